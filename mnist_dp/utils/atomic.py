"""Write files safely: atomically (to a temporary file in the same folder, then renamed over the
target), and into an output folder that one process at a time may write.

A crash or an error half-way never leaves half a file, and the previous version stays intact.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path

from mnist_dp.utils.errors import UserError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def replacing(path: Path):
    """Yield a temporary path next to `path`; on success it replaces `path`, on error it is removed.
    Failing to write it (a full disk, a read-only folder) is a UserError naming `path`, which is
    then unchanged."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=path.suffix, dir=path.parent)
    except OSError as exc:  # read-only folder, a file where a folder should be, full disk...
        raise _cannot_write(path, exc) from None
    os.close(fd)
    try:
        os.chmod(tmp, _mode_of_new(path))
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        # Writing failed: a full disk, a lost permission. An OSError that names another file (a
        # source read while writing) is that file's problem and goes on as it is.
        if isinstance(exc, OSError) and exc.errno is not None and (
                exc.filename is None or str(exc.filename) in (tmp, str(path))):
            raise _cannot_write(path, exc) from None
        raise


def _cannot_write(path: Path, exc: OSError) -> UserError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        todo = f"free space on the disk of {path.parent} or choose another path"
    else:
        todo = f"make {path.parent} writable or choose another path"
    unchanged = " (the previous file is unchanged)" if path.is_file() else ""
    return UserError(f"{path}: cannot write it ({exc.strerror}){unchanged}; {todo}")


def _mode_of_new(path: Path) -> int:
    # mkstemp's file is private (0600): give it the mode of the file it replaces,
    # or of a new file (umask).
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask


def write_text(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text)


def write_bytes(path: Path, content: bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(content)


def write_json(path: Path, payload) -> None:
    """Strict JSON (no NaN / Infinity), indented."""
    write_text(path, json.dumps(payload, indent=2, allow_nan=False) + "\n")


def write_performance(path: Path, value: float) -> None:
    """Substra's performance file, {"all": value}, as substratools' save_performance writes it (ε =
    inf as JSON's non-standard `Infinity`, which Python's json, and so Substra, reads back), but
    atomically."""
    write_text(path, json.dumps({"all": value}))


@contextlib.contextmanager
def exclusive(folder: Path, what: str):
    """Hold `folder` (created if missing) for this process: a second process asking for it gets a
    UserError instead of mixing its results with ours. The lock dies with the process, even
    killed; a run that ends removes its lock file, while it still holds it."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder}: is a file; {what} must be a folder (give a new or existing "
                        "folder)")
    lock = folder / LOCK_FILE
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle = open(lock, "a+")
        except OSError as exc:
            raise UserError(f"{folder}: cannot write to this folder ({exc.strerror}); choose "
                            f"another {what}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise UserError(f"{folder}: another run (process {holder}) is writing to this {what}; "
                            "wait for it to end or choose another one") from None
        if _is_at(handle, lock):
            break
        handle.close()  # the run that held it removed it as it ended: take the one there now
    with handle:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield folder
        finally:
            with contextlib.suppress(OSError):
                lock.unlink()


def _is_at(handle, path: Path) -> bool:
    """Whether the open file `handle` is still the file at `path`."""
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
