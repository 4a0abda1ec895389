"""Every algo asset, through the substratools command line, on tiny data (one epoch).

Parametrised by framework: a new algo asset is covered by adding it to mnist_dp.assets.ALGO_ASSETS.
"""
import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import (
    ALGO_ASSETS,
    FRAMEWORKS,
    REPO,
    TINY_HYPERPARAMETERS,
    assert_one_line_error,
    extract_function,
    ledger_edit,
    rewrite_member,
    run_function,
    samples,
    tiny_hyperparameters,
)

from mnist_dp.assets import load_asset_module
from mnist_dp.data import dataset
from mnist_dp.data.samples import KEY_FILE, sample_identity
from mnist_dp.learning import functions, interface, model_io
from mnist_dp.orchestration import archive
from mnist_dp.privacy import data_ledger, model_file, policy
from mnist_dp.privacy.accountant import calibrate_noise_multiplier, compose_epsilon
from mnist_dp.privacy.events import PER_EXAMPLE, DpEvent, new_run_id
from mnist_dp.privacy.ledger import Ledger


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
    assert (event.n, event.steps, event.noise_multiplier) == (300, steps_per_epoch,
            hp["noise_multiplier"])
    assert event.sample_rate == pytest.approx(1 / steps_per_epoch)
    assert event.clipping == "per-example" and len(event.data) == 2  # two train data samples
    # which code made it: the function archive it ran from (the one a node would have registered)
    archive_path = next((outputs["model"].parent / "fn-model").glob("*.tar.gz"))
    assert event.code == {"function": "train",
                          "archive_digest": archive.archive_digest(archive_path)}
    assert (event.batch_size, event.planned_steps) == (hp["batch_size"], steps_per_epoch)
    epsilon = read_epsilon(outputs["epsilon"])
    assert epsilon == pytest.approx(saved.ledger.epsilon(hp["delta"]))
    assert 0 < epsilon < math.inf


def test_two_default_runs_on_identical_inputs_give_different_weights_and_store_no_seed(
        trained, tmp_path):
    framework, first, data_dir, opener = trained
    proc, again = train(tmp_path, framework, data_dir, opener, name="again")
    assert proc.returncode == 0, proc.stderr[-3000:]
    models = [model_file.load(outputs["model"], framework) for outputs in (first, again)]
    assert models[0].weights != models[1].weights  # fresh noise (and batches) at every run
    # nothing that could replay the noise is stored: the seed is the initialisation's
    for saved in models:
        assert saved.hyperparameters["seed"] == tiny_hyperparameters(framework)["seed"]
        assert saved.hyperparameters[
            "noise_seed"] is None and not saved.ledger.events[0].replayable_noise
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
    assert read_epsilon(tmp_path / "performance") == pytest.approx(
        float(np.mean(predictions == labels)))


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
    assert Ledger(events).epsilon(delta, "rdp") == pytest.approx(
        compose_epsilon([one_long_run], delta, "rdp"))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_search_in_every_framework_releases_a_model_that_predicts_and_trains_on(
        framework, tmp_path, tiny_data, opener_path):
    # No search file in the archive: the default search as the tune task runs it, with each
    # framework's DP step (the recipe beside the candidates, then the winner's final run).
    folder = extract_function(ALGO_ASSETS[framework], "tune", tmp_path / "fn-tune",
                              tiny_hyperparameters(framework, noise_multiplier=None,
                                                   target_epsilon=3.0))
    assert not (folder / "search.json").exists()
    tuned = {"model": tmp_path / "tuned", "epsilon": tmp_path / "tuned-epsilon.json"}
    run_function(folder / "algo.py", "tune",
                 {"opener": opener_path, "datasamples": samples(tiny_data, "train")}, tuned)
    saved = model_file.load(tuned["model"], framework)
    search, final = saved.ledger.events
    assert search.search is not None and search.search.recipe is not None
    assert final.search is None and search.framework == final.framework == framework
    assert 0.25 <= saved.hyperparameters["learning_rate"] <= 4.0
    assert 2.5 < read_epsilon(tuned["epsilon"]) <= 3.0
    run_function(ALGO_ASSETS[framework] / "algo.py", "predict",
                 {"opener": opener_path, "datasamples": samples(tiny_data, "test"),
                  "model": tuned["model"]}, {"predictions": tmp_path / "predictions"})
    assert np.load(tmp_path / "predictions").shape == (100,)
    if framework != "torch":
        return  # what follows is the skeleton's ledger arithmetic: checked once
    # Training on from the released model: the search and the new run compose (by
    # RDP, as the search needs).
    proc, more = train(tmp_path, framework, tiny_data, opener_path, model=tuned["model"],
                       name="more", learning_rate=saved.hyperparameters["learning_rate"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = model_file.load(more["model"]).ledger
    assert [e.search is not None for e in ledger.events] == [True, False, False]
    assert read_epsilon(more["epsilon"]) == pytest.approx(ledger.epsilon(1e-4)) and \
        read_epsilon(more["epsilon"]) > read_epsilon(tuned["epsilon"])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_target_epsilon_gives_the_same_sigma_everywhere_and_the_budget_stops_training(
        framework, tmp_path, tiny_data, opener_path):
    # 300 examples, batch 64: 5 steps per epoch
    delta, q, planned = TINY_HYPERPARAMETERS["delta"], 1 / 5, 5
    sigma = calibrate_noise_multiplier(8.0, delta, q, planned)

    def epsilon_after(steps):
        return compose_epsilon([DpEvent(framework, ("x",), 300, q, sigma, steps, PER_EXAMPLE, 1.0)],
                               delta)

    budget = (epsilon_after(3) + epsilon_after(4)) / 2
    proc, outputs = train(tmp_path, framework, tiny_data, opener_path, noise_multiplier=None,
                          target_epsilon=8.0, max_epsilon=budget)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = model_file.load(outputs["model"], framework)
    [event] = saved.ledger.events
    # calibrated in the shared skeleton: identical for every framework
    assert event.noise_multiplier == sigma
    assert event.steps == 3 and "stopping after 3 of 5 steps" in proc.stderr
    assert saved.hyperparameters[
        "stopped_by_budget"] and saved.hyperparameters["planned_steps"] == planned
    assert (read_epsilon(outputs["epsilon"]) == pytest.approx(epsilon_after(3))
            and epsilon_after(3) <= budget)
    assert event.library_epsilon  # the library's own figure is kept for the privacy statement
    if framework != "torch":
        return  # what follows is the skeleton's budget and ledger checks: checked once

    # the 4th step at this σ would exceed the budget: a task continuing from this model trains
    # nothing and passes the model on unchanged (in a plan, the other organisations go on)
    proc, more = train(tmp_path, framework, tiny_data, opener_path, model=outputs["model"],
                       name="more", noise_multiplier=sigma, target_epsilon=None, max_epsilon=budget)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"privacy budget spent: this data's ε is already {epsilon_after(3):.3f}" in proc.stderr
    assert "the input model is passed on unchanged" in proc.stderr
    assert more["model"].read_bytes() == outputs["model"].read_bytes()
    assert read_epsilon(more["epsilon"]) == pytest.approx(epsilon_after(3))
    # the same model with its ledger edited (3 steps -> 1) must not pass where it is refused

    rewrite_member(outputs["model"], "ledger.json", ledger_edit("steps", 1))
    proc, _ = train(tmp_path, framework, tiny_data, opener_path, model=outputs["model"],
                    name="edited", noise_multiplier=sigma, target_epsilon=None, max_epsilon=budget)
    assert_one_line_error(proc, str(outputs["model"]),
                          "its ledger does not match the sha256 recorded")


def test_the_default_network_is_the_scatternet_cnn_with_the_same_layers_in_every_framework(
        trained, tmp_path):
    # trained with the asset's own hyperparameters, one epoch
    framework, outputs, tiny_data, opener = trained
    saved = model_file.load(outputs["model"], framework)
    assert (saved.hyperparameters["features"], saved.hyperparameters["network"]) == ("scattering",
            "cnn")
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}_scatternet")
    network = interface.Network.of_saved(saved)
    weights = algo.FRAMEWORK.weight_arrays(algo.FRAMEWORK.load_model(saved.weights, network))
    # conv 81→16 (3×3), conv 16→32 (3×3), dense 512→32, dense 32→10, each with its bias, and the
    # shortcut 3969→10 without one: in any layout
    assert sorted(a.size for a in weights) == sorted([81 * 16 * 9, 16, 16 * 32 * 9, 32, 512 * 32,
                                                      32, 32 * 10, 10, 3969 * 10])
    # nothing left at zero: the shortcut (zero at first) trained
    assert all(np.abs(w).sum() > 0 for w in weights)
    [event] = saved.ledger.events
    assert event.clipping == PER_EXAMPLE and read_epsilon(outputs["epsilon"]) == pytest.approx(
        saved.ledger.epsilon(tiny_hyperparameters(framework)["delta"]))
    # the linear classifier stays an option, and its model cannot be continued as the
    # CNN: one line naming both
    proc, linear = train(tmp_path, framework, tiny_data, opener, name="linear", network="linear")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc, _ = train(tmp_path, framework, tiny_data, opener, model=linear["model"], name="mixed")
    assert_one_line_error(proc, "input model: its network is network 'linear'",
                          "the hyperparameters say network 'cnn'")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_non_private_baseline_reports_infinite_epsilon(framework, tmp_path, tiny_data, opener_path):
    proc, outputs = train(tmp_path, framework, tiny_data, opener_path, dp=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_epsilon(outputs["epsilon"]) == math.inf
    [event] = model_file.load(outputs["model"]).ledger.events
    assert event.noise_multiplier == 0 and event.clipping == "none"


BAD_HYPERPARAMETERS = [
    ({"noise_multiplier": 0.0}, ["noise_multiplier = 0.0", "hyperparameters.json"]),
    ({"noise_multiplier": -2.0}, ["noise_multiplier = -2.0"]),
    ({"delta": 0.01}, ["delta = 0.01", "1/n"]),
    ({"batch_size": 1000}, ["batch_size = 1000", "300 training examples"]),
]


# Every framework's train task says the first in one line; the checks are the skeleton's, the same
# in every framework: torch says the others.
@pytest.mark.parametrize("framework, changes, fragments", [
    *((framework, *BAD_HYPERPARAMETERS[0]) for framework in FRAMEWORKS),
    *(("torch", *bad) for bad in BAD_HYPERPARAMETERS[1:])])
def test_bad_hyperparameters_fail_in_one_line(framework, changes, fragments, tmp_path, tiny_data,
                                              opener_path):
    proc, _ = train(tmp_path, framework, tiny_data, opener_path, **changes)
    assert_one_line_error(proc, *fragments)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bad_inputs_fail_in_one_line(framework, tmp_path, tiny_data, opener_path):
    script = ALGO_ASSETS[framework] / "algo.py"
    corrupt = tmp_path / "corrupt-model"
    corrupt.write_bytes(b"garbage")
    proc = run_function(script, "predict",
                        {"opener": opener_path, "datasamples": samples(tiny_data, "test"),
                                            "model": corrupt}, {"predictions": tmp_path / "p"},
                        check=False)
    assert_one_line_error(proc, str(corrupt), "not a valid model file")

    missing = tmp_path / "no-such-sample"
    proc = run_function(script, "predict",
                        {"opener": opener_path, "datasamples": [missing], "model": corrupt},
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
    proc = run_function(ALGO_ASSETS[framework] / "algo.py", "train",
                        {"opener": opener_path, "datasamples": [sample]},
                        {"model": tmp_path / "m", "epsilon": tmp_path / "e"}, check=False)
    assert_one_line_error(proc, str(sample / "images.npy"), "NaN")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_aggregate_averages_by_examples_and_counts_every_run_once(framework, tmp_path, opener_path):
    """Two organisations (200 and 100 examples) train from the global model through the command
    line; the aggregate's weights are the exact weighted mean and its ledger every run once. A
    second round, whose inputs both carry the global model's runs, is the skeleton's ledger
    arithmetic, the same in every framework: torch runs it."""
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, train_samples=3, seed=1,
                     organizations=2)
    folders = samples(tmp_path / "data", "train")
    holdings = {"a": folders[0::2], "b": folders[1:2]}  # each organisation its own key
    aggregate = extract_function(ALGO_ASSETS[framework], "aggregate", tmp_path / "fn-aggregate")
    trainer = extract_function(ALGO_ASSETS[framework], "train", tmp_path / "fn-train",
                               tiny_hyperparameters(framework))
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py",
                             f"algo_{framework}_aggregate").FRAMEWORK

    def arrays(path):
        saved = model_file.load(path, framework)
        return algo.weight_arrays(algo.load_model(saved.weights,
                                                  interface.Network.of_saved(saved))), saved

    global_model, rounds = None, 2 if framework == "torch" else 1
    for round_idx in range(1, rounds + 1):
        trained = {}
        for org, own in holdings.items():
            inputs = {"opener": opener_path, "datasamples": own,
                      **({"model": global_model} if global_model else {})}
            trained[org] = tmp_path / f"{org}{round_idx}"
            run_function(trainer / "algo.py", "train", inputs,
                         {"model": trained[org], "epsilon": tmp_path / f"{org}{round_idx}-epsilon"})
        global_model = tmp_path / f"global{round_idx}"
        run_function(aggregate / "algo.py", "aggregate", {"models": [trained["a"], trained["b"]]},
                     {"model": global_model})
        (a, saved_a), (b, saved_b), (mean, saved) = map(arrays,
                                                        (trained["a"], trained["b"], global_model))
        for x, y, m in zip(a, b, mean):
            np.testing.assert_array_equal(
                m,
                ((200 * x.astype(np.float64) + 100 * y.astype(np.float64)) / 300).astype(x.dtype))
        # every run once: the global model's (in both inputs) and each organisation's new one
        assert saved.ledger.events == saved_a.ledger.events + saved_b.ledger.events[-1:]
        assert len(saved.ledger.events) == 2 * round_idx
    by_org = {org: [e for e in saved.ledger.events
                    if set(e.data) <= {sample_identity(f) for f in own}]
              for org, own in holdings.items()}
    for org, n in (("a", 200), ("b", 100)):
        steps = math.ceil(n / TINY_HYPERPARAMETERS["batch_size"])
        alone = compose_epsilon([DpEvent(framework, ("x",), n, 1 / steps, 1.0, rounds * steps,
                                         PER_EXAMPLE, 1.0)],
                                # every round, recomputed from σ, q and steps alone
                                TINY_HYPERPARAMETERS["delta"])
        assert len(by_org[org]) == rounds
        assert saved.ledger.epsilon(TINY_HYPERPARAMETERS["delta"],
                                    data=by_org[org][0].data) == pytest.approx(alone)


def test_runs_on_two_splits_of_the_same_data_compose_for_the_examples_they_share(
        tmp_path, opener_path):
    """A model trained on one split, then continued on, or averaged with a model trained on, another
    split of the same data: the examples in both splits were trained on by both runs, and ε is
    theirs (the worst example's)."""

    framework, delta = "torch", TINY_HYPERPARAMETERS["delta"]
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, seed=1)
    [whole] = dataset.sample_folders(tmp_path / "data", "train")
    images, labels = np.load(whole / "images.npy"), np.load(whole / "labels.npy")
    splits = {}
    for name, part in (("x", slice(0, 200)), ("y", slice(100, 300))):  # 100 examples in both
        split = tmp_path / name / "train" / "0"
        split.mkdir(parents=True)
        # y stores its pixels as float32 in [0, 1]: what the model sees is the same
        np.save(split / "images.npy", images[part] if name == "x"
                else images[part].astype(np.float32) / 255)
        np.save(split / "labels.npy", labels[part])
        (split / KEY_FILE).write_text((whole / KEY_FILE).read_text())
        policy.declare_size(split, 200)
        splits[name] = tmp_path / name

    def trained_on(split, name, model=None):
        proc, outputs = train(tmp_path, framework, splits[split], opener_path, model=model,
                              name=name)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return outputs

    first = trained_on("x", "first")
    continued = trained_on("y", "continued", first["model"])
    events = model_file.load(continued["model"]).ledger.events
    assert read_epsilon(continued["epsilon"]) == pytest.approx(compose_epsilon(events, delta))
    assert read_epsilon(continued["epsilon"]) > read_epsilon(first["epsilon"]) * 1.2

    alone = trained_on("y", "alone")
    aggregate = extract_function(ALGO_ASSETS[framework], "aggregate", tmp_path / "fn-aggregate")
    run_function(aggregate / "algo.py", "aggregate", {"models": [first["model"], alone["model"]]},
                 {"model": tmp_path / "averaged"})
    averaged = model_file.load(tmp_path / "averaged").ledger
    assert averaged.epsilon(delta) == pytest.approx(compose_epsilon(averaged.events, delta))
    # per example in the organisation's own record: x's 100 alone, the 100 shared, y's 100 alone
    record = data_ledger.read([splits[name] / "train" / "0" for name in ("x", "y")])
    assert sorted((account.examples, len(account.events))
                  for account in record.accounts()) == [(100, 1), (100, 2), (100, 3)]

    # both splits in one task: the 100 shared examples would be trained on
    # twice; refused in one line
    both = tmp_path / "both" / "train"
    for name in ("x", "y"):
        (both / name).parent.mkdir(parents=True, exist_ok=True)
        (splits[name] / "train" / "0").rename(both / name)
    proc, _ = train(tmp_path, framework, tmp_path / "both", opener_path, name="together")
    assert_one_line_error(proc, "share 100 examples", "remove the copies")


# --- what goes wrong around a task: the disk, the folders, the files it is given, its own training
# ---


def craft_model(path, framework, weights):
    """A model file with metadata and digests as a train task writes them, holding `weights`."""
    from conftest import ledger_event, save_model


    event = dataclasses.replace(ledger_event(framework), run_id=new_run_id())
    return save_model(path, [event], weights, features="pixels", network="cnn", activation="tanh")


def test_a_full_disk_is_one_line_and_the_model_it_would_replace_stays_readable(
        tmp_path, tiny_data, opener_path, tmpfs):
    from conftest import fill_disk

    proc, trained = train(tmp_path, "torch", tiny_data, opener_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    disk = tmpfs("size=1m")
    old = disk / "global"  # last round's model, which this round's aggregate replaces
    old.write_bytes(trained["model"].read_bytes())
    fill_disk(disk)
    proc = run_function(ALGO_ASSETS["torch"] / "algo.py", "aggregate",
                        {"models": [trained["model"]]}, {"model": old}, check=False)
    assert_one_line_error(proc, f"{old}: cannot write it (No space left on device) (the previous "
                                "file is unchanged)", f"free space on the disk of {disk}")
    assert old.read_bytes() == trained["model"].read_bytes()
    saved = model_file.load(old, "torch")
    algo = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_full_disk").FRAMEWORK
    model_io.load_weights(algo, saved, old, interface.Network.of_saved(saved))
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "global"]  # no temporary file left


def test_a_read_only_working_directory_or_output_folder_is_one_line(
        tmp_path, tiny_data, opener_path, tmpfs, objective_script):
    read_only = tmpfs("ro")
    script = ALGO_ASSETS["torch"] / "algo.py"
    inputs = {"opener": opener_path, "datasamples": samples(tiny_data, "train")}
    # substratools creates chainkeys/ in the working directory before any function runs
    proc = run_function(script, "train", inputs,
                        {"model": tmp_path / "m", "epsilon": tmp_path / "e"}, check=False,
                        cwd=read_only)
    assert_one_line_error(proc, f"{read_only}/chainkeys/: substratools cannot create this folder "
                          "(Read-only file system)", "run the function from a writable folder")
    proc = run_function(objective_script, "score",
                        {"opener": opener_path, "datasamples": samples(tiny_data, "test"),
                                                    "predictions": tmp_path / "p"},
                        # every function's
                        {"performance": tmp_path / "performance"}, check=False, cwd=read_only)
    assert_one_line_error(proc, f"{read_only}/chainkeys/: substratools cannot create this folder")
    proc = run_function(script, "train", inputs,
                        {"model": read_only / "m", "epsilon": read_only / "e"}, check=False)
    assert_one_line_error(proc, f"output 'model': folder {read_only} is not writable")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_weights_that_are_not_the_frameworks_fail_in_one_line_naming_the_file(framework, tmp_path):
    bad = craft_model(tmp_path / "bad", framework, b"\x80\x02 not weights of any framework" * 100)
    model_file.load(bad, framework)  # a well-formed model file: its digests match
    proc = run_function(ALGO_ASSETS[framework] / "algo.py", "aggregate", {"models": [bad]},
                        {"model": tmp_path / "global"}, check=False)
    assert_one_line_error(proc,
                          f"{bad}: its weights cannot be loaded into this {framework} network",
                          f"the file was not written by this bundle's {framework} algo")
    assert not (tmp_path / "global").exists()


def test_weights_that_are_not_the_frameworks_fail_in_one_line_in_predict_and_train_too(
        tmp_path, tiny_data, opener_path):
    bad = craft_model(tmp_path / "bad", "torch", b"garbage" * 100)
    proc = run_function(ALGO_ASSETS["torch"] / "algo.py", "predict",
                        {"opener": opener_path, "datasamples": samples(tiny_data, "test"),
                         "model": bad}, {"predictions": tmp_path / "predictions"}, check=False)
    assert_one_line_error(proc, f"{bad}: its weights cannot be loaded into this torch network")
    proc, outputs = train(tmp_path, "torch", tiny_data, opener_path, model=bad, features="pixels",
                          network="cnn")
    assert_one_line_error(proc, f"{bad}: its weights cannot be loaded into this torch network")
    assert not outputs["model"].exists()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_diverged_run_fails_in_one_line_and_saves_nothing(
        framework, tmp_path, tiny_data, opener_path):
    # The tutorial CNN on pixels has no normalisation: relu activations of weights moved by
    # noise of std 1e30 overflow.
    proc, outputs = train(tmp_path, framework, tiny_data, opener_path, max_grad_norm=1e30,
                          features="pixels", activation="relu", ema_decay=0.0)
    assert_one_line_error(proc, "training diverged in 5 steps",
                          "weights are NaN or infinite; nothing was saved; lower learning_rate or "
                          "max_grad_norm in")
    assert not outputs["model"].exists() and not outputs["epsilon"].exists()


def test_a_model_with_non_finite_weights_is_refused_and_never_averaged(tmp_path):
    algo = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_nan").FRAMEWORK
    model = algo.new_model(0, interface.Network("pixels", "tanh"))
    arrays = algo.weight_arrays(model)
    arrays[0][0] = np.nan
    nan = craft_model(tmp_path / "nan", "torch",
                      algo.dump_model(algo.set_weight_arrays(model, arrays)))
    proc = run_function(ALGO_ASSETS["torch"] / "algo.py", "aggregate", {"models": [nan]},
                        {"model": tmp_path / "global"}, check=False)
    assert_one_line_error(proc, f"{nan}: {arrays[0][0].size} of the model's 26010 weights are NaN "
                                "or infinite", "its training diverged")
    assert not (tmp_path / "global").exists()


def test_mindspore_with_one_batch_of_every_example_drops_mindarmours_nan(
        tmp_path, tiny_data, opener_path):
    """q = 1 (batch_size = n): MindArmour's monitor gives NaN (over two steps: it counts no
    single one). The run is fine; its figure is dropped, so the model file stays readable."""
    proc, outputs = train(tmp_path, "mindspore", tiny_data, opener_path, batch_size=300, epochs=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("MindArmour RDPMonitor (this run only) gave epsilon = nan for this run; not "
            "kept" in proc.stderr)
    [event] = model_file.load(outputs["model"], "mindspore").ledger.events
    assert event.sample_rate == 1 and event.library_epsilon == ()
    report = subprocess.run([sys.executable, str(REPO / "scripts" / "privacy_report.py"),
                             str(outputs["model"])], capture_output=True, text=True)
    assert report.returncode == 0 and "q = 1," in report.stdout, report.stderr


def test_an_input_a_function_does_not_use_is_refused_not_ignored(
        tmp_path, tiny_data, opener_path, objective_script):
    from mnist_dp.orchestration.contract import CONTRACT

    # the functions check what the contract declares
    for name, known in functions.FUNCTION_INPUTS.items():
        assert {spec.identifier
                for spec in CONTRACT[name][0]} == known | ({"opener"} if "datasamples" in known
                                                                           else set())
    script = ALGO_ASSETS["torch"] / "algo.py"
    (tmp_path / "any.model").write_bytes(b"never read")
    inputs = {"opener": opener_path, "datasamples": samples(tiny_data, "train"),
              "model": tmp_path / "any.model"}
    proc = run_function(script, "tune", inputs,
                        {"model": tmp_path / "m", "epsilon": tmp_path / "e"}, check=False)
    assert_one_line_error(proc, "input 'model': the tune function does not use it (it takes "
                                "datasamples, ledger); remove it")
    assert not (tmp_path / "m").exists()
    proc = run_function(objective_script, "score", {**inputs, "predictions": tmp_path / "p"},
                        {"performance": tmp_path / "performance"}, check=False)
    assert_one_line_error(proc, "input 'model': the score function does not use it")


def test_opacus_accountant_warnings_the_user_cannot_act_on_are_not_printed(
        tmp_path, tiny_data, opener_path):
    # At a high σ, Opacus' PRV domain bound warns "Optimal order is the
    # largest alpha" once per task.
    proc, _ = train(tmp_path, "torch", tiny_data, opener_path, noise_multiplier=40.0)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Optimal order" not in proc.stderr
