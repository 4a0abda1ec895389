"""DP-SGD on MNIST with TensorFlow 2.15 + TensorFlow Privacy, as Substra train / predict functions.

Only framework code lives here; the sampling plan, σ, the ledger and ε come from
`mnist_dp.learning.skeleton`. Run alone:  python assets/algo_tf_dp/algo.py --function-name train
--inputs '[...]' --outputs '[...]'

How the DP step works, and why not TF Privacy's Keras DP optimizers: their per-example gradients
through Conv2D (vectorized_map) are far slower than a plain step on a CPU (docs/design.md). Instead
we use TF Privacy's *fast gradient clipping*: exact per-example norms from each layer's inputs and
output gradients (its layer registry, with `conv2d_layer_computation` for the Conv2D it lacks),
clip weights min(1, C / norm_i), the clipped sum from the same tape (`clipped_gradient_sum`), and
Gaussian noise from a `tf.random.Generator` whose whole Philox state (192 bits) comes from the
run's fresh entropy: TF Privacy's `add_aggregate_noise` draws from `tf.random.normal`, whose seeds
TensorFlow cuts to 31 bits (or takes 32 bits of process entropy). The networks, and each example's
gradient norm under them, are in `tf_networks.py` beside this file.
"""
import functools
import io
import logging
import os
import sys
from pathlib import Path

# Before TensorFlow is imported: quiet its C++ start-up log. Protobuf's pure-Python implementation
# wherever MindSpore may join TensorFlow in the process (docs/design.md); a task runs TensorFlow
# alone, on protobuf's compiled one.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if __name__ == "__main__":
    os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "upb"
else:
    os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import numpy as np
import tensorflow as tf

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# imported by a test or a benchmark: tf_networks.py's folder
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

# not networks.py: MindSpore's algo imports its own, and a process may import all three algos
from tf_networks import (
    build_network,
    data_grams,
    flattened_map,
    from_common,
    make_layer_registry,
    on_pixels,  # noqa: F401 - whether a model takes images, for the tests
    to_common,
)

from mnist_dp.hyperparameters import Training
from mnist_dp.learning import functions, interface, training
from mnist_dp.privacy.task_plan import SamplingPlan

tf.get_logger().setLevel(logging.ERROR)
HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")


# --- 1. The DP step: per-example clipping by TF Privacy's fast gradient clipping, noise -----------

def clipped_gradient_sum(model, registry, x, y, max_grad_norm, groups=None):
    """The clipped gradient sum Σ_i min(1, C / ‖g_i‖) g_i of a batch, with one forward and one
    backward pass. TF Privacy's `compute_clipped_gradients_and_outputs` does this with a second
    forward and backward pass of a re-weighted loss. We use the same TF Privacy parts
    (`model_forward_pass` with the registry generator, registry norm functions,
    `compute_clip_weights`) but keep the tape: the gradient of Σ_i w_i ℓ_i w.r.t. a layer's
    pre-activation output Z is w_i times that of Σ_i ℓ_i, so each layer's weight gradient is one
    vector-Jacobian product from Z ("book-keeping", Bu et al. 2023).

    Args:
      model: the compiled Keras model (its loss summed over the batch).
      registry: TF Privacy's layer registry (make_layer_registry).
      x: the batch's inputs.
      y: their labels.
      max_grad_norm: C.
      groups: each example's person [B] when the registry's norms are per person (each person's
        examples then share their person's clip weight), else None.

    Returns:
      (the clipped sum, in `model.trainable_variables` order; the gradient norms before clipping,
      per example [B] or per person [P]).
    """
    from tensorflow_privacy.privacy.fast_gradient_clipping import (
        clip_grads,
        gradient_clipping_utils,
    )

    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(model.trainable_variables)
        generator = clip_grads.get_registry_generator_fn(tape, registry)
        logits, layers = gradient_clipping_utils.model_forward_pass(model, x, generator)
        summed_loss = model.loss(y, logits)  # reduction SUM: Σ_i ℓ_i
    layers = [layer for layer in layers if layer is not None]  # layers without weights yield None
    base_grads = tape.gradient(summed_loss, [layer[0] for layer in layers])
    norms = tf.sqrt(tf.add_n([sqr_norm_fn(g) for (_, sqr_norm_fn, _),
                              g in zip(layers, base_grads)]))
    clip_weights = clip_grads.compute_clip_weights(max_grad_norm, norms)  # min(1, C/‖g_i‖)
    if groups is not None:
        clip_weights = tf.gather(clip_weights, groups)
    grads = {}
    for (base, _, weights), g in zip(layers, base_grads):
        scaled = g * tf.reshape(clip_weights, [-1] + [1] * (len(g.shape) - 1))
        for weight, grad in zip(weights, tape.gradient(base, weights, output_gradients=scaled)):
            grads[weight.ref()] = grad
    del tape
    if len(grads) != len(model.trainable_variables):
        raise RuntimeError("a trainable layer escaped per-example clipping")
    return [grads[v.ref()] for v in model.trainable_variables], norms


def noise_generator(randomness):
    """A Philox generator (128-bit counter, 64-bit key) whose whole state comes from the run's
    randomness."""
    state = randomness.words("gradient noise", 3, np.uint64).view(np.int64)
    return tf.random.Generator.from_state(state, alg="philox")


SCALAR = tf.TensorSpec([], tf.float32)
# A step's graph traced as plain Python (no control flow on a tensor's value), not by AutoGraph.
graph = functools.partial(tf.function, autograph=False)


def batch_spec(model):
    """The (inputs, labels) signature of a training step: the model's input shape, any batch
    size."""
    return tf.TensorSpec([None, *model.input_shape[1:]], tf.float32), tf.TensorSpec([None],
                         tf.int64)


def make_dp_step(model, optimizer, expected_batch_size, generator, with_canaries=None,
                 known_layer=None, per_person=False):
    """One DP-SGD step.

    Args:
      model: the compiled Keras model, trained in place.
      optimizer: its Keras optimizer.
      expected_batch_size: E[B], which divides the noisy sum.
      generator: the tf.random.Generator the noise is drawn from.
      with_canaries: the white-box audit's DpStep.with_canaries, called between the clipping and the
        noise (the step is then two graphs); None: no canaries.
      known_layer: data_grams' Conv2D, whose norms come from `rows`, the batch's rows of its patch
        Grams (given at every step exactly when known_layer is), or None.
      per_person: clip each person's summed gradient (the step then takes the batch's `persons`).

    Returns:
      `step(x, y, C, σ, rows=None, persons=None)`: clips each example's (person's) gradient to C,
      sums, adds N(0, σ²C²) drawn from `generator`, divides by E[B], and returns how many examples
      (persons) had a gradient norm ≤ C (adaptive clipping's count, before noise). An empty batch's
      step adds the noise alone. `persons`: the batch's units.BatchPersons, exactly when
      per_person.
    """
    def noisy_update(clipped_sum, max_grad_norm, noise_multiplier):
        """Add N(0, σ²C²) to the clipped sum, divide by E[B], apply the optimizer.

        Args:
          clipped_sum: the clipped sum, in `model.trainable_variables` order.
          max_grad_norm: C.
          noise_multiplier: σ.
        """
        noisy_sum = [g + generator.normal(tf.shape(g), stddev=noise_multiplier * max_grad_norm)
                     for g in clipped_sum]
        # Divide by the *expected* batch size (a constant, as Opacus does): dividing by the realised
        # size would make the update depend on the data beyond what the mechanism accounts for.
        optimizer.apply_gradients([(g / expected_batch_size, v) for g,
                                   v in zip(noisy_sum, model.trainable_variables)])

    def clip(x, y, max_grad_norm, *extra):
        """The batch's clipped sum (clipped_gradient_sum).

        Args:
          x: the batch's inputs.
          y: their labels.
          max_grad_norm: C.
          *extra: `given`'s tensors: the batch's persons, or rows of known_layer's patch Grams.

        Returns:
          (the clipped sum, how many examples (persons) had a gradient norm ≤ C).
        """
        registry = make_layer_registry(persons=extra) if per_person else make_layer_registry(
            None if known_layer is None else (known_layer, *extra))
        clipped_sum, norms = clipped_gradient_sum(model, registry, x, y, max_grad_norm,
                                                  extra[0] if per_person else None)
        return clipped_sum, tf.reduce_sum(tf.cast(norms <= max_grad_norm, tf.int32))

    def nothing_clipped(x, y, max_grad_norm, *extra):
        """An empty Poisson batch's clipped sum: zeros (Keras' Conv2D fails on 0 examples); its
        noise is a step.

        Args:
          x: the empty batch's inputs (unused).
          y: their labels (unused).
          max_grad_norm: C (unused).
          *extra: `given`'s tensors (unused).

        Returns:
          (zeros shaped as each trainable variable, 0).
        """
        return [tf.zeros_like(v) for v in model.trainable_variables], tf.constant(0, tf.int32)

    extra_spec = ((tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, None], tf.int64))
                  if per_person
                  else (tf.TensorSpec([None, None], tf.float32),))

    def step_of(clipped):
        @graph(input_signature=(*batch_spec(model), SCALAR, SCALAR, *extra_spec))
        def step(x, y, max_grad_norm, noise_multiplier, *extra):
            """One compiled step: the clipped sum, noised and applied.

            Args:
              x: the batch's inputs.
              y: their labels.
              max_grad_norm: C.
              noise_multiplier: σ.
              *extra: `given`'s tensors.

            Returns:
              How many examples (persons) had a gradient norm ≤ C.
            """
            clipped_sum, unclipped = clipped(x, y, max_grad_norm, *extra)
            noisy_update(clipped_sum, max_grad_norm, noise_multiplier)
            return unclipped

        return step

    def given(x, rows, persons):
        """What the clipping takes beside the batch, as tensors: the batch's persons (groups,
        slots), or its rows of known_layer's patch Grams ([B, 0] without it)."""
        if per_person != (persons is not None):
            raise ValueError("a DP step takes its batch's persons exactly when it clips per person")
        if per_person:
            return tf.constant(persons.groups), tf.constant(persons.slots)
        if (rows is None) != (known_layer is None):
            raise ValueError("a DP step takes its batch's patch Grams exactly when it was made "
                             "with their layer")
        return (tf.zeros([x.shape[0], 0]) if rows is None else tf.constant(rows),)

    if with_canaries is None:
        step, noise_only_step = step_of(clip), step_of(nothing_clipped)
        return lambda x, y, max_grad_norm, noise_multiplier, rows=None, persons=None: (
            step if x.shape[0] else noise_only_step)(
            x, y, max_grad_norm, noise_multiplier, *given(x, rows, persons))
    clip, update = graph(clip), graph(noisy_update)

    def audited_step(x, y, max_grad_norm, noise_multiplier, rows=None, persons=None):
        """The step with the audit's canaries: the clipped sum, `with_canaries` on it in the common
        layout (weight_arrays'), then the noise and the update, in two graphs.

        Args:
          x: the batch's inputs.
          y: their labels.
          max_grad_norm: C.
          noise_multiplier: σ.
          rows: the batch's rows of known_layer's patch Grams, exactly when known_layer is given.
          persons: the batch's units.BatchPersons, exactly when per_person.

        Returns:
          How many examples (persons) had a gradient norm ≤ C.
        """
        clipped_sum, unclipped = (clip if x.shape[0] else nothing_clipped)(
            x, y, max_grad_norm, *given(x, rows, persons))
        # the canaries are coordinates of weight_arrays, in the common layout
        flattened = flattened_map(model)
        with_them = from_common(with_canaries(to_common([g.numpy() for g in clipped_sum],
                                                        flattened)), flattened)
        update([tf.constant(g) for g in with_them], max_grad_norm, noise_multiplier)
        return unclipped

    return audited_step


def make_plain_step(model, optimizer):
    """The non-private step: mean loss over the batch, plain gradients."""
    @graph(input_signature=batch_spec(model))
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.loss(y, model(x, training=True)) / tf.cast(tf.shape(x)[0], tf.float32)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    return step


def new_optimizer(training: Training):
    """SGD with momentum or Adam; with ema_decay Keras keeps a moving average of the weights (its
    own `use_ema`), copied into the model at the end of training."""
    ema = {"use_ema": True, "ema_momentum": training.ema_decay} if training.ema_decay else {}
    if training.optimizer == "adam":
        # torch's and MindSpore's ε
        return tf.keras.optimizers.Adam(training.learning_rate, epsilon=1e-8, **ema)
    return tf.keras.optimizers.SGD(training.learning_rate, momentum=training.momentum, **ema)


def tf_privacy_statement_epsilon(n, batch_size, epochs, noise_multiplier, delta):
    """TF Privacy's own statement (RDP, Poisson line), for comparison with our accountant.

    Args:
      n: the training examples.
      batch_size: the expected batch size.
      epochs: the epochs run (may be a fraction).
      noise_multiplier: σ.
      delta: δ.

    Returns:
      The ε of the statement's Poisson sampling line.
    """
    from tensorflow_privacy import compute_dp_sgd_privacy_statement

    # used_microbatching=False: we clip each example (its default True would double the sensitivity)
    statement = compute_dp_sgd_privacy_statement(
        number_of_examples=n, batch_size=batch_size, num_epochs=epochs,
        noise_multiplier=noise_multiplier, delta=delta, used_microbatching=False)
    return float(next(line for line in statement.splitlines()
                      if "Poisson sampling" in line).split()[-1])


# --- 2. Model I/O: inputs as the network takes them, weights as bytes ----------------------------

def as_input(inputs) -> tf.Tensor:
    """A float32 tensor as the network takes it: images [N, 28, 28] get a channel axis (NHWC),
    features widened."""
    return tf.cast(inputs[..., None] if inputs.ndim == 3 else inputs, tf.float32)


def model_to_bytes(model) -> bytes:
    """The weights as an .npz of Keras' get_weights(), in order."""
    buffer = io.BytesIO()
    np.savez(buffer, *model.get_weights())
    return buffer.getvalue()


def model_from_bytes(weights: bytes, network):
    """The network `network` names with the weights of `model_to_bytes` (no pickle)."""
    model = build_network(network)
    with np.load(io.BytesIO(weights), allow_pickle=False) as arrays:
        model.set_weights([arrays[f"arr_{i}"] for i in range(len(arrays.files))])
    return model


# --- 3. The Framework object: what the skeleton calls -------------------------------------------

class TensorFlowPrivacy(interface.Framework):
    name = "tf"
    per_person = True

    def network(self, network: interface.Network) -> tf.keras.Model:
        return build_network(network)

    def optimizer(self, model: tf.keras.Model,
                  training: Training) -> tf.keras.optimizers.Optimizer:
        return new_optimizer(training)  # Keras keeps the weight average itself (use_ema)

    def dp_step(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                inputs: np.ndarray, labels: np.ndarray, step: training.DpStep):
        """See interface.Framework.dp_step."""
        per_person = step.persons is not None
        # the first layer's patch Grams, if it has them: per-example norms only
        known = None if per_person else data_grams(model, inputs)
        dp_step = make_dp_step(model, optimizer, step.expected_batch_size,
                               noise_generator(step.randomness), step.canary_hook,
                               None if known is None else known[0], per_person)

        def one_step(batch: np.ndarray, max_grad_norm: float, noise_multiplier: float) -> int:
            """One DP-SGD step on inputs[batch], each batch widened to float32 alone.

            Args:
              batch: the indices of the step's Poisson batch.
              max_grad_norm: C.
              noise_multiplier: σ.

            Returns:
              How many examples (persons) of the batch had a gradient norm ≤ C.
            """
            # each batch widened to float32 alone
            x, y = as_input(inputs[batch]), tf.constant(labels[batch])
            return int(dp_step(x, y, tf.constant(max_grad_norm, tf.float32),
                               tf.constant(noise_multiplier, tf.float32),
                               None if known is None else known[1][batch], step.persons_in(batch)))

        return one_step

    def plain_step(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                   inputs: np.ndarray, labels: np.ndarray):
        """See interface.Framework.plain_step."""
        plain_step = make_plain_step(model, optimizer)
        return lambda batch: plain_step(as_input(inputs[batch]), tf.constant(labels[batch]))

    def end_training(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                     training: Training) -> None:
        """See interface.Framework.end_training."""
        if training.ema_decay:
            # the averaged weights are saved
            optimizer.finalize_variable_values(model.trainable_variables)

    def library_epsilon(self, sampling: SamplingPlan, delta: float, steps: int,
                        sigma: float) -> dict:
        """See interface.Framework.library_epsilon."""
        return {"TF Privacy statement, RDP, Poisson (this run only)": tf_privacy_statement_epsilon(
            sampling.n, sampling.expected_batch_size, steps / sampling.steps_per_epoch, sigma,
            delta)}

    load_model = staticmethod(model_from_bytes)
    dump_model = staticmethod(model_to_bytes)

    def weight_arrays(self, model: tf.keras.Model) -> list[np.ndarray]:
        return to_common(model.get_weights(), flattened_map(model))

    def set_weight_arrays(self, model: tf.keras.Model, arrays: list[np.ndarray]) -> tf.keras.Model:
        model.set_weights(from_common(arrays, flattened_map(model)))
        return model

    def batch_logits(self, model: tf.keras.Model, inputs: np.ndarray) -> np.ndarray:
        return model(as_input(inputs), training=False).numpy()


FRAMEWORK = TensorFlowPrivacy()

if __name__ == "__main__":
    functions.run(FRAMEWORK, HYPERPARAMETERS)
