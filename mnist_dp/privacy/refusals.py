"""Why the accountant's answers refuse a plan, in the words of the setting to change: no σ meets
target_epsilon (the accountant's NoSigma, which says why in numbers only), or max_epsilon is below
a single step's ε. The plan (task_plan.py), the scripts' checks (preflight.py) and the search
(search.py) refuse in these words.
"""
from __future__ import annotations

from mnist_dp import hyperparameters
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy import events, no_sigma
from mnist_dp.utils.errors import UserError

INPUT_MODEL = "the input model"  # what a task's earlier runs are, in its refusals
DATA_LEDGER = "the runs this data's own ledger records"  # a plan's, which its models will carry


def refused(why: no_sigma.NoSigma, hp: Hyperparameters, plan, where: str = "",
            prior: list = (), repeats: int = 1, prior_is: str = INPUT_MODEL) -> UserError:
    """Why no σ meets hp.target_epsilon, in the words of the setting to change.

    Args:
      why: the accountant's reason (a NoSigma).
      hp: the hyperparameters.
      plan: the run's sampling plan (a task_plan.SamplingPlan).
      where: what names the hyperparameters ("": nothing).
      prior: the runs on its data before it.
      repeats: how many times the run is repeated.
      prior_is: what `prior` is: INPUT_MODEL, or DATA_LEDGER.

    Returns:
      The UserError that says so (returned, not raised).
    """
    named = f"{where}: " if where else ""
    target = f"{named}target_epsilon = {hp.target_epsilon}"
    over = (f"at δ = {hp.delta:g} over {plan.steps * repeats} "
            f"steps{f' after {prior_is}' if prior else ''}")
    todo = ("raise the target or train from scratch" if prior_is == INPUT_MODEL else
            "the models this plan releases carry them: raise the target, or train on fresh data "
            "(generate_data.py --output NEW)")
    most = hyperparameters.MAX_NOISE_MULTIPLIER
    match why:
        case no_sigma.PriorNotPrivate():
            text = (f"{named}cannot calibrate to a target epsilon: the input model was trained "
                    "without DP (epsilon = inf)")
        case no_sigma.PriorSpent(epsilon=spent):
            text = (f"{target} is already spent by {prior_is} (epsilon = {spent:.3f}); {todo}")
        case no_sigma.DecayTooSteep(least=least):
            text = (f"{named}noise_decay = {hp.noise_decay:g} lowers the noise so far that keeping "
                    f"every step's noise multiplier at {events.MIN_NOISE_MULTIPLIER:g} or more "
                    f"needs σ = {least:.3g} in the first steps, more than {most:g}; raise "
                    "noise_decay (1: constant)")
        case no_sigma.CountAloneSpends(epsilon=spent):
            text = (f"{target}: adaptive clipping's noisy count alone spends ε = {spent:.3f} "
                    f"{over}, so no gradient noise can meet the target; raise clip_count_stddev "
                    "(the count's noise) or target_epsilon, or set clip_quantile to null")
        case no_sigma.TooManySteps(epsilon=spent):
            decay = " or noise_decay" if hp.noise_decay < 1 else ""
            fewer = ("train fewer epochs" if not prior or prior_is == INPUT_MODEL else
                     "train on fresh data (generate_data.py --output NEW)")
            text = (f"{target}: even noise_multiplier = {most:g}, the most allowed, spends ε = "
                    f"{spent:.3g} {over}; raise target_epsilon{decay}, or {fewer}")
        case _:  # NumericsGaveUp
            text = (f"{target}: no noise multiplier found for it {over} with q = "
                    f"{plan.sample_rate:.4g} ({why}); give noise_multiplier instead, or a smaller "
                    "target_epsilon")
    return UserError(text)


def below_one_step(hp: Hyperparameters, one_step: float, where: str = "",
                   named: str = "max_epsilon", epsilon: float | None = None,
                   delta: float | None = None) -> UserError:
    """A budget is below the ε of a single step: the run could not train at all.

    Args:
      hp: the hyperparameters.
      one_step: the ε of a single step of the run on fresh data.
      where: names the organisation when the scripts check it ("": nothing).
      named: what names the budget: "max_epsilon" (hp's), or the data owner's.
      epsilon: the budget's ε (default hp.max_epsilon).
      delta: its δ (default hp.delta).

    Returns:
      The UserError that says so (returned, not raised).
    """
    where = f"{where}: " if where else ""
    epsilon = hp.max_epsilon if epsilon is None else epsilon
    delta = hp.delta if delta is None else delta
    todo = "raise max_epsilon or the noise" if named == "max_epsilon" else "raise the noise"
    return UserError(f"{where}{named} = {epsilon} is below the ε of a single step "
                     f"({one_step:.3f} at δ = {delta:g}); {todo}")
