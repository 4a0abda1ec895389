"""Why no σ meets a target: the accountant's typed answers (accountant.py raises them), each with
the numbers that show it; refusals.py puts them in the words of the setting to change.
"""
from __future__ import annotations

import dataclasses


class NoSigma(Exception):
    """No σ up to MAX_NOISE_MULTIPLIER meets the target: each subclass says why, with the numbers
    that show it. Words for the user come from refusals.py, which knows which setting to change."""

    prior: tuple = ()  # the earlier runs it was calibrated after (accountant.account_run sets it)

    def __str__(self) -> str:
        return repr(self)


@dataclasses.dataclass
class PriorNotPrivate(NoSigma):
    """An earlier run on the data was not private: ε is already infinite."""


@dataclasses.dataclass
class PriorSpent(NoSigma):
    """The earlier runs on the data already spend `epsilon` ≥ the target."""
    epsilon: float


@dataclasses.dataclass
class DecayTooSteep(NoSigma):
    """Keeping every step's noise multiplier at MIN_NOISE_MULTIPLIER or more needs σ = `least` in
    the first steps."""
    least: float


@dataclasses.dataclass
class CountAloneSpends(NoSigma):
    """Adaptive clipping's noisy count alone (infinite gradient noise) spends `epsilon` ≥ the
    target."""
    epsilon: float


@dataclasses.dataclass
class TooManySteps(NoSigma):
    """Even σ = MAX_NOISE_MULTIPLIER spends `epsilon` > the target over the run's steps."""
    epsilon: float


@dataclasses.dataclass
class NumericsGaveUp(NoSigma):
    """dp_accounting's search failed (`detail`: its exception)."""
    detail: str
