"""DP events: one DP-SGD training run as it really ran, checked field by field when read from a
file.

Each event is a Poisson-subsampled Gaussian mechanism composed over the steps really run (its noise
schedule: σ, a decay, adaptive clipping's count noise), on data samples named by keyed identities.
The accountant (accountant.py) turns events into ε; the ledger (ledger.py) keeps a model's events
and examples.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import uuid

import numpy as np

from mnist_dp.utils.errors import UserError

PER_EXAMPLE = "per-example"
# A person's images summed, then clipped as one (data with subjects.npy): n counts persons.
PER_PERSON = "per-person"
NO_CLIPPING = "none"  # the non-private baseline
# the only ones the accountant's sensitivity (C per unit) covers
CLIPPING_UNITS = (PER_EXAMPLE, PER_PERSON, NO_CLIPPING)
# A decaying noise schedule lowers σ at each quarter of the planned steps: few
# distinct σ keep PLD fast.
NOISE_STAGES = 4
# The least effective noise multiplier of any step (gradient noise, decay and adaptive clipping's
# count together): below it PLD's grid (∝ 1/σ²) takes minutes or fails, and one step already spends
# ε ≥ 5.7. Measurements: design.md, "Accounting rules".
MIN_NOISE_MULTIPLIER = 0.3  # the most: hyperparameters.MAX_NOISE_MULTIPLIER


def _integer(low: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number(test):
    return lambda v: isinstance(
        v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and test(v)


def _text(v) -> bool:
    return isinstance(v, str) and bool(v)


# Every field of a ledger event read from a file: (test, what it must be).
_EVENT_FIELDS = {
    "framework": (_text, "a framework name"),
    "data": (lambda v: isinstance(v, list) and bool(v) and all(map(_text, v))
             and len(set(v)) == len(v), "a non-empty list of distinct data sample identities"),
    "n": (_integer(1), "a positive integer"),
    "sample_rate": (_number(lambda v: 0 < v <= 1), "a number in (0, 1]"),
    "noise_multiplier": (_number(lambda v: v >= 0), "a number >= 0"),
    "steps": (_integer(1), "a positive integer"),
    "clipping": (lambda v: v in CLIPPING_UNITS, f"one of {list(CLIPPING_UNITS)}"),
    "max_grad_norm": (_number(lambda v: v > 0), "a positive number"),
    "library_epsilon": (lambda v: isinstance(v, dict)
                        and all(isinstance(k, str) and _number(lambda x: True)(x)
                                                              for k, x in v.items()),
                        "an object of {name: number}"),
    "batch_size": (_integer(1), "a positive integer"),
    "planned_steps": (_integer(1), "a positive integer"),
    "noise_decay": (_number(lambda v: 0 < v <= 1), "a number in (0, 1]"),
    "decay_steps": (_integer(0), "an integer >= 0"),
    "count_noise_multiplier": (_number(lambda v: v >= 0), "a number >= 0"),
    "run_id": (lambda v: v is None
               or (isinstance(v, str) and re.fullmatch(r"[0-9a-f]{32}", v) is not None),
               "null or 32 hexadecimal digits"),
    "code": (lambda v: isinstance(v, dict) and set(v) == {"function", "archive_digest"}
             and _text(v["function"])
             and (v["archive_digest"] is None or _text(v["archive_digest"])),
             'an object {"function": name, "archive_digest": digest or null}'),
    "replayable_noise": (lambda v: isinstance(v, bool), "true or false"),
    "public_size": (lambda v: isinstance(v, bool), "true or false"),
    # Search.from_json first
    "search": (lambda v: v is None or isinstance(v, Search), "null or a search object"),
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
    # The privacy units (examples, or persons: PER_PERSON) the data's owner declared the samples to
    # hold (`public_size`), or that they held (older ledgers); q, the steps and E[B] come from it.
    n: int
    sample_rate: float  # Poisson sampling probability q of each step
    noise_multiplier: float
    steps: int
    clipping: str  # clipping unit: PER_EXAMPLE, PER_PERSON, or NO_CLIPPING for the baseline
    max_grad_norm: float
    # The DP library's own ε for this run alone, as (name, value) pairs: shown
    # for comparison, never used.
    library_epsilon: tuple = ()
    batch_size: int | None = None  # the expected batch size asked for: q = 1 / ceil(n / batch_size)
    # epochs * ceil(n / batch_size); `steps` is fewer when a budget stopped it
    planned_steps: int | None = None
    # what produced the event: {"function": ..., "archive_digest": ... or None}
    code: dict | None = None
    # A decaying noise schedule: σ of steps [k·decay_steps, (k+1)·decay_steps) is
    # noise_multiplier · noise_decay^k.
    noise_decay: float = 1.0
    decay_steps: int = 0  # 0: σ constant
    # Adaptive clipping's noisy count of unclipped examples, released at every step with the
    # gradient: its noise multiplier (std / sensitivity 1/2); 0 when the clipping norm is fixed.
    count_noise_multiplier: float = 0.0
    # Which training run this is (a random id, `new_run_id`): when the ledgers of models trained
    # in parallel from one global model are merged, the global model's runs appear in every
    # input and are counted once.
    run_id: str | None = None
    # The run's batches and noise came from the noise_seed hyperparameter (randomness.py), not fresh
    # OS entropy: whoever knows the seed can replay them, and its ε then holds for no one else.
    replayable_noise: bool = False
    # `n` is the data owner's declared size (policy.py), not a count: false where n counted the data
    public_size: bool = True
    # A private hyperparameter search (Search) that released this run's model as the best of its
    # candidates: this run trained on the examples of `data` outside its validation split, and the
    # whole search is what is accounted.
    search: Search | None = None

    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def trained_n(self) -> int:
        """The examples the run trained on: n, less a search's validation split."""
        return self.n - (self.search.validation_n if self.search else 0)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "data": list(self.data),
                "library_epsilon": dict(self.library_epsilon),
                "search": self.search.to_json() if self.search else None}

    @classmethod
    def from_json(cls, record) -> DpEvent:
        """A ledger event read from a file, every field checked (type, range, consistency): a figure
        computed from an edited or damaged ledger must not be printed."""
        if not isinstance(record, dict):
            raise UserError("privacy ledger event must be a JSON object, got "
                            f"{json.dumps(record)[:40]}")
        fields = {f.name for f in dataclasses.fields(cls)}
        # a ledger written before these options existed ran without them
        record = {**_ADDED_LATER, **record}
        missing, unknown = fields - set(record), set(record) - fields
        if missing or unknown:
            raise UserError(f"privacy ledger event: missing {sorted(missing)}, unknown "
                            f"{sorted(unknown)}")
        if record["search"] is not None:
            record["search"] = Search.from_json(record["search"])
        for name, (test, what) in _EVENT_FIELDS.items():
            if not test(record[name]):
                raise UserError(f"privacy ledger event: {name} = {json.dumps(record[name])} must "
                                f"be {what}")
        event = cls(**{**record, "data": tuple(record["data"]),
                       "library_epsilon": tuple(sorted(record["library_epsilon"].items()))})
        event.check_consistent()
        return event

    def check_consistent(self) -> None:
        """q, steps and clipping must agree with each other as the skeleton makes them."""
        n = self.trained_n
        steps_per_epoch = math.ceil(n / self.batch_size) if n > 0 else 0
        problems = []
        if self.batch_size > n:
            problems.append(f"batch_size {self.batch_size} > the {n} examples trained on")
            steps_per_epoch = 1
        if not math.isclose(self.sample_rate, 1.0 / steps_per_epoch, rel_tol=1e-12):
            problems.append(f"q = {self.sample_rate} but 1 / ceil(n / batch_size) = "
                            f"{1.0 / steps_per_epoch}")
        if self.planned_steps % steps_per_epoch:
            problems.append(f"planned_steps {self.planned_steps} is not a whole number of epochs "
                            f"of {steps_per_epoch}")
        if self.steps > self.planned_steps:
            problems.append(f"steps {self.steps} > planned_steps {self.planned_steps}")
        if self.clipping == NO_CLIPPING and self.is_private:
            problems.append("noise without clipping")
        if (self.noise_decay < 1) != (self.decay_steps > 0):
            problems.append(f"noise_decay {self.noise_decay} with decay_steps {self.decay_steps}")
        elif self.decay_steps and self.decay_steps != math.ceil(self.planned_steps / NOISE_STAGES):
            problems.append(f"decay_steps {self.decay_steps} but the schedule has {NOISE_STAGES} "
                            f"blocks of ceil(planned_steps / {NOISE_STAGES}) = "
                            f"{math.ceil(self.planned_steps / NOISE_STAGES)}")
        if self.is_private and self.schedule().smallest(self.steps) < MIN_NOISE_MULTIPLIER:
            # No task trains so (task_plan.check_noise), and the accountant
            # could run for hours on it.
            problems.append(f"a step's noise multiplier {self.schedule().smallest(self.steps):.3g} "
                            f"is below {MIN_NOISE_MULTIPLIER}, the least a train task allows")
        if self.search:
            problems += self.search.problems(self)
        if problems:
            raise UserError(f"privacy ledger event ({self.framework}) is inconsistent: "
                            f"{'; '.join(problems)}")

    @classmethod
    def of_run(cls, framework: str, data: tuple, n: int, sample_rate: float,
               schedule: NoiseSchedule, steps: int, clipping: str,
               max_grad_norm: float) -> DpEvent:
        """The event of a run's first `steps` steps at the noise of `schedule`.

        Args:
          framework: the algo's name.
          data: the keyed identities of the data samples trained on.
          n: the examples in those samples.
          sample_rate: the Poisson sampling probability q of each step.
          schedule: the run's noise: σ, its decay and adaptive clipping's count noise.
          steps: the steps run.
          clipping: the clipping unit: PER_EXAMPLE, PER_PERSON, or NO_CLIPPING for the non-private
            baseline.
          max_grad_norm: the clipping norm C.

        Returns:
          The DpEvent, its other fields (provenance, run id, search) at their defaults.
        """
        return cls(framework, data, n, sample_rate, schedule.sigma, steps, clipping, max_grad_norm,
                   noise_decay=schedule.noise_decay, decay_steps=schedule.decay_steps,
                   count_noise_multiplier=schedule.count_noise_multiplier)

    def segments(self) -> list:
        """[(q, effective σ, steps)] of the steps this run really ran, as the accountant composes
        them."""
        return [(self.sample_rate, sigma, steps) for sigma,
                steps in self.schedule().segments(self.steps)]

    def schedule(self) -> NoiseSchedule:
        return NoiseSchedule(self.noise_multiplier, self.noise_decay, self.decay_steps,
                             self.count_noise_multiplier)


# Older ledgers' runs: noise seeded from public values (replayable), n a count of the examples.
_ADDED_LATER = {"noise_decay": 1.0, "decay_steps": 0, "count_noise_multiplier": 0.0, "run_id": None,
                "replayable_noise": True, "search": None, "public_size": False}


def new_run_id() -> str:
    """A training run's id: random, so two runs never share one (equal settings on equal data
    included)."""
    return uuid.uuid4().hex


def combined_noise_multiplier(gradient: float, count: float) -> float:
    """The noise multiplier of a step that releases the noisy clipped gradient sum (sensitivity C,
    noise multiplier `gradient`) and a noisy count (sensitivity 1/2, noise multiplier `count`; 0:
    none) on the same Poisson batch: together one Gaussian mechanism on the joint vector, of
    multiplier (σ_g⁻² + σ_b⁻²)^(-1/2) (Andrew et al. 2021, Theorem 1)."""
    # no count released; or a gradient without noise (not private at all)
    if count == 0 or gradient == 0:
        return gradient
    return (gradient ** -2 + count ** -2) ** -0.5


@dataclasses.dataclass(frozen=True)
class NoiseSchedule:
    """The noise of every step of a run: gradient noise multiplier σ · noise_decay^k in the k-th
    block of `decay_steps` steps (decay_steps 0: σ throughout), with adaptive clipping's count noise
    beside it."""

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
        """The least effective noise multiplier among the first `steps` steps (to compare with
        MIN_NOISE_MULTIPLIER; σ = inf: the count's alone)."""
        return min(sigma for sigma, _ in self.segments(steps))

    def with_sigma(self, sigma: float) -> NoiseSchedule:
        return dataclasses.replace(self, sigma=sigma)


# A private search (Papernot & Steinke 2022): the number of candidates is drawn from a truncated
# negative binomial of this shape (0: logarithmic, 1: geometric) or a Poisson ("poisson")
# distribution, with the given mean.
POISSON = "poisson"
# The validation split is a function of each example's keyed id alone (VALIDATION_MODULUS),
# never of the other examples: adding or removing one example moves no other example
# between training and validation.
VALIDATION_MODULUS = 1000


def validation_mask(ids: np.ndarray, permille: int) -> np.ndarray:
    """Which examples (by their keyed 64-bit ids, the ledger's names) a search holds out for
    validation: those whose id is below `permille` modulo VALIDATION_MODULUS (HMAC ids are uniform,
    so about permille / 1000 of them)."""
    return np.asarray(ids, dtype=np.uint64) % np.uint64(VALIDATION_MODULUS) < np.uint64(permille)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One privacy profile a search's candidate trains with: Poisson rate q, its planned steps and
    its noise schedule (σ of the first steps, decay, adaptive clipping's count). Every candidate
    with this profile composes these steps; the learning rate, clipping norm and the rest do not
    change them."""

    sample_rate: float
    steps: int
    noise_multiplier: float
    noise_decay: float = 1.0
    decay_steps: int = 0
    count_noise_multiplier: float = 0.0

    @classmethod
    def of(cls, sample_rate: float, steps: int, schedule: NoiseSchedule) -> Candidate:
        """The profile of a candidate's run of Poisson rate `sample_rate`, `steps` planned steps and
        noise `schedule` (σ of the first steps, decay, count noise)."""
        return cls(sample_rate, steps, *dataclasses.astuple(schedule))

    def schedule(self) -> NoiseSchedule:
        return NoiseSchedule(self.noise_multiplier, self.noise_decay, self.decay_steps,
                             self.count_noise_multiplier)

    def segments(self) -> list:
        """[(q, effective σ, steps)] of the candidate's run, as the accountant composes them."""
        return [(self.sample_rate, sigma, steps) for sigma,
                steps in self.schedule().segments(self.steps)]


_CANDIDATE_FIELDS = {
    "sample_rate": _EVENT_FIELDS["sample_rate"], "steps": _EVENT_FIELDS["steps"],
    "noise_multiplier": (_number(lambda v: v >= MIN_NOISE_MULTIPLIER),
                         f"a number >= {MIN_NOISE_MULTIPLIER}"),
    "noise_decay": _EVENT_FIELDS["noise_decay"], "decay_steps": _EVENT_FIELDS["decay_steps"],
    "count_noise_multiplier": _EVENT_FIELDS["count_noise_multiplier"],
}


def _is_candidate(record) -> bool:
    """Whether a ledger's record holds exactly a Candidate's fields, each valid."""
    return isinstance(record, dict) and set(record) == set(_CANDIDATE_FIELDS) and all(
        test(record[k]) for k, (test, _) in _CANDIDATE_FIELDS.items())


@dataclasses.dataclass(frozen=True)
class Search:
    """A private hyperparameter search that released one model, the best of its candidates (Papernot
    & Steinke, ICLR 2022, "Hyperparameter tuning with Rényi DP"; dp_accounting's
    RepeatAndSelectDpEvent).

    The number of candidates K is drawn from a distribution of `mean` and `shape` and never
    released. Each candidate draws its hyperparameters from the search space, trains with DP-SGD on
    the examples outside the validation split (its privacy profile one of `candidates`) and is
    scored by its number of correct predictions on the validation split plus Gaussian noise of std
    `score_noise_multiplier` (a count's sensitivity is 1); only the best candidate's model leaves
    the search. With a `recipe` (the search file's recipe_candidate), one more candidate of that
    profile, the algo's own hyperparameters, is trained and scored once whatever K is, and competes
    with the K candidates' best: its run and score compose with the repeated selection.

    Per example: a training example is covered by the repeated selection of the candidate's training
    (a random choice among `candidates`, whose Rényi divergence is at most the worst of theirs at
    every order), a validation example by that of its score alone. `face` says which one an account
    composes ("training", as stored; "score": Ledger.accounts makes it for the validation examples;
    "either": the worse of the two at every RDP order, for an individual who may sit on either side,
    as in several organisations' data).
    """

    mean: float  # E[K] >= 1
    shape: float  # >= 0, math.inf for Poisson
    candidates: tuple  # the distinct Candidate profiles of the search space
    score_noise_multiplier: float
    validation_permille: int  # examples whose id modulo 1000 is below it are the validation split
    validation_n: int  # how many of the event's examples that is
    face: str = "training"
    recipe: Candidate | None = None  # the profile of the candidate run once besides the K

    def to_json(self) -> dict:
        return {"mean": self.mean, "shape": POISSON if math.isinf(self.shape) else self.shape,
                "candidates": [dataclasses.asdict(c) for c in self.candidates],
                "score_noise_multiplier": self.score_noise_multiplier,
                "validation_permille": self.validation_permille, "validation_n": self.validation_n,
                **({} if self.recipe is None else {"recipe": dataclasses.asdict(self.recipe)})}

    def scored(self) -> Search:
        """The search as a validation example sees it: its score only."""
        return dataclasses.replace(self, face="score")

    def either(self) -> Search:
        """The search as an example on an unknown side of the split sees it: the worse face at every
        order."""
        return dataclasses.replace(self, face="either")

    @classmethod
    def from_json(cls, record) -> Search:
        where = "privacy ledger event: search"
        names = {"mean", "shape", "candidates", "score_noise_multiplier", "validation_permille",
                 "validation_n"}
        if not isinstance(record, dict) or not names <= set(record) <= names | {"recipe"}:
            raise UserError(f"{where} must be an object with exactly {sorted(names)} (and "
                            "\"recipe\" with a recipe candidate)")
        checks = {"mean": (_number(lambda v: v >= 1), "a number >= 1"),
                  "shape": (lambda v: v == POISSON or _number(lambda x: x >= 0)(v),
                            f'a number >= 0 or "{POISSON}"'),
                  "candidates": (lambda v: isinstance(v, list) and bool(v) and all(
                      _is_candidate(c) for c in v), f"a non-empty list of objects "
                      f"{sorted(_CANDIDATE_FIELDS)}, each a candidate's privacy profile"),
                  "recipe": (_is_candidate, f"an object {sorted(_CANDIDATE_FIELDS)}: the recipe "
                             "candidate's privacy profile"),
                  "score_noise_multiplier": (_number(lambda v: v > 0), "a positive number"),
                  "validation_permille": (lambda v: _integer(1)(v) and v < VALIDATION_MODULUS,
                                          f"an integer from 1 to {VALIDATION_MODULUS - 1}"),
                  "validation_n": (_integer(1), "a positive integer")}
        for name, (test, what) in checks.items():
            if name in record and not test(record[name]):
                raise UserError(f"{where}: {name} = {json.dumps(record[name])[:60]} must be {what}")
        return cls(float(record["mean"]), math.inf if record["shape"] == POISSON
                   else float(record["shape"]), tuple(Candidate(**c) for c in record["candidates"]),
                   float(record["score_noise_multiplier"]), record["validation_permille"],
                   record["validation_n"],
                   recipe=Candidate(**record["recipe"]) if "recipe" in record else None)

    def problems(self, event: DpEvent) -> list:
        """What in `event`, the released run, disagrees with its search: its profile must be one of
        the candidates', with every planned step run."""
        released = Candidate.of(event.sample_rate, event.planned_steps, event.schedule())
        problems = []
        if released not in self.candidates and released != self.recipe:
            problems.append("the released run's privacy profile is not one of the search's "
                            "candidates")
        if event.steps != event.planned_steps:
            problems.append("a search's released run stopped early (a search runs every planned "
                            "step)")
        if self.validation_n >= event.n:
            problems.append(f"validation_n {self.validation_n} leaves no training example of n "
                            f"{event.n}")
        return problems
