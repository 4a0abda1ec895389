"""mnist_dp/privacy/search_accountant.py: a private search's σ per profile and its score's noise,
calibrated so that the whole search ends at the target."""
import math

import pytest

from mnist_dp import search_space
from mnist_dp.privacy import accountant, search_accountant
from mnist_dp.privacy.events import NoiseSchedule

DELTA = 1e-5


@pytest.mark.parametrize("shape", [0.0, search_space.MAX_SHAPE, math.inf])
@pytest.mark.parametrize("mean", [1.0, float(search_space.MAX_MEAN)])
def test_at_the_search_files_bounds_the_accounting_still_calibrates_a_tight_sigma(mean, shape):
    """Every corner of mean_candidates × shape a search file may give (Poisson is shape ∞): σ stays
    far below the ceiling, meets the target, and a step of the grid below it does not, so no bound
    makes the figure degenerate."""
    profile = (1 / 8, 240, NoiseSchedule(1.0))
    (sigma,) = search_accountant.calibrate_search(3.0, DELTA, [profile], mean, shape)
    assert sigma < accountant.MAX_NOISE_MULTIPLIER / 10
    assert search_accountant.search_epsilon([profile], [sigma], mean, shape, DELTA) <= 3.0
    assert search_accountant.search_epsilon([profile], [sigma - 2e-3], mean, shape, DELTA) > 3.0
    score = search_accountant.calibrate_score_noise(3.0, DELTA, mean, shape)
    assert 0 < score < sigma  # the score is one count, the training 240 steps
