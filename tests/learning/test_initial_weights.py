"""mnist_dp/learning/initial_weights.py: the common start every framework loads, drawn from `seed`
alone."""
import numpy as np
import pytest

from mnist_dp.learning import features, initial_weights
from mnist_dp.learning.interface import Network

NETWORKS = [Network("pixels", "tanh", "cnn"), Network("scattering", "tanh", "cnn"),
            Network("scattering", "tanh", "linear")]


@pytest.mark.parametrize("network", NETWORKS, ids=lambda n: f"{n.features}-{n.network}")
def test_the_draw_follows_the_layout_and_pytorchs_default_bounds(network):
    arrays = initial_weights.draw(network, seed=3)
    layout = initial_weights.layout(network)
    assert [a.shape for a in arrays] == [shape for _, shape, _ in layout]
    assert all(a.dtype == np.float32 for a in arrays)
    for array, (name, _, fan_in) in zip(arrays, layout):
        if fan_in == initial_weights.ZERO:  # the shortcut and the linear classifier start at zero
            assert not array.any(), name
        else:
            bound = 1 / np.sqrt(fan_in)
            assert np.abs(array).max() <= bound and np.abs(array).max() > 0.9 * bound, name


def test_the_same_seed_gives_the_same_weights_and_another_seed_others():
    network = NETWORKS[1]
    same = initial_weights.draw(network, 7), initial_weights.draw(network, 7)
    assert all(np.array_equal(a, b) for a, b in zip(*same))
    other = initial_weights.draw(network, 8)
    assert not np.array_equal(same[0][0], other[0])


def test_the_scatternet_layout_reads_the_scattering_channels():
    (name, shape, fan_in), *_ = initial_weights.layout(NETWORKS[1])
    assert name == "conv1.weight" and shape == (16, features.SCATTERING_CHANNELS, 3, 3)
    assert fan_in == features.SCATTERING_CHANNELS * 9
