"""What privacy per person buys: test accuracy on Fashion-MNIST 60,000 / 10,000 when the guarantee
is for a person with all their images, at ε = 3 and δ = 1e-5 for the person.

The images are grouped into persons by mnist_dp/data/subjects.py, as `generate_data.py
--images-per-subject` does: "10" (6,000 persons of 10 images) or "1-50" (each person's count drawn
from 1..50, a skewed split). A person's images are consecutive images of the shuffled set, so they
are no more alike than any others: real persons' images (a writer's digits) are likelier to help
each other. Per split and framework, three rows:
- per-person: the recipe trained private per person at ε = 3, δ = 1e-5, its batch_size counting
  persons (500 of 6,000 persons of 10: q = 1/12, 360 steps in 30 epochs);
- group-privacy: the recipe trained private per image at the ε and δ whose group-privacy bound gives
  every person (k images, k the split's largest) ε = 3 and δ = 1e-5: an (ε, δ)-DP mechanism is
  (kε, k·e^((k-1)ε)·δ)-DP for groups of k, so ε/k and δ / (k·e^((k-1)ε/k));
- per-image: the recipe at ε = 3 per image, for reference (no guarantee for a person of several
  images but the group-privacy bound's k·3).

Writes benchmarks/results/per-person.json (one record per split, framework, row and seed) as each
finishes, skipping records already there, and per-person.md beside it.

    python benchmarks/per_person.py [--splits 10,1-50] [--frameworks torch,tf,mindspore] [--seeds 1]
"""
import json
import math
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# utility.py: the data and the features' memory
import numpy as np  # noqa: E402
import utility  # noqa: E402

from mnist_dp import hyperparameters  # noqa: E402
from mnist_dp.assets import ALGO_ASSETS, load_asset_module  # noqa: E402
from mnist_dp.data import subjects  # noqa: E402
from mnist_dp.learning import features, model_io, training  # noqa: E402
from mnist_dp.privacy.ledger import Ledger  # noqa: E402
from mnist_dp.utils import atomic, json_input, options  # noqa: E402
from mnist_dp.utils.errors import run_cli  # noqa: E402

EPSILON, DELTA, DATASET = 3.0, 1e-5, "fmnist"
SPLITS = {"10": "persons of 10 images", "1-50": "persons of 1 to 50 images"}
ROWS = ("per-person", "group-privacy", "per-image")
RESULTS = Path(__file__).resolve().parent / "results" / "per-person.json"
# The goal: per person beats the group-privacy row by this much in every framework.
GOAL = 0.05


def group_privacy(k: int, epsilon: float, delta: float) -> tuple[float, float]:
    """The per-image (ε, δ) whose group-privacy bound is (epsilon, delta) for a group of k."""
    per_image = epsilon / k
    return per_image, delta / (k * math.exp((k - 1) * per_image))


def persons_of(split: str, n: int) -> np.ndarray:
    """Each of n images' person, 0..P-1 (seed 0: every run of a split has the same persons)."""
    return subjects.assign(n, subjects.parse(split), np.random.default_rng(0))


def point(framework, split: str | None, row: str, seed: int, train, test,
          changes: dict | None = None) -> dict:
    """Train one model of `row` (on the persons of `split`; None for per-image) and score it on the
    test set; `changes` to the recipe (tests')."""
    persons = None if split is None else persons_of(split, len(train[1]))
    epsilon, delta, changes = EPSILON, DELTA, dict(changes or {})
    if row == "group-privacy":
        epsilon, delta = group_privacy(int(np.bincount(persons).max()), EPSILON, DELTA)
    hp = hyperparameters.load(ALGO_ASSETS[framework.name] / hyperparameters.FILE_NAME,
                              hyperparameters.Overrides({
        **changes, "noise_multiplier": None, "target_epsilon": epsilon, "max_epsilon": None,
        "delta": delta, "seed": seed, "noise_seed": seed, "dp": True, "secure_mode": False},
                                                        "the benchmark's settings"))
    run = training.fit_from_scratch(framework, *train, hp, "per-person", (DATASET,),
                                    persons if row == "per-person" else None)
    predicted = model_io.predicted_labels(framework, run.model, test[0], run.network)
    return {"test_accuracy": float(np.mean(predicted == test[1])),
            "epsilon": Ledger([run.plan.event(run.ran)]).epsilon(delta), "delta": delta,
            "sigma": run.plan.sigma, "batch_size": hp.batch_size, "steps": run.ran.steps,
            "seconds": round(run.seconds, 1)}


def run_all(splits, frameworks, seeds, path: Path) -> list:
    records = read(path)
    done = {(r["split"], r["framework"], r["row"], r["seed"]) for r in records}
    warnings.filterwarnings("ignore")
    # each image set transformed once
    features.scattering = utility.remember_features(features.scattering)
    train, test = utility.load_dataset(DATASET, validation=False)
    for name in frameworks:
        framework = load_asset_module(ALGO_ASSETS[name] / "algo.py", f"algo_{name}").FRAMEWORK
        # per image at ε = 3 does not depend on the persons: one row for every split
        for split, row in [(None, "per-image")] + [(split, row) for split in splits
                                                   for row in ROWS[:2]]:
            for seed in range(seeds):
                key = (split, name, row, seed)
                if key not in done:
                    record = {"split": split, "framework": name, "row": row, "seed": seed,
                              **point(framework, split, row, seed, train, test)}
                    print(f"{split or 'any':<5} {name:<10} {row:<14} seed {seed}: accuracy "
                          f"{record['test_accuracy']:.4f}, ε = {record['epsilon']:.3f} at δ = "
                          f"{record['delta']:.3g}, σ = {record['sigma']:.2f}, "
                          f"{record['seconds']:.0f} s", flush=True)
                    records.append(record)
                    atomic.write_text(path, json.dumps(records, indent=1) + "\n")
    return records


def read(path: Path) -> list:
    return json_input.read(path, "per-person results") if path.exists() else []


def report(records: list) -> str:
    """per-person.md: per split, framework and row, the mean test accuracy, ε, δ, σ and time; then
    the goal."""
    lines = ["# Privacy per person: Fashion-MNIST 60k test accuracy, ε = 3 and δ = 1e-5 per person",
             "", "Written by `python benchmarks/per_person.py` from `per-person.json` (its "
             "docstring says how persons and rows are made). per-image is for reference: its "
             "guarantee is per image.", "",
             "| persons | framework | row | test accuracy | ε | δ | σ | batch | seconds | seeds |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    mean = {}
    for name in ALGO_ASSETS:
        for split, row in [(None, "per-image")] + [(split, row) for split in SPLITS
                                                   for row in ROWS[:2]]:
            rows = [r for r in records if (r["split"], r["framework"], r["row"]) == (split, name,
                                                                                      row)]
            if rows:
                mean[split, name, row] = statistics.mean(r["test_accuracy"] for r in rows)
                lines.append(f"| {SPLITS.get(split, 'any')} | {name} | "
                             f"{row} | {mean[split, name, row] * 100:.1f} | "
                             f"{max(r['epsilon'] for r in rows):.3f} | {rows[0]['delta']:.3g} | "
                             f"{rows[0]['sigma']:.2f} | {rows[0]['batch_size']} | "
                             f"{statistics.mean(r['seconds'] for r in rows):.0f} | {len(rows)} |")
    lines += ["", f"## Goal: per-person beats group-privacy by ≥ {GOAL * 100:.0f} points", ""]
    for (split, name, row), accuracy in mean.items():
        other = mean.get((split, name, "group-privacy"))
        if row == "per-person" and other is not None:
            gap = accuracy - other
            lines.append(f"- {SPLITS[split]}, {name}: {gap * 100:+.1f} points, "
                         f"{'met' if gap >= GOAL else 'MISSED'}.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--splits", type=options.names(SPLITS), default=None,
                        help=f"comma-separated (default: {','.join(SPLITS)})")
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS), default=None,
                        help=f"comma-separated (default: {','.join(ALGO_ASSETS)})")
    parser.add_argument("--seeds", type=options.integer(1, utility.MAX_SEEDS), default=None,
                        help="seeds per point (default: 1)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the JSON records, resumed if present; per-person.md is written "
                             "beside it (default: %(default)s)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing; per-person.md from --results")
    args = parser.parse_args(argv)
    if args.report_only:
        options.refuse_unused("with --report-only", {"--splits": args.splits,
                                                     "--frameworks": args.frameworks,
                                                     "--seeds": args.seeds})
        records = read(args.results)
    else:
        records = run_all(args.splits or list(SPLITS), args.frameworks or list(ALGO_ASSETS),
                          args.seeds or 1, args.results)
    text = report(records)
    atomic.write_text(args.results.with_name("per-person.md"), text)
    print(text)


if __name__ == "__main__":
    run_cli(main)
