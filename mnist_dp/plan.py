"""The compute plan: train -> predict -> score, chained across organisations and rounds.

The function contract (identifiers, kinds, multiplicity) is written once here, in `CONTRACT`.
Outputs get the least privilege that lets the plan run: a model or predictions file is visible to
the organisation that made it and to the organisations whose tasks consume it (plus any named with
`share_with`); performances are public, as Substra requires.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import substra
from substra.sdk.models import ComputePlanStatus, ComputeTaskStatus
from substra.sdk.schemas import (
    AssetKind,
    ComputePlanSpec,
    ComputePlanTaskSpec,
    ComputeTaskOutputSpec,
    FunctionInputSpec,
    FunctionOutputSpec,
    InputRef,
    Permissions,
)

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


def public() -> Permissions:
    return Permissions(public=True, authorized_ids=[])


def owner_only(owner: str) -> Permissions:
    return Permissions(public=False, authorized_ids=[owner])


@dataclass(frozen=True)
class Share:
    """Data one organisation holds and trains or evaluates on: its dataset and data sample keys."""

    organization: str
    dataset: str
    samples: tuple


class PlanFailed(UserError):
    """A task failed: the message names it and ends with its log; the plan's finished work is kept."""


def id_list(text: str | None) -> tuple:
    """'a, b' -> ('a', 'b'): organisation ids or client names given on the command line."""
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


def describe_role(role: dict) -> str:
    """e.g. 'torch train, round 1 at MyOrg1MSP' or 'torch score, round 2 at MyOrg1MSP on test'."""
    text = f"{role['run']} {role['step']}, round {role['round_idx']} at {role['organization']}"
    return text + (f" on {role['split']}" if role.get("split") else "")


@dataclass
class PlanBuilder:
    """Accumulates compute plan tasks; remembers what each task is (its role) for the report."""

    share_with: tuple = ()  # organisations also allowed to read every model and predictions output
    tasks: list = field(default_factory=list)  # dicts, made into specs by `spec()`
    roles: dict = field(default_factory=dict)  # task id -> {"run", "step", "round_idx", "organization", ...}

    @staticmethod
    def _data(share: Share) -> list:
        return [InputRef(identifier="opener", asset_key=share.dataset)] + [
            InputRef(identifier="datasamples", asset_key=k) for k in share.samples]

    def _add(self, function_key: str, worker: str, inputs: list, outputs: list, role: dict) -> str:
        task_id = str(uuid.uuid4())  # a remote node requires UUID task ids
        self.tasks.append({"task_id": task_id, "function_key": function_key, "worker": worker,
                           "inputs": inputs, "outputs": outputs})
        self.roles[task_id] = role
        return task_id

    def train(self, run: str, function_key: str, share: Share, round_idx: int, parent: str | None = None) -> str:
        """Train at `share`'s organisation, continuing from the model of task `parent` if given."""
        inputs = self._data(share)
        if parent:
            inputs.append(InputRef(identifier="model", parent_task_key=parent, parent_task_output_identifier="model"))
        return self._add(function_key, share.organization, inputs, ["model", "epsilon"],
                         {"run": run, "step": "train", "round_idx": round_idx, "organization": share.organization})

    def evaluate(self, train_task: str, predict_key: str, score_key: str, share: Share, split: str) -> str:
        """Predict on `share` with the model of `train_task`, then score. Returns the score task id."""
        role = {**self.roles[train_task], "split": split, "train_task": train_task, "organization": share.organization}
        model = InputRef(identifier="model", parent_task_key=train_task, parent_task_output_identifier="model")
        predict_id = self._add(predict_key, share.organization, self._data(share) + [model], ["predictions"],
                               {**role, "step": "predict"})
        predictions = InputRef(identifier="predictions", parent_task_key=predict_id,
                               parent_task_output_identifier="predictions")
        return self._add(score_key, share.organization, self._data(share) + [predictions], ["performance"],
                         {**role, "step": "score"})

    def chain(self, run: str, train_key: str, predict_key: str, score_key: str, stages: list, test: Share) -> list:
        """Train through `stages` ((round, Share) pairs, in order), each task from the model before it;
        after every train task, predict and score on its own share ("train") and on `test`.
        Returns the train task ids."""
        trained, parent = [], None
        for round_idx, share in stages:
            parent = self.train(run, train_key, share, round_idx, parent)
            self.evaluate(parent, predict_key, score_key, share, "train")
            self.evaluate(parent, predict_key, score_key, test, "test")
            trained.append(parent)
        return trained

    def readers(self) -> dict:
        """(task id, output) -> organisations that must read it: its own, its consumers', share_with."""
        readers = {}
        for task in self.tasks:
            for output in task["outputs"]:
                readers[(task["task_id"], output)] = {task["worker"], *self.share_with}
        for task in self.tasks:
            for ref in task["inputs"]:
                if ref.parent_task_key:
                    readers[(ref.parent_task_key, ref.parent_task_output_identifier)].add(task["worker"])
        return readers

    def spec(self, name: str, key: str) -> ComputePlanSpec:
        readers = self.readers()
        performance = {o.identifier for _, outputs in CONTRACT.values() for o in outputs
                       if o.kind == AssetKind.performance}
        tasks = []
        for task in self.tasks:
            outputs = {
                output: ComputeTaskOutputSpec(permissions=public() if output in performance else Permissions(
                    public=False, authorized_ids=sorted(readers[(task["task_id"], output)])))
                for output in task["outputs"]}
            metadata = {k: str(v) for k, v in self.roles[task["task_id"]].items() if k != "train_task"}
            tasks.append(ComputePlanTaskSpec(task_id=task["task_id"], function_key=task["function_key"],
                                             worker=task["worker"], inputs=task["inputs"], outputs=outputs,
                                             metadata=metadata))
        return ComputePlanSpec(key=key, name=name, tasks=tasks)


def new_key() -> str:
    """A compute plan key chosen before submission, so it can be recorded before anything runs."""
    return str(uuid.uuid4())


def run_plan(client: substra.Client, builder: PlanBuilder, name: str, key: str) -> None:
    """Submit the plan under `key` and see it to its end. Raises PlanFailed naming the failed task.

    Local backends run the whole plan inside add_compute_plan; a remote node runs it while we poll,
    with a progress bar.
    """
    from substra.sdk.backends.local.compute.spawner.base import BuildError, ExecutionError

    spec = builder.spec(name, key)
    if client.backend_mode != "remote":
        with OutputTail() as tail:
            try:
                client.add_compute_plan(spec)
            except (substra.exceptions.SDKException, ExecutionError, BuildError) as exc:
                cause = exc.args[0] if exc.args else None
                error, log = f"{type(exc).__name__}: {exc}", None
                if isinstance(cause, subprocess.CalledProcessError):
                    error = f"its process exited with status {cause.returncode}"
                elif container := _FAILED_CONTAINER.fullmatch(str(cause)):
                    error = f"its container exited with status {container['status']}"
                    log = failed_container_log(container["image"])
                elif isinstance(exc, BuildError):
                    error, log = "its Docker image did not build", failed_build_log(str(cause))
            else:
                return
        raise PlanFailed(_failure(client, builder, name, error, tail.lines() if log is None else log))
    interval = polling_seconds()  # a bad setting is said before the plan is submitted
    client.add_compute_plan(spec)
    compute_plan = _wait(client, spec.key, len(builder.tasks), interval)
    if compute_plan.status != ComputePlanStatus.done:
        log = _remote_log(client, compute_plan.failed_task_key)
        raise PlanFailed(_failure(client, builder, name, f"plan status {compute_plan.status.value}", log,
                                  compute_plan.failed_task_key))


POLLING_VARIABLE = "MNIST_DP_POLLING_SECONDS"


def polling_seconds() -> float:
    """How often a remote plan's progress is asked for: 5 s, or the environment's MNIST_DP_POLLING_SECONDS."""
    text = os.environ.get(POLLING_VARIABLE, "5")
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise UserError(f"{POLLING_VARIABLE}={text}: must be a positive number of seconds")
    return seconds


def _wait(client: substra.Client, key: str, task_count: int, interval: float):
    from tqdm import tqdm

    finished = (ComputePlanStatus.done, ComputePlanStatus.failed, ComputePlanStatus.canceled)
    with tqdm(total=task_count, desc="compute plan", unit="task") as bar:
        while True:
            compute_plan = client.get_compute_plan(key)
            bar.update(compute_plan.done_count - bar.n)
            bar.set_postfix_str(f"{compute_plan.executing_count} executing, {compute_plan.failed_count} failed")
            if compute_plan.status in finished:
                return compute_plan
            time.sleep(interval)


def _remote_log(client: substra.Client, task_key: str | None) -> list:
    if not task_key:
        return []
    try:
        return client.get_logs(task_key).splitlines()
    except substra.exceptions.SDKException as exc:
        return [f"(its log could not be fetched: {exc})"]


LOG_TAIL_LINES = 15


def _failure(client: substra.Client, builder: PlanBuilder, name: str, error: str, log: list,
             task_key: str | None = None) -> str:
    task_id, role, function = failed_task(client, builder, task_key)
    where = f"task '{describe_role(role)}' ({task_id}), function {function!r}" if task_id else "an unknown task"
    tail = [line for line in log if line.strip()][-LOG_TAIL_LINES:]
    return (f"compute plan {name!r} failed in {where}: {error}\n"
            f"last lines of its log:\n" + "\n".join(f"  | {line}" for line in tail))


def failed_task(client: substra.Client, builder: PlanBuilder, task_key: str | None = None) -> tuple:
    """(task id, role, function name) of the failed task: `task_key` if the node said which, else the
    first task found failed (substra's local backend leaves it 'executing')."""
    candidates = [task_key] if task_key in builder.roles else builder.roles
    for task_id in candidates:
        role = builder.roles[task_id]
        try:
            task = client.get_task(task_id)
        except substra.exceptions.NotFound:  # never submitted: the plan stopped before it
            continue
        if task.status in (ComputeTaskStatus.executing, ComputeTaskStatus.failed):
            return task_id, role, task.function.name
    return None, None, None


def task_status(client: substra.Client, task_id: str) -> ComputeTaskStatus | None:
    try:
        return client.get_task(task_id).status
    except substra.exceptions.NotFound:
        return None


def performances(client: substra.Client, plan_key: str, roles: dict):
    """The plan's performances from Substra (get_performances), one row per performance, with the roles."""
    import pandas as pd

    try:
        perfs = client.get_performances(plan_key)
    except substra.exceptions.NotFound:  # the plan was refused before it existed
        perfs = substra.sdk.models.Performances()
    frame = pd.DataFrame({"task_key": perfs.task_key, "worker": perfs.worker, "round": perfs.round_idx,
                          "identifier": perfs.identifier, "performance": perfs.performance})
    frame["run"] = [roles[k]["run"] for k in frame.task_key]
    frame["metric"] = [f"{roles[k]['split']}_accuracy" if i == "performance" else i
                       for k, i in zip(frame.task_key, frame.identifier)]
    frame["train_task"] = [roles[k].get("train_task", k) for k in frame.task_key]
    return frame


def fetch_model(client: substra.Client, train_task: str, dest: Path) -> Path:
    """Copy the model file a train task produced to `dest` (kept with the run's results)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(client.download_model_from_task(train_task, "model", dest.parent))
    shutil.move(tmp, dest)
    return dest


# How substra's docker backend reports a task whose container failed (it names the function's image).
_FAILED_CONTAINER = re.compile(r"Container '(?P<image>[^']+)' exited with status code '(?P<status>-?\d+)'")


def failed_container_log(image: str) -> list | None:
    """The log of the newest exited container of `image` (a failed task), which is then removed:
    substra's docker backend keeps a failed task's container. None if there is none."""
    import docker

    containers = docker.from_env().containers.list(all=True, filters={"ancestor": image, "status": "exited"})
    if not containers:
        return None
    container = max(containers, key=lambda c: c.attrs["State"]["FinishedAt"])
    log = container.logs(stdout=True, stderr=True).decode(errors="replace")
    container.remove()
    return terminal_lines(log)


def failed_build_log(build_log: str) -> list:
    """A failed image build's output, which substra joins into one line, split back into its steps;
    the container of the step that failed (the last 'Running in <id>': substra builds without
    forcerm, so Docker keeps it) is removed."""
    import docker

    steps = re.findall(r"---> Running in ([0-9a-f]{12})", build_log)
    if steps:
        with contextlib.suppress(docker.errors.NotFound):
            docker.from_env().containers.get(steps[-1]).remove()
    return [part for step in re.split(r"(?=Step \d+/\d+ : |---> )", build_log) for part in textwrap.wrap(step, 160)]


def terminal_lines(text: str) -> list:
    """The lines a terminal would show: a progress bar's redraws (carriage returns) keep their last
    state, and a TTY's CRLF line ends (substra runs containers with a TTY) are plain line ends."""
    return [line.removesuffix("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]


class OutputTail:
    """While active, keep the last bytes written to this process's stdout and stderr (still shown).

    Substra's local mode runs each task as a child process writing straight to our terminal and keeps
    no log (its download_logs raises), so this is the only record of a failed task's output.
    """

    def __init__(self, keep: int = 64 * 1024):
        self.keep = keep
        self.buffer = bytearray()

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self._read_end, write_end = os.pipe()
        for fd in (1, 2):
            os.dup2(write_end, fd)
        os.close(write_end)
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()
        return self

    def _copy(self):
        while chunk := os.read(self._read_end, 65536):
            os.write(self._saved[2], chunk)  # one terminal stream: order is kept
            self.buffer += chunk
            del self.buffer[:-self.keep]

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # closes the pipe's last write ends: the copier sees EOF
        self._thread.join()
        os.close(self._read_end)
        for saved in self._saved.values():
            os.close(saved)
        return False

    def lines(self) -> list:
        return terminal_lines(self.buffer.decode(errors="replace"))
