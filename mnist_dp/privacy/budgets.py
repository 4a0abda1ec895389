"""What a run on an organisation's data may spend, known before its plan (`Budget`, the first of a
train task's four phases: budget -> plan -> run -> record), and the budgets it must keep: the algo's
max_epsilon and its data owner's (policy.py), each ε at its δ over every run the data's ledger
records. A train task stops at the last step within all of them (task_plan.for_task); a run that
cannot stop early is refused when it could pass one (`check_whole_run`).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.privacy import accountant, data_ledger, policy
from mnist_dp.privacy.examples import persons_of
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.policy import Policy, plan_size
from mnist_dp.privacy.units import IMAGE, PrivacyUnit
from mnist_dp.privacy.units import of as units_of
from mnist_dp.utils import words
from mnist_dp.utils.errors import UserError

# substratools configures the "substratools" logger (level from --log-level); log under it.
log = logging.getLogger("substratools.mnist_dp")

NO_POLICY = Policy()  # data whose owner set no policy: the algo's hyperparameters decide


@dataclass(frozen=True)
class Budget:
    """What a run on some data may spend, before σ and the steps are decided: its unit and how many
    there are, the earlier runs it counts, and its data owner's policy.

    Attributes:
      n: the data's public size (policy.plan_size), in units: training examples, or persons.
      unit: the privacy unit clipped and counted (units.IMAGE, or PERSON bound to the data's
        persons: units.of).
      identities: the keyed identities of the run's data samples (its event's `data`).
      histories: the earlier runs on the data in the input model's ledger, one list per
        organisation (Ledger.histories; ((),) for none): σ is calibrated for the worst of them.
      budget_histories: the histories the budgets count (the input model's ledger joined with
        the data's own: data_ledger.union); None: `histories`.
      owner: the data owner's policy, whose budgets hold beside hp.max_epsilon.
      passes_on: whether a run that the budgets stop before its first step passes its input model
        on (received from elsewhere, its ledger lacking none of the data's runs); else it is
        refused.
    """

    n: int
    unit: PrivacyUnit = IMAGE
    identities: tuple = ()
    histories: tuple = ((),)
    budget_histories: tuple | None = None
    owner: Policy = NO_POLICY
    passes_on: bool = False

    @property
    def counted(self) -> tuple:
        """The histories the budgets count."""
        return self.histories if self.budget_histories is None else self.budget_histories


def budgets(hp: Hyperparameters, owner: Policy = NO_POLICY) -> list:
    """[(ε, δ, what names it)]: every budget a run on the data must keep, the algo's max_epsilon
    and its data owner's (which the algo can only lower)."""
    return ([(hp.max_epsilon, hp.delta, "max_epsilon")] if hp.max_epsilon is not None else []) + [
        (epsilon, delta, f"the data owner's max_epsilon ({owner.source})")
        for epsilon, delta in owner.budgets]


def check_whole_run(owner: Policy, histories, epsilon: float | None, delta: float,
                    what: str) -> None:
    """Refuse a run that cannot stop early (a search) where it could pass a budget of the data
    owner's policy `owner`.

    Args:
      owner: the data owner's policy.
      histories: the earlier runs it counts (Ledger.histories).
      epsilon: the run's own ε at `delta` (its target), or None: unknown, refused with a
        budget.
      delta: the run's δ.
      what: names the run in the UserError.

    By basic composition the run and its history are (ε_h + ε, δ_h + δ)-DP: each budget (ε_b,
    δ_b) holds when δ ≤ δ_b and ε_h, the history's ε at δ_h = δ_b − δ, plus ε is at most ε_b.
    """
    for budget, budget_delta in owner.budgets:
        rest = budget_delta - delta
        earlier = [h for h in histories if h]
        if rest > 0:
            spent = max((accountant.compose_epsilon(h, rest) for h in earlier), default=0.0)
        else:
            spent = math.inf if earlier or rest < 0 else 0.0
        if epsilon is None or spent + epsilon > budget:
            told = ("its ε is unknown (no target_epsilon)" if epsilon is None else
                    f"its ε {epsilon:g} at δ = {delta:g} after what the data has spent "
                    f"({spent:.3f} at δ = {max(rest, 0):g}) could pass it")
            raise UserError(f"{owner.source}: the data owner's max_epsilon = {budget:g} at "
                            f"delta = {budget_delta:g}: {what} cannot stop early, and {told}; "
                            "nothing was trained: give it a smaller target_epsilon or "
                            "delta, or train on other data")


def of_task(framework: str, clips_per_person: bool, ledger: Ledger, data: dict,
            hp: Hyperparameters, spent: data_ledger.Held | None, continuing: bool) -> Budget:
    """The budget of a train task's run on the opener's `data`: its unit (per_person), the data's
    public size in it, the histories σ and the budgets count, and the owner's policy, checked
    against hp here.

    Args:
      framework: the algo's name.
      clips_per_person: whether the algo can clip per person (Framework.per_person).
      ledger: the input model's ledger (empty for a new model): the data's samples are added to it,
        and, when `continuing`, the data's own runs that it lacks.
      data: the opener's data, refused if it holds copies of an example.
      hp: the hyperparameters.
      spent: the data's own ledger, held (data_ledger.held), or None in memory.
      continuing: whether the model was received from elsewhere.

    Returns:
      The Budget. Raises UserError for copies, a unit the algo or the earlier runs cannot take, or
      a run the owner's policy does not allow.
    """
    refuse_copies(data)
    absorbed = take_in_own_runs(ledger, spent, data["samples"], continuing)
    unit, owner = allowed_unit(framework, clips_per_person, data, hp, {
        "the input model's ledger": ledger,
        "this data's own ledger": spent.ledger if spent is not None else None})
    identities = ledger.add_samples(data["samples"])
    histories = ledger.histories(identities)
    n = plan_size(data, unit, len(data["labels"]))
    # the budgets count every run of the data: the input model's and the data's own ledger's
    everything = None if spent is None else data_ledger.union(ledger, spent.ledger).histories(
        identities)
    return Budget(n, unit, tuple(identities), tuple(map(tuple, histories)),
                  None if everything is None else tuple(map(tuple, everything)), owner,
                  continuing and not absorbed)


def of_search(framework: str, clips_per_person: bool, earlier: Ledger, data: dict,
              hp: Hyperparameters) -> Budget:
    """The budget of a tune task's search on the opener's `data`, after the runs its own ledger
    `earlier` records: its unit, the data's public size in it (validation split included) and the
    owner's policy, checked against hp. A search cannot stop early: where it could pass a budget
    of the owner's, it is refused here (check_whole_run).

    Args:
      framework: the algo's name.
      clips_per_person: whether the algo can clip per person (Framework.per_person).
      earlier: the data's own ledger.
      data: the opener's data, refused if it holds copies of an example.
      hp: the hyperparameters the search searches around.

    Returns:
      The Budget (its histories the data's own ledger's). Raises UserError as of_task does, and
      for a search that could pass the owner's budget.
    """
    refuse_copies(data)
    unit, owner = allowed_unit(framework, clips_per_person, data, hp,
                               {"this data's own ledger": earlier})
    histories = data_ledger.histories(earlier, data["samples"])
    check_whole_run(owner, histories, hp.target_epsilon, hp.delta, "a search")
    return Budget(plan_size(data, unit, len(data["labels"])), unit,
                  tuple(s["identity"] for s in data["samples"]), tuple(map(tuple, histories)),
                  owner=owner)


def refuse_copies(data: dict) -> None:
    """Refuse the opener's data if it holds copies of an example: trained twice, it would be
    accounted once."""
    if data.get("copies"):
        raise UserError(data["copies"])


def allowed_unit(framework: str, clips_per_person: bool, data: dict, hp: Hyperparameters,
                 earlier: dict) -> tuple:
    """(the run's PrivacyUnit: per_person's, the data owner's Policy), the run checked against
    that policy (per example where it asks for persons, without DP, with a noise_seed)."""
    unit = per_person(framework, clips_per_person, data, hp, earlier)
    owner = policy.of_data(data)
    owner.check_allowed(hp.dp, hp.noise_seed, unit.grouped)
    return unit, owner


def per_person(framework: str, clips_per_person: bool, data: dict, hp: Hyperparameters,
               earlier: dict) -> PrivacyUnit:
    """The run's unit: PERSON bound to each image's person (examples.persons_of) when `data`
    names persons and the run is private, else IMAGE. Refused in one line where the algo
    `framework` cannot train per person (`clips_per_person` False), or where a ledger of `earlier`
    ({whose: Ledger}) holds private runs of the other unit on this organisation's data: a person's
    runs and their images' runs would be accounted apart."""
    unit = units_of(persons_of(data) if hp.dp else None)
    if unit.grouped and not clips_per_person:
        raise UserError(f"subjects.npy: {framework} does not clip per person; train this "
                        "data with an algo that does, or without subjects.npy per image")
    clipping, keys = unit.clipping, {s["key"] for s in data["samples"]}
    for whose, known in earlier.items():
        other = sorted({e.clipping for e in known.events if e.is_private and e.clipping != clipping
                        and known.touches_keys(e, keys)}) if known is not None and hp.dp else []
        if other:
            raise UserError(f"{whose} records runs clipped {other[0]} on this organisation's "
                            f"data, and this run would clip {clipping}: the two are not composed; "
                            "train with the privacy unit of the earlier runs (subjects.npy present "
                            "or absent as it was)")
    return unit


def take_in_own_runs(ledger: Ledger, spent: data_ledger.Held | None, samples: list,
                     continuing: bool) -> list:
    """Compose into the input model's `ledger` the runs that the data's own ledger (`spent`)
    records and it lacks, when the model was received from elsewhere (`continuing`); returns them.
    Either ledger names this organisation's examples under its other keys as the same examples."""
    for known in (ledger, spent.ledger if spent is not None else None):
        # only with the organisation's other keys
        if known is not None and known.link(samples):
            log.info("this organisation's examples named under another of its keys are counted as "
                     "the same examples")
    lacking = data_ledger.absorb(ledger, spent.ledger) if spent is not None and continuing else []
    if lacking:
        log.warning("the input model's ledger lacks %s that this organisation's own ledger "
                    "records on this data (%s): they are composed into this model's ε",
                    words.counted(len(lacking), "run"),
                    ", ".join(f"{e.framework} {e.run_id[:8]}" for e in lacking))
    return lacking
