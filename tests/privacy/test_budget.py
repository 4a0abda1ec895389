"""mnist_dp/privacy/budget.py: what a run may spend against what its data and its input model have
spent: the budget cut, the up-front checks of a plan, and their words."""

import dataclasses

import pytest
from conftest import BASE_HP, dict_hp

from mnist_dp import hyperparameters
from mnist_dp.privacy import accountant, budget, events, planning
from mnist_dp.utils.errors import UserError


@pytest.mark.slow  # over 10 s of PLD accounting: CI runs it, the fast loop does not
def test_budget_cuts_the_plan_stops_when_spent_or_refuses():
    hp = hyperparameters.parse({**BASE_HP, "target_epsilon": None, "noise_multiplier": 1.0,
                                "max_epsilon": 2.0}, "x")
    plan = planning.SamplingPlan.from_hyperparameters(1000, hp, "x")
    cut = budget.apply_budget("torch", ("d",), hp, plan, 1.0, [])
    assert 0 < cut.steps < plan.steps == cut.planned_steps
    spent = events.DpEvent("torch", ("d",), 1000, plan.sample_rate, 1.0, cut.steps,
                           events.PER_EXAMPLE, 1.0)
    # the task trains nothing
    assert budget.apply_budget("torch", ("d",), hp, plan, 1.0, [spent]).steps == 0
    with pytest.raises(UserError, match="below the ε of a single step"):
        budget.apply_budget("torch", ("d",), hp, plan, 0.4, [])
    assert budget.apply_budget("torch", ("d",), hyperparameters.parse(BASE_HP, "x"), plan, 1.0,
                               []) is plan


@pytest.mark.parametrize("changes, message", [
    ({"clip_quantile": 0.5, "clip_count_stddev": 0.005, "noise_multiplier": 1.0,
      "target_epsilon": None},
     "clip_count_stddev (0.005) gives adaptive clipping's count a noise multiplier of 0.01"),
    # with a target
    ({"clip_quantile": 0.5, "clip_count_stddev": 1e-6}, "count a noise multiplier of 2e-06"),
    ({"clip_quantile": 0.5, "batch_size": 1, "epochs": 1},
     "clip_count_stddev (null: E[B] / 20 = 0.05) gives adaptive clipping's count a noise "
     "multiplier of 0.1"), ({"noise_decay": 1e-3, "noise_multiplier": 1.0, "target_epsilon": None},
     "noise_decay = 0.001 (σ · 0.001^3 in the last of 4 stages) gives steps an effective noise "
     "multiplier of 1e-09"),
    ({"noise_decay": 1e-3}, "noise_decay = 0.001 lowers the noise so far that"),
    ({"noise_multiplier": 0.25, "target_epsilon": None},
     "an effective noise multiplier of 0.25, below 0.3"),
    ({"clip_quantile": 0.5, "target_epsilon": 0.01},
     "target_epsilon = 0.01: adaptive clipping's noisy count alone"), ({"target_epsilon": 1e-4},
     "target_epsilon = 0.0001: even noise_multiplier = 1000, the most allowed"),
])
def test_noise_the_accountant_cannot_bound_is_refused_before_it_runs(changes, message):
    # These ran for minutes in dp_accounting, ran out of memory, or failed in its
    # numerics (deep in a train task).
    import re
    import time

    start = time.perf_counter()
    with pytest.raises(UserError, match=r"^hp\.json: .*" + re.escape(message)):
        budget.check_plan("torch", dict_hp(**changes), [200], 1, ["hp.json"])
    assert time.perf_counter() - start < 10


def test_a_budget_below_one_step_is_refused_before_registering_naming_the_organisation():
    hp = dict_hp(noise_multiplier=1.0, target_epsilon=None, epochs=1)
    # q = 1/4, 1/2
    plans = [planning.SamplingPlan.from_hyperparameters(n, hp, "x") for n in (200, 100)]
    one_step = [accountant.compose_epsilon([planning.run_event("torch", (), hp, plan, 1.0, 1)],
                                           hp.delta)
                for plan in plans]
    assert one_step[0] < one_step[1]
    # enough for organisation 1's step, not 2's
    hp = dataclasses.replace(hp, max_epsilon=sum(one_step) / 2)
    with pytest.raises(UserError, match=f"^org 2: max_epsilon = {hp.max_epsilon} is below the ε of "
                                        "a single step "
                                        rf"\({one_step[1]:.3f} at δ = 1e-05\)"):
        budget.check_plan("torch", hp, [200, 100], 1, ["org 1", "org 2"])
    # The task's own check says the same (one message), and lets organisation 1 train.
    assert budget.apply_budget("torch", ("a",), hp, plans[0], 1.0, []).steps > 0
    with pytest.raises(UserError,
                       match=rf"^max_epsilon = {hp.max_epsilon} is below the ε of a single step"):
        budget.apply_budget("torch", ("b",), hp, plans[1], 1.0, [])


def test_the_budget_check_calibrates_sigma_as_the_tasks_will_get_it():
    # With a target, σ is calibrated for the run (one round) or for all rounds
    # (noise_for_rounds: more noise, a cheaper step); a budget between the two steps' ε passes
    # with 3 rounds and is refused with 1.
    hp = dict_hp(epochs=1)
    plan = planning.SamplingPlan.from_hyperparameters(200, hp, "x")
    three = budget.check_plan("torch", hp, [200], 3, ["x"])
    assert (three.target_epsilon is None
            and three.noise_multiplier > planning.resolve_noise_multiplier(hp, plan, []))

    def step(sigma):
        return accountant.compose_epsilon([planning.run_event("torch", (), hp, plan, sigma, 1)],
                                          hp.delta)

    between = (step(planning.resolve_noise_multiplier(hp, plan,
                                                      [])) + step(three.noise_multiplier)) / 2
    assert budget.check_plan("torch", dataclasses.replace(hp, max_epsilon=between), [200], 3,
                             ["x"]) == \
        dataclasses.replace(three, max_epsilon=between)
    with pytest.raises(UserError, match="^x: max_epsilon = .* is below the ε of a single step"):
        budget.check_plan("torch", dataclasses.replace(hp, max_epsilon=between), [200], 1, ["x"])


def test_a_budget_the_datas_ledger_has_spent_is_refused_up_front_whatever_samples_spent_it():
    import numpy as np

    from mnist_dp.privacy.ledger import Examples, Ledger

    hp = dict_hp(batch_size=10, epochs=1, noise_multiplier=1.0, target_epsilon=None, delta=1e-3)
    plan = planning.check_run("torch", hp, 200, "x")
    ids = np.arange(1, 201, dtype=np.uint64)
    earlier = planning.run_event("torch", ("a",), hp,
                                 planning.SamplingPlan.from_hyperparameters(100, hp, "x"), 1.0, 10,
                                 ran=None)
    spent = Ledger([earlier], {"a": Examples.of("ab" * 8, ids[:100])})
    # b: nothing trained on it yet
    now = {"a": spent.examples["a"], "b": Examples.of("ab" * 8, ids[100:])}
    one_run = accountant.compose_epsilon([earlier], hp.delta)
    with pytest.raises(UserError, match=r"x: max_epsilon = [0-9.]+ is spent: this data.s own "
                                        r"ledger records 1 run"):
        budget.check_spent("torch", dataclasses.replace(hp, max_epsilon=one_run), plan, 1.0, spent,
                           now, "x")
    budget.check_spent("torch", dataclasses.replace(hp, max_epsilon=one_run + 1), plan, 1.0, spent,
                       now, "x")
