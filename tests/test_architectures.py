import math

import pytest

from mnist_dp import architectures
from mnist_dp.architectures import ACT, Architecture, Conv, Dense
from mnist_dp.learning import features
from mnist_dp.learning.interface import Network
from mnist_dp.utils.errors import UserError


@pytest.mark.parametrize("architecture", architectures.ARCHITECTURES,
                         ids=lambda a: f"{a.features}-{a.network}")
def test_every_declared_network_chains_its_shapes_to_ten_logits(architecture):
    assert architecture.shapes()[-1][1] == (10,)
    names = [name for name, _, _ in architecture.layout()]
    assert len(set(names)) == len(names)
    channels, size, _ = architecture.input_maps
    if architecture.features == "scattering":  # the features the network is given
        assert channels * size ** 2 == features.SCATTERING_DIM
    if architecture.shortcut is not None:
        assert architecture.shortcut.width_in == channels * size ** 2


def test_the_parameter_counts_the_documents_give():
    counts = {(a.features, a.network): sum(math.prod(shape) for _, shape, _ in a.layout())
              for a in architectures.ARCHITECTURES}
    assert counts[("pixels", "cnn")] == 26_010 and counts[("scattering", "cnn")] == 72_756
    assert counts[("scattering", "linear")] == 39_700


def test_a_network_whose_layers_do_not_chain_is_refused_naming_the_layer():
    broken = Architecture("pixels", "broken", "", (Conv("conv1", 1, 8, 3, 1, 1), ACT,
                                                   Dense("fc", 8 * 27 * 27, 10)))
    with pytest.raises(ValueError, match="fc takes 5832 numbers"):
        broken.shapes()
    with pytest.raises(ValueError, match="conv1 takes \\[3, H, W\\]"):
        Architecture("pixels", "broken", "", (Conv("conv1", 3, 8, 3, 1, 1),)).shapes()


def test_an_undeclared_pair_is_refused_saying_what_is_declared():
    with pytest.raises(UserError, match="^hp.json: network = \"linear\" takes features "
                                        "\\['scattering'\\], not \"pixels\""):
        architectures.of(Network("pixels", "tanh", "linear"), "hp.json")
    assert architectures.of(Network("pixels", "relu", "cnn")).features == "pixels"
