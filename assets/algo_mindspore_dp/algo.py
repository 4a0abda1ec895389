"""DP-SGD on MNIST with MindSpore 2.9 + MindArmour 2.0 on CPU, as Substra train / predict functions.

Only framework code lives here; the sampling plan, σ, the ledger and ε come from `mnist_dp.learning.skeleton`.
Run alone:  python assets/algo_mindspore_dp/algo.py --function-name train --inputs '[...]' --outputs '[...]'

How the DP step works, and why not MindArmour's `DPModel` (it refuses device_target CPU, clips per microbatch,
expects fixed batches): exact per-example gradients from each layer's input and output gradient (book-keeping,
as the tf algo) in GRAPH mode, clipped and summed; noise from MindArmour's `NoiseGaussianRandom`; its
`RDPMonitor` as a cross-check. Convolutions are Im2Col patches times a matrix (`PatchConv2d`): far faster than
MindSpore 2.9's CPU Conv2D, and what the per-example gradients need anyway (timings: docs/design.md).
"""
import io
import logging
import math
import os
import sys
from collections.abc import Iterable
from pathlib import Path

# Before MindSpore is imported: quiet its C++ log; protobuf's pure-Python implementation (docs/design.md).
os.environ.setdefault("GLOG_v", "3")
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import mindspore as ms
import numpy as np
from mindspore import nn, ops

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.learning import chunks, features, initial_weights, interface, skeleton
from mnist_dp.learning.interface import GROUP_SIZE, MNIST_MEAN, MNIST_STD, NORM_EPS
from mnist_dp.privacy.planning import SamplingPlan

HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


# --- 1. The network -------------------------------------------------------------------------------------------------

class PatchConv2d(nn.Conv2d):
    """`nn.Conv2d` (same parameters, names and initialisation), computed as Im2Col patches times the
    kernel matrix (the module docstring says why). Output [B, out_channels, H', W'] as Conv2d's.
    Handles what this CNN uses: groups 1, dilation 1, one padding for every side; a bias unless told not to."""

    def __init__(self, *args, has_bias=True, **kwargs):
        super().__init__(*args, has_bias=has_bias, **kwargs)
        if self.group != 1 or tuple(self.dilation[-2:]) != (1, 1) or not isinstance(self.padding, int):
            raise ValueError("PatchConv2d: groups 1, dilation 1 and an int padding only")
        self.batch_matmul, self.bias_add = ops.BatchMatMul(), ops.BiasAdd()

    def patches(self, x):
        """[B, C, H, W] -> [B, C·kh·kw, H'·W']: each output position's input, in the weight's (C, kh, kw) order."""
        return ops.unfold(x, self.kernel_size, 1, self.padding, self.stride)

    def pre_activation(self, patches):
        """Patches -> the convolution's output [B, out_channels, H'·W'] (bias added)."""
        kernel = self.weight.reshape(self.out_channels, -1)  # -> [out, C·kh·kw]
        kernels = ops.broadcast_to(kernel, (patches.shape[0],) + kernel.shape)  # one per example
        return self.bias_add(self.batch_matmul(kernels, patches), self.bias)

    def construct(self, x):
        (kh, kw), (sh, sw) = self.kernel_size, self.stride[-2:]
        height = (x.shape[2] + 2 * self.padding - kh) // sh + 1
        width = (x.shape[3] + 2 * self.padding - kw) // sw + 1
        return self.pre_activation(self.patches(x)).reshape(x.shape[0], self.out_channels, height, width)


class GroupNorm(nn.Cell):
    """The other algos' GroupNorm on a conv output [B, C, H·W]: nn.GroupNorm keeps gamma and beta even unused."""

    def construct(self, z):
        groups = z.reshape(z.shape[0], -1, GROUP_SIZE * z.shape[2])  # -> [B, C / GROUP_SIZE, GROUP_SIZE·H·W]
        centred = groups - groups.mean(axis=2, keep_dims=True)
        return (centred / ops.sqrt((centred * centred).mean(axis=2, keep_dims=True) + NORM_EPS)).reshape(z.shape)


def _probed(z, probes, index):
    """z + probes[index]: with a zero probe, the gradient w.r.t. the probe is the gradient w.r.t. z."""
    return z if probes is None else z + probes[index]


class ConvNet(nn.Cell):
    """The CNNs, the same networks as the other algos': on pixels the TF Privacy / Opacus tutorial CNN (26,010
    parameters); on scattering features Tramèr & Boneh's ScatterNet CNN, its convolutions group-normalised, with a
    linear shortcut from the features to the logits (72,756)."""

    def __init__(self, activation="tanh", scattering=False):
        super().__init__()
        self.scattering = scattering
        # The parameters, in the order ClippedGradientSum returns their gradients.
        self.GRADIENT_ORDER = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias",
                               "fc2.weight", "fc2.bias") + (("shortcut.weight",) if scattering else ())
        if scattering:  # [B, 81, 7, 7] -> conv [B, 16, 4, 4] -> conv [B, 32, 4, 4]
            self.conv1 = PatchConv2d(features.SCATTERING_CHANNELS, 16, 3, stride=2, pad_mode="pad", padding=1)
            self.conv2 = PatchConv2d(16, 32, 3, stride=1, pad_mode="pad", padding=1)
            self.pool, self.norm, self.conv_shapes = nn.Identity(), GroupNorm(), ((16, 4, 4), (32, 4, 4))
        else:  # [B, 1, 28, 28] -> conv [B, 16, 14, 14] -> pool [B, 16, 13, 13] -> conv [B, 32, 5, 5] -> pool 4×4
            self.conv1 = PatchConv2d(1, 16, 8, stride=2, pad_mode="pad", padding=3)
            self.conv2 = PatchConv2d(16, 32, 4, stride=2, pad_mode="valid")
            self.pool, self.norm, self.conv_shapes = nn.MaxPool2d(2, 1), nn.Identity(), ((16, 14, 14), (32, 5, 5))
        self.fc1, self.fc2, self.flatten = nn.Dense(32 * 4 * 4, 32), nn.Dense(32, 10), nn.Flatten()
        self.shortcut = nn.Dense(features.SCATTERING_DIM, 10, weight_init=0, has_bias=False) if scattering else None
        self.act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]()  # "tanh" or "relu", as the other algos
        # Each weighted layer's output [B, ...] (before its activation): the shapes of `forward`'s probes.
        self.probe_shapes = tuple((c, h * w) for c, h, w in self.conv_shapes) + ((32,), (10,))

    def construct(self, x):
        return self.forward(x)[0]

    def forward(self, x, probes=None):
        """Logits, and the input of each weighted layer (a convolution's patches), for the per-example
        gradients of ClippedGradientSum; `probes` (zeros shaped [B, *probe_shapes[i]]) are added to each
        layer's output so that the loss can be differentiated with respect to it."""
        batch, features_in = x.shape[0], x
        if self.scattering:  # x: [B, 3969] -> [B, 81, 7, 7]
            x = x.reshape(batch, features.SCATTERING_CHANNELS, features.SCATTERING_SIZE, features.SCATTERING_SIZE)
        else:  # x: [B, 1, 28, 28] in [0, 1]
            x = (x - MNIST_MEAN) / MNIST_STD
        patches1 = self.conv1.patches(x)  # -> [B, 64, 196] on pixels, [B, 729, 16] on scattering features
        z1 = _probed(self.conv1.pre_activation(patches1), probes, 0)  # -> [B, 16, 196] ([B, 16, 16])
        x = self.pool(self.act(self.norm(z1).reshape((batch,) + self.conv_shapes[0])))  # -> [B, 16, 13, 13] (4×4)
        patches2 = self.conv2.patches(x)  # -> [B, 256, 25] ([B, 144, 16])
        z2 = _probed(self.conv2.pre_activation(patches2), probes, 1)  # -> [B, 32, 25] ([B, 32, 16])
        x = self.pool(self.act(self.norm(z2).reshape((batch,) + self.conv_shapes[1])))  # -> [B, 32, 4, 4]
        hidden_in = self.flatten(x)  # -> [B, 512]
        hidden = self.act(_probed(self.fc1(hidden_in), probes, 2))  # -> [B, 32]
        logits = self.fc2(hidden) + (self.shortcut(features_in) if self.scattering else 0)  # -> [B, 10]
        logits = _probed(logits, probes, 3)
        return logits, (patches1, patches2, hidden_in, hidden)


class ScatteringLinear(nn.Cell):
    """A linear classifier on scattering features [B, 3969]."""

    GRADIENT_ORDER = ("fc.weight", "fc.bias")

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(features.SCATTERING_DIM, 10, weight_init="zeros", bias_init="zeros")
        self.probe_shapes = ((10,),)  # the logits, as ConvNet's

    def construct(self, x):
        return self.fc(x)  # -> [B, 10] logits


def build_network(network):
    if network.network == "linear":
        return ScatteringLinear()
    return ConvNet(network.activation, scattering=network.features == "scattering")


# --- 2. The DP step: exact per-example clipping in GRAPH mode, MindArmour's noise, the optimizer --------------------

def import_mindarmour():
    """MindArmour 2.0 warns (and sleeps 1 s) at import, predating MindSpore 2.9, which runs it fine: kept quiet."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        from mindarmour.privacy.diff_privacy import NoiseGaussianRandom, RDPMonitor
    finally:
        logging.disable(previous)
    return NoiseGaussianRandom, RDPMonitor


class _ClippedSumGraph(nn.Cell):
    """The GRAPH-mode body of ClippedGradientSum (the probes must be inputs of the graph: MindSpore folds
    zeros made inside it into constants, which have no gradient)."""

    def __init__(self, net, grad_position=(1, 2, 3, 4), has_aux=True):
        super().__init__(auto_prefix=False)
        self.net = net
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum")
        self.output_grads = ms.grad(self.probed_loss, grad_position=grad_position, has_aux=has_aux)
        self.batch_matmul_tb = ops.BatchMatMul(transpose_b=True)
        self.matmul_ta = ops.MatMul(transpose_a=True)

    def probed_loss(self, x, probe1, probe2, probe3, probe4, y):
        logits, inputs = self.net.forward(x, (probe1, probe2, probe3, probe4))
        return self.loss(logits, y), inputs[0], inputs[1], inputs[2], inputs[3]

    def construct(self, x, y, mask, max_grad_norm, probe1, probe2, probe3, probe4):
        # Σ_i ℓ_i: example i's loss depends only on its own row, so row i of each output gradient is ℓ_i's.
        (g1, g2, g3, g4), (patches1, patches2, hidden_in, hidden) = self.output_grads(
            x, probe1, probe2, probe3, probe4, y)
        batch = x.shape[0]
        kernel1 = self.batch_matmul_tb(g1, patches1)  # per-example kernel gradients -> [B, 16, 64]
        kernel2 = self.batch_matmul_tb(g2, patches2)  # -> [B, 32, 256]
        bias1, bias2 = g1.sum(2), g2.sum(2)  # -> [B, 16], [B, 32]
        # A dense layer's per-example weight gradient is g_i a_iᵀ, of squared norm ‖g_i‖²‖a_i‖².
        sqr_norms = (ops.square(kernel1).reshape(batch, -1).sum(1) + ops.square(bias1).sum(1)
                     + ops.square(kernel2).reshape(batch, -1).sum(1) + ops.square(bias2).sum(1)
                     + ops.square(g3).sum(1) * (ops.square(hidden_in).sum(1) + 1)
                     # fc2's weight, its bias and the shortcut's weight (g4 x_iᵀ) share the output gradient g4
                     + ops.square(g4).sum(1) * (ops.square(hidden).sum(1) + 1
                                                + (ops.square(x).sum(1) if self.net.scattering else 0)))
        norms = ops.sqrt(sqr_norms)
        weight = ops.minimum(1.0, max_grad_norm / ops.maximum(norms, 1e-12)) * mask  # [B]
        unclipped = ((norms <= max_grad_norm).astype(ms.float32) * mask).sum()  # adaptive clipping's count
        row, column = weight.reshape(1, -1), weight.reshape(-1, 1)
        sums = (ops.matmul(row, kernel1.reshape(batch, -1)).reshape(self.net.conv1.weight.shape),
                ops.matmul(row, bias1).reshape(-1),
                ops.matmul(row, kernel2.reshape(batch, -1)).reshape(self.net.conv2.weight.shape),
                ops.matmul(row, bias2).reshape(-1),
                self.matmul_ta(g3 * column, hidden_in), ops.matmul(row, g3).reshape(-1),
                self.matmul_ta(g4 * column, hidden), ops.matmul(row, g4).reshape(-1))
        return sums + ((self.matmul_ta(g4 * column, x),) if self.net.scattering else ()) + (unclipped,)


class _LinearClippedSumGraph(_ClippedSumGraph):
    """ClippedGradientSum's GRAPH-mode body for ScatteringLinear: the example's weight gradient is g_i x_iᵀ
    (g_i the gradient of its loss w.r.t. its logits), of squared norm ‖g_i‖²(‖x_i‖² + 1) with the bias."""

    def __init__(self, net):
        super().__init__(net, grad_position=1, has_aux=False)

    def probed_loss(self, x, probe, y):
        return self.loss(self.net.fc(x) + probe, y)

    def construct(self, x, y, mask, max_grad_norm, probe):
        g = self.output_grads(x, probe, y)  # -> [B, 10]
        norms = ops.sqrt(ops.square(g).sum(1) * (ops.square(x).sum(1) + 1))
        weight = ops.minimum(1.0, max_grad_norm / ops.maximum(norms, 1e-12)) * mask  # [B]
        unclipped = ((norms <= max_grad_norm).astype(ms.float32) * mask).sum()
        return (self.matmul_ta(g * weight.reshape(-1, 1), x), ops.matmul(weight.reshape(1, -1), g).reshape(-1),
                unclipped)


class ClippedGradientSum:
    """Σ_i mask_i · min(1, C / ‖g_i‖) · g_i over one chunk from exact per-example gradients (one backward pass to each
    layer's output, each example's gradient from its layer inputs), in `weights` order, then how many had ‖g_i‖ ≤ C."""

    def __init__(self, net, weights):
        if tuple(w.name for w in weights) != net.GRADIENT_ORDER:
            raise ValueError(f"ClippedGradientSum returns {net.GRADIENT_ORDER}, not {[w.name for w in weights]}")
        self.graph = _LinearClippedSumGraph(net) if isinstance(net, ScatteringLinear) else _ClippedSumGraph(net)
        self.probe_shapes = net.probe_shapes
        self.probes = {}  # chunk size -> zero probes

    def __call__(self, x, y, mask, max_grad_norm):
        size = x.shape[0]
        if size not in self.probes:
            self.probes[size] = tuple(ms.Tensor(np.zeros((size, *shape), np.float32)) for shape in self.probe_shapes)
        return self.graph(x, y, mask, ms.Tensor(max_grad_norm, ms.float32), *self.probes[size])


# MindSpore's random ops take a global and an op seed of 31 bits each: four MindArmour draws with their own op seeds
# carry 5 × 31 = 155 bits of the run's fresh entropy. Their sum over 2 is N(0, 1), as Opacus' secure mode draws it
# (resistant to floating-point attacks, Holohan & Braghin 2021): always so in MindSpore, secure_mode or not.
NOISE_DRAWS = 4
SEED_LIMIT = 2**31 - 1  # mindspore.common.seed keeps a seed modulo this


class NoisyUpdate(nn.Cell):
    """Add Gaussian noise of std `noise_std` (σ·C of this step) to the clipped sum, divide by E[B], take the
    step. The noise: NOISE_DRAWS unit draws of MindArmour's `NoiseGaussianRandom` seeded from `randomness`, summed
    over √NOISE_DRAWS and scaled (the schedule and adaptive clipping change σ·C from step to step). One draw covers
    every weight, cut into the gradients' shapes: a draw per gradient repeats the same numbers in each (one seed,
    one stream per call site), which would let two gradients' difference cancel the noise."""

    def __init__(self, optimizer, expected_batch_size, randomness):
        super().__init__(auto_prefix=False)
        NoiseGaussianRandom, _ = import_mindarmour()
        self.optimizer = optimizer
        ends = np.cumsum([math.prod(p.shape) for p in optimizer.parameters]).tolist()
        self.bounds = tuple(zip([0] + ends[:-1], ends))
        self.shapes = tuple(tuple(p.shape) for p in optimizer.parameters)
        self.every_weight = ms.Tensor(np.zeros(ends[-1], np.float32))  # the shape of one draw
        # The global seed, then one op seed per draw, each in [1, SEED_LIMIT) (0 would mean "pick one yourself").
        words = randomness.words("gradient noise", 1 + NOISE_DRAWS)
        global_seed, *op_seeds = [1 + int(word) % (SEED_LIMIT - 1) for word in words]
        ms.set_seed(global_seed)  # MindSpore bakes the seeds into the graph when it compiles this cell
        self.noises = nn.CellList([NoiseGaussianRandom(1.0, 1.0, seed=seed) for seed in op_seeds])
        self.scale = 1.0 / math.sqrt(NOISE_DRAWS)
        # The *expected* batch size, a constant as in Opacus: dividing by the realised size would make
        # the update depend on the data beyond what the mechanism accounts for.
        self.expected_batch_size = float(expected_batch_size)

    def unit_noise(self, g):
        total = self.noises[0](g)
        for k in range(1, NOISE_DRAWS):
            total = total + self.noises[k](g)
        return total * self.scale

    def construct(self, clipped_sum, noise_std):
        noise = self.unit_noise(self.every_weight) * noise_std
        noisy = ()
        for g, (start, end), shape in zip(clipped_sum, self.bounds, self.shapes):
            noisy += ((g + noise[start:end].reshape(shape)) / self.expected_batch_size,)
        return self.optimizer(noisy)


def make_dp_step(net, optimizer, expected_batch_size, randomness, with_canaries=None):
    """One DP-SGD step `step(images, labels, batch, C, σ)` on images[batch] (as stored; labels int32): clip each
    example's gradient to C, sum the chunks, add N(0, σ²C²), divide by E[B], update; returns how many had ‖g_i‖ ≤ C."""
    clipped_sum = ClippedGradientSum(net, optimizer.parameters)
    update = NoisyUpdate(optimizer, expected_batch_size, randomness)
    sizes = chunks.chunk_sizes(expected_batch_size)

    def step(images, labels, batch, max_grad_norm, noise_multiplier):
        total = None
        for index, mask in chunks.padded_chunks(batch, sizes):
            part = clipped_sum(as_input(images[index]), ms.Tensor(labels[index]), ms.Tensor(mask), max_grad_norm)
            total = part if total is None else tuple(a + b for a, b in zip(total, part))
        *gradients, unclipped = total
        if with_canaries is not None:  # the white-box audit's canaries (DpStep.with_canaries), before the noise
            gradients = [ms.Tensor(g) for g in with_canaries([g.asnumpy() for g in gradients])]
        # mutable: GRAPH mode takes a plain tuple for a constant and recompiles at every step. σ = 0: mechanism tests.
        update(ms.mutable(tuple(gradients)), ms.Tensor(noise_multiplier * max_grad_norm, ms.float32))
        return int(unclipped.asnumpy())

    return step


def make_plain_step(net, optimizer):
    """The non-private step on images[batch]: mean loss, plain gradients (MindSpore's TrainOneStepCell)."""
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    train_step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)

    def step(images, labels, batch):
        return train_step(as_input(images[batch]), ms.Tensor(labels[batch]))

    return step


def new_optimizer(net, hp):
    if hp.optimizer == "adam":
        return nn.Adam(net.trainable_params(), learning_rate=hp.learning_rate)
    return nn.SGD(net.trainable_params(), learning_rate=hp.learning_rate, momentum=hp.momentum)


class MovingAverage(nn.Cell):
    """A moving average of the weights after every step, put in the net by `copy_to`: post-processing, free."""

    def __init__(self, params, decay):
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(params)
        self.averages = self.params.clone(prefix="average")
        self.decay = float(decay)

    def construct(self):
        for average, param in zip(self.averages, self.params):
            ops.assign(average, average * self.decay + param * (1 - self.decay))
        return True

    def copy_to(self):
        for average, param in zip(self.averages, self.params):
            param.set_data(ms.Tensor(average.asnumpy()))


def mindarmour_epsilon(n, sample_rate, noise_multiplier, steps, delta):
    """MindArmour's RDPMonitor figure for this run, once for all steps (its step_end miscounts): above our RDP's."""
    _, RDPMonitor = import_mindarmour()
    batch = max(1, round(n * sample_rate))
    if batch >= n:
        return float("nan")
    monitor = RDPMonitor(num_samples=n, batch_size=batch, initial_noise_multiplier=noise_multiplier,
                         max_eps=1e9, target_delta=delta, noise_decay_mode=None, per_print_times=max(steps, 1))
    return float(monitor._compute_privacy_steps(list(range(steps)))[0])


# --- 3. Model I/O: inputs as the network takes them, weights as bytes -----------------------------------------------

def as_input(inputs) -> ms.Tensor:
    """A float32 tensor as the network takes it: images with a channel axis (NCHW), features widened (features.py)."""
    return ms.Tensor(inputs[:, None] if inputs.ndim == 3 else inputs).astype(ms.float32)


def model_to_bytes(net) -> bytes:
    """The parameters as an .npz, by name."""
    buffer = io.BytesIO()
    np.savez(buffer, **{p.name: p.asnumpy() for p in net.get_parameters()})
    return buffer.getvalue()


def model_from_bytes(weights: bytes, network):
    """The network `network` names with the parameters of `model_to_bytes` (every one, no pickle)."""
    net = build_network(network)
    with np.load(io.BytesIO(weights), allow_pickle=False) as arrays:
        params = {name: ms.Parameter(ms.Tensor(arrays[name]), name=name) for name in arrays.files}
    not_loaded, _ = ms.load_param_into_net(net, params, strict_load=True)
    if not_loaded:
        raise ValueError(f"parameters {not_loaded} missing")
    return net


# --- 4. The Framework object: what the skeleton calls ---------------------------------------------------------------

class MindSporeMindArmour:
    name = "mindspore"
    # GRAPH mode compiles once per input shape: 1000 cuts a test set of 10,000 images into equal batches.
    predict_batch_size = 1000

    def new_model(self, seed: int, network: interface.Network) -> nn.Cell:
        return self.set_weight_arrays(build_network(network), initial_weights.draw(network, seed))

    # Model I/O is section 3's (weights that are not its parameters: see skeleton.load_weights).
    load_model = staticmethod(model_from_bytes)
    dump_model = staticmethod(model_to_bytes)

    def fit(self, net: nn.Cell, images: np.ndarray, labels: np.ndarray, hp: Hyperparameters, plan: SamplingPlan,
            step: interface.DpStep, batches: Iterable[np.ndarray]) -> interface.Ran:
        optimizer = new_optimizer(net, hp)
        average = MovingAverage(net.trainable_params(), hp.ema_decay) if hp.ema_decay else None
        net.set_train(True)
        labels = labels.astype(np.int32)
        dp_step = hp.dp and make_dp_step(net, optimizer, plan.expected_batch_size, step.randomness, step.canary_hook)
        plain_step = None if hp.dp else make_plain_step(net, optimizer)
        batch_sizes = []
        for batch in batches:
            if hp.dp:
                unclipped = dp_step(images, labels, batch, step.clip.value,
                                    step.noise.gradient_sigma(len(batch_sizes)))
                step.clip.update(unclipped, len(batch))  # adaptive clipping's count (a no-op otherwise)
            else:
                plain_step(images, labels, batch)
            if average is not None:
                average()
            batch_sizes.append(len(batch))
        if average is not None:
            average.copy_to()
        net.set_train(False)
        library = {}
        if hp.dp and step.library_can_account:
            library["MindArmour RDPMonitor (this run only)"] = mindarmour_epsilon(
                plan.n, plan.sample_rate, step.noise.sigma, len(batch_sizes), hp.delta)
        return interface.Ran(batch_sizes, library)

    def weight_arrays(self, net: nn.Cell) -> list[np.ndarray]:
        return [p.asnumpy() for p in net.get_parameters()]

    def set_weight_arrays(self, net: nn.Cell, arrays: list[np.ndarray]) -> nn.Cell:
        parameters = list(net.get_parameters())
        interface.check_shapes(arrays, [p.shape for p in parameters])  # set_data would take any shape
        for parameter, array in zip(parameters, arrays):
            parameter.set_data(ms.Tensor(array))
        return net

    def batch_logits(self, net: nn.Cell, images: np.ndarray) -> np.ndarray:
        net.set_train(False)
        return net(as_input(images)).asnumpy()


FRAMEWORK = MindSporeMindArmour()

if __name__ == "__main__":
    skeleton.run_functions(FRAMEWORK, HYPERPARAMETERS)  # substratools' `train` and `predict`
