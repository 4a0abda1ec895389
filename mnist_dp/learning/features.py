"""Fixed, data-independent image features: the scattering transform, as Tramèr & Boneh (2021) use
it.

A scattering network (Bruna & Mallat 2013, "Invariant scattering convolution networks") is a
convolutional network whose filters are fixed Morlet wavelets, not learnt: with J = 2 and 8
orientations a 28×28 image becomes 81 channels of 7×7 (kymatio's transform). Each example's channels
are then normalised in 27 groups of 3 (group normalisation without learnt parameters). Nothing here
looks at more than one example, so the features cost no privacy; only the classifier on top is
trained with DP-SGD.

Computed here in numpy, once, for every framework: the three algos train the same classifier on the
same numbers. kymatio's filters and algorithm (reflection padding, products in Fourier, subsampling
by periodising the spectrum), batched: every filter at once, each low-pass as one matrix product, a
block of images per core. That is faster than kymatio's own numpy transform (benchmarks/benchmark.py
times both; docs/benchmarks.md), and equal to it within float32 rounding
(tests/learning/test_features.py).

The networks are given the features kept in float16 (TRAINED_DTYPE) and widen each batch to float32
in their own framework: 60,000 images' features take 476 MB instead of 952, which is what keeps a
train task on 60,000 images under 1.5 GB (docs/design.md, "memory"). The rounding, 2⁻¹¹ of each
number, is a function of each image alone.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.architectures import SCATTERING_CHANNELS, SCATTERING_DIM, SCATTERING_SIZE
from mnist_dp.learning import blocks
from mnist_dp.utils import progress

FEATURES = hyperparameters.FEATURES
SCATTERING_J, ORIENTATIONS = 2, 8
GROUPS = 27
# kymatio pads 28 -> 36 by reflection (its compute_padding); 18: resolution 1
_PAD, _PADDED, _HALF = 4, 36, 18
_BATCH = 125  # images a block: bounds the transform's memory (about 60 MB a block at its peak)
TRAINED_DTYPE = np.float16  # the features as the networks are given them (module docstring)


def _kymatio():
    import scipy.special

    # kymatio 0.3.0 imports scipy.special.sph_harm (for its 3-D transform only), which SciPy 1.15
    # removed; the 2-D transform does not use it.
    if not hasattr(scipy.special, "sph_harm"):
        scipy.special.sph_harm = None
    import kymatio.numpy
    import kymatio.scattering2d.filter_bank

    return kymatio


def kymatio_scattering(images: np.ndarray) -> np.ndarray:
    """kymatio's own numpy transform, [N, 28, 28] -> [N, 81, 7, 7]: the reference the tests and
    benchmark.py hold `scattering_maps` to."""
    return _kymatio().numpy.Scattering2D(J=SCATTERING_J, shape=(28, 28), L=ORIENTATIONS)(images)


@dataclasses.dataclass(frozen=True)
class _Filters:
    """kymatio's filters on the padded 36×36 grid, as the linear maps its algorithm makes of
    them."""

    fine: np.ndarray  # [8, 36, 36] complex64: the Morlet filters ψ(0, θ) in Fourier
    # [324, 8, 16] float32: at each 18×18 frequency, a spectrum's 4 aliases as
    # (real, imaginary) pairs -> the mean of their products with each ψ(1, θ), as (real, imaginary)
    # pairs (_periodised_products)
    coarse: np.ndarray
    # [1296, 49] float32: a 36×36 map -> low-pass φ, subsampled by 4, unpadded to 7×7
    low_36: np.ndarray
    # [324, 49] float32: an 18×18 map (resolution 1) -> low-pass φ, subsampled by 2, unpadded
    low_18: np.ndarray


def _periodise(spectra: np.ndarray, k: int) -> np.ndarray:
    """A spectrum [..., H, W] -> that of the map subsampled by k in space, [..., H/k, W/k]: its k²
    aliases' mean (kymatio's subsample_fourier)."""
    *lead, h, w = spectra.shape
    return spectra.reshape(*lead, k, h // k, k, w // k).mean(axis=(-4, -2))


def _low_pass_matrix(low_pass: np.ndarray, size: int, k: int) -> np.ndarray:
    """The real linear map kymatio applies to a [size, size] map: FFT, × the low-pass filter,
    periodised by k, inverse FFT, real part, one pixel cut off each side; as a [size², 49] matrix
    (its images of the unit maps)."""
    import scipy.fft

    units = np.eye(size * size, dtype=np.float32).reshape(-1, size, size)
    maps = scipy.fft.ifft2(_periodise(scipy.fft.fft2(units) * low_pass, k)).real[:, 1:-1, 1:-1]
    return np.ascontiguousarray(maps.reshape(size * size, -1), np.float32)


@functools.cache
def _filters() -> _Filters:
    bank = _kymatio().scattering2d.filter_bank.filter_bank(
        _PADDED, _PADDED, SCATTERING_J, ORIENTATIONS)
    scales = np.array([psi["j"] for psi in bank["psi"]])
    # what _block assumes
    assert SCATTERING_J == 2 and list(scales) == [0] * ORIENTATIONS + [1] * ORIENTATIONS
    wavelets = np.stack([psi["levels"][0] for psi in bank["psi"]]).astype(np.complex64)
    # ψ(1, θ) as [frequency, alias, θ], over 4 for the aliases' mean; (a + ib)(c +
    # id) = (ac − bd) + i(ad + bc)
    w = wavelets[scales == 1].reshape(ORIENTATIONS, 2, _HALF, 2, _HALF).transpose(2, 4, 1, 3, 0)
    w = w.reshape(_HALF ** 2, 4, ORIENTATIONS) / 4
    # [frequency, alias, re|im, θ, re|im]
    coarse = np.empty((_HALF ** 2, 4, 2, ORIENTATIONS, 2), np.float32)
    coarse[:, :, 0, :, 0], coarse[:, :, 0, :, 1] = w.real, w.imag
    coarse[:, :, 1, :, 0], coarse[:, :, 1, :, 1] = -w.imag, w.real
    phi = [level.astype(np.complex64) for level in bank["phi"]["levels"]]
    return _Filters(fine=wavelets[scales == 0],
                    coarse=coarse.reshape(_HALF ** 2, 8, 2 * ORIENTATIONS),
                    low_36=_low_pass_matrix(phi[0], _PADDED, 4),
                    low_18=_low_pass_matrix(phi[1], _HALF, 2))


def _aliases(spectra: np.ndarray) -> np.ndarray:
    """Spectra [36, 36, ...] (m of them) -> their 4 aliases at each 18×18 frequency, [18, 18, m, 2,
    2]: [i, j, :, r, c] = spectrum[18r + i, 18c + j]."""
    return np.ascontiguousarray(spectra.reshape(2, _HALF, 2, _HALF, -1).transpose(1, 3, 4, 0, 2))


def _periodised_products(aliases: np.ndarray) -> np.ndarray:
    """The 4 aliases [18, 18, m, 2, 2] of m spectra (`_aliases`) -> [18, 18, m, 8]: each spectrum's
    product with every ψ(1, θ), periodised by 2 (the mean of its 4 aliases, kymatio's
    subsample_fourier). At each of the 18×18 frequencies that is [m, 4 aliases] @ [4 aliases, 8 θ]:
    one batched real matrix product on the (real, imaginary) pairs, written straight into a complex
    array, with no [m, 8, 36, 36] product in memory."""
    m = aliases.shape[2]
    out = np.empty((_HALF, _HALF, m, ORIENTATIONS), np.complex64)
    np.matmul(aliases.view(np.float32).reshape(_HALF ** 2, m, 8), _filters().coarse,
              out=out.view(np.float32).reshape(_HALF ** 2, m, 2 * ORIENTATIONS))
    return out


def _block(images: np.ndarray) -> np.ndarray:
    """kymatio's scattering2d (J = 2, 8 orientations) of images [b, 28, 28], batched: [b, 81, 49] in
    its channel order (order 0; order 1 by (j1, θ1); order 2 by (θ1, θ2), j1 = 0, j2 = 1). The same
    operations on the same filters, with every filter at once and each low-pass as one matrix
    product. Maps at scale 1 keep the maps' axis in the middle ([18, 18, maps, θ]), so that no step
    transposes a large array element by element."""
    import scipy.fft

    f, b = _filters(), len(images)
    out = np.empty((b, SCATTERING_CHANNELS, SCATTERING_SIZE ** 2), np.float32)
    x = np.pad(images, ((0, 0), (_PAD, _PAD), (_PAD, _PAD)), mode="reflect")  # -> [b, 36, 36]
    out[:, 0] = x.reshape(b, -1) @ f.low_36  # order 0: the image's low-pass
    spectra = scipy.fft.fft2(x)  # -> [b, 36, 36]
    # |x ⋆ ψ(0, θ)|: [b, 8, 36, 36]
    fine = np.abs(scipy.fft.ifft2(spectra[:, None] * f.fine, overwrite_x=True))
    coarse = np.abs(scipy.fft.ifft2(_periodised_products(_aliases(spectra.transpose(1, 2, 0))),
                                    axes=(0, 1),
                                    overwrite_x=True))  # -> [18, 18, b, 8]
    out[:, 1 : 1 + ORIENTATIONS] = (
        fine.reshape(-1, _PADDED ** 2) @ f.low_36).reshape(b, ORIENTATIONS, -1)
    out[:, 1 + ORIENTATIONS : 1 + 2 * ORIENTATIONS] = (
        f.low_18.T @ coarse.reshape(_HALF ** 2, -1)).reshape(-1, b, ORIENTATIONS).transpose(1, 2, 0)
    # Order 2: ||x ⋆ ψ(0, θ1)| ⋆ ψ(1, θ2)|↓2, for the b·8 maps of order 1 at scale 0.
    # Its arrays are the block's largest (products: 21 MB a block), so each goes as soon as the next
    # is made.
    aliases = _aliases(scipy.fft.fft2(np.ascontiguousarray(fine.transpose(2, 3, 0, 1)),
                                      axes=(0, 1)))
    products = _periodised_products(aliases)  # -> [18, 18, b·8, 8]
    del aliases
    second = np.abs(scipy.fft.ifft2(products, axes=(0, 1), overwrite_x=True))
    del products
    low = f.low_18.T @ second.reshape(_HALF ** 2, -1)  # -> [49, b·8·8]
    out[:, 1 + 2 * ORIENTATIONS :] = low.reshape(-1, b, ORIENTATIONS ** 2).transpose(1, 2, 0)
    return out


def _by_blocks(images: np.ndarray, out: np.ndarray, compute) -> np.ndarray:
    """out[i : i + _BATCH] = compute(its images' _block) for every block, blocks.THREADS at once,
    with a bar."""
    _filters()  # once, before the threads

    def fill(start: int) -> int:
        block = np.asarray(images[start : start + _BATCH], np.float32)
        out[start : start + len(block)] = compute(_block(block))
        return len(block)

    with progress.bar(len(images), "scattering features", "image") as bar:
        for done in blocks.in_threads(fill, len(images), _BATCH):
            bar.update(done)
    return out


def scattering_maps(images: np.ndarray) -> np.ndarray:
    """Images [N, 28, 28] in [0, 1] -> the scattering coefficients [N, 81, 7, 7] (float32),
    kymatio's numbers."""
    out = np.empty((len(images), SCATTERING_CHANNELS, SCATTERING_SIZE, SCATTERING_SIZE), np.float32)
    return _by_blocks(images, out,
                      lambda maps: maps.reshape(len(maps), SCATTERING_CHANNELS, SCATTERING_SIZE,
                                                -1))


def _group_normalised(maps: np.ndarray) -> np.ndarray:
    groups = maps.reshape(len(maps), GROUPS, -1)  # -> [b, 27, 3·49]
    mean, var = groups.mean(axis=2, keepdims=True), groups.var(axis=2, keepdims=True)
    return ((groups - mean) / np.sqrt(var + 1e-5)).reshape(len(maps), -1)


def scattering(images: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Images [N, 28, 28] in [0, 1] -> group-normalised scattering features [N, 3969], computed in
    float32 and kept in `dtype`, normalised block by block: no second copy of the features."""
    return _by_blocks(images, np.empty((len(images), SCATTERING_DIM), dtype), _group_normalised)


def transform(images: np.ndarray, features: str) -> np.ndarray:
    """What the network is given: the images themselves ("pixels") or their scattering features (in
    TRAINED_DTYPE)."""
    if features == "pixels":
        return images
    if features == "scattering":
        return scattering(images, TRAINED_DTYPE)
    raise ValueError(f"unknown features {features!r}, expected one of {FEATURES}")
