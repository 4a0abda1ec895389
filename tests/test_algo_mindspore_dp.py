"""The MindSpore algo's DP machinery against naive per-example gradients, and MindArmour's noise."""
import os

import numpy as np
import pytest
from conftest import ALGO_ASSETS

from mnist_dp.assets import load_asset_module

os.environ.setdefault("GLOG_v", "3")
ms = pytest.importorskip("mindspore")
algo = load_asset_module(ALGO_ASSETS["mindspore"] / "algo.py", "algo_mindspore_dp")


@pytest.fixture(scope="module")
def net_and_batch():
    rng = np.random.default_rng(0)
    net = algo.SampleConvNet()
    x = rng.random((algo.CHUNK_SIZE, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, algo.CHUNK_SIZE).astype(np.int32)
    return net, x, y


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
    mask = np.zeros(algo.CHUNK_SIZE, np.float32)
    mask[:count] = 1
    got = algo.ClippedGradientSum(net, net.trainable_params(), clip)(ms.Tensor(x), ms.Tensor(y), ms.Tensor(mask))
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


def test_padded_chunks_cover_every_index_once():
    indices = np.arange(600)
    chunks = list(algo.padded_chunks(indices, 256))
    assert [int(mask.sum()) for _, mask in chunks] == [256, 256, 88]
    assert np.array_equal(np.concatenate([idx[mask > 0] for idx, mask in chunks]), indices)
    [(empty, mask)] = algo.padded_chunks(np.arange(0), 256)  # an empty Poisson batch is still one step
    assert mask.sum() == 0 and len(empty) == 256
