"""mnist_dp/search_space.py: a search file read and checked (every number bounded, every key the
hyperparameters file's, refused in one line before any work), its draws, its privacy profiles and
its JSON round trip."""
import math

import numpy as np
import pytest
from conftest import dict_hp

from mnist_dp import search_space
from mnist_dp.utils.errors import UserError


def parse(**values):
    return search_space.parse({"space": {"learning_rate": [0.5, 1.0]}, **values}, "s.json")


@pytest.mark.parametrize("values, message", [
    ({"mean_candidates": 0.5}, "mean_candidates = 0.5 must be a number from 1 to 1,000"),
    ({"mean_candidates": True}, "mean_candidates = true must be a number"),
    ({"mean_candidates": math.nan}, "mean_candidates = NaN must be a number"),
    ({"shape": 11}, "shape = 11 must be a number from 0 to 10"),
    ({"shape": "geometric"}, "shape = \"geometric\" must be a number from 0 to 10"),
    ({"validation_fraction": 0.6}, "validation_fraction = 0.6 must be a number from 0.001 to 0.5"),
    ({"candidates": 4}, "unknown key ['candidates']"),
    ({"space": {}}, "\"space\" must be a non-empty object"),
    ({"space": {"lr": [1.0]}}, "space.lr: unknown hyperparameter"),
    ({"space": {"target_epsilon": [1.0, 2.0]}},
     "target_epsilon is one setting for the whole search"),
    ({"space": {"learning_rate": [1.0, 1.0]}}, "a value is listed twice"),
    ({"space": {"learning_rate": []}}, "an empty list"),
    ({"space": {"optimizer": {"low": 0, "high": 1}}}, "a range of a non-numeric hyperparameter"),
    ({"space": {"learning_rate": {"low": 2.0, "high": 1.0}}}, "low = 2.0 must be below high = 1.0"),
    ({"space": {"learning_rate": {"low": 0.1, "high": 1.0, "log": "yes"}}},
     "log = \"yes\" must be true or false"),
    ({"space": {"ema_decay": {"low": 0.0, "high": 0.9, "log": True}}}, "a log range needs low > 0"),
    ({"space": {"noise_decay": {"low": 0.5, "high": 0.9}}},
     "noise_decay changes a candidate's noise"),
    ({"space": {"epochs": {"low": 1, "high": 200}}}, "200 privacy profiles"),
    ({"recipe_weight": 1}, "recipe_weight = 1 must be a number from 0"),
    ({"recipe_weight": -0.1}, "recipe_weight = -0.1 must be a number from 0"),
    ({"search_epsilon": "all"}, "search_epsilon = \"all\" must be null or a number above 0"),
    ({"recipe_weight": 0.5, "recipe_margin": -1}, "recipe_margin = -1 must be a number from 0"),
    ({"recipe_margin": 0.05}, "recipe_margin = 0.05 needs a recipe_weight above 0 or "
                              "recipe_candidate"),
    ({"recipe_margin_noise": -1}, "recipe_margin_noise = -1 must be a number from 0 to 10"),
    ({"recipe_margin_noise": 2}, "recipe_margin_noise = 2 needs a recipe_weight above 0 or "
                                 "recipe_candidate"),
    ({"recipe_candidate": "yes"}, "recipe_candidate = \"yes\" must be true or false"),
    ({"recipe_candidate": 1}, "recipe_candidate = 1 must be true or false"),
    ({"search_epsilon": 1.0, "candidate_epochs": 2.5}, "candidate_epochs = 2.5 must be null or an "
                                                       "integer from 1"),
    ({"candidate_epochs": 3}, "candidate_epochs needs a search_epsilon"),
    ({"search_epsilon": 1.0, "candidate_epochs": 3, "space": {"epochs": [1, 2]}},
     "candidate_epochs and space.epochs both set the candidates' epochs"),
])
def test_a_bad_search_file_is_one_line_naming_it(values, message):
    with pytest.raises(UserError) as refused:
        search_space.parse({"space": {"learning_rate": [1.0]}, **values}, "s.json")
    assert str(refused.value).startswith("s.json") and message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_privacy_profiles_are_counted_without_being_made_and_made_once_each():
    search = search_space.parse({"space": {"epochs": {"low": 1, "high": 3}, "batch_size": [10, 20],
                                           "learning_rate": {"low": 0.1, "high": 1.0}}}, "s.json")
    profiles = search.profiles(dict_hp())
    assert search.profile_count() == len(profiles) == 6  # the learning rate changes no profile
    assert {(hp.epochs, hp.batch_size)
            for hp in profiles} == {(e, b) for e in (1, 2, 3) for b in (10, 20)}


def test_a_draw_takes_every_searched_key_from_its_range_or_list_and_the_rest_from_the_base():
    search = search_space.parse({"space": {"learning_rate": {
        "low": 0.01, "high": 10.0, "log": True}, "epochs": {"low": 2, "high": 4},
                                           "ema_decay": [0.0, 0.9]}}, "s.json")
    base = dict_hp(max_grad_norm=0.7)
    rng = np.random.default_rng(0)
    draws = [search.draw(base, rng) for _ in range(2000)]
    rates = np.array([hp.learning_rate for hp in draws])
    assert rates.min() >= 0.01 and rates.max() <= 10.0
    # log-uniform: a third of the decades
    assert np.mean(rates < 0.1) == pytest.approx(1 / 3, abs=0.04)
    assert {hp.epochs for hp in draws} == {2, 3, 4} and {hp.ema_decay for hp in draws} == {0.0, 0.9}
    assert {hp.max_grad_norm for hp in draws} == {0.7}


def test_a_recipe_weight_draws_the_base_itself_that_often_and_adds_its_profile():
    search = search_space.parse({"space": {"learning_rate": {"low": 0.01, "high": 10.0},
                                           "batch_size": [10, 20]}, "recipe_weight": 0.25},
                                "s.json")
    base = dict_hp(batch_size=50)
    rng = np.random.default_rng(0)
    draws = [search.draw(base, rng) for _ in range(4000)]
    assert np.mean([hp == base for hp in draws]) == pytest.approx(0.25, abs=0.025)
    # the base's batch of 50 is a privacy profile the accountant must cover
    assert sorted(hp.batch_size for hp in search.profiles(base)) == [10, 20, 50]
    without = search_space.parse({"space": {"learning_rate": {"low": 0.01, "high": 10.0}}},
                                 "s.json")
    # weight 0 draws no more numbers: a search's candidates stay as they were
    rng, alone = np.random.default_rng(1), np.random.default_rng(1)
    assert [without.draw(base, rng).learning_rate for _ in range(3)] == [
        without.space["learning_rate"].draw(alone) for _ in range(3)]


def test_a_recipe_candidate_adds_the_base_s_profile_first_and_never_a_draw():
    search = search_space.parse({"space": {"learning_rate": {"low": 0.01, "high": 10.0},
                                           "batch_size": [10, 20]}, "recipe_candidate": True,
                                 "recipe_margin": 0.1}, "s.json")
    base = dict_hp(batch_size=50)
    # the base's batch first: plan_search calibrates the recipe candidate's profile as the first
    assert [hp.batch_size for hp in search.profiles(base)] == [50, 10, 20]
    rng = np.random.default_rng(0)
    assert not any(search.draw(base, rng) == base for _ in range(200))


@pytest.mark.parametrize("shape", [0, 2.5, "poisson"])
def test_a_search_file_survives_its_json_round_trip(shape):
    search = search_space.parse({"space": {"learning_rate": {"low": 0.1, "high": 1.0, "log": True},
                                           "batch_size": [10, 20]}, "mean_candidates": 3,
                                 "shape": shape, "validation_fraction": 0.2,
                                 "recipe_weight": 0.5, "recipe_margin": 0.05,
                                 "recipe_candidate": True, "recipe_margin_noise": 2.5,
                                 "search_epsilon": 1.0,
                                 "candidate_epochs": 3}, "s.json")
    assert search_space.parse(search.to_json(), "again") == search
    assert search.validation_permille == 200


@pytest.mark.parametrize("base, message", [
    ({"dp": False}, "a private search needs dp = true"),
    ({"target_epsilon": None, "noise_multiplier": 1.0}, "a search needs target_epsilon"),
    ({"max_epsilon": 5.0}, "set max_epsilon to null"), ({"features": "pixels"},
     'the candidate {"network": "linear"}: network = "linear" takes features'),
])
def test_a_search_the_algos_hyperparameters_cannot_run_is_refused(base, message):
    search = search_space.parse({"space": {"network": ["cnn", "linear"]}}, "s.json")
    with pytest.raises(UserError) as refused:
        search_space.check_with(search, dict_hp(**{"features": "scattering", **base}), "s.json")
    assert str(refused.value).startswith("s.json") and message in str(refused.value)
    # one profile
    assert len(search_space.check_with(search, dict_hp(features="scattering"), "s.json")) == 1


def test_the_option_names_the_default_search_a_file_or_none(tmp_path):
    assert search_space.from_option(None) is None
    assert search_space.from_option("default") == search_space.parse(
        search_space.DEFAULT, "default")
    (tmp_path / "s.json").write_text('{"space": {"learning_rate": [1.0, 2.0]}}')
    assert search_space.from_option(str(tmp_path / "s.json")).space == {"learning_rate": (1.0, 2.0)}
