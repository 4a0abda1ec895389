"""A data sample as a task reads it: the dataset asset's opener is the one definition (of its
examples, its identity and their keyed ids); this module reads folders through it, and checks
training data for copies.

A data sample is a folder with ``images.npy`` (uint8, [n, 28, 28]), ``labels.npy`` (uint8, [n]),
``identity.key`` (its secret identity key) and optionally ``subjects.npy`` (each image's person);
``assets/dataset/description.md`` is the formal description and the opener validates it.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted

IMAGES_FILE = "images.npy"
LABELS_FILE = "labels.npy"
SUBJECTS_FILE = "subjects.npy"  # the opener's SUBJECTS_FILE
KEY_FILE = "identity.key"  # the opener's KEY_FILE
RING_FILE = "organization.keys"  # the opener's RING_FILE


def sample_fingerprint(folder: Path) -> str:
    """The content hash of a data sample: sha256 of images.npy, labels.npy and, when present,
    subjects.npy, in that order. Never released: its keyed form, `sample_identity`, names the sample
    in ledgers."""
    digest = hashlib.sha256()
    for name in (IMAGES_FILE, LABELS_FILE, SUBJECTS_FILE):
        if name != SUBJECTS_FILE or (Path(folder) / name).exists():
            digest.update((Path(folder) / name).read_bytes())
    return digest.hexdigest()


@functools.cache
def opener():
    """The dataset asset's opener module: the one definition of a data sample, its identity and its
    examples (it is self-contained, as Substra ships it alone; the scripts use it rather than a
    copy)."""
    from mnist_dp.assets import DATASET_ASSET, load_asset_module

    return load_asset_module(DATASET_ASSET / "opener.py", "mnist_dp_dataset_opener")


def read_sample(folder: Path):
    """A data sample folder as the opener reads it (opener.Sample); its errors as UserError."""
    try:
        return opener().read_sample(str(folder))
    except opener().DataSampleError as exc:
        raise UserError(str(exc)) from None


class KeyFileProblem(UserError):
    """A sample's identity key missing or unusable (the opener's KeyFileError, as a UserError):
    `advice(key_from)` is its message with the command that gives the folder the key of `key_from`,
    another sample of its organisation."""

    def __init__(self, error):
        super().__init__(str(error))
        self.advice = error.advice


def read_key(folder: Path) -> str:
    """The identity key of data sample folder `folder` (64 lowercase hex digits), checked as the
    opener checks it."""
    try:
        return opener().read_key(str(folder)).hex()
    except opener().KeyFileError as exc:
        raise KeyFileProblem(exc) from None
    except opener().DataSampleError as exc:
        raise UserError(str(exc)) from None


def read_ring(folder: Path) -> list:
    """The organisation's other identity keys written in data sample folder `folder` (hex), as the
    opener reads them (its RING_FILE; none without one)."""
    try:
        return [key.hex() for key in opener().read_ring(str(folder))]
    except opener().DataSampleError as exc:
        raise UserError(str(exc)) from None


def spent_on(folders: list):
    """The data's own ledger of data sample folders `folders` (privacy/data_ledger.py), with the
    examples it names under their organisation's other keys known as these samples'
    (Ledger.link)."""
    from mnist_dp.privacy import data_ledger

    ledger = data_ledger.read(folders)
    if any((Path(f) / RING_FILE).exists() for f in folders):
        ledger.link(opener().combine([read_sample(f) for f in folders])["samples"])
    return ledger


def named(folders: list):
    """A ledger naming the examples (or persons, with subjects.npy) of data sample folders
    `folders` as a task on them names them (Ledger.add_samples), with no run."""
    from mnist_dp.privacy.ledger import Ledger

    ledger = Ledger()
    ledger.add_samples(opener().combine([read_sample(f) for f in folders])["samples"])
    return ledger


def seal_keys(folders: list) -> dict:
    """The seal keys of the organisation holding data sample folders `folders` (the opener's
    `seal_keys`: {key id: secret}), which check its ledger outputs (privacy/seal.py)."""
    found = {}
    for folder in folders:
        found.update(opener().seal_keys([bytes.fromhex(k) for k in (read_key(folder),
                                                                     *read_ring(folder))]))
    return found


def key_id(folder: Path) -> str:
    """The id of data sample folder `folder`'s identity key, as its ledger entries name it (reveals
    nothing of it)."""
    return opener().key_id(bytes.fromhex(read_key(folder)))


# The key of examples held in memory (benchmarks and tests that train without sample folders):
# public, so their ledgers are comparable with each other only, which is all they need.
IN_MEMORY_KEY = "00" * 32


def in_memory_key(organization: str) -> str:
    """A public identity key of its own for organisation `organization`'s examples held in memory
    (a benchmark of several organisations: samples under one key are one organisation's)."""
    return hashlib.sha256(f"mnist-dp in-memory key of {organization}".encode()).hexdigest()


def in_memory(images: np.ndarray, labels: np.ndarray, identity: str,
              subjects: np.ndarray | None = None, key: str = IN_MEMORY_KEY) -> dict:
    """What the opener returns for one data sample of these examples, its examples named under
    `key`.

    Args:
      images: the images, made float32 (in [0, 1]).
      labels: their labels, made int.
      identity: the sample's identity, which names it.
      subjects: each image's person, integers as in a SUBJECTS_FILE; None: each image its own.
      key: the identity key (64 hex digits): IN_MEMORY_KEY, or an organisation's in_memory_key.

    Returns:
      The opener's datasamples dict of that one sample (its `combine`).
    """
    key, reader = bytes.fromhex(key), opener()
    images, labels = images.astype(np.float32), labels.astype(np.int64)
    digests = reader.example_digests(images, labels)
    persons = None if subjects is None else reader.subject_ids(
        key, [str(int(s)) for s in subjects.tolist()])
    sample = reader.Sample(f"<{identity}>", images, labels, identity, reader.key_id(key),
                           reader.example_ids(key, digests), digests, None, persons)
    return reader.combine([sample], reader.copies([sample]))


def sample_identity(folder: Path) -> str:
    """A data sample's identity in the privacy ledger, as the opener computes it: HMAC-SHA256 of its
    content fingerprint under the key in its identity.key."""
    return read_sample(folder).identity


def sample_size(folder: Path) -> int:
    """Examples in a data sample folder (read from the labels file's header only)."""
    return int(np.load(Path(folder) / LABELS_FILE, mmap_mode="r").shape[0])


def unit_count(read: list) -> int:
    """The privacy units of read samples (read_sample's): their persons where subjects.npy names
    them, else their examples: what the scripts hold against the declared public size."""
    return len(np.unique(np.concatenate([s.units for s in read]))) if read else 0


def unit_name(read: list) -> str:
    """What unit_count counts in read samples: "persons" where subjects.npy names them, else
    "images"."""
    return "persons" if any(s.persons is not None for s in read) else "images"


def public_size(folders: list, read: list, where: str) -> int:
    """The public size train sample folders `folders` (`read`: as read_sample reads them) declare
    together, what a train task's plan counts; refused (UserError naming `where`) where one declares
    none or where their real count of units is far from it (policy.declared_size). The scripts ask
    it before registering anything."""
    from mnist_dp.privacy import policy

    return policy.declared_size(folders, unit_count(read), where, unit_name(read))


def declare_size(folders: list, size: int) -> str:
    """Declare `size` the public size of every train sample folder of `folders` (its
    privacy_policy.json, before it is registered), each checked first to hold within
    policy.SIZE_TOLERANCE of it (UserError naming the folder, nothing written); returns what was
    written, in one line."""
    from mnist_dp.privacy import policy

    for folder in folders:
        read = [read_sample(folder)]
        policy.check_size(size, unit_count(read), str(folder), unit_name(read))
    for folder in folders:
        policy.declare_size(folder, size)
    return f"public size {size:,} declared in {counted(len(folders), 'train sample folder')}"


def check_examples(folders: list) -> list:
    """Refuse training data sample folders that hold an example twice, in one sample or in two (the
    opener's rule, which a train task applies): trained on twice, it would be accounted once.
    Returns them as read."""
    samples = [read_sample(folder) for folder in folders]
    problem = opener().copies(samples)
    if problem:
        raise UserError(problem)
    return samples
