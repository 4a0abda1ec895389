"""The MindSpore algo's networks and DP machinery against MindSpore's own layers and naive
per-example gradients, the DP step's noise, and why that noise is not MindArmour's."""
import os

import numpy as np
import pytest
from conftest import ALGO_ASSETS, fresh_python

from mnist_dp.assets import load_asset_module
from mnist_dp.learning import chunks
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.task_plan import SamplingPlan

os.environ.setdefault("GLOG_v", "3")
ms = pytest.importorskip("mindspore")
algo = load_asset_module(ALGO_ASSETS["mindspore"] / "algo.py", "algo_mindspore_dp")
networks = algo.networks
layers = networks.layers


CHUNK = 16


@pytest.fixture(scope="module", params=["cnn", "scatter-cnn", "linear"])
def net_and_batch(request):
    rng = np.random.default_rng(0)
    if request.param == "cnn":
        net, x = networks.TutorialCNN(), rng.random((CHUNK, 1, 28, 28), dtype=np.float32)
        reference = net  # its PatchConv2d is tested against nn.Conv2d below
    elif request.param == "scatter-cnn":  # random weights everywhere: the shortcut starts at 0
        net, x = networks.ScatterNetCNN(), rng.normal(size=(CHUNK, 3969)).astype(np.float32)
        reference = same_weights(ScatterNetReference(), randomised(net, rng))
    else:  # random weights: the zero start would give every example the same gradient norm
        net, x = randomised(networks.ScatteringLinear(),
                            rng), rng.normal(size=(CHUNK, 3969)).astype(np.float32)
        reference = net
    y = rng.integers(0, 10, CHUNK).astype(np.int32)
    return net, x, y, reference


def randomised(net, rng):
    for parameter in net.get_parameters():
        parameter.set_data(ms.Tensor(rng.normal(0, 0.1, parameter.shape).astype(np.float32)))
    return net


def same_weights(reference, net):
    """`reference` with `net`'s parameters (every one of net's, by name)."""
    arrays = {p.name: p.asnumpy() for p in net.get_parameters()}
    for parameter in reference.get_parameters():
        if parameter.name in arrays:
            parameter.set_data(ms.Tensor(arrays.pop(parameter.name)))
    assert not arrays, f"the reference has no {sorted(arrays)}"
    return reference


class ScatterNetReference(ms.nn.Cell):
    """The ScatterNet CNN from MindSpore's own layers, as the torch and tf algos build it: what
    ScatterNetCNN must compute, in value and gradient."""

    def __init__(self):
        from mindspore import nn

        super().__init__()
        self.conv1 = nn.Conv2d(81, 16, 3, stride=2, pad_mode="pad", padding=1, has_bias=True)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=1, pad_mode="pad", padding=1, has_bias=True)
        self.fc1, self.fc2 = nn.Dense(512, 32), nn.Dense(32, 10)
        self.shortcut = nn.Dense(3969, 10, has_bias=False)
        self.norm1 = nn.GroupNorm(4, 16, eps=1e-5, affine=False)
        self.norm2 = nn.GroupNorm(8, 32, eps=1e-5, affine=False)
        self.tanh, self.flatten = nn.Tanh(), nn.Flatten()

    def construct(self, x):
        x = x.astype(ms.float32)
        h = self.tanh(self.norm1(self.conv1(x.reshape(-1, 81, 7, 7))))  # -> [B, 16, 4, 4]
        h = self.tanh(self.norm2(self.conv2(h)))  # -> [B, 32, 4, 4]
        return self.fc2(self.tanh(self.fc1(self.flatten(h)))) + self.shortcut(x)


def parameter_gradients(net, x, y):
    from mindspore import nn

    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum")
    grads = ms.grad(nn.WithLossCell(net, loss), grad_position=None,
                    weights=net.trainable_params())(x, y)
    return {p.name: g.asnumpy() for p, g in zip(net.trainable_params(), grads)}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_scatternet_cnn_is_the_cnn_of_mindspores_own_layers_in_value_and_gradient(dtype):
    rng = np.random.default_rng(2)
    net = randomised(networks.ScatterNetCNN(), rng)
    reference = same_weights(ScatterNetReference(), net)
    x, y = ms.Tensor(
        rng.normal(size=(5,
                         3969)).astype(dtype)), ms.Tensor(rng.integers(0, 10, 5).astype(np.int32))
    np.testing.assert_allclose(net(x).asnumpy(), reference(x).asnumpy(), rtol=1e-5, atol=1e-5)
    expected = parameter_gradients(reference, x, y)
    got = parameter_gradients(net, x, y)
    assert list(got) == list(networks.ScatterNetCNN.GRADIENT_ORDER)
    for name, gradient in got.items():
        np.testing.assert_allclose(gradient, expected[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("size, kernel, stride, padding",
                         [(4, 3, 1, 1), (7, 3, 2, 1), (6, 2, 2, 0), (5, 3, 1, 2)])
def test_toeplitz_convolution_is_mindspores_conv2d_in_value_and_gradient(
        size, kernel, stride, padding):
    from mindspore import nn

    rng = np.random.default_rng(3)
    ours = layers.ToeplitzConv2d(size, 3, 4, kernel, stride, padding)
    reference = nn.Conv2d(3, 4, kernel, stride=stride, pad_mode="pad" if padding else "valid",
                          padding=padding)
    weight = ms.Tensor(rng.normal(size=(4, 3, kernel, kernel)).astype(np.float32))
    reference.weight.set_data(weight)
    x = rng.normal(size=(2, 3, size, size)).astype(np.float32)
    channels_last = ms.Tensor(x.transpose(0, 2, 3, 1).reshape(2, -1))

    def squared(z, w):  # the squared output of ours, in NCHW order as the reference's
        return (ours(z, w) ** 2).sum()

    out = ours(channels_last, weight).asnumpy()
    np.testing.assert_allclose(out.reshape(reference(ms.Tensor(x)).shape),
                               reference(ms.Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-5)
    input_grad, weight_grad = ms.grad(squared, grad_position=(0, 1))(channels_last, weight)
    ref_input, (ref_weight,) = ms.grad(SquaredOutput(reference), grad_position=0,
                                       weights=reference.trainable_params())(ms.Tensor(x))
    np.testing.assert_allclose(input_grad.asnumpy(),
                               ref_input.asnumpy().transpose(0, 2, 3, 1).reshape(2, -1), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(weight_grad.asnumpy(), ref_weight.asnumpy(), rtol=1e-4, atol=1e-4)


def test_group_norm_is_mindspores_in_value_and_gradient_in_any_layout():
    from mindspore import nn

    rng = np.random.default_rng(4)
    # [B, C, P]: 8 channels in 2 groups of 4, 5 positions
    z = rng.normal(size=(3, 8, 5)).astype(np.float32)
    reference = nn.GroupNorm(2, 8, eps=1e-5, affine=False)
    expected = reference(ms.Tensor(z[..., None])).asnumpy()[..., 0]
    expected_grad = ms.grad(SquaredOutput(reference))(ms.Tensor(z[..., None])).asnumpy()[..., 0]
    groups = np.arange(8) // 4
    for layout, entry_groups in (((0, 1, 2), np.repeat(groups, 5)),
                                 ((0, 2, 1), np.tile(groups, 5))):
        ours = layers.GroupNorm(entry_groups)
        laid = ms.Tensor(np.ascontiguousarray(z.transpose(layout)).reshape(3, -1))
        shape = z.transpose(layout).shape  # [B, C, P] channel-major, then [B, P, C]: channels last
        np.testing.assert_allclose(ours(laid).asnumpy().reshape(shape), expected.transpose(layout),
                                   atol=1e-5)
        np.testing.assert_allclose(ms.grad(SquaredOutput(ours))(laid).asnumpy().reshape(shape),
                                   expected_grad.transpose(layout), atol=1e-4)


def test_patch_convolution_refuses_what_it_does_not_compute():
    with pytest.raises(ValueError, match="dilation 1"):
        networks.PatchConv2d(1, 4, 3, dilation=2)


class SquaredOutput(ms.nn.Cell):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def construct(self, x):
        return (self.layer(x) ** 2).sum()


@pytest.mark.parametrize("channels, kernel, stride, padding, size",
                         [(1, 8, 2, 3, 28), (16, 4, 2, 0, 13), (3, 3, 1, 1, 9),
                          (2, (3, 5), (1, 2), 1, 9)])
def test_patch_convolution_is_mindspores_conv2d_in_value_and_gradient(
        channels, kernel, stride, padding, size):
    from mindspore import nn

    pad_mode = "pad" if padding else "valid"
    ours = networks.PatchConv2d(channels, 5, kernel, stride=stride, pad_mode=pad_mode,
                                padding=padding, has_bias=True)
    reference = nn.Conv2d(channels, 5, kernel, stride=stride, pad_mode=pad_mode, padding=padding,
                          has_bias=True)
    assert [p.name for p in ours.get_parameters()] == [p.name for p in reference.get_parameters()]
    ms.load_param_into_net(reference, {p.name: ms.Parameter(p.data.copy(), name=p.name)
                                       for p in ours.get_parameters()})
    x = ms.Tensor(np.random.default_rng(1).random((3, channels, size, size), dtype=np.float32))
    np.testing.assert_allclose(ours(x).asnumpy(), reference(x).asnumpy(), rtol=1e-5, atol=1e-5)

    def gradients(layer):  # w.r.t. the input and every parameter
        inputs_grad, weights_grad = ms.grad(SquaredOutput(layer), grad_position=0,
                                            weights=layer.trainable_params())(x)
        return [g.asnumpy() for g in (inputs_grad, *weights_grad)]

    for got, expected in zip(gradients(ours), gradients(reference)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def naive_per_example_gradients(net, x, y, count, order):
    """Each of the first `count` examples' gradients, one backward pass each, as a list in `order`
    (names)."""
    per_example = [parameter_gradients(net, ms.Tensor(x[i : i + 1]), ms.Tensor(y[i : i + 1]))
                   for i in range(count)]
    return [[grads[name] for name in order] for grads in per_example]


def test_clipped_sum_is_the_masked_sum_of_clipped_per_example_gradients(net_and_batch):
    net, x, y, reference = net_and_batch
    count = 6  # the rest of the chunk is padding, masked out
    per_example = naive_per_example_gradients(reference, x, y, count, net.GRADIENT_ORDER)
    norms = [np.sqrt(sum(np.sum(g ** 2) for g in grads)) for grads in per_example]
    clip = float(np.median(norms))  # some examples clipped, some not
    mask = np.zeros(CHUNK, np.float32)
    mask[:count] = 1
    # The data rows of a larger set whose examples sit in a shuffled order, taken at
    # this chunk's places in it.
    place = np.random.default_rng(5).permutation(3 * CHUNK)[:CHUNK]
    stored = np.random.default_rng(6).normal(size=(3 * CHUNK, *x.shape[1:])).astype(np.float32)
    stored[place] = x
    rows = algo.data_rows(net, stored)
    assert (rows is not None) == isinstance(net, networks.ScatterNetCNN)
    *got, unclipped = algo.ClippedGradientSum(net, net.trainable_params())(
        ms.Tensor(x), ms.Tensor(y), ms.Tensor(mask), clip, None if rows is None else rows[place])
    # adaptive clipping's count
    assert int(unclipped.asnumpy()) == sum(norm <= clip for norm in norms)
    for k, ours in enumerate(got):
        expected = sum(grads[k] * min(1.0, clip / norm) for grads, norm in zip(per_example, norms))
        np.testing.assert_allclose(ours.asnumpy(), expected, rtol=1e-3, atol=1e-5)


def test_each_parameters_per_example_norm_is_its_naive_gradients(net_and_batch):
    """Term by term: the shortcut holds about 97 % of a ScatterNet example's squared norm and
    conv1's bias 1e-5, so a term dropped from the total would move the clipped sum less than any
    tolerance the sum could be held to."""
    net, x, y, reference = net_and_batch
    per_example = naive_per_example_gradients(reference, x, y, CHUNK, net.GRADIENT_ORDER)
    # -> [B, parameters]
    expected = np.array([[np.sum(g ** 2) for g in grads] for grads in per_example])
    rows = algo.data_rows(net, x)
    got = algo.ClippedGradientSum(net, net.trainable_params()).squared_norms(
        ms.Tensor(x), ms.Tensor(y), rows)
    np.testing.assert_allclose(got.asnumpy(), expected, rtol=1e-4, atol=1e-12)


def test_the_clipped_sum_refuses_a_chunk_without_its_rows_and_rows_it_does_not_take():
    x, y, mask = ms.Tensor(
        np.zeros((4, 3969), np.float32)), ms.Tensor(np.zeros(4, np.int32)), ms.Tensor(np.ones(4))
    scatter_cnn, linear = networks.ScatterNetCNN(), networks.ScatteringLinear()
    with pytest.raises(ValueError, match="takes its chunk's data rows"):
        algo.ClippedGradientSum(scatter_cnn, scatter_cnn.trainable_params())(x, y, mask, 1.0)
    with pytest.raises(ValueError, match="takes no data rows"):
        algo.ClippedGradientSum(linear, linear.trainable_params())(
            x, y, mask, 1.0, np.zeros((4, 137), np.float32))


@pytest.mark.parametrize("secure_mode", [False, True])
def test_a_step_adds_the_runs_noise_to_the_clipped_sum_of_all_its_chunks(secure_mode):
    """40 examples at E[B] = 8 are three chunks (18, 18, and 4 padded to 16), the last one clipped,
    noised and applied in one graph: the weights move by -lr / E[B] times the clipped sum of all 40
    plus σC times the unit noise the run's "gradient noise" generator draws (with secure_mode,
    Opacus' sum of four draws over 2)."""
    rng = np.random.default_rng(3)
    net = randomised(networks.ScatteringLinear(), rng)
    x, y = rng.normal(size=(40, 3969)).astype(np.float32), rng.integers(0, 10, 40).astype(np.int32)
    clip, lr, sigma, expected_batch = 0.5, 0.25, 0.7, 8.0
    *clipped, unclipped = algo.ClippedGradientSum(net, net.trainable_params())(
        ms.Tensor(x), ms.Tensor(y), ms.Tensor(np.ones(40, np.float32)), clip)
    # asnumpy shares the weights' memory
    before = [p.asnumpy().copy() for p in net.trainable_params()]
    step = algo.make_dp_step(net, ms.nn.SGD(net.trainable_params(), learning_rate=lr),
                             expected_batch, RunRandomness(7).numpy("gradient noise"), secure_mode)
    assert step(x, y, np.arange(40), clip, sigma) == int(unclipped.asnumpy())
    noise = algo.unit_noise(RunRandomness(7).numpy("gradient noise"), sum(w.size for w in before),
                            secure_mode)
    ends = np.cumsum([w.size for w in before])
    for w, after, g, z in zip(before, net.trainable_params(), clipped, np.split(noise, ends[:-1])):
        expected = w - lr * (g.asnumpy() + sigma * clip * z.reshape(w.shape)) / expected_batch
        np.testing.assert_allclose(after.asnumpy(), expected, rtol=1e-5, atol=1e-6)


# Why the algo's noise is not MindArmour's: a model of MindSpore 2.9's CPU StandardNormal, which
# MindArmour's NoiseGaussianRandom draws with. A Philox hash of the global and op seed, kept modulo
# 2³¹ − 1, is the whole state of libstdc++'s minstd_rand0 (period 2³¹ − 2), then
# std::normal_distribution<float> (Marsaglia's polar method).
MASK, MINSTD = 0xFFFFFFFF, 2**31 - 1


def kernel_state(global_seed, op_seed):
    counter, key = [global_seed & MASK, global_seed >> 32, op_seed & MASK,
                    op_seed >> 32], [0x3EC8F720, 0x02461E29]
    for _ in range(10):  # Philox4x32-10
        a, b = 0xD2511F53 * counter[0], 0xCD9E8D57 * counter[2]
        counter = [(b >> 32) ^ counter[1] ^ key[0], b & MASK, (a >> 32) ^ counter[3] ^ key[1],
                   a & MASK]
        key = [(key[0] + 0x9E3779B9) & MASK, (key[1] + 0xBB67AE85) & MASK]
    return ((counter[1] << 32) | counter[0]) % MINSTD or 1


def minstd_normals(state, count):
    f, out = np.float32, []
    while len(out) < count:
        r2 = f(0)
        while not 0 < r2 <= 1:
            state = state * 16807 % MINSTD
            x = f(2 * f(f(state - 1) / f(2147483646)) - 1)
            state = state * 16807 % MINSTD
            y = f(2 * f(f(state - 1) / f(2147483646)) - 1)
            r2 = f(x * x + y * y)
        scale = f(np.sqrt(f(-2) * np.log(r2) / r2))
        out += [y * scale, x * scale]
    return np.array(out[:count], np.float32)


class MindArmourDraw(ms.nn.Cell):
    def __init__(self, seed, size):
        super().__init__()
        self.noise = algo.import_mindarmour("NoiseGaussianRandom")(1.0, 1.0, seed=seed)
        self.shape = ms.Tensor(np.zeros(size, np.float32))

    def construct(self):
        return self.noise(self.shape)


def test_mindarmours_cpu_noise_is_a_31_bit_generator_so_the_algo_draws_its_own():
    """Two launches of one NoiseGaussianRandom continue one minstd_rand0 stream set by 31 bits: a
    draw holds 31 bits whatever its seeds, in a period of 2³¹ − 2 numbers, most of which a
    Fashion-MNIST task's noise would use."""
    ms.set_seed(1234567)
    draw = MindArmourDraw(890123, 1000)
    first, second = draw().asnumpy(), draw().asnumpy()
    stream = minstd_normals(kernel_state(1234567, 890123), 1064)
    np.testing.assert_allclose(first[:64], stream[:64], atol=2e-6)
    np.testing.assert_allclose(second[:64], stream[1000:], atol=2e-6)


def test_per_person_clipped_sum_clips_each_persons_summed_naive_gradients(net_and_batch):
    """A person's gradient is the sum of their examples' naive ones, clipped as one, term by term
    in its squared norm (a dropped cross term between two of a person's examples fails it); the
    grid's padding (a row's empty slots, a row without a person) is no one's."""
    net, x, y, reference = net_and_batch
    persons = np.array([0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 4, 5, 5, 6, 6, 6])
    per_example = naive_per_example_gradients(reference, x, y, CHUNK, net.GRADIENT_ORDER)
    summed = [[sum(per_example[i][k] for i in np.flatnonzero(persons == p))
               for k in range(len(net.GRADIENT_ORDER))] for p in range(7)]
    clipped_sum = algo.ClippedGradientSum(net, net.trainable_params(), per_person=True)
    # 7 persons in 8 rows of 4
    [(index, mask, person_mask)] = chunks.person_grids(np.arange(CHUNK), persons, (8, 9), 4)
    x, y = ms.Tensor(x[index]), ms.Tensor(y[index])
    got = clipped_sum.run(x, y, ms.Tensor(mask), 1.0, None, person_mask)[-1].asnumpy()
    expected = np.array([[np.sum(g ** 2) for g in person] for person in summed])
    np.testing.assert_allclose(got[:7], expected, rtol=1e-4, atol=1e-12)
    assert not got[7:].any()  # no one in the padding row
    alone = np.array([[sum(np.sum(per_example[i][k] ** 2) for i in np.flatnonzero(persons == p))
                       for k in range(len(net.GRADIENT_ORDER))] for p in range(7)])
    assert (np.abs(expected - alone).max(0) > 1e-3 * expected.max(0)).all()  # cross terms count

    # the last person's row made padding
    mask[6 * 4:], person_mask[6:] = 0, 0
    norms = np.sqrt(expected[:6].sum(1))
    clip = float(np.median(norms))
    *got, unclipped = clipped_sum(x, y, ms.Tensor(mask), clip, None, person_mask)
    assert int(unclipped.asnumpy()) == sum(norm <= clip for norm in norms)
    for k, ours in enumerate(got):
        want = sum(summed[p][k] * min(1.0, clip / norms[p]) for p in range(6))
        np.testing.assert_allclose(ours.asnumpy(), want, rtol=1e-3, atol=1e-5)


def test_mindarmour_imports_without_its_version_warning_and_leaves_time_sleep_alone():
    """MindArmour 2.0 warns at import that it predates MindSpore 2.9, then sleeps a second: the
    algo filters the warning out through logging and lets the sleep reach time.sleep (a recorder
    here), replacing nothing of the standard library."""
    script = ("import logging, sys, time; logging.basicConfig(stream=sys.stderr); "
              f"sys.path.insert(0, {str(ALGO_ASSETS['mindspore'])!r}); import algo; "
              "slept, sleep = [], time.sleep; "
              "time.sleep = lambda seconds: slept.append(seconds) or sleep(seconds); "
              "monitor = algo.import_mindarmour('RDPMonitor'); print(monitor.__name__, slept)")
    proc = fresh_python(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "RDPMonitor [1]"
    assert "MindArmour" not in proc.stderr and "countdown" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("n, sample_rate, sigma, steps",
                         [(300, 0.2, 1.0, 2), (1000, 0.01, 3.0, 17)])
def test_mindarmours_figure_is_its_callbacks_for_exactly_the_runs_steps(
        n, sample_rate, sigma, steps, capsys):
    """The figure comes from RDPMonitor's documented `step_end`, which counts its print interval
    and one more step: it is what the monitor's accountant gives for `steps` steps (its private
    method, an oracle here only), and its printed line does not reach the task's output."""
    got = algo.mindarmour_epsilon(n, sample_rate, sigma, steps, 1e-5)
    monitor = algo.import_mindarmour("RDPMonitor")(
        num_samples=n, batch_size=round(n * sample_rate), initial_noise_multiplier=sigma,
        max_eps=1e9, target_delta=1e-5, noise_decay_mode=None, per_print_times=steps)
    assert got == float(monitor._compute_privacy_steps(list(range(steps)))[0])
    assert capsys.readouterr().out == ""
    one_step = algo.FRAMEWORK.library_epsilon(SamplingPlan(n, round(1 / sample_rate), 1), 1e-5, 1,
                                              sigma)
    assert one_step == {}  # the monitor cannot count a single step
