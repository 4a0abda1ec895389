"""scripts/add_train_algo_cnn_dp.py against a local client (subprocess backend), after
add_dataset_objective."""
import json

import pytest
from conftest import REPO, TINY_HYPERPARAMETERS, run_python

from mnist_dp.privacy import model_file
from mnist_dp.privacy.accountant import compose_epsilon

SCRIPTS = REPO / "scripts"
FRAMEWORK = "torch"  # the fastest; every framework runs through run_local's tests


def run(script, *args, cwd):
    return run_python([SCRIPTS / script, *args], cwd)


@pytest.fixture
def keys_file(tmp_path, tiny_data):
    proc = run("add_dataset_objective.py", "--data", tiny_data, "--folds", 2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp_path / "assets_keys.json"


def test_trains_through_the_folds_reports_and_adds_its_keys(tmp_path, keys_file):
    (tmp_path / "hp.json").write_text(json.dumps(TINY_HYPERPARAMETERS))
    before = json.loads(keys_file.read_text())
    proc = run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, "--hyperparameters", "hp.json",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = json.loads(keys_file.read_text())
    assert set(keys["algos"][FRAMEWORK]) == {"train", "predict"}
    tasks = keys["compute_plans"][FRAMEWORK]["tasks"]
    # train, then predict and score on the test data only: nothing computed on the
    # training data is published
    assert len(tasks) == 2 * 3
    assert f"{FRAMEWORK} train, round 2 at {keys['organization_id']}" in tasks.values()
    assert not [task for task in tasks.values() if task.endswith(" on train")]
    assert set(before) - {"organization_id"} <= set(keys)
    records = json.loads((tmp_path / "results" / FRAMEWORK / "results.json").read_text())
    assert [r["round"] for r in records] == [1, 2]
    # The model passes from fold to fold. Its file names no example, so its ε counts both folds'
    # runs for every example of the organisation; the data's own record, per example, composes
    # the disjoint folds in parallel: one task's.
    for record in records:
        events = model_file.load(record["model_file"], FRAMEWORK).ledger.events
        assert len(events) == record["round"]
        assert record["epsilon"] == pytest.approx(
            compose_epsilon(events, TINY_HYPERPARAMETERS["delta"]))
        assert record["epsilon_in_substra"] == pytest.approx(record["epsilon"])
        # after the plan, on its last round's row: each example in one fold, so one run
        assert record["data_epsilon_by_organization"] == ({} if record["round"] == 1 else {
            keys["organization_id"]: pytest.approx(records[0]["epsilon"])})
    assert records[1]["epsilon"] > records[0]["epsilon"] + 1
    assert "test acc" in proc.stdout and "keys added to" in proc.stdout
    assert {"summary.md",
            "results.png"} <= {p.name for p in (tmp_path / "results" / FRAMEWORK).iterdir()}


def test_a_failing_task_is_named_with_its_log_and_the_keys_are_kept(tmp_path, keys_file):
    # A clipping norm of 1e30 makes the tutorial CNN's relu activations overflow: the train function
    # refuses the diverged model (a budget below one step, which failed here before, is refused
    # before anything is registered).
    (tmp_path / "bad.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, "max_grad_norm": 1e30,
                                                   "features": "pixels", "activation": "relu"}))
    proc = run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, "--hyperparameters",
               "bad.json", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    message = proc.stderr[proc.stderr.index("error: compute plan"):]
    assert (f"task '{FRAMEWORK} train, round 1 at MyOrg" in message
            and f"function '{FRAMEWORK} train'" in message)
    assert "last lines of its log" in message and "training diverged in 3 steps" in message
    keys = json.loads(keys_file.read_text())
    assert keys["compute_plans"][FRAMEWORK]["key"] and keys["algos"][FRAMEWORK]["train"]
    assert "The plan failed" in (tmp_path / "results" / FRAMEWORK / "summary.md").read_text()


@pytest.mark.parametrize("changes, args, message", [
    ({"batch_size": 1000}, [],
     f"{FRAMEWORK} hyperparameters (bad.json), fold 1: batch_size = 1000 is larger than the 150 "
     "training examples (the data's public size)\n"), ({"max_epsilon": 0.001}, [],
     f"{FRAMEWORK} hyperparameters (bad.json), fold 1: max_epsilon = 0.001 is below the ε of a "
     "single step ("), ({}, ["--rounds", 5000],
     "--rounds 5000 with the 2 folds of assets_keys.json and --strategy cyclic make 30,000 "
     "tasks, more than the 10,000"),
])
def test_what_a_task_would_refuse_is_refused_before_anything_is_registered(
        tmp_path, keys_file, changes, args, message):
    (tmp_path / "bad.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, **changes}))
    before = keys_file.read_text()
    proc = run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, "--hyperparameters",
               "bad.json", *args, cwd=tmp_path)
    assert (proc.returncode == 2 and proc.stderr.startswith(f"error: {message}")
            and proc.stderr.count("\n") == 1), proc.stderr
    assert keys_file.read_text() == before  # nothing registered


@pytest.mark.parametrize("field, value", [("train_data_sample_keys", "abc"),
                                          ("train_data_sample_keys", [["a"], []]),
                                          ("test_data_sample_keys", [1]), ("dataset_key", None)])
def test_a_damaged_keys_file_names_the_field(tmp_path, keys_file, field, value):
    keys = json.loads(keys_file.read_text())
    keys_file.write_text(json.dumps({**keys, field: value}))
    proc = run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"error: {keys_file.name}: {field} = "), proc.stderr
    assert ("must be" in proc.stderr and "--folds" not in proc.stderr
            and "Traceback" not in proc.stderr)


def test_rounds_with_a_target_need_the_fold_sizes(tmp_path, keys_file):
    keys = json.loads(keys_file.read_text())
    # the data is on another machine
    keys_file.write_text(json.dumps({**keys, "data": str(tmp_path / "elsewhere")}))
    before = keys_file.read_text()
    proc = run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, "--strategy", "fedavg",
               "--rounds", 2, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert ("--rounds 2 with target_epsilon" in proc.stderr
            and "give noise_multiplier" in proc.stderr)
    assert keys_file.read_text() == before  # nothing registered
    assert run("add_train_algo_cnn_dp.py", "--rounds", 0, cwd=tmp_path).stderr == (
        "error: argument --rounds: 0 is not an integer from 1 to 10,000 (see "
        "add_train_algo_cnn_dp.py --help)\n")
