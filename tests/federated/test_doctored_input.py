"""An organisation's figure holds whatever another party sends: a model whose ledger lacks the
organisation's own earlier run (a doctored model from the previous organisation of a cyclic plan, or
from the aggregator of a federated average) is accounted with that run, from the data's own ledger;
max_epsilon stops the run that would pass it; a task killed after its model was saved has recorded
its spend."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    REPO,
    assert_one_line_error,
    extract_function,
    independent_epsilon,
    run_function,
    tiny_hyperparameters,
)

from mnist_dp.assets import ALGO_ASSETS, DATASET_ASSET, load_asset_module
from mnist_dp.data import dataset, keys, samples
from mnist_dp.data.samples import sample_identity
from mnist_dp.learning import skeleton
from mnist_dp.privacy import data_ledger, model_file, policy, seal
from mnist_dp.utils.errors import UserError

SIGMA, DELTA = 2.0, 1e-4
HP = tiny_hyperparameters("torch", noise_multiplier=SIGMA, target_epsilon=None, delta=DELTA,
                          ema_decay=0.0)
ONE_RUN = 3  # steps of one epoch of batch 64 on an organisation's 150 examples: q = 1/3


@pytest.fixture
def organisations(tmp_path):
    """Two organisations' data, 150 examples each under its own key, with nothing released from it
    yet."""
    dest = tmp_path / "data"
    dataset.generate(dest, train_size=300, test_size=50, train_samples=2, organizations=2, seed=3)
    return [[str(f)] for f in dataset.sample_folders(dest, "train")]


def train(tmp_path, name, folders, model=None, ledger=None, framework="torch", **changes):
    """A train task of the `framework` algo at the organisation holding `folders`, from `model` and
    with the `ledger` input if given: its model (its ledger output is beside it, `name`.ledger)."""
    hp_path = tmp_path / f"{name}.json"
    hp = HP if framework == "torch" else tiny_hyperparameters(
        framework, **{k: HP[k] for k in ("noise_multiplier", "target_epsilon", "delta",
                                         "batch_size", "epochs")})
    hp_path.write_text(json.dumps({**hp, **changes}))
    opener = load_asset_module(DATASET_ASSET / "opener.py", "opener_for_doctored_tests")
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py",
                             f"{framework}_algo_for_doctored_tests")
    inputs = {"datasamples": opener.MnistOpener().get_data(folders),
              **({"model": str(model)} if model else {}),
              **({"ledger": str(ledger)} if ledger else {})}
    outputs = {"model": str(tmp_path / f"{name}.model"),
               "epsilon": str(tmp_path / f"{name}.epsilon"),
               "ledger": str(tmp_path / f"{name}.ledger")}
    skeleton.train(algo.FRAMEWORK, inputs, outputs, hp_path)
    return tmp_path / f"{name}.model"


def genesis(tmp_path, folders, name="genesis"):
    """The genesis task's ledger output on `folders` (what they record, sealed)."""
    opener = load_asset_module(DATASET_ASSET / "opener.py", "opener_for_doctored_tests")
    skeleton.genesis({"datasamples": opener.MnistOpener().get_data(folders)},
                     {"ledger": str(tmp_path / f"{name}.ledger")})
    return tmp_path / f"{name}.ledger"


def read_only_copy(tmpfs, folders):
    """`folders` copied onto a file system then mounted read-only, as Substra's docker mode and a
    node give a task its data samples."""
    mount = tmpfs("size=16m")
    copies = [shutil.copytree(f, mount / Path(f).name) for f in folders]
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    return copies


def doctored(tmp_path, how, own_model, other_model):
    """A model carrying organisation 2's own weights but organisation 1's ledger: passed on in a
    cyclic plan (the file edited, its digests recomputed), or averaged by an aggregator that left
    organisation 2's ledger out."""
    path = tmp_path / f"doctored-{how}.model"
    theirs = model_file.load(other_model)
    if how == "cyclic":
        mine = model_file.load(own_model)
        model_file.save(path, model_file.ModelFile("torch", mine.weights, theirs.ledger,
                                                   theirs.hyperparameters))
    else:
        algo = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "torch_algo_for_doctored_tests")
        skeleton.aggregate(algo.FRAMEWORK, {"models": [str(other_model)]}, {"model": str(path)},
                           tmp_path / "aggregate.json")
    model_file.load(path, "torch")  # every check of a model file passes
    return path


@pytest.mark.parametrize("how", ["cyclic", "fedavg"])
def test_a_model_lacking_the_organisations_own_run_is_accounted_with_it(
        tmp_path, organisations, how):
    (tmp_path / "aggregate.json").write_text(json.dumps(HP))
    first, second = organisations
    own = train(tmp_path, "own", second)  # organisation 2's earlier run
    other = train(tmp_path, "other", first)
    again = train(tmp_path, "again", second, doctored(tmp_path, how, own, other))
    saved = model_file.load(again, "torch")
    mine = [sample_identity(f) for f in second]
    both_runs = independent_epsilon(SIGMA, 1 / 3, 2 * ONE_RUN, DELTA)
    assert saved.ledger.epsilon(DELTA, data=mine) == pytest.approx(both_runs, rel=1e-6)
    # Substra's performance
    assert json.loads((tmp_path / "again.epsilon").read_text())["all"] >= both_runs - 1e-9
    assert len(data_ledger.read(second).events) == 2


@pytest.mark.parametrize("how", ["cyclic", "fedavg"])
def test_max_epsilon_stops_the_run_that_would_pass_it_whatever_the_input_model_says(
        tmp_path, organisations, how):
    (tmp_path / "aggregate.json").write_text(json.dumps(HP))
    first, second = organisations
    one, two = (independent_epsilon(SIGMA, 1 / 3, k * ONE_RUN, DELTA) for k in (1, 2))
    budget = (one + two) / 2  # one run fits, two do not
    own = train(tmp_path, "own", second, max_epsilon=budget)
    other = train(tmp_path, "other", first, max_epsilon=budget)
    again = model_file.load(train(tmp_path, "again", second, doctored(tmp_path, how, own, other),
                                  max_epsilon=budget), "torch")
    mine = [sample_identity(f) for f in second]
    last = again.ledger.events[-1]
    assert again.hyperparameters["stopped_by_budget"] and 0 < last.steps < ONE_RUN
    assert again.ledger.epsilon(DELTA, data=mine) == pytest.approx(
        independent_epsilon(SIGMA, 1 / 3, ONE_RUN + last.steps, DELTA), rel=1e-6)
    assert again.ledger.epsilon(DELTA, data=mine) <= budget
    spent = data_ledger.read(second)
    assert spent.epsilon(DELTA, data=mine) <= budget and spent.events[-1] == last


@pytest.mark.parametrize("how", ["cyclic", "fedavg"])
def test_on_read_only_data_the_ledger_passed_from_task_to_task_keeps_the_organisations_run(
        tmp_path, organisations, tmpfs, how):
    (tmp_path / "aggregate.json").write_text(json.dumps(HP))
    first, second = organisations[0], read_only_copy(tmpfs, organisations[1])
    # recorded nowhere beside the data: only in its ledger output
    own = train(tmp_path, "own", second, ledger=genesis(tmp_path, second))
    assert not data_ledger.read(second).events and len(
        data_ledger.read_output(tmp_path / "own.ledger", samples.seal_keys(second)).events) == 1
    other = train(tmp_path, "other", first)
    doctored_model = doctored(tmp_path, how, own, other)
    mine = [sample_identity(f) for f in second]
    both_runs = independent_epsilon(SIGMA, 1 / 3, 2 * ONE_RUN, DELTA)
    again = model_file.load(train(tmp_path, "again", second, doctored_model,
                                  tmp_path / "own.ledger"), "torch")
    assert again.ledger.epsilon(DELTA, data=mine) == pytest.approx(both_runs, rel=1e-6)
    # what the next task receives
    assert len(data_ledger.read_output(tmp_path / "again.ledger",
                                       samples.seal_keys(second)).events) == 2
    # one run fits, two do not
    budget = (independent_epsilon(SIGMA, 1 / 3, ONE_RUN, DELTA) + both_runs) / 2
    stopped = model_file.load(train(tmp_path, "stopped", second, doctored_model,
                                    tmp_path / "own.ledger", max_epsilon=budget), "torch")
    assert stopped.hyperparameters[
        "stopped_by_budget"] and 0 < stopped.ledger.events[-1].steps < ONE_RUN
    assert stopped.ledger.epsilon(DELTA, data=mine) <= budget


def test_a_model_continued_in_another_framework_counts_the_datas_runs_in_every_framework(
        tmp_path, organisations):
    first, second = organisations
    train(tmp_path, "own", second, framework="tf")  # organisation 2's earlier run, in tf
    # organisation 1's torch model: its weights could be organisation 2's tf ones, converted
    other = train(tmp_path, "other", first)
    again = model_file.load(train(tmp_path, "again", second, other), "torch")
    assert [e.framework for e in again.ledger.events] == ["tf", "torch", "torch"]
    mine = [sample_identity(f) for f in second]
    both_runs = independent_epsilon(SIGMA, 1 / 3, 2 * ONE_RUN, DELTA)
    assert again.ledger.epsilon(DELTA, data=mine) == pytest.approx(both_runs, rel=1e-6)
    assert json.loads((tmp_path / "again.epsilon").read_text())["all"] >= both_runs - 1e-9


@pytest.mark.parametrize("ledger_output, ledger_input", [(False, True), (True, False),
                                                         (True, True)])
def test_on_read_only_samples_a_task_without_its_ledger_input_and_output_is_refused_before_training(
        tmp_path, organisations, tmpfs, ledger_output, ledger_input):
    """Through the substratools command line, as a user runs an asset alone: with nowhere to record
    its run, or with no way to know the runs before it (a plan that left the organisation's ledger
    out), the task trains nothing and releases nothing."""
    folder = extract_function(ALGO_ASSETS["torch"], "train", tmp_path / "build", HP)
    sample = read_only_copy(tmpfs, organisations[1])[0]
    genesis_out = tmp_path / "genesis.ledger"
    proc = run_function(folder / "algo.py", "genesis", {"opener": DATASET_ASSET / "opener.py",
                                                         "datasamples": [sample]},
                        {"ledger": genesis_out}, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs = {"model": tmp_path / "model", "epsilon": tmp_path / "epsilon",
               **({"ledger": tmp_path / "ledger"} if ledger_output else {})}
    proc = run_function(folder / "algo.py", "train", {"opener": DATASET_ASSET / "opener.py",
                                                       "datasamples": [sample],
                                                       **({"ledger": [genesis_out]}
                                                          if ledger_input else {})}, outputs,
                        check=False)
    if ledger_output and ledger_input:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert len(data_ledger.read_output(tmp_path / "ledger",
                                           samples.seal_keys([sample])).events) == 1
        return
    assert_one_line_error(proc, "the data samples are read-only here and this task has no "
                                + ("'ledger' input" if ledger_output else "ledger output"))
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("how, why", [
    ("cut", "its seal line is cut or damaged"),
    ("cut to its runs", "it carries no seal"),
    ("a run edited", "its seal does not match its content"),
    ("a run left out", "its seal does not match its content"),
    ("resealed by another organisation", "it is sealed by another organisation"),
])
def test_a_forged_foreign_or_cut_ledger_input_is_refused_naming_it(tmp_path, organisations, how,
                                                                   why):
    """A ledger input is the organisation's own, whole, or nothing: whoever builds the plan holds
    no seal key, so it can pass an output on as it is or not at all."""
    train(tmp_path, "one", organisations[1])
    train(tmp_path, "two", organisations[1], ledger=genesis(tmp_path, organisations[1]))
    whole = (tmp_path / "two.ledger").read_bytes()
    lines = whole.splitlines(keepends=True)
    assert len(lines) == 3  # two runs, then the seal
    forged = {
        "cut": whole[:-20],
        "cut to its runs": b"".join(lines[:2]),
        "a run edited": lines[0].replace(b'"steps": 3', b'"steps": 1') + b"".join(lines[1:]),
        "a run left out": b"".join(lines[1:]),
        "resealed by another organisation": seal.seal(b"".join(lines[1:2]), [], samples.seal_keys(
            organisations[0])),
    }[how]
    assert forged != whole
    (tmp_path / "forged.ledger").write_bytes(forged)
    with pytest.raises(UserError, match=rf"forged\.ledger: the ledger input is refused: "
                                        rf"{why}[^;]*; nothing was trained"):
        train(tmp_path, "again", organisations[1], ledger=tmp_path / "forged.ledger")
    assert len(data_ledger.read(organisations[1]).events) == 2  # the refused task recorded nothing


def test_a_key_from_copy_in_a_new_folder_keeps_the_record_and_the_budget_stops_the_run_there(
        tmp_path):
    """generate_data.py --key-from into another folder: the same images under the same key, and
    the same ledger file."""
    dataset.generate(tmp_path / "first", train_size=150, test_size=50, train_samples=1, seed=3)
    first = [str(f) for f in dataset.sample_folders(tmp_path / "first", "train")]
    # one run fits, and not one step more
    budget = sum(independent_epsilon(SIGMA, 1 / 3, steps, DELTA) for steps in (ONE_RUN,
                                                                             ONE_RUN + 1)) / 2
    train(tmp_path, "earlier", first, max_epsilon=budget)
    dataset.generate(tmp_path / "copy", train_size=150, test_size=50, train_samples=1, seed=3,
                     key_from=tuple(first))
    copy = [str(f) for f in dataset.sample_folders(tmp_path / "copy", "train")]
    assert samples.key_id(copy[0]) == samples.key_id(first[0])
    with pytest.raises(UserError, match=r"^max_epsilon = .*: this data has spent its budget"):
        train(tmp_path, "again", copy, max_epsilon=budget)
    assert len(data_ledger.read(copy).events) == 1 and data_ledger.read(
        copy).events == data_ledger.read(first).events


def test_an_owners_budget_below_the_algos_max_epsilon_stops_training_at_the_owners_figure(
        tmp_path, organisations):
    first = organisations[0]
    one, two = (independent_epsilon(SIGMA, 1 / 3, k * ONE_RUN, DELTA) for k in (1, 2))
    owner = (one + two) / 2  # one run fits, two do not
    policy.write(first[0], policy.parse({"max_epsilon": owner, "delta": DELTA}, "test"))
    train(tmp_path, "own", first, max_epsilon=10 * two)
    again = model_file.load(train(tmp_path, "again", first, tmp_path / "own.model",
                                  max_epsilon=10 * two), "torch")
    mine = [sample_identity(f) for f in first]
    assert again.hyperparameters["stopped_by_budget"]
    assert 0 < again.ledger.events[-1].steps < ONE_RUN
    assert one < again.ledger.epsilon(DELTA, data=mine) <= owner
    assert data_ledger.read(first).epsilon(DELTA, data=mine) <= owner
    with pytest.raises(UserError, match=r"the data owner's max_epsilon .*: this data has spent its "
                                        r"budget"):
        train(tmp_path, "fresh", first, max_epsilon=10 * two)


@pytest.fixture
def one_source_under_two_keys(tmp_path):
    """One organisation's 150 examples written twice from one source, each time under a new key
    (generate_data.py run twice without --key-from): the same images, two samples that name them
    differently."""
    for name in ("first", "second"):
        dataset.generate(tmp_path / name, train_size=150, test_size=50, train_samples=1, seed=3)
    return [dataset.sample_folders(tmp_path / name, "train") for name in ("first", "second")]


def test_an_image_under_two_organisations_keys_is_one_example_once_they_are_one(
        tmp_path, one_source_under_two_keys):
    first, second = one_source_under_two_keys
    earlier = train(tmp_path, "earlier", first)
    one, two, three = (independent_epsilon(SIGMA, 1 / 3, k * ONE_RUN, DELTA) for k in (1, 2, 3))
    apart = model_file.load(train(tmp_path, "apart", second, earlier), "torch")
    # two keys: two organisations' records
    assert apart.ledger.epsilon(DELTA) == pytest.approx(one, rel=1e-6)
    keys.same_organization([*first, *second])
    # Continued on the second folder: the earlier run (first key), the apart run (the
    # data's own ledger) and its own all trained on the same images. Apart, the keys'
    # records would give two runs.
    continued = model_file.load(train(tmp_path, "continued", second, earlier), "torch")
    assert len(continued.ledger.events) == 3
    # the headline, from the file alone
    assert continued.ledger.epsilon(DELTA) == pytest.approx(three, rel=1e-6)
    # One ledger for the organisation's data, whichever folder a run read:
    # the three runs, each once.
    assert data_ledger.read(first).events == data_ledger.read(second).events
    assert len(data_ledger.read(second).events) == 3
    mine = [sample_identity(f) for f in second]
    assert samples.spent_on(second).epsilon(DELTA, data=mine) == pytest.approx(three, rel=1e-6)
    # A fresh model on either folder is held to a budget its images spent under both keys.
    with pytest.raises(UserError, match=r"^max_epsilon = .*: this data has spent its budget"):
        train(tmp_path, "fresh", first, max_epsilon=(two + three) / 2)


# Runs a train task's algo.py and kills its process (SIGKILL: nothing runs after) the
# moment its model is saved.
KILLED_AFTER_SAVE = """import os, runpy, signal, sys
from mnist_dp.privacy import model_file
save = model_file.save
def save_then_die(path, model):
    save(path, model)
    os.kill(os.getpid(), signal.SIGKILL)
model_file.save = save_then_die
sys.argv[0] = "algo.py"
runpy.run_path("algo.py", run_name="__main__")
"""


def test_a_task_killed_after_its_model_left_has_recorded_its_spend(tmp_path, organisations):
    folder = extract_function(ALGO_ASSETS["torch"], "train", tmp_path / "build", HP)
    (folder / "killed.py").write_text(KILLED_AFTER_SAVE)
    resources = [{"id": "opener", "value": str(DATASET_ASSET / "opener.py"), "multiple": False},
                 {"id": "datasamples", "value": organisations[0][0], "multiple": True}]
    outputs = [{"id": "model", "value": str(tmp_path / "model"), "multiple": False},
               {"id": "epsilon", "value": str(tmp_path / "epsilon"), "multiple": False}]
    proc = subprocess.run([sys.executable, "killed.py", "--function-name", "train", "--inputs",
                           json.dumps(resources), "--outputs",
                           json.dumps(outputs)], cwd=folder, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    released = model_file.load(tmp_path / "model", "torch").ledger.events[-1]
    assert data_ledger.read(organisations[0]).events == [released]


def test_two_train_tasks_on_the_same_data_at_once_both_record_their_spend(tmp_path, organisations):
    folder = extract_function(ALGO_ASSETS["torch"], "train", tmp_path / "build", HP)
    resources = json.dumps([{"id": "opener", "value": str(DATASET_ASSET / "opener.py"),
                             "multiple": False},
                            {"id": "datasamples", "value": organisations[0][0], "multiple": True}])
    tasks = []
    for k in range(2):
        outputs = json.dumps([{"id": "model", "value": str(tmp_path / f"model{k}"),
                               "multiple": False},
                              {"id": "epsilon", "value": str(tmp_path / f"epsilon{k}"),
                               "multiple": False}])
        tasks.append(subprocess.Popen([sys.executable, "algo.py", "--function-name", "train",
                                       "--inputs", resources, "--outputs",
                                       outputs], cwd=folder, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONPATH": str(REPO)}))
    assert all(task.wait(timeout=300) == 0
               for task in tasks), [t.stderr.read()[-2000:] for t in tasks]
    released = {model_file.load(tmp_path / f"model{k}", "torch").ledger.events[-1].run_id
                for k in range(2)}
    assert {e.run_id for e in data_ledger.read(organisations[0]).events} == released
