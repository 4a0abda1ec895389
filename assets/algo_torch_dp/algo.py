"""DP-SGD on MNIST with PyTorch + Opacus, as Substra train / predict functions (substratools 1.0).

Only framework code lives here; the sampling plan, σ, the ledger and ε come from the skeleton,
`mnist_dp.learning.skeleton`.
Run alone:  python assets/algo_torch_dp/algo.py --function-name train --inputs '[...]' --outputs '[...]'
"""
import io
import logging
import os
import struct
import sys
import warnings
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")  # see docs/design.md: before any framework

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mnist_dp.learning import features, interface, skeleton
from mnist_dp.learning.interface import MNIST_MEAN, MNIST_STD

HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")

# Opacus computes per-example gradient norms by "ghost clipping" (two backward passes, no per-example
# gradient tensors): the fastest mode on this CPU (see benchmarks/benchmark.py). Still exact
# per-example clipping, so the accounting is unchanged. "hooks" is Opacus' default (timed by the benchmark
# on its own); `fit` unpacks what make_private returns in ghost mode (the DP loss too).
GRAD_SAMPLE_MODE = "ghost"

# Known, harmless Opacus noise: the secure-RNG reminder (secure_mode is an explicit choice) and a
# PyTorch note about ghost clipping's backward hooks on inputs that need no gradient.
warnings.filterwarnings("ignore", message="Secure RNG turned off")
warnings.filterwarnings("ignore", message="Full backward hook is firing")
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
    learnt scale: nothing to clip) before its activation. The shortcut starts at zero, so training starts from the
    CNN alone; each change gave about +0.4 points on Fashion-MNIST (docs/benchmarks.md)."""

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
        nn.init.zeros_(self.shortcut.weight)

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
    linear classifier (zero weights at the start, as in every framework: the problem is convex, so nothing is
    lost)."""
    if network.features == "pixels":
        return SampleConvNet(network.activation)
    if network.network == "cnn":
        return ScatterConvNet(network.activation)
    model = nn.Linear(features.SCATTERING_DIM, 10)  # [B, 3969] -> [B, 10] logits
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


# --- 2. The DP step: Opacus' per-example clipping (with a Conv2d norm sampler) and noise, the optimizer -------------

def conv_example_gradients(layer: nn.Conv2d, inputs: torch.Tensor, out_grads: torch.Tensor) -> torch.Tensor:
    """Each example's kernel gradient [B, out, in·kh·kw] of a Conv2d (groups 1, dilation 1, zero padding)
    from its input [B, in, H, W] and the gradient of its output [B, out, H', W']."""
    batch, channels = inputs.shape[:2]
    if channels == 1:
        # One convolution with the batch as groups: each example's input correlated with its own output
        # gradient, dilated by the stride. 3.5 ms for our first layer on 500 images, against 9 ms for
        # patches (im2col) and a batched product, which stay the faster way with many input channels.
        kernels = F.conv2d(inputs.reshape(1, batch, *inputs.shape[2:]),
                           out_grads.reshape(batch * layer.out_channels, 1, *out_grads.shape[2:]),
                           padding=layer.padding, dilation=layer.stride, groups=batch)
        kh, kw = layer.kernel_size  # a stride that does not divide the span leaves extra rows: cut
        return kernels[:, :, :kh, :kw].reshape(batch, layer.out_channels, -1)
    patches = F.unfold(inputs, layer.kernel_size, layer.dilation, layer.padding, layer.stride)  # [B, K, P]
    return torch.bmm(out_grads.flatten(2), patches.transpose(1, 2))


def conv2d_norm_sample(layer: nn.Conv2d, activations: list, backprops: torch.Tensor) -> dict:
    """Opacus norm sampler for nn.Conv2d (Opacus ships them for Linear and Embedding only, so ghost
    clipping fell back to its per-example gradient sampler): each example's gradient norm per parameter."""
    from opacus.grad_sample.conv import compute_conv_grad_sample

    inputs = activations[0]
    if len(inputs) == 0:  # an empty Poisson batch: no example, no norm
        return {param: inputs.new_zeros(0) for param in (layer.weight, layer.bias) if param is not None}
    if (layer.groups != 1 or layer.dilation != (1, 1) or layer.padding_mode != "zeros"
            or isinstance(layer.padding, str)):
        gradients = compute_conv_grad_sample(layer, activations, backprops)  # Opacus' own, general
        return {param: g.flatten(1).norm(2, dim=1) for param, g in gradients.items()}
    norms = {layer.weight: conv_example_gradients(layer, inputs, backprops).flatten(1).norm(2, dim=1)}
    if layer.bias is not None:
        norms[layer.bias] = backprops.sum((2, 3)).norm(2, dim=1)
    return norms


def register_conv2d_norm_sampler():
    from opacus.grad_sample.utils import register_norm_sampler

    register_norm_sampler(nn.Conv2d)(conv2d_norm_sample)


def noise_generator(randomness) -> torch.Generator:
    """A torch generator whose whole Mersenne Twister state (624 words) comes from the run's randomness:
    `manual_seed` takes 64 bits, fewer than a fresh run's 256. torch's CPU generator state is a fixed layout
    (int64 seed, int left, int seeded, uint64 next, uint64 state[624], then cached normals, cleared here);
    left = 1 makes the first draw twist the whole state."""
    generator = torch.Generator()
    state = bytearray(generator.get_state().numpy().tobytes())
    header, words = struct.calcsize("<qiiQ"), randomness.words("gradient noise", 624).astype("<u8").tobytes()
    state[:header] = struct.pack("<qiiQ", 0, 1, 1, 0)
    state[header:header + len(words)] = words
    state[header + len(words):] = bytes(len(state) - header - len(words))
    generator.set_state(torch.frombuffer(state, dtype=torch.uint8).clone())
    return generator


def has_torchcsprng() -> bool:
    """Opacus' full secure_mode draws everything from torchcsprng (a CSPRNG); it has no torch 2.x release."""
    import importlib.util

    return importlib.util.find_spec("torchcsprng") is not None


def new_optimizer(model, hp):
    if hp.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=hp.learning_rate)
    return torch.optim.SGD(model.parameters(), lr=hp.learning_rate, momentum=hp.momentum)


class EMA:
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


# --- 3. Model I/O: inputs as the network takes them, weights as bytes -----------------------------------------------

def as_tensor(inputs):
    """Inputs as the network takes them: images [N, 28, 28] get their channel axis, features stay [N, 3969]."""
    return torch.from_numpy(inputs[:, None] if inputs.ndim == 3 else inputs)


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

class TorchOpacus:
    name = "torch"

    def new_model(self, seed, network):
        torch.manual_seed(seed)
        return build_network(network)

    # Model I/O is section 3's (weights that are not a state dict: see skeleton.load_weights).
    load_model = staticmethod(model_from_bytes)
    dump_model = staticmethod(model_to_bytes)

    def fit(self, model, images, labels, hp, plan, step, batches):
        inputs, targets = as_tensor(images), torch.from_numpy(labels)
        optimizer = new_optimizer(model, hp)
        criterion = nn.CrossEntropyLoss()
        average = EMA(model, hp.ema_decay)  # before make_private: a copy without Opacus' hooks
        engine, train_model = None, model
        if hp.dp:
            from opacus import PrivacyEngine

            register_conv2d_norm_sampler()
            engine = PrivacyEngine(accountant="prv", secure_mode=hp.secure_mode and has_torchcsprng())
            # Opacus takes q from the loader (1 / its length), but trains on the skeleton's Poisson batches:
            # its own sampler (poisson_sampling=True) runs int(1/q) steps an epoch, one fewer for some q.
            loader = DataLoader(TensorDataset(inputs, targets), batch_size=hp.batch_size)
            train_model, optimizer, criterion, loader = engine.make_private(
                module=model, optimizer=optimizer, criterion=criterion, data_loader=loader,
                noise_multiplier=step.noise.sigma, max_grad_norm=hp.max_grad_norm,
                poisson_sampling=False, grad_sample_mode=GRAD_SAMPLE_MODE,
                noise_generator=None if engine.secure_mode else noise_generator(step.randomness),
            )
            if abs(1 / len(loader) - plan.sample_rate) > 1e-12:  # the ledger would not match the training
                raise RuntimeError(f"Opacus accounts q={1 / len(loader)}, the plan says {plan.sample_rate}")
            optimizer.expected_batch_size = plan.expected_batch_size  # Opacus' int(n·q) may round it down
            # Without torchcsprng, secure_mode keeps Opacus' floating-point-attack-resistant noise sampling.
            optimizer.secure_mode = hp.secure_mode
            if hp.secure_mode and not engine.secure_mode:
                skeleton.log.warning("secure_mode without torchcsprng: float-attack-resistant noise from a generator "
                                     "seeded with 256 fresh bits, but PyTorch's generator is not a CSPRNG")

        model.train()
        batch_sizes = []
        for batch in batches:
            if hp.dp:  # the schedule's σ and the clipping norm of this step
                optimizer.noise_multiplier = step.noise.gradient_sigma(len(batch_sizes))
                train_model.max_grad_norm = optimizer.max_grad_norm = step.clip.value  # clipping, noise std
            index = torch.from_numpy(batch)
            optimizer.zero_grad()
            loss = criterion(train_model(inputs[index]), targets[index])
            loss.backward()
            optimizer.step()
            if step.clip.adaptive:  # the count is read only for adaptive clipping (a sync per step otherwise)
                step.clip.update(int((train_model.per_sample_gradient_norms <= step.clip.value).sum()), len(batch))
            average.update(model)
            batch_sizes.append(len(batch))
        average.copy_to(model)
        library = {}
        if engine is not None and step.library_can_account:
            library["Opacus PRV (this run only)"] = engine.get_epsilon(hp.delta)
        return interface.Ran(batch_sizes, library)

    def weight_arrays(self, model):
        return [t.detach().numpy().copy() for t in model.state_dict().values()]

    def set_weight_arrays(self, model, arrays):
        model.load_state_dict({name: torch.from_numpy(a) for name, a in zip(model.state_dict(), arrays)})
        return model

    def batch_logits(self, model, images):
        model.eval()
        with torch.no_grad():
            return model(as_tensor(images)).numpy()


FRAMEWORK = TorchOpacus()

if __name__ == "__main__":
    skeleton.run_functions(FRAMEWORK, HYPERPARAMETERS)  # substratools' `train` and `predict`
