"""DP-SGD on MNIST with MindSpore 2.9 + MindArmour 2.0 on CPU, as Substra train / predict functions.

Only framework code lives here; the sampling plan, σ, the ledger and ε come from
`mnist_dp.learning.skeleton`. Run alone:  python assets/algo_mindspore_dp/algo.py --function-name
train --inputs '[...]' --outputs '[...]'

How the DP step works, and why not MindArmour's `DPModel` (it refuses device_target CPU, clips per
microbatch, expects fixed batches): exact per-example gradients from each layer's input and output
gradient (book-keeping, as the tf algo) in GRAPH mode, clipped and summed; Gaussian noise from
numpy's PCG64 (MindArmour's `NoiseGaussianRandom` repeats itself on CPU: docs/design.md);
MindArmour's `RDPMonitor` as a cross-check. The networks, built from their declaration, and their
clipped-sum graphs are in `networks.py` beside this file; the ScatterNet CNN's is made from what
MindSpore 2.9's CPU kernels run fast (its Conv2D does not; timings: docs/benchmarks.md).
"""
import contextlib
import io
import logging
import math
import os
import sys
from pathlib import Path

# Before MindSpore is imported: quiet its C++ log; protobuf's pure-Python
# implementation (docs/design.md).
os.environ.setdefault("GLOG_v", "3")
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import mindspore as ms
import numpy as np
from mindspore import nn, ops
from mindspore.train import RunContext

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# imported by a test or a benchmark: networks.py's folder
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import networks
from clipped_sums import ClippedGradientSum

from mnist_dp.hyperparameters import Training
from mnist_dp.learning import chunks, functions, interface, training
from mnist_dp.privacy import randomness
from mnist_dp.privacy.task_plan import SamplingPlan

HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")
# images in a chunk per person, about: its graph forms each row's gradient of every weight
PERSON_CHUNK = 512
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")


# --- 1. The DP step: exact per-example clipping in GRAPH mode, the noise, the optimizer
# -------------------------------

class MindArmourVersionWarning(logging.Filter):
    """Drops the warning MindArmour 2.0 logs at import, and its countdown: it predates MindSpore
    2.9, which runs it fine (docs/design.md)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith((
            "Current version of MindSpore is not compatible with MindArmour",
            "Please pay attention to the above warning"))


def import_mindarmour(name):
    """`name` from mindarmour.privacy.diff_privacy, imported without its version warning."""
    root, quiet = logging.getLogger(), MindArmourVersionWarning()
    root.addFilter(quiet)
    try:
        from mindarmour.privacy import diff_privacy
    finally:
        root.removeFilter(quiet)
    return getattr(diff_privacy, name)


def data_rows(net, images):
    """Each example's numbers that the clipped sum needs and no weight changes (networks.py), made
    once per task: [N, ...] float32 for a network with `data_rows`, else None."""
    return net.data_rows(images) if hasattr(net, "data_rows") else None


# The noise is numpy's PCG64: MindArmour's NoiseGaussianRandom has a 31-bit state and repeats its
# numbers within a task, which the accountant's independent steps do not allow (docs/design.md).

class NoisyUpdate(nn.Cell):
    """Adds noise to the clipped sum, divides by E[B], takes the step. One flat draw cut into the
    gradients' shapes, so no two gradients share their noise."""

    def __init__(self, optimizer, expected_batch_size):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        ends = np.cumsum([math.prod(p.shape) for p in optimizer.parameters]).tolist()
        self.bounds = tuple(zip([0] + ends[:-1], ends))
        self.shapes = tuple(tuple(p.shape) for p in optimizer.parameters)
        # The *expected* batch size, a constant as in Opacus: dividing by the realised size would
        # make the update depend on the data beyond what the mechanism accounts for.
        self.expected_batch_size = float(expected_batch_size)

    def construct(self, clipped_sum, noise, noise_std):
        """Add `noise` times `noise_std` to the clipped sum, divide by E[B], take the step.

        Args:
          clipped_sum: the batch's clipped sum, in the optimizer's parameter order.
          noise: unit Gaussian noise for every weight, flat (`unit_noise`).
          noise_std: σ·C of this step (the schedule and adaptive clipping change it between steps).
        Returns:
          What the optimizer returns."""
        noise = noise * noise_std
        noisy = ()
        for g, (start, end), shape in zip(clipped_sum, self.bounds, self.shapes):
            noisy += ((g + noise[start:end].reshape(shape)) / self.expected_batch_size,)
        return self.optimizer(noisy)


class ClippedNoisyUpdate(nn.Cell):
    """The last chunk's clipped sum (`clipped_sum`, a ClippedGradientSum's graph) plus the earlier
    chunks', noised and applied by `update` (a NoisyUpdate), in one graph. One graph call a step:
    two (a clipped sum, then an update) cost more."""

    def __init__(self, clipped_sum, update):
        super().__init__(auto_prefix=False)
        self.clipped_sum, self.update = clipped_sum, update

    def construct(self, carried, noise, noise_std, *chunk):
        """The last chunk's clipped sum plus `carried`, noised and applied.

        Args:
          carried: the clipped sum of the batch's earlier chunks.
          noise, noise_std: unit Gaussian noise for every weight, flat, and σ·C of this step.
          *chunk: the last chunk's graph inputs (ClippedGradientSum.inputs).
        Returns:
          How many of the chunk's examples had ‖g_i‖ ≤ C."""
        # the gradients' clipped sums, the unclipped count, the squared norms
        sums = self.clipped_sum(*chunk)
        gradients = ()
        for g, earlier in zip(sums[:-2], carried):
            gradients += (g + earlier,)
        # the count once the step is taken
        return ops.depend(sums[-2], self.update(gradients, noise, noise_std))


def unit_noise(rng, size, secure_mode):
    """One step's noise, float32.

    Args:
      rng: the run's "gradient noise" generator.
      size: how many numbers.
      secure_mode: draw them as Opacus' secure_mode does.
    Returns:
      `size` N(0, 1) numbers."""
    return randomness.standard_normal(rng, (size,), secure_mode, np.float32)


def make_dp_step(net, optimizer, expected_batch_size, rng, secure_mode=False, with_canaries=None,
                 persons=None):
    """One DP-SGD step; the last chunk clipped, summed, noised, applied in one ClippedNoisyUpdate.

    Args:
      net: the network, trained in place.
      optimizer: its optimizer (or AveragingOptimizer).
      expected_batch_size: E[B], which divides the noisy sum; it sets the chunk sizes too.
      rng: the run's "gradient noise" generator, which the noise comes from.
      secure_mode: draw the noise as Opacus' secure_mode does (`unit_noise`).
      with_canaries: the audit's DpStep.with_canaries, applied to the clipped sum, or None.
      persons: each image's person (DpStep.persons), to clip per person, or None: per example.
    Returns:
      `step(images, labels, batch, C, σ, rows)` (below)."""
    clipped_sum = ClippedGradientSum(net, optimizer.parameters, persons is not None)
    update = NoisyUpdate(optimizer, expected_batch_size)
    last_chunk_and_update = ClippedNoisyUpdate(clipped_sum.graph, update)
    size = sum(math.prod(p.shape) for p in optimizer.parameters)
    nothing = ms.mutable(tuple(ms.Tensor(np.zeros(p.shape, np.float32))
                               for p in optimizer.parameters))
    if persons is None:
        sizes = chunks.chunk_sizes(expected_batch_size)
    else:  # E[B] persons, a row each as long as the largest, PERSON_CHUNK images a chunk about
        slots = int(np.bincount(persons).max())
        sizes = chunks.chunk_sizes(min(expected_batch_size, max(1, PERSON_CHUNK // slots)))

    def step(images, labels, batch, max_grad_norm, noise_multiplier, rows=None):
        """Clip each gradient to C, sum the chunks, add N(0, σ²C²), divide by E[B], update.

        Args:
          images, labels: the network's inputs, as stored, and their labels, int32.
          batch: the indices of the step's examples in them.
          max_grad_norm, noise_multiplier: C and σ.
          rows: the images' data_rows, if the network has them (per example).
        Returns:
          How many examples (persons) had a gradient norm ≤ C."""
        if persons is None:
            parts = [clipped_sum.inputs(as_input(images[index]), ms.Tensor(labels[index]),
                                        ms.Tensor(mask), max_grad_norm,
                                        None if rows is None else rows[index])
                     for index, mask in chunks.padded_chunks(batch, sizes)]
        else:
            parts = [clipped_sum.inputs(as_input(images[index]), ms.Tensor(labels[index]),
                                        ms.Tensor(mask), max_grad_norm, None, person_mask)
                     for index, mask, person_mask in chunks.person_grids(batch, persons[batch],
                                                                         sizes, slots)]
        noise = ms.from_numpy(unit_noise(rng, size, secure_mode))
        # σ = 0: the mechanism tests
        noise_std = ms.Tensor(noise_multiplier * max_grad_norm, ms.float32)
        # the white-box audit's canaries (DpStep.with_canaries): the sum on the host
        if with_canaries is not None:
            gradients, unclipped = summed(parts)
            gradients = [ms.Tensor(g) for g in with_canaries([g.asnumpy() for g in gradients])]
            update(ms.mutable(tuple(gradients)), noise, noise_std)
            return unclipped
        # a batch above the larger chunk: about one step in 3,600 by default
        carried, unclipped = summed(parts[:-1])
        return unclipped + int(last_chunk_and_update(carried, noise, noise_std,
                                                     *parts[-1]).asnumpy())

    def summed(parts):
        """The clipped sums of chunks run through the clipped sum alone, and how many had ‖g_i‖ ≤ C
        (zeros and 0 for none). mutable: GRAPH mode takes a plain tuple for a constant and
        recompiles at every step."""
        total, unclipped = nothing, 0
        for inputs in parts:
            *sums, count, _ = clipped_sum.graph(*inputs)
            total = ms.mutable(tuple(a + b for a, b in zip(total, sums)))
            unclipped += int(count.asnumpy())
        return total, unclipped

    return step


def make_plain_step(net, optimizer):
    """The non-private step on images[batch]: mean loss, plain gradients (MindSpore's
    TrainOneStepCell)."""
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    train_step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)

    def step(images, labels, batch):
        """The non-private step on images[batch]: mean loss, plain gradients.

        Args:
          images, labels: the network's inputs, as stored, and their labels, int32.
          batch: the indices of the step's examples in them.
        Returns:
          TrainOneStepCell's output: the batch's mean loss."""
        return train_step(as_input(images[batch]), ms.Tensor(labels[batch]))

    return step


def new_optimizer(net, training: Training):
    if training.optimizer == "adam":
        return nn.Adam(net.trainable_params(), learning_rate=training.learning_rate)
    return nn.SGD(net.trainable_params(), learning_rate=training.learning_rate,
                  momentum=training.momentum)


class MovingAverage(nn.Cell):
    """A moving average of the weights after every step, put in the net by `copy_to`:
    post-processing, free."""

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


class AveragingOptimizer(nn.Cell):
    """`optimizer`'s step, then `average`'s (a MovingAverage), in the step's graph, as Keras'
    `use_ema` in the tf algo: called as a graph of its own, the average cost more a step."""

    def __init__(self, optimizer, average):
        super().__init__(auto_prefix=False)
        self.optimizer, self.average = optimizer, average
        self.parameters = optimizer.parameters  # what the steps read of an optimizer

    def construct(self, gradients):
        stepped = self.optimizer(gradients)
        return ops.depend(self.average(), stepped)  # after the step: it averages the new weights


class CallbackParams(dict):
    """A run's state as a MindSpore callback reads it: a dict read by attribute, as `Model` fills
    the `RunContext` it passes."""

    __getattr__ = dict.__getitem__


def mindarmour_epsilon(n, sample_rate, noise_multiplier, steps, delta):
    """MindArmour's RDPMonitor figure for this run, through its documented callback: one
    `step_end` at the run's end, which composes a print interval's steps and one more, and prints ε.

    Args:
      n: the training examples.
      sample_rate: q; the monitor's batch is round(n·q), at least 1.
      noise_multiplier, steps, delta: σ, the steps taken (two at least), δ.
    Returns:
      ε at δ, above our RDP's; NaN when the batch is n or more."""
    RDPMonitor = import_mindarmour("RDPMonitor")
    batch = max(1, round(n * sample_rate))
    if batch >= n:
        return float("nan")
    interval = steps - 1  # step_end composes the interval's steps and one more: `steps` in all
    monitor = RDPMonitor(num_samples=n, batch_size=batch, initial_noise_multiplier=noise_multiplier,
                         max_eps=1e9, target_delta=delta, noise_decay_mode=None,
                         per_print_times=interval)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        monitor.step_end(RunContext(CallbackParams(
            cur_step_num=interval, batch_num=interval, cur_epoch_num=1)))
    return float(printed.getvalue().rsplit("eps is ", 1)[1])


# --- 2. Model I/O: inputs as the network takes them, weights as bytes
# -----------------------------------------------

def as_input(inputs) -> ms.Tensor:
    """A tensor as the network takes it: images with a channel axis (NCHW). The networks widen
    float16 features (features.py) to float32 in their graph: a cast outside it is a PyNative op,
    slower. `from_numpy` shares the array's memory, where `ms.Tensor` copies it."""
    return ms.from_numpy(np.ascontiguousarray(inputs[:, None] if inputs.ndim == 3 else inputs))


def model_to_bytes(model) -> bytes:
    """The parameters as an .npz, by name."""
    buffer = io.BytesIO()
    np.savez(buffer, **{p.name: p.asnumpy() for p in model.get_parameters()})
    return buffer.getvalue()


def model_from_bytes(weights: bytes, network):
    """The network `network` names with the parameters of `model_to_bytes` (every one, no
    pickle)."""
    net = networks.build_network(network)
    with np.load(io.BytesIO(weights), allow_pickle=False) as arrays:
        params = {name: ms.Parameter(ms.Tensor(arrays[name]), name=name) for name in arrays.files}
    not_loaded, _ = ms.load_param_into_net(net, params, strict_load=True)
    if not_loaded:
        raise ValueError(f"parameters {not_loaded} missing")
    return net


# --- 3. The Framework object: what the skeleton calls
# ---------------------------------------------------------------

class MindSporeMindArmour(interface.Framework):
    name = "mindspore"
    per_person = True
    # GRAPH mode compiles once per input shape: 1000 cuts a test set of 10,000
    # images into equal batches.
    predict_batch_size = 1000

    def network(self, network: interface.Network) -> nn.Cell:
        return networks.build_network(network)

    def optimizer(self, model: nn.Cell, training: Training) -> nn.Cell:
        optimizer = new_optimizer(model, training)
        if training.ema_decay:  # every step then updates the average too
            optimizer = AveragingOptimizer(
                optimizer, MovingAverage(model.trainable_params(), training.ema_decay))
        return optimizer

    def dp_step(self, model: nn.Cell, optimizer: nn.Cell, inputs: np.ndarray, labels: np.ndarray,
                step: training.DpStep):
        """See interface.Framework.dp_step."""
        model.set_train(True)
        labels = labels.astype(np.int32)
        dp_step = make_dp_step(model, optimizer, step.expected_batch_size,
                               step.randomness.numpy("gradient noise"), step.secure_mode,
                               step.canary_hook, step.persons)
        # kept in memory as the features, never written; per example only
        rows = data_rows(model, inputs) if step.persons is None else None
        return lambda batch, max_grad_norm, noise_multiplier: dp_step(
            inputs, labels, batch, max_grad_norm, noise_multiplier, rows)

    def plain_step(self, model: nn.Cell, optimizer: nn.Cell, inputs: np.ndarray,
                   labels: np.ndarray):
        """See interface.Framework.plain_step."""
        model.set_train(True)
        labels = labels.astype(np.int32)
        plain_step = make_plain_step(model, optimizer)
        return lambda batch: plain_step(inputs, labels, batch)

    def end_training(self, model: nn.Cell, optimizer: nn.Cell, training: Training) -> None:
        """See interface.Framework.end_training."""
        if isinstance(optimizer, AveragingOptimizer):
            optimizer.average.copy_to()
        model.set_train(False)

    def library_epsilon(self, sampling: SamplingPlan, delta: float, steps: int,
                        sigma: float) -> dict:
        """See interface.Framework.library_epsilon; none for one step (the monitor counts two)."""
        return {} if steps < 2 else {"MindArmour RDPMonitor (this run only)": mindarmour_epsilon(
            sampling.n, sampling.sample_rate, sigma, steps, delta)}

    load_model = staticmethod(model_from_bytes)
    dump_model = staticmethod(model_to_bytes)

    def weight_arrays(self, model: nn.Cell) -> list[np.ndarray]:
        return [p.asnumpy() for p in model.get_parameters()]

    def set_weight_arrays(self, model: nn.Cell, arrays: list[np.ndarray]) -> nn.Cell:
        parameters = list(model.get_parameters())
        # set_data would take any shape
        interface.check_shapes(arrays, [p.shape for p in parameters])
        for parameter, array in zip(parameters, arrays):
            parameter.set_data(ms.Tensor(array))
        return model

    def batch_logits(self, model: nn.Cell, inputs: np.ndarray) -> np.ndarray:
        model.set_train(False)
        return model(as_input(inputs)).asnumpy()


FRAMEWORK = MindSporeMindArmour()

if __name__ == "__main__":
    functions.run(FRAMEWORK, HYPERPARAMETERS)
