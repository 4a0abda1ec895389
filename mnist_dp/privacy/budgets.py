"""The budgets a run on an organisation's data must keep: the algo's max_epsilon and its data
owner's (policy.py), each ε at its δ over every run the data's ledger records. A train task stops at
the last step within all of them (task_plan.for_task); a run that cannot stop early is refused when
it could pass one (`check_whole_run`).
"""
from __future__ import annotations

import math

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy import accountant
from mnist_dp.privacy.policy import Policy
from mnist_dp.utils.errors import UserError

NO_POLICY = Policy()  # data whose owner set no policy: the algo's hyperparameters decide


def budgets(hp: Hyperparameters, owner: Policy = NO_POLICY) -> list:
    """[(ε, δ, what names it)]: every budget a run on the data must keep, the algo's max_epsilon
    and its data owner's (which the algo can only lower)."""
    return ([(hp.max_epsilon, hp.delta, "max_epsilon")] if hp.max_epsilon is not None else []) + [
        (epsilon, delta, f"the data owner's max_epsilon ({owner.source})")
        for epsilon, delta in owner.budgets]


def check_whole_run(owner: Policy, histories, epsilon: float | None, delta: float,
                    what: str) -> None:
    """Refuse a run that cannot stop early (a search) where it could pass a budget of the data
    owner's policy `owner`.

    Args:
      owner: the data owner's policy.
      histories: the earlier runs it counts (Ledger.histories).
      epsilon: the run's own ε at `delta` (its target), or None: unknown, refused with a
        budget.
      delta: the run's δ.
      what: names the run in the UserError.

    By basic composition the run and its history are (ε_h + ε, δ_h + δ)-DP: each budget (ε_b,
    δ_b) holds when δ ≤ δ_b and ε_h, the history's ε at δ_h = δ_b − δ, plus ε is at most ε_b.
    """
    for budget, budget_delta in owner.budgets:
        rest = budget_delta - delta
        earlier = [h for h in histories if h]
        if rest > 0:
            spent = max((accountant.compose_epsilon(h, rest) for h in earlier), default=0.0)
        else:
            spent = math.inf if earlier or rest < 0 else 0.0
        if epsilon is None or spent + epsilon > budget:
            told = ("its ε is unknown (no target_epsilon)" if epsilon is None else
                    f"its ε {epsilon:g} at δ = {delta:g} after what the data has spent "
                    f"({spent:.3f} at δ = {max(rest, 0):g}) could pass it")
            raise UserError(f"{owner.source}: the data owner's max_epsilon = {budget:g} at "
                            f"delta = {budget_delta:g}: {what} cannot stop early, and {told}; "
                            "nothing was trained: give it a smaller target_epsilon or "
                            "delta, or train on other data")
