"""MNIST-format dataset opener (substratools 1.0).

Self-contained on purpose: Substra ships the opener alone to every task that reads the dataset,
so it imports nothing from this repository. The sample layout is described in description.md.
"""
import collections
import hashlib
import hmac
import os
import re
import shlex

import numpy as np
import substratools as tools

IMAGES_FILE = "images.npy"
LABELS_FILE = "labels.npy"
# The sample's secret identity key (64 hex digits), its organisation's, which never leaves it: its
# identity in released artefacts is an HMAC of its content under this key, so whoever holds a
# candidate dataset but not the key cannot confirm it was trained on.
KEY_FILE = "identity.key"
# Optional: the organisation's other identity keys, one per line (scripts/generate_data.py
# --same-organization), so that its examples named under any of them are known as the same examples.
RING_FILE = "organization.keys"
# Optional: one id per image naming the person it belongs to (integers or text, description.md); the
# privacy unit is then the person, all their images together. Without it each image is its own.
SUBJECTS_FILE = "subjects.npy"
# Text that stands for a missing value, never for a person.
_MISSING = {"", "nan", "na", "n/a", "none", "null"}
_KEY = re.compile(r"[0-9a-fA-F]{64}")  # either case: the same 32 bytes
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10


class DataSampleError(ValueError):
    """A data sample that does not follow description.md (printed as one line by the functions)."""

    user_error = True


class KeyFileError(DataSampleError):
    """A sample's identity key missing or unusable: `problem` says what, then what to do about it.
    `remove` names a file to remove (or a link) before a new key can be written; `readable` is False
    where the file only needs to be made readable (a new key would change the sample's identity);
    `restore`: the file is a broken link, whose target may be restored instead."""

    def __init__(self, folder, problem, remove=None, readable=True, restore=False):
        self.folder, self.problem, self.remove, self.readable, self.restore = (
            folder, problem, remove, readable, restore)
        super().__init__(self.advice())

    def advice(self, key_from=None):
        """The message; `key_from`: a sample folder of the same organisation whose key the new one
        must be (an organisation's samples are under one key)."""
        if not self.readable:
            return f"{self.problem}; make it readable to this user (e.g. chmod 600 it as its owner)"
        command = f"python scripts/generate_data.py --add-key {shlex.quote(str(self.folder))}"
        if key_from is not None:
            command += f" --key-from {shlex.quote(str(key_from))}"
        first = f"remove {shlex.quote(str(self.remove))}, then " if self.remove else ""
        return (f"{self.problem}; {'restore its target, or ' if self.restore else ''}{first}add a "
                f"key with: {command}")


def _load_array(path):
    if not os.path.isfile(path):
        raise DataSampleError(f"{path}: file missing; a data sample folder holds {IMAGES_FILE} and "
                              f"{LABELS_FILE}")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataSampleError(f"{path}: not a readable .npy array ({exc})") from None


def _images_as_float(images, path):
    """uint8 pixels are scaled to [0, 1]; float pixels must already be finite and in [0, 1]."""
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
        raise DataSampleError(f"{path}: images must have shape [n, 28, 28], got "
                              f"{list(images.shape)}")
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    if images.dtype.kind != "f":
        raise DataSampleError(f"{path}: images must be uint8 or float in [0, 1], got dtype "
                              f"{images.dtype}")
    if not np.isfinite(images).all():
        raise DataSampleError(f"{path}: images contain NaN or infinite pixels")
    if images.size and (images.min() < 0 or images.max() > 1):
        raise DataSampleError(f"{path}: float pixels must lie in [0, 1], found "
                              f"{images.min()}..{images.max()}")
    return images.astype(np.float32)


def _labels_as_int(labels, path, n):
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataSampleError(f"{path}: labels must be a 1-D integer array, got {labels.dtype} "
                              f"{list(labels.shape)}")
    if len(labels) != n:
        raise DataSampleError(f"{path}: {len(labels)} labels for {n} images")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataSampleError(f"{path}: labels must be digits 0-9, found "
                              f"{labels.min()}..{labels.max()}")
    return labels.astype(np.int64)


def _subject_texts(path, n):
    """The ids of subjects.npy at `path` as text (an integer as its decimal digits, so 7 and "7"
    name one person), checked: one per image, integers or text, none empty or a missing value."""
    try:
        subjects = np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc):  # an object array
            raise DataSampleError(f"{path}: subject ids must be integers or text, not Python "
                                  "objects; save them as an integer or string array") from None
        raise DataSampleError(f"{path}: not a readable .npy array ({exc})") from None
    except OSError as exc:
        raise DataSampleError(f"{path}: not a readable .npy array ({exc})") from None
    if subjects.ndim != 1 or len(subjects) != n:
        raise DataSampleError(f"{path}: one subject id per image: shape [{n}], got "
                              f"{list(subjects.shape)}")
    if subjects.dtype.kind in "iu":
        return [str(int(v)) for v in subjects.tolist()]
    if subjects.dtype.kind == "U":
        texts = subjects.tolist()
    elif subjects.dtype.kind == "S":
        try:
            texts = [v.decode("utf-8") for v in subjects.tolist()]
        except UnicodeDecodeError:
            raise DataSampleError(f"{path}: byte-string subject ids must be UTF-8 text") from None
    else:
        raise DataSampleError(f"{path}: subject ids must be integers or text, got dtype "
                              f"{subjects.dtype}")
    for i, text in enumerate(texts):
        if text.strip().lower() in _MISSING:
            raise DataSampleError(f"{path}: subject id {i} is {text!r}, a missing value; every "
                                  "image needs the id of the person it belongs to")
    return texts


def subject_ids(key, texts):
    """The persons' names in a released ledger: the first 64 bits of an HMAC of each id's text under
    the sample's key (uint64, one per image), apart from the examples' (example_ids) by a prefix. A
    person's images in several samples under one key share one name."""
    return np.array([int.from_bytes(hmac.digest(key, b"mnist-dp subject\0" + t.encode("utf-8"),
                                                "sha256")[:8], "big") for t in texts],
                    dtype=np.uint64)


def _fingerprint(*paths):
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def read_key(folder):
    """The sample's secret identity key (bytes); a KeyFileError saying what to do when it is missing
    or unusable."""
    path = os.path.join(folder, KEY_FILE)
    try:
        with open(path, encoding="ascii") as f:
            key = f.read().strip()
    except FileNotFoundError:
        if os.path.islink(path):
            raise KeyFileError(folder,
                               f"{path}: a link to {os.readlink(path)}, which does not exist",
                               remove=path, restore=True) from None
        raise KeyFileError(folder, f"{folder}: no {KEY_FILE}, the secret key that keeps the sample "
                                   "unrecognisable in released models") from None
    except IsADirectoryError:
        raise KeyFileError(folder, f"{path}: is a folder, not a key file", remove=path) from None
    except PermissionError as exc:
        raise KeyFileError(folder, f"{path}: cannot read it ({exc.strerror})",
                           readable=False) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(folder, f"{path}: cannot read it as text ({exc})", remove=path) from None
    if not _KEY.fullmatch(key):
        raise KeyFileError(folder,
                           f"{path}: must hold 64 hexadecimal digits (a random 256-bit key), not "
                           f"{len(key)} characters", remove=path)
    return bytes.fromhex(key)


def key_id(key):
    """Which key named a sample's examples (16 hex digits that reveal nothing of the key). A key is
    one organisation's: the ledger accounts examples under different keys as different
    organisations' records."""
    return hmac.digest(key, b"mnist-dp identity key id", "sha256")[:8].hex()


def seal_keys(keys):
    """{key id: the secret that seals the organisation's ledger outputs under that key} for identity
    keys `keys` (bytes): an HMAC of each, so a seal reveals nothing of the key, and only a task
    holding one of the organisation's samples can make or check it."""
    return {key_id(key): hmac.digest(key, b"mnist-dp ledger seal", "sha256") for key in keys}


def example_digests(images, labels):
    """One sha256 per example, of what the model sees: the image as float32 in [0, 1] (after
    _images_as_float; -0.0 read as 0.0) and its label as int64. The same example stored as uint8 or
    as float gives one digest. Never released: only compared inside the task, and named in the
    ledger under a key (example_ids)."""
    n = len(labels)
    if n == 0:
        return []
    rows = (np.ascontiguousarray(images, dtype=np.float32).reshape(n,
                                 -1) + np.float32(0)).view(np.uint8)
    records = np.concatenate([rows, labels.astype("<i8").reshape(n, 1).view(np.uint8)], axis=1)
    view, width = memoryview(records).cast("B"), records.shape[1]
    return [hashlib.sha256(view[i:i + width]).digest() for i in range(0, n * width, width)]


def example_ids(key, digests):
    """The examples' names in a released ledger: the first 64 bits of an HMAC of each digest under
    the sample's key (uint64, in the order of the images: a search splits its validation examples by
    them; the ledger sorts them). Two runs' ledgers tell which examples they share; without the key
    nobody can tell whether a candidate example is one of them. Two examples colliding (2^-64 per
    pair) only merges their accounts, which over-states ε, never under-states it."""
    return np.array([int.from_bytes(hmac.digest(key, d, "sha256")[:8], "big") for d in digests],
                    dtype=np.uint64)


class Sample(collections.namedtuple(
        "Sample", "folder images labels identity key_id ids digests aliases persons seal_keys",
        defaults=(None, None, None))):
    """One data sample as read: its arrays, its keyed identity, the id of its key, its examples'
    keyed ids, their digests (compared within a task, never returned), `aliases`: {key id: the
    privacy units' ids under that key} for each of the organisation's other keys (RING_FILE; None
    without one), `persons`: each image's person's keyed id (SUBJECTS_FILE; None without one), and
    `seal_keys`: the organisation's seal keys (seal_keys), kept in the task like the key itself."""

    @property
    def units(self):
        """The keyed id of each image's privacy unit: its person's, or its own."""
        return self.ids if self.persons is None else self.persons


def read_ring(folder):
    """The organisation's other identity keys (bytes) of RING_FILE in `folder`: none without the
    file."""
    path = os.path.join(folder, RING_FILE)
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().split()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise DataSampleError(f"{path}: cannot read it ({exc}); make it readable, or remove it and "
                              "run scripts/generate_data.py --same-organization again") from None
    for number, line in enumerate(lines, 1):
        if not _KEY.fullmatch(line):
            raise DataSampleError(f"{path}: key {number} is not 64 hexadecimal digits; remove the "
                                  "file and run scripts/generate_data.py --same-organization again")
    return [bytes.fromhex(line) for line in lines]


def read_sample(folder):
    """One data sample folder -> Sample (images float32 [n, 28, 28] in [0, 1], labels int64 [n])."""
    if os.path.isfile(folder):
        raise DataSampleError(f"{folder}: is a file, not a data sample folder (a folder holding "
                              f"{IMAGES_FILE} and {LABELS_FILE})")
    if not os.path.isdir(folder):
        raise DataSampleError(f"{folder}: data sample folder not found")
    images_path = os.path.join(folder, IMAGES_FILE)
    labels_path = os.path.join(folder, LABELS_FILE)
    images = _images_as_float(_load_array(images_path), images_path)
    labels = _labels_as_int(_load_array(labels_path), labels_path, len(images))
    if len(labels) == 0:
        raise DataSampleError(f"{folder}: data sample holds no example")
    key = read_key(folder)
    subjects_path = os.path.join(folder, SUBJECTS_FILE)
    texts = _subject_texts(subjects_path, len(labels)) if os.path.lexists(subjects_path) else None
    content = [images_path, labels_path, *([subjects_path] if texts is not None else [])]
    identity = hmac.new(key, _fingerprint(*content).encode(), hashlib.sha256).hexdigest()
    digests = example_digests(images, labels)

    def unit_ids(under):
        return example_ids(under, digests) if texts is None else subject_ids(under, texts)

    ring = read_ring(folder)
    aliases = {key_id(other): unit_ids(other) for other in ring if other != key}
    return Sample(folder, images, labels, identity, key_id(key), example_ids(key, digests), digests,
                  aliases or None, None if texts is None else subject_ids(key, texts),
                  seal_keys([key, *ring]))


def copies(samples):
    """None, or the line that refuses these samples for training: an example (what the model sees:
    image and label) present twice among them, in one sample or in two, would be trained on as two
    copies but accounted as one example. Only training refuses them (a test set may hold copies)."""
    first_holder, shared, repeated = {}, collections.Counter(), {}
    for i, sample in enumerate(samples):
        distinct = set(sample.digests)
        if len(distinct) < len(sample.digests):
            repeated[i] = len(sample.digests) - len(distinct)
        for digest in distinct:
            holder = first_holder.setdefault(digest, i)
            if holder != i:
                shared[holder, i] += 1
    if shared:
        # Each shared example is counted once, between the first sample holding it and a later one;
        # for the first such pair in folder order that is every example the two share.
        (first, later), count = min(shared.items())
        others = " (other samples share examples too)" if len(shared) > 1 else ""
        return (f"{samples[later].folder} and {samples[first].folder} share {count} "
                f"{'example' if count == 1 else 'examples'}{others} (the same image, as the model "
                "sees it, with the same label); an example in two samples is trained on twice but "
                "would be accounted once: remove the copies")
    if repeated:
        i, count = min(repeated.items())
        copies = "example is a copy" if count == 1 else "examples are copies"
        return (f"{samples[i].folder}: {count} {copies} of others in this sample (the same "
                "image, as the model sees it, with the same label); an example trained on as "
                "several copies would be accounted as one: remove the copies "
                "(scripts/generate_data.py --source leaves them out of the samples it writes)")
    return None


def combine(samples, problem=None):
    """Concatenate read samples into the dict every function receives as inputs['datasamples'], with
    `problem`, the line that refuses them for training (copies) or None."""
    return {
        "copies": problem, "images": np.concatenate([s.images for s in samples]),
        "labels": np.concatenate([s.labels for s in samples]),
        # The secrets that seal and check the organisation's ledger outputs (seal_keys): they never
        # leave the task.
        "seal_keys": {k: v for s in samples for k, v in (s.seal_keys or {}).items()},
        # One entry per data sample: the privacy ledger names the sample by its keyed identity and
        # its examples by their keyed ids (in the order of its images), so that ε is composed per
        # example across runs. "folder": where the organisation keeps the sample, and its ledger of
        # the runs on it (privacy_ledger.jsonl, which the tasks read and append:
        # mnist_dp/privacy/data_ledger.py). "aliases" (only with the organisation's other keys,
        # RING_FILE): the same examples' ids under each of them.
        # "persons" (only with SUBJECTS_FILE): each image's person's id, the privacy unit.
        "samples": [{"identity": s.identity, "n": int(len(s.labels)), "key": s.key_id,
                     "examples": s.ids, "folder": s.folder,
                     **({"aliases": s.aliases} if s.aliases else {}),
                     **({"persons": s.persons} if s.persons is not None else {})}
                    for s in samples],
    }


class MnistOpener(tools.Opener):
    def get_data(self, folders):
        if not folders:
            raise DataSampleError("no data sample folder given to the opener")
        samples = [read_sample(folder) for folder in folders]
        # In identity order: Substra names sample folders after random keys, and the order of the
        # examples decides which ones each Poisson batch drawn from a noise_seed holds.
        return combine(sorted(samples, key=lambda sample: sample.identity), copies(samples))

    def fake_data(self, n_samples=None):
        n = max(int(n_samples or 1), 1)
        rng = np.random.default_rng(n)
        images = rng.random((n, *IMAGE_SHAPE), dtype=np.float32)
        labels = rng.integers(0, NUM_CLASSES, size=n, dtype=np.int64)
        return {"copies": None, "images": images, "labels": labels,
                "samples": [{"identity": f"fake-{n}", "n": n, "key": f"{rng.integers(2**62):016x}",
                             "examples": np.arange(n, dtype=np.uint64)}]}
