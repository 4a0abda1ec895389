"""The three algos are one mechanism: the same initial weights, the same function, the same update.

Each framework's `weight_arrays` speaks the common layout (mnist_dp/learning/initial_weights.py), so
their weights compare number for number.
"""
import dataclasses

import numpy as np
import pytest
from conftest import ALGO_ASSETS, FRAMEWORKS

from mnist_dp import hyperparameters
from mnist_dp.assets import load_asset_module
from mnist_dp.learning import initial_weights, interface, training
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan

NETWORKS = [interface.Network("pixels", "tanh", "cnn"),
            interface.Network("scattering", "tanh", "cnn"),
            interface.Network("scattering", "tanh", "linear")]


@pytest.fixture(scope="module")
def algos():
    return {f: load_asset_module(ALGO_ASSETS[f] / "algo.py", f"algo_{f}_same_mechanism").FRAMEWORK
            for f in FRAMEWORKS}


@pytest.mark.parametrize("network", NETWORKS, ids=lambda n: f"{n.features}-{n.network}")
def test_every_framework_starts_from_the_same_drawn_weights(algos, network):
    """(The linear classifier starts at zero, where each library's own draw would not.)"""
    drawn = initial_weights.draw(network, 5)
    for name, framework in algos.items():
        arrays = framework.weight_arrays(framework.new_model(5, network))
        assert [a.shape for a in arrays] == [a.shape for a in drawn], name
        for got, want in zip(arrays, drawn):
            np.testing.assert_array_equal(got, want, err_msg=name)
    other = initial_weights.draw(network, 6)  # the seed chooses them
    assert all(np.array_equal(a, b) == (not a.any()) for a, b in zip(drawn, other))


def test_initial_weights_follow_torchs_default_distribution():
    """U(±1/√fan_in) for weights and biases, zero for the shortcut: torch's Kaiming-uniform (a =
    √5)."""
    network = interface.Network("scattering", "tanh", "cnn")
    for (name, _, fan_in), array in zip(initial_weights.layout(network),
         initial_weights.draw(network, 0)):
        if fan_in == initial_weights.ZERO:
            assert not array.any(), name
            continue
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(array).max() <= bound, name
        if array.size >= 500:  # a uniform's std is bound / √3
            assert array.std() == pytest.approx(bound / np.sqrt(3), rel=0.1), name


def test_the_scatternet_cnn_is_one_function_in_every_framework(algos):
    """The same weights give the same logits everywhere: the same layers in the same order, the same
    group normalisation and the same flattening, so a recipe tuned in one framework holds in the
    others."""
    network = interface.Network("scattering", "tanh", "cnn")
    rng = np.random.default_rng(0)
    # weights ×4; the shortcut, zero at the start, random
    arrays = [a * 4 if a.any() else rng.normal(0, 0.05, a.shape).astype(np.float32)
              for a in initial_weights.draw(network, 0)]
    inputs = rng.normal(size=(6, 3969)).astype(np.float32)
    logits = {}
    for name, framework in algos.items():
        model = framework.set_weight_arrays(framework.new_model(1, network), arrays)
        logits[name] = np.asarray(framework.batch_logits(model, inputs))
    # weights ×4: the group norms and activations are not in a linear regime
    assert logits["torch"].std() > 0.5
    for name in FRAMEWORKS:
        np.testing.assert_allclose(logits[name], logits["torch"], atol=2e-4, err_msg=name)


def hp_of(network, **changes):
    """The assets' recipe (SGD, momentum 0.9, C 0.1, learning rate 1, weight average 0.99) on a full
    batch."""
    return hyperparameters.parse({
        **dataclasses.asdict(hyperparameters.load(ALGO_ASSETS["torch"] / "hyperparameters.json")),
        **dataclasses.asdict(network), "epochs": 3, "batch_size": 12, "noise_multiplier": 1.0,
                                  "target_epsilon": None, "noise_seed": 0, **changes}, "test")


@pytest.mark.slow
@pytest.mark.parametrize("network", NETWORKS, ids=lambda n: f"{n.features}-{n.network}")
@pytest.mark.parametrize("ema_decay", [0.0, 0.99])
def test_noise_free_dp_steps_move_every_framework_to_the_same_weights(algos, network, ema_decay):
    """Three DP steps on the full batch with σ = 0, from the same weights: clipping (every example's
    gradient norm is far above C), the division by E[B], the momentum and the weight average are the
    same update in every framework, to float precision."""
    rng = np.random.default_rng(1)
    images, labels = rng.random((12, 28, 28), dtype=np.float32), np.arange(12) % 10
    hp = hp_of(network, ema_decay=ema_decay)
    sampling = SamplingPlan.from_hyperparameters(len(labels), hp, "test")
    assert sampling.sample_rate == 1.0 and sampling.steps == 3
    inputs = network.inputs(images)
    moved = {}
    for name, framework in algos.items():
        model = framework.new_model(hp.seed, network)
        start = interface.flat_weights(framework, model)
        training.fit(framework, model, inputs, labels, TaskPlan.of(name, hp, sampling, 0.0),
                     RunRandomness.for_run(0))
        moved[name] = interface.flat_weights(framework, model) - start
    scale = np.abs(moved["torch"]).max()
    assert scale > 1e-4  # the steps moved the weights
    for name in FRAMEWORKS:
        np.testing.assert_allclose(moved[name], moved["torch"], atol=1e-3 * scale, err_msg=name)
