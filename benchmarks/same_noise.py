"""The three frameworks given the same noise: does anything but their noise draws tell them apart?

Each framework trains the assets' recipe on the embedded MNIST-4k split (4,000 / 1,000) at --epsilon
(σ calibrated by our accountant, δ = 1e-5), twice per seed:
- "shared noise": its own noise off, and instead the same N(0, σ²C²) added to its clipped sum at
  every step, drawn in numpy from the seed coordinate by coordinate in the common weight layout
  (mnist_dp/learning/initial_weights.py), through the hook the white-box audit uses
  (DpStep.canaries, between the clipping and the update);
- "own noise": as a train task runs it, each library drawing its own noise.
Everything else is already shared: the initial weights (drawn from the seed), the Poisson batches
(the skeleton's, from the seed), the features. If the three algos are one mechanism, the
shared-noise runs differ by float rounding only, and what separates the own-noise runs is their
noise draws.

Writes OUTPUT/same-noise.json (one record per run, as each finishes) and OUTPUT/same-noise.md
(accuracy per seed, both ways).

    python benchmarks/same_noise.py [--frameworks torch,tf,mindspore] [--seeds 5] [--epsilon 3]
    [--output DIR]
"""
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

# before any framework (docs/design.md)
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.assets import ALGO_ASSETS, load_asset_module
from mnist_dp.learning import model_io, training
from mnist_dp.learning.interface import Network
from mnist_dp.privacy import task_plan
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.utils import atomic, options
from mnist_dp.utils.errors import run_cli

# utility.py: the data, δ and the keys a benchmark sets
sys.path.insert(0, str(Path(__file__).resolve().parent))
import utility  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DELTA = utility.DELTA
SHARED, OWN = "shared noise", "own noise"


class SharedNoise:
    """The noise of every step, drawn here instead of by the framework (training.fit gives the
    framework σ × 0): N(0, (σC)²) on each coordinate of the clipped sum, from a numpy generator
    seeded with the run's seed."""

    noise_scale = 0.0  # the framework's own noise: none

    def __init__(self, seed: int, sigma: float):
        self.rng, self.sigma = np.random.default_rng(seed), sigma

    def before_noise(self, clipped_sum: list, clip_norm: float) -> list:
        return [(np.asarray(g, np.float64) + self.rng.normal(0.0, self.sigma * clip_norm,
                            np.shape(g)))
                .astype(np.float32) for g in clipped_sum]


def mnist4k(train_size):
    """The default run's split (utility.py's): the first `train_size` of its 4,000 training images,
    its test set."""
    (train_x, train_y), test = utility.load_dataset("mnist4k", False)
    return (train_x[:train_size], train_y[:train_size]), test


def run(algo, framework, data, seed, args, noise):
    """One training run; its record."""
    (train_x, train_y), (test_x, test_y) = data
    hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME,
                              hyperparameters.Overrides({
        **args.changes, "noise_multiplier": None, "target_epsilon": args.epsilon,
                                                         "max_epsilon": None, "delta": DELTA,
        "seed": seed, "noise_seed": seed, "dp": True, "secure_mode": False},
                                                        "the benchmark's settings"))
    plan = task_plan.fresh(framework, hp, len(train_y), "the benchmark's settings")
    network = Network.of(hp)
    model = algo.FRAMEWORK.new_model(hp.seed, network)
    began = time.perf_counter()
    training.fit(algo.FRAMEWORK, model, network.inputs(train_x), train_y, plan,
                 RunRandomness.for_run(hp.noise_seed),
                 canaries=SharedNoise(seed, plan.sigma) if noise == SHARED else None)
    accuracy = float(np.mean(model_io.predicted_labels(algo.FRAMEWORK, model, test_x,
                                                       network) == test_y))
    return {"framework": framework, "seed": seed, "noise": noise, "epsilon": args.epsilon,
            "sigma": plan.sigma, "steps": plan.sampling.steps, "train_size": len(train_y),
            "accuracy": accuracy,
            "seconds": round(time.perf_counter() - began, 1)}


def report(records, frameworks):
    """Markdown: accuracy per seed and framework, shared noise then own noise, and how far apart
    they are."""
    lines = []
    for noise in (SHARED, OWN):
        rows = {(r["seed"], r["framework"]): r["accuracy"] for r in records if r["noise"] == noise}
        seeds = sorted({seed for seed, _ in rows})
        lines += [f"**{noise}** (test accuracy %, MNIST-4k, ε = {records[0]['epsilon']:g} at δ = "
                  f"{DELTA:g})", "",
                  "| seed | " + " | ".join(frameworks) + " | largest difference (points) |",
                  "|---:|" + "---:|" * (len(frameworks) + 1)]
        for seed in seeds:
            values = [rows.get((seed, f)) for f in frameworks]
            known = [v for v in values if v is not None]
            lines.append(f"| {seed} | " + " | ".join("–" if v is None else f"{100 * v:.1f}"
                                                     for v in values)
                         + f" | {100 * (max(known) - min(known)):.1f} |")
        means = [[rows[s, f] for s in seeds if (s, f) in rows] for f in frameworks]
        lines.append("| mean | " + " | ".join(f"{100 * statistics.mean(m):.2f}" if m else "–"
                                              for m in means)
                     + " | |")
        same = sum(len({rows.get((s, f)) for f in frameworks}) == 1 for s in seeds)
        lines += ["", f"The same accuracy in every framework at {same} of {len(seeds)} seeds.", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS),
                        default=",".join(ALGO_ASSETS),
                        help="comma-separated (default: %(default)s)")
    parser.add_argument("--seeds", type=options.integer(1, 100), default=5,
                        help="seeds 0 .. N-1 (default: 5)")
    parser.add_argument("--epsilon",
                        type=options.number(0, hyperparameters.MAX_EPSILON, low_open=True),
                        default=3.0, help="target ε at δ = 1e-5 (default: 3)")
    parser.add_argument("--train-size", type=options.integer(10, 4000), default=4000,
                        help="training images, the first of the split's 4,000 (default: 4000)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a hyperparameter of every asset (JSON value), e.g. --set "
                             "epochs=10")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help="folder of the results (default: %(default)s)")
    args = parser.parse_args(argv)
    args.changes = hyperparameters.parse_assignments(args.set)
    hyperparameters.refuse_keys(args.changes, utility.SET_BY_THE_BENCHMARK,
                                "the benchmark sets it (σ for --epsilon, the seeds, DP on)")
    warnings.filterwarnings("ignore")
    data = mnist4k(args.train_size)
    args.output.mkdir(parents=True, exist_ok=True)
    records = []
    for framework in args.frameworks:
        algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}")
        for seed in range(args.seeds):
            for noise in (SHARED, OWN):
                records.append(run(algo, framework, data, seed, args, noise))
                print(f"{framework:<10} seed {seed} {noise:<12}: accuracy "
                      f"{records[-1]['accuracy']:.4f}, {records[-1]['seconds']:.0f} s", flush=True)
                # Written as it goes: a run stopped half-way keeps what it measured.
                atomic.write_text(args.output / "same-noise.json",
                                  json.dumps(records, indent=1) + "\n")
    text = report(records, args.frameworks)
    atomic.write_text(args.output / "same-noise.md", text)
    print(text + f"\nwrote {args.output / 'same-noise.json'} and {args.output / 'same-noise.md'}")


if __name__ == "__main__":
    run_cli(main)
