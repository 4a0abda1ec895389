"""DP-SGD on MNIST with PyTorch + Opacus, as Substra train / predict functions (substratools 1.0).

Only framework code lives here; the sampling plan, σ, the ledger and ε come from the skeleton,
`mnist_dp.learning.skeleton`.
Run alone:  python assets/algo_torch_dp/algo.py --function-name train --inputs '[...]' --outputs '[...]'
"""
import functools
import io
import logging
import os
import struct
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")  # see docs/design.md: before any framework

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.learning import conv_grams, features, functions, interface
from mnist_dp.learning.interface import MNIST_MEAN, MNIST_STD
from mnist_dp.privacy.planning import SamplingPlan

HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")

# Known, harmless Opacus noise: the secure-RNG reminder (secure_mode is an explicit choice).
warnings.filterwarnings("ignore", message="Secure RNG turned off")
# Importing opacus calls logging.basicConfig(), which would print every substratools log line twice.
logging.getLogger("substratools").propagate = False


# --- 1. The network -------------------------------------------------------------------------------------------------

ACTIVATIONS = {"tanh": torch.tanh, "relu": F.relu}


class SampleConvNet(nn.Module):
    """The TF Privacy / Opacus tutorial CNN (26,010 parameters): small enough for DP-SGD on a CPU.
    `activation` "tanh" (tempered sigmoid: bounded activations keep gradient norms small under clipping)
    or "relu" (the tutorial's)."""

    def __init__(self, activation="tanh"):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.conv1 = nn.Conv2d(1, 16, 8, stride=2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, stride=2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        # x: [B, 1, 28, 28] in [0, 1]
        x = (x - MNIST_MEAN) / MNIST_STD
        x = self.act(self.conv1(x))  # -> [B, 16, 14, 14]
        x = F.max_pool2d(x, 2, 1)  # -> [B, 16, 13, 13]
        x = self.act(self.conv2(x))  # -> [B, 32, 5, 5]
        x = F.max_pool2d(x, 2, 1)  # -> [B, 32, 4, 4]
        x = x.flatten(1)  # -> [B, 512]
        x = self.act(self.fc1(x))  # -> [B, 32]
        return self.fc2(x)  # -> [B, 10] logits


class ScatterConvNet(nn.Module):
    """Tramèr & Boneh's (2021) ScatterNet CNN with a linear shortcut (72,756 parameters): two convolutions and two
    dense layers on the scattering features, already normalised per example (features.py), plus a linear map of
    the same features added to the logits. Each convolution's output is group-normalised (groups of 4 channels, no
    learnt scale: nothing to clip) before its activation. The shortcut starts at zero (initial_weights.py), so
    training starts from the CNN alone; each change gave about +0.4 points on Fashion-MNIST (docs/benchmarks.md)."""

    def __init__(self, activation="tanh"):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.conv1 = nn.Conv2d(features.SCATTERING_CHANNELS, 16, 3, stride=2, padding=1)
        self.norm1 = nn.GroupNorm(16 // interface.GROUP_SIZE, 16, eps=interface.NORM_EPS, affine=False)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=1, padding=1)
        self.norm2 = nn.GroupNorm(32 // interface.GROUP_SIZE, 32, eps=interface.NORM_EPS, affine=False)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)
        self.shortcut = nn.Linear(features.SCATTERING_DIM, 10, bias=False)  # fc2's bias serves both

    def forward(self, features_in):
        # features_in: [B, 3969] scattering features
        size = features.SCATTERING_SIZE
        x = features_in.view(-1, features.SCATTERING_CHANNELS, size, size)  # -> [B, 81, 7, 7]
        x = self.act(self.norm1(self.conv1(x)))  # -> [B, 16, 4, 4]
        x = self.act(self.norm2(self.conv2(x)))  # -> [B, 32, 4, 4]
        x = x.flatten(1)  # -> [B, 512]
        x = self.act(self.fc1(x))  # -> [B, 32]
        return self.fc2(x) + self.shortcut(features_in)  # -> [B, 10] logits


def build_network(network):
    """The network `network` names: the tutorial CNN on pixels; on scattering features the ScatterNet CNN or a
    linear classifier. Its weights are torch's draw until new_model or model_from_bytes sets them."""
    if network.features == "pixels":
        return SampleConvNet(network.activation)
    if network.network == "cnn":
        return ScatterConvNet(network.activation)
    return nn.Linear(features.SCATTERING_DIM, 10)  # [B, 3969] -> [B, 10] logits


# --- 2. The DP step: book-keeping per-example clipping, then Opacus' noise and the optimizer -------------------------
# One forward and one backward to the layers' outputs give each example's gradient norm from its layer inputs and
# output gradients, then the sum of the clipped gradients as ordinary weight gradients of the output gradients scaled
# by each example's clipping factor (Bu et al. 2023): exact per-example clipping with no per-example gradient tensor
# and no second backward pass (Opacus' ghost clipping runs two). Opacus' DPOptimizerFastGradientClipping takes that
# sum as p.grad and adds the noise. benchmarks/benchmark.py times it against Opacus' own modes.

def conv_example_gradients(layer: nn.Conv2d, inputs: torch.Tensor, out_grads: torch.Tensor) -> torch.Tensor:
    """Each example's kernel gradient [B, out, in·kh·kw] of a Conv2d (groups 1, dilation 1, zero padding)
    from its input [B, in, H, W] and the gradient of its output [B, out, H', W']."""
    batch, channels = inputs.shape[:2]
    if channels == 1:
        # One convolution with the batch as groups: each example's input correlated with its own output
        # gradient, dilated by the stride; patches (below) are faster with many input channels (design.md, §4).
        kernels = F.conv2d(inputs.reshape(1, batch, *inputs.shape[2:]),
                           out_grads.reshape(batch * layer.out_channels, 1, *out_grads.shape[2:]),
                           padding=layer.padding, dilation=layer.stride, groups=batch)
        kh, kw = layer.kernel_size  # a stride that does not divide the span leaves extra rows: cut
        return kernels[:, :, :kh, :kw].reshape(batch, layer.out_channels, -1)
    patches = F.unfold(inputs, layer.kernel_size, layer.dilation, layer.padding, layer.stride)  # [B, K, P]
    return torch.bmm(out_grads.flatten(2), patches.transpose(1, 2))


def conv_weight_norms(layer: nn.Conv2d, inputs: torch.Tensor, out_grads: torch.Tensor) -> torch.Tensor:
    """Each example's squared kernel-gradient norm [B] from the Gram of its input pixels (conv_grams.py) when that
    is smaller than its kernel gradient (the ScatterNet CNN's layers; F.unfold's im2col is slow on CPU): one
    batched product, then one sparse product that sums the pixel pairs of each patch pair."""
    (ph, pw), (kh, kw), (sh, sw) = layer.padding, layer.kernel_size, layer.stride
    batch, channels, height, width = inputs.shape
    if not conv_grams.pixel_grams_are_smaller(height, width, layer.weight.numel()):  # the pixel CNN
        return conv_example_gradients(layer, inputs, out_grads).flatten(1).square().sum(1)
    pixels = inputs.flatten(2)  # [B, in, H·W]
    grams = torch.bmm(pixels.transpose(1, 2), pixels).flatten(1)  # -> [B, (H·W)²]
    patch_grams = grams @ patch_pair_sums(height, width, *out_grads.shape[2:], kh, kw, sh, sw, ph, pw)  # [B, P·P]
    return (output_grams(out_grads) * patch_grams).sum(1)


def output_grams(out_grads: torch.Tensor) -> torch.Tensor:
    """[B, out, H', W'] output gradients -> each example's Gram of them over positions, flattened [B, P·P]."""
    grads = out_grads.flatten(2)  # [B, out, P]
    return torch.bmm(grads.transpose(1, 2), grads).flatten(1)


@functools.cache
def patch_pair_sums(*shape) -> torch.Tensor:
    """conv_grams.patch_pair_sums(*shape) as a sparse CSR tensor [(H·W)², P·P], made once per shape (a dense matrix
    times CSR was the fastest of torch's sparse products here)."""
    indices, values, size = conv_grams.patch_pair_sums(*shape)
    coo = torch.sparse_coo_tensor(torch.from_numpy(indices.T.copy()), torch.tensor(values), size, check_invariants=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta": what it is used for works
        return coo.to_sparse_csr()


@functools.cache
def packed_pairs(positions: int) -> torch.Tensor:
    return torch.tensor(conv_grams.packed_pairs(positions))


def data_grams(model: nn.Module, images: np.ndarray) -> tuple[nn.Conv2d, torch.Tensor] | None:
    """The ScatterNet CNN's first convolution and every example's packed patch Grams under it
    (conv_grams.patch_grams): its input is the features themselves, so they are made once, not at every step;
    clip_and_sum takes a batch's rows. None for the other networks (whose first layer is dense, or takes its norms
    from per-example gradients)."""
    if not isinstance(model, ScatterConvNet):
        return None
    layer, size = model.conv1, features.SCATTERING_SIZE
    (ph, pw), (kh, kw), (sh, sw) = layer.padding, layer.kernel_size, layer.stride
    if not conv_grams.pixel_grams_are_smaller(size, size, layer.weight.numel()):
        return None
    pixels = images.reshape(-1, layer.in_channels, size, size)
    out_h, out_w = (size + 2 * ph - kh) // sh + 1, (size + 2 * pw - kw) // sw + 1
    return layer, torch.from_numpy(conv_grams.patch_grams(pixels, out_h, out_w, kh, kw, sh, sw, ph, pw))


def clip_and_sum(model: nn.Module, inputs, targets, max_grad_norm, known_grams=None) -> torch.Tensor:
    """Sets every parameter's .grad to the sum over the batch of the per-example gradients of the cross-entropy,
    each clipped to norm `max_grad_norm`; returns the per-example norms before clipping. Every parameter must
    belong to an nn.Linear on [B, in] inputs or a plain nn.Conv2d, each called once a forward pass. known_grams:
    (a Conv2d whose input is `inputs` itself, these examples' rows of data_grams), for that layer's norms."""
    calls = []
    hooks = [module.register_forward_hook(lambda module, args, out: calls.append((module, args[0].detach(), out)))
             for module in model.modules() if isinstance(module, (nn.Linear, nn.Conv2d))]
    try:
        loss = F.cross_entropy(model(inputs), targets, reduction="sum")
    finally:
        for hook in hooks:
            hook.remove()
    layers = [module for module, _, _ in calls]
    if len(set(layers)) != len(layers) or sum(p.numel() for m in layers for p in m.parameters(recurse=False)) != \
            sum(p.numel() for p in model.parameters()):
        raise ValueError("clip_and_sum: every parameter must sit in a Linear or Conv2d layer called once")
    for layer, layer_in, _ in calls:  # what the norms below are exact for
        if isinstance(layer, nn.Linear) and layer_in.dim() != 2:
            raise ValueError("clip_and_sum: a Linear layer on sequences is not supported")
        if isinstance(layer, nn.Conv2d) and (layer.groups != 1 or layer.dilation != (1, 1)
                                             or layer.padding_mode != "zeros" or isinstance(layer.padding, str)):
            raise ValueError("clip_and_sum: Conv2d with groups, dilation or non-zero padding")
    out_grads = torch.autograd.grad(loss, [out for _, _, out in calls])
    with torch.no_grad():
        squares = inputs.new_zeros(len(inputs))
        for (layer, layer_in, _), grads in zip(calls, out_grads):
            if isinstance(layer, nn.Linear):  # one example's weight gradient is g xᵀ: its norm is ‖g‖·‖x‖
                squares += grads.square().sum(1) * layer_in.square().sum(1)
            elif known_grams is not None and layer is known_grams[0]:
                if layer_in.data_ptr() != inputs.data_ptr() or layer_in.numel() != inputs.numel():
                    raise ValueError("clip_and_sum: the layer of known_grams must read the inputs themselves")
                squares += (output_grams(grads)[:, packed_pairs(grads.shape[2] * grads.shape[3])]
                            * known_grams[1]).sum(1)
            else:
                squares += conv_weight_norms(layer, layer_in, grads)
            if layer.bias is not None:
                squares += grads.flatten(2).sum(2).square().sum(1) if grads.dim() == 4 else grads.square().sum(1)
        norms = squares.sqrt()
        factors = (max_grad_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
        for (layer, layer_in, _), grads in zip(calls, out_grads):
            scaled = grads * factors.view(-1, *[1] * (grads.dim() - 1))
            if isinstance(layer, nn.Linear):
                layer.weight.grad = scaled.T @ layer_in
            else:
                layer.weight.grad = torch.nn.grad.conv2d_weight(layer_in, layer.weight.shape, scaled,
                                                                layer.stride, layer.padding)
            if layer.bias is not None:
                layer.bias.grad = scaled.sum((0, 2, 3) if scaled.dim() == 4 else 0)
    return norms


def noise_generator(randomness) -> torch.Generator:
    """A torch generator whose whole Mersenne Twister state (624 words) comes from the run's randomness:
    `manual_seed` takes 64 bits, fewer than a fresh run's 256. torch's CPU generator state is a fixed layout
    (int64 seed, int left, int seeded, uint64 next, uint64 state[624], then cached normals, cleared here);
    left = 1 makes the first draw twist the whole state."""
    generator = torch.Generator()
    state = bytearray(generator.get_state().numpy().tobytes())
    header = struct.calcsize("<qiiQ")
    words = randomness.words("gradient noise", 624).astype("<u8").tobytes()
    state[:header] = struct.pack("<qiiQ", 0, 1, 1, 0)
    state[header:header + len(words)] = words
    state[header + len(words):] = bytes(len(state) - header - len(words))
    generator.set_state(torch.frombuffer(state, dtype=torch.uint8).clone())
    return generator


def has_torchcsprng() -> bool:
    """Opacus' full secure_mode draws everything from torchcsprng (a CSPRNG); it has no torch 2.x release."""
    import importlib.util

    return importlib.util.find_spec("torchcsprng") is not None


def secure_generator(secure_mode: bool, randomness) -> torch.Generator:
    """The noise's generator. Opacus' full secure_mode draws the noise from torchcsprng (no torch 2.x release);
    without it, secure_mode keeps Opacus' floating-point-attack-resistant sampling on the run's own generator."""
    if secure_mode and has_torchcsprng():
        from opacus import PrivacyEngine

        return PrivacyEngine(secure_mode=True).secure_rng  # torchcsprng's /dev/urandom generator
    return noise_generator(randomness)  # without torchcsprng: notices() says so, once per task


def make_dp_step(model, optimizer, expected_batch_size, generator, secure_mode, with_canaries=None):
    """One DP-SGD step `step(x, y, C, σ, known_grams=None)` (clip_and_sum's known_grams): clip each example's
    gradient to C, sum, add N(0, σ²C²) drawn from `generator`, divide by E[B] (Opacus' optimizer). Returns how many
    examples had a gradient norm ≤ C (adaptive clipping's count, before noise). `with_canaries`: the white-box
    audit's DpStep.with_canaries, called between the clipping and the noise."""
    from opacus.optimizers import DPOptimizerFastGradientClipping

    optimizer = DPOptimizerFastGradientClipping(optimizer, noise_multiplier=1.0, max_grad_norm=1.0,
                                                expected_batch_size=expected_batch_size, generator=generator,
                                                secure_mode=secure_mode)

    def step(x: torch.Tensor, y: torch.Tensor, max_grad_norm: float, noise_multiplier: float, known_grams=None) -> int:
        optimizer.zero_grad()
        optimizer.noise_multiplier, optimizer.max_grad_norm = noise_multiplier, max_grad_norm
        unclipped = 0
        if len(x):  # p.grad holds the clipped sum
            unclipped = int((clip_and_sum(model, x, y, max_grad_norm, known_grams) <= max_grad_norm).sum())
        else:  # an empty Poisson batch: nothing to clip, the noise alone
            for param in model.parameters():
                param.grad = torch.zeros_like(param)
        if with_canaries is not None:
            params = list(model.parameters())
            for param, summed in zip(params, with_canaries([p.grad.numpy() for p in params])):
                param.grad = torch.from_numpy(summed)
        optimizer.step()  # adds the noise and divides by the expected batch size
        return unclipped

    return step


def make_plain_step(model, optimizer):
    """The non-private step: mean loss over the batch, plain gradients."""
    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def new_optimizer(model, hp):
    if hp.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=hp.learning_rate)
    return torch.optim.SGD(model.parameters(), lr=hp.learning_rate, momentum=hp.momentum)


class MovingAverage:
    """An exponential moving average of the weights (decay 0: none), taken after every step and saved in
    their place: post-processing of the DP iterates, so free in privacy."""

    def __init__(self, model, decay):
        self.decay = decay
        self.weights = [p.detach().clone() for p in model.parameters()] if decay else None

    def update(self, model):
        if self.weights is not None:
            with torch.no_grad():
                torch._foreach_lerp_(self.weights, [p.detach() for p in model.parameters()], 1 - self.decay)

    def copy_to(self, model):
        if self.weights is not None:
            with torch.no_grad():
                for p, w in zip(model.parameters(), self.weights):
                    p.copy_(w)


@dataclass
class AveragingOptimizer:
    """hp's optimizer and the moving average of the weights its steps update (the `optimizer` hook's)."""

    inner: torch.optim.Optimizer
    average: MovingAverage


# --- 3. Model I/O: inputs as the network takes them, weights as bytes -----------------------------------------------

def as_tensor(inputs):
    """Inputs as the network takes them, as stored (no copy): images [N, 28, 28] get their channel axis, features
    stay [N, 3969] (float16: features.py)."""
    return torch.from_numpy(inputs[:, None] if inputs.ndim == 3 else inputs)


def as_input(inputs):
    """The same in float32, as the network computes."""
    return as_tensor(inputs).float()


def model_to_bytes(model) -> bytes:
    """The weights as torch.save writes a state dict."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def model_from_bytes(weights: bytes, network):
    """The network `network` names with the weights of `model_to_bytes` (weights_only: no pickled code runs)."""
    model = build_network(network)
    model.load_state_dict(torch.load(io.BytesIO(weights), weights_only=True))
    return model


# --- 4. The Framework object: what the skeleton calls ---------------------------------------------------------------

class TorchOpacus(interface.Framework):
    name = "torch"

    def network(self, network: interface.Network) -> nn.Module:
        return build_network(network)

    def optimizer(self, model: nn.Module, hp: Hyperparameters) -> AveragingOptimizer:
        return AveragingOptimizer(new_optimizer(model, hp), MovingAverage(model, hp.ema_decay))

    def dp_step(self, model: nn.Module, optimizer: AveragingOptimizer, inputs: np.ndarray, labels: np.ndarray,
                hp: Hyperparameters, plan: SamplingPlan, step: interface.DpStep):
        x, y = as_tensor(inputs), torch.from_numpy(labels)  # each batch is widened to float32 alone
        known = data_grams(model, inputs)  # the first layer's patch Grams, if it has them
        dp_step = make_dp_step(model, optimizer.inner, plan.expected_batch_size,
                               secure_generator(hp.secure_mode, step.randomness), hp.secure_mode, step.canary_hook)
        model.train()

        def one_step(batch: np.ndarray, max_grad_norm: float, noise_multiplier: float) -> int:
            index = torch.from_numpy(batch)
            unclipped = dp_step(x[index].float(), y[index], max_grad_norm, noise_multiplier,
                                None if known is None else (known[0], known[1][index]))
            optimizer.average.update(model)
            return unclipped

        return one_step

    def plain_step(self, model: nn.Module, optimizer: AveragingOptimizer, inputs: np.ndarray, labels: np.ndarray):
        x, y = as_tensor(inputs), torch.from_numpy(labels)
        plain_step = make_plain_step(model, optimizer.inner)
        model.train()

        def one_step(batch: np.ndarray) -> None:
            index = torch.from_numpy(batch)
            plain_step(x[index].float(), y[index])
            optimizer.average.update(model)

        return one_step

    def end_training(self, model: nn.Module, optimizer: AveragingOptimizer, hp: Hyperparameters) -> None:
        optimizer.average.copy_to(model)

    def library_epsilon(self, plan: SamplingPlan, steps: int, sigma: float, delta: float) -> dict:
        from opacus.accountants import PRVAccountant

        accountant = PRVAccountant()
        accountant.history = [(sigma, plan.sample_rate, steps)]  # as its optimizer hook records constant steps
        with warnings.catch_warnings():  # its RDP domain bound warns ("Optimal order is the largest alpha")
            warnings.simplefilter("ignore")
            return {"Opacus PRV (this run only)": accountant.get_epsilon(delta)}

    load_model = staticmethod(model_from_bytes)
    dump_model = staticmethod(model_to_bytes)

    def weight_arrays(self, model: nn.Module) -> list[np.ndarray]:
        # The common layout (initial_weights.py) is torch's own state dict.
        return [t.detach().numpy().copy() for t in model.state_dict().values()]

    def set_weight_arrays(self, model: nn.Module, arrays: list[np.ndarray]) -> nn.Module:
        model.load_state_dict({name: torch.from_numpy(a) for name, a in zip(model.state_dict(), arrays)})
        return model

    def batch_logits(self, model: nn.Module, inputs: np.ndarray) -> np.ndarray:
        model.eval()
        with torch.no_grad():
            return model(as_input(inputs)).numpy()

    def notices(self, hp: Hyperparameters) -> list:
        if hp.dp and hp.secure_mode and not has_torchcsprng():
            return ["secure_mode without torchcsprng: float-attack-resistant noise from a generator seeded with 256 "
                    "fresh bits, but PyTorch's is not a CSPRNG"]
        return []


FRAMEWORK = TorchOpacus()

if __name__ == "__main__":
    functions.run(FRAMEWORK, HYPERPARAMETERS)
