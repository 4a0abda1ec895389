"""An organisation's reconciliation with its node: every run any compute plan made on its data, read
from the node's own records, recorded with the data and composed into the data's figure.

On a node a task sees its data samples read-only, and knows the runs made on them since they were
registered only through its `ledger` inputs, which the plan's builder chose. A builder that leaves
them out is refused by the task; one that feeds an earlier ledger output (valid and sealed, say the
genesis again) is not: that task's budget check and its model's ε miss the runs it was not given.
The node, though, keeps every task it ran. The reconciliation lists the done tasks at this
organisation that read its dataset and made a ledger output, checks each output's seal, records
every run they hold in the data folder's ledger (data_ledger.record_released), and returns the
chain's tips, the outputs no other extends: the organisation's next plan takes them all as its
first task's ledger inputs, so that it knows every run. docs/privacy.md says what this covers.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import substra
from substra.sdk.models import ComputeTaskStatus

from mnist_dp.data import samples
from mnist_dp.orchestration import registry
from mnist_dp.privacy import data_ledger, seal
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted


@dataclass(frozen=True)
class Reconciled:
    """What a reconciliation found: `outputs`, the ledger outputs read (one per task); `tips`, the
    keys of the tasks whose outputs no other extends; `runs`, every run they hold; `recorded`, the
    runs the data folder's ledger lacked before; `forks`, outputs extended by more than one task (a
    plan fed a ledger another plan had already extended)."""

    outputs: int
    tips: list
    runs: int
    recorded: int
    forks: int

    def describe(self) -> str:
        fork = (f"; {counted(self.forks, 'ledger output')} "
                f"{'was' if self.forks == 1 else 'were'} extended twice: a plan was given an "
                "earlier ledger than the last, and its tasks' budget checks missed runs (all are "
                "counted here)" if self.forks else "")
        return (f"reconciled with the node: {counted(self.outputs, 'ledger output')} of tasks "
                f"on this organisation's data, {counted(self.runs, 'run')}, {self.recorded} newly "
                f"recorded in the data folder{fork}")


def ledger_tasks(client: substra.Client, organization: str, dataset_key: str) -> list:
    """The done tasks at `organization` that read dataset `dataset_key` and made a ledger output,
    oldest first."""
    tasks = client.list_task(filters={"worker": [organization],
                                      "status": [ComputeTaskStatus.done.value]},
                             order_by="creation_date", ascending=True)
    return [t for t in tasks if "ledger" in (t.outputs or {}) and any(
        i.identifier == "opener" and i.asset_key == dataset_key for i in t.inputs or ())]


def reconcile(client: substra.Client, organization: str, dataset_key: str,
              folders: list) -> Reconciled:
    """Reconcile the organisation's data sample folders `folders` with the node `client` talks to.

    Args:
      client: the organisation's Substra client.
      organization: its organisation id, where its tasks run.
      dataset_key: its dataset on the node.
      folders: its train data sample folders, whose ledgers the runs are recorded in.

    Returns:
      A Reconciled. Refused (UserError) where a task's ledger output cannot be read or its seal
      does not hold: the data's figure would miss runs.
    """
    keys = samples.seal_keys(folders)
    everything, digests, extended = Ledger(), {}, {}
    tasks = ledger_tasks(client, organization, dataset_key)
    with tempfile.TemporaryDirectory() as work:
        for task in tasks:
            path = _download(client, task, Path(work))
            content = path.read_bytes()
            for parent in data_ledger.add_sealed(everything, content, keys,
                                                 Path(f"task {task.key}: ledger")):
                extended[parent] = extended.get(parent, 0) + 1
            digests[seal.digest(content)] = task.key
    recorded = data_ledger.record_released({samples.sample_identity(f): f for f in folders},
                                           [everything])
    return Reconciled(outputs=len(tasks), tips=[k for d, k in digests.items() if d not in extended],
                      runs=len(everything.events), recorded=recorded,
                      forks=sum(count > 1 for count in extended.values()))


def of_keys_file(client: substra.Client, keys: registry.KeysFile) -> tuple:
    """Reconcile the train data folder the keys file `keys` names (reconcile), printing what was
    found: (the Reconciled, its train sample folders). Refused where the folder is not here: the
    node's runs could be neither checked nor recorded."""
    data_dir = Path(keys.require("data"))
    if not data_dir.is_dir():
        raise UserError(f"{keys.path}: its data folder {data_dir} is not here, so the runs made on "
                        "the node cannot be reconciled with its ledger; run this where the folder "
                        "is")
    folders = registry.sample_folders(data_dir, "train")
    found = reconcile(client, keys.require("organization_id"), keys.require("dataset_key"),
                      folders)
    print(found.describe())
    return found, folders


def _download(client: substra.Client, task, work: Path) -> Path:
    folder = work / task.key
    folder.mkdir()
    try:
        return Path(client.download_model_from_task(task.key, "ledger", folder))
    except substra.exceptions.AuthorizationError as exc:
        raise UserError(f"task {task.key} (compute plan {task.compute_plan_key}) ran on this "
                        "organisation's data, but the node refuses it its ledger output "
                        f"({exc.status_code}): its runs cannot be counted; ask the plan's creator "
                        "to share it, and restrict the dataset's permissions") from None
