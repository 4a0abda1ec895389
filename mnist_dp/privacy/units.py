"""The privacy unit: what two neighbouring datasets differ by, one image or one person with all
their images; how a run's images are counted and sampled in it, and a batch grouped; and the
words the statement, results.json and the errors use for it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mnist_dp.privacy.events import PER_EXAMPLE, PER_PERSON


@dataclass(frozen=True)
class PrivacyUnit:
    """One privacy unit: how images are counted, sampled and grouped in it, and its words.

    A unit of persons counts, samples and groups the images of the data it is bound to (`on`):
    `groups`, each image's person, an index 0..P-1 (examples.persons_of). A unit of one image needs
    no data. Two units are equal when they are the same kind (PERSON on any data is PERSON).
    """

    clipping: str  # what the ledger's events call its clipping (events.PER_EXAMPLE, PER_PERSON)
    name: str  # results.json's privacy_unit
    counted: str  # what a plan's n counts, in an error
    sampling: str  # the sampling the accountant assumes
    neighbouring_relation: str  # what two neighbouring datasets differ by
    grouped: bool = False  # whether a unit is a group of images (a person's)
    groups: np.ndarray | None = field(default=None, compare=False, repr=False)

    def on(self, groups: np.ndarray | None) -> PrivacyUnit:
        """This unit on data whose images' groups are `groups` (a unit of one image ignores
        them)."""
        return replace(self, groups=groups) if self.grouped else self

    def within(self, mask: np.ndarray) -> PrivacyUnit:
        """This unit on the images `mask` selects, their groups numbered 0..P'-1 again."""
        return self.on(np.unique(self.groups[mask], return_inverse=True)[1]) if self.grouped \
            else self

    def count(self, images: int) -> int:
        """How many units `images` images hold: the images, or their groups."""
        return int(self.groups.max()) + 1 if self.grouped else images

    def in_batch(self, batch: np.ndarray) -> int:
        """The units of an index batch."""
        return len(np.unique(self.groups[batch])) if self.grouped else len(batch)

    def group(self, batch: np.ndarray) -> BatchPersons | None:
        """An index batch's groups, as a DP step that clips per person takes them; None for a unit
        of one image."""
        return BatchPersons.of(self.groups[batch]) if self.grouped else None

    def sample(self, rng: np.random.Generator, sample_rate: float, units: int) -> np.ndarray:
        """One Poisson batch, as the accountant assumes it: each of `units` units joins it
        independently with probability `sample_rate`, a group with all its images.

        Args:
          rng: the run's "batches" generator.
          sample_rate: q.
          units: how many units the data holds (`count`).

        Returns:
          The batch's image indices, int64, ascending (maybe none).
        """
        sampled = rng.random(units) < sample_rate
        return np.flatnonzero(sampled[self.groups] if self.grouped else sampled)


@dataclass(frozen=True)
class BatchPersons:
    """A batch's persons, for a DP step that clips per person: a person's gradient is the sum of
    their examples'. `slots` lays each person's examples out in a row, so that a layer's per-person
    sums and Grams are batched products over persons."""

    groups: np.ndarray  # each example's person, an index 0..P-1 into the batch's persons [B]
    # each person's examples [P, k], k the batch's largest person; a smaller person's row padded
    # with B, the index of the zero row each framework appends to a layer's tensors
    slots: np.ndarray

    @classmethod
    def of(cls, persons: np.ndarray) -> BatchPersons:
        """The batch's persons from each example's person id [B], any integers."""
        groups, slots = person_rows(persons, len(persons))
        return cls(groups, slots)

    @property
    def count(self) -> int:
        """P, the batch's persons."""
        return len(self.slots)


IMAGE = PrivacyUnit(
    PER_EXAMPLE, "image", "training examples",
    "Poisson (each example joins each batch independently with probability q)",
    "add or remove one example")
# With subjects.npy: a person is the unit, all their images together.
PERSON = PrivacyUnit(
    PER_PERSON, "person", "persons",
    "Poisson (each person joins each batch independently with probability q, with all their "
    "images)",
    "add or remove one person, with all their images", grouped=True)
UNITS = {unit.clipping: unit for unit in (IMAGE, PERSON)}


def of(persons: np.ndarray | None) -> PrivacyUnit:
    """The unit of a run whose images' persons are `persons` (examples.persons_of's): PERSON on
    them, or IMAGE for None."""
    return IMAGE if persons is None else PERSON.on(persons)


def person_rows(persons, pad):
    """A batch's persons, laid out a person a row.

    Args:
      persons: each example's person [B], any integers.
      pad: what fills a row beyond its person's examples.

    Returns:
      (each example's person, an index 0..P-1 in the order of their ids [B] int64, each person's
      examples [P, k] int64, k the most one person has, a smaller person's row padded with `pad`).
    """
    ids, groups = np.unique(persons, return_inverse=True)
    groups = groups.reshape(-1).astype(np.int64)
    sizes = np.bincount(groups, minlength=len(ids))
    order = np.argsort(groups, kind="stable")
    layout = np.full((len(ids), sizes.max(initial=0)), pad, np.int64)
    layout[groups[order], np.arange(len(order)) - (np.cumsum(sizes) - sizes)[groups[order]]] = order
    return groups, layout
