"""A training run's plan, decided once before its first step and never changed: the sampling plan
(Poisson rate q, the steps, cut to the budget), σ (given, or calibrated from target_epsilon), the
noise of every step, adaptive clipping's count noise, and the DP event that records the run.

One function makes it: `for_task` (a train task, after the earlier runs it counts), `fresh`
(data no run has touched: benchmarks, audits) or `TaskPlan.of` (a search's candidate, whose σ the
search calibrated). It runs every check once, and it alone asks the accountant (accountant.py,
mathematics only), whose NoSigma errors become user errors naming the setting to change
(refusals.py).
Everything downstream (the skeleton's fit, the frameworks' hooks, the ledger's event, the model
file's metadata, the search's candidates) takes the plan, not the raw hyperparameters.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from mnist_dp.assets import capabilities
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy import accountant, events, no_sigma, refusals
from mnist_dp.privacy.budgets import Budget, budgets
from mnist_dp.privacy.events import (
    NO_CLIPPING,
    NOISE_STAGES,
    PER_EXAMPLE,
    PER_PERSON,
    DpEvent,
    NoiseSchedule,
)
from mnist_dp.privacy.units import UNITS
from mnist_dp.utils.errors import UserError

# substratools configures the "substratools" logger (level from --log-level); log under
# it, as the skeleton does.
log = logging.getLogger("substratools.mnist_dp")

MAX_STEPS = 1_000_000  # days of training on a CPU; beyond it a typo is likelier than a plan


@dataclass(frozen=True)
class SamplingPlan:
    """What one training run will do: `steps` Poisson-sampled batches with probability
    `sample_rate`, all from `n`, the data's public size (policy.py), not a count of the data."""

    n: int
    steps_per_epoch: int
    epochs: int
    max_steps: int | None = None  # set when the privacy budget stops training early

    @property
    def sample_rate(self) -> float:
        # Same convention as Opacus' DPDataLoader: q = 1 / (batches per epoch), expected batch n*q.
        return 1.0 / self.steps_per_epoch

    @property
    def expected_batch_size(self) -> float:
        """E[B] = n·q: what a DP step divides the noisy sum by (a public constant, not the realised
        size)."""
        return self.n * self.sample_rate

    @property
    def planned_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    @property
    def steps(self) -> int:
        """The steps to run: every epoch's, or fewer if the budget says so (a framework stops
        there)."""
        return self.planned_steps if self.max_steps is None else min(
            self.max_steps, self.planned_steps)

    @property
    def stopped_by_budget(self) -> bool:
        return self.steps < self.planned_steps

    @classmethod
    def from_hyperparameters(cls, n: int, hp: Hyperparameters, where: str,
                             privacy_unit: str = PER_EXAMPLE) -> SamplingPlan:
        """The sampling plan of every epoch of a run, ceil(n / batch_size) steps each.

        Args:
          n: the data's public size: training examples (persons) it is declared to hold.
          hp: the hyperparameters (batch_size, epochs).
          where: what names the hyperparameters in an error.
          privacy_unit: what n counts, events.PER_EXAMPLE or PER_PERSON (an error names it).

        Returns:
          The SamplingPlan, not cut by a budget. Raises UserError when batch_size > n or the plan is
          more than MAX_STEPS steps.
        """
        units = UNITS[privacy_unit].counted
        if hp.batch_size > n:
            counted = ("; with subjects.npy a batch counts persons: lower batch_size"
                       if privacy_unit == PER_PERSON else "")
            raise UserError(f"{where}: batch_size = {hp.batch_size} is larger than the {n} "
                            f"{units} (the data's public size){counted}")
        plan = cls(n=n, steps_per_epoch=math.ceil(n / hp.batch_size), epochs=hp.epochs)
        if plan.planned_steps > MAX_STEPS:
            raise UserError(f"{where}: epochs = {hp.epochs} with batch_size = {hp.batch_size} on "
                            f"{n} {units} is {plan.planned_steps:,} steps, more than "
                            f"{MAX_STEPS:,}; use fewer epochs or larger batches")
        return plan


@dataclass(frozen=True)
class TaskPlan:
    """Everything a run of a framework will do that its privacy depends on.

    Attributes:
      framework: the algo's name (a key of assets.ALGO_ASSETS).
      hp: the hyperparameters, checked: the frameworks read their training settings here
        (optimizer, learning rate, weight average, secure_mode).
      sampling: the sampling plan: n, q, and the steps, cut to hp.max_epsilon.
      sigma: the gradient noise multiplier of the first steps (0 without DP).
      schedule: the noise of every step at `sigma` (decay, adaptive clipping's count noise).
      identities: the keyed identities of the run's data samples (the event's `data`).
      histories: the earlier runs it counts (Ledger.histories: one list per organisation of its
        data).
      privacy_unit: the unit clipped and counted in sampling.n: events.PER_EXAMPLE or PER_PERSON.
    """

    framework: str
    hp: Hyperparameters
    sampling: SamplingPlan
    sigma: float
    schedule: NoiseSchedule
    identities: tuple = ()
    histories: tuple = ((),)
    privacy_unit: str = PER_EXAMPLE

    def __post_init__(self):
        if self.schedule.sigma != self.sigma:  # one σ: the events are made from the schedule's
            raise ValueError(f"σ {self.sigma} and its schedule's {self.schedule.sigma} differ")

    @classmethod
    def of(cls, framework: str, hp: Hyperparameters, sampling: SamplingPlan, sigma: float,
           identities: tuple = (), histories: Sequence = ((),)) -> TaskPlan:
        """The plan of a run, its schedule made from hp, without checks or budget: a search's
        candidate, whose σ the search calibrated.

        Args:
          framework: the algo's name.
          hp: the hyperparameters.
          sampling: the run's sampling plan.
          sigma: the gradient noise multiplier of the first steps (0 without DP, whatever is given).
          identities: the keyed identities of the run's data samples.
          histories: the earlier runs it counts (Ledger.histories).

        Returns:
          The TaskPlan.
        """
        sigma = sigma if hp.dp else 0.0
        return cls(framework, hp, sampling, sigma, noise_schedule(hp, sampling, sigma),
                   tuple(identities), tuple(tuple(h) for h in histories))

    @property
    def count_stddev(self) -> float:
        """The std s of adaptive clipping's noisy count (count_noise_multiplier = 2s)."""
        return count_stddev(self.hp.clip_count_stddev, self.sampling.expected_batch_size)

    def event_at(self, steps: int) -> DpEvent:
        """The DP event of the run's first `steps` steps: what the budget and the progress bar
        account."""
        return DpEvent.of_run(self.framework, self.identities, self.sampling.n,
                              self.sampling.sample_rate, self.schedule, steps,
                              self.privacy_unit if self.hp.dp else NO_CLIPPING,
                              self.hp.max_grad_norm)

    def event(self, ran, code: dict | None = None) -> DpEvent:
        """The ledger's event of the run as it ran, with a new run id.

        Args:
          ran: what the run did (interface.Ran, as training.fit completes it): its steps, σ, its
            clipping unit, the library's own ε, whether its noise can be replayed.
          code: the running code's provenance (None in memory).
        """
        return dataclasses.replace(
            self.event_at(ran.steps), noise_multiplier=ran.noise_multiplier,
            run_id=events.new_run_id(), clipping=ran.clipping,
            library_epsilon=tuple(sorted(ran.library_epsilon.items())),
            batch_size=self.hp.batch_size, planned_steps=self.sampling.planned_steps, code=code,
            replayable_noise=ran.replayable_noise)

    def metadata(self) -> dict:
        """The model file's metadata of a model this plan trained: the hyperparameters and the
        settings it ran with (which model_file.load checks against the ledger's last run)."""
        return {**self.hp.to_json(), "noise_multiplier": self.sigma,
                "planned_steps": self.sampling.planned_steps,
                "stopped_by_budget": self.sampling.stopped_by_budget}


def for_task(framework: str, hp: Hyperparameters, budget: Budget, where: str,
             may_stop: bool = True) -> TaskPlan:
    """The plan of a train task, in one pass: every check, then σ, then the budgets.

    Args:
      framework: the algo's name.
      hp: the hyperparameters.
      budget: what the run may spend: its unit and their count, the earlier runs it counts (σ is
        calibrated for the worst of `budget.histories`; the budgets count `budget.counted`), the
        data owner's policy (whose budgets hold beside hp.max_epsilon).
      where: what names the hyperparameters in an error.
      may_stop: whether the run may stop early at a budget; else one that would is refused.

    Returns:
      The TaskPlan, its steps cut to the budgets (0 when the data has spent one and
      budget.passes_on: the task passes its input model on). Raises UserError for anything the
      accountant could not bound (check_run), a target_epsilon no σ meets, a budget below a single
      step's ε, or a spent budget where the input model is not passed on.
    """
    n, privacy_unit = budget.n, budget.unit.clipping
    sampling, unit = checked_run(framework, hp, n, where, privacy_unit)
    limits = budgets(hp, budget.owner) if hp.dp else []
    # σ as given (0 without DP), or None: calibrated to target_epsilon
    given = 0.0 if not hp.dp else None if hp.noise_multiplier is None else float(
        hp.noise_multiplier)
    try:
        account = accountant.account_run(accountant.PlannedRun(
            DpEvent.of_run(framework, budget.identities, n, sampling.sample_rate, unit,
                           sampling.steps, privacy_unit, hp.max_grad_norm),
            hp.delta, given, hp.target_epsilon, budget.histories,
            tuple((epsilon, delta) for epsilon, delta, _ in limits), budget.counted))
    except no_sigma.NoSigma as exc:
        raise refusals.refused(exc, hp, sampling, where, exc.prior) from None
    if given is None:
        log.info("calibrated noise_multiplier = %.4f for target epsilon %.3g at delta %.1e",
                 account.sigma, hp.target_epsilon, hp.delta)
    for limit, (epsilon, delta, named) in zip(account.limits, limits):
        if limit.one_step > epsilon:  # not even one step fits on fresh data
            raise refusals.below_one_step(hp, limit.one_step, named=named, epsilon=epsilon,
                                          delta=delta)
        if limit.allowed < limit.steps and not may_stop:
            raise UserError(f"{named} = {epsilon:g} at delta = {delta:g}: this run would pass it "
                            f"after {limit.allowed} of its {limit.steps} steps, and it cannot stop "
                            "early; train fewer epochs, with more noise, or on other data")
        if limit.allowed == 0:
            log.warning("privacy budget spent: this data's ε is already %.3f at delta = %g (its "
                        "own ledger and the input model's) and one more step would exceed %s = "
                        "%g: no training", limit.spent, delta, named, epsilon)
        elif limit.allowed < limit.steps:
            log.warning("privacy budget: stopping after %d of %d steps (%s = %g at delta = %g)",
                        limit.allowed, limit.steps, named, epsilon, delta)
        sampling = dataclasses.replace(sampling, max_steps=limit.allowed)
    if sampling.steps == 0 and not budget.passes_on:
        named = " and ".join(f"{name} = {epsilon}" for epsilon, _, name in limits)
        raise UserError(f"{named}: this data has spent its budget (its own ledger of the runs "
                        "released from it: docs/privacy.md, \"The data's own ledger\"); nothing "
                        "was trained or saved")
    return TaskPlan(framework, hp, sampling, account.sigma, unit.with_sigma(account.sigma),
                    tuple(budget.identities), tuple(tuple(h) for h in budget.histories),
                    privacy_unit)


def fresh(framework: str, hp: Hyperparameters, n: int, where: str,
          identities: tuple = (), privacy_unit: str = PER_EXAMPLE) -> TaskPlan:
    """The plan of a run on `n` examples (persons) that no earlier run touched (benchmarks,
    audits).

    Args:
      framework: the algo's name.
      hp: the hyperparameters.
      n: the number of training examples, or of persons per person.
      where: what names the hyperparameters in an error.
      identities: the keyed identities of the run's data samples.
      privacy_unit: for_task's.

    Returns:
      The TaskPlan, as for_task makes and checks it.
    """
    return for_task(framework, hp, Budget(n, UNITS[privacy_unit], tuple(identities)), where)


def noise_schedule(hp: Hyperparameters, plan: SamplingPlan, sigma: float) -> NoiseSchedule:
    """What noise every step of a run adds.

    Args:
      hp: the hyperparameters (dp, noise_decay, clip_quantile, clip_count_stddev).
      plan: the run's sampling plan (its planned steps set the decay's stages).
      sigma: the gradient noise multiplier of the first stage.

    Returns:
      The NoiseSchedule: σ, the decay and adaptive clipping's count noise (σ 0 without DP).
    """
    if not hp.dp:
        return NoiseSchedule(0.0)
    decay_steps = math.ceil(plan.planned_steps / NOISE_STAGES) if hp.noise_decay < 1 else 0
    # sensitivity of the count: 1/2
    count = (2 * count_stddev(hp.clip_count_stddev, plan.expected_batch_size)
             if hp.clip_quantile is not None else 0.0)
    return NoiseSchedule(sigma, hp.noise_decay, decay_steps, count)


def count_stddev(clip_count_stddev: float | None, expected_batch_size: float) -> float:
    """Adaptive clipping: the std of the noise on the count of unclipped examples (E[B] / 20 unless
    given, Andrew et al. 2021); the ledger's count_noise_multiplier is twice it (the count's
    sensitivity is 1/2)."""
    return clip_count_stddev if clip_count_stddev is not None else expected_batch_size / 20


def check_run(framework: str, hp: Hyperparameters, n: int, where: str,
              privacy_unit: str = PER_EXAMPLE) -> SamplingPlan:
    """The sampling plan of a run, after every check of `checked_run`: what the scripts check before
    they register anything (preflight.check_plan) and the search for each of its profiles.

    Args:
      framework: the algo's name.
      hp: the hyperparameters.
      n: the number of training examples (persons).
      where: what names the hyperparameters in an error.
      privacy_unit: checked_run's.

    Returns:
      The run's SamplingPlan. Raises UserError as checked_run does.
    """
    return checked_run(framework, hp, n, where, privacy_unit)[0]


def checked_run(framework: str, hp: Hyperparameters, n: int, where: str,
                privacy_unit: str = PER_EXAMPLE) -> tuple:
    """What a run on `n` examples (persons) would refuse before σ is resolved.

    Args:
      framework: the algo's name (a key of assets.ALGO_ASSETS).
      hp: the hyperparameters.
      n: the number of training examples (persons).
      where: what names the hyperparameters in an error ("hyperparameters.json", an organisation).
      privacy_unit: what n counts (SamplingPlan.from_hyperparameters').

    Returns:
      (the run's SamplingPlan, its noise schedule at σ = 1). Raises UserError for δ ≥ 1/n,
      secure_mode where the library has no secure generator, a plan past the step limits, or too
      little noise per step.
    """
    check_delta(hp.delta, n, where=f"{where}: delta")
    refused = capabilities(framework).secure_noise
    if hp.dp and hp.secure_mode and refused is not None:
        raise UserError(f"{where}: secure_mode: {refused}")
    plan = SamplingPlan.from_hyperparameters(n, hp, where, privacy_unit)
    unit = noise_schedule(hp, plan, 1.0)
    check_noise(hp, plan, unit, where)
    return plan, unit


def check_delta(delta: float, n: int, where: str = "delta") -> None:
    """δ must be explicit, positive and below 1/n (else 'release one example at random' is
    (0, δ)-DP).

    Args:
      delta: δ.
      n: the number of training examples.
      where: what names δ in the UserError that refuses it.
    """
    if not isinstance(delta, (int, float)) or not 0 < delta < 1.0 / n:
        raise UserError(f"{where} = {delta} must be > 0 and < 1/n = {1.0 / n:.3g} for n = {n} "
                        "training examples (the data's public size); choose a smaller delta")


def check_noise(hp: Hyperparameters, plan: SamplingPlan, unit: NoiseSchedule, where: str) -> None:
    """Refuse a step with less noise than events.MIN_NOISE_MULTIPLIER (its ε is huge and PLD cannot
    compute it in reasonable time): a given σ too small, or adaptive clipping's count too little
    noised for any σ. A σ calibrated from target_epsilon never goes below the floor (the
    calibration's own checks, worded by refusals.refused).

    Args:
      hp: the hyperparameters.
      plan: the run's sampling plan.
      unit: the run's noise schedule at σ = 1 (noise_schedule).
      where: what names the hyperparameters in an error.
    """
    if not hp.dp:
        return
    floor = events.MIN_NOISE_MULTIPLIER
    stddev = count_stddev(hp.clip_count_stddev, plan.expected_batch_size)
    # infinite gradient noise: the count's alone (or inf)
    count = unit.with_sigma(math.inf).smallest(1)
    if count <= floor:  # the gradient's noise lowers a step's σ below the count's: no room is left
        named = "null: E[B] / 20 = " if hp.clip_count_stddev is None else ""
        raise UserError(f"{where}: clip_count_stddev ({named}{stddev:.3g}) gives adaptive "
                        f"clipping's count a noise multiplier of {count:.3g} (twice the std: the "
                        f"count's sensitivity is 1/2), not above the {floor:g} every step's noise "
                        "must exceed: a near-noiseless count spends a huge ε; set "
                        f"clip_count_stddev above {floor / 2:g}, or clip_quantile to null")
    if hp.noise_multiplier is None:
        return
    schedule = unit.with_sigma(hp.noise_multiplier)
    smallest = schedule.smallest(plan.planned_steps)
    if smallest < floor:
        stages = len(schedule.segments(plan.planned_steps))
        decay = (f" and noise_decay = {hp.noise_decay:g} (σ · {hp.noise_decay:g}^{stages - 1} in "
                 f"the last of {stages} stages)" if schedule.decay_steps and stages > 1 else "")
        count_too = " with the count's noise" if hp.clip_quantile is not None else ""
        raise UserError(f"{where}: noise_multiplier = {hp.noise_multiplier:g}{decay} gives steps "
                        f"an effective noise multiplier of {smallest:.3g}{count_too}, below "
                        f"{floor:g}: such a step spends a huge ε; raise "
                        f"noise_multiplier{' or noise_decay' if decay else ''}")


def resolve_noise_multiplier(hp: Hyperparameters, plan: SamplingPlan, prior: list, repeats: int = 1,
                             where: str = "", prior_is: str = refusals.INPUT_MODEL) -> float:
    """σ of a run of `plan`.

    Args:
      hp: the hyperparameters: noise_multiplier, or target_epsilon and delta.
      plan: the run's sampling plan.
      prior: the DpEvents of the earlier runs on the same examples.
      repeats: how many runs of this plan the target must cover (rounds of a plan).
      where: what names the hyperparameters in an error.
      prior_is: what `prior` is, for a refusal (refusals.INPUT_MODEL or DATA_LEDGER).

    Returns:
      0 without DP; hp's noise_multiplier if given; else the least σ that keeps the data's ε
      within target_epsilon after `prior` and `repeats` runs of this one. Raises UserError when
      no σ does.
    """
    if not hp.dp:
        return 0.0
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    unit = noise_schedule(hp, plan, 1.0)
    try:
        sigma = accountant.calibrate_noise_multiplier(hp.target_epsilon, hp.delta, plan.sample_rate,
                                                      plan.steps, prior, schedule=unit,
                                                      repeats=repeats)
    except no_sigma.NoSigma as exc:
        raise refusals.refused(exc, hp, plan, where, prior, repeats, prior_is) from None
    log.info("calibrated noise_multiplier = %.4f for target epsilon %.3g at delta %.1e", sigma,
             hp.target_epsilon, hp.delta)
    return sigma
