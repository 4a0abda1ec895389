"""The networks, declared once: each a list of layers with their shapes. Every framework builds its
network from the declaration (one builder per layer type), clips each layer by its type's rule, and
initial_weights.py draws the common start from its parameters. (MindSpore's ScatterNet CNN alone is
also made by hand, for its slow convolution kernels: docs/design.md, "Where things go".)

A new network is one `Architecture` in ARCHITECTURES, named by the hyperparameters `features` and
`network`; docs/hyperparameters.md lists it (a test checks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mnist_dp.utils.errors import UserError

ZERO = 0  # fan_in of a parameter that starts at zero
# learning/features.py's scattering features (J = 2, 8 orientations): maps channel-first, flattened
SCATTERING_CHANNELS, SCATTERING_SIZE = 81, 7
SCATTERING_DIM = SCATTERING_CHANNELS * SCATTERING_SIZE ** 2  # 3,969 numbers per image
# What a network is given (hyperparameter `features`) -> its inputs as maps (channels, size).
INPUT_MAPS = {"pixels": (1, 28), "scattering": (SCATTERING_CHANNELS, SCATTERING_SIZE)}


@dataclass(frozen=True)
class Conv:
    """A square 2-D convolution with a bias and zero padding, on maps [channels_in, H, W]."""

    name: str
    channels_in: int
    channels_out: int
    kernel: int
    stride: int
    padding: int

    def output(self, shape: tuple) -> tuple:
        """[C, H, W] -> [channels_out, H', W']."""
        if len(shape) != 3 or shape[0] != self.channels_in:
            raise ValueError(f"{self.name} takes [{self.channels_in}, H, W] maps, not {shape}")
        size = (shape[1] + 2 * self.padding - self.kernel) // self.stride + 1
        return self.channels_out, size, size

    def parameters(self) -> list[tuple[str, tuple, int]]:
        fan_in = self.channels_in * self.kernel ** 2
        return [(f"{self.name}.weight", (self.channels_out, self.channels_in, self.kernel,
                                         self.kernel), fan_in),
                (f"{self.name}.bias", (self.channels_out,), fan_in)]


@dataclass(frozen=True)
class Dense:
    """A dense layer on [width_in] vectors (maps before it are flattened channel-first); it starts
    at zero if `zero`, and has no bias if not `bias`."""

    name: str
    width_in: int
    width_out: int
    bias: bool = True
    zero: bool = False

    def output(self, shape: tuple) -> tuple:
        if math.prod(shape) != self.width_in:
            raise ValueError(f"{self.name} takes {self.width_in} numbers, not {shape}")
        return (self.width_out,)

    def parameters(self) -> list[tuple[str, tuple, int]]:
        fan_in = ZERO if self.zero else self.width_in
        return [(f"{self.name}.weight", (self.width_out, self.width_in), fan_in)] + (
            [(f"{self.name}.bias", (self.width_out,), fan_in)] if self.bias else [])


class Unweighted:
    """A layer without parameters (nothing to clip), of the same shape out as in."""

    def output(self, shape: tuple) -> tuple:
        return shape

    def parameters(self) -> list:
        return []


@dataclass(frozen=True)
class GroupNorm(Unweighted):
    """Group normalisation of maps over groups of interface.GROUP_SIZE channels, no learnt
    scale."""

    name: str


@dataclass(frozen=True)
class Activation(Unweighted):
    """The network's activation (hyperparameter `activation`)."""


@dataclass(frozen=True)
class MaxPool(Unweighted):
    """A 2 × 2 max pool of stride 1."""

    def output(self, shape: tuple) -> tuple:
        return shape[0], shape[1] - 1, shape[2] - 1


ACT, POOL = Activation(), MaxPool()


@dataclass(frozen=True)
class Architecture:
    """A network: its `layers` in order and an optional `shortcut`, a dense map of the inputs added
    to the last layer's output (whose bias serves both). Inputs are images [1, 28, 28] on
    "pixels", normalised by MNIST's mean and std first, or scattering features [3969] (81 channels
    × 7 × 7, channel-first) on "scattering"."""

    features: str
    network: str
    description: str
    layers: tuple
    shortcut: Dense | None = None

    @property
    def input_maps(self) -> tuple[int, int, int]:
        """The inputs as the first convolution reads them, [C, H, W]."""
        channels, size = INPUT_MAPS[self.features]
        return channels, size, size

    @property
    def reads_maps(self) -> bool:
        """Whether the first layer reads the inputs as maps [C, H, W]: images always, scattering
        features before a convolution (before a dense layer they stay flat)."""
        return self.features == "pixels" or isinstance(self.layers[0], Conv)

    @property
    def has_activation(self) -> bool:
        return ACT in self.layers

    def shapes(self) -> list[tuple[tuple, tuple]]:
        """(input shape, output shape) of every layer, in order; ValueError if one does not take
        the previous one's output."""
        shape, shapes = self.input_maps, []
        for layer in self.layers:
            shapes.append((shape, layer.output(shape)))
            shape = shapes[-1][1]
        if shape != (10,):
            raise ValueError(f"{self.network}: the last layer gives {shape}, not 10 logits")
        return shapes

    @property
    def weighted(self) -> tuple:
        """Every layer with parameters, in the order its parameters are laid out."""
        return tuple(layer for layer in self.layers if layer.parameters()) + (
            (self.shortcut,) if self.shortcut else ())

    def layout(self) -> list[tuple[str, tuple, int]]:
        """(name, shape, fan_in) of every parameter, in the common order and layout; fan_in ZERO:
        starts at zero."""
        return [parameter for layer in self.weighted for parameter in layer.parameters()]


ARCHITECTURES = (
    Architecture(
        "pixels", "cnn", "the TF Privacy / Opacus tutorial CNN (26,010 parameters)",
        (Conv("conv1", 1, 16, 8, 2, 3), ACT, POOL,  # -> [16, 13, 13]
         Conv("conv2", 16, 32, 4, 2, 0), ACT, POOL,  # -> [32, 4, 4]
         Dense("fc1", 32 * 4 * 4, 32), ACT, Dense("fc2", 32, 10))),
    Architecture(
        "scattering", "cnn", "Tramèr & Boneh's ScatterNet CNN with a linear shortcut (72,756 "
        "parameters)",
        (Conv("conv1", SCATTERING_CHANNELS, 16, 3, 2, 1), GroupNorm("norm1"), ACT,  # [16, 4, 4]
         Conv("conv2", 16, 32, 3, 1, 1), GroupNorm("norm2"), ACT,  # -> [32, 4, 4]
         Dense("fc1", 32 * 4 * 4, 32), ACT, Dense("fc2", 32, 10)),
        shortcut=Dense("shortcut", SCATTERING_DIM, 10, bias=False, zero=True)),
    Architecture(
        "scattering", "small_cnn", "one group-normalised convolution and a dense layer (14,250 "
        "parameters)",
        (Conv("conv1", SCATTERING_CHANNELS, 16, 3, 2, 1), GroupNorm("norm1"), ACT,  # [16, 4, 4]
         Dense("fc", 16 * 4 * 4, 10))),
    Architecture(
        "scattering", "linear", "a linear classifier (39,700 parameters)",
        (Dense("fc", SCATTERING_DIM, 10, zero=True),)),
)


NETWORKS = tuple(dict.fromkeys(architecture.network for architecture in ARCHITECTURES))


def of(network, where: str = "hyperparameters") -> Architecture:
    """The architecture `network` names (anything with `features` and `network`: the
    hyperparameters, an interface.Network); UserError naming `where` if none is declared."""
    for architecture in ARCHITECTURES:
        if (architecture.features, architecture.network) == (network.features, network.network):
            return architecture
    declared = [a.network for a in ARCHITECTURES if a.features == network.features]
    elsewhere = [a.features for a in ARCHITECTURES if a.network == network.network]
    raise UserError(f"{where}: network = \"{network.network}\" takes features {elsewhere}, not "
                    f"\"{network.features}\" (mnist_dp/architectures.py); set features to one of "
                    f"those, or network to one of {declared}")
