"""The layers the MindSpore algo's ScatterNet CNN (networks.py) is built from.

Convolutions as matrix products (a gather of each position's patch, a product with the kernel
matrix or with a Toeplitz matrix) and a group normalisation, each from gathers and 2-D matrix
products, with its own gradient (`bprop`) where MindSpore's would be slow (networks.py's docstring
says why).
"""
import math

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.common.initializer import HeUniform, initializer

from mnist_dp.learning import conv_grams
from mnist_dp.learning.interface import NORM_EPS


def kernel_matrix(weight):
    """A convolution's weight [O, C, k, k] as the matrix [O, k·k·C] its patches (offsets, then
    channels) multiply."""
    return ops.transpose(weight, (0, 2, 3, 1)).reshape(weight.shape[0], -1)


def kernel_of(matrix, shape):
    """`kernel_matrix`'s inverse: a [O, k·k·C] matrix as a weight of `shape` [O, C, k, k]."""
    out, channels, kh, kw = shape
    return ops.transpose(matrix.reshape(out, kh, kw, channels), (0, 3, 1, 2))


class ConvWeights(nn.Cell):
    """A convolution's parameters, named and shaped as nn.Conv2d's (weight [O, C, k, k], bias [O]);
    the ScatterNet CNN computes its convolutions itself."""

    def __init__(self, in_channels, out_channels, kernel):
        super().__init__()
        shape = (out_channels, in_channels, kernel, kernel)
        self.weight = ms.Parameter(initializer(HeUniform(math.sqrt(5)), shape, ms.float32),
                                   name="weight")
        self.bias = ms.Parameter(initializer("zeros", (out_channels,), ms.float32), name="bias")


class PatchGather(nn.Cell):
    """Each output position's patch of a square convolution over pixels [B, H·W, C] (channels last),
    as rows [B, P, k·k·C] (offsets, then channels). Padding reads a zero pixel appended to the
    input: one gather, where Im2Col, Pad or strided slices cost several times more."""

    def __init__(self, size, kernel, stride, padding):
        super().__init__()
        out = (size + 2 * padding - kernel) // stride + 1
        pixels = conv_grams.patch_pixels(size, size, out, out, kernel, kernel, stride, stride,
                                         padding, padding)
        self.index = ms.Tensor(np.where(pixels < 0, size * size,
                                        pixels).reshape(-1).astype(np.int32))
        # [P, k·k]: the pixel each offset of each position reads, -1 for padding
        self.pixels = pixels
        self.positions, self.offsets = pixels.shape
        # conv_grams' arguments
        self.geometry = (out, out, kernel, kernel, stride, stride, padding, padding)

    def construct(self, pixels):
        batch, channels = pixels.shape[0], pixels.shape[2]
        padded = ops.concat((pixels, ops.zeros((batch, 1, channels), pixels.dtype)), 1)
        return ops.gather(padded, self.index, 1).reshape(batch, self.positions,
                          self.offsets * channels)


class DataProduct(nn.Cell):
    """patches @ kernelᵀ, for patches of the data (no gradient): its own gradient is the kernel's
    alone, one product (MindSpore's generic MatMul gradient also forms the patches', with
    transposes: several times slower)."""

    def __init__(self):
        super().__init__()
        self.matmul_tb, self.matmul_ta = ops.MatMul(transpose_b=True), ops.MatMul(transpose_a=True)

    def construct(self, patches, kernel):
        return self.matmul_tb(patches, kernel)

    def bprop(self, patches, kernel, out, dout):
        """The gradient: the kernel's alone.

        Args:
          patches: the forward pass's patches (data: their gradient is zero).
          kernel: the kernel matrix [O, K].
          out: the forward pass's output (unused).
          dout: the output's gradient [N, O].

        Returns:
          (zeros shaped as `patches`, the kernel's gradient doutᵀ · patches).
        """
        return ops.zeros_like(patches), self.matmul_ta(dout, patches)


class ToeplitzConv2d(nn.Cell):
    """A square convolution (no bias) as one product with its Toeplitz matrix T: input [B, H·W·C]
    (pixels, channels last), weight as nn.Conv2d's, output [B, O·P] in NCHW's (channel, position)
    order. T[pixel·C + c, o·P + p] is weight[o, c, offset] for the offset of position p that reads
    that pixel, else 0. Its own gradient: the input's is one more product; the kernel's is its
    patches' product with the output gradient (through T's gather it would be a scatter-add, slower
    than the whole step)."""

    def __init__(self, size, in_channels, out_channels, kernel, stride, padding):
        super().__init__()
        self.patches = PatchGather(size, kernel, stride, padding)
        self.weight_shape = (out_channels, in_channels, kernel, kernel)
        pixels, positions, offsets = (self.patches.pixels, self.patches.positions,
                                      self.patches.offsets)
        # each (position, offset) that reads a pixel: the entries of T it fills
        p, k = np.nonzero(pixels >= 0)
        c, o = np.arange(in_channels)[None, :, None], np.arange(out_channels)[None, None, :]
        index = np.full((size * size * in_channels, out_channels * positions),
                        math.prod(self.weight_shape))
        index[pixels[p, k][:, None, None] * in_channels + c, o * positions + p[:, None, None]] = (
            # the weight's flat index; its size means 0
            (o * in_channels + c) * offsets + k[:, None, None])
        self.index, self.shape = ms.Tensor(index.reshape(-1).astype(np.int32)), index.shape
        self.matmul_tb, self.matmul_ta = ops.MatMul(transpose_b=True), ops.MatMul(transpose_a=True)

    def toeplitz(self, weight):
        entries = ops.concat((weight.reshape(-1), ops.zeros(1, weight.dtype)))
        return ops.gather(entries, self.index, 0).reshape(self.shape)

    def construct(self, x, weight):
        return ops.matmul(x, self.toeplitz(weight))

    def bprop(self, x, weight, out, dout):
        """The gradients of the input and of the weight.

        Args:
          x: the input [B, H·W·C].
          weight: the weight, shaped as nn.Conv2d's.
          out: the forward pass's output (unused).
          dout: the output's gradient [B, O·P].

        Returns:
          (the input's gradient, dout · Tᵀ; the weight's, the input patches' product with the output
          gradient, shaped as `weight`).
        """
        batch, (out_channels, in_channels, _, _) = x.shape[0], self.weight_shape
        patches = self.patches(x.reshape(batch, -1, in_channels))  # -> [B, P, k·k·C]
        grads = ops.transpose(dout.reshape(batch, out_channels, -1), (0, 2, 1))  # -> [B, P, O]
        kernel = self.matmul_ta(grads.reshape(-1, out_channels),
                                patches.reshape(-1, patches.shape[2]))
        return self.matmul_tb(dout, self.toeplitz(weight)), kernel_of(kernel, self.weight_shape)


class GroupNorm(nn.Cell):
    """Group normalisation (no affine part) of z [B, D] in any layout: entry j is in group
    `groups[j]`, groups of equal size. Group means are products with the 0/1 membership matrix, and
    the cell gives its own gradient: MindSpore's for ReduceMean (a Tile) cost more than the
    normalisation."""

    def __init__(self, groups):
        super().__init__()
        groups = np.asarray(groups)
        member = (groups[:, None] == np.arange(groups.max() + 1)).astype(np.float32)  # -> [D, G]
        self.member, self.spread = ms.Tensor(member), ms.Tensor(np.ascontiguousarray(member.T))
        self.size = float(member.sum(0)[0])

    def group_means(self, z):
        return ops.matmul(z, self.member) / self.size  # -> [B, G]

    def mean(self, z):
        """Each entry's group mean, [B, D]."""
        return ops.matmul(self.group_means(z), self.spread)

    def centred_and_scale(self, z):
        """z minus its group means, and each entry's 1 / (its group's standard deviation), [B, D]
        each."""
        centred = z - self.mean(z)
        return centred, ops.matmul(ops.rsqrt(self.group_means(centred * centred) + NORM_EPS),
                                   self.spread)

    def construct(self, z):
        centred, scale = self.centred_and_scale(z)
        return centred * scale

    def bprop(self, z, out, dout):
        """The input's gradient.

        Args:
          z: the input [B, D].
          out: the forward pass's output, the normalised z.
          dout: the output's gradient [B, D].

        Returns:
          (the gradient w.r.t. z [B, D],).
        """
        _, scale = self.centred_and_scale(z)
        return (scale * (dout - self.mean(dout) - out * self.mean(dout * out)),)
