"""What a declared public size costs: test accuracy when the data's real count differs from the size
its owner declared (docs/privacy.md, "The public size"), at ε = 3 and δ = 1e-5 on MNIST-4k.

A run's q, steps and normaliser come from the declared size S, not from the n examples the data
holds: the expected batch is n·q while the noisy sum is divided by S·q, so the mean update is
scaled by n / S (a learning rate off by that factor) and the noise's share of it by S / n. Per
framework and seed, the recipe trains on the default run's 4,000 training images declared as S =
4,000 · ratio for each ratio (1 is today's mechanism, bit for bit; 0.9 and 1.1 are the largest the
scripts accept, policy.SIZE_TOLERANCE). Every point draws its noise from its seed, so the rows of
one seed differ only by the declared size.

Writes benchmarks/results/public-size.json (one record per framework, ratio and seed, resumed) and
public-size.md beside it.

    python benchmarks/public_size.py [--frameworks torch,tf,mindspore] [--ratios 0.9,1,1.1]
        [--seeds 3]
"""
import concurrent.futures
import json
import multiprocessing
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import utility  # noqa: E402

from mnist_dp import hyperparameters  # noqa: E402
from mnist_dp.assets import ALGO_ASSETS, load_asset_module  # noqa: E402
from mnist_dp.learning import features, model_io, training  # noqa: E402
from mnist_dp.privacy import policy  # noqa: E402
from mnist_dp.privacy.ledger import Ledger  # noqa: E402
from mnist_dp.utils import atomic, json_input, options  # noqa: E402
from mnist_dp.utils.errors import run_cli  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "public-size.json"
EPSILON, DELTA = 3.0, 1e-5
RATIOS = (1 - policy.SIZE_TOLERANCE, 1.0, 1 + policy.SIZE_TOLERANCE)


def run_point(framework: str, ratio: float, seed: int) -> dict:
    """In a child process: train the recipe on MNIST-4k declared as round(4,000 · ratio) images;
    its record."""
    warnings.filterwarnings("ignore")
    if not getattr(features.scattering, "remembers", False):
        features.scattering = utility.remember_features(features.scattering)
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}")
    (train_x, train_y), (test_x, test_y) = utility.load_dataset("mnist4k", validation=False)
    hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME,
                              hyperparameters.Overrides({
                                  "target_epsilon": EPSILON, "noise_multiplier": None,
                                  "delta": DELTA, "seed": seed, "noise_seed": seed},
                                  "the benchmark's settings"))
    size = round(len(train_y) * ratio)
    run = training.fit_from_scratch(algo.FRAMEWORK, train_x, train_y, hp, "public size",
                                    ("mnist4k",), public_size=size)
    predicted = model_io.predicted_labels(algo.FRAMEWORK, run.model, test_x, run.network)
    return {"framework": framework, "ratio": ratio, "seed": seed, "n": int(len(train_y)),
            "public_size": size, "test_accuracy": float(np.mean(predicted == test_y)),
            "epsilon": Ledger([run.plan.event(run.ran)]).epsilon(DELTA),
            "sigma": run.plan.sigma, "sample_rate": run.plan.sampling.sample_rate,
            "steps": run.ran.steps, "seconds": round(run.seconds, 1)}


def read(path: Path) -> list:
    if not path.is_file():
        return []
    return [json_input.loads(line, f"{path}, line {k}")
            for k, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]


def run_all(frameworks: list, ratios: list, seeds: int, results: Path) -> list:
    """Every point not in `results` yet, each written as it finishes (one child process per
    framework, its features computed once)."""
    records = read(results)
    done = {(r["framework"], r["ratio"], r["seed"]) for r in records}
    for framework in frameworks:
        with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")) as pool:
            for seed in range(seeds):
                for ratio in ratios:
                    if (framework, ratio, seed) in done:
                        continue
                    record = pool.submit(run_point, framework, ratio, seed).result()
                    print(json.dumps(record), flush=True)
                    records.append(record)
                    atomic.write_text(results, "".join(json.dumps(r) + "\n" for r in records))
    return records


def report(records: list) -> str:
    """The table: mean test accuracy per framework and ratio, and its move from ratio 1."""
    lines = ["| framework | declared size / n | q | steps | ε | seeds | test accuracy % | "
             "against ratio 1 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for framework in sorted({r["framework"] for r in records}):
        own = [r for r in records if r["framework"] == framework]
        means = {ratio: statistics.mean(r["test_accuracy"] for r in own if r["ratio"] == ratio)
                 for ratio in sorted({r["ratio"] for r in own})}
        for ratio, mean in means.items():
            first = next(r for r in own if r["ratio"] == ratio)
            seeds = sum(r["ratio"] == ratio for r in own)
            move = (f"{100 * (mean - means[1.0]):+.1f} points" if 1.0 in means else "")
            lines.append(f"| {framework} | {ratio:g} | {first['sample_rate']:.4g} | "
                         f"{first['steps']} | {first['epsilon']:.3f} | {seeds} | "
                         f"{100 * mean:.1f} | {move} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS), default=None,
                        help=f"comma-separated (default: {','.join(ALGO_ASSETS)})")
    parser.add_argument("--ratios", type=options.comma_list(options.number(
        1 - policy.SIZE_TOLERANCE, 1 + policy.SIZE_TOLERANCE)), default=None,
                        help="declared size / real count, each within the scripts' bound "
                             f"(default: {','.join(f'{r:g}' for r in RATIOS)})")
    parser.add_argument("--seeds", type=options.integer(1, utility.MAX_SEEDS), default=None,
                        help="seeds per point (default: 3)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the JSON records, resumed if present; public-size.md is written "
                             "beside it (default: %(default)s)")
    args = parser.parse_args(argv)
    records = run_all(args.frameworks or list(ALGO_ASSETS), args.ratios or list(RATIOS),
                      args.seeds or 3, args.results)
    text = report(records)
    atomic.write_text(args.results.with_name("public-size.md"), text)
    print(text)


if __name__ == "__main__":
    run_cli(main)
