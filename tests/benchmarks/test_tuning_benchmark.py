"""benchmarks/tuning.py: the recipe-off class-imbalanced set, and how its report judges goals."""
import json

import numpy as np
import pytest

from mnist_dp import search_space
from mnist_dp.assets import REPO, load_asset_module
from mnist_dp.utils.errors import UserError

tuning = load_asset_module(REPO / "benchmarks" / "tuning.py", "tuning_benchmark")


def test_the_imbalanced_set_keeps_the_digits_5_to_9_at_one_in_ten_and_a_balanced_test_set():
    (_, labels), (_, test_labels) = tuning.load("imbalanced")
    (_, all_labels), (_, all_test_labels) = tuning.load("mnist4k")
    common, rare = np.bincount(labels, minlength=10)[:5], np.bincount(labels, minlength=10)[5:]
    assert np.array_equal(common, np.bincount(all_labels, minlength=10)[:5])
    assert 0.07 < rare.sum() / np.bincount(all_labels, minlength=10)[5:].sum() < 0.13
    assert np.array_equal(test_labels, all_test_labels)
    assert np.array_equal(tuning.load("imbalanced")[0][1], labels)  # drawn once


def record(dataset, method, accuracy, seconds):
    return {"dataset": dataset, "method": method, "seed": 0, "epsilon": 3.0,
            "test_accuracy": accuracy, "candidates": 1, "seconds": seconds}


def test_the_report_judges_each_goal_in_accuracy_and_in_time():
    text = tuning.report([record("fmnist", "private-search", 0.894, 250),
                          record("fmnist", "default", 0.897, 130),
                          record("mnist4k", "private-search", 0.960, 50),
                          record("mnist4k", "default", 0.969, 20),
                          record("imbalanced", "private-search", 0.83, 3),
                          record("imbalanced", "default", 0.79, 2)])
    assert "- private-search, Fashion-MNIST 60k: loses at most 0.3 points to the default: -0.3 " \
           "points, met." in text
    assert "- private-search, Fashion-MNIST 60k: takes at most 2× the default's time: 1.9×, " \
           "met." in text
    assert "- private-search, MNIST-4k (embedded): loses at most 0.5 points to the default: " \
           "-0.9 points, MISSED." in text
    assert "- private-search, MNIST-4k (embedded): takes at most 2× the default's time: 2.5×, " \
           "MISSED." in text
    assert "- private-search, class-imbalanced MNIST-4k (recipe off): beats the default by at " \
           "least 3 points: +4.0 points, met." in text
    assert "search-then-train," not in text  # no records of it


def test_every_search_method_s_file_is_a_search_file_with_a_runner():
    for method, values in tuning.SEARCHES.items():
        assert search_space.parse(values, method).to_json() == values
        assert method in tuning.METHODS and method in tuning.RUN
    # the docs' claims: recipe-noise is the bundle's default search, private-search its space alone
    assert search_space.parse(tuning.SEARCHES["recipe-noise"], "x") == search_space.load(None)
    assert search_space.parse(tuning.SEARCHES["private-search"], "x") == search_space.parse(
        {"space": search_space.DEFAULT["space"]}, "x")


def test_the_report_is_written_beside_the_records_it_was_made_from(tmp_path, capsys):
    records = tmp_path / "five-seeds.json"
    records.write_text(json.dumps([record("mnist4k", "default", 0.969, 20)]))
    tuning.main(["--report-only", "--results", str(records)])
    assert "| MNIST-4k (embedded) | default | 96.9 |" in (tmp_path / "five-seeds.md").read_text()
    with pytest.raises(UserError, match="give the records a .json name"):
        tuning.main(["--report-only", "--results", str(tmp_path / "five-seeds.md")])
