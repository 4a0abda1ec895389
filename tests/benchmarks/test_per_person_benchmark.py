"""benchmarks/per_person.py: the group-privacy row's (ε, δ), the report and its goal, and one tiny
point of each row."""
import math

import numpy as np
import pytest

from mnist_dp.assets import ALGO_ASSETS, REPO, load_asset_module
from mnist_dp.data import sources

per_person = load_asset_module(REPO / "benchmarks" / "per_person.py", "per_person_benchmark")


@pytest.mark.parametrize("k", [1, 10, 50])
def test_the_group_privacy_row_gives_a_group_of_k_the_persons_epsilon_and_delta(k):
    epsilon, delta = per_person.group_privacy(k, 3.0, 1e-5)
    assert k * epsilon == pytest.approx(3.0)  # (kε, k·e^((k-1)ε)·δ) for a group of k
    assert k * math.exp((k - 1) * epsilon) * delta == pytest.approx(1e-5)
    assert per_person.group_privacy(10, 3.0, 1e-5) == pytest.approx((0.3, 1e-5 / (10 * math.exp(
        2.7))))


def record(framework, split, row, accuracy, organizations=1):
    return {"organizations": organizations, "split": split, "framework": framework, "row": row,
            "seed": 0, "test_accuracy": accuracy, "epsilon": 3.0, "delta": 1e-5, "sigma": 1.0,
            "batch_size": 50, "steps": 10, "seconds": 1.0}


def test_the_report_shows_every_row_and_judges_the_goal_per_organisations_split_and_framework():
    text = per_person.report([record("torch", None, "per-image", 0.9),
                              record("torch", "10", "per-person", 0.85),
                              record("torch", "10", "group-privacy", 0.79),
                              record("tf", "10", "per-person", 0.85),
                              record("tf", "10", "group-privacy", 0.81),
                              record("torch", "10", "per-person", 0.84, 2),
                              record("torch", "10", "group-privacy", 0.80, 2)])
    assert "| 1 | any | torch | per-image | 90.0 |" in text
    assert "| 1 | persons of 10 images | torch | per-person | 85.0 |" in text
    assert "| 2 | persons of 10 images | torch | per-person | 84.0 |" in text
    assert "- 1 organisation, persons of 10 images, torch: +6.0 points, met." in text
    assert "- 1 organisation, persons of 10 images, tf: +4.0 points, MISSED." in text
    assert "- 2 organisations, persons of 10 images, torch: +4.0 points, MISSED." in text


def torch_framework():
    return load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_per_person").FRAMEWORK


def tiny_split():
    """(train, test): 300 and 100 embedded images in [0, 1], as the benchmark's data."""
    train, test = sources.split_train_test(*sources.load_embedded(), 300, 100, 0)
    return tuple((x.astype(np.float32) / 255, y.astype(np.int64)) for x, y in (train, test))


@pytest.mark.parametrize("row", ["per-person", "group-privacy"])
def test_one_tiny_point_of_each_row_trains_at_its_epsilon(row):
    got = per_person.point(torch_framework(), "1-50", row, 0, *tiny_split(),
                           {"epochs": 1, "batch_size": 10})
    persons = per_person.persons_of("1-50", 300)
    want = {"per-person": (3.0, 1e-5),
            "group-privacy": per_person.group_privacy(int(np.bincount(persons).max()), 3.0, 1e-5)}
    assert got["delta"] == pytest.approx(want[row][1])
    assert got["epsilon"] <= want[row][0] * (1 + 1e-9) and got["epsilon"] > 0.9 * want[row][0]
    assert got["batch_size"] == 10  # in persons, or images
    assert 0 <= got["test_accuracy"] <= 1


def test_each_organisation_holds_whole_persons_named_only_when_the_row_is_per_person():
    persons = per_person.persons_of("1-50", 300)
    # each image's label is its index: what an organisation holds
    images, labels = np.random.default_rng(0).random((300, 28, 28)), np.arange(300)
    named, unnamed = (per_person.holdings((images, labels), persons, 2, flag) for flag in (True,
                                                                                        False))
    held = [np.unique(persons[h["labels"]]) for h in named]
    assert not set(held[0]) & set(held[1])  # a person at one organisation only
    assert len(held[0]) + len(held[1]) == persons.max() + 1
    assert abs(len(held[0]) - len(held[1])) <= 1
    assert sum(len(h["labels"]) for h in named) == 300
    assert all("persons" in h["samples"][0] for h in named)
    assert not any("persons" in h["samples"][0] for h in unnamed)


@pytest.mark.parametrize("row", ["per-person", "group-privacy"])
def test_one_tiny_federated_point_keeps_every_organisation_within_the_rows_epsilon(row):
    got = per_person.point(torch_framework(), "10", row, 0, *tiny_split(),
                           {"batch_size": 5, "ema_decay": 0}, organizations=2, schedule=(1, 2))
    want = {"per-person": (3.0, 1e-5), "group-privacy": per_person.group_privacy(10, 3.0, 1e-5)}
    assert got["delta"] == pytest.approx(want[row][1])
    # calibrated for two rounds: the worst organisation ends at, not beyond, the row's ε
    assert 0.9 * want[row][0] < got["epsilon"] <= want[row][0] * (1 + 1e-9)
    assert 0 <= got["test_accuracy"] <= 1
