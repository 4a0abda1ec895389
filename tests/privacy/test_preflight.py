"""mnist_dp/privacy/preflight.py: what the train tasks of a plan would refuse, checked before
anything is registered with the task's own plan (task_plan.py), and σ of a plan of several
rounds."""

import dataclasses

import pytest
from conftest import BASE_HP, dict_hp

from mnist_dp import hyperparameters
from mnist_dp.privacy import accountant, events, preflight, task_plan
from mnist_dp.privacy.budgets import Budget
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan
from mnist_dp.utils.errors import UserError


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
        preflight.check_plan("torch", dict_hp(**changes), [200], 1, ["hp.json"])
    assert time.perf_counter() - start < 10


def test_a_budget_below_one_step_is_refused_before_registering_naming_the_organisation():
    hp = dict_hp(noise_multiplier=1.0, target_epsilon=None, epochs=1)
    # q = 1/4, 1/2
    plans = [TaskPlan.of("torch", hp, SamplingPlan.from_hyperparameters(n, hp, "x"), 1.0)
             for n in (200, 100)]
    one_step = [accountant.compose_epsilon([plan.event_at(1)], hp.delta) for plan in plans]
    assert one_step[0] < one_step[1]
    # enough for organisation 1's step, not 2's
    hp = dataclasses.replace(hp, max_epsilon=sum(one_step) / 2)
    with pytest.raises(UserError, match=f"^org 2: max_epsilon = {hp.max_epsilon} is below the ε of "
                                        "a single step "
                                        rf"\({one_step[1]:.3f} at δ = 1e-05\)"):
        preflight.check_plan("torch", hp, [200, 100], 1, ["org 1", "org 2"])
    # The task's own check says the same (one message), and lets organisation 1 train.
    assert task_plan.for_task("torch", hp, Budget(200), "x").sampling.steps > 0
    with pytest.raises(UserError,
                       match=rf"^max_epsilon = {hp.max_epsilon} is below the ε of a single step"):
        task_plan.for_task("torch", hp, Budget(100), "x")


def test_the_budget_check_calibrates_sigma_as_the_tasks_will_get_it():
    # With a target, σ is calibrated for the run (one round) or for all rounds
    # (noise_for_rounds: more noise, a cheaper step); a budget between the two steps' ε passes
    # with 3 rounds and is refused with 1.
    hp = dict_hp(epochs=1)
    plan = SamplingPlan.from_hyperparameters(200, hp, "x")
    three = preflight.check_plan("torch", hp, [200], 3, ["x"])
    one = task_plan.resolve_noise_multiplier(hp, plan, [])
    assert three.target_epsilon is None and three.noise_multiplier > one

    def step(sigma):
        return accountant.compose_epsilon([TaskPlan.of("torch", hp, plan, sigma).event_at(1)],
                                          hp.delta)

    between = (step(one) + step(three.noise_multiplier)) / 2
    assert preflight.check_plan("torch", dataclasses.replace(hp, max_epsilon=between), [200], 3,
                             ["x"]) == \
        dataclasses.replace(three, max_epsilon=between)
    with pytest.raises(UserError, match="^x: max_epsilon = .* is below the ε of a single step"):
        preflight.check_plan("torch", dataclasses.replace(hp, max_epsilon=between), [200], 1, ["x"])


def test_a_budget_the_datas_ledger_has_spent_is_refused_up_front_whatever_samples_spent_it():
    import numpy as np

    from mnist_dp.privacy.examples import Examples
    from mnist_dp.privacy.ledger import Ledger

    hp = dict_hp(batch_size=10, epochs=1, noise_multiplier=1.0, target_epsilon=None, delta=1e-3)
    plan = TaskPlan.of("torch", hp, task_plan.check_run("torch", hp, 200, "x"), 1.0)
    ids = np.arange(1, 201, dtype=np.uint64)
    earlier = TaskPlan.of("torch", hp, SamplingPlan.from_hyperparameters(100, hp, "x"), 1.0,
                          ("a",)).event_at(10)
    spent = Ledger([earlier], {"a": Examples.of("ab" * 8, ids[:100])})
    # b: nothing trained on it yet
    now = {"a": spent.examples["a"], "b": Examples.of("ab" * 8, ids[100:])}
    one_run = accountant.compose_epsilon([earlier], hp.delta)
    with pytest.raises(UserError, match=r"x: max_epsilon = [0-9.]+ is spent: this data.s own "
                                        r"ledger records 1 run"):
        preflight.check_spent(budgeted(plan, one_run), spent, now, "x")
    preflight.check_spent(budgeted(plan, one_run + 1), spent, now, "x")


def budgeted(plan, max_epsilon):
    return dataclasses.replace(plan, hp=dataclasses.replace(plan.hp, max_epsilon=max_epsilon))


def test_noise_for_rounds_keeps_every_organisation_within_the_target_after_the_last_round():
    hp = hyperparameters.parse(BASE_HP, "x")
    sizes, rounds = [1000, 600], 3
    fixed = preflight.noise_for_rounds(hp, sizes, rounds)
    assert fixed.target_epsilon is None and fixed.noise_multiplier > 0
    epsilons = []
    for n in sizes:
        plan = SamplingPlan.from_hyperparameters(n, hp, "x")
        event = events.DpEvent("torch", ("d",), n, plan.sample_rate, fixed.noise_multiplier,
                               plan.steps, events.PER_EXAMPLE, 1.0)
        epsilons.append(accountant.compose_epsilon([event] * rounds, hp.delta))
    assert max(epsilons) <= hp.target_epsilon and max(epsilons) == pytest.approx(
        hp.target_epsilon, abs=0.02)
    # one round, a fixed σ or no DP: nothing to do (each task calibrates its own run)
    assert preflight.noise_for_rounds(hp, sizes, 1) is hp
    baseline = hyperparameters.parse({**BASE_HP, "dp": False}, "x")
    assert preflight.noise_for_rounds(baseline, sizes, 3) is baseline


def test_a_batch_larger_than_the_persons_is_refused_in_the_words_of_the_unit():
    """The per-person journey: 400 persons of 10 images and the default batch of 500. The scripts'
    check names persons, not training examples, and says a batch counts them."""
    hp = dict_hp(batch_size=500, noise_multiplier=1.0, target_epsilon=None)
    with pytest.raises(UserError, match=r"^org 1: batch_size = 500 is larger than the 400 persons "
                                        r"\(the data's public size\); with subjects.npy a batch "
                                        r"counts persons: lower batch_size$"):
        preflight.check_plan("torch", hp, [400], 1, ["org 1"], per_person=[True])
    with pytest.raises(UserError, match="larger than the 400 training examples"):
        preflight.check_plan("torch", hp, [400], 1, ["org 1"])
    preflight.check_plan("torch", dataclasses.replace(hp, batch_size=50), [400], 1, ["org 1"],
                         per_person=[True])
