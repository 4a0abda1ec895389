"""mnist_dp/privacy/search.py and the search's accounting (events.Search, accountant.search_rdp,
Ledger.parts): ε of a private hyperparameter search against an independent recomputation with
dp_accounting, the number of candidates against its distribution, σ calibrated for the whole search,
per-example faces, and the ledger's checks."""
import dataclasses
import math
import re

import dp_accounting
import numpy as np
import pytest
from conftest import dict_hp
from dp_accounting import pld, rdp
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats
from search_events import RELEASED, dp_sgd, search_event, search_then_run

from mnist_dp import search_space
from mnist_dp.privacy import accountant
from mnist_dp.privacy.events import Candidate, DpEvent, Search, validation_mask
from mnist_dp.privacy.examples import Examples
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.search import draw_count, plan_search
from mnist_dp.utils.errors import UserError

DELTA = 1e-5


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, math.inf])
def test_epsilon_of_a_search_is_dp_accountings_repeat_and_select(shape):
    event = search_event(shape=shape)
    independent = rdp.RdpAccountant().compose(
        dp_accounting.dp_event.RepeatAndSelectDpEvent(dp_sgd(1 / 8, 240, 1.3), 4.0,
                                                      shape)).get_epsilon(DELTA)
    assert accountant.compose_epsilon([event], DELTA) == pytest.approx(independent, rel=1e-9)
    score = rdp.RdpAccountant().compose(
        dp_accounting.dp_event.RepeatAndSelectDpEvent(dp_accounting.GaussianDpEvent(3.0), 4.0,
                                                      shape))
    scored = dataclasses.replace(event, search=event.search.scored())
    assert accountant.compose_epsilon([scored], DELTA) == pytest.approx(score.get_epsilon(DELTA),
                                      rel=1e-9)


def test_a_search_of_several_profiles_is_bounded_by_the_worst_at_every_order():
    profiles = [(1 / 8, 240, 1.3), (1 / 40, 1200, 1.1)]
    event = search_event(tuple(Candidate(*p) for p in profiles))
    curves = [rdp.RdpAccountant().compose(dp_sgd(*p)).rdp for p in profiles]
    orders = rdp.RdpAccountant().orders
    worst = rdp_privacy_accountant._compute_rdp_repeat_and_select(
        orders, np.max(curves, axis=0), 4.0, 0.0)
    independent = rdp_privacy_accountant.compute_epsilon(orders, worst, DELTA)[0]
    assert accountant.compose_epsilon([event], DELTA) == pytest.approx(independent, rel=1e-9)
    for p in profiles:  # never below a search of either profile alone
        alone = rdp.RdpAccountant().compose(
            dp_accounting.dp_event.RepeatAndSelectDpEvent(dp_sgd(*p), 4.0, 0.0))
        assert accountant.compose_epsilon([event], DELTA) >= alone.get_epsilon(DELTA) - 1e-9


def test_a_search_costs_more_than_its_one_released_run_and_later_runs_compose_with_it():
    event = search_event()
    one_run = rdp.RdpAccountant().compose(dp_sgd(1 / 8, 240, 1.3)).get_epsilon(DELTA)
    assert accountant.compose_epsilon([event], DELTA) > one_run
    later = dataclasses.replace(event, search=None, n=3600)
    reported, by_rdp = search_then_run(
        dp_accounting.dp_event.RepeatAndSelectDpEvent(dp_sgd(1 / 8, 240, 1.3), 4.0, 0.0),
        1 / 8, 240, 1.3)
    assert accountant.compose_epsilon([event, later], DELTA) == pytest.approx(reported, rel=1e-6)
    assert accountant.compose_epsilon([event, later], DELTA, "rdp") == pytest.approx(by_rdp)
    # a search alone: RDP at δ is below its own pair at a part of δ
    assert accountant.compose_epsilon([event], DELTA) == accountant.compose_epsilon(
        [event], DELTA, "rdp")


def test_two_searches_then_a_run_share_the_pairs_part_of_delta_equally():
    first = search_event((Candidate(1 / 8, 240, 10.0),))
    second = search_event((Candidate(1 / 8, 240, 12.0),), mean=2.0)
    run = dataclasses.replace(first, search=None, noise_multiplier=1.0, n=3600)
    searches = [rdp.RdpAccountant().compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(
        dp_sgd(1 / 8, 240, sigma), mean, 0.0)) for sigma, mean in ((10.0, 4.0), (12.0, 2.0))]
    whole = rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent([
        dp_accounting.dp_event.RepeatAndSelectDpEvent(dp_sgd(1 / 8, 240, 10.0), 4.0, 0.0),
        dp_accounting.dp_event.RepeatAndSelectDpEvent(dp_sgd(1 / 8, 240, 12.0), 2.0, 0.0),
        dp_sgd(1 / 8, 240, 1.0)])).get_epsilon(DELTA)
    runs = pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=1.0, sampling_prob=1 / 8, value_discretization_interval=1e-4
    ).self_compose(240)
    pairs = []
    for share in accountant.SEARCH_DELTA_SHARES:
        composed = runs
        for search in searches:
            composed = composed.compose(pld.privacy_loss_distribution.from_privacy_parameters(
                pld.common.DifferentialPrivacyParameters(search.get_epsilon(DELTA * share / 2),
                                                         DELTA * share / 2)))
        pairs.append(composed.get_epsilon_for_delta(DELTA))
    assert min(pairs) < whole - 0.1  # the pairs' bound is the one reported here
    assert accountant.compose_epsilon([first, second, run], DELTA) == pytest.approx(
        min(pairs), rel=1e-6)


@pytest.mark.parametrize("shape, distribution", [
    (0.0, lambda gamma: stats.logser(1 - gamma)), (1.0, lambda gamma: stats.geom(gamma)),
    (math.inf, None),
    (2.0, lambda gamma: stats.nbinom(2.0, gamma)),  # conditioned on k >= 1 below
])
def test_the_number_of_candidates_follows_its_distribution(shape, distribution):
    mean, draws = 4.0, 20_000
    rng = np.random.default_rng(11)
    counts = np.bincount([draw_count(rng, mean, shape) for _ in range(draws)])
    if shape == math.inf:
        pmf = stats.poisson(mean).pmf
    else:
        law = distribution(rdp_privacy_accountant._gamma_truncated_negative_binomial(shape, mean))
        pmf = (lambda k: law.pmf(k) / (1 - law.pmf(0))) if shape == 2.0 else law.pmf
    assert (counts[0] == 0) == (shape != math.inf)  # only Poisson may draw no candidate
    ks = np.arange(len(counts))
    expected = pmf(ks) * draws
    keep = expected >= 5  # chi-square cells, the tail pooled into the last
    observed = np.append(counts[keep], draws - counts[keep].sum())
    expected = np.append(expected[keep], draws - expected[keep].sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    assert np.mean(np.repeat(ks, counts)) == pytest.approx(mean, rel=0.05)


def test_sigma_is_calibrated_so_the_whole_search_ends_at_the_target():
    hp = dict_hp(epochs=2, batch_size=50, target_epsilon=3.0)
    space = search_space.parse({"space": {"learning_rate": [0.1, 0.2]}}, "x")
    plan = plan_search("torch", hp, space, 1000, 100, "x")
    ((q, steps, schedule), sigma), = plan.sigmas.items()
    search = Search(space.mean, space.shape, (Candidate(q, steps, sigma),),
                    plan.score_noise_multiplier, 100, 100)
    event = search_event(search.candidates, score=plan.score_noise_multiplier, n=1000,
                         validation_n=100)
    assert accountant.compose_epsilon([event], DELTA) <= 3.0
    lower = search_event((Candidate(q, steps, sigma - 0.01),), n=1000, validation_n=100)
    assert accountant.compose_epsilon([lower], DELTA) > 3.0
    scored = dataclasses.replace(event, search=event.search.scored())
    # the validation examples end there too
    assert 2.9 < accountant.compose_epsilon([scored], DELTA) <= 3.0
    one_run = rdp.RdpAccountant().compose(dp_sgd(q, steps, sigma)).get_epsilon(DELTA)
    assert one_run < 2.5  # the search costs noise: one run at its σ would spend much less


def test_profiles_of_several_batch_sizes_get_their_own_sigma_and_the_worst_bounds_the_search():
    hp = dict_hp(epochs=2, batch_size=50, target_epsilon=3.0)
    space = search_space.parse({"space": {"batch_size": [25, 100], "epochs": [1, 2]}}, "x")
    plan = plan_search("torch", hp, space, 1000, 100, "x")
    assert len(plan.sigmas) == 4 and len(set(plan.sigmas.values())) == 4
    event = search_event(tuple(Candidate(q, steps, sigma) for (q, steps, _),
                               sigma in plan.sigmas.items()), n=1000, validation_n=100)
    assert 2.8 < accountant.compose_epsilon([event], DELTA) <= 3.0


def test_a_target_no_search_can_meet_is_refused_in_a_line():
    hp = dict_hp(epochs=500, batch_size=500, target_epsilon=0.05)
    space = search_space.parse({"space": {"learning_rate": [0.1, 0.2]}}, "hp.json")
    with pytest.raises(UserError, match=r"hp.json \(a search of 4 candidates on average\): "
                                        r"target_epsilon = 0.05"):
        plan_search("torch", hp, space, 1000, 100, "hp.json")


def test_each_example_pays_for_its_own_face_of_the_search():
    ids = np.random.default_rng(3).integers(0, 2**63, 2000, dtype=np.uint64)
    held = validation_mask(ids, 100)
    assert 0.07 < held.mean() < 0.13
    event = search_event(n=2000, validation_n=int(held.sum()))
    ledger = Ledger([event], {"s": Examples.of("0" * 16, ids)})
    faces = {(a.events[0].search.face, a.examples) for a in ledger.accounts()}
    assert faces == {("training", 2000 - int(held.sum())), ("score", int(held.sum()))}
    assert ledger.epsilon(DELTA) == pytest.approx(max(accountant.compose_epsilon([e], DELTA)
                                                      for _, e in ledger.parts()))
    again = Ledger.from_json(ledger.to_json())
    assert again.events == ledger.events and again.epsilon(DELTA) == ledger.epsilon(DELTA)
    # a later run on the same data counts the search by either face an example may have seen
    histories = ledger.histories(["s"])
    assert sorted(h[0].search.face for h in histories) == ["score", "training"]
    # released: the same figure, its examples not named
    assert ledger.released().epsilon(DELTA) == pytest.approx(ledger.epsilon(DELTA), rel=1e-12)


@pytest.mark.parametrize("edit, message", [
    (lambda s: {**s, "mean": 0.5}, "mean = 0.5 must be a number >= 1"),
    (lambda s: {**s, "shape": -1}, "shape = -1 must be"),
    (lambda s: {**s, "candidates": []}, "candidates"),
    (lambda s: {**s, "candidates": [{**s["candidates"][0], "noise_multiplier": 9.0}]},
     "not one of the search's"),
    (lambda s: {**s, "validation_n": 4000}, "leaves no training example"),
    (lambda s: {**s, "face": "score"}, "exactly"),
    (lambda s: {**s, "recipe": {**s["candidates"][0], "steps": 0}}, "recipe = "),
    (lambda s: {**s, "recipe": [s["candidates"][0]]}, "recipe = "),
])
def test_a_damaged_search_in_a_ledger_is_refused(edit, message):
    record = search_event().to_json()
    record["search"] = edit(record["search"])
    with pytest.raises(UserError, match=message):
        DpEvent.from_json(record)


def test_the_statement_says_the_search_is_covered_and_how_it_is_composed(tmp_path):
    from conftest import dp_event, save_model

    from mnist_dp.privacy import model_file, statement

    searched = model_file.load(save_model(tmp_path / "searched", [search_event()]))
    text = statement.privacy_statement(searched)
    assert f"by {statement.SEARCHED_ACCOUNTANT} (reported)" in text
    assert "and the whole of the 1 private hyperparameter search(es) that chose them" in text
    assert "K never released" in text and "how long the task ran" in text
    assert "Not covered: " + statement.SEARCHED_NOT_COVERED in text
    # its examples not recorded: every example is accounted as if it had seen both faces
    event = search_event()
    both = accountant.compose_epsilon([event,
                                       dataclasses.replace(event, search=event.search.scored())],
                                      DELTA)
    assert f"(ε, δ) = ({both:.3f}" in text
    assert "run once besides them" not in text
    recipe = search_event()
    recipe = dataclasses.replace(recipe, search=dataclasses.replace(recipe.search,
                                                                    recipe=RELEASED[0]))
    text = statement.privacy_statement(model_file.load(save_model(tmp_path / "r", [recipe])))
    assert "and the recipe's hyperparameters run once besides them (q = 0.125, σ = 1.3" in text
    once = model_file.load(save_model(tmp_path / "once", [dp_event()]))
    text = statement.privacy_statement(once)
    assert "Not covered: " + statement.NOT_COVERED[0] in text and "search" not in text


def test_an_individual_in_every_organisation_pays_the_worse_face_of_each_search_at_every_order():
    # Two organisations' searches: a score noise so low that the validation face is
    # the worse at some orders.
    ids = [np.random.default_rng(k).integers(0, 2**63, 2000, dtype=np.uint64) for k in (1, 2)]
    events = [dataclasses.replace(search_event(n=2000,
                                               validation_n=int(validation_mask(own, 100).sum()),
                                               score=0.5),
                                  data=(f"s{k}",)) for k, own in enumerate(ids)]
    ledger = Ledger(events, {f"s{k}": Examples.of(f"{k}" * 16, own) for k, own in enumerate(ids)})
    orders = rdp.RdpAccountant().orders
    faces = [rdp.RdpAccountant().compose(dp_accounting.dp_event.RepeatAndSelectDpEvent(
        single, 4.0, 0.0)).rdp
             for single in (dp_sgd(1 / 8, 240, 1.3), dp_accounting.GaussianDpEvent(0.5))]
    # neither face is the worse everywhere
    assert np.any(faces[0] > faces[1]) and np.any(faces[1] > faces[0])
    independent = rdp_privacy_accountant.compute_epsilon(orders, 2 * np.maximum(*faces), DELTA)[0]
    assert ledger.epsilon_in_every_organization(DELTA) == pytest.approx(independent, rel=1e-9)
    training_only = rdp_privacy_accountant.compute_epsilon(orders, 2 * faces[0], DELTA)[0]
    assert ledger.epsilon_in_every_organization(DELTA) > training_only  # what it reported before


def test_delta_is_checked_against_every_example_before_a_search_starts():
    # 1/1000 < δ < 1/900: the training split alone would accept it, the
    # released model's check would not.
    hp = dict_hp(batch_size=100, delta=1 / 950)
    space = search_space.parse({"space": {"learning_rate": [0.1, 0.2]}}, "hp.json")
    with pytest.raises(UserError, match=r"hp.json: delta = 0.00105\d* must be > 0 and < 1/n = "
                                        r"0.001 for n = 1000"):
        plan_search("torch", hp, space, 1000, 100, "hp.json")


@pytest.mark.slow  # 15 s of accounting for the two: CI runs it, the fast loop does not
@pytest.mark.parametrize("candidate_epochs", [None, 1])  # more than the base's 2: as None
def test_a_search_with_a_final_run_ends_each_face_at_the_target_as_dp_accounting_composes_it(
        candidate_epochs):
    """search_epsilon: the candidates and scores spend it; the final run on all the examples is
    calibrated so that either face of the search and that run together end at target_epsilon.
    With candidate_epochs, the candidates train that many epochs (the base's if fewer) and the
    final run the base's."""
    hp = dict_hp(epochs=2, batch_size=50, target_epsilon=3.0)
    space = search_space.parse({"space": {"learning_rate": [0.1, 0.2]}, "search_epsilon": 0.5,
                                "candidate_epochs": candidate_epochs}, "x")
    plan = plan_search("torch", hp, space, 1000, 100, "x")
    ((q, steps, _), sigma), = plan.sigmas.items()
    assert steps == min(candidate_epochs or 2, 2) * 18  # 900 training examples, batches of 50
    event = search_event((Candidate(q, steps, sigma),), score=plan.score_noise_multiplier, n=1000,
                         validation_n=100)
    scored = dataclasses.replace(event, search=event.search.scored())
    assert 0.45 < accountant.compose_epsilon([event], DELTA) <= 0.5
    assert 0.45 < accountant.compose_epsilon([scored], DELTA) <= 0.5
    winner = plan.candidate("torch", dataclasses.replace(plan.recipe, learning_rate=0.2), "x")
    final = plan.final("torch", winner.hp, event, "x")
    assert final.sampling.n == 1000 and final.hp.learning_rate == 0.2  # all examples, the winner's
    assert final.sampling.steps == 2 * 20  # the base's epochs
    run = final.event_at(final.sampling.steps)
    for face, single in ((event, dp_sgd(q, steps, sigma)),
                         (scored, dp_accounting.GaussianDpEvent(plan.score_noise_multiplier))):
        reported, by_rdp = search_then_run(
            dp_accounting.dp_event.RepeatAndSelectDpEvent(single, space.mean, space.shape),
            final.sampling.sample_rate, final.sampling.steps, final.sigma)
        assert accountant.compose_epsilon([face, run], DELTA) == pytest.approx(reported, rel=1e-6)
        assert accountant.compose_epsilon([face, run], DELTA, "rdp") == pytest.approx(by_rdp,
                                                                                      rel=1e-9)
        assert reported < by_rdp - 0.1  # the search as a pair: the run's PLD is the tighter bound
    worse = max(accountant.compose_epsilon([face, run], DELTA) for face in (event, scored))
    assert 2.95 < worse <= 3.0
    alone = accountant.compose_epsilon([run], DELTA)
    assert alone < worse  # the search costs the final run something


@pytest.mark.slow  # about 10 s of PLD
def test_a_recipe_candidate_composes_its_run_and_score_once_with_the_repeated_selection():
    """recipe_candidate: the recipe's run (a training example) and its score (a validation example)
    compose with RepeatAndSelect as dp_accounting's ComposedDpEvent composes them, then the final
    run; the search's σ rises to pay for it."""
    hp = dict_hp(epochs=2, batch_size=50, target_epsilon=3.0)
    values = {"space": {"learning_rate": [0.1, 0.2]}, "search_epsilon": 0.5}
    plan = plan_search("torch", hp, search_space.parse({**values, "recipe_candidate": True}, "x"),
                       1000, 100, "x")
    without = plan_search("torch", hp, search_space.parse(values, "x"), 1000, 100, "x")
    ((q, steps, _), sigma), = plan.sigmas.items()
    assert sigma > next(iter(without.sigmas.values()))
    assert plan.score_noise_multiplier > without.score_noise_multiplier
    assert plan.recipe_candidate() == Candidate(q, steps, sigma)
    event = search_event((Candidate(q, steps, sigma),), score=plan.score_noise_multiplier, n=1000,
                         validation_n=100)
    event = dataclasses.replace(event, search=dataclasses.replace(
        event.search, recipe=plan.recipe_candidate()))
    assert DpEvent.from_json(event.to_json()) == event
    scored = dataclasses.replace(event, search=event.search.scored())
    final = plan.final("torch", plan.recipe, event, "x")
    run = final.event_at(final.sampling.steps)
    for face, single in ((event, dp_sgd(q, steps, sigma)),
                         (scored, dp_accounting.GaussianDpEvent(plan.score_noise_multiplier))):
        search = dp_accounting.ComposedDpEvent([
            dp_accounting.dp_event.RepeatAndSelectDpEvent(single, 4.0, 0.0), single])
        search_alone = rdp.RdpAccountant().compose(search).get_epsilon(DELTA)
        assert accountant.compose_epsilon([face], DELTA) == pytest.approx(search_alone, rel=1e-9)
        assert 0.45 < search_alone <= 0.5
        reported, by_rdp = search_then_run(search, final.sampling.sample_rate,
                                           final.sampling.steps, final.sigma)
        assert accountant.compose_epsilon([face, run], DELTA) == pytest.approx(reported, rel=1e-6)
        assert accountant.compose_epsilon([face, run], DELTA, "rdp") == pytest.approx(by_rdp,
                                                                                      rel=1e-9)
    assert 2.95 < max(accountant.compose_epsilon([face, run], DELTA)
                      for face in (event, scored)) <= 3.0


@pytest.mark.parametrize("spent, message", [
    (3.0, "the search's search_epsilon = 3 must be below target_epsilon = 3"),
    (0, "search_epsilon = 0 must be null or a number above 0"),
    ("half", "search_epsilon = \"half\" must be null or a number above 0"),
])
def test_a_search_epsilon_that_leaves_the_final_run_nothing_is_refused_in_a_line(spent, message):
    hp = dict_hp(epochs=2, batch_size=50, target_epsilon=3.0)
    with pytest.raises(UserError, match=re.escape(message)):
        space = search_space.parse({"space": {"learning_rate": [0.1, 0.2]},
                                    "search_epsilon": spent}, "search.json")
        plan_search("torch", hp, space, 1000, 100, "hp.json")
