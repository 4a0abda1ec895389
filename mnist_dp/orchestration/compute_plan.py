"""The compute plan: train -> predict -> score, chained across organisations and rounds (cyclic), or
each round's train tasks averaged by an aggregate task (federated averaging).

Outputs get the least privilege that lets the plan run (contract.py): a model or predictions file is
visible to the organisation that made it and to the organisations whose tasks consume it (plus any
named with `share_with`); performances are public, as Substra requires. A train or tune task's
`ledger` output, the data's own ledger, goes to its organisation's next train or tune task and to no
one else.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from substra.sdk.schemas import (
    AssetKind,
    ComputePlanSpec,
    ComputePlanTaskSpec,
    ComputeTaskOutputSpec,
    InputRef,
    Permissions,
)

from mnist_dp.orchestration.contract import CONTRACT, OWNER_ONLY, public
from mnist_dp.utils import options
from mnist_dp.utils.errors import UserError


@dataclass(frozen=True)
class Share:
    """Data one organisation holds and trains or evaluates on: its dataset and data sample keys."""

    organization: str
    dataset: str
    samples: tuple


def id_list(text: str | None) -> tuple:
    """'a, b' -> ('a', 'b'): organisation ids or client names given on the command line."""
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


@dataclass(frozen=True)
class Role:
    """What a task is, for reports and failure messages: which run, step, round and organisation."""

    run: str  # e.g. "torch" or "torch-baseline"
    step: str  # "train", "tune", "aggregate", "predict" or "score"
    round_idx: int
    organization: str  # where the task runs
    split: str | None = None  # predict and score: "train" (the train task's own data) or "test"
    # predict and score: the train (or aggregate) task whose model they evaluate
    train_task: str | None = None

    def metadata(self) -> dict:
        """The task's metadata on Substra (strings only; the train task is in its inputs
        already)."""
        return {name: str(value) for name, value in vars(self).items() if value is not None
                and name != "train_task"}


def describe_role(role: Role) -> str:
    """e.g. 'torch train, round 1 at MyOrg1MSP' or 'torch score, round 2 at MyOrg1MSP on test'."""
    text = f"{role.run} {role.step}, round {role.round_idx} at {role.organization}"
    return text + (f" on {role.split}" if role.split else "")


# strategy -> the algo functions it runs
STRATEGIES = {"cyclic": ("train", "predict"), "fedavg": ("train", "predict", "aggregate")}
SEARCH_FUNCTIONS = ("tune", "predict")  # a private search at each organisation (PlanBuilder.search)


def functions(strategy: str, search: bool, read_only: bool) -> tuple:
    """The algo functions a plan of `strategy` (or a search) runs, with the genesis where the
    backend gives tasks their data samples read-only (connection.READ_ONLY_DATA)."""
    return (SEARCH_FUNCTIONS if search else STRATEGIES[strategy]) + (("genesis",) * read_only)


# Tasks in one compute plan at most: a local backend runs them one after the other, seconds each and
# a train task much more, so days of work; beyond it a typo (--rounds 1000000000) is likelier than a
# plan, and building it would not end. Checked, like MAX_STEPS and MAX_EPOCHS, before any data is
# generated or anything is registered.
MAX_TASKS = 10_000


def add_arguments(parser, holders: str) -> None:
    """--strategy and --rounds, the same on every script that trains; `holders`: who holds the data
    shares ("organisations", "folds")."""
    parser.add_argument("--strategy", choices=STRATEGIES, default="cyclic",
                        help=f"how the {holders} train together: cyclic (one model passed from one "
                             "to the next) or fedavg (federated averaging) (default: %(default)s)")
    parser.add_argument("--rounds", type=options.integer(1, MAX_TASKS), default=1,
                        help=f"rounds: passes of the model through the {holders} (cyclic), or "
                             "train-then-average rounds (fedavg) (default: %(default)s)")
    parser.add_argument("--score-train", action="store_true",
                        help="also score every cyclic model on its own training data and publish "
                             "that accuracy as a Substra performance: an un-noised statistic of "
                             "the training data, NOT covered by ε (default: the test data only)")


def count_tasks(strategy: str, rounds: int, holders: int, runs: int = 1,
                score_train: bool = False) -> int:
    """The tasks PlanBuilder makes for `runs` runs of `rounds` rounds through `holders` data shares.
    Per round, cyclic: at each holder a train task, then predict and score on the test data (and on
    its own with score_train); fedavg: a train task at each holder, then one aggregate, predict and
    score. A search (one round): at each holder a tune task, then predict and score. With a
    "genesis" function key, one genesis task more per organisation that has no ledger yet.

    Args:
      strategy: "cyclic", "fedavg" or "search".
      rounds: the rounds of each run.
      holders: the data shares (organisations or folds).
      runs: the runs in the plan.
      score_train: cyclic models are also scored on their own training data.

    Returns:
      The number of tasks.
    """
    per_round = holders * (3 + 2 * score_train) if strategy in ("cyclic", "search") else holders + 3
    return runs * rounds * per_round


def check_size(tasks: int, asked: str) -> None:
    """Refuse a plan of more than MAX_TASKS tasks; `asked` names the options that sized it."""
    if tasks > MAX_TASKS:
        raise UserError(f"{asked} make {tasks:,} tasks, more than the {MAX_TASKS:,} one compute "
                        "plan may have (days of tasks run one after the other); use fewer rounds "
                        "or organisations")


def check_options(strategy: str, score_train: bool, search: bool = False, rounds: int = 1) -> None:
    """Refuse what a strategy would ignore: --score-train scores each cyclic model on its own
    organisation's data; a fedavg round's model is the average, which no organisation trained alone.
    A search (--search) is one tune task per organisation, its model scored on the test set.

    Args:
      strategy: --strategy.
      score_train: --score-train.
      search: whether --search was given.
      rounds: --rounds.
    """
    if search:
        options.refuse_unused("with --search (one search per organisation, its model scored on the "
                              "test set)", {
            "--rounds": rounds != 1, "--strategy fedavg": strategy == "fedavg",
                                            "--score-train": score_train})
    if strategy == "fedavg":
        options.refuse_unused("with --strategy fedavg", {"--score-train": score_train})


def describe_strategy(strategy: str) -> str:
    return {"cyclic": "cyclic (the model passed from organisation to organisation)",
            "fedavg": "federated averaging (each round's models averaged, weighted by "
                      "examples)"}[strategy]


@dataclass
class PlanBuilder:
    """Accumulates compute plan tasks; remembers what each task is (its role) for the report."""

    share_with: tuple = ()  # organisations also allowed to read every model and predictions output
    tasks: list = field(default_factory=list)  # dicts, made into specs by `spec()`
    roles: dict = field(default_factory=dict)  # task id -> Role
    # organisation -> the tasks (of this plan or earlier ones) whose `ledger` outputs its next train
    # or tune task takes as inputs: its latest, and any other tip of its chain the organisation's
    # reconciliation found (orchestration/reconcile.py)
    ledgers: dict = field(default_factory=dict)

    @staticmethod
    def _data(share: Share) -> list:
        return [InputRef(identifier="opener", asset_key=share.dataset)] + [
            InputRef(identifier="datasamples", asset_key=k) for k in share.samples]

    def _add(self, function_key: str, worker: str, inputs: list, outputs: list, role: Role) -> str:
        task_id = str(uuid.uuid4())  # a remote node requires UUID task ids
        self.tasks.append({"task_id": task_id, "function_key": function_key, "worker": worker,
                           "inputs": inputs, "outputs": outputs})
        self.roles[task_id] = role
        return task_id

    def _spending(self, function_key: str, share: Share, inputs: list, role: Role,
                  genesis: str | None) -> str:
        """A train or tune task at `share`'s organisation: it takes the `ledger` outputs of the
        organisation's previous one (or the tips of its chain), and its own goes to the next. With
        a `genesis` function key (read-only data samples: docker mode, a node), an organisation
        with no ledger yet gets a genesis task first."""
        previous = list(self.ledgers.get(share.organization) or ())
        if not previous and genesis:
            previous = [self._add(genesis, share.organization, self._data(share), ["ledger"],
                                  replace(role, step="genesis"))]
        inputs += [InputRef(identifier="ledger", parent_task_key=task,
                            parent_task_output_identifier="ledger") for task in previous]
        task = self._add(function_key, share.organization, inputs, ["model", "epsilon", "ledger"],
                         role)
        self.ledgers[share.organization] = [task]
        return task

    def train(self, run: str, function_key: str, share: Share, round_idx: int,
              parent: str | None = None, genesis: str | None = None) -> str:
        """Train at `share`'s organisation, continuing from the model of task `parent` if given.

        Args:
          run: the run the task is of (its Role's).
          function_key: the train function's key.
          share: the data it trains on.
          round_idx: its round.
          parent: the task whose model it continues from; None: the seeded start.
          genesis: the genesis function's key, where the data samples are read-only (_spending).

        Returns:
          The train task's id.
        """
        inputs = self._data(share)
        if parent:
            inputs.append(InputRef(identifier="model", parent_task_key=parent,
                                   parent_task_output_identifier="model"))
        return self._spending(function_key, share, inputs,
                              Role(run, "train", round_idx, share.organization), genesis)

    def aggregate(self, run: str, function_key: str, trained: list, worker: str,
                  round_idx: int) -> str:
        """Average the models of the `trained` tasks at organisation `worker` into the next global
        model.

        Args:
          run: the run the task is of.
          function_key: the aggregate function's key.
          trained: the train tasks whose models are averaged.
          worker: the organisation where it runs.
          round_idx: its round.

        Returns:
          The aggregate task's id.
        """
        inputs = [InputRef(identifier="models", parent_task_key=t,
                           parent_task_output_identifier="model")
                  for t in trained]
        return self._add(function_key, worker, inputs, ["model"],
                         Role(run, "aggregate", round_idx, worker))

    def evaluate(self, train_task: str, predict_key: str, score_key: str, share: Share,
                 split: str) -> str:
        """Predict on `share` with the model of `train_task`, then score.

        Args:
          train_task: the task whose model is evaluated (train, tune or aggregate).
          predict_key: the predict function's key.
          score_key: the score function's key.
          share: the data evaluated on, at its organisation.
          split: "train" (the train task's own data) or "test".

        Returns:
          The score task's id.
        """
        role = replace(self.roles[train_task], split=split, train_task=train_task,
                       organization=share.organization)
        model = InputRef(identifier="model", parent_task_key=train_task,
                         parent_task_output_identifier="model")
        predict_id = self._add(predict_key, share.organization, self._data(share) + [model],
                               ["predictions"], replace(role, step="predict"))
        predictions = InputRef(identifier="predictions", parent_task_key=predict_id,
                               parent_task_output_identifier="predictions")
        return self._add(score_key, share.organization, self._data(share) + [predictions],
                         ["performance"], replace(role, step="score"))

    def chain(self, run: str, keys: dict, stages: list, test: Share,
              score_train: bool = False) -> list:
        """Train through `stages`, each task from the model before it; after every train task,
        predict and score on `test`, and with `score_train` on its own share.

        Args:
          run: the run the tasks are of.
          keys: the run's function keys by function name ("genesis" where the data samples are
            read-only).
          stages: (round, Share) pairs, in order.
          test: the test data.
          score_train: also score on each train task's own share ("train": a public performance of
            the training data, outside ε, so only when asked).

        Returns:
          The train task ids.
        """
        trained, parent = [], None
        for round_idx, share in stages:
            parent = self.train(run, keys["train"], share, round_idx, parent, keys.get("genesis"))
            if score_train:
                self.evaluate(parent, keys["predict"], keys["score"], share, "train")
            self.evaluate(parent, keys["predict"], keys["score"], test, "test")
            trained.append(parent)
        return trained

    def fedavg(self, run: str, keys: dict, shares: list, rounds: int, test: Share) -> list:
        """Federated averaging: each round one train task per share, all from the round's global
        model (in round 1 from the same seeded initialisation), then an aggregate task at the test
        data's organisation averaging their models into the next global model, which is evaluated on
        `test`.

        Args:
          run: the run the tasks are of.
          keys: the run's function keys by function name ("genesis" where the data samples are
            read-only).
          shares: the data shares that train.
          rounds: the rounds.
          test: the test data.

        Returns:
          The aggregate task ids.
        """
        aggregated, global_model = [], None
        for round_idx in range(1, rounds + 1):
            trained = [self.train(run, keys["train"], share, round_idx, global_model,
                                  keys.get("genesis")) for share in shares]
            global_model = self.aggregate(run, keys["aggregate"], trained, test.organization,
                                          round_idx)
            self.evaluate(global_model, keys["predict"], keys["score"], test, "test")
            aggregated.append(global_model)
        return aggregated

    def search(self, run: str, keys: dict, shares: list, test: Share) -> list:
        """A private hyperparameter search at each share's organisation on its own data (a tune
        task), each released model evaluated on `test`.

        Args:
          run: the run the tasks are of.
          keys: the run's function keys by function name ("genesis" where the data samples are
            read-only).
          shares: the data shares searched on.
          test: the test data.

        Returns:
          The tune task ids.
        """
        tuned = []
        for share in shares:
            task = self._spending(keys["tune"], share, self._data(share),
                                  Role(run, "tune", 1, share.organization), keys.get("genesis"))
            self.evaluate(task, keys["predict"], keys["score"], test, "test")
            tuned.append(task)
        return tuned

    def spending(self, organization: str) -> list:
        """The ids of the tasks at `organization` that make a ledger output (genesis, train and
        tune), in the order their ledgers chain."""
        return [t["task_id"] for t in self.tasks if t["worker"] == organization
                and "ledger" in t["outputs"]]

    def readers(self) -> dict:
        """(task id, output) -> organisations that must read it: its own, its consumers', share_with
        (but for an OWNER_ONLY output, whose consumers are its own organisation's tasks: an output
        of an earlier plan is not in the result)."""
        readers = {}
        for task in self.tasks:
            for output in task["outputs"]:
                shared = () if output in OWNER_ONLY else self.share_with
                readers[(task["task_id"], output)] = {task["worker"], *shared}
        for task in self.tasks:
            for ref in task["inputs"]:
                if (ref.parent_task_key, ref.parent_task_output_identifier) in readers:
                    readers[(ref.parent_task_key,
                             ref.parent_task_output_identifier)].add(task["worker"])
        return readers

    def spec(self, name: str, key: str) -> ComputePlanSpec:
        readers = self.readers()
        performance = {o.identifier for _, outputs in CONTRACT.values() for o in outputs
                       if o.kind == AssetKind.performance}
        tasks = []
        for task in self.tasks:
            outputs = {
                output: ComputeTaskOutputSpec(permissions=public() if output in performance
                                              else Permissions(
                    public=False, authorized_ids=sorted(readers[(task["task_id"], output)])))
                for output in task["outputs"]}
            tasks.append(ComputePlanTaskSpec(task_id=task["task_id"],
                                             function_key=task["function_key"],
                                             worker=task["worker"], inputs=task["inputs"],
                                             outputs=outputs,
                                             metadata=self.roles[task["task_id"]].metadata()))
        return ComputePlanSpec(key=key, name=name, tasks=tasks)


def new_key() -> str:
    """A compute plan key chosen before submission, so it can be recorded before anything runs."""
    return str(uuid.uuid4())


