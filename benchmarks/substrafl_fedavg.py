"""substrafl's FedAvg with the bundle's algos against the bundle's own federated averaging, through
Substra.

For each framework, on the same data (the embedded MNIST 4,000 / 1,000 split by default, shared
among the organisations) and the same recipe (examples/fedavg.json), both at every organisation's ε
≤ target_epsilon:
- `examples/substrafl_fedavg.py` (substrafl's FedAvg and execute_experiment, the bundle's algo);
- `scripts/run_local.py --strategy fedavg` (the bundle's own plan: train, aggregate, score tasks).
Each runs as its own command on Substra's subprocess backend, one after the other. The table gives
both test accuracies after the last round and their difference (goal: within 1 point), each
organisation's ε as the results.json gives it and as dp_accounting recomputes it here from σ, q and
the steps alone (PLD, Poisson-subsampled Gaussian), and each command's time. Writes
DIR/substrafl.json and DIR/substrafl.md.

    python benchmarks/substrafl_fedavg.py [--frameworks torch,tf,mindspore] [--organizations 2]
    [--rounds 3]
"""
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant

from mnist_dp import hyperparameters
from mnist_dp.assets import ALGO_ASSETS, REPO
from mnist_dp.data import dataset
from mnist_dp.federated import experiment
from mnist_dp.federated.algo import OWN_DATA, check_hyperparameters
from mnist_dp.orchestration import compute_plan
from mnist_dp.privacy import model_file
from mnist_dp.privacy.data_ledger import LEDGER_FILE
from mnist_dp.utils import atomic, json_input, options
from mnist_dp.utils.errors import UserError, run_cli

GOAL_POINTS = 1.0  # the issue: substrafl's accuracy within 1 point of the bundle's own fedavg


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS),
                        default=",".join(ALGO_ASSETS),
                        help="comma-separated (default: %(default)s)")
    parser.add_argument("--organizations", type=options.integer(1, options.MAX_ORGANIZATIONS),
                        default=2, help="(default: %(default)s)")
    parser.add_argument("--rounds", type=options.integer(1, compute_plan.MAX_TASKS), default=3,
                        help="(default: %(default)s)")
    parser.add_argument("--hyperparameters", type=Path, default=REPO / "examples" / "fedavg.json",
                        help="the recipe both commands get (default: %(default)s)")
    parser.add_argument("--data", type=Path,
                        default=REPO / "benchmarks" / "output" / "substrafl-data",
                        help="data samples; the embedded default data is written there if missing "
                             "(default: %(default)s)")
    parser.add_argument("--work", type=Path, default=REPO / "benchmarks" / "output" / "substrafl",
                        help="the commands' --output folders, replaced (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results",
                        help="where substrafl.json and substrafl.md go (default: %(default)s)")
    return parser


def own_runs(record: dict) -> list:
    """The runs of the record's organisation in its local state's ledger (which holds every
    organisation's)."""
    saved = model_file.load(record["model_file"])
    own = set(saved.hyperparameters[OWN_DATA])
    return [e for e in saved.ledger.events if own & set(e.data)]


def recomputed_epsilon(runs: list, delta: float) -> float:
    """ε of an organisation's own steps (`runs`), Poisson-subsampled Gaussian at its (σ, q), at
    `delta`: dp_accounting alone."""
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        runs[0].sample_rate, dp_accounting.GaussianDpEvent(runs[0].noise_multiplier)),
                                              sum(e.steps for e in runs))
    return pld_privacy_accountant.PLDAccountant().compose(event).get_epsilon(delta)


def run(command: list, output: Path) -> tuple:
    """Run a command into a fresh `output`; (its results.json records, seconds)."""
    if output.exists():
        subprocess.run(["rm", "-rf", str(output)], check=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *map(str, command), "--output", str(output)],
                          capture_output=True, text=True)
    if done.returncode:
        raise UserError(f"{' '.join(map(str, command))} failed (exit "
                        f"{done.returncode}):\n{done.stderr[-3000:]}")
    return json_input.read(output / "results.json", "results file"), time.perf_counter() - start


def fresh_copy(data: Path, organizations: int, dest: Path) -> Path:
    """A copy of the data samples (the default data made first if missing) that nothing was released
    from: each path of a comparison trains on its own, or the data's own ledger would count the
    first path's runs in the second's continued models (privacy/data_ledger.py), as it must for two
    experiments on one organisation's data."""
    dataset.generate_default_if_missing(data, train_samples=organizations, flag="--organizations",
                                        organizations=organizations)
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    shutil.copytree(data, dest, ignore=shutil.ignore_patterns(LEDGER_FILE))
    return dest


def compare(framework: str, args) -> dict:
    common = ["--organizations", args.organizations, "--rounds", args.rounds, "--hyperparameters",
              args.hyperparameters]
    theirs, sfl_seconds = run([REPO / "examples" / "substrafl_fedavg.py", "--framework", framework,
                               *common, "--data", fresh_copy(args.data, args.organizations,
                                          args.work / "data-substrafl")],
                              args.work / f"substrafl-{framework}")
    ours, own_seconds = run([REPO / "scripts" / "run_local.py", "--frameworks", framework,
                             "--strategy", "fedavg", *common, "--data",
                             fresh_copy(args.data, args.organizations, args.work / "data-fedavg")],
                            args.work / f"fedavg-{framework}")
    last = [r for r in theirs if r["round"] == args.rounds]
    own_last = max(ours, key=lambda r: r["round"])
    # each organisation's, from its local state
    runs = {r["organization"]: own_runs(r) for r in last}
    accuracies = {r["organization"]: r["test_accuracy"] for r in last}
    if len(set(accuracies.values())) != 1:  # every organisation holds the same global model
        raise UserError(f"{framework}: the organisations' evaluations of the last round differ: "
                        f"{accuracies}")
    return {
        "framework": framework, "organizations": args.organizations, "rounds": args.rounds,
        "substrafl_accuracy": last[0]["test_accuracy"],
            "fedavg_accuracy": own_last["test_accuracy"],
        "difference_points": 100 * (last[0]["test_accuracy"] - own_last["test_accuracy"]),
        "substrafl_epsilon_by_organization": {r["organization"]: r["epsilon_by_organization"][r[
            "organization"]]
                                              for r in last},
        "substrafl_epsilon_recomputed": {r["organization"]: recomputed_epsilon(runs[r[
            "organization"]], r["delta"])
                                         for r in last},
        "substrafl_epsilon_in_evaluation": {r["organization"]: r["epsilon_in_substra"]
                                            for r in last},
        "fedavg_epsilon_by_organization": own_last["epsilon_by_organization"],
        "noise_multiplier": {org: own[0].noise_multiplier for org, own in runs.items()},
        "sample_rate": {org: own[0].sample_rate for org, own in runs.items()},
        "steps": {org: sum(e.steps for e in own) for org, own in runs.items()},
        "substrafl_seconds": sfl_seconds, "fedavg_seconds": own_seconds,
    }


def table(rows: list) -> str:
    lines = ["| framework | substrafl FedAvg % | own fedavg % | difference (points) | ε per "
             "organisation: results.json / recomputed / evaluation | own fedavg ε | σ | q | steps "
             "| seconds: substrafl / own |", "|---|---:|---:|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        orgs = sorted(r["substrafl_epsilon_by_organization"])
        eps = "; ".join(f"{r['substrafl_epsilon_by_organization'][o]:.3f} / "
                        f"{r['substrafl_epsilon_recomputed'][o]:.3f} / "
                        f"{r['substrafl_epsilon_in_evaluation'][o]:.3f}" for o in orgs)
        own = "; ".join(f"{v:.3f}" for _, v in sorted(r["fedavg_epsilon_by_organization"].items()))
        lines.append(f"| {r['framework']} | {100 * r['substrafl_accuracy']:.2f} | "
                     f"{100 * r['fedavg_accuracy']:.2f} | {r['difference_points']:+.2f} | {eps} | "
                     f"{own} | {r['noise_multiplier'][orgs[0]]:.3f} | "
                     f"{r['sample_rate'][orgs[0]]:.4f} | {r['steps'][orgs[0]]} | "
                     f"{r['substrafl_seconds']:.0f} / {r['fedavg_seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    args = build_parser().parse_args(argv)
    asked = f"--rounds {args.rounds} with --organizations {args.organizations}"
    # the substrafl plan
    compute_plan.check_size(experiment.count_tasks(args.organizations, args.rounds), asked)
    # ours
    compute_plan.check_size(compute_plan.count_tasks("fedavg", args.rounds, args.organizations),
                            asked)
    # what either command refuses, refused first
    recipe = hyperparameters.load_overrides(args.hyperparameters)
    if "dp" in recipe.values:
        raise UserError(f"{args.hyperparameters}: dp: both commands train with DP; remove dp from "
                        "this file")
    for framework in args.frameworks:
        hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME, recipe)
        check_hyperparameters(hp.to_json(), args.rounds, str(args.hyperparameters))
    rows = []
    for framework in args.frameworks:
        rows.append(compare(framework, args))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    args.output.mkdir(parents=True, exist_ok=True)
    atomic.write_json(args.output / "substrafl.json", rows)
    text = (f"# substrafl's FedAvg against the bundle's own fedavg\n\n{args.organizations} "
            f"organisations, {args.rounds} rounds, recipe {args.hyperparameters.name}, data "
            f"{args.data.name}; `python benchmarks/substrafl_fedavg.py`. Goal: within "
            f"{GOAL_POINTS:g} point.\n\n{table(rows)}\n")
    atomic.write_text(args.output / "substrafl.md", text)
    print(f"\nwritten: {args.output / 'substrafl.json'}, {args.output / 'substrafl.md'}")


if __name__ == "__main__":
    run_cli(main)
