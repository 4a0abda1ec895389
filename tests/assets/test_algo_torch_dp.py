"""The torch algo: its Conv2d norm sampler for Opacus' ghost clipping, against naive per-example gradients;
every planned step runs; its noise generator's state."""
import json

import numpy as np
import pytest
from conftest import ALGO_ASSETS, tiny_hyperparameters

from mnist_dp.data.samples import in_memory
from mnist_dp.learning import skeleton
from mnist_dp.orchestration.assets import load_asset_module
from mnist_dp.privacy import model_file
from mnist_dp.privacy.randomness import RunRandomness

torch = pytest.importorskip("torch")
algo = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_dp")


@pytest.mark.parametrize("channels, kernel, stride, padding, size, groups", [
    (1, 8, 2, 3, 28, 1),  # the CNN's first layer: one grouped convolution
    (16, 4, 2, 0, 13, 1),  # its second layer: patches and a batched product
    (1, 3, 2, 0, 10, 1),  # a stride that leaves extra rows in the grouped convolution
    (81, 3, 2, 1, 7, 1),  # the ScatterNet CNN's first layer, on scattering features
    (16, 3, 1, 1, 4, 1),  # and its second
    (4, 3, 1, "same", 9, 2),  # outside what ours handles: Opacus' own sampler
])
def test_conv2d_norms_are_the_per_example_gradient_norms(channels, kernel, stride, padding, size, groups):
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(channels, 6, kernel, stride=stride, padding=padding, groups=groups)
    x = torch.rand(5, channels, size, size)
    out = layer(x)
    out_grads = torch.randn_like(out)
    expected = {layer.weight: [], layer.bias: []}
    for i in range(len(x)):  # example i's gradient of <output_i, out_grads_i>
        inner = (layer(x[i : i + 1]) * out_grads[i : i + 1]).sum()
        weight, bias = torch.autograd.grad(inner, [layer.weight, layer.bias])
        expected[layer.weight].append(weight.norm().item())
        expected[layer.bias].append(bias.norm().item())
    norms = algo.conv2d_norm_sample(layer, [x], out_grads)
    assert set(norms) == {layer.weight, layer.bias}
    for param, values in expected.items():
        np.testing.assert_allclose(norms[param].detach().numpy(), values, rtol=1e-4)


def test_conv2d_norm_sampler_is_what_opacus_ghost_clipping_uses():
    from opacus.grad_sample import GradSampleModuleFastGradientClipping

    algo.register_conv2d_norm_sampler()
    assert GradSampleModuleFastGradientClipping.NORM_SAMPLERS[torch.nn.Conv2d] is algo.conv2d_norm_sample


@pytest.mark.parametrize("n", [930, 990])
def test_every_planned_step_runs_where_opacus_own_sampler_runs_one_fewer(tmp_path, n):
    """Opacus' DPDataLoader runs int(1/q) steps an epoch: 92 for q = 1/93 in floating point."""
    assert int(1 / (1 / (n // 10))) == n // 10 - 1
    rng = np.random.default_rng(0)
    samples = in_memory(rng.random((n, 28, 28), dtype=np.float32), np.arange(n) % 10, "sample")
    hp_path = tmp_path / "hyperparameters.json"
    hp_path.write_text(json.dumps(tiny_hyperparameters("torch", batch_size=10, features="pixels", network="cnn",
                                                       ema_decay=0.0, delta=1e-5)))
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
    assert algo.noise_generator(replayed).initial_seed() == 0  # no seed shown: the state is all there is
