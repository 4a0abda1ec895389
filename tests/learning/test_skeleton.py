import dataclasses
import itertools
import logging
import math

import numpy as np
import pytest
from conftest import BASE_HP, StepsThatLearnNothing, dict_hp

from mnist_dp import hyperparameters
from mnist_dp.learning import interface, skeleton
from mnist_dp.privacy import events, planning
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.utils.errors import UserError


@pytest.mark.parametrize("dp", [True, False])
def test_batches_report_progress_once_per_epoch_without_a_terminal(dp):
    # pytest's output is no terminal, so the progress bar is disabled: the epoch callback (an ε
    # computation) must still run once per epoch, not at every step.
    hp = hyperparameters.parse({**BASE_HP, "epochs": 3, "dp": dp}, "x")
    plan = planning.SamplingPlan.from_hyperparameters(1000, hp, "x")
    calls = []
    batches = list(skeleton.sampled_batches(plan, hp, RunRandomness.fresh(),
                                            lambda steps: calls.append(steps) or "", "x"))
    assert len(batches) == 60 and calls == [20, 40, 60]


@pytest.mark.parametrize("unclipped, direction", [(50, -1), (0, 1)])
def test_adaptive_clipping_moves_c_towards_the_quantile(unclipped, direction):
    hp = dict_hp(clip_quantile=0.5, clip_learning_rate=0.2, clip_count_stddev=0.01)
    plan = planning.SamplingPlan.from_hyperparameters(1000, hp, "x")  # E[B] = 50
    clip = interface.ClipNorm(hp, plan, RunRandomness.fresh())
    clip.update(unclipped, 50)  # all unclipped: C too large, shrinks; all clipped: grows
    assert clip.value == pytest.approx(1.0 * math.exp(-0.2 * ((unclipped - 25) / 50 + 0.5 - 0.5)),
                                       rel=1e-3)
    assert (clip.value - 1.0) * direction > 0
    fixed = interface.ClipNorm(dict_hp(), plan, RunRandomness.fresh())
    fixed.update(0, 50)
    assert fixed.value == 1.0


class StepCounter(StepsThatLearnNothing):
    """A framework whose DP library reports `library` as its own ε."""

    def __init__(self, library=None):
        self.library = library or {}

    def library_epsilon(self, plan, steps, sigma, delta):
        return self.library


def test_a_run_that_does_not_take_every_planned_step_is_refused():
    """Batches lost on their way to the framework (as Opacus' own sampler lost one for some q)."""
    hp = dict_hp(epochs=1, batch_size=10)
    # 93 steps: 1/(1/93) is 92.99999... in floats
    plan = planning.SamplingPlan.from_hyperparameters(930, hp, "x")
    with pytest.raises(RuntimeError, match="ran 92 steps where the plan has 93"):
        skeleton.fit(StepCounter(), None, np.zeros((930, 28, 28), np.float32),
                     np.zeros(930, np.int64), hp, plan, 1.0, lambda steps: "",
                     through=lambda batches, plan: itertools.islice(batches, plan.steps - 1))
    assert not plan.stopped_by_budget and dataclasses.replace(plan, max_steps=50).stopped_by_budget


def test_a_library_epsilon_that_is_not_finite_is_dropped_with_a_warning():
    hp = dict_hp(epochs=1, batch_size=100)
    plan = planning.SamplingPlan.from_hyperparameters(100, hp, "x")  # q = 1
    # On the skeleton's logger itself: substratools, run by earlier tests in this
    # process, may stop propagation.
    records, handler = [], logging.Handler(logging.WARNING)
    handler.emit = records.append
    skeleton.log.addHandler(handler)
    # nor a level substratools set for its logger
    level, skeleton.log.level = skeleton.log.level, logging.WARNING
    try:
        # MindArmour's at q = 1: NaN
        library = {"fine": 2.5, "monitor": float("nan"), "statement": float("inf")}
        ran = skeleton.fit(StepCounter(library), None, np.zeros((100, 28, 28), np.float32),
                           np.zeros(100, np.int64), hp, plan, 1.0, lambda steps: "")
    finally:
        skeleton.log.removeHandler(handler)
        skeleton.log.level = level
    assert ran.library_epsilon == {"fine": 2.5}
    assert [r.getMessage().split(";")[0] for r in records] == [
        "torch: monitor gave epsilon = nan for this "
        "run", "torch: statement gave epsilon = inf for this run"]
    event = planning.run_event("torch", ("d",), hp, plan, ran.noise_multiplier, ran.steps, ran=ran,
                               code={"function": "train", "archive_digest": None})
    # as a model file stores it: readable again
    assert events.DpEvent.from_json(event.to_json()) == event


def test_the_average_is_the_exact_weighted_mean_in_each_arrays_dtype():
    rng = np.random.default_rng(0)
    models = [[rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5)] for _ in range(3)]
    # the third trained nothing this round: weight 0
    mean = skeleton.weighted_mean(models, [200, 100, 0])
    for i, array in enumerate(mean):
        expected = (
            200 * models[0][i].astype(np.float64) + 100 * models[1][i].astype(np.float64)) / 300
        assert array.dtype == models[0][i].dtype
        np.testing.assert_array_equal(array, expected.astype(models[0][i].dtype))
    np.testing.assert_array_equal(skeleton.weighted_mean(models[:2], [0, 0])[1],
                                  (models[0][1] + models[1][1]) / 2)
    with pytest.raises(UserError, match="differ in shape"):
        skeleton.weighted_mean([models[0], [models[0][0], np.zeros(4)]], [1, 1])


class ArrayModels:
    """A interface.Framework for aggregation alone: a model is one float32 vector, saved as its
    bytes."""

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

    from mnist_dp.privacy import model_file

    def run(org, n):
        return dataclasses.replace(ledger_event(data=(org,), n=n), run_id=events.new_run_id())

    history = [run("a", 200), run("b", 100)]  # the global model of round 1
    a, b = run("a", 200), run("b", 100)
    paths = [save_model(tmp_path / "a", history + [a], np.full(3, 1.0, np.float32).tobytes()),
             save_model(tmp_path / "b", history + [b], np.full(3, 4.0, np.float32).tobytes()),
             # organisation c's budget was spent: its task passed the global model on unchanged
             save_model(tmp_path / "c", history, np.full(3, 100.0, np.float32).tobytes())]
    skeleton.aggregate(ArrayModels(), {"models": [str(p) for p in paths]},
                       {"model": str(tmp_path / "avg")}, tmp_path / "hyperparameters.json")
    saved = model_file.load(tmp_path / "avg", "torch")
    np.testing.assert_array_equal(np.frombuffer(saved.weights, np.float32),
                                  np.full(3, 2.0, np.float32))
    assert saved.ledger.events == history + [a, b]
    assert [i["examples"] for i in saved.hyperparameters[model_file.AGGREGATED]] == [200, 100, 0]
    with pytest.raises(UserError, match="no input models"):
        skeleton.aggregate(ArrayModels(), {"models": []}, {"model": str(tmp_path / "none")},
                           tmp_path / "hp.json")


class SeesItsInputs(StepsThatLearnNothing):
    """A framework that records the inputs it trains on, and whether the task's data still held its
    images then."""

    def __init__(self, data):
        self.data, self.seen = data, None

    def dp_step(self, model, optimizer, inputs, labels, hp, plan, step):
        self.seen = inputs.dtype, inputs.shape, self.data["images"]
        return super().dp_step(model, optimizer, inputs, labels, hp, plan, step)

    def weight_arrays(self, model):
        return []


def test_a_train_task_trains_on_float16_features_and_lets_its_images_go(opener_path):
    """A train task's memory: the features in float16, and no float32 images beside them while
    training (a set of 60,000 takes 188 MB); a caller that keeps its data (substrafl's algos) keeps
    its images."""
    from mnist_dp.assets import load_asset_module
    from mnist_dp.privacy.ledger import Ledger

    opener = load_asset_module(opener_path, "opener_for_skeleton_tests")
    hp = dict_hp(epochs=1, batch_size=20, noise_multiplier=1.0, target_epsilon=None,
                 features="scattering")
    for release in (True, False):
        data = opener.MnistOpener().fake_data(40)
        images, framework = data["images"], SeesItsInputs(data)
        plan = skeleton.check_data(framework, data, hp, "x")
        skeleton.train_in_memory(framework, None, Ledger(), data, hp, plan, {}, "",
                                 release_images=release)
        assert framework.seen[:2] == (np.float16, (40, 3969))
        assert (framework.seen[2] is None) == release and (data["images"] is images) != release
