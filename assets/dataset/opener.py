"""MNIST-format dataset opener (substratools 1.0).

Self-contained on purpose: Substra ships the opener alone to every task that reads the dataset,
so it imports nothing from this repository. The sample layout is described in description.md.
"""
import collections
import hashlib
import hmac
import os
import re

import numpy as np
import substratools as tools

IMAGES_FILE = "images.npy"
LABELS_FILE = "labels.npy"
# The sample's secret identity key (64 hex digits): its identity in released artefacts is an HMAC of its content
# under this key, so whoever holds a candidate dataset but not the key cannot confirm it was trained on.
KEY_FILE = "identity.key"
_KEY = re.compile(r"[0-9a-f]{64}")
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10


class DataSampleError(ValueError):
    """A data sample that does not follow description.md (printed as one line by the functions)."""

    user_error = True


def _load_array(path):
    if not os.path.isfile(path):
        raise DataSampleError(f"{path}: file missing; a data sample folder holds {IMAGES_FILE} and {LABELS_FILE}")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataSampleError(f"{path}: not a readable .npy array ({exc})") from None


def _images_as_float(images, path):
    """uint8 pixels are scaled to [0, 1]; float pixels must already be finite and in [0, 1]."""
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
        raise DataSampleError(f"{path}: images must have shape [n, 28, 28], got {list(images.shape)}")
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    if images.dtype.kind != "f":
        raise DataSampleError(f"{path}: images must be uint8 or float in [0, 1], got dtype {images.dtype}")
    if not np.isfinite(images).all():
        raise DataSampleError(f"{path}: images contain NaN or infinite pixels")
    if images.size and (images.min() < 0 or images.max() > 1):
        raise DataSampleError(f"{path}: float pixels must lie in [0, 1], found {images.min()}..{images.max()}")
    return images.astype(np.float32)


def _labels_as_int(labels, path, n):
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataSampleError(f"{path}: labels must be a 1-D integer array, got {labels.dtype} {list(labels.shape)}")
    if len(labels) != n:
        raise DataSampleError(f"{path}: {len(labels)} labels for {n} images")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataSampleError(f"{path}: labels must be digits 0-9, found {labels.min()}..{labels.max()}")
    return labels.astype(np.int64)


def _fingerprint(*paths):
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _identity(folder, fingerprint):
    """HMAC-SHA256 of the sample's content fingerprint under its key (mnist_dp.data.sample_identity, copied)."""
    path = os.path.join(folder, KEY_FILE)
    try:
        with open(path, encoding="ascii") as f:
            key = f.read().strip()
    except FileNotFoundError:
        raise DataSampleError(f"{folder}: no {KEY_FILE}, the secret key that keeps the sample unrecognisable in "
                              "released models; add one with: python scripts/generate_data.py --add-key "
                              f"{folder}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataSampleError(f"{path}: cannot read it ({exc})") from None
    if not _KEY.fullmatch(key):
        raise DataSampleError(f"{path}: must hold 64 hexadecimal digits (a random 256-bit key); write a new one "
                              f"with: python scripts/generate_data.py --add-key {folder} (after removing this file)")
    return hmac.new(bytes.fromhex(key), fingerprint.encode(), hashlib.sha256).hexdigest()


def _example_digests(images, labels):
    """One sha256 per example, of its image's exact bytes and its label (as int64); the same code as
    mnist_dp.data.example_digests, copied because the opener imports nothing from the repository."""
    n = len(labels)
    if n == 0:
        return []
    rows = np.ascontiguousarray(images).reshape(n, -1).view(np.uint8)
    records = np.concatenate([rows, labels.astype("<i8").reshape(n, 1).view(np.uint8)], axis=1)
    view, width = memoryview(records).cast("B"), records.shape[1]
    return [hashlib.sha256(view[i:i + width]).digest() for i in range(0, n * width, width)]


def read_sample(folder):
    """One data sample folder -> (images float32 [n, 28, 28] in [0, 1], labels int64 [n], keyed identity,
    one digest per example)."""
    if os.path.isfile(folder):
        raise DataSampleError(f"{folder}: is a file, not a data sample folder (a folder holding {IMAGES_FILE} "
                              f"and {LABELS_FILE})")
    if not os.path.isdir(folder):
        raise DataSampleError(f"{folder}: data sample folder not found")
    images_path = os.path.join(folder, IMAGES_FILE)
    labels_path = os.path.join(folder, LABELS_FILE)
    stored = _load_array(images_path)
    images = _images_as_float(stored, images_path)
    labels = _labels_as_int(_load_array(labels_path), labels_path, len(images))
    if len(labels) == 0:
        raise DataSampleError(f"{folder}: data sample holds no example")
    # Digests of the pixels as stored, as mnist_dp.data.check_disjoint computes them (compared here, never released).
    identity = _identity(folder, _fingerprint(images_path, labels_path))
    return images, labels, identity, _example_digests(stored, labels)


def check_disjoint(folders, samples):
    """Refuse samples that share an example (the exact bytes of an image with its label): trained on
    twice, it would be accounted once. Copies inside one sample are not checked here."""
    first_holder, shared = {}, collections.Counter()
    for i, sample in enumerate(samples):
        for digest in set(sample[3]):
            holder = first_holder.setdefault(digest, i)
            if holder != i:
                shared[holder, i] += 1
    if shared:
        # Each shared example is counted once, between the first sample holding it and a later one; for
        # the first such pair in folder order that is every example the two share.
        (first, later), count = min(shared.items())
        others = " (other samples share examples too)" if len(shared) > 1 else ""
        raise DataSampleError(f"{folders[later]} and {folders[first]} share {count} example(s){others}; an example "
                              "in two samples is trained on twice but would be accounted once: remove the copies")


def combine(samples):
    """Concatenate read samples into the dict every function receives as inputs['datasamples']."""
    return {
        "images": np.concatenate([s[0] for s in samples]),
        "labels": np.concatenate([s[1] for s in samples]),
        # One entry per data sample: the privacy ledger accounts per sample, by its keyed identity.
        "samples": [{"identity": s[2], "n": int(len(s[1]))} for s in samples],
    }


class MnistOpener(tools.Opener):
    def get_data(self, folders):
        if not folders:
            raise DataSampleError("no data sample folder given to the opener")
        samples = [read_sample(folder) for folder in folders]
        check_disjoint(folders, samples)
        # In identity order: Substra names sample folders after random keys, and the order of the examples
        # decides which ones each Poisson batch drawn from a noise_seed holds.
        return combine(sorted(samples, key=lambda sample: sample[2]))

    def fake_data(self, n_samples=None):
        n = max(int(n_samples or 1), 1)
        rng = np.random.default_rng(n)
        images = rng.random((n, *IMAGE_SHAPE), dtype=np.float32)
        labels = rng.integers(0, NUM_CLASSES, size=n, dtype=np.int64)
        return {"images": images, "labels": labels, "samples": [{"identity": f"fake-{n}", "n": n}]}
