"""The accountant: ε from DP events, by Google's ``dp_accounting``, and σ calibrated to a target.

PLD is the reported figure, RDP is shown beside it. Steps of equal (q, σ), whichever run took them,
are composed as one self-composition. A private hyperparameter search (events.Search) has an RDP
bound only (dp_accounting's repeat-and-select): an account that holds one reports the lower of two
bounds, RDP of the whole, and PLD of the runs composed with each search as the (ε, δ) pair its RDP
gives (`_with_searches_as_pairs`). Mathematics only: a target no σ meets is a NoSigma carrying its
numbers, which the callers that know the hyperparameters (task_plan.py) put in a user's words.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from mnist_dp.hyperparameters import MAX_NOISE_MULTIPLIER
from mnist_dp.privacy import calibration
from mnist_dp.privacy.events import MIN_NOISE_MULTIPLIER, DpEvent, NoiseSchedule, Search
from mnist_dp.privacy.no_sigma import (
    CountAloneSpends,
    DecayTooSteep,
    NoSigma,
    NumericsGaveUp,
    PriorNotPrivate,
    PriorSpent,
    TooManySteps,
)
from mnist_dp.utils.lazy import lazy_import

# Loaded when a figure is first computed: a task that computes none skips scipy's import.
dp_accounting = lazy_import("dp_accounting")

ACCOUNTANTS = ("pld", "rdp")
REPORTED_ACCOUNTANT = "pld"
ACCOUNTANT_NAMES = {
    "pld": "PLD (Google dp_accounting)", "rdp": "RDP (Google dp_accounting)",
}


def _counts(segments) -> tuple:
    """((q, σ), steps) of every distinct (q, σ) among the (q, σ, steps) `segments`, in a fixed
    order. Composition is commutative, so the steps of equal q and σ, whichever run took them, are
    one self-composition: the same mechanism, accounted once (federated rounds repeat the same run
    many times)."""
    counts = {}
    for sample_rate, sigma, steps in segments:
        counts[sample_rate, sigma] = counts.get((sample_rate, sigma), 0) + steps
    return tuple(sorted(counts.items()))


def _poisson_gaussians(counts: tuple) -> dp_accounting.DpEvent:
    """The dp_accounting event of DP-SGD steps: Poisson-sampled Gaussians, composed in sequence."""
    parts = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate,
                                            dp_accounting.GaussianDpEvent(sigma)), count)
        for (sample_rate, sigma), count in counts]
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def compose_epsilon(events: Sequence[DpEvent], delta: float,
                    accountant: str = REPORTED_ACCOUNTANT) -> float:
    """ε of the sequential composition of DP events.

    Args:
      events: the DpEvents composed (a ledger's runs, or one run).
      delta: δ.
      accountant: "pld" or "rdp"; with a private search among the events, "pld" is the lower of
        RDP and the runs' PLD with each search as an (ε, δ) pair.

    Returns:
      ε at δ; inf if any event is non-private, 0 for none.
    """
    if any(not e.is_private for e in events):
        return math.inf
    if not events:
        return 0.0
    counts = _counts(_run_segments(events))
    return _epsilon(counts, delta, accountant, _searches(events))


@functools.lru_cache(maxsize=256)
def _epsilon(counts: tuple, delta: float, accountant: str, searches: tuple = ()) -> float:
    """ε of the steps `counts` (from `_counts`) and the `searches`: remembered, since the
    organisations of a federated ledger usually have equal accounts, a report asks for each one's ε
    again, and a calibration for the σ it tried."""
    if searches:  # PLD cannot compose a repeated selection: RDP composes everything
        curve = sum((search_rdp(s) for s in searches), _rdp_curve(_poisson_gaussians(counts))
                    if counts else 0.0)
        whole = _rdp_epsilon(curve, delta)
        if accountant != "pld":
            return whole
        return min(whole, _with_searches_as_pairs(counts, searches, delta))
    if accountant == "pld":
        return float(_pld_of(counts).get_epsilon_for_delta(delta))
    if accountant != "rdp":
        raise ValueError(f"unknown accountant {accountant!r}, expected one of {ACCOUNTANTS}")
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(_poisson_gaussians(counts))
    return float(acc.get_epsilon(delta))


def _pld_of(counts: tuple):
    """The PLD of the steps `counts`, composed as dp_accounting's PLDAccountant composes them (from
    the identity, each (q, σ) self-composed in turn, at its default discretisation): the same
    operations on the same numbers, one step's PLD made once per (q, σ)."""
    composed = dp_accounting.pld.privacy_loss_distribution.identity(PLD_INTERVAL)
    for (sample_rate, sigma), count in counts:
        if sample_rate > 0:  # the accountant skips a step that samples nothing
            composed = composed.compose(_step_pld(sample_rate, sigma).self_compose(count))
    return composed


# PLDAccountant's default value_discretization_interval.
PLD_INTERVAL = 1e-4
# The parts of δ the searches may take as pairs, the runs' PLD the rest: each one is a valid bound,
# and the least is reported.
SEARCH_DELTA_SHARES = (0.01, 0.03, 0.1, 0.3)
# A pair's ε past which its PLD overflows (exp(ε)); such a bound would not be the lower one anyway.
MAX_PAIR_EPSILON = 50.0


def _with_searches_as_pairs(counts: tuple, searches: tuple, delta: float) -> float:
    """ε at δ of the runs `counts` (PLD) composed with each of `searches` as the (ε_i, δ_i) pair its
    RDP gives: an (ε, δ)-DP mechanism's privacy loss is dominated by dp_accounting's pessimistic
    PLD of that pair (from_privacy_parameters), which composes with the runs' like any PLD. The
    searches share a part of δ equally; the least ε over SEARCH_DELTA_SHARES is returned, inf if
    no share gives a finite one."""
    runs, least = _pld_of(counts), math.inf
    for share in SEARCH_DELTA_SHARES:
        pair_delta = delta * share / len(searches)
        composed = runs
        for search in searches:
            pair_epsilon = _rdp_epsilon(search_rdp(search), pair_delta)
            if not pair_epsilon < MAX_PAIR_EPSILON:
                break
            pair = dp_accounting.pld.common.DifferentialPrivacyParameters(pair_epsilon, pair_delta)
            composed = composed.compose(
                dp_accounting.pld.privacy_loss_distribution.from_privacy_parameters(
                    pair, PLD_INTERVAL))
        else:
            least = min(least, float(composed.get_epsilon_for_delta(delta)))
    return least


@functools.lru_cache(maxsize=128)
def _step_pld(sample_rate: float, sigma: float):
    """One Poisson-sampled Gaussian step's PLD; a budget's search over steps and a report's figures
    compose the same step again and again."""
    return dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, value_discretization_interval=PLD_INTERVAL,
        sampling_prob=sample_rate)


@functools.cache
def _rdp_orders() -> np.ndarray:
    """The orders of every RDP curve here: dp_accounting's default ones."""
    return np.asarray(dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS, np.float64)


def _rdp_epsilon(curve: np.ndarray, delta: float) -> float:
    """ε at `delta` of an RDP `curve` at the orders _rdp_orders()."""
    return float(dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(
        _rdp_orders(), curve, delta)[0])


def _rdp_curve(event: dp_accounting.DpEvent) -> np.ndarray:
    """RDP of `event` at every order of _rdp_orders() (dp_accounting's RDP accountant)."""
    acc = dp_accounting.rdp.RdpAccountant(list(_rdp_orders()))
    acc.compose(event)
    return acc.rdp


@functools.lru_cache(maxsize=256)
def search_rdp(search: Search) -> np.ndarray:
    """RDP of a search, at every order of _rdp_orders(), as its face sees it: a training example,
    the repeated selection of a candidate's training (a candidate's profile is a random choice among
    `candidates`: Rényi divergence is jointly quasi-convex, so its RDP is at most the worst
    profile's at every order); a validation example, that of its Gaussian score; face "either", the
    larger of the two at each order. With one profile it is exactly dp_accounting's
    RepeatAndSelectDpEvent(profile, mean, shape), whose RDP it computes by the same function; a
    recipe candidate adds its own run (or score) once, as ComposedDpEvent composes it."""
    if search.face == "either":
        return np.maximum(search_rdp(search.scored()),
                          search_rdp(dataclasses.replace(search, face="training")))
    if search.face == "score":
        single = _rdp_curve(dp_accounting.GaussianDpEvent(search.score_noise_multiplier))
        recipe = single
    else:
        single = np.max([_candidate_rdp(c) for c in search.candidates], axis=0)
        recipe = None if search.recipe is None else _candidate_rdp(search.recipe)
    repeated = np.asarray(
        dp_accounting.rdp.rdp_privacy_accountant._compute_rdp_repeat_and_select(  # noqa: SLF001 - the accountant's own
            _rdp_orders(), single, search.mean, search.shape))
    return repeated if search.recipe is None else repeated + recipe


def _candidate_rdp(candidate) -> np.ndarray:
    """RDP of one candidate's training run (events.Candidate), at every order of _rdp_orders()."""
    return _rdp_curve(_poisson_gaussians(_counts(candidate.segments())))


def steps_within_budget(prior_events: Sequence[DpEvent], next_run: DpEvent, delta: float,
                        max_epsilon: float) -> int:
    """How far a run may go within a budget.

    Args:
      prior_events: the earlier runs on the same examples.
      next_run: the run to cut (its `steps` are the most it may take).
      delta: δ.
      max_epsilon: the budget, ε at δ by PLD.

    Returns:
      The most steps of `next_run` after `prior_events` that keep ε within `max_epsilon`; 0 when
      even one step would exceed it.
    """
    if not all(e.is_private for e in [*prior_events, next_run]):
        return 0  # ε is infinite after any step
    prior = _run_segments(prior_events)
    run, searches = next_run.schedule(), _searches(prior_events)

    def fits(steps: int) -> bool:  # as compose_epsilon composes the run cut to `steps`
        segments = prior + [(next_run.sample_rate, sigma, count)
                            for sigma, count in run.segments(steps)]
        return _epsilon(_counts(segments), delta, REPORTED_ACCOUNTANT, searches) <= max_epsilon

    if fits(next_run.steps):
        return next_run.steps
    # invariant: `high` steps exceed the budget; `low` steps fit (or low = 0)
    low, high = 0, next_run.steps
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """What a plan asks the accountant of the run it plans (account_run).

    Attributes:
      event: the run's event at σ = 1, all its planned steps: q, the steps, the decay and adaptive
        clipping's count noise, kept at every σ.
      delta: δ of target_epsilon.
      sigma: the run's σ when given (0 without DP); None: calibrated to target_epsilon, at δ,
        after the worst of `histories` (one sequence of earlier DpEvents per organisation).
      budgets: ((ε, δ), …), in order, each cutting the steps the one before left, after every one
        of the histories `counted`.
    """

    event: DpEvent
    delta: float
    sigma: float | None = None
    target_epsilon: float | None = None
    histories: tuple = ((),)
    budgets: tuple = ()
    counted: tuple = ((),)


@dataclasses.dataclass(frozen=True)
class Limit:
    """What one budget allows a planned run (account_run)."""

    steps: int  # the run's steps when this budget is asked (the earlier budgets' cut)
    allowed: int  # the most of them that keep ε within the budget after every counted history
    one_step: float  # ε of one step on data no run touched; 0 when a history is not empty
    spent: float  # where no step fits: the most ε a counted history already spends; else 0


@dataclasses.dataclass(frozen=True)
class RunAccount:
    """The accountant's answer to a PlannedRun: σ, and a Limit per budget, in order."""

    sigma: float
    limits: tuple


def account_run(run: PlannedRun) -> RunAccount:
    """Everything a plan asks the accountant, in one question: σ as given, or the largest σ the
    calibration gives over run.histories (one the σ found so far already meets is not calibrated
    again), and what each budget allows at that σ. Raises the NoSigma that says why when no σ
    meets the target, its `prior` the history it was calibrated after."""
    sigma, event = run.sigma, run.event
    # a history with a run without noise first: no σ meets it, and no other need be calibrated
    histories = sorted(run.histories, key=lambda prior: all(e.is_private for e in prior))
    for prior in histories if sigma is None else ():
        if sigma is None or not meets_target(sigma, run.target_epsilon, run.delta,
                                             event.sample_rate, event.steps, prior,
                                             event.schedule()):
            try:
                found = calibrate_noise_multiplier(run.target_epsilon, run.delta,
                                                   event.sample_rate, event.steps, prior,
                                                   schedule=event.schedule())
            except NoSigma as exc:
                exc.prior = tuple(prior)
                raise
            sigma = found if sigma is None else max(sigma, found)
    limits, event = [], dataclasses.replace(event, noise_multiplier=sigma)
    for epsilon, delta in run.budgets:
        one_step = 0.0 if any(run.counted) else compose_epsilon(
            [dataclasses.replace(event, steps=1)], delta)
        allowed = min(steps_within_budget(prior, event, delta, epsilon) for prior in run.counted)
        spent = 0.0 if allowed else max(compose_epsilon(prior, delta) for prior in run.counted)
        limits.append(Limit(event.steps, allowed, one_step, spent))
        event = dataclasses.replace(event, steps=allowed)
    return RunAccount(sigma, tuple(limits))


def calibrate_noise_multiplier(
    target_epsilon: float, delta: float, sample_rate: float, steps: int,
    prior_events: Sequence[DpEvent] = (), tol: float = 1e-3,
    schedule: NoiseSchedule = NoiseSchedule(1.0), repeats: int = 1,
) -> float:
    """The smallest σ (within `tol`, rounded up) that keeps ε at δ (PLD) within `target_epsilon`, or
    a NoSigma. No step gets less than MIN_NOISE_MULTIPLIER.

    Args:
      target_epsilon: the budget, ε at δ.
      delta: δ.
      sample_rate: the run's Poisson rate q.
      steps: the run's steps.
      prior_events: the earlier runs on the same data, composed first.
      tol: the precision of σ.
      schedule: the run's noise, whose σ (the gradient noise of the first steps) is calibrated, its
        decay and count noise kept.
      repeats: the run is repeated that many times (rounds of training on the same data).

    Returns:
      σ. Raises the NoSigma that says why when no σ up to MAX_NOISE_MULTIPLIER meets the target.
    """
    least = noise_range(target_epsilon, delta, sample_rate, steps, schedule, prior_events, repeats)
    # _epsilon remembers: the search asks again for σ it tried (a bracket's ends)
    pld_epsilon, rdp_epsilon = (_spent_at(delta, accountant, sample_rate, steps, schedule,
                                          prior_events, repeats) for accountant in ("pld", "rdp"))
    try:
        return calibration.calibrate(pld_epsilon, rdp_epsilon, target_epsilon, tol, least,
                                     MAX_NOISE_MULTIPLIER)
    except (ValueError, ArithmeticError, RuntimeError) as exc:
        raise NumericsGaveUp(f"{type(exc).__name__}: {exc}") from None


def meets_target(sigma: float, target_epsilon: float, delta: float, sample_rate: float,
                 steps: int, prior_events: Sequence[DpEvent] = (),
                 schedule: NoiseSchedule = NoiseSchedule(1.0), repeats: int = 1) -> bool:
    """Whether the run at gradient noise `sigma` keeps ε at δ within `target_epsilon` after
    `prior_events`, as calibrate_noise_multiplier computes it (the same arguments): a σ calibrated
    for one history serves another that it meets, whose own σ could only be smaller. False after a
    non-private run: the calibration refuses it."""
    if any(not e.is_private for e in prior_events):
        return False
    return _spent_at(delta, REPORTED_ACCOUNTANT, sample_rate, steps, schedule, prior_events,
                     repeats)(sigma) <= target_epsilon


def noise_range(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                schedule: NoiseSchedule, prior_events: Sequence[DpEvent] = (),
                repeats: int = 1) -> float:
    """The least σ a calibration may return, after checking that some σ up to MAX_NOISE_MULTIPLIER
    meets the target: calibrate_noise_multiplier's first part, for a caller that checks a target
    before it calibrates (in another process).

    Args:
      target_epsilon: the budget, ε at δ.
      delta: δ.
      sample_rate: the run's Poisson rate q.
      steps: the run's steps.
      schedule: the run's noise, whose decay and count noise every σ tried keeps.
      prior_events: the earlier runs on the same data, composed first.
      repeats: the run is repeated that many times (rounds of training on the same data).

    Returns:
      least_sigma(schedule, steps). Raises the NoSigma that says why when no σ meets the target.
    """
    if any(not e.is_private for e in prior_events):
        raise PriorNotPrivate()
    spent_before = compose_epsilon(prior_events, delta) if prior_events else 0.0
    if spent_before >= target_epsilon:
        raise PriorSpent(spent_before)
    least = least_sigma(schedule, steps)
    if least > MAX_NOISE_MULTIPLIER:
        raise DecayTooSteep(least)

    spent = _spent_at(delta, REPORTED_ACCOUNTANT, sample_rate, steps, schedule, prior_events,
                      repeats)
    if spent(MAX_NOISE_MULTIPLIER) > target_epsilon:
        # σ = inf: the count's noise alone
        if schedule.count_noise_multiplier and spent(math.inf) >= target_epsilon:
            raise CountAloneSpends(spent(math.inf))
        raise TooManySteps(spent(MAX_NOISE_MULTIPLIER))
    return least


def _spent_at(delta: float, accountant: str, sample_rate: float, steps: int,
              schedule: NoiseSchedule, prior_events: Sequence[DpEvent], repeats: int):
    """σ -> ε at δ by `accountant` of `prior_events` (their runs and searches), then of `repeats`
    runs of `steps` steps at gradient noise σ (`schedule`'s decay and count noise kept): what a
    calibration computes for each σ it tries."""
    prior, searches = _run_segments(prior_events), _searches(prior_events)

    def spent(sigma: float) -> float:
        segments = prior + [(sample_rate, effective, count) for effective,
                            count in schedule.with_sigma(sigma).segments(steps)] * repeats
        return _epsilon(_counts(segments), delta, accountant, searches)
    return spent


def _run_segments(events: Sequence[DpEvent]) -> list:
    """The (q, σ, steps) segments of the training runs among `events` (a search is composed apart:
    _searches)."""
    return [segment for e in events if e.search is None for segment in e.segments()]


def _searches(events: Sequence[DpEvent]) -> tuple:
    return tuple(e.search for e in events if e.search is not None)


def least_sigma(schedule: NoiseSchedule, steps: int) -> float:
    """The least σ whose every step (decay and count noise included) has an effective noise
    multiplier of at least MIN_NOISE_MULTIPLIER (inf: none, the count's noise is too small): the
    lower end of a calibration."""
    count = schedule.count_noise_multiplier
    # what the gradient may add to a step's σ⁻²
    room = MIN_NOISE_MULTIPLIER ** -2 - (count ** -2 if count else 0.0)
    if room <= 0:
        return math.inf
    # A hair above it, so that the σ found passes the floor again where a task is
    # handed it (noise_for_rounds).
    return room ** -0.5 / schedule.with_sigma(1.0).gradient_sigma(steps - 1) * (1 + 1e-9)


def searches_epsilon(searches: Sequence[Search], delta: float) -> float:
    """ε at δ (RDP) of private searches alone (events.Search), as compose_epsilon composes them."""
    return _epsilon((), delta, "rdp", tuple(searches))
