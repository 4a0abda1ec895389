"""Train, predict and score every DP algo in one local Substra compute plan, then report accuracy
and ε.

Generates the data samples if they are missing, registers the dataset, the objective (accuracy) and
the data samples, builds and registers each algo's train / predict functions, and runs
train -> predict -> score per framework (with --baseline, also a non-private baseline: its accuracy
is not covered by ε). With --organizations N, N
Substra clients each own a share of the training data, and ε is reported per organisation:
- --strategy cyclic: the model passes from organisation to organisation (train at org 1 -> train at
  org 2 -> ...) for --rounds rounds, with predict and score after every train task;
- --strategy fedavg: federated averaging; each round every organisation trains from the global model
  (`epochs` local epochs), an aggregate task averages their models weighted by their data's public
  sizes, and the new global model is scored on the test set.
With --search, every organisation instead runs a private hyperparameter search on its own data (a
tune task: the best of a random number of candidates, by default trained again on all the data, ε
covering the whole search) and its model is scored on the test set. Writes results.json, summary.md,
results.png and the model files (models/) to --output. This replaces `substra run-local`.
"""
from pathlib import Path

from mnist_dp import hyperparameters, search_space
from mnist_dp.assets import ALGO_ASSETS
from mnist_dp.data import dataset, samples
from mnist_dp.orchestration import compute_plan, connection, registry
from mnist_dp.privacy import data_ledger, policy, preflight, search
from mnist_dp.privacy.examples import Examples
from mnist_dp.report import results
from mnist_dp.utils import options
from mnist_dp.utils.errors import UserError, run_cli
from mnist_dp.utils.words import counted


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS),
                        default=",".join(ALGO_ASSETS),
                        help="comma-separated frameworks to run (default: all, i.e. %(default)s)")
    parser.add_argument("--data", type=Path, default=None,
                        help="data samples written by scripts/generate_data.py; generated from "
                             "the embedded MNIST subset if missing "
                             f"({dataset.DEFAULT_FOLDER_HELP})")
    parser.add_argument("--output", type=Path, default=Path("results"),
                        help="folder for the reports, models/ and Substra's local work files "
                             "(default: %(default)s)")
    parser.add_argument("--hyperparameters", type=Path, default=None,
                        help="JSON file whose keys replace those of every algo's "
                             "hyperparameters.json (e.g. {\"epochs\": 1})")
    parser.add_argument("--baseline", action="store_true",
                        help="also train a non-private baseline per framework (same "
                             "hyperparameters with dp=false): its model and accuracy are un-noised "
                             "functions of the training data, NOT covered by ε, and every report "
                             "says so; refused with --backend remote, where its accuracy would be "
                             "a performance every organisation sees (default: DP models only)")
    parser.add_argument("--organizations", type=options.integer(1, options.MAX_ORGANIZATIONS),
                        default=1,
                        help="organisations sharing the training data, each with its own dataset; "
                             "the data needs at least this many train data samples (default: "
                             "%(default)s)")
    compute_plan.add_arguments(parser, "organisations")
    search_space.add_argument(parser)
    parser.add_argument("--share-with", default="",
                        help="comma-separated organisation ids also allowed to read the models and "
                             "predictions (default: only the organisations whose tasks need them)")
    connection.add_arguments(parser, "With --backend remote give one name per organisation, "
                                     "comma-separated.")
    policy.add_size_argument(parser)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    frameworks = args.frameworks
    if args.baseline and args.backend == "remote":
        raise UserError("--baseline with --backend remote: the baseline's accuracy, not covered by "
                        "ε, would be a performance every organisation on the node sees; train it "
                        "on a local backend")
    compute_plan.check_options(args.strategy, args.score_train, args.search is not None,
                               args.rounds)
    # the baseline is one training run: compare with a run without --search
    if args.search is not None:
        options.refuse_unused("with --search", {"--baseline": args.baseline})
    searched = search_space.from_option(args.search)
    runs_per_framework = 2 if args.baseline else 1
    tasks = compute_plan.count_tasks("search" if searched else args.strategy, args.rounds,
                                     args.organizations, len(frameworks) * runs_per_framework,
                                     args.score_train)
    compute_plan.check_size(tasks,
                            f"--rounds {args.rounds} with --organizations {args.organizations}, "
                            f"--strategy {args.strategy} and "
                            f"{counted(len(frameworks) * runs_per_framework, 'run')}")
    client_names = compute_plan.id_list(args.client_name) or [None] * args.organizations
    if len(client_names) != args.organizations:
        raise UserError(f"--client-name: give one name per organisation ({args.organizations}), "
                        "comma-separated")
    for name in client_names:  # refused now, before --output is made
        connection.check_settings(args.backend, name)
    overrides = hyperparameters.load_overrides(args.hyperparameters)
    if "dp" in overrides.values:
        raise UserError(f"{overrides.source}: dp: run_local.py trains every framework with DP "
                        "(and, with --baseline, without it too); remove dp from this file")
    data_dir, output = (
        args.data or dataset.default_folder(args.organizations)).resolve(), args.output.resolve()
    dataset.check_apart(data_dir, output)
    runs = {}  # run name -> (framework, hyperparameters)
    for framework in frameworks:
        for dp in [True, False] if args.baseline else [True]:
            hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME,
                                      overrides.replace(dp=dp))
            runs[framework if dp else f"{framework}-baseline"] = (framework, hp)

    to_write = dataset.generate_default_if_missing(data_dir, args.organizations, "--organizations",
                                                   args.organizations, dry_run=True)
    # what the train tasks would refuse of the data to be written, before writing it
    if to_write and not searched:
        for run, (framework, hp) in runs.items():
            preflight.check_plan(framework, hp, to_write, args.rounds,
                              [f"{run} hyperparameters ({overrides.source}), organisation {k} of "
                               "the default data"
                               for k in range(1, len(to_write) + 1)])

    work = output / "substra"  # Substra's local backend keeps its files in <work>/local-worker
    with results.run_output(output, work):
        work.mkdir(exist_ok=True)
        clients = [connection.connect(args.backend, name, work) for name in client_names]
        dataset.generate_default_if_missing(data_dir, train_samples=args.organizations,
                                            flag="--organizations",
                                            organizations=args.organizations)
        if args.public_size is not None:  # before the samples are registered
            print(samples.declare_size(dataset.sample_folders(data_dir, "train"),
                                       args.public_size))
        # Everything a task would refuse is checked now, before anything is registered.
        holdings = registry.split_among(data_dir, args.organizations, flag="--organizations")
        # each organisation its own key, as deployed
        dataset.check_organization_keys(data_dir, holdings)
        # What each organisation's train task refuses (an example two organisations hold
        # is accounted per example).
        read = {folder: sample for own in holdings for folder,
                sample in zip(own, samples.check_examples(own))}
        identities = {folder: sample.identity for folder, sample in read.items()}
        # the released runs are recorded in them after the plan
        data_ledger.check_writable(read)
        sizes = [samples.public_size(own, [read[f] for f in own], f"organisation {k}'s data")
                 for k, own in enumerate(holdings, 1)]
        spent = [(samples.spent_on(own),
                  {read[f].identity: Examples.of(read[f].key_id, read[f].units) for f in own})
                 for own in holdings]
        owners = [policy.of_folders(own) for own in holdings]
        # each with the hyperparameters its tasks will get
        for run, (framework, hp) in runs.items():
            per_person = [any(read[f].persons is not None for f in own) for own in holdings]
            for persons, owner, history in zip(per_person, owners, spent):
                preflight.check_owner(owner, hp, persons, args.score_train,
                                      history if searched else None)
            wheres = [f"{run} hyperparameters ({overrides.source}), organisation {k}"
                      for k in range(1, len(sizes) + 1)]
            if searched:
                search.check_plan(framework, hp, searched, sizes, wheres, per_person)
            else:
                runs[run] = framework, preflight.check_plan(
                    framework, hp, sizes, args.rounds, wheres, spent, owners, per_person)

        keys = registry.KeysFile()  # in memory: a local run starts from an empty backend
        shares, test, holdings = registry.register_organizations(clients, keys, data_dir)
        organizations = {org: [identities[f] for f in folders] for org, folders in holdings.items()}

        client = clients[0]  # submits the plan and reads the results
        builder = compute_plan.PlanBuilder(share_with=compute_plan.id_list(args.share_with))
        score = registry.register_objective(client, keys, work / "archives")
        for k, (run, (framework, hp)) in enumerate(runs.items()):
            # the first run's genesis starts each organisation's chain; the later runs extend it
            functions = registry.register_algo(
                client, keys, run, framework, hp.to_json(), work / "archives",
                compute_plan.functions(args.strategy, searched is not None,
                                       args.backend in connection.READ_ONLY_DATA and k == 0),
                searched.to_json() if searched else None)
            functions["score"] = score
            if searched:
                builder.search(run, functions, shares, test)
            elif args.strategy == "fedavg":
                builder.fedavg(run, functions, shares, args.rounds, test)
            else:
                builder.chain(run, functions,
                              [(r, share) for r in range(1, args.rounds + 1) for share in shares],
                              test, args.score_train)
        orgs, rounds = (counted(args.organizations, "organisation"),
                        counted(args.rounds, "round"))
        results.run_and_report(
            client, builder, f"mnist-dp local run ({orgs}, {rounds}, {args.strategy})",
            compute_plan.new_key(), {run: framework for run, (framework, _) in runs.items()},
            organizations, output, "mnist-dp: DP-SGD on MNIST with Substra",
            [f"{args.backend} backend, data: {data_dir}", f"{orgs}, " + (
                f"a private search each ({args.search}): {', '.join(organizations)}" if searched
                else f"{rounds}, {compute_plan.describe_strategy(args.strategy)}: "
                     f"{', '.join(organizations)}")], holdings)


if __name__ == "__main__":
    run_cli(main, explain=connection.explain_refusal)
