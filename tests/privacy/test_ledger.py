"""mnist_dp/privacy/ledger.py: ε per example (parallel and sequential composition), the examples
table, merging the ledgers of averaged models."""
import dataclasses

import pytest
from conftest import dp_event

from mnist_dp.privacy import events
from mnist_dp.privacy import ledger as ledger_module
from mnist_dp.privacy.accountant import (
    compose_epsilon,
)
from mnist_dp.privacy.events import DpEvent
from mnist_dp.privacy.examples import Examples
from mnist_dp.privacy.ledger import Ledger, merge, own_runs
from mnist_dp.utils.errors import UserError

KEY = "0123456789abcdef"  # a key id: the examples below are named under one identity key

def named(samples: dict, key=KEY) -> dict:
    """An examples table: data sample identity -> Examples of the given ids (ranges stand for keyed
    ids)."""
    return {identity: Examples.of(key, list(ids)) for identity, ids in samples.items()}


def test_runs_on_disjoint_data_compose_in_parallel():
    ledger = Ledger([dp_event(4000, 250, 3, data=["a"]), dp_event(4000, 250, 3, data=["b"])],
                    named({"a": range(4000), "b": range(4000, 8000)}))
    single = Ledger([dp_event(4000, 250, 3)]).epsilon(1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(single, rel=1e-6)
    assert [account.examples for account in ledger.accounts()] == [4000, 4000]
    assert ledger.epsilon(1e-5, data=["b"]) == pytest.approx(single, rel=1e-6)


def test_an_example_in_two_samples_composes_both_runs_that_trained_on_it():
    # Two splits of the same data (other samples, other identities) sharing 100 examples: those 100
    # were trained on by both runs, and ε is theirs, the worst example's.
    runs = [dp_event(4000, 250, 3, data=["a"]), dp_event(4000, 250, 3, data=["b"])]
    ledger = Ledger(runs, named({"a": range(4000), "b": range(3900, 7900)}))
    both = compose_epsilon(runs, 1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    assert both > Ledger(runs[:1]).epsilon(1e-5) + 0.5
    assert sorted((a.examples, len(a.events))
                  for a in ledger.accounts()) == [(100, 2), (3900, 1), (3900, 1)]
    # its shared examples' runs: what a next run on "b" must add to
    assert ledger.histories(["b"]) == [runs]


def test_a_person_in_two_samples_of_a_run_composes_it_once():
    """Per person (subjects.npy): a sample's ids name persons, and a person whose images sit in two
    samples of one run is one of the run's n persons, trained on by it once."""
    run = dataclasses.replace(dp_event(300, 10, 2, data=["a", "b"]), clipping=events.PER_PERSON)
    ledger = Ledger([run], named({"a": range(200), "b": range(100, 300)}))  # 100 persons in both
    ledger = Ledger.from_json(ledger.to_json())  # its examples agree with its run
    assert ledger.epsilon(1e-5) == pytest.approx(compose_epsilon([run], 1e-5), rel=1e-9)
    assert [account.examples for account in ledger.accounts()] == [300]
    # per example, the same table would name 400 examples for a counted n = 300: refused
    with pytest.raises(UserError, match="names 400 examples"):
        Ledger.from_json(Ledger([dataclasses.replace(run, clipping=events.PER_EXAMPLE,
                                                     public_size=False)],
                                named({"a": range(200), "b": range(100, 300)})).to_json())


def test_examples_under_different_keys_are_different_organisations_records():
    runs = [dp_event(4000, 250, 3, data=["a"]), dp_event(4000, 250, 3, data=["b"])]
    one_run, both = compose_epsilon(runs[:1], 1e-5), compose_epsilon(runs, 1e-5)
    # Two organisations, each its own key: a run on one's data does not touch the other's
    # records, even where the ids happen to be equal (they are HMACs under different keys,
    # so equal ids say nothing).
    two_keys = {**named({"a": range(4000)}), **named({"b": range(4000)}, key="fedcba9876543210")}
    ledger = Ledger(runs, two_keys)
    assert ledger.keys() == [KEY, "fedcba9876543210"]
    assert ledger.epsilon(1e-5) == pytest.approx(one_run, rel=1e-9)
    assert ledger.epsilon(1e-5, data=["b"]) == pytest.approx(one_run, rel=1e-9)
    assert sorted(len(a.events) for a in ledger.accounts()) == [1, 1]
    assert ledger.histories(["b"]) == [[runs[1]]]  # a next run on b's data adds to b's run only
    # An individual whose records both organisations hold: both runs.
    assert ledger.epsilon_in_every_organization(1e-5) == pytest.approx(both, rel=1e-9)
    assert both > one_run + 0.5
    # One key, the same ids: the same examples, trained on by both runs.
    assert Ledger(runs, named({"a": range(4000),
                               "b": range(4000)})).epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    # a ledger that names no examples (a model file of format 2): every run counts for every example
    assert Ledger(runs).epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    assert Ledger.from_json([e.to_json()
                             for e in runs]).epsilon(1e-5) == pytest.approx(both, rel=1e-9)


@pytest.mark.parametrize("ids, message", [
    (range(3999), "n = 4000 names 3999 examples"),
    ([*range(3999), 5], "ids must be distinct and sorted"),
])
def test_a_ledger_whose_examples_disagree_with_its_runs_is_refused(ids, message):
    """A run whose n counted its examples (a ledger from before public sizes) must name as many."""
    counted = dataclasses.replace(dp_event(4000, 250, 3), public_size=False)
    record = Ledger([counted], named({"a": range(4000)})).to_json()
    table = Examples(KEY, b"".join(int(i).to_bytes(8, "big") for i in ids))
    with pytest.raises(UserError, match=message):
        Ledger.from_json({**record, "examples": {"a": table.to_json()}})


def test_a_run_of_a_declared_public_size_may_name_more_or_fewer_examples():
    """n is the size the data's owner declared, not a count: the data may hold a few more or
    fewer."""
    for count in (3999, 4001):
        ledger = Ledger.from_json(Ledger([dp_event(4000, 250, 3)],
                                         named({"a": range(count)})).to_json())
        assert ledger.accounts()[0].examples == count


def test_ledger_json_round_trip():
    ledger = Ledger([dp_event(4000, 250, 3, data=["x", "y"])],
                    named({"x": range(2000), "y": range(5000, 7000)}))
    again = Ledger.from_json(ledger.to_json())
    assert again.events == ledger.events and again.examples == ledger.examples


def run(data, steps=10, n=100):
    """A training run with its id, as a train task records it."""
    return dataclasses.replace(DpEvent("torch", data, n, 0.1, 1.0, steps, events.PER_EXAMPLE, 1.0,
                                       batch_size=10,
                                       planned_steps=max(steps, 10)), run_id=events.new_run_id())


def test_merged_ledgers_count_the_shared_history_once_and_every_new_run():
    history = [run(("a",)), run(("b",))]  # the global model: one run per organisation
    # round 2: both organisations train again from it, with runs equal in everything but their ids
    a2, b2 = run(("a",)), run(("b",))
    examples = named({"a": range(100), "b": range(100, 200)})
    inputs = [Ledger(history + [a2], examples), Ledger(history + [b2], examples)]
    merged = merge(inputs)
    assert merged.events == history + [a2, b2]
    assert own_runs(inputs) == [[a2], [b2]]
    # each organisation's ε: its two runs, recomputed from σ, q and steps alone;
    # the model's ε is the worst
    two_runs = compose_epsilon([DpEvent("torch", ("x",), 100, 0.1, 1.0, 20, events.PER_EXAMPLE,
                                        1.0)], 1e-5)
    assert merged.epsilon(1e-5, data=["a"]) == pytest.approx(two_runs, rel=1e-6)
    assert merged.epsilon(1e-5) == pytest.approx(two_runs, rel=1e-6)
    # the same run given twice is one run; a second run on the same data,
    # identical but for its id, is two
    assert merge([Ledger(history + [a2])] * 2).events == history + [a2]
    twin = dataclasses.replace(a2, run_id=events.new_run_id())
    assert len(merge([Ledger([a2]), Ledger([twin])]).events) == 2


def test_a_merge_refuses_runs_it_cannot_tell_apart():
    # no run id: an earlier version's
    old = DpEvent("torch", ("a",), 100, 0.1, 1.0, 10, events.PER_EXAMPLE, 1.0)
    with pytest.raises(UserError, match="has no run id"):
        merge([Ledger([old]), Ledger([run(("b",))])])
    a = run(("a",))
    with pytest.raises(UserError, match=f"record training run {a.run_id} differently"):
        merge([Ledger([a]), Ledger([dataclasses.replace(a, steps=5)])])


def test_a_samples_examples_linked_under_its_organisations_other_key_compose_with_the_runs_there():
    # "a" under KEY and "b" under OTHER hold the same 4000 images; the task on "b" knows its images'
    # ids under KEY (its ring), so it links "a": each a-id that is one of its images gets that
    # image's b-id as an alias.
    other = "fedcba9876543210"
    runs = [dataclasses.replace(dp_event(4000, 250, 3, data=[i]), run_id=events.new_run_id())
            for i in "ab"]
    one_run, both = compose_epsilon(runs[:1], 1e-5), compose_epsilon(runs, 1e-5)
    ledger = Ledger(runs, {**named({"a": range(4000)}),
                           **named({"b": range(10_000, 14_000)}, key=other)})
    assert ledger.epsilon(1e-5) == pytest.approx(one_run, rel=1e-9)
    b_sample = {"identity": "b", "key": other, "examples": list(range(10_000, 14_000)), "aliases": {
        # only a's last 1000 images are b's images (b-ids 10000..10999)
        KEY: list(range(3000, 7000))}}
    assert ledger.link([b_sample]) == 1
    assert ledger.aliases["a"][other] == Examples.of(other, range(10_000, 11_000))
    assert ledger.epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    assert sorted((a.examples, len(a.events)) for a in ledger.accounts()
                  if a.samples == {"a", "b"}) == [(1000, 2)]
    assert ledger.epsilon(1e-5, data=["b"]) == pytest.approx(both, rel=1e-9)
    # The released ledger carries the link: its figure needs no key, and an older
    # reader is refused, not misled.
    again = Ledger.from_json(ledger.to_json())
    assert again.aliases == ledger.aliases and again.epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    # Averaged with a copy that does not know the link (the aggregator holds
    # no key): the link is kept.
    assert merge([Ledger(runs, ledger.examples),
                  again]).epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    with pytest.raises(UserError, match="aliases of data sample"):
        Ledger.from_json({**ledger.to_json(), "aliases": {"c": []}})
    # without a link: the format of before
    assert "aliases" not in Ledger(runs, ledger.examples).to_json()


def test_a_search_counts_both_faces_for_examples_it_reaches_through_a_link():
    # The search split its validation examples by their a-ids, which the b-ids of the same images do
    # not tell: each linked example is counted under both faces, never under the wrong one alone.
    other = "fedcba9876543210"
    searched = dataclasses.replace(dp_event(4000, 250, 3, data=["a"]), search=events.Search(
        2.0, 1.0, (events.Candidate(1 / 16, 48, 1.1),), 8.0, 100, 400))
    ledger = Ledger([searched], {**named({"a": range(4000)}),
                                 **named({"b": range(10_000, 14_000)}, key=other)})
    ledger.link([{"identity": "b", "key": other, "examples": list(range(10_000, 14_000)),
                  "aliases": {KEY: list(range(4000))}}])
    faces = sorted((a.examples, tuple(e.search.face for e in a.events)) for a in ledger.accounts())
    # Under a's key: 400 validation and 3600 training examples; under b's key,
    # all 4000 with both faces.
    assert faces == [(400, ("score",)), (3600, ("training",)), (4000, ("training", "score"))]


def test_the_released_form_names_no_example_and_counts_every_run_of_an_organisation():
    """A model file's ledger (Ledger.released): per sample the key and its ring, no example id;
    each organisation's ε composes every run on any of its samples, an upper bound."""
    runs = [dp_event(4000, 250, 3, data=["a"]), dp_event(4000, 250, 3, data=["b"])]
    one_run, both = compose_epsilon(runs[:1], 1e-5), compose_epsilon(runs, 1e-5)
    # disjoint samples of one organisation: per example in its record, every run once released
    record = Ledger(runs, named({"a": range(4000), "b": range(4000, 8000)}))
    assert record.epsilon(1e-5) == pytest.approx(one_run, rel=1e-9)
    released = Ledger.from_json(record.released().to_json())
    assert released.epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    assert [a.examples for a in released.accounts()] == [None]
    # nothing in it depends on how many examples the samples hold
    assert record.released().to_json() == Ledger(runs, named({"a": range(3999), "b": range(
        4000, 8001)})).released().to_json()
    assert "ids" not in str(record.released().to_json())
    # another organisation's runs stay apart; a ring joins its keys into one organisation
    other = "fedcba9876543210"
    two = {**named({"a": range(4000)}), **named({"b": range(4000)}, key=other)}
    assert Ledger(runs, two).released().epsilon(1e-5) == pytest.approx(one_run, rel=1e-9)
    ringed = Ledger.from_json(Ledger(runs, two, rings={"b": [KEY]}).released().to_json())
    assert ringed.rings == {"b": (KEY,)}
    assert ringed.epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    with pytest.raises(UserError, match="ring of data sample"):
        Ledger.from_json({**ringed.to_json(), "examples": {"a": {"key": KEY, "ring": ["x"]}}})


def test_a_released_search_is_counted_by_each_face_an_example_may_see():
    """An example is on one side of each search's split: a released ledger's accounts combine the
    faces, and past FACED_SEARCHES searches take the worse at every order."""
    searched = dataclasses.replace(dp_event(4000, 250, 3, data=["a"]), search=events.Search(
        2.0, 1.0, (events.Candidate(1 / 16, 48, 1.1),), 8.0, 100, 400))
    record = Ledger([searched], named({"a": range(4000)}))
    released = record.released()
    assert sorted(a.events[0].search.face for a in released.accounts()) == ["score", "training"]
    assert released.epsilon(1e-5, "rdp") == pytest.approx(record.epsilon(1e-5, "rdp"), rel=1e-12)
    many = Ledger([searched] * (ledger_module.FACED_SEARCHES + 1), named({"a": range(4000)}))
    (account,) = many.released().accounts()
    assert {e.search.face for e in account.events} == {"either"}
    assert len(Ledger([searched] * ledger_module.FACED_SEARCHES, named({"a": range(4000)}))
               .released().accounts()) == 2 ** ledger_module.FACED_SEARCHES


def test_the_organisations_record_names_a_released_runs_examples_where_it_can():
    """A task holds an input model's released ledger beside its own record: a sample the record
    names is named again; a run on a sample it cannot name may have touched any of the
    organisation's examples."""
    runs = [dp_event(4000, 250, 3, data=["a"]), dp_event(4000, 250, 3, data=["c"])]
    one_run, both = compose_epsilon(runs[:1], 1e-5), compose_epsilon(runs, 1e-5)
    received = Ledger(runs, named({"a": range(4000), "c": range(4000, 8000)})).released()
    received.add_examples(named({"a": range(4000)}))  # the record knows "a", not "c"
    assert received.examples["a"].named and not received.examples["c"].named
    with pytest.raises(UserError, match="two different sets"):
        received.add_examples(named({"a": range(10)}))
    # a next run on "a" counts c's run: the released ledger does not say which examples it touched
    assert received.histories(["a"]) == [runs]
    assert received.epsilon(1e-5, data=["a"]) == pytest.approx(both, rel=1e-9)
    # another organisation's unnamed sample does not touch this one's examples
    apart = Ledger(runs, {**named({"a": range(4000)}), "c": Examples("fedcba9876543210")})
    assert apart.histories(["a"]) == [runs[:1]]
    assert apart.epsilon(1e-5, data=["a"]) == pytest.approx(one_run, rel=1e-9)


def test_what_a_next_run_counts_does_not_depend_on_which_examples_earlier_runs_shared():
    """σ and the budget's stop are released: the history a run on "b" counts is every run on its
    organisation's samples, whether "a" shares one example with it or none."""
    run_a = dp_event(4000, 250, 3, data=["a"])
    shares_one = Ledger([run_a], named({"a": range(4000), "b": range(3999, 7999)}))
    shares_none = Ledger([run_a], named({"a": range(4000), "b": range(4000, 8000)}))
    assert shares_one.histories(["b"]) == shares_none.histories(["b"]) == [[run_a]]
    # the data's figure, per example, tells them apart once "b" is trained on: it is the
    # organisation's own
    run_b = dp_event(4000, 250, 3, data=["b"])
    one_run, both = (compose_epsilon(runs, 1e-5) for runs in ([run_b], [run_a, run_b]))
    assert shares_none.copy([run_a, run_b]).epsilon(1e-5) == pytest.approx(one_run, rel=1e-9)
    assert shares_one.copy([run_a, run_b]).epsilon(1e-5) == pytest.approx(both, rel=1e-9)
