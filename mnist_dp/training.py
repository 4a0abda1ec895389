"""The skeleton every algo asset shares: data -> model -> DP step -> ledger -> save.

An asset supplies only a `Framework` (model, weights (de)serialisation, one training run that reports
what it ran, the logits of one batch); everything that decides the privacy figure lives here, once: the
sampling plan (Poisson rate q and the number of steps) and its batches, σ (given or calibrated from a target
ε), where the noise's randomness comes from (randomness.py), δ checks, the clipping unit, the ledger event and ε.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import pickle
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from mnist_dp import atomic, model_file, predictions, privacy, provenance, timing
from mnist_dp import features as feature_maps
from mnist_dp import hyperparameters as hp_file
from mnist_dp.errors import UserError, run_cli
from mnist_dp.privacy import (
    ACCOUNTANT_NAMES,
    NO_CLIPPING,
    NOISE_STAGES,
    PER_EXAMPLE,
    REPORTED_ACCOUNTANT,
    DpEvent,
    Ledger,
    NoiseSchedule,
    calibrate_noise_multiplier,
    check_delta,
    compose_epsilon,
    steps_within_budget,
)
from mnist_dp.randomness import REPLAYABLE_WARNING, RunRandomness

# substratools configures the "substratools" logger (level from --log-level); log under it.
log = logging.getLogger("substratools.mnist_dp")

# The network's input normalisation (MNIST's pixel mean and std), the first layer of every framework's CNN.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
# Images per forward pass at prediction (bounds the memory); a framework may set its own `predict_batch_size`.
PREDICT_BATCH_SIZE = 1024


@dataclass(frozen=True)
class Network:
    """Which network a framework builds: on "pixels" the tutorial CNN with `activation`; on "scattering" a
    linear classifier on the features of mnist_dp/features.py (the inputs the skeleton gives it)."""

    features: str = "pixels"
    activation: str = "tanh"

    @classmethod
    def of(cls, hp: hp_file.Hyperparameters) -> Network:
        return cls(hp.features, hp.activation)

    @classmethod
    def of_saved(cls, saved: model_file.ModelFile) -> Network:
        # Models saved before these options existed: the ReLU CNN on pixels.
        return cls(saved.hyperparameters.get("features", "pixels"), saved.hyperparameters.get("activation", "relu"))

    def inputs(self, images: np.ndarray) -> np.ndarray:
        """Images [N, 28, 28] -> what the network takes: the same, or scattering features [N, 3969]."""
        return feature_maps.transform(images, self.features)


@dataclass(frozen=True)
class SamplingPlan:
    """What one training run will do: `steps` Poisson-sampled batches with probability `sample_rate`."""

    n: int
    steps_per_epoch: int
    epochs: int
    max_steps: int | None = None  # set when the privacy budget stops training early

    @property
    def sample_rate(self) -> float:
        # Same convention as Opacus' DPDataLoader: q = 1 / (batches per epoch), expected batch n*q.
        return 1.0 / self.steps_per_epoch

    @property
    def expected_batch_size(self) -> float:
        """E[B] = n·q: what a DP step divides the noisy sum by (a constant, not the realised size)."""
        return self.n * self.sample_rate

    @property
    def planned_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    @property
    def steps(self) -> int:
        """The steps to run: every epoch's, or fewer if the budget says so (a framework stops there)."""
        return self.planned_steps if self.max_steps is None else min(self.max_steps, self.planned_steps)

    @property
    def stopped_by_budget(self) -> bool:
        return self.steps < self.planned_steps

    @classmethod
    def from_hyperparameters(cls, n: int, hp: hp_file.Hyperparameters, where: str) -> SamplingPlan:
        if hp.batch_size > n:
            raise UserError(f"{where}: batch_size = {hp.batch_size} is larger than the {n} training examples")
        plan = cls(n=n, steps_per_epoch=math.ceil(n / hp.batch_size), epochs=hp.epochs)
        if plan.planned_steps > MAX_STEPS:
            raise UserError(f"{where}: epochs = {hp.epochs} with batch_size = {hp.batch_size} on {n} examples is "
                            f"{plan.planned_steps:,} steps, more than {MAX_STEPS:,}; "
                            "use fewer epochs or larger batches")
        return plan


MAX_STEPS = 1_000_000  # days of training on a CPU; beyond it a typo is likelier than a plan


def noise_schedule(hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float) -> NoiseSchedule:
    """What noise every step of the run adds: σ (the first stage's), the decay, and adaptive clipping's count."""
    if not hp.dp:
        return NoiseSchedule(0.0)
    decay_steps = math.ceil(plan.planned_steps / NOISE_STAGES) if hp.noise_decay < 1 else 0
    count = 2 * count_stddev(hp, plan) if hp.clip_quantile is not None else 0.0  # sensitivity of the count: 1/2
    return NoiseSchedule(sigma, hp.noise_decay, decay_steps, count)


def count_stddev(hp: hp_file.Hyperparameters, plan: SamplingPlan) -> float:
    return privacy.count_stddev(hp.clip_count_stddev, plan.expected_batch_size)


# Frameworks whose DP library has no secure noise generator (secure_mode is refused for them).
NO_SECURE_MODE = {"tf": "TF Privacy offers no secure noise generator; use the torch algo (Opacus secure_mode) "
                        "or set secure_mode to false"}


def check_run(framework: str, hp: hp_file.Hyperparameters, n: int, where: str) -> SamplingPlan:
    """Everything a train task on `n` examples would refuse, checked where the sizes are known: the
    task itself, and the scripts before they register anything."""
    check_delta(hp.delta, n, where=f"{where}: delta")
    if hp.secure_mode and framework in NO_SECURE_MODE:
        raise UserError(f"{where}: secure_mode: {NO_SECURE_MODE[framework]}")
    plan = SamplingPlan.from_hyperparameters(n, hp, where)
    check_noise(hp, plan, where)
    return plan


def check_noise(hp: hp_file.Hyperparameters, plan: SamplingPlan, where: str) -> None:
    """Refuse a step with less noise than privacy.MIN_NOISE_MULTIPLIER (its ε is huge and PLD cannot compute it in
    reasonable time), and a target_epsilon that adaptive clipping's count alone spends (no σ could meet it). A σ
    calibrated from target_epsilon never goes below the floor (calibrate_noise_multiplier)."""
    if not hp.dp:
        return
    floor = privacy.MIN_NOISE_MULTIPLIER
    count = noise_schedule(hp, plan, math.inf).smallest(1)  # infinite gradient noise: the count's alone (or inf)
    if count <= floor:  # the gradient's noise lowers a step's σ below the count's: no room is left
        stddev = "null: E[B] / 20 = " if hp.clip_count_stddev is None else ""
        raise UserError(f"{where}: clip_count_stddev ({stddev}{count_stddev(hp, plan):.3g}) gives adaptive clipping's "
                        f"count a noise multiplier of {count:.3g} (twice the std: the count's sensitivity is 1/2), not "
                        f"above the {floor:g} every step's noise must exceed: a near-noiseless count spends a huge ε; "
                        f"set clip_count_stddev above {floor / 2:g}, or clip_quantile to null")
    if hp.noise_multiplier is not None:
        schedule = noise_schedule(hp, plan, hp.noise_multiplier)
        smallest = schedule.smallest(plan.planned_steps)
        if smallest < floor:
            stages = len(schedule.segments(plan.planned_steps))
            decay = (f" and noise_decay = {hp.noise_decay:g} (σ · {hp.noise_decay:g}^{stages - 1} in the last of "
                     f"{stages} stages)" if schedule.decay_steps and stages > 1 else "")
            count_too = " with the count's noise" if hp.clip_quantile is not None else ""
            raise UserError(f"{where}: noise_multiplier = {hp.noise_multiplier:g}{decay} gives steps an effective "
                            f"noise multiplier of {smallest:.3g}{count_too}, below {floor:g}: such a step spends a "
                            f"huge ε; raise noise_multiplier{' or noise_decay' if decay else ''}")
    else:
        schedule = noise_schedule(hp, plan, 1.0)
        least = privacy.least_sigma(schedule, plan.planned_steps)
        if least > privacy.MAX_NOISE_MULTIPLIER:
            raise UserError(f"{where}: noise_decay = {hp.noise_decay:g} lowers the noise so far that keeping every "
                            f"step's noise multiplier at {floor:g} or more needs σ = {least:.3g} in the first steps, "
                            f"more than {privacy.MAX_NOISE_MULTIPLIER:g}; raise noise_decay (1: constant)")
        privacy.check_target_reachable(hp.target_epsilon, hp.delta, plan.sample_rate, plan.planned_steps, schedule,
                                       where=where)


@dataclass
class Ran:
    """What a framework's `fit` really ran, as only the framework knows it (it must report, not assume)."""

    batch_sizes: list  # examples in each step really taken: one entry per step
    library_epsilon: dict = field(default_factory=dict)  # the DP library's own ε for this run, for comparison
    # Only when the effective σ per example is not the σ the framework was given (a library clipping
    # microbatches of m > 1 examples: σ/2); None means the given σ.
    noise_multiplier: float | None = None


@dataclass
class FitResult:
    """What a training run did: the framework's `Ran` with what the skeleton decided (q, clipping unit)."""

    steps: int
    sample_rate: float
    noise_multiplier: float  # effective σ per example (σ/2 for microbatch clipping)
    clipping: str
    library_epsilon: dict = field(default_factory=dict)  # the DP library's own figure, for comparison
    batch_sizes: list = field(default_factory=list)  # examples in each step really taken
    replayable_noise: bool = False  # batches and noise from noise_seed (randomness.py), not fresh entropy


# Called after each epoch with the number of steps run so far; returns a short progress text (ε so far) for
# the progress bar.
EpochCallback = Callable[[int], str]


class Framework(Protocol):
    name: str

    def new_model(self, seed: int, network: Network): ...

    def load_model(self, weights: bytes, network: Network): ...

    def dump_model(self, model) -> bytes: ...

    def fit(self, model, images: np.ndarray, labels: np.ndarray, hp: hp_file.Hyperparameters,
            plan: SamplingPlan, step: DpStep, batches: Iterable) -> Ran:
        """Train `model` in place, one step per index batch of `batches` (exactly plan.steps of them), with
        DP-SGD if hp.dp as `step` says (see DpStep). Called through the skeleton's `fit` (below), which draws
        the batches and adds q and the clipping unit."""

    def batch_logits(self, model, images: np.ndarray) -> np.ndarray:
        """Class scores [B, 10] (before softmax) of one batch of inputs (images [B, 28, 28], or features
        [B, 3969] for a network on scattering features); `predict_in_batches`
        calls it with `predict_batch_size` images (a framework's own attribute, else PREDICT_BATCH_SIZE)."""

    def weight_arrays(self, model) -> list:
        """Every weight of the model, as numpy arrays in a fixed order (federated averaging, tests)."""

    def set_weight_arrays(self, model, arrays: list):
        """The model with its weights replaced by `arrays` (the order of `weight_arrays`); returns it."""


def flat_weights(framework: Framework, model) -> np.ndarray:
    """All weights in one vector (the mechanism tests measure updates with it)."""
    return np.concatenate([a.ravel() for a in framework.weight_arrays(model)])


@dataclass
class DpStep:
    """What the privacy mechanism of every step uses, as the skeleton decided it. Step t (0-based) adds Gaussian
    noise of std noise.gradient_sigma(t) · clip.value to the sum of the examples' gradients clipped to clip.value,
    drawn from a generator the framework seeds from randomness.words("gradient noise", ...), divides by
    plan.expected_batch_size, and then reports its count of unclipped examples to clip.update (adaptive clipping;
    a no-op otherwise). Without DP: σ = 0 and nothing is clipped."""

    noise: NoiseSchedule
    clip: ClipNorm
    randomness: RunRandomness


class ClipNorm:
    """The clipping norm C of every step: max_grad_norm throughout, or with clip_quantile adaptive clipping
    (Andrew et al. 2021, as Opacus' AdaClipDPOptimizer and TF Privacy's quantile-adaptive query): after each
    step C ← C · exp(-rate · (b̃ - quantile)), b̃ the noisy fraction of the batch whose gradient norm was at
    most C. The count is released with noise N(0, s²) on Σ_i (1[‖g_i‖ ≤ C] - 1/2), sensitivity 1/2, which the
    ledger's count_noise_multiplier = 2s accounts for; its noise is drawn here, for every framework."""

    def __init__(self, hp: hp_file.Hyperparameters, plan: SamplingPlan, randomness: RunRandomness):
        self.value = float(hp.max_grad_norm)
        self.adaptive = hp.dp and hp.clip_quantile is not None
        self.quantile, self.rate = hp.clip_quantile, hp.clip_learning_rate
        self.stddev = count_stddev(hp, plan)
        self.expected_batch_size = plan.expected_batch_size
        self.rng = randomness.numpy("count noise")

    def update(self, unclipped: int, batch_size: int) -> None:
        """After a step on `batch_size` examples of which `unclipped` had a gradient norm ≤ C."""
        if not self.adaptive:
            return
        noisy = unclipped - batch_size / 2 + self.rng.normal(0.0, self.stddev)
        fraction = noisy / self.expected_batch_size + 0.5  # the expected, not the realised, batch size
        self.value *= math.exp(-self.rate * (fraction - self.quantile))


def sampled_batches(plan: SamplingPlan, hp: hp_file.Hyperparameters, randomness: RunRandomness,
                    on_epoch: EpochCallback, name: str):
    """Yield the index batch of every step of a run (exactly plan.steps), with a progress bar.

    With DP, Poisson sampling as the accountant assumes: each example joins each batch independently
    with probability q (batch sizes vary; a batch may be empty and is still a step). The non-private
    baseline takes shuffled batches of `batch_size`. Every framework trains on these batches (Opacus' own
    DPDataLoader runs int(1/q) steps an epoch, one fewer than planned for some q).
    """
    from tqdm import tqdm

    rng = randomness.numpy("batches")
    # Steps are counted here, not by the bar: a bar without a terminal (a Substra task) counts nothing.
    with tqdm(total=plan.steps, desc=f"train ({name})", unit="step", disable=None) as bar:
        for step in range(1, plan.steps + 1):
            if hp.dp:
                yield np.flatnonzero(rng.random(plan.n) < plan.sample_rate)
            else:
                yield rng.choice(plan.n, size=min(hp.batch_size, plan.n), replace=False)
            bar.update()
            if step == 1:
                timing.mark("first step")  # with the graph's compilation (tf, MindSpore)
            if step % plan.steps_per_epoch == 0 or step == plan.steps:
                bar.set_postfix_str(f"epoch {math.ceil(step / plan.steps_per_epoch)}/{plan.epochs} {on_epoch(step)}")


def fit(framework: Framework, model, images: np.ndarray, labels: np.ndarray, hp: hp_file.Hyperparameters,
        plan: SamplingPlan, sigma: float, on_epoch: EpochCallback, randomness: RunRandomness | None = None
        ) -> FitResult:
    """One training run of `framework` (model trained in place), and what it did: the steps and batch
    sizes it ran and its library's ε from the framework, q and the clipping unit from here. `randomness`:
    the run's (default: fresh, or from hp.noise_seed)."""
    randomness = randomness or RunRandomness.for_run(hp.noise_seed)
    inputs = Network.of(hp).inputs(images)
    timing.mark("features")  # fixed features: the scattering transform of every image (nothing for pixels)
    step = DpStep(noise_schedule(hp, plan, sigma), ClipNorm(hp, plan, randomness), randomness)
    batches = sampled_batches(plan, hp, randomness, on_epoch, framework.name)
    ran = framework.fit(model, inputs, labels, hp, plan, step, batches)
    if len(ran.batch_sizes) != plan.steps:  # the ledger records what ran; the frameworks must all run the plan
        raise RuntimeError(f"{framework.name} ran {len(ran.batch_sizes)} steps where the plan has {plan.steps}")
    if hp.dp:
        clipping, noise_multiplier = PER_EXAMPLE, sigma if ran.noise_multiplier is None else ran.noise_multiplier
    else:
        clipping, noise_multiplier = NO_CLIPPING, 0.0
    return FitResult(len(ran.batch_sizes), plan.sample_rate, noise_multiplier, clipping,
                     comparable_library_epsilon(framework.name, ran.library_epsilon), list(ran.batch_sizes),
                     randomness.replayable)


def comparable_library_epsilon(framework_name: str, library_epsilon: dict) -> dict:
    """The DP library's own ε figures that are finite. It is only shown for comparison, and a figure that is not
    a number (MindArmour's monitor at q = 1 gives NaN) compares with nothing and would make the ledger unreadable."""
    kept = {}
    for name, value in library_epsilon.items():
        if math.isfinite(value):
            kept[name] = float(value)
        else:
            log.warning("%s: %s gave epsilon = %s for this run; not kept (it is shown only for comparison; the "
                        "ledger's epsilon does not depend on it)", framework_name, name, value)
    return kept


@dataclass
class Trained:
    """A model trained from scratch in memory (benchmarks, audits), and what its training did."""

    model: object
    network: Network
    plan: SamplingPlan
    sigma: float
    result: FitResult
    seconds: float  # the training itself (features included)


def fit_from_scratch(framework: Framework, images: np.ndarray, labels: np.ndarray, hp: hp_file.Hyperparameters,
                     where: str) -> Trained:
    """A train task's work without Substra: the checks, σ (calibrated when hp asks), a new model, `fit` (fresh
    noise unless hp.noise_seed)."""
    plan = check_run(framework.name, hp, len(labels), where)
    sigma = resolve_noise_multiplier(hp, plan, [])
    network = Network.of(hp)
    model = framework.new_model(hp.seed, network)
    start = time.perf_counter()
    result = fit(framework, model, images, labels, hp, plan, sigma, lambda steps: "")
    return Trained(model, network, plan, sigma, result, time.perf_counter() - start)


def dp_event(framework_name: str, data: tuple, hp: hp_file.Hyperparameters, plan: SamplingPlan, result: FitResult,
             code: dict | None = None) -> DpEvent:
    """The ledger event of a run: what it did (`result`) on `data` (sample identities), as `plan` and `hp` asked."""
    return dataclasses.replace(
        run_event(framework_name, data, hp, plan, result.noise_multiplier, result.steps),
        run_id=privacy.new_run_id(),
        clipping=result.clipping,
        sample_rate=result.sample_rate,
        library_epsilon=tuple(sorted(result.library_epsilon.items())),
        batch_size=hp.batch_size,
        planned_steps=plan.planned_steps,
        code=code,
        replayable_noise=result.replayable_noise,
    )


def run_event(framework_name: str, data: tuple, hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float,
              steps: int) -> DpEvent:
    """The ledger event of `steps` steps of this run at gradient noise σ (schedule and count noise from hp)."""
    schedule = noise_schedule(hp, plan, sigma)
    return DpEvent(framework_name, data, plan.n, plan.sample_rate, sigma, steps,
                   PER_EXAMPLE if hp.dp else NO_CLIPPING, hp.max_grad_norm, noise_decay=schedule.noise_decay,
                   decay_steps=schedule.decay_steps, count_noise_multiplier=schedule.count_noise_multiplier)


# What a framework's loader raises on bytes that are not its weights for the network (torch's unpickler, np.load,
# a name or a shape the network lacks); a framework may also raise UserError itself.
_NOT_WEIGHTS = (UserError, pickle.UnpicklingError, EOFError, RuntimeError, ValueError, KeyError, TypeError, OSError,
                zipfile.BadZipFile)


def load_weights(framework: Framework, saved: model_file.ModelFile, path, network: Network):
    """The model of the weights of the model file at `path` (read as `saved`). Weights that are not the framework's
    for `network`, or not finite, are refused naming the file: its digests only say it was not edited since."""
    try:
        model = framework.load_model(saved.weights, network)
    except _NOT_WEIGHTS as exc:
        # Its first sentence: torch's unpickler goes on for lines about torch.load's options.
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "").split(". ")[0][:150]
        detail = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        raise UserError(f"{path}: its weights cannot be loaded into this {framework.name} network ({detail}); the "
                        f"file was not written by this bundle's {framework.name} algo: use one it trained") from None
    check_finite(framework, model, str(path), "its training diverged: use another model, or train again with a "
                                              "lower learning_rate or max_grad_norm")
    return model


def check_finite(framework: Framework, model, where: str, todo: str) -> None:
    """No model with a NaN or infinite weight is saved or used: a diverged run must fail, not pass on garbage."""
    arrays = [np.asarray(a) for a in framework.weight_arrays(model)]
    bad = sum(a.size - int(np.count_nonzero(np.isfinite(a))) for a in arrays)
    if bad:
        raise UserError(f"{where}: {bad} of the model's {sum(a.size for a in arrays)} weights are NaN or infinite; "
                        f"{todo}")


def _load_input_model(framework: Framework, inputs: dict, network: Network):
    if inputs.get("model"):
        saved = model_file.load(inputs["model"], framework.name)
        if Network.of_saved(saved) != network:
            theirs = Network.of_saved(saved)
            raise UserError(f"input model: its network has features {theirs.features!r} and activation "
                            f"{theirs.activation!r}, the hyperparameters say {network.features!r} and "
                            f"{network.activation!r}; set them as the input model's")
        log.info("continuing from input model: %d earlier training run(s) in its ledger", len(saved.ledger.events))
        return load_weights(framework, saved, inputs["model"], network), saved.ledger
    return None, Ledger()


def resolve_noise_multiplier(hp: hp_file.Hyperparameters, plan: SamplingPlan, prior: list) -> float:
    if not hp.dp:
        return 0.0
    if hp.noise_multiplier is not None:
        return float(hp.noise_multiplier)
    sigma = calibrate_noise_multiplier(hp.target_epsilon, hp.delta, plan.sample_rate, plan.steps, prior,
                                       schedule=noise_schedule(hp, plan, 1.0))
    log.info("calibrated noise_multiplier = %.4f for target epsilon %.3g at delta %.1e", sigma, hp.target_epsilon,
             hp.delta)
    return sigma


def noise_for_rounds(hp: hp_file.Hyperparameters, sizes: list, rounds: int) -> hp_file.Hyperparameters:
    """Fix σ for a plan that trains on the same data `rounds` times.

    A train task calibrates σ from target_epsilon for its own run; in round 2 its data's budget is already
    spent. So with several rounds σ is calibrated here, once, so that every organisation's data (of the
    given `sizes`) ends at or below target_epsilon after the last round; the tasks get that σ.
    """
    if not hp.dp or hp.target_epsilon is None or rounds == 1:
        return hp
    sigmas = []
    for n in sizes:
        plan = SamplingPlan.from_hyperparameters(n, hp, "hyperparameters")
        check_noise(hp, plan, "hyperparameters")  # before the accountant runs on it
        sigmas.append(calibrate_noise_multiplier(hp.target_epsilon, hp.delta, plan.sample_rate, plan.steps,
                                                 schedule=noise_schedule(hp, plan, 1.0), repeats=rounds))
    return dataclasses.replace(hp, noise_multiplier=max(sigmas), target_epsilon=None)


def check_plan(framework: str, hp: hp_file.Hyperparameters, sizes: list, rounds: int,
               wheres: list) -> hp_file.Hyperparameters:
    """What the train tasks of a plan would refuse, checked before anything is registered: each organisation's run
    (check_run: `sizes[k]` examples, errors named `wheres[k]`), and a max_epsilon below the ε of its first step, with
    σ as the tasks will get it (noise_for_rounds for several rounds). Returns the hyperparameters the tasks get."""
    plans = [check_run(framework, hp, n, where) for n, where in zip(sizes, wheres)]
    hp = noise_for_rounds(hp, sizes, rounds)
    if hp.dp and hp.max_epsilon is not None:
        for plan, where in zip(plans, wheres):  # each organisation's first task starts on fresh data
            check_first_step(framework, hp, plan, resolve_noise_multiplier(hp, plan, []), where)
    return hp


def check_first_step(name: str, hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float, where: str = "") -> None:
    """Refuse a max_epsilon below the ε of a single step of this run at σ (no earlier run on its data): it could
    not train at all. The scripts check it up front (check_plan), a train task again (apply_budget)."""
    one_step = compose_epsilon([run_event(name, (), hp, plan, sigma, 1)], hp.delta)
    if one_step > hp.max_epsilon:
        raise UserError(f"{where + ': ' if where else ''}max_epsilon = {hp.max_epsilon} is below the ε of a single "
                        f"step ({one_step:.3f} at δ = {hp.delta:g}); raise max_epsilon or the noise")


def apply_budget(name: str, identities: tuple, hp: hp_file.Hyperparameters, plan: SamplingPlan, sigma: float,
                 prior: list) -> SamplingPlan:
    """With max_epsilon: the plan cut at the last step that keeps ε (prior runs on this data included)
    within budget; 0 steps when the prior runs spent it (the train task passes its input model on); refuses
    a budget below a single step's ε."""
    if not hp.dp or hp.max_epsilon is None:
        return plan
    run = run_event(name, identities, hp, plan, sigma, plan.steps)
    allowed = steps_within_budget(prior, run, hp.delta, hp.max_epsilon)
    if allowed == 0 and not prior:
        check_first_step(name, hp, plan, sigma)  # not even one step fits: it raises
    if allowed == 0:
        log.warning("privacy budget spent: the input model's ε on this data is already %.3f at delta = %g and one "
                    "more step would exceed max_epsilon = %g; no training, the input model is passed on unchanged",
                    compose_epsilon(prior, hp.delta), hp.delta, hp.max_epsilon)
    elif allowed < plan.steps:
        log.warning("privacy budget: stopping after %d of %d steps (max_epsilon = %g at delta = %g)",
                    allowed, plan.steps, hp.max_epsilon, hp.delta)
    return dataclasses.replace(plan, max_steps=allowed)


def train(framework: Framework, inputs: dict, outputs: dict, hyperparameters_path: Path) -> dict:
    """The substratools `train` function body. Returns the privacy summary it logged."""
    timing.begin_task("train", framework=framework.name)
    check_outputs_writable(outputs)
    data = inputs["datasamples"]
    if data.get("copies"):  # the opener found an example twice: trained twice, it would be accounted once
        raise UserError(data["copies"])
    images, labels = data["images"], data["labels"]
    identities = tuple(s["identity"] for s in data["samples"])
    hp = hp_file.load(hyperparameters_path)
    plan = check_run(framework.name, hp, len(labels), str(hyperparameters_path))

    model, ledger = _load_input_model(framework, inputs, Network.of(hp))
    if model is None:
        model = framework.new_model(hp.seed, Network.of(hp))  # the same seeded start at every organisation
    randomness = RunRandomness.for_run(hp.noise_seed, len(ledger.events), identities)
    if randomness.replayable:
        log.warning("noise_seed = %d: %s", hp.noise_seed, REPLAYABLE_WARNING)
    ledger.add_examples({s["identity"]: privacy.Examples.of(s["key"], s["examples"]) for s in data["samples"]})
    # The earlier runs of each example of this data (usually one list; several when the input model trained on
    # overlapping parts of it): σ, the budget and the progress hold for the worst of them.
    histories = ledger.histories(identities)
    sigma = max(resolve_noise_multiplier(hp, plan, prior) for prior in histories)
    plan = min((apply_budget(framework.name, identities, hp, plan, sigma, prior) for prior in histories),
               key=lambda cut: cut.steps)
    timing.mark("setup")  # input model, σ calibration, budget
    if plan.steps == 0:  # the budget of this data is spent: nothing trains, nothing is added to the ledger
        model_file.copy(inputs["model"], outputs["model"])
        summary = privacy_summary(ledger, hp.delta)
        _save_epsilon(outputs["epsilon"], summary["epsilon"])
        timing.end_task("saving", dp=hp.dp)
        return summary

    def on_epoch(steps_done: int) -> str:
        if not hp.dp:
            return "no DP"
        partial = run_event(framework.name, identities, hp, plan, sigma, steps_done)
        eps = max(compose_epsilon(prior + [partial], hp.delta, "rdp") for prior in histories)  # RDP: fast enough
        return f"ε(RDP)={eps:.2f} δ={hp.delta:g}"

    result = fit(framework, model, images, labels, hp, plan, sigma, on_epoch, randomness)
    timing.mark("training")  # the steps after the first
    check_finite(framework, model, f"training diverged in {result.steps} steps",
                 f"nothing was saved; lower learning_rate or max_grad_norm in {hyperparameters_path}")
    ledger.add(dp_event(framework.name, identities, hp, plan, result,
                        code=provenance.running_code(Path(hyperparameters_path).parent, "train")))
    model_file.save(outputs["model"], model_file.ModelFile(
        framework=framework.name,
        weights=framework.dump_model(model),
        ledger=ledger,
        hyperparameters={**hp.to_json(), "noise_multiplier": sigma, "planned_steps": plan.planned_steps,
                         "stopped_by_budget": plan.stopped_by_budget},
    ))
    summary = privacy_summary(ledger, hp.delta)
    summary["library_epsilon"] = result.library_epsilon
    _save_epsilon(outputs["epsilon"], summary["epsilon"])
    log.info("trained %d steps, q=%.4g, sigma=%.4g: %s", result.steps, result.sample_rate, result.noise_multiplier,
             describe(summary))
    timing.end_task("saving", dp=hp.dp)
    return summary


def aggregate(framework: Framework, inputs: dict, outputs: dict, hyperparameters_path: Path) -> None:
    """The substratools `aggregate` function body: federated averaging. The next global model's weights are the
    mean of the input models' weights, each weighted by the examples of its own new training run (an input whose
    organisation's budget was spent trained nothing and weighs 0); its ledger is the union of theirs
    (privacy.merge). Averaging is post-processing: no privacy is spent here."""
    timing.begin_task("aggregate", framework=framework.name)
    check_outputs_writable(outputs)
    paths = inputs.get("models") or []
    if not paths:
        raise UserError("aggregate: no input models; give one or more in the 'models' input")
    saved = [model_file.load(path, framework.name) for path in paths]
    network = Network.of_saved(saved[0])
    for path, other in zip(paths[1:], saved[1:]):
        if Network.of_saved(other) != network or other.hyperparameters["delta"] != saved[0].hyperparameters["delta"]:
            raise UserError(f"{path}: its network or delta differs from {paths[0]}'s; models averaged together must "
                            "share the network and delta")
    ledgers = [s.ledger for s in saved]
    ledger = privacy.merge(ledgers)
    added = [runs[-1] if runs else None for runs in privacy.own_runs(ledgers)]  # None: that input trained nothing
    examples = [run.n if run else 0 for run in added]
    models = [load_weights(framework, s, path, network) for s, path in zip(saved, paths)]
    mean = weighted_mean([framework.weight_arrays(m) for m in models], examples)
    model = framework.set_weight_arrays(models[0], mean)
    check_finite(framework, model, "aggregate: the average", "nothing was saved")  # finite inputs: never, but cheap
    timing.mark("averaging")
    model_file.save(outputs["model"], model_file.ModelFile(
        framework=framework.name, weights=framework.dump_model(model), ledger=ledger,
        hyperparameters=model_file.aggregate_metadata(
            [s.hyperparameters for s in saved], [run.run_id if run else None for run in added], examples,
            provenance.running_code(Path(hyperparameters_path).parent, "aggregate"))))
    log.info("averaged %d models weighted by %s examples: %s", len(saved), examples,
             describe(privacy_summary(ledger, saved[0].hyperparameters["delta"])))
    timing.end_task("saving", dp=saved[0].hyperparameters.get("dp"))


def weighted_mean(models: list, weights: list) -> list:
    """Array by array, Σ_k w_k · models[k] / Σ_k w_k (in float64, returned in each array's dtype); all weights 0
    (no input trained): the plain mean."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.sum() == 0:
        weights = np.ones_like(weights)
    shapes = [[a.shape for a in arrays] for arrays in models]
    if any(s != shapes[0] for s in shapes):
        raise UserError("aggregate: the input models' weights differ in shape; they are not the same network")
    return [(sum(w * arrays[i].astype(np.float64) for w, arrays in zip(weights, models)) / weights.sum())
            .astype(models[0][i].dtype) for i in range(len(models[0]))]


def predict(framework: Framework, inputs: dict, outputs: dict) -> None:
    """The substratools `predict` function body."""
    timing.begin_task("predict", framework=framework.name)
    check_outputs_writable(outputs)
    saved = model_file.load(inputs["model"], framework.name)
    network = Network.of_saved(saved)
    model = load_weights(framework, saved, inputs["model"], network)
    timing.mark("loading model")
    labels = predicted_labels(framework, model, inputs["datasamples"]["images"], network)  # features; compiling
    timing.mark("predict")
    predictions.save(outputs["predictions"], labels)
    timing.end_task("saving", dp=saved.hyperparameters.get("dp"))


def predict_in_batches(framework: Framework, model, images: np.ndarray, network: Network) -> np.ndarray:
    """Class scores [N, 10] (before softmax) of images [N, 28, 28]; the predicted label is their argmax."""
    batch_size = getattr(framework, "predict_batch_size", PREDICT_BATCH_SIZE)
    inputs = network.inputs(images)
    return np.concatenate([framework.batch_logits(model, inputs[i : i + batch_size])
                           for i in range(0, len(inputs), batch_size)])


def predicted_labels(framework: Framework, model, images: np.ndarray, network: Network) -> np.ndarray:
    return np.argmax(predict_in_batches(framework, model, images, network), axis=1).astype(np.int64)


def run_functions(framework: Framework, hyperparameters_path: Path) -> None:
    """An algo asset's command line: register its substratools functions `train`, `predict` and `aggregate`
    (the contract's names) and run the one asked for. Registering only here keeps several algo modules
    importable in one process (substratools' registry is global)."""
    import substratools as tools

    def train_function(inputs, outputs, task_properties):
        train(framework, inputs, outputs, hyperparameters_path)

    def predict_function(inputs, outputs, task_properties):
        predict(framework, inputs, outputs)

    def aggregate_function(inputs, outputs, task_properties):
        aggregate(framework, inputs, outputs, hyperparameters_path)

    for function, name in ((train_function, "train"), (predict_function, "predict"), (aggregate_function, "aggregate")):
        function.__name__ = name  # substratools logs it
        tools.register(function, name)
    run_cli(tools.execute, task=True)


def check_outputs_writable(outputs: dict) -> None:
    """Fail before the work, not after it: every output path must be a file we can create."""
    for identifier, path in outputs.items():
        path = Path(path)
        if path.is_dir():
            raise UserError(f"output {identifier!r}: {path} is a folder; give a file path")
        if not path.parent.is_dir():
            raise UserError(f"output {identifier!r}: folder {path.parent} does not exist")
        if not os.access(path.parent, os.W_OK | os.X_OK):  # a read-only mount, permissions
            raise UserError(f"output {identifier!r}: folder {path.parent} is not writable; make it writable or "
                            "choose another path")


def privacy_summary(ledger: Ledger, delta: float) -> dict:
    return {
        "epsilon": ledger.epsilon(delta, REPORTED_ACCOUNTANT),
        "epsilon_rdp": ledger.epsilon(delta, "rdp"),
        "delta": delta,
        "accountant": ACCOUNTANT_NAMES[REPORTED_ACCOUNTANT],
    }


def describe(summary: dict) -> str:
    text = (f"ε = {summary['epsilon']:.3f} at δ = {summary['delta']:g} ({summary['accountant']}; "
            f"RDP {summary['epsilon_rdp']:.3f})")
    for name, value in summary.get("library_epsilon", {}).items():
        text += f"; {name}: {value:.3f}"
    return text


def _save_epsilon(path, epsilon: float) -> None:
    # Substra's performance file (a non-private model's ε = inf is JSON's non-standard `Infinity`).
    atomic.write_performance(path, float(epsilon))
