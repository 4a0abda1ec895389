"""A substrafl experiment with the bundle's algos, end to end: examples/substrafl_fedavg.py on
Substra's subprocess backend in every framework and in docker for torch (tiny data, 1 round), and
what mnist_dp/federated/experiment.py does around substrafl: the pinned packages, the Dockerfile's
user, a failed task named with its log."""
import json
import math
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import FRAMEWORKS, REPO, TINY_HYPERPARAMETERS, independent_epsilon, report_files
from substrafl.evaluation_strategy import EvaluationStrategy
from substrafl.nodes import AggregationNode
from substrafl.remote.register import register as substrafl_register

from mnist_dp.federated import experiment
from mnist_dp.federated.algo import METRICS, DpFedAvgAlgo
from mnist_dp.federated.strategy import DpFedAvg
from mnist_dp.orchestration import connection, registry
from mnist_dp.privacy import model_file

EXAMPLE = REPO / "examples" / "substrafl_fedavg.py"
# Tiny, with σ calibrated to ε = 3 for the run (the recipe's target).
TINY = {**TINY_HYPERPARAMETERS, "noise_multiplier": None, "target_epsilon": 3.0, "delta": 1e-5,
        "ema_decay": 0.0}


def run_example(tmp_path, data, *options):
    (tmp_path / "hp.json").write_text(json.dumps(TINY))
    return subprocess.run([sys.executable, str(EXAMPLE), "--data", str(data), "--output",
                           str(tmp_path / "out"), "--hyperparameters", str(tmp_path / "hp.json"),
                           *options], capture_output=True, text=True, cwd=tmp_path)


def check_results(out, framework, organizations):
    records = json.loads((out / "results.json").read_text())
    assert [(r["round"], r["organization"]) for r in records] == [
        (1, f"MyOrg{k}MSP") for k in range(1, organizations + 1)]
    # every organisation holds the global model
    assert len({r["test_accuracy"] for r in records}) == 1
    assert 0 <= records[0]["test_accuracy"] <= 1
    orgs = [f"MyOrg{k}MSP" for k in range(1, organizations + 1)]
    for record in records:
        org = record["organization"]
        assert record["framework"] == framework and record["dp"]
        # The local state's ledger holds every organisation's run (all are in the global weights):
        # its figure is the worst organisation's, each organisation's own beside it, and the
        # evaluation reported its own.
        assert list(record["epsilon_by_organization"]) == orgs
        assert record["epsilon"] == max(record["epsilon_by_organization"].values()) <= 3.0
        # the local state: the bundle's model file
        saved = model_file.load(record["model_file"], framework)
        assert (len(saved.ledger.events) == organizations
                and len(saved.ledger.keys()) == organizations)
        n = 300 // organizations  # the tiny data's examples, shared; batch 64
        for event, other in zip(saved.ledger.events, orgs):
            assert event.steps == -(-n // 64) and event.sample_rate == pytest.approx(
                1 / -(-n // 64))
            assert math.isclose(record["epsilon_by_organization"][other], independent_epsilon(
                event.noise_multiplier, event.sample_rate, event.steps, record["delta"]),
                                rel_tol=1e-6)
        assert math.isclose(record["epsilon_in_substra"], record["epsilon_by_organization"][org],
                            rel_tol=1e-9)
        # What each organisation's data has spent: this experiment's one run (recorded by
        # its task, or in docker mode by the example from the local state), on data
        # nothing else was trained on.
        assert record["data_epsilon_by_organization"] == pytest.approx(
            record["epsilon_by_organization"], rel=1e-9)
    assert (out / "summary.md").is_file() and (out / "results.png").is_file()


# tf and MindSpore with one organisation, which runs their code in every kind of task with half the
# tasks (test_algo.py checks in every framework that an organisation keeps the global model); torch
# with two organisations in docker below, and beside the bundle's own plans in
# test_across_organisations.py.
@pytest.mark.parametrize("framework", [f for f in FRAMEWORKS if f != "torch"])
def test_the_example_runs_in_every_framework(framework, tmp_path, tiny_data):
    organizations = 1
    done = run_example(tmp_path, tiny_data, "--framework", framework, "--rounds", "1",
                       "--organizations", str(organizations))
    assert done.returncode == 0, done.stderr[-3000:]
    check_results(tmp_path / "out", framework, organizations)
    assert "ε: each model's own, for adding or removing one example" in done.stdout
    # redirected: a line per finished task, no bar, none of substrafl's INFO lines
    assert "Compute plan progress: 1/" in done.stderr and "%|" not in done.stderr
    assert " - INFO - " not in done.stderr


def test_the_example_runs_in_substrafls_docker_images(docker_daemon, tmp_path, tiny_data_2orgs):
    """substrafl's generated Dockerfile (FROM python:3.11-slim, its venv, our pinned packages from
    the index)."""
    done = run_example(tmp_path, tiny_data_2orgs, "--framework", "torch", "--rounds", "1",
                       "--backend", "docker")
    assert done.returncode == 0, done.stderr[-3000:]
    check_results(tmp_path / "out", "torch", 2)


def test_a_failed_task_is_named_with_its_organisation_and_log(tmp_path, tiny_data_2orgs):
    """An algo calibrated for 1 round in a 2-round experiment: the organisations' third train task
    refuses."""
    work = tmp_path / "substra"
    clients = [connection.connect("subprocess", work_dir=work) for _ in range(2)]
    organizations = experiment.register(clients, registry.KeysFile(), tiny_data_2orgs)
    algo = DpFedAvgAlgo("torch", {**json.loads((
                            REPO / "assets/algo_torch_dp/hyperparameters.json").read_text()),
                                  **TINY_HYPERPARAMETERS}, rounds=1)
    with pytest.raises(experiment.ExperimentFailed) as failed:
        experiment.run(clients[0], tmp_path, strategy=DpFedAvg(algo=algo, metric_functions=METRICS),
                       train_data_nodes=organizations.train_data_nodes,
                       aggregation_node=AggregationNode(organizations.train_data_nodes[
                           0].organization_id), evaluation_strategy=EvaluationStrategy(
                           test_data_nodes=organizations.test_data_nodes, eval_rounds=[2]),
                       num_rounds=2, dependencies=experiment.dependency("torch"),
                       name="too many rounds")
    message = str(failed.value)
    assert "substrafl experiment failed at organisation MyOrg" in message
    assert "function 'Training with DpFedAvgAlgo', round 2" in message
    assert "calibrated for rounds = 1" in message.split("last lines of its log:")[1]


def test_the_packages_are_the_frameworks_dockerfiles_and_requirements():
    pins = dict(line.split("==") for line in (REPO / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for framework in FRAMEWORKS:
        packages = experiment.pinned_packages(framework)
        named = dict(p.split("==") for p in packages if "==" in p)
        assert {"numpy", "dp-accounting", "substratools"} <= set(named)
        assert all(pins[name] == version for name, version in named.items())
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in experiment.pinned_packages(
        "torch")
    assert {"torch", "opacus"} <= {p.split("==")[0] for p in experiment.pinned_packages("torch")}
    # the Debian packages too: MindSpore's kernels and MindArmour's OpenCV
    assert [experiment.system_packages(f) for f in FRAMEWORKS] == [
        [] if f != "mindspore" else ["libgomp1", "libgl1", "libglib2.0-0"] for f in FRAMEWORKS]


def test_in_docker_mode_the_functions_run_as_this_user_and_the_template_is_restored():
    template = substrafl_register.DOCKERFILE_TEMPLATE
    with experiment._containers_run_as_this_user(SimpleNamespace(backend_mode="docker")):
        patched = substrafl_register.DOCKERFILE_TEMPLATE
    assert substrafl_register.DOCKERFILE_TEMPLATE == template
    lines = patched.strip().splitlines()
    assert lines[-2].startswith("USER ") and lines[-1].startswith("ENTRYPOINT [")
    assert patched.replace(lines[-2] + "\n",
                           "").replace("# the user who owns the task folders on the host\n", "") \
        == template
    with experiment._containers_run_as_this_user(SimpleNamespace(backend_mode="subprocess")):
        assert substrafl_register.DOCKERFILE_TEMPLATE == template


@pytest.mark.parametrize("options, message", [
    (["--organizations", "0"], "--organizations: 0 is not an integer from 1 to 1,000"),
    (["--framework", "jax"], "invalid choice: 'jax'"),
])
def test_bad_options_are_one_line_errors(options, message, tmp_path, tiny_data):
    done = run_example(tmp_path, tiny_data, *options)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_an_output_inside_the_data_folder_is_refused_before_anything_is_written(
        tmp_path, tiny_data):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    done = run_example(tmp_path, data, "--output", data / "results")
    assert (done.returncode == 2 and "is inside the data folder" in done.stderr
            and done.stderr.count("\n") == 1)
    assert not (data / "results").exists()


def test_a_refused_run_leaves_the_earlier_runs_reports_in_their_place(tmp_path, tiny_data_2orgs):
    """Refused after it took the output folder (the data hold 2 organisations' samples, not 3)."""
    out = tmp_path / "out"
    (out / "models").mkdir(parents=True)
    for name in ("results.json", "summary.md", "results.png", "models/torch.model"):
        (out / name).write_text(f"the earlier run's {name}")
    before = report_files(out)
    done = run_example(tmp_path, tiny_data_2orgs, "--organizations", "3")
    assert (done.returncode == 2 and done.stderr.count("\n") == 1
            and "--organizations" in done.stderr), done.stderr
    assert report_files(out) == before
    assert not (out / "earlier").exists()
    assert "put the earlier run's reports back" in done.stdout


def test_help():
    done = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--framework" in done.stdout and "--backend" in done.stdout


def test_the_federated_journeys_on_one_data_folder_each_meet_their_target_or_refuse(
        tmp_path, tiny_data):
    """The README's order on one machine: the bundle's fedavg (target_epsilon 1, 1 round), then the
    substrafl example (3, 2 rounds) on the same data. A continued model carries its data's
    earlier runs: the example's σ must count them and meet 3 (it printed 3.984 after round 1 when
    it did not)."""
    fedavg = [REPO / "scripts" / "run_local.py", "--frameworks", "torch", "--strategy", "fedavg"]
    journeys = [(fedavg, 1.0, 1), ([EXAMPLE, "--framework", "torch"], 3.0, 2)]
    for k, (journey, target, rounds) in enumerate(journeys):
        out, hp = tmp_path / f"out{k}", tmp_path / f"hp{k}.json"
        hp.write_text(json.dumps({**TINY, "target_epsilon": target}))
        done = subprocess.run([sys.executable, *map(str, journey), "--organizations", "1",
                               "--rounds", str(rounds), "--data", str(tiny_data), "--output",
                               str(out), "--hyperparameters", str(hp)],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        records = json.loads((out / "results.json").read_text())
        assert records and all(r["epsilon"] <= target + 1e-9 for r in records), [
            r["epsilon"] for r in records]
        # the example's last model carries the first journey's run
        ledgers = [model_file.load(r["model_file"]).ledger for r in records]
        assert max(len(ledger.events) for ledger in ledgers) == (1 if k == 0 else 1 + 2)
