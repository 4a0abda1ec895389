"""mnist_dp/learning/search.py: a search trains K candidates drawn from the space, scores each with
its noisy count of correct validation predictions (the noise measured), and releases the best one
only."""
import numpy as np
import pytest
from conftest import StepsThatLearnNothing, dict_hp

from mnist_dp import search_space
from mnist_dp.data import samples
from mnist_dp.learning import search, training
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.privacy.search import draw_count, plan_search


class Remembering(StepsThatLearnNothing):
    """An interface.Framework that learns nothing: a model is the learning rate it was trained with,
    and it classifies right the first `correct[learning_rate]` validation examples."""

    name = "torch"

    def __init__(self, correct):
        self.correct, self.trained = correct, []

    def new_model(self, seed, network):
        return {}

    def optimizer(self, model, training):
        model["learning_rate"] = training.learning_rate
        self.trained.append(training.learning_rate)

    def batch_logits(self, model, inputs):
        right = np.arange(len(inputs)) < self.correct[model["learning_rate"]]
        logits = np.zeros((len(inputs), 10))
        logits[np.arange(len(inputs)), np.where(right, 0, 1)] = 1.0  # every label is 0 below
        return logits

    def weight_arrays(self, model):
        return [np.array([model["learning_rate"]])]


def test_the_noisy_score_has_the_planned_standard_deviation():
    rng = np.random.default_rng(5)
    draws = np.array([search.noisy_count(120, 2.5, rng) for _ in range(40_000)])
    assert draws.mean() == pytest.approx(120, abs=0.05)
    assert draws.std() == pytest.approx(2.5, rel=0.02)


def test_the_search_trains_k_candidates_and_releases_the_best_noisy_score(monkeypatch):
    hp = dict_hp(epochs=1, batch_size=50, target_epsilon=3.0, features="pixels")
    space = search_space.parse({"space": {"learning_rate": [0.1, 0.2, 0.3]}, "mean_candidates": 5,
                                "shape": 1}, "x")
    n = 400
    held_out = np.arange(n) % 10 == 0
    plan = plan_search("torch", hp, space, n, int(held_out.sum()), "x")
    scores = []
    real_noisy_count = search.noisy_count

    def recording(count, noise_multiplier, rng):
        assert noise_multiplier == plan.score_noise_multiplier
        scores.append(real_noisy_count(count, noise_multiplier, rng))
        return scores[-1]

    monkeypatch.setattr(search, "noisy_count", recording)
    images, labels = np.zeros((n, 28, 28), np.float32), np.zeros(n, np.int64)
    for seed in range(5):
        framework = Remembering({0.1: 10, 0.2: 30, 0.3: 20})
        randomness = RunRandomness.for_run(seed, 0, ("s",))
        scores.clear()
        found = search.run_search(framework, images, labels, held_out, plan, randomness, "x")
        expected_k = draw_count(randomness.numpy("search"), 5.0, 1.0)
        assert len(framework.trained) == len(scores) == found.candidates == expected_k
        best = int(np.argmax(scores))
        learning_rate = found.plan.hp.learning_rate
        assert found.model["learning_rate"] == framework.trained[best] == learning_rate


@pytest.mark.parametrize("other_correct, winner", [(28, 0.5), (29, 0.2)])
def test_the_recipes_head_start_is_a_constant_so_the_score_keeps_its_sensitivity_of_1(
        monkeypatch, other_correct, winner):
    """A candidate exactly `recipe_margin` right answers ahead of the recipe ties with it (the
    recipe stays), one more wins; that must hold however many validation examples there are, else
    one example added or removed moves the recipe's score by more than the count's 1."""
    hp = dict_hp(epochs=1, batch_size=50, target_epsilon=3.0, features="pixels",
                 learning_rate=0.5)
    space = search_space.parse({"space": {"learning_rate": [0.2]}, "mean_candidates": 3,
                                "shape": 1, "recipe_candidate": True, "recipe_margin": 10}, "x")
    monkeypatch.setattr(search, "noisy_count", lambda count, noise_multiplier, rng: count)
    n = 400
    images, labels = np.zeros((n, 28, 28), np.float32), np.zeros(n, np.int64)
    for validation_n in (39, 40, 41, 80):  # neighbours, and a split twice as large
        held_out = np.arange(n) < validation_n
        plan = plan_search("torch", hp, space, n, validation_n, "x")
        drawn = 0
        for seed in range(6):
            framework = Remembering({0.5: 18, 0.2: other_correct})
            found = search.run_search(framework, images, labels, held_out, plan,
                                      RunRandomness.for_run(seed, 0, ("s",)), "x")
            if 0.2 in framework.trained:
                drawn += 1
                assert found.plan.hp.learning_rate == winner, validation_n
        assert drawn


@pytest.mark.parametrize("margin, recipe_wins, candidate_epochs", [
    (14, True, None), (10, False, None), (14, True, 1)])
def test_the_recipe_wins_unless_another_scores_more_than_its_margin_above_it(
        monkeypatch, margin, recipe_wins, candidate_epochs):
    hp = dict_hp(epochs=2, batch_size=50, target_epsilon=3.0, features="pixels",
                 learning_rate=0.5)
    space = search_space.parse({"space": {"learning_rate": [0.2]}, "mean_candidates": 5,
                                "shape": 1, "recipe_weight": 0.5, "recipe_margin": margin,
                                "search_epsilon": 1.0, "candidate_epochs": candidate_epochs}, "x")
    n = 400
    held_out = np.arange(n) % 10 == 0  # 40 validation examples; the recipe starts 14 or 10 ahead
    plan = plan_search("torch", hp, space, n, int(held_out.sum()), "x")
    monkeypatch.setattr(search, "noisy_count", lambda count, noise_multiplier, rng: count)
    images, labels = np.zeros((n, 28, 28), np.float32), np.zeros(n, np.int64)
    both_drawn = 0
    for seed in range(30):
        framework = Remembering({0.5: 18, 0.2: 30})
        found = search.run_search(framework, images, labels, held_out, plan,
                                  RunRandomness.for_run(seed, 0, ("s",)), "x")
        if set(framework.trained) != {0.5, 0.2}:
            continue
        both_drawn += 1
        assert found.plan.hp.learning_rate == (0.5 if recipe_wins else 0.2)
    assert both_drawn >= 5


@pytest.mark.slow  # about 9 s of searching: CI runs it, the fast loop does not
def test_the_final_run_draws_from_the_task_s_run_streams_which_no_candidate_uses(monkeypatch):
    hp = dict_hp(epochs=1, batch_size=50, target_epsilon=3.0, features="pixels")
    space = search_space.parse({"space": {"learning_rate": [0.1, 0.2]}, "mean_candidates": 5,
                                "shape": 1, "search_epsilon": 1.0}, "x")
    n = 400
    data = samples.in_memory(np.zeros((n, 28, 28), np.float32), np.zeros(n, np.int64), "s")
    held_out = np.arange(n) % 10 == 0
    plan = plan_search("torch", hp, space, n, int(held_out.sum()), "x")
    drawn_from, real_fit = [], training.fit

    def recording(framework, model, inputs, labels, plan, randomness, **options):
        drawn_from.append(randomness.entropy)
        return real_fit(framework, model, inputs, labels, plan, randomness, **options)

    monkeypatch.setattr(training, "fit", recording)
    framework, randomness = Remembering({0.1: 10, 0.2: 30}), RunRandomness.for_run(3, 0, ("s",))
    found = search.run_search(framework, data["images"], data["labels"], held_out, plan,
                              randomness, "x")
    ledger = search.released_ledger(framework, data, plan, found, None)
    search.final_run(framework, data, plan, found, ledger, randomness, "x")
    *candidates, final = drawn_from
    # a train task with this randomness would draw its batches and noise as the final run did
    assert final == randomness.entropy
    assert len(set(candidates)) == len(candidates) == found.candidates
    assert final not in candidates


@pytest.mark.parametrize("margin", ["validation", "noise", None])
def test_a_recipe_candidate_runs_first_whatever_k_and_competes_with_the_k(monkeypatch, margin):
    """recipe_candidate: the recipe is trained and scored once besides the K candidates, all drawn
    from the space; it wins over candidates that score less than it plus its head start (10 below,
    as a fraction of the validation examples or in score noise stds), even when K = 1. Without it
    (recipe_weight 0), no candidate is the recipe."""
    hp = dict_hp(epochs=1, batch_size=50, target_epsilon=3.0, features="pixels",
                 learning_rate=0.5)
    values = {"space": {"learning_rate": [0.2, 0.3]}, "mean_candidates": 2, "shape": 1}
    n = 400
    held_out = np.arange(n) % 10 == 0  # 40 validation examples
    noise = plan_search("torch", hp, search_space.parse({**values, "recipe_candidate": True}, "x"),
                        n, 40, "x").score_noise_multiplier
    if margin is not None:
        values.update({"recipe_candidate": True, "recipe_margin": 10 * (margin == "validation"),
                       "recipe_margin_noise": 10 / noise * (margin == "noise")})
    plan = plan_search("torch", hp, search_space.parse(values, "x"), n, 40, "x")
    monkeypatch.setattr(search, "noisy_count", lambda count, noise_multiplier, rng: count)
    images, labels = np.zeros((n, 28, 28), np.float32), np.zeros(n, np.int64)
    for seed in range(12):
        framework = Remembering({0.5: 18, 0.2: 26, 0.3: 30})
        randomness = RunRandomness.for_run(seed, 0, ("s",))
        found = search.run_search(framework, images, labels, held_out, plan, randomness, "x")
        k = draw_count(randomness.numpy("search"), 2.0, 1.0)
        assert found.candidates == k
        if margin is None:
            assert 0.5 not in framework.trained and len(framework.trained) == k
            continue
        assert framework.trained[0] == 0.5 and len(framework.trained) == k + 1
        assert 0.5 not in framework.trained[1:]
        # 0.3 scores 30 > 18 + 10: it wins whenever drawn; 0.2 (26) never does
        assert found.plan.hp.learning_rate == (0.3 if 0.3 in framework.trained else 0.5)
