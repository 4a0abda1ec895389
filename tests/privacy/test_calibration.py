"""mnist_dp/privacy/calibration.py: the search for the least σ on its grid."""
from mnist_dp.privacy import calibration


def test_the_grid_search_takes_the_least_point_of_a_falling_function():
    """Regula falsi over the grid of 0.001, between a σ that misses the target and one that meets
    it."""
    def search(epsilon, target, lower, upper):
        tried = []
        found = calibration.least_on_grid(lambda s: tried.append(s) or epsilon(s), target, lower,
                                          upper, 1e-3, 20.0)
        return found, tried

    assert search(lambda s: 10 - s, 3.0, 0.1, 10.0)[0] == 7.0  # exactly on the target: met
    found, tried = search(lambda s: s ** -4, 9.0, 0.1, 10.0)  # steep: 9^(-1/4) = 0.57735
    # about as many as bisection (log2 of 9,900 grid points)
    assert found == 0.578 and len(tried) <= 14
    # A rounded-up upper end that misses the target by a hair (PLD's numerics)
    # is stepped up, never taken.
    spiked = lambda s: 3.0001 if s == 7.0 else 10 - s  # noqa: E731
    assert search(spiked, 3.0, 0.1, 6.9995)[0] == 7.001
