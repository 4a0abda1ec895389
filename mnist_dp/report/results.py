"""A plan's results: run it, then one record per evaluated model that finished (a train task's, or
an aggregate task's in federated averaging: framework, round, organisation), its privacy figures
recomputed from the model file's ledger beside Substra's performances; display.py shows them."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import substra
from substra.sdk.models import ComputeTaskStatus

from mnist_dp.orchestration import execution
from mnist_dp.orchestration.compute_plan import PlanBuilder
from mnist_dp.privacy import model_file, replace_one
from mnist_dp.privacy.events import PER_EXAMPLE
from mnist_dp.privacy.randomness import REPLAYABLE_WARNING
from mnist_dp.privacy.statement import is_per_person, privacy_summary
from mnist_dp.privacy.units import IMAGE, PERSON
from mnist_dp.report import display
from mnist_dp.utils import atomic
from mnist_dp.utils.errors import UserError

# What a run writes in its --output folder, all of it that run's: an earlier
# run's are moved aside first.
REPORTS = ("results.json", "summary.md", "results.png", "models")
EARLIER = "earlier"  # <output>/earlier/<when the earlier run wrote its results>/


@contextlib.contextmanager
def run_output(output: Path, work: Path | None = None):
    """The --output folder of one run, held by it alone (atomic.exclusive), with no other run's
    reports in it: the REPORTS an earlier run left there are moved into EARLIER/<their date>/ first,
    never deleted, and put back if this run stops (a refusal, an error) before writing any of its
    own. `work`: Substra's local work folder, whose scratch files (its local-worker/) a killed run
    leaves behind (removed, saying so) and a run removes when it ends."""
    with atomic.exclusive(output, "--output folder") as folder:
        earlier = set_aside(folder)
        if earlier is not None:
            print("moved the earlier run's "
                  f"{', '.join(n for n in REPORTS if (earlier / n).exists())} to {earlier}")
        worker = None if work is None else Path(work) / "local-worker"
        if worker is not None and worker.is_dir() and any(worker.iterdir()):
            size = sum(f.stat().st_size for f in worker.rglob("*") if f.is_file()
                       and not f.is_symlink())
            shutil.rmtree(worker)
            print(f"removed {_size(size)} of work files left in {worker} by a run that was killed")
        try:
            yield folder
        except BaseException:
            if earlier is not None and not any((folder / name).exists() for name in REPORTS):
                put_back(earlier, folder)
                print(f"put the earlier run's reports back from {earlier}: this run wrote none")
            raise
        finally:
            if worker is not None:
                shutil.rmtree(worker, ignore_errors=True)


def put_back(earlier: Path, output: Path) -> None:
    """Undo set_aside: the reports in `earlier` return to `output`, and their folder (and EARLIER,
    if empty) goes."""
    for path in earlier.iterdir():
        path.rename(output / path.name)
    _point_at(output / "results.json", earlier / "models", output / "models")
    earlier.rmdir()
    with contextlib.suppress(OSError):  # other runs' reports may still be there
        earlier.parent.rmdir()


def set_aside(output: Path) -> Path | None:
    """Move the REPORTS an earlier run wrote in `output` into EARLIER/<the date of its results>/
    (returned; None when there were none). Refused (UserError), with nothing moved, where a path of
    a report's name is not one (`check_report`), or EARLIER is not a folder."""
    found = [output / name for name in REPORTS if os.path.lexists(output / name)]
    for path in found:
        check_report(path)
    if not found:
        return None
    if os.path.lexists(output / EARLIER) and (
            (output / EARLIER).is_symlink() or not (output / EARLIER).is_dir()):
        raise UserError(f"{output / EARLIER}: is not a folder, and a run keeps an earlier run's "
                        "reports there; move it out of the output folder, or choose another "
                        "--output")
    written = max(p.stat().st_mtime for p in found)
    stamp = datetime.datetime.fromtimestamp(written).strftime("%Y-%m-%dT%H-%M-%S")
    dest, k = output / EARLIER / stamp, 1
    while dest.exists():
        k += 1
        dest = output / EARLIER / f"{stamp}-{k}"
    dest.mkdir(parents=True)
    for path in found:
        path.rename(dest / path.name)
    _point_at(dest / "results.json", output / "models", dest / "models")
    return dest


def _point_at(report: Path, old: Path, new: Path) -> None:
    """Make the model_file paths of results.json `report` under `old` name `new` instead, where its
    model files went; a report that does not read as results.json's records is left as it is."""
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        records = json.loads(report.read_text())
        moved = [{**r, "model_file": str(new / Path(r["model_file"]).relative_to(old))}
                 if r.get("model_file") and Path(r["model_file"]).is_relative_to(old) else r
                 for r in records]
        if moved != records:
            atomic.write_json(report, moved)


def check_report(path: Path) -> None:
    """Refuse (UserError) a path of one of REPORTS' names that is not what a run writes there (a
    regular file; for "models", a folder of regular *.model files): it is the user's, and a run
    never moves it."""
    if path.name == "models":
        ours = not path.is_symlink() and path.is_dir() and all(
            entry.suffix == ".model" and entry.is_file() and not entry.is_symlink()
            for entry in path.iterdir())
    else:
        ours = not path.is_symlink() and path.is_file()
    if not ours:
        raise UserError(f"{path}: is not a report of this bundle, and a run sets aside only its "
                        "own earlier reports; move it out of the output folder, or choose another "
                        "--output")


def _size(size: int) -> str:
    return (f"{size / 1e6:.0f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB" if size >= 1e3
            else f"{size} bytes")


@dataclass
class Record:
    """One evaluated model that finished: where and when it trained, its privacy figures recomputed
    from its model file's ledger (`model_record`), and Substra's performances of its model. ε is inf
    without DP."""

    run: str  # e.g. "torch" or "torch-baseline"
    round: int
    # where it trained; display.FEDAVG for an average of every organisation's models
    organization: str
    framework: str
    dp: bool
    epsilon: float  # PLD, worst case over the data; per organisation in epsilon_by_organization
    epsilon_rdp: float
    epsilon_by_organization: dict
    delta: float
    accountant: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    # Every step behind ε at this σ and q, so the three give it; else the row says not (display.py).
    one_noise: bool = True
    clipping: str = PER_EXAMPLE
    max_grad_norm: float | None = None
    sampling: str = IMAGE.sampling
    neighbouring_relation: str = IMAGE.neighbouring_relation
    privacy_unit: str = IMAGE.name  # or PERSON.name: the unit ε is for (subjects.npy)
    max_epsilon: float | None = None
    stopped_by_budget: bool = False
    secure_mode: bool = False
    noise_seed: int | None = None  # replayable noise: see `warnings`
    library_epsilon: dict = field(default_factory=dict)
    model_file: str | None = None
    train_accuracy: float | None = None
    test_accuracy: float | None = None
    # what the train task itself published as its "epsilon" output
    epsilon_in_substra: float | None = None
    # An individual whose records every organisation holds (every run composed); None
    # with one organisation's data.
    epsilon_in_every_organization: float | None = None
    # Replacing one example by another (replace_one.py): the group-of-two bound of `epsilon`.
    epsilon_replace_one: float | None = None
    # The steps its worst example's ε composes, at each organisation (with q
    # and σ they recompute its ε).
    steps_by_organization: dict = field(default_factory=dict)
    # What each organisation's data has spent after the plan over every run released from it, this
    # model's among them (its own ledger, privacy/data_ledger.py), and the steps that figure
    # composes; on the plan's last round's records only.
    data_epsilon_by_organization: dict = field(default_factory=dict)
    data_steps_by_organization: dict = field(default_factory=dict)
    # what ε does not cover in this record, one line each
    warnings: list = field(default_factory=list)

    def __post_init__(self):
        flagged = [*([BASELINE_WARNING] if not self.dp else []),
                   *([TRAIN_SCORE_WARNING] if self.train_accuracy is not None else [])]
        self.warnings = [*self.warnings, *(w for w in flagged if w not in self.warnings)]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


BASELINE_WARNING = ("the non-private baseline (--baseline) trained without clipping or noise: its "
                    "model and its test accuracy are un-noised functions of the training data, not "
                    "covered by ε")
TRAIN_SCORE_WARNING = ("train_accuracy (--score-train) is computed on the training data without "
                       "noise and published as a Substra performance: it is not covered by ε")


def model_record(path: Path, framework: str, organizations: dict) -> dict:
    """Privacy figures recomputed from a saved model's ledger (never copied from a log).

    Args:
      path: the model file.
      framework: the framework that saved it.
      organizations: maps each organisation to the identities of its data samples (None: all).

    Returns:
      {Record field: value}: every field of the model's Record but where it trained (run, round,
      organization), the accuracies, epsilon_in_substra and what the data has spent.
    """
    saved = model_file.load(path, framework)
    delta = saved.hyperparameters["delta"]
    last = saved.ledger.events[-1]
    summary = privacy_summary(saved.ledger, delta)
    unit = PERSON if is_per_person(saved) else IMAGE
    runs = worst_runs(saved.ledger, delta, None)
    return {
        "framework": framework, "dp": all(e.is_private for e in saved.ledger.events),
        "epsilon": summary["epsilon"], "epsilon_rdp": summary["epsilon_rdp"],
        "epsilon_by_organization": {org: saved.ledger.epsilon(delta, data=fps) for org,
                                    fps in organizations.items()},
        "steps_by_organization": {org: steps(saved.ledger, delta, fps) for org,
                                  fps in organizations.items()},
        "epsilon_in_every_organization": (saved.ledger.epsilon_in_every_organization(delta)
                                          if len(saved.ledger.keys()) > 1 else None),
        "epsilon_replace_one": replace_one.of_ledger(saved.ledger, delta),
        "delta": delta, "accountant": summary["accountant"],
        "noise_multiplier": last.noise_multiplier, "sample_rate": last.sample_rate,
        # the steps behind the headline ε (its worst organisation's), not every run's: with q and
        # σ they recompute it, where every step of theirs has this σ and q
        "steps": sum(e.steps for e in runs), "clipping": last.clipping,
        "one_noise": all((q, sigma) == (last.sample_rate, last.noise_multiplier)
                         for e in runs for q, sigma, _ in e.segments()),
        "max_grad_norm": last.max_grad_norm,
        "sampling": unit.sampling, "neighbouring_relation": unit.neighbouring_relation,
        "privacy_unit": unit.name,
        "max_epsilon": saved.hyperparameters.get("max_epsilon"),
        "stopped_by_budget": saved.hyperparameters.get("stopped_by_budget", False),
        "secure_mode": saved.hyperparameters.get("secure_mode", False),
        "noise_seed": saved.hyperparameters.get("noise_seed"),
        "warnings": [REPLAYABLE_WARNING] if any(e.replayable_noise for e in saved.ledger.events)
            else [], "library_epsilon": {name: value for e in saved.ledger.events for name,
                            value in e.library_epsilon}, "model_file": str(path),
    }


def worst_runs(ledger, delta: float, data) -> list:
    """The runs behind the ledger's worst ε on the data samples `data`, a search's candidates aside
    (a row says "+ search" for them: display.py).

    Args:
      ledger: the ledger.
      delta: δ.
      data: the identities of the data samples (None: all).

    Returns:
      Those runs' events, in order; none where no run touched the data.
    """
    _, account = ledger.worst(delta, data=data)
    return [e for e in account.events if e.search is None] if account else []


def steps(ledger, delta: float, data) -> int:
    """The steps of `worst_runs(ledger, delta, data)`, summed."""
    return sum(e.steps for e in worst_runs(ledger, delta, data))


def with_data_spent(records: list, data_folders: dict) -> None:
    """Give the records of the plan's last round what each organisation's data has spent after the
    plan (its own ledger in `data_folders`, {organisation: its train sample folders}), after
    recording the released models' runs a task could not record itself (read-only data samples:
    docker mode). An earlier round's figure would be the plan's too, so it gets none."""
    if not data_folders or not records:
        return
    from mnist_dp.data import samples
    from mnist_dp.privacy import data_ledger

    identities = {org: {samples.sample_identity(f): f for f in folders} for org,
                  folders in data_folders.items()}
    released = [model_file.load(r.model_file).ledger for r in records if r.model_file]
    for own in identities.values():
        data_ledger.record_released(own, released, name=samples.named)
    spent = {org: samples.spent_on(list(own.values())) for org, own in identities.items()}
    last = max(r.round for r in records)
    for record in (r for r in records if r.round == last):
        record.data_epsilon_by_organization = {org: spent[org].epsilon(record.delta, data=own)
                                               for org, own in identities.items()}
        record.data_steps_by_organization = {org: steps(spent[org], record.delta, own)
                                             for org, own in identities.items()}


def run_and_report(client, builder: PlanBuilder, name: str, plan_key: str, frameworks: dict,
                   organizations: dict, output: Path, title: str, facts: list,
                   data_folders: dict | None = None, reconcile=None) -> list:
    """Run the plan `builder` built on `client`, then report whatever finished into `output`
    (models, results.json, summary.md, results.png) and print the table; a failed plan is reported
    first and raised after.

    Args:
      client: the Substra client.
      builder: the PlanBuilder that built the plan.
      name: the plan's name.
      plan_key: the key it is registered as.
      frameworks: run -> framework.
      organizations: organisation -> its data sample identities.
      output: the output folder.
      title: the report's heading.
      facts: the report's list of what was run.
      data_folders: organisation -> its train sample folders, whose own ledger gives what the data
        has spent; None: not reported.
      reconcile: called before the data's figures are read (a node: every run of every plan on
        the data, orchestration/reconcile.py), or None.

    Returns:
      The records.
    """
    failure = None
    try:
        execution.run_plan(client, builder, name, plan_key)
    except execution.PlanFailed as exc:
        failure = exc
    records, performances, not_downloaded = collect(client, builder, plan_key, frameworks,
                                                    organizations, output / "models")
    if reconcile is not None:
        reconcile()
    with_data_spent(records, data_folders)
    if not_downloaded:  # e.g. a node whose model export is off: its own figures are all there is
        facts = facts + [f"not downloaded, so not in the table: {', '.join(not_downloaded)}; their "
                         "accuracy and ε (as the train task computed it) are in Substra's "
                         "performances below"]
    written = display.write_reports(output, title, [f"compute plan `{plan_key}`"] + facts, records,
                                    performances, str(failure) if failure else None)
    print()
    print(display.table(records))
    if not_downloaded:
        print(f"\nmodel files not downloaded: {', '.join(not_downloaded)}; see Substra's "
              "performances in summary.md")
    print(f"\n{display.statement_for(records)}\nwritten: {', '.join(map(str, written))}")
    if failure:
        raise failure
    return records


def collect(client, builder: PlanBuilder, plan_key: str, frameworks: dict, organizations: dict,
            models_dir: Path) -> tuple:
    """The records of every train task that finished (every aggregate task in federated averaging),
    whether or not the plan did.

    Args:
      client: the Substra client.
      builder: the PlanBuilder that built the plan.
      plan_key: the plan's key.
      frameworks: maps run -> framework.
      organizations: maps organisation -> its data sample identities (None: all the data in the
        ledger).
      models_dir: where the model files are downloaded.

    Returns:
      (records, performances, not downloaded): a model the node refuses to hand out is named in the
      third, with the reason.
    """
    performances = execution.performances(client, plan_key, builder.roles)
    metric = {(row.train_task, row.metric): row.performance for row in performances.itertuples()}
    records, not_downloaded = [], []
    evaluated = _evaluated(builder)
    single_stage = len({(role.round_idx, where(role)) for role in evaluated.values()}) == 1
    for task_id, role in evaluated.items():
        if execution.task_status(client, task_id) != ComputeTaskStatus.done:
            continue
        run, round_idx, org = role.run, role.round_idx, where(role)
        name = run if single_stage else f"{run}-round{round_idx}-{org}"
        try:
            model = execution.fetch_model(client, task_id, models_dir / f"{name}.model")
        except substra.exceptions.AuthorizationError as exc:
            not_downloaded.append(f"{name} ({type(exc).__name__} {exc.status_code})")
            continue
        records.append(Record(
            run=run, round=round_idx, organization=org,
                              **model_record(model, frameworks[run], organizations),
            train_accuracy=metric.get((task_id, "train_accuracy")),
            test_accuracy=metric.get((task_id, "test_accuracy")),
            epsilon_in_substra=metric.get((task_id, "epsilon"))))
    return records, performances, not_downloaded


def where(role) -> str:
    """Where a recorded model was trained: the train task's organisation, or display.FEDAVG for an
    average."""
    return display.FEDAVG if role.step == "aggregate" else role.organization


def _evaluated(builder: PlanBuilder) -> dict:
    """{task id: role} of the tasks whose models are evaluated (every train task of a cyclic plan,
    the aggregate tasks of federated averaging), in plan order."""
    evaluated = {role.train_task for role in builder.roles.values() if role.train_task}
    return {task_id: role for task_id, role in builder.roles.items() if task_id in evaluated}
