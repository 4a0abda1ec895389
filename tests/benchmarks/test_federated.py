"""benchmarks/federated.py: how it groups, reports and judges runs (the tasks are skeleton.train and
skeleton.aggregate, tested elsewhere), and one real tiny run."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mnist_dp.assets import REPO, load_asset_module

FEDERATED = REPO / "benchmarks" / "federated.py"
federated = load_asset_module(FEDERATED, "federated_benchmark")
ARGS = SimpleNamespace(epsilon=3.0, changes={}, validation=False, frameworks=["torch"],
                       strategies=["fedavg", "cyclic"], organizations=[2], schedules=[(10, 3)])


def row(strategy, organizations, accuracies, seed=0, epochs=10, rounds=3, epsilons=(2.99, 2.99)):
    return {"framework": "torch", "strategy": strategy, "organizations": organizations,
            "epochs": epochs, "rounds": rounds, "epsilon": 3.0, "seed": seed, "changes": {},
            "validation": False, "accuracies": accuracies, "epsilons": list(epsilons), "sigma": 3.0,
            "seconds": 1.0}


ROWS = [row(federated.SINGLE, 1, [0.96], epochs=30, rounds=1),
        row(federated.SINGLE, 1, [0.97], seed=1, epochs=30, rounds=1),
        row("fedavg", 2, [0.90, 0.93, 0.95]), row("fedavg", 2, [0.91, 0.94, 0.94], seed=1),
        row("cyclic", 2, [0.80, 0.85, 0.90], epsilons=(2.5, 2.999)),
        # another split: not in this summary
        {**row("fedavg", 2, [0.1, 0.1, 0.1]), "validation": True}]


def test_the_report_holds_the_runs_asked_for_and_the_one_organisation_reference():
    asked = SimpleNamespace(**{**vars(ARGS), "strategies": ["cyclic"]})
    assert sorted(federated.summarise(ROWS, asked)) == [("torch", "cyclic", 2, 10, 3),
                                                         ("torch", federated.SINGLE, 1, 30, 1)]
    other = SimpleNamespace(**{**vars(ARGS), "organizations": [4], "schedules": [(5, 6)]})
    assert sorted(federated.summarise(ROWS, other)) == [("torch", federated.SINGLE, 1, 30, 1)]


def test_runs_are_averaged_over_seeds_and_judged_against_one_organisation():
    summary = federated.summarise(ROWS, ARGS)
    mean, spread, seeds, epsilon, by_round = summary["torch", "fedavg", 2, 10, 3]
    assert (mean, spread, seeds, epsilon) == (pytest.approx(0.945), pytest.approx(0.005), 2, 2.99)
    assert by_round == [pytest.approx(0.905), pytest.approx(0.935), pytest.approx(0.945)]
    assert summary["torch", "cyclic", 2, 10, 3][3] == 2.999  # the worst organisation's ε
    text = federated.table(summary, ARGS)
    assert "| torch | one organisation | 1 | 30×1 | 96.5 ± 0.5 (2) | 2.990 |  |" in text
    assert "| torch | fedavg | 2 | 10×3 | 94.5 ± 0.5 (2) | 2.990 | -2.0 |" in text
    assert "| torch | cyclic | 2 | 10×3 | 90.0 | 2.999 | -6.5 |" in text
    assert federated.goals(summary) == [
        "torch fedavg, 2 organisations, 10×3: 94.5% vs 96.5% for one organisation, 2.0 points "
        "below (goal ≤ 2): met"]
    # 96.0 alone
    worse = federated.summarise(ROWS[:1] + [row("fedavg", 2, [0.90, 0.92, 0.93])], ARGS)
    assert federated.goals(worse) == [
        "torch fedavg, 2 organisations, 10×3: 93.0% vs 96.0% for one organisation, 3.0 points "
        "below (goal ≤ 2): MISSED by 1.0 points"]


def test_the_same_run_is_not_run_twice():
    assert federated.run_key(row("fedavg", 2, [0.5])) == federated.run_key(row("fedavg", 2, [0.9]))
    assert federated.run_key(row("fedavg", 2, [0.5])) != federated.run_key(row("fedavg", 4, [0.5]))


def test_one_tiny_federated_run_trains_and_the_report_is_written(tmp_path):
    results = tmp_path / "federated.jsonl"
    proc = subprocess.run([sys.executable, str(FEDERATED), "--frameworks", "torch",
                           "--organizations", "2", "--strategies", "fedavg", "--schedules", "1x2",
                           "--seeds", "1", "--skip-single",
                           # examples/fedavg.json's weight average: none (4 steps a round leave a
                           # 0.99 one at the initial CNN)
                           "--epsilon", "8", "--set", "ema_decay=0", "--results", str(results)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run] = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(run["accuracies"]) == 2 and 0.5 < run["accuracies"][-1] <= 1
    assert len(run["epsilons"]) == 2 and max(run["epsilons"]) <= 8.0
    assert (tmp_path / "federated.png").read_bytes()[:4] == b"\x89PNG"
    assert "| torch | fedavg | 2 | 1×2 |" in (tmp_path / "federated.md").read_text()


@pytest.mark.parametrize("args, message", [(["--schedules", "10"], "expected EPOCHSxROUNDS"),
                                           (["--set", "epochs=3"],
                                            "give local epochs in --schedules"),
                                           (["--organizations", "1"], "1 is not an integer from 2"),
                                           (["--schedules", "10x1000000000"],
                                            "1,000,000,000 is not an integer from 1"),
                                           (["--schedules", "10x3000", "--organizations", "2,4"],
                                            "--schedules 10x3000 with 2 organisations and fedavg "
                                            "make 15,000 tasks, more than the 10,000"),
                                           (["--set", "noise_seed=3"],
                                            "--set noise_seed: the benchmark sets it"),
                                           (["--report-only", "--seeds", "2"],
                                            "--seeds has no effect with --report-only")])
def test_bad_settings_are_refused_in_one_line(args, message):
    proc = subprocess.run([sys.executable, str(FEDERATED), *args, "--report-only"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
