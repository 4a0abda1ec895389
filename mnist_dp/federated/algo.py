"""The bundle's DP training as a substrafl algo for its FedAvg strategy, in any of the three
frameworks.

substrafl re-creates the algo in every task from its constructor's arguments, then loads the
organisation's local state into it. Here the arguments are plain values (framework, hyperparameters,
rounds) and the local state is the bundle's model file: the weights with the privacy ledger of every
run on this organisation's data, which `scripts/privacy_report.py` reads like any other. A train
task is one run of the skeleton (`skeleton.train_in_memory`: Poisson batches, the framework's DP
step, the ledger), returning the change of the weights for FedAvg to average; every organisation
applies the average itself, so all hold the same global model.

σ is calibrated once, for what really runs. substrafl's FedAvg runs `rounds + 1` train tasks at
every organisation (its first round trains twice, before and after the first average), and the last
one's update is never averaged: the final model is the average of round `rounds`. So that last task
applies the average and trains nothing (it spends no privacy), and σ is calibrated for `rounds`
local trainings of `epochs` Poisson epochs each: every organisation ends at or below
`target_epsilon`. A train task beyond those refuses to run.

The ledger travels with the weights (strategy.DpFedAvg): each train task sends the organisation's
ledger with its change, and keeps the merge the aggregator sends back, so the local state's ledger
holds every run in its weights. Evaluation reports the organisation's own ε beside the accuracy:
`predict` returns the predicted labels with the ε of the organisation's examples, recomputed from
the local state's ledger, and the metric functions `accuracy` and `epsilon` read them.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
from substrafl.algorithms.algo import Algo
from substrafl.remote import remote_data
from substrafl.strategies.schemas import StrategyName

from mnist_dp import hyperparameters
from mnist_dp.assets import ALGO_ASSETS, load_asset_module
from mnist_dp.federated.strategy import LedgerSharedState, received_ledger
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.learning import model_io, skeleton
from mnist_dp.learning.interface import Framework, Network
from mnist_dp.privacy import data_ledger, model_file, preflight, provenance, units
from mnist_dp.privacy.examples import persons_of
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.policy import plan_size
from mnist_dp.utils import atomic, json_input
from mnist_dp.utils.errors import UserError

# A local state before any training: the initial model is the seeded start (hp
# seed), rebuilt, not stored.
UNTRAINED = "mnist-dp-substrafl-untrained/1"
# The local state's count of train tasks, and the identities of the organisation's own data samples
# (its own ε), in its model file's metadata.
TRAIN_TASKS = "substrafl_train_tasks"
OWN_DATA = "substrafl_own_data"


@functools.cache
def load_framework(framework: str):
    """The `Framework` of an algo asset (its algo.py's FRAMEWORK), imported once per process."""
    return load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}_dp").FRAMEWORK


def check_hyperparameters(values: dict, rounds: int,
                          where: str = "hyperparameters") -> Hyperparameters:
    """The hyperparameters an algo trains with, refused here, on the caller's machine, rather than
    in a task.

    Args:
      values: the hyperparameters, as a hyperparameters file holds them.
      rounds: the experiment's num_rounds, a positive integer.
      where: names their source in error messages.

    Returns:
      The parsed Hyperparameters. Raises UserError for invalid ones, for `rounds` not a positive
      integer, or for a max_epsilon (not supported under substrafl: an organisation that stops would
      send FedAvg no update to weigh).
    """
    hp = hyperparameters.parse(values, where)
    if not isinstance(rounds, int) or rounds < 1:
        raise UserError(f"rounds = {rounds!r}: give the experiment's num_rounds, a positive "
                        "integer")
    if hp.max_epsilon is not None:
        raise UserError(f"{where}: max_epsilon is not supported under substrafl (an organisation "
                        "that stops would send FedAvg no update to weigh); set it to null and use "
                        "target_epsilon, which every organisation meets after the last round")
    return hp


class DpTraining:
    """What the bundle's algos for substrafl share, whatever their base class: the framework, the
    hyperparameters, the model and its ledger, one train run, the local state, and predict. A
    subclass has a `model` property.

    The framework is imported when first used: substrafl builds the algo in tasks that never use it
    (the organisations' first task, which only saves the local state, and the aggregator's), and
    importing a framework's library takes seconds."""

    def _setup(self, framework: str, hyperparameters: dict, rounds: int) -> None:
        if framework not in ALGO_ASSETS:
            raise UserError(f"framework {framework!r}: expected one of {', '.join(ALGO_ASSETS)}")
        self.framework_name = framework
        self.hp = check_hyperparameters(hyperparameters, rounds)
        self.rounds = rounds
        self.network = Network.of(self.hp)
        self.ledger = Ledger()
        # substrafl train tasks run at this organisation, the last one included
        self.train_tasks = 0
        # the model file metadata of the last run (TaskPlan.metadata); None: untrained
        self.settings = None
        # the identities of this organisation's training data samples (its own ε)
        self.own_data = ()

    @property
    def framework(self) -> Framework:
        """The algo asset's Framework (self.framework_name names it without importing it)."""
        return load_framework(self.framework_name)

    def __reduce__(self):
        # substrafl pickles the algo inside the strategy (for the aggregate and evaluate tasks) and
        # deep-copies it: re-create it from its arguments, as substrafl does in every task (the
        # framework's module and a tf or MindSpore model do not pickle).
        return _recreate, (type(self), self.kwargs)

    def _train_run(self, data: dict, through=None) -> int:
        """One train task's work on `self.model` (in place) with the opener's `data`: a local
        training, or nothing in FedAvg's last task (its update is never averaged); returns the
        data's public size (policy.plan_size), FedAvg's weight for this organisation."""
        unit = units.of(persons_of(data) if self.hp.dp else None)
        n = plan_size(data, unit, len(data["labels"]))
        if self.train_tasks > self.rounds:
            raise UserError(f"this {self.framework_name} algo's σ was calibrated for rounds = "
                            f"{self.rounds} (substrafl's FedAvg runs {self.rounds + 1} train tasks "
                            "per organisation) and this organisation ran them all: more would "
                            "spend beyond its plan; give the algo the experiment's num_rounds")
        self.train_tasks += 1
        if self.train_tasks == self.rounds + 1:
            skeleton.log.info("FedAvg's last train task: its update is never averaged, so nothing "
                              "is trained and no privacy is spent")
            return n
        # σ is calibrated over what the plan counts
        hp = self._hyperparameters_for_rounds(n, data)
        # the local state, this organisation's own, carries the run where the data is read-only
        with data_ledger.held(skeleton.sample_folders(data), passes_on=True) as spent:
            plan, ran = skeleton.train_in_memory(
                self.framework, self.model, self.ledger, data, hp,
                f"{self.framework_name} algo's hyperparameters",
                provenance.running_code(Path.cwd(), "substrafl train"),
                "nothing was sent; lower learning_rate or max_grad_norm", through, spent=spent,
                continuing=self.train_tasks > 1, may_stop=False)
        if ran is None:  # no budget stops a run without max_epsilon, refused above
            raise RuntimeError(f"{self.framework_name}: a run without max_epsilon trained no step")
        self.settings = plan.metadata()
        self.own_data = tuple(sample["identity"] for sample in data["samples"])
        return n

    def _receive(self, shared_state) -> None:
        """Keep the aggregator's merged ledger (none in the first round): the global model's runs,
        every organisation's."""
        if shared_state is not None:
            self.ledger = received_ledger(shared_state, self.ledger)

    def _shared_state(self, n: int, update: list) -> LedgerSharedState:
        """What this organisation sends the aggregator: the change, its data's public size (FedAvg's
        weight), and its ledger."""
        return LedgerSharedState(n_samples=n, parameters_update=update,
                                 ledger=self.ledger.released().to_json())

    def _hyperparameters_for_rounds(self, n: int, data: dict) -> Hyperparameters:
        """The hyperparameters with σ fixed for every run of this organisation
        (preflight.noise_for_rounds): calibrated by its first train task, after what the opener's
        `data` had spent (its continued models carry those runs), then read from the local state
        (the same σ, without the accountant's search)."""
        if self.settings is None:
            earlier = data_ledger.read(skeleton.sample_folders(data))
            return preflight.noise_for_rounds(self.hp, [n], self.rounds,
                                              [data_ledger.histories(earlier, data["samples"])])
        return hyperparameters.parse({**self.hp.to_json(),
                                      "noise_multiplier": self.settings["noise_multiplier"],
                              "target_epsilon": None}, "local state") if self.hp.dp else self.hp

    def _weights(self) -> list:
        # copies: MindSpore's alias the weights
        return [np.array(a) for a in self.framework.weight_arrays(self.model)]

    def epsilon(self) -> float:
        """The organisation's own ε, that of its examples, after its runs so far (0 before any), at
        the hyperparameters' δ. The local state's headline figure (privacy_report.py) is the worst
        organisation's."""
        if not self.own_data:
            return 0.0
        return self.ledger.released().epsilon(self.hp.delta, data=self.own_data)

    def predict(self, data_from_opener: dict, shared_state=None) -> dict:
        """The predicted labels of the opener's images, with this organisation's ε for the `epsilon`
        metric."""
        labels = model_io.predicted_labels(self.framework, self.model, data_from_opener["images"],
                                           self.network)
        return {"labels": labels, "epsilon": self.epsilon()}

    def save_local_state(self, path: Path) -> None:
        if self.settings is None:  # substrafl's init task: nothing trained yet
            with atomic.replacing(path) as tmp:
                Path(tmp).write_text(json.dumps({"format": UNTRAINED,
                                                 "framework": self.framework_name}))
            return
        model_file.save(path, model_file.ModelFile(self.framework_name,
                                                   self.framework.dump_model(self.model),
                                                   self.ledger,
                                                   {**self.settings, TRAIN_TASKS: self.train_tasks,
                                                                 OWN_DATA: list(self.own_data)}))

    def load_local_state(self, path: Path):
        if _is_untrained(path, self.framework_name):
            return self
        saved = model_file.load(path, self.framework_name)
        if Network.of_saved(saved) != self.network:
            raise UserError(f"{path}: a local state of {Network.of_saved(saved).describe()}, this "
                            f"algo trains {self.network.describe()}")
        self._model = model_io.load_weights(self.framework, saved, path, self.network)
        self.ledger, self.settings = saved.ledger, saved.hyperparameters
        self.train_tasks = self.settings.pop(TRAIN_TASKS)
        self.own_data = tuple(self.settings.pop(OWN_DATA))
        return self


def _recreate(cls, kwargs: dict):
    return cls(**kwargs)


def _is_untrained(path: Path, framework: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(64)
    if not head.startswith(b"{"):
        return False  # a model file is a zip
    try:
        state = json_input.loads(Path(path).read_text(), str(path))
    except (json.JSONDecodeError, UnicodeDecodeError):
        state = None
    if state != {"format": UNTRAINED, "framework": framework}:
        raise UserError(f"{path}: not a local state of this bundle's {framework} algo")
    return True


class DpFedAvgAlgo(DpTraining, Algo):
    """The bundle's DP training for substrafl's FedAvg, in `framework` (a key of ALGO_ASSETS), on
    substrafl's generic Algo; for torch users, `torch_algo.TorchDpFedAvgAlgo` is the same on
    substrafl's TorchFedAvgAlgo.

    `hyperparameters`: a full set, as an algo asset's hyperparameters.json; `rounds`: the
    experiment's num_rounds, for which σ is calibrated."""

    def __init__(self, framework: str, hyperparameters: dict, rounds: int):
        # substrafl re-creates
        super().__init__(framework=framework, hyperparameters=hyperparameters, rounds=rounds)
        self._setup(framework, hyperparameters, rounds)
        self._model = None

    @property
    def model(self):
        if self._model is None:  # the seeded start, the same at every organisation
            self._model = self.framework.new_model(self.hp.seed, self.network)
        return self._model

    @property
    def strategies(self) -> list:
        return [StrategyName.FEDERATED_AVERAGING]

    @remote_data
    def train(self, data_from_opener: dict, shared_state=None) -> LedgerSharedState:
        """Apply the last average (none in the first round) with its ledger, train, send the change
        with this organisation's ledger and keep the global model."""
        self._receive(shared_state)
        if shared_state is not None:
            self._model = self.framework.set_weight_arrays(self.model, [
                w + u.astype(w.dtype) for w, u in zip(self._weights(),
                                                      shared_state.avg_parameters_update)])
        start = self._weights()
        n = self._train_run(data_from_opener)
        update = [new - old for new, old in zip(self._weights(), start)]
        self._model = self.framework.set_weight_arrays(self.model, start)
        return self._shared_state(n, update)


# The metric functions for DpFedAvg(metric_functions=...): substrafl calls them with the opener's
# data and DpTraining.predict's output.

def accuracy(data_from_opener, predictions) -> float:
    return float(np.mean(predictions["labels"] == np.asarray(data_from_opener["labels"])))


def epsilon(data_from_opener, predictions) -> float:
    """The organisation's own ε so far (its examples' in its ledger, recomputed by the accountant in
    the evaluation task)."""
    return float(predictions["epsilon"])


METRICS = {"accuracy": accuracy, "epsilon": epsilon}
