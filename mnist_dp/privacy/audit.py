"""Empirical privacy auditing: a lower bound on ε from membership guesses on canaries, in one
training run.

Steinke, Nasr & Jagielski (2023), "Privacy Auditing with One (1) Training Run": m canaries are each
put in the training set independently with probability 1/2. After training, the auditor guesses "in"
for the canaries with the k+ highest scores and "out" for the k- lowest, and abstains on the rest.
If the training is (ε, δ)-DP, the number of correct guesses is at most what ε-randomized response
gives, up to a δ term (their Theorem 3.1 and Appendix D); an ε under which the observed count has
p-value below β is ruled out, so the largest such ε is a lower bound at confidence 1 - β. k+ and k-
must be fixed before looking at the result (choosing the best of several would need a union bound).

Mahloujifar, Melis & Chaudhuri (2025), "Auditing f-Differential Privacy in One Run", test the same
guesses against a whole tradeoff curve instead of (ε, δ): here the Gaussian one, μ-GDP, which is
exactly what DP-SGD with the full batch (q = 1) claims (its steps compose to μ = √steps / σ). Their
bound does not pay Steinke et al.'s m·δ term, so it keeps improving with more canaries; it holds for
a claim of that family only (the white-box audit's).
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
from scipy import optimize, stats


def p_value(m: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """The p-value of the guesses' result under an (epsilon, delta)-DP claim.

    Args:
      m: the number of canaries.
      guesses: how many canaries were guessed (not abstained on).
      correct: how many guesses were right.
      epsilon: ε of the claim tested.
      delta: δ of the claim tested.

    Returns:
      P[at least `correct` right out of `guesses`] if training were (epsilon, delta)-DP, for m
      canaries (at most 1). Raises ValueError unless 0 <= correct <= guesses <= m.
    """
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


def largest_ruled_out(ruled_out, smallest: float) -> float | None:
    """The largest x >= `smallest` for which `ruled_out(x)` holds, for a test that holds up to a
    point and fails beyond it (None when it fails at `smallest`): doubling from 1, then 50
    bisections that keep the lower end ruled out, so the answer never overstates."""
    if not ruled_out(smallest):
        return None
    low, high = smallest, 1.0
    while ruled_out(high):
        low, high = high, 2 * high
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if ruled_out(middle) else (low, middle)
    return low


def epsilon_lower_bound(m: int, guesses: int, correct: int, delta: float,
                        beta: float = 0.05) -> float:
    """The largest ε ruled out at confidence 1 - beta; p_value increases with ε.

    Args:
      m: the number of canaries.
      guesses: how many canaries were guessed (not abstained on).
      correct: how many guesses were right.
      delta: δ of the claims tested.
      beta: the test's level: the confidence is 1 - beta.

    Returns:
      That ε; 0 when none is ruled out.
    """
    epsilon = largest_ruled_out(lambda epsilon: p_value(m, guesses, correct, epsilon, delta) < beta,
                                0.0)
    return 0.0 if epsilon is None else epsilon


def gaussian_rejected(mu: float, m: int, guesses: int, correct: int, beta: float) -> bool:
    """Whether the guesses rule out μ-GDP: Mahloujifar et al.'s Algorithm 3 (Theorem 3.2) for in /
    out guesses (k = 2), with their code's running maximum of h. Its recursion runs down from
    `correct` over the tradeoff curve's inverse blow-up f̄⁻¹(y) = Φ(Φ⁻¹(y) - μ).

    Args:
      mu: μ of the claim tested.
      m: the number of canaries.
      guesses: how many canaries were guessed (not abstained on).
      correct: how many guesses were right.
      beta: the test's level.

    Returns:
      Whether every μ-GDP mechanism gives `correct` or more right out of `guesses` (of m canaries)
      with probability at most beta; False when `correct` is 0.
    """
    if correct <= 0:
        return False
    normal = NormalDist()

    def inverse_blow_up(y):
        return 0.0 if y <= 0 else 1.0 if y >= 1 else normal.cdf(normal.inv_cdf(y) - mu)

    r, h = beta * correct / m, beta * (guesses - correct) / m
    for i in range(correct - 1, -1, -1):
        h_next = max(h, inverse_blow_up(r))
        if h_next == h:  # r and h no longer change
            break
        r, h = min(r + i / (guesses - i) * (h_next - h), 1.0), h_next
    return r + h > guesses / m


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The ε at δ of μ-GDP (Dong, Roth & Su 2022, Corollary 2.13): δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ
    - μ/2)."""
    def excess(epsilon):
        return (stats.norm.cdf(-epsilon / mu + mu / 2)
                - math.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2)) - delta)

    return 0.0 if excess(0.0) <= 0 else optimize.brentq(excess, 0.0, mu * mu / 2 + 10 * mu + 10,
                                                        xtol=1e-9)


def gaussian_epsilon_lower_bound(m: int, guesses: int, correct: int, delta: float,
                                 beta: float = 0.05) -> float:
    """A lower bound on the ε of a mechanism that claims μ-GDP, as DP-SGD with the full batch does.

    Args:
      m: the number of canaries.
      guesses: how many canaries were guessed (not abstained on).
      correct: how many guesses were right.
      delta: the δ at which ε is given.
      beta: the test's level: the confidence is 1 - beta.

    Returns:
      The ε at δ of the largest μ whose μ-GDP the guesses rule out at confidence 1 - beta (0 when
      none is). Raises ValueError unless 0 <= correct <= guesses <= m.
    """
    if not 0 <= correct <= guesses <= m:
        raise ValueError(f"need 0 <= correct ({correct}) <= guesses ({guesses}) <= m ({m})")
    # monotone in μ
    mu = largest_ruled_out(lambda mu: gaussian_rejected(mu, m, guesses, correct, beta), 1e-9)
    return 0.0 if mu is None else gaussian_epsilon(mu, delta)


def guess(scores: np.ndarray, included: np.ndarray, k_in: int, k_out: int) -> tuple:
    """Guess "in" for the k_in highest scores, "out" for the k_out lowest.

    Args:
      scores: each canary's score.
      included: whether each canary was included (bool).
      k_in: how many of the highest scores are guessed "in".
      k_out: how many of the lowest scores are guessed "out".

    Returns:
      (guesses, correct): how many guesses, and how many of them were right.
    """
    order = np.argsort(scores, kind="stable")
    said_in, said_out = order[len(order) - k_in:], order[:k_out]
    return k_in + k_out, int(included[said_in].sum() + (~included[said_out]).sum())


class DiracCanaries:
    """The white-box audit's canaries (Steinke, Nasr & Jagielski 2023, §6, "Dirac" gradient
    canaries), given to one training run through DpStep.canaries. Canary i is coordinate i of the
    model's weights (flattened in the framework's `weight_arrays` order), included with probability
    1/2 (`included`). At every step each included canary adds a gradient of norm exactly C, on its
    coordinate alone, to the clipped sum before the noise: a DP step must hide it in the N(0, σ²C²)
    noise on that coordinate, step after step.

    The real examples' clipped sum moves the coordinates too. With the full batch (q = 1) it is a
    function of the iterates and the data, which DP's adversary both has, so the auditor may
    subtract it (it is kept, summed, as the steps pass it): the scores are then the idealised
    DP-SGD's, the Gaussian mechanism composed over the steps, where a one-run audit is tightest.
    Under Poisson sampling which examples joined is the mechanism's secret, so the canaries accept
    only q = 1.

    `noise_scale` is the audit's broken mechanism: below 1, training.fit has the steps add that
    fraction of the noise while the ledger still claims σ. Nothing but benchmarks/audit.py and its
    tests builds this object."""

    def __init__(self, weight_shapes: list, included: np.ndarray, sample_rate: float,
                 noise_scale: float = 1.0):
        if sample_rate != 1.0:
            raise ValueError("Dirac canaries need the full batch (q = 1), not q = "
                             f"{sample_rate:g}: only then is the real examples' clipped sum "
                             "public, to be subtracted")
        self.shapes = [tuple(shape) for shape in weight_shapes]
        self.sizes = [math.prod(shape) for shape in self.shapes]
        if included.shape != (sum(self.sizes),):
            raise ValueError(f"one inclusion per weight: {sum(self.sizes)}, not {included.shape}")
        self.included, self.noise_scale = included, noise_scale
        # Σ_t of the real examples' clipped sums, flattened
        self.real_sum = np.zeros(sum(self.sizes))
        self.clip_norm = None  # C, the same at every step (`scores` divides by it)

    def before_noise(self, clipped_sum: list, clip_norm: float) -> list:
        """DpStep.with_canaries: this step's clipped sum (the real examples') plus C on every
        included canary."""
        if [tuple(np.shape(g)) for g in clipped_sum] != self.shapes:
            raise ValueError(f"clipped sum shaped {[np.shape(g) for g in clipped_sum]}, the "
                             f"weights {self.shapes}")
        if self.clip_norm not in (None, clip_norm):
            raise ValueError(f"the clipping norm moved from {self.clip_norm:g} to {clip_norm:g}: "
                             "the scores need one C (audit without adaptive clipping)")
        self.clip_norm = clip_norm
        real = np.concatenate([np.asarray(g, np.float64).ravel() for g in clipped_sum])
        self.real_sum += real
        with_canaries = (real + clip_norm * self.included).astype(np.float32)
        return [part.reshape(shape) for part,
                shape in zip(np.split(with_canaries, np.cumsum(self.sizes)[:-1]), self.shapes)]

    def scores(self, start: np.ndarray, end: np.ndarray, learning_rate: float,
               expected_batch_size: float
               ) -> np.ndarray:
        """Each canary's score, in units of C: the sum over the steps of its coordinate's noisy sum,
        less the real examples' part. Plain SGD (no momentum, no weight average) moved the weights
        by -learning_rate / E[B] times the sum of the steps' noisy sums, so an included canary
        scores steps + N(0, steps·σ²) if the steps added the noise claimed, an excluded one
        N(0, steps·σ²).

        Args:
          start: the weights before the run (flat_weights).
          end: the weights after it (flat_weights).
          learning_rate: the plain SGD's learning rate.
          expected_batch_size: E[B], which divided each step's noisy sum.

        Returns:
          The scores, one per canary.
        """
        moved = -(
            end.astype(np.float64) - start.astype(np.float64)) * expected_batch_size / learning_rate
        return (moved - self.real_sum) / self.clip_norm
