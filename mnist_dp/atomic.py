"""Write files safely: atomically (to a temporary file in the same folder, then renamed over the
target), and into an output folder that one process at a time may write.

A crash or an error half-way never leaves half a file, and the previous version stays intact.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path

from mnist_dp.errors import UserError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def replacing(path: Path):
    """Yield a temporary path next to `path`; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=path.suffix, dir=path.parent)
    except OSError as exc:  # read-only folder, a file where a folder should be, full disk...
        raise UserError(f"{path}: cannot write it ({exc.strerror}); make {path.parent} writable or choose "
                        "another path") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text)


def write_json(path: Path, payload) -> None:
    """Strict JSON (no NaN / Infinity), indented."""
    write_text(path, json.dumps(payload, indent=2, allow_nan=False) + "\n")


@contextlib.contextmanager
def exclusive(folder: Path, what: str):
    """Hold `folder` (created if missing) for this process: a second process asking for it gets a
    UserError instead of mixing its results with ours. The lock dies with the process, even killed."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder}: is a file; {what} must be a folder (give a new or existing folder)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK_FILE, "a+")
    except OSError as exc:
        raise UserError(f"{folder}: cannot write to this folder ({exc.strerror}); choose another {what}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            raise UserError(f"{folder}: another run (process {holder}) is writing to this {what}; wait for it to "
                            "end or choose another one") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield folder
