"""The DP-SGD mechanism of every framework, measured on its real training steps (training.fit, or
the framework's own `fit` with the weights read between steps).

Learning rate 1 and no momentum: a step moves the weights by exactly -(sum of clipped per-example
gradients + N(0, (σC)²)) / (expected batch size). Tests that compare two runs ask for the same
noise_seed (the same batches and noise); a run without one draws fresh noise.
"""
import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import ALGO_ASSETS, FRAMEWORKS
from scipy import stats

from mnist_dp import hyperparameters
from mnist_dp.assets import load_asset_module
from mnist_dp.learning import interface, model_io, training
from mnist_dp.privacy import task_plan
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan
from mnist_dp.utils.errors import UserError

C = 1.0
rng = np.random.default_rng(0)
IMAGES = rng.random((8, 28, 28), dtype=np.float32)
LABELS = np.arange(8) % 10
# with a label the model does not predict (see wrong_labels): gradients far above C
HUGE = IMAGES * 100


@dataclass(frozen=True)
class Case:
    """One framework training one of the networks (NETWORKS)."""

    algo: object
    network: interface.Network

    @property
    def name(self):
        return self.algo.name


# Every network: the CNN on pixels, the ScatterNet CNN and the linear
# classifier on scattering features.
NETWORKS = [("pixels", "cnn"), ("scattering", "cnn"), ("scattering", "linear")]


class ScaledStart:
    """The framework, its new models' weights times `scale`: scattering features are normalised per
    example, so a HUGE image does not make a CNN's gradients huge on them; larger weights do (ReLU:
    each layer's gradient grows with the others' weights)."""

    def __init__(self, framework, scale):
        self.framework, self.scale = framework, scale

    def __getattr__(self, name):
        return getattr(self.framework, name)

    def new_model(self, seed, network):
        model = self.framework.new_model(seed, network)
        return self.framework.set_weight_arrays(model, [a * self.scale
                                                 for a in self.framework.weight_arrays(model)])


@pytest.fixture(scope="module", params=[(f, *network) for f in FRAMEWORKS for network in NETWORKS],
                ids=lambda p: "-".join(p))
def framework(request):
    name, features, network = request.param
    algo = load_asset_module(ALGO_ASSETS[name] / "algo.py", f"algo_{name}_mechanism")
    # ReLU: its gradients grow with the input (HUGE), tanh's saturate; clipping and
    # noise do not depend on it.
    scattering_cnn = (features, network) == ("scattering", "cnn")
    return Case(ScaledStart(algo.FRAMEWORK, 3.0) if scattering_cnn else algo.FRAMEWORK,
                interface.Network(features, "relu", network))


# The noise, its schedule and the sampling are each framework's whatever the layers: the tests of
# them run on the default network (a CNN in every framework); clipping, which each network's
# per-example norms make, runs on every network.
DEFAULT_NETWORK = pytest.mark.parametrize(
    "framework", [(f, "scattering", "cnn") for f in FRAMEWORKS], indirect=True,
    ids=lambda p: "-".join(p))


def make_hp(**changes):
    """Learning rate 1, no momentum, no averaging: the weights move by exactly the update."""
    return hyperparameters.parse({
        "epochs": 1, "batch_size": 8, "learning_rate": 1.0, "momentum": 0.0, "max_grad_norm": C,
        "noise_multiplier": 1.0, "target_epsilon": None, "max_epsilon": None, "delta": 1e-5,
                                  "seed": 0, "dp": True, "secure_mode": False, "features": "pixels",
        "network": "cnn", "activation": "tanh", "optimizer": "sgd", "ema_decay": 0.0,
        "noise_decay": 1.0, "clip_quantile": None, "clip_learning_rate": 0.2,
        "clip_count_stddev": None, "noise_seed": 0, **changes}, "test")


def fit(case, images, labels, sigma, dp=True, noise_seed=0, epochs=1, batch_size=None,
        secure_mode=False):
    hp = make_hp(epochs=epochs, batch_size=batch_size or len(labels), noise_seed=noise_seed, dp=dp,
                 secure_mode=secure_mode, **dataclasses.asdict(case.network))
    plan = plan_of(case.name, hp, len(labels), sigma)
    model = case.algo.new_model(0, case.network)
    before = interface.flat_weights(case.algo, model)
    ran = training.fit(case.algo, model, case.network.inputs(images), labels, plan,
                       RunRandomness.for_run(hp.noise_seed))
    return before - interface.flat_weights(case.algo, model), ran  # = lr × the update applied


def plan_of(framework, hp, n, sigma=1.0, identities=()):
    """The plan of a run of `hp` on `n` examples at gradient noise `sigma` (not the task's checks:
    some of these schedules are steeper than a task allows, to measure each stage)."""
    return TaskPlan.of(framework, hp, SamplingPlan.from_hyperparameters(n, hp, "test"), sigma,
                       identities)


def wrong_labels(case, images):
    """Labels the initial model does not predict: the loss gradient cannot vanish (saturated
    softmax)."""
    return (model_io.predicted_labels(case.algo, case.algo.new_model(0, case.network), images,
                                      case.network) + 1) % 10


def test_every_per_example_contribution_is_clipped_to_c(framework):
    labels = wrong_labels(framework, HUGE)
    for i in (0, 1):  # one example per step: its clipped gradient is the whole update
        raw, _ = fit(framework, HUGE[i : i + 1], labels[i : i + 1], sigma=0.0, dp=False)
        assert np.linalg.norm(raw) > 10 * C  # deliberately huge
        clipped, _ = fit(framework, HUGE[i : i + 1], labels[i : i + 1], sigma=0.0)
        assert np.linalg.norm(clipped) == pytest.approx(C, rel=1e-3)  # clipped to exactly C
    update, ran = fit(framework, HUGE, labels, sigma=0.0)
    assert ran.batch_sizes == [8] and ran.clipping == "per-example"
    assert np.linalg.norm(update) <= C * (1 + 1e-4)  # mean of 8 contributions of norm ≤ C


@DEFAULT_NETWORK
def test_noise_has_standard_deviation_sigma_c_over_the_expected_batch(framework):
    sigma = 2.0
    clean, _ = fit(framework, IMAGES, LABELS, sigma=0.0)
    noisy, _ = fit(framework, IMAGES, LABELS, sigma=sigma)
    noise = noisy - clean  # the same batch and gradients: the difference is the noise alone
    expected = sigma * C / len(LABELS)
    assert noise.size > 20000  # one sample per weight
    assert np.std(noise) == pytest.approx(expected, rel=0.03)
    assert abs(np.mean(noise)) < 4 * expected / np.sqrt(noise.size)
    assert stats.normaltest(noise).pvalue > 1e-4  # Gaussian


@DEFAULT_NETWORK
def test_without_dp_nothing_is_clipped_or_noised_and_with_dp_seeds_differ(framework):
    labels = wrong_labels(framework, HUGE)
    plain, ran = fit(framework, HUGE, labels, sigma=1.0, dp=False)
    assert ran.noise_multiplier == 0 and ran.clipping == "none"
    assert np.linalg.norm(plain) > 10 * C  # not clipped
    again, _ = fit(framework, HUGE, labels, sigma=1.0, dp=False, noise_seed=1)
    # no noise: the seed changes nothing
    np.testing.assert_allclose(again, plain, rtol=1e-4, atol=1e-6)
    first, _ = fit(framework, IMAGES, LABELS, sigma=1.0, noise_seed=0)
    second, _ = fit(framework, IMAGES, LABELS, sigma=1.0, noise_seed=1)
    assert np.linalg.norm(first - second) > 0.1 * np.linalg.norm(first)
    replayed, _ = fit(framework, IMAGES, LABELS, sigma=1.0, noise_seed=0)
    # noise_seed: the same noise again
    np.testing.assert_allclose(replayed, first, rtol=1e-4, atol=1e-6)


@DEFAULT_NETWORK
def test_by_default_two_runs_on_identical_inputs_draw_different_noise(framework):
    sigma = 2.0
    first, ran = fit(framework, IMAGES, LABELS, sigma=sigma, noise_seed=None)
    second, _ = fit(framework, IMAGES, LABELS, sigma=sigma, noise_seed=None)
    assert not ran.replayable_noise
    difference = first - second  # noise minus independent noise: std √2·σC/E[B]
    assert np.std(difference) == pytest.approx(np.sqrt(2) * sigma * C / len(LABELS), rel=0.03)


@DEFAULT_NETWORK
def test_secure_mode_noise_cannot_be_replayed_and_keeps_its_size(framework):
    sigma = 2.0
    if framework.name == "tf":  # refused by the run's checks, before any plan is made
        with pytest.raises(UserError, match="TF Privacy offers no secure noise"):
            task_plan.check_run("tf", make_hp(secure_mode=True, noise_seed=None), len(LABELS),
                                "test")
        return
    first, _ = fit(framework, IMAGES, LABELS, sigma=sigma, secure_mode=True, noise_seed=None)
    second, _ = fit(framework, IMAGES, LABELS, sigma=sigma, secure_mode=True, noise_seed=None)
    difference = first - second  # noise minus independent noise: std √2·σC/E[B]
    assert np.std(difference) == pytest.approx(np.sqrt(2) * sigma * C / len(LABELS), rel=0.03)


@DEFAULT_NETWORK
def test_noise_is_divided_by_the_expected_batch_size_not_the_realised_one(framework):
    n, sigma = 16, 2.0
    images, labels = np.resize(IMAGES, (n, 28, 28)), np.resize(LABELS, n)
    hp = make_hp(batch_size=8)  # q = 1/2: E[B] = 8
    plan = plan_of("torch", hp, n)
    # A noise_seed whose first Poisson batch is far from E[B]: normalising by the realised
    # size would be off by 37%+.
    noise_seed = next(seed for seed in range(100)
                      if abs(len(first_batch(plan, hp, seed)) - 8) in (3, 4, 5, 6))
    clean, *_ = stepwise(framework, images, labels, sigma=0.0, batch_size=8, noise_seed=noise_seed)
    noisy, _, _, ran = stepwise(framework, images, labels, sigma=sigma, batch_size=8,
                                noise_seed=noise_seed)
    # the batch the test chose trained
    assert ran.batch_sizes[0] == len(first_batch(plan, hp, noise_seed))
    # The first step of both runs: the same weights and batch, so the difference is the noise alone.
    assert np.std(noisy[0] - clean[0]) == pytest.approx(
        sigma * C / plan.sampling.expected_batch_size, rel=0.03)


def first_batch(plan, hp, noise_seed):
    return next(training.sampled_batches(plan, RunRandomness.for_run(noise_seed),
                                         lambda steps: ""))


@DEFAULT_NETWORK
def test_every_framework_trains_binomial_poisson_batches_exactly_the_planned_steps(framework):
    n, batch = 64, 8  # q = 1/8
    images, labels = np.resize(IMAGES, (n, 28, 28)), np.resize(LABELS, n)
    _, ran = fit(framework, images, labels, sigma=1.0, epochs=40, batch_size=batch)
    assert len(ran.batch_sizes) == 320
    assert_binomial(ran.batch_sizes, n, 1 / 8)
    plan = plan_of("torch", make_hp(batch_size=batch, epochs=40), n)
    drawn = training.sampled_batches(plan, RunRandomness.for_run(0), lambda steps: "")
    # the shared sampler's batches are what trains
    assert ran.batch_sizes == [len(b) for b in drawn]


def stepwise(case, images, labels, sigma, clip_class=training.ClipNorm, **changes):
    """The framework's steps (training.train_steps) on the shared sampler's batches, the weights
    read before each batch is handed out: (the update of every step (learning rate 1: the weight
    change), the weight arrays' shapes, the clip, what ran)."""
    hp = make_hp(**{"batch_size": len(labels), **dataclasses.asdict(case.network), **changes})
    plan = plan_of(case.name, hp, len(labels), sigma)
    model = case.algo.new_model(0, case.network)
    randomness = RunRandomness.for_run(hp.noise_seed)
    clip = clip_class(plan, randomness)
    step = training.DpStep(plan.schedule, clip, randomness)
    weights = []

    def batches():
        for batch in training.sampled_batches(plan, randomness, lambda steps: ""):
            weights.append(interface.flat_weights(case.algo, model))
            yield batch
        weights.append(interface.flat_weights(case.algo, model))

    ran = training.train_steps(case.algo, model, case.network.inputs(images), labels, plan, step,
                               batches())
    assert len(ran.batch_sizes) == plan.sampling.steps
    shapes = [a.shape for a in case.algo.weight_arrays(model)]
    return [before - after for before, after in zip(weights, weights[1:])], shapes, clip, ran


@DEFAULT_NETWORK
def test_sigma_of_every_step_follows_the_noise_schedule(framework):
    # 4 planned steps on the whole batch (q = 1): σ halves at each quarter, 8, 4, 2, 1. The clipped
    # sum (norm ≤ 8C over ≥ 26,000 weights) shifts the measured std by under 0.2%.
    updates, *_ = stepwise(framework, IMAGES, LABELS, sigma=8.0, epochs=4, noise_decay=0.5)
    for t, update in enumerate(updates):
        assert np.std(update) == pytest.approx(8.0 * 0.5 ** t * C / len(LABELS), rel=0.03), t


@DEFAULT_NETWORK
def test_noise_is_independent_across_weight_tensors_and_steps(framework):
    updates, shapes, *_ = stepwise(framework, IMAGES, LABELS, sigma=8.0, epochs=3)
    # a replayed generator would repeat the noise: correlation 1
    for a, b in zip(updates, updates[1:]):
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(a.size)
    tensors = np.split(updates[0], np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1])
    for i in range(len(tensors)):
        for j in range(i + 1, len(tensors)):
            # a generator restarted per tensor repeats its start
            length = min(tensors[i].size, tensors[j].size)
            correlation = np.corrcoef(tensors[i][:length], tensors[j][:length])[0, 1]
            assert abs(correlation) < max(5 / np.sqrt(length), 0.95), (i, j, correlation)


class RecordingClip(training.ClipNorm):
    """The run's clipping norm, remembering every update: (unclipped count, batch size, C
    before, C after)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.history = []

    def update(self, unclipped, batch_size):
        before = self.value
        super().update(unclipped, batch_size)
        self.history.append((unclipped, batch_size, before, self.value))


@DEFAULT_NETWORK
def test_adaptive_clipping_count_noise_has_its_standard_deviation(framework):
    n, stddev, rate, quantile = 64, 2.0, 0.01, 0.5
    images, labels = np.resize(IMAGES, (n, 28, 28)), np.resize(LABELS, n)
    # C far above every gradient norm: every example is unclipped, so the count the step reports
    # is the batch size, and the noise is what moved C: log(C'/C) = -rate · ((unclipped - B/2 + z)
    # / E[B] + 1/2 - quantile).
    _, _, clip, _ = stepwise(framework, images, labels, sigma=0.0, clip_class=RecordingClip,
                             epochs=50, batch_size=8, max_grad_norm=1e6, learning_rate=0.01,
                          clip_quantile=quantile, clip_learning_rate=rate, clip_count_stddev=stddev)
    unclipped, sizes, before, after = map(np.array, zip(*clip.history))
    assert len(sizes) == 400 and np.array_equal(unclipped, sizes)  # the real step's count
    noise = 8 * (-np.log(after / before) / rate + quantile - 0.5) - unclipped + sizes / 2
    # 400 draws: the estimate's own spread is 3.5%
    assert np.std(noise) == pytest.approx(stddev, rel=0.15)
    assert abs(np.mean(noise)) < 4 * stddev / np.sqrt(len(noise))


def test_the_shared_sampler_draws_binomial_batch_sizes_and_fresh_batches():
    hp = make_hp(epochs=50, batch_size=25, noise_seed=3)
    plan = plan_of("torch", hp, 500)  # q = 1/20, 1000 steps
    batches = list(training.sampled_batches(plan, RunRandomness.for_run(3), lambda steps: ""))
    assert len(batches) == 1000
    assert_binomial([len(b) for b in batches], 500, 1 / 20)
    # each example: Binomial(1000, q) times
    counts = np.bincount(np.concatenate(batches), minlength=500)
    assert_binomial(counts, 1000, 1 / 20)


def assert_binomial(sizes, n, q):
    """Chi-square goodness of fit of the batch sizes to Binomial(n, q) (tails pooled)."""
    sizes = np.asarray(sizes)
    low, high = int(stats.binom.ppf(0.02, n, q)), int(stats.binom.ppf(0.98, n, q))
    observed = [np.sum(sizes <= low)] + [np.sum(sizes == k)
                                         for k in range(low + 1, high)] + [np.sum(sizes >= high)]
    expected = np.array([stats.binom.cdf(low, n, q)] + [stats.binom.pmf(k, n, q)
                                                        for k in range(low + 1, high)]
                        + [stats.binom.sf(high - 1, n, q)]) * len(sizes)
    assert stats.chisquare(observed, expected).pvalue > 1e-3, (observed, expected.round(1))


@DEFAULT_NETWORK
def test_every_utility_option_trains_and_the_ledger_records_what_changes_epsilon(framework):
    hp = make_hp(epochs=2, batch_size=4, optimizer="adam", learning_rate=0.01, ema_decay=0.5,
                 noise_decay=0.5, clip_quantile=0.5, **dataclasses.asdict(framework.network))
    # 2 steps per epoch, 4 planned
    plan = plan_of(framework.name, hp, len(LABELS), 1.0, ("d",))
    model = framework.algo.new_model(0, framework.network)
    before = interface.flat_weights(framework.algo, model)
    ran = training.fit(framework.algo, model, framework.network.inputs(IMAGES), LABELS, plan,
                       RunRandomness.for_run(hp.noise_seed))
    after = interface.flat_weights(framework.algo, model)
    assert np.all(np.isfinite(after)) and not np.allclose(after, before)
    event = plan.event(ran)
    # σ halves at each quarter of the 4 steps
    assert (event.noise_decay, event.decay_steps) == (0.5, 1)
    assert event.count_noise_multiplier == pytest.approx(
        2 * plan.sampling.expected_batch_size / 20)
    assert ran.library_epsilon == {}  # no library accounts for a schedule or a count: none is shown


@DEFAULT_NETWORK
def test_an_empty_poisson_batch_is_a_step_of_noise_alone_and_a_run_at_expected_batch_2_finishes(
        framework):
    """At E[B] = 2 of 16 examples (q = 1/8) about one step in eight draws no example: it still runs,
    adding the noise alone (std σC / E[B]), as the accountant counts it. (tf's conv layers once
    failed on a batch of 0.)"""
    n, sigma = 16, 2.0
    images, labels = np.resize(IMAGES, (n, 28, 28)), np.resize(LABELS, n)
    hp = make_hp(batch_size=2, epochs=3)
    plan = plan_of("torch", hp, n)
    seed = next(s for s in range(100) if 0 in [len(b) for b in training.sampled_batches(
        plan, RunRandomness.for_run(s), lambda steps: "")][:-1])
    noisy, _, _, ran = stepwise(framework, images, labels, sigma=sigma, batch_size=2, epochs=3,
                                noise_seed=seed)
    clean, *_ = stepwise(framework, images, labels, sigma=0.0, batch_size=2, epochs=3,
                         noise_seed=seed)
    empty = ran.batch_sizes.index(0)
    assert len(ran.batch_sizes) == plan.sampling.steps == 24
    assert not np.any(clean[empty])  # nothing to clip, no noise: the weights stay
    expected_batch_size = plan.sampling.expected_batch_size
    assert np.std(noisy[empty]) == pytest.approx(sigma * C / expected_batch_size, rel=0.03)
    assert abs(np.mean(noisy[empty])) < 4 * sigma * C / expected_batch_size / np.sqrt(
        noisy[empty].size)


def test_secure_mode_draws_adaptive_clippings_count_noise_as_the_sum_of_four_over_two():
    hp, secure_hp = make_hp(clip_quantile=0.5, noise_seed=None), make_hp(clip_quantile=0.5,
                            noise_seed=None, secure_mode=True)
    randomness = RunRandomness(12345)
    plain = training.ClipNorm(plan_of("torch", hp, 8), randomness)
    secure = training.ClipNorm(plan_of("torch", secure_hp, 8), randomness)
    draws = np.array([secure.count_noise() for _ in range(4000)])
    same_stream = randomness.numpy("count noise").normal(0.0, plain.stddev, size=(4000, 4))
    # never a single draw
    np.testing.assert_allclose(draws, same_stream.sum(axis=1) / 2, rtol=1e-12)
    assert np.std(draws) == pytest.approx(plain.stddev, rel=0.05)  # the std the ledger accounts for
    # without it: one draw
    assert plain.count_noise() == pytest.approx(same_stream[0, 0], rel=1e-12)
