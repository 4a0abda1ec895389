"""Privacy ledger and accountant: ε is always recomputed from what the training really did.

A model file carries a *ledger*: the list of DP-SGD runs (events) that produced its weights. Each
event is a Poisson-subsampled Gaussian mechanism composed over the steps really run, on a set of
data samples identified by keyed identities. Google's ``dp_accounting`` turns the ledger into ε:
PLD is the reported figure, RDP is shown beside it.

Accounting unit. Neighbouring datasets differ by adding or removing one example: what the model sees, an
image with its label. The ε of an example composes every event that trained on it, whichever data sample held
it; the ledger's ε is the worst example's (events on disjoint examples compose in parallel, not in sequence).
So the ledger names, beside each run's data samples, their examples: each by a 64-bit HMAC of its content under
the secret key stored with its sample (the opener computes both), in a table shared by the runs on the same
samples. Re-registering or re-splitting the same data cannot reset an account, and whoever holds a candidate
example but not the key cannot tell from a released ledger whether it was trained on. Examples named under
different keys cannot be compared: they are accounted as possibly the same, never as disjoint.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import re
import uuid
from collections.abc import Iterable, Sequence

import dp_accounting
import numpy as np
from dp_accounting import mechanism_calibration, pld, rdp

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
# The least effective noise multiplier of any step (gradient noise, decay and adaptive clipping's count together)
# that a run may have. PLD's privacy-loss grid grows as 1/σ²: one ε took (2 cores, q from 1e-6 to 1, 1 to 1,000
# steps) at most 2 s at σ = 1, 8 s at 0.3, 23 s at 0.2, 74 s at 0.1; at 0.07 its numerics failed ("deltas are not
# in non-increasing order"), at 0.01 it ran for minutes, at 1e-6 it asked for 9 PiB; and a budget or a calibration
# takes up to ~20 of them. Settings below it are refused before anything runs, rather than accounted by a
# fallback (RDP, which over-estimates): a single step at σ = 0.3 already spends ε ≥ 5.7 (q = 1e-3) to 19 (q = 1),
# so nothing worth protecting is lost, and every ε reported stays the PLD figure.
MIN_NOISE_MULTIPLIER = 0.3
# The most: a step at σ = 1000 spends ε < 0.01 at any q, and RDP's numerics fail above ~3e4 (q = 1e-3). A σ
# calibrated from a target lies between the two.
MAX_NOISE_MULTIPLIER = 1000.0


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
            # No task trains so (check_noise), and the accountant could run for hours on it.
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


@dataclasses.dataclass(frozen=True)
class Examples:
    """The examples of one data sample as a ledger names them: `key`, the id of the sample's identity key, and
    `ids`, the examples' keyed 64-bit ids (the opener's example_ids), sorted, as big-endian bytes."""

    key: str
    ids: bytes

    @classmethod
    def of(cls, key: str, ids) -> Examples:
        return cls(key, np.sort(np.asarray(ids, dtype=np.uint64)).astype(">u8").tobytes())

    @property
    def array(self) -> np.ndarray:
        return np.frombuffer(self.ids, dtype=">u8").astype(np.uint64)

    def __len__(self) -> int:
        return len(self.ids) // 8

    def to_json(self) -> dict:
        return {"key": self.key, "ids": base64.b64encode(self.ids).decode("ascii")}

    @classmethod
    def from_json(cls, identity: str, record) -> Examples:
        where = f"privacy ledger: examples of data sample {identity[:8]}…"
        if not isinstance(record, dict) or set(record) != {"key", "ids"}:
            raise UserError(f'{where} must be an object {{"key": ..., "ids": ...}}')
        if not isinstance(record["key"], str) or not re.fullmatch(r"[0-9a-f]{16}", record["key"]):
            raise UserError(f"{where}: key must be 16 hexadecimal digits")
        try:
            ids = base64.b64decode(record["ids"], validate=True) if isinstance(record["ids"], str) else None
        except ValueError:
            ids = None
        if not ids or len(ids) % 8:
            raise UserError(f"{where}: ids must be base64 of one or more 8-byte ids")
        examples = cls(record["key"], ids)
        if np.any(examples.array[1:] <= examples.array[:-1]):
            raise UserError(f"{where}: ids must be distinct and sorted")
        return examples


@dataclasses.dataclass(frozen=True)
class Account:
    """Examples trained on by exactly the same runs: their ε composes `events`."""

    events: tuple  # the DpEvents, in training order
    samples: frozenset  # identities of the data samples holding these examples
    examples: int | None  # how many (None: not recorded)


class Ledger:
    """The DP events behind one model, in training order, and the examples of the data samples they name."""

    def __init__(self, events: Iterable[DpEvent] = (), examples: dict | None = None):
        self.events = list(events)
        self.examples = dict(examples or {})  # data sample identity -> Examples

    def add(self, event: DpEvent) -> None:
        self.events.append(event)

    def add_examples(self, examples: dict) -> None:
        """Record the examples of data samples ({identity: Examples}); a sample already recorded must agree."""
        for identity, named in examples.items():
            if self.examples.setdefault(identity, named) != named:
                raise UserError(f"data sample {identity[:8]}… is recorded with two different sets of examples: a model "
                                "file was edited or damaged; its privacy figure cannot be trusted")

    def to_json(self) -> dict:
        return {"events": [e.to_json() for e in self.events],
                "examples": {identity: self.examples[identity].to_json() for identity in sorted(self.examples)}}

    @classmethod
    def from_json(cls, records) -> Ledger:
        """A ledger as `to_json` writes it, or a list of events (written before examples were recorded: every
        run is then accounted as touching every example)."""
        if isinstance(records, list):
            return cls(DpEvent.from_json(r) for r in records)
        if not isinstance(records, dict) or set(records) != {"events", "examples"} \
                or not isinstance(records["events"], list) or not isinstance(records["examples"], dict):
            raise UserError('privacy ledger must be an object {"events": [...], "examples": {...}}')
        ledger = cls((DpEvent.from_json(r) for r in records["events"]),
                     {identity: Examples.from_json(identity, named) for identity, named in records["examples"].items()})
        ledger.check_examples()
        return ledger

    def check_examples(self) -> None:
        """Each run's examples, when recorded, are as many as its n, distinct, and every sample has its own."""
        for event in self.events:
            named = [self.examples[i] for i in event.data if i in self.examples]
            if not named:
                continue
            if len(named) < len(event.data):
                raise UserError(f"privacy ledger: a {event.framework} run records the examples of some of its data "
                                "samples only: the file was edited or damaged; its privacy figure cannot be trusted")
            distinct = sum(len(np.unique(np.concatenate([e.array for e in named if e.key == key])))
                           for key in {e.key for e in named})
            if sum(map(len, named)) != event.n or distinct != event.n:
                raise UserError(f"privacy ledger: a {event.framework} run of n = {event.n} names "
                                f"{sum(map(len, named))} examples ({distinct} distinct): the file was edited or "
                                "damaged; its privacy figure cannot be trusted")

    def accounts(self) -> list:
        """The examples trained on, grouped by the runs that trained on them: [Account]. The ε of an example
        composes its account's events. An example named under one key may be any example named under another
        (they cannot be compared), so a run on other keys' data counts for it too; a run whose examples are not
        recorded (an older ledger) counts for every example."""
        events = self.events
        if not events:
            return []
        every_sample = frozenset(i for e in events for i in e.data)
        if any(i not in self.examples for e in events for i in e.data):
            return [Account(tuple(events), every_sample, None)]
        groups: dict = {}
        for key in sorted({self.examples[i].key for i in every_sample}):
            samples = sorted(i for i in every_sample if self.examples[i].key == key)
            arrays = [self.examples[i].array for i in samples]
            universe = np.unique(np.concatenate(arrays))
            holds = {i: np.isin(universe, array, assume_unique=True) for i, array in zip(samples, arrays)}
            columns = []
            for event in events:
                own = [holds[i] for i in event.data if i in holds]
                if len(own) < len(event.data):  # some of its data is under another key: may be any of these
                    columns.append(np.ones(len(universe), dtype=bool))
                else:
                    columns.append(np.logical_or.reduce(own) if own else np.zeros(len(universe), dtype=bool))
            matrix = np.stack(columns + [holds[i] for i in samples], axis=1)
            # One row per distinct pattern (rows packed to bytes: np.unique on them is fast).
            packed = np.packbits(matrix, axis=1)
            _, first, counts = np.unique(packed.view(np.dtype((np.void, packed.shape[1]))).ravel(),
                                         return_index=True, return_counts=True)
            for row, count in zip(matrix[first], counts):
                touched = tuple(np.flatnonzero(row[:len(events)]))
                held = {samples[j] for j in np.flatnonzero(row[len(events):])}
                group = groups.setdefault(touched, [set(), 0])
                group[0] |= held
                group[1] += int(count)
        return [Account(tuple(events[i] for i in touched), frozenset(held), count)
                for touched, (held, count) in groups.items() if touched]

    def epsilon(self, delta: float, accountant: str = REPORTED_ACCOUNTANT, data: Iterable[str] | None = None) -> float:
        """Worst-case ε at δ over the examples (restricted to those of the data samples `data` if given)."""
        wanted = None if data is None else set(data)
        worst = 0.0
        for account in self.accounts():
            if wanted is None or account.samples & wanted:
                worst = max(worst, compose_epsilon(account.events, delta, accountant))
        return worst

    def histories(self, data: Sequence[str]) -> list:
        """The earlier runs of the examples of data samples `data` (recorded in `examples`), as the distinct
        lists of runs that trained on one of them, without the lists another one contains ([[]]: none did)."""
        probe = DpEvent("next run", tuple(data), sum(len(self.examples[i]) for i in data), 1.0, 1.0, 1, PER_EXAMPLE,
                        1.0)
        position = {id(e): k for k, e in enumerate(self.events)}
        found = {frozenset(position[id(e)] for e in account.events if e is not probe)
                 for account in Ledger([*self.events, probe], self.examples).accounts()
                 if any(e is probe for e in account.events)}
        found = [h for h in found if not any(h < other for other in found)]
        return sorted(([self.events[k] for k in sorted(h)] for h in found), key=len, reverse=True) or [[]]


def merge(ledgers: Sequence[Ledger]) -> Ledger:
    """The ledger of a model averaged from several models (federated averaging): every training run of every
    input, once. Averaging is post-processing, so nothing is added. Runs are told apart by `run_id`: the global
    model's history, present in every input, is counted once, and each input's own new runs are all kept;
    `accounts` then composes per example: in parallel across organisations' disjoint examples, in sequence for
    an example two of them hold."""
    merged, seen, examples = [], {}, Ledger()
    for ledger in ledgers:
        examples.add_examples(ledger.examples)
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
    return Ledger(merged, examples.examples)


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
    """Smallest σ (within `tol`, rounded up; none that gives a step less than MIN_NOISE_MULTIPLIER) such that
    prior_events + this run stay within ε at δ (PLD). σ is the gradient noise of the first steps; the rest of
    `schedule` (decay, count noise) is kept. `repeats`: the run is repeated that many times (rounds of training on
    the same data)."""
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
        least = least_sigma(schedule, steps)
        if least > MAX_NOISE_MULTIPLIER:  # privacy_plan.check_noise names the setting to change
            raise ValueError(f"the noise schedule needs σ = {least:.3g} for every step to have at least "
                             f"{MIN_NOISE_MULTIPLIER}, more than {MAX_NOISE_MULTIPLIER:g}")
        check_target_reachable(target_epsilon, delta, sample_rate, steps, schedule, prior_events, repeats)
        return _calibrate(make_event, pld_epsilon, target_epsilon, delta, tol, least, MAX_NOISE_MULTIPLIER)
    except (ValueError, ArithmeticError, RuntimeError, mechanism_calibration.NoBracketIntervalFoundError,
            mechanism_calibration.NoOptimumFoundError) as exc:  # dp_accounting's numerics gave up
        raise UserError(f"target_epsilon = {target_epsilon}: no noise multiplier found for it at δ = {delta:g} "
                        f"with q = {sample_rate:.4g} over {steps} steps ({type(exc).__name__}: {exc}); "
                        "give noise_multiplier instead, or a smaller target_epsilon") from None


def check_target_reachable(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                           schedule: NoiseSchedule, prior_events: Sequence[DpEvent] = (), repeats: int = 1,
                           where: str = "") -> None:
    """Refuse a target that no σ up to MAX_NOISE_MULTIPLIER meets (PLD; `prior_events` and `repeats` runs of `steps`
    steps included): adaptive clipping's noisy count alone spends it (the gradient's noise only adds to a step's ε),
    or the run has too many steps for it. `schedule` must pass privacy_plan.check_noise."""
    prior = [segment for e in prior_events for segment in e.segments()]

    def spent(sigma: float) -> float:
        run = [(sample_rate, effective, count) for effective, count in schedule.with_sigma(sigma).segments(steps)]
        return _epsilon(_counts(prior + run * repeats), delta, REPORTED_ACCOUNTANT)

    most = spent(MAX_NOISE_MULTIPLIER)
    if most <= target_epsilon:
        return
    prefix = f"{where}: target_epsilon = {target_epsilon}" if where else f"target_epsilon = {target_epsilon}"
    over = f"at δ = {delta:g} over {steps * repeats} steps{' after the input model' if prior_events else ''}"
    if schedule.count_noise_multiplier and spent(math.inf) >= target_epsilon:  # σ = inf: the count's noise alone
        raise UserError(f"{prefix}: adaptive clipping's noisy count alone spends ε = {spent(math.inf):.3f} {over}, so "
                        "no gradient noise can meet the target; raise clip_count_stddev (the count's noise) or "
                        "target_epsilon, or set clip_quantile to null")
    raise UserError(f"{prefix}: even noise_multiplier = {MAX_NOISE_MULTIPLIER:g}, the most allowed, spends "
                    f"ε = {most:.3g} {over}; raise target_epsilon{' or noise_decay' if schedule.decay_steps else ''}, "
                    "or train fewer epochs")


def least_sigma(schedule: NoiseSchedule, steps: int) -> float:
    """The least σ whose every step (decay and count noise included) has an effective noise multiplier of at least
    MIN_NOISE_MULTIPLIER (inf: none, the count's noise is too small): the lower end of a calibration."""
    count = schedule.count_noise_multiplier
    room = MIN_NOISE_MULTIPLIER ** -2 - (count ** -2 if count else 0.0)  # what the gradient may add to a step's σ⁻²
    if room <= 0:
        return math.inf
    # A hair above it, so that the σ found passes the floor again where a task is handed it (noise_for_rounds).
    return room ** -0.5 / schedule.with_sigma(1.0).gradient_sigma(steps - 1) * (1 + 1e-9)


def _calibrate(make_event, pld_epsilon, target_epsilon: float, delta: float, tol: float, least: float,
               most: float) -> float:
    # σ is searched in [least, most] (the floors of every step's noise and the ceiling; PLD meets the target at
    # `most`: check_target_reachable). When `least` meets it, it is the answer: ε below the target, never above. PLD
    # is slow for small σ, so bracket it with RDP first: RDP over-estimates ε, hence the RDP-calibrated σ is an
    # upper end for PLD.
    def rdp_epsilon(sigma: float) -> float:
        return rdp.RdpAccountant().compose(make_event(sigma)).get_epsilon(delta)

    if rdp_epsilon(least) <= target_epsilon and pld_epsilon(least) <= target_epsilon:
        return round(math.ceil(least / tol) * tol, 6)
    upper = most  # where only PLD's figure meets the target below the ceiling (the count's noise comes close)
    if rdp_epsilon(most) <= target_epsilon:
        upper = min(most, dp_accounting.calibrate_dp_mechanism(
            rdp.RdpAccountant, make_event, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(least, most),
            tol=tol) + tol)
    lower = max(upper / 2, least)
    while pld_epsilon(lower) <= target_epsilon:
        if lower == least:
            return round(math.ceil(least / tol) * tol, 6)
        upper, lower = lower, max(lower / 2, least)
    sigma = dp_accounting.calibrate_dp_mechanism(
        pld.PLDAccountant, make_event, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(lower, upper),
        tol=tol
    )
    # Brent's method lands within tol of the optimum on either side: step up until the budget holds (at `most` it
    # does).
    sigma = math.ceil(sigma / tol) * tol
    while sigma < most and pld_epsilon(sigma) > target_epsilon:
        sigma += tol
    return round(min(sigma, most), 6)
