"""The privacy ledger: DP events in training order and the data samples they trained on.

Accounting unit: an organisation's record. Neighbouring datasets differ by adding or removing one
example (the image with its label, as the model sees it) of one organisation's data; examples named
under different keys are different organisations' records. Two forms. The organisation's own record
(the data's ledger, its sealed ledger outputs, a task's ledger while it runs) names each example by
a 64-bit HMAC of its content under the organisation's secret identity key (examples.py), and an
example's ε composes every run that trained on it, whichever data sample held it: re-splitting the
same data cannot reset an account, and runs on disjoint examples compose in parallel. The released
form a model file and a shared state carry (`Ledger.released`) names no example, only each sample's
key id and its organisation's other keys (its ring), so nothing in it counts the data: each
organisation's ε composes every run on any of its samples (an upper bound). An individual whose
records several organisations hold is covered by the composition of all their runs
(`epsilon_in_every_organization`), which the statement gives beside the headline.
"""
from __future__ import annotations

import dataclasses
import itertools
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
from mnist_dp.privacy.examples import Examples, ring_of, unit_ids
from mnist_dp.utils.errors import UserError

# An organisation's searches whose faces a released ledger's accounts combine (2**k of them).
FACED_SEARCHES = 6


@dataclasses.dataclass(frozen=True)
class Account:
    """Examples trained on by exactly the same runs: their ε composes `events`."""

    events: tuple  # the DpEvents, in training order (a search's as these examples see it)
    samples: frozenset  # identities of the data samples holding these examples
    examples: int | None  # how many (None: not recorded)
    runs: tuple  # the position of each of `events` in the ledger


class Ledger:
    """The DP events behind one model, in training order, and the examples of the data samples they
    name."""

    def __init__(self, events: Iterable[DpEvent] = (), examples: dict | None = None,
                 aliases: dict | None = None, rings: dict | None = None):
        self.events = list(events)
        self.examples = dict(examples or {})  # data sample identity -> Examples
        # data sample identity -> {key id: Examples}: some of its examples as named under another
        # key of their organisation (`link`): a run on the sample trains on them too
        self.aliases = {identity: dict(named) for identity, named in (aliases or {}).items()}
        # data sample identity -> the ids of its organisation's other keys (the opener's RING_FILE)
        self.rings = {identity: tuple(sorted(ring)) for identity, ring in (rings or {}).items()
                      if ring}

    def copy(self, events: Iterable[DpEvent] | None = None) -> Ledger:
        """The same examples, aliases and rings, with `events` (default: these)."""
        return Ledger(self.events if events is None else events, self.examples, self.aliases,
                      self.rings)

    def released(self) -> Ledger:
        """This ledger as it leaves the organisation (a model file, a shared state): its runs, each
        sample's key id and ring, no example's id (their number would be the data's size)."""
        return Ledger(self.events, {i: Examples(e.key) for i, e in self.examples.items()},
                      rings=self.rings)

    @property
    def names_examples(self) -> bool:
        """Whether it names a sample's examples (an organisation's record, an older model file)."""
        return any(e.named for e in self.examples.values())

    def add(self, event: DpEvent) -> None:
        self.events.append(event)

    def add_examples(self, examples: dict) -> None:
        """Record the examples of data samples ({identity: Examples}); a sample already recorded
        must agree, or be unnamed under the same key (then named here)."""
        for identity, named in examples.items():
            known = self.examples.setdefault(identity, named)
            if known.key == named.key and not known.named:
                self.examples[identity] = named
            elif known != named and not (known.key == named.key and not named.named):
                raise UserError(f"data sample {identity[:8]}… is recorded with two different sets "
                                "of examples: a model file was edited or damaged; its privacy "
                                "figure cannot be trusted")

    def add_samples(self, samples: list) -> tuple:
        """Record the privacy units of the opener's data samples (get_data's "samples"): their
        persons, or their examples (unit_ids); returns their identities."""
        self.add_examples({s["identity"]: Examples.of(s["key"], np.unique(unit_ids(s)))
                           for s in samples})
        self.add_rings({s["identity"]: s.get("aliases") or () for s in samples})
        return tuple(s["identity"] for s in samples)

    def add_rings(self, rings: dict) -> None:
        """Record samples' organisations' other keys ({identity: key ids}), united with any
        recorded."""
        for identity, ring in rings.items():
            if ring:
                self.rings[identity] = tuple(sorted({*self.rings.get(identity, ()), *ring}))

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
                "examples": {identity: {**self.examples[identity].to_json(),
                                        **({"ring": list(self.rings[identity])}
                                           if identity in self.rings else {})}
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
                     {identity: Examples.from_json(identity, named, ring=False) for identity,
                      named in records["examples"].items()},
                     rings={identity: ring_of(identity, named) for identity,
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
            if not named or not all(e.named for e in named):  # the released form counts nothing
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
        """The examples trained on, grouped by the runs that trained on them: [Account], each
        example's ε composing its account's events. A run touches the examples of the samples it
        names, and only those; a search's validation examples get its score face, the others its
        training face. A sample whose examples are not named may hold any of its organisation's: a
        run on it touches them all, with both faces of a search; a ledger that names none is counted
        per organisation (`_organisation_accounts`); one whose runs' samples are not recorded (an
        older ledger), every run for every example."""
        parts = self.parts()
        if not parts:
            return []
        every_sample = frozenset(i for e in self.events for i in e.data)
        if any(i not in self.examples for e in self.events for i in e.data):
            return [Account(tuple(event for _, event in parts), every_sample, None,
                            tuple(k for k, _ in parts))]
        organisation = self.organisations(every_sample)
        if not any(self.examples[i].named for i in every_sample):
            return self._organisation_accounts(organisation)
        groups: dict = {}
        keys = {self.examples[i].key
                for i in every_sample} | {k for i in every_sample for k in self.aliases.get(i, {})}
        for key in sorted(keys):
            # (sample, its examples under this key, named by it rather than by an alias)
            named = [(i, self.examples[i], True) for i in sorted(every_sample)
                     if self.examples[i].key == key and self.examples[i].named] + [
                (i, self.aliases[i][key],
                 False) for i in sorted(every_sample) if key in self.aliases.get(i, {})]
            unnamed = [i for i in sorted(every_sample)
                       if not self.examples[i].named and key in organisation[i]]
            samples = [i for i, _, _ in named] + unnamed
            universe = np.unique(np.concatenate([examples.array for _, examples, _ in named]
                                                or [np.empty(0, np.uint64)]))
            # with unnamed samples, one more: an example none of the named samples holds
            size = len(universe) + bool(unnamed)
            holds = [_padded(np.isin(universe, examples.array, assume_unique=True), size) for _,
                     examples, _ in named] + [np.ones(size, dtype=bool) for _ in unnamed]
            columns = []
            for _, event in parts:
                own = [h for (i, _, direct), h in zip(named, holds) if i in event.data and direct]
                touched = np.logical_or.reduce(own) if own else np.zeros(size, dtype=bool)
                if event.search is not None:
                    held_out = _padded(validation_mask(universe, event.search.validation_permille),
                                       size)
                    touched &= held_out if event.search.face == "score" else ~held_out
                # An alias's examples took both faces of a search: its split was
                # drawn by their other ids; so did an unnamed sample's.
                other = [h for (i, _, direct), h in zip(named, holds) if i in event.data
                         and not direct] + [
                    h for i, h in zip(unnamed, holds[len(named):]) if i in event.data]
                columns.append(np.logical_or.reduce([touched, *other]))
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

    def organisations(self, identities) -> dict:
        """{identity: the key ids of its organisation}, for the recorded data samples `identities`:
        keys its samples' rings (or aliases) join are one organisation's."""
        parent: dict = {}

        def root(key):
            while parent.setdefault(key, key) != key:
                key = parent[key]
            return key

        for i in identities:
            for other in (*self.rings.get(i, ()), *self.aliases.get(i, {})):
                parent[root(other)] = root(self.examples[i].key)
        members: dict = {}
        for key in [self.examples[i].key for i in identities] + list(parent):
            members.setdefault(root(key), set()).add(key)
        return {i: frozenset(members[root(self.examples[i].key)]) for i in identities}

    def _organisation_accounts(self, organisation: dict) -> list:
        """For each organisation of `organisation` ({identity: its keys}), its examples not
        counted: every run on any of its samples, each search by a face one of its examples may see
        (one Account per combination: an example is on one side of each split; past FACED_SEARCHES
        searches, each by its worse face at every order, Search.either)."""
        accounts = []
        for keys in sorted(set(organisation.values()), key=sorted):
            samples = frozenset(i for i, org in organisation.items() if org == keys)
            runs = tuple(k for k, e in enumerate(self.events) if samples & set(e.data))
            searches = [k for k in runs if self.events[k].search is not None]
            for faces in (itertools.product(("training", "score"), repeat=len(searches))
                          if len(searches) <= FACED_SEARCHES else [("either",) * len(searches)]):
                face = dict(zip(searches, faces))
                accounts.append(Account(tuple(_faced(self.events[k], face.get(k)) for k in runs),
                                        samples, None, runs))
        return accounts

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
        return compose_epsilon([_faced(e, "either") for e in self.events], delta, accountant)

    def histories(self, data: Sequence[str]) -> list:
        """The earlier runs a next run on data samples `data` (recorded in `examples`) counts, one
        list per organisation they belong to: every run on any of its samples, a search by its
        worse face (the released form's accounts). What the run releases (σ, where its budget stops
        it) then depends on which runs touched which samples, never on which examples they shared.
        [[]]: none."""
        probe = DpEvent("next run", tuple(data), 1, 1.0, 1.0, 1, PER_EXAMPLE, 1.0)
        last = len(self.events)  # the probe's position
        found = [[e for e, k in zip(account.events, account.runs) if k != last]
                 for account in self.released().copy([*self.events, probe]).accounts()
                 if last in account.runs]
        return sorted(found, key=len, reverse=True) or [[]]


def _padded(mask: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([mask, np.zeros(size - len(mask), dtype=bool)])


def _faced(event: DpEvent, face: str | None) -> DpEvent:
    """`event`, a search seen by its `face` ("training", "score" or "either"); None: as it is."""
    if event.search is None or face is None:
        return event
    return dataclasses.replace(event, search=dataclasses.replace(event.search, face=face))


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
        examples.add_rings(ledger.rings)
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
