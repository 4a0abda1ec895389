"""What the train tasks of a Substra compute plan would refuse, checked by the scripts before they
register anything, with the train task's own plan (task_plan.py); and σ of a plan that trains on the
same data several times (noise_for_rounds), which a single task cannot calibrate for itself.
"""
from __future__ import annotations

import dataclasses

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy import accountant, no_sigma, refusals
from mnist_dp.privacy.budgets import NO_POLICY, budgets, check_whole_run
from mnist_dp.privacy.data_ledger import union
from mnist_dp.privacy.events import PER_EXAMPLE, PER_PERSON
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.policy import Policy
from mnist_dp.privacy.task_plan import (
    SamplingPlan,
    TaskPlan,
    check_delta,
    check_noise,
    check_run,
    noise_schedule,
    resolve_noise_multiplier,
)
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted


def check_plan(framework: str, hp: Hyperparameters, sizes: list, rounds: int, wheres: list,
               spent: list | None = None, owners: list | None = None,
               per_person: list | None = None) -> Hyperparameters:
    """What the train tasks of a plan would refuse, checked before anything is registered: each
    organisation's run (check_run), a target_epsilon no σ meets, and a max_epsilon below the ε of
    its first step after what its data has spent, with σ as the tasks will get it.

    Args:
      framework: the algo's name.
      hp: the hyperparameters.
      sizes: each organisation's number of training examples (persons, where the data
        names them: samples.unit_count).
      rounds: how many times the plan trains on each organisation's data.
      wheres: what names each organisation in an error.
      spent: per organisation, its data's own ledger and its samples' examples (check_spent).
      owners: per organisation, its data owner's policy (policy.of_folders), whose budgets hold
        beside hp.max_epsilon; None: none.
      per_person: per organisation, whether its samples name persons (then `sizes` counts
        persons); None: none does.

    Returns:
      The hyperparameters the tasks get (σ calibrated here for several rounds: noise_for_rounds).
    """
    plans = [check_run(framework, hp, n, where, PER_PERSON if persons and hp.dp else PER_EXAMPLE)
             for n, where, persons in zip(sizes, wheres, per_person or [False] * len(sizes))]
    # several rounds: σ is calibrated here, for all of them, after what each data has spent
    hp = noise_for_rounds(hp, sizes, rounds, [history(*s) for s in spent] if spent else None,
                          wheres)
    # each organisation's first task starts a fresh model
    for k, (sampling, where) in enumerate(zip(plans, wheres)):
        limits = budgets(hp, owners[k] if owners else NO_POLICY) if hp.dp else []
        if limits:
            sigma = resolve_noise_multiplier(hp, sampling, [], where=where)
            plan = TaskPlan.of(framework, hp, sampling, sigma)
            for epsilon, delta, named in limits:
                one_step = accountant.compose_epsilon([plan.event_at(1)], delta)
                if one_step > epsilon:
                    raise refusals.below_one_step(hp, one_step, where, named, epsilon, delta)
                if spent:
                    check_spent(plan, *spent[k], where, (epsilon, delta, named))
        else:
            # the task calibrates σ itself: some σ must meet the target
            check_target(hp, sampling, where)
    return hp


def check_spent(plan: TaskPlan, data: Ledger, examples: dict, where: str,
                budget: tuple | None = None) -> None:
    """Refuse a budget the data samples have spent: their own ledger leaves no room for one step of
    `plan`.

    Args:
      plan: the run's plan.
      data: the data samples' own ledger.
      examples: their examples, {identity: examples.Examples}.
      where: what names the organisation in the UserError.
      budget: (ε, δ, what names it), one of budgets.budgets; default the plan's max_epsilon.
    """
    if not data.events:
        return
    hp, identities = plan.hp, tuple(examples)
    epsilon, delta, named = budget or (hp.max_epsilon, hp.delta, "max_epsilon")
    todo = ("raise max_epsilon (a budget for the data, over every run on it)"
            if named == "max_epsilon" else "ask the data's owner for a larger budget")
    first_step = dataclasses.replace(plan, identities=identities).event_at(1)
    for prior in union(Ledger((), examples), data).histories(identities):
        if accountant.steps_within_budget(prior, first_step, delta, epsilon) == 0:
            raise UserError(f"{where}: {named} = {epsilon} is spent: this data's own ledger "
                            f"records {counted(len(data.events), 'run')} released from it, ε = "
                            f"{accountant.compose_epsilon(prior, delta):.3f} at δ = {delta:g}, "
                            f"and one more step would pass it; {todo} or train on other data")


def check_owner(owner: Policy, hp: Hyperparameters, per_person: bool, score_train: bool = False,
                history: tuple | None = None) -> None:
    """Refuse before anything is registered what the data owner's policy forbids: a run without DP
    (--baseline), a noise_seed, a per-image run where it asks for persons, --score-train, and a
    search (`history`: (the data's own ledger, its samples' examples)) that could pass its budget.
    """
    owner.check_allowed(hp.dp, hp.noise_seed, per_person)
    if score_train:
        owner.refuse("score_train", "run without --score-train")
    if history is not None and owner.budgets:
        data, examples = history
        check_whole_run(owner, history(data, examples), hp.target_epsilon, hp.delta, "a search")


def check_target(hp: Hyperparameters, plan: SamplingPlan, where: str) -> None:
    """Refuse a target_epsilon no σ meets on fresh data, without calibrating: the scripts' check
    before they register a plan whose tasks calibrate σ themselves (a task's calibration checks it
    again with the earlier runs of its data).

    Args:
      hp: the hyperparameters; checked only with DP and no noise_multiplier.
      plan: the run's sampling plan.
      where: what names the organisation in an error.
    """
    if hp.dp and hp.noise_multiplier is None:
        try:
            accountant.noise_range(hp.target_epsilon, hp.delta, plan.sample_rate, plan.steps,
                                   noise_schedule(hp, plan, 1.0))
        except no_sigma.NoSigma as exc:
            raise refusals.refused(exc, hp, plan, where) from None


def noise_for_rounds(hp: Hyperparameters, sizes: list, rounds: int,
                     histories: list | None = None, wheres: list | None = None) -> Hyperparameters:
    """Fix σ for a plan that trains on the same data `rounds` times.

    A train task calibrates σ from target_epsilon for its own run; in round 2 its data's budget is
    already spent. So with several rounds σ is calibrated here, once, so that every organisation's
    model ends at or below target_epsilon after the last round, counting what its data had spent
    before the plan (a continued model carries the data's earlier runs: data_ledger.absorb); the
    tasks get that σ.

    Args:
      hp: the hyperparameters.
      sizes: each organisation's number of training examples (persons, where the data
        names them: samples.unit_count).
      rounds: how many times the plan trains on each organisation's data.
      histories: each organisation's data's earlier runs (`history`); None: fresh data.
      wheres: what names each organisation in an error (default: "hyperparameters").

    Returns:
      `hp` with noise_multiplier the largest σ an organisation needs and target_epsilon None; `hp`
      itself without DP, without target_epsilon or for one round. Raises UserError for a delta or a
      run the tasks would refuse, or a target no σ meets after what the data has spent.
    """
    if not hp.dp or hp.target_epsilon is None or rounds == 1:
        return hp
    sigmas = []
    for k, n in enumerate(sizes):
        where = wheres[k] if wheres else "hyperparameters"
        check_delta(hp.delta, n, f"{where}: delta")
        plan = SamplingPlan.from_hyperparameters(n, hp, where)
        # before the accountant runs on it
        check_noise(hp, plan, noise_schedule(hp, plan, 1.0), where)
        sigmas += [resolve_noise_multiplier(hp, plan, prior, rounds, where, refusals.DATA_LEDGER)
                   for prior in (histories[k] if histories else [[]])]
    return dataclasses.replace(hp, noise_multiplier=max(sigmas), target_epsilon=None)


def history(data: Ledger, examples: dict) -> list:
    """The earlier runs a run on the samples of `examples` ({identity: examples.Examples}) counts,
    of those their data's own ledger `data` records (Ledger.histories)."""
    return union(Ledger((), examples), data).histories(tuple(examples))
