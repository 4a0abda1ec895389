"""benchmarks/utility.py: how it groups, reports and judges points (the training is the skeleton's,
tested elsewhere), and one real point on tiny settings."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mnist_dp.assets import REPO, load_asset_module

UTILITY = REPO / "benchmarks" / "utility.py"
utility = load_asset_module(UTILITY, "utility_benchmark")


def row(framework, epsilon, accuracy, seed=0, label="default", dataset="mnist4k", changes=None):
    return {"dataset": dataset, "framework": framework, "target_epsilon": epsilon, "seed": seed,
            "changes": changes or {}, "validation": False, "label": label, "accuracy": accuracy,
            "epsilon": epsilon or float("inf"), "sigma": 1.0, "steps": 1, "seconds": 1.0}


ROWS = [row("torch", 3.0, 0.95), row("torch", 3.0, 0.97, seed=1), row("torch", None, 0.97),
        row("tf", 3.0, 0.93), row("tf", None, 0.97),
        row("tf", 3.0, 0.5, label="other", changes={"epochs": 1})]


def test_seeds_are_averaged_per_label_and_the_goals_are_judged():
    summary = utility.summarise(ROWS, "default", False)
    mean, spread, seeds, *_ = summary["mnist4k", "torch", 3.0]
    assert (mean, spread, seeds) == (pytest.approx(0.96), pytest.approx(0.01), 2)
    assert "| torch | 96.0 ± 1.0 (2) | 97.0 |" in utility.table(summary, [3.0], False)
    goals = utility.goals(summary, 3.0)
    assert "mnist4k torch: 96.0% at ε = 3 (goal ≥ 97.0%): MISSED by 1.0 points" in goals
    assert "mnist4k tf: 93.0% at ε = 3 (goal ≥ 97.0%): MISSED by 4.0 points" in goals
    assert "mnist4k torch: 96.0% at ε = 3 (floor ≥ 96.5%): MISSED by 0.5 points" in goals
    assert not any(" − " in line for line in goals)  # tf has one seed: no two-sample test
    fashion = utility.summarise([row("torch", 1.0, 0.886, dataset="fmnist"),
                                 row("torch", 3.0, 0.899, dataset="fmnist")], "default", False)
    assert utility.goals(fashion, 3.0) == ["fmnist torch: 89.9% at ε = 3 (goal ≥ 90.0%): MISSED by "
                                           "0.1 points",
                                           "fmnist torch: 88.6% at ε = 1 (goal ≥ 88.5%): met"]


def seeds(framework, accuracies):
    return [row(framework, 3.0, accuracy, seed=seed) for seed, accuracy in enumerate(accuracies)]


def test_two_frameworks_are_told_apart_by_welchs_test_on_their_seeds():
    near = utility.summarise(seeds("torch", [0.970, 0.968, 0.972, 0.969, 0.971])
                             + seeds("tf", [0.969, 0.971, 0.967, 0.972, 0.970]), "default", False)
    line = next(line for line in utility.goals(near, 3.0) if " − " in line)
    assert line.startswith("mnist4k torch − tf at ε = 3: +0.02 points, standard error 0.11, Welch "
                           "p = 0.86")
    assert line.endswith(": met")
    apart = utility.summarise(seeds("torch", [0.970, 0.968, 0.972, 0.969, 0.971])
                              + seeds("mindspore", [0.962, 0.961, 0.963, 0.960, 0.962]), "default",
                              False)
    line = next(line for line in utility.goals(apart, 3.0) if " − " in line)
    assert "+0.84 points" in line and line.endswith(": MISSED")


def test_the_reports_say_which_accuracy_they_show():
    summary = utility.summarise(ROWS, "default", False)
    assert "(test accuracy %" in utility.table(summary, [3.0], False)
    assert "(validation accuracy %" in utility.table(summary, [3.0], True)
    assert "(validation accuracy %" in utility.ablation_table(
        ROWS, ["default"], "mnist4k", 3.0, True)


def test_the_ablation_table_shows_each_labels_changes_and_accuracy():
    text = utility.ablation_table(ROWS, ["default", "other"], "mnist4k", 3.0, False)
    assert "| default | none | 96.0 ± 1.0 (2) | 93.0 |" in text
    assert '| other | epochs 1 | – | 50.0 |' in text


def test_a_point_already_in_the_results_has_the_same_key():
    assert utility.point_key(row("torch", 3.0, 0.1)) == utility.point_key(row("torch", 3.0, 0.9))
    assert utility.point_key(row("torch", 3.0, 0.1)) != utility.point_key(row("torch", 3.0, 0.1,
                                 seed=1))
    # A point trained from each library's own initial weights is not one from the common ones.
    assert utility.point_key(row("torch", 3.0, 0.1)) != utility.point_key(
        {**row("torch", 3.0, 0.1), "initial_weights": utility.INITIAL_WEIGHTS})



@pytest.mark.parametrize("label, expected", [
    ("default", "default"), ("tutorial: ReLU CNN (before)", "tutorial-relu-cnn-before"),
    ("default + noise decay 0.7", "default-noise-decay-0.7"),
    ("tanh CNN, C 0.1, lr 1, EMA", "tanh-cnn-c-0.1-lr-1-ema"),
    ("Tramèr & Boneh: ε = 3 ", "tramer-boneh-3"), ("..hidden/../path\\", "hidden-..-path"),
])
def test_a_label_becomes_a_file_name_with_no_character_to_quote(label, expected):
    assert utility.slug(label) == expected


def test_a_report_is_named_by_the_whole_label_not_cut_at_its_last_dot():
    assert (utility.result_file(Path("r/utility.jsonl"), "utility-default + noise decay 0.7", ".md")
            == Path("r/utility-default-noise-decay-0.7.md"))


RESULTS = REPO / "benchmarks" / "results"


def test_every_committed_result_has_a_slug_name_and_each_label_its_report():
    names = [path.relative_to(RESULTS).as_posix() for path in RESULTS.rglob("*")]
    assert names and [n for n in names if not re.fullmatch(r"[a-z0-9.-]+", n)
                      or utility.slug(n) != n] == []
    labels = {row["label"] for row in utility.read_results(RESULTS / "utility.jsonl")
              if not row["validation"]}
    assert labels and [label for label in sorted(labels)
                       if not utility.result_file(RESULTS / "utility.jsonl", f"utility-{label}",
                                                  ".md").exists()] == []


def test_one_tiny_point_trains_and_the_report_is_written(tmp_path):
    results = tmp_path / "utility.jsonl"
    proc = subprocess.run([sys.executable, str(UTILITY), "--datasets", "mnist4k", "--frameworks",
                           "torch", "--epsilons", "8", "--seeds", "1", "--skip-non-private",
                           "--set", "epochs=1",
                           # 8 steps are too few for a weight average of decay
                           # 0.99 to leave the initial CNN
                           "--set", "ema_decay=0", "--results", str(results), "--label", "tiny"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [point] = [json.loads(line) for line in results.read_text().splitlines()]
    assert point["epsilon"] <= 8.0 and 0.5 < point["accuracy"] <= 1 and point["steps"] == 8
    assert (tmp_path / "utility-tiny.png").read_bytes()[:4] == b"\x89PNG"
    assert "| torch | 8" in (tmp_path / "utility-tiny.md").read_text()


def test_a_bad_change_is_refused_in_one_line():
    proc = subprocess.run([sys.executable, str(UTILITY), "--set", "features=wavelets"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "features" in proc.stderr and "Traceback" not in proc.stderr
