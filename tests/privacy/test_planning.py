"""mnist_dp/privacy/planning.py: what one training run will do (its sampling plan, σ and noise
schedule) and the checks that refuse a run the accountant cannot bound, in the words of the setting
to change."""
import dataclasses

import pytest
from conftest import BASE_HP, dict_hp

from mnist_dp import hyperparameters
from mnist_dp.privacy import accountant, events, planning
from mnist_dp.utils.errors import UserError


def test_sampling_plan_follows_opacus_convention():
    plan = planning.SamplingPlan.from_hyperparameters(1001, hyperparameters.parse(BASE_HP, "x"),
                                                      "x")
    assert (plan.steps_per_epoch == 21 and plan.sample_rate == pytest.approx(1 / 21)
            and plan.steps == 42)



def test_noise_for_rounds_keeps_every_organisation_within_the_target_after_the_last_round():
    hp = hyperparameters.parse(BASE_HP, "x")
    sizes, rounds = [1000, 600], 3
    fixed = planning.noise_for_rounds(hp, sizes, rounds)
    assert fixed.target_epsilon is None and fixed.noise_multiplier > 0
    epsilons = []
    for n in sizes:
        plan = planning.SamplingPlan.from_hyperparameters(n, hp, "x")
        event = events.DpEvent("torch", ("d",), n, plan.sample_rate, fixed.noise_multiplier,
                               plan.steps, events.PER_EXAMPLE, 1.0)
        epsilons.append(accountant.compose_epsilon([event] * rounds, hp.delta))
    assert max(epsilons) <= hp.target_epsilon and max(epsilons) == pytest.approx(
        hp.target_epsilon, abs=0.02)
    # one round, a fixed σ or no DP: nothing to do (each task calibrates its own run)
    assert planning.noise_for_rounds(hp, sizes, 1) is hp
    baseline = hyperparameters.parse({**BASE_HP, "dp": False}, "x")
    assert planning.noise_for_rounds(baseline, sizes, 3) is baseline



def test_the_noise_schedule_and_the_count_follow_the_hyperparameters():
    hp = hyperparameters.parse({**BASE_HP, "noise_decay": 0.5, "clip_quantile": 0.5}, "x")
    # 21 steps per epoch, 42 planned
    plan = planning.SamplingPlan.from_hyperparameters(1001, hp, "x")
    noise = planning.noise_schedule(hp, plan, 2.0)
    assert noise.decay_steps == 11 and noise.count_noise_multiplier == pytest.approx(
        2 * plan.expected_batch_size / 20)
    assert [noise.gradient_sigma(t) for t in (0, 10, 11, 41)] == [2.0, 2.0, 1.0, 0.25]
    assert planning.noise_schedule(dict_hp(dp=False), plan, 2.0).sigma == 0



def test_a_task_is_told_why_no_sigma_meets_its_target_in_the_settings_words():
    # The same checks run inside the task's calibration, with the runs its data already
    # had. 4 steps, the count's 4.0
    hp = dict_hp(epochs=1, target_epsilon=1.0, clip_quantile=0.5, clip_count_stddev=2.0)
    plan = planning.SamplingPlan.from_hyperparameters(200, hp, "x")
    # one round fits; ten rounds of it do not
    assert planning.resolve_noise_multiplier(hp, plan, []) > 0
    with pytest.raises(UserError, match=r"^hyperparameters: target_epsilon = 1.0: adaptive "
                                        r"clipping's noisy count "
                                        r"alone spends ε = 1.6\d\d at δ = 1e-05 over 40 steps, .* "
                                        r"raise "
                                        "clip_count_stddev"):
        planning.noise_for_rounds(hp, [200], 10)
    spent = planning.run_event("torch", ("d",), hp, plan, 1.0, 4)
    with pytest.raises(UserError, match=r"^target_epsilon = 0.5 is already spent by the input "
                                        r"model \(epsilon = "):
        planning.resolve_noise_multiplier(dataclasses.replace(hp, target_epsilon=0.5), plan,
                                          [spent])
    with pytest.raises(UserError, match="^cannot calibrate to a target epsilon: the input model "
                                        "was trained without"):
        planning.resolve_noise_multiplier(hp, plan,
                                          [dataclasses.replace(spent, noise_multiplier=0.0)])



@pytest.mark.parametrize("delta", [1 / 4000, 0.01, 0, -1e-5])
def test_delta_must_be_below_one_over_n(delta):
    with pytest.raises(UserError, match="^hp.json: delta = .* choose a smaller delta"):
        planning.check_delta(delta, 4000, "hp.json: delta")
    planning.check_delta(1e-5, 4000)



def test_the_least_noise_allowed_passes():
    least = dict_hp(noise_multiplier=events.MIN_NOISE_MULTIPLIER, target_epsilon=None)
    planning.check_run("torch", least, 200, "x")
    planning.check_run("torch",
                       dict_hp(noise_multiplier=1.0, target_epsilon=None, clip_quantile=0.5,
                                        # count 0.4, the gradient's 1: 0.37
                                        clip_count_stddev=0.2), 200, "x")



def test_secure_mode_is_refused_in_tf_only_where_it_would_draw_noise():
    with pytest.raises(UserError, match="secure_mode: TF Privacy offers no secure noise generator"):
        planning.check_run("tf", dict_hp(secure_mode=True), 1000, "x")
    # the baseline draws no noise: the key has no effect anywhere
    for framework in ("tf", "torch", "mindspore"):
        planning.check_run(framework, dict_hp(secure_mode=True, dp=False), 1000, "x")
