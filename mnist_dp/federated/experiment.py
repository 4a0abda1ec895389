"""What a substrafl experiment with the bundle's algos needs around them: the organisations' data
registered as substrafl's nodes, the Dependency its functions run with (and their Dockerfile in
docker mode), the experiment run with a failed task named, and the results read back in the bundle's
format (results.json, summary.md).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import substra
from substra.sdk.models import ComputeTaskStatus

from mnist_dp.assets import ALGO_ASSETS, ASSETS, REPO
from mnist_dp.data import samples
from mnist_dp.orchestration import registry
from mnist_dp.orchestration.execution import log_tail
from mnist_dp.orchestration.task_logs import OutputTail, local_failure
from mnist_dp.report.results import Record, model_record
from mnist_dp.utils import progress
from mnist_dp.utils.errors import UserError


@dataclass
class Organizations:
    """substrafl's nodes over every organisation's registered data, and which data each holds
    (identities)."""

    train_data_nodes: list
    test_data_nodes: list
    identities: dict  # organisation -> identities of its train data samples (its ε in the ledger)
    # organisation -> its train data sample folders (their own ledger: what the data has spent)
    folders: dict


def count_tasks(organizations: int, rounds: int) -> int:
    """The tasks of substrafl's FedAvg plan evaluated at every organisation after every round: an
    initialisation at each organisation, then per round a train task at each, one aggregate and an
    evaluation at each."""
    return organizations + rounds * (2 * organizations + 1)


def register(clients: list, keys: registry.KeysFile, data_dir: Path) -> Organizations:
    """Organisation k registers train data samples k, k+N, ... and the test samples: every
    organisation evaluates the global model on the test set, so each reports its own ε (that of its
    local state) beside the accuracy.

    Args:
      clients: one Substra client per organisation.
      keys: the keys file the assets' keys go to.
      data_dir: the data folder.

    Returns:
      The Organizations: substrafl's train and test data nodes, and each organisation's train data
      sample identities and folders.
    """
    from substrafl.nodes import TestDataNode, TrainDataNode

    shares, tests, holdings = registry.register_organizations(
        clients, keys, data_dir, test_everywhere=True)
    return Organizations(
        [TrainDataNode(organization_id=s.organization, data_manager_key=s.dataset,
                       data_sample_keys=list(s.samples))
         for s in shares], [TestDataNode(organization_id=t.organization, data_manager_key=t.dataset,
                      data_sample_keys=list(t.samples))
         for t in tests], {org: [samples.sample_identity(f) for f in folders] for org,
         folders in holdings.items()}, holdings)


def pinned_packages(framework: str) -> list:
    """The pip requirements of the framework's functions, as its asset's Dockerfile pins them (one
    list for both kinds of images): `name==version` and any `--extra-index-url URL` (torch's CPU
    builds)."""
    text = (ALGO_ASSETS[framework] / "Dockerfile").read_text()
    return (re.findall(r"--extra-index-url \S+", text)
            + re.findall(r"(?<![\w.-])([A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+)", text))


def system_packages(framework: str) -> list:
    """The Debian packages the framework's functions need besides pip's, as its asset's Dockerfile
    installs them (`apt-get install ... --no-install-recommends NAME ...`)."""
    text = (ALGO_ASSETS[framework] / "Dockerfile").read_text().replace("\\\n", " ")
    found = re.search(r"apt-get install -y --no-install-recommends ((?:[\w.+-]+ )+)", text)
    return found.group(1).split() if found else []


def dependency(framework: str):
    """substrafl's Dependency of the bundle's algos: the framework's pinned packages, and the
    bundle's code (the mnist_dp package and the assets) copied beside each function. substrafl adds
    itself."""
    from substrafl.dependency import Dependency

    return Dependency(pypi_dependencies=pinned_packages(framework),
                      local_code=[REPO / "mnist_dp", ASSETS],
                      binary_dependencies=system_packages(framework))


class ExperimentFailed(UserError):
    """A task failed: the message names its organisation, function and round, and ends with its
    log."""


def run(client: substra.Client, output: Path, **experiment) -> str:
    """substrafl's execute_experiment(client=client, experiment_folder=output/"experiment",
    **experiment) on a local backend, which runs every task before it returns; returns the compute
    plan's key. A failed task raises ExperimentFailed naming where it ran, with the end of its
    log."""
    import substrafl
    from substra.sdk.backends.local import backend
    from substra.sdk.backends.local.compute.spawner.base import BuildError, ExecutionError
    from substrafl.experiment import execute_experiment
    from substrafl.strategies import strategy

    (output / "experiment").mkdir(parents=True, exist_ok=True)
    known = {plan.key for plan in client.list_compute_plan()}
    progress.show_in_tasks()  # their output comes through OutputTail's pipe to our terminal
    if not sys.stderr.isatty():  # its INFO lines: a terminal's only, as the bars
        substrafl.set_logging_level(logging.WARNING)
    with OutputTail() as tail, _containers_run_as_this_user(client), \
            progress.library_bars(backend, strategy):
        try:
            return execute_experiment(client=client, experiment_folder=str(output / "experiment"),
                                      clean_models=False, **experiment).key
        except (substra.exceptions.SDKException, ExecutionError, BuildError) as exc:
            error, log = local_failure(exc, tail)
    new = [plan.key for plan in client.list_compute_plan() if plan.key not in known]
    raise ExperimentFailed(_failure(client, new[0] if new else None, error, log))


@contextlib.contextmanager
def _containers_run_as_this_user(client: substra.Client):
    """In docker mode, substrafl's generated Dockerfile with one line added: its functions run as
    the user of this process, not as its own uid 1001. Substra's local backend hands every task
    folders this user created and data samples this user owns (a sample's identity.key is readable
    by its owner only), so uid 1001 could neither read its inputs nor write its outputs. The image
    is otherwise substrafl's, built the same way."""
    if client.backend_mode != "docker":
        yield
        return
    from substrafl.remote.register import register as substrafl_register

    template, entrypoint = substrafl_register.DOCKERFILE_TEMPLATE, "\nENTRYPOINT ["
    if template.count(entrypoint) != 1:
        raise RuntimeError("substrafl's DOCKERFILE_TEMPLATE has no single ENTRYPOINT line: "
                           "substrafl changed, update mnist_dp/federated/experiment.py")
    substrafl_register.DOCKERFILE_TEMPLATE = template.replace(
        entrypoint, "\n# the user who owns the task folders on the host\nUSER "
                    f"{os.getuid()}:{os.getgid()}{entrypoint}")
    try:
        yield
    finally:
        substrafl_register.DOCKERFILE_TEMPLATE = template


def _failure(client: substra.Client, plan_key: str | None, error: str, log: list) -> str:
    where = "an unknown task"
    if plan_key:  # substra's local backend leaves the failed task 'executing'
        for task in client.list_task(filters={"compute_plan_key": [plan_key]}):
            if task.status in (ComputeTaskStatus.executing, ComputeTaskStatus.failed):
                where = (f"organisation {task.worker}, function {task.function.name!r}, round "
                         f"{task.metadata.get('round_idx', '?')} (task {task.key})")
                break
    return f"substrafl experiment failed at {where}: {error}\n{log_tail(log)}"


def collect(client: substra.Client, plan_key: str, framework: str, organizations: Organizations,
            models_dir: Path) -> tuple:
    """The experiment's results in the bundle's format.

    Args:
      client: the Substra client that ran it.
      plan_key: its compute plan's key.
      framework: the algo's framework, each record's run.
      organizations: the registered Organizations (their identities give each one's ε).
      models_dir: where the evaluated local states are downloaded.

    Returns:
      (records, performances): one Record per organisation and round after the first training, from
      the local state its evaluation used (downloaded to `models_dir`, the bundle's model file: ε
      recomputed from its ledger, every organisation's), with the evaluation's accuracy and the
      organisation's own ε (`epsilon_in_substra`) beside; and Substra's performances as a frame.
    """
    import pandas as pd

    perfs = client.get_performances(plan_key)
    frame = pd.DataFrame({"task_key": perfs.task_key, "worker": perfs.worker,
                          "round": perfs.round_idx, "metric": perfs.identifier,
                          "performance": perfs.performance})
    frame["run"] = framework
    frame["trained_at"] = frame["worker"]  # each organisation evaluates its own local state
    records = []
    for (task_key, org, round_idx), rows in frame.groupby(["task_key", "worker", "round"],
         sort=False):
        metric = dict(zip(rows.metric, rows.performance))
        if round_idx == 0:  # the seeded start, before any training: no model file, ε 0
            continue
        evaluated = next(i.parent_task_key for i in client.get_task(task_key).inputs
                         if i.identifier == "local")
        path = models_dir / f"{framework}-round{round_idx}-{org}.model"
        path.parent.mkdir(parents=True, exist_ok=True)
        Path(client.download_model_from_task(evaluated, "local", path.parent)).replace(path)
        records.append(Record(run=framework, round=int(round_idx), organization=org,
                              **model_record(path, framework, organizations.identities),
                              test_accuracy=metric.get("accuracy"),
                              epsilon_in_substra=metric.get("epsilon")))
    records.sort(key=lambda r: (r.round, r.organization))
    return records, frame

