"""One training run, the same in every framework: the Poisson batches of its plan
(sampled_batches), the mechanism's settings each DP step applies (DpStep: the noise schedule, the
clipping norm C, adaptive clipping's noisy count in ClipNorm, the randomness), and the loop over the
steps (train_steps), which calls the framework's hooks (interface.Framework). `fit` is one run of a
plan (privacy/task_plan.py): a train task's (skeleton.train_in_memory), a search candidate's, or a
benchmark's (fit_from_scratch).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.learning.interface import EpochCallback, Framework, Network, Ran
from mnist_dp.privacy import task_plan
from mnist_dp.privacy.events import NO_CLIPPING, NoiseSchedule
from mnist_dp.privacy.randomness import REPLAYABLE_WARNING, RunRandomness, standard_normal
from mnist_dp.privacy.task_plan import TaskPlan
from mnist_dp.privacy.units import IMAGE, BatchPersons, PrivacyUnit
from mnist_dp.privacy.units import of as units_of
from mnist_dp.utils import progress as progress_bars
from mnist_dp.utils import timing

# substratools configures the "substratools" logger (level from --log-level); log under it.
log = logging.getLogger("substratools.mnist_dp")


@dataclass
class DpStep:
    """What the privacy mechanism of every step uses, as the run's plan decided it. Step t (0-based)
    adds Gaussian noise of std sigma_at(t) · clip.value to the sum of the examples' gradients
    clipped to clip.value, drawn from the run's "gradient noise" stream (a generator whose
    whole state comes from randomness), divides by the plan's expected batch size, and then reports
    its count of unclipped examples to clip.update (adaptive clipping; a no-op otherwise). Without
    DP: σ = 0 and nothing is clipped.

    `canaries`: the benchmarks' only: the white-box audit's (mnist_dp/privacy/audit.py,
    benchmarks/audit.py --white-box) and benchmarks/same_noise.py's shared noise; the skeleton's
    `train` never sets it. When set, a framework passes each step's clipped sum through
    `with_canaries` between the clipping and the noise, and the steps add canaries.noise_scale of
    the noise (below 1: the audit's broken mechanism, whose ledger still says σ)."""

    noise: NoiseSchedule
    clip: ClipNorm
    randomness: RunRandomness
    canaries: object | None = None  # an audit.DiracCanaries
    unit: PrivacyUnit = IMAGE  # bound to the run's data (units.of)

    def units_in(self, batch: np.ndarray) -> int:
        """The privacy units in an index batch: its examples, or its persons."""
        return self.unit.in_batch(batch)

    @property
    def persons(self) -> np.ndarray | None:
        """Each example's person, an index 0..P-1 (examples.persons_of), when the unit is a
        person; else None."""
        return self.unit.groups

    @property
    def expected_batch_size(self) -> float:
        """E[B], which divides each step's noisy sum (the plan's, as adaptive clipping's count
        reads it)."""
        return self.clip.expected_batch_size

    @property
    def secure_mode(self) -> bool:
        """Whether the noise is drawn as Opacus' secure_mode draws it (hyperparameter
        secure_mode)."""
        return self.clip.secure

    def persons_in(self, batch: np.ndarray) -> BatchPersons | None:
        """The persons of an index batch, as a framework's DP step takes them; None per example."""
        return self.unit.group(batch)

    @property
    def noise_scale(self) -> float:
        return 1.0 if self.canaries is None else self.canaries.noise_scale

    @property
    def sigma(self) -> float:
        """The noise multiplier the first steps add."""
        return self.noise.sigma * self.noise_scale

    def sigma_at(self, step: int) -> float:
        """The noise multiplier step `step` (0-based) adds."""
        return self.noise.gradient_sigma(step) * self.noise_scale

    def with_canaries(self, clipped_sum: list) -> list:
        """This step's clipped sum (numpy arrays in the order of the framework's `weight_arrays`)
        with the audit's canaries added, before the noise."""
        return self.canaries.before_noise(clipped_sum, self.clip.value)

    @property
    def canary_hook(self):
        """`with_canaries` when the audit set canaries, else None: what a framework's make_dp_step
        takes."""
        return self.with_canaries if self.canaries is not None else None

    @property
    def library_can_account(self) -> bool:
        """Whether a DP library's own accountant can account this run, for comparison with ours: a
        constant σ > 0 and no count noise (none knows a schedule or adaptive clipping's count; none
        has an ε without noise)."""
        noise = self.noise
        return self.sigma > 0 and not noise.decay_steps and not noise.count_noise_multiplier


MAX_EXPONENT = math.log(float.fromhex("0x1.fffffffffffffp+1023"))  # exp of more overflows


class ClipNorm:
    """The clipping norm C of every step: max_grad_norm throughout, or with clip_quantile adaptive
    clipping (Andrew et al. 2021, as Opacus' AdaClipDPOptimizer and TF Privacy's quantile-adaptive
    query): after each step C ← C · exp(-rate · (b̃ - quantile)), b̃ the noisy fraction of the batch
    whose gradient norm was at most C. The count is released with noise N(0, s²) on Σ_i (1[‖g_i‖ ≤
    C] - 1/2), sensitivity 1/2, which the ledger's count_noise_multiplier = 2s accounts for; its
    noise is drawn here, for every framework."""

    def __init__(self, plan: TaskPlan, randomness: RunRandomness):
        hp = plan.hp
        self.value = float(hp.max_grad_norm)
        self.adaptive = hp.dp and hp.clip_quantile is not None
        self.quantile, self.rate = hp.clip_quantile, hp.clip_learning_rate
        self.stddev = plan.count_stddev
        self.expected_batch_size = plan.sampling.expected_batch_size
        self.rng = randomness.numpy("count noise")
        self.secure = hp.secure_mode

    def count_noise(self) -> float:
        """One draw of N(0, s²), as Opacus' secure_mode draws the noise when secure_mode is on."""
        return float(self.stddev * standard_normal(self.rng, secure=self.secure))

    def update(self, unclipped: int, batch_size: int) -> None:
        """After a step on `batch_size` examples of which `unclipped` had a gradient norm ≤ C."""
        if not self.adaptive:
            return
        noisy = unclipped - batch_size / 2 + self.count_noise()
        # the expected, not the realised, batch size
        fraction = noisy / self.expected_batch_size + 0.5
        exponent = -self.rate * (fraction - self.quantile)
        # Past the float range the run has diverged: an infinite C (no clipping, infinite noise)
        # makes the weights say so, and the task refuses them as any diverged run's
        # (model_io.check_finite).
        if math.isinf(self.value) or exponent >= MAX_EXPONENT:
            self.value = math.inf
        else:
            self.value *= math.exp(exponent)


def sampled_batches(plan: TaskPlan, randomness: RunRandomness, on_epoch: EpochCallback,
                    progress: bool = True, persons: np.ndarray | None = None,
                    units: int | None = None):
    """Yield the index batch of every step of a run, with a progress bar.

    Args:
      plan: the run's plan: its sampling plan's n, q and steps (exactly that many batches); with
        DP, Poisson batches; without, hp.batch_size shuffled indices.
      randomness: the run's randomness, which draws the batches.
      on_epoch: the progress text after each epoch.
      progress: whether to draw the bar (not for a search's candidates, whose number is secret).
      persons: each example's person (0..P-1), or None: persons are sampled, and a sampled
        person's examples are all in the batch.
      units: how many units the data really holds (examples, or the P persons), which each step
        samples at rate q; None: the plan's public size (data made to it).

    Yields:
      int64 index arrays into the training data, one per step.

    With DP, the unit's Poisson batches (PrivacyUnit.sample, as the accountant assumes them: batch
    sizes vary; a batch may be empty and is still a step). The non-private baseline takes shuffled
    batches of `batch_size`. Every framework trains on these batches (Opacus' own DPDataLoader runs
    int(1/q) steps an epoch, one fewer than planned for some q).
    """
    rng, sampling, dp = randomness.numpy("batches"), plan.sampling, plan.hp.dp
    units, unit = sampling.n if units is None else units, units_of(persons)
    # Steps are counted here, not by the bar: a bar no terminal sees counts nothing.
    with progress_bars.bar(sampling.steps, f"train ({plan.framework})", "step",
                           shown=progress) as bar:
        for step in range(1, sampling.steps + 1):
            if dp:
                yield unit.sample(rng, sampling.sample_rate, units)
            else:
                yield rng.choice(units, size=min(plan.hp.batch_size, units), replace=False)
            bar.update()
            if step == 1:
                timing.mark("first step")  # with the graph's compilation (tf, MindSpore)
            if step % sampling.steps_per_epoch == 0 or step == sampling.steps:
                epoch = math.ceil(step / sampling.steps_per_epoch)
                bar.set_postfix_str(f"epoch {epoch}/{sampling.epochs} {on_epoch(step)}")


def fit(framework: Framework, model, inputs: np.ndarray, labels: np.ndarray, plan: TaskPlan,
        randomness: RunRandomness, on_epoch: EpochCallback = lambda steps: "", canaries=None,
        through=None, progress: bool = True, persons: np.ndarray | None = None) -> Ran:
    """One training run of `framework`.

    Args:
      framework: the algo's Framework (its hooks take the steps).
      model: the framework's model, trained in place.
      inputs: the network's inputs of the training images (Network.inputs) [n, ...].
      labels: the training labels [n].
      plan: the run's plan (task_plan.py): the steps to run, σ, the clipping settings.
      randomness: the run's: it draws the batches, the noise and adaptive clipping's count.
      on_epoch: the progress text after each epoch; none by default (a figure by another
        accountant than the reported one would contradict the report).
      canaries: the white-box audit's (audit.DiracCanaries, or benchmarks/same_noise.py's shared
        noise). A `noise_scale` below 1 is the audit's broken mechanism: the steps add that
        fraction of the noise while the result still says σ.
      through: through(batches, sampling plan), what the batches pass through on their way to the
        framework (substrafl's index generator, which counts them); it must hand on every batch.
      progress: whether to draw the steps' progress bar.
      persons: each example's person (examples.persons_of) when plan.privacy_unit is PER_PERSON,
        else None.

    Returns:
      What ran (Ran): the batch sizes and the library's ε from the framework; σ, the clipping unit
      and where the noise came from, completed here.
    """
    if plan.framework != framework.name:  # the ledger's event names the plan's
        raise ValueError(f"a plan of {plan.framework} given to {framework.name}")
    dp, unit = plan.hp.dp, units_of(persons)
    if unit.clipping != plan.privacy_unit or (unit.grouped and not framework.per_person):
        raise ValueError(f"a plan per {plan.privacy_unit} given data per {unit.name} and "
                         f"{framework.name}")
    units = unit.count(len(labels))  # the data's own count, which each step samples
    batches = sampled_batches(plan, randomness, on_epoch, progress, persons, units)
    if through is not None:
        batches = through(batches, plan.sampling)
    step = DpStep(plan.schedule, ClipNorm(plan, randomness), randomness, canaries, unit)
    ran = train_steps(framework, model, inputs, labels, plan, step, batches)
    # the ledger records what ran; the frameworks must all run the plan
    if len(ran.batch_sizes) != plan.sampling.steps:
        raise RuntimeError(f"{framework.name} ran {len(ran.batch_sizes)} steps where the plan has "
                           f"{plan.sampling.steps}")
    return dataclasses.replace(
        ran, batch_sizes=list(ran.batch_sizes), replayable_noise=randomness.replayable,
        library_epsilon=comparable_library_epsilon(framework.name, ran.library_epsilon),
        noise_multiplier=plan.sigma if dp else 0.0,
        clipping=plan.privacy_unit if dp else NO_CLIPPING)


def train_steps(framework: Framework, model, inputs: np.ndarray, labels: np.ndarray,
                plan: TaskPlan, step: DpStep, batches) -> Ran:
    """Train `model` in place, one step of the framework's hooks per index batch.

    With DP, each step runs at the step's clipping norm and σ (step.sigma_at), and its
    count of unclipped examples goes back to adaptive clipping. Then the weight average takes the
    weights' place, and the library's own ε is asked where it can account the run.

    Args:
      framework: the algo's Framework.
      model: the framework's model, trained in place.
      inputs: the network's inputs [n, ...].
      labels: the labels [n].
      plan: the run's plan (its hyperparameters and sampling plan).
      step: the DP step's settings: noise schedule, clipping norm, randomness, canaries.
      batches: the index batches, one per step (sampled_batches).

    Returns:
      Ran with the batch sizes and the library's ε only (what fit completes).
    """
    dp = plan.hp.dp
    optimizer = framework.optimizer(model, plan.hp.training)
    if dp:
        dp_step = framework.dp_step(model, optimizer, inputs, labels, step)
    else:
        plain_step = framework.plain_step(model, optimizer, inputs, labels)
    batch_sizes = []
    for batch in batches:
        units = step.units_in(batch)
        if dp:
            unclipped = dp_step(batch, step.clip.value, step.sigma_at(len(batch_sizes)))
            step.clip.update(unclipped, units)  # adaptive clipping's count (a no-op otherwise)
        else:
            plain_step(batch)
        batch_sizes.append(units)
    framework.end_training(model, optimizer, plan.hp.training)
    library = {}
    if dp and step.library_can_account:
        library = framework.library_epsilon(plan.sampling, plan.hp.delta, len(batch_sizes),
                                            step.sigma)
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


def run(framework: Framework, model, data: dict, plan: TaskPlan,
        unit: PrivacyUnit, randomness: RunRandomness, through=None,
        release_images: bool = False) -> Ran:
    """A train task's run: the steps of `plan` on the opener's `data` (`fit`), `model` trained in
    place, its batches and noise drawn from `randomness`.

    Args:
      framework: the algo's Framework.
      model: the framework's model.
      data: the opener's data.
      plan: the run's plan.
      unit: the privacy unit, bound to the data (Budget.unit).
      randomness: the run's randomness (RunRandomness.for_run, for its place in the model's
        ledger).
      through: as in `fit`.
      release_images: whether the data's images give way to the network's inputs
        (skeleton.train_in_memory's).

    Returns:
      What it Ran.
    """
    inputs = Network.of(plan.hp).inputs(data["images"])
    if release_images:
        data["images"] = None
    # fixed features: the scattering transform of every image (nothing for pixels)
    timing.mark("features")
    say_notices(framework, plan.hp, randomness)
    ran = fit(framework, model, inputs, data["labels"], plan, randomness, through=through,
              persons=unit.groups)
    timing.mark("training")  # the steps after the first
    return ran


@dataclass
class Trained:
    """A model trained from scratch in memory (benchmarks, audits), and what its training did."""

    model: object
    network: Network
    plan: TaskPlan
    ran: Ran  # what the training ran
    seconds: float  # the training itself (features included)


def fit_from_scratch(framework: Framework, images: np.ndarray, labels: np.ndarray,
                     hp: Hyperparameters, where: str, identities: tuple = (),
                     persons: np.ndarray | None = None,
                     randomness: RunRandomness | None = None,
                     public_size: int | None = None) -> Trained:
    """A train task's work without Substra, for benchmarks and audits: its plan on data no run has
    touched (task_plan.fresh), a new model, `fit` (fresh noise unless hp.noise_seed).

    Args:
      framework: the algo's Framework.
      images: the training images [n, 28, 28].
      labels: their labels [n].
      hp: the hyperparameters.
      where: what an error names (the file or options the hyperparameters came from).
      identities: what the run's event names as its data.
      persons: each image's person, an index 0..P-1, to train private per person; None: per image.
      randomness: what the run draws from; None: RunRandomness.for_run(hp.noise_seed).
      public_size: the size the plan is made for (policy.py); None: the data's own count.

    Returns:
      The Trained model, with its network, its plan, what it ran and the training's seconds.
    """
    unit = units_of(persons)
    plan = task_plan.fresh(framework.name, hp,
                           unit.count(len(labels)) if public_size is None else public_size, where,
                           identities, unit.clipping)
    network = Network.of(hp)
    model = framework.new_model(hp.seed, network)
    start = time.perf_counter()
    ran = fit(framework, model, network.inputs(images), labels, plan,
              randomness or RunRandomness.for_run(hp.noise_seed), persons=persons)
    return Trained(model, network, plan, ran, time.perf_counter() - start)


def say_notices(framework: Framework, hp: Hyperparameters, randomness: RunRandomness) -> None:
    """Log, once and before any step, what a run of `hp` warns about. A search says them once for
    all its candidates: a line per candidate would count them.

    Args:
      framework: the algo's Framework: its own notices (Framework.notices).
      hp: the run's hyperparameters.
      randomness: the run's randomness: replayable noise is warned about.
    """
    if randomness.replayable:
        log.warning("noise_seed = %d: %s", hp.noise_seed, REPLAYABLE_WARNING)
    for notice in getattr(framework, "notices", lambda hp: [])(hp):
        log.warning("%s", notice)
