import math

import numpy as np
import pytest

from mnist_dp.privacy import audit


def test_no_evidence_gives_zero_and_perfect_guesses_give_a_positive_bound():
    assert audit.epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0  # chance level
    perfect = audit.epsilon_lower_bound(1000, 200, 200, 1e-5)
    assert 2.0 < perfect < math.inf
    assert audit.epsilon_lower_bound(1000, 200, 180, 1e-5) < perfect
    assert audit.epsilon_lower_bound(1000, 200, 200, 1e-2) < perfect  # a larger δ explains more


def test_the_bound_is_sound_on_randomized_response():
    """ε0-randomized response is exactly ε0-DP: the 95% bound may exceed ε0 at most ~5% of the time."""
    rng = np.random.default_rng(0)
    epsilon0, m, trials = 1.0, 1000, 200
    p = 1 / (1 + math.exp(-epsilon0))
    over = 0
    for _ in range(trials):
        included = rng.random(m) < 0.5
        truthful = rng.random(m) < p  # each canary's score reveals membership with probability p
        scores = np.where(truthful == included, 1.0, 0.0) + rng.random(m) * 1e-3
        guesses, correct = audit.guess(scores, included, 250, 250)
        over += audit.epsilon_lower_bound(m, guesses, correct, 0.0) > epsilon0
    assert over / trials <= 0.1


def test_guess_counts_right_answers():
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.5])
    included = np.array([True, False, False, False, True])
    assert audit.guess(scores, included, 2, 2) == (4, 3)  # in: 0 ✓, 2 ✗; out: 1 ✓, 3 ✓
    with pytest.raises(ValueError):
        audit.p_value(10, 5, 6, 1.0, 0.0)
