"""The networks' initial weights, drawn once in numpy from the hyperparameters' `seed` and loaded
into every framework: the same start in torch, tf and MindSpore, so that the three algos differ only
in their float paths.

Every framework's `weight_arrays` speaks the common layout defined here: the parameters in the order
the network defines them (`layout`), convolution kernels [out, in, kh, kw], dense weights [out, in],
and a CNN's last feature map flattened channel-first, [C, H, W]. The distribution is PyTorch's
default for Conv2d and Linear (Kaiming-uniform with a = √5: weights and biases U(±1/√fan_in)); the
ScatterNet CNN's shortcut and the linear classifier start at zero. It looks at no data, so it costs
no privacy.
"""
from __future__ import annotations

import math

import numpy as np

from mnist_dp.learning import features

ZERO = 0  # fan_in of a parameter that starts at zero


def layout(network) -> list[tuple[str, tuple, int]]:
    """(name, shape, fan_in) of every parameter of `network` (an interface.Network), in the common
    order and layout; fan_in ZERO: starts at zero."""
    if network.features == "pixels":  # the TF Privacy / Opacus tutorial CNN
        return [*_conv("conv1", 1, 16, 8), *_conv("conv2", 16, 32, 4),
                *_dense("fc1", 32 * 4 * 4, 32), *_dense("fc2", 32, 10)]
    if network.network == "cnn":  # Tramèr & Boneh's ScatterNet CNN with its linear shortcut
        return [*_conv("conv1", features.SCATTERING_CHANNELS, 16, 3), *_conv("conv2", 16, 32, 3),
                *_dense("fc1", 32 * 4 * 4, 32), *_dense("fc2", 32, 10),
                ("shortcut.weight", (10, features.SCATTERING_DIM), ZERO)]
    # the linear classifier
    return [("weight", (10, features.SCATTERING_DIM), ZERO), ("bias", (10,), ZERO)]


def _conv(name, channels_in, channels_out, kernel):
    fan_in = channels_in * kernel * kernel
    return [(f"{name}.weight", (channels_out, channels_in, kernel, kernel), fan_in),
            (f"{name}.bias", (channels_out,), fan_in)]


def _dense(name, width_in, width_out):
    return [(f"{name}.weight", (width_out, width_in), width_in),
            (f"{name}.bias", (width_out,), width_in)]


def draw(network, seed: int) -> list[np.ndarray]:
    """The initial weights of `network` for `seed` (float32, common layout): the same numbers on
    every machine."""
    rng = np.random.default_rng(seed)
    arrays = []
    for _, shape, fan_in in layout(network):
        if fan_in == ZERO:
            arrays.append(np.zeros(shape, np.float32))
        else:
            bound = 1 / math.sqrt(fan_in)
            arrays.append(rng.uniform(-bound, bound, shape).astype(np.float32))
    return arrays
