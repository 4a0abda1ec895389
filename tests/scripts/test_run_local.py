"""scripts/run_local.py end to end: one local Substra compute plan on tiny data."""
import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    FRAMEWORKS,
    REPO,
    TINY_HYPERPARAMETERS,
    assert_one_line_error,
    follow_advice,
    independent_epsilon,
    report_files,
    run_python,
)
from documented import fresh_clone, run_documented

from mnist_dp.data import dataset, samples
from mnist_dp.privacy import accountant, data_ledger, events, model_file, policy
from mnist_dp.report import display
from mnist_dp.utils.words import counted

SCRIPT = REPO / "scripts" / "run_local.py"
REQUIRED_KEYS = {"framework", "organization", "test_accuracy", "train_accuracy", "epsilon", "delta",
                 "accountant", "noise_multiplier", "sample_rate", "steps", "dp"}


# Replayable noise and training-data scores, so that the docker run can be
# compared with this one exactly.
REPLAYED = {**TINY_HYPERPARAMETERS, "noise_seed": 0}


def run_local(*args, cwd):
    return run_python([SCRIPT, *args], cwd)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_data):
    tmp = tmp_path_factory.mktemp("run_local")
    (tmp / "hp.json").write_text(json.dumps(REPLAYED))
    proc = run_local("--data", tiny_data, "--output", tmp / "results", "--hyperparameters",
                     tmp / "hp.json", "--score-train", "--baseline", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, tmp


def test_results_json_has_a_record_per_framework_and_baseline(local_run):
    _, tmp = local_run
    records = json.loads((tmp / "results" / "results.json").read_text())
    assert sorted((r["framework"], r["dp"]) for r in records) == sorted(
        [(f, True) for f in FRAMEWORKS] + [(f, False) for f in FRAMEWORKS])
    for record in records:
        assert REQUIRED_KEYS <= set(record)
        assert 0 <= record["test_accuracy"] <= 1 and 0 <= record["train_accuracy"] <= 1
        assert record["delta"] == TINY_HYPERPARAMETERS["delta"]
        # ceil(300 / 64) steps
        assert record["steps"] == 5 and record["sample_rate"] == pytest.approx(1 / 5)


def test_redirected_output_holds_one_line_per_task_and_no_bar(local_run):
    """No terminal: Substra's compute plan bar is one line per finished task, and no bar (tqdm's
    "|" and "%") reaches the output."""
    proc, _ = local_run
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith("Compute plan progress: ")]
    total = int(lines[0].split("/")[1])
    assert [line.split(": ")[1] for line in lines] == [f"{k}/{total}" for k in range(1, total + 1)]
    assert "%|" not in proc.stderr + proc.stdout and "\r" not in proc.stderr


def test_epsilon_reached_substra_and_matches_the_model_ledger(local_run):
    _, tmp = local_run
    for record in json.loads((tmp / "results" / "results.json").read_text()):
        saved = model_file.load(record["model_file"], record["framework"])
        if record["dp"]:
            assert record["epsilon"] == pytest.approx(saved.ledger.epsilon(record["delta"]))
            assert record["epsilon_in_substra"] == pytest.approx(record["epsilon"])
            assert record["noise_multiplier"] == TINY_HYPERPARAMETERS["noise_multiplier"]
        else:
            assert record["epsilon"] is None and record["epsilon_in_substra"] is None
            assert record["noise_multiplier"] == 0


def test_replayable_noise_and_training_data_scores_are_flagged(local_run):
    proc, tmp = local_run
    assert "train acc (not covered by ε)" in proc.stdout
    assert ("warning (torch, torch-baseline" in proc.stdout
            and "holds only while that seed stays secret" in proc.stdout)
    # The opt-in baseline is flagged in the table, results.json and the
    # summary, as --score-train is.
    assert ("warning (torch-baseline, tf-baseline, mindspore-baseline): the non-private baseline "
            "(--baseline)" in proc.stdout)
    for record in json.loads((tmp / "results" / "results.json").read_text()):
        assert record["noise_seed"] == 0 and len(record["warnings"]) == (
            2 if record["dp"] else 3), record["warnings"]
        assert any("not covered by ε" in w and "--baseline" in w
                   for w in record["warnings"]) is not record["dp"]
    summary = (tmp / "results" / "summary.md").read_text()
    assert ("**Replayable noise**" in summary
            and "**Training-data accuracy was published**" in summary)
    assert "the non-private baseline (--baseline) trained without clipping or noise" in summary


def test_table_and_reports_and_no_files_leak_into_the_working_directory(local_run):
    proc, tmp = local_run
    assert "test acc" in proc.stdout and "  ε  " in proc.stdout
    assert sorted(p.name for p in tmp.iterdir()) == ["hp.json", "results"]
    assert {"results.json", "summary.md", "results.png",
            "models"} <= {p.name for p in (tmp / "results").iterdir()}
    summary = (tmp / "results" / "summary.md").read_text()
    for framework in FRAMEWORKS:
        assert f"| {framework} | yes |" in summary and f"| {framework}-baseline | 1 |" in summary


def test_two_organisations_train_in_rounds_with_epsilon_per_organisation(tmp_path, tiny_data_2orgs):
    """docs/federated.md's first command, on tiny data."""
    clone = fresh_clone(tmp_path / "clone", data_2=tiny_data_2orgs)
    proc = run_documented("docs/federated.md", "python scripts/run_local.py --organizations 2 "
                          "--rounds 2", clone)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads((clone / "results" / "results.json").read_text())
    assert [(r["round"], r["organization"]) for r in records] == [
        (1, "MyOrg1MSP"), (1, "MyOrg2MSP"), (2, "MyOrg1MSP"), (2, "MyOrg2MSP")]
    # Each organisation holds one of the 2 train samples (150 examples): ceil(150
    # / 64) = 3 steps per task.
    one_task = accountant.compose_epsilon(
        [events.DpEvent("torch", ("x",), 150, 1 / 3, 1.0, 3, "per-example", 1.0)],
        TINY_HYPERPARAMETERS["delta"])
    two_tasks = accountant.compose_epsilon(
        [events.DpEvent("torch", ("x",), 150, 1 / 3, 1.0, 6, "per-example", 1.0)],
        TINY_HYPERPARAMETERS["delta"])
    expected = [(one_task, 0.0), (one_task, one_task), (two_tasks, one_task),
                (two_tasks, two_tasks)]
    for record, (org1, org2) in zip(records, expected):
        by_org = record["epsilon_by_organization"]
        assert by_org[
            "MyOrg1MSP"] == pytest.approx(org1) and by_org["MyOrg2MSP"] == pytest.approx(org2)
        # worst organisation, not a sequential sum
        assert record["epsilon"] == pytest.approx(max(org1, org2))
        assert 0 <= record["test_accuracy"] <= 1
    saved = model_file.load(records[-1]["model_file"], "torch")
    assert len(saved.ledger.events) == 4 and len({e.data for e in saved.ledger.events}) == 2
    assert "ε MyOrg2MSP" in proc.stdout
    summary = (clone / "results" / "summary.md").read_text()
    assert "| torch | yes | 2 | MyOrg2MSP |" in summary
    # The default plan: no score of the training data anywhere, fresh noise (nothing to warn about).
    assert all(r["train_accuracy"] is None and r["warnings"] == [] for r in records)
    assert ("train_accuracy" not in summary and "train acc" not in proc.stdout
            and "warning" not in proc.stdout)


def test_federated_averaging_averages_each_round_with_epsilon_per_organisation(
        tmp_path, tiny_data_2orgs):
    """docs/federated.md's federated averaging (3 rounds, examples/fedavg.json), on tiny data."""
    clone = fresh_clone(tmp_path / "clone", data_2=tiny_data_2orgs)
    proc = run_documented("docs/federated.md", "python scripts/run_local.py --organizations 2 "
                          "--strategy fedavg", clone)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads((clone / "results" / "results.json").read_text())
    assert [(r["round"], r["organization"]) for r in records] == [(k, "fedavg") for k in (1, 2, 3)]
    delta = TINY_HYPERPARAMETERS["delta"]
    for record in records:
        # Each organisation ran 3 steps (150 examples, q = 1/3) per round on its own data: its ε
        # is that, recomputed from σ, q and the steps alone; the other organisation's runs in the
        # same model do not add to it.
        alone = accountant.compose_epsilon(
            [events.DpEvent("torch", ("x",), 150, 1 / 3, 1.0, 3 * record["round"], "per-example",
                            1.0)], delta)
        assert record["epsilon_by_organization"] == {org: pytest.approx(alone)
                                                     for org in ("MyOrg1MSP", "MyOrg2MSP")}
        assert record["epsilon"] == pytest.approx(alone) and 0 <= record["test_accuracy"] <= 1
        # What the data has spent after the plan, on the last round's row alone: its 9 steps.
        assert record["data_steps_by_organization"] == (
            {} if record["round"] < 3 else {org: 9 for org in ("MyOrg1MSP", "MyOrg2MSP")})
        assert record["data_epsilon_by_organization"] == (
            {} if record["round"] < 3 else {org: pytest.approx(alone) for org in (
                "MyOrg1MSP", "MyOrg2MSP")})
        saved = model_file.load(record["model_file"], "torch")
        # the round-1 average's runs once, not once per input
        assert len(saved.ledger.events) == 2 * record["round"]
        assert [a["examples"] for a in saved.hyperparameters[model_file.AGGREGATED]] == [150, 150]
    summary = (clone / "results" / "summary.md").read_text()
    assert "federated averaging" in summary and "| torch | yes | 2 | fedavg |" in summary
    assert "| torch | yes | 1 | fedavg |" in summary and display.LAST_ROUND_LINE in proc.stdout
    assert "Averaging is post-processing of those models and spends no privacy" in summary


# What fails only inside a train task (everything else is refused up front): a clipping
# norm of 1e30 makes the tutorial CNN's relu activations overflow, and the train function
# refuses the diverged model.
DIVERGING = {**TINY_HYPERPARAMETERS, "max_grad_norm": 1e30, "features": "pixels",
             "activation": "relu"}


def test_a_failing_organisations_task_fails_the_federated_plan_naming_it_with_its_log(
        tmp_path, tiny_data_2orgs):
    (tmp_path / "hp.json").write_text(json.dumps(DIVERGING))
    proc = run_local("--data", tiny_data_2orgs, "--output", tmp_path / "out", "--hyperparameters",
                     tmp_path / "hp.json", "--frameworks", "torch", "--organizations", 2,
                     "--strategy", "fedavg", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    message = proc.stderr[proc.stderr.index("error: compute plan"):]
    assert ("failed in task 'torch train, round 1 at MyOrg1MSP'" in message
            and "function 'torch train'" in message)
    assert "last lines of its log" in message and "training diverged in 3 steps" in message
    assert "The plan failed" in (tmp_path / "out" / "summary.md").read_text()


def test_a_budget_below_one_organisations_first_step_is_refused_before_anything_is_registered(
        tmp_path):
    # Organisation 2 holds 100 examples (q = 1/2), organisation 1 200 (q = 1/4): one step at σ = 1
    # costs 2.95 and 2.13, so a budget of 2.5 would let organisation 1 train and fail organisation
    # 2's task half-way through the plan.
    dataset.generate(tmp_path / "data", train_size=300, test_size=100, train_samples=3, seed=1,
                     organizations=2)
    (tmp_path / "hp.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, "max_epsilon": 2.5}))
    proc = run_local("--data", tmp_path / "data", "--output", tmp_path / "out", "--hyperparameters",
                     tmp_path / "hp.json", "--frameworks", "torch", "--organizations", 2,
                     "--strategy", "fedavg", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: torch hyperparameters ({tmp_path / 'hp.json'}), "
                                  "organisation 2: max_epsilon = 2.5 is below the ε of a single "
                                  "step (2.949 at δ = 0.0001)")
    # nothing was built or registered
    assert not list((tmp_path / "out").glob("substra/archives/*"))


def test_two_runs_on_the_same_data_report_what_it_has_spent_over_all_their_models(tmp_path):
    """The README's main job as written, on tiny data in a fresh clone, then a second run into the
    same output folder: every report in it is the latest run's, the earlier run's moved aside
    whole. The second run trains one framework: the data's ledger counts every model, whichever
    framework trained it."""
    clone = fresh_clone(tmp_path / "clone")
    data, out = clone / "data", clone / "results"
    dataset.generate(data, train_size=300, test_size=100, train_samples=1, seed=1)
    # σ = 1: q = 1/5, 5 steps a model
    (tmp_path / "hp.json").write_text(json.dumps(TINY_HYPERPARAMETERS))
    totals, reports, models = [], [], 0
    for frameworks in (FRAMEWORKS, ["torch"]):
        proc = run_documented("README.md", "pip install -r requirements.txt && python scripts/"
                              "run_local.py", clone) if frameworks == FRAMEWORKS else run_local(
            "--output", out, "--hyperparameters", tmp_path / "hp.json", "--frameworks", "torch",
            cwd=clone)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "data's ε" in proc.stdout  # the table's column
        # no leftover
        assert ("removed" not in proc.stdout
                and not list((out / "substra" / "local-worker").glob("*")))
        records = json.loads((out / "results.json").read_text())
        assert sorted(record["framework"] for record in records) == frameworks
        models += len(frameworks)
        for record in records:
            ((org, total),) = record["data_epsilon_by_organization"].items()
            assert record["data_steps_by_organization"] == {org: 5 * models}
            assert total == pytest.approx(independent_epsilon(1.0, 1 / 5, 5 * models, 1e-4),
                                          rel=1e-6)
            assert record["epsilon"] == pytest.approx(independent_epsilon(1.0, 1 / 5, 5, 1e-4),
                                                      rel=1e-6)
            assert Path(record["model_file"]).parent == out / "models"
        totals.append(total)
        assert f"ε = {total:.3f}" in (out / "summary.md").read_text()  # each statement gives it
        reports.append(report_files(out))
    [moved] = (out / "earlier").iterdir()
    assert ("moved the earlier run's results.json, summary.md, results.png, models to "
            f"{moved}" in proc.stdout)
    aside = report_files(moved)
    # the first run's reports, its results.json naming its model files where they went
    assert {k: v for k, v in aside.items() if k.name != "results.json"} == {
        k: v for k, v in reports[0].items() if k.name != "results.json"}
    assert {Path(r["model_file"]).parent for r in json.loads(aside[Path("results.json")])} == {
        moved / "models"}
    # the latest run's, in their place, none of the first run's left among them
    assert set(reports[1]) < set(reports[0]) and not set(reports[1].items()) & set(
        reports[0].items())
    # docs/privacy.md's report of the latest torch model
    report = run_documented("docs/privacy.md", "python scripts/privacy_report.py results/", clone)
    assert report.returncode == 0 and "\n**(ε, δ) = (" in report.stdout, report.stderr
    # A budget below what the data has spent refuses a third run before anything is registered.
    (tmp_path / "budget.json").write_text(json.dumps({**TINY_HYPERPARAMETERS,
                                                      "max_epsilon": totals[-1] - 0.01}))
    archives = set(out.glob("substra/archives/*"))
    proc = run_local("--data", data, "--output", out, "--hyperparameters", tmp_path / "budget.json",
                     "--frameworks", "torch", cwd=clone)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"is spent: this data's own ledger records {counted(models, 'run')}" in proc.stderr
    assert set(out.glob("substra/archives/*")) == archives  # nothing was built or registered
    # and the refused run leaves the latest run's reports where they were, and the first run's aside
    assert [moved] == list((out / "earlier").iterdir())
    assert f"put the earlier run's reports back from {out / 'earlier'}" in proc.stdout
    assert report_files(out) == reports[1]
    assert len(data_ledger.read(dataset.sample_folders(data, "train")).events) == models


def test_help_and_bad_arguments(tmp_path):
    assert "--frameworks" in run_local("--help", cwd=tmp_path).stdout
    assert "--strategy {cyclic,fedavg}" in run_local("--help", cwd=tmp_path).stdout
    proc = run_local("--frameworks", "jax", cwd=tmp_path)
    assert proc.returncode == 2 and "jax" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "hp.json").write_text('{"epochs": 0}')
    proc = run_local("--hyperparameters", tmp_path / "hp.json", "--data", tmp_path / "d",
                     cwd=tmp_path)
    assert proc.returncode == 2 and "epochs = 0" in proc.stderr and "Traceback" not in proc.stderr
    for bad, message in (('{"noise_seed": "1"}', 'noise_seed = "1" is a string'),
                         ('{"noise_seed": 1, "secure_mode": true}',
                          "noise_seed = 1 makes the noise replayable")):
        (tmp_path / "hp.json").write_text(bad)
        proc = run_local("--hyperparameters", tmp_path / "hp.json", "--data", tmp_path / "d",
                         cwd=tmp_path)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / "d").exists()
    assert "--score-train" in run_local("--help", cwd=tmp_path).stdout
    proc = run_local("--baseline", "--backend", "remote", "--data", tmp_path / "d", cwd=tmp_path)
    assert (proc.returncode == 2 and "--baseline with --backend remote" in proc.stderr
            and proc.stderr.count("\n") == 1)
    assert not (tmp_path / "d").exists()


def test_output_and_data_inside_each_other_are_refused_before_anything_is_written_there(
        tmp_path, tiny_data):
    data = shutil.copytree(tiny_data, tmp_path / "data")
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    for inside in (data, data / "train", data / "results"):
        proc = run_local("--data", data, "--output", inside, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"is inside the data folder {data}" in proc.stderr
        assert "choose an output folder outside it" in proc.stderr
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before  # no substra/, no .lock
    # the data inside the output folder, where a run sets earlier reports aside: refused too
    out = tmp_path / "out"
    inner = shutil.copytree(tiny_data, out / "models")
    proc = run_local("--data", inner, "--output", out, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"--data {inner}: is inside the output folder {out}" in proc.stderr
    assert not (out / "earlier").exists() and (inner / "train").is_dir()  # nothing moved


def test_organisations_sharing_a_key_are_refused_and_the_advised_command_fixes_it(tmp_path):
    """One key for two organisations' shares: either could recognise the other's examples in a
    released ledger. The error names the commands that give the second its own key; after them, the
    run gets past the check."""
    data = tmp_path / "data"
    # one organisation's data
    dataset.generate(data, train_size=300, test_size=100, train_samples=2, seed=1)
    (tmp_path / "hp.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, "batch_size": 1000}))
    options = ["--data", data, "--output", tmp_path / "out", "--hyperparameters",
               tmp_path / "hp.json", "--frameworks", "torch", "--organizations", 2]
    proc = run_local(*options, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "organisation 1's train data samples are under" not in proc.stderr
    assert f"error: {data}: organisations 1 and 2 hold data under one identity key" in proc.stderr
    follow_advice(proc.stderr.strip().removeprefix("error: "))
    keys = [samples.key_id(folder) for split in ("train", "test")
            for folder in dataset.sample_folders(data, split)]
    assert len(set(keys)) == 3  # each organisation its key, the test set its own
    proc = run_local(*options, cwd=tmp_path)  # now refused later, by its hyperparameters only
    assert (proc.returncode == 2
            and "batch_size = 1000 is larger than the 150 training examples" in proc.stderr)


def test_docker_backend_without_a_daemon_fails_in_one_line(tmp_path):
    # whether or not one runs here
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}
    proc = subprocess.run([sys.executable, SCRIPT, "--backend", "docker", "--data", tmp_path / "d"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert (proc.returncode == 2 and "no Docker daemon" in proc.stderr
            and "Traceback" not in proc.stderr)
    assert not (tmp_path / "d").exists()  # failed before generating anything


@pytest.fixture(scope="module")
def docker_run(docker_daemon, tmp_path_factory, tiny_data):
    """The DP runs of `local_run`'s plan, in the functions' Docker images (built here on first
    use)."""
    tmp = tmp_path_factory.mktemp("run_local_docker")
    (tmp / "hp.json").write_text(json.dumps(REPLAYED))
    proc = run_local("--backend", "docker", "--data", tiny_data, "--output", tmp / "results",
                     "--hyperparameters", tmp / "hp.json", "--score-train", cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, tmp


def test_docker_backend_gives_the_subprocess_backends_results(local_run, docker_run):
    """Same data, noise_seed and code in each function's image as in this environment (same pinned
    packages): the same accuracies, ε, privacy figures and ledgers (but for the runs' random ids),
    exactly, and the same weights.

    Weights are byte-identical when the two plans run alone; within the whole suite torch's, and in
    one run tf's, differed by 1-2 float32 ulps (≤ 3e-8, same accuracies and ε), from some state
    this test process passes to its children that is not found yet. So they are compared to 1e-6:
    a change of batches or noise moves them by ~1e-2.
    """
    def by_run(run):
        _, tmp = run
        return {r["run"]: r for r in json.loads((tmp / "results" / "results.json").read_text())}

    local, docker = by_run(local_run), by_run(docker_run)
    # local: the baselines too
    assert sorted(docker) == sorted(FRAMEWORKS) and len(local) == 2 * len(FRAMEWORKS)
    for run, record in docker.items():
        record = local[run]
        for key in ("train_accuracy", "test_accuracy", "epsilon", "epsilon_rdp",
                    "epsilon_in_substra", "noise_multiplier", "sample_rate", "steps",
                    "library_epsilon"):
            assert docker[run][key] == record[key], (run, key)
        local_model, docker_model = (model_file.load(r["model_file"])
                                     for r in (record, docker[run]))
        # the same runs, each with its own random id
        assert [dataclasses.replace(e, run_id=None) for e in docker_model.ledger.events] == \
            [dataclasses.replace(e, run_id=None) for e in local_model.ledger.events], run
        assert docker_model.ledger.events[0].run_id != local_model.ledger.events[0].run_id
        local_arrays, docker_arrays = (weight_arrays(record["framework"], m.weights)
                                       for m in (local_model, docker_model))
        assert local_arrays.keys() == docker_arrays.keys()
        for name, array in local_arrays.items():
            np.testing.assert_allclose(docker_arrays[name], array, rtol=0, atol=1e-6,
                                       err_msg=f"{run} {name}")


def weight_arrays(framework, weights):
    """{name: array} of a model file's weights: torch's state dict, the others' .npz."""
    if framework == "torch":
        import torch

        return {name: t.numpy() for name, t in torch.load(io.BytesIO(weights)).items()}
    with np.load(io.BytesIO(weights), allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}


def test_function_images_hold_cpu_builds_only(docker_run):
    """Every image the docker run built (substra names it after its archive's sha256) has no CUDA
    package, CPU torch only, and none of MindSpore's GPU or Ascend plugins."""
    import docker

    _, tmp = docker_run
    client = docker.from_env()
    archives = sorted((tmp / "results" / "substra" / "archives").glob("*.tar.gz"))
    # score, train + predict per run, and the first run's genesis (the samples are read-only here)
    assert len(archives) == 1 + 2 * len(FRAMEWORKS) + 1
    plugins = "/usr/local/lib/python3.11/site-packages/mindspore/lib/plugin"
    for archive in archives:
        image = f"function-{hashlib.sha256(archive.read_bytes()).hexdigest()}"
        command = f"pip list --format=freeze; ls {plugins} 2>/dev/null || true"
        listing = client.containers.run(image, ["sh", "-c", command], entrypoint=[],
                                        remove=True).decode().split()
        assert not [name for name in listing
                    if re.search(r"nvidia|cuda|gpu|ascend", name, re.I)], archive.name
        assert all(name.endswith("+cpu") for name in listing
                   if name.startswith("torch==")), archive.name


def test_federated_averaging_runs_in_the_functions_images(docker_daemon, tmp_path, tiny_data_2orgs):
    """The aggregate function in its own image, between the organisations' train tasks and the
    evaluation, as in the subprocess backend. One framework: an aggregate image is its algo's
    image with another entrypoint (archive.function_dockerfile), and every framework's image runs
    in `docker_run`."""
    (tmp_path / "hp.json").write_text(json.dumps(TINY_HYPERPARAMETERS))
    proc = run_local("--backend", "docker", "--data", tiny_data_2orgs, "--output", tmp_path / "out",
                     "--hyperparameters", tmp_path / "hp.json", "--organizations", 2, "--strategy",
                     "fedavg", "--frameworks", "torch", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(r["framework"], r["round"], r["organization"]) for r in records] == [
        ("torch", 1, "fedavg")]
    alone = accountant.compose_epsilon([events.DpEvent("x", ("x",), 150, 1 / 3, 1.0, 3,
                                                       "per-example", 1.0)],
                                    # each organisation's one run, and nothing more
                                    TINY_HYPERPARAMETERS["delta"])
    for record in records:
        assert record["epsilon_by_organization"] == {org: pytest.approx(alone)
                                                     for org in ("MyOrg1MSP", "MyOrg2MSP")}
        assert 0 <= record["test_accuracy"] <= 1
        saved = model_file.load(record["model_file"], record["framework"])
        # it ran from its registered archive
        assert saved.hyperparameters["aggregated_by"]["archive_digest"]
    archives = sorted(p.name for p in (tmp_path / "out" / "substra" / "archives").glob("*.tar.gz"))
    assert archives == sorted(["accuracy.tar.gz"] + [f"torch_{function}.tar.gz" for function in (
        "aggregate", "genesis", "predict", "train")])


def test_a_failing_task_is_named_and_exits_non_zero(tmp_path, tiny_data):
    (tmp_path / "hp.json").write_text(json.dumps(DIVERGING))
    proc = run_local("--data", tiny_data, "--output", tmp_path / "out", "--hyperparameters",
                     tmp_path / "hp.json", "--frameworks", FRAMEWORKS[0], cwd=tmp_path)
    assert proc.returncode == 2
    message = proc.stderr[proc.stderr.index("error: compute plan"):]
    assert f"failed in task '{FRAMEWORKS[0]} train, round 1 at MyOrg1MSP'" in message
    assert f"function '{FRAMEWORKS[0]} train'" in message
    # the function's own
    assert "last lines of its log" in message and "training diverged in 5 steps" in message
    assert "Traceback" not in proc.stderr
    # reports still written
    assert "The plan failed" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.parametrize("changes, message", [
    ({"batch_size": 1000}, "batch_size = 1000 is larger than the 150 training examples"),
    ({"delta": 0.01}, "delta = 0.01 must be > 0 and < 1/n"),
    ({"secure_mode": True}, "secure_mode: TF Privacy offers no secure noise generator"),
    ({"epochs": 10000, "batch_size": 1}, "1,500,000 steps, more than 1,000,000"),
    # A budget below one step's ε, σ given or calibrated (the train tasks would fail
    # half-way through the plan).
    ({"max_epsilon": 0.001}, "max_epsilon = 0.001 is below the ε of a single step"),
    ({"noise_multiplier": None, "target_epsilon": 3.0, "max_epsilon": 0.5},
     "max_epsilon = 0.5 is below the ε of a"),
    # Noise the accountant cannot bound (it ran for minutes or failed in dp_accounting),
    # a target the count spends.
    ({"clip_quantile": 0.5, "clip_count_stddev": 0.005},
     "gives adaptive clipping's count a noise multiplier of 0.01"),
    ({"noise_decay": 0.001}, "noise_decay = 0.001 (σ · 0.001^2 in the last of 3 stages)"),
    ({"clip_quantile": 0.5, "noise_multiplier": None, "target_epsilon": 0.01},
     "noisy count alone spends ε = "),
])
def test_what_a_task_would_refuse_is_refused_before_anything_is_registered(
        tmp_path, tiny_data_2orgs, changes, message):
    (tmp_path / "hp.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, **changes}))
    proc = run_local("--data", tiny_data_2orgs, "--output", tmp_path / "out", "--hyperparameters",
                     tmp_path / "hp.json", "--frameworks", "tf", "--organizations", 2, cwd=tmp_path)
    assert (proc.returncode == 2 and proc.stderr.count("\n") == 1
            and message in proc.stderr), proc.stderr
    # names the user's file
    assert f"tf hyperparameters ({tmp_path / 'hp.json'}), organisation 1: " in proc.stderr
    # nothing was built or registered
    assert not list((tmp_path / "out").glob("substra/archives/*"))


@pytest.mark.parametrize("content, message", [
    ('{"dp": "false"}', 'dp = "false" is a string; it must be true or false'),
    ('{"dp": false}', "remove dp from this file"),
    ('{"target_epsilon": 1e9}', "target_epsilon = 1000000000.0 must be a number in (0, 100]"),
    ('{"epochs": 1000000000}', "epochs = 1000000000 must be an integer from 1 to 10,000"),
    ('{"epochs": 1, "batch_size": 10, "epochs": 2}', 'key "epochs" is given twice; keep one'),
])
def test_bad_hyperparameters_are_one_line_naming_the_users_file(tmp_path, content, message):
    (tmp_path / "hp.json").write_text(content)
    proc = run_local("--hyperparameters", tmp_path / "hp.json", "--data", tmp_path / "d",
                     cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"error: {tmp_path / 'hp.json'}: "), proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "d").exists()


def shuffled_copy(tiny_data, dest):
    """The tiny data with a third train sample: sample 0's examples again, rows shuffled (new
    bytes)."""
    shutil.copytree(tiny_data, dest)
    images, labels = (np.load(dest / "train" / "0" / name) for name in ("images.npy", "labels.npy"))
    order = np.random.default_rng(0).permutation(len(labels))
    (dest / "train" / "2").mkdir()
    np.save(dest / "train" / "2" / "images.npy", images[order])
    np.save(dest / "train" / "2" / "labels.npy", labels[order])
    shutil.copy(dest / "train" / "0" / "identity.key", dest / "train" / "2")
    return dest


def test_examples_shared_between_an_organisations_samples_are_refused(tmp_path, tiny_data):
    # One organisation's train task would get all three samples; organisations that share examples
    # are not refused (each example's ε composes the runs of every organisation holding it).
    data = shuffled_copy(tiny_data, tmp_path / "data")
    proc = run_local("--data", data, "--output", tmp_path / "out", "--organizations", 1,
                     cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "share 150 examples" in proc.stderr and str(
        data / "train" / "2") in proc.stderr, proc.stderr


def test_a_second_run_on_the_same_output_is_refused_and_leftovers_are_removed(tmp_path, tiny_data):
    import fcntl

    out = tmp_path / "out"
    leftover = out / "substra" / "local-worker" / "tmpabc123"
    leftover.mkdir(parents=True)
    (leftover / "model").write_bytes(b"x" * 2_000_000)
    # stops early
    (tmp_path / "hp.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, "batch_size": 1000}))
    with open(out / ".lock", "a+") as held:  # what a running run_local holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        proc = run_local("--data", tiny_data, "--output", out, "--hyperparameters",
                         tmp_path / "hp.json", cwd=tmp_path)
        assert (proc.returncode == 2
                and "another run (process 4242) is writing to this --output folder" in proc.stderr)
        assert leftover.exists()
    proc = run_local("--data", tiny_data, "--output", out, "--hyperparameters",
                     tmp_path / "hp.json", cwd=tmp_path)
    assert proc.returncode == 2 and "batch_size = 1000" in proc.stderr
    assert ("removed 2 MB of work files left in" in proc.stdout
            and "by a run that was killed" in proc.stdout)
    assert not leftover.exists()


def test_output_that_is_a_file_or_read_only_is_one_line(tmp_path, tiny_data):
    from conftest import WITHOUT_WRITE_OVERRIDE

    (tmp_path / "file").write_text("mine")
    proc = run_local("--data", tiny_data, "--output", tmp_path / "file", cwd=tmp_path)
    assert (proc.returncode == 2
            and "file: is a file; --output folder must be a folder" in proc.stderr)
    assert (tmp_path / "file").read_text() == "mine"
    (tmp_path / "ro").mkdir(mode=0o555)
    proc = subprocess.run([*WITHOUT_WRITE_OVERRIDE, sys.executable, SCRIPT, "--data", tiny_data,
                           "--output", tmp_path / "ro" / "out"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert (proc.returncode == 2 and proc.stderr.startswith("error: ")
            and "Traceback" not in proc.stderr)
    assert "cannot write to this folder (Permission denied)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, hp, message", [
    (["--baseline"], {}, "does not allow a non-private model"),
    (["--score-train"], {}, "does not allow scores on the training data"),
    ([], {"noise_seed": 1}, "does not allow replayable noise"),
])
def test_an_opt_in_the_data_owner_forbids_is_refused_before_anything_is_registered(
        tmp_path, tiny_data, args, hp, message):
    data = shutil.copytree(tiny_data, tmp_path / "data")
    for folder in dataset.sample_folders(data, "train"):
        policy.write(folder, policy.parse({"allow": []}, "test"))
    (tmp_path / "hp.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, **hp}))
    proc = run_local("--data", data, "--output", tmp_path / "out", "--frameworks", "torch",
                     "--hyperparameters", tmp_path / "hp.json", *args, cwd=tmp_path)
    assert_one_line_error(proc, message, policy.POLICY_FILE)
    assert not (tmp_path / "out" / "substra").exists() or not any(
        (tmp_path / "out" / "substra").rglob("*.tar.gz"))


def test_a_public_size_far_from_the_data_is_refused_before_anything_is_registered(tmp_path,
                                                                                  tiny_data):
    """--public-size far from a sample's 150 images, or a declaration gone far from its data: one
    line, nothing declared, nothing registered; an undeclared sample is refused naming it."""
    data = shutil.copytree(tiny_data, tmp_path / "data")
    folders = dataset.sample_folders(data, "train")
    before = [policy.read(f) for f in folders]

    def refused(*args):
        proc = run_local("--data", data, "--output", tmp_path / "out", "--frameworks", "torch",
                         *args, cwd=tmp_path)
        assert not (tmp_path / "out" / "substra").exists() or not any(
            (tmp_path / "out" / "substra").rglob("*.tar.gz"))
        return proc

    assert_one_line_error(refused("--public-size", 1000), f"{folders[0]}: holds 150 images but "
                          "declares a public size of 1,000, more than 10% away")
    assert [policy.read(f) for f in folders] == before
    policy.declare_size(folders[0], 120)
    assert_one_line_error(refused(), "organisation 1's data: holds 300 images but declares a "
                                     "public size of 270")
    (folders[0] / policy.POLICY_FILE).unlink()
    assert_one_line_error(refused(), f"{folders[0]}: no public size declared for this data")


def test_a_read_only_data_folder_is_refused_before_anything_is_registered(tmp_path, tiny_data,
                                                                          tmpfs):
    """Its ledger could not record the released runs: a run would be counted nowhere."""
    mount = tmpfs("size=8m")
    data = shutil.copytree(tiny_data, mount / "data")
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    proc = run_local("--data", data, "--output", tmp_path / "out", "--frameworks", "torch",
                     cwd=tmp_path)
    assert_one_line_error(proc, "cannot record the released runs in this data's privacy ledger: "
                                "the folder is read-only")
    assert not (tmp_path / "out" / "results.json").exists()


def test_sigterm_stops_a_run_like_ctrl_c_and_leaves_no_work_files(tmp_path, tiny_data):
    import signal
    import time

    out = tmp_path / "out"
    (tmp_path / "hp.json").write_text(json.dumps({**TINY_HYPERPARAMETERS, "epochs": 50}))
    run = subprocess.Popen([sys.executable, SCRIPT, "--data", tiny_data, "--output", out,
                            "--frameworks", "torch", "--hyperparameters", tmp_path / "hp.json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    worker = out / "substra" / "local-worker"
    deadline = time.monotonic() + 120
    while not list(worker.glob("*/*")) and time.monotonic() < deadline:  # a task is running
        time.sleep(0.2)
    time.sleep(3)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM and stderr.rstrip().endswith(
        "terminated"), stderr[-2000:]
    assert "Traceback" not in stderr
    assert not list(worker.iterdir()) if worker.exists() else True


@pytest.mark.parametrize("args, message", [
    (["--rounds", 2000, "--strategy", "fedavg"],
     "--rounds 2000 with --organizations 1, --strategy fedavg and 3 runs make 24,000 tasks, more "
     "than the 10,000"), (["--organizations", 1000, "--rounds", 3],
     "--rounds 3 with --organizations 1000, --strategy cyclic and 3 runs make 27,000 tasks"),
    (["--rounds", 10**9], "argument --rounds: 1,000,000,000 is not an integer from 1 to 10,000"),
    (["--organizations", 10**9],
     "argument --organizations: 1,000,000,000 is not an integer from 1 to 1,000"),
])
def test_a_plan_too_large_is_refused_at_once_before_any_data_is_generated(tmp_path, args, message):
    proc = subprocess.run([sys.executable, SCRIPT, *map(str, args), "--data", tmp_path / "d",
                           "--output",
                           tmp_path / "out"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert (proc.returncode == 2 and proc.stderr.startswith(f"error: {message}")
            and proc.stderr.count("\n") == 1), proc.stderr
    assert not (tmp_path / "d").exists()


def test_more_organisations_than_the_datas_samples_names_the_option_given(tmp_path, tiny_data):
    proc = run_local("--data", tiny_data, "--output", tmp_path / "out", "--organizations", 3,
                     cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: --organizations 3: {tiny_data} holds 2 train data "
                                  "samples for 3 organisations (one at least each); use at "
                                  "most 2")


def test_a_plan_the_default_data_cannot_hold_is_refused_before_it_is_written(tmp_path):
    # 1,000 organisations would get 4 examples each, fewer than a batch: refused
    # before any sample is written.
    proc = run_local("--organizations", 1000, "--data", tmp_path / "new", "--output",
                     tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "organisation 1 of the default data" in proc.stderr and "batch" in proc.stderr
    assert not (tmp_path / "new").exists() and not (tmp_path / "out").exists()

