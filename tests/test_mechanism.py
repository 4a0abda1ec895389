"""The DP-SGD mechanism of every framework, measured on one real training step (training.fit).

One step with q = 1 (every example in the batch), learning rate 1 and no momentum: the weights move by
exactly -(sum of clipped per-example gradients + N(0, (σC)²)) / (expected batch size).
"""
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import ALGO_ASSETS, FRAMEWORKS
from scipy import stats

from mnist_dp import hyperparameters, training
from mnist_dp.assets import load_asset_module
from mnist_dp.errors import UserError

C = 1.0
rng = np.random.default_rng(0)
IMAGES = rng.random((8, 28, 28), dtype=np.float32)
LABELS = np.arange(8) % 10
HUGE = IMAGES * 100  # with a label the model does not predict (see wrong_labels): gradients far above C


@dataclass(frozen=True)
class Case:
    """One framework training one of the networks (the CNN on pixels, the linear classifier on features)."""

    algo: object
    network: training.Network

    @property
    def name(self):
        return self.algo.name


@pytest.fixture(scope="module", params=[(f, features) for f in FRAMEWORKS for features in ("pixels", "scattering")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def framework(request):
    name, features = request.param
    algo = load_asset_module(ALGO_ASSETS[name] / "algo.py", f"algo_{name}_mechanism")
    # ReLU: its gradients grow with the input (HUGE), tanh's saturate; clipping and noise do not depend on it.
    return Case(algo.FRAMEWORK, training.Network(features, "relu"))


def make_hp(**changes):
    """Learning rate 1, no momentum, no averaging: the weights move by exactly the update."""
    return hyperparameters.parse({
        "epochs": 1, "batch_size": 8, "learning_rate": 1.0, "momentum": 0.0, "max_grad_norm": C,
        "noise_multiplier": 1.0, "target_epsilon": None, "max_epsilon": None, "delta": 1e-5, "seed": 0, "dp": True,
        "secure_mode": False, "features": "pixels", "activation": "tanh", "optimizer": "sgd", "ema_decay": 0.0,
        "noise_decay": 1.0, "clip_quantile": None, "clip_learning_rate": 0.2, "clip_count_stddev": None,
        **changes}, "test")


def fit(case, images, labels, sigma, dp=True, seed=0, epochs=1, batch_size=None, secure_mode=False):
    hp = make_hp(epochs=epochs, batch_size=batch_size or len(labels), seed=seed, dp=dp, secure_mode=secure_mode,
                 features=case.network.features, activation=case.network.activation)
    plan = training.SamplingPlan.from_hyperparameters(len(labels), hp, "test")
    model = case.algo.new_model(0, case.network)
    before = training.flat_weights(case.algo, model)
    result = training.fit(case.algo, model, images, labels, hp, plan, sigma, lambda steps: "")
    return before - training.flat_weights(case.algo, model), result  # = lr × the update applied


def wrong_labels(case, images):
    """Labels the initial model does not predict: the loss gradient cannot vanish (saturated softmax)."""
    return (training.predicted_labels(case.algo, case.algo.new_model(0, case.network), images, case.network) + 1) % 10


def test_every_per_example_contribution_is_clipped_to_c(framework):
    labels = wrong_labels(framework, HUGE)
    for i in (0, 1):  # one example per step: its clipped gradient is the whole update
        raw, _ = fit(framework, HUGE[i : i + 1], labels[i : i + 1], sigma=0.0, dp=False)
        assert np.linalg.norm(raw) > 10 * C  # deliberately huge
        clipped, _ = fit(framework, HUGE[i : i + 1], labels[i : i + 1], sigma=0.0)
        assert np.linalg.norm(clipped) == pytest.approx(C, rel=1e-3)  # clipped to exactly C
    update, result = fit(framework, HUGE, labels, sigma=0.0)
    assert result.batch_sizes == [8] and result.clipping == "per-example"
    assert np.linalg.norm(update) <= C * (1 + 1e-4)  # mean of 8 contributions of norm ≤ C


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


def test_without_dp_nothing_is_clipped_or_noised_and_with_dp_seeds_differ(framework):
    labels = wrong_labels(framework, HUGE)
    plain, result = fit(framework, HUGE, labels, sigma=1.0, dp=False)
    assert result.noise_multiplier == 0 and result.clipping == "none"
    assert np.linalg.norm(plain) > 10 * C  # not clipped
    again, _ = fit(framework, HUGE, labels, sigma=1.0, dp=False, seed=1)
    np.testing.assert_allclose(again, plain, rtol=1e-4, atol=1e-6)  # no noise: the seed changes nothing
    first, _ = fit(framework, IMAGES, LABELS, sigma=1.0, seed=0)
    second, _ = fit(framework, IMAGES, LABELS, sigma=1.0, seed=1)
    assert np.linalg.norm(first - second) > 0.1 * np.linalg.norm(first)


def test_secure_mode_noise_cannot_be_replayed_and_keeps_its_size(framework):
    sigma = 2.0
    if framework.name == "tf":
        with pytest.raises(UserError, match="TF Privacy offers no secure noise"):
            fit(framework, IMAGES, LABELS, sigma=sigma, secure_mode=True)
        return
    first, _ = fit(framework, IMAGES, LABELS, sigma=sigma, secure_mode=True)
    second, _ = fit(framework, IMAGES, LABELS, sigma=sigma, secure_mode=True)  # same seed: still fresh noise
    difference = first - second  # noise minus independent noise: std √2·σC/E[B]
    assert np.std(difference) == pytest.approx(np.sqrt(2) * sigma * C / len(LABELS), rel=0.03)


def test_realised_batch_sizes_are_the_poisson_samples(framework):
    n, batch = 64, 8  # q = 1/8
    images, labels = np.resize(IMAGES, (n, 28, 28)), np.resize(LABELS, n)
    if framework.name == "torch":  # Opacus samples (DPDataLoader): test its batch sizes directly, many steps
        _, result = fit(framework, images, labels, sigma=1.0, epochs=40, batch_size=batch)
        assert_binomial(result.batch_sizes, n, 1 / 8)
    else:  # the shared sampler (its distribution: the next test): check it is what trains
        _, result = fit(framework, images, labels, sigma=1.0, epochs=1, batch_size=batch)
        hp = make_hp(batch_size=batch)
        plan = training.SamplingPlan.from_hyperparameters(n, hp, "test")
        assert result.batch_sizes == [len(b) for b in training.sampled_batches(plan, hp, lambda s: "", "t")]


def test_the_shared_sampler_draws_binomial_batch_sizes_and_fresh_batches():
    hp = make_hp(epochs=50, batch_size=25, seed=3)
    plan = training.SamplingPlan.from_hyperparameters(500, hp, "t")  # q = 1/20, 1000 steps
    batches = list(training.sampled_batches(plan, hp, lambda steps: "", "t"))
    assert len(batches) == 1000
    assert_binomial([len(b) for b in batches], 500, 1 / 20)
    counts = np.bincount(np.concatenate(batches), minlength=500)  # each example: Binomial(1000, q) times
    assert_binomial(counts, 1000, 1 / 20)


def assert_binomial(sizes, n, q):
    """Chi-square goodness of fit of the batch sizes to Binomial(n, q) (tails pooled)."""
    sizes = np.asarray(sizes)
    low, high = int(stats.binom.ppf(0.02, n, q)), int(stats.binom.ppf(0.98, n, q))
    observed = [np.sum(sizes <= low)] + [np.sum(sizes == k) for k in range(low + 1, high)] + [np.sum(sizes >= high)]
    expected = np.array([stats.binom.cdf(low, n, q)] + [stats.binom.pmf(k, n, q) for k in range(low + 1, high)]
                        + [stats.binom.sf(high - 1, n, q)]) * len(sizes)
    assert stats.chisquare(observed, expected).pvalue > 1e-3, (observed, expected.round(1))


def test_every_utility_option_trains_and_the_ledger_records_what_changes_epsilon(framework):
    hp = make_hp(epochs=2, batch_size=4, optimizer="adam", learning_rate=0.01, ema_decay=0.5, noise_decay=0.5,
                 clip_quantile=0.5, features=framework.network.features, activation=framework.network.activation)
    plan = training.SamplingPlan.from_hyperparameters(len(LABELS), hp, "test")  # 2 steps per epoch, 4 planned
    model = framework.algo.new_model(0, framework.network)
    before = training.flat_weights(framework.algo, model)
    result = training.fit(framework.algo, model, IMAGES, LABELS, hp, plan, 1.0, lambda steps: "")
    after = training.flat_weights(framework.algo, model)
    assert np.all(np.isfinite(after)) and not np.allclose(after, before)
    event = training.dp_event(framework.name, ("d",), hp, plan, result)
    assert (event.noise_decay, event.decay_steps) == (0.5, 1)  # σ halves at each quarter of the 4 steps
    assert event.count_noise_multiplier == pytest.approx(2 * plan.expected_batch_size / 20)
    assert result.library_epsilon == {}  # no library accounts for a schedule or a count: none is shown
