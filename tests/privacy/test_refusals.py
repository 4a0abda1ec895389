"""mnist_dp/privacy/refusals.py: each reason the accountant gives for refusing a plan, in one line
that names the setting to change."""
import pytest
from conftest import dict_hp

from mnist_dp.privacy import no_sigma, refusals
from mnist_dp.privacy.task_plan import SamplingPlan

HP = dict_hp(epochs=2, batch_size=50, target_epsilon=1.5, noise_decay=0.5)
PLAN = SamplingPlan.from_hyperparameters(1000, HP, "x")  # q = 1/20, 40 steps


@pytest.mark.parametrize("why, words", [
    (no_sigma.PriorNotPrivate(), "hp.json: cannot calibrate to a target epsilon: the input model "
                                 "was trained without DP (epsilon = inf)"),
    (no_sigma.PriorSpent(2.25), "hp.json: target_epsilon = 1.5 is already spent by the input "
                                "model (epsilon = 2.250); raise the target or train from scratch"),
    (no_sigma.DecayTooSteep(1234.5), "hp.json: noise_decay = 0.5 lowers the noise so far that "
                                     "keeping every step's noise multiplier at 0.3 or more needs "
                                     "σ = 1.23e+03 in the first steps, more than 1000; raise "
                                     "noise_decay (1: constant)"),
    (no_sigma.CountAloneSpends(1.75), "hp.json: target_epsilon = 1.5: adaptive clipping's noisy "
                                      "count alone spends ε = 1.750 at δ = 1e-05 over 120 steps "
                                      "after the input model, so no gradient noise can meet the "
                                      "target; raise clip_count_stddev"),
    (no_sigma.TooManySteps(9.5), "hp.json: target_epsilon = 1.5: even noise_multiplier = 1000, "
                                 "the most allowed, spends ε = 9.5 at δ = 1e-05 over 120 steps "
                                 "after the input model; raise target_epsilon or noise_decay, or "
                                 "train fewer epochs"),
    (no_sigma.NumericsGaveUp("ArithmeticError: no root"), "hp.json: target_epsilon = 1.5: no noise "
                                                          "multiplier found for it at δ = 1e-05 "
                                                          "over 120 steps after the input model "
                                                          "with q = 0.05"),
])
def test_every_reason_is_one_line_naming_the_setting_to_change(why, words):
    # three rounds of the run, after an input model's runs
    message = str(refusals.refused(why, HP, PLAN, "hp.json", prior=[object()], repeats=3))
    assert message.startswith(words) and "\n" not in message


def test_without_earlier_runs_or_a_name_the_words_say_less():
    message = str(refusals.refused(no_sigma.TooManySteps(9.5), HP, PLAN))
    assert message.startswith("target_epsilon = 1.5: even noise_multiplier = 1000") and (
        "over 40 steps;" in message)


def test_a_budget_below_one_step_names_its_epsilon_and_the_organisation():
    hp = dict_hp(max_epsilon=0.05)
    assert str(refusals.below_one_step(hp, 0.0731, "org 2")) == (
        "org 2: max_epsilon = 0.05 is below the ε of a single step (0.073 at δ = 1e-05); raise "
        "max_epsilon or the noise")
    assert str(refusals.below_one_step(hp, 0.0731)).startswith("max_epsilon = 0.05 is below")
