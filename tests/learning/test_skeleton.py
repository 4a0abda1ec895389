import dataclasses

import numpy as np
import pytest
from conftest import StepsThatLearnNothing, dict_hp

from mnist_dp.learning import skeleton
from mnist_dp.privacy import events
from mnist_dp.utils.errors import UserError


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

    def dp_step(self, model, optimizer, inputs, labels, step):
        self.seen = inputs.dtype, inputs.shape, self.data["images"]
        return super().dp_step(model, optimizer, inputs, labels, step)

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
        skeleton.train_in_memory(framework, None, Ledger(), data, hp, "x", {}, "",
                                 release_images=release)
        assert framework.seen[:2] == (np.float16, (40, 3969))
        assert (framework.seen[2] is None) == release and (data["images"] is images) != release


def test_a_train_task_makes_its_plan_once_and_only_the_plan_asks_the_accountant(opener_path,
                                                                               monkeypatch):
    """One plan per task: task_plan.for_task runs once, and asks the accountant once
    (accountant.account_run): every other call into the accountant while the task trains (σ's
    calibration, the budget's cut) comes from that question."""
    import sys

    from mnist_dp.assets import load_asset_module
    from mnist_dp.privacy import accountant, task_plan
    from mnist_dp.privacy.ledger import Ledger

    callers, plans = [], []

    def recording(real, into):
        def recorded(*args, **kwargs):
            into.append(sys._getframe(1).f_globals["__name__"])  # noqa: SLF001 - who called
            return real(*args, **kwargs)
        return recorded

    for name in ("account_run", "calibrate_noise_multiplier", "noise_range", "steps_within_budget",
                 "compose_epsilon"):
        monkeypatch.setattr(accountant, name, recording(getattr(accountant, name), callers))
    monkeypatch.setattr(task_plan, "for_task", recording(task_plan.for_task, plans))
    opener = load_asset_module(opener_path, "opener_for_plan_tests")
    data = opener.MnistOpener().fake_data(400)
    hp = dict_hp(epochs=1, batch_size=40, target_epsilon=0.5, max_epsilon=0.4, delta=1e-3)
    plan, ran = skeleton.train_in_memory(SeesItsInputs(data), None, Ledger(), data, hp, "x", {},
                                         "")
    assert plans == [skeleton.__name__] and ran.steps == plan.sampling.steps > 0
    assert plan.sampling.stopped_by_budget  # the budget cut it: the plan asked for that too
    assert set(callers) - {accountant.__name__} == {task_plan.__name__}
    assert callers.count(task_plan.__name__) == 1  # one question: account_run


def test_the_progress_bar_shows_the_epoch_and_no_figure_the_report_would_contradict(
        opener_path, monkeypatch, capsys):
    """An RDP ε along the way (3.13 for a 3.0 target) contradicted the reported PLD figure: the bar
    counts steps and epochs only."""
    from mnist_dp.assets import load_asset_module
    from mnist_dp.privacy.ledger import Ledger
    from mnist_dp.utils import progress

    monkeypatch.setenv(progress.VARIABLE, "1")  # as on a terminal
    data = load_asset_module(opener_path, "opener_for_bar_tests").MnistOpener().fake_data(100)
    hp = dict_hp(epochs=2, batch_size=50, noise_multiplier=1.0, target_epsilon=None)
    skeleton.train_in_memory(SeesItsInputs(data), None, Ledger(), data, hp, "x", {}, "")
    bar = capsys.readouterr().err
    assert "epoch 2/2" in bar and "ε" not in bar and "RDP" not in bar
