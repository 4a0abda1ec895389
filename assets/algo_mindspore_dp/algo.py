"""DP-SGD on MNIST with MindSpore 2.9 + MindArmour 2.0 on CPU, as Substra train / predict functions.

Only framework code lives here; the sampling plan, σ, the ledger and ε come from `mnist_dp.training`.
Run alone:  python assets/algo_mindspore_dp/algo.py --function-name train --inputs '[...]' --outputs '[...]'

Why not MindArmour's `DPModel`: it refuses device_target CPU, clips per microbatch (per-example only
with one example per microbatch, a 229 s compile) and expects shuffled fixed batches. The DP step is
therefore written here, in GRAPH mode: exact per-example gradients with `vmap` over `grad`, clipped
to C, summed, and MindArmour's `NoiseGaussianRandom` (std σ·C) added once per step. MindArmour's
`RDPMonitor` recomputes ε for this run as a cross-check (see `mindarmour_epsilon`).
"""
import io
import logging
import os
import secrets
import sys
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

from mnist_dp import training
from mnist_dp.errors import UserError
from mnist_dp.training import MNIST_MEAN, MNIST_STD

HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


def import_mindarmour():
    """MindArmour 2.0 warns (and sleeps 1 s) at import because it predates MindSpore 2.9; its noise
    and monitor code work with 2.9 (tests check the noise). Keep the version warning off the user's
    screen; the sleep cannot be avoided."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        from mindarmour.privacy.diff_privacy import NoiseGaussianRandom, RDPMonitor
    finally:
        logging.disable(previous)
    return NoiseGaussianRandom, RDPMonitor


class SampleConvNet(nn.Cell):
    """The TF Privacy / Opacus tutorial CNN (26,010 parameters), the same network as the other algos."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, stride=2, pad_mode="pad", padding=3, has_bias=True)
        self.conv2 = nn.Conv2d(16, 32, 4, stride=2, pad_mode="valid", has_bias=True)
        self.pool = nn.MaxPool2d(2, 1)
        self.fc1 = nn.Dense(32 * 4 * 4, 32)
        self.fc2 = nn.Dense(32, 10)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()

    def construct(self, x):
        # x: [B, 1, 28, 28] in [0, 1]
        x = (x - MNIST_MEAN) / MNIST_STD
        x = self.pool(self.relu(self.conv1(x)))  # -> [B, 16, 14, 14] -> [B, 16, 13, 13]
        x = self.pool(self.relu(self.conv2(x)))  # -> [B, 32, 5, 5] -> [B, 32, 4, 4]
        x = self.relu(self.fc1(self.flatten(x)))  # -> [B, 512] -> [B, 32]
        return self.fc2(x)  # -> [B, 10] logits


# Poisson batches vary in size and GRAPH mode compiles once per input shape, so a batch is cut into
# chunks of one fixed size (padding masked out). vmap's graph grows with the chunk: past ~500 examples
# it exceeds MindSpore's call-depth limit, so chunks stay at 256.
CHUNK_SIZE = 256


class ClippedGradientSum(nn.Cell):
    """Σ_i mask_i · min(1, C / ‖g_i‖) · g_i over one chunk, from exact per-example gradients.

    (GRAPH mode compiles Cells reliably; jitted closures hit the compiler's recursion limit.)
    """

    def __init__(self, net, weights, max_grad_norm):
        super().__init__(auto_prefix=False)
        self.net = net
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum")
        self.max_grad_norm = float(max_grad_norm)
        self.per_example_grads = ms.vmap(ms.grad(self.example_loss, grad_position=None, weights=weights),
                                         in_axes=(0, 0))

    def example_loss(self, x, y):
        return self.loss(self.net(x[None]), y[None])

    def construct(self, x, y, mask):
        grads = self.per_example_grads(x, y)  # one [chunk, *shape] tensor per parameter
        sqr_norms = sum(ops.sum(ops.square(g.reshape(g.shape[0], -1)), 1) for g in grads)
        weight = ops.minimum(1.0, self.max_grad_norm / ops.maximum(ops.sqrt(sqr_norms), 1e-12)) * mask
        return tuple(ops.tensor_dot(weight, g, ((0,), (0,))) for g in grads)


class NoisyUpdate(nn.Cell):
    """Add MindArmour's Gaussian noise (std σ·C) to the clipped sum, divide by E[B], take the step."""

    def __init__(self, optimizer, max_grad_norm, noise_multiplier, expected_batch_size, seed):
        super().__init__(auto_prefix=False)
        NoiseGaussianRandom, _ = import_mindarmour()
        self.optimizer = optimizer
        # MindArmour draws fresh noise at every call; its seed 0 selects its "secure" random source (seed
        # None here). σ = 0 (no noise, clipping only) serves the mechanism tests; MindArmour refuses it.
        self.noise = (NoiseGaussianRandom(float(max_grad_norm), float(noise_multiplier),
                                          seed=0 if seed is None else seed + 1)
                      if noise_multiplier > 0 else None)
        # The *expected* batch size, a constant as in Opacus: dividing by the realised size would make
        # the update depend on the data beyond what the mechanism accounts for.
        self.expected_batch_size = float(expected_batch_size)

    def construct(self, clipped_sum):
        if self.noise is None:
            return self.optimizer(tuple(g / self.expected_batch_size for g in clipped_sum))
        return self.optimizer(tuple((g + self.noise(g)) / self.expected_batch_size for g in clipped_sum))


def make_plain_step(net, optimizer):
    """The non-private step: mean loss over the batch, plain gradients."""
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)


def mindarmour_epsilon(n, sample_rate, noise_multiplier, steps, delta):
    """MindArmour's RDPMonitor figure for this run, computed once for all steps.

    Its step_end callback counts one extra step per print (arange(cur - k, cur + 1)), so we call its
    accountant directly. It uses a sparse list of RDP orders, so it is above our RDP figure."""
    _, RDPMonitor = import_mindarmour()
    batch = max(1, round(n * sample_rate))
    if batch >= n:
        return float("nan")
    monitor = RDPMonitor(num_samples=n, batch_size=batch, initial_noise_multiplier=noise_multiplier,
                         max_eps=1e9, target_delta=delta, noise_decay_mode=None, per_print_times=max(steps, 1))
    return float(monitor._compute_privacy_steps(list(range(steps)))[0])


def padded_chunks(indices, size):
    """Yield (indices padded to `size`, mask) covering `indices` (at least one chunk, maybe empty)."""
    for start in range(0, max(len(indices), 1), size):
        part = indices[start : start + size]
        mask = np.zeros(size, np.float32)
        mask[: len(part)] = 1
        yield np.concatenate([part, np.zeros(size - len(part), part.dtype)]), mask


class MindSporeMindArmour:
    name = "mindspore"
    # GRAPH mode compiles once per input shape: 1000 cuts a test set of 10,000 images into equal batches.
    predict_batch_size = 1000

    def new_model(self, seed):
        ms.set_seed(seed)
        return SampleConvNet()

    def load_model(self, weights):
        net = SampleConvNet()
        try:
            with np.load(io.BytesIO(weights), allow_pickle=False) as arrays:
                params = {name: ms.Parameter(ms.Tensor(arrays[name]), name=name) for name in arrays.files}
        except (OSError, ValueError) as exc:
            raise UserError(f"model weights are not this CNN's MindSpore parameters ({exc})") from None
        not_loaded, _ = ms.load_param_into_net(net, params, strict_load=True)
        if not_loaded:
            raise UserError(f"model weights lack parameters {not_loaded}")
        return net

    def dump_model(self, net):
        buffer = io.BytesIO()
        np.savez(buffer, **{p.name: p.asnumpy() for p in net.get_parameters()})
        return buffer.getvalue()

    def fit(self, net, images, labels, hp, plan, noise_multiplier, on_epoch):
        # With a global seed set, MindSpore derives even seed-0 ("secure") ops' seeds from it: secure_mode
        # must not set a replayable one.
        ms.set_seed(secrets.randbits(31) if hp.secure_mode else hp.seed)
        optimizer = nn.SGD(net.trainable_params(), learning_rate=hp.learning_rate, momentum=hp.momentum)
        net.set_train(True)
        images, labels = images[:, None], labels.astype(np.int32)
        if hp.dp:
            add_chunk = ClippedGradientSum(net, optimizer.parameters, hp.max_grad_norm)
            # secure_mode: MindArmour's own option, seed 0 ("secure random number": a fresh random seed per run)
            apply = NoisyUpdate(optimizer, hp.max_grad_norm, noise_multiplier, plan.n * plan.sample_rate,
                                None if hp.secure_mode else hp.seed)
        else:
            plain_step = make_plain_step(net, optimizer)
        batch_sizes = []
        for batch in training.sampled_batches(plan, hp, on_epoch, self.name):
            if hp.dp:
                total = None
                for index, mask in padded_chunks(batch, CHUNK_SIZE):
                    part = add_chunk(ms.Tensor(images[index]), ms.Tensor(labels[index]), ms.Tensor(mask))
                    total = part if total is None else tuple(a + b for a, b in zip(total, part))
                apply(total)
            else:
                plain_step(ms.Tensor(images[batch]), ms.Tensor(labels[batch]))
            batch_sizes.append(len(batch))
        net.set_train(False)
        library = {}
        if hp.dp and noise_multiplier > 0:  # MindArmour has no ε for a run without noise
            library["MindArmour RDPMonitor (this run only)"] = mindarmour_epsilon(
                plan.n, plan.sample_rate, noise_multiplier, len(batch_sizes), hp.delta)
        return training.Ran(batch_sizes, library)

    def flat_weights(self, net):
        return np.concatenate([p.asnumpy().ravel() for p in net.trainable_params()])

    def batch_logits(self, net, images):
        net.set_train(False)
        return net(ms.Tensor(images[:, None])).asnumpy()


FRAMEWORK = MindSporeMindArmour()

if __name__ == "__main__":
    training.run_functions(FRAMEWORK, HYPERPARAMETERS)  # substratools' `train` and `predict`
