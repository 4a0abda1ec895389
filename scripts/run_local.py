"""Train, predict and score every DP algo in one local Substra compute plan, then report accuracy and ε.

Generates the data samples if they are missing, registers the dataset, the objective (accuracy) and
the data samples, builds and registers each algo's train / predict functions, and runs
train -> predict -> score per framework (plus a non-private baseline). With --organizations N, N
Substra clients each own a share of the training data; the model passes from organisation to
organisation (train at org 1 -> train at org 2 -> ...) for --rounds rounds, with predict and score
after every train task, and ε is reported per organisation. Writes results.json, summary.md,
results.png and the model files (models/) to --output. This replaces `substra run-local`.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: mnist_dp

from mnist_dp import connection, data, plan, registry, report, training  # noqa: E402
from mnist_dp import hyperparameters as hp_file  # noqa: E402
from mnist_dp.errors import UserError  # noqa: E402


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=",".join(plan.ALGO_ASSETS),
                        help="comma-separated frameworks to run (default: all, i.e. %(default)s)")
    parser.add_argument("--data", type=Path, default=Path("data"),
                        help="data samples written by scripts/generate_data.py; generated from the embedded "
                             "MNIST subset if missing (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=Path("results"),
                        help="folder for the reports, models/ and Substra's local work files (default: %(default)s)")
    parser.add_argument("--hyperparameters", type=Path, default=None,
                        help="JSON file whose keys replace those of every algo's hyperparameters.json "
                             "(e.g. {\"epochs\": 1})")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the non-private baseline (same hyperparameters with dp=false)")
    parser.add_argument("--organizations", type=int, default=1,
                        help="organisations sharing the training data, each with its own dataset; the data needs "
                             "at least this many train data samples (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes of the model through every organisation (default: %(default)s)")
    parser.add_argument("--share-with", default="",
                        help="comma-separated organisation ids also allowed to read the models and predictions "
                             "(default: only the organisations whose tasks need them)")
    connection.add_arguments(parser, "With --backend remote give one name per organisation, comma-separated.")
    return parser


def parse_frameworks(text: str) -> list:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in plan.ALGO_ASSETS]
    if unknown or not names:
        raise UserError(f"--frameworks {text!r}: unknown {unknown}; available: {', '.join(plan.ALGO_ASSETS)}")
    return names


def split_list(text: str) -> list:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def main(argv=None):
    args = build_parser().parse_args(argv)
    frameworks = parse_frameworks(args.frameworks)
    if args.organizations < 1 or args.rounds < 1:
        raise UserError("--organizations and --rounds must be at least 1")
    client_names = split_list(args.client_name) or [None] * args.organizations
    if len(client_names) != args.organizations:
        raise UserError(f"--client-name: give one name per organisation ({args.organizations}), comma-separated")
    overrides = hp_file.load_overrides(args.hyperparameters)
    data_dir, output = args.data.resolve(), args.output.resolve()
    runs = {}  # run name -> (framework, hyperparameters)
    for framework in frameworks:
        for dp in [True] if args.no_baseline else [True, False]:
            hp = hp_file.load(plan.ALGO_ASSETS[framework] / hp_file.FILE_NAME, {**overrides, "dp": dp})
            runs[framework if dp else f"{framework}-baseline"] = (framework, hp)

    work = output / "substra"  # Substra's local backend keeps its files in <work>/local-worker
    work.mkdir(parents=True, exist_ok=True)
    clients = [connection.connect(args.backend, name, work) for name in client_names]
    if not (data_dir / "train").is_dir():
        manifest = data.generate(data_dir, train_samples=args.organizations)
        print(f"generated {manifest['train_examples']} train / {manifest['test_examples']} test examples in {data_dir}")
    folders = data.sample_folders(data_dir, "train")
    if len(folders) < args.organizations:
        raise UserError(f"{data_dir}: {len(folders)} train data sample(s) for {args.organizations} organisations; "
                        f"regenerate with scripts/generate_data.py --train-samples {args.organizations} --force")

    # Organisation k holds train samples k, k+N, ...; the first one also holds the test samples.
    keys = registry.KeysFile()
    shares, organizations, test = [], {}, None
    for k, client in enumerate(clients):
        own = folders[k::args.organizations]
        owner = client.organization_info().organization_id
        share, test_share = registry.register_data(client, keys, f"MNIST ({owner})", own,
                                                   data.sample_folders(data_dir, "test") if k == 0 else ())
        shares.append(share)
        test = test or test_share
        organizations[owner] = [data.sample_fingerprint(f) for f in own]
    sizes = [sum(data.sample_size(f) for f in folders[k::args.organizations]) for k in range(args.organizations)]
    stages = [(r, share) for r in range(1, args.rounds + 1) for share in shares]

    client = clients[0]  # submits the plan and reads the results
    builder = plan.PlanBuilder(share_with=tuple(split_list(args.share_with)))
    score = registry.register_objective(client, keys, work / "archives")
    for run, (framework, hp) in runs.items():
        hp = training.noise_for_rounds(hp, sizes, args.rounds)
        train, predict = registry.register_algo(client, keys, run, framework, hp.to_json(), work / "archives")
        builder.chain(run, train, predict, score, stages, test)
    name = f"mnist-dp local run ({args.organizations} organisation(s), {args.rounds} round(s))"
    plan_key, failure = plan.new_key(), None
    try:
        plan.run_plan(client, builder, name, plan_key)
    except plan.PlanFailed as exc:
        failure = exc  # report what finished first, then fail
    records, performances = report.collect(client, builder, plan_key, {r: fw for r, (fw, _) in runs.items()},
                                           organizations, output / "models")
    facts = [f"compute plan `{plan_key}` ({args.backend} backend)", f"data: {data_dir}",
             f"{args.organizations} organisation(s), {args.rounds} round(s): {', '.join(organizations)}"]
    written = report.write_reports(output, "mnist-dp: DP-SGD on MNIST with Substra", facts, records, performances,
                                   str(failure) if failure else None)
    print()
    print(report.table(records))
    print(f"\n{report.STATEMENT}\nwritten: {', '.join(str(p) for p in written)}")
    if failure:
        raise failure


if __name__ == "__main__":
    connection.run_cli(main)
