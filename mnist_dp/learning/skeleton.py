"""The skeleton every algo asset shares: a train task in four phases, budget -> plan -> run ->
record, then the model saved.

An asset supplies only a `Framework` (interface.py: the hooks that build the network and its
optimizer, take one DP or plain step, end the training, give the library's ε and move weights in and
out); the rest is shared, once: the task functions train, aggregate and predict here (models loaded
and checked in model_io.py). `train_in_memory` makes each phase once: the budget in
privacy/budgets.py (the unit, what the data and the input model have spent), the run's plan in
privacy/task_plan.py (q, steps, σ, the cut to the budgets, the DP event), the run in training.py
(the Poisson batches, each step's σ and clipping norm, the loop over the steps), which takes that
plan, and the record: the plan's event in the model's ledger and the data's own.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.learning import model_io, predictions, training
from mnist_dp.learning.interface import Framework, Network
from mnist_dp.privacy import (
    budgets,
    data_ledger,
    model_file,
    policy,
    provenance,
    statement,
    task_plan,
)
from mnist_dp.privacy.ledger import Ledger, merge, own_runs
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.utils import timing
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted

# substratools configures the "substratools" logger (level from --log-level); log under it.
log = logging.getLogger("substratools.mnist_dp")


def train(framework: Framework, inputs: dict, outputs: dict, hyperparameters_path: Path) -> dict:
    """The substratools `train` function body: data -> model -> DP step -> ledger -> save.

    The task's data gives up its images once their features are made
    (inputs["datasamples"]["images"] is None after): a caller that runs several tasks in one
    process gives each its own data dict. When the data's budget is spent, the input model is
    passed on unchanged.

    Args:
      framework: the algo's Framework.
      inputs: the task's inputs: "datasamples" (the opener's data), and when given "model" (the
        input model file) and "ledger" (the organisation's previous task's ledger output).
      outputs: the task's output paths: "model", "epsilon", and "ledger" when given.
      hyperparameters_path: the hyperparameters file; its folder holds the running code.

    Returns:
      The privacy summary it logged.
    """
    timing.begin_task("train", framework=framework.name)
    model_io.check_outputs_writable(outputs)
    # 1. The data, and the model: the input model, or a seeded start (the same at every
    #    organisation).
    data = inputs["datasamples"]
    hp = hyperparameters.load(hyperparameters_path)
    network = Network.of(hp)
    model, ledger = model_io.load_input_model(framework, inputs, network)
    if model is None:
        model = framework.new_model(hp.seed, network)
    # 2. The budget, the plan, the run and its record (train_in_memory's four phases), recorded
    #    with the data before the model is saved.
    chain = data_ledger.Chain.of(inputs.get("ledger"), data)
    with data_ledger.held(sample_folders(data), chain,
                          passes_on=outputs.get("ledger") is not None) as spent:
        plan, ran = train_in_memory(
            framework, model, ledger, data, hp, str(hyperparameters_path),
            provenance.running_code(Path(hyperparameters_path).parent, "train"),
            f"nothing was saved; lower learning_rate or max_grad_norm in {hyperparameters_path}",
            release_images=True, spent=spent, continuing=bool(inputs.get("model")))
        spent.pass_on(outputs.get("ledger"))
    # the budget of this data is spent: nothing trained, nothing was added to the ledger
    if ran is None:
        log.warning("the input model is passed on unchanged")
        model_file.copy(inputs["model"], outputs["model"])
        summary = statement.privacy_summary(ledger.released(), hp.delta)
        model_io.save_epsilon(outputs["epsilon"], summary["epsilon"])
        timing.end_task("saving", dp=hp.dp)
        return summary
    # 3. Save the model with its ledger, and ε.
    model_file.save(outputs["model"], model_file.ModelFile(framework.name,
                                                           framework.dump_model(model), ledger,
                                                           plan.metadata()))
    summary = statement.privacy_summary(ledger.released(), hp.delta)
    summary["library_epsilon"] = ran.library_epsilon
    model_io.save_epsilon(outputs["epsilon"], summary["epsilon"])
    log.info("trained %d steps, q=%.4g, sigma=%.4g: %s", ran.steps, plan.sampling.sample_rate,
             ran.noise_multiplier, statement.describe(summary))
    if spent.ledger.events:
        log.info("%s", statement.data_spent(spent.ledger, plan.identities, hp.delta,
                                            policy.of_data(data).budgets))
    timing.end_task("saving", dp=hp.dp)
    return summary


def genesis(inputs: dict, outputs: dict) -> None:
    """The substratools `genesis` function body: the first link of the organisation's chain of
    ledger outputs, every run its data samples record, sealed (data_ledger.genesis). On read-only
    data (docker mode, a node) a train or tune task refuses to run without a ledger input; a
    plan's builder gives the organisation's first one this output."""
    timing.begin_task("genesis")
    data = inputs["datasamples"]
    runs = data_ledger.genesis(sample_folders(data), data.get("seal_keys") or {},
                               outputs["ledger"])
    log.info("the organisation's ledger chain starts with the %s its data samples record",
             counted(runs, "run"))
    timing.end_task("genesis")


def sample_folders(data: dict) -> list:
    """The folders of the opener's data samples (none for data made in memory)."""
    return [s["folder"] for s in data["samples"] if s.get("folder")]


def train_in_memory(framework: Framework, model, ledger: Ledger, data: dict, hp: Hyperparameters,
                    where: str, code: dict, if_diverged: str, through=None, release_images=False,
                    spent: data_ledger.Held | None = None, continuing: bool = False,
                    may_stop: bool = True) -> tuple:
    """One training run of `model` (in place) by `framework` on the opener's `data`, after the runs
    of `ledger`, to which its event is added. The substratools train task and the substrafl algos
    (mnist_dp/federated) both train through here.

    Args:
      framework: the algo's Framework.
      model: the framework's model, trained in place.
      ledger: the input model's ledger (empty for a new model); the run's examples and event are
        added to it.
      data: the opener's data (`get_data`'s dict), refused if it holds copies of an example.
      hp: the hyperparameters.
      where: what names the hyperparameters in an error.
      code: the running function's provenance, for the ledger.
      if_diverged: what to do, said when a weight is not finite after training.
      through: as in training.fit.
      release_images: whether `data` is the task's own, read by nothing after this: its images
        then give way to the network's inputs, not to be kept beside them through training.
      spent: the data's own ledger, held (data_ledger.held): the budget holds for all of its runs,
        and the run is recorded in it before this returns.
      continuing: whether the model was received from elsewhere: the data's own ledger's runs, in
        every framework, are then composed into `ledger`.
      may_stop: whether the run may stop early at a budget (a substrafl run may not: refused
        instead). The data owner's policy (privacy/policy.py) holds whatever hp says.

    Returns:
      (the run's TaskPlan, what it Ran), or (TaskPlan, None) when the data's budget is spent and
      nothing ran.
    """
    # 1. The budget: what the data and the input model have spent, and the privacy unit.
    budget = budgets.of_task(framework.name, framework.per_person, ledger, data, hp, spent,
                             continuing)
    # 2. The plan: σ, the steps within the budget (none: the input model is passed on), the noise
    #    of every step.
    plan = task_plan.for_task(framework.name, hp, budget, where, may_stop)
    timing.mark("setup")  # input model, σ calibration, budget
    if plan.sampling.steps == 0:
        return plan, None
    # 3. The run, its batches and noise drawn for its place in the ledger, and 4. its record: the
    #    ledger's event, and the data's own ledger.
    randomness = RunRandomness.for_run(plan.hp.noise_seed, len(ledger.events), plan.identities)
    ran = training.run(framework, model, data, plan, budget.unit, randomness, through,
                       release_images)
    model_io.check_finite(framework, model, f"training diverged in {ran.steps} steps", if_diverged)
    ledger.add(plan.event(ran, code=code))
    if spent is not None:
        spent.record(ledger, ledger.events[-1])
    return plan, ran


def aggregate(framework: Framework, inputs: dict, outputs: dict,
              hyperparameters_path: Path) -> None:
    """The substratools `aggregate` function body: federated averaging. The next global model's
    weights are the mean of the input models' weights, each weighted by its new training run's n,
    its data's public size (an input whose organisation's budget was spent trained nothing and
    weighs 0); its ledger is the union of theirs (merge). Averaging is post-processing: no privacy
    is spent here.

    Args:
      framework: the algo's Framework.
      inputs: the task's inputs: "models", the paths of the input model files.
      outputs: the task's output paths: "model".
      hyperparameters_path: the hyperparameters file; its folder holds the running code.
    """
    timing.begin_task("aggregate", framework=framework.name)
    model_io.check_outputs_writable(outputs)
    paths = inputs.get("models") or []
    if not paths:
        raise UserError("aggregate: no input models; give one or more in the 'models' input")
    saved = [model_file.load(path, framework.name) for path in paths]
    network = Network.of_saved(saved[0])
    for path, other in zip(paths[1:], saved[1:]):
        if Network.of_saved(other) != network or other.hyperparameters[
                "delta"] != saved[0].hyperparameters["delta"]:
            raise UserError(f"{path}: its network or delta differs from {paths[0]}'s; models "
                            "averaged together must share the network and delta")
    ledgers = [s.ledger for s in saved]
    ledger = merge(ledgers)
    # None: that input trained nothing
    added = [runs[-1] if runs else None for runs in own_runs(ledgers)]
    examples = [run.n if run else 0 for run in added]  # public sizes (policy.py)
    models = [model_io.load_weights(framework, s, path, network) for s, path in zip(saved, paths)]
    mean = weighted_mean([framework.weight_arrays(m) for m in models], examples)
    model = framework.set_weight_arrays(models[0], mean)
    # finite inputs: never, but cheap
    model_io.check_finite(framework, model, "aggregate: the average", "nothing was saved")
    timing.mark("averaging")
    model_file.save(outputs["model"], model_file.ModelFile(
        framework=framework.name, weights=framework.dump_model(model), ledger=ledger,
        hyperparameters=model_file.aggregate_metadata(
            [s.hyperparameters
             for s in saved], [run.run_id if run else None for run in added], examples,
            provenance.running_code(Path(hyperparameters_path).parent, "aggregate"))))
    log.info(
        "averaged %d models weighted by their data's public sizes %s: %s", len(saved), examples,
        statement.describe(statement.privacy_summary(ledger.released(),
                                                     saved[0].hyperparameters["delta"])))
    timing.end_task("saving", dp=saved[0].hyperparameters.get("dp"))


def weighted_mean(models: list, weights: list) -> list:
    """Array by array, Σ_k w_k · models[k] / Σ_k w_k (in float64, returned in each array's dtype);
    all weights 0 (no input trained): the plain mean."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.sum() == 0:
        weights = np.ones_like(weights)
    shapes = [[a.shape for a in arrays] for arrays in models]
    if any(s != shapes[0] for s in shapes):
        raise UserError("aggregate: the input models' weights differ in shape; they are not the "
                        "same network")
    return [(sum(w * arrays[i].astype(np.float64) for w,
                 arrays in zip(weights, models)) / weights.sum())
            .astype(models[0][i].dtype) for i in range(len(models[0]))]


def predict(framework: Framework, inputs: dict, outputs: dict) -> None:
    """The substratools `predict` function body.

    Args:
      framework: the algo's Framework.
      inputs: the task's inputs: "model" (the model file's path) and "datasamples" (the opener's
        data, whose images are predicted).
      outputs: the task's output paths: "predictions".
    """
    timing.begin_task("predict", framework=framework.name)
    model_io.check_outputs_writable(outputs)
    saved = model_file.load(inputs["model"], framework.name)
    network = Network.of_saved(saved)
    model = model_io.load_weights(framework, saved, inputs["model"], network)
    timing.mark("loading model")
    # features; compiling
    labels = model_io.predicted_labels(framework, model, inputs["datasamples"]["images"], network)
    timing.mark("predict")
    predictions.save(outputs["predictions"], labels)
    timing.end_task("saving", dp=saved.hyperparameters.get("dp"))
