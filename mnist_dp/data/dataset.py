"""A dataset folder as generate_data writes it: train/<i> and test/0 data samples, and
manifest.json, which marks the folder as ours (only such a folder is ever replaced, and only its own
entries). Sources: sources.py; how a sample is read: samples.py.

Identity keys: one per organisation, which never leaves it (it lets its holder recognise the
organisation's examples in a released ledger). The train samples are split among `organizations`
(sample i to organisation i mod N, as run_local.py and the substrafl example assign them), each
organisation's under its own key, as a deployment has it; the test set, which every organisation may
be given to evaluate on, has a key of its own.
"""
from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
from pathlib import Path

import numpy as np

from mnist_dp.data import dataset_folder, subjects
from mnist_dp.data import keys as identity_keys
from mnist_dp.data.dataset_folder import MANIFEST_FILE, WRITTEN_BY, read_manifest
from mnist_dp.data.samples import IMAGES_FILE, LABELS_FILE, read_key, sample_fingerprint
from mnist_dp.data.sources import (
    EMBEDDED_SOURCE,
    checked_arrays,
    load_source,
    split_train_test,
    stratified_indices,
    without_copies,
)
from mnist_dp.privacy import data_ledger, policy
from mnist_dp.utils.errors import UserError, writing_in
from mnist_dp.utils.words import counted

DEFAULT_TRAIN_SIZE, DEFAULT_TEST_SIZE, DEFAULT_SEED = 4000, 1000, 0
# examples (or samples) asked of one source: far more than any MNIST-format data set
MAX_EXAMPLES = 100_000_000


def write_sample(folder: Path, images: np.ndarray, labels: np.ndarray, key: str,
                 persons: np.ndarray | None = None, public: bool = False) -> None:
    """Write one data sample folder: its images and labels as uint8 .npy files, its identity key,
    each image's person when given, and with `public` its units as its declared public size.

    Args:
      folder, images, labels: the folder to make (it must not exist), the images, the labels.
      key: its identity key, as hex text.
      persons: each image's person (subjects.npy), or None.
    """
    folder.mkdir(parents=True)
    np.save(folder / IMAGES_FILE, np.ascontiguousarray(images, dtype=np.uint8))
    np.save(folder / LABELS_FILE, np.ascontiguousarray(labels, dtype=np.uint8))
    if persons is not None:
        subjects.write(folder, persons)
    identity_keys.write_key(folder, key)
    if public:
        policy.declare_size(folder, len(labels) if persons is None else len(np.unique(persons)))


def write_dataset(dest: Path, train, test, train_samples: int, manifest: dict, force: bool = False,
                  organizations: int = 1, keys: tuple = (), test_key: str | None = None) -> dict:
    """Write ``dest/train/<i>``, ``dest/test/0`` and ``dest/manifest.json``, which marks the folder
    as ours. Built in a temporary folder next to `dest` and moved into place, so an interrupted run
    leaves no half dataset.

    Args:
      dest: the dataset folder: missing, empty or ours.
      train: (images, labels) of the train split.
      test: (images, labels) of the test split, written as test/0 under a key of its own.
      train_samples: the data sample folders the train split is cut into; sample i is under the key
        of organisation i mod `organizations`.
      manifest: what the manifest records besides what is written here (the source, the seed,
        and "images_per_subject", [LO, HI], when the train samples name persons: subjects.py).
      force: replace our entries of `dest` (train/, test/, manifest.json), keeping anything else.
      organizations: how many organisations hold the train samples.
      keys: the first organisations' keys (the others get new ones).
      test_key: the test set's key (None: a new one).

    Returns:
      The manifest written.
    """
    dest = Path(dest)
    train_samples = _at_least_one("--train-samples", train_samples)
    if train_samples > len(train[1]):
        raise UserError(f"--train-samples {train_samples}: more than the {len(train[1])} train "
                        f"examples; give at most {len(train[1])}")
    organizations = _at_least_one("--organizations", organizations)
    if organizations > train_samples:
        raise UserError(f"--organizations {organizations}: more than the "
                        f"{counted(train_samples, 'train data sample')} (--train-samples); give "
                        f"--train-samples {organizations} or more")
    if len(keys) > organizations:
        raise UserError(f"--key-from: {counted(len(keys), 'sample')} for "
                        f"{counted(organizations, 'organisation')}; give at most one per "
                        "organisation, in order")
    dataset_folder.check_output(dest, force)
    parts = np.array_split(np.arange(len(train[1])), train_samples)
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{parent}: cannot create this folder ({exc.strerror}); choose a folder "
                        "you can write to") from None
    dataset_folder.remove_abandoned(parent)
    with writing_in(parent):
        tmp = parent / f".{dest.name}-partial-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
    try:
        with writing_in(parent):
            # one per organisation
            keys = [*keys, *(identity_keys.new_key() for _ in range(organizations - len(keys)))]
            sizes, rng = manifest.get("images_per_subject"), np.random.default_rng(
                [manifest.get("seed", DEFAULT_SEED), 1])
            for i, part in enumerate(parts):  # sizes the generator chose: its public declaration
                persons = None if sizes is None else subjects.assign(len(part), sizes, rng,
                                                                     first=int(part[0]))
                write_sample(tmp / "train" / str(i), train[0][part], train[1][part],
                             keys[i % organizations], persons, public=True)
            write_sample(tmp / "test" / "0", *test, test_key or identity_keys.new_key())
            folders = [f"train/{i}" for i in range(train_samples)] + ["test/0"]
            manifest = {**manifest, "written_by": WRITTEN_BY, "train_examples": int(len(train[1])),
                        "test_examples": int(len(test[1])), "train_samples": train_samples,
                        "organizations": organizations,
                        # Tells data nobody changed since
                        # (generate_default_if_missing may split it again).
                        "sample_fingerprints": {f: sample_fingerprint(tmp / f) for f in folders}}
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        with writing_in(dest):
            dataset_folder.move_in(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def sample_folders(dest: Path, split: str) -> list:
    """The data sample folders of one split ('train' or 'test') written by `write_dataset`."""
    root = Path(dest) / split
    found = (p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ()
    folders = sorted(found, key=lambda p: (len(p.name), p.name))
    if not folders:
        force = " --force" if read_manifest(dest) else ""
        raise UserError(f"{root}: no data sample folders; write data samples with: python "
                        f"scripts/generate_data.py --output {shlex.quote(str(Path(dest)))}{force}")
    return folders


def check_organization_keys(data_dir: Path, holdings: list, test_everywhere: bool = False) -> None:
    """Refuse a split of `data_dir` among organisations that a deployment could not have: a sample
    without a usable key, an organisation's data under several identity keys (its ε would be counted
    as several organisations'), two organisations under one key (either could recognise the other's
    examples in a released ledger), or a test set under the key of an organisation it would be
    registered beside. The advice gives the commands that fix it, keeping every key that can stay.

    Args:
      data_dir: the data folder (its test samples are read from it).
      holdings: each organisation's train sample folders, in order.
      test_everywhere: the test set is registered beside every organisation, not the first one's
        only.
    """
    data_dir = Path(data_dir)
    test_folders = sample_folders(data_dir, "test")
    keys = [identity_keys.of_organization(own) for own in [*holdings, test_folders]]
    test = keys.pop()
    problem = None
    for k, own in enumerate(keys, 1):
        if len(set(own.values())) > 1:
            first = next(iter(own.values()))
            others = [folder for folder, key in own.items() if key != first]
            problem = (f"organisation {k}'s train data samples are under {len(set(own.values()))} "
                       "identity keys; one organisation's data is under one key", others,
                       next(iter(own)))
            break
        shared = [j for j, other in enumerate(keys[:k - 1], 1)
                  if set(other.values()) & set(own.values())]
        if shared:
            problem = (f"organisations {shared[0]} and {k} hold data under one identity key; each "
                       "organisation's key must be its own: a shared key lets either recognise the "
                       "other's examples in a released ledger", list(own), None)
            break
    else:
        # registered beside another organisation's data
        reached = [k for k, own in enumerate(keys, 1)
                   if set(own.values()) & set(test.values())
                   and (test_everywhere and len(keys) > 1 or k > 1)]
        if reached:
            problem = (f"the test data is under organisation {reached[0]}'s identity key and would "
                       "be registered at another organisation, which could then recognise that "
                       "organisation's examples in a released ledger; the test data needs a key of "
                       "its own", list(test), None)
    if problem is not None:
        what, rekeyed, key_from = problem
        raise UserError(f"{data_dir}: {what}; {identity_keys.rekey_advice(rekeyed, key_from)}")


def check_apart(data_dir: Path, output: Path, flag: str = "--output") -> None:
    """Refuse (UserError naming `flag`) an output folder `output` that is the data folder
    `data_dir`, inside it or holding it, before anything is written: the run's files would sit
    among the samples, or the run would set the data aside as an earlier run's reports."""
    data_dir, output = Path(data_dir).resolve(), Path(output).resolve()
    if output == data_dir or data_dir in output.parents:
        raise UserError(f"{flag} {output}: is inside the data folder {data_dir}; the run's files "
                        "would be mixed with the data samples: choose an output folder outside it")
    if output in data_dir.parents:
        raise UserError(f"--data {data_dir}: is inside the output folder {output}, where a run "
                        "sets an earlier run's reports aside: keep the data outside it, or choose "
                        f"another {flag}")


def split_advice(data_dir: Path, train_samples: int, organizations: int = 1) -> str:
    """How to give `data_dir` at least `train_samples` train samples for `organizations`.

    Args:
      data_dir: the data folder.
      train_samples: the train samples it needs.
      organizations: the organisations they are for.

    Returns:
      The generate_data command that writes it again when it is as generate_data wrote it (so that
      the command loses nothing), else how to by hand, or the command that writes new data beside
      it.
    """
    manifest = _as_written(Path(data_dir))
    if manifest is None:  # a user's samples, or changed ones: never written over
        other = Path(data_dir).resolve().parent / f"{Path(data_dir).name}-{train_samples}-samples"
        return (f"split its train samples into at least {train_samples} folders yourself "
                "(docs/data.md), or give --data new data written with: python "
                f"scripts/generate_data.py --output {shlex.quote(str(other))} --train-samples "
                f"{train_samples} --organizations {organizations}")
    return "write it again with: " + regenerate_command(data_dir, manifest, organizations,
                                                        train_samples)


def regenerate_command(data_dir: Path, manifest: dict, organizations: int,
                       train_samples: int = 1) -> str:
    """The generate_data command that writes `data_dir` again, with the same examples: each
    organisation it was written for keeps its key (--key-from, organisation k's from its first
    sample, train/k-1, as the scripts' own re-split keeps them), a new one gets a new key.

    Args:
      data_dir: the data folder (ours).
      manifest: its manifest.
      organizations: the organisations to write it for.
      train_samples: the fewest train samples to write; no fewer than `organizations`, nor than the
        manifest records, are written.

    Returns:
      The command line, its arguments shell-quoted.
    """
    source = manifest.get("source")
    parts = ["python scripts/generate_data.py --output", shlex.quote(str(data_dir))]
    sizes = (manifest.get("train_examples"), manifest.get("test_examples"))
    given_sizes = ["--train-size", str(sizes[0]), "--test-size", str(sizes[1])]
    if source and source != EMBEDDED_SOURCE:
        parts += ["--source", shlex.quote(str(source)), *given_sizes]
    elif source == EMBEDDED_SOURCE and sizes != (DEFAULT_TRAIN_SIZE, DEFAULT_TEST_SIZE):
        parts += given_sizes
    if manifest.get("images_per_subject"):
        parts += ["--images-per-subject", "-".join(map(str, manifest["images_per_subject"]))]
    parts += ["--seed", str(manifest.get("seed", DEFAULT_SEED)), "--train-samples",
              str(max(organizations, train_samples, manifest.get("train_samples") or 1)),
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


def generate(dest: Path, source: Path | None = None, train_size: int | None = None,
             test_size: int | None = None, train_samples: int | None = None,
             seed: int = DEFAULT_SEED, force: bool = False, organizations: int = 1,
             keys: tuple = (), test_key: str | None = None,
             images_per_subject: tuple | None = None, key_from: tuple = ()) -> dict:
    """Build the train/test data samples in `dest` from `source`. Deterministic for a seed, but for
    the identity keys.

    Args:
      dest: the dataset folder.
      source: a folder of MNIST IDX files or a .npz file; None: the embedded subset (see the module
        docstring).
      train_size: train examples; None for 4000 of the embedded data or all of a source.
      test_size: test examples; None for 1000 of the embedded data or all of a source.
      train_samples: data sample folders; None: one per organisation.
      seed: the seed of the examples drawn.
      force: write into a non-empty `dest`.
      organizations: how many hold the train samples, each under its own key.
      keys: identity keys to reuse, the first organisations' (write_dataset).
      test_key: the test set's identity key to reuse (write_dataset).
      images_per_subject: (LO, HI) images per person of the train samples' subjects.npy
        (subjects.parse); None: none written, each image its own person.
      key_from: sample folders whose keys the first organisations take, and ledgers (follow).

    Returns:
      The manifest.
    """
    # checked before anything is written
    keys = keys or tuple(read_key(data_ledger.check_follow(f, dest)) for f in key_from)
    organizations = _at_least_one("--organizations", organizations)
    train_samples = organizations if train_samples is None else train_samples
    train_size = None if train_size is None else _at_least_one("--train-size", train_size)
    test_size = None if test_size is None else _at_least_one("--test-size", test_size)
    # Before the source is loaded (seconds); write_dataset checks both again.
    _at_least_one("--train-samples", train_samples)
    dataset_folder.check_output(Path(dest), force)
    loaded = load_source(source)
    if source is None:  # one labelled set: split it ourselves
        images, labels, _ = without_copies(*loaded)
        train, test = split_train_test(images, labels, DEFAULT_TRAIN_SIZE if train_size is None
                                       else train_size,
                                       DEFAULT_TEST_SIZE if test_size is None else test_size, seed)
    else:
        rng = np.random.default_rng(seed)
        parts = []
        for (x, y), split, flag, size in zip(loaded, ("train", "test"),
                                             ("--train-size", "--test-size"),
                                             (train_size, test_size)):
            x, y = checked_arrays(x, y, source, split)
            if split == "train":
                x, y, removed = without_copies(x, y)
                if removed:
                    print(f"{source}: left out {counted(removed, 'train example')}, copies of "
                          "others (the same image and label): each would be trained on twice but "
                          "accounted once")
            if size is not None and size > len(y):
                raise UserError(f"{flag} {size}: the source has only {len(y)} {split} examples")
            picked = stratified_indices(y, len(y) if size is None else size, rng)
            parts.append((x[picked], y[picked]))
        train, test = parts
    # The source resolved: the regenerate command (regenerate_command) works
    # from any working directory.
    manifest = {"source": EMBEDDED_SOURCE if source is None else str(Path(source).resolve()),
                "seed": seed, **({"images_per_subject": list(images_per_subject)}
                                 if images_per_subject else {})}
    manifest = write_dataset(dest, train, test, train_samples, manifest, force=force,
                             organizations=organizations, keys=keys, test_key=test_key)
    for k, folder in enumerate(key_from):
        data_ledger.follow(folder, sample_folders(dest, "train")[k::organizations])
    return manifest


def default_folder(organizations: int) -> Path:
    """The scripts' data folder when the user names none: `data`, or for N > 1 organisations a
    folder of its own (the default data split for one number of organisations cannot be split again
    for another once its own ledgers record runs: dataset_folder.refuse_losing_ledgers)."""
    return Path("data") if organizations == 1 else Path(f"data-{organizations}-organizations")


DEFAULT_FOLDER_HELP = "default: data, or data-N-organizations with --organizations N"


def generate_default_if_missing(dest: Path, train_samples: int, flag: str = "--train-samples",
                                organizations: int = 1, dry_run: bool = False) -> list | None:
    """The scripts' first run: write the embedded default data to `dest` unless it holds data
    samples, split among `organizations`, each under its own key. The default data written here,
    unchanged since, is split again when it has fewer than `train_samples` train samples or was
    written for another number of organisations; any other data is left as it is.

    Args:
      dest: the data folder.
      train_samples: the train samples the run needs.
      flag: the script's option that asked for `train_samples`, which errors name (the user gave no
        --train-samples).
      organizations: the organisations the train samples are split among.
      dry_run: write nothing.

    Returns:
      With `dry_run`, the train examples of each sample it would write (None: none), which a run
      checks before it writes anything; else None.
    """
    dest = Path(dest)
    _at_least_one(flag, train_samples)
    entries = dataset_folder.folder_entries(dest)
    sizes = [len(part) for part in np.array_split(np.arange(DEFAULT_TRAIN_SIZE), train_samples)]
    if (dest / "train").is_dir():
        held = sum(p.is_dir() for p in (dest / "train").iterdir())
        written_for = (read_manifest(dest) or {}).get("organizations")
        if (held < train_samples or written_for != organizations) and _is_unchanged_default(dest):
            _check_default_holds(train_samples, flag)
            if dry_run:
                return sizes
            print(f"{dest}: splitting the default data again into {train_samples} train samples "
                  f"for {counted(organizations, 'organisation')} (it had {held}; same examples)")
            # Organisation k keeps its key (a model trained on the earlier split can be
            # compared example by example); data written before the test set had a key of its
            # own gets new keys throughout.
            kept = () if written_for is None else tuple(
                read_key(dest / "train" / str(k)) for k in range(min(written_for, organizations)))
            generate(dest, train_samples=train_samples, force=True, organizations=organizations,
                     keys=kept, test_key=read_key(dest / "test" / "0") if written_for else None)
        return None
    if entries:
        raise UserError(f"{dest}: holds no data samples (no train/ folder) but other files "
                        f"({dataset_folder.listed(entries)}); give --data a folder of data samples "
                        "written by scripts/generate_data.py, or a new folder")
    _check_default_holds(train_samples, flag)
    if dry_run:
        return sizes
    manifest = generate(dest, train_samples=train_samples, organizations=organizations)
    print(f"generated {manifest['train_examples']} train / {manifest['test_examples']} test "
          f"examples in {dest}"
          + (f" for {organizations} organisations, each under its own identity key"
             if organizations > 1 else ""))
    return None


def _check_default_holds(train_samples: int, flag: str) -> None:
    if train_samples > DEFAULT_TRAIN_SIZE:
        raise UserError(f"{flag} {train_samples}: the default data has {DEFAULT_TRAIN_SIZE:,} "
                        "train examples, fewer than one for each; give at most "
                        f"{DEFAULT_TRAIN_SIZE:,}, or --data a folder of more data samples "
                        "(scripts/generate_data.py --source)")


def _is_unchanged_default(dest: Path) -> bool:
    """Whether `dest` holds the embedded default data as `generate` wrote it (without persons), no
    file changed or added."""
    manifest = _as_written(dest)
    expected = {"written_by": WRITTEN_BY, "source": EMBEDDED_SOURCE, "seed": DEFAULT_SEED,
                "train_examples": DEFAULT_TRAIN_SIZE, "test_examples": DEFAULT_TEST_SIZE}
    return manifest is not None and "images_per_subject" not in manifest and all(
        manifest.get(key) == value for key, value in expected.items())


def _as_written(dest: Path) -> dict | None:
    """`dest`'s manifest if every data sample in it is as `generate` wrote it (none changed, none
    added), else None: only then may a command write it again without losing a user's sample."""
    manifest = read_manifest(dest)
    recorded = (manifest or {}).get("sample_fingerprints")
    present = {f"{split}/{p.name}" for split in ("train", "test") if (dest / split).is_dir()
               for p in (dest / split).iterdir()}
    if not isinstance(recorded, dict) or set(recorded) != present:
        return None
    try:
        unchanged = all(sample_fingerprint(dest / folder) == fingerprint for folder,
                        fingerprint in recorded.items())
    except OSError:
        return None
    return manifest if unchanged else None
