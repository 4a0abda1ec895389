"""Identity keys on the data owner's side: a new key, written once into a sample folder, added to a
user's own samples, and read per organisation, each refusal with the command that fixes it keeping
every key it can."""
from __future__ import annotations

import os
import secrets
import shlex
from pathlib import Path

from mnist_dp.data.samples import (
    IMAGES_FILE,
    KEY_FILE,
    LABELS_FILE,
    RING_FILE,
    KeyFileProblem,
    key_id,
    read_key,
    read_ring,
)
from mnist_dp.privacy import data_ledger
from mnist_dp.utils import atomic
from mnist_dp.utils.errors import UserError, writing_in


def new_key() -> str:
    """A secret identity key: 256 bits from the OS, as 64 hex digits."""
    return secrets.token_hex(32)


def write_key(folder: Path, key: str) -> None:
    # Created, never replaced (mode x): a sample's identity must not change
    # under a ledger that names it.
    with open(Path(folder) / KEY_FILE, "x", encoding="ascii") as f:
        f.write(key + "\n")
    os.chmod(Path(folder) / KEY_FILE, 0o600)


def add_key(folders: list, key: str | None = None) -> list:
    """Give every data sample folder of `folders` that has no identity key one key, `key` or a new
    one (one organisation's samples: the same key); returns the folders that got it. An existing key
    is never replaced: one that is not a valid key (or a broken link) is refused, saying what to do,
    before any key is written."""
    missing = []
    for folder in map(Path, folders):
        if not (folder / IMAGES_FILE).is_file() or not (folder / LABELS_FILE).is_file():
            raise UserError(f"{folder}: not a data sample folder (it needs {IMAGES_FILE} and "
                            f"{LABELS_FILE})")
        if os.path.lexists(folder / KEY_FILE):
            read_key(folder)  # a valid key stays; anything else is refused with its remedy
        else:
            missing.append(folder)
    key = key or new_key()
    for folder in missing:
        with writing_in(folder):
            write_key(folder, key)
    return missing


def same_organization(folders: list) -> tuple:
    """Make data sample folders `folders` one organisation's, whatever keys they are under: each
    gets every other's key in its ring file (the opener's RING_FILE, kept: keys are only added), so
    a task knows its examples under all of them, and their privacy ledgers become one
    (data_ledger.join). Returns (the keys, the runs recorded)."""
    folders = [Path(f) for f in folders]
    for folder in folders:
        if not (folder / IMAGES_FILE).is_file() or not (folder / LABELS_FILE).is_file():
            raise UserError(f"{folder}: not a data sample folder (it needs {IMAGES_FILE} and "
                            f"{LABELS_FILE})")
    own = {folder: read_key(folder) for folder in folders}
    every = set(own.values())
    rings = {folder: sorted(set(read_ring(folder)) | every - {own[folder]}) for folder in folders}
    runs = data_ledger.join(folders)
    for folder, ring in rings.items():
        if ring:
            with writing_in(folder):
                atomic.write_text(folder / RING_FILE, "".join(key + "\n" for key in ring))
                os.chmod(folder / RING_FILE, 0o600)
    return len(every | {k for ring in rings.values() for k in ring}), runs


def of_organization(own: list) -> dict:
    """{folder: its key id} of one organisation's sample folders. A key missing or unusable is
    refused with the command that gives its folder the key of another sample of the organisation
    that has one (its data is under one key), or a new key when none has."""
    ids, problem = {}, None
    for folder in own:
        try:
            ids[folder] = key_id(folder)
        except KeyFileProblem as exc:
            problem = problem or exc
    if problem is not None:
        raise UserError(problem.advice(key_from=next(iter(ids), None)))
    return ids


def rekey_advice(folders: list, key_from: Path | None) -> str:
    """The commands that give `folders` another key: `key_from`'s, or a new one (the earlier ledgers
    of their examples then name them under a key they no longer have: models trained before are not
    compared with later ones)."""
    command = "python scripts/generate_data.py --add-key " + " ".join(
        shlex.quote(str(f)) for f in folders)
    if key_from is not None:
        command += f" --key-from {shlex.quote(str(key_from))}"
    removed = " ".join(shlex.quote(str(Path(f) / KEY_FILE)) for f in folders)
    own = "its own" if len(folders) == 1 else "their own"
    whose = (f"a key of {own}" if key_from is None
             else f"the key of {key_from}, as the rest of their organisation")
    return f"give {' '.join(map(str, folders))} {whose}: remove {removed}, then run: {command}"
