"""The accountant: ε from DP events, by Google's ``dp_accounting``, and σ calibrated to a target.

PLD is the reported figure, RDP is shown beside it. Steps of equal (q, σ), whichever run took them, are
composed as one self-composition. δ is explicit and below 1/n (check_delta).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import dp_accounting
from dp_accounting import mechanism_calibration, pld, rdp

from mnist_dp.hyperparameters import MAX_NOISE_MULTIPLIER
from mnist_dp.privacy.events import MIN_NOISE_MULTIPLIER, DpEvent, NoiseSchedule
from mnist_dp.utils.errors import UserError

ACCOUNTANTS = ("pld", "rdp")
REPORTED_ACCOUNTANT = "pld"
ACCOUNTANT_NAMES = {
    "pld": "PLD (Google dp_accounting)",
    "rdp": "RDP (Google dp_accounting)",
}
SAMPLING = "Poisson (each example joins each batch independently with probability q)"
NEIGHBOURING_RELATION = "add or remove one example"


def dp_sgd_event(segments) -> dp_accounting.DpEvent:
    """The dp_accounting event of DP-SGD steps given as (q, σ, steps) segments: Poisson-sampled Gaussians composed
    in sequence. Composition is commutative, so the steps of equal q and σ, whichever run took them, are one
    self-composition: the same mechanism, accounted once (federated rounds repeat the same run many times)."""
    return _poisson_gaussians(_counts(segments))


def _counts(segments) -> tuple:
    """((q, σ), steps) of every distinct (q, σ) among `segments`, in a fixed order."""
    counts = {}
    for sample_rate, sigma, steps in segments:
        counts[sample_rate, sigma] = counts.get((sample_rate, sigma), 0) + steps
    return tuple(sorted(counts.items()))


def _poisson_gaussians(counts: tuple) -> dp_accounting.DpEvent:
    parts = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(sigma)), count)
        for (sample_rate, sigma), count in counts]
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def _new_accountant(accountant: str) -> dp_accounting.PrivacyAccountant:
    if accountant == "pld":
        return pld.PLDAccountant()
    if accountant == "rdp":
        return rdp.RdpAccountant()
    raise ValueError(f"unknown accountant {accountant!r}, expected one of {ACCOUNTANTS}")


def compose_epsilon(events: Sequence[DpEvent], delta: float, accountant: str = REPORTED_ACCOUNTANT) -> float:
    """ε at δ of the sequential composition of `events` (inf if any is non-private)."""
    if any(not e.is_private for e in events):
        return math.inf
    if not events:
        return 0.0
    return _epsilon(_counts(segment for e in events for segment in e.segments()), delta, accountant)


@functools.lru_cache(maxsize=256)
def _epsilon(counts: tuple, delta: float, accountant: str) -> float:
    """ε of the steps `counts` (from `_counts`): remembered, since the organisations of a federated ledger
    usually have equal accounts, and a report asks for each one's ε again."""
    acc = _new_accountant(accountant)
    acc.compose(_poisson_gaussians(counts))
    return float(acc.get_epsilon(delta))



def check_delta(delta: float, n: int, where: str = "delta") -> None:
    """δ must be explicit, positive and below 1/n (else 'release one example at random' is (0, δ)-DP)."""
    if not isinstance(delta, (int, float)) or not 0 < delta < 1.0 / n:
        raise UserError(
            f"{where} = {delta} must be > 0 and < 1/n = {1.0 / n:.3g} for n = {n} training examples; "
            "choose a smaller delta"
        )


def steps_within_budget(prior_events: Sequence[DpEvent], next_run: DpEvent, delta: float, max_epsilon: float) -> int:
    """The most steps of `next_run` (at most its `steps`) after `prior_events` that keep ε at δ (PLD)
    within `max_epsilon`; 0 when even one step would exceed it."""
    def fits(steps: int) -> bool:
        return compose_epsilon([*prior_events, dataclasses.replace(next_run, steps=steps)], delta) <= max_epsilon

    if fits(next_run.steps):
        return next_run.steps
    low, high = 0, next_run.steps  # invariant: `high` steps exceed the budget; `low` steps fit (or low = 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    prior_events: Sequence[DpEvent] = (),
    tol: float = 1e-3,
    schedule: NoiseSchedule = NoiseSchedule(1.0),
    repeats: int = 1,
) -> float:
    """Smallest σ (within `tol`, rounded up; none that gives a step less than MIN_NOISE_MULTIPLIER) such that
    prior_events + this run stay within ε at δ (PLD). σ is the gradient noise of the first steps; the rest of
    `schedule` (decay, count noise) is kept. `repeats`: the run is repeated that many times (rounds of training on
    the same data)."""
    prior = [segment for e in prior_events for segment in e.segments()]
    if any(not e.is_private for e in prior_events):
        raise UserError("cannot calibrate to a target epsilon: the input model was trained without DP (epsilon = inf)")
    floor = compose_epsilon(prior_events, delta) if prior_events else 0.0
    if floor >= target_epsilon:
        raise UserError(
            f"target_epsilon = {target_epsilon} is already spent by the input model (epsilon = {floor:.3f}); "
            "raise the target or train from scratch"
        )

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        run = [(sample_rate, effective, count) for effective, count in schedule.with_sigma(sigma).segments(steps)]
        return dp_sgd_event(prior + run * repeats)

    def pld_epsilon(sigma: float) -> float:
        return pld.PLDAccountant().compose(make_event(sigma)).get_epsilon(delta)

    try:
        least = least_sigma(schedule, steps)
        if least > MAX_NOISE_MULTIPLIER:  # budget.check_noise names the setting to change
            raise ValueError(f"the noise schedule needs σ = {least:.3g} for every step to have at least "
                             f"{MIN_NOISE_MULTIPLIER}, more than {MAX_NOISE_MULTIPLIER:g}")
        check_target_reachable(target_epsilon, delta, sample_rate, steps, schedule, prior_events, repeats)
        return _calibrate(make_event, pld_epsilon, target_epsilon, delta, tol, least, MAX_NOISE_MULTIPLIER)
    except (ValueError, ArithmeticError, RuntimeError, mechanism_calibration.NoBracketIntervalFoundError,
            mechanism_calibration.NoOptimumFoundError) as exc:  # dp_accounting's numerics gave up
        raise UserError(f"target_epsilon = {target_epsilon}: no noise multiplier found for it at δ = {delta:g} "
                        f"with q = {sample_rate:.4g} over {steps} steps ({type(exc).__name__}: {exc}); "
                        "give noise_multiplier instead, or a smaller target_epsilon") from None


def check_target_reachable(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                           schedule: NoiseSchedule, prior_events: Sequence[DpEvent] = (), repeats: int = 1,
                           where: str = "") -> None:
    """Refuse a target that no σ up to MAX_NOISE_MULTIPLIER meets (PLD; `prior_events` and `repeats` runs of `steps`
    steps included): adaptive clipping's noisy count alone spends it (the gradient's noise only adds to a step's ε),
    or the run has too many steps for it. `schedule` must pass budget.check_noise."""
    prior = [segment for e in prior_events for segment in e.segments()]

    def spent(sigma: float) -> float:
        run = [(sample_rate, effective, count) for effective, count in schedule.with_sigma(sigma).segments(steps)]
        return _epsilon(_counts(prior + run * repeats), delta, REPORTED_ACCOUNTANT)

    most = spent(MAX_NOISE_MULTIPLIER)
    if most <= target_epsilon:
        return
    prefix = f"{where}: target_epsilon = {target_epsilon}" if where else f"target_epsilon = {target_epsilon}"
    over = f"at δ = {delta:g} over {steps * repeats} steps{' after the input model' if prior_events else ''}"
    if schedule.count_noise_multiplier and spent(math.inf) >= target_epsilon:  # σ = inf: the count's noise alone
        raise UserError(f"{prefix}: adaptive clipping's noisy count alone spends ε = {spent(math.inf):.3f} {over}, so "
                        "no gradient noise can meet the target; raise clip_count_stddev (the count's noise) or "
                        "target_epsilon, or set clip_quantile to null")
    raise UserError(f"{prefix}: even noise_multiplier = {MAX_NOISE_MULTIPLIER:g}, the most allowed, spends "
                    f"ε = {most:.3g} {over}; raise target_epsilon{' or noise_decay' if schedule.decay_steps else ''}, "
                    "or train fewer epochs")


def least_sigma(schedule: NoiseSchedule, steps: int) -> float:
    """The least σ whose every step (decay and count noise included) has an effective noise multiplier of at least
    MIN_NOISE_MULTIPLIER (inf: none, the count's noise is too small): the lower end of a calibration."""
    count = schedule.count_noise_multiplier
    room = MIN_NOISE_MULTIPLIER ** -2 - (count ** -2 if count else 0.0)  # what the gradient may add to a step's σ⁻²
    if room <= 0:
        return math.inf
    # A hair above it, so that the σ found passes the floor again where a task is handed it (noise_for_rounds).
    return room ** -0.5 / schedule.with_sigma(1.0).gradient_sigma(steps - 1) * (1 + 1e-9)


def _calibrate(make_event, pld_epsilon, target_epsilon: float, delta: float, tol: float, least: float,
               most: float) -> float:
    # σ is searched in [least, most] (the floors of every step's noise and the ceiling; PLD meets the target at
    # `most`: check_target_reachable). When `least` meets it, it is the answer: ε below the target, never above. PLD
    # is slow for small σ, so bracket it with RDP first: RDP over-estimates ε, hence the RDP-calibrated σ is an
    # upper end for PLD.
    def rdp_epsilon(sigma: float) -> float:
        return rdp.RdpAccountant().compose(make_event(sigma)).get_epsilon(delta)

    if rdp_epsilon(least) <= target_epsilon and pld_epsilon(least) <= target_epsilon:
        return round(math.ceil(least / tol) * tol, 6)
    upper = most  # where only PLD's figure meets the target below the ceiling (the count's noise comes close)
    if rdp_epsilon(most) <= target_epsilon:
        upper = min(most, dp_accounting.calibrate_dp_mechanism(
            rdp.RdpAccountant, make_event, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(least, most),
            tol=tol) + tol)
    lower = max(upper / 2, least)
    while pld_epsilon(lower) <= target_epsilon:
        if lower == least:
            return round(math.ceil(least / tol) * tol, 6)
        upper, lower = lower, max(lower / 2, least)
    sigma = dp_accounting.calibrate_dp_mechanism(
        pld.PLDAccountant, make_event, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(lower, upper),
        tol=tol
    )
    # Brent's method lands within tol of the optimum on either side: step up until the budget holds (at `most` it
    # does).
    sigma = math.ceil(sigma / tol) * tol
    while sigma < most and pld_epsilon(sigma) > target_epsilon:
        sigma += tol
    return round(min(sigma, most), 6)
