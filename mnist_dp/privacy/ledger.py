"""The privacy ledger a model file carries: its DP events in training order and the examples they
trained on.

Accounting unit: an organisation's record. Neighbouring datasets differ by adding or removing one
example (the image with its label, as the model sees it) of one organisation's data. Each
organisation names its examples by a 64-bit HMAC of their content under its own secret identity key,
stored with its data samples and never sent to anyone (the opener computes both). Inside one
organisation (one key) an example's ε composes every run that trained on it, whichever data sample
held it: re-splitting or re-registering the same data cannot reset an account, and runs on disjoint
examples compose in parallel. Examples named under different keys are different organisations'
records: a run on one organisation's data does not touch another's, so each organisation's ε is that
of its own examples. An individual whose records several organisations hold is covered by the
composition of all their runs (`epsilon_in_every_organization`), which the statement gives beside
the headline. Whoever holds a candidate example but not the organisation's key cannot tell from a
released ledger whether it was trained on.
"""
from __future__ import annotations

import base64
import dataclasses
import re
from collections.abc import Iterable, Sequence

import numpy as np

from mnist_dp.privacy.accountant import REPORTED_ACCOUNTANT, compose_epsilon
from mnist_dp.privacy.events import (
    NO_CLIPPING,
    PER_EXAMPLE,
    PER_PERSON,
    DpEvent,
    validation_mask,
)
from mnist_dp.utils.errors import UserError


@dataclasses.dataclass(frozen=True)
class Examples:
    """The examples of one data sample as a ledger names them: `key`, the id of the sample's
    identity key, and `ids`, the examples' keyed 64-bit ids (the opener's example_ids), sorted, as
    big-endian bytes."""

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
            ids = base64.b64decode(record["ids"], validate=True) if isinstance(record["ids"],
                                   str) else None
        except ValueError:
            ids = None
        if not ids or len(ids) % 8:
            raise UserError(f"{where}: ids must be base64 of one or more 8-byte ids")
        examples = cls(record["key"], ids)
        if np.any(examples.array[1:] <= examples.array[:-1]):
            raise UserError(f"{where}: ids must be distinct and sorted")
        return examples


def unit_ids(sample: dict) -> np.ndarray:
    """The keyed id of the privacy unit of each image of one of the opener's data samples (an entry
    of get_data's "samples"): its person's ("persons", from subjects.npy), or its own ("examples").
    uint64 [n], in the order of its images."""
    return np.asarray(sample["persons"] if "persons" in sample else sample["examples"], np.uint64)


def persons_of(data: dict) -> np.ndarray | None:
    """Each image's person in the opener's `data` (get_data's dict), as an index 0..P-1 into its P
    persons, when a data sample names them (subjects.npy; an image of a sample that does not is a
    person of its own); None when none does. Refused (UserError) when the samples are under several
    identity keys: one person's images under two keys would be two persons here."""
    samples = data["samples"]
    if not any("persons" in s for s in samples):
        return None
    if len({s["key"] for s in samples}) > 1 or any(s.get("aliases") for s in samples):
        raise UserError("subjects.npy: the data samples are under several identity keys (or "
                        "organization.keys), and a person's images under two keys would count as "
                        "two persons; train per person on samples under one key")
    _, index = np.unique(np.concatenate([unit_ids(s) for s in samples]), return_inverse=True)
    return index


@dataclasses.dataclass(frozen=True)
class Account:
    """Examples trained on by exactly the same runs: their ε composes `events`."""

    # the DpEvents, in training order (a search's as these examples see it: Ledger.parts)
    events: tuple
    samples: frozenset  # identities of the data samples holding these examples
    examples: int | None  # how many (None: not recorded)
    runs: tuple  # the position of each of `events` in the ledger


class Ledger:
    """The DP events behind one model, in training order, and the examples of the data samples they
    name."""

    def __init__(self, events: Iterable[DpEvent] = (), examples: dict | None = None,
                 aliases: dict | None = None):
        self.events = list(events)
        self.examples = dict(examples or {})  # data sample identity -> Examples
        # data sample identity -> {key id: Examples}: some of its examples as named under another
        # key of their organisation (`link`): a run on the sample trains on them too
        self.aliases = {identity: dict(named) for identity, named in (aliases or {}).items()}

    def copy(self, events: Iterable[DpEvent] | None = None) -> Ledger:
        """The same examples and aliases, with `events` (default: these)."""
        return Ledger(self.events if events is None else events, self.examples, self.aliases)

    def add(self, event: DpEvent) -> None:
        self.events.append(event)

    def add_examples(self, examples: dict) -> None:
        """Record the examples of data samples ({identity: Examples}); a sample already recorded
        must agree."""
        for identity, named in examples.items():
            if self.examples.setdefault(identity, named) != named:
                raise UserError(f"data sample {identity[:8]}… is recorded with two different sets "
                                "of examples: a model file was edited or damaged; its privacy "
                                "figure cannot be trusted")

    def add_samples(self, samples: list) -> tuple:
        """Record the privacy units of the opener's data samples (get_data's "samples"): their
        persons, or their examples (unit_ids); returns their identities."""
        self.add_examples({s["identity"]: Examples.of(s["key"], np.unique(unit_ids(s)))
                           for s in samples})
        return tuple(s["identity"] for s in samples)

    def add_aliases(self, aliases: dict) -> None:
        """Record other names of samples' examples ({identity: {key id: Examples}}); names of one
        sample under one key are united (a name too many can only over-state ε)."""
        for identity, named in aliases.items():
            mine = self.aliases.setdefault(identity, {})
            for key, examples in named.items():
                mine[key] = examples if key not in mine else Examples.of(
                    key, np.union1d(mine[key].array, examples.array))

    def link(self, samples: list) -> int:
        """Know as the task's own examples those this ledger names under another key of their
        organisation. `samples`: the opener's data samples; one with "aliases" (its organisation's
        other keys: the opener's RING_FILE) names its examples under each. A recorded sample under
        one of those keys gets, for each of its ids that is one of these examples, that example's id
        under the task's key, as an alias: its runs then compose with the task's on the same image.
        Returns how many recorded samples were linked."""
        # (other key, own key) -> (ids under the other key, the same examples' ids under own key)
        pairs: dict = {}
        for sample in samples:
            for key, ids in (sample.get("aliases") or {}).items():
                other, own = pairs.get((key, sample["key"]), (np.empty(0, np.uint64),) * 2)
                pairs[(key, sample["key"])] = (
                    np.concatenate([other, np.asarray(ids, np.uint64)]),
                    np.concatenate([own, unit_ids(sample)]))
        linked = 0
        for identity, named in list(self.examples.items()):
            for (key, own_key), (other, own) in pairs.items():
                if named.key != key:
                    continue
                order = np.argsort(other)
                at = np.minimum(np.searchsorted(other[order], named.array), len(other) - 1)
                found = other[order][at] == named.array
                if found.any():
                    self.add_aliases(
                        {identity: {own_key: Examples.of(own_key, own[order[at[found]]])}})
                    linked += 1
        return linked

    def to_json(self) -> dict:
        aliases = {identity: [self.aliases[identity][key].to_json()
                              for key in sorted(self.aliases[identity])]
                   for identity in sorted(self.aliases)}
        return {"events": [e.to_json() for e in self.events],
                "examples": {identity: self.examples[identity].to_json()
                             for identity in sorted(self.examples)},
                **({"aliases": aliases} if aliases else {})}

    @classmethod
    def from_json(cls, records) -> Ledger:
        """A ledger as `to_json` writes it, or a list of events (written before examples were
        recorded: every run is then accounted as touching every example)."""
        if isinstance(records, list):
            return cls(DpEvent.from_json(r) for r in records)
        if not isinstance(records, dict) or set(records) - {"aliases"} != {"events", "examples"} \
                or not isinstance(records["events"], list) or not isinstance(records["examples"],
                                  dict) \
                or not isinstance(records.get("aliases", {}), dict):
            raise UserError('privacy ledger must be an object {"events": [...], "examples": {...}} '
                            '(and "aliases": {...})')
        ledger = cls((DpEvent.from_json(r) for r in records["events"]),
                     {identity: Examples.from_json(identity, named) for identity,
                      named in records["examples"].items()})
        for identity, named in records.get("aliases", {}).items():
            if identity not in ledger.examples or not isinstance(named, list):
                raise UserError(f"privacy ledger: aliases of data sample {identity[:8]}… must be a "
                                "list of the examples of a sample it records")
            ledger.add_aliases({identity: {e.key: e
                                           for e in (Examples.from_json(identity, n)
                                                     for n in named)}})
        ledger.check_examples()
        return ledger

    def check_examples(self) -> None:
        """Each run's units, when recorded, are as many as its n: its examples, distinct, every
        sample its own; or its persons (PER_PERSON), whose images several samples may hold. A run
        whose n is a declared public size is checked for the first only."""
        for event in self.events:
            named = [self.examples[i] for i in event.data if i in self.examples]
            if not named:
                continue
            if len(named) < len(event.data):
                raise UserError(f"privacy ledger: a {event.framework} run records the examples of "
                                "some of its data samples only: the file was edited or damaged; "
                                "its privacy figure cannot be trusted")
            distinct = sum(len(np.unique(np.concatenate([e.array for e in named if e.key == key])))
                           for key in {e.key for e in named})
            if event.clipping == NO_CLIPPING or event.public_size:  # n counts nothing here
                continue
            if distinct != event.n or (sum(map(len, named)) != event.n
                                       and event.clipping != PER_PERSON):
                raise UserError(f"privacy ledger: a {event.framework} run of n = {event.n} names "
                                f"{sum(map(len, named))} examples ({distinct} distinct): the file "
                                "was edited or damaged; its privacy figure cannot be trusted")

    def parts(self) -> list:
        """[(index of a run in `events`, the run as its examples are accounted)]: a run is one part,
        a search two, its training face (its examples outside the validation split) and its score
        face (those inside)."""
        parts = []
        for k, event in enumerate(self.events):
            parts.append((k, event))
            if event.search is not None:
                parts.append((k, dataclasses.replace(event, search=event.search.scored())))
        return parts

    def accounts(self) -> list:
        """The examples trained on, grouped by the runs that trained on them: [Account]. The ε of an
        example composes its account's events. A run touches the examples of the data samples it
        names, and only those: another key's examples are another organisation's records; a search's
        validation examples get its score face, the others its training face. A run whose examples
        are not recorded (an older ledger) counts for every example, and so does each face of a
        search there."""
        parts = self.parts()
        if not parts:
            return []
        every_sample = frozenset(i for e in self.events for i in e.data)
        if any(i not in self.examples for e in self.events for i in e.data):
            return [Account(tuple(event for _, event in parts), every_sample, None,
                            tuple(k for k, _ in parts))]
        groups: dict = {}
        keys = {self.examples[i].key
                for i in every_sample} | {k for i in every_sample for k in self.aliases.get(i, {})}
        for key in sorted(keys):
            # (sample, its examples under this key, named by it rather than by an alias)
            named = [(i, self.examples[i], True) for i in sorted(every_sample)
                     if self.examples[i].key == key] + [
                (i, self.aliases[i][key],
                 False) for i in sorted(every_sample) if key in self.aliases.get(i, {})]
            samples = [i for i, _, _ in named]
            universe = np.unique(np.concatenate([examples.array for _, examples, _ in named]))
            holds = [np.isin(universe, examples.array, assume_unique=True) for _, examples,
                     _ in named]
            columns = []
            for _, event in parts:
                own = [h for (i, _, direct), h in zip(named, holds) if i in event.data and direct]
                touched = np.logical_or.reduce(own) if own else np.zeros(len(universe), dtype=bool)
                if event.search is not None:
                    held_out = validation_mask(universe, event.search.validation_permille)
                    touched &= held_out if event.search.face == "score" else ~held_out
                # An alias's examples took both faces of a search: its split was
                # drawn by their other ids.
                aliased = [h for (i, _, direct), h in zip(named, holds) if i in event.data
                           and not direct]
                columns.append(np.logical_or.reduce([touched, *aliased]))
            matrix = np.stack(columns + holds, axis=1)
            # One row per distinct pattern (rows packed to bytes: np.unique on them is fast).
            packed = np.packbits(matrix, axis=1)
            _, first, counts = np.unique(packed.view(np.dtype((np.void, packed.shape[1]))).ravel(),
                                         return_index=True, return_counts=True)
            for row, count in zip(matrix[first], counts):
                touched = tuple(np.flatnonzero(row[:len(parts)]))
                held = {samples[j] for j in np.flatnonzero(row[len(parts):])}
                group = groups.setdefault(touched, [set(), 0])
                group[0] |= held
                group[1] += int(count)
        return [Account(tuple(parts[i][1] for i in touched), frozenset(held), count,
                        tuple(parts[i][0] for i in touched))
                for touched, (held, count) in groups.items() if touched]

    def epsilon(self, delta: float, accountant: str = REPORTED_ACCOUNTANT,
                data: Iterable[str] | None = None) -> float:
        """Worst-case ε at δ over the examples.

        Args:
          delta: δ.
          accountant: "pld" or "rdp" (a ledger with a search is composed by RDP).
          data: identities of data samples, whose examples alone count (None: every example).

        Returns:
          ε; 0.0 without an example.
        """
        return self.worst(delta, accountant, data)[0]

    def worst(self, delta: float, accountant: str = REPORTED_ACCOUNTANT,
              data: Iterable[str] | None = None) -> tuple:
        """The worst example at δ.

        Args:
          delta: δ.
          accountant: "pld" or "rdp" (a ledger with a search is composed by RDP).
          data: identities of data samples, whose examples alone count (None: every example).

        Returns:
          (ε, Account) of the worst example; (0.0, None) without one.
        """
        wanted = None if data is None else set(data)
        worst, which = 0.0, None
        for account in self.accounts():
            if wanted is None or account.samples & wanted:
                epsilon = compose_epsilon(account.events, delta, accountant)
                if which is None or epsilon > worst:
                    worst, which = epsilon, account
        return worst, which

    def touches_keys(self, event: DpEvent, keys: set) -> bool:
        """Whether `event` trained on examples named under one of the key ids `keys` (an
        organisation's), or may have (its examples not recorded)."""
        return any(i not in self.examples or self.examples[i].key in keys for i in event.data)

    def keys(self) -> list:
        """The ids of the identity keys its examples are named under: one per organisation whose
        data it trained on (empty for a ledger that names no examples)."""
        return sorted({named.key for named in self.examples.values()})

    def samples_under(self, key: str) -> list:
        """The identities of the data samples whose examples are named under key id `key` (one
        organisation's)."""
        return sorted(identity for identity, named in self.examples.items() if named.key == key)

    def epsilon_in_every_organization(self, delta: float,
                                      accountant: str = REPORTED_ACCOUNTANT) -> float:
        """ε at δ of an individual whose records every organisation holds (and every data sample):
        every run composed, each search by the worse of its two faces at every RDP order (one record
        may sit in one organisation's validation split and another in another's training split). The
        same as `epsilon` when the runs all trained on the same examples and none is a search."""
        return compose_epsilon([e if e.search is None
                                else dataclasses.replace(e, search=e.search.either())
                                for e in self.events], delta, accountant)

    def histories(self, data: Sequence[str]) -> list:
        """The earlier runs of the examples of data samples `data` (recorded in `examples`), as the
        distinct lists of runs that trained on one of them, without the lists another one contains
        ([[]]: none did)."""
        probe = DpEvent("next run", tuple(data), sum(len(self.examples[i]) for i in data), 1.0, 1.0,
                        1, PER_EXAMPLE, 1.0)
        last = len(self.events)  # the probe's position
        found = {frozenset((k, _face(e)) for e, k in zip(account.events, account.runs) if k != last)
                 for account in self.copy([*self.events, probe]).accounts() if last in account.runs}
        found = [h for h in found if not any(h < other for other in found)]
        part = {(k, _face(e)): e for k, e in self.parts()}
        return sorted(([part[k] for k in sorted(h)] for h in found), key=len, reverse=True) or [[]]


def _face(event: DpEvent) -> str:
    return event.search.face if event.search is not None else ""


def merge(ledgers: Sequence[Ledger]) -> Ledger:
    """The ledger of a model averaged from several models (federated averaging): every training run
    of every input, once. Averaging is post-processing, so nothing is added. Runs are told apart by
    `run_id`: the global model's history, present in every input, is counted once, and each input's
    own new runs are all kept; `accounts` then composes per example: in parallel across
    organisations' disjoint examples, in sequence for an example two of them hold."""
    merged, seen, examples = [], {}, Ledger()
    for ledger in ledgers:
        examples.add_examples(ledger.examples)
        examples.add_aliases(ledger.aliases)
        for event in ledger.events:
            if event.run_id is None:
                raise UserError(f"a {event.framework} training run in an input model's ledger has "
                                "no run id (a model written by an earlier version of this bundle): "
                                "its runs cannot be told from the other inputs'; train it again")
            if is_new(seen, event,
                      f"two input models record training run {event.run_id} differently: a file "
                      "was edited or damaged; their privacy figure cannot be trusted"):
                merged.append(event)
    return examples.copy(merged)


def is_new(seen: dict, event: DpEvent, differently: str) -> bool:
    """A union by run id: whether `event` is a run `seen` does not hold yet, adding it.

    Args:
      seen: {run id: event}, the runs so far; `event` is added when new.
      event: the run.
      differently: the message of the UserError that refuses the same run recorded twice
        differently.

    Returns:
      Whether `event` is new. Raises UserError `differently` when `seen` holds its run id with
      another event.
    """
    if event.run_id in seen:
        if seen[event.run_id] != event:
            raise UserError(differently)
        return False
    seen[event.run_id] = event
    return True


def own_runs(ledgers: Sequence[Ledger]) -> list:
    """For each ledger, its runs that are not in every one of `ledgers`: what each input model
    trained after the history they share (the global model they started from)."""
    shared = set.intersection(*({e.run_id for e in ledger.events} for ledger in ledgers))
    return [[e for e in ledger.events if e.run_id not in shared] for ledger in ledgers]
