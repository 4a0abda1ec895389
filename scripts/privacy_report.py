"""Print the privacy statement of a saved model file, recomputed from its ledger.

Needs no ML framework (only numpy and dp_accounting): give it a model written by a train task
(e.g. results/models/torch.model or a model downloaded from Substra).
"""
from pathlib import Path

from mnist_dp.privacy import model_file, statement
from mnist_dp.utils import options
from mnist_dp.utils.errors import run_cli


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("model", type=Path, nargs="+", help="model file(s) written by a train task")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    for path in args.model:
        saved = model_file.load(path)
        print(f"# {path} ({saved.framework})\n")
        print(statement.privacy_statement(saved))
        print()


if __name__ == "__main__":
    run_cli(main)
