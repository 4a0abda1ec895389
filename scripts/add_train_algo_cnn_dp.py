"""Register one framework's DP-SGD algo (train and predict functions, and aggregate for federated
averaging) on a Substra node, run a compute plan on the assets of the keys file, and report test
accuracy and ε.

Reads the keys file written by scripts/add_dataset_objective.py. With --strategy cyclic (the
default) training goes through the train folds one after the other (one train task per fold, each
continuing from the model before), with predict and score after each; with --strategy fedavg each
round trains every fold from the global model and an aggregate task averages them, then predict and
score on the test set. --rounds repeats either. ε is per fold (the folds hold disjoint data). With
--search, one tune task runs a private hyperparameter search on every fold's data together and its
model is scored on the test set. The algo's and the
plan's keys are added to the keys file; the reports (results.json, summary.md, results.png) and the
model files go to --output. With a local backend (which forgets everything between runs) the dataset
and objective are registered again from the data folder named in the keys file.
"""
import tempfile
from pathlib import Path

from mnist_dp import hyperparameters, search_space
from mnist_dp.assets import ALGO_ASSETS
from mnist_dp.data import dataset, samples
from mnist_dp.hyperparameters import Hyperparameters
from mnist_dp.orchestration import compute_plan, connection, reconcile, registry
from mnist_dp.privacy import data_ledger, policy, preflight, search
from mnist_dp.privacy.examples import Examples
from mnist_dp.report import results
from mnist_dp.utils import options
from mnist_dp.utils.errors import UserError, run_cli
from mnist_dp.utils.words import counted


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--framework", choices=list(ALGO_ASSETS), default="torch",
                        help="which algo asset to register and train (default: %(default)s)")
    parser.add_argument("--keys-file", type=Path, default=Path("assets_keys.json"),
                        help="keys file of scripts/add_dataset_objective.py; the new keys are "
                             "added to it (default: %(default)s)")
    parser.add_argument("--hyperparameters", type=Path, default=None,
                        help="JSON file whose keys replace those of the algo's "
                             "hyperparameters.json")
    parser.add_argument("--output", type=Path, default=None,
                        help="folder for the reports and model files (default: "
                             "results/<framework>)")
    compute_plan.add_arguments(parser, "folds")
    search_space.add_argument(parser)
    parser.add_argument("--share-with", default="",
                        help="comma-separated organisation ids also allowed to read the model and "
                             "predictions (default: this organisation only)")
    connection.add_arguments(parser)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    compute_plan.check_options(args.strategy, args.score_train, args.search is not None,
                               args.rounds)
    searched = search_space.from_option(args.search)
    # refused now, before --output is made
    connection.check_settings(args.backend, args.client_name)
    if not args.keys_file.is_file():
        raise UserError(f"{args.keys_file}: no keys file; run scripts/add_dataset_objective.py "
                        "first")
    keys = registry.KeysFile(args.keys_file)
    hp = hyperparameters.load(ALGO_ASSETS[args.framework] / hyperparameters.FILE_NAME,
                              hyperparameters.load_overrides(args.hyperparameters))
    if not hp.dp and args.backend == "remote":
        raise UserError(f"{args.hyperparameters}: dp = false on a Substra node: the non-private "
                        "model's accuracy, not covered by ε, would be a performance every "
                        "organisation on the node sees; train a baseline locally "
                        "(scripts/run_local.py --baseline)")
    for field in ("organization_id", "dataset_key", "objective_key", "test_data_sample_keys"):
        keys.require(field)  # a damaged keys file is named now, not half-way through
    folds = keys.require("train_data_sample_keys")
    compute_plan.check_size(compute_plan.count_tasks("search" if searched else args.strategy,
                                                     args.rounds, 1 if searched else len(folds), 1,
                                                     args.score_train),
                            f"--rounds {args.rounds} with the {counted(len(folds), 'fold')} of "
                            f"{args.keys_file} and --strategy {args.strategy}")
    data_dir = Path(keys.require("data"))
    dataset.check_apart(data_dir, args.output or Path("results") / args.framework)
    where = f"{args.framework} hyperparameters ({args.hyperparameters or 'the asset'})"
    if data_dir.is_dir():  # the released runs are recorded in its folders after the plan
        data_ledger.check_writable(f for own in registry.split_among(data_dir, len(folds))
                                   for f in own)
    client, tips = None, []
    if args.backend == "remote":  # every run any plan made on the data, before it is checked
        client = connection.connect(args.backend, args.client_name,
                                    args.keys_file.resolve().parent)
        tips = reconcile.of_keys_file(client, keys)[0].tips
    # what the tune task would refuse, checked before anything is registered
    if data_dir.is_dir() and searched:
        folders = [f for own in registry.split_among(data_dir, len(folds)) for f in own]
        read = samples.check_examples(folders)
        preflight.check_owner(policy.of_folders(folders), hp,
                              any(s.persons is not None for s in read), history=(
                                  samples.spent_on(folders),
                                  {s.identity: Examples.of(s.key_id, s.units) for s in read}))
        search.check_plan(args.framework, hp, searched,
                          [samples.public_size(folders, read, str(data_dir))], [where],
                          [any(s.persons is not None for s in read)])
    # what each train task would refuse, checked before anything is registered
    elif data_dir.is_dir():
        holdings = registry.split_among(data_dir, len(folds))
        read = [list(map(samples.read_sample, own)) for own in holdings]
        sizes = [samples.public_size(own, read_own, f"fold {k}'s data")
                 for k, (own, read_own) in enumerate(zip(holdings, read), 1)]
        spent = [(samples.spent_on(own), {s.identity: Examples.of(s.key_id, s.units)
                                          for s in read_own})
                 for own, read_own in zip(holdings, read)]
        owners = [policy.of_folders(own) for own in holdings]
        per_person = [any(s.persons is not None for s in read_own) for read_own in read]
        for owner, persons in zip(owners, per_person):
            preflight.check_owner(owner, hp, persons, args.score_train)
        hp = preflight.check_plan(args.framework, hp, sizes, args.rounds,
                                  [f"{where}, fold {k}" for k in range(1, len(sizes) + 1)], spent,
                                  owners, per_person)
    elif args.rounds > 1 and hp.dp and hp.target_epsilon is not None:
        raise UserError(f"--rounds {args.rounds} with target_epsilon: σ is calibrated for every "
                        f"fold's size, but the data folder {data_dir} named in {args.keys_file} is "
                        "not here; give noise_multiplier in --hyperparameters instead")
    with results.run_output((args.output or Path("results") / args.framework).resolve()) as output:
        register_and_run(args, keys, hp, output, searched, client, tips)


def register_and_run(args, keys: registry.KeysFile, hp: Hyperparameters, output: Path,
                     searched: search_space.SearchSpace | None, client=None,
                     tips: list = ()) -> None:
    client = client or connection.connect(args.backend, args.client_name,
                                          args.keys_file.resolve().parent)
    run = args.framework
    with tempfile.TemporaryDirectory() as build_dir:
        if args.backend in connection.LOCAL_BACKENDS:  # a new local backend starts empty
            registry.register_dataset_objective(client, keys, Path(keys.require("data")),
                                                len(keys.require("train_data_sample_keys")),
                                                Path(build_dir))
        registry.check_on_node(client, keys)
        functions = registry.register_algo(
            client, keys, run, args.framework, hp.to_json(), Path(build_dir),
            compute_plan.functions(args.strategy, searched is not None,
                                   args.backend in connection.READ_ONLY_DATA),
            searched.to_json() if searched else None)
    keys.add_algo(args.framework, functions)

    owner, dataset = keys.require("organization_id"), keys.require("dataset_key")
    folds = keys.require("train_data_sample_keys")
    shares = [compute_plan.Share(owner, dataset, tuple(fold)) for fold in folds]
    test = compute_plan.Share(owner, dataset, tuple(keys.require("test_data_sample_keys")))
    # the first train or tune task takes every tip of the organisation's chain the reconciliation
    # found, or a genesis
    builder = compute_plan.PlanBuilder(share_with=compute_plan.id_list(args.share_with),
                                       ledgers={owner: list(tips)} if tips else {})
    functions = {**functions, "score": keys.require("objective_key")}
    if searched:  # the organisation's data: every fold
        builder.search(run, functions,
                       [compute_plan.Share(owner, dataset, sum(map(tuple, folds), ()))], test)
    elif args.strategy == "fedavg":
        builder.fedavg(run, functions, shares, args.rounds, test)
    # the folds are at one organisation: each train task is numbered as a round
    # of its own in the reports
    else:
        builder.chain(run, functions, list(enumerate(shares * args.rounds, 1)), test,
                      args.score_train)
    plan_key = compute_plan.new_key()
    keys.add_compute_plan(args.framework, plan_key,
                          {task: compute_plan.describe_role(role) for task,
                           role in builder.roles.items()})
    print(f"algo and compute plan keys added to {args.keys_file}")
    data_dir = Path(keys.require("data"))
    results.run_and_report(client, builder, f"mnist-dp {run}", plan_key, {run: args.framework},
                           {owner: None}, output, f"mnist-dp: {run} on a Substra node",
                           [f"{args.backend} backend, keys file: {args.keys_file.resolve()}",
                            f"{counted(len(folds), 'fold')} at {owner}, " + (
                                f"a private search on all of them ({args.search})" if searched
                                else f"{counted(args.rounds, 'round')}, "
                                     f"{compute_plan.describe_strategy(args.strategy)}")],
                           {owner: registry.sample_folders(data_dir, "train")}
                           if data_dir.is_dir() else None,
                           # on a node, the runs of every plan on the data, before the report
                           (lambda: reconcile.of_keys_file(client, keys))
                           if args.backend == "remote" else None)


if __name__ == "__main__":
    run_cli(main, explain=connection.explain_refusal)
