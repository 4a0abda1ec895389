"""How a ledger names the examples of one data sample: by their keyed ids in the organisation's own
record, by its key alone in the released form (ledger.py); and the privacy units of the opener's
samples.
"""
from __future__ import annotations

import base64
import dataclasses
import re

import numpy as np

from mnist_dp.utils.errors import UserError


@dataclasses.dataclass(frozen=True)
class Examples:
    """The examples of one data sample as a ledger names them: `key`, the id of the sample's
    identity key, and `ids`, the examples' keyed 64-bit ids (the opener's example_ids), sorted, as
    big-endian bytes; empty where the ledger does not name them (its released form): any example
    of the organisation may be among them."""

    key: str
    ids: bytes = b""

    @property
    def named(self) -> bool:
        return bool(self.ids)

    @classmethod
    def of(cls, key: str, ids) -> Examples:
        return cls(key, np.sort(np.asarray(ids, dtype=np.uint64)).astype(">u8").tobytes())

    @property
    def array(self) -> np.ndarray:
        return np.frombuffer(self.ids, dtype=">u8").astype(np.uint64)

    def __len__(self) -> int:
        return len(self.ids) // 8

    def to_json(self) -> dict:
        return {"key": self.key,
                **({"ids": base64.b64encode(self.ids).decode("ascii")} if self.ids else {})}

    @classmethod
    def from_json(cls, identity: str, record, ring: bool = True) -> Examples:
        """The examples of data sample `identity` as `to_json` wrote them; a "ring" beside them
        (`ring_of`) is refused unless `ring` is False."""
        where = f"privacy ledger: examples of data sample {identity[:8]}…"
        if not ring and isinstance(record, dict):
            record = {k: v for k, v in record.items() if k != "ring"}
        if not isinstance(record, dict) or not {"key"} <= set(record) <= {"key", "ids"}:
            raise UserError(f'{where} must be an object {{"key": ...}} or {{"key": ..., "ids": '
                            '...}}')
        if not is_key_id(record["key"]):
            raise UserError(f"{where}: key must be 16 hexadecimal digits")
        if "ids" not in record:
            return cls(record["key"])
        try:
            ids = base64.b64decode(record["ids"], validate=True) if isinstance(record["ids"],
                                   str) else None
        except ValueError:
            ids = None
        if not ids or len(ids) % 8:
            raise UserError(f"{where}: ids must be base64 of one or more 8-byte ids")
        examples = cls(record["key"], ids)
        if np.any(examples.array[1:] <= examples.array[:-1]):
            raise UserError(f"{where}: ids must be distinct and sorted")
        return examples


def is_key_id(value) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16}", value) is not None


def ring_of(identity: str, record) -> tuple:
    """The ids of the other keys of data sample `identity`'s organisation that a ledger's record of
    it names ("ring", a list; none without one)."""
    ring = record.get("ring", []) if isinstance(record, dict) else []
    if not isinstance(ring, list) or not all(map(is_key_id, ring)) or len(set(ring)) < len(ring):
        raise UserError(f"privacy ledger: ring of data sample {identity[:8]}… must be a list of "
                        "distinct key ids (16 hexadecimal digits)")
    return tuple(ring)


def unit_ids(sample: dict) -> np.ndarray:
    """The keyed id of the privacy unit of each image of one of the opener's data samples (an entry
    of get_data's "samples"): its person's ("persons", from subjects.npy), or its own ("examples").
    uint64 [n], in the order of its images."""
    return np.asarray(sample["persons"] if "persons" in sample else sample["examples"], np.uint64)


def persons_of(data: dict) -> np.ndarray | None:
    """Each image's person in the opener's `data` (get_data's dict), as an index 0..P-1 into its P
    persons, when a data sample names them (subjects.npy; an image of a sample that does not is a
    person of its own); None when none does. Refused (UserError) when the samples are under several
    identity keys: one person's images under two keys would be two persons here."""
    samples = data["samples"]
    if not any("persons" in s for s in samples):
        return None
    if len({s["key"] for s in samples}) > 1 or any(s.get("aliases") for s in samples):
        raise UserError("subjects.npy: the data samples are under several identity keys (or "
                        "organization.keys), and a person's images under two keys would count as "
                        "two persons; train per person on samples under one key")
    _, index = np.unique(np.concatenate([unit_ids(s) for s in samples]), return_inverse=True)
    return index
