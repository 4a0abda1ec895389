"""DP events: one DP-SGD training run as it really ran, checked field by field when read from a file.

Each event is a Poisson-subsampled Gaussian mechanism composed over the steps really run (its noise
schedule: σ, a decay, adaptive clipping's count noise), on data samples named by keyed identities. The
accountant (accountant.py) turns events into ε; the ledger (ledger.py) keeps a model's events and examples.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import uuid

from mnist_dp.utils.errors import UserError

PER_EXAMPLE = "per-example"
NO_CLIPPING = "none"  # the non-private baseline
CLIPPING_UNITS = (PER_EXAMPLE, NO_CLIPPING)  # the only ones the accountant's sensitivity (C per example) covers
# A decaying noise schedule lowers σ at each quarter of the planned steps: few distinct σ keep PLD fast.
NOISE_STAGES = 4
# The least effective noise multiplier of any step (gradient noise, decay and adaptive clipping's count together):
# below it PLD's grid (∝ 1/σ²) takes minutes or fails, and one step already spends ε ≥ 5.7. Measurements: design.md,
# "Accounting rules".
MIN_NOISE_MULTIPLIER = 0.3
# The most is hyperparameters.MAX_NOISE_MULTIPLIER; a σ calibrated from a target lies between the two.



def _integer(low: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number(test):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and test(v)


def _text(v) -> bool:
    return isinstance(v, str) and bool(v)


# Every field of a ledger event read from a file: (test, what it must be).
_EVENT_FIELDS = {
    "framework": (_text, "a framework name"),
    "data": (lambda v: isinstance(v, list) and bool(v) and all(map(_text, v)) and len(set(v)) == len(v),
             "a non-empty list of distinct data sample identities"),
    "n": (_integer(1), "a positive integer"),
    "sample_rate": (_number(lambda v: 0 < v <= 1), "a number in (0, 1]"),
    "noise_multiplier": (_number(lambda v: v >= 0), "a number >= 0"),
    "steps": (_integer(1), "a positive integer"),
    "clipping": (lambda v: v in CLIPPING_UNITS, f"one of {list(CLIPPING_UNITS)}"),
    "max_grad_norm": (_number(lambda v: v > 0), "a positive number"),
    "library_epsilon": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and _number(lambda x: True)(x)
                                                              for k, x in v.items()),
                        "an object of {name: number}"),
    "batch_size": (_integer(1), "a positive integer"),
    "planned_steps": (_integer(1), "a positive integer"),
    "noise_decay": (_number(lambda v: 0 < v <= 1), "a number in (0, 1]"),
    "decay_steps": (_integer(0), "an integer >= 0"),
    "count_noise_multiplier": (_number(lambda v: v >= 0), "a number >= 0"),
    "run_id": (lambda v: v is None or (isinstance(v, str) and re.fullmatch(r"[0-9a-f]{32}", v) is not None),
               "null or 32 hexadecimal digits"),
    "code": (lambda v: isinstance(v, dict) and set(v) == {"function", "archive_digest"} and _text(v["function"])
             and (v["archive_digest"] is None or _text(v["archive_digest"])),
             'an object {"function": name, "archive_digest": digest or null}'),
    "replayable_noise": (lambda v: isinstance(v, bool), "true or false"),
}


@dataclasses.dataclass(frozen=True)
class DpEvent:
    """One DP-SGD training run, as it really ran.

    ``noise_multiplier`` is the effective σ relative to the sensitivity of one example: with
    per-example clipping it is the optimizer's σ; a library that clips microbatches of m > 1
    examples must record σ/2 (one example can move the clipped sum by 2C). 0 means no noise (no DP).
    The last three fields are provenance: a ledger read from a model file must have them, so that
    q, the steps and the code can be checked against each other; an event made only to compute an
    ε (tests, benchmarks) may leave them out.
    """

    framework: str
    data: tuple  # keyed identities of the data samples trained on (their examples: Ledger.examples)
    n: int  # examples in those samples
    sample_rate: float  # Poisson sampling probability q of each step
    noise_multiplier: float
    steps: int
    clipping: str  # clipping unit: PER_EXAMPLE, or NO_CLIPPING for the non-private baseline
    max_grad_norm: float
    # The DP library's own ε for this run alone, as (name, value) pairs: shown for comparison, never used.
    library_epsilon: tuple = ()
    batch_size: int | None = None  # the expected batch size asked for: q = 1 / ceil(n / batch_size)
    planned_steps: int | None = None  # epochs * ceil(n / batch_size); `steps` is fewer when a budget stopped it
    code: dict | None = None  # what produced the event: {"function": ..., "archive_digest": ... or None}
    # A decaying noise schedule: σ of steps [k·decay_steps, (k+1)·decay_steps) is noise_multiplier · noise_decay^k.
    noise_decay: float = 1.0
    decay_steps: int = 0  # 0: σ constant
    # Adaptive clipping's noisy count of unclipped examples, released at every step with the gradient: its
    # noise multiplier (std / sensitivity 1/2); 0 when the clipping norm is fixed.
    count_noise_multiplier: float = 0.0
    # Which training run this is (a random id, `new_run_id`): when the ledgers of models trained in parallel
    # from one global model are merged, the global model's runs appear in every input and are counted once.
    run_id: str | None = None
    # The run's batches and noise came from the noise_seed hyperparameter (randomness.py), not fresh OS entropy:
    # whoever knows the seed can replay them, and its ε then holds for no one else.
    replayable_noise: bool = False

    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "data": list(self.data), "library_epsilon": dict(self.library_epsilon)}

    @classmethod
    def from_json(cls, record) -> DpEvent:
        """A ledger event read from a file, every field checked (type, range, consistency): a figure
        computed from an edited or damaged ledger must not be printed."""
        if not isinstance(record, dict):
            raise UserError(f"privacy ledger event must be a JSON object, got {json.dumps(record)[:40]}")
        fields = {f.name for f in dataclasses.fields(cls)}
        record = {**_ADDED_LATER, **record}  # a ledger written before these options existed ran without them
        missing, unknown = fields - set(record), set(record) - fields
        if missing or unknown:
            raise UserError(f"privacy ledger event: missing {sorted(missing)}, unknown {sorted(unknown)}")
        for name, (test, what) in _EVENT_FIELDS.items():
            if not test(record[name]):
                raise UserError(f"privacy ledger event: {name} = {json.dumps(record[name])} must be {what}")
        event = cls(**{**record, "data": tuple(record["data"]),
                       "library_epsilon": tuple(sorted(record["library_epsilon"].items()))})
        event.check_consistent()
        return event

    def check_consistent(self) -> None:
        """q, steps and clipping must agree with each other as the skeleton makes them."""
        steps_per_epoch = math.ceil(self.n / self.batch_size)
        problems = []
        if self.batch_size > self.n:
            problems.append(f"batch_size {self.batch_size} > n {self.n}")
        if not math.isclose(self.sample_rate, 1.0 / steps_per_epoch, rel_tol=1e-12):
            problems.append(f"q = {self.sample_rate} but 1 / ceil(n / batch_size) = {1.0 / steps_per_epoch}")
        if self.planned_steps % steps_per_epoch:
            problems.append(f"planned_steps {self.planned_steps} is not a whole number of epochs of {steps_per_epoch}")
        if self.steps > self.planned_steps:
            problems.append(f"steps {self.steps} > planned_steps {self.planned_steps}")
        if self.clipping == NO_CLIPPING and self.is_private:
            problems.append("noise without clipping")
        if (self.noise_decay < 1) != (self.decay_steps > 0):
            problems.append(f"noise_decay {self.noise_decay} with decay_steps {self.decay_steps}")
        elif self.decay_steps and self.decay_steps != math.ceil(self.planned_steps / NOISE_STAGES):
            problems.append(f"decay_steps {self.decay_steps} but the schedule has {NOISE_STAGES} blocks of "
                            f"ceil(planned_steps / {NOISE_STAGES}) = {math.ceil(self.planned_steps / NOISE_STAGES)}")
        if self.is_private and self.schedule().smallest(self.steps) < MIN_NOISE_MULTIPLIER:
            # No task trains so (planning.check_noise), and the accountant could run for hours on it.
            problems.append(f"a step's noise multiplier {self.schedule().smallest(self.steps):.3g} is below "
                            f"{MIN_NOISE_MULTIPLIER}, the least a train task allows")
        if problems:
            raise UserError(f"privacy ledger event ({self.framework}) is inconsistent: {'; '.join(problems)}")

    def segments(self) -> list:
        """[(q, effective σ, steps)] of the steps this run really ran, as the accountant composes them."""
        return [(self.sample_rate, sigma, steps) for sigma, steps in self.schedule().segments(self.steps)]

    def schedule(self) -> NoiseSchedule:
        return NoiseSchedule(self.noise_multiplier, self.noise_decay, self.decay_steps, self.count_noise_multiplier)


_ADDED_LATER = {"noise_decay": 1.0, "decay_steps": 0, "count_noise_multiplier": 0.0, "run_id": None,
                # Ledgers from before fresh noise by default: seeded from public values, so replayable.
                "replayable_noise": True}


def new_run_id() -> str:
    """A training run's id: random, so two runs never share one (equal settings on equal data included)."""
    return uuid.uuid4().hex


def count_stddev(clip_count_stddev: float | None, expected_batch_size: float) -> float:
    """Adaptive clipping: the std of the noise on the count of unclipped examples (E[B] / 20 unless given,
    Andrew et al. 2021); the ledger's count_noise_multiplier is twice it (the count's sensitivity is 1/2)."""
    return clip_count_stddev if clip_count_stddev is not None else expected_batch_size / 20


def combined_noise_multiplier(gradient: float, count: float) -> float:
    """The noise multiplier of a step that releases the noisy clipped gradient sum (sensitivity C, noise
    multiplier `gradient`) and a noisy count (sensitivity 1/2, noise multiplier `count`; 0: none) on the same
    Poisson batch: together one Gaussian mechanism on the joint vector, of multiplier (σ_g⁻² + σ_b⁻²)^(-1/2)
    (Andrew et al. 2021, Theorem 1)."""
    if count == 0 or gradient == 0:  # no count released; or a gradient without noise (not private at all)
        return gradient
    return (gradient ** -2 + count ** -2) ** -0.5


@dataclasses.dataclass(frozen=True)
class NoiseSchedule:
    """The noise of every step of a run: gradient noise multiplier σ · noise_decay^k in the k-th block of
    `decay_steps` steps (decay_steps 0: σ throughout), with adaptive clipping's count noise beside it."""

    sigma: float
    noise_decay: float = 1.0
    decay_steps: int = 0
    count_noise_multiplier: float = 0.0

    def gradient_sigma(self, step: int) -> float:
        """The gradient's noise multiplier at step `step` (0-based)."""
        if not self.decay_steps:
            return self.sigma
        return self.sigma * self.noise_decay ** (step // self.decay_steps)

    def segments(self, steps: int) -> list:
        """[(effective σ, steps)] of the first `steps` steps, as the accountant composes them."""
        block = self.decay_steps or steps
        return [(combined_noise_multiplier(self.gradient_sigma(start), self.count_noise_multiplier),
                 min(block, steps - start)) for start in range(0, steps, block)]

    def smallest(self, steps: int) -> float:
        """The least effective noise multiplier among the first `steps` steps (to compare with MIN_NOISE_MULTIPLIER;
        σ = inf: the count's alone)."""
        return min(sigma for sigma, _ in self.segments(steps))

    def with_sigma(self, sigma: float) -> NoiseSchedule:
        return dataclasses.replace(self, sigma=sigma)
