"""Register the dataset (opener), its train / test data samples and the objective (accuracy) on a
Substra node, and write their keys to a JSON keys file.

The keys file is rewritten atomically after every new key; a re-run reuses the keys of assets that
are unchanged and still on the node. Then run scripts/add_train_algo_cnn_dp.py. Connection settings
come from the environment (see --client-name); none is written anywhere.
"""
import tempfile
from pathlib import Path

from mnist_dp.data import dataset, samples
from mnist_dp.orchestration import connection, registry
from mnist_dp.privacy import policy
from mnist_dp.utils import options
from mnist_dp.utils.errors import run_cli
from mnist_dp.utils.words import counted


def build_parser():
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--data", type=Path, default=Path("data"),
                        help="data samples written by scripts/generate_data.py; generated from the "
                             "embedded MNIST subset if missing (default: %(default)s)")
    parser.add_argument("--keys-file", type=Path, default=Path("assets_keys.json"),
                        help="JSON file the keys are written to, and read from on a re-run "
                             "(default: %(default)s)")
    parser.add_argument("--folds", type=options.integer(1, options.MAX_ORGANIZATIONS), default=1,
                        help="groups the train data samples into this many folds; "
                             "add_train_algo_cnn_dp.py trains on them one after the other "
                             "(default: %(default)s)")
    connection.add_arguments(parser)
    policy.add_arguments(parser)
    policy.add_size_argument(parser)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    owner = policy.from_arguments(args)
    keys = registry.KeysFile(args.keys_file)
    work = args.keys_file.resolve().parent  # a local backend keeps its files in ./local-worker here
    client = connection.connect(args.backend, args.client_name, work)
    dataset.generate_default_if_missing(args.data, train_samples=args.folds, flag="--folds")
    # before the samples are registered: Substra never lets them change
    if owner is not None:
        print(policy.write_into(dataset.sample_folders(args.data, "train"), owner))
    if args.public_size is not None:
        print(samples.declare_size(dataset.sample_folders(args.data, "train"), args.public_size))
    with tempfile.TemporaryDirectory() as build_dir:
        registry.register_dataset_objective(client, keys, args.data, args.folds, Path(build_dir))
    folds = keys.get("train_data_sample_keys")
    print(f"dataset {keys.get('dataset_key')} at {keys.get('organization_id')}: "
          f"{counted(sum(map(len, folds)), 'train data sample')} in "
          f"{counted(len(folds), 'fold')}, "
          f"{len(keys.get('test_data_sample_keys'))} test; objective {keys.get('objective_key')}")
    print(f"keys written to {args.keys_file}")


if __name__ == "__main__":
    run_cli(main, explain=connection.explain_refusal)
