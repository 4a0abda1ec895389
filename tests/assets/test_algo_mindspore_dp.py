"""The MindSpore algo's convolution and DP machinery against MindSpore's own layers and naive
per-example gradients, and MindArmour's noise."""
import os

import numpy as np
import pytest
from conftest import ALGO_ASSETS

from mnist_dp.assets import load_asset_module

os.environ.setdefault("GLOG_v", "3")
ms = pytest.importorskip("mindspore")
algo = load_asset_module(ALGO_ASSETS["mindspore"] / "algo.py", "algo_mindspore_dp")


CHUNK = 16


@pytest.fixture(scope="module", params=["cnn", "scatter-cnn", "linear"])
def net_and_batch(request):
    rng = np.random.default_rng(0)
    if request.param == "cnn":
        net, x = algo.ConvNet(), rng.random((CHUNK, 1, 28, 28), dtype=np.float32)
    elif request.param == "scatter-cnn":
        net, x = algo.ConvNet(scattering=True), rng.normal(size=(CHUNK, 3969)).astype(np.float32)
    else:  # random weights: the zero start would give every example the same gradient norm
        net, x = algo.ScatteringLinear(), rng.normal(size=(CHUNK, 3969)).astype(np.float32)
        net.fc.weight.set_data(ms.Tensor(rng.normal(0, 0.01, (10, 3969)).astype(np.float32)))
    y = rng.integers(0, 10, CHUNK).astype(np.int32)
    return net, x, y


def test_patch_convolution_refuses_what_it_does_not_compute():
    with pytest.raises(ValueError, match="dilation 1"):
        algo.PatchConv2d(1, 4, 3, dilation=2)


class SquaredOutput(ms.nn.Cell):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def construct(self, x):
        return (self.layer(x) ** 2).sum()


@pytest.mark.parametrize("channels, kernel, stride, padding, size",
                         [(1, 8, 2, 3, 28), (16, 4, 2, 0, 13), (3, 3, 1, 1, 9), (2, (3, 5), (1, 2), 1, 9)])
def test_patch_convolution_is_mindspores_conv2d_in_value_and_gradient(channels, kernel, stride, padding, size):
    from mindspore import nn

    pad_mode = "pad" if padding else "valid"
    ours = algo.PatchConv2d(channels, 5, kernel, stride=stride, pad_mode=pad_mode, padding=padding, has_bias=True)
    reference = nn.Conv2d(channels, 5, kernel, stride=stride, pad_mode=pad_mode, padding=padding, has_bias=True)
    assert [p.name for p in ours.get_parameters()] == [p.name for p in reference.get_parameters()]
    ms.load_param_into_net(reference, {p.name: ms.Parameter(p.data.copy(), name=p.name) for p in ours.get_parameters()})
    x = ms.Tensor(np.random.default_rng(1).random((3, channels, size, size), dtype=np.float32))
    np.testing.assert_allclose(ours(x).asnumpy(), reference(x).asnumpy(), rtol=1e-5, atol=1e-5)

    def gradients(layer):  # w.r.t. the input and every parameter
        inputs_grad, weights_grad = ms.grad(SquaredOutput(layer), grad_position=0, weights=layer.trainable_params())(x)
        return [g.asnumpy() for g in (inputs_grad, *weights_grad)]

    for got, expected in zip(gradients(ours), gradients(reference)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def naive_per_example_gradients(net, x, y, count):
    from mindspore import nn

    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum")
    grad = ms.grad(nn.WithLossCell(net, loss), grad_position=None, weights=net.trainable_params())
    return [[g.asnumpy() for g in grad(ms.Tensor(x[i : i + 1]), ms.Tensor(y[i : i + 1]))] for i in range(count)]


def test_clipped_sum_is_the_masked_sum_of_clipped_per_example_gradients(net_and_batch):
    net, x, y = net_and_batch
    count = 6  # the rest of the chunk is padding, masked out
    per_example = naive_per_example_gradients(net, x, y, count)
    norms = [np.sqrt(sum(np.sum(g ** 2) for g in grads)) for grads in per_example]
    clip = float(np.median(norms))  # some examples clipped, some not
    mask = np.zeros(CHUNK, np.float32)
    mask[:count] = 1
    *got, unclipped = algo.ClippedGradientSum(net, net.trainable_params())(ms.Tensor(x), ms.Tensor(y),
                                                                           ms.Tensor(mask), clip)
    assert int(unclipped.asnumpy()) == sum(norm <= clip for norm in norms)  # adaptive clipping's count
    for k, ours in enumerate(got):
        expected = sum(grads[k] * min(1.0, clip / norm) for grads, norm in zip(per_example, norms))
        np.testing.assert_allclose(ours.asnumpy(), expected, rtol=1e-3, atol=1e-5)


def test_mindarmour_noise_has_std_sigma_c_and_is_fresh_at_every_step():
    NoiseGaussianRandom, _ = algo.import_mindarmour()
    noise = NoiseGaussianRandom(2.0, 1.5, seed=3)
    zeros = ms.Tensor(np.zeros(20000, np.float32))
    first, second = noise(zeros).asnumpy(), noise(zeros).asnumpy()
    assert np.std(first) == pytest.approx(3.0, rel=0.03) and abs(np.mean(first)) < 0.1
    assert not np.allclose(first, second)
