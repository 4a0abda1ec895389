"""Register one framework's DP-SGD algo (train and predict functions) on a Substra node, run a compute
plan of train -> predict -> score on the assets of the keys file, and report test accuracy and ε.

Reads the keys file written by scripts/add_dataset_objective.py. Training goes through the train
folds one after the other (one train task per fold, each continuing from the model before), with
predict and score after each. The algo's and the plan's keys are added to the keys file; the reports
(results.json, summary.md, results.png) and the model files go to --output. With a local backend
(which forgets everything between runs) the dataset and objective are registered again from the
data folder named in the keys file.
"""
import argparse
import tempfile
from pathlib import Path

from mnist_dp import atomic, connection, data, plan, registry, results, training
from mnist_dp import hyperparameters as hp_file
from mnist_dp.assets import ALGO_ASSETS
from mnist_dp.errors import UserError, run_cli


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=list(ALGO_ASSETS), default="torch",
                        help="which algo asset to register and train (default: %(default)s)")
    parser.add_argument("--keys-file", type=Path, default=Path("assets_keys.json"),
                        help="keys file of scripts/add_dataset_objective.py; the new keys are added to it "
                             "(default: %(default)s)")
    parser.add_argument("--hyperparameters", type=Path, default=None,
                        help="JSON file whose keys replace those of the algo's hyperparameters.json")
    parser.add_argument("--output", type=Path, default=None,
                        help="folder for the reports and model files (default: results/<framework>)")
    parser.add_argument("--share-with", default="",
                        help="comma-separated organisation ids also allowed to read the model and predictions "
                             "(default: this organisation only)")
    connection.add_arguments(parser)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.keys_file.is_file():
        raise UserError(f"{args.keys_file}: no keys file; run scripts/add_dataset_objective.py first")
    keys = registry.KeysFile(args.keys_file)
    hp = hp_file.load(ALGO_ASSETS[args.framework] / hp_file.FILE_NAME, hp_file.load_overrides(args.hyperparameters))
    for field in ("organization_id", "dataset_key", "objective_key", "test_data_sample_keys"):
        keys.require(field)  # a damaged keys file is named now, not half-way through
    folds = keys.require("train_data_sample_keys")
    data_dir = Path(keys.require("data"))
    if data_dir.is_dir():  # what each train task would refuse, checked before anything is registered
        for k, own in enumerate(registry.split_among(data_dir, len(folds)), 1):
            training.check_run(args.framework, hp, sum(map(data.sample_size, own)),
                               f"{args.framework} hyperparameters ({args.hyperparameters or 'the asset'}), fold {k}")
    with atomic.exclusive((args.output or Path("results") / args.framework).resolve(), "--output folder") as output:
        register_and_run(args, keys, hp, output)


def register_and_run(args, keys: registry.KeysFile, hp: hp_file.Hyperparameters, output: Path) -> None:
    client = connection.connect(args.backend, args.client_name, args.keys_file.resolve().parent)
    run = args.framework
    with tempfile.TemporaryDirectory() as build_dir:
        if args.backend in connection.LOCAL_BACKENDS:  # a new local backend starts empty
            registry.register_dataset_objective(client, keys, Path(keys.require("data")),
                                                len(keys.require("train_data_sample_keys")), Path(build_dir))
        registry.check_on_node(client, keys)
        train, predict = registry.register_algo(client, keys, run, args.framework, hp.to_json(), Path(build_dir))
    keys.add_algo(args.framework, train, predict)

    owner, dataset = keys.require("organization_id"), keys.require("dataset_key")
    folds = keys.require("train_data_sample_keys")
    stages = [(i + 1, plan.Share(owner, dataset, tuple(fold))) for i, fold in enumerate(folds)]
    test = plan.Share(owner, dataset, tuple(keys.require("test_data_sample_keys")))
    builder = plan.PlanBuilder(share_with=plan.id_list(args.share_with))
    builder.chain(run, train, predict, keys.require("objective_key"), stages, test)
    plan_key = plan.new_key()
    keys.add_compute_plan(args.framework, plan_key,
                          {task: plan.describe_role(role) for task, role in builder.roles.items()})
    print(f"algo and compute plan keys added to {args.keys_file}")
    results.run_and_report(client, builder, f"mnist-dp {run}", plan_key, {run: args.framework}, {owner: None}, output,
                          f"mnist-dp: {run} on a Substra node",
                          [f"{args.backend} backend, keys file: {args.keys_file.resolve()}",
                           f"{len(folds)} fold(s) trained one after the other at {owner}"])


if __name__ == "__main__":
    run_cli(main, explain=connection.explain_refusal)
