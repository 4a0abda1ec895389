"""Federated averaging with substrafl and the bundle's DP-SGD, ε per organisation reported after
every round.

substrafl's own pieces (FedAvg, the nodes, EvaluationStrategy, execute_experiment) with the bundle's
algo: TorchDpFedAvgAlgo (a TorchFedAvgAlgo) for torch, DpFedAvgAlgo (substrafl's generic Algo) for
tf and MindSpore, and DpFedAvg, substrafl's FedAvg passing the privacy ledgers along. Each
organisation registers its share of the data under its own identity key (and the test set, under a
key of its own, to evaluate on); every round each trains `epochs` local epochs of DP-SGD from the
global model, and its evaluation reports the global model's accuracy and the organisation's own ε
(its examples', recomputed by the accountant from the ledger). σ is calibrated so that every
organisation ends at or below target_epsilon after the last round.

    python examples/substrafl_fedavg.py --framework torch --organizations 2 --rounds 3

Writes results.json (one record per organisation and round), summary.md, results.png and the
organisations' local states (models/, the bundle's model files: scripts/privacy_report.py reads
them) to --output.
"""
import contextlib
from pathlib import Path

from substrafl.evaluation_strategy import EvaluationStrategy
from substrafl.nodes import AggregationNode

from mnist_dp import hyperparameters
from mnist_dp.assets import ALGO_ASSETS
from mnist_dp.data import dataset, samples
from mnist_dp.federated import experiment
from mnist_dp.federated.algo import METRICS, DpFedAvgAlgo, check_hyperparameters
from mnist_dp.federated.strategy import DpFedAvg
from mnist_dp.orchestration import compute_plan, connection, registry
from mnist_dp.privacy import policy, preflight
from mnist_dp.privacy.examples import Examples
from mnist_dp.report import display, results
from mnist_dp.utils import options
from mnist_dp.utils.errors import run_cli
from mnist_dp.utils.words import counted

EXAMPLES = Path(__file__).resolve().parent


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--framework", choices=list(ALGO_ASSETS), default="torch",
                        help="the framework the algo trains with (default: %(default)s)")
    parser.add_argument("--organizations", type=options.integer(1, options.MAX_ORGANIZATIONS),
                        default=2,
                        help="organisations, each holding a share of the train data (default: "
                             "%(default)s)")
    parser.add_argument("--rounds", type=options.integer(1, compute_plan.MAX_TASKS), default=3,
                        help="FedAvg rounds (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=None,
                        help="data samples written by scripts/generate_data.py; generated from "
                             "the embedded MNIST subset if missing "
                             f"({dataset.DEFAULT_FOLDER_HELP})")
    parser.add_argument("--output", type=Path, default=Path("results-substrafl"),
                        help="folder for the reports, models/ and Substra's work files (default: "
                             "%(default)s)")
    parser.add_argument("--hyperparameters", type=Path, default=EXAMPLES / "fedavg.json",
                        help="JSON file whose keys replace those of the algo asset's "
                             "hyperparameters.json (default: the federated recipe, %(default)s)")
    parser.add_argument("--backend", choices=["subprocess", "docker"], default="subprocess",
                        help="Substra's local backend: every task a process, or a container built "
                             "from substrafl's Dockerfile (default: %(default)s)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    compute_plan.check_size(experiment.count_tasks(args.organizations, args.rounds),
                            f"--rounds {args.rounds} with --organizations {args.organizations}")
    hp = hyperparameters.load(ALGO_ASSETS[args.framework] / hyperparameters.FILE_NAME,
                              hyperparameters.load_overrides(args.hyperparameters))
    # what the algo refuses, refused now
    check_hyperparameters(hp.to_json(), args.rounds, str(args.hyperparameters))
    data_dir, output = (
        args.data or dataset.default_folder(args.organizations)).resolve(), args.output.resolve()
    dataset.check_apart(data_dir, output)
    work = output / "substra"
    with results.run_output(output, work):
        work.mkdir(exist_ok=True)
        # One local Substra client per organisation.
        clients = [connection.connect(args.backend, work_dir=work)
                   for _ in range(args.organizations)]
        dataset.generate_default_if_missing(data_dir, train_samples=args.organizations,
                                            flag="--organizations",
                                            organizations=args.organizations)
        # What a train task would refuse, refused now: copies of an example, a target ε σ cannot
        # reach; and keys a deployment would not share (each organisation its own; the test set,
        # evaluated everywhere, its own).
        shares = registry.split_among(data_dir, args.organizations, flag="--organizations")
        dataset.check_organization_keys(data_dir, shares, test_everywhere=True)
        # each organisation's own (two organisations may hold one example, as deployed)
        read = [samples.check_examples(share) for share in shares]
        # what each organisation's data has spent: its continued models carry those runs
        spent = [(samples.spent_on(share), {s.identity: Examples.of(s.key_id, s.units)
                                            for s in own}) for share, own in zip(shares, read)]
        owners = [policy.of_folders(share) for share in shares]
        per_person = [any(s.persons is not None for s in own) for own in read]
        for owner, persons in zip(owners, per_person):
            preflight.check_owner(owner, hp, persons)
        sizes = [samples.public_size(share, own, f"organisation {k}'s data")
                 for k, (share, own) in enumerate(zip(shares, read), 1)]
        preflight.check_plan(args.framework, hp, sizes, args.rounds,
                             [f"organisation {k}" for k in range(1, args.organizations + 1)],
                             spent, owners, per_person)
        organizations = experiment.register(clients, registry.KeysFile(), data_dir)

        # The algo: the bundle's DP training, with σ calibrated for these rounds.
        if args.framework == "torch":
            from mnist_dp.federated.torch_algo import TorchDpFedAvgAlgo

            algo = TorchDpFedAvgAlgo(hp.to_json(), args.rounds)
        else:
            algo = DpFedAvgAlgo(args.framework, hp.to_json(), args.rounds)
        # substrafl's FedAvg with the ledgers passed along, evaluated after every round (not
        # round 0, the untrained start) at every organisation: the global model's accuracy
        # and that organisation's ε.
        strategy = DpFedAvg(algo=algo, metric_functions=METRICS)
        evaluation = EvaluationStrategy(test_data_nodes=organizations.test_data_nodes,
                                        eval_rounds=list(range(1, args.rounds + 1)))
        aggregator = AggregationNode(organizations.train_data_nodes[0].organization_id)
        # substrafl writes its function folders in the working directory
        with contextlib.chdir(work):
            plan_key = experiment.run(
                clients[0], output, strategy=strategy,
                                      train_data_nodes=organizations.train_data_nodes,
                aggregation_node=aggregator, evaluation_strategy=evaluation, num_rounds=args.rounds,
                dependencies=experiment.dependency(args.framework),
                name=f"mnist-dp substrafl FedAvg ({args.framework})")

        records, performances = experiment.collect(clients[0], plan_key, args.framework,
                                                   organizations, output / "models")
        results.with_data_spent(records, organizations.folders)
        written = display.write_reports(
            output, f"mnist-dp with substrafl: FedAvg in {args.framework}",
            [f"compute plan `{plan_key}`, {args.backend} backend, data: {data_dir}",
             f"{counted(args.organizations, 'organisation')}, "
             f"{counted(args.rounds, 'round')} of substrafl's FedAvg; "
             "every organisation evaluates the global model on the test set and reports its own ε"],
                                        records, performances)
    print(display.table(records))
    print(f"\n{display.statement_for(records)}\nwritten: {', '.join(map(str, written))}")


if __name__ == "__main__":
    run_cli(main, explain=connection.explain_refusal)
