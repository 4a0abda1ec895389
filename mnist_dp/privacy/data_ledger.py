"""The data's own ledger: every run on an organisation's data, recorded by that organisation with
the data.

A model's ledger says what trained that model, as whoever sent the model says it. The data's ledger
says what was released from the data: each train or tune task appends its run, with the examples it
trained on, to the file LEDGER_FILE of every data sample folder it read, before its model leaves the
task. It lives beside the sample's identity key and, like it, never goes to another organisation or
to the aggregator. It is what holds whatever
another party sends:

- a train task continuing from an input model composes the model's ledger with the data's runs in
  every framework (the three share one weight layout, so a model's weights may hold any of them), as
  a union (`absorb`): a model whose ledger lacks one of them is accounted as if it had it;
- max_epsilon is checked against the data's ledger with the new run, before any noise is drawn;
- every report gives beside each model's ε what each organisation's data has spent over everything
  released from it (`Record.epsilon`).

A file is a journal: one JSON line per run, appended under an exclusive lock (flock) that the task
holds from its budget check to its record, so two tasks on the same data at once never lose a spend
and the second sees the first's. A line cut short by a crash is a run whose model never left its
task: it is dropped before the next append. Any other line that is not a run record is refused: the
file was edited or damaged.

A train or tune task in a compute plan also passes the ledger on as its `ledger` output, which only
its own organisation may read, and takes the organisation's previous task's as its `ledger` input
(`held(..., chained)`, `Held.pass_on`): where a task cannot write beside its data (Substra's docker
mode and a node mount data samples read-only, and a task there reads them as they were when the plan
started), the organisation's next task still sees the run. The scripts record the released runs in
the data folders after the plan (`record_released`).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mnist_dp.privacy.events import DpEvent
from mnist_dp.privacy.ledger import Examples, Ledger, is_new
from mnist_dp.utils import atomic, json_input
from mnist_dp.utils.errors import UserError

LEDGER_FILE = "privacy_ledger.jsonl"  # in each data sample folder, beside identity.key
log = logging.getLogger("substratools.mnist_dp")


def path_of(folder) -> Path:
    return Path(folder) / LEDGER_FILE


def read(folders) -> Ledger:
    """The runs recorded with the data sample folders `folders`, each once, in the order first
    recorded."""
    ledger = Ledger()
    for folder in sorted(map(str, folders)):
        try:
            with open(path_of(folder), "rb") as f:
                _read_into(ledger, f.read(), path_of(folder))
        except FileNotFoundError:
            continue
    return ledger


def read_output(path) -> Ledger:
    """The runs of a task's `ledger` output (`Held.pass_on`)."""
    ledger = Ledger()
    _read_into(ledger, Path(path).read_bytes(), Path(path), chained=True)
    return ledger


def _read_into(ledger: Ledger, content: bytes, path: Path, chained: bool = False) -> None:
    lines = content.split(b"\n")
    # the last piece is "" after a full line, or a line cut short by a crash: never released
    whole = lines[:-1]
    # a task output is written whole: a cut line there is damage, not a crash
    if chained and lines[-1]:
        whole = lines
    known = {e.run_id: e for e in ledger.events}
    for number, line in enumerate(whole, 1):
        try:
            record = json_input.loads(line, f"{path}: line {number}")
            if not isinstance(record, dict) or set(record) != {"event", "examples"} \
                    or not isinstance(record["examples"], dict):
                raise ValueError('not an object {"event": ..., "examples": ...}')
            event = DpEvent.from_json(record["event"])
            examples = {i: Examples.from_json(i, e) for i, e in record["examples"].items()}
            if event.run_id is None or set(examples) != set(event.data):
                raise ValueError("a run record names its run id and the examples of every data "
                                 "sample it trained on")
            ledger.add_examples(examples)
        except (ValueError, UserError) as exc:
            raise UserError(f"{path}: line {number} is not a run record ({exc}); the file was "
                            "edited or damaged, and the privacy this data has spent cannot be "
                            "known from it: "
                            + ("give the task its organisation's last ledger output" if chained else
                               "restore it from a backup")) from None
        if is_new(known, event, f"{path}: run {event.run_id} is recorded twice, differently: the "
                                "file was edited or damaged; restore it from a backup"):
            ledger.add(event)


@dataclass
class Held:
    """The data's ledger of some data sample folders, locked for one task (`held`): `ledger` is what
    they record, `files` the open files the task appends its run to (none where a folder is
    read-only)."""

    files: list  # open files, each under an exclusive lock
    ledger: Ledger

    def record(self, ledger: Ledger, event: DpEvent) -> None:
        """Append `event`, the run just made, with its examples as `ledger` names them, to every
        folder's file (flushed to disk before the model is saved); where the folders are read-only,
        say who records it."""
        self.ledger.add_examples({i: ledger.examples[i] for i in event.data})
        self.ledger.add(event)
        if not self.files:
            log.info("the data samples are read-only here: this run goes on in the task's ledger "
                     "output, which only this organisation reads, and the script that reads the "
                     "released model records it in their %s (docs/privacy.md, \"The data's own "
                     "ledger\")", LEDGER_FILE)
            return
        line = lines(ledger, [event]).encode()
        for f in self.files:
            _drop_cut_line(f)
            os.write(f.fileno(), line)
            os.fsync(f.fileno())

    def pass_on(self, path) -> None:
        """Write every run the task knows of its organisation's data, this task's too, to its
        `ledger` output `path` (None: the task has none), for the organisation's next task; before
        the model is saved."""
        if path is not None:
            atomic.write_text(Path(path), lines(self.ledger, self.ledger.events))


def line_of(ledger: Ledger, event: DpEvent) -> dict:
    return {"event": event.to_json(),
            "examples": {i: ledger.examples[i].to_json() for i in event.data}}


def lines(ledger: Ledger, events) -> str:
    """The journal lines of `events`, their examples as `ledger` names them: what a file or a ledger
    output holds."""
    return "".join(json.dumps(line_of(ledger, e), allow_nan=False) + "\n" for e in events)


def _drop_cut_line(f) -> None:
    """A last line without its newline is a run cut short before its model was saved: it goes before
    the next."""
    size = os.fstat(f.fileno()).st_size
    if size == 0:
        return
    f.seek(0)
    content = f.read()
    if not content.endswith(b"\n"):
        os.ftruncate(f.fileno(), content.rfind(b"\n") + 1)


@contextlib.contextmanager
def held(folders, chained=None):
    """The data's ledger of `folders`, locked exclusively until the block ends: read, check the
    budget against it, train, record, all with no other task's run in between. Folders the task
    cannot write (read-only mounts) are read under a shared lock. One file linked into several
    folders (`join`) is held once. `chained`: the task's `ledger` input (its organisation's previous
    task's `ledger` output), whose runs are added, or None."""
    files, writable = [], True
    try:
        while True:
            files, writable = _open(folders)
            for f, mode in files:  # in file order, so two tasks never deadlock
                try:
                    fcntl.flock(f.fileno(), mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    log.info("waiting for %s: another task on this data is recording its run",
                             f.name)
                    fcntl.flock(f.fileno(), mode)
            if all(_still_there(f) for f, _ in files):
                break
            # a file was replaced while this task waited (join): open the new one
            for f, _ in files:
                f.close()
        ledger = Ledger()
        for f, _ in files:
            f.seek(0)
            _read_into(ledger, f.read(), Path(f.name))
        if chained is not None:
            _read_into(ledger, Path(chained).read_bytes(), Path(chained), chained=True)
        yield Held([f for f, _ in files] if writable else [], ledger)
    finally:
        for f, _ in files:
            f.close()  # closing releases the lock


def _open(folders) -> tuple:
    """([(open file, lock mode)] of the folders' ledgers, each file once, in (device, inode) order;
    whether all could be opened for appending)."""
    files, writable = {}, True
    for folder in sorted(map(str, folders)):
        path = path_of(folder)
        try:
            f, mode = open(path, "a+b"), fcntl.LOCK_EX  # noqa: SIM115 - held open until the block ends
        except OSError:
            writable = False
            try:
                f, mode = open(path, "rb"), fcntl.LOCK_SH  # noqa: SIM115
            except FileNotFoundError:
                continue
        stat = os.fstat(f.fileno())
        if (stat.st_dev, stat.st_ino) in files:
            f.close()
        else:
            files[(stat.st_dev, stat.st_ino)] = (f, mode)
    return [files[k] for k in sorted(files)], writable


def _still_there(f) -> bool:
    try:
        return os.stat(f.name).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
        return False


def join(folders) -> int:
    """Make the data's ledgers of `folders` (one organisation's data sample folders) one file,
    hard-linked into each: every run any of them records, once. A run recorded later on any of them
    is then recorded on all. Returns the runs. Done under their locks; a task waiting for one opens
    the joined file."""
    folders = [Path(f) for f in folders]
    devices = {os.stat(f).st_dev for f in folders}
    if len(devices) > 1:
        raise UserError(f"{', '.join(map(str, folders))}: not all on one file system; the privacy "
                        "ledgers of one organisation's data samples are joined by hard links: move "
                        "them onto one")
    with held(folders) as data:
        if not data.files:  # a folder whose ledger could not be opened for appending
            raise UserError(f"{', '.join(map(str, folders))}: cannot write the privacy ledger of "
                            "each of these data samples; make the folders writable")
        joined = folders[0] / f".{LEDGER_FILE}.joined"
        atomic.write_text(joined, lines(data.ledger, data.ledger.events))
        try:
            for folder in folders:
                os.link(joined, folder / f".{LEDGER_FILE}.link")
                os.replace(folder / f".{LEDGER_FILE}.link", path_of(folder))
        finally:
            joined.unlink()
        return len(data.ledger.events)


def absorb(model: Ledger, data: Ledger) -> list:
    """Add to the model's ledger every run of the data's ledger it lacks, in any framework: what a
    train task continuing from an input model accounts, whatever its sender recorded (weights move
    between frameworks: one layout serves all three).

    Args:
      model: the model's ledger, changed in place: the runs go before its own, with their examples
        and the data's aliases of its samples.
      data: the data's own ledger.

    Returns:
      The runs added. A run both hold must be recorded alike, else the model was edited (refused
      with a UserError).
    """
    known = {e.run_id: e for e in model.events}
    lacking = [e for e in data.events
               if is_new(known, e,
                         f"input model: its ledger records training run {e.run_id} differently "
                         "from this organisation's own ledger of its data: the model was edited; "
                         "its privacy figure cannot be trusted")]
    model.add_examples({i: data.examples[i] for e in lacking for i in e.data})
    model.add_aliases({i: named for i, named in data.aliases.items() if i in model.examples})
    model.events[:0] = lacking
    return lacking


def union(ledger: Ledger, data: Ledger) -> Ledger:
    """A copy of `ledger` with every run of the data's ledger `data` it lacks, in every framework:
    what a budget for the data counts (`ledger` itself when there is none to add). A run both hold
    must be recorded alike (absorb)."""
    everything = ledger.copy(list(ledger.events))
    return everything if absorb(everything, data) or data.aliases else ledger


def record_released(folders_by_identity: dict, ledgers) -> None:
    """Append to the data's ledger every run of the released models' `ledgers` on the sample folders
    `folders_by_identity` ({sample identity: folder}) that it does not hold yet (a task that could
    not write beside its data)."""
    runs = {}
    for ledger in ledgers:
        for event in ledger.events:
            if event.run_id and any(i in folders_by_identity for i in event.data):
                runs.setdefault(event.run_id, (ledger, event))
    for ledger, event in runs.values():
        folders = [folders_by_identity[i] for i in event.data if i in folders_by_identity]
        with held(folders) as data:
            if event.run_id not in {e.run_id for e in data.ledger.events}:
                data.record(ledger, event)
