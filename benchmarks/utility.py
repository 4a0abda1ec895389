"""The privacy–utility curve: test accuracy against ε for every framework, with and without DP.

Each point trains one model with the training skeleton (`mnist_dp.learning.training.fit`, each
asset's hyperparameters.json with --set changes), σ calibrated by our accountant for the target ε at
δ = 1e-5, in its own child process, and scores it on the test set:
- mnist4k: the embedded 4,000 / 1,000 MNIST split the default run trains on;
- fmnist: Fashion-MNIST 60,000 / 10,000 from Debian's package (`apt-get install
  dataset-fashion-mnist`).
At --seeds-at (ε = 3) the mean and spread over --seeds seeds. --validation trains on 90% of the
training set and scores on the other 10% (for choosing hyperparameters: the test set is never looked
at).

Every point is appended to --results (JSON lines) as it finishes, and a point already there with the
same settings is not run again, so a long run can be stopped and resumed. Writes a markdown table
and a PNG (accuracy against ε, one line per framework, the non-private accuracy as a line, published
results as markers) next to --results.

    python benchmarks/utility.py [--datasets mnist4k,fmnist] [--frameworks torch,tf,mindspore]
        [--epsilons 1,2,3,8] [--seeds 3] [--set epochs=20 --set activation=relu --label relu]
"""
import concurrent.futures
import functools
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import statistics
import unicodedata
import warnings
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GLOG_v", "3")

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.assets import ALGO_ASSETS, load_asset_module
from mnist_dp.data import sources
from mnist_dp.learning import features, model_io, training
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils import atomic, json_input, options
from mnist_dp.utils.errors import UserError, run_cli

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
DATASETS = {"mnist4k": "MNIST, embedded 4,000 / 1,000 split",
            "fmnist": "Fashion-MNIST 60,000 / 10,000"}
DELTA = 1e-5
MAX_SEEDS = 100  # trainings per point: beyond it a typo is likelier than a plan
# What every point sets itself (point()), whatever --set says.
SET_BY_THE_BENCHMARK = ("noise_multiplier", "target_epsilon", "max_epsilon", "delta", "seed",
                        "noise_seed", "dp", "secure_mode")
RESULTS = Path(__file__).resolve().parent / "results" / "utility.jsonl"
# The goals, (dataset, ε) -> least accuracy in every framework (at --seeds-at the mean over
# the seeds): above the best credible published result at ε = 3 and 1 on Fashion-MNIST, and
# on the embedded MNIST-4k.
GOALS = {("fmnist", 3.0): 0.900, ("fmnist", 1.0): 0.885, ("mnist4k", 3.0): 0.970}
# On MNIST-4k at --seeds-at every framework reaches FLOOR, and no two frameworks' seeds tell them
# apart: a two-sample (Welch) t-test's p-value at least ALPHA.
FLOOR, ALPHA = 0.965, 0.05
# The initial weights the points were trained from: drawn once by
# mnist_dp/learning/initial_weights.py and loaded into every framework. Points of the results file
# without the field drew them with each library's initialiser.
INITIAL_WEIGHTS = "common"
# Published results on these datasets with this CNN or close (δ = 1e-5; their ε from older RDP
# accountants with their own sampling, so compare loosely): (dataset, ε, accuracy, label,
# disputed). DPSUR's selective updates are accounted without the change in sampling probability
# the selection causes (arXiv 2606.04384): its figures are plotted, marked disputed, and no
# goal is set against them.
PUBLISHED = [
    ("mnist", 2.93, 0.981, "Papernot et al. 2021, tanh CNN (60k)", False),
    ("mnist", 3.0, 0.981, "Tramèr & Boneh 2021, tanh CNN (60k)", False),
    ("fmnist", 2.7, 0.861, "Papernot et al. 2021, tanh CNN", False),
    ("fmnist", 3.0, 0.860, "Tramèr & Boneh 2021, tanh CNN", False),
    ("fmnist", 3.0, 0.890, "Tramèr & Boneh 2021, ScatterNet + CNN", False),
    ("fmnist", 3.0, 0.897, "Tramèr & Boneh 2021, ScatterNet + linear", False),
    ("fmnist", 3.0, 0.8809, "DPNAS", False),
    ("fmnist", 3.0, 0.8971, "DPSUR (Fu et al. 2023)", True),
    ("fmnist", 1.0, 0.8838, "DPSUR (Fu et al. 2023)", True),
]


def load_dataset(name, validation, seed=0):
    """((train images, labels), (test images, labels)), images float32 in [0, 1] as the opener gives
    them."""
    if name == "mnist4k":
        images, labels = sources.load_embedded()
        # the default run's split
        train, test = sources.split_train_test(images, labels, 4000, 1000, 0)
    elif name == "fmnist":
        if not FASHION_MNIST.is_dir():
            raise UserError(f"{FASHION_MNIST}: not found; install it with `apt-get install "
                            "dataset-fashion-mnist`")
        train, test = sources.load_idx_folder(FASHION_MNIST)
    else:
        raise UserError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    if validation:  # the last tenth of a shuffled, stratified training set plays the test set
        n = len(train[1])
        train, test = sources.split_train_test(*train, n - n // 10, n // 10, seed)
    scale = lambda split: (split[0].astype(np.float32) / 255.0, split[1].astype(np.int64))  # noqa: E731
    return scale(train), scale(test)


def remember_features(scattering):
    """The scattering transform with a memory: one child process runs every point of a data set and
    a framework, so each image set is transformed once (the features are a function of the images
    alone)."""
    memory = {}

    @functools.wraps(scattering)
    def remembered(images, dtype=np.float32):
        key = hashlib.sha1(images.tobytes()).hexdigest(), np.dtype(dtype).str
        if key not in memory:
            memory[key] = scattering(images, dtype)
        return memory[key]

    remembered.remembers = True
    return remembered


def run_point(framework, dataset, epsilon, seed, changes, validation):
    """In a child process: train one model, return its test accuracy, ε and what it ran."""
    warnings.filterwarnings("ignore")
    if not getattr(features.scattering, "remembers", False):
        features.scattering = remember_features(features.scattering)
    algo = load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}")
    (train_x, train_y), (test_x, test_y) = load_dataset(dataset, validation)
    dp = epsilon is not None
    hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME,
                              hyperparameters.Overrides({
        **changes, "noise_multiplier": None, "target_epsilon": epsilon if dp else None,
                                                         "max_epsilon": None, "delta": DELTA,
        "seed": seed, "noise_seed": seed, "dp": dp, "secure_mode": False},
                                                        "the benchmark's settings"))
    run = training.fit_from_scratch(algo.FRAMEWORK, train_x, train_y, hp, "utility", (dataset,))
    predicted = model_io.predicted_labels(algo.FRAMEWORK, run.model, test_x, run.network)
    event = run.plan.event(run.ran)
    return {"accuracy": float(np.mean(predicted == test_y)),
            "epsilon": Ledger([event]).epsilon(DELTA), "sigma": run.plan.sigma,
            "steps": run.ran.steps,
            "seconds": round(run.seconds, 1), "hyperparameters": hp.to_json()}


def point_key(row):
    return json.dumps([row[k] for k in ("dataset", "framework", "target_epsilon", "seed", "changes",
                                        "validation")]
                      + [row.get("initial_weights", "each library's")], sort_keys=True)


def slug(name):
    """A label as a file name: lowercase ASCII letters, digits, '-' and '.' only, so that it needs
    no quoting in a shell and checks out on Windows (no colon): 'tutorial: ReLU CNN (before)' ->
    'tutorial-relu-cnn-before', 'noise decay 0.7' -> 'noise-decay-0.7'. Accents are dropped ('è' ->
    'e'), other letters too ('ε')."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9.]+", "-", ascii_name.lower()).strip("-.")


def result_file(results, name, suffix):
    """The report `name` (a label, slugged) with `suffix` next to the JSON lines `results`: every
    benchmark names its files here (not with with_suffix, which would take a label's '0.7' for a
    suffix)."""
    return results.with_name(slug(name) + suffix)


def read_results(path):
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json_input.loads(line, f"{path} line {number}"))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} line {number}: not JSON ({exc}); fix or remove that line, or "
                            "give another --results") from None
    return rows


def run_all(args, changes):
    path = args.results
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {point_key(row) for row in read_results(path)}
    points = []
    for dataset in args.datasets:
        for framework in args.frameworks:
            for epsilon in args.epsilons + ([] if args.skip_non_private else [None]):
                seeds = range(args.seeds) if epsilon == args.seeds_at else range(1)
                points += [(dataset, framework, epsilon, seed) for seed in seeds]
    pools = {}  # one child process per data set and framework (its features computed once)
    for dataset, framework, epsilon, seed in points:
        row = {"dataset": dataset, "framework": framework, "target_epsilon": epsilon, "seed": seed,
               "changes": changes, "validation": args.validation, "label": args.label,
               "initial_weights": INITIAL_WEIGHTS}
        if point_key(row) in done:
            continue
        if (dataset, framework) not in pools:
            for pool in pools.values():
                pool.shutdown()
            pools = {(dataset, framework): concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"))}
        pool = pools[dataset, framework]
        row.update(pool.submit(run_point, framework, dataset, epsilon, seed, changes,
                               args.validation).result())
        print(f"{dataset:<8} {framework:<10} ε target {'-' if epsilon is None else epsilon:<4} "
              f"seed {seed}: accuracy {row['accuracy']:.4f}, ε = {row['epsilon']:.3f}, σ = "
              f"{row['sigma']:.3f}, {row['steps']} steps, {row['seconds']:.0f} s", flush=True)
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
    for pool in pools.values():
        pool.shutdown()


def summarise(rows, label, validation):
    """{(dataset, framework, target ε or None): (mean accuracy, spread, seeds, mean ε, accuracies)}
    of one label."""
    groups = {}
    for row in rows:
        if row.get("label") == label and row["validation"] == validation:
            groups.setdefault((row["dataset"], row["framework"], row["target_epsilon"]),
                              []).append(row)
    summary = {}
    for key, group in groups.items():
        accuracies = [r["accuracy"] for r in group]
        summary[key] = (statistics.mean(accuracies), statistics.pstdev(accuracies), len(group),
                        statistics.mean(r["epsilon"] for r in group), accuracies)
    return summary


def accuracy_name(validation):
    """What the reports call the figure: it is measured on the held-out tenth under --validation."""
    return "validation accuracy" if validation else "test accuracy"


def table(summary, epsilons, validation):
    lines = []
    for dataset in sorted({k[0] for k in summary}, key=list(DATASETS).index):
        frameworks = sorted({k[1] for k in summary if k[0] == dataset}, key=list(ALGO_ASSETS).index)
        lines += [f"**{DATASETS[dataset]}** ({accuracy_name(validation)} %; ε at δ = {DELTA:g}, "
                  "PLD; at ε with several seeds: mean ± standard deviation (seeds))", "",
                  "| framework | " + " | ".join(f"ε = {e:g}"
                                                for e in epsilons) + " | non-private |",
                  "|---|" + "---:|" * (len(epsilons) + 1)]
        for framework in frameworks:
            cells = []
            for epsilon in [*epsilons, None]:
                if (dataset, framework, epsilon) not in summary:
                    cells.append("–")
                    continue
                mean, spread, seeds, *_ = summary[dataset, framework, epsilon]
                cells.append(f"{100 * mean:.1f}" + (f" ± {100 * spread:.1f} ({seeds})" if seeds > 1
                                                    else ""))
            lines.append(f"| {framework} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def goals(summary, seeds_at):
    """Each goal (GOALS, FLOOR and the frameworks' two-sample tests) that the summary has points
    for, met or MISSED, as lines."""
    lines = []
    for (dataset, epsilon), goal in GOALS.items():
        points = {k[1]: v[0] for k, v in summary.items() if k[0] == dataset and k[2] == epsilon}
        for framework, accuracy in points.items():
            lines.append(f"{dataset} {framework}: {100 * accuracy:.1f}% at ε = {epsilon:g} (goal ≥ "
                         f"{100 * goal:.1f}%): "
                         + met(accuracy, goal))
    seeds = {k[1]: v[4] for k, v in summary.items() if k[0] == "mnist4k" and k[2] == seeds_at
             and v[2] > 1}
    for framework, accuracies in seeds.items():
        lines.append(f"mnist4k {framework}: {100 * statistics.mean(accuracies):.1f}% at ε = "
                     f"{seeds_at:g} (floor ≥ {100 * FLOOR:.1f}%): " + met(statistics.mean(
                         accuracies), FLOOR))
    for first, second in itertools.combinations(seeds, 2):
        lines.append(indistinguishable(first, seeds[first], second, seeds[second], seeds_at))
    return lines


def met(accuracy, goal):
    return "met" if accuracy >= goal else f"MISSED by {100 * (goal - accuracy):.1f} points"


def indistinguishable(first, a, second, b, epsilon):
    """Whether two frameworks' accuracies over their seeds tell them apart: the difference of their
    means against its standard error, and Welch's two-sample t-test (unequal variances) at level
    ALPHA."""
    from scipy import stats

    error = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    difference = statistics.mean(a) - statistics.mean(b)
    p_value = float(
        stats.ttest_ind(a, b,
                        equal_var=False).pvalue) if error else (1.0 if not difference else 0.0)
    return (f"mnist4k {first} − {second} at ε = {epsilon:g}: {100 * difference:+.2f} points, "
            f"standard error {100 * error:.2f}, Welch p = {p_value:.2f} ({len(a)} and {len(b)} "
            f"seeds; goal: not told apart at p < {ALPHA:g}): " + (
                "met" if p_value >= ALPHA else "MISSED"))


def ablation_table(rows, labels, dataset, epsilon, validation):
    """Markdown: accuracy at ε of each configuration (label) in each framework, with what it
    changes."""
    frameworks = [f for f in ALGO_ASSETS if any(r["framework"] == f for r in rows)]
    lines = [f"**{DATASETS[dataset]}, ε = {epsilon:g}** ({accuracy_name(validation)} %, mean ± "
             "standard deviation (seeds))", "",
             "| configuration | changes from the assets' hyperparameters | "
             + " | ".join(frameworks) + " |", "|---|---|" + "---:|" * len(frameworks)]
    for label in labels:
        summary = summarise(rows, label, validation)
        changes = next((r["changes"] for r in rows if r.get("label") == label), {})
        cells = []
        for framework in frameworks:
            if (dataset, framework, epsilon) not in summary:
                cells.append("–")
                continue
            mean, spread, seeds, *_ = summary[dataset, framework, epsilon]
            cells.append(f"{100 * mean:.1f}" + (f" ± {100 * spread:.1f} ({seeds})" if seeds > 1
                                                else ""))
        described = ", ".join(f"{k} {json.dumps(v)}" for k, v in changes.items()) or "none"
        lines.append(f"| {label} | {described} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(summary, path, validation):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({k[0] for k in summary}, key=list(DATASETS).index)
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 4.5), squeeze=False)
    colours = {"torch": "tab:red", "tf": "tab:orange", "mindspore": "tab:blue"}
    for ax, dataset in zip(axes[0], datasets):
        for framework in sorted({k[1] for k in summary if k[0] == dataset},
                                key=list(ALGO_ASSETS).index):
            points = sorted((v[3], v[0], v[1]) for k, v in summary.items()
                            if k[:2] == (dataset, framework) and k[2] is not None)
            if points:
                eps, acc, spread = zip(*points)
                ax.errorbar(eps, [100 * a for a in acc], yerr=[100 * s for s in spread], marker="o",
                            capsize=3, color=colours.get(framework), label=f"{framework} (DP-SGD)")
            base = summary.get((dataset, framework, None))
            if base:
                ax.axhline(100 * base[0], linestyle="--", color=colours.get(framework), alpha=0.6,
                           label=f"{framework} non-private")
        published = [p for p in PUBLISHED if dataset.startswith(p[0])]
        for (_, eps, acc, label, disputed), marker in zip(published, "*PXsD^v"):
            if disputed:  # hollow and grey, and said so
                ax.scatter([eps], [100 * acc], marker=marker, s=90, facecolors="none",
                           edgecolors="grey", zorder=5, label=f"{label}: disputed accounting")
            else:
                ax.scatter([eps], [100 * acc], marker=marker, s=90, color="black", zorder=5,
                           label=label)
        ax.set_xscale("log")
        ax.set_xticks([1, 2, 3, 8])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(f"ε at δ = {DELTA:g} (PLD, Poisson sampling)")
        ax.set_ylabel(f"{accuracy_name(validation)} (%)")
        ax.set_title(DATASETS[dataset])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic.replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


DEFAULTS = {"frameworks": list(ALGO_ASSETS), "epsilons": [1.0, 2.0, 3.0, 8.0], "seeds": 3,
            "seeds_at": 3.0, "label": "default"}


def main(argv=None):
    parser = options.ArgumentParser(__doc__)
    epsilon = options.number(0, hyperparameters.MAX_EPSILON, low_open=True)
    parser.add_argument("--datasets", type=options.names(DATASETS), default=",".join(DATASETS),
                        help="comma-separated (default: %(default)s)")
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS),
                        help=f"comma-separated (default: {','.join(DEFAULTS['frameworks'])})")
    parser.add_argument("--epsilons", type=options.comma_list(epsilon),
                        help="target ε values (default: "
                             f"{','.join(f'{e:g}' for e in DEFAULTS['epsilons'])})")
    parser.add_argument("--seeds", type=options.integer(1, MAX_SEEDS),
                        help=f"seeds at --seeds-at (default: {DEFAULTS['seeds']})")
    parser.add_argument("--seeds-at", type=epsilon,
                        help="the ε of --epsilons run with every seed (default: "
                             f"{DEFAULTS['seeds_at']:g})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a hyperparameter of every asset (JSON value), e.g. --set "
                             "activation=relu")
    parser.add_argument("--label", help="name of this configuration in the results (default: "
                                        f"{DEFAULTS['label']})")
    parser.add_argument("--validation", action="store_true",
                        help="score on a held-out tenth of the training set, not the test set (for "
                             "tuning)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="JSON lines of every point (default: %(default)s)")
    parser.add_argument("--skip-non-private", action="store_true",
                        help="train no non-private model")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing; table and figure from --results")
    parser.add_argument("--ablation", metavar="LABEL;LABEL;...",
                        help="train nothing; write the table of these labels at --seeds-at "
                             "(utility-ablation.md)")
    args = parser.parse_args(argv)
    if args.ablation is not None:
        options.refuse_unused("with --ablation", {
            "--frameworks": args.frameworks, "--epsilons": args.epsilons, "--seeds": args.seeds,
                                                  "--set": args.set, "--label": args.label,
            "--skip-non-private": args.skip_non_private, "--report-only": args.report_only})
    elif args.report_only:
        options.refuse_unused("with --report-only",
                              {"--seeds": args.seeds, "--seeds-at": args.seeds_at,
                                                     "--set": args.set,
                               "--skip-non-private": args.skip_non_private})
    asked_seeds = (args.seeds or 1) > 1 or args.seeds_at is not None
    for name, value in DEFAULTS.items():
        setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    if (asked_seeds and args.ablation is None and not args.report_only
            and args.seeds_at not in args.epsilons):
        raise UserError(f"--seeds-at {args.seeds_at:g}: not one of --epsilons, so no point would "
                        f"run with --seeds {args.seeds}; give one of them")
    if args.ablation is not None and not [label for label in args.ablation.split(";") if label]:
        raise UserError("--ablation: give the labels to compare, separated by ';'")
    changes = hyperparameters.parse_assignments(args.set)
    hyperparameters.refuse_keys(changes, SET_BY_THE_BENCHMARK,
                                f"the benchmark sets it (σ for each of --epsilons, δ = {DELTA:g}, "
                                "seeds from --seeds, DP on and off)")
    if not slug(args.label):
        parser.error(f"--label {args.label!r}: needs a letter or digit (it names the report's "
                     "files)")
    if not args.ablation:  # two labels with one slug would write over each other's report
        clash = sorted({row.get("label") for row in read_results(args.results)
                        if row.get("label") != args.label
                        and slug(row.get("label") or "") == slug(args.label)})
        if clash:
            raise UserError(f"--label {args.label!r}: its report's file name is that of "
                            f"{', '.join(map(repr, clash))} in {args.results}; choose another "
                            "label")
        other = {json.dumps(row.get("changes"), sort_keys=True)
                 for row in read_results(args.results)
                 if row.get("label") == args.label} - {json.dumps(changes, sort_keys=True)}
        # one label's report averages its points: one setting per label
        if other and not args.report_only:
            raise UserError(f"--label {args.label!r}: {args.results} holds its points with other "
                            f"--set changes ({'; '.join(sorted(other))}); give the same --set, or "
                            "another label")
    if args.ablation:
        rows, labels = read_results(args.results), [label for label in args.ablation.split(";")
                                                    if label]
        text = "\n".join(ablation_table(rows, labels, dataset, args.seeds_at, args.validation)
                         for dataset in args.datasets)
        path = result_file(args.results, "utility-ablation", ".md")
        atomic.write_text(path, text)
        print(text + f"\nwrote {path}")
        return
    if not args.report_only:
        run_all(args, changes)
    summary = summarise(read_results(args.results), args.label, args.validation)
    summary = {k: v for k, v in summary.items() if k[0] in args.datasets
               and k[1] in args.frameworks}
    if not summary:
        raise UserError(f"{args.results}: no results for label {args.label!r}")
    name = f"utility-{args.label}{'-validation' if args.validation else ''}"
    markdown, png = result_file(args.results, name, ".md"), result_file(args.results, name, ".png")
    text = table(summary, args.epsilons, args.validation) + "\n" + "".join(
        f"- {line}\n" for line in goals(summary, args.seeds_at))
    atomic.write_text(markdown, text)
    plot(summary, png, args.validation)
    print(text + f"\nwrote {markdown} and {png}")


if __name__ == "__main__":
    run_cli(main)
