"""Empirical privacy audits: lower bounds on ε from canaries in one training run, against the ε the
ledger claims.

--white-box: each framework's own DP step (its clipping, its noise, its optimizer) with Dirac
gradient canaries (Steinke, Nasr & Jagielski 2023, §6; mnist_dp/privacy/audit.py's DiracCanaries).
Canary i is weight coordinate i of the default network (all 72,756 of them), included with
probability 1/2; at every step each included canary adds C to its coordinate of the clipped sum,
before the noise. Its score is how far its coordinate moved, less the real examples' part. The run
is the one where a one-run audit is strongest (docs/privacy.md says why): the full batch (q = 1, so
the real examples' clipped sum is public and subtracted, and the steps compose to exactly μ-GDP),
plain SGD without momentum or weight average (the weights' move is then the sum of the noisy sums).
Each claimed ε is audited twice: as built, and with the mechanism broken on purpose (the steps add
--broken-noise-scale of the noise while the ledger claims all of it), which the audit must catch.
With --images-per-person K the real images are persons of K and the run is private per person: a
canary is then one person's clipped contribution, and the claim is ε per person.

black-box (the default): held-out images given a wrong label are the canaries, each in the training
set with probability 1/2; the training is the assets' recipe with the options below; a canary's
score is the final model's log-probability of its wrong label. The same is done without DP to show
the attack has teeth.

Every audit guesses "in" for the k highest scores and "out" for the k lowest (k = --guesses, fixed
in advance) and turns the correct guesses into 95% lower bounds on ε: Steinke et al.'s, which holds
for any (ε, δ) claim, and for the white-box runs Mahloujifar, Melis & Chaudhuri's (2025) f-DP bound
against the Gaussian claim q = 1 makes.

Exits 1 when an as-built bound exceeds its claim (a bug in the mechanism or the accounting) or a
broken mechanism's does not (the audit could not have caught it). Writes OUTPUT/audit.json (one
record per run, replacing earlier records of the same framework, mode, mechanism and claimed ε) and
OUTPUT/audit.md.

    python benchmarks/audit.py [--white-box] [--frameworks torch,tf,mindspore] [--epsilons 2,8]
    [--output DIR]
"""
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.assets import ALGO_ASSETS, load_asset_module
from mnist_dp.data import sources
from mnist_dp.learning import model_io, training
from mnist_dp.learning.interface import Network, flat_weights
from mnist_dp.privacy import audit, task_plan, units
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.utils import atomic, json_input, options
from mnist_dp.utils.errors import UserError, run_cli

BETA = 0.05  # the lower bounds hold with 95% confidence
RESULTS = Path(__file__).resolve().parent / "results"
STEINKE, FDP = "Steinke et al. 2023, (ε, δ)", "Mahloujifar et al. 2025, f-DP (Gaussian)"
# Each mode's defaults where they differ: real training images and guesses per side.
DEFAULTS = {"white-box": {"train_size": 256, "guesses": 1000},
            "black-box": {"train_size": 1000, "guesses": 100}}
MAX_GUESSES = 1_000_000  # per side; at most half the canaries, checked where their number is known
# The options of one mode only, with their defaults: given in the other mode, they are refused.
WHITE_BOX = {"steps": 10, "broken_noise_scale": 0.5, "images_per_person": 1}
BLACK_BOX = {"canaries": 500, "epochs": 30, "batch_size": 125, "no_baseline": False}


def images_and_labels(count, rng):
    """`count` distinct embedded MNIST images (the opener's scaling) and labels, in the order of
    rng."""
    images, labels = sources.load_embedded()
    order = rng.permutation(len(labels))[:count]
    return images[order].astype(np.float32) / 255.0, labels[order].astype(np.int64)


def audit_hyperparameters(framework, args, epsilon, changes):
    return hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME,
                                hyperparameters.Overrides({
        "noise_multiplier": None, "target_epsilon": epsilon, "max_epsilon": None,
                                                           "delta": args.delta, "seed": args.seed,
        "noise_seed": args.seed, **changes}, "the audit's options"))


def claimed_epsilon(plan, ran):
    return Ledger([plan.event(ran)]).epsilon(plan.hp.delta)


def white_box_run(framework, algo, args, epsilon, noise_scale):
    """One training run with Dirac canaries on every weight coordinate; its record."""
    rng = np.random.default_rng(args.seed)
    images, labels = images_and_labels(args.train_size, rng)
    # persons of K consecutive images, or None: per image
    persons = np.arange(len(labels)) // args.images_per_person if args.images_per_person > 1 \
        else None
    unit = units.of(persons)
    count = unit.count(len(labels))
    hp = audit_hyperparameters(framework, args, epsilon, {
        "epochs": args.steps, "batch_size": count, "optimizer": "sgd", "momentum": 0.0,
                                                          "ema_decay": 0.0,
        "clip_quantile": None, "noise_decay": 1.0, "dp": True})  # q = 1: one step an epoch
    plan = task_plan.fresh(framework, hp, count, "the audit's options", ("audit",),
                           unit.clipping)
    network = Network.of(hp)
    model = algo.FRAMEWORK.new_model(hp.seed, network)
    shapes = [a.shape for a in algo.FRAMEWORK.weight_arrays(model)]
    m = sum(int(np.prod(s)) for s in shapes)
    if 2 * args.guesses > m:
        raise UserError(f"--guesses {args.guesses}: 2k must be at most the {m} canaries (the "
                        "network's weights)")
    canaries = audit.DiracCanaries(shapes, rng.random(m) < 0.5, plan.sampling.sample_rate,
                                   noise_scale)
    start, began = flat_weights(algo.FRAMEWORK, model), time.perf_counter()
    ran = training.fit(algo.FRAMEWORK, model, network.inputs(images), labels, plan,
                       RunRandomness.for_run(hp.noise_seed), canaries=canaries, persons=persons)
    scores = canaries.scores(start, flat_weights(algo.FRAMEWORK, model), hp.learning_rate,
                             plan.sampling.expected_batch_size)
    guesses, correct = audit.guess(scores, canaries.included, args.guesses, args.guesses)
    return {"mode": "white-box", "mechanism": "as-built" if noise_scale == 1 else "broken",
            "noise_added": noise_scale, "privacy_unit": unit.name,
            "claimed_epsilon": claimed_epsilon(plan, ran),
            "lower_bound": audit.gaussian_epsilon_lower_bound(m, guesses, correct, hp.delta, BETA),
            "estimator": FDP,
            "lower_bound_steinke": audit.epsilon_lower_bound(m, guesses, correct, hp.delta, BETA),
            "sigma": plan.sigma, "steps": ran.steps, "canaries": m, "guesses": guesses,
            "correct": correct, "seconds": round(time.perf_counter() - began, 1)}


def black_box_run(framework, algo, args, epsilon):
    """Mislabelled canaries in the training set, loss scores on the final model; its record (epsilon
    None: without DP)."""
    rng = np.random.default_rng(args.seed)
    images, labels = images_and_labels(args.train_size + args.canaries, rng)
    # never the true label
    canary_labels = (labels[args.train_size:] + rng.integers(1, 10, args.canaries)) % 10
    included = rng.random(args.canaries) < 0.5
    train_x = np.concatenate([images[:args.train_size], images[args.train_size:][included]])
    train_y = np.concatenate([labels[:args.train_size], canary_labels[included]])
    hp = audit_hyperparameters(framework, args, epsilon or 1.0, {
        "epochs": args.epochs, "batch_size": args.batch_size, "dp": epsilon is not None})
    run = training.fit_from_scratch(algo.FRAMEWORK, train_x, train_y, hp, "audit", ("audit",))
    logits = model_io.predict_in_batches(algo.FRAMEWORK, run.model, images[args.train_size:],
                                         run.network)
    logits = logits.astype(np.float64)
    log_probs = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    scores = log_probs[np.arange(args.canaries), canary_labels]  # memorised canaries score high
    guesses, correct = audit.guess(scores, included, args.guesses, args.guesses)
    return {"mode": "black-box", "mechanism": "as-built" if epsilon else "non-private",
            "claimed_epsilon": claimed_epsilon(run.plan, run.ran) if epsilon
            else None,
            "lower_bound": audit.epsilon_lower_bound(args.canaries, guesses, correct, hp.delta,
                                                     BETA), "estimator": STEINKE,
            "sigma": run.plan.sigma, "steps": run.ran.steps, "canaries": args.canaries,
            "guesses": guesses, "correct": correct, "seconds": round(run.seconds, 1)}


def framework_records(framework, args):
    """Runs in a child process (one framework per process): every run of the audit for
    `framework`."""
    warnings.filterwarnings("ignore")
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}")
    records = []
    for epsilon in args.epsilons:
        if args.white_box:
            runs = [white_box_run(framework, algo, args, epsilon, scale)
                    for scale in (1.0, args.broken_noise_scale)]
        else:
            runs = [black_box_run(framework, algo, args, epsilon)]
        records += [{"framework": framework, "delta": args.delta, **run} for run in runs]
    if not args.white_box and not args.no_baseline:
        records.append({"framework": framework, "delta": args.delta,
                        **black_box_run(framework, algo, args, None)})
    return records


def verdict(record):
    """What a record says of the mechanism: None when it is as it should be, else the problem."""
    claimed, bound = record["claimed_epsilon"], record["lower_bound"]
    if record["mechanism"] == "as-built" and bound > claimed:
        return "BUG: the lower bound exceeds the claimed ε"
    if record["mechanism"] == "broken" and bound <= claimed:
        return "NOT CAUGHT: the broken mechanism's lower bound does not exceed its claim"
    return None


def table(records):
    """The markdown table of `records`."""
    columns = ["framework", "mode", "unit", "mechanism", "claimed ε", "95% lower bound",
               "% of claim",
               "Steinke et al.", "correct / guesses", "canaries", "σ", "steps", "seconds"]
    lines = ["| " + " | ".join(columns) + " |", "|---|---|---|---|" + "---:|" * (len(columns) - 4)]
    for r in records:
        claimed, bound = r["claimed_epsilon"], r["lower_bound"]
        steinke = r.get("lower_bound_steinke", bound)  # the black-box bound is Steinke et al.'s
        cells = [r["framework"], r["mode"], r.get("privacy_unit", "image"),
                 f"broken ({r['noise_added']:g} of the noise)" if r["mechanism"] == "broken"
                 else r["mechanism"], "–" if claimed is None else f"{claimed:.2f}", f"{bound:.2f}",
                 "–" if claimed is None else f"{100 * bound / claimed:.0f}", f"{steinke:.2f}",
                 f"{r['correct']} / {r['guesses']}", f"{r['canaries']:,}", f"{r['sigma']:.3g}",
                 str(r["steps"]), f"{r['seconds']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def merge(path, records):
    """The records of `path` (if any) with `records` replacing those of the same framework, mode,
    mechanism, claimed ε and privacy unit in place, the others appended; how many were
    replaced."""
    def key(r):
        return r["framework"], r["mode"], r["mechanism"], r["claimed_epsilon"] and round(
            r["claimed_epsilon"], 2), r.get("privacy_unit", "image")

    try:
        earlier = json_input.loads(path.read_text(), str(path)) if path.exists() else []
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON ({exc}); move it away or give another "
                        "--output") from None
    if not isinstance(earlier, list) or not all(
            isinstance(r, dict) and {"framework", "mode", "mechanism",
                                     "claimed_epsilon"} <= set(r) for r in earlier):
        raise UserError(f"{path}: not a list of audit records; move it away or give another "
                        "--output")
    fresh = {key(r): r for r in records}
    merged = [fresh.pop(key(r)) if key(r) in fresh else r for r in earlier]
    return merged + list(fresh.values()), len(records) - len(fresh)


def parse_arguments(argv):
    parser = options.ArgumentParser(__doc__)
    # every image the audit uses is an embedded one
    images = options.integer(1, sources.EMBEDDED_SIZE)
    parser.add_argument("--white-box", action="store_true",
                        help="the white-box audit of each framework's DP step")
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS),
                        default=",".join(ALGO_ASSETS),
                        help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--epsilons",
        type=options.comma_list(options.number(0, hyperparameters.MAX_EPSILON, low_open=True)),
        default="2,8", help="claimed ε values, σ calibrated for each (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help="folder of audit.json and audit.md (default: benchmarks/results)")
    parser.add_argument("--guesses", type=options.integer(1, MAX_GUESSES),
                        help="k: 'in' for the k highest scores, 'out' for the k lowest, fixed in "
                             "advance (default: white-box 1000, black-box 100)")
    parser.add_argument("--train-size", type=images,
                        help="real training images (default: white-box 256, black-box 1000)")
    parser.add_argument("--delta", type=options.number(0, 1, low_open=True, high_open=True),
                        default=1e-5, help="(default: %(default)s)")
    parser.add_argument("--seed", type=options.integer(0, options.MAX_SEED), default=0,
                        help="canaries, inclusion, images and training seed (default: %(default)s)")
    white = parser.add_argument_group("white-box")
    white.add_argument("--steps", type=options.integer(1, hyperparameters.MAX_EPOCHS),
                       help=f"full-batch steps (default: {WHITE_BOX['steps']})")
    white.add_argument("--broken-noise-scale", type=options.number(0, 1, high_open=True),
                       help="the fraction of the noise the broken mechanism adds (default: "
                            f"{WHITE_BOX['broken_noise_scale']}, half)")
    white.add_argument("--images-per-person", type=images,
                       help="K: the real images as persons of K, the run private per person and "
                            "each canary one person (default: 1, per image)")
    black = parser.add_argument_group("black-box")
    black.add_argument("--canaries", type=images,
                       help=f"m: mislabelled canaries (default: {BLACK_BOX['canaries']})")
    black.add_argument("--epochs", type=options.integer(1, hyperparameters.MAX_EPOCHS),
                       help=f"(default: {BLACK_BOX['epochs']})")
    black.add_argument("--batch-size", type=images,
                       help=f"expected batch size (default: {BLACK_BOX['batch_size']})")
    black.add_argument("--no-baseline", action="store_true", help="skip the non-private run")
    args = parser.parse_args(argv)
    if args.white_box:
        mode, own, other, said = "white-box", WHITE_BOX, BLACK_BOX, "with --white-box"
    else:
        mode, own, other, said = ("black-box", BLACK_BOX, WHITE_BOX,
                                  "without --white-box (the black-box audit)")
    options.refuse_unused(said,
                          {f"--{name.replace('_', '-')}": getattr(args, name) for name in other})
    for name, value in {**DEFAULTS[mode], **own}.items():
        setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    if not args.white_box and args.train_size + args.canaries > sources.EMBEDDED_SIZE:
        parser.error(f"--train-size {args.train_size} with --canaries {args.canaries}: the audit "
                     f"draws them from the {sources.EMBEDDED_SIZE:,} embedded images; ask for "
                     "fewer")
    if not args.white_box and 2 * args.guesses > args.canaries:
        parser.error(f"--guesses {args.guesses}: 2k must be at most --canaries ({args.canaries})")
    if not args.output.is_dir():
        parser.error(f"--output: {args.output} is not a folder")
    merge(args.output / "audit.json", [])  # its earlier records readable, before any training
    return args


def main(argv=None):
    args = parse_arguments(argv)
    mode = "white-box" if args.white_box else "black-box"
    print(f"{mode} one-run audit, {args.guesses} + {args.guesses} guesses, {100 * (1 - BETA):.0f}% "
          f"lower bounds, δ = {args.delta:g}, claimed ε "
          f"{', '.join(f'{e:g}' for e in args.epsilons)}", flush=True)
    records = []
    for framework in args.frameworks:
        with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")) as pool:
            added = pool.submit(framework_records, framework, args).result()
        for r in added:
            claimed = "no DP" if r["claimed_epsilon"] is None else f"{r['claimed_epsilon']:.3f}"
            print(f"{framework:<10} {r['mechanism']:<12} claimed {claimed:>7}  lower bound "
                  f"{r['lower_bound']:6.3f}  {r['correct']}/{r['guesses']} correct  "
                  f"{r['seconds']:.0f}s  {verdict(r) or ''}", flush=True)
        records += added
    merged, replaced = merge(args.output / "audit.json", records)
    atomic.write_text(args.output / "audit.json", json.dumps(merged, indent=1) + "\n")
    atomic.write_text(args.output / "audit.md", table(merged) + "\n")
    print(f"wrote {args.output / 'audit.json'} ({len(records)} records; {replaced} earlier "
          f"record{'' if replaced == 1 else 's'} of the same runs replaced) and audit.md")
    problems = [f"{r['framework']} {r['mechanism']} at ε {r['claimed_epsilon']:.2f}: {verdict(r)}"
                for r in records if verdict(r)]
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print("every as-built bound is at most its "
          "claim" + (", every broken one above it" if args.white_box else ""))


if __name__ == "__main__":
    run_cli(main)
