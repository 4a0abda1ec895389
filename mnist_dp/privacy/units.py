"""The privacy unit: what two neighbouring datasets differ by, one image or one person with all
their images; how a run's images are counted and sampled in it; and the words the statement,
results.json and the errors use for it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnist_dp.privacy.events import PER_EXAMPLE, PER_PERSON


@dataclass(frozen=True)
class PrivacyUnit:
    """One privacy unit: how images are counted and sampled in it, and its words.

    A unit's methods take `groups`, each image's group (a person: an index 0..P-1, from
    examples.persons_of), which a unit of one image ignores (None there).
    """

    clipping: str  # what the ledger's events call its clipping (events.PER_EXAMPLE, PER_PERSON)
    name: str  # results.json's privacy_unit
    counted: str  # what a plan's n counts, in an error
    sampling: str  # the sampling the accountant assumes
    neighbouring_relation: str  # what two neighbouring datasets differ by
    grouped: bool = False  # whether a unit is a group of images (a person's)

    def count(self, images: int, groups: np.ndarray | None) -> int:
        """How many units `images` images hold: the images, or their groups."""
        return int(groups.max()) + 1 if self.grouped else images

    def in_batch(self, batch: np.ndarray, groups: np.ndarray | None) -> int:
        """The units of an index batch."""
        return len(np.unique(groups[batch])) if self.grouped else len(batch)

    def sample(self, rng: np.random.Generator, sample_rate: float, units: int,
               groups: np.ndarray | None) -> np.ndarray:
        """One Poisson batch, as the accountant assumes it: each of `units` units joins it
        independently with probability `sample_rate`, a group with all its images.

        Args:
          rng: the run's "batches" generator.
          sample_rate: q.
          units: how many units the data holds (`count`).
          groups: each image's group, or None for a unit of one image.

        Returns:
          The batch's image indices, int64, ascending (maybe none).
        """
        sampled = rng.random(units) < sample_rate
        return np.flatnonzero(sampled[groups] if self.grouped else sampled)


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
    """The unit of a run whose images' persons are `persons` (examples.persons_of's): PERSON, or
    IMAGE for None."""
    return IMAGE if persons is None else PERSON
