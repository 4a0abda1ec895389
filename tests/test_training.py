import dataclasses
import math

import numpy as np
import pytest

from mnist_dp import hyperparameters, privacy, training
from mnist_dp.errors import UserError
from mnist_dp.randomness import RunRandomness

BASE = {"epochs": 2, "batch_size": 50, "learning_rate": 0.1, "momentum": 0.9, "max_grad_norm": 1.0,
        "noise_multiplier": None, "target_epsilon": 2.0, "max_epsilon": None, "delta": 1e-5, "seed": 0, "dp": True,
        "secure_mode": False, "features": "pixels", "activation": "tanh", "optimizer": "sgd", "ema_decay": 0.0,
        "noise_decay": 1.0, "clip_quantile": None, "clip_learning_rate": 0.2, "clip_count_stddev": None,
        "noise_seed": None}


def test_sampling_plan_follows_opacus_convention():
    plan = training.SamplingPlan.from_hyperparameters(1001, hyperparameters.parse(BASE, "x"), "x")
    assert plan.steps_per_epoch == 21 and plan.sample_rate == pytest.approx(1 / 21) and plan.steps == 42


def test_noise_for_rounds_keeps_every_organisation_within_the_target_after_the_last_round():
    hp = hyperparameters.parse(BASE, "x")
    sizes, rounds = [1000, 600], 3
    fixed = training.noise_for_rounds(hp, sizes, rounds)
    assert fixed.target_epsilon is None and fixed.noise_multiplier > 0
    epsilons = []
    for n in sizes:
        plan = training.SamplingPlan.from_hyperparameters(n, hp, "x")
        event = privacy.DpEvent("torch", ("d",), n, plan.sample_rate, fixed.noise_multiplier, plan.steps,
                                privacy.PER_EXAMPLE, 1.0)
        epsilons.append(privacy.compose_epsilon([event] * rounds, hp.delta))
    assert max(epsilons) <= hp.target_epsilon and max(epsilons) == pytest.approx(hp.target_epsilon, abs=0.02)
    # one round, a fixed σ or no DP: nothing to do (each task calibrates its own run)
    assert training.noise_for_rounds(hp, sizes, 1) is hp
    baseline = hyperparameters.parse({**BASE, "dp": False}, "x")
    assert training.noise_for_rounds(baseline, sizes, 3) is baseline


def test_budget_cuts_the_plan_stops_when_spent_or_refuses():
    hp = hyperparameters.parse({**BASE, "target_epsilon": None, "noise_multiplier": 1.0, "max_epsilon": 2.0}, "x")
    plan = training.SamplingPlan.from_hyperparameters(1000, hp, "x")
    cut = training.apply_budget("torch", ("d",), hp, plan, 1.0, [])
    assert 0 < cut.steps < plan.steps == cut.planned_steps
    spent = privacy.DpEvent("torch", ("d",), 1000, plan.sample_rate, 1.0, cut.steps, privacy.PER_EXAMPLE, 1.0)
    assert training.apply_budget("torch", ("d",), hp, plan, 1.0, [spent]).steps == 0  # the task trains nothing
    with pytest.raises(UserError, match="below the ε of a single step"):
        training.apply_budget("torch", ("d",), hp, plan, 0.4, [])
    assert training.apply_budget("torch", ("d",), hyperparameters.parse(BASE, "x"), plan, 1.0, []) is plan


@pytest.mark.parametrize("dp", [True, False])
def test_batches_report_progress_once_per_epoch_without_a_terminal(dp):
    # pytest's output is no terminal, so the progress bar is disabled: the epoch callback (an ε
    # computation) must still run once per epoch, not at every step.
    hp = hyperparameters.parse({**BASE, "epochs": 3, "dp": dp}, "x")
    plan = training.SamplingPlan.from_hyperparameters(1000, hp, "x")
    calls = []
    batches = list(training.sampled_batches(plan, hp, RunRandomness.fresh(), lambda steps: calls.append(steps) or "",
                                            "x"))
    assert len(batches) == 60 and calls == [20, 40, 60]


def test_the_noise_schedule_and_the_count_follow_the_hyperparameters():
    hp = hyperparameters.parse({**BASE, "noise_decay": 0.5, "clip_quantile": 0.5}, "x")
    plan = training.SamplingPlan.from_hyperparameters(1001, hp, "x")  # 21 steps per epoch, 42 planned
    noise = training.noise_schedule(hp, plan, 2.0)
    assert noise.decay_steps == 11 and noise.count_noise_multiplier == pytest.approx(2 * plan.expected_batch_size / 20)
    assert [noise.gradient_sigma(t) for t in (0, 10, 11, 41)] == [2.0, 2.0, 1.0, 0.25]
    assert training.noise_schedule(dict_hp(dp=False), plan, 2.0).sigma == 0


def dict_hp(**changes):
    return hyperparameters.parse({**BASE, **changes}, "x")


@pytest.mark.parametrize("unclipped, direction", [(50, -1), (0, 1)])
def test_adaptive_clipping_moves_c_towards_the_quantile(unclipped, direction):
    hp = dict_hp(clip_quantile=0.5, clip_learning_rate=0.2, clip_count_stddev=0.01)
    plan = training.SamplingPlan.from_hyperparameters(1000, hp, "x")  # E[B] = 50
    clip = training.ClipNorm(hp, plan, RunRandomness.fresh())
    clip.update(unclipped, 50)  # all unclipped: C too large, shrinks; all clipped: grows
    assert clip.value == pytest.approx(1.0 * math.exp(-0.2 * ((unclipped - 25) / 50 + 0.5 - 0.5)), rel=1e-3)
    assert (clip.value - 1.0) * direction > 0
    fixed = training.ClipNorm(dict_hp(), plan, RunRandomness.fresh())
    fixed.update(0, 50)
    assert fixed.value == 1.0


class ShortFramework:
    """A framework that stops one step early (as Opacus' own sampler did for some q)."""

    name = "short"

    def fit(self, model, images, labels, hp, plan, step, batches):
        return training.Ran([len(batch) for batch, _ in zip(batches, range(plan.steps - 1))])


def test_a_framework_that_does_not_run_every_planned_step_is_refused():
    hp = dict_hp(epochs=1, batch_size=10)
    plan = training.SamplingPlan.from_hyperparameters(930, hp, "x")  # 93 steps: 1/(1/93) is 92.99999... in floats
    with pytest.raises(RuntimeError, match="ran 92 steps where the plan has 93"):
        training.fit(ShortFramework(), None, np.zeros((930, 28, 28), np.float32), np.zeros(930, np.int64), hp, plan,
                     1.0, lambda steps: "")
    assert not plan.stopped_by_budget and dataclasses.replace(plan, max_steps=50).stopped_by_budget


def test_the_average_is_the_exact_weighted_mean_in_each_arrays_dtype():
    rng = np.random.default_rng(0)
    models = [[rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5)] for _ in range(3)]
    mean = training.weighted_mean(models, [200, 100, 0])  # the third trained nothing this round: weight 0
    for i, array in enumerate(mean):
        expected = (200 * models[0][i].astype(np.float64) + 100 * models[1][i].astype(np.float64)) / 300
        assert array.dtype == models[0][i].dtype
        np.testing.assert_array_equal(array, expected.astype(models[0][i].dtype))
    np.testing.assert_array_equal(training.weighted_mean(models[:2], [0, 0])[1], (models[0][1] + models[1][1]) / 2)
    with pytest.raises(UserError, match="differ in shape"):
        training.weighted_mean([models[0], [models[0][0], np.zeros(4)]], [1, 1])


class ArrayModels:
    """A training.Framework for aggregation alone: a model is one float32 vector, saved as its bytes."""

    name = "torch"

    def load_model(self, weights, network):
        return np.frombuffer(weights, np.float32).copy()

    def dump_model(self, model):
        return model.tobytes()

    def weight_arrays(self, model):
        return [model]

    def set_weight_arrays(self, model, arrays):
        return arrays[0]


def test_an_organisation_that_trained_nothing_weighs_nothing_in_the_average(tmp_path):
    from conftest import ledger_event, save_model

    from mnist_dp import model_file

    def run(org, n):
        return dataclasses.replace(ledger_event(data=(org,), n=n), run_id=privacy.new_run_id())

    history = [run("a", 200), run("b", 100)]  # the global model of round 1
    a, b = run("a", 200), run("b", 100)
    paths = [save_model(tmp_path / "a", history + [a], np.full(3, 1.0, np.float32).tobytes()),
             save_model(tmp_path / "b", history + [b], np.full(3, 4.0, np.float32).tobytes()),
             # organisation c's budget was spent: its task passed the global model on unchanged
             save_model(tmp_path / "c", history, np.full(3, 100.0, np.float32).tobytes())]
    training.aggregate(ArrayModels(), {"models": [str(p) for p in paths]}, {"model": str(tmp_path / "avg")},
                       tmp_path / "hyperparameters.json")
    saved = model_file.load(tmp_path / "avg", "torch")
    np.testing.assert_array_equal(np.frombuffer(saved.weights, np.float32), np.full(3, 2.0, np.float32))
    assert saved.ledger.events == history + [a, b]
    assert [i["examples"] for i in saved.hyperparameters[model_file.AGGREGATED]] == [200, 100, 0]
    with pytest.raises(UserError, match="no input models"):
        training.aggregate(ArrayModels(), {"models": []}, {"model": str(tmp_path / "none")}, tmp_path / "hp.json")
