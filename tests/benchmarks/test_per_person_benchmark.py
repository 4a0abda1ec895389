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


def record(framework, split, row, accuracy):
    return {"split": split, "framework": framework, "row": row, "seed": 0,
            "test_accuracy": accuracy, "epsilon": 3.0, "delta": 1e-5, "sigma": 1.0,
            "batch_size": 50, "steps": 10, "seconds": 1.0}


def test_the_report_shows_every_row_and_judges_the_goal_per_split_and_framework():
    text = per_person.report([record("torch", None, "per-image", 0.9),
                              record("torch", "10", "per-person", 0.85),
                              record("torch", "10", "group-privacy", 0.79),
                              record("tf", "10", "per-person", 0.85),
                              record("tf", "10", "group-privacy", 0.81)])
    assert "| any | torch | per-image | 90.0 |" in text
    assert "| persons of 10 images | torch | per-person | 85.0 |" in text
    assert "- persons of 10 images, torch: +6.0 points, met." in text
    assert "- persons of 10 images, tf: +4.0 points, MISSED." in text


@pytest.mark.parametrize("row", ["per-person", "group-privacy"])
def test_one_tiny_point_of_each_row_trains_at_its_epsilon(row):
    images, labels = sources.load_embedded()
    train, test = sources.split_train_test(images, labels, 300, 100, 0)
    scale = lambda split: (split[0].astype(np.float32) / 255, split[1].astype(np.int64))  # noqa: E731
    framework = load_asset_module(ALGO_ASSETS["torch"] / "algo.py", "algo_torch_per_person_bench")
    got = per_person.point(framework.FRAMEWORK, "1-50", row, 0, scale(train), scale(test),
                           {"epochs": 1, "batch_size": 10})
    persons = per_person.persons_of("1-50", 300)
    want = {"per-person": (3.0, 1e-5),
            "group-privacy": per_person.group_privacy(int(np.bincount(persons).max()), 3.0, 1e-5)}
    assert got["delta"] == pytest.approx(want[row][1])
    assert got["epsilon"] <= want[row][0] * (1 + 1e-9) and got["epsilon"] > 0.9 * want[row][0]
    assert got["batch_size"] == 10  # in persons, or images
    assert 0 <= got["test_accuracy"] <= 1
