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

With --organizations 2, the same rows in a two-organisation federated averaging (federated.py's
task bodies and its 10×3 schedule: 10 local epochs a round, 3 rounds). Each organisation holds half
the persons with all their images, so a person's guarantee is their organisation's ε; every
organisation's σ is calibrated for ε = 3 (or the group-privacy row's) after the last round.

Writes benchmarks/results/per-person.json (one record per organisations, split, framework, row and
seed) as each finishes, skipping records already there, and per-person.md beside it.

    python benchmarks/per_person.py [--organizations 1,2] [--splits 10,1-50]
        [--frameworks torch,tf,mindspore] [--seeds 1]
"""
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# federated.py: the federated training; utility.py: the data and the features' memory
import federated  # noqa: E402
import numpy as np  # noqa: E402
import utility  # noqa: E402

from mnist_dp import hyperparameters  # noqa: E402
from mnist_dp.assets import ALGO_ASSETS, load_asset_module  # noqa: E402
from mnist_dp.data import samples, subjects  # noqa: E402
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
# federated.py's schedule: local epochs a round, rounds
SCHEDULE = (10, 3)
MAX_ORGANIZATIONS = 4


def group_privacy(k: int, epsilon: float, delta: float) -> tuple[float, float]:
    """The per-image (ε, δ) whose group-privacy bound is (epsilon, delta) for a group of k."""
    per_image = epsilon / k
    return per_image, delta / (k * math.exp((k - 1) * per_image))


def persons_of(split: str, n: int) -> np.ndarray:
    """Each of n images' person, 0..P-1 (seed 0: every run of a split has the same persons)."""
    return subjects.assign(n, subjects.parse(split), np.random.default_rng(0))


def holdings(train, persons: np.ndarray | None, organizations: int, per_person: bool) -> list:
    """Each organisation's datasamples: whole persons (`persons`, 0..P-1; None: images) in equal
    shares, each image's person named (subjects) when the row trains `per_person`."""
    if persons is None:
        shares = np.array_split(np.arange(len(train[1])), organizations)
    else:
        owner = np.repeat(np.arange(organizations),
                          [len(s) for s in np.array_split(np.arange(persons.max() + 1),
                                                          organizations)])[persons]
        shares = [np.flatnonzero(owner == k) for k in range(organizations)]
    return [samples.in_memory(train[0][i], train[1][i], f"org{k}",
                              persons[i] if per_person else None,
                              key=samples.in_memory_key(f"org{k}"))
            for k, i in enumerate(shares, 1)]


def point(framework, split: str | None, row: str, seed: int, train, test,
          changes: dict | None = None, organizations: int = 1, schedule=SCHEDULE) -> dict:
    """Train one model of `row` (on the persons of `split`; None for per-image), alone or by
    federated averaging over `organizations` in `schedule` (local epochs a round, rounds), and score
    it on the test set; `changes` to the recipe (tests')."""
    everyone = None if split is None else persons_of(split, len(train[1]))
    epsilon, delta = EPSILON, DELTA
    if row == "group-privacy":
        epsilon, delta = group_privacy(int(np.bincount(everyone).max()), EPSILON, DELTA)
    hp = hyperparameters.load(ALGO_ASSETS[framework.name] / hyperparameters.FILE_NAME,
                              hyperparameters.Overrides({
        **(changes or {}), **({"epochs": schedule[0]} if organizations > 1 else {}),
        "noise_multiplier": None, "target_epsilon": epsilon, "max_epsilon": None, "delta": delta,
        "seed": seed, "noise_seed": seed, "dp": True, "secure_mode": False},
                                                        "the benchmark's settings"))
    if organizations > 1:
        start = time.perf_counter()
        accuracies, epsilons, sigma = federated.train_rounds(
            framework, holdings(train, everyone, organizations, row == "per-person"), hp,
            "fedavg", schedule[1], test)
        return {"test_accuracy": accuracies[-1], "epsilon": max(epsilons), "delta": delta,
                "sigma": sigma, "batch_size": hp.batch_size, "steps": None,
                "seconds": round(time.perf_counter() - start, 1)}
    run = training.fit_from_scratch(framework, *train, hp, "per-person", (DATASET,),
                                    everyone if row == "per-person" else None)
    predicted = model_io.predicted_labels(framework, run.model, test[0], run.network)
    return {"test_accuracy": float(np.mean(predicted == test[1])),
            "epsilon": Ledger([run.plan.event(run.ran)]).epsilon(delta), "delta": delta,
            "sigma": run.plan.sigma, "batch_size": hp.batch_size, "steps": run.ran.steps,
            "seconds": round(run.seconds, 1)}


def run_all(organizations, splits, frameworks, seeds, path: Path) -> list:
    records = read(path)
    done = {key(r) for r in records}
    warnings.filterwarnings("ignore")
    # each image set transformed once
    features.scattering = utility.remember_features(features.scattering)
    train, test = utility.load_dataset(DATASET, validation=False)
    for name in frameworks:
        framework = load_asset_module(ALGO_ASSETS[name] / "algo.py", f"algo_{name}").FRAMEWORK
        for count in organizations:
            for split, row in planned_rows(splits):
                for seed in range(seeds):
                    record = {"organizations": count, "split": split, "framework": name,
                              "row": row, "seed": seed}
                    if key(record) in done:
                        continue
                    record.update(point(framework, split, row, seed, train, test,
                                        organizations=count))
                    print(f"{count} org {split or 'any':<5} {name:<10} {row:<14} seed {seed}: "
                          f"accuracy {record['test_accuracy']:.4f}, ε = {record['epsilon']:.3f} "
                          f"at δ = {record['delta']:.3g}, σ = {record['sigma']:.2f}, "
                          f"{record['seconds']:.0f} s", flush=True)
                    records.append(record)
                    atomic.write_text(path, json.dumps(records, indent=1) + "\n")
    return records


def planned_rows(splits) -> list:
    """(split, row) to train: per image at ε = 3 does not depend on the persons, so one row serves
    every split."""
    return [(None, "per-image")] + [(split, row) for split in splits for row in ROWS[:2]]


def key(record: dict) -> tuple:
    return tuple(record[k] for k in ("organizations", "split", "framework", "row", "seed"))


def read(path: Path) -> list:
    return json_input.read(path, "per-person results") if path.exists() else []


def report(records: list) -> str:
    """per-person.md: per organisations, split, framework and row, the mean test accuracy, ε, δ, σ
    and time; then the goal."""
    lines = ["# Privacy per person: Fashion-MNIST 60k test accuracy, ε = 3 and δ = 1e-5 per person",
             "", "Written by `python benchmarks/per_person.py` from `per-person.json` (its "
             "docstring says how persons, rows and organisations are made). per-image is for "
             "reference: its guarantee is per image. With 2 organisations: federated averaging, "
             f"{SCHEDULE[0]} local epochs a round, {SCHEDULE[1]} rounds, ε the worst "
             "organisation's.", "",
             "| organisations | persons | framework | row | test accuracy | ε | δ | σ | batch | "
             "seconds | seeds |", "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    mean = {}
    for count in sorted({r["organizations"] for r in records}):
        for name in ALGO_ASSETS:
            for split, row in planned_rows(SPLITS):
                rows = [r for r in records if key(r)[:4] == (count, split, name, row)]
                if rows:
                    mean[count, split, name, row] = statistics.mean(r["test_accuracy"]
                                                                    for r in rows)
                    lines.append(f"| {count} | {SPLITS.get(split, 'any')} | {name} | {row} | "
                                 f"{mean[count, split, name, row] * 100:.1f} | "
                                 f"{max(r['epsilon'] for r in rows):.3f} | "
                                 f"{rows[0]['delta']:.3g} | {rows[0]['sigma']:.2f} | "
                                 f"{rows[0]['batch_size']} | "
                                 f"{statistics.mean(r['seconds'] for r in rows):.0f} | "
                                 f"{len(rows)} |")
    lines += ["", f"## Goal: per-person beats group-privacy by ≥ {GOAL * 100:.0f} points", ""]
    for (count, split, name, row), accuracy in mean.items():
        other = mean.get((count, split, name, "group-privacy"))
        if row == "per-person" and other is not None:
            gap = accuracy - other
            lines.append(f"- {count} organisation{'s' if count > 1 else ''}, {SPLITS[split]}, "
                         f"{name}: {gap * 100:+.1f} points, {'met' if gap >= GOAL else 'MISSED'}.")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--organizations",
                        type=options.comma_list(options.integer(1, MAX_ORGANIZATIONS)),
                        default=None, help="comma-separated counts: 1 trains alone, more by "
                                           "federated averaging (default: 1,2)")
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
        options.refuse_unused("with --report-only", {"--organizations": args.organizations,
                                                     "--splits": args.splits,
                                                     "--frameworks": args.frameworks,
                                                     "--seeds": args.seeds})
        records = read(args.results)
    else:
        records = run_all(args.organizations or [1, 2], args.splits or list(SPLITS),
                          args.frameworks or list(ALGO_ASSETS), args.seeds or 1, args.results)
    text = report(records)
    atomic.write_text(args.results.with_name("per-person.md"), text)
    print(text)


if __name__ == "__main__":
    run_cli(main)
