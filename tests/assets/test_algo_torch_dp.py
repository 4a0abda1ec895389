"""The torch algo: its book-keeping clipped sum and Conv2d norms, against naive per-example
gradients; every planned step runs; its noise generator's state."""
import importlib
import json

import numpy as np
import pytest
from conftest import ALGO_ASSETS, tiny_hyperparameters

from mnist_dp.assets import load_asset_module
from mnist_dp.data.samples import in_memory
from mnist_dp.learning import conv_grams, skeleton
from mnist_dp.privacy import model_file
from mnist_dp.privacy.randomness import RunRandomness

torch = pytest.importorskip("torch")
algo = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_dp")
# the networks and their per-example norms: torch_networks.py, on sys.path once algo.py is imported
networks = importlib.import_module("torch_networks")


@pytest.mark.parametrize("channels, out, kernel, stride, padding, size, grams", [
    # the pixel CNN's first layer: per-example gradients by one grouped convolution
    (1, 16, 8, 2, 3, 28, False),
    (16, 32, 4, 2, 0, 13, False),  # its second layer: patches and a batched product
    (1, 6, 3, 2, 0, 10, False),  # a stride that leaves extra rows in the grouped convolution
    (81, 16, 3, 2, 1, 7, True),  # the ScatterNet CNN's first layer: patch Grams from the pixel Gram
    (16, 32, 3, 1, 1, 4, True),  # and its second
    (81, 6, 3, 3, 0, 6, True),  # patch Grams with a stride as wide as the kernel
    (32, 6, 2, 1, 0, 5, True),  # an even kernel
    (64, 64, 1, 2, 0, 6, True),  # a last row and column the convolution never reads
])
def test_conv_weight_norms_are_the_per_example_gradient_norms(
        channels, out, kernel, stride, padding, size, grams):
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(channels, out, kernel, stride=stride, padding=padding)
    assert conv_grams.pixel_grams_are_smaller(size, size, layer.weight.numel()) == grams
    x = torch.rand(5, channels, size, size)
    out_grads = torch.randn_like(layer(x))
    expected = []
    for i in range(len(x)):  # example i's gradient of <output_i, out_grads_i>
        inner = (layer(x[i : i + 1]) * out_grads[i : i + 1]).sum()
        expected.append(torch.autograd.grad(inner, layer.weight)[0].square().sum().item())
    np.testing.assert_allclose(networks.conv_weight_norms(layer, x, out_grads).numpy(), expected,
                               rtol=1e-4)


def naive_clipped_sum(model, inputs, targets, clip):
    """The definition: each example's gradient on its own, clipped to `clip`, summed."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for i in range(len(inputs)):
        grads = torch.autograd.grad(
            torch.nn.functional.cross_entropy(model(inputs[i : i + 1]), targets[i : i + 1]),
            list(model.parameters()))
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        for t, g in zip(total, grads):
            t += g * min(1.0, clip / float(norm))
    return total


@pytest.mark.parametrize("features, network",
                         [("scattering", "cnn"), ("pixels", "cnn"), ("scattering", "linear")])
@pytest.mark.parametrize("with_data_grams", [False, True])
def test_clip_and_sum_is_the_sum_of_per_example_clipped_gradients(
        features, network, with_data_grams):
    from mnist_dp.learning import interface

    torch.manual_seed(0)
    model = networks.build_network(interface.Network(features, "tanh", network))
    # no zero weights (the shortcut, the linear model): every gradient term matters
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    inputs = torch.randn(9, 3969) * 0.05 if features == "scattering" else torch.rand(9, 1, 28, 28)
    targets = torch.arange(9) % 10
    expected = naive_clipped_sum(model, inputs, targets, 0.1)
    known = networks.data_grams(model, inputs.numpy()) if with_data_grams else None
    assert (known is not None) == (with_data_grams and (features, network) == ("scattering", "cnn"))
    # a batch takes its rows out of order: they must follow their examples (a sum is not)
    if known is not None:
        order = torch.randperm(len(inputs))
        inputs, targets, known = inputs[order], targets[order], (known[0], known[1][order])
    norms = algo.clip_and_sum(model, inputs, targets, 0.1, known)
    assert (norms > 0.1).any() and (norms < 1e3).all()  # some examples were clipped
    for param, want in zip(model.parameters(), expected):
        np.testing.assert_allclose(param.grad.numpy(), want.numpy(), atol=1e-6)


def test_clip_and_sum_refuses_a_parameter_it_cannot_clip():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4),
                                torch.nn.Linear(4, 10))
    with pytest.raises(ValueError, match="every parameter"):
        algo.clip_and_sum(model, torch.randn(3, 4), torch.zeros(3, dtype=torch.long), 1.0)


def test_clip_and_sum_refuses_patch_grams_of_a_layer_that_does_not_read_the_inputs():
    from mnist_dp.learning import interface

    model = networks.build_network(interface.Network("scattering", "tanh", "cnn"))
    inputs = torch.randn(3, 3969)
    _, rows = networks.data_grams(model, inputs.numpy())
    # conv2 has 16 positions too: its norms would be wrong
    with pytest.raises(ValueError, match="read the inputs"):
        algo.clip_and_sum(model, inputs, torch.zeros(3, dtype=torch.long), 1.0, (model.conv2, rows))


@pytest.mark.parametrize("n", [930, 990])
def test_every_planned_step_runs_where_opacus_own_sampler_runs_one_fewer(tmp_path, n):
    """Opacus' DPDataLoader runs int(1/q) steps an epoch: 92 for q = 1/93 in floating point."""
    assert int(1 / (1 / (n // 10))) == n // 10 - 1
    rng = np.random.default_rng(0)
    samples = in_memory(rng.random((n, 28, 28), dtype=np.float32), np.arange(n) % 10, "sample")
    hp_path = tmp_path / "hyperparameters.json"
    hp_path.write_text(json.dumps(tiny_hyperparameters("torch", batch_size=10, features="pixels",
                                                       network="cnn", ema_decay=0.0, delta=1e-5)))
    outputs = {"model": str(tmp_path / "model"), "epsilon": str(tmp_path / "epsilon")}
    skeleton.train(algo.FRAMEWORK, {"datasamples": samples}, outputs, hp_path)
    saved = model_file.load(outputs["model"], "torch")
    [event] = saved.ledger.events
    assert event.steps == event.planned_steps == n // 10
    assert saved.hyperparameters["stopped_by_budget"] is False


def test_the_noise_generator_takes_its_whole_state_from_the_runs_randomness():
    def draws(randomness):
        return torch.normal(0, 1, (8,), generator=algo.noise_generator(randomness)).tolist()

    replayed = RunRandomness.for_run(5)
    assert draws(replayed) == draws(replayed) != draws(RunRandomness.for_run(6))
    assert draws(RunRandomness.fresh()) != draws(RunRandomness.fresh())
    # no seed shown: the state is all there is
    assert algo.noise_generator(replayed).initial_seed() == 0
