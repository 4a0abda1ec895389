"""A dataset folder as generate_data writes it: train/<i> and test/0 data samples, and manifest.json, which marks
the folder as ours (only such a folder is ever replaced, and only its own entries). Sources: sources.py; how a
sample is read: samples.py.

Identity keys: one per organisation, which never leaves it (it lets its holder recognise the organisation's
examples in a released ledger). The train samples are split among `organizations` (sample i to organisation
i mod N, as run_local.py and the substrafl example assign them), each organisation's under its own key, as a
deployment has it; the test set, which every organisation may be given to evaluate on, has a key of its own.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
from pathlib import Path

import numpy as np

from mnist_dp.data import keys as identity_keys
from mnist_dp.data.samples import IMAGES_FILE, LABELS_FILE, opener, read_key, sample_fingerprint
from mnist_dp.data.sources import EMBEDDED_SOURCE, checked_arrays, load_source, split_train_test, stratified_indices
from mnist_dp.privacy.data_ledger import LEDGER_FILE
from mnist_dp.utils import json_input
from mnist_dp.utils.errors import UserError, cannot_write, writing_in

MANIFEST_FILE = "manifest.json"
DEFAULT_TRAIN_SIZE, DEFAULT_TEST_SIZE, DEFAULT_SEED = 4000, 1000, 0
MAX_EXAMPLES = 100_000_000  # examples (or samples) asked of one source: far more than any MNIST-format data set

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


def write_sample(folder: Path, images: np.ndarray, labels: np.ndarray, key: str) -> None:
    folder.mkdir(parents=True)
    np.save(folder / IMAGES_FILE, np.ascontiguousarray(images, dtype=np.uint8))
    np.save(folder / LABELS_FILE, np.ascontiguousarray(labels, dtype=np.uint8))
    identity_keys.write_key(folder, key)


def read_manifest(dest: Path) -> dict | None:
    """`dest`'s manifest.json when generate_data wrote it (the mark that the folder is ours), else None."""
    try:
        manifest = json_input.loads((Path(dest) / MANIFEST_FILE).read_text(), str(Path(dest) / MANIFEST_FILE))
    except (OSError, ValueError):  # missing, unreadable or not JSON: not ours
        return None
    if not isinstance(manifest, dict):
        return None
    return manifest if manifest.get("written_by") == WRITTEN_BY or set(manifest) == _LEGACY_MANIFEST_KEYS else None


def write_dataset(dest: Path, train, test, train_samples: int, manifest: dict, force: bool = False,
                  organizations: int = 1, keys: tuple = (), test_key: str | None = None) -> dict:
    """Write ``dest/train/<i>`` (train split in `train_samples` folders, sample i under the key of organisation
    i mod `organizations`), ``dest/test/0`` (under a key of its own) and ``dest/manifest.json``, which marks the
    folder as ours. `keys`: the first organisations' keys (the others get new ones); `test_key`: the test set's.

    `dest` must be missing, empty or ours; `force` replaces our entries of it (train/, test/,
    manifest.json) and keeps anything else. Built in a temporary folder next to `dest` and moved into
    place, so an interrupted run leaves no half dataset. Returns the manifest.
    """
    dest = Path(dest)
    train_samples = _at_least_one("--train-samples", train_samples)
    if train_samples > len(train[1]):
        raise UserError(f"--train-samples {train_samples}: more than the {len(train[1])} train examples; "
                        f"give at most {len(train[1])}")
    organizations = _at_least_one("--organizations", organizations)
    if organizations > train_samples:
        raise UserError(f"--organizations {organizations}: more than the {train_samples} train data sample(s) "
                        f"(--train-samples); give --train-samples {organizations} or more")
    if len(keys) > organizations:
        raise UserError(f"--key-from: {len(keys)} samples for {organizations} organisation(s); give at most one per "
                        "organisation, in order")
    _check_output(dest, force)
    parts = np.array_split(np.arange(len(train[1])), train_samples)
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{parent}: cannot create this folder ({exc.strerror}); "
                        "choose a folder you can write to") from None
    _remove_abandoned(parent)
    with writing_in(parent):
        tmp = parent / f".{dest.name}-partial-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
    try:
        with writing_in(parent):
            keys = [*keys, *(identity_keys.new_key() for _ in range(organizations - len(keys)))]  # one per organisation
            for i, part in enumerate(parts):
                write_sample(tmp / "train" / str(i), train[0][part], train[1][part], keys[i % organizations])
            write_sample(tmp / "test" / "0", *test, test_key or identity_keys.new_key())
            folders = [f"train/{i}" for i in range(train_samples)] + ["test/0"]
            manifest = {**manifest, "written_by": WRITTEN_BY, "train_examples": int(len(train[1])),
                        "test_examples": int(len(test[1])), "train_samples": train_samples,
                        "organizations": organizations,
                        # Tells data nobody changed since (generate_default_if_missing may split it again).
                        "sample_fingerprints": {f: sample_fingerprint(tmp / f) for f in folders}}
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        with writing_in(dest):
            _move_in(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def without_copies(images: np.ndarray, labels: np.ndarray) -> tuple:
    """(images, labels) with every copy of an earlier example removed (the same image and label, as the opener
    sees them), and how many were removed: a train task refuses copies, which would be accounted once."""
    pixels = images.astype(np.float32) / 255.0 if images.dtype == np.uint8 else images
    seen, keep = set(), []
    for i, digest in enumerate(opener().example_digests(pixels, labels)):
        if digest not in seen:
            seen.add(digest)
            keep.append(i)
    return images[keep], labels[keep], len(labels) - len(keep)


def _check_output(dest: Path, force: bool) -> None:
    """Refuse an output folder that is a file, holds files we did not write, is ours without `force`,
    or cannot be written (checked up front, before 50-100 MB are built; root passes any permission
    check, and write_dataset still turns a failed write into a UserError)."""
    entries = _entries(dest)
    if entries:
        if read_manifest(dest) is None:
            mark = (f"its {MANIFEST_FILE} is unreadable or not generate_data's, so it may hold files generate_data did "
                    f"not write ({_listed(entries)}): restore that file, or" if MANIFEST_FILE in entries else
                    f"holds files generate_data did not write ({_listed(entries)});")
            raise UserError(f"{dest}: {mark} choose a new or empty folder")
        if not force:
            raise UserError(f"{dest} already holds data samples generate_data wrote; pass --force to replace them "
                            "(its train/, test/ and manifest.json; other files in it are kept)")
        refuse_losing_ledgers(dest)
    for folder in (dest.parent, dest):
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise cannot_write(folder, "permission denied")


def refuse_losing_ledgers(dest: Path) -> None:
    """Refuse to replace the data samples of `dest` when their own ledgers (data_ledger.LEDGER_FILE) record runs
    released from them: what the data has spent would be lost with them."""
    kept = [p for split in ("train", "test") for p in sorted((Path(dest) / split).glob(f"*/{LEDGER_FILE}"))
            if p.stat().st_size]
    if kept:
        raise UserError(f"{dest}: its data samples' own ledgers record the runs released from them ({kept[0]}"
                        f"{f' and {len(kept) - 1} more' if len(kept) > 1 else ''}): replacing or splitting them again "
                        "would lose what they have spent; keep this folder, and write the new data to another one "
                        "(--output of generate_data.py, --data of the scripts)")


def _move_in(tmp: Path, dest: Path) -> None:
    """Move the dataset built in `tmp` to `dest` (missing, empty or ours)."""
    if not dest.exists() or not any(dest.iterdir()):
        os.replace(tmp, dest)  # the whole folder in one rename
        return
    # Ours: our entries one by one, the old ones into tmp (removed with it) and the manifest last, so
    # that `dest` still holds our manifest (and stays replaceable) if this is interrupted.
    (tmp / "replaced").mkdir()
    for name in ("train", "test"):
        if os.path.lexists(dest / name):
            os.rename(dest / name, tmp / "replaced" / name)
        os.rename(tmp / name, dest / name)
    os.replace(tmp / MANIFEST_FILE, dest / MANIFEST_FILE)


def _remove_abandoned(parent: Path) -> None:
    """Remove the temporary folders that killed generate runs left in `parent`: named and laid out as
    ours, with a writer pid that no longer runs. One whose writer still runs is left alone."""
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


def _entries(dest: Path) -> list:
    """The sorted names in folder `dest` ([] when it does not exist); a file there is refused."""
    if not os.path.lexists(dest):
        return []
    if not dest.is_dir():
        what = "a file" if dest.is_file() else "not a folder"
        raise UserError(f"{dest}: is {what}; the data samples are written to a folder: give the path of a new folder")
    try:
        return sorted(p.name for p in dest.iterdir())
    except OSError as exc:
        raise UserError(f"{dest}: cannot read this folder ({exc.strerror}); choose a folder you can write to") from None


def _listed(names: list, limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def sample_folders(dest: Path, split: str) -> list:
    """The data sample folders of one split ('train' or 'test') written by `write_dataset`."""
    root = Path(dest) / split
    found = (p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ()
    folders = sorted(found, key=lambda p: (len(p.name), p.name))
    if not folders:
        raise UserError(f"{root}: no data sample folders; write data samples with: python scripts/generate_data.py "
                        f"--output {shlex.quote(str(Path(dest)))}" + (" --force" if read_manifest(dest) else ""))
    return folders


def check_organization_keys(data_dir: Path, holdings: list, test_everywhere: bool = False) -> None:
    """Refuse a split of `data_dir` among organisations (`holdings`: each one's train sample folders) that a
    deployment could not have: a sample without a usable key, an organisation's data under several identity keys
    (its ε would be counted as several organisations'), two organisations under one key (either could recognise the
    other's examples in a released ledger), or a test set under the key of an organisation it would be registered
    beside (the first one's; every one's with `test_everywhere`). The advice gives the commands that fix it, keeping
    every key that can stay."""
    data_dir = Path(data_dir)
    test_folders = sample_folders(data_dir, "test")
    keys = [identity_keys.of_organization(own) for own in [*holdings, test_folders]]
    test = keys.pop()
    problem = None
    for k, own in enumerate(keys, 1):
        if len(set(own.values())) > 1:
            first = next(iter(own.values()))
            others = [folder for folder, key in own.items() if key != first]
            problem = (f"organisation {k}'s train data samples are under {len(set(own.values()))} identity keys; one "
                       "organisation's data is under one key", others, next(iter(own)))
            break
        shared = [j for j, other in enumerate(keys[:k - 1], 1) if set(other.values()) & set(own.values())]
        if shared:
            problem = (f"organisations {shared[0]} and {k} hold data under one identity key; each organisation's key "
                       "must be its own: a shared key lets either recognise the other's examples in a released ledger",
                       list(own), None)
            break
    else:
        reached = [k for k, own in enumerate(keys, 1)  # registered beside another organisation's data
                   if set(own.values()) & set(test.values()) and (test_everywhere and len(keys) > 1 or k > 1)]
        if reached:
            problem = (f"the test data is under organisation {reached[0]}'s identity key and would be registered at "
                       "another organisation, which could then recognise that organisation's examples in a released "
                       "ledger; the test data needs a key of its own", list(test), None)
    if problem is not None:
        what, rekeyed, key_from = problem
        raise UserError(f"{data_dir}: {what}; {identity_keys.rekey_advice(rekeyed, key_from)}")


def check_output_outside(data_dir: Path, output: Path, flag: str = "--output") -> None:
    """Refuse an output folder that is the data folder or inside it, before anything is written there: the run's
    files (Substra's work files, the lock, the reports) would sit among the data samples, and a later run would
    read them as samples."""
    data_dir, output = Path(data_dir).resolve(), Path(output).resolve()
    if output == data_dir or data_dir in output.parents:
        raise UserError(f"{flag} {output}: is inside the data folder {data_dir}; the run's files would be mixed with "
                        "the data samples: choose an output folder outside it")


def split_advice(data_dir: Path, train_samples: int, organizations: int = 1) -> str:
    """How to give `data_dir` at least `train_samples` train samples for `organizations`: the generate_data command
    that writes it again when it is as generate_data wrote it (so that the command loses nothing), else how to by
    hand."""
    manifest = _as_written(Path(data_dir))
    if manifest is None:  # a user's samples, or changed ones: never written over
        other = Path(data_dir).resolve().parent / f"{Path(data_dir).name}-{train_samples}-samples"
        return (f"split its train samples into at least {train_samples} folders yourself (docs/data.md), or give "
                f"--data new data written with: python scripts/generate_data.py --output {shlex.quote(str(other))} "
                f"--train-samples {train_samples} --organizations {organizations}")
    return "write it again with: " + regenerate_command(data_dir, manifest, organizations, train_samples)


def regenerate_command(data_dir: Path, manifest: dict, organizations: int, train_samples: int = 1) -> str:
    """The generate_data command that writes `data_dir` (ours, `manifest`) again for `organizations`, in at least
    `train_samples` train samples, with the same examples: each organisation it was written for keeps its key
    (--key-from, organisation k's from its first sample, train/k-1, as the scripts' own re-split keeps them), a new
    one gets a new key."""
    source = manifest.get("source")
    parts = ["python scripts/generate_data.py --output", shlex.quote(str(data_dir))]
    sizes = (manifest.get("train_examples"), manifest.get("test_examples"))
    given_sizes = ["--train-size", str(sizes[0]), "--test-size", str(sizes[1])]
    if source and source != EMBEDDED_SOURCE:
        parts += ["--source", shlex.quote(str(source)), *given_sizes]
    elif source == EMBEDDED_SOURCE and sizes != (DEFAULT_TRAIN_SIZE, DEFAULT_TEST_SIZE):
        parts += given_sizes
    parts += ["--seed", str(manifest.get("seed", DEFAULT_SEED)),
              "--train-samples", str(max(organizations, train_samples, manifest.get("train_samples") or 1)),
              "--organizations", str(organizations), "--force"]
    kept = []
    for k in range(min(manifest.get("organizations") or 1, organizations)):
        try:
            read_key(Path(data_dir) / "train" / str(k))
        except UserError:
            break  # no key to keep from here on
        kept.append(shlex.quote(str(Path(data_dir) / "train" / str(k))))
    return " ".join(parts + (["--key-from", *kept] if kept else []))


def _at_least_one(flag: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{flag} {value}: must be a whole number, at least 1")
    return int(value)


def generate(dest: Path, source: Path | None = None, train_size: int | None = None, test_size: int | None = None,
             train_samples: int | None = None, seed: int = DEFAULT_SEED, force: bool = False,
             organizations: int = 1, keys: tuple = (), test_key: str | None = None) -> dict:
    """Build the train/test data samples in `dest` from `source` (None: the embedded subset; see the module
    docstring) and return the manifest. Deterministic for a seed, but for the identity keys (`keys`, `test_key`:
    reuse these; write_dataset). `train_size`, `test_size`: examples, None for 4000 / 1000 of the embedded data or
    all of a source; `train_samples`: data sample folders, one per organisation if None; `organizations`: how many
    hold the train samples, each under its own key; `force`: write into a non-empty `dest`."""
    organizations = _at_least_one("--organizations", organizations)
    train_samples = organizations if train_samples is None else train_samples
    train_size = None if train_size is None else _at_least_one("--train-size", train_size)
    test_size = None if test_size is None else _at_least_one("--test-size", test_size)
    # Before the source is loaded (seconds); write_dataset checks both again.
    _at_least_one("--train-samples", train_samples)
    _check_output(Path(dest), force)
    loaded = load_source(source)
    if source is None:  # one labelled set: split it ourselves
        images, labels, _ = without_copies(*loaded)
        train, test = split_train_test(images, labels, DEFAULT_TRAIN_SIZE if train_size is None else train_size,
                                       DEFAULT_TEST_SIZE if test_size is None else test_size, seed)
    else:
        rng = np.random.default_rng(seed)
        parts = []
        for (x, y), split, flag, size in zip(loaded, ("train", "test"), ("--train-size", "--test-size"),
                                             (train_size, test_size)):
            x, y = checked_arrays(x, y, source, split)
            if split == "train":
                x, y, removed = without_copies(x, y)
                if removed:
                    print(f"{source}: left out {removed} train example(s) that are copies of others (the same image "
                          "and label): each would be trained on twice but accounted once")
            if size is not None and size > len(y):
                raise UserError(f"{flag} {size}: the source has only {len(y)} {split} examples")
            picked = stratified_indices(y, len(y) if size is None else size, rng)
            parts.append((x[picked], y[picked]))
        train, test = parts
    # The source resolved: the regenerate command (regenerate_command) works from any working directory.
    manifest = {"source": EMBEDDED_SOURCE if source is None else str(Path(source).resolve()), "seed": seed}
    return write_dataset(dest, train, test, train_samples, manifest, force=force, organizations=organizations,
                         keys=keys, test_key=test_key)


def default_folder(organizations: int) -> Path:
    """The scripts' data folder when the user names none: `data`, or for N > 1 organisations a folder of its own
    (the default data split for one number of organisations cannot be split again for another once its own
    ledgers record runs: refuse_losing_ledgers)."""
    return Path("data") if organizations == 1 else Path(f"data-{organizations}-organizations")


DEFAULT_FOLDER_HELP = "default: data, or data-N-organizations with --organizations N"


def generate_default_if_missing(dest: Path, train_samples: int, flag: str = "--train-samples",
                                organizations: int = 1, dry_run: bool = False) -> list | None:
    """The scripts' first run: write the embedded default data to `dest` unless it holds data samples, split among
    `organizations`, each under its own key. The default data written here, unchanged since, is split again when it
    has fewer than `train_samples` train samples or was written for another number of organisations; any other
    data is left as it is. `flag`: the script's option that asked for `train_samples`, which errors name (the user
    gave no --train-samples). `dry_run`: write nothing, and return the train examples of each sample it would write
    (None: none), which a run checks before it writes anything."""
    dest = Path(dest)
    _at_least_one(flag, train_samples)
    entries = _entries(dest)
    sizes = [len(part) for part in np.array_split(np.arange(DEFAULT_TRAIN_SIZE), train_samples)]
    if (dest / "train").is_dir():
        held = sum(p.is_dir() for p in (dest / "train").iterdir())
        written_for = (read_manifest(dest) or {}).get("organizations")
        if (held < train_samples or written_for != organizations) and _is_unchanged_default(dest):
            _check_default_holds(train_samples, flag)
            if dry_run:
                return sizes
            print(f"{dest}: splitting the default data again into {train_samples} train samples for {organizations} "
                  f"organisation(s) (it had {held}; the same examples)")
            # Organisation k keeps its key (a model trained on the earlier split can be compared example by
            # example); data written before the test set had a key of its own gets new keys throughout.
            kept = () if written_for is None else tuple(read_key(dest / "train" / str(k))
                                                        for k in range(min(written_for, organizations)))
            generate(dest, train_samples=train_samples, force=True, organizations=organizations, keys=kept,
                     test_key=read_key(dest / "test" / "0") if written_for else None)
        return None
    if entries:
        raise UserError(f"{dest}: holds no data samples (no train/ folder) but other files ({_listed(entries)}); "
                        "give --data a folder of data samples written by scripts/generate_data.py, or a new folder")
    _check_default_holds(train_samples, flag)
    if dry_run:
        return sizes
    manifest = generate(dest, train_samples=train_samples, organizations=organizations)
    print(f"generated {manifest['train_examples']} train / {manifest['test_examples']} test examples in {dest}"
          + (f" for {organizations} organisations, each under its own identity key" if organizations > 1 else ""))
    return None


def _check_default_holds(train_samples: int, flag: str) -> None:
    if train_samples > DEFAULT_TRAIN_SIZE:
        raise UserError(f"{flag} {train_samples}: the default data has {DEFAULT_TRAIN_SIZE:,} train examples, fewer "
                        f"than one for each; give at most {DEFAULT_TRAIN_SIZE:,}, or --data a folder of more data "
                        "samples (scripts/generate_data.py --source)")


def _is_unchanged_default(dest: Path) -> bool:
    """Whether `dest` holds the embedded default data as `generate` wrote it, no file changed or added."""
    manifest = _as_written(dest)
    expected = {"written_by": WRITTEN_BY, "source": EMBEDDED_SOURCE, "seed": DEFAULT_SEED,
                "train_examples": DEFAULT_TRAIN_SIZE, "test_examples": DEFAULT_TEST_SIZE}
    return manifest is not None and all(manifest.get(key) == value for key, value in expected.items())


def _as_written(dest: Path) -> dict | None:
    """`dest`'s manifest if every data sample in it is as `generate` wrote it (none changed, none added), else None:
    only then may a command write it again without losing a user's sample."""
    manifest = read_manifest(dest)
    recorded = (manifest or {}).get("sample_fingerprints")
    present = {f"{split}/{p.name}" for split in ("train", "test") if (dest / split).is_dir()
               for p in (dest / split).iterdir()}
    if not isinstance(recorded, dict) or set(recorded) != present:
        return None
    try:
        unchanged = all(sample_fingerprint(dest / folder) == fingerprint for folder, fingerprint in recorded.items())
    except OSError:
        return None
    return manifest if unchanged else None
