"""Privacy ledger and accountant: ε is always recomputed from what the training really did.

A model file carries a *ledger*: the list of DP-SGD runs (events) that produced its weights. Each
event is a Poisson-subsampled Gaussian mechanism composed over the steps really run, on a set of
data samples identified by keyed identities. Google's ``dp_accounting`` turns the ledger into ε:
PLD is the reported figure, RDP is shown beside it.

Accounting unit. Neighbouring datasets differ by adding or removing one example. An example lives in
one data sample, so the ε of an example composes every event that trained on its sample; the ledger's
ε is the worst case over samples (events on disjoint samples compose in parallel, not in sequence).
A sample is identified by an HMAC of its content under a secret key stored with it (data.py), so
re-registering the same data under new Substra keys cannot reset the account, and whoever holds a candidate
dataset but not the key cannot confirm it from a released ledger.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import uuid
from collections.abc import Iterable, Sequence

import dp_accounting
from dp_accounting import pld, rdp

from mnist_dp.errors import UserError

ACCOUNTANTS = ("pld", "rdp")
REPORTED_ACCOUNTANT = "pld"
ACCOUNTANT_NAMES = {
    "pld": "PLD (Google dp_accounting)",
    "rdp": "RDP (Google dp_accounting)",
}
SAMPLING = "Poisson (each example joins each batch independently with probability q)"
NEIGHBOURING_RELATION = "add or remove one example"
PER_EXAMPLE = "per-example"
NO_CLIPPING = "none"  # the non-private baseline
CLIPPING_UNITS = (PER_EXAMPLE, NO_CLIPPING)  # the only ones the accountant's sensitivity (C per example) covers
# A decaying noise schedule lowers σ at each quarter of the planned steps: few distinct σ keep PLD accounting
# fast (one σ per epoch made calibrating σ take 80 s for 30 epochs).
NOISE_STAGES = 4


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
    data: tuple  # keyed identities of the data samples trained on (data.sample_identity)
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

    def with_sigma(self, sigma: float) -> NoiseSchedule:
        return dataclasses.replace(self, sigma=sigma)


def dp_sgd_event(segments) -> dp_accounting.DpEvent:
    """The dp_accounting event of DP-SGD steps given as (q, σ, steps) segments: Poisson-sampled Gaussians composed
    in sequence. Composition is commutative, so the steps of equal q and σ, whichever run took them, are one
    self-composition: the same mechanism, accounted once (federated rounds repeat the same run many times)."""
    return _poisson_gaussians(_counts(segments))


def _counts(segments) -> tuple:
    """((q, σ), steps) of every distinct (q, σ) among `segments`, in a fixed order."""
    counts = {}
    for sample_rate, sigma, steps in segments:
        counts[sample_rate, sigma] = counts.get((sample_rate, sigma), 0) + steps
    return tuple(sorted(counts.items()))


def _poisson_gaussians(counts: tuple) -> dp_accounting.DpEvent:
    parts = [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(sigma)), count)
        for (sample_rate, sigma), count in counts]
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def _new_accountant(accountant: str) -> dp_accounting.PrivacyAccountant:
    if accountant == "pld":
        return pld.PLDAccountant()
    if accountant == "rdp":
        return rdp.RdpAccountant()
    raise ValueError(f"unknown accountant {accountant!r}, expected one of {ACCOUNTANTS}")


def compose_epsilon(events: Sequence[DpEvent], delta: float, accountant: str = REPORTED_ACCOUNTANT) -> float:
    """ε at δ of the sequential composition of `events` (inf if any is non-private)."""
    if any(not e.is_private for e in events):
        return math.inf
    if not events:
        return 0.0
    return _epsilon(_counts(segment for e in events for segment in e.segments()), delta, accountant)


@functools.lru_cache(maxsize=256)
def _epsilon(counts: tuple, delta: float, accountant: str) -> float:
    """ε of the steps `counts` (from `_counts`): remembered, since the organisations of a federated ledger
    usually have equal accounts, and a report asks for each one's ε again."""
    acc = _new_accountant(accountant)
    acc.compose(_poisson_gaussians(counts))
    return float(acc.get_epsilon(delta))


class Ledger:
    """The DP events behind one model, in training order."""

    def __init__(self, events: Iterable[DpEvent] = ()):
        self.events = list(events)

    def add(self, event: DpEvent) -> None:
        self.events.append(event)

    def to_json(self) -> list:
        return [e.to_json() for e in self.events]

    @classmethod
    def from_json(cls, records) -> Ledger:
        if not isinstance(records, list):
            raise UserError("privacy ledger must be a list of events")
        return cls(DpEvent.from_json(r) for r in records)

    def accounts(self) -> list:
        """Group data samples that were trained on by exactly the same events.

        Returns a list of (identities, events): each group's ε is the composition of its events.
        """
        touched_by: dict = {}
        for index, event in enumerate(self.events):
            for identity in event.data:
                touched_by.setdefault(identity, []).append(index)
        groups: dict = {}
        for identity, indexes in touched_by.items():
            groups.setdefault(tuple(indexes), set()).add(identity)
        return [(frozenset(fps), [self.events[i] for i in idx]) for idx, fps in groups.items()]

    def epsilon(self, delta: float, accountant: str = REPORTED_ACCOUNTANT, data: Iterable[str] | None = None) -> float:
        """Worst-case ε at δ over the data samples (restricted to the `data` identities if given)."""
        wanted = None if data is None else set(data)
        worst = 0.0
        for identities, events in self.accounts():
            if wanted is None or identities & wanted:
                worst = max(worst, compose_epsilon(events, delta, accountant))
        return worst


def merge(ledgers: Sequence[Ledger]) -> Ledger:
    """The ledger of a model averaged from several models (federated averaging): every training run of every
    input, once. Averaging is post-processing, so nothing is added. Runs are told apart by `run_id`: the global
    model's history, present in every input, is counted once, and each input's own new runs are all kept;
    together with `accounts` this is parallel composition across organisations' disjoint data."""
    merged, seen = [], {}
    for ledger in ledgers:
        for event in ledger.events:
            if event.run_id is None:
                raise UserError(f"a {event.framework} training run in an input model's ledger has no run id (a model "
                                "written by an earlier version of this bundle): its runs cannot be told from the "
                                "other inputs'; train it again")
            if event.run_id in seen:
                if seen[event.run_id] != event:
                    raise UserError(f"two input models record training run {event.run_id} differently: a file was "
                                    "edited or damaged; their privacy figure cannot be trusted")
                continue
            seen[event.run_id] = event
            merged.append(event)
    return Ledger(merged)


def own_runs(ledgers: Sequence[Ledger]) -> list:
    """For each ledger, its runs that are not in every one of `ledgers`: what each input model trained after
    the history they share (the global model they started from)."""
    shared = set.intersection(*({e.run_id for e in ledger.events} for ledger in ledgers))
    return [[e for e in ledger.events if e.run_id not in shared] for ledger in ledgers]


def check_delta(delta: float, n: int, where: str = "delta") -> None:
    """δ must be explicit, positive and below 1/n (else 'release one example at random' is (0, δ)-DP)."""
    if not isinstance(delta, (int, float)) or not 0 < delta < 1.0 / n:
        raise UserError(
            f"{where} = {delta} must be > 0 and < 1/n = {1.0 / n:.3g} for n = {n} training examples; "
            "choose a smaller delta"
        )


def steps_within_budget(prior_events: Sequence[DpEvent], next_run: DpEvent, delta: float, max_epsilon: float) -> int:
    """The most steps of `next_run` (at most its `steps`) after `prior_events` that keep ε at δ (PLD)
    within `max_epsilon`; 0 when even one step would exceed it."""
    def fits(steps: int) -> bool:
        return compose_epsilon([*prior_events, dataclasses.replace(next_run, steps=steps)], delta) <= max_epsilon

    if fits(next_run.steps):
        return next_run.steps
    low, high = 0, next_run.steps  # invariant: `high` steps exceed the budget; `low` steps fit (or low = 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    prior_events: Sequence[DpEvent] = (),
    tol: float = 1e-3,
    schedule: NoiseSchedule = NoiseSchedule(1.0),
    repeats: int = 1,
) -> float:
    """Smallest σ (within `tol`, rounded up) such that prior_events + this run stay within ε at δ (PLD).
    σ is the gradient noise of the first steps; the rest of `schedule` (decay, count noise) is kept. `repeats`:
    the run is repeated that many times (rounds of training on the same data)."""
    prior = [segment for e in prior_events for segment in e.segments()]
    if any(not e.is_private for e in prior_events):
        raise UserError("cannot calibrate to a target epsilon: the input model was trained without DP (epsilon = inf)")
    floor = compose_epsilon(prior_events, delta) if prior_events else 0.0
    if floor >= target_epsilon:
        raise UserError(
            f"target_epsilon = {target_epsilon} is already spent by the input model (epsilon = {floor:.3f}); "
            "raise the target or train from scratch"
        )

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        run = [(sample_rate, effective, count) for effective, count in schedule.with_sigma(sigma).segments(steps)]
        return dp_sgd_event(prior + run * repeats)

    def pld_epsilon(sigma: float) -> float:
        return pld.PLDAccountant().compose(make_event(sigma)).get_epsilon(delta)

    try:
        return _calibrate(make_event, pld_epsilon, target_epsilon, delta, tol)
    except (ValueError, ArithmeticError, RuntimeError) as exc:  # dp_accounting's numerics gave up
        raise UserError(f"target_epsilon = {target_epsilon}: no noise multiplier found for it at δ = {delta:g} "
                        f"with q = {sample_rate:.4g} over {steps} steps ({type(exc).__name__}: {exc}); "
                        "give noise_multiplier instead, or a smaller target_epsilon") from None


def _calibrate(make_event, pld_epsilon, target_epsilon: float, delta: float, tol: float) -> float:
    # PLD is very slow for tiny σ, so bracket it with RDP first: RDP over-estimates ε, hence the
    # RDP-calibrated σ is an upper end for PLD.
    upper = dp_accounting.calibrate_dp_mechanism(
        rdp.RdpAccountant, make_event, target_epsilon, delta, dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=tol
    ) + tol
    lower = upper / 2
    while pld_epsilon(lower) <= target_epsilon:
        upper, lower = lower, lower / 2
    sigma = dp_accounting.calibrate_dp_mechanism(
        pld.PLDAccountant, make_event, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(lower, upper),
        tol=tol
    )
    # Brent's method lands within tol of the optimum on either side: step up until the budget holds.
    sigma = math.ceil(sigma / tol) * tol
    while pld_epsilon(sigma) > target_epsilon:
        sigma += tol
    return round(sigma, 6)
