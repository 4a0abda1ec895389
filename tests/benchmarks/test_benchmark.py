"""benchmarks/benchmark.py: its command line and how it times variants (not the figures
themselves)."""
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import FRAMEWORKS

from mnist_dp.assets import REPO, load_asset_module
from mnist_dp.learning import features

BENCHMARK = REPO / "benchmarks" / "benchmark.py"
benchmark = load_asset_module(BENCHMARK, "benchmark")


def test_variants_take_turns_and_each_gets_its_median_after_the_warmup():
    order = []

    def step(name, seconds):
        def run(x, y):
            order.append(name)
            time.sleep(seconds)
        return run

    warmup = benchmark.WARMUP
    medians = benchmark.interleaved_medians({
        "fast": (step("fast", 0.001), [(None, None)] * (warmup + 5)),
        "slow": (step("slow", 0.02), [(None, None)] * (warmup + 2)),  # fewer steps: it stops early
    })
    assert order[:4] == ["fast", "slow", "fast", "slow"] and order.count("slow") == warmup + 2
    assert medians["slow"] > 5 * medians["fast"]


def test_help_and_a_bad_framework():
    assert "default run" in subprocess.run([sys.executable, BENCHMARK, "--help"],
                                           capture_output=True, text=True, check=True).stdout
    proc = subprocess.run([sys.executable, BENCHMARK, "--frameworks", "jax"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: argument --frameworks: unknown 'jax'")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_variant_steps_the_network_that_set_names_on_its_inputs(framework):
    # not the default network
    variants = benchmark.step_variants(framework, 1, {"network": "linear"})
    assert {benchmark.PLAIN, benchmark.PER_PERSON} <= set(variants)
    assert any(name.endswith("(used)") for name in variants)
    for step, batches in variants.values():
        x, y, *rest = next(iter(batches))  # rest: rows, persons or the indices of x
        assert x.shape[1:] == (features.SCATTERING_DIM,)
        step(x, y, *rest)


def test_a_bad_set_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, BENCHMARK, "--skip-run", "--set", "colour=red"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "colour" in proc.stderr and "Traceback" not in proc.stderr


def test_data_that_is_not_data_samples_is_one_line_and_exit_2(tmp_path):
    """Else run_local.py would generate the embedded data there and time the wrong run."""
    proc = subprocess.run([sys.executable, BENCHMARK, "--skip-steps", "--data",
                           str(tmp_path / "none")], capture_output=True, text=True)
    assert (proc.returncode == 2 and "none: no manifest.json" in proc.stderr
            and "Traceback" not in proc.stderr)


def test_the_features_timing_times_both_transforms_and_the_target_line_judges_the_speed_up(
        monkeypatch, capsys):
    """The two transforms take turns, each gets its own time per image, and the target line says met
    or MISSED."""
    calls = []
    monkeypatch.setattr(benchmark, "embedded_train_set",
                        lambda: (np.zeros((10, 28, 28), np.float32), None))
    monkeypatch.setattr(features, "kymatio_scattering", lambda images: calls.append("kymatio")
                        or time.sleep(0.02))
    monkeypatch.setattr(features, "scattering_maps", lambda images: calls.append("ours")
                        or time.sleep(0.002))
    timings = benchmark.measure_features(2)
    assert calls == ["kymatio", "ours", "kymatio", "ours"]  # taking turns
    speedup = timings["kymatio's numpy transform"] / timings["features.py (used)"]
    assert 3 < speedup < 20
    benchmark.print_targets({}, {}, speedup, None, [])
    assert ("met    scattering features, kymatio's time / features.py's: "
            f"{speedup:.2f}×" in capsys.readouterr().out)
    benchmark.print_targets({}, {}, 4.0, None, [])
    assert "MISSED scattering features" in capsys.readouterr().out


def test_a_per_image_step_is_held_to_1_2_times_its_plain_step_and_a_per_person_one_to_1_5(capsys):
    benchmark.print_targets({}, {"tf": 1.25, "tf per person": 1.45}, None, None, [])
    out = capsys.readouterr().out
    assert "MISSED tf DP step / its plain step: 1.25× (target ≤ 1.2×)" in out
    assert "met    tf per person DP step / its plain step: 1.45× (target ≤ 1.5×)" in out
