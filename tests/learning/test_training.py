"""mnist_dp/learning/training.py: one training run of a plan: its Poisson batches, adaptive
clipping's norm, the loop over the steps, and what it reports as having run."""
import dataclasses
import itertools
import logging
import math

import numpy as np
import pytest
from conftest import BASE_HP, StepsThatLearnNothing, dict_hp

from mnist_dp import hyperparameters
from mnist_dp.learning import training
from mnist_dp.privacy import events
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.task_plan import SamplingPlan, TaskPlan


@pytest.mark.parametrize("dp", [True, False])
def test_batches_report_progress_once_per_epoch_without_a_terminal(dp):
    # pytest's output is no terminal, so the progress bar is disabled: the epoch callback (an ε
    # computation) must still run once per epoch, not at every step.
    hp = hyperparameters.parse({**BASE_HP, "epochs": 3, "dp": dp}, "x")
    plan = TaskPlan.of("torch", hp, SamplingPlan.from_hyperparameters(1000, hp, "x"), 1.0)
    calls = []
    batches = list(training.sampled_batches(plan, RunRandomness.fresh(),
                                            lambda steps: calls.append(steps) or ""))
    assert len(batches) == 60 and calls == [20, 40, 60]


@pytest.mark.parametrize("unclipped, direction", [(50, -1), (0, 1)])
def test_adaptive_clipping_moves_c_towards_the_quantile(unclipped, direction):
    hp = dict_hp(clip_quantile=0.5, clip_learning_rate=0.2, clip_count_stddev=0.01)
    sampling = SamplingPlan.from_hyperparameters(1000, hp, "x")  # E[B] = 50
    clip = training.ClipNorm(TaskPlan.of("torch", hp, sampling, 1.0), RunRandomness.fresh())
    clip.update(unclipped, 50)  # all unclipped: C too large, shrinks; all clipped: grows
    assert clip.value == pytest.approx(1.0 * math.exp(-0.2 * ((unclipped - 25) / 50 + 0.5 - 0.5)),
                                       rel=1e-3)
    assert (clip.value - 1.0) * direction > 0
    fixed = training.ClipNorm(TaskPlan.of("torch", dict_hp(), sampling, 1.0),
                               RunRandomness.fresh())
    fixed.update(0, 50)
    assert fixed.value == 1.0


def test_a_clipping_norm_past_the_float_range_is_infinite_not_a_traceback():
    """clip_count_stddev may be 1e30: a count that noisy sends exp past the float range. C is then
    infinite for good (the weights become infinite, a diverged run the task refuses in one line),
    or underflows to 0; never an OverflowError mid-training."""
    hp = dict_hp(clip_quantile=0.5, clip_learning_rate=1000.0, clip_count_stddev=1e30)
    plan = TaskPlan.of("torch", hp, SamplingPlan.from_hyperparameters(1000, hp, "x"), 1.0)
    clip = training.ClipNorm(plan, RunRandomness.fresh())
    clip.count_noise = lambda: -1e30  # every example clipped, by far: C grows past the range
    clip.update(0, 50)
    assert clip.value == math.inf
    clip.count_noise = lambda: 1e30  # an update that would shrink it leaves it infinite
    clip.update(50, 50)
    assert clip.value == math.inf
    shrinking = training.ClipNorm(plan, RunRandomness.fresh())
    shrinking.count_noise = lambda: 1e30
    shrinking.update(50, 50)
    assert shrinking.value == 0.0


class StepCounter(StepsThatLearnNothing):
    """A framework whose DP library reports `library` as its own ε."""

    def __init__(self, library=None):
        self.library = library or {}

    def library_epsilon(self, sampling, delta, steps, sigma):
        return self.library


def test_a_run_that_does_not_take_every_planned_step_is_refused():
    """Batches lost on their way to the framework (as Opacus' own sampler lost one for some q)."""
    hp = dict_hp(epochs=1, batch_size=10)
    # 93 steps: 1/(1/93) is 92.99999... in floats
    plan = TaskPlan.of("torch", hp, SamplingPlan.from_hyperparameters(930, hp, "x"), 1.0)
    with pytest.raises(RuntimeError, match="ran 92 steps where the plan has 93"):
        training.fit(StepCounter(), None, np.zeros((930, 28, 28), np.float32),
                     np.zeros(930, np.int64), plan, RunRandomness.fresh(),
                     through=lambda batches, sampling: itertools.islice(batches,
                                                                        sampling.steps - 1))
    sampling = plan.sampling
    assert (not sampling.stopped_by_budget
            and dataclasses.replace(sampling, max_steps=50).stopped_by_budget)


def test_a_plan_made_for_another_framework_is_refused():
    """Its ledger event would name the framework the plan names, not the one that trained."""
    hp = dict_hp(epochs=1, batch_size=100)
    plan = TaskPlan.of("tf", hp, SamplingPlan.from_hyperparameters(100, hp, "x"), 1.0)
    with pytest.raises(ValueError, match="a plan of tf given to torch"):
        training.fit(StepCounter(), None, np.zeros((100, 28, 28), np.float32),
                     np.zeros(100, np.int64), plan, RunRandomness.fresh())


def test_a_library_epsilon_that_is_not_finite_is_dropped_with_a_warning():
    hp = dict_hp(epochs=1, batch_size=100)
    plan = TaskPlan.of("torch", hp, SamplingPlan.from_hyperparameters(100, hp, "x"), 1.0,
                       ("d",))  # q = 1
    # On the run's logger itself: substratools, run by earlier tests in this
    # process, may stop propagation.
    records, handler = [], logging.Handler(logging.WARNING)
    handler.emit = records.append
    training.log.addHandler(handler)
    # nor a level substratools set for its logger
    level, training.log.level = training.log.level, logging.WARNING
    try:
        # MindArmour's at q = 1: NaN
        library = {"fine": 2.5, "monitor": float("nan"), "statement": float("inf")}
        ran = training.fit(StepCounter(library), None, np.zeros((100, 28, 28), np.float32),
                           np.zeros(100, np.int64), plan, RunRandomness.fresh())
    finally:
        training.log.removeHandler(handler)
        training.log.level = level
    assert ran.library_epsilon == {"fine": 2.5}
    assert [r.getMessage().split(";")[0] for r in records] == [
        "torch: monitor gave epsilon = nan for this "
        "run", "torch: statement gave epsilon = inf for this run"]
    event = plan.event(ran, code={"function": "train", "archive_digest": None})
    # as a model file stores it: readable again
    assert events.DpEvent.from_json(event.to_json()) == event
