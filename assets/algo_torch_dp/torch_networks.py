"""The torch algo's networks, and each example's squared convolution-gradient norm under them.

The networks, built from their declaration (mnist_dp/architectures.py), and what the book-keeping
clipping in algo.py needs for their convolutions: per-example kernel gradients, norms from Grams of
the input pixels (conv_grams.py), and the first convolution's patch Grams, made once per task
(`data_grams`).
"""
import functools
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mnist_dp import architectures
from mnist_dp.learning import conv_grams, interface
from mnist_dp.learning.interface import MNIST_MEAN, MNIST_STD

# --- 1. The networks ------------------------------------------------------------------------------

ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu}


class DeclaredNetwork(nn.Module):
    """A network of mnist_dp/architectures.py: a Conv2d, GroupNorm or Linear submodule named as each
    declared layer, so that the state dict is the common layout; activations and pools are
    functions. `activation` "tanh" (tempered sigmoid: bounded activations keep gradient norms small
    under clipping) or "relu"."""

    def __init__(self, architecture, activation="tanh"):
        super().__init__()
        self.architecture, self.act = architecture, ACTIVATIONS[activation]
        for layer, (shape, _) in zip(architecture.layers, architecture.shapes()):
            if isinstance(layer, architectures.Conv):
                self.add_module(layer.name, nn.Conv2d(layer.channels_in, layer.channels_out,
                                                      layer.kernel, layer.stride, layer.padding))
            elif isinstance(layer, architectures.GroupNorm):
                self.add_module(layer.name, nn.GroupNorm(shape[0] // interface.GROUP_SIZE,
                                                         shape[0], interface.NORM_EPS,
                                                         affine=False))
            elif isinstance(layer, architectures.Dense):
                self.add_module(layer.name, linear(layer))
        if architecture.shortcut is not None:
            self.add_module(architecture.shortcut.name, linear(architecture.shortcut))

    def forward(self, inputs):
        # inputs: images [B, 1, 28, 28] in [0, 1], or scattering features [B, 3969]
        if self.architecture.features == "pixels":
            x = (inputs - MNIST_MEAN) / MNIST_STD
        else:
            x = inputs.view(-1, *self.architecture.input_maps)  # -> [B, 81, 7, 7]
        for layer in self.architecture.layers:
            if layer is architectures.ACT:
                x = self.act(x)
            elif layer is architectures.POOL:
                x = F.max_pool2d(x, 2, 1)
            else:
                x = getattr(self, layer.name)(x.flatten(1) if isinstance(
                    layer, architectures.Dense) else x)
        if self.architecture.shortcut is not None:
            x = x + getattr(self, self.architecture.shortcut.name)(inputs)
        return x  # -> [B, 10] logits


def linear(layer) -> nn.Linear:
    return nn.Linear(layer.width_in, layer.width_out, bias=layer.bias)


def build_network(network):
    """The network `network` names (mnist_dp/architectures.py); one dense layer on features is that
    nn.Linear, its state dict's names unprefixed. Its weights are torch's draw until new_model or
    model_from_bytes sets them."""
    architecture = architectures.of(network)
    if architecture.features != "pixels" and len(architecture.weighted) == 1 and isinstance(
            architecture.layers[0], architectures.Dense):
        return linear(architecture.layers[0])  # [B, 3969] -> [B, 10] logits
    return DeclaredNetwork(architecture, network.activation)


# --- 2. Each example's convolution gradient norms -------------------------------------------------

def conv_example_gradients(layer: nn.Conv2d, inputs: torch.Tensor,
                           out_grads: torch.Tensor) -> torch.Tensor:
    """Each example's kernel gradient of a Conv2d (groups 1, dilation 1, zero padding).

    Args:
      layer: the Conv2d.
      inputs: its input [B, in, H, W].
      out_grads: the gradient of its output [B, out, H', W'].

    Returns:
      [B, out, in·kh·kw].
    """
    batch, channels = inputs.shape[:2]
    if channels == 1:
        # One convolution with the batch as groups: each example's input correlated with its own
        # output gradient, dilated by the stride; patches (below) are faster with many input
        # channels (design.md, §4).
        kernels = F.conv2d(inputs.reshape(1, batch, *inputs.shape[2:]),
                           out_grads.reshape(batch * layer.out_channels, 1, *out_grads.shape[2:]),
                           padding=layer.padding, dilation=layer.stride, groups=batch)
        kh, kw = layer.kernel_size  # a stride that does not divide the span leaves extra rows: cut
        return kernels[:, :, :kh, :kw].reshape(batch, layer.out_channels, -1)
    # [B, K, P]
    patches = F.unfold(inputs, layer.kernel_size, layer.dilation, layer.padding, layer.stride)
    return torch.bmm(out_grads.flatten(2), patches.transpose(1, 2))


def conv_weight_norms(layer: nn.Conv2d, inputs: torch.Tensor,
                      out_grads: torch.Tensor) -> torch.Tensor:
    """Each example's squared kernel-gradient norm: from the Gram of its input pixels
    (conv_grams.py) when that is smaller than its kernel gradient (the ScatterNet CNN's layers;
    F.unfold's im2col is slow on CPU), one batched product, then one sparse product that sums the
    pixel pairs of each patch pair; else from its kernel gradient (conv_example_gradients: the pixel
    CNN's).

    Args:
      layer: the Conv2d.
      inputs: its input [B, in, H, W].
      out_grads: the gradient of its output [B, out, H', W'].

    Returns:
      [B] squared norms.
    """
    (ph, pw), (kh, kw), (sh, sw) = layer.padding, layer.kernel_size, layer.stride
    batch, channels, height, width = inputs.shape
    if not conv_grams.pixel_grams_are_smaller(height, width, layer.weight.numel()):  # the pixel CNN
        return conv_example_gradients(layer, inputs, out_grads).flatten(1).square().sum(1)
    pixels = inputs.flatten(2)  # [B, in, H·W]
    grams = torch.bmm(pixels.transpose(1, 2), pixels).flatten(1)  # -> [B, (H·W)²]
    # [B, P·P]
    patch_grams = grams @ patch_pair_sums(height, width, *out_grads.shape[2:], kh, kw, sh, sw, ph,
                                          pw)
    return (output_grams(out_grads) * patch_grams).sum(1)


def person_squares(layer: nn.Module, layer_in: torch.Tensor, out_grads: torch.Tensor,
                   slots: torch.Tensor) -> torch.Tensor:
    """Each person's squared norm of the sum of their examples' gradients of `layer`'s parameters
    (weights and bias).

    Args:
      layer: an nn.Linear on [B, in] or a plain nn.Conv2d (clip_and_sum's).
      layer_in: its input [B, ...].
      out_grads: the gradient of its output [B, ...].
      slots: units.BatchPersons.slots, each person's examples [P, k] (padded with B).

    Returns:
      [P].
    """
    x, g = padded(layer_in)[slots], padded(out_grads)[slots]  # [P, k, ...]: a person's examples
    if isinstance(layer, nn.Conv2d):
        squares = person_kernel_gradients(layer, x, g).flatten(1).square().sum(1)
        channels = g.sum((1, 3, 4))  # the bias gradient: [P, out]
    elif slots.shape[1] * (x.shape[2] + g.shape[2]) < x.shape[2] * g.shape[2]:
        # ‖Σ_i g_i x_iᵀ‖² = Σ_{i,j} (g_i·g_j)(x_i·x_j): Grams smaller than the gradient
        squares = (g @ g.transpose(1, 2) * (x @ x.transpose(1, 2))).sum((1, 2))
        channels = g.sum(1)
    else:
        squares = (g.transpose(1, 2) @ x).square().sum((1, 2))  # [P, out, in]
        channels = g.sum(1)
    return squares + channels.square().sum(1) if layer.bias is not None else squares


def person_kernel_gradients(layer: nn.Conv2d, inputs: torch.Tensor,
                            out_grads: torch.Tensor) -> torch.Tensor:
    """Each person's kernel gradient of a Conv2d: one weight gradient of a convolution grouped by
    person, whose batch is a person's examples.

    Args:
      layer: the Conv2d.
      inputs: its inputs, a row of examples per person [P, k, in, H, W].
      out_grads: the gradients of its outputs [P, k, out, H', W'].

    Returns:
      [P, out, in·kh·kw].
    """
    persons, k = inputs.shape[:2]
    kernels = torch.nn.grad.conv2d_weight(
        inputs.transpose(0, 1).reshape(k, -1, *inputs.shape[3:]),
        (persons * layer.out_channels, layer.in_channels, *layer.kernel_size),
        out_grads.transpose(0, 1).reshape(k, -1, *out_grads.shape[3:]), layer.stride,
        layer.padding, groups=persons)
    return kernels.view(persons, layer.out_channels, -1)


def padded(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` [B, ...] with a row of zeros appended: the row BatchPersons.slots pads with."""
    return torch.cat([tensor, tensor.new_zeros(1, *tensor.shape[1:])])


def output_grams(out_grads: torch.Tensor) -> torch.Tensor:
    """[B, out, H', W'] output gradients -> each example's Gram of them over positions, flattened
    [B, P·P]."""
    grads = out_grads.flatten(2)  # [B, out, P]
    return torch.bmm(grads.transpose(1, 2), grads).flatten(1)


@functools.cache
def patch_pair_sums(*shape) -> torch.Tensor:
    """conv_grams.patch_pair_sums(*shape) as a sparse CSR tensor [(H·W)², P·P], made once per shape
    (a dense matrix times CSR was the fastest of torch's sparse products here)."""
    indices, values, size = conv_grams.patch_pair_sums(*shape)
    coo = torch.sparse_coo_tensor(torch.from_numpy(indices.T.copy()), torch.tensor(values), size,
                                  check_invariants=True)
    with warnings.catch_warnings():
        # "sparse CSR support is in beta": what it is used for works
        warnings.simplefilter("ignore", UserWarning)
        return coo.to_sparse_csr()


@functools.cache
def packed_pairs(positions: int) -> torch.Tensor:
    return torch.tensor(conv_grams.packed_pairs(positions))


def data_grams(model: nn.Module, images: np.ndarray) -> tuple[nn.Conv2d, torch.Tensor] | None:
    """A network's first convolution, when it reads the inputs themselves (scattering features, not
    normalised pixels), and every example's packed patch Grams under it (conv_grams.patch_grams):
    made once, not at every step; clip_and_sum takes a batch's rows. None for the other networks
    (whose first layer is dense, or takes its norms from per-example gradients)."""
    architecture = getattr(model, "architecture", None)
    if architecture is None or architecture.features == "pixels" or not isinstance(
            architecture.layers[0], architectures.Conv):
        return None
    layer, (_, size, _) = getattr(model, architecture.layers[0].name), architecture.input_maps
    (ph, pw), (kh, kw), (sh, sw) = layer.padding, layer.kernel_size, layer.stride
    if not conv_grams.pixel_grams_are_smaller(size, size, layer.weight.numel()):
        return None
    pixels = images.reshape(-1, layer.in_channels, size, size)
    out_h, out_w = (size + 2 * ph - kh) // sh + 1, (size + 2 * pw - kw) // sw + 1
    return layer, torch.from_numpy(
        conv_grams.patch_grams(pixels, out_h, out_w, kh, kw, sh, sw, ph, pw))
