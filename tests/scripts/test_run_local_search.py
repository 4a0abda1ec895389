"""--search: a private hyperparameter search at each organisation as Substra tasks (run_local.py,
subprocess backend), the tune function through the substratools command line, and the search file's
bad inputs."""
import difflib
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from conftest import (
    REPO,
    TINY_HYPERPARAMETERS,
    extract_function,
    run_function,
    run_python,
    samples,
    tiny_hyperparameters,
)

from mnist_dp.assets import ALGO_ASSETS, DATASET_ASSET
from mnist_dp.data import dataset
from mnist_dp.data.samples import sample_identity
from mnist_dp.learning import search
from mnist_dp.privacy import model_file

SCRIPT = REPO / "scripts" / "run_local.py"
SEARCH = {"space": {"learning_rate": [0.05, 0.1, 0.2], "ema_decay": [0.0, 0.5]},
          "mean_candidates": 2, "shape": 1, "validation_fraction": 0.2}
HYPERPARAMETERS = {**TINY_HYPERPARAMETERS, "noise_multiplier": None, "target_epsilon": 3.0}


def run_local(tmp_path, data, search, hp=HYPERPARAMETERS, *args):
    (tmp_path / "hp.json").write_text(json.dumps(hp))
    if isinstance(search, dict):
        (tmp_path / "search.json").write_text(json.dumps(search))
        search = tmp_path / "search.json"
    return run_python([SCRIPT, "--data", data, "--output", tmp_path / "out", "--hyperparameters",
                       tmp_path / "hp.json", "--frameworks", "torch", "--search", search, *args],
                      tmp_path)


@pytest.fixture(scope="module")
def searched(tmp_path_factory, tiny_data_2orgs):
    tmp = tmp_path_factory.mktemp("search")
    proc = run_local(tmp, tiny_data_2orgs, SEARCH, HYPERPARAMETERS, "--organizations", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, tmp / "out"


def model_files(folder):
    """Every model file under `folder`, wherever Substra or the report put it: {path: sha256 of its
    weights}."""
    found = {}
    for path in folder.rglob("*"):
        if path.is_file() and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if "weights.bin" in archive.namelist():
                    found[path] = hashlib.sha256(archive.read("weights.bin")).hexdigest()
    return found


def test_each_organisation_releases_one_model_whose_ledger_is_its_whole_search(
        searched, tiny_data_2orgs):
    proc, out = searched
    records = json.loads((out / "results.json").read_text())
    assert len(records) == 2 and len({r["organization"] for r in records}) == 2
    holdings = dataset.sample_folders(tiny_data_2orgs, "train")
    for record, folder in zip(records, holdings):
        saved = model_file.load(record["model_file"], "torch")
        (event,) = saved.ledger.events
        assert event.search is not None and event.search.mean == 2 and event.search.shape == 1
        assert event.data == (sample_identity(folder),)  # its own organisation's data only
        assert 2.5 < record["epsilon"] <= 3.0 and record["epsilon"] == pytest.approx(
            record["epsilon_in_substra"])
        assert "RDP" in record["accountant"]
    summary = (out / "summary.md").read_text()
    assert "the whole of the 1 private hyperparameter search(es)" in summary
    # the not-covered line names what the search does not cover
    assert "besides the private search" in summary


def test_only_the_best_candidates_model_and_no_score_leaves_a_search(searched):
    proc, out = searched
    records = json.loads((out / "results.json").read_text())
    released = {hashlib.sha256(model_file.load(r["model_file"]).weights).hexdigest()
                for r in records}
    # Every model file anywhere in the run (Substra's work files included) is a released
    # one: no other candidate's.
    assert set(model_files(out).values()) == released
    # Substra's performances: each tune task's ε and each released model's
    # test accuracy, nothing else.
    performances = (out / "summary.md").read_text().split(
        "## Performances as recorded by Substra")[1]
    headers, *rows = [[cell.strip() for cell in line.split("|")[1:-1]]
                      for line in performances.splitlines()
                      if line.startswith("| ") and not line.startswith("|---")]
    organizations = sorted(r["organization"] for r in records)
    assert headers == ["run", "round", "model trained at",
                       *(f"epsilon @ {org}" for org in organizations),
                       f"test_accuracy @ {organizations[0]}"], headers
    assert sorted(row[2] for row in rows) == organizations  # one row per released model
    by_org = {r["organization"]: r for r in records}
    for row in rows:
        values = [None if v == "-" else float(v) for v in row[3:]]
        # its tune task's ε, its test accuracy: no other figure
        assert sum(v is not None for v in values) == 2
        assert values[-1] == pytest.approx(by_org[row[2]]["test_accuracy"], abs=1e-4)
    assert "validation" not in proc.stdout + proc.stderr


# Runs a tune task's algo.py with K, the number of candidates, forced to argv[1]: the search draws
# it in secret, so a test cannot choose it otherwise under secure_mode (which refuses a noise_seed).
FORCED_COUNT = """import runpy, sys
from mnist_dp.learning import search
count = int(sys.argv.pop(1))
search.draw_count = lambda rng, mean, shape: count
sys.argv[0] = "algo.py"
runpy.run_path("algo.py", run_name="__main__")
"""


def in_a_terminal(command, cwd, env):
    """Run `command` with its standard output and error on a pseudo-terminal (as Substra's docker
    mode gives a task): (exit code, everything it wrote there, progress bars included)."""
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=follower,
                            stderr=follower)
    os.close(follower)
    written = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process and its children are done with it
            break
        if not chunk:
            break
        written += chunk
    os.close(leader)
    return proc.wait(), written.decode(errors="replace")


# torch with a final run and a recipe candidate: the plain search's flow is the other frameworks'
@pytest.mark.parametrize("framework, extra", [(name, {}) for name in ALGO_ASSETS if name != "torch"]
                         + [("torch", {"search_epsilon": 1.0, "recipe_candidate": True})])
def test_nothing_a_tune_task_emits_depends_on_the_number_of_candidates(
        tmp_path, tiny_data, framework, extra):
    """A K = 1 and a K = 6 search under a terminal, with secure_mode where the framework has it: the
    same bytes on the terminal, digits included, from the task's first line on (before it, the
    process's start, only timestamps are masked), the same timings file, the same outputs; with
    search_epsilon and a recipe candidate, the final run's and the recipe's too."""
    import os

    # TF Privacy has no secure noise generator: its algo refuses secure_mode
    secure = framework != "tf"
    hp = tiny_hyperparameters(framework, noise_multiplier=None, target_epsilon=3.0, noise_seed=None,
                              secure_mode=secure)
    folder = extract_function(ALGO_ASSETS[framework], "tune", tmp_path / "build", hp)
    (folder / "search.json").write_text(json.dumps({**SEARCH, **extra}))
    (folder / "forced_count.py").write_text(FORCED_COUNT)
    written, timings, outputs = [], [], []
    for count in (1, 6):
        # each search on a copy nothing was released from yet
        shutil.rmtree(tmp_path / "data", ignore_errors=True)
        data = shutil.copytree(tiny_data, tmp_path / "data")
        resources = [{"id": "opener", "value": str(DATASET_ASSET / "opener.py"),
                      "multiple": False}] + [
            {"id": "datasamples", "value": f, "multiple": True} for f in samples(data, "train")]
        out = tmp_path / f"out{count}"
        out.mkdir()
        outs = [{"id": "model", "value": str(out / "model"), "multiple": False},
                {"id": "epsilon", "value": str(out / "epsilon"), "multiple": False}]
        timings_file = tmp_path / f"timings{count}.jsonl"
        code, text = in_a_terminal(
            [sys.executable, "forced_count.py", str(count), "--function-name", "tune", "--inputs",
             json.dumps(resources), "--outputs", json.dumps(outs), "--log-level", "debug"], folder,
            {**os.environ, "MNIST_DP_TIMINGS": str(timings_file)})
        assert code == 0, text[-3000:]
        before, sentinel, after = text.partition(search.UNTIMED)
        assert sentinel, text[-3000:]
        written.append(re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", before) + after)
        timings.append(timings_file.read_text() if timings_file.exists() else None)
        outputs.append(sorted(p.name for p in out.iterdir()))
    assert ("search: released the best candidate" if "search_epsilon" not in extra else
            "search: released the final run") in written[0]
    assert written[0] == written[1], "\n".join(
        difflib.unified_diff(*(w.splitlines() for w in written), lineterm=""))
    assert timings[0] == timings[1] and outputs[0] == outputs[1] == ["epsilon", "model"]


# candidate_epochs None with a search_epsilon: the torch case of the K-independence test above.
@pytest.mark.parametrize("short", [{"candidate_epochs": 1, "recipe_weight": 0.5,
                                    "recipe_margin": 0.05},
                                   {"candidate_epochs": 1, "recipe_candidate": True,
                                    "recipe_margin_noise": 3.0}])
def test_a_tune_task_with_search_epsilon_releases_a_final_run_on_all_its_data(tmp_path,
                                                                                  tiny_data, short):
    """search_epsilon: the search spends it, the best candidate's hyperparameters train again on
    every example, validation ones too, and only that model leaves; the model's ledger and the
    data's own hold the search, then the run, together at target_epsilon. With candidate_epochs,
    the candidates train that many epochs and the final run the hyperparameters file's."""
    hp = tiny_hyperparameters("torch", noise_multiplier=None, target_epsilon=3.0, noise_seed=0,
                              epochs=2)
    folder = extract_function(ALGO_ASSETS["torch"], "tune", tmp_path / "build", hp)
    (folder / "search.json").write_text(json.dumps({**SEARCH, "search_epsilon": 1.0, **short}))
    data = shutil.copytree(tiny_data, tmp_path / "data")
    folders = samples(data, "train")
    proc = run_function(folder / "algo.py", "tune",
                        {"opener": DATASET_ASSET / "opener.py", "datasamples": folders},
                        {"model": tmp_path / "model", "epsilon": tmp_path / "epsilon"},
                        log_level="info")
    assert "released the final run on the best candidate's hyperparameters" in proc.stderr
    saved = model_file.load(tmp_path / "model", "torch")
    searched, final = saved.ledger.events
    assert searched.search is not None and final.search is None
    assert (searched.search.recipe is not None) == short.get("recipe_candidate", False)
    assert final.n == searched.n == sum(len(np.load(f"{f}/labels.npy")) for f in folders)
    trained = searched.n - searched.search.validation_n
    assert searched.planned_steps == short.get("candidate_epochs", 2) * math.ceil(
        trained / searched.batch_size)
    assert final.planned_steps == 2 * math.ceil(final.n / final.batch_size)
    assert (saved.hyperparameters["noise_multiplier"] == final.noise_multiplier
            != searched.noise_multiplier)
    epsilon = json.loads((tmp_path / "epsilon").read_text())["all"]
    assert 2.9 < epsilon <= 3.0 and epsilon == pytest.approx(saved.ledger.epsilon(hp["delta"]))
    from mnist_dp.privacy import data_ledger

    assert [e.run_id for e in data_ledger.read(folders).events] == [searched.run_id,
                                                                    final.run_id]


@pytest.mark.parametrize("search, message", [
    ({"space": {}}, '"space" must be a non-empty object'),
    ({"space": {"lr": [0.1]}}, "space.lr: unknown hyperparameter"),
    ({"space": {"learning_rate": {"low": 0.0, "high": 2.0}}},
     "learning_rate = 0.0 must be a number in (0, 1000]"),
    ({"space": {"learning_rate": [0.1]}, "mean_candidates": 0.5},
     "mean_candidates = 0.5 must be a number from 1"),
    ({"space": {"learning_rate": [0.1]}, "shape": -1}, "shape = -1 must be a number from 0 to 10"),
    ({"space": {"learning_rate": [0.1]}, "shape": 1e6},
     'nearly Poisson, whose own bound ("poisson") is far tighter'),
    ({"space": {"epochs": {"low": 1, "high": 10000}, "batch_size": {"low": 1, "high": 4000}}},
     "the space has 40,000,000 privacy profiles"),  # refused before one is made
    ({"space": {"target_epsilon": [1.0, 2.0]}},
     "target_epsilon is one setting for the whole search"),
    ({"space": {"epochs": {"low": 1, "high": 3}}, "validation_fraction": 0.9},
     "validation_fraction = 0.9 must be"), ({"space": {"noise_decay": {"low": 0.5, "high": 1.0}}},
     "noise_decay changes a candidate's noise"),
    ({"space": {"learning_rate": [0.1]}, "candidates": 3}, "unknown key ['candidates']"),
    ({"space": {"learning_rate": [0.1]}, "search_epsilon": 0},
     "search_epsilon = 0 must be null or a number above 0"),
    ({"space": {"learning_rate": [0.1]}, "recipe_candidate": "yes"},
     'recipe_candidate = "yes" must be true or false'),
])
def test_a_bad_search_file_is_one_line_and_nothing_is_registered(
        tmp_path, tiny_data, search, message):
    proc = run_local(tmp_path, tiny_data, search)
    assert (proc.returncode == 2 and proc.stderr.count("\n") == 1
            and message in proc.stderr), proc.stderr
    assert str(tmp_path / "search.json") in proc.stderr  # names the user's file
    # refused before the output folder, the data or any registration
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("hp, args, message", [
    ({**HYPERPARAMETERS, "target_epsilon": 0.001}, (),
     "(a search of 2 candidates on average): target_epsilon = 0.001: even noise_multiplier = 1000"),
    (TINY_HYPERPARAMETERS, (), "a search needs target_epsilon"),
    ({**HYPERPARAMETERS, "max_epsilon": 2.0}, (), "set max_epsilon to null"),
    (HYPERPARAMETERS, ("--rounds", 2), "--rounds"),
    (HYPERPARAMETERS, ("--baseline",), "--baseline"),
])
def test_a_search_no_task_could_run_is_refused_before_anything_is_registered(
        tmp_path, tiny_data, hp, args, message):
    proc = run_local(tmp_path, tiny_data, SEARCH, hp, *args)
    assert (proc.returncode == 2 and proc.stderr.count("\n") == 1
            and message in proc.stderr), proc.stderr
    # nothing was built or registered
    assert not list((tmp_path / "out").glob("substra/archives/*"))


@pytest.mark.parametrize("search, hp, figures", [
    ({**SEARCH, "search_epsilon": 3.0}, HYPERPARAMETERS, "= 3 must be below target_epsilon = 3"),
    ("default", {**HYPERPARAMETERS, "target_epsilon": 0.25},
     "= 0.25 must be below target_epsilon = 0.25"),
])
def test_a_search_epsilon_not_below_target_epsilon_is_refused_before_anything_is_registered(
        tmp_path, tiny_data, search, hp, figures):
    proc = run_local(tmp_path, tiny_data, search, hp)
    assert (proc.returncode == 2 and proc.stderr.count("\n") == 1
            and f"the search's search_epsilon {figures}: the final run spends the rest; raise "
                "target_epsilon, or give a search file with a smaller search_epsilon"
            in proc.stderr), proc.stderr
    assert not list((tmp_path / "out").glob("substra/archives/*"))


def test_the_default_search_is_valid_for_the_bundles_hyperparameters(tmp_path, tiny_data):
    from mnist_dp import hyperparameters, search_space

    search = search_space.load(None)
    for framework, asset in ALGO_ASSETS.items():
        base = hyperparameters.load(asset / hyperparameters.FILE_NAME)
        # one privacy profile, the recipe's and every candidate's
        assert len(set(search_space.check_with(search, search.for_candidates(base),
                                               framework))) == 1
        drawn = search.draw(base, np.random.default_rng(0))
        assert 0.25 <= drawn.learning_rate <= 4 and drawn.ema_decay in (0.0, 0.9, 0.99)


def test_a_search_runs_in_the_functions_docker_images_as_in_subprocesses(
        docker_daemon, tmp_path, tiny_data):
    """The tune function's image runs the same search: with the same noise_seed, the same candidates
    and the same released model's hyperparameters and ε as Substra's subprocess mode."""
    replayed = {**HYPERPARAMETERS, "noise_seed": 4}
    released = []
    for backend in ("subprocess", "docker"):
        (tmp_path / backend).mkdir()
        proc = run_local(tmp_path / backend, tiny_data, SEARCH, replayed, "--backend", backend)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (record,) = json.loads((tmp_path / backend / "out" / "results.json").read_text())
        saved = model_file.load(record["model_file"], "torch")
        released.append((record["epsilon"], saved.hyperparameters["learning_rate"],
                         saved.hyperparameters["ema_decay"], saved.ledger.events[0].search))
    assert released[0] == released[1]
