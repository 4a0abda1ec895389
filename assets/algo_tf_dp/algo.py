"""DP-SGD on MNIST with TensorFlow 2.15 + TensorFlow Privacy, as Substra train / predict functions.

Only framework code lives here; the sampling plan, σ, the ledger and ε come from `mnist_dp.learning.skeleton`.
Run alone:  python assets/algo_tf_dp/algo.py --function-name train --inputs '[...]' --outputs '[...]'

How the DP step works, and why not TF Privacy's Keras DP optimizers: their per-example gradients through Conv2D
(vectorized_map) are far slower than a plain step on a CPU (docs/design.md). Instead we use TF Privacy's *fast
gradient clipping*: exact per-example norms from each layer's inputs and output gradients (its layer registry, with
`conv2d_layer_computation` below for the Conv2D it lacks), clip weights min(1, C / norm_i), the clipped sum from
the same tape (`clipped_gradient_sum`), and Gaussian noise from a `tf.random.Generator` whose whole Philox state
(192 bits) comes from the run's fresh entropy: TF Privacy's `add_aggregate_noise` draws from `tf.random.normal`,
whose seeds TensorFlow cuts to 31 bits (or takes 32 bits of process entropy).
"""
import functools
import io
import logging
import os
import sys
from pathlib import Path

# Before TensorFlow is imported: quiet its C++ start-up log, and protobuf's pure-Python
# implementation (docs/design.md: else MindSpore crashes when TensorFlow was imported first).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import numpy as np
import tensorflow as tf

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.learning import conv_grams, features, functions, interface
from mnist_dp.learning.interface import GROUP_SIZE, MNIST_MEAN, MNIST_STD, NORM_EPS
from mnist_dp.privacy.planning import SamplingPlan

tf.get_logger().setLevel(logging.ERROR)
HYPERPARAMETERS = Path(__file__).with_name("hyperparameters.json")


# --- 1. The network -------------------------------------------------------------------------------------------------

def build_network(network):
    """The network `network` names (the same as the other algos'): the TF Privacy tutorial CNN (26,010
    parameters) on pixels; on scattering features Tramèr & Boneh's ScatterNet CNN with a linear shortcut (72,756)
    or a linear classifier. Its weights are Keras' draw until new_model or model_from_bytes sets them."""
    layers = tf.keras.layers
    if network.features == "pixels":
        model = pixel_cnn(network.activation)
    elif network.network == "cnn":
        model = scatter_cnn(network.activation)
    else:
        model = tf.keras.Sequential([layers.Input((features.SCATTERING_DIM,)), layers.Dense(10)])  # [B, 3969] -> logits
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.SUM)
    model.compile(loss=loss)  # summed: the clipped gradients are then the *sum* of the per-example clipped ones
    return model


def pixel_cnn(activation):
    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input((28, 28, 1)),  # [B, 28, 28, 1] in [0, 1]
        layers.Rescaling(1 / MNIST_STD, offset=-MNIST_MEAN / MNIST_STD),
        layers.Conv2D(16, 8, strides=2, padding="same", activation=activation),  # -> [B, 14, 14, 16]
        layers.MaxPool2D(2, 1),  # -> [B, 13, 13, 16]
        layers.Conv2D(32, 4, strides=2, padding="valid", activation=activation),  # -> [B, 5, 5, 32]
        layers.MaxPool2D(2, 1),  # -> [B, 4, 4, 32]
        layers.Flatten(),  # -> [B, 512]
        layers.Dense(32, activation=activation),  # -> [B, 32]
        layers.Dense(10),  # -> [B, 10] logits
    ])


def scatter_cnn(activation):
    """Each convolution's output group-normalised (no learnt scale) before its activation, and a linear shortcut
    from the features to the logits, as the other algos'."""
    layers = tf.keras.layers
    channels, size = features.SCATTERING_CHANNELS, features.SCATTERING_SIZE

    def normalised(width):  # [B, 4, 4, width], groups of GROUP_SIZE channels, then the activation
        return [layers.GroupNormalization(width // GROUP_SIZE, epsilon=NORM_EPS, center=False, scale=False),
                layers.Activation(activation)]

    inputs = x = layers.Input((features.SCATTERING_DIM,))  # [B, 3969] scattering features
    for layer in [
        layers.Reshape((channels, size, size)),  # -> [B, 81, 7, 7], their order
        layers.Permute((2, 3, 1)),  # -> [B, 7, 7, 81]
        layers.Conv2D(16, 3, strides=2, padding="same"), *normalised(16),  # -> [B, 4, 4, 16]
        layers.Conv2D(32, 3, strides=1, padding="same"), *normalised(32),  # -> [B, 4, 4, 32]
        layers.Permute((3, 1, 2)),  # -> [B, 32, 4, 4]: flattened in the other algos' order
        layers.Flatten(),  # -> [B, 512]
        layers.Dense(32, activation=activation),  # -> [B, 32]
        layers.Dense(10),  # -> [B, 10]
    ]:
        x = layer(x)
    shortcut = layers.Dense(10, use_bias=False)  # the CNN's last bias serves both
    return tf.keras.Model(inputs, layers.Add()([x, shortcut(inputs)]))  # -> [B, 10] logits


# --- 2. The DP step: per-example clipping by TF Privacy's fast gradient clipping (with a Conv2D entry), noise -------

def conv2d_layer_computation(layer_instance, input_args, input_kwargs, tape, num_microbatches=None, known=None):
    """TF Privacy layer-registry function for `tf.keras.layers.Conv2D` (fast gradient clipping). For example i,
    the kernel gradient is P_iᵀ G_i, with P_i the input patches [positions, kh·kw·c_in] and G_i the gradient of the
    summed loss w.r.t. the pre-activation output [positions, c_out]; the bias gradient is the sum of G_i over
    positions. Their squared norms: `conv_kernel_norms` (for the layer of `known`, from the batch's data_grams)."""
    if input_kwargs or len(input_args) != 1 or num_microbatches is not None:
        raise NotImplementedError("Conv2D registry function: one input, no kwargs, no microbatches")
    if layer_instance.groups != 1 or tuple(layer_instance.dilation_rate) != (1, 1) or \
            layer_instance.data_format != "channels_last":
        raise NotImplementedError("Conv2D registry function: groups=1, dilation 1, channels_last only")
    inputs = input_args[0]
    activation = layer_instance.activation
    layer_instance.activation = None
    base_vars = layer_instance(inputs)  # pre-activation output [B, H', W', c_out]
    tape.watch(base_vars)
    layer_instance.activation = activation
    outputs = activation(base_vars) if activation else base_vars

    def sqr_norm_fn(grads):
        if known is not None and layer_instance is known[0]:  # Σ_{p,p'} (g_p·g_p')(a_p·a_p') from packed a_p·a_p'
            packed = tf.gather(output_grams(grads), conv_grams.packed_pairs(grads.shape[1] * grads.shape[2]), axis=1)
            sqr_norms = tf.reduce_sum(packed * known[1], 1)
        else:
            sqr_norms = conv_kernel_norms(inputs, layer_instance, grads)
        if layer_instance.use_bias:  # the bias gradient: the output gradient summed over positions
            sqr_norms += tf.reduce_sum(tf.square(tf.reduce_sum(grads, [1, 2])), 1)
        return sqr_norms

    return base_vars, outputs, sqr_norm_fn


def conv_kernel_norms(inputs, layer, grads):
    """Each example's squared kernel-gradient norm [B] from its input [B, H, W, c_in] and the gradient of the
    pre-activation output [B, H', W', c_out]: from the Gram of its input pixels (conv_grams.py) when that is smaller
    than its kernel gradient (the ScatterNet CNN's layers, whose first layer's patches cost about as much as a plain
    step), else from the patches (the pixel CNN's)."""
    (kh, kw), (out_h, out_w) = layer.kernel_size, grads.shape[1:3]
    batch, (in_h, in_w, channels) = tf.shape(grads)[0], inputs.shape[1:]
    grads = tf.reshape(grads, [batch, out_h * out_w, grads.shape[-1]])  # [B, P, c_out]
    if not conv_grams.pixel_grams_are_smaller(in_h, in_w, kh * kw * channels * grads.shape[-1]):
        patches = tf.reshape(conv_patches(inputs, layer, (out_h, out_w)), [batch, out_h * out_w, -1])  # [B, P, K]
        return tf.reduce_sum(tf.square(tf.einsum("bpk,bpc->bkc", patches, grads)), axis=[1, 2])
    sums = conv_grams.patch_pair_sums(in_h, in_w, *geometry(layer, in_h, in_w, out_h, out_w))
    pixels = tf.reshape(inputs, [batch, in_h * in_w, channels])
    grams = tf.reshape(tf.matmul(pixels, pixels, transpose_b=True), [batch, -1])  # -> [B, (H·W)²]
    patch_grams = tf.sparse.sparse_dense_matmul(grams, tf.sparse.SparseTensor(*sums))  # -> [B, P·P]
    return tf.reduce_sum(output_grams(grads) * patch_grams, 1)


def output_grams(grads):
    """Each example's g_p·g_p' over output positions p, flattened: [B, H', W', c] (or [B, P, c]) -> [B, P·P]."""
    flat = tf.reshape(grads, [tf.shape(grads)[0], -1, grads.shape[-1]])
    return tf.reshape(tf.matmul(flat, flat, transpose_b=True), [tf.shape(grads)[0], -1])


def data_grams(model, images: np.ndarray):
    """The ScatterNet CNN's first Conv2D and every example's packed patch Grams under it (conv_grams.patch_grams), made
    once, not at every step: that layer reads the features themselves, moved. None for the other networks."""
    layer = next((layer for layer in model.layers if isinstance(layer, tf.keras.layers.Conv2D)), None)
    size = features.SCATTERING_SIZE
    reorders = (tf.keras.layers.InputLayer, tf.keras.layers.Reshape, tf.keras.layers.Permute)  # the data, moved
    if layer is None or not all(isinstance(before, reorders) for before in model.layers[:model.layers.index(layer)]) \
            or not conv_grams.pixel_grams_are_smaller(size, size, layer.kernel.shape.num_elements()):
        return None
    pixels = images.reshape(-1, features.SCATTERING_CHANNELS, size, size)
    return layer, conv_grams.patch_grams(pixels, *geometry(layer, size, size, *layer.output.shape[1:3]))


def geometry(layer, in_h, in_w, out_h, out_w):
    """A Conv2D's (out_h, out_w, kh, kw, sh, sw, top, left) for conv_grams: SAME pads half its rows above, rounded
    down, the rest below; columns alike."""
    (kh, kw), (sh, sw) = layer.kernel_size, layer.strides
    top, left = max((out_h - 1) * sh + kh - in_h, 0) // 2, max((out_w - 1) * sw + kw - in_w, 0) // 2
    return (out_h, out_w, kh, kw, sh, sw) + ((top, left) if layer.padding == "same" else (0, 0))


def conv_patches(inputs, layer, out_shape):
    """The input patch under each output position: [B, H', W', kh·kw·c_in] (in some fixed order: only norms are
    taken). When the kernel is a multiple of the stride, space_to_depth and kh/s · kw/s shifted slices give them with
    cheap copies, where tf.image.extract_patches costs more than the step it serves (docs/design.md)."""
    (kh, kw), (sh, sw) = layer.kernel_size, layer.strides
    if kh % sh or kw % sw or sh != sw:
        return tf.image.extract_patches(inputs, [1, kh, kw, 1], [1, sh, sw, 1], [1, 1, 1, 1], layer.padding.upper())
    out_h, out_w = out_shape
    span_h, span_w = (out_h - 1) * sh + kh, (out_w - 1) * sw + kw  # input rows/cols the conv reads
    if layer.padding == "same":
        in_h, in_w = inputs.shape[1:3]
        pad_h, pad_w = max(span_h - in_h, 0), max(span_w - in_w, 0)
        inputs = tf.pad(inputs, [[0, 0], [pad_h // 2, pad_h - pad_h // 2], [pad_w // 2, pad_w - pad_w // 2], [0, 0]])
    blocks = inputs[:, :span_h, :span_w, :]
    if sh > 1:
        blocks = tf.nn.space_to_depth(blocks, sh)  # [B, span/s, span/s, s·s·c_in]
    return tf.concat([blocks[:, i : i + out_h, j : j + out_w, :]
                      for i in range(kh // sh) for j in range(kw // sw)], axis=-1)


def make_layer_registry(known=None):
    from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry

    registry = layer_registry.make_default_layer_registry()  # Dense, Embedding
    registry.insert(tf.keras.layers.Conv2D, functools.partial(conv2d_layer_computation, known=known))
    return registry


def clipped_gradient_sum(model, registry, x, y, max_grad_norm):
    """Σ_i min(1, C / ‖g_i‖) g_i over the batch, with one forward and one backward pass, and the number of examples
    whose gradient norm was at most C. TF Privacy's `compute_clipped_gradients_and_outputs` does this with a second
    forward and backward pass of a re-weighted loss (3.3x a plain step here). We use the same TF Privacy parts
    (`model_forward_pass` with the registry generator, registry norm functions, `compute_clip_weights`) but keep the
    tape: the gradient of Σ_i w_i ℓ_i w.r.t. a layer's pre-activation output Z is w_i times that of Σ_i ℓ_i, so each
    layer's weight gradient is one vector-Jacobian product from Z ("book-keeping", Bu et al. 2023). Returns the
    gradients in `model.trainable_variables` order."""
    from tensorflow_privacy.privacy.fast_gradient_clipping import clip_grads, gradient_clipping_utils

    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        tape.watch(model.trainable_variables)
        generator = clip_grads.get_registry_generator_fn(tape, registry)
        logits, layers = gradient_clipping_utils.model_forward_pass(model, x, generator)
        summed_loss = model.loss(y, logits)  # reduction SUM: Σ_i ℓ_i
    layers = [layer for layer in layers if layer is not None]  # layers without weights yield None
    base_grads = tape.gradient(summed_loss, [layer[0] for layer in layers])
    norms = tf.sqrt(tf.add_n([sqr_norm_fn(g) for (_, sqr_norm_fn, _), g in zip(layers, base_grads)]))
    clip_weights = clip_grads.compute_clip_weights(max_grad_norm, norms)  # min(1, C/‖g_i‖)
    grads = {}
    for (base, _, weights), g in zip(layers, base_grads):
        scaled = g * tf.reshape(clip_weights, [-1] + [1] * (len(g.shape) - 1))
        for weight, grad in zip(weights, tape.gradient(base, weights, output_gradients=scaled)):
            grads[weight.ref()] = grad
    del tape
    if len(grads) != len(model.trainable_variables):
        raise RuntimeError("a trainable layer escaped per-example clipping")
    unclipped = tf.reduce_sum(tf.cast(norms <= max_grad_norm, tf.int32))
    return [grads[v.ref()] for v in model.trainable_variables], unclipped


def noise_generator(randomness):
    """A Philox generator (128-bit counter, 64-bit key) whose whole state comes from the run's randomness."""
    state = randomness.words("gradient noise", 3, np.uint64).view(np.int64)
    return tf.random.Generator.from_state(state, alg="philox")


SCALAR = tf.TensorSpec([], tf.float32)


def batch_spec(model):
    """The (inputs, labels) signature of a training step: the model's input shape, any batch size."""
    return tf.TensorSpec([None, *model.input_shape[1:]], tf.float32), tf.TensorSpec([None], tf.int64)


def make_dp_step(model, optimizer, expected_batch_size, generator, with_canaries=None, known_layer=None):
    """One DP-SGD step `step(x, y, C, σ, rows=None)`: clip each example's gradient to C, sum, add N(0, σ²C²) drawn
    from `generator`, divide by E[B]. Returns how many examples had a gradient norm ≤ C (adaptive clipping's count,
    before noise). `known_layer`: data_grams' Conv2D, whose norms come from `rows`, the batch's rows of its patch
    Grams (given at every step exactly when known_layer is). `with_canaries`: the white-box audit's
    DpStep.with_canaries, called between the clipping and the noise (the step is then two graphs)."""
    def noisy_update(clipped_sum, max_grad_norm, noise_multiplier):
        noisy_sum = [g + generator.normal(tf.shape(g), stddev=noise_multiplier * max_grad_norm) for g in clipped_sum]
        # Divide by the *expected* batch size (a constant, as Opacus does): dividing by the realised
        # size would make the update depend on the data beyond what the mechanism accounts for.
        optimizer.apply_gradients([(g / expected_batch_size, v) for g, v in zip(noisy_sum, model.trainable_variables)])

    def clip(x, y, max_grad_norm, rows):
        registry = make_layer_registry(None if known_layer is None else (known_layer, rows))
        return clipped_gradient_sum(model, registry, x, y, max_grad_norm)

    def nothing_clipped(x, y, max_grad_norm, rows):
        """An empty Poisson batch's clipped sum: zeros (Keras' Conv2D fails on 0 examples); its noise is a step."""
        return [tf.zeros_like(v) for v in model.trainable_variables], tf.constant(0, tf.int32)

    def step_of(clipped):
        @tf.function(input_signature=(*batch_spec(model), SCALAR, SCALAR, tf.TensorSpec([None, None], tf.float32)))
        def step(x, y, max_grad_norm, noise_multiplier, rows):
            clipped_sum, unclipped = clipped(x, y, max_grad_norm, rows)
            noisy_update(clipped_sum, max_grad_norm, noise_multiplier)
            return unclipped

        return step

    def given(x, rows):  # a batch's rows, as a tensor ([B, 0] for a step without known_layer)
        if (rows is None) != (known_layer is None):
            raise ValueError("a DP step takes its batch's patch Grams exactly when it was made with their layer")
        return tf.zeros([x.shape[0], 0]) if rows is None else tf.constant(rows)

    if with_canaries is None:
        step, noise_only_step = step_of(clip), step_of(nothing_clipped)
        return lambda x, y, max_grad_norm, noise_multiplier, rows=None: (step if x.shape[0] else noise_only_step)(
            x, y, max_grad_norm, noise_multiplier, given(x, rows))
    clip, update = tf.function(clip), tf.function(noisy_update)

    def audited_step(x, y, max_grad_norm, noise_multiplier, rows=None):
        clipped_sum, unclipped = (clip if x.shape[0] else nothing_clipped)(x, y, max_grad_norm, given(x, rows))
        pixels = on_pixels(model)  # the canaries are coordinates of weight_arrays, in the common layout
        with_them = from_common(with_canaries(to_common([g.numpy() for g in clipped_sum], pixels)), pixels)
        update([tf.constant(g) for g in with_them], max_grad_norm, noise_multiplier)
        return unclipped

    return audited_step


def make_plain_step(model, optimizer):
    """The non-private step: mean loss over the batch, plain gradients."""
    @tf.function(input_signature=batch_spec(model))
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.loss(y, model(x, training=True)) / tf.cast(tf.shape(x)[0], tf.float32)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    return step


def new_optimizer(hp):
    """SGD with momentum or Adam; with ema_decay Keras keeps a moving average of the weights (its own
    `use_ema`), copied into the model at the end of training."""
    ema = {"use_ema": True, "ema_momentum": hp.ema_decay} if hp.ema_decay else {}
    if hp.optimizer == "adam":
        return tf.keras.optimizers.Adam(hp.learning_rate, epsilon=1e-8, **ema)  # torch's and MindSpore's ε
    return tf.keras.optimizers.SGD(hp.learning_rate, momentum=hp.momentum, **ema)


def tf_privacy_statement_epsilon(n, batch_size, epochs, noise_multiplier, delta):
    """TF Privacy's own statement (RDP, Poisson line), for comparison with our accountant."""
    from tensorflow_privacy import compute_dp_sgd_privacy_statement

    # used_microbatching=False: we clip each example (its default True would double the sensitivity).
    statement = compute_dp_sgd_privacy_statement(
        number_of_examples=n, batch_size=batch_size, num_epochs=epochs, noise_multiplier=noise_multiplier,
        delta=delta, used_microbatching=False)
    return float(next(line for line in statement.splitlines() if "Poisson sampling" in line).split()[-1])


# --- 3. Model I/O: inputs as the network takes them, weights as bytes -----------------------------------------------

def as_input(inputs) -> tf.Tensor:
    """A float32 tensor as the network takes it: images [N, 28, 28] get a channel axis (NHWC), features widened."""
    return tf.cast(inputs[..., None] if inputs.ndim == 3 else inputs, tf.float32)


# The pixel CNN's fc1 kernel (its 5th array): Keras flattens the [4, 4, 32] map height-width-channel, the common
# layout channel-height-width.
PIXEL_FC1, PIXEL_MAP = 4, (4, 4, 32)


def on_pixels(model) -> bool:
    """Whether the model is the pixel CNN (its input images [B, 28, 28, 1]), whose flattening differs."""
    return len(model.input_shape) == 4


def to_common(arrays, pixels):
    """Keras' get_weights() -> the common layout (initial_weights.py): HWIO kernels to OIHW, [in, out] dense
    kernels to [out, in]; `pixels`: the arrays are the pixel CNN's."""
    common = []
    for index, array in enumerate(arrays):
        if array.ndim == 4:
            array = array.transpose(3, 2, 0, 1)
        elif array.ndim == 2:
            array = array.T
            if pixels and index == PIXEL_FC1:  # columns (h, w, c) -> (c, h, w)
                array = array.reshape(-1, *PIXEL_MAP).transpose(0, 3, 1, 2).reshape(array.shape)
        common.append(np.ascontiguousarray(array))
    return common


def from_common(arrays, pixels):
    """The common layout -> Keras' get_weights(): to_common's inverse."""
    keras = []
    for index, array in enumerate(arrays):
        if array.ndim == 4:
            array = array.transpose(2, 3, 1, 0)
        elif array.ndim == 2:
            if pixels and index == PIXEL_FC1:  # columns (c, h, w) -> (h, w, c)
                array = array.reshape(-1, PIXEL_MAP[2], *PIXEL_MAP[:2]).transpose(0, 2, 3, 1).reshape(array.shape)
            array = array.T
        keras.append(np.ascontiguousarray(array))
    return keras


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


# --- 4. The Framework object: what the skeleton calls ---------------------------------------------------------------

class TensorFlowPrivacy(interface.Framework):
    name = "tf"

    def network(self, network: interface.Network) -> tf.keras.Model:
        return build_network(network)

    def optimizer(self, model: tf.keras.Model, hp: Hyperparameters) -> tf.keras.optimizers.Optimizer:
        return new_optimizer(hp)  # Keras keeps the weight average itself (use_ema)

    def dp_step(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer, inputs: np.ndarray,
                labels: np.ndarray, hp: Hyperparameters, plan: SamplingPlan, step: interface.DpStep):
        known = data_grams(model, inputs)  # the first layer's patch Grams, if it has them
        dp_step = make_dp_step(model, optimizer, plan.expected_batch_size, noise_generator(step.randomness),
                               step.canary_hook, None if known is None else known[0])

        def one_step(batch: np.ndarray, max_grad_norm: float, noise_multiplier: float) -> int:
            x, y = as_input(inputs[batch]), tf.constant(labels[batch])  # each batch widened to float32 alone
            return int(dp_step(x, y, tf.constant(max_grad_norm, tf.float32), tf.constant(noise_multiplier, tf.float32),
                               None if known is None else known[1][batch]))

        return one_step

    def plain_step(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer, inputs: np.ndarray,
                   labels: np.ndarray):
        plain_step = make_plain_step(model, optimizer)
        return lambda batch: plain_step(as_input(inputs[batch]), tf.constant(labels[batch]))

    def end_training(self, model: tf.keras.Model, optimizer: tf.keras.optimizers.Optimizer,
                     hp: Hyperparameters) -> None:
        if hp.ema_decay:
            optimizer.finalize_variable_values(model.trainable_variables)  # the averaged weights are saved

    def library_epsilon(self, plan: SamplingPlan, steps: int, sigma: float, delta: float) -> dict:
        return {"TF Privacy statement, RDP, Poisson (this run only)": tf_privacy_statement_epsilon(
            plan.n, plan.expected_batch_size, steps / plan.steps_per_epoch, sigma, delta)}

    load_model = staticmethod(model_from_bytes)
    dump_model = staticmethod(model_to_bytes)

    def weight_arrays(self, model: tf.keras.Model) -> list[np.ndarray]:
        return to_common(model.get_weights(), on_pixels(model))

    def set_weight_arrays(self, model: tf.keras.Model, arrays: list[np.ndarray]) -> tf.keras.Model:
        model.set_weights(from_common(arrays, on_pixels(model)))
        return model

    def batch_logits(self, model: tf.keras.Model, inputs: np.ndarray) -> np.ndarray:
        return model(as_input(inputs), training=False).numpy()


FRAMEWORK = TensorFlowPrivacy()

if __name__ == "__main__":
    functions.run(FRAMEWORK, HYPERPARAMETERS)
