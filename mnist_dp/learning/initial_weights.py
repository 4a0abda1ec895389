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

from mnist_dp import architectures
from mnist_dp.architectures import ZERO


def layout(network) -> list[tuple[str, tuple, int]]:
    """(name, shape, fan_in) of every parameter of `network` (an interface.Network), in the common
    order and layout (mnist_dp/architectures.py); fan_in ZERO: starts at zero."""
    return architectures.of(network).layout()


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
