"""Empirical privacy audit: an ε lower bound from canaries, against the ε the ledger claims.

For each framework: take a training set of real MNIST images and m canaries (held-out images given a
wrong label), put each canary in the training set with probability 1/2, train once with DP (the
training skeleton's fit, the asset's hyperparameters with the overrides below), score every canary by
the trained model's log-probability of its wrong label, guess "in" for the k highest and "out" for the
k lowest, and turn the correct guesses into a 95% lower bound on ε (Steinke, Nasr & Jagielski 2023,
one training run; mnist_dp/privacy/audit.py). The same is done without DP to show the attack has teeth.

A lower bound above the claimed ε is a bug (in the mechanism or the accounting): the script then says
so and exits 1.

    python benchmarks/audit.py [--frameworks torch,tf,mindspore] [--canaries 500] [--target-epsilon 8]
"""
import argparse
import concurrent.futures
import multiprocessing
import os
import sys
import warnings

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from mnist_dp.data import sources
from mnist_dp.learning import hyperparameters as hp_file
from mnist_dp.learning import skeleton
from mnist_dp.orchestration.assets import ALGO_ASSETS, load_asset_module
from mnist_dp.privacy import audit, budget
from mnist_dp.privacy.ledger import Ledger

BETA = 0.05  # the lower bounds hold with 95% confidence


def canary_set(train_size, canaries, seed):
    """Real training images, plus canaries (held-out images with a wrong label) each included w.p. 1/2."""
    images, labels = sources.load_embedded()
    images = images.astype(np.float32) / 255.0  # the opener's scaling
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    real, held_out = order[:train_size], order[train_size : train_size + canaries]
    canary_labels = (labels[held_out] + rng.integers(1, 10, canaries)) % 10  # never the true label
    included = rng.random(canaries) < 0.5
    train_x = np.concatenate([images[real], images[held_out][included]])
    train_y = np.concatenate([labels[real], canary_labels[included]]).astype(np.int64)
    return (train_x, train_y), (images[held_out], canary_labels.astype(np.int64)), included


def audit_framework(framework, args, dp):
    """Runs in a child process: one training run, the canaries' scores, the claimed ε and the bound."""
    warnings.filterwarnings("ignore")
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}")
    (train_x, train_y), (canary_x, canary_y), included = canary_set(args.train_size, args.canaries, args.seed)
    hp = hp_file.load(ALGO_ASSETS[framework] / hp_file.FILE_NAME, hp_file.Overrides({
        "epochs": args.epochs, "batch_size": args.batch_size, "noise_multiplier": None,
        "target_epsilon": args.target_epsilon, "max_epsilon": None, "delta": args.delta, "seed": args.seed,
        "noise_seed": args.seed, "dp": dp},
        "the audit's options"))
    run = skeleton.fit_from_scratch(algo.FRAMEWORK, train_x, train_y, hp, "audit")
    logits = skeleton.predict_in_batches(algo.FRAMEWORK, run.model, canary_x, run.network).astype(np.float64)
    log_probs = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    scores = log_probs[np.arange(len(canary_y)), canary_y]  # memorised canaries score high
    guesses, correct = audit.guess(scores, included, args.guesses, args.guesses)
    event = budget.dp_event(framework, ("audit",), hp, run.plan, run.result)
    return {"dp": dp, "claimed": Ledger([event]).epsilon(hp.delta), "sigma": run.sigma, "steps": run.result.steps,
            "n": run.plan.n, "guesses": guesses, "correct": correct,
            "lower_bound": audit.epsilon_lower_bound(args.canaries, guesses, correct, hp.delta, BETA),
            "seconds": run.seconds}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=",".join(ALGO_ASSETS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--canaries", type=int, default=500,
                        help="m: canaries, each included w.p. 1/2 (default: %(default)s)")
    parser.add_argument("--guesses", type=int, default=100,
                        help="k: guesses 'in' for the k highest scores and 'out' for the k lowest, fixed in "
                             "advance (default: %(default)s)")
    parser.add_argument("--train-size", type=int, default=1000, help="real training images (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=30, help="(default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=125, help="expected batch size (default: %(default)s)")
    parser.add_argument("--target-epsilon", type=float, default=8.0,
                        help="σ is calibrated for this claimed ε (default: %(default)s)")
    parser.add_argument("--delta", type=float, default=1e-5, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="canaries, inclusion and training seed (default: %(default)s)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the non-private run")
    args = parser.parse_args(argv)
    if not 0 < 2 * args.guesses <= args.canaries:
        parser.error("--guesses: 2k must be at most --canaries")

    print(f"one-run audit: {args.canaries} canaries (wrong labels, each in w.p. 1/2) + {args.train_size} real images, "
          f"{args.epochs} epochs, expected batch {args.batch_size}, {args.guesses} + {args.guesses} guesses, "
          f"{100 * (1 - BETA):.0f}% lower bounds, δ = {args.delta:g}")
    print(f"{'framework':<10}{'DP':>4}{'σ':>7}{'steps':>7}{'correct':>12}{'ε claimed':>11}{'ε lower bound':>15}"
          f"{'time':>8}")
    broken = []
    for framework in [f for f in args.frameworks.split(",") if f]:
        for dp in [True] if args.no_baseline else [True, False]:
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                row = pool.submit(audit_framework, framework, args, dp).result()
            print(f"{framework:<10}{'yes' if dp else 'no':>4}{row['sigma']:>7.3f}{row['steps']:>7}"
                  f"{row['correct']:>7}/{row['guesses']:<4}{row['claimed']:>11.3f}{row['lower_bound']:>15.3f}"
                  f"{row['seconds']:>7.0f}s", flush=True)
            if row["lower_bound"] > row["claimed"]:
                broken.append(framework)
    if broken:
        print(f"BUG: the empirical lower bound exceeds the claimed ε for {', '.join(broken)}")
        sys.exit(1)
    print("every lower bound is at most the claimed ε")


if __name__ == "__main__":
    main()
