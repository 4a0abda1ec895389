"""The accountant of a private search (Papernot & Steinke 2022): σ of each candidate profile and the
noise of the validation score, calibrated so that the whole search, repeated and selected, ends at
the target (RDP, dp_accounting's repeat-and-select); the mathematics it shares is accountant.py's
and calibration.py's.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from mnist_dp.hyperparameters import MAX_NOISE_MULTIPLIER
from mnist_dp.privacy.accountant import least_sigma, searches_epsilon
from mnist_dp.privacy.calibration import root, rounded_up
from mnist_dp.privacy.events import Candidate, Search
from mnist_dp.privacy.no_sigma import DecayTooSteep, NumericsGaveUp, TooManySteps


def calibrate_search(target_epsilon: float, delta: float, profiles: Sequence[tuple], mean: float,
                     shape: float, recipe: int | None = None, tol: float = 1e-3) -> tuple:
    """The σ of each of a search's privacy profiles that ends its training examples' ε (RDP) at or
    below `target_epsilon`, or a NoSigma. One factor s is calibrated: profile i gets
    σ_i = s · q_i·√steps_i / max_j q_j·√steps_j (for small q their RDP then nearly agree, so none is
    noisier than it needs), kept between its least σ and the most.

    Args:
      target_epsilon: the budget, ε at δ.
      delta: δ.
      profiles: (q, steps, NoiseSchedule whose σ is calibrated), one per distinct profile of the
        search space.
      mean: the mean number of candidates (events.Search).
      shape: the shape of their number's distribution (events.Search).
      recipe: the index in `profiles` of the recipe candidate's (run once besides the K), or None.
      tol: the precision of σ.

    Returns:
      σ of each profile, in the order of `profiles`.
    """
    weights = [q * math.sqrt(steps) for q, steps, _ in profiles]
    weights = [w / max(weights) for w in weights]
    least = [least_sigma(schedule, steps) for _, steps, schedule in profiles]
    if max(least) > MAX_NOISE_MULTIPLIER:
        raise DecayTooSteep(max(least))

    def sigmas(factor: float) -> tuple:
        return tuple(min(max(factor * w, low), MAX_NOISE_MULTIPLIER) for w,
                     low in zip(weights, least))

    def epsilon(factor: float) -> float:
        return search_epsilon(profiles, sigmas(factor), mean, shape, delta, recipe)

    lower, upper = min(low / w for low,
                       w in zip(least, weights)), MAX_NOISE_MULTIPLIER / min(weights)
    if epsilon(upper) > target_epsilon:
        raise TooManySteps(epsilon(upper))
    if epsilon(lower) > target_epsilon:
        try:
            lower = root(epsilon, target_epsilon, lower, upper, tol)
        except (ValueError, ArithmeticError, RuntimeError) as exc:
            raise NumericsGaveUp(f"{type(exc).__name__}: {exc}") from None
    # rounded up: ε only falls
    found = tuple(math.ceil(sigma / tol) * tol for sigma in sigmas(lower))
    # Brent's root may sit a hair below
    while search_epsilon(profiles, found, mean, shape, delta, recipe) > target_epsilon:
        found = tuple(sigma + tol for sigma in found)
    return tuple(round(sigma, 6) for sigma in found)


def search_epsilon(profiles: Sequence[tuple], sigmas: Sequence[float], mean: float, shape: float,
                   delta: float, recipe: int | None = None) -> float:
    """ε at δ (RDP) of a search's training examples.

    Args:
      profiles: each candidate profile's (q, steps, NoiseSchedule).
      sigmas: each profile's gradient noise.
      mean: the mean number of candidates (events.Search).
      shape: the shape of their number's distribution (events.Search).
      delta: δ.
      recipe: the index in `profiles` of the recipe candidate's, or None.

    Returns:
      ε of the candidates of `profiles` at gradient noise `sigmas`.
    """
    candidates = tuple(candidate(profile, sigma) for profile, sigma in zip(profiles, sigmas))
    return searches_epsilon([Search(mean, shape, candidates, 1.0, 1, 1, recipe=None if recipe
                                    is None else candidates[recipe])], delta)


def candidate(profile: tuple, sigma: float) -> Candidate:
    """A privacy profile (q, steps, NoiseSchedule) at gradient noise σ, as a search's event records
    it."""
    sample_rate, steps, schedule = profile
    return Candidate.of(sample_rate, steps, schedule.with_sigma(sigma))


def calibrate_score_noise(target_epsilon: float, delta: float, mean: float, shape: float,
                          recipe: Candidate | None = None, tol: float = 1e-3) -> float:
    """The least noise multiplier of a search's validation score (a count, sensitivity 1) that keeps
    its validation examples' ε (RDP) within `target_epsilon`.

    Args:
      target_epsilon: the budget, ε at δ.
      delta: δ.
      mean: the mean number of candidates (events.Search).
      shape: the shape of their number's distribution (events.Search).
      recipe: the recipe candidate's profile (its score is one more), or None.
      tol: the precision of the noise multiplier.

    Returns:
      The noise multiplier. Raises TooManySteps if even MAX_NOISE_MULTIPLIER spends more.
    """
    def epsilon(sigma: float) -> float:
        return searches_epsilon([Search(mean, shape, (), sigma, 1, 1, face="score",
                                        recipe=recipe)], delta)

    if epsilon(MAX_NOISE_MULTIPLIER) > target_epsilon:
        raise TooManySteps(epsilon(MAX_NOISE_MULTIPLIER))
    return rounded_up(epsilon, root(epsilon, target_epsilon, tol, MAX_NOISE_MULTIPLIER, tol),
                       target_epsilon, tol, MAX_NOISE_MULTIPLIER)
