"""Every algo asset, through the substratools command line, on tiny data (one epoch).

Parametrised by framework: a new algo asset is covered by adding it to mnist_dp.assets.ALGO_ASSETS.
"""
import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import (
    ALGO_ASSETS,
    FRAMEWORKS,
    TINY_HYPERPARAMETERS,
    extract_function,
    run_function,
    samples,
    tiny_hyperparameters,
)

from mnist_dp import archive, model_file
from mnist_dp.privacy import PER_EXAMPLE, DpEvent, Ledger, calibrate_noise_multiplier, compose_epsilon


def train(tmp_path, framework, data_dir, opener, model=None, name="model", **changes):
    folder = extract_function(ALGO_ASSETS[framework], "train", tmp_path / f"fn-{name}",
                              tiny_hyperparameters(framework, **changes))
    inputs = {"opener": opener, "datasamples": samples(data_dir, "train")}
    if model:
        inputs["model"] = model
    outputs = {"model": tmp_path / name, "epsilon": tmp_path / f"{name}-epsilon.json"}
    proc = run_function(folder / "algo.py", "train", inputs, outputs, check=False)
    return proc, outputs


def read_epsilon(path):
    return json.loads(path.read_text())["all"]


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0]


@pytest.fixture(scope="module", params=FRAMEWORKS)
def trained(request, tmp_path_factory, tiny_data):
    tmp = tmp_path_factory.mktemp(f"trained-{request.param}")
    opener = str(ALGO_ASSETS[request.param].parents[0] / "dataset" / "opener.py")
    proc, outputs = train(tmp, request.param, tiny_data, opener)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return request.param, outputs, tiny_data, opener


def test_train_writes_a_model_whose_ledger_is_what_ran(trained):
    framework, outputs, _, _ = trained
    saved = model_file.load(outputs["model"], framework)
    [event] = saved.ledger.events
    hp = tiny_hyperparameters(framework)
    steps_per_epoch = math.ceil(300 / hp["batch_size"])
    assert (event.n, event.steps, event.noise_multiplier) == (300, steps_per_epoch, hp["noise_multiplier"])
    assert event.sample_rate == pytest.approx(1 / steps_per_epoch)
    assert event.clipping == "per-example" and len(event.data) == 2  # two train data samples
    # which code made it: the function archive it ran from (the one a node would have registered)
    archive_path = next((outputs["model"].parent / "fn-model").glob("*.tar.gz"))
    assert event.code == {"function": "train", "archive_digest": archive.archive_digest(archive_path)}
    assert (event.batch_size, event.planned_steps) == (hp["batch_size"], steps_per_epoch)
    epsilon = read_epsilon(outputs["epsilon"])
    assert epsilon == pytest.approx(saved.ledger.epsilon(hp["delta"]))
    assert 0 < epsilon < math.inf


def test_two_default_runs_on_identical_inputs_give_different_weights_and_store_no_seed(trained, tmp_path):
    framework, first, data_dir, opener = trained
    proc, again = train(tmp_path, framework, data_dir, opener, name="again")
    assert proc.returncode == 0, proc.stderr[-3000:]
    models = [model_file.load(outputs["model"], framework) for outputs in (first, again)]
    assert models[0].weights != models[1].weights  # fresh noise (and batches) at every run
    for saved in models:  # nothing that could replay the noise is stored: the seed is the initialisation's
        assert saved.hyperparameters["seed"] == tiny_hyperparameters(framework)["seed"]
        assert saved.hyperparameters["noise_seed"] is None and not saved.ledger.events[0].replayable_noise
    assert "noise_seed" not in proc.stderr


def test_predict_then_score_from_the_repository_assets(trained, tmp_path, objective_script):
    framework, outputs, data_dir, opener = trained
    test = samples(data_dir, "test")
    # Run straight from the repository: every asset works alone through the substratools CLI.
    run_function(ALGO_ASSETS[framework] / "algo.py", "predict",
                 {"opener": opener, "datasamples": test, "model": outputs["model"]},
                 {"predictions": tmp_path / "predictions"})
    predictions = np.load(tmp_path / "predictions")
    assert predictions.shape == (100,) and predictions.min() >= 0 and predictions.max() <= 9
    run_function(objective_script, "score",
                 {"opener": opener, "datasamples": test, "predictions": tmp_path / "predictions"},
                 {"performance": tmp_path / "performance"})
    labels = np.load(data_dir / "test" / "0" / "labels.npy")
    assert read_epsilon(tmp_path / "performance") == pytest.approx(float(np.mean(predictions == labels)))


def test_continuing_training_composes_the_ledger(trained, tmp_path):
    framework, first, data_dir, opener = trained
    proc, second = train(tmp_path, framework, data_dir, opener, model=first["model"], name="second")
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = model_file.load(second["model"])
    events = saved.ledger.events
    assert len(events) == 2
    assert not any(e.replayable_noise for e in events)  # fresh noise in both runs
    delta = tiny_hyperparameters(framework)["delta"]
    both = read_epsilon(second["epsilon"])
    assert both == pytest.approx(compose_epsilon(events, delta))
    assert both > read_epsilon(first["epsilon"]) * 1.2
    # the same as one run of all the steps together
    one_long_run = dataclasses.replace(events[0], steps=events[0].steps * 2)
    assert Ledger(events).epsilon(delta, "rdp") == pytest.approx(compose_epsilon([one_long_run], delta, "rdp"))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_target_epsilon_gives_the_same_sigma_everywhere_and_the_budget_stops_training(framework, tmp_path, tiny_data,
                                                                                         opener_path):
    delta, q, planned = TINY_HYPERPARAMETERS["delta"], 1 / 5, 5  # 300 examples, batch 64: 5 steps per epoch
    sigma = calibrate_noise_multiplier(8.0, delta, q, planned)

    def epsilon_after(steps):
        return compose_epsilon([DpEvent(framework, ("x",), 300, q, sigma, steps, PER_EXAMPLE, 1.0)], delta)

    budget = (epsilon_after(3) + epsilon_after(4)) / 2
    proc, outputs = train(tmp_path, framework, tiny_data, opener_path, noise_multiplier=None, target_epsilon=8.0,
                          max_epsilon=budget)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = model_file.load(outputs["model"], framework)
    [event] = saved.ledger.events
    assert event.noise_multiplier == sigma  # calibrated in the shared skeleton: identical for every framework
    assert event.steps == 3 and "stopping after 3 of 5 steps" in proc.stderr
    assert saved.hyperparameters["stopped_by_budget"] and saved.hyperparameters["planned_steps"] == planned
    assert read_epsilon(outputs["epsilon"]) == pytest.approx(epsilon_after(3)) and epsilon_after(3) <= budget
    assert event.library_epsilon  # the library's own figure is kept for the privacy statement

    # the 4th step at this σ would exceed the budget: a task continuing from this model trains nothing and passes
    # the model on unchanged (in a plan, the other organisations go on)
    proc, more = train(tmp_path, framework, tiny_data, opener_path, model=outputs["model"], name="more",
                       noise_multiplier=sigma, target_epsilon=None, max_epsilon=budget)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"privacy budget spent: the input model's ε on this data is already {epsilon_after(3):.3f}" in proc.stderr
    assert more["model"].read_bytes() == outputs["model"].read_bytes()
    assert read_epsilon(more["epsilon"]) == pytest.approx(epsilon_after(3))
    # the same model with its ledger edited (3 steps -> 1) must not pass where it is refused
    from test_model_file import ledger_edit, rewrite

    rewrite(outputs["model"], "ledger.json", ledger_edit("steps", 1))
    proc, _ = train(tmp_path, framework, tiny_data, opener_path, model=outputs["model"], name="edited",
                    noise_multiplier=sigma, target_epsilon=None, max_epsilon=budget)
    assert_one_line_error(proc, str(outputs["model"]), "its ledger does not match the sha256 recorded")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_non_private_baseline_reports_infinite_epsilon(framework, tmp_path, tiny_data, opener_path):
    proc, outputs = train(tmp_path, framework, tiny_data, opener_path, dp=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_epsilon(outputs["epsilon"]) == math.inf
    [event] = model_file.load(outputs["model"]).ledger.events
    assert event.noise_multiplier == 0 and event.clipping == "none"


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("changes, fragments", [
    ({"noise_multiplier": 0.0}, ["noise_multiplier = 0.0", "hyperparameters.json"]),
    ({"noise_multiplier": -2.0}, ["noise_multiplier = -2.0"]),
    ({"delta": 0.01}, ["delta = 0.01", "1/n"]),
    ({"batch_size": 1000}, ["batch_size = 1000", "300 training examples"]),
])
def test_bad_hyperparameters_fail_in_one_line(framework, changes, fragments, tmp_path, tiny_data, opener_path):
    proc, _ = train(tmp_path, framework, tiny_data, opener_path, **changes)
    assert_one_line_error(proc, *fragments)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bad_inputs_fail_in_one_line(framework, tmp_path, tiny_data, opener_path):
    script = ALGO_ASSETS[framework] / "algo.py"
    corrupt = tmp_path / "corrupt-model"
    corrupt.write_bytes(b"garbage")
    proc = run_function(script, "predict", {"opener": opener_path, "datasamples": samples(tiny_data, "test"),
                                            "model": corrupt}, {"predictions": tmp_path / "p"}, check=False)
    assert_one_line_error(proc, str(corrupt), "not a valid model file")

    missing = tmp_path / "no-such-sample"
    proc = run_function(script, "predict", {"opener": opener_path, "datasamples": [missing], "model": corrupt},
                        {"predictions": tmp_path / "p"}, check=False)
    assert_one_line_error(proc, str(missing), "not found")

    empty = tmp_path / "empty-sample"
    empty.mkdir()
    proc = run_function(script, "train", {"opener": opener_path, "datasamples": [empty]},
                        {"model": tmp_path / "m", "epsilon": tmp_path / "e"}, check=False)
    assert_one_line_error(proc, "images.npy", "file missing")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_nan_pixels_fail_in_one_line(framework, tmp_path, opener_path):
    sample = tmp_path / "nan-sample"
    sample.mkdir()
    np.save(sample / "images.npy", np.full((4, 28, 28), np.nan, np.float32))
    np.save(sample / "labels.npy", np.arange(4))
    proc = run_function(ALGO_ASSETS[framework] / "algo.py", "train", {"opener": opener_path, "datasamples": [sample]},
                        {"model": tmp_path / "m", "epsilon": tmp_path / "e"}, check=False)
    assert_one_line_error(proc, str(sample / "images.npy"), "NaN")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_aggregate_averages_by_examples_and_counts_every_run_once(framework, tmp_path, opener_path):
    """Two organisations (200 and 100 examples) train two rounds from the global model through the command line;
    the aggregate's weights are the exact weighted mean and its ledger every run once."""
    from mnist_dp import data, training
    from mnist_dp.assets import load_asset_module

    data.generate(tmp_path / "data", train_size=300, test_size=100, train_samples=3, seed=1)
    folders = samples(tmp_path / "data", "train")
    holdings = {"a": folders[:2], "b": folders[2:]}
    aggregate = extract_function(ALGO_ASSETS[framework], "aggregate", tmp_path / "fn-aggregate")
    trainer = extract_function(ALGO_ASSETS[framework], "train", tmp_path / "fn-train", tiny_hyperparameters(framework))
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}_aggregate").FRAMEWORK

    def arrays(path):
        saved = model_file.load(path, framework)
        return algo.weight_arrays(algo.load_model(saved.weights, training.Network.of_saved(saved))), saved

    global_model = None
    for round_idx in (1, 2):
        trained = {}
        for org, own in holdings.items():
            inputs = {"opener": opener_path, "datasamples": own, **({"model": global_model} if global_model else {})}
            trained[org] = tmp_path / f"{org}{round_idx}"
            run_function(trainer / "algo.py", "train", inputs,
                         {"model": trained[org], "epsilon": tmp_path / f"{org}{round_idx}-epsilon"})
        global_model = tmp_path / f"global{round_idx}"
        run_function(aggregate / "algo.py", "aggregate", {"models": [trained["a"], trained["b"]]},
                     {"model": global_model})
        (a, saved_a), (b, saved_b), (mean, saved) = map(arrays, (trained["a"], trained["b"], global_model))
        for x, y, m in zip(a, b, mean):
            np.testing.assert_array_equal(m, ((200 * x.astype(np.float64) + 100 * y.astype(np.float64)) / 300)
                                          .astype(x.dtype))
        # every run once: the global model's (in both inputs) and each organisation's new one
        assert saved.ledger.events == saved_a.ledger.events + saved_b.ledger.events[-1:]
        assert len(saved.ledger.events) == 2 * round_idx
    by_org = {org: [e for e in saved.ledger.events if set(e.data) <= {data.sample_identity(f) for f in own}]
              for org, own in holdings.items()}
    for org, n in (("a", 200), ("b", 100)):
        steps = math.ceil(n / TINY_HYPERPARAMETERS["batch_size"])
        alone = compose_epsilon([DpEvent(framework, ("x",), n, 1 / steps, 1.0, 2 * steps, PER_EXAMPLE, 1.0)],
                                TINY_HYPERPARAMETERS["delta"])  # two rounds, recomputed from σ, q and steps alone
        assert len(by_org[org]) == 2
        assert saved.ledger.epsilon(TINY_HYPERPARAMETERS["delta"], data=by_org[org][0].data) == pytest.approx(alone)
