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

A file is a journal (journal.py: one JSON line per run, that can only grow), appended under an
exclusive lock (flock) that the task holds from its budget check to its record, so two tasks on the
same data at once never lose a spend and the second sees the first's.

A train or tune task in a compute plan also passes the ledger on as its `ledger` output, which only
its own organisation may read, sealed under the organisation's keys (seal.py), and takes the
organisation's previous outputs as its `ledger` inputs (`held(..., chain)`, `Held.pass_on`): where a
task cannot write beside its data (Substra's docker mode and a node mount data samples read-only,
and a task there reads them as they were when the plan started), the organisation's next task still
sees the run. There a train or tune task refuses to run without a `ledger` input: the first is the
genesis (`genesis`), made from what the samples record. The scripts record the released runs in the
data folders after the plan (`record_released`), and on a node every run any plan made
(orchestration/reconcile.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from mnist_dp.privacy import journal, seal
from mnist_dp.privacy.events import DpEvent
from mnist_dp.privacy.ledger import Ledger, is_new
from mnist_dp.utils import atomic
from mnist_dp.utils.errors import UserError

LEDGER_FILE = "privacy_ledger.jsonl"  # in each data sample folder, beside identity.key
KEY_FILE = "identity.key"  # the opener's KEY_FILE
log = logging.getLogger("substratools.mnist_dp")


def home(folder) -> Path:
    """Where a data sample's ledger lives: beside its identity key. Substra's subprocess mode gives
    a task its samples as folders of symbolic links to the registered files: the ledger is then the
    registered folder's, the one the organisation keeps."""
    key = Path(folder) / KEY_FILE
    return key.resolve().parent if key.is_symlink() else Path(folder)


def path_of(folder) -> Path:
    return home(folder) / LEDGER_FILE


def read(folders) -> Ledger:
    """The runs recorded with the data sample folders `folders`, each once, in the order first
    recorded."""
    ledger = Ledger()
    for folder in sorted(map(str, folders)):
        f = journal.open_file(path_of(folder), writable=False)
        if f is not None:
            with f:
                journal.read_into(ledger, f.read(), path_of(folder))
    return ledger


def read_output(path, seal_keys: dict) -> Ledger:
    """The runs of a task's `ledger` output (`Held.pass_on`), its seal checked under the
    organisation's `seal_keys` (seal.open_sealed)."""
    ledger = Ledger()
    add_sealed(ledger, Path(path).read_bytes(), seal_keys, Path(path))
    return ledger


def add_sealed(ledger: Ledger, content: bytes, seal_keys: dict, path: Path) -> list:
    """Add to `ledger` the runs of the ledger output `content` (read from `path`), once its seal is
    checked under the organisation's `seal_keys`; returns the digests it extends."""
    body, extends = seal.open_sealed(content, seal_keys, path)
    journal.read_into(ledger, body, path, chained=True)
    return extends


@dataclass(frozen=True)
class Chain:
    """A train or tune task's place in its organisation's chain of ledger outputs: `inputs`, the
    paths of its `ledger` inputs (the genesis, or earlier tasks' outputs), and `seal_keys`, the
    organisation's (the opener's data["seal_keys"]), which check them and seal the task's own."""

    inputs: tuple
    seal_keys: dict

    @classmethod
    def of(cls, ledger_input, data: dict) -> Chain:
        """The chain of a task whose `ledger` input is `ledger_input` (substratools' value: None, a
        path, or a list of paths) on the opener's `data`."""
        inputs = [] if ledger_input is None else [ledger_input] if isinstance(
            ledger_input, (str, Path)) else list(ledger_input)
        return cls(tuple(map(Path, inputs)), data.get("seal_keys") or {})


def genesis(folders, seal_keys: dict, path) -> int:
    """Write the genesis of the organisation's chain to the `ledger` output `path`: every run the
    data sample folders `folders` record, sealed, extending nothing. Returns the runs."""
    ledger = read(folders)
    atomic.write_bytes(Path(path), seal.seal(journal.lines(ledger, ledger.events).encode(), [],
                                             seal_keys))
    return len(ledger.events)


@dataclass
class Held:
    """The data's ledger of some data sample folders, locked for one task (`held`): `ledger` is what
    they record, `files` the open files the task appends its run to (none where a folder is
    read-only)."""

    files: list  # open files, each under an exclusive lock
    ledger: Ledger
    chain: Chain | None = None  # the task's ledger inputs and seal keys
    extends: tuple = ()  # the digests of its ledger inputs, which its output extends

    def record(self, ledger: Ledger, event: DpEvent) -> None:
        """Append `event`, the run just made, with its examples as `ledger` names them, to every
        folder's file, checked on disk before the model is saved (a UserError if it cannot be);
        where the folders are read-only, the task's ledger output carries it (held refused a task
        without one)."""
        self.ledger.add_examples({i: ledger.examples[i] for i in event.data})
        self.ledger.add(event)
        if not self.files:
            log.info("the data samples are read-only here: this run goes on in the task's ledger "
                     "output, which only this organisation reads, and the script that reads the "
                     "released model records it in their %s (docs/privacy.md, \"The data's own "
                     "ledger\")", LEDGER_FILE)
        line = journal.lines(ledger, [event]).encode()
        for f in self.files:
            journal.append(f, line)

    def pass_on(self, path) -> None:
        """Write every run the task knows of its organisation's data, this task's too, to its
        `ledger` output `path` (None: the task has none), for the organisation's next task; before
        the model is saved."""
        if path is not None:
            atomic.write_bytes(Path(path), seal.seal(
                journal.lines(self.ledger, self.ledger.events).encode(), list(self.extends),
                self.chain.seal_keys if self.chain else {}))


@contextlib.contextmanager
def held(folders, chain: Chain | None = None, passes_on: bool = False):
    """The data's ledger of `folders`, locked exclusively until the block ends: read, check the
    budget against it, train, record, all with no other task's run in between. Folders the task
    cannot write (read-only mounts) are read under a shared lock. One file linked into several
    folders (`join`) is held once.

    Args:
      folders: the task's data sample folders.
      chain: a train or tune task's ledger inputs (its organisation's earlier `ledger` outputs),
        whose runs are added once their seals are checked, or None (no chain: a substrafl algo, a
        script). Where the folders are read-only, a chain without inputs is refused (UserError):
        the plan's builder left the organisation's record out.
      passes_on: whether the task's run also leaves in a ledger output or a local state of its own
        organisation. Where the folders are read-only and it does not, the run would be recorded
        nowhere: refused (UserError) before anything trains.
    """
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
        if not writable and not passes_on:
            raise UserError(f"{home(sorted(map(str, folders))[0])}: the data samples are read-only "
                            "here and this task has no ledger output, so its run would be recorded "
                            "nowhere; nothing was trained: give the task a 'ledger' output (the "
                            "scripts' plans do), or make the data sample folders writable")
        if not writable and chain is not None and not chain.inputs:
            raise UserError(f"{home(sorted(map(str, folders))[0])}: the data samples are read-only "
                            "here and this task has no 'ledger' input, so it cannot know what was "
                            "released from them; nothing was trained: give it its organisation's "
                            "last ledger output (the scripts' plans do; python "
                            "scripts/privacy_report.py --reconcile finds it)")
        ledger, extends = Ledger(), []
        for f, _ in files:
            f.seek(0)
            journal.read_into(ledger, f.read(), Path(f.name))
        for path in chain.inputs if chain else ():
            content = path.read_bytes()
            add_sealed(ledger, content, chain.seal_keys, path)
            extends.append(seal.digest(content))
        yield Held([f for f, _ in files] if writable else [], ledger, chain, tuple(extends))
    finally:
        for f, _ in files:
            f.close()  # closing releases the lock


def _open(folders) -> tuple:
    """([(open file, lock mode)] of the folders' ledgers, each file once, in (device, inode) order;
    whether all could be opened for appending)."""
    files, writable = {}, True
    for folder in sorted(map(str, folders)):
        if not home(folder).is_dir():  # a sample made in memory: no ledger
            continue
        path = path_of(folder)
        f, mode = journal.open_file(path, writable=True), fcntl.LOCK_EX
        if f is None:
            writable = False
            f, mode = journal.open_file(path, writable=False), fcntl.LOCK_SH
            if f is None:
                continue
        stat_ = os.fstat(f.fileno())
        if (stat_.st_dev, stat_.st_ino) in files:
            f.close()
        else:
            files[(stat_.st_dev, stat_.st_ino)] = (f, mode)
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
        atomic.write_text(joined, journal.lines(data.ledger, data.ledger.events))
        try:
            for folder in folders:
                os.link(joined, folder / f".{LEDGER_FILE}.link")
                os.replace(folder / f".{LEDGER_FILE}.link", path_of(folder))
        finally:
            joined.unlink()
        return len(data.ledger.events)


def check_follow(source, dest) -> Path:
    """Refuse (UserError) to write data samples under the key of sample folder `source` into `dest`
    when their ledger could not be `source`'s own file: on another file system (hard links do not
    cross them), checked before anything is written. Returns `source`."""
    existing = next(p for p in (Path(dest), *Path(dest).resolve().parents) if p.exists())
    if os.stat(home(source)).st_dev != os.stat(existing).st_dev:
        raise UserError(f"--key-from {source}: on another file system than {dest}, so the new "
                        "samples could not share its privacy ledger (one file, hard-linked) and "
                        "their runs would start a new record; write them on the same file system")
    return Path(source)


def follow(source, folders) -> None:
    """Give `folders`, data sample folders just written under the identity key of sample folder
    `source` (--key-from), `source`'s own ledger file, hard-linked into each: the same examples
    under the same key share one record whatever folder they are in, and a run recorded on any of
    them is recorded on all."""
    shared_path = path_of(source)
    f = journal.open_file(shared_path, writable=True)  # made if missing; refused if it could forget
    if f is None:
        raise _read_only(source, "; make it writable, then write the new samples again")
    f.close()
    shared = os.stat(shared_path)
    for folder in map(Path, folders):
        check_follow(source, folder)
        own = path_of(folder)
        if own.exists() and own.stat().st_size and not os.path.samestat(own.stat(), shared):
            raise UserError(f"{own}: records runs of its own; it cannot take the ledger of "
                            f"{source} without losing them: make them one organisation's with "
                            "generate_data.py --same-organization instead")
        link = folder / f".{LEDGER_FILE}.link"
        os.link(shared_path, link)
        os.replace(link, own)


def absorb(model: Ledger, data: Ledger) -> list:
    """Add to the model's ledger every run of the data's ledger it lacks, in any framework: what a
    train task continuing from an input model accounts, whatever its sender recorded (weights move
    between frameworks: one layout serves all three).

    Args:
      model: the model's ledger, changed in place: the runs go before its own, and every sample of
        the data's runs named as the data names it (a released ledger names none), with the data's
        aliases of its samples.
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
    model.add_examples({i: data.examples[i] for e in data.events for i in e.data})
    model.add_aliases({i: named for i, named in data.aliases.items() if i in model.examples})
    model.events[:0] = lacking
    return lacking


def union(ledger: Ledger, data: Ledger) -> Ledger:
    """A copy of `ledger` with every run of the data's ledger `data` it lacks, in every framework:
    what a budget for the data counts (`ledger` itself when there is none to add). A run both hold
    must be recorded alike (absorb)."""
    everything = ledger.copy(list(ledger.events))
    added = absorb(everything, data)
    return everything if added or data.aliases or everything.examples != ledger.examples else ledger


def histories(data: Ledger, samples: list) -> list:
    """The earlier runs a run on the opener's data samples `samples` counts, of those the data's own
    ledger `data` records (Ledger.histories; [[]] for none)."""
    mine = Ledger()
    identities = mine.add_samples(samples)
    return union(mine, data).histories(identities)


def record_released(folders_by_identity: dict, ledgers, name=None) -> int:
    """Append to the data's ledger every run of the released models' `ledgers` on the sample folders
    `folders_by_identity` ({sample identity: folder}) that it does not hold yet (a task that could
    not write beside its data); returns how many it appended. Refused (UserError) where such a run
    cannot be recorded: a script that released it must not end in success.

    A released ledger names no example: `name(folders)`, a Ledger naming the examples of those
    folders (samples.named), names them in the record; without it, or for another organisation's
    samples, the record says the run may have touched any of the organisation's examples."""
    runs = {}
    for ledger in ledgers:
        for event in ledger.events:
            if event.run_id and any(i in folders_by_identity for i in event.data):
                runs.setdefault(event.run_id, (ledger, event))
    recorded = 0
    for ledger, event in runs.values():
        folders = [folders_by_identity[i] for i in event.data if i in folders_by_identity]
        with held(folders, passes_on=True) as data:
            if event.run_id in {e.run_id for e in data.ledger.events}:
                continue
            if not data.files:
                raise _read_only(folders[0], "; make it writable, then run python "
                                 "scripts/privacy_report.py MODEL --data FOLDER... on the released "
                                 "models to record them")
            unnamed = [folders_by_identity[i] for i in event.data if i in folders_by_identity
                       and not (i in ledger.examples and ledger.examples[i].named)]
            named = ledger.copy()
            if unnamed and name is not None:
                named.add_examples(name(unnamed).examples)
            data.record(named, event)
            recorded += 1
    return recorded


def check_writable(folders) -> None:
    """Refuse (UserError) data sample folders whose ledger the scripts could not record released
    runs in: what they check before they register anything."""
    for folder in folders:
        f = journal.open_file(path_of(folder), writable=True)
        if f is None:
            raise _read_only(folder, "; nothing was registered: make it writable, or train on a "
                             "writable copy (its ledger file with it)")
        f.close()


def _read_only(folder, todo: str) -> UserError:
    return UserError(f"{home(folder)}: cannot record the released runs in this data's privacy "
                     "ledger: the folder is read-only, and a run released from it would be "
                     f"counted nowhere{todo}")
