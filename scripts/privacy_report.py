"""Print the privacy statement of a saved model file, recomputed from its ledger.

Needs no ML framework (only numpy and dp_accounting): give it a model written by a train task
(e.g. results/models/torch.model or a model downloaded from Substra).
"""
from pathlib import Path

from mnist_dp.data import samples
from mnist_dp.privacy import data_ledger, model_file, statement
from mnist_dp.utils import options
from mnist_dp.utils.errors import run_cli


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("model", type=Path, nargs="+", help="model file(s) written by a train task")
    parser.add_argument("--data", type=Path, nargs="+", metavar="SAMPLE",
                        help="your organisation's training data sample folders: the models' runs "
                             "on them that their own ledger (privacy_ledger.jsonl) lacks are "
                             "recorded there first, and the statement adds what they have spent "
                             "over every run released from them")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    own = [samples.sample_identity(folder) for folder in args.data or []]
    saved_models = [(path, model_file.load(path)) for path in args.model]
    if args.data:
        data_ledger.record_released(dict(zip(own, args.data)),
                                    [saved.ledger for _, saved in saved_models])
    spent = samples.spent_on(args.data) if args.data else None
    for path, saved in saved_models:
        print(f"# {path} ({saved.framework})\n")
        delta = saved.hyperparameters["delta"]
        print(statement.privacy_statement(saved,
                                          data_spent={"your data": spent.epsilon(delta, data=own)}
                                          if spent is not None else None))
        print()


if __name__ == "__main__":
    run_cli(main)
