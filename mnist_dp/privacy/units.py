"""The privacy unit: what two neighbouring datasets differ by, one image or one person with all
their images, and the words the statement, results.json and the errors use for it."""
from __future__ import annotations

from dataclasses import dataclass

from mnist_dp.privacy.events import PER_EXAMPLE, PER_PERSON


@dataclass(frozen=True)
class PrivacyUnit:
    """One privacy unit and its words."""

    clipping: str  # what the ledger's events call its clipping (events.PER_EXAMPLE, PER_PERSON)
    name: str  # results.json's privacy_unit
    counted: str  # what a plan's n counts, in an error
    sampling: str  # the sampling the accountant assumes
    neighbouring_relation: str  # what two neighbouring datasets differ by


IMAGE = PrivacyUnit(
    PER_EXAMPLE, "image", "training examples",
    "Poisson (each example joins each batch independently with probability q)",
    "add or remove one example")
# With subjects.npy: a person is the unit, all their images together.
PERSON = PrivacyUnit(
    PER_PERSON, "person", "persons",
    "Poisson (each person joins each batch independently with probability q, with all their "
    "images)",
    "add or remove one person, with all their images")
UNITS = {unit.clipping: unit for unit in (IMAGE, PERSON)}
