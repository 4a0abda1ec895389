"""The data's own ledger as a file: a journal of one JSON line per run, read and appended so that
it can only grow (data_ledger.py says who writes it and when).

A record is appended whole, checked on disk, or not at all: a full disk or a failing write leaves
nothing of it and fails the task before its model is saved. Only a last line that does not parse
and begins as every record begins is a crash's (its model was never saved), dropped before the next
record; a whole record that lost its newline is kept. The file must be a regular file the task can
read and write: a symbolic link (which can point nowhere, making a writable folder look read-only),
a folder, a device or a pipe is refused in one line naming it.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from mnist_dp.privacy.events import DpEvent
from mnist_dp.privacy.examples import Examples
from mnist_dp.privacy.ledger import Ledger, is_new
from mnist_dp.utils import json_input
from mnist_dp.utils.errors import UserError

# How json.dumps begins every record (`lines`): a last line that begins so, or is a beginning of it,
# and does not parse, is a record cut short by a crash.
RECORD_START = b'{"event": {'


def _is_cut(line: bytes) -> bool:
    return line.startswith(RECORD_START) or RECORD_START.startswith(line)


def read_into(ledger: Ledger, content: bytes, path: Path, chained: bool = False) -> None:
    lines = content.split(b"\n")
    # the last piece is "" after a full line; else a whole record that lost its newline, or a
    # record cut short by a crash (never released); a task output is written whole: a cut there is
    # damage
    whole = lines[:-1] if not lines[-1] or (not chained and _cut_last(lines, path)) else lines
    known = {e.run_id: e for e in ledger.events}
    for number, line in enumerate(whole, 1):
        try:
            event, examples = _record(line, f"{path}: line {number}")
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


def _record(line: bytes, where: str) -> tuple:
    """(DpEvent, {identity: Examples}) of one journal line; ValueError or UserError if it is
    none."""
    record = json_input.loads(line, where)
    if not isinstance(record, dict) or set(record) != {"event", "examples"} \
            or not isinstance(record["examples"], dict):
        raise ValueError('not an object {"event": ..., "examples": ...}')
    event = DpEvent.from_json(record["event"])
    examples = {i: Examples.from_json(i, e) for i, e in record["examples"].items()}
    if event.run_id is None or set(examples) != set(event.data):
        raise ValueError("a run record names its run id and the examples of every data sample it "
                         "trained on")
    return event, examples


def _cut_last(lines: list, path: Path) -> bool:
    """Whether the journal's last piece (no newline after it) is a record cut short by a crash,
    dropped; False when it is a whole record, kept."""
    try:
        _record(lines[-1], f"{path}: line {len(lines)}")
        return False
    except (ValueError, UserError):
        if _is_cut(lines[-1]):
            return True
        raise UserError(f"{path}: its last line ({len(lines)}) is neither a run record nor the "
                        "beginning of one: the file was edited or damaged, and the privacy this "
                        "data has spent cannot be known from it; restore it from a backup"
                        ) from None


def line_of(ledger: Ledger, event: DpEvent) -> dict:
    return {"event": event.to_json(),
            "examples": {i: ledger.examples[i].to_json() for i in event.data}}


def lines(ledger: Ledger, events) -> str:
    """The journal lines of `events`, their examples as `ledger` names them: what a file or a ledger
    output holds."""
    return "".join(json.dumps(line_of(ledger, e), allow_nan=False) + "\n" for e in events)


def append(f, line: bytes) -> None:
    """Append one record to the journal `f` and check that it is on disk, whole; else remove what
    was written and refuse (UserError): the model is not saved. A last record cut short by a crash
    goes first; a whole one that lost its newline gets it back."""
    path = f.name
    f.seek(0)
    content = f.read()
    size = len(content)
    if content and not content.endswith(b"\n"):
        tail = content[content.rfind(b"\n") + 1:]
        if _cut_last([tail], Path(path)):
            size -= len(tail)
            os.ftruncate(f.fileno(), size)
        else:
            line = b"\n" + line
    try:
        written = 0
        while written < len(line):
            count = os.write(f.fileno(), line[written:])
            if count == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += count
        os.fsync(f.fileno())
        if os.fstat(f.fileno()).st_size != size + len(line) or os.pread(
                f.fileno(), len(line), size) != line:
            raise OSError(errno.EIO, "the record read back differs from the one written")
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(f.fileno(), size)
            os.fsync(f.fileno())
        todo = ("free space on its file system" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else "check its file system")
        raise UserError(f"{path}: could not record this run in the data's privacy ledger "
                        f"({exc.strerror}); the model was not saved: {todo}, then run the task "
                        "again") from None


def open_file(path: Path, writable: bool):
    """The journal at `path`, opened to append and read (`writable`) or to read; None when it does
    not exist (read), or cannot be created where its folder is read-only (append: see `held`).
    Refused in one line (UserError) when it is a symbolic link, not a regular file, or a file the
    task cannot both read and write in a folder it can write: each could make runs go unrecorded."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # a pipe must not block the open
    try:
        fd = os.open(path, flags | (os.O_RDWR | os.O_APPEND | os.O_CREAT if writable
                                    else os.O_RDONLY), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise UserError(f"{path}: is a symbolic link; a data sample's privacy ledger must be a "
                            "regular file beside its identity key (a link can point it nowhere and "
                            "lose every run): put the file it points to in its place") from None
        if exc.errno == errno.EISDIR:
            raise a_folder(path) from None
        if exc.errno == errno.ENOENT and not writable:
            return None
        if writable and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and not os.access(
                path.parent, os.W_OK):
            return None  # a read-only folder: docker mode and a node
        raise UserError(f"{path}: cannot open the data's privacy ledger to "
                        f"{'read and append to' if writable else 'read'} it ({exc.strerror}); give "
                        "the task read and write access to it") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise a_folder(path)
        raise UserError(f"{path}: is not a regular file (a device, a pipe or a socket), so it "
                        "cannot keep the data's privacy ledger; remove it (a new ledger records "
                        "the next run) or restore the file from a backup")
    return open(path, "a+b" if writable else "rb", opener=lambda *_: fd)  # named by its path


def a_folder(path: Path) -> UserError:
    return UserError(f"{path}: is a folder, not a privacy ledger; move it away (nothing was "
                     "trained)")
