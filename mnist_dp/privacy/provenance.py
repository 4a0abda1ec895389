"""Which code produced a ledger event: the digest of the function archive a train task ran from.

`archive.build` writes ``archive_manifest.json`` into every function archive: the sha256 of each of
its other files. The archive's digest is the sha256 of that manifest. A running function checks the
files on disk against the manifest and records the digest in its ledger event, so a reader of the
privacy statement can match the figure to the registered function archive (and its code and
hyperparameters) that made it. Run from the repository (no manifest) the digest is null.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

MANIFEST_FILE = "archive_manifest.json"
log = logging.getLogger("substratools.mnist_dp")


def manifest_bytes(contents: dict) -> bytes:
    """The manifest of an archive whose files are `contents` ({relative path: bytes})."""
    files = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(contents.items())
             if name != MANIFEST_FILE}
    return (json.dumps({"files": files}, indent=2, sort_keys=True) + "\n").encode()


def digest(manifest: bytes) -> str:
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def running_code(folder: Path, function: str) -> dict:
    """{"function", "archive_digest"} for a function running from `folder`: the digest of its
    archive if every file the manifest lists is there unchanged, else null (and a warning)."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return {"function": function, "archive_digest": None}
    manifest = path.read_bytes()
    try:
        files = json.loads(manifest)["files"]
        changed = [name for name, sha in files.items()
                   if hashlib.sha256((Path(folder) / name).read_bytes()).hexdigest() != sha]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        changed = [MANIFEST_FILE]
    if changed:
        log.warning("the function's files differ from its archive manifest (%s): no archive digest "
                    "recorded", ", ".join(changed[:3]))
        return {"function": function, "archive_digest": None}
    return {"function": function, "archive_digest": digest(manifest)}
