"""DP-SGD on MNIST with PyTorch + Opacus, as Substra train / predict functions (substratools 1.0).

Only framework code lives here; the sampling plan, σ, the ledger and ε come from the skeleton,
`mnist_dp.learning.skeleton`.
Run alone:  python assets/algo_torch_dp/algo.py --function-name train --inputs '[...]' --outputs
'[...]'

The networks, and each example's convolution gradient norms under them, are in `torch_networks.py`
beside this file.
"""
import io
import os
import struct
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

# see docs/design.md: before any framework
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# imported by a test or a benchmark: torch_networks.py's folder
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

# not networks.py: MindSpore's algo imports its own, and a process may import all three algos
from torch_networks import (
    build_network,
    conv_weight_norms,
    data_grams,
    output_grams,
    packed_pairs,
    person_squares,
)

from mnist_dp.hyperparameters import Hyperparameters, Training
from mnist_dp.learning import functions, interface, training
from mnist_dp.privacy.task_plan import SamplingPlan

HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")

# Known, harmless Opacus noise: the secure-RNG reminder (secure_mode is an explicit choice).
warnings.filterwarnings("ignore", message="Secure RNG turned off")


# --- 1. The DP step: book-keeping per-example clipping, then Opacus' noise and the optimizer ------
# One forward and one backward to the layers' outputs give each example's gradient norm from its
# layer inputs and output gradients, then the sum of the clipped gradients as ordinary weight
# gradients of the output gradients scaled by each example's clipping factor (Bu et al. 2023): exact
# per-example clipping with no per-example gradient tensor and no second backward pass (Opacus'
# ghost clipping runs two). Opacus' DPOptimizerFastGradientClipping takes that sum as p.grad and
# adds the noise. benchmarks/benchmark.py times it against Opacus' own modes.

def clip_and_sum(model: nn.Module, inputs, targets, max_grad_norm,
                 known_grams=None, persons=None) -> torch.Tensor:
    """Set every parameter's .grad to the sum over the batch of the per-example gradients of the
    cross-entropy, each clipped to norm `max_grad_norm`; with `persons`, of the per-person
    gradients, each the sum of a person's examples' gradients, clipped as one. Every parameter must
    belong to an nn.Linear on [B, in] inputs or a plain nn.Conv2d, each called once a forward pass
    (ValueError otherwise).

    Args:
      model: the network.
      inputs: the batch's inputs, as the network takes them.
      targets: their labels.
      max_grad_norm: C.
      known_grams: (a Conv2d whose input is `inputs` itself, these examples' rows of data_grams),
        for that layer's norms, or None.
      persons: the batch's persons (units.BatchPersons), or None: per example.

    Returns:
      The gradient norms before clipping: per example [B], or per person [P].
    """
    calls = []
    hooks = [module.register_forward_hook(lambda module, args,
                                          out: calls.append((module, args[0].detach(), out)))
             for module in model.modules() if isinstance(module, (nn.Linear, nn.Conv2d))]
    try:
        loss = F.cross_entropy(model(inputs), targets, reduction="sum")
    finally:
        for hook in hooks:
            hook.remove()
    layers = [module for module, _, _ in calls]
    if len(set(layers)) != len(layers) or sum(p.numel() for m in layers
                                              for p in m.parameters(recurse=False)) != \
            sum(p.numel() for p in model.parameters()):
        raise ValueError("clip_and_sum: every parameter must sit in a Linear or Conv2d layer "
                         "called once")
    for layer, layer_in, _ in calls:  # what the norms below are exact for
        if isinstance(layer, nn.Linear) and layer_in.dim() != 2:
            raise ValueError("clip_and_sum: a Linear layer on sequences is not supported")
        if isinstance(layer, nn.Conv2d) and (layer.groups != 1 or layer.dilation != (1, 1)
                                             or layer.padding_mode != "zeros"
                                             or isinstance(layer.padding, str)):
            raise ValueError("clip_and_sum: Conv2d with groups, dilation or non-zero padding")
    out_grads = torch.autograd.grad(loss, [out for _, _, out in calls])
    with torch.no_grad():
        if persons is None:
            squares = example_squares(calls, out_grads, inputs, known_grams)
        else:  # each person's: the squared norm of their examples' summed gradient
            groups, slots = torch.from_numpy(persons.groups), torch.from_numpy(persons.slots)
            squares = sum(person_squares(layer, layer_in, grads, slots)
                          for (layer, layer_in, _), grads in zip(calls, out_grads))
        norms = squares.sqrt()
        factors = (max_grad_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
        if persons is not None:  # each example scaled by its person's factor
            factors = factors[groups]
        for (layer, layer_in, _), grads in zip(calls, out_grads):
            scaled = grads * factors.view(-1, *[1] * (grads.dim() - 1))
            if isinstance(layer, nn.Linear):
                layer.weight.grad = scaled.T @ layer_in
            else:
                layer.weight.grad = torch.nn.grad.conv2d_weight(
                    layer_in, layer.weight.shape, scaled, layer.stride, layer.padding)
            if layer.bias is not None:
                layer.bias.grad = scaled.sum((0, 2, 3) if scaled.dim() == 4 else 0)
    return norms


def example_squares(calls: list, out_grads: tuple, inputs: torch.Tensor,
                    known_grams=None) -> torch.Tensor:
    """Each example's squared gradient norm over the layers of `calls` (clip_and_sum's).

    Args:
      calls: (layer, its input, its output) of each layer, in the forward pass's order.
      out_grads: the gradient of each layer's output.
      inputs: the batch's inputs.
      known_grams: clip_and_sum's.

    Returns:
      [B].
    """
    squares = inputs.new_zeros(len(inputs))
    for (layer, layer_in, _), grads in zip(calls, out_grads):
        # one example's weight gradient is g xᵀ: its norm is ‖g‖·‖x‖
        if isinstance(layer, nn.Linear):
            squares += grads.square().sum(1) * layer_in.square().sum(1)
        elif known_grams is not None and layer is known_grams[0]:
            if layer_in.data_ptr() != inputs.data_ptr() or layer_in.numel() != inputs.numel():
                raise ValueError("clip_and_sum: the layer of known_grams must read the inputs "
                                 "themselves")
            squares += (output_grams(grads)[:, packed_pairs(grads.shape[2] * grads.shape[3])]
                        * known_grams[1]).sum(1)
        else:
            squares += conv_weight_norms(layer, layer_in, grads)
        if layer.bias is not None:
            squares += (grads.flatten(2).sum(2).square().sum(1) if grads.dim() == 4
                        else grads.square().sum(1))
    return squares


def noise_generator(randomness) -> torch.Generator:
    """A torch generator whose whole Mersenne Twister state (624 words) comes from the run's
    randomness: `manual_seed` takes 64 bits, fewer than a fresh run's 256. torch's CPU generator
    state is a fixed layout (int64 seed, int left, int seeded, uint64 next, uint64 state[624], then
    cached normals, cleared here); left = 1 makes the first draw twist the whole state."""
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
    """Opacus' full secure_mode draws everything from torchcsprng (a CSPRNG); it has no torch 2.x
    release."""
    import importlib.util

    return importlib.util.find_spec("torchcsprng") is not None


def secure_generator(secure_mode: bool, randomness) -> torch.Generator:
    """The noise's generator. Opacus' full secure_mode draws the noise from torchcsprng (no torch
    2.x release); without it, secure_mode keeps Opacus' floating-point-attack-resistant sampling on
    the run's own generator."""
    if secure_mode and has_torchcsprng():
        from opacus import PrivacyEngine

        return PrivacyEngine(secure_mode=True).secure_rng  # torchcsprng's /dev/urandom generator
    return noise_generator(randomness)  # without torchcsprng: notices() says so, once per task


def make_dp_step(model, optimizer, expected_batch_size, generator, secure_mode, with_canaries=None):
    """One DP-SGD step, through Opacus' DPOptimizerFastGradientClipping.

    Args:
      model: the network, trained in place.
      optimizer: hp's torch optimizer, which Opacus' optimizer wraps.
      expected_batch_size: E[B], which divides the noisy sum.
      generator: the torch generator the noise is drawn from.
      secure_mode: Opacus' secure_mode.
      with_canaries: the white-box audit's DpStep.with_canaries, called between the clipping and the
        noise; None: no canaries.

    Returns:
      `step(x, y, C, σ, known_grams=None, persons=None)` (clip_and_sum's known_grams and persons):
      clips each example's (or person's) gradient to C, sums, adds N(0, σ²C²) drawn from
      `generator`, divides by E[B] (Opacus' optimizer), and returns how many examples (persons) had
      a gradient norm ≤ C (adaptive clipping's count, before noise).
    """
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.schedulers import LambdaGradClip, LambdaNoise

    optimizer = DPOptimizerFastGradientClipping(optimizer, noise_multiplier=1.0, max_grad_norm=1.0,
                                                expected_batch_size=expected_batch_size,
                                                generator=generator, secure_mode=secure_mode)
    # Each step's σ and C reach the optimizer through Opacus' own schedulers, as multiples of the
    # 1.0 it starts at (exact in floating point).
    this_step = {"sigma": 1.0, "C": 1.0}
    schedulers = (LambdaNoise(optimizer, noise_lambda=lambda _: this_step["sigma"]),
                  LambdaGradClip(optimizer, scheduler_function=lambda _: this_step["C"]))

    def step(x: torch.Tensor, y: torch.Tensor, max_grad_norm: float, noise_multiplier: float,
             known_grams=None, persons=None) -> int:
        """One step; an empty Poisson batch adds the noise alone.

        Args:
          x: the batch's inputs, float32.
          y: their labels.
          max_grad_norm: C.
          noise_multiplier: σ.
          known_grams: clip_and_sum's, or None.
          persons: clip_and_sum's, or None.

        Returns:
          How many examples (persons) had a gradient norm ≤ C.
        """
        optimizer.zero_grad()
        this_step.update(sigma=noise_multiplier, C=max_grad_norm)
        for scheduler in schedulers:
            scheduler.step()
        unclipped = 0
        if len(x):  # p.grad holds the clipped sum
            unclipped = int((clip_and_sum(model, x, y, max_grad_norm, known_grams,
                                          persons) <= max_grad_norm).sum())
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


def new_optimizer(model, training: Training):
    if training.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=training.learning_rate)
    return torch.optim.SGD(model.parameters(), lr=training.learning_rate,
                           momentum=training.momentum)


class MovingAverage:
    """An exponential moving average of the weights (decay 0: none), taken after every step and
    saved in their place: post-processing of the DP iterates, so free in privacy."""

    def __init__(self, model, decay):
        self.decay = decay
        self.weights = [p.detach().clone() for p in model.parameters()] if decay else None

    def update(self, model):
        if self.weights is not None:
            with torch.no_grad():
                torch._foreach_lerp_(self.weights, [p.detach() for p in model.parameters()],
                                     1 - self.decay)

    def copy_to(self, model):
        if self.weights is not None:
            with torch.no_grad():
                for p, w in zip(model.parameters(), self.weights):
                    p.copy_(w)


@dataclass
class AveragingOptimizer:
    """hp's optimizer and the moving average of the weights its steps update (the `optimizer`
    hook's)."""

    inner: torch.optim.Optimizer
    average: MovingAverage


# --- 2. Model I/O: inputs as the network takes them, weights as bytes
# -----------------------------------------------

def as_tensor(inputs):
    """Inputs as the network takes them, as stored (no copy): images [N, 28, 28] get their channel
    axis, features stay [N, 3969] (float16: features.py)."""
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
    """The network `network` names with the weights of `model_to_bytes` (weights_only: no pickled
    code runs)."""
    model = build_network(network)
    model.load_state_dict(torch.load(io.BytesIO(weights), weights_only=True))
    return model


# --- 3. The Framework object: what the skeleton calls
# ---------------------------------------------------------------

class TorchOpacus(interface.Framework):
    name = "torch"
    per_person = True

    def network(self, network: interface.Network) -> nn.Module:
        return build_network(network)

    def optimizer(self, model: nn.Module, training: Training) -> AveragingOptimizer:
        return AveragingOptimizer(new_optimizer(model, training),
                                  MovingAverage(model, training.ema_decay))

    def dp_step(self, model: nn.Module, optimizer: AveragingOptimizer, inputs: np.ndarray,
                labels: np.ndarray, step: training.DpStep):
        """See interface.Framework.dp_step."""
        x, y = as_tensor(inputs), torch.from_numpy(labels)  # each batch is widened to float32 alone
        known = data_grams(model, inputs)  # the first layer's patch Grams, if it has them
        secure = step.secure_mode
        dp_step = make_dp_step(model, optimizer.inner, step.expected_batch_size,
                               secure_generator(secure, step.randomness), secure, step.canary_hook)
        model.train()

        def one_step(batch: np.ndarray, max_grad_norm: float, noise_multiplier: float) -> int:
            """One DP-SGD step on inputs[batch], widened to float32 alone, then the moving average's
            update.

            Args:
              batch: the indices of the step's Poisson batch.
              max_grad_norm: C.
              noise_multiplier: σ.

            Returns:
              How many examples (persons) of the batch had a gradient norm ≤ C.
            """
            index = torch.from_numpy(batch)
            unclipped = dp_step(x[index].float(), y[index], max_grad_norm, noise_multiplier,
                                None if known is None else (known[0], known[1][index]),
                                step.persons_in(batch))
            optimizer.average.update(model)
            return unclipped

        return one_step

    def plain_step(self, model: nn.Module, optimizer: AveragingOptimizer, inputs: np.ndarray,
                   labels: np.ndarray):
        """See interface.Framework.plain_step."""
        x, y = as_tensor(inputs), torch.from_numpy(labels)
        plain_step = make_plain_step(model, optimizer.inner)
        model.train()

        def one_step(batch: np.ndarray) -> None:
            index = torch.from_numpy(batch)
            plain_step(x[index].float(), y[index])
            optimizer.average.update(model)

        return one_step

    def end_training(self, model: nn.Module, optimizer: AveragingOptimizer,
                     training: Training) -> None:
        """See interface.Framework.end_training."""
        optimizer.average.copy_to(model)

    def library_epsilon(self, sampling: SamplingPlan, delta: float, steps: int,
                        sigma: float) -> dict:
        """See interface.Framework.library_epsilon."""
        from opacus.accountants import PRVAccountant

        accountant = PRVAccountant()
        for _ in range(steps):  # as its optimizer hook records each step (equal ones as one entry)
            accountant.step(noise_multiplier=sigma, sample_rate=sampling.sample_rate)
        # its RDP domain bound warns ("Optimal order is the largest alpha")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {"Opacus PRV (this run only)": accountant.get_epsilon(delta)}

    load_model = staticmethod(model_from_bytes)
    dump_model = staticmethod(model_to_bytes)

    def weight_arrays(self, model: nn.Module) -> list[np.ndarray]:
        # The common layout (initial_weights.py) is torch's own state dict.
        return [t.detach().numpy().copy() for t in model.state_dict().values()]

    def set_weight_arrays(self, model: nn.Module, arrays: list[np.ndarray]) -> nn.Module:
        model.load_state_dict({name: torch.from_numpy(a) for name,
                               a in zip(model.state_dict(), arrays)})
        return model

    def batch_logits(self, model: nn.Module, inputs: np.ndarray) -> np.ndarray:
        model.eval()
        with torch.no_grad():
            return model(as_input(inputs)).numpy()

    def notices(self, hp: Hyperparameters) -> list:
        if hp.dp and hp.secure_mode and not has_torchcsprng():
            return ["secure_mode without torchcsprng: float-attack-resistant noise from a "
                    "generator seeded with 256 fresh bits, but PyTorch's is not a CSPRNG"]
        return []


FRAMEWORK = TorchOpacus()

if __name__ == "__main__":
    functions.run(FRAMEWORK, HYPERPARAMETERS)
