"""Registering the bundle's assets with a Substra client and running train -> predict -> score.

The function contract (identifiers, kinds, multiplicity) is written once here, in `CONTRACT`.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import substra
from substra.sdk.models import ComputeTaskStatus
from substra.sdk.schemas import (
    AssetKind,
    ComputePlanSpec,
    ComputePlanTaskSpec,
    ComputeTaskOutputSpec,
    DataSampleSpec,
    DatasetSpec,
    FunctionInputSpec,
    FunctionOutputSpec,
    FunctionSpec,
    InputRef,
    Permissions,
)

from mnist_dp import archive, data
from mnist_dp.errors import UserError

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO / "assets"
DATASET_ASSET = ASSETS / "dataset"
OBJECTIVE_ASSET = ASSETS / "objective"
# framework name -> algo asset folder. A new framework is one more line here.
ALGO_ASSETS = {
    "torch": ASSETS / "algo_torch_dp",
    "tf": ASSETS / "algo_tf_dp",
    "mindspore": ASSETS / "algo_mindspore_dp",
}



def load_asset_module(script: Path, name: str):
    """Import an asset's script (e.g. an algo.py) as module `name`, for tests and benchmarks.

    It is registered in sys.modules: MindSpore's graph compiler re-imports a jitted function's module by name.
    """
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_OPENER = FunctionInputSpec(identifier="opener", kind=AssetKind.data_manager, optional=False, multiple=False)
_SAMPLES = FunctionInputSpec(identifier="datasamples", kind=AssetKind.data_sample, optional=False, multiple=True)

# function -> (inputs, outputs); see DESIGN.md "Function contract".
CONTRACT = {
    "train": (
        [_OPENER, _SAMPLES,
         FunctionInputSpec(identifier="model", kind=AssetKind.model, optional=True, multiple=False)],
        [FunctionOutputSpec(identifier="model", kind=AssetKind.model, multiple=False),
         FunctionOutputSpec(identifier="epsilon", kind=AssetKind.performance, multiple=False)],
    ),
    "predict": (
        [_OPENER, _SAMPLES,
         FunctionInputSpec(identifier="model", kind=AssetKind.model, optional=False, multiple=False)],
        [FunctionOutputSpec(identifier="predictions", kind=AssetKind.model, multiple=False)],
    ),
    "score": (
        [_OPENER, _SAMPLES,
         FunctionInputSpec(identifier="predictions", kind=AssetKind.model, optional=False, multiple=False)],
        [FunctionOutputSpec(identifier="performance", kind=AssetKind.performance, multiple=False)],
    ),
}


def local_client(backend: str) -> substra.Client:
    """A local Substra client; with the docker backend, check first that a Docker daemon answers."""
    if backend == "docker":
        import docker

        try:
            docker.from_env().ping()
        except docker.errors.DockerException as exc:
            raise UserError(f"--backend docker: no Docker daemon answers ({exc}); "
                            "start Docker or use --backend subprocess") from None
    return substra.Client(backend_type=backend)


def public() -> Permissions:
    return Permissions(public=True, authorized_ids=[])


def owner_only(owner: str) -> Permissions:
    return Permissions(public=False, authorized_ids=[owner])


@dataclass
class DatasetKeys:
    owner: str
    dataset: str
    train_samples: list
    test_samples: list


def register_dataset(client: substra.Client, data_dir: Path, name: str = "MNIST") -> DatasetKeys:
    """Register the opener (dataset) and the train / test data samples written by generate_data."""
    owner = client.organization_info().organization_id
    dataset = client.add_dataset(DatasetSpec(
        name=name,
        data_opener=DATASET_ASSET / "opener.py",
        description=DATASET_ASSET / "description.md",
        permissions=owner_only(owner),
        logs_permission=owner_only(owner),
    ))

    def add(split):
        paths = data.sample_folders(data_dir, split)
        return client.add_data_samples(DataSampleSpec(paths=paths, data_manager_keys=[dataset]))

    return DatasetKeys(owner, dataset, add("train"), add("test"))


def register_function(client: substra.Client, asset_dir: Path, function: str, name: str, build_dir: Path,
                      hyperparameters: dict | None = None) -> str:
    """Build the function's self-contained archive and register it. Returns the function key."""
    description = asset_dir / "description.md"
    if not description.is_file():
        raise UserError(f"{description}: missing; every asset needs a description.md")
    replace = None
    if hyperparameters is not None:
        replace = {"hyperparameters.json": (json.dumps(hyperparameters, indent=2) + "\n").encode()}
    archive_path = archive.build(asset_dir, function, Path(build_dir) / f"{name.replace(' ', '_')}.tar.gz", replace)
    inputs, outputs = CONTRACT[function]
    return client.add_function(FunctionSpec(
        name=name,
        description=description,
        file=archive_path,
        permissions=public(),
        inputs=inputs,
        outputs=outputs,
    ))


@dataclass
class PlanBuilder:
    """Accumulates compute plan tasks; remembers what each task is, for the report."""

    keys: DatasetKeys
    tasks: list = field(default_factory=list)
    roles: dict = field(default_factory=dict)  # task id -> {"run": ..., "step": ..., "split": ...}

    def _data(self, split: str) -> list:
        samples = self.keys.train_samples if split == "train" else self.keys.test_samples
        return [InputRef(identifier="opener", asset_key=self.keys.dataset)] + [
            InputRef(identifier="datasamples", asset_key=k) for k in samples
        ]

    def _add(self, function_key: str, inputs: list, outputs: dict, role: dict) -> str:
        task_id = str(uuid.uuid4())  # a remote node requires UUID task ids
        self.tasks.append(ComputePlanTaskSpec(
            task_id=task_id, function_key=function_key, worker=self.keys.owner, inputs=inputs,
            outputs={k: ComputeTaskOutputSpec(permissions=p) for k, p in outputs.items()},
            metadata={k: str(v) for k, v in role.items()},
        ))
        self.roles[task_id] = role
        return task_id

    def train(self, run: str, function_key: str, parent: str | None = None) -> str:
        inputs = self._data("train")
        if parent:
            inputs.append(InputRef(identifier="model", parent_task_key=parent, parent_task_output_identifier="model"))
        return self._add(function_key, inputs,
                         {"model": owner_only(self.keys.owner), "epsilon": public()}, {"run": run, "step": "train"})

    def evaluate(self, run: str, train_task: str, predict_key: str, score_key: str, split: str) -> str:
        """predict on `split` with the model of `train_task`, then score. Returns the score task id."""
        predict_id = self._add(
            predict_key,
            self._data(split) + [InputRef(identifier="model", parent_task_key=train_task,
                                          parent_task_output_identifier="model")],
            {"predictions": owner_only(self.keys.owner)}, {"run": run, "step": "predict", "split": split})
        return self._add(
            score_key,
            self._data(split) + [InputRef(identifier="predictions", parent_task_key=predict_id,
                                          parent_task_output_identifier="predictions")],
            {"performance": public()}, {"run": run, "step": "score", "split": split})

    def spec(self, name: str) -> ComputePlanSpec:
        return ComputePlanSpec(name=name, tasks=self.tasks)


def run_plan(client: substra.Client, builder: PlanBuilder, name: str):
    """Submit the plan (local backends run it to completion here) and return it."""
    from substra.sdk.backends.local.compute.spawner.base import BuildError, ExecutionError

    try:
        return client.add_compute_plan(builder.spec(name))
    except (substra.exceptions.SDKException, ExecutionError, BuildError) as exc:
        raise UserError(f"compute plan {name!r} failed in task {failed_task(client, builder)}: {exc} "
                        "(the task's own output is above)") from None


def failed_task(client: substra.Client, builder: PlanBuilder) -> str:
    """Name the task substra's local backend left 'executing' when its function failed."""
    for task_id, role in builder.roles.items():
        try:
            status = client.get_task(task_id).status
        except substra.exceptions.NotFound:  # never submitted: the plan stopped before it
            continue
        if status in (ComputeTaskStatus.executing, ComputeTaskStatus.failed):
            return f"'{' '.join(role.values())}' ({task_id})"
    return "(unknown)"


def collect_performances(client: substra.Client, plan_key: str, roles: dict) -> dict:
    """{(run, metric): value}: accuracy per split ('train_accuracy'/'test_accuracy') and ε."""
    perfs = client.get_performances(plan_key)
    found = {}
    for task_key, identifier, value in zip(perfs.task_key, perfs.identifier, perfs.performance):
        role = roles[task_key]
        metric = "epsilon" if identifier == "epsilon" else f"{role['split']}_accuracy"
        found[(role["run"], metric)] = value
    return found


def fetch_model(client: substra.Client, train_task: str, dest: Path) -> Path:
    """Copy the model file a train task produced to `dest` (kept with the run's results)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(client.download_model_from_task(train_task, "model", dest.parent))
    shutil.move(tmp, dest)
    return dest
