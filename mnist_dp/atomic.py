"""Write files atomically: to a temporary file in the same folder, then rename over the target.

A crash or an error half-way never leaves half a file, and the previous version stays intact.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path):
    """Yield a temporary path next to `path`; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=path.suffix, dir=path.parent)
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
