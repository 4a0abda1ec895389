"""Train, predict and score every DP algo in one local Substra compute plan, then report accuracy and ε.

Generates the data samples if they are missing, registers the dataset, the objective (accuracy) and
the data samples, builds and registers each algo's train / predict functions, runs
train -> predict -> score on the train and test data per framework (plus a non-private baseline),
prints a table and writes <output>/results.json and the trained model files (<output>/models/).
This replaces the old `substra run-local` command.
"""
import argparse
import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: mnist_dp

from mnist_dp import data, plan, report  # noqa: E402
from mnist_dp import hyperparameters as hp_file  # noqa: E402
from mnist_dp.errors import UserError, run_cli  # noqa: E402


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=",".join(plan.ALGO_ASSETS),
                        help="comma-separated frameworks to run (default: all, i.e. %(default)s)")
    parser.add_argument("--data", type=Path, default=Path("data"),
                        help="data samples written by scripts/generate_data.py; generated from the embedded "
                             "MNIST subset if missing (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=Path("results"),
                        help="folder for results.json, models/ and Substra's local work files (default: %(default)s)")
    parser.add_argument("--hyperparameters", type=Path, default=None,
                        help="JSON file whose keys replace those of every algo's hyperparameters.json "
                             "(e.g. {\"epochs\": 1})")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the non-private baseline (same hyperparameters with dp=false)")
    parser.add_argument("--backend", choices=["subprocess", "docker"], default="subprocess",
                        help="Substra local backend: subprocess runs functions with this Python; docker "
                             "builds each function's image and needs a Docker daemon (default: %(default)s)")
    return parser


def parse_frameworks(text: str) -> list:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in plan.ALGO_ASSETS]
    if unknown or not names:
        raise UserError(f"--frameworks {text!r}: unknown {unknown}; available: {', '.join(plan.ALGO_ASSETS)}")
    return names


def load_overrides(path) -> dict:
    if path is None:
        return {}
    try:
        overrides = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: cannot read hyperparameters JSON ({exc})") from None
    if not isinstance(overrides, dict):
        raise UserError(f"{path}: must hold a JSON object of hyperparameters")
    return overrides


def run_hyperparameters(asset_dir: Path, overrides: dict, dp: bool) -> dict:
    """The asset's hyperparameters with the user's overrides, validated before anything runs."""
    path = asset_dir / hp_file.FILE_NAME
    return hp_file.load(path, {**overrides, "dp": dp}).to_json()


def main(argv=None):
    args = build_parser().parse_args(argv)
    frameworks = parse_frameworks(args.frameworks)
    overrides = load_overrides(args.hyperparameters)
    data_dir, output = args.data.resolve(), args.output.resolve()
    variants = [True] if args.no_baseline else [True, False]
    runs = {}  # run name -> (framework, hyperparameters)
    for framework in frameworks:
        for dp in variants:
            run = framework if dp else f"{framework}-baseline"
            runs[run] = (framework, run_hyperparameters(plan.ALGO_ASSETS[framework], overrides, dp))

    work = output / "substra"
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(work):  # substra's local backend keeps its files in ./local-worker
        client = plan.local_client(args.backend)
        if not (data_dir / "train").is_dir():
            manifest = data.generate(data_dir)
            print(f"generated {manifest['train_examples']} train / {manifest['test_examples']} test examples in {data_dir}")
        keys = plan.register_dataset(client, data_dir)
        builder = plan.PlanBuilder(keys)
        score = plan.register_function(client, plan.OBJECTIVE_ASSET, "score", "accuracy", work / "archives")
        train_tasks = {}
        for run, (framework, hyperparameters) in runs.items():
            asset = plan.ALGO_ASSETS[framework]
            train = plan.register_function(client, asset, "train", f"{run} train", work / "archives", hyperparameters)
            predict = plan.register_function(client, asset, "predict", f"{run} predict", work / "archives",
                                             hyperparameters)
            train_tasks[run] = builder.train(run, train)
            for split in ("train", "test"):
                builder.evaluate(run, train_tasks[run], predict, score, split)
        compute_plan = plan.run_plan(client, builder, "mnist-dp local run")
        performances = plan.collect_performances(client, compute_plan.key, builder.roles)

        records = []
        for run, (framework, _) in runs.items():
            model = plan.fetch_model(client, train_tasks[run], output / "models" / f"{run}.model")
            record = {"run": run, **report.model_record(model, framework, keys.owner)}
            for metric in ("train_accuracy", "test_accuracy"):
                record[metric] = performances[(run, metric)]
            record["epsilon_in_substra"] = performances[(run, "epsilon")]
            records.append(record)

    report.write_results(output / "results.json", records)
    print()
    print(report.table(records))
    print(f"\nε is for the add/remove-one-example relation, Poisson sampling, per-example clipping; "
          f"results in {output / 'results.json'}")


if __name__ == "__main__":
    run_cli(main)
