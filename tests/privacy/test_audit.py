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
    """ε0-randomized response is exactly ε0-DP: the 95% bound may exceed ε0 at most ~5% of the
    time."""
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


def gaussian_scores(rng, m, mu):
    """The scores of m canaries under μ-GDP's own mechanism (one Gaussian of mean μ if included, 0
    if not)."""
    included = rng.random(m) < 0.5
    return rng.normal(size=m) + mu * included, included


def test_the_gaussian_bound_is_sound_on_the_gaussian_mechanism():
    """μ0-GDP's own mechanism: the 95% f-DP bound may exceed ε(μ0) at most ~5% of the time, and it
    sits well above Steinke et al.'s on the same guesses (the point of it)."""
    rng = np.random.default_rng(0)
    mu0, delta, m, k, trials = 2.0, 1e-5, 4000, 100, 100
    claim = audit.gaussian_epsilon(mu0, delta)
    over, gains = 0, []
    for _ in range(trials):
        scores, included = gaussian_scores(rng, m, mu0)
        guesses, correct = audit.guess(scores, included, k, k)
        bound = audit.gaussian_epsilon_lower_bound(m, guesses, correct, delta)
        over += bound > claim
        gains.append(bound - audit.epsilon_lower_bound(m, guesses, correct, delta))
    assert over / trials <= 0.1
    assert np.mean(gains) > 0.5


def test_the_gaussian_bound_grows_with_the_evidence_and_is_zero_without_it():
    assert audit.gaussian_epsilon_lower_bound(1000, 200, 100, 1e-5) == 0.0  # chance level
    perfect = [audit.gaussian_epsilon_lower_bound(72756, g, g, 1e-5) for g in (500, 2000)]
    assert 0 < perfect[0] < perfect[1] < 20
    assert audit.gaussian_epsilon_lower_bound(72756, 2000, 1990, 1e-5) < perfect[1]
    with pytest.raises(ValueError):
        audit.gaussian_epsilon_lower_bound(10, 5, 6, 1e-5)


def test_gaussian_epsilon_agrees_with_the_accountant():
    """μ-GDP is one Gaussian mechanism of σ = 1/μ: dp_accounting's PLD (pessimistic by its
    discretisation) must give the same ε, a little above."""
    import dp_accounting

    for mu in (0.5, 1.67):
        accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
        exact = audit.gaussian_epsilon(mu, 1e-5)
        assert exact <= accountant.get_epsilon(1e-5) <= exact + 0.01


def test_dirac_canaries_add_c_on_included_coordinates_and_keep_the_real_sum():
    included = np.array([True, False, False, True, True, False])
    canaries = audit.DiracCanaries([(2, 2), (2,)], included, sample_rate=1.0)
    real = [np.arange(4, dtype=np.float32).reshape(2, 2), np.array([4.0, 5.0], np.float32)]
    for _ in range(3):
        out = canaries.before_noise(real, 0.5)
    assert [a.shape for a in out] == [(2, 2), (2,)]
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in out]),
                               np.arange(6) + 0.5 * included)
    np.testing.assert_allclose(canaries.real_sum, 3 * np.arange(6.0))
    # SGD without momentum: the weights moved by -lr / E[B] times the noisy sums; no
    # noise: scores = steps · 1[in]
    start = np.zeros(6)
    end = -(2.0 / 4.0) * 3 * np.concatenate([a.ravel() for a in out])
    np.testing.assert_allclose(canaries.scores(start, end, 2.0, 4.0), 3 * included)
    # adaptive clipping: the scores' unit would be wrong
    with pytest.raises(ValueError, match="one C"):
        canaries.before_noise(real, 0.4)
    with pytest.raises(ValueError, match="q = 1"):
        audit.DiracCanaries([(6,)], included, sample_rate=0.5)
    with pytest.raises(ValueError, match="shaped"):
        canaries.before_noise([np.zeros(6)], 0.5)
