"""mnist_dp/privacy/task_plan.py: what one training run will do (its sampling plan, σ, noise
schedule and budget, made once into an immutable plan) and the checks that refuse a run the
accountant cannot bound, in the words of the setting to change."""
import dataclasses

import pytest
from conftest import BASE_HP, dict_hp

from mnist_dp import hyperparameters
from mnist_dp.privacy import accountant, events, preflight, task_plan
from mnist_dp.privacy.budgets import Budget
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan
from mnist_dp.utils.errors import UserError


def test_sampling_plan_follows_opacus_convention():
    plan = SamplingPlan.from_hyperparameters(1001, hyperparameters.parse(BASE_HP, "x"),
                                                      "x")
    assert (plan.steps_per_epoch == 21 and plan.sample_rate == pytest.approx(1 / 21)
            and plan.steps == 42)



def test_the_noise_schedule_and_the_count_follow_the_hyperparameters():
    hp = hyperparameters.parse({**BASE_HP, "noise_decay": 0.5, "clip_quantile": 0.5}, "x")
    # 21 steps per epoch, 42 planned
    plan = SamplingPlan.from_hyperparameters(1001, hp, "x")
    noise = task_plan.noise_schedule(hp, plan, 2.0)
    assert noise.decay_steps == 11 and noise.count_noise_multiplier == pytest.approx(
        2 * plan.expected_batch_size / 20)
    assert [noise.gradient_sigma(t) for t in (0, 10, 11, 41)] == [2.0, 2.0, 1.0, 0.25]
    assert task_plan.noise_schedule(dict_hp(dp=False), plan, 2.0).sigma == 0



def test_a_task_is_told_why_no_sigma_meets_its_target_in_the_settings_words():
    # The same checks run inside the task's calibration, with the runs its data already
    # had. 4 steps, the count's 4.0
    hp = dict_hp(epochs=1, target_epsilon=1.0, clip_quantile=0.5, clip_count_stddev=2.0)
    plan = SamplingPlan.from_hyperparameters(200, hp, "x")
    # one round fits; ten rounds of it do not
    assert task_plan.resolve_noise_multiplier(hp, plan, []) > 0
    with pytest.raises(UserError, match=r"^hyperparameters: target_epsilon = 1.0: adaptive "
                                        r"clipping's noisy count "
                                        r"alone spends ε = 1.6\d\d at δ = 1e-05 over 40 steps, .* "
                                        r"raise "
                                        "clip_count_stddev"):
        preflight.noise_for_rounds(hp, [200], 10)
    spent = TaskPlan.of("torch", hp, plan, 1.0, ("d",)).event_at(4)
    with pytest.raises(UserError, match=r"^target_epsilon = 0.5 is already spent by the input "
                                        r"model \(epsilon = "):
        task_plan.resolve_noise_multiplier(dataclasses.replace(hp, target_epsilon=0.5), plan,
                                          [spent])
    with pytest.raises(UserError, match="^cannot calibrate to a target epsilon: the input model "
                                        "was trained without"):
        task_plan.resolve_noise_multiplier(hp, plan,
                                          [dataclasses.replace(spent, noise_multiplier=0.0)])



@pytest.mark.parametrize("delta", [1 / 4000, 0.01, 0, -1e-5])
def test_delta_must_be_below_one_over_n(delta):
    with pytest.raises(UserError, match="^hp.json: delta = .* choose a smaller delta"):
        task_plan.check_delta(delta, 4000, "hp.json: delta")
    task_plan.check_delta(1e-5, 4000)



def test_the_least_noise_allowed_passes():
    least = dict_hp(noise_multiplier=events.MIN_NOISE_MULTIPLIER, target_epsilon=None)
    task_plan.check_run("torch", least, 200, "x")
    task_plan.check_run("torch",
                       dict_hp(noise_multiplier=1.0, target_epsilon=None, clip_quantile=0.5,
                                        # count 0.4, the gradient's 1: 0.37
                                        clip_count_stddev=0.2), 200, "x")



def test_secure_mode_is_refused_in_tf_only_where_it_would_draw_noise():
    with pytest.raises(UserError, match="secure_mode: TF Privacy offers no secure noise generator"):
        task_plan.check_run("tf", dict_hp(secure_mode=True), 1000, "x")
    # the baseline draws no noise: the key has no effect anywhere
    for framework in ("tf", "torch", "mindspore"):
        task_plan.check_run(framework, dict_hp(secure_mode=True, dp=False), 1000, "x")


@pytest.mark.slow  # over 10 s of PLD accounting: CI runs it, the fast loop does not
def test_budget_cuts_the_plan_stops_when_spent_or_refuses():
    hp = hyperparameters.parse({**BASE_HP, "target_epsilon": None, "noise_multiplier": 1.0,
                                "max_epsilon": 2.0}, "x")
    plan = task_plan.for_task("torch", hp, Budget(1000, identities=("d",)), "x")
    cut = plan.sampling
    assert 0 < cut.steps < cut.planned_steps and cut.stopped_by_budget
    # the task trains nothing, and passes its input model on; or, where it has none to pass on
    # (a new model, or one whose ledger lacked the data's runs), it is refused
    spent = Budget(1000, identities=("d",), histories=((plan.event_at(cut.steps),),))
    assert task_plan.for_task("torch", hp, dataclasses.replace(spent, passes_on=True),
                              "x").sampling.steps == 0
    with pytest.raises(UserError, match=r"^max_epsilon = 2.0: this data has spent its budget"):
        task_plan.for_task("torch", hp, spent, "x")
    with pytest.raises(UserError, match="below the ε of a single step"):
        task_plan.for_task("torch", dataclasses.replace(hp, noise_multiplier=0.4), Budget(1000),
                           "x")
    unbudgeted = task_plan.for_task("torch", hyperparameters.parse(
        {**BASE_HP, "target_epsilon": None, "noise_multiplier": 1.0}, "x"), Budget(1000), "x")
    assert unbudgeted.sampling.steps == unbudgeted.sampling.planned_steps == cut.planned_steps


def small_hp(**changes):
    """4 steps of q = 1/4 on 200 examples."""
    return dict_hp(epochs=1, batch_size=50, **changes)


def test_a_task_plan_is_made_once_and_never_changes():
    plan = task_plan.for_task("torch", small_hp(noise_multiplier=1.0, target_epsilon=None),
                              Budget(200, identities=("d",)), "x")
    assert (plan.sigma, plan.sampling.steps, plan.identities) == (1.0, 4, ("d",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.sigma = 2.0
    # without DP: no noise, whatever σ it is given
    assert TaskPlan.of("torch", small_hp(dp=False), plan.sampling, 1.0).sigma == 0.0


@pytest.mark.slow  # PLD calibrations: CI runs it, the fast loop does not
@pytest.mark.parametrize("heavy_first", [False, True])
def test_sigma_is_calibrated_for_the_worst_history_of_the_tasks_examples(monkeypatch, heavy_first):
    """A history that the σ found for an earlier one already keeps within the target is not
    calibrated again: the same σ, one calibration fewer."""
    hp = small_hp(target_epsilon=3.0)
    earlier = TaskPlan.of("torch", hp, task_plan.check_run("torch", hp, 200, "x"), 2.0)
    light, heavy = [earlier.event_at(1)], [earlier.event_at(4)]
    histories = [heavy, light] if heavy_first else [light, heavy]
    calibrated, calibrate = [], accountant.calibrate_noise_multiplier
    monkeypatch.setattr(accountant, "calibrate_noise_multiplier",
                        lambda *args, **kw: calibrated.append(args) or calibrate(*args, **kw))
    plan = task_plan.for_task("torch", hp, Budget(200, histories=histories), "x")
    assert len(calibrated) == (1 if heavy_first else 2)
    assert plan.sigma == task_plan.resolve_noise_multiplier(hp, plan.sampling, heavy)
    assert plan.sigma > task_plan.resolve_noise_multiplier(hp, plan.sampling, light)
    assert plan.histories == tuple(tuple(h) for h in histories)


def test_a_non_private_run_in_a_later_history_is_refused_in_one_line():
    """The σ of the first history is not taken as meeting a later one that holds a run without
    noise: that history is calibrated, and refused."""
    hp = small_hp(target_epsilon=3.0)
    earlier = TaskPlan.of("torch", hp, task_plan.check_run("torch", hp, 200, "x"), 2.0)
    private = [earlier.event_at(1)]
    plain = [dataclasses.replace(earlier.event_at(1), noise_multiplier=0.0)]
    with pytest.raises(UserError, match="x: "):
        task_plan.for_task("torch", hp, Budget(200, histories=(private, plain)), "x")


def test_the_budget_counts_every_run_of_the_data_not_only_the_input_models():
    hp = small_hp(noise_multiplier=1.0, target_epsilon=None)
    alone = task_plan.for_task("torch", hp, Budget(200), "x")
    spent = [alone.event_at(4)]
    budget = accountant.compose_epsilon(spent + [alone.event_at(2)], hp.delta)
    hp = dataclasses.replace(hp, max_epsilon=budget)
    assert task_plan.for_task("torch", hp, Budget(200), "x").sampling.steps == 4
    # the data's own ledger holds a run the input model's does not: two steps are left
    cut = task_plan.for_task("torch", hp, Budget(200, budget_histories=(spent,)), "x")
    assert (cut.sampling.steps, cut.sampling.stopped_by_budget, cut.sigma) == (2, True, 1.0)


def test_the_ledgers_event_and_the_model_files_metadata_record_the_run_as_it_ran():
    from mnist_dp.learning.interface import Ran

    hp = small_hp(noise_multiplier=3.0, target_epsilon=None, noise_decay=0.8)
    plan = task_plan.for_task("torch", hp, Budget(200, identities=("d",)), "x")
    ran = Ran([3, 5], {"library": 1.25}, noise_multiplier=3.0, clipping=events.PER_EXAMPLE,
              replayable_noise=True)
    event = plan.event(ran, code={"function": "train"})
    assert (event.data, event.n, event.sample_rate, event.noise_multiplier, event.steps) == (
        ("d",), 200, 0.25, 3.0, 2)
    assert (event.noise_decay, event.decay_steps, event.planned_steps, event.batch_size) == (
        0.8, 1, 4, 50)
    assert (event.library_epsilon, event.replayable_noise, event.code) == (
        (("library", 1.25),), True, {"function": "train"})
    assert event.run_id and plan.event(ran).run_id != event.run_id
    assert plan.metadata() == {**hp.to_json(), "noise_multiplier": 3.0, "planned_steps": 4,
                               "stopped_by_budget": False}
