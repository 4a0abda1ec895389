"""ε for the other neighbouring relation: replace one example by another (neighbouring data sets of
the same size), beside the add-or-remove figure every report leads with.

Replacing an example is removing it and adding another: two add-or-remove steps. An (ε', δ')-DP
mechanism is (2ε', (1 + e^ε')·δ')-DP for two such steps (group privacy), so the replace-one ε at δ
is 2ε' with ε' the add-or-remove ε at δ' = δ / (1 + e^ε'). dp_accounting 0.4.3 offers no tighter
bound for Poisson sampling: its PLD accountant refuses REPLACE_ONE with a PoissonSampledDpEvent.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from mnist_dp.privacy.accountant import REPORTED_ACCOUNTANT

# The fixed point's margin: ε' is taken this far above the last iterate, so that it is one.
MARGIN = 1e-4


def group_of_two(epsilon_at: Callable[[float], float], delta: float) -> float:
    """The replace-one ε at `delta` of a mechanism whose add-or-remove ε at δ' is epsilon_at(δ').

    Args:
      epsilon_at: δ' -> the add-or-remove ε at δ' (decreasing in δ').
      delta: the replace-one δ.

    Returns:
      2ε' for an ε' that satisfies ε' >= epsilon_at(δ / (1 + e^ε')), checked; inf if the
      add-or-remove ε is.
    """
    guess = epsilon_at(delta)
    for _ in range(100):  # a contraction: a few iterations reach it
        if math.isinf(guess):
            return math.inf
        needed = epsilon_at(delta / (1 + math.exp(guess)))
        if needed <= guess:
            return 2 * guess
        guess = needed + MARGIN
    raise ArithmeticError(f"no group-of-two bound found at δ = {delta}")


def of_ledger(ledger, delta: float) -> float:
    """The replace-one ε at `delta` of a model's ledger (ledger.Ledger): the group-of-two bound of
    its reported, worst-case add-or-remove figure."""
    return group_of_two(lambda at: ledger.epsilon(at, REPORTED_ACCOUNTANT), delta)
