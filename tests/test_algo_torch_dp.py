"""The torch algo's Conv2d norm sampler for Opacus' ghost clipping, against naive per-example gradients."""
import numpy as np
import pytest
from conftest import ALGO_ASSETS

from mnist_dp.assets import load_asset_module

torch = pytest.importorskip("torch")
algo = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_dp")


@pytest.mark.parametrize("channels, kernel, stride, padding, size, groups", [
    (1, 8, 2, 3, 28, 1),  # the CNN's first layer: one grouped convolution
    (16, 4, 2, 0, 13, 1),  # its second layer: patches and a batched product
    (1, 3, 2, 0, 10, 1),  # a stride that leaves extra rows in the grouped convolution
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
