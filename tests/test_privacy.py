import dataclasses
import math

import pytest

from mnist_dp import privacy
from mnist_dp.errors import UserError
from mnist_dp.privacy import DpEvent, Ledger, calibrate_noise_multiplier, check_delta, compose_epsilon


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
    ledger = Ledger([event(4000, 250, 3, data=["a"]), event(4000, 250, 3, data=["b"])])
    single = Ledger([event(4000, 250, 3)]).epsilon(1e-5)
    assert ledger.epsilon(1e-5) == pytest.approx(single, rel=1e-6)
    assert len(ledger.accounts()) == 2
    assert ledger.epsilon(1e-5, data=["b"]) == pytest.approx(single, rel=1e-6)


def test_non_private_event_makes_epsilon_infinite():
    ledger = Ledger([event(4000, 250, 3), event(4000, 250, 3, sigma=0.0)])
    assert ledger.epsilon(1e-5) == math.inf


def test_ledger_json_round_trip():
    ledger = Ledger([event(4000, 250, 3, data=["x", "y"])])
    again = Ledger.from_json(ledger.to_json())
    assert again.events == ledger.events


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


def test_a_target_epsilon_the_accountant_cannot_reach_is_a_user_error():
    with pytest.raises(UserError, match="no noise multiplier found"):
        calibrate_noise_multiplier(1e9, 1e-5, 0.125, 240)


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
    inputs = [Ledger(history + [a2]), Ledger(history + [b2])]
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
