"""benchmarks/benchmark.py: its command line and how it times variants (not the figures themselves)."""
import subprocess
import sys
import time

from mnist_dp.orchestration.assets import REPO, load_asset_module

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
    assert "default run" in subprocess.run([sys.executable, BENCHMARK, "--help"], capture_output=True, text=True,
                                           check=True).stdout
    proc = subprocess.run([sys.executable, BENCHMARK, "--frameworks", "jax"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown ['jax']" in proc.stderr
