"""Print the privacy statement of a saved model file, recomputed from its ledger; with --reconcile,
first record every run any compute plan made on your data on a Substra node.

Needs no ML framework (only numpy and dp_accounting): give it a model written by a train task
(e.g. results/models/torch.model or a model downloaded from Substra). --reconcile asks the node
(--client-name) for every task that ran on the keys file's dataset, checks each one's sealed
ledger output, records their runs in the data folder the keys file names, and prints what the
data has spent (docs/privacy.md, "Where Substra really runs").
"""
from pathlib import Path

from mnist_dp.data import samples
from mnist_dp.orchestration import connection, reconcile, registry
from mnist_dp.privacy import data_ledger, model_file, policy, statement
from mnist_dp.utils import options
from mnist_dp.utils.errors import UserError, run_cli


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("model", type=Path, nargs="*", help="model files written by train tasks")
    parser.add_argument("--data", type=Path, nargs="+", metavar="SAMPLE",
                        help="your organisation's training data sample folders: the models' runs "
                             "on them that their own ledger (privacy_ledger.jsonl) lacks are "
                             "recorded there first, and the statement adds what they have spent "
                             "over every run released from them")
    parser.add_argument("--reconcile", type=Path, metavar="KEYS_FILE", default=None,
                        help="the keys file of scripts/add_dataset_objective.py: reconcile the "
                             "train data folder it names with the node of --client-name first "
                             "(every run of every plan on the dataset), then report what it has "
                             "spent")
    parser.add_argument("--delta", type=options.number(0, 1, low_open=True, high_open=True),
                        default=1e-5,
                        help="δ of the data's ε with --reconcile and no model file, where its "
                             "owner set no budget (default: %(default)s)")
    parser.add_argument("--client-name", default=None,
                        help="with --reconcile: the Substra client of your organisation (settings "
                             "from SUBSTRA_<NAME>_URL and SUBSTRA_<NAME>_TOKEN, as on every "
                             "script)")
    return parser


def reconciled_folders(keys_path: Path, client_name: str | None) -> list:
    """Reconcile the data folder of keys file `keys_path` with the node; its train folders."""
    if not keys_path.is_file():
        raise UserError(f"--reconcile {keys_path}: no keys file; run "
                        "scripts/add_dataset_objective.py first")
    keys = registry.KeysFile(keys_path)
    data_dir = Path(keys.require("data"))
    if data_dir.is_dir():  # the runs found are recorded there
        data_ledger.check_writable(registry.sample_folders(data_dir, "train"))
    return reconcile.of_keys_file(connection.connect("remote", client_name), keys)[1]


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.model and args.reconcile is None:
        raise UserError("give model files, --reconcile KEYS_FILE, or both")
    folders = list(args.data or [])
    if args.reconcile is not None:
        folders += [f for f in reconciled_folders(args.reconcile, args.client_name)
                    if f not in folders]
    own = [samples.sample_identity(folder) for folder in folders]
    saved_models = [(path, model_file.load(path)) for path in args.model]
    if folders:
        data_ledger.record_released(dict(zip(own, folders)),
                                    [saved.ledger for _, saved in saved_models],
                                    name=samples.named)
    spent = samples.spent_on(folders) if folders else None
    for path, saved in saved_models:
        print(f"# {path} ({saved.framework})\n")
        delta = saved.hyperparameters["delta"]
        print(statement.privacy_statement(saved,
                                          data_spent={"your data": spent.epsilon(delta, data=own)}
                                          if spent is not None else None))
        print()
    if not saved_models:
        budgets = policy.of_folders(folders).budgets
        print(statement.data_spent(spent, own, budgets[0][1] if budgets else args.delta, budgets))


if __name__ == "__main__":
    run_cli(main, explain=connection.explain_refusal)
