"""The skeleton every algo asset shares: data -> model -> DP step -> ledger -> save.

An asset supplies only a `Framework` (interface.py: the hooks that build the network and its
optimizer, take one DP or plain step, end the training, give the library's ε and move weights in and
out); the rest lives here, once: the Poisson batches of the sampling plan and the loop over the
steps (train_steps), each step's σ and clipping norm, where the noise's randomness comes from
(randomness.py), and the task functions train, aggregate and predict (models loaded and checked
in model_io.py).
What a run may spend (q, steps, σ, the budget, the DP event) is decided in privacy/
(planning.py, budget.py), which `train` asks once.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.learning import model_io, predictions
from mnist_dp.learning.interface import (
    ClipNorm,
    DpStep,
    EpochCallback,
    Framework,
    Network,
    Ran,
)
from mnist_dp.privacy import budget, data_ledger, model_file, planning, provenance, statement
from mnist_dp.privacy.events import NO_CLIPPING, PER_EXAMPLE
from mnist_dp.privacy.ledger import Ledger, merge, own_runs
from mnist_dp.privacy.planning import SamplingPlan
from mnist_dp.privacy.randomness import REPLAYABLE_WARNING, RunRandomness
from mnist_dp.utils import progress as progress_bars
from mnist_dp.utils import timing
from mnist_dp.utils.errors import UserError

# substratools configures the "substratools" logger (level from --log-level); log under it.
log = logging.getLogger("substratools.mnist_dp")


def sampled_batches(plan: SamplingPlan, hp: Hyperparameters, randomness: RunRandomness,
                    on_epoch: EpochCallback, name: str, progress: bool = True):
    """Yield the index batch of every step of a run, with a progress bar.

    Args:
      plan: the sampling plan: n, q and the number of steps (exactly plan.steps batches).
      hp: the hyperparameters: with dp, Poisson batches; without, `batch_size` shuffled indices.
      randomness: the run's randomness, which draws the batches.
      on_epoch: the progress text after each epoch (ε so far).
      name: the framework's name, in the bar's title.
      progress: whether to draw the bar (not for a search's candidates, whose number is secret).

    Yields:
      int64 index arrays into the training data, one per step.

    With DP, Poisson sampling as the accountant assumes: each example joins each batch independently
    with probability q (batch sizes vary; a batch may be empty and is still a step). The non-private
    baseline takes shuffled batches of `batch_size`. Every framework trains on these batches
    (Opacus' own DPDataLoader runs int(1/q) steps an epoch, one fewer than planned for some q).
    """
    rng = randomness.numpy("batches")
    # Steps are counted here, not by the bar: a bar no terminal sees counts nothing.
    with progress_bars.bar(plan.steps, f"train ({name})", "step", shown=progress) as bar:
        for step in range(1, plan.steps + 1):
            if hp.dp:
                yield np.flatnonzero(rng.random(plan.n) < plan.sample_rate)
            else:
                yield rng.choice(plan.n, size=min(hp.batch_size, plan.n), replace=False)
            bar.update()
            if step == 1:
                timing.mark("first step")  # with the graph's compilation (tf, MindSpore)
            if step % plan.steps_per_epoch == 0 or step == plan.steps:
                bar.set_postfix_str(f"epoch {math.ceil(step / plan.steps_per_epoch)}/{plan.epochs} "
                                    f"{on_epoch(step)}")


def fit(framework: Framework, model, images: np.ndarray, labels: np.ndarray, hp: Hyperparameters,
        plan: SamplingPlan, sigma: float, on_epoch: EpochCallback,
        randomness: RunRandomness | None = None, canaries=None, through=None,
        inputs: np.ndarray | None = None, progress: bool = True) -> Ran:
    """One training run of `framework`.

    Args:
      framework: the algo's Framework (its hooks take the steps).
      model: the framework's model, trained in place.
      images: the training images [n, 28, 28]; may be None when `inputs` is given.
      labels: the training labels [n].
      hp: the hyperparameters.
      plan: the sampling plan (n, q, the steps to run).
      sigma: the gradient noise multiplier of the first steps (0 without DP).
      on_epoch: the progress text after each epoch (ε so far).
      randomness: the run's (default: fresh, or from hp.noise_seed).
      canaries: the white-box audit's (audit.DiracCanaries, or benchmarks/same_noise.py's shared
        noise). A `noise_scale` below 1 is the audit's broken mechanism: the steps add that
        fraction of the noise while the result still says σ.
      through: through(batches, plan), what the batches pass through on their way to the
        framework (substrafl's index generator, which counts them); it must hand on every batch.
      inputs: the network's inputs of `images` when the caller has them (a search's candidates
        share them), else computed here.
      progress: whether to draw the steps' progress bar.

    Returns:
      What ran (Ran): the batch sizes and the library's ε from the framework; σ, the clipping unit
      and where the noise came from, completed here.
    """
    planning.check_secure_mode(framework.name, hp)  # as check_run does, which a caller may skip
    randomness = randomness or RunRandomness.for_run(hp.noise_seed)
    inputs = Network.of(hp).inputs(images) if inputs is None else inputs
    # fixed features: the scattering transform of every image (nothing for pixels)
    timing.mark("features")
    added = sigma if canaries is None else sigma * canaries.noise_scale
    step = DpStep(planning.noise_schedule(hp, plan, added), ClipNorm(hp, plan, randomness),
                  randomness, canaries)
    batches = sampled_batches(plan, hp, randomness, on_epoch, framework.name, progress)
    if through is not None:
        batches = through(batches, plan)
    ran = train_steps(framework, model, inputs, labels, hp, plan, step, batches)
    # the ledger records what ran; the frameworks must all run the plan
    if len(ran.batch_sizes) != plan.steps:
        raise RuntimeError(f"{framework.name} ran {len(ran.batch_sizes)} steps where the plan has "
                           f"{plan.steps}")
    return dataclasses.replace(
        ran, batch_sizes=list(ran.batch_sizes), replayable_noise=randomness.replayable,
        library_epsilon=comparable_library_epsilon(framework.name, ran.library_epsilon),
        noise_multiplier=sigma if hp.dp else 0.0, clipping=PER_EXAMPLE if hp.dp else NO_CLIPPING)


def train_steps(framework: Framework, model, inputs: np.ndarray, labels: np.ndarray,
                hp: Hyperparameters, plan: SamplingPlan, step: DpStep, batches) -> Ran:
    """Train `model` in place, one step of the framework's hooks per index batch.

    With DP, each step runs at the step's clipping norm and σ (step.noise's schedule), and its
    count of unclipped examples goes back to adaptive clipping. Then the weight average takes the
    weights' place, and the library's own ε is asked where it can account the run.

    Args:
      framework: the algo's Framework.
      model: the framework's model, trained in place.
      inputs: the network's inputs [n, ...].
      labels: the labels [n].
      hp: the hyperparameters.
      plan: the sampling plan.
      step: the DP step's settings: noise schedule, clipping norm, randomness, canaries.
      batches: the index batches, one per step (sampled_batches).

    Returns:
      Ran with the batch sizes and the library's ε only (what fit completes).
    """
    optimizer = framework.optimizer(model, hp)
    if hp.dp:
        dp_step = framework.dp_step(model, optimizer, inputs, labels, hp, plan, step)
    else:
        plain_step = framework.plain_step(model, optimizer, inputs, labels)
    batch_sizes = []
    for batch in batches:
        if hp.dp:
            unclipped = dp_step(batch, step.clip.value, step.noise.gradient_sigma(len(batch_sizes)))
            step.clip.update(unclipped, len(batch))  # adaptive clipping's count (a no-op otherwise)
        else:
            plain_step(batch)
        batch_sizes.append(len(batch))
    framework.end_training(model, optimizer, hp)
    library = {}
    if hp.dp and step.library_can_account:
        library = framework.library_epsilon(plan, len(batch_sizes), step.noise.sigma, hp.delta)
    return Ran(batch_sizes, library)


def comparable_library_epsilon(framework_name: str, library_epsilon: dict) -> dict:
    """The DP library's own ε figures that are finite. It is only shown for comparison, and a figure
    that is not a number (MindArmour's monitor at q = 1 gives NaN) compares with nothing and would
    make the ledger unreadable."""
    kept = {}
    for name, value in library_epsilon.items():
        if math.isfinite(value):
            kept[name] = float(value)
        else:
            log.warning("%s: %s gave epsilon = %s for this run; not kept (it is shown only for "
                        "comparison; the ledger's epsilon does not depend on it)", framework_name,
                        name, value)
    return kept


@dataclass
class Trained:
    """A model trained from scratch in memory (benchmarks, audits), and what its training did."""

    model: object
    network: Network
    plan: SamplingPlan
    sigma: float
    ran: Ran  # what the training ran
    seconds: float  # the training itself (features included)


def fit_from_scratch(framework: Framework, images: np.ndarray, labels: np.ndarray,
                     hp: Hyperparameters, where: str) -> Trained:
    """A train task's work without Substra, for benchmarks and audits: the checks, σ (calibrated
    when hp asks), a new model, `fit` (fresh noise unless hp.noise_seed). `framework`: the algo's;
    `images`, `labels`: the training data, [n, 28, 28] and [n]; `where`: what an error names (the
    file or options the hyperparameters came from)."""
    plan = planning.check_run(framework.name, hp, len(labels), where)
    sigma = planning.resolve_noise_multiplier(hp, plan, [])
    network = Network.of(hp)
    model = framework.new_model(hp.seed, network)
    start = time.perf_counter()
    ran = fit(framework, model, images, labels, hp, plan, sigma, lambda steps: "")
    return Trained(model, network, plan, sigma, ran, time.perf_counter() - start)


# What a framework's loader raises on bytes that are not its weights for the network
# (torch's unpickler, np.load, a name or a shape the network lacks); a framework may
# also raise UserError itself.
def train(framework: Framework, inputs: dict, outputs: dict, hyperparameters_path: Path) -> dict:
    """The substratools `train` function body: data -> model -> DP step -> ledger -> save. Returns
    the privacy summary it logged. The task's data gives up its images once their features are made
    (inputs["datasamples"] ["images"] is None after): a caller that runs several tasks in one
    process gives each its own data dict."""
    timing.begin_task("train", framework=framework.name)
    model_io.check_outputs_writable(outputs)
    # 1. Data, and what it may spend (privacy/: q, steps, σ, budget, over the earlier runs of its
    #    examples).
    data = inputs["datasamples"]
    hp = hyperparameters.load(hyperparameters_path)
    plan = check_data(framework, data, hp, str(hyperparameters_path))
    # 2. The model: the input model, or a seeded start (the same at every organisation).
    model, ledger = model_io.load_input_model(framework, inputs, Network.of(hp))
    if model is None:
        model = framework.new_model(hp.seed, Network.of(hp))
    # 3. The DP steps, and 4. the ledger: this run as it ran, recorded with the data before the
    #    model is saved.
    with data_ledger.held(sample_folders(data), inputs.get("ledger")) as spent:
        run, ran = train_in_memory(
            framework, model, ledger, data, hp, plan,
            provenance.running_code(Path(hyperparameters_path).parent, "train"),
            f"nothing was saved; lower learning_rate or max_grad_norm in {hyperparameters_path}",
            release_images=True, spent=spent, continuing=bool(inputs.get("model")))
        spent.pass_on(outputs.get("ledger"))
    # the budget of this data is spent: nothing trained, nothing was added to the ledger
    if ran is None:
        log.warning("the input model is passed on unchanged")
        model_file.copy(inputs["model"], outputs["model"])
        summary = statement.privacy_summary(ledger, hp.delta)
        model_io.save_epsilon(outputs["epsilon"], summary["epsilon"])
        timing.end_task("saving", dp=hp.dp)
        return summary
    # 5. Save the model with its ledger, and ε.
    model_file.save(outputs["model"],
                    model_file.ModelFile(framework.name, framework.dump_model(model), ledger,
                                                           run_settings(
                                                               run.hp, run.sigma, run.plan)))
    summary = statement.privacy_summary(ledger, hp.delta)
    summary["library_epsilon"] = ran.library_epsilon
    model_io.save_epsilon(outputs["epsilon"], summary["epsilon"])
    log.info("trained %d steps, q=%.4g, sigma=%.4g: %s", ran.steps, run.plan.sample_rate,
             ran.noise_multiplier, statement.describe(summary))
    log_data_epsilon(spent.ledger, run.identities, hp.delta)
    timing.end_task("saving", dp=hp.dp)
    return summary


def sample_folders(data: dict) -> list:
    """The folders of the opener's data samples (none for data made in memory)."""
    return [s["folder"] for s in data["samples"] if s.get("folder")]


def log_data_epsilon(spent: Ledger, identities: tuple, delta: float) -> None:
    """Say what the task's data has spent over every run its own ledger records (data_ledger.py)."""
    if spent.events:
        log.info("this data's own ledger: %d run(s) released from it, ε = %.3f at δ = %g over all "
                 "of them", len(spent.events), spent.epsilon(delta, data=identities), delta)


def check_data(framework: Framework, data: dict, hp: Hyperparameters, where: str) -> SamplingPlan:
    """The opener's data (`get_data`'s dict) refused if it holds copies of an example
    (refuse_copies), else the sampling plan of a run of `hp` on it (planning.check_run's checks)."""
    refuse_copies(data)
    return planning.check_run(framework.name, hp, len(data["labels"]), where)


def refuse_copies(data: dict) -> None:
    """Refuse the opener's data if it holds copies of an example: trained twice, it would be
    accounted once."""
    if data.get("copies"):
        raise UserError(data["copies"])


def train_in_memory(framework: Framework, model, ledger: Ledger, data: dict, hp: Hyperparameters,
                    plan: SamplingPlan, code: dict, if_diverged: str, through=None,
                    release_images=False, spent: data_ledger.Held | None = None,
                    continuing: bool = False) -> tuple:
    """One training run of `model` (in place) by `framework` on the opener's `data`, after the runs
    of `ledger`, to which its event is added: (its budget.RunPrivacy, what it Ran), or (RunPrivacy,
    None) when the data's budget is spent and nothing ran. `hp`, `plan`: the hyperparameters and the
    sampling plan check_data made of them; `code`: provenance of the running function;
    `if_diverged`: what to do, when a weight is not finite after training; `through`: as in `fit`;
    `release_images`: the task's own `data`, read by nothing after this: its images give way to the
    network's inputs (a set of 60,000 takes 188 MB in float32, which would stay beside their
    features through training); `spent`: the data's own ledger, held (data_ledger.held): a
    `continuing` run (from a model received from elsewhere) composes its runs of this framework into
    `ledger`, the budget holds for all of its runs, and the run is recorded in it before this
    returns. The substratools train task and the substrafl algos (mnist_dp/federated) both train
    through here."""
    for known in (ledger, spent.ledger if spent is not None else None):
        # only with the organisation's other keys
        if known is not None and known.link(data["samples"]):
            log.info("this organisation's examples named under another of its keys are counted as "
                     "the same examples")
    lacking = data_ledger.absorb(ledger, spent.ledger,
                                 framework.name) if spent is not None and continuing else []
    if lacking:
        log.warning("the input model's ledger lacks %d %s run(s) that this organisation's own "
                    "ledger records on this data (%s): they are composed into this model's ε",
                    len(lacking), framework.name, ", ".join(e.run_id[:8] for e in lacking))
    run = budget.for_task(framework.name, hp, plan, ledger, data["samples"], spent.ledger if spent
                          else None)
    # else the input model, as received, is passed on
    if run.plan.steps == 0 and (lacking or not continuing):
        raise UserError(f"max_epsilon = {hp.max_epsilon}: this data has spent its budget (its own "
                        "ledger of the runs released from it: docs/privacy.md, \"The data's own "
                        "ledger\"); nothing was trained or saved")
    randomness = RunRandomness.for_run(hp.noise_seed, len(ledger.events), run.identities)
    say_notices(framework, hp, randomness)
    timing.mark("setup")  # input model, σ calibration, budget
    if run.plan.steps == 0:
        return run, None
    inputs = Network.of(hp).inputs(data["images"])
    if release_images:
        data["images"] = None
    ran = fit(framework, model, None, data["labels"], hp, run.plan, run.sigma, run.progress,
              randomness, through=through, inputs=inputs)
    timing.mark("training")  # the steps after the first
    model_io.check_finite(framework, model, f"training diverged in {ran.steps} steps", if_diverged)
    ledger.add(run.event(ran, code=code))
    if spent is not None:
        spent.record(ledger, ledger.events[-1])
    return run, ran


def say_notices(framework: Framework, hp: Hyperparameters, randomness: RunRandomness) -> None:
    """Log, once and before any step, what a run of `hp` warns about: replayable noise, and the
    framework's own notices (Framework.notices). A search says them once for all its candidates: a
    line per candidate would count them."""
    if randomness.replayable:
        log.warning("noise_seed = %d: %s", hp.noise_seed, REPLAYABLE_WARNING)
    for notice in getattr(framework, "notices", lambda hp: [])(hp):
        log.warning("%s", notice)


def run_settings(hp: Hyperparameters, sigma: float, plan: SamplingPlan) -> dict:
    """The model file metadata of a model just trained with hyperparameters `hp` at gradient noise
    `sigma` by the sampling plan `plan`: the hyperparameters and the settings it ran with (which
    model_file.load checks against the ledger's last run)."""
    return {**hp.to_json(), "noise_multiplier": sigma, "planned_steps": plan.planned_steps,
            "stopped_by_budget": plan.stopped_by_budget}


def aggregate(framework: Framework, inputs: dict, outputs: dict,
              hyperparameters_path: Path) -> None:
    """The substratools `aggregate` function body: federated averaging. The next global model's
    weights are the mean of the input models' weights, each weighted by the examples of its own new
    training run (an input whose organisation's budget was spent trained nothing and weighs 0); its
    ledger is the union of theirs (merge). Averaging is post-processing: no privacy is spent
    here."""
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
    examples = [run.n if run else 0 for run in added]
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
        "averaged %d models weighted by %s examples: %s", len(saved), examples,
        statement.describe(statement.privacy_summary(ledger, saved[0].hyperparameters["delta"])))
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
    """The substratools `predict` function body."""
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
