import dataclasses
import math

import pytest

from mnist_dp import privacy
from mnist_dp.errors import UserError
from mnist_dp.privacy import DpEvent, Ledger, calibrate_noise_multiplier, check_delta, compose_epsilon

KEY = "0123456789abcdef"  # a key id: the examples below are named under one identity key


def named(samples: dict, key=KEY) -> dict:
    """An examples table: data sample identity -> Examples of the given ids (ranges stand for keyed ids)."""
    return {identity: privacy.Examples.of(key, list(ids)) for identity, ids in samples.items()}


def event(n=60000, batch=250, epochs=60, sigma=1.1, data=("a",)):
    steps_per_epoch = math.ceil(n / batch)
    return DpEvent("torch", tuple(data), n, 1 / steps_per_epoch, sigma, steps_per_epoch * epochs, "per-example", 1.0,
                   (), batch, steps_per_epoch * epochs, {"function": "train", "archive_digest": None})


@pytest.mark.parametrize("n, batch, epochs, rdp, pld", [
    (60000, 250, 60, 2.562, 2.35),  # docs/design.md reference values, delta 1e-5, sigma 1.1
    (4000, 250, 3, 3.112, 2.66),
])
def test_reference_values(n, batch, epochs, rdp, pld):
    ledger = Ledger([event(n, batch, epochs)])
    assert ledger.epsilon(1e-5, "rdp") == pytest.approx(rdp, abs=1e-3)
    assert ledger.epsilon(1e-5, "pld") == pytest.approx(pld, abs=0.01)


def test_pld_is_tighter_than_rdp():
    ledger = Ledger([event(4000, 250, 3)])
    assert ledger.epsilon(1e-5, "pld") < ledger.epsilon(1e-5, "rdp")


def test_chained_runs_on_same_data_compose_like_one_long_run():
    two = Ledger([event(4000, 250, 3), event(4000, 250, 3)])
    one = Ledger([event(4000, 250, 6)])
    assert two.epsilon(1e-5, "rdp") == pytest.approx(one.epsilon(1e-5, "rdp"), rel=1e-9)
    assert two.epsilon(1e-5) > Ledger([event(4000, 250, 3)]).epsilon(1e-5)


def test_runs_on_disjoint_data_compose_in_parallel():
    ledger = Ledger([event(4000, 250, 3, data=["a"]), event(4000, 250, 3, data=["b"])],
                    named({"a": range(4000), "b": range(4000, 8000)}))
    single = Ledger([event(4000, 250, 3)]).epsilon(1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(single, rel=1e-6)
    assert [account.examples for account in ledger.accounts()] == [4000, 4000]
    assert ledger.epsilon(1e-5, data=["b"]) == pytest.approx(single, rel=1e-6)


def test_an_example_in_two_samples_composes_both_runs_that_trained_on_it():
    # Two splits of the same data (other samples, other identities) sharing 100 examples: those 100 were trained
    # on by both runs, and ε is theirs, the worst example's.
    runs = [event(4000, 250, 3, data=["a"]), event(4000, 250, 3, data=["b"])]
    ledger = Ledger(runs, named({"a": range(4000), "b": range(3900, 7900)}))
    both = compose_epsilon(runs, 1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    assert both > Ledger(runs[:1]).epsilon(1e-5) + 0.5
    assert sorted((a.examples, len(a.events)) for a in ledger.accounts()) == [(100, 2), (3900, 1), (3900, 1)]
    assert ledger.histories(["b"]) == [runs]  # its shared examples' runs: what a next run on "b" must add to


def test_examples_that_cannot_be_compared_are_accounted_as_the_same():
    runs = [event(4000, 250, 3, data=["a"]), event(4000, 250, 3, data=["b"])]
    both = compose_epsilon(runs, 1e-5)
    # named under two keys: the ids cannot be compared, so the runs may share every example
    other_key = {**named({"a": range(4000)}), **named({"b": range(4000, 8000)}, key="fedcba9876543210")}
    assert Ledger(runs, other_key).epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    # a ledger that names no examples (a model file of format 2): every run counts for every example
    assert Ledger(runs).epsilon(1e-5) == pytest.approx(both, rel=1e-9)
    assert Ledger.from_json([e.to_json() for e in runs]).epsilon(1e-5) == pytest.approx(both, rel=1e-9)


def test_a_ledger_event_with_less_noise_than_any_task_allows_is_refused():
    record = Ledger([event(4000, 250, 3, sigma=0.05)]).to_json()  # PLD would take hours on it
    with pytest.raises(UserError, match="noise multiplier 0.05 is below 0.3, the least a train task allows"):
        Ledger.from_json(record)


@pytest.mark.parametrize("ids, message", [
    (range(3999), "n = 4000 names 3999 examples"),
    ([*range(3999), 5], "ids must be distinct and sorted"),
])
def test_a_ledger_whose_examples_disagree_with_its_runs_is_refused(ids, message):
    record = Ledger([event(4000, 250, 3)], named({"a": range(4000)})).to_json()
    table = privacy.Examples(KEY, b"".join(int(i).to_bytes(8, "big") for i in ids))
    with pytest.raises(UserError, match=message):
        Ledger.from_json({**record, "examples": {"a": table.to_json()}})


def test_non_private_event_makes_epsilon_infinite():
    ledger = Ledger([event(4000, 250, 3), event(4000, 250, 3, sigma=0.0)])
    assert ledger.epsilon(1e-5) == math.inf


def test_ledger_json_round_trip():
    ledger = Ledger([event(4000, 250, 3, data=["x", "y"])], named({"x": range(2000), "y": range(5000, 7000)}))
    again = Ledger.from_json(ledger.to_json())
    assert again.events == ledger.events and again.examples == ledger.examples


@pytest.mark.parametrize("field, value, message", [
    ("clipping", "per-batch", "clipping = .per-batch. must be one of"),  # its sensitivity is not one example's C
    ("sample_rate", 0, "sample_rate = 0 must be a number in"),
    ("noise_multiplier", -1, "noise_multiplier = -1 must be a number >= 0"),
    ("noise_multiplier", float("nan"), "noise_multiplier = NaN must be"),
    ("steps", 2.0, "steps = 2.0 must be a positive integer"),
    ("data", ["a", "a"], "distinct data sample identities"),
    ("n", 10**9, "is inconsistent: q = 0.0625 but 1 / ceil.n / batch_size. = 2.5e-07"),
    ("steps", 10**6, "steps 1000000 > planned_steps 48"),
])
def test_every_ledger_field_is_checked_when_read(field, value, message):
    record = event(4000, 250, 3).to_json()
    record[field] = value
    with pytest.raises(UserError, match=message):
        Ledger.from_json([record])


def test_a_target_that_even_the_most_noise_misses_is_a_user_error_naming_the_ceiling():
    with pytest.raises(UserError, match="even noise_multiplier = 1000, the most allowed, spends"):
        calibrate_noise_multiplier(1e-4, 1e-5, 0.125, 240)


def test_no_calibrated_step_has_less_noise_than_the_floor():
    # The least noise allowed (MIN_NOISE_MULTIPLIER at the last steps) already meets a generous target: it is taken
    # (ε below the target), never less. With a decay of 1/2 over 4 stages the last steps get σ / 8.
    floor = privacy.MIN_NOISE_MULTIPLIER
    for schedule, last in ((privacy.NoiseSchedule(1.0), 1.0),
                           (privacy.NoiseSchedule(1.0, noise_decay=0.5, decay_steps=2), 1 / 8)):
        sigma = calibrate_noise_multiplier(99.0, 1e-5, 0.125, 8, schedule=schedule)
        assert floor / last < sigma < floor / last + 0.0011  # rounded up to calibrate's tolerance, 0.001
        assert schedule.with_sigma(sigma).smallest(8) >= floor
        run = DpEvent("torch", ("a",), 4000, 0.125, sigma, 8, "per-example", 1.0, noise_decay=schedule.noise_decay,
                      decay_steps=schedule.decay_steps)
        assert compose_epsilon([run], 1e-5) <= 99.0


def test_a_target_adaptive_clippings_count_alone_spends_is_refused_naming_the_knob():
    schedule = privacy.NoiseSchedule(1.0, count_noise_multiplier=4.0)  # the count alone: 0.52 in 4 steps, 1.65 in 40
    with pytest.raises(UserError, match="count alone spends ε = 0.521 at δ = 1e-05 over 4 steps, .* raise "
                                        "clip_count_stddev"):
        calibrate_noise_multiplier(0.4, 1e-5, 0.25, 4, schedule=schedule)
    privacy.check_target_reachable(1.0, 1e-5, 0.25, 4, schedule)  # one round fits; ten rounds of it do not
    with pytest.raises(UserError, match="x: target_epsilon = 1.0: adaptive clipping's noisy count alone spends "
                                        r"ε = .* over 40 steps"):
        privacy.check_target_reachable(1.0, 1e-5, 0.25, 4, schedule, repeats=10, where="x")
    sigma = calibrate_noise_multiplier(1.0, 1e-5, 0.25, 4, schedule=schedule)
    run = privacy.DpEvent("torch", ("a",), 200, 0.25, sigma, 4, "per-example", 1.0, count_noise_multiplier=4.0)
    assert 0.98 < compose_epsilon([run], 1e-5) <= 1.0


def test_ledger_json_missing_field_is_a_user_error():
    record = event().to_json()
    del record["steps"]
    with pytest.raises(UserError, match="steps"):
        Ledger.from_json([record])


@pytest.mark.parametrize("delta", [1 / 4000, 0.01, 0, -1e-5])
def test_delta_must_be_below_one_over_n(delta):
    with pytest.raises(UserError, match="delta"):
        check_delta(delta, 4000)
    check_delta(1e-5, 4000)


def test_calibration_hits_the_target_from_below():
    sigma = calibrate_noise_multiplier(2.0, 1e-5, 1 / 16, 48)
    spent = compose_epsilon([event(4000, 250, 3, sigma=sigma)], 1e-5)
    assert spent <= 2.0
    assert spent > 1.98  # and does not waste budget
    slightly_less = compose_epsilon([event(4000, 250, 3, sigma=sigma - 0.01)], 1e-5)
    assert slightly_less > 2.0


def test_calibration_counts_the_input_models_steps():
    prior = [event(4000, 250, 3, sigma=1.1)]
    sigma = calibrate_noise_multiplier(4.0, 1e-5, 1 / 16, 48, prior)
    assert compose_epsilon(prior + [event(4000, 250, 3, sigma=sigma)], 1e-5) <= 4.0
    assert sigma > calibrate_noise_multiplier(4.0, 1e-5, 1 / 16, 48)


def test_calibration_refuses_a_spent_budget():
    with pytest.raises(UserError, match="already spent"):
        calibrate_noise_multiplier(1.0, 1e-5, 1 / 16, 48, [event(4000, 250, 3, sigma=1.1)])


def test_steps_within_budget_is_the_last_step_that_fits():
    run = privacy.DpEvent("torch", ("a",), 1000, 0.05, 1.0, 400, privacy.PER_EXAMPLE, 1.0)
    budget = 2.0
    allowed = privacy.steps_within_budget([], run, 1e-5, budget)
    assert 0 < allowed < 400
    assert privacy.compose_epsilon([dataclasses.replace(run, steps=allowed)], 1e-5) <= budget
    assert privacy.compose_epsilon([dataclasses.replace(run, steps=allowed + 1)], 1e-5) > budget
    assert privacy.steps_within_budget([], run, 1e-5, 100.0) == 400  # the whole run fits
    spent = dataclasses.replace(run, steps=allowed)
    assert privacy.steps_within_budget([spent], run, 1e-5, budget) == 0  # the input model spent it


def pld_of(segments, q, delta=1e-5):
    """ε of Poisson-subsampled Gaussians [(σ, steps)] composed in order, straight from dp_accounting."""
    import dp_accounting
    from dp_accounting import pld

    accountant = pld.PLDAccountant()
    for sigma, steps in segments:
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return accountant.get_epsilon(delta)


def test_a_decaying_schedule_is_composed_block_by_block_as_it_ran():
    run = dataclasses.replace(event(4000, 500, 5), noise_decay=0.5, decay_steps=10, steps=25)  # 40 planned
    expected = pld_of([(1.1, 10), (0.55, 10), (0.275, 5)], 1 / 8)
    assert Ledger([run]).epsilon(1e-5) == pytest.approx(expected, rel=1e-9)
    assert Ledger([run]).epsilon(1e-5) > Ledger([dataclasses.replace(run, decay_steps=0)]).epsilon(1e-5)


def test_adaptive_clippings_noisy_count_is_part_of_every_step():
    run = dataclasses.replace(event(4000, 500, 4), count_noise_multiplier=2.0)
    combined = (1.1 ** -2 + 2.0 ** -2) ** -0.5  # one Gaussian on the joint (gradient sum, count) vector
    assert Ledger([run]).epsilon(1e-5) == pytest.approx(pld_of([(combined, 32)], 1 / 8), rel=1e-9)
    assert Ledger([run]).epsilon(1e-5) > Ledger([event(4000, 500, 4)]).epsilon(1e-5)


def test_a_ledger_written_before_schedules_and_adaptive_clipping_reads_as_neither():
    record = event(4000, 500, 4).to_json()
    for name in ("noise_decay", "decay_steps", "count_noise_multiplier"):
        del record[name]
    assert DpEvent.from_json(record) == event(4000, 500, 4)
    with pytest.raises(UserError, match="decay_steps"):
        DpEvent.from_json({**record, "decay_steps": -1})


@pytest.mark.parametrize("changes, message", [
    ({"noise_decay": 0.5}, "noise_decay 0.5 with decay_steps 0"),  # a schedule read as constant: ε too low
    ({"decay_steps": 8}, "noise_decay 1.0 with decay_steps 8"),
    ({"noise_decay": 0.5, "decay_steps": 3}, "decay_steps 3 but the schedule has 4 blocks"),
])
def test_an_edited_schedule_is_refused(changes, message):
    with pytest.raises(UserError, match=message):
        DpEvent.from_json({**event(4000, 500, 4).to_json(), **changes})


def test_calibration_holds_the_target_with_a_schedule_and_a_count():
    schedule = privacy.NoiseSchedule(1.0, noise_decay=0.8, decay_steps=12, count_noise_multiplier=40.0)
    sigma = calibrate_noise_multiplier(3.0, 1e-5, 1 / 8, 48, schedule=schedule)
    run = dataclasses.replace(event(4000, 500, 6), noise_multiplier=sigma, noise_decay=0.8, decay_steps=12,
                              count_noise_multiplier=40.0, steps=48)
    assert 2.95 < Ledger([run]).epsilon(1e-5) <= 3.0


def run(data, steps=10, n=100):
    """A training run with its id, as a train task records it."""
    return dataclasses.replace(DpEvent("torch", data, n, 0.1, 1.0, steps, privacy.PER_EXAMPLE, 1.0, batch_size=10,
                                       planned_steps=max(steps, 10)), run_id=privacy.new_run_id())


def test_merged_ledgers_count_the_shared_history_once_and_every_new_run():
    history = [run(("a",)), run(("b",))]  # the global model: one run per organisation
    # round 2: both organisations train again from it, with runs equal in everything but their ids
    a2, b2 = run(("a",)), run(("b",))
    examples = named({"a": range(100), "b": range(100, 200)})
    inputs = [Ledger(history + [a2], examples), Ledger(history + [b2], examples)]
    merged = privacy.merge(inputs)
    assert merged.events == history + [a2, b2]
    assert privacy.own_runs(inputs) == [[a2], [b2]]
    # each organisation's ε: its two runs, recomputed from σ, q and steps alone; the model's ε is the worst
    two_runs = compose_epsilon([DpEvent("torch", ("x",), 100, 0.1, 1.0, 20, privacy.PER_EXAMPLE, 1.0)], 1e-5)
    assert merged.epsilon(1e-5, data=["a"]) == pytest.approx(two_runs, rel=1e-6)
    assert merged.epsilon(1e-5) == pytest.approx(two_runs, rel=1e-6)
    # the same run given twice is one run; a second run on the same data, identical but for its id, is two
    assert privacy.merge([Ledger(history + [a2])] * 2).events == history + [a2]
    twin = dataclasses.replace(a2, run_id=privacy.new_run_id())
    assert len(privacy.merge([Ledger([a2]), Ledger([twin])]).events) == 2


def test_a_merge_refuses_runs_it_cannot_tell_apart():
    old = DpEvent("torch", ("a",), 100, 0.1, 1.0, 10, privacy.PER_EXAMPLE, 1.0)  # no run id: an earlier version's
    with pytest.raises(UserError, match="has no run id"):
        privacy.merge([Ledger([old]), Ledger([run(("b",))])])
    a = run(("a",))
    with pytest.raises(UserError, match=f"record training run {a.run_id} differently"):
        privacy.merge([Ledger([a]), Ledger([dataclasses.replace(a, steps=5)])])
