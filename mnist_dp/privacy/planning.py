"""A training run's privacy plan, decided before its first step: the sampling plan (Poisson rate q,
the steps), the noise of every step (σ given, or calibrated from target_epsilon; decay; adaptive
clipping's count), the checks that refuse what the accountant could not bound, and the DP event that
records a run.

This is where the hyperparameters meet the accountant (accountant.py, mathematics only): its NoSigma
errors become user errors here, naming the setting to change. budget.py builds a train task's plan
on this one.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from mnist_dp import hyperparameters
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy import accountant, events
from mnist_dp.privacy.events import NO_CLIPPING, NOISE_STAGES, PER_EXAMPLE, DpEvent, NoiseSchedule
from mnist_dp.utils.errors import UserError

# substratools configures the "substratools" logger (level from --log-level); log under
# it, as the skeleton does.
log = logging.getLogger("substratools.mnist_dp")


@dataclass(frozen=True)
class SamplingPlan:
    """What one training run will do: `steps` Poisson-sampled batches with probability
    `sample_rate`."""

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
        """E[B] = n·q: what a DP step divides the noisy sum by (a constant, not the realised
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
    def from_hyperparameters(cls, n: int, hp: Hyperparameters, where: str) -> SamplingPlan:
        if hp.batch_size > n:
            raise UserError(f"{where}: batch_size = {hp.batch_size} is larger than the {n} "
                            "training examples")
        plan = cls(n=n, steps_per_epoch=math.ceil(n / hp.batch_size), epochs=hp.epochs)
        if plan.planned_steps > MAX_STEPS:
            raise UserError(f"{where}: epochs = {hp.epochs} with batch_size = {hp.batch_size} on "
                            f"{n} examples is {plan.planned_steps:,} steps, more than "
                            f"{MAX_STEPS:,}; use fewer epochs or larger batches")
        return plan


MAX_STEPS = 1_000_000  # days of training on a CPU; beyond it a typo is likelier than a plan


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
    count = 2 * count_stddev(hp, plan) if hp.clip_quantile is not None else 0.0
    return NoiseSchedule(sigma, hp.noise_decay, decay_steps, count)


def count_stddev(hp: Hyperparameters, plan: SamplingPlan) -> float:
    return events.count_stddev(hp.clip_count_stddev, plan.expected_batch_size)


# Frameworks whose DP library has no secure noise generator (secure_mode is refused for them).
NO_SECURE_MODE = {"tf": "TF Privacy offers no secure noise generator; use the torch algo (Opacus "
                        "secure_mode) or set secure_mode to false"}


def check_run(framework: str, hp: Hyperparameters, n: int, where: str) -> SamplingPlan:
    """What a train task on `n` examples would refuse before it resolves σ, checked where the sizes
    are known: the task itself, and the scripts before they register anything (with check_target:
    budget.check_plan).

    Args:
      framework: the algo's name ("torch", "tf", "mindspore").
      hp: the hyperparameters.
      n: the number of training examples.
      where: what names the hyperparameters in an error ("hyperparameters.json", an organisation).

    Returns:
      The run's SamplingPlan. Raises UserError for δ ≥ 1/n, secure_mode where the library has no
      secure generator, a plan past the step limits, or too little noise per step.
    """
    check_delta(hp.delta, n, where=f"{where}: delta")
    check_secure_mode(framework, hp, where)
    plan = SamplingPlan.from_hyperparameters(n, hp, where)
    check_noise(hp, plan, where)
    return plan


def check_secure_mode(framework: str, hp: Hyperparameters, where: str = "") -> None:
    """Refuse secure_mode for a framework whose DP library has no secure noise generator (without DP
    there is no noise, in any framework): check_run's check, and skeleton.fit's for a caller that
    skips check_run."""
    if hp.dp and hp.secure_mode and framework in NO_SECURE_MODE:
        raise UserError(f"{where + ': ' if where else ''}secure_mode: {NO_SECURE_MODE[framework]}")


def check_delta(delta: float, n: int, where: str = "delta") -> None:
    """δ must be explicit, positive and below 1/n (else 'release one example at random' is
    (0, δ)-DP)."""
    if not isinstance(delta, (int, float)) or not 0 < delta < 1.0 / n:
        raise UserError(f"{where} = {delta} must be > 0 and < 1/n = {1.0 / n:.3g} for n = {n} "
                        "training examples; choose a smaller delta")


def check_noise(hp: Hyperparameters, plan: SamplingPlan, where: str) -> None:
    """Refuse a step with less noise than events.MIN_NOISE_MULTIPLIER (its ε is huge and PLD cannot
    compute it in reasonable time): a given σ too small, or adaptive clipping's count too little
    noised for any σ. A σ calibrated from target_epsilon never goes below the floor (the
    calibration's own checks, worded by `refused`)."""
    if not hp.dp:
        return
    floor = events.MIN_NOISE_MULTIPLIER
    # infinite gradient noise: the count's alone (or inf)
    count = noise_schedule(hp, plan, math.inf).smallest(1)
    if count <= floor:  # the gradient's noise lowers a step's σ below the count's: no room is left
        stddev = "null: E[B] / 20 = " if hp.clip_count_stddev is None else ""
        raise UserError(f"{where}: clip_count_stddev ({stddev}{count_stddev(hp, plan):.3g}) gives "
                        f"adaptive clipping's count a noise multiplier of {count:.3g} (twice the "
                        f"std: the count's sensitivity is 1/2), not above the {floor:g} every "
                        "step's noise must exceed: a near-noiseless count spends a huge ε; set "
                        f"clip_count_stddev above {floor / 2:g}, or clip_quantile to null")
    if hp.noise_multiplier is None:
        return
    schedule = noise_schedule(hp, plan, hp.noise_multiplier)
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


def check_target(hp: Hyperparameters, plan: SamplingPlan, where: str) -> None:
    """Refuse a target_epsilon no σ meets on fresh data, without calibrating: the scripts' check
    before they register a plan whose tasks calibrate σ themselves (a task's calibration checks it
    again with the earlier runs of its data)."""
    if hp.dp and hp.noise_multiplier is None:
        try:
            accountant.noise_range(hp.target_epsilon, hp.delta, plan.sample_rate, plan.steps,
                                   noise_schedule(hp, plan, 1.0))
        except accountant.NoSigma as exc:
            raise refused(exc, hp, plan, where) from None


def resolve_noise_multiplier(hp: Hyperparameters, plan: SamplingPlan, prior: list, repeats: int = 1,
                             where: str = "") -> float:
    """σ of a run of `plan`.

    Args:
      hp: the hyperparameters: noise_multiplier, or target_epsilon and delta.
      plan: the run's sampling plan.
      prior: the DpEvents of the earlier runs on the same examples.
      repeats: how many runs of this plan the target must cover (rounds of a plan).
      where: what names the hyperparameters in an error.

    Returns:
      0 without DP; hp's noise_multiplier if given; else the least σ that keeps the data's ε
      within target_epsilon after `prior` and `repeats` runs of this one. Raises UserError when
      no σ does.
    """
    if not hp.dp:
        return 0.0
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    try:
        sigma = accountant.calibrate_noise_multiplier(hp.target_epsilon, hp.delta, plan.sample_rate,
                                                      plan.steps, prior,
                                                      schedule=noise_schedule(hp, plan, 1.0),
                                                      repeats=repeats)
    except accountant.NoSigma as exc:
        raise refused(exc, hp, plan, where, prior, repeats) from None
    log.info("calibrated noise_multiplier = %.4f for target epsilon %.3g at delta %.1e", sigma,
             hp.target_epsilon, hp.delta)
    return sigma


def refused(why: accountant.NoSigma, hp: Hyperparameters, plan: SamplingPlan, where: str = "",
            prior: list = (), repeats: int = 1) -> UserError:
    """The accountant's reason why no σ meets hp.target_epsilon, in the words of the setting to
    change, for a run of `plan` repeated `repeats` times after the runs `prior` on its data; `where`
    names the hyperparameters."""
    named = f"{where}: " if where else ""
    target = f"{named}target_epsilon = {hp.target_epsilon}"
    over = (f"at δ = {hp.delta:g} over {plan.steps * repeats} "
            f"steps{' after the input model' if prior else ''}")
    most = hyperparameters.MAX_NOISE_MULTIPLIER
    match why:
        case accountant.PriorNotPrivate():
            text = (f"{named}cannot calibrate to a target epsilon: the input model was trained "
                    "without DP (epsilon = inf)")
        case accountant.PriorSpent(epsilon=spent):
            text = (f"{target} is already spent by the input model (epsilon = {spent:.3f}); raise "
                    "the target or train from scratch")
        case accountant.DecayTooSteep(least=least):
            text = (f"{named}noise_decay = {hp.noise_decay:g} lowers the noise so far that keeping "
                    f"every step's noise multiplier at {events.MIN_NOISE_MULTIPLIER:g} or more "
                    f"needs σ = {least:.3g} in the first steps, more than {most:g}; raise "
                    "noise_decay (1: constant)")
        case accountant.CountAloneSpends(epsilon=spent):
            text = (f"{target}: adaptive clipping's noisy count alone spends ε = {spent:.3f} "
                    f"{over}, so no gradient noise can meet the target; raise clip_count_stddev "
                    "(the count's noise) or target_epsilon, or set clip_quantile to null")
        case accountant.TooManySteps(epsilon=spent):
            decay = " or noise_decay" if hp.noise_decay < 1 else ""
            text = (f"{target}: even noise_multiplier = {most:g}, the most allowed, spends ε = "
                    f"{spent:.3g} {over}; raise target_epsilon{decay}, or train fewer epochs")
        case _:  # NumericsGaveUp
            text = (f"{target}: no noise multiplier found for it {over} with q = "
                    f"{plan.sample_rate:.4g} ({why}); give noise_multiplier instead, or a smaller "
                    "target_epsilon")
    return UserError(text)


def noise_for_rounds(hp: Hyperparameters, sizes: list, rounds: int) -> Hyperparameters:
    """Fix σ for a plan that trains on the same data `rounds` times.

    A train task calibrates σ from target_epsilon for its own run; in round 2 its data's budget is
    already spent. So with several rounds σ is calibrated here, once, so that every organisation's
    data (of the given `sizes`) ends at or below target_epsilon after the last round; the tasks get
    that σ.
    """
    if not hp.dp or hp.target_epsilon is None or rounds == 1:
        return hp
    sigmas = []
    for n in sizes:
        plan = SamplingPlan.from_hyperparameters(n, hp, "hyperparameters")
        check_noise(hp, plan, "hyperparameters")  # before the accountant runs on it
        sigmas.append(resolve_noise_multiplier(hp, plan, [], rounds, "hyperparameters"))
    return dataclasses.replace(hp, noise_multiplier=max(sigmas), target_epsilon=None)


def run_event(framework: str, data: tuple, hp: Hyperparameters, plan: SamplingPlan, sigma: float,
              steps: int, ran=None, code: dict | None = None) -> DpEvent:
    """The DP event of a run: what the budget and the progress bar account, and the ledger records.

    Args:
      framework: the algo's name.
      data: the keyed identities of the run's data samples.
      hp: the hyperparameters (noise schedule, clipping norm, batch size).
      plan: the run's sampling plan (n, q).
      sigma: the gradient noise multiplier of the first steps.
      steps: how many steps the event covers (those run so far, or all).
      ran: for the ledger, what the run did (interface.Ran, as skeleton.fit completes it): its
        clipping unit, the library's own ε, whether its noise can be replayed.
      code: for the ledger, the running code's provenance.

    Returns:
      A DpEvent; with `ran`, one with a new run id.
    """
    schedule = noise_schedule(hp, plan, sigma)
    event = DpEvent(framework, data, plan.n, plan.sample_rate, sigma, steps, PER_EXAMPLE if hp.dp
                    else NO_CLIPPING, hp.max_grad_norm, noise_decay=schedule.noise_decay,
                    decay_steps=schedule.decay_steps,
                    count_noise_multiplier=schedule.count_noise_multiplier)
    if ran is None:
        return event
    return dataclasses.replace(event, run_id=events.new_run_id(), clipping=ran.clipping,
                               library_epsilon=tuple(sorted(ran.library_epsilon.items())),
                               batch_size=hp.batch_size, planned_steps=plan.planned_steps,
                               code=code, replayable_noise=ran.replayable_noise)
