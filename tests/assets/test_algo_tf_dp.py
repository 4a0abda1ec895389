"""The TF algo's own DP machinery against naive per-example gradients (exactness, not speed)."""
import importlib
import os

import numpy as np
import pytest
from conftest import ALGO_ASSETS, fresh_python

from mnist_dp.assets import load_asset_module
from mnist_dp.learning import conv_grams, training
from mnist_dp.learning.interface import Network

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
algo = load_asset_module(ALGO_ASSETS["tf"] / "algo.py", "algo_tf_dp")
# the networks and their per-example norms: tf_networks.py, on sys.path once algo.py is imported
networks = importlib.import_module("tf_networks")
CNN = Network("pixels", "tanh")


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return tf.constant(rng.random((7, 28, 28, 1), dtype=np.float32)), tf.constant(rng.integers(0,
                                  10, 7))


def naive_per_example_gradients(model, x, y):
    grads = []
    for i in range(len(y)):
        with tf.GradientTape() as tape:
            loss = model.loss(y[i : i + 1], model(x[i : i + 1], training=True))
        grads.append(tape.gradient(loss, model.trainable_variables))
    return grads


def norm(grads):
    return float(tf.sqrt(sum(tf.reduce_sum(tf.square(g)) for g in grads)))


@pytest.mark.parametrize("padding, kernel, stride",
                         [("same", 8, 2), ("valid", 4, 2), ("same", 3, 1), ("valid", 3, 2)])
def test_conv_patches_match_tf_extract_patches(padding, kernel, stride):
    layer = tf.keras.layers.Conv2D(4, kernel, strides=stride, padding=padding)
    x = tf.random.stateless_uniform((2, 13, 13, 3), seed=(1, 2))
    out_shape = layer(x).shape[1:3]
    ours = networks.conv_patches(x, layer, out_shape)
    reference = tf.image.extract_patches(x, [1, kernel, kernel, 1], [1, stride, stride, 1],
                                         [1, 1, 1, 1], padding.upper())
    # same patch under each output position; the order inside a patch may
    # differ (only norms are used)
    np.testing.assert_allclose(tf.sort(ours, axis=-1), tf.sort(reference, axis=-1), rtol=1e-6)


@pytest.mark.parametrize("channels, out, kernel, stride, padding, size, grams", [
    # the pixel CNN's first layer: per-example gradients from patches
    (1, 16, 8, 2, "same", 28, False),
    (16, 32, 4, 2, "valid", 13, False),  # and its second
    # the ScatterNet CNN's first layer: patch Grams from the pixel Gram
    (81, 16, 3, 2, "same", 7, True),
    (16, 32, 3, 1, "same", 4, True),  # and its second
    (81, 6, 3, 3, "valid", 6, True),  # a stride as wide as the kernel
    (64, 32, 2, 2, "same", 5, True),  # SAME padding all at the bottom and right
    (64, 64, 1, 2, "same", 6, True),  # a last row and column the convolution never reads
])
def test_conv_kernel_norms_are_the_per_example_gradient_norms(
        channels, out, kernel, stride, padding, size, grams):
    layer = tf.keras.layers.Conv2D(out, kernel, strides=stride, padding=padding)
    x = tf.random.stateless_uniform((5, size, size, channels), seed=(1, 2))
    out_grads = tf.random.stateless_normal(layer(x).shape, seed=(3, 4))
    assert conv_grams.pixel_grams_are_smaller(size, size, kernel * kernel * channels * out) == grams
    expected = []
    for i in range(len(x)):  # example i's gradient of <output_i, out_grads_i>
        with tf.GradientTape() as tape:
            inner = tf.reduce_sum(layer(x[i : i + 1]) * out_grads[i : i + 1])
        expected.append(float(tf.reduce_sum(tf.square(tape.gradient(inner, layer.kernel)))))
    np.testing.assert_allclose(networks.conv_kernel_norms(x, layer, out_grads), expected, rtol=1e-4)


@pytest.fixture(scope="module", params=["pixels", "scattering"])
def model_and_batch(request, batch):
    """Each CNN with a batch of its inputs: the tutorial CNN on images, the ScatterNet CNN on
    features."""
    if request.param == "pixels":
        return algo.FRAMEWORK.new_model(0, CNN), batch
    x = np.random.default_rng(0).normal(size=(7, 3969)).astype(np.float32)
    return algo.FRAMEWORK.new_model(0, Network("scattering", "tanh",
                                               "cnn")), (tf.constant(x), batch[1])


def test_registry_norms_are_the_exact_per_example_gradient_norms(model_and_batch):
    from tensorflow_privacy.privacy.fast_gradient_clipping import clip_grads

    model, batch = model_and_batch
    norms = clip_grads.compute_gradient_norms(model, networks.make_layer_registry(), *batch,
                                              trainable_vars=model.trainable_variables)
    expected = [norm(g) for g in naive_per_example_gradients(model, *batch)]
    np.testing.assert_allclose(norms, expected, rtol=1e-4)


@pytest.mark.parametrize("with_data_grams", [False, True])
def test_clipped_sum_is_the_sum_of_clipped_per_example_gradients(model_and_batch, with_data_grams):
    model, batch = model_and_batch
    per_example = naive_per_example_gradients(model, *batch)
    norms = sorted(norm(g) for g in per_example)
    clip = (norms[3] + norms[4]) / 2  # some examples clipped, some not, none at the boundary
    expected = [sum(g[k] * min(1.0, clip / norm(g)) for g in per_example)
                for k in range(len(per_example[0]))]
    known = networks.data_grams(model, batch[0].numpy()) if with_data_grams else None
    assert (known is not None) == (with_data_grams and not algo.on_pixels(model))
    # a batch takes its rows out of order: they must follow their examples (a sum is not)
    if known is not None:
        order = np.random.default_rng(1).permutation(len(batch[1]))
        batch, known = (tf.gather(batch[0], order), tf.gather(batch[1], order)), (known[0],
                        known[1][order])
    got, norms = algo.clipped_gradient_sum(model, networks.make_layer_registry(known), *batch,
                                           clip)
    # each example's, in the batch's order
    np.testing.assert_allclose(norms, [norm(g) for g in naive_per_example_gradients(model, *batch)],
                               rtol=1e-4)
    for ours, reference in zip(got, expected):
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-6)


def test_a_dp_step_takes_the_first_layers_patch_grams_exactly_when_made_with_their_layer():
    from mnist_dp.privacy.randomness import RunRandomness

    model = algo.FRAMEWORK.new_model(0, Network("scattering", "tanh", "cnn"))
    x = np.random.default_rng(0).normal(size=(4, 3969)).astype(np.float32)
    layer, rows = networks.data_grams(model, x)
    generator = algo.noise_generator(RunRandomness.fresh())
    with_layer = algo.make_dp_step(model, tf.keras.optimizers.SGD(0.1), 4.0, generator, None, layer)
    without = algo.make_dp_step(model, tf.keras.optimizers.SGD(0.1), 4.0, generator)
    args = (tf.constant(x), tf.constant([0, 1, 2, 3], tf.int64), tf.constant(1.0), tf.constant(1.0))
    with pytest.raises(ValueError, match="exactly when"):
        with_layer(*args)  # its rows forgotten: the layer's norms could not be taken
    with pytest.raises(ValueError, match="exactly when"):
        without(*args, rows)
    with pytest.raises(ValueError, match="persons exactly when it clips per person"):
        without(*args, persons=training.BatchPersons.of(np.array([0, 0, 1, 2])))
    assert 0 <= int(with_layer(*args, rows)) <= 4


def test_a_huge_gradient_is_clipped_to_the_norm(batch):
    # ReLU: its gradient grows with the input
    model = algo.FRAMEWORK.new_model(0, Network("pixels", "relu"))
    x = batch[0][:1] * 1e3
    wrong_label = tf.argmin(model(x), axis=1)  # the most wrong class: a very large gradient
    assert norm(naive_per_example_gradients(model, x, wrong_label)[0]) > 1e3
    got, _ = algo.clipped_gradient_sum(model, networks.make_layer_registry(), x, wrong_label, 0.5)
    assert norm(got) == pytest.approx(0.5, rel=1e-4)


def test_a_task_process_runs_protobufs_compiled_implementation_an_importer_the_pure_python_one():
    """algo.py run as a task holds TensorFlow alone: protobuf's upb, whatever the environment says;
    imported (as here, beside MindSpore) it keeps the pure-Python one that MindSpore needs."""
    script = ("import runpy, sys; sys.argv = ['algo.py', '--help']\n"
              f"try: runpy.run_path({str(ALGO_ASSETS['tf'] / 'algo.py')!r}, run_name='__main__')\n"
              "except SystemExit: pass\n"
              "from google.protobuf.internal import api_implementation\n"
              "print(api_implementation.Type(), file=sys.stderr)")
    proc = fresh_python(script, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    assert proc.returncode == 0 and proc.stderr.splitlines()[-1] == "upb", proc.stderr[-2000:]
    from google.protobuf.internal import api_implementation

    assert api_implementation.Type() == "python"
