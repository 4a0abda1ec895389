"""Running a compute plan on a backend: submit it, follow it to its end, name a failed task with the
end of its log, and read back what finished (task status, Substra's performances, model files).
"""
from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import substra
from substra.sdk.models import ComputePlanStatus, ComputeTaskStatus

from mnist_dp.orchestration.compute_plan import PlanBuilder, describe_role
from mnist_dp.orchestration.task_logs import OutputTail, local_failure
from mnist_dp.utils import progress
from mnist_dp.utils.errors import UserError


class PlanFailed(UserError):
    """A task failed: the message names it and ends with its log; the plan's finished work is
    kept."""


def run_plan(client: substra.Client, builder: PlanBuilder, name: str, key: str) -> None:
    """Submit the plan under `key` and see it to its end.

    Local backends run the whole plan inside add_compute_plan; a remote node runs it while we poll,
    with a progress bar.

    Args:
      client: the Substra client.
      builder: the PlanBuilder that holds the plan's tasks.
      name: the plan's name.
      key: the plan's key.

    Raises:
      PlanFailed: naming the failed task.
    """
    from substra.sdk.backends.local import backend
    from substra.sdk.backends.local.compute.spawner.base import BuildError, ExecutionError

    spec = builder.spec(name, key)
    if client.backend_mode != "remote":
        progress.show_in_tasks()  # their output comes through OutputTail's pipe to our terminal
        with OutputTail() as tail, progress.library_bars(backend):
            try:
                client.add_compute_plan(spec)
            except (substra.exceptions.SDKException, ExecutionError, BuildError) as exc:
                error, log = local_failure(exc, tail)
            else:
                return
        raise PlanFailed(_failure(client, builder, name, error, log))
    interval = polling_seconds()  # a bad setting is said before the plan is submitted
    client.add_compute_plan(spec)
    compute_plan = _wait(client, spec.key, len(builder.tasks), interval)
    if compute_plan.status != ComputePlanStatus.done:
        log = _remote_log(client, compute_plan.failed_task_key)
        raise PlanFailed(_failure(client, builder, name, f"plan status {compute_plan.status.value}",
                                  log, compute_plan.failed_task_key))


POLLING_VARIABLE = "MNIST_DP_POLLING_SECONDS"
DEFAULT_POLLING_SECONDS = 5


def polling_seconds() -> float:
    """Seconds between two requests for a remote plan's progress: the environment's
    MNIST_DP_POLLING_SECONDS, by default DEFAULT_POLLING_SECONDS."""
    text = os.environ.get(POLLING_VARIABLE, str(DEFAULT_POLLING_SECONDS))
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise UserError(f"{POLLING_VARIABLE}={text}: must be a positive number of seconds")
    return seconds


def _wait(client: substra.Client, key: str, task_count: int, interval: float):
    finished = (ComputePlanStatus.done, ComputePlanStatus.failed, ComputePlanStatus.canceled)
    with progress.counter(task_count, "compute plan", "task") as bar:
        while True:
            compute_plan = client.get_compute_plan(key)
            bar.update(compute_plan.done_count - bar.n)
            bar.set_postfix_str(f"{compute_plan.executing_count} executing, "
                                f"{compute_plan.failed_count} failed")
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
    where = (f"task '{describe_role(role)}' ({task_id}), function {function!r}" if task_id
             else "an unknown task")
    return f"compute plan {name!r} failed in {where}: {error}\n{log_tail(log)}"


def log_tail(log: list) -> str:
    """The end of a failed task's log as its failure message ends: its last LOG_TAIL_LINES non-blank
    lines."""
    tail = [line for line in log if line.strip()][-LOG_TAIL_LINES:]
    return "last lines of its log:\n" + "\n".join(f"  | {line}" for line in tail)


def failed_task(client: substra.Client, builder: PlanBuilder, task_key: str | None = None) -> tuple:
    """The failed task of a plan.

    Args:
      client: the Substra client.
      builder: the plan's PlanBuilder.
      task_key: the failed task, if the node said which.

    Returns:
      (task id, role, function name) of `task_key` if the node said which, else of the first task
      found failed (substra's local backend leaves it 'executing'); (None, None, None) if none is
      found.
    """
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


def last_done(client: substra.Client, task_ids: list) -> str | None:
    """The last of `task_ids` that is done (None: none is)."""
    return next((t for t in reversed(task_ids) if task_status(client, t) == ComputeTaskStatus.done),
                None)


def performances(client: substra.Client, plan_key: str, roles: dict):
    """The plan's performances from Substra (get_performances), one row per performance, with the
    roles.

    Args:
      client: the Substra client.
      plan_key: the plan's key.
      roles: {task id: Role} of the plan's tasks.

    Returns:
      A pandas frame: task_key, worker, round, identifier and performance, then from the roles run,
      metric (the identifier; "<split>_accuracy" for a score task's "performance"), train_task and
      trained_at. No rows when the plan was refused before it existed.
    """
    import pandas as pd

    try:
        perfs = client.get_performances(plan_key)
    except substra.exceptions.NotFound:  # the plan was refused before it existed
        perfs = substra.sdk.models.Performances()
    frame = pd.DataFrame({"task_key": perfs.task_key, "worker": perfs.worker,
                          "round": perfs.round_idx, "identifier": perfs.identifier,
                          "performance": perfs.performance})
    frame["run"] = [roles[k].run for k in frame.task_key]
    frame["metric"] = [f"{roles[k].split}_accuracy" if i == "performance" else i
                       for k, i in zip(frame.task_key, frame.identifier)]
    frame["train_task"] = [roles[k].train_task or k for k in frame.task_key]
    # Whose model a performance is of: a round's models trained at several
    # organisations are scored at one.
    frame["trained_at"] = [roles[t].organization for t in frame.train_task]
    return frame


def fetch_model(client: substra.Client, train_task: str, dest: Path) -> Path:
    """Copy the model file a train task produced to `dest` (kept with the run's results).

    Args:
      client: the Substra client.
      train_task: the task whose "model" output is copied.
      dest: the file to write.

    Returns:
      `dest`.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(client.download_model_from_task(train_task, "model", dest.parent))
    shutil.move(tmp, dest)
    return dest
