"""Fixed, data-independent image features: the scattering transform, as Tramèr & Boneh (2021) use it.

A scattering network (Bruna & Mallat 2013, "Invariant scattering convolution networks") is a convolutional
network whose filters are fixed Morlet wavelets, not learnt: with J = 2 and 8 orientations a 28×28 image
becomes 81 channels of 7×7 (kymatio's numpy implementation). Each example's channels are then normalised
in 27 groups of 3 (group normalisation without learnt parameters). Nothing here looks at more than one
example, so the features cost no privacy; only the classifier on top is trained with DP-SGD.

Computed here in numpy, once, for every framework: the three algos train the same classifier on the same
numbers. About 1 ms per image on one core.
"""
from __future__ import annotations

import functools

import numpy as np

from mnist_dp import hyperparameters

FEATURES = hyperparameters.FEATURES
SCATTERING_J = 2
SCATTERING_CHANNELS, SCATTERING_SIZE, GROUPS = 81, 7, 27
SCATTERING_DIM = SCATTERING_CHANNELS * SCATTERING_SIZE ** 2  # 3,969 numbers per image
_BATCH = 500  # images per call: bounds the transform's memory


@functools.cache
def _scattering():
    import scipy.special

    # kymatio 0.3.0 imports scipy.special.sph_harm (for its 3-D transform only), which SciPy 1.15 removed; the
    # 2-D transform does not use it.
    if not hasattr(scipy.special, "sph_harm"):
        scipy.special.sph_harm = None
    from kymatio.numpy import Scattering2D

    return Scattering2D(J=SCATTERING_J, shape=(28, 28))


def scattering(images: np.ndarray) -> np.ndarray:
    """Images [N, 28, 28] in [0, 1] -> group-normalised scattering features [N, 3969] (float32)."""
    from tqdm import tqdm

    transform = _scattering()
    out = np.empty((len(images), SCATTERING_DIM), np.float32)
    for start in tqdm(range(0, len(images), _BATCH), desc="scattering features", unit="batch", disable=None):
        block = transform(np.ascontiguousarray(images[start : start + _BATCH], np.float32))  # -> [b, 81, 7, 7]
        groups = block.reshape(len(block), GROUPS, -1)  # -> [b, 27, 3·49]
        mean, var = groups.mean(axis=2, keepdims=True), groups.var(axis=2, keepdims=True)
        out[start : start + len(block)] = ((groups - mean) / np.sqrt(var + 1e-5)).reshape(len(block), -1)
    return out


def transform(images: np.ndarray, features: str) -> np.ndarray:
    """What the network is given: the images themselves ("pixels") or their scattering features."""
    if features == "pixels":
        return images
    if features == "scattering":
        return scattering(images)
    raise ValueError(f"unknown features {features!r}, expected one of {FEATURES}")
