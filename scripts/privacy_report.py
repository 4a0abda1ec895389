"""Print the privacy statement of a saved model file, recomputed from its ledger.

Needs no ML framework (only numpy and dp_accounting): give it a model written by a train task
(e.g. results/models/torch.model or a model downloaded from Substra).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: mnist_dp

from mnist_dp import model_file, statement  # noqa: E402
from mnist_dp.errors import run_cli  # noqa: E402


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
