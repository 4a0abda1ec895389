"""A dataset folder as generate_data's own: the manifest that marks it (only such a folder is ever
replaced, and only its own entries), and how a new dataset takes its place without losing anything:
built beside it, moved in entry by entry, a killed run's leftovers removed, and data samples whose
own ledgers record runs never replaced (what they have spent would be lost).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from mnist_dp.privacy.data_ledger import LEDGER_FILE
from mnist_dp.utils import json_input
from mnist_dp.utils.errors import UserError, cannot_write

MANIFEST_FILE = "manifest.json"
# The manifest marks a folder as written by generate_data: only such a folder may be replaced
# (--force), and then only these entries of it.
WRITTEN_BY = "mnist_dp generate_data"
OWN_ENTRIES = ("train", "test", MANIFEST_FILE)
# Manifests written before WRITTEN_BY existed had exactly these keys.
_LEGACY_MANIFEST_KEYS = {"source", "seed", "train_examples", "test_examples", "train_samples"}
# A dataset is built in `.<name>-partial-<pid>-<random>` next to its folder, then moved in; the pid
# tells a killed run's leftover (pid gone) from a run still writing.
_PARTIAL_NAME = re.compile(r"\..+-partial-(?P<pid>[1-9][0-9]{0,6})-[0-9a-f]+")
_PARTIAL_ENTRIES = {*OWN_ENTRIES, "replaced"}


def read_manifest(dest: Path) -> dict | None:
    """`dest`'s manifest.json when generate_data wrote it (the mark that the folder is ours), else
    None."""
    try:
        manifest = json_input.loads((Path(dest) / MANIFEST_FILE).read_text(),
                                    str(Path(dest) / MANIFEST_FILE))
    except (OSError, ValueError):  # missing, unreadable or not JSON: not ours
        return None
    if not isinstance(manifest, dict):
        return None
    return manifest if manifest.get(
        "written_by") == WRITTEN_BY or set(manifest) == _LEGACY_MANIFEST_KEYS else None


def check_output(dest: Path, force: bool) -> None:
    """Refuse an output folder that is a file, holds files we did not write, is ours without
    `force`, or cannot be written (checked up front, before 50-100 MB are built; root passes any
    permission check, and write_dataset still turns a failed write into a UserError)."""
    entries = folder_entries(dest)
    if entries:
        if read_manifest(dest) is None:
            mark = (f"its {MANIFEST_FILE} is unreadable or not generate_data's, so it may hold "
                    f"files generate_data did not write ({listed(entries)}): restore that file, or"
                    if MANIFEST_FILE in entries else
                    f"holds files generate_data did not write ({listed(entries)});")
            raise UserError(f"{dest}: {mark} choose a new or empty folder")
        # before advising --force, which would then be refused for them
        refuse_losing_ledgers(dest)
        if not force:
            raise UserError(f"{dest} already holds data samples generate_data wrote; pass --force "
                            "to replace them (its train/, test/ and manifest.json; other files in "
                            "it are kept)")
    for folder in (dest.parent, dest):
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise cannot_write(folder, "permission denied")


def refuse_losing_ledgers(dest: Path) -> None:
    """Refuse to replace the data samples of `dest` when their own ledgers (data_ledger.LEDGER_FILE)
    record runs released from them: what the data has spent would be lost with them."""
    kept = [p for split in ("train", "test")
            for p in sorted((Path(dest) / split).glob(f"*/{LEDGER_FILE}"))
            if p.stat().st_size]
    if kept:
        raise UserError(f"{dest}: its data samples' own ledgers record the runs released from them "
                        f"({kept[0]}{f' and {len(kept) - 1} more' if len(kept) > 1 else ''}): "
                        "replacing or splitting them again would lose what they have spent; keep "
                        "this folder, and write the new data to another one with the keys of its "
                        "organisations, whose ledgers the new samples then share (--output OTHER "
                        f"--key-from {Path(dest) / 'train' / '0'}, one sample per organisation, "
                        "with generate_data.py; --data OTHER with the scripts)")


def move_in(tmp: Path, dest: Path) -> None:
    """Move the dataset built in `tmp` to `dest` (missing, empty or ours)."""
    if not dest.exists() or not any(dest.iterdir()):
        os.replace(tmp, dest)  # the whole folder in one rename
        return
    # Ours: our entries one by one, the old ones into tmp (removed with it) and the manifest last,
    # so that `dest` still holds our manifest (and stays replaceable) if this is interrupted.
    (tmp / "replaced").mkdir()
    for name in ("train", "test"):
        if os.path.lexists(dest / name):
            os.rename(dest / name, tmp / "replaced" / name)
        os.rename(tmp / name, dest / name)
    os.replace(tmp / MANIFEST_FILE, dest / MANIFEST_FILE)


def remove_abandoned(parent: Path) -> None:
    """Remove the temporary folders that killed generate runs left in `parent`: named and laid out
    as ours, with a writer pid that no longer runs. One whose writer still runs is left alone."""
    try:
        candidates = [p for p in parent.iterdir() if _PARTIAL_NAME.fullmatch(p.name)]
    except OSError:
        return
    for path in candidates:
        pid = int(_PARTIAL_NAME.fullmatch(path.name)["pid"])
        if path.is_symlink() or not path.is_dir() or _running(pid):
            continue
        try:
            if not {p.name for p in path.iterdir()} <= _PARTIAL_ENTRIES:
                continue
            shutil.rmtree(path)
        except OSError:  # not ours to remove after all (permissions): leave it
            continue
        print(f"removed {path}: left by a generate_data run (pid {pid}) that was interrupted")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 sends nothing: it only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        pass
    return True


def folder_entries(dest: Path) -> list:
    """The sorted names in folder `dest` ([] when it does not exist); a file there is refused."""
    if not os.path.lexists(dest):
        return []
    if not dest.is_dir():
        what = "a file" if dest.is_file() else "not a folder"
        raise UserError(f"{dest}: is {what}; the data samples are written to a folder: give the "
                        "path of a new folder")
    try:
        return sorted(p.name for p in dest.iterdir())
    except OSError as exc:
        raise UserError(f"{dest}: cannot read this folder ({exc.strerror}); choose a folder you "
                        "can write to") from None


def listed(names: list, limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
