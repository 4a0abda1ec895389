"""What a training run may spend: its privacy plan, decided before the first step and recorded after the last.

The sampling plan (Poisson rate q and the number of steps), σ (given, or calibrated from target_epsilon over
the runs its examples already had), the noise schedule and adaptive clipping's count noise, the budget that
may stop it early, the up-front checks the scripts share with the task, and the DP event the ledger records.
The task skeleton (learning/skeleton.py) asks for it once (`for_task`) and records its event; accountant.py is
the accountant it relies on.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from mnist_dp import hyperparameters as hp_file
from mnist_dp.privacy import accountant, events
from mnist_dp.privacy.accountant import (
    ACCOUNTANT_NAMES,
    REPORTED_ACCOUNTANT,
    calibrate_noise_multiplier,
    check_delta,
    compose_epsilon,
    steps_within_budget,
)
from mnist_dp.privacy.events import NO_CLIPPING, NOISE_STAGES, PER_EXAMPLE, DpEvent, NoiseSchedule
from mnist_dp.privacy.ledger import Examples, Ledger
from mnist_dp.utils.errors import UserError

# substratools configures the "substratools" logger (level from --log-level); log under it, as the skeleton does.
log = logging.getLogger("substratools.mnist_dp")


@dataclass(frozen=True)
class SamplingPlan:
    """What one training run will do: `steps` Poisson-sampled batches with probability `sample_rate`."""

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
        """E[B] = n·q: what a DP step divides the noisy sum by (a constant, not the realised size)."""
        return self.n * self.sample_rate

    @property
    def planned_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    @property
    def steps(self) -> int:
        """The steps to run: every epoch's, or fewer if the budget says so (a framework stops there)."""
        return self.planned_steps if self.max_steps is None else min(self.max_steps, self.planned_steps)

    @property
    def stopped_by_budget(self) -> bool:
        return self.steps < self.planned_steps

    @classmethod
    def from_hyperparameters(cls, n: int, hp: hp_file.Hyperparameters, where: str) -> SamplingPlan:
        if hp.batch_size > n:
            raise UserError(f"{where}: batch_size = {hp.batch_size} is larger than the {n} training examples")
        plan = cls(n=n, steps_per_epoch=math.ceil(n / hp.batch_size), epochs=hp.epochs)
        if plan.planned_steps > MAX_STEPS:
            raise UserError(f"{where}: epochs = {hp.epochs} with batch_size = {hp.batch_size} on {n} examples is "
                            f"{plan.planned_steps:,} steps, more than {MAX_STEPS:,}; "
                            "use fewer epochs or larger batches")
        return plan


MAX_STEPS = 1_000_000  # days of training on a CPU; beyond it a typo is likelier than a plan


def noise_schedule(hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float) -> NoiseSchedule:
    """What noise every step of the run adds: σ (the first stage's), the decay, and adaptive clipping's count."""
    if not hp.dp:
        return NoiseSchedule(0.0)
    decay_steps = math.ceil(plan.planned_steps / NOISE_STAGES) if hp.noise_decay < 1 else 0
    count = 2 * count_stddev(hp, plan) if hp.clip_quantile is not None else 0.0  # sensitivity of the count: 1/2
    return NoiseSchedule(sigma, hp.noise_decay, decay_steps, count)


def count_stddev(hp: hp_file.Hyperparameters, plan: SamplingPlan) -> float:
    return events.count_stddev(hp.clip_count_stddev, plan.expected_batch_size)


# Frameworks whose DP library has no secure noise generator (secure_mode is refused for them).
NO_SECURE_MODE = {"tf": "TF Privacy offers no secure noise generator; use the torch algo (Opacus secure_mode) "
                        "or set secure_mode to false"}


def check_run(framework: str, hp: hp_file.Hyperparameters, n: int, where: str) -> SamplingPlan:
    """Everything a train task on `n` examples would refuse, checked where the sizes are known: the
    task itself, and the scripts before they register anything."""
    check_delta(hp.delta, n, where=f"{where}: delta")
    if hp.dp and hp.secure_mode and framework in NO_SECURE_MODE:  # without DP there is no noise, in any framework
        raise UserError(f"{where}: secure_mode: {NO_SECURE_MODE[framework]}")
    plan = SamplingPlan.from_hyperparameters(n, hp, where)
    check_noise(hp, plan, where)
    return plan


def check_noise(hp: hp_file.Hyperparameters, plan: SamplingPlan, where: str) -> None:
    """Refuse a step with less noise than events.MIN_NOISE_MULTIPLIER (its ε is huge and PLD cannot compute it in
    reasonable time), and a target_epsilon that adaptive clipping's count alone spends (no σ could meet it). A σ
    calibrated from target_epsilon never goes below the floor (calibrate_noise_multiplier)."""
    if not hp.dp:
        return
    floor = events.MIN_NOISE_MULTIPLIER
    count = noise_schedule(hp, plan, math.inf).smallest(1)  # infinite gradient noise: the count's alone (or inf)
    if count <= floor:  # the gradient's noise lowers a step's σ below the count's: no room is left
        stddev = "null: E[B] / 20 = " if hp.clip_count_stddev is None else ""
        raise UserError(f"{where}: clip_count_stddev ({stddev}{count_stddev(hp, plan):.3g}) gives adaptive clipping's "
                        f"count a noise multiplier of {count:.3g} (twice the std: the count's sensitivity is 1/2), not "
                        f"above the {floor:g} every step's noise must exceed: a near-noiseless count spends a huge ε; "
                        f"set clip_count_stddev above {floor / 2:g}, or clip_quantile to null")
    if hp.noise_multiplier is not None:
        schedule = noise_schedule(hp, plan, hp.noise_multiplier)
        smallest = schedule.smallest(plan.planned_steps)
        if smallest < floor:
            stages = len(schedule.segments(plan.planned_steps))
            decay = (f" and noise_decay = {hp.noise_decay:g} (σ · {hp.noise_decay:g}^{stages - 1} in the last of "
                     f"{stages} stages)" if schedule.decay_steps and stages > 1 else "")
            count_too = " with the count's noise" if hp.clip_quantile is not None else ""
            raise UserError(f"{where}: noise_multiplier = {hp.noise_multiplier:g}{decay} gives steps an effective "
                            f"noise multiplier of {smallest:.3g}{count_too}, below {floor:g}: such a step spends a "
                            f"huge ε; raise noise_multiplier{' or noise_decay' if decay else ''}")
    else:
        schedule = noise_schedule(hp, plan, 1.0)
        least = accountant.least_sigma(schedule, plan.planned_steps)
        if least > hp_file.MAX_NOISE_MULTIPLIER:
            raise UserError(f"{where}: noise_decay = {hp.noise_decay:g} lowers the noise so far that keeping every "
                            f"step's noise multiplier at {floor:g} or more needs σ = {least:.3g} in the first steps, "
                            f"more than {hp_file.MAX_NOISE_MULTIPLIER:g}; raise noise_decay (1: constant)")
        accountant.check_target_reachable(hp.target_epsilon, hp.delta, plan.sample_rate, plan.planned_steps, schedule,
                                       where=where)


def dp_event(framework_name: str, data: tuple, hp: hp_file.Hyperparameters, plan: SamplingPlan, result,
             code: dict | None = None) -> DpEvent:
    """The ledger event of a run: what it did (`result`, the skeleton's FitResult) on `data` (sample identities), as
    `plan` and `hp` asked."""
    return dataclasses.replace(
        run_event(framework_name, data, hp, plan, result.noise_multiplier, result.steps),
        run_id=events.new_run_id(),
        clipping=result.clipping,
        sample_rate=result.sample_rate,
        library_epsilon=tuple(sorted(result.library_epsilon.items())),
        batch_size=hp.batch_size,
        planned_steps=plan.planned_steps,
        code=code,
        replayable_noise=result.replayable_noise,
    )


def run_event(framework_name: str, data: tuple, hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float,
              steps: int) -> DpEvent:
    """The ledger event of `steps` steps of this run at gradient noise σ (schedule and count noise from hp)."""
    schedule = noise_schedule(hp, plan, sigma)
    return DpEvent(framework_name, data, plan.n, plan.sample_rate, sigma, steps,
                   PER_EXAMPLE if hp.dp else NO_CLIPPING, hp.max_grad_norm, noise_decay=schedule.noise_decay,
                   decay_steps=schedule.decay_steps, count_noise_multiplier=schedule.count_noise_multiplier)


def resolve_noise_multiplier(hp: hp_file.Hyperparameters, plan: SamplingPlan, prior: list) -> float:
    if not hp.dp:
        return 0.0
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    sigma = calibrate_noise_multiplier(hp.target_epsilon, hp.delta, plan.sample_rate, plan.steps, prior,
                                       schedule=noise_schedule(hp, plan, 1.0))
    log.info("calibrated noise_multiplier = %.4f for target epsilon %.3g at delta %.1e", sigma, hp.target_epsilon,
             hp.delta)
    return sigma


def noise_for_rounds(hp: hp_file.Hyperparameters, sizes: list, rounds: int) -> hp_file.Hyperparameters:
    """Fix σ for a plan that trains on the same data `rounds` times.

    A train task calibrates σ from target_epsilon for its own run; in round 2 its data's budget is already
    spent. So with several rounds σ is calibrated here, once, so that every organisation's data (of the
    given `sizes`) ends at or below target_epsilon after the last round; the tasks get that σ.
    """
    if not hp.dp or hp.target_epsilon is None or rounds == 1:
        return hp
    sigmas = []
    for n in sizes:
        plan = SamplingPlan.from_hyperparameters(n, hp, "hyperparameters")
        check_noise(hp, plan, "hyperparameters")  # before the accountant runs on it
        sigmas.append(calibrate_noise_multiplier(hp.target_epsilon, hp.delta, plan.sample_rate, plan.steps,
                                                 schedule=noise_schedule(hp, plan, 1.0), repeats=rounds))
    return dataclasses.replace(hp, noise_multiplier=max(sigmas), target_epsilon=None)


def check_plan(framework: str, hp: hp_file.Hyperparameters, sizes: list, rounds: int,
               wheres: list) -> hp_file.Hyperparameters:
    """What the train tasks of a plan would refuse, checked before anything is registered: each organisation's run
    (check_run: `sizes[k]` examples, errors named `wheres[k]`), and a max_epsilon below the ε of its first step, with
    σ as the tasks will get it (noise_for_rounds for several rounds). Returns the hyperparameters the tasks get."""
    plans = [check_run(framework, hp, n, where) for n, where in zip(sizes, wheres)]
    hp = noise_for_rounds(hp, sizes, rounds)
    if hp.dp and hp.max_epsilon is not None:
        for plan, where in zip(plans, wheres):  # each organisation's first task starts on fresh data
            check_first_step(framework, hp, plan, resolve_noise_multiplier(hp, plan, []), where)
    return hp


def check_first_step(name: str, hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float, where: str = "") -> None:
    """Refuse a max_epsilon below the ε of a single step of this run at σ (no earlier run on its data): it could
    not train at all. The scripts check it up front (check_plan), a train task again (apply_budget)."""
    one_step = compose_epsilon([run_event(name, (), hp, plan, sigma, 1)], hp.delta)
    if one_step > hp.max_epsilon:
        raise UserError(f"{where + ': ' if where else ''}max_epsilon = {hp.max_epsilon} is below the ε of a single "
                        f"step ({one_step:.3f} at δ = {hp.delta:g}); raise max_epsilon or the noise")


def apply_budget(name: str, identities: tuple, hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float,
                 prior: list) -> SamplingPlan:
    """With max_epsilon: the plan cut at the last step that keeps ε (prior runs on this data included)
    within budget; 0 steps when the prior runs spent it (the train task passes its input model on); refuses
    a budget below a single step's ε."""
    if not hp.dp or hp.max_epsilon is None:
        return plan
    run = run_event(name, identities, hp, plan, sigma, plan.steps)
    allowed = steps_within_budget(prior, run, hp.delta, hp.max_epsilon)
    if allowed == 0 and not prior:
        check_first_step(name, hp, plan, sigma)  # not even one step fits: it raises
    if allowed == 0:
        log.warning("privacy budget spent: the input model's ε on this data is already %.3f at delta = %g and one "
                    "more step would exceed max_epsilon = %g; no training, the input model is passed on unchanged",
                    compose_epsilon(prior, hp.delta), hp.delta, hp.max_epsilon)
    elif allowed < plan.steps:
        log.warning("privacy budget: stopping after %d of %d steps (max_epsilon = %g at delta = %g)",
                    allowed, plan.steps, hp.max_epsilon, hp.delta)
    return dataclasses.replace(plan, max_steps=allowed)


def privacy_summary(ledger: Ledger, delta: float) -> dict:
    return {
        "epsilon": ledger.epsilon(delta, REPORTED_ACCOUNTANT),
        "epsilon_rdp": ledger.epsilon(delta, "rdp"),
        "delta": delta,
        "accountant": ACCOUNTANT_NAMES[REPORTED_ACCOUNTANT],
    }


def describe(summary: dict) -> str:
    text = (f"ε = {summary['epsilon']:.3f} at δ = {summary['delta']:g} ({summary['accountant']}; "
            f"RDP {summary['epsilon_rdp']:.3f})")
    for name, value in summary.get("library_epsilon", {}).items():
        text += f"; {name}: {value:.3f}"
    return text


@dataclass
class RunPrivacy:
    """A train task's privacy plan: the sampling plan (cut by the budget), σ, and the earlier runs of its
    examples (Ledger.histories: usually one list; several when an input model trained on parts of its data)."""

    name: str  # the framework's
    hp: hp_file.Hyperparameters
    identities: tuple  # the data samples' keyed identities
    plan: SamplingPlan
    sigma: float
    histories: list

    def progress(self, steps_done: int) -> str:
        """ε so far, for the progress bar (RDP: fast enough for every epoch)."""
        if not self.hp.dp:
            return "no DP"
        partial = run_event(self.name, self.identities, self.hp, self.plan, self.sigma, steps_done)
        eps = max(compose_epsilon(prior + [partial], self.hp.delta, "rdp") for prior in self.histories)
        return f"ε(RDP)={eps:.2f} δ={self.hp.delta:g}"

    def event(self, result, code: dict | None) -> DpEvent:
        """The ledger event of the run as it ran (`result`: skeleton.FitResult)."""
        return dp_event(self.name, self.identities, self.hp, self.plan, result, code)


def for_task(name: str, hp: hp_file.Hyperparameters, plan: SamplingPlan, ledger: Ledger, samples: list) -> RunPrivacy:
    """The privacy plan of a train task on data `samples` (the opener's), after the runs of `ledger`: its
    examples are recorded in the ledger, σ holds for the worst of their histories, and so does the budget."""
    identities = tuple(s["identity"] for s in samples)
    ledger.add_examples({s["identity"]: Examples.of(s["key"], s["examples"]) for s in samples})
    histories = ledger.histories(identities)
    sigma = max(resolve_noise_multiplier(hp, plan, prior) for prior in histories)
    plan = min((apply_budget(name, identities, hp, plan, sigma, prior) for prior in histories),
               key=lambda cut: cut.steps)
    return RunPrivacy(name, hp, identities, plan, sigma, histories)
