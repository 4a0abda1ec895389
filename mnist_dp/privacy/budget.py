"""What a train task may spend: σ for the worst history of its examples, and the budget
(max_epsilon) that may stop it early, checked by the scripts for a whole plan before anything is
registered.

The task skeleton (learning/skeleton.py) asks for it once (`for_task`) and records the event it
returns; a run's plan, its noise and its checks are planning.py's, ε is the accountant's.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy.accountant import compose_epsilon, steps_within_budget
from mnist_dp.privacy.data_ledger import union
from mnist_dp.privacy.events import DpEvent
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.planning import (
    SamplingPlan,
    check_run,
    check_target,
    noise_for_rounds,
    resolve_noise_multiplier,
    run_event,
)
from mnist_dp.utils.errors import UserError

# substratools configures the "substratools" logger (level from --log-level); log under
# it, as the skeleton does.
log = logging.getLogger("substratools.mnist_dp")


def check_plan(framework: str, hp: Hyperparameters, sizes: list, rounds: int, wheres: list,
               spent: list | None = None) -> Hyperparameters:
    """What the train tasks of a plan would refuse, checked before anything is registered: each
    organisation's run (check_run), a target_epsilon no σ meets, and a max_epsilon below the ε of
    its first step after what its data has spent, with σ as the tasks will get it.

    Args:
      framework: the algo's name.
      hp: the hyperparameters.
      sizes: each organisation's number of training examples.
      rounds: how many times the plan trains on each organisation's data.
      wheres: what names each organisation in an error.
      spent: per organisation, its data's own ledger and its samples' examples (check_spent).

    Returns:
      The hyperparameters the tasks get (σ calibrated here for several rounds: noise_for_rounds).
    """
    plans = [check_run(framework, hp, n, where) for n, where in zip(sizes, wheres)]
    # several rounds: σ is calibrated here, for all of them
    hp = noise_for_rounds(hp, sizes, rounds)
    # each organisation's first task starts a fresh model
    for k, (plan, where) in enumerate(zip(plans, wheres)):
        if hp.dp and hp.max_epsilon is not None:
            sigma = resolve_noise_multiplier(hp, plan, [], where=where)
            check_first_step(framework, hp, plan, sigma, where)
            if spent:
                check_spent(framework, hp, plan, sigma, *spent[k], where)
        else:
            # the task calibrates σ itself: some σ must meet the target
            check_target(hp, plan, where)
    return hp


def check_spent(framework: str, hp: Hyperparameters, plan: SamplingPlan, sigma: float, data: Ledger,
                examples: dict, where: str) -> None:
    """Refuse hp's max_epsilon when the data samples `examples` ({identity: ledger.Examples}) have
    spent it: their own ledger `data` leaves no room for one step of a `framework` run of `plan` at
    gradient noise `sigma`."""
    if not data.events:
        return
    identities = tuple(examples)
    for prior in union(Ledger((), examples), data).histories(identities):
        if steps_within_budget(prior, run_event(framework, identities, hp, plan, sigma, 1),
                               hp.delta, hp.max_epsilon) == 0:
            raise UserError(f"{where}: max_epsilon = {hp.max_epsilon} is spent: this data's own "
                            f"ledger records {len(data.events)} run(s) released from it, ε = "
                            f"{compose_epsilon(prior, hp.delta):.3f} at δ = {hp.delta:g}, and one "
                            "more step would pass it; raise max_epsilon (a budget for the data, "
                            "over every run on it) or train on other data")


def check_first_step(framework: str, hp: Hyperparameters, plan: SamplingPlan, sigma: float,
                     where: str = "") -> None:
    """Refuse hp's max_epsilon below the ε of a single step of a `framework` run of `plan` at
    gradient noise `sigma` (no earlier run on its data): it could not train at all. The scripts
    check it up front (check_plan, `where` naming the organisation), a train task again
    (apply_budget)."""
    one_step = compose_epsilon([run_event(framework, (), hp, plan, sigma, 1)], hp.delta)
    if one_step > hp.max_epsilon:
        raise UserError(f"{where + ': ' if where else ''}max_epsilon = {hp.max_epsilon} is below "
                        f"the ε of a single step ({one_step:.3f} at δ = {hp.delta:g}); raise "
                        "max_epsilon or the noise")


def apply_budget(framework: str, identities: tuple, hp: Hyperparameters, plan: SamplingPlan,
                 sigma: float, prior: list) -> SamplingPlan:
    """The sampling plan cut to hp's max_epsilon.

    Args:
      framework: the algo's name.
      identities: the keyed identities of the run's data samples.
      hp: the hyperparameters (max_epsilon, delta).
      plan: the run's sampling plan.
      sigma: the run's gradient noise multiplier.
      prior: the DpEvents of the earlier runs on those samples.

    Returns:
      `plan` with max_steps at the last step that keeps ε within max_epsilon (unchanged without a
      budget); 0 steps when `prior` spent it (the train task passes its input model on). Raises
      UserError for a budget below a single step's ε.
    """
    if not hp.dp or hp.max_epsilon is None:
        return plan
    run = run_event(framework, identities, hp, plan, sigma, plan.steps)
    allowed = steps_within_budget(prior, run, hp.delta, hp.max_epsilon)
    if allowed == 0 and not prior:
        check_first_step(framework, hp, plan, sigma)  # not even one step fits: it raises
    if allowed == 0:
        log.warning("privacy budget spent: this data's ε is already %.3f at delta = %g (its own "
                    "ledger and the input model's) and one more step would exceed max_epsilon = "
                    "%g: no training", compose_epsilon(prior, hp.delta), hp.delta, hp.max_epsilon)
    elif allowed < plan.steps:
        log.warning("privacy budget: stopping after %d of %d steps (max_epsilon = %g at delta = "
                    "%g)", allowed, plan.steps, hp.max_epsilon, hp.delta)
    return dataclasses.replace(plan, max_steps=allowed)


@dataclass
class RunPrivacy:
    """A train task's privacy plan: the sampling plan (cut by the budget), σ, and the earlier runs
    of its examples (Ledger.histories: usually one list; several when an input model trained on
    parts of its data)."""

    framework: str
    hp: Hyperparameters
    identities: tuple  # the data samples' keyed identities
    plan: SamplingPlan
    sigma: float
    histories: list

    def progress(self, steps_done: int) -> str:
        """ε so far, for the progress bar (RDP: fast enough for every epoch)."""
        if not self.hp.dp:
            return "no DP"
        partial = run_event(self.framework, self.identities, self.hp, self.plan, self.sigma,
                            steps_done)
        eps = max(compose_epsilon(prior + [partial], self.hp.delta, "rdp")
                  for prior in self.histories)
        return f"ε(RDP)={eps:.2f} δ={self.hp.delta:g}"

    def event(self, ran, code: dict | None) -> DpEvent:
        """The ledger event of the run as it ran (`ran`: the skeleton's interface.Ran)."""
        return run_event(self.framework, self.identities, self.hp, self.plan, ran.noise_multiplier,
                         ran.steps, ran=ran, code=code)


def for_task(framework: str, hp: Hyperparameters, plan: SamplingPlan, ledger: Ledger, samples: list,
             spent: Ledger | None = None) -> RunPrivacy:
    """The privacy plan of a train task.

    Args:
      framework: the algo's name.
      hp: the hyperparameters.
      plan: the run's sampling plan (planning.check_run).
      ledger: the input model's ledger; the task's examples are recorded in it.
      samples: the opener's data samples.
      spent: the data's own ledger of these samples (data_ledger.py): every run released from the
        data, in every framework.

    Returns:
      RunPrivacy: σ for the worst history of the task's examples, and the plan cut to the budget
      over both ledgers.
    """
    identities = ledger.add_samples(samples)
    histories = ledger.histories(identities)
    sigma = max(resolve_noise_multiplier(hp, plan, prior) for prior in histories)
    everything = ledger if spent is None else union(ledger, spent)
    plan = min((apply_budget(framework, identities, hp, plan, sigma, prior)
                for prior in (histories if everything is ledger
                              else everything.histories(identities))), key=lambda cut: cut.steps)
    return RunPrivacy(framework, hp, identities, plan, sigma, histories)
