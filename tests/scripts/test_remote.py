"""--backend remote end to end: scripts/add_dataset_objective.py and add_train_algo_cnn_dp.py run as
subprocesses against a Substra node imitated over HTTP (substra_node_stub.py), so every call goes
through the real substra SDK. The node runs train tasks with the real training skeleton and opener
around a framework that learns nothing (see write_model_file)."""
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest
import requests
import substra
from conftest import (
    REPO,
    TINY_HYPERPARAMETERS,
    StepsThatLearnNothing,
    assert_one_line_error,
    independent_epsilon,
    tiny_hyperparameters,
)
from substra_node_stub import SubstraNodeStub

from mnist_dp import search_space
from mnist_dp.assets import ALGO_ASSETS, DATASET_ASSET, OBJECTIVE_ASSET, load_asset_module
from mnist_dp.data.dataset import sample_folders
from mnist_dp.data.samples import sample_identity, seal_keys
from mnist_dp.learning import search, skeleton
from mnist_dp.orchestration import archive, compute_plan, execution
from mnist_dp.orchestration.contract import CONTRACT
from mnist_dp.orchestration.execution import LOG_TAIL_LINES, POLLING_VARIABLE
from mnist_dp.privacy import data_ledger, model_file
from mnist_dp.utils.errors import UserError

SCRIPTS = REPO / "scripts"
CLIENT = "node1"
TOKEN = "tok-node1-5f0c1a9e3b7d"  # distinctive, so that finding it in any output means it leaked
FRAMEWORK = "torch"
# The algo's hyperparameters for these plans: one full-batch step per fold at a large σ, because the
# report accounts ε a dozen times and PLD takes about a second per ε at σ = 1 with q = 1/3.
HYPERPARAMETERS = {**TINY_HYPERPARAMETERS, "batch_size": 150, "noise_multiplier": 4.0}
FAILURE_LOG = "\n".join([f"epoch {i}: loading batch" for i in range(20)]
                        + ["", "error: batch_size = 1000 is larger than the 150 training examples",
                           ""])


@pytest.fixture
def node():
    with SubstraNodeStub(token=TOKEN) as stub:
        yield stub


def environment(node, **settings) -> dict:
    """This process's environment without any Substra setting, plus the node's URL and `settings`
    (default: its token)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SUBSTRA_")}
    env[f"SUBSTRA_{CLIENT.upper()}_URL"] = node.url
    for name, value in (settings or {"token": TOKEN}).items():
        env[f"SUBSTRA_{CLIENT.upper()}_{name.upper()}"] = value
    return env


def run(script, *args, cwd, env, polling=None):
    if polling is not None:  # a node's plan is polled every 5 s by default
        env = {**env, POLLING_VARIABLE: str(polling)}
    return subprocess.run([sys.executable, SCRIPTS / script, *map(str, args), "--backend", "remote",
                           "--client-name", CLIENT], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def add_dataset_objective(node, tmp_path, data_dir, **settings):
    return run("add_dataset_objective.py", "--data", data_dir, "--folds", 2, "--keys-file",
               tmp_path / "keys.json", cwd=tmp_path, env=environment(node, **settings))


def add_train_algo(node, tmp_path, *args):
    (tmp_path / "hp.json").write_text(json.dumps(HYPERPARAMETERS))
    return run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, "--hyperparameters",
               tmp_path / "hp.json", "--keys-file", tmp_path / "keys.json", "--output",
               tmp_path / "results", *args, cwd=tmp_path, env=environment(node), polling=0.01)


@pytest.fixture
def registered(node, tmp_path, tiny_data):
    """The keys file of a successful add_dataset_objective run (2 folds) against the node."""
    proc = add_dataset_objective(node, tmp_path, tiny_data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "keys.json"


def error_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def zip_members(archive: bytes) -> dict:
    """{name: bytes} of a data sample as the SDK uploads it (the folder, zipped)."""
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return {name: z.read(name) for name in z.namelist()}


def tar_gz_members(archive: bytes) -> dict:
    """{name: bytes} of a function archive, which must be a tar.gz."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def folder_files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def contract(function: str) -> tuple:
    """A function's inputs and outputs as the SDK sends them: {identifier: {kind, optional,
    multiple}}."""
    inputs, outputs = CONTRACT[function]
    return ({i.identifier: {"kind": i.kind.value, "optional": i.optional, "multiple": i.multiple}
             for i in inputs},
            {o.identifier: {"kind": o.kind.value, "multiple": o.multiple} for o in outputs})


# -- the node's train tasks
# ---------------------------------------------------------------------------


class NoLearning(StepsThatLearnNothing):
    """A interface.Framework that learns nothing and needs no ML library."""

    name = FRAMEWORK

    def new_model(self, seed, network):
        return b"untrained weights"

    def load_model(self, weights, network):
        return weights

    def dump_model(self, model):
        return model

    def batch_logits(self, model, inputs):
        return np.zeros((len(inputs), 10))

    def weight_arrays(self, model):
        return [np.frombuffer(model, np.uint8).astype(np.float64)]

    def set_weight_arrays(self, model, arrays):
        return arrays[0].astype(np.uint8).tobytes()


def write_model_file(dest: Path, opener: Path, data_folders: list, hyperparameters: Path,
                     input_model: Path | None = None, input_ledgers: list = ()) -> float:
    """Write a model file as a torch train task does (a tune task when the function holds a search
    file) and return the ε it outputs. The one place that knows how a model file is made: the real
    training skeleton (skeleton.train, or search.tune: ledger, hyperparameters, ε) and dataset
    opener around NoLearning, so a change of the file's format made there reaches these tests
    unchanged."""
    opener_module = load_asset_module(opener, f"stub_node_opener_{uuid.uuid4().hex}")
    inputs = {"datasamples": opener_module.MnistOpener().get_data([str(f) for f in data_folders])}
    if input_model:
        inputs["model"] = str(input_model)
    if input_ledgers:
        inputs["ledger"] = [str(path) for path in input_ledgers]
    outputs = {"model": str(dest), "epsilon": str(dest.with_name(dest.name + ".epsilon")),
               "ledger": str(dest.with_name(dest.name + ".ledger"))}
    if hyperparameters.with_name(search_space.FILE_NAME).is_file():
        search.tune(NoLearning(), inputs, outputs, hyperparameters)
    else:
        skeleton.train(NoLearning(), inputs, outputs, hyperparameters)
    return json.loads(Path(outputs["epsilon"]).read_text())["all"]


def accuracy(round_idx: int, split: str) -> float:
    """The accuracy the node reports for a score task: different for every round and split."""
    return 0.5 + 0.1 * round_idx + (0.05 if split == "train" else 0.0)


def train_on_node(node: SubstraNodeStub, work: Path, read_only=None) -> dict:
    """Make the node's train tasks write real model files from what the node holds: the function
    archive (its hyperparameters.json), the opener, the data samples the task names and its input
    models and ledgers. With `read_only` (the tmpfs fixture), each task's data samples are mounted
    read-only, as on a node, and a task the real function refuses fails with its error line as its
    log. Returns {train task key: the ε it output}, filled as the node runs them."""
    epsilons = {}

    def model_file_of(task, identifier):
        folder = work / task["key"]
        if identifier not in ("model", "ledger"):
            return f"{identifier} of task {task['key']}".encode()
        # the task's work makes both (asked for in identifier order)
        if not (folder / "model.ledger").exists() and not (folder / "model").exists():
            run_task(task, folder)
        return (folder / ("model" if identifier == "model" else "model.ledger")).read_bytes()

    def refuses(task):
        if "ledger" not in task["function"]["outputs"]:  # predict, score, aggregate: not run here
            return False
        try:
            run_task(task, work / task["key"])
        except UserError as exc:
            node.failure_log = f"error: {exc}\n"
            return True
        return False

    def run_task(task, folder):
        function_dir = folder / "function"
        with tarfile.open(
                fileobj=io.BytesIO(node.functions[task["function"]["key"]].files["file"])) as tar:
            tar.extractall(function_dir, filter="data")
        samples, input_models, input_ledgers = [], [], []
        data = (read_only("size=16m") if read_only else folder) / "data"
        for ref in task["inputs"]:
            if ref["identifier"] == "opener":
                opener = folder / "opener.py"
                opener.write_bytes(node.datasets[ref["asset_key"]].files["data_opener"])
            elif ref["identifier"] == "datasamples":
                samples.append(data / ref["asset_key"])
                with zipfile.ZipFile(
                        io.BytesIO(node.data_samples[ref["asset_key"]].files["archive"])) as z:
                    z.extractall(samples[-1])
            else:
                parent = node.tasks[ref["parent_task_key"]].state["outputs"]
                # "model", or "models" to aggregate
                output = "ledger" if ref["identifier"] == "ledger" else "model"
                asset_key = next(o["asset"]["key"] for o in parent if o["identifier"] == output)
                if ref["identifier"] == "ledger":
                    input_ledgers.append(folder / f"input-{len(input_ledgers)}.ledger")
                    input_ledgers[-1].write_bytes(node.models[asset_key].files["file"])
                    continue
                input_models.append(folder / f"input-{len(input_models)}.model")
                input_models[-1].write_bytes(node.models[asset_key].files["file"])
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(data.parent)], check=True)
        if set(task["function"]["outputs"]) == {"ledger"}:
            opener_module = load_asset_module(opener, f"stub_node_opener_{uuid.uuid4().hex}")
            skeleton.genesis({"datasamples": opener_module.MnistOpener().get_data(
                [str(f) for f in samples])}, {"ledger": str(folder / "model.ledger")})
        elif samples:
            epsilons[task["key"]] = write_model_file(folder / "model", opener, samples,
                                                     function_dir / "hyperparameters.json",
                                                     input_models[0] if input_models else None,
                                                     input_ledgers)
        else:  # an aggregate task: the real averaging
            skeleton.aggregate(NoLearning(), {"models": [str(m) for m in input_models]},
                               {"model": str(folder / "model")},
                               function_dir / "hyperparameters.json")

    def performance(task, identifier):
        if identifier == "epsilon":
            return epsilons[task["key"]]
        return accuracy(int(task["metadata"]["round_idx"]), task["metadata"]["split"])

    node.model_file, node.performance = model_file_of, performance
    if read_only:
        node.fail_when = refuses
    return epsilons


# -- the stub itself
# ----------------------------------------------------------------------------------


def test_the_stub_refuses_a_wrong_token_and_records_paths_it_does_not_know(node):
    assert requests.get(f"{node.url}/info/",
                        headers={"Authorization": "Token wrong"}).status_code == 401
    assert requests.get(f"{node.url}/info/").status_code == 401
    answer = requests.get(f"{node.url}/no_such_route/", headers={"Authorization": f"Token {TOKEN}"})
    assert answer.status_code == 404 and answer.json() == {"detail": "Not found."}
    assert node.unexpected == [("GET", "/no_such_route/")]


def test_the_stub_takes_data_samples_uploaded_or_as_paths_on_the_node(node, tiny_data):
    import substra

    client = substra.Client(url=node.url, token=TOKEN, backend_type="remote")
    dataset = client.add_dataset({"name": "d", "data_opener": DATASET_ASSET / "opener.py",
                                  "description": DATASET_ASSET / "description.md",
                                  "permissions": {"public": False, "authorized_ids": []},
                                  "logs_permission": {"public": False, "authorized_ids": []}})
    folder = sample_folders(tiny_data, "test")[0]
    uploaded = client.add_data_sample({"path": folder, "data_manager_keys": [dataset]})
    on_node = client.add_data_sample({"path": folder, "data_manager_keys": [dataset]}, local=False)
    assert zip_members(node.data_samples[uploaded].files["archive"]) == folder_files(folder)
    assert node.data_samples[on_node].files["path"] == str(folder).encode()
    assert client.get_dataset(dataset).data_sample_keys == [uploaded, on_node]
    assert client.list_task(
        filters={"compute_plan_key": [str(uuid.uuid4())]}) == [] and node.unexpected == []


# -- add_dataset_objective.py
# -------------------------------------------------------------------------


def test_add_dataset_objective_uploads_each_asset_and_keeps_the_keys_the_node_gave(
        node, registered, tiny_data):
    keys = json.loads(registered.read_text())
    org = node.organization_id
    assert keys["organization_id"] == org
    assert list(node.datasets) == [keys["dataset_key"]]
    dataset = node.datasets[keys["dataset_key"]]
    assert dataset.files["data_opener"] == (DATASET_ASSET / "opener.py").read_bytes()
    assert dataset.files["description"] == (DATASET_ASSET / "description.md").read_bytes()
    assert dataset.sent["permissions"] == dataset.sent["logs_permission"] == {
        "public": False, "authorized_ids": [org]}

    # One uploaded archive per data sample folder, linked to the dataset, keys in fold order.
    folds, test_keys = keys["train_data_sample_keys"], keys["test_data_sample_keys"]
    folders = [[folder] for folder in sample_folders(tiny_data, "train")]
    folders.append(sample_folders(tiny_data, "test"))
    assert [len(fold) for fold in folds] == [1, 1] and len(test_keys) == 1
    assert set(node.data_samples) == {*folds[0], *folds[1], *test_keys}
    for sample_keys, fold_folders in zip(folds + [test_keys], folders):
        for key, folder in zip(sample_keys, fold_folders):
            assert zip_members(node.data_samples[key].files["archive"]) == folder_files(folder)
            assert node.data_samples[key].sent["data_manager_keys"] == [keys["dataset_key"]]

    # The objective: a public function whose archive is built to run on a
    # node (its Dockerfile inside).
    assert list(node.functions) == [keys["objective_key"]]
    objective = node.functions[keys["objective_key"]]
    files = tar_gz_members(objective.files["file"])
    assert files["Dockerfile"] == archive.function_dockerfile(OBJECTIVE_ASSET, "score")
    assert files["metrics.py"] == (OBJECTIVE_ASSET / "metrics.py").read_bytes()
    assert objective.files["description"] == (OBJECTIVE_ASSET / "description.md").read_bytes()
    assert objective.sent["name"] == "accuracy"
    assert objective.sent["permissions"] == {"public": True, "authorized_ids": []}
    assert (objective.sent["inputs"], objective.sent["outputs"]) == contract("score")
    assert node.unexpected == []
    assert TOKEN not in registered.read_text()


def test_add_dataset_objective_run_again_reuses_every_key_and_registers_nothing(
        node, registered, tmp_path, tiny_data):
    before, posts = registered.read_text(), node.calls("POST")
    proc = add_dataset_objective(node, tmp_path, tiny_data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert registered.read_text() == before and node.calls("POST") == posts
    keys = json.loads(before)
    asked = set(node.calls("GET"))
    assert ("GET", f"/data_manager/{keys['dataset_key']}/") in asked
    assert ("GET", f"/function/{keys['objective_key']}/") in asked
    for key in [*keys["train_data_sample_keys"][0], *keys["train_data_sample_keys"][1],
                *keys["test_data_sample_keys"]]:
        assert ("GET", f"/data_sample/{key}/") in asked
    assert keys["dataset_key"] in proc.stdout and node.unexpected == []


def test_a_data_sample_the_node_no_longer_knows_is_registered_again(
        node, registered, tmp_path, tiny_data):
    keys = json.loads(registered.read_text())
    lost = keys["test_data_sample_keys"][0]
    del node.data_samples[lost]
    posts = len(node.calls("POST"))
    proc = add_dataset_objective(node, tmp_path, tiny_data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert node.calls("POST")[posts:] == [("POST", "/data_sample/")]
    again = json.loads(registered.read_text())
    assert again["test_data_sample_keys"] == [key for key in node.data_samples
                                              if key not in keys["fingerprints"]]
    assert {k: v for k, v in again.items()
            if k not in ("test_data_sample_keys", "fingerprints")} == \
        {k: v for k, v in keys.items() if k not in ("test_data_sample_keys", "fingerprints")}


# -- add_train_algo_cnn_dp.py
# -------------------------------------------------------------------------


def test_a_plan_run_on_the_node_reports_accuracy_and_epsilon_from_the_models_it_downloads(
        node, registered, tmp_path, tiny_data):
    epsilons = train_on_node(node, tmp_path / "node")
    node.doing_polls = 2
    # the training data's scores too (not by default)
    proc = add_train_algo(node, tmp_path, "--score-train")
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = json.loads(registered.read_text())
    org, dataset, folds = keys["organization_id"], keys["dataset_key"], keys[
        "train_data_sample_keys"]

    # The algo's functions: its code, its Dockerfile per function, the tuned hyperparameters inside.
    algo = keys["algos"][FRAMEWORK]
    for function in ("train", "predict"):
        registered_function = node.functions[algo[function]]
        files = tar_gz_members(registered_function.files["file"])
        assert files["Dockerfile"] == archive.function_dockerfile(ALGO_ASSETS[FRAMEWORK], function)
        assert files["algo.py"] == (ALGO_ASSETS[FRAMEWORK] / "algo.py").read_bytes()
        assert (
            json.loads(files["hyperparameters.json"]) == tiny_hyperparameters(
                FRAMEWORK, **HYPERPARAMETERS))
        assert "mnist_dp/learning/skeleton.py" in files
        assert registered_function.sent["name"] == f"{FRAMEWORK} {function}"
        assert (registered_function.sent["inputs"],
                registered_function.sent["outputs"]) == contract(function)

    # The plan: train through the folds in order, predict and score after each on its
    # fold and on the test set.
    plan_key = keys["compute_plans"][FRAMEWORK]["key"]
    described = keys["compute_plans"][FRAMEWORK]["tasks"]
    tasks = {t.record["key"]: t.record for t in node.plan_tasks(plan_key)}
    assert (list(node.compute_plans) == [plan_key] and set(tasks) == set(described)
            and len(tasks) == 2 * 5 + 1)  # and the genesis of the organisation's ledger chain
    by_role = {description: key for key, description in described.items()}
    private, public = {"public": False, "authorized_ids": [org]}, {"public": True,
                       "authorized_ids": []}

    def data_inputs(task):
        return [(i["identifier"], i["asset_key"]) for i in task["inputs"] if i["asset_key"]]

    def on(samples):
        return [("opener", dataset)] + [("datasamples", key) for key in samples]

    def parent(task, identifier):
        return [i["parent_task_key"] for i in task["inputs"] if i["identifier"] == identifier]

    def permissions(task, output):  # as the client asked for them
        return node.tasks[task["key"]].sent["outputs"][output]["permissions"]

    genesis = tasks[by_role[f"{FRAMEWORK} genesis, round 1 at {org}"]]
    assert genesis["function"]["key"] == algo["genesis"] and data_inputs(genesis) == on(folds[0])
    assert permissions(genesis, "ledger") == private
    for round_idx, fold in enumerate(folds, start=1):
        train = tasks[by_role[f"{FRAMEWORK} train, round {round_idx} at {org}"]]
        assert train["function"]["key"] == algo["train"] and train["worker"] == org
        assert data_inputs(train) == on(fold)
        assert parent(train, "model") == ([by_role[f"{FRAMEWORK} train, round 1 at {org}"]]
                                          if round_idx == 2 else [])
        # the data's own ledger, from task to task, from the genesis on
        assert parent(train, "ledger") == (parent(train, "model") or [genesis["key"]])
        assert permissions(train, "model") == private and permissions(train, "epsilon") == public
        assert permissions(train, "ledger") == private
        for split, samples in (("train", fold), ("test", keys["test_data_sample_keys"])):
            score = tasks[by_role[f"{FRAMEWORK} score, round {round_idx} at {org} on {split}"]]
            predict = tasks[parent(score, "predictions")[0]]
            assert score["function"]["key"] == keys[
                "objective_key"] and predict["function"]["key"] == algo["predict"]
            assert data_inputs(score) == data_inputs(predict) == on(samples)
            assert parent(predict,
                          "model") == [train["key"]] and score["worker"] == predict["worker"] == org
            assert permissions(
                predict, "predictions") == private and permissions(score, "performance") == public

    # The report: figures recomputed from the model files downloaded from the
    # node, beside its performances.
    records = json.loads((tmp_path / "results" / "results.json").read_text())
    assert [r["round"] for r in records] == [1, 2]
    train_folders = sample_folders(tiny_data, "train")
    for record in records:
        train_key = by_role[f"{FRAMEWORK} train, round {record['round']} at {org}"]
        served = next(o["asset"]["key"] for o in node.tasks[train_key].state["outputs"]
                      if o["identifier"] == "model")
        assert Path(record["model_file"]).read_bytes() == node.models[served].files["file"]
        saved = model_file.load(record["model_file"], FRAMEWORK)
        # Each round continued from the one before, on its own fold: the
        # tasks got the right samples.
        assert [event.data for event in saved.ledger.events] == \
            [(sample_identity(folder),) for folder in train_folders[:record["round"]]]
        assert record["epsilon"] == pytest.approx(saved.ledger.epsilon(HYPERPARAMETERS["delta"]))
        assert record["epsilon_in_substra"] == pytest.approx(epsilons[train_key])
        assert record["epsilon"] == pytest.approx(epsilons[train_key])
        for split in ("train", "test"):
            assert record[f"{split}_accuracy"] == pytest.approx(accuracy(record["round"], split))
    assert "  ε  " in proc.stdout and "keys added to" in proc.stdout
    assert all(f"{record['epsilon']:.3f}" in proc.stdout for record in records)
    # before the plan the node held nothing; before the report, this plan's genesis and two runs
    assert "reconciled with the node: 0 ledger outputs" in proc.stdout
    assert "reconciled with the node: 3 ledger outputs of tasks on this organisation's data, 2 " \
           "runs" in proc.stdout
    assert ("GET", f"/compute_plan/{plan_key}/perf/") in node.calls() and node.unexpected == []
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".json", ".md")]
    assert TOKEN not in proc.stdout + proc.stderr and not any(
        TOKEN in p.read_text() for p in written)


def test_a_search_on_the_node_is_one_tune_task_on_every_fold_with_the_search_file_inside(
        node, registered, tmp_path):
    epsilons = train_on_node(node, tmp_path / "node")
    searched = {"space": {"learning_rate": [0.1, 0.2]}, "mean_candidates": 2, "shape": 1,
                "validation_fraction": 0.2}
    (tmp_path / "search.json").write_text(json.dumps(searched))
    (tmp_path / "hp.json").write_text(json.dumps({**HYPERPARAMETERS, "noise_multiplier": None,
                                                  "target_epsilon": 3.0}))
    proc = run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, "--hyperparameters",
               tmp_path / "hp.json", "--keys-file", registered, "--output", tmp_path / "results",
               "--search", tmp_path / "search.json", cwd=tmp_path, env=environment(node),
               polling=0.01)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = json.loads(registered.read_text())
    algo = keys["algos"][FRAMEWORK]
    assert set(algo) == {"tune", "predict", "genesis"}
    files = tar_gz_members(node.functions[algo["tune"]].files["file"])
    assert json.loads(files[search_space.FILE_NAME]) == search_space.parse(searched, "x").to_json()
    assert files["Dockerfile"] == archive.function_dockerfile(ALGO_ASSETS[FRAMEWORK], "tune")
    assert (node.functions[algo["tune"]].sent["inputs"],
            node.functions[algo["tune"]].sent["outputs"]) == \
        contract("tune")
    tasks = [t.record for t in node.plan_tasks(keys["compute_plans"][FRAMEWORK]["key"])]
    tuned = [t for t in tasks if t["function"]["key"] == algo["tune"]]
    assert len(tasks) == 4 and len(tuned) == 1  # genesis, tune, predict, score
    # every fold, in one search
    assert sorted(i["asset_key"] for i in tuned[0]["inputs"]
                  if i["identifier"] == "datasamples") == \
        sorted(k for fold in keys["train_data_sample_keys"] for k in fold)
    record, = json.loads((tmp_path / "results" / "results.json").read_text())
    saved = model_file.load(record["model_file"], FRAMEWORK)
    (event,) = saved.ledger.events
    assert event.search is not None and event.search.mean == 2 and len(event.data) == 2
    assert (record["epsilon"] == pytest.approx(epsilons[tuned[0]["key"]])
            and 2.5 < record["epsilon"] <= 3.0)


def test_federated_averaging_on_the_node_averages_each_round_and_accounts_each_fold_once(
        node, registered, tmp_path, tiny_data):
    epsilons = train_on_node(node, tmp_path / "node")
    proc = add_train_algo(node, tmp_path, "--strategy", "fedavg", "--rounds", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = json.loads(registered.read_text())
    org, folds, algo = keys["organization_id"], keys[
        "train_data_sample_keys"], keys["algos"][FRAMEWORK]
    aggregate = node.functions[algo["aggregate"]]
    assert tar_gz_members(aggregate.files["file"])["Dockerfile"] == \
        archive.function_dockerfile(ALGO_ASSETS[FRAMEWORK], "aggregate")
    assert (aggregate.sent["inputs"], aggregate.sent["outputs"]) == contract("aggregate")

    described = keys["compute_plans"][FRAMEWORK]["tasks"]
    tasks = {t.record["key"]: t.record
             for t in node.plan_tasks(keys["compute_plans"][FRAMEWORK]["key"])}
    # per round: a train task per fold, the aggregate, predict and score; and the genesis
    assert len(tasks) == 2 * 5 + 1
    averages = [key for key, text in described.items() if text.startswith(f"{FRAMEWORK} aggregate")]
    assert [described[key]
            for key in averages] == [f"{FRAMEWORK} aggregate, round {r} at {org}" for r in (1, 2)]
    for round_idx, average in enumerate(averages, 1):
        trained = [i["parent_task_key"] for i in tasks[average]["inputs"]
                   if i["identifier"] == "models"]
        assert [[i["asset_key"] for i in tasks[t]["inputs"] if i["identifier"] == "datasamples"]
                for t in trained] == folds
        starts = {i["parent_task_key"] for t in trained for i in tasks[t]["inputs"]
                  if i["identifier"] == "model"}
        assert starts == (set() if round_idx == 1 else {averages[0]})

    records = json.loads((tmp_path / "results" / "results.json").read_text())
    assert [(r["round"], r["organization"]) for r in records] == [(1, "fedavg"), (2, "fedavg")]
    for record in records:
        saved = model_file.load(record["model_file"], FRAMEWORK)
        # every fold's run of every round, once: 2 per round (the global model's
        # runs are not counted twice)
        assert len(saved.ledger.events) == 2 * record["round"]
        assert len({e.run_id for e in saved.ledger.events}) == len(saved.ledger.events)
        one_fold = [e for e in saved.ledger.events if e.data == saved.ledger.events[0].data]
        assert len(one_fold) == record["round"]
        assert record["epsilon"] == pytest.approx(
            saved.ledger.epsilon(HYPERPARAMETERS["delta"], data=one_fold[0].data))
        assert record["test_accuracy"] == pytest.approx(accuracy(record["round"], "test"))
    # The aggregate published no ε; each train task did, from its own model's ledger.
    assert len(epsilons) == 4 and node.unexpected == []
    assert "Federated averaging: this model is the average of 2 models" in \
        (tmp_path / "results" / "summary.md").read_text()


def test_a_node_that_refuses_model_downloads_still_gets_its_report_from_substras_figures(
        node, registered, tmp_path):
    train_on_node(node, tmp_path / "node")
    node.refuse("GET", "/model/[^/]+/file/", 403,
                {"detail": "model export is disabled on this node"}, times=2)
    proc = add_train_algo(node, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("model files not downloaded: torch-round1-" in proc.stdout
            and "(AuthorizationError 403)" in proc.stdout)
    assert json.loads((tmp_path / "results" / "results.json").read_text()) == []
    summary = (tmp_path / "results" / "summary.md").read_text()
    assert ("their accuracy and ε (as the train task computed it) are in Substra's performances "
            "below" in summary)
    # Substra's own figures, per round
    assert "| torch | 1 |" in summary and "| torch | 2 |" in summary


def test_a_task_failed_on_the_node_exits_2_naming_it_and_ending_with_the_log_the_node_serves(
        node, registered, tmp_path):
    train_on_node(node, tmp_path / "node")  # the genesis is done, as on a node
    node.fail_when = lambda task: task["function"]["name"] == f"{FRAMEWORK} train"
    node.failure_log = FAILURE_LOG
    node.doing_polls = 1
    proc = add_train_algo(node, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    keys = json.loads(registered.read_text())
    org, plan_key = keys["organization_id"], keys["compute_plans"][FRAMEWORK]["key"]
    failed = node.compute_plans[plan_key].record["failed_task_key"]
    assert keys[
        "compute_plans"][FRAMEWORK]["tasks"][failed] == f"{FRAMEWORK} train, round 1 at {org}"
    (line,) = error_lines(proc.stderr)
    assert line == (f"error: compute plan 'mnist-dp {FRAMEWORK}' failed in task '{FRAMEWORK} "
                    f"train, round 1 at {org}' ({failed}), function '{FRAMEWORK} train': plan "
                    "status PLAN_STATUS_FAILED")
    tail = proc.stderr.split("last lines of its log:\n", 1)[1].splitlines()
    expected = [f"  | {text}" for text in FAILURE_LOG.splitlines()
                if text.strip()][-LOG_TAIL_LINES:]
    assert tail == expected
    assert ("GET", f"/task/{failed}/logs/") in node.calls() and node.unexpected == []
    assert json.loads((tmp_path / "results" / "results.json").read_text()) == []
    assert "The plan failed" in (tmp_path / "results" / "summary.md").read_text()
    assert TOKEN not in proc.stdout + proc.stderr


# -- refusals and secrets
# ---------------------------------------------------------------------------


def test_a_wrong_token_ends_in_one_error_line_with_exit_2_and_registers_nothing(
        node, tmp_path, tiny_data):
    wrong = "tok-wrong-8d2e6b40"
    proc = add_dataset_objective(node, tmp_path, tiny_data, token=wrong)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "AuthenticationError" in line and "401" in line and node.url in line
    assert wrong not in proc.stdout + proc.stderr
    assert node.calls() == [("GET", "/info/")] and not (tmp_path / "keys.json").exists()


def test_a_refusal_by_the_node_prints_nothing_but_the_error_line(node, tmp_path, tiny_data):
    proc = add_dataset_objective(node, tmp_path, tiny_data, token="tok-wrong-8d2e6b40")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == error_lines(proc.stderr), proc.stderr


def test_the_token_never_appears_even_when_the_node_echoes_it_in_an_error(
        node, tmp_path, tiny_data):
    node.refuse("POST", "/data_sample/", 400,
                {"detail": f"refused: request with Authorization: Token {TOKEN}"})
    proc = add_dataset_objective(node, tmp_path, tiny_data)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert line.startswith("error: Substra refused: InvalidRequest") and "***" in line
    assert TOKEN not in proc.stdout + proc.stderr


def test_an_error_echoing_the_token_is_masked_in_the_error_line_and_keeps_the_keys_obtained(
        node, tmp_path, tiny_data):
    node.refuse("POST", "/data_sample/", 400,
                {"detail": f"refused: request with Authorization: Token {TOKEN}"})
    proc = add_dataset_objective(node, tmp_path, tiny_data)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = error_lines(proc.stderr)
    assert (line == "error: Substra refused: InvalidRequest: refused: request with Authorization: "
                    "Token ***")
    # The dataset registered before the refusal is in the keys file: the next run reuses it.
    assert list(node.datasets) == list(
        json.loads((tmp_path / "keys.json").read_text())["fingerprints"])
    assert TOKEN not in (tmp_path / "keys.json").read_text()
    proc = add_dataset_objective(node, tmp_path, tiny_data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(node.datasets) == 1 and node.calls("POST").count(("POST", "/data_manager/")) == 1


def test_a_username_and_password_log_in_and_the_password_never_appears(tmp_path, tiny_data):
    password = "pw-alice-2b9f77c1"
    with SubstraNodeStub(token=TOKEN, users={"alice": password}) as node:
        proc = add_dataset_objective(node, tmp_path, tiny_data, username="alice", password=password)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert node.calls()[0] == ("POST", "/api-token-auth/") and node.unexpected == []
        # The session the login opened is closed when the script ends
        # (substra's client does it on exit).
        assert node.calls()[-1] == ("DELETE", "/active-api-tokens/") and node.sessions == {}
        assert password not in proc.stdout + proc.stderr
        proc = add_dataset_objective(node, tmp_path, tiny_data, username="alice",
                                     password="wrong-" + password)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert password not in proc.stdout + proc.stderr


def test_the_next_plan_on_the_node_goes_on_from_the_ledger_the_last_one_left(
        node, registered, tmp_path, tiny_data):
    train_on_node(node, tmp_path / "node")
    assert add_train_algo(node, tmp_path).returncode == 0
    first = json.loads(registered.read_text())["compute_plans"][FRAMEWORK]["tasks"]
    first_last = next(key for key, role in first.items() if " train, round 2 " in role)
    proc = add_train_algo(node, tmp_path, "--output", tmp_path / "again")
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = json.loads(registered.read_text())
    plan = keys["compute_plans"][FRAMEWORK]
    trains = [key for key, role in plan["tasks"].items() if " train, " in role]
    ledgers = [[i["parent_task_key"] for i in node.tasks[t].record["inputs"]
                if i["identifier"] == "ledger"]
               for t in trains]
    # no genesis again: the reconciliation found the chain's one tip, the first plan's last task
    assert not any(" genesis, " in role for role in plan["tasks"].values())
    assert ledgers == [[first_last], [trains[0]]]
    assert "reconciled with the node: 3 ledger outputs of tasks on this organisation's data, 2 " \
           "runs, 0 newly recorded" in proc.stdout
    # the ledger the second plan leaves holds the first plan's two runs on the
    # organisation's data and its own two
    served = next(o["asset"]["key"] for o in node.tasks[trains[-1]].state["outputs"]
                  if o["identifier"] == "ledger")
    (tmp_path / "served.ledger").write_bytes(node.models[served].files["file"])
    assert len(data_ledger.read_output(tmp_path / "served.ledger",
                                       seal_keys(sample_folders(tiny_data, "train"))).events) == 4


@pytest.mark.parametrize("strategy", ["cyclic", "fedavg"])
def test_a_plan_built_by_another_client_without_the_ledger_is_refused_and_reconciliation_counts_all(
        node, registered, tmp_path, tiny_data, tmpfs, monkeypatch, strategy):
    """On read-only data samples, as on a node: a plan another client builds without the
    organisation's ledger is refused by its first train task; one fed a valid but earlier ledger
    (the genesis again) trains, its budget check missing the runs it was not given, and the
    organisation's reconciliation finds every run, so its next plan is stopped by the budget."""
    train_on_node(node, tmp_path / "node", read_only=tmpfs)
    proc = add_train_algo(node, tmp_path, "--strategy", strategy)  # the organisation's: two runs
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = json.loads(registered.read_text())
    org, dataset, folds = keys["organization_id"], keys["dataset_key"], keys[
        "train_data_sample_keys"]
    # the other client's plans have no genesis task of their own
    functions = {**keys["algos"][FRAMEWORK], "score": keys["objective_key"], "genesis": None}
    genesis = next(k for k, role in keys["compute_plans"][FRAMEWORK]["tasks"].items()
                   if " genesis, " in role)
    shares = [compute_plan.Share(org, dataset, tuple(fold)) for fold in folds]
    test = compute_plan.Share(org, dataset, tuple(keys["test_data_sample_keys"]))
    monkeypatch.setenv(POLLING_VARIABLE, "0.01")
    other = substra.Client(url=node.url, token=TOKEN, backend_type="remote")

    def plan_of_another_client(ledgers):
        builder = compute_plan.PlanBuilder(ledgers=ledgers)
        if strategy == "cyclic":
            builder.chain(FRAMEWORK, functions, [(1, shares[0])], test)
        else:
            builder.fedavg(FRAMEWORK, functions, shares[:1], 1, test)
        try:
            execution.run_plan(other, builder, "another client's plan", compute_plan.new_key())
        except execution.PlanFailed:
            pass
        return builder.spending(org)[0]

    # without the organisation's ledger: refused, nothing trained
    refused = plan_of_another_client({})
    assert node.tasks[refused].state["status"] == "STATUS_FAILED"
    assert "the data samples are read-only here and this task has no 'ledger' input" in \
        node.tasks[refused].state["log"]
    # with the genesis again: it trains, seeing none of the organisation's two runs
    earlier = plan_of_another_client({org: [genesis]})
    assert node.tasks[earlier].state["status"] == "STATUS_DONE"

    proc = subprocess.run([sys.executable, SCRIPTS / "privacy_report.py", "--reconcile",
                           registered, "--client-name", CLIENT, "--delta",
                           str(HYPERPARAMETERS["delta"])], capture_output=True, text=True,
                          cwd=tmp_path, env=environment(node), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("reconciled with the node: 4 ledger outputs of tasks on this organisation's data, 3 "
            "runs, 1 newly recorded in the data folder; 1 ledger output was extended twice"
            in proc.stdout)
    folders = sample_folders(tiny_data, "train")
    spent = data_ledger.read(folders)
    assert len(spent.events) == 3
    first_fold = [e for e in spent.events if e.data == (sample_identity(folders[0]),)]
    assert len(first_fold) == 2  # the organisation's round 1 and the other client's run
    both = independent_epsilon(first_fold[0].noise_multiplier, first_fold[0].sample_rate,
                               sum(e.steps for e in first_fold), HYPERPARAMETERS["delta"])
    assert spent.epsilon(HYPERPARAMETERS["delta"], data=[sample_identity(folders[0])]) == \
        pytest.approx(both, rel=1e-6)
    # the worst example's: the first fold's, whose two runs compose
    assert f"3 runs released from it, ε = {both:.3f} at δ = {HYPERPARAMETERS['delta']:g}" in \
        proc.stdout

    # the organisation's next plan counts every run: a budget below them refuses it
    (tmp_path / "hp.json").write_text(json.dumps({**HYPERPARAMETERS, "max_epsilon": both * 0.99}))
    proc = run("add_train_algo_cnn_dp.py", "--framework", FRAMEWORK, "--hyperparameters",
               tmp_path / "hp.json", "--keys-file", registered, "--output", tmp_path / "again",
               cwd=tmp_path, env=environment(node), polling=0.01)
    assert_one_line_error(proc, "max_epsilon", "is spent")


@pytest.mark.parametrize("how", ["refused", "forged"])
def test_a_ledger_output_the_reconciliation_cannot_read_or_trust_stops_it_in_one_line(
        node, registered, tmp_path, how):
    """A task ran on the organisation's data, but the node will not hand its ledger output over,
    or the output's seal does not hold: the data's figure would miss runs, so nothing is
    reported."""
    train_on_node(node, tmp_path / "node")
    assert add_train_algo(node, tmp_path).returncode == 0
    train = next(t for t in node.tasks.values() if t.record["function"]["name"].endswith(" train"))
    ledger = next(o["asset"] for o in train.state["outputs"] if o["identifier"] == "ledger")
    if how == "refused":
        node.refuse("GET", rf"/model/{ledger['key']}/file/", 403,
                    {"detail": "You do not have permission to perform this action."})
    else:
        content = node.models[ledger["key"]].files["file"]
        node.models[ledger["key"]].files["file"] = content.replace(b'"steps": 1', b'"steps": 0')
    proc = subprocess.run([sys.executable, SCRIPTS / "privacy_report.py", "--reconcile",
                           registered, "--client-name", CLIENT], capture_output=True, text=True,
                          cwd=tmp_path, env=environment(node), timeout=120)
    assert_one_line_error(proc, f"task {train.record['key']}", *(
        ["the node refuses it its ledger output (403)"] if how == "refused"
        else ["its seal does not match its content"]))
    assert "reconciled" not in proc.stdout
