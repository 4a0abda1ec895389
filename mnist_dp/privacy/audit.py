"""Empirical privacy auditing: a lower bound on ε from membership guesses on canaries, in one training run.

Steinke, Nasr & Jagielski (2023), "Privacy Auditing with One (1) Training Run": m canaries are each put
in the training set independently with probability 1/2. After training, the auditor guesses "in" for
the canaries with the k+ highest scores and "out" for the k- lowest, and abstains on the rest. If the
training is (ε, δ)-DP, the number of correct guesses is at most what ε-randomized response gives, up to
a δ term (their Theorem 3.1 and Appendix D); an ε under which the observed count has p-value below β
is ruled out, so the largest such ε is a lower bound at confidence 1 - β. k+ and k- must be fixed
before looking at the result (choosing the best of several would need a union bound).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats


def p_value(m: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[at least `correct` right out of `guesses`] if training were (epsilon, delta)-DP, for m canaries."""
    if not 0 <= correct <= guesses <= m:
        raise ValueError(f"need 0 <= correct ({correct}) <= guesses ({guesses}) <= m ({m})")
    q = 1 / (1 + math.exp(-epsilon))  # accuracy of epsilon-randomized response
    tail = stats.binom.sf(correct - 1, guesses, q)
    if delta == 0:
        return min(tail, 1.0)
    # The δ term: the worst average over i of P[correct - i <= Binomial < correct].
    below = np.cumsum(stats.binom.pmf(correct - np.arange(1, correct + 1), guesses, q))
    alpha = float(np.max(below / np.arange(1, correct + 1))) if correct else 0.0
    return min(tail + 2 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, guesses: int, correct: int, delta: float, beta: float = 0.05) -> float:
    """The largest ε ruled out at confidence 1 - beta (0 when none is)."""
    if p_value(m, guesses, correct, 0.0, delta) >= beta:
        return 0.0
    low, high = 0.0, 1.0
    while p_value(m, guesses, correct, high, delta) < beta:
        low, high = high, 2 * high
    for _ in range(50):  # p_value increases with ε: bisect
        middle = (low + high) / 2
        low, high = (middle, high) if p_value(m, guesses, correct, middle, delta) < beta else (low, middle)
    return low


def guess(scores: np.ndarray, included: np.ndarray, k_in: int, k_out: int) -> tuple:
    """(guesses, correct): "in" for the k_in highest scores, "out" for the k_out lowest."""
    order = np.argsort(scores, kind="stable")
    said_in, said_out = order[len(order) - k_in:], order[:k_out]
    return k_in + k_out, int(included[said_in].sum() + (~included[said_out]).sum())
