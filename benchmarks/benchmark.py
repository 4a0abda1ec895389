"""Speed and memory of every framework's training step, and of the whole default run.

1. Steps, one child process per framework (so its peak memory is its own): the median time of
   --steps optimizer steps (forward + backward + update) of each asset's network
   (hyperparameters.json, with --set changes) on the embedded data's inputs at the asset's batch
   size: the non-private step on fixed batches, as the baseline trains, and each DP variant on
   Poisson-sampled batches, with its ratio to the non-private step. The variants take turns step by
   step, so the ratios hold on a noisy machine. Then every framework's non-private step against
   torch's, taking turns in one process. With the steps, the scattering features of the 4,000
   training images: features.py's transform against kymatio's own numpy transform, taking turns.
2. The default run, `python scripts/run_local.py` (3 frameworks with DP, embedded data) in a
   fresh folder, end to end: each task's time split into phases (from the record every task writes,
   see mnist_dp/utils/timing.py) with its peak memory; the rest of the wall time is Substra's and
   the scripts'. Accuracy and ε come from the run's results.json. With --data, the same run on
   those data samples, e.g. Fashion-MNIST's 60,000 images.
3. The speed and memory targets against what was measured.

    python benchmarks/benchmark.py [--frameworks torch,tf] [--steps 30] [--skip-run] [--set
    network=linear] python scripts/generate_data.py --source /usr/share/datasets/fashion-mnist
    --output fmnist-data python benchmarks/benchmark.py --skip-steps --data fmnist-data
"""
import concurrent.futures
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GLOG_v", "3")

import numpy as np

from mnist_dp import hyperparameters
from mnist_dp.assets import ALGO_ASSETS, REPO, load_asset_module
from mnist_dp.data import sources
from mnist_dp.learning import chunks, interface
from mnist_dp.privacy import task_plan, units
from mnist_dp.privacy.randomness import RunRandomness
from mnist_dp.utils import json_input, options, timing
from mnist_dp.utils.errors import UserError, run_cli

# The speed targets: every per-image DP step within 1.2× its framework's plain step and every
# per-person one within 1.5×, MindSpore's plain step within 2× torch's, the default run within 4
# minutes, every task process within 1.5 GB and every DP train task within 2 minutes, on
# Fashion-MNIST's 60,000 images too (--data).
MAX_DP_RATIO, MAX_MINDSPORE_VS_TORCH, MAX_RUN_SECONDS, MAX_TASK_MB = 1.2, 2.0, 240, 1536
MAX_PER_PERSON_RATIO = 1.5
PERSON_SUFFIX = " per person"  # a per-person ratio's name: its framework's, then this
MAX_TRAIN_TASK_SECONDS = 120
MIN_FEATURES_SPEEDUP = 5.0  # features.py's scattering transform against kymatio's numpy transform
FEATURES_ROUNDS = 3  # turns of each transform over the images
PLAIN = "non-private"  # the name of each framework's baseline variant


def load_algo(framework):
    return load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}")


def embedded_train_set():
    """The run's 4,000 training images, scaled as the opener scales uint8 pixels."""
    images, labels = sources.load_embedded()
    (train_x, train_y), _ = sources.split_train_test(images, labels, 4000, 1000, 0)
    return train_x.astype(np.float32) / 255.0, train_y.astype(np.int64)


WARMUP = 3  # steps per variant not timed (graph compilation, allocations)
# The hyperparameters a timed step uses (--set may change them): the network's and its DP
# step's (σ is fixed at 1).
TIMED_KEYS = ("features", "network", "activation", "batch_size", "max_grad_norm", "learning_rate",
              "momentum")
# per variant: the default, and a bound on what a run may ask
TIMED_STEPS, MAX_TIMED_STEPS = 30, 10_000


def interleaved_medians(variants):
    """{name: (step, batches)} -> {name: median seconds per step}. The variants take turns, one step
    each, so a slow spell of a noisy machine falls on all of them alike and the ratios hold.
    `step(x, y)` must return when the step has finished (frameworks that run asynchronously
    wait)."""
    times = {name: [] for name in variants}
    pending = {name: (step, iter(batches)) for name, (step, batches) in variants.items()}
    while pending:
        for name, (step, batches) in list(pending.items()):
            batch = next(batches, None)
            if batch is None:
                del pending[name]
                continue
            start = time.perf_counter()
            step(*batch)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds[WARMUP:]) for name, seconds in times.items()}


def poisson_batches(images, labels, plan, count, seed=0, rows=None):
    """Batches as a DP train task samples them: each example in w.p. q = plan.sample_rate. With
    `rows` (one per example, e.g. the first layer's patch Grams a task makes before training), each
    batch's rows of it too."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        picked = np.flatnonzero(rng.random(plan.n) < plan.sample_rate)
        yield (images[picked], labels[picked]) + (() if rows is None else (rows[picked],))


IMAGES_PER_PERSON = 10  # the per-person variant's persons: consecutive images of the shuffled set
PER_PERSON = f"per person, {IMAGES_PER_PERSON} images each (used per person)"


def person_picks(plan, count, seed=0):
    """Index batches as a DP train task samples them per person (subjects.npy): each person of
    IMAGES_PER_PERSON consecutive images in w.p. q, with all their images (as many images expected
    as poisson_batches)."""
    rng = np.random.default_rng(seed)
    persons = np.arange(plan.n) // IMAGES_PER_PERSON
    for _ in range(count):
        yield np.flatnonzero((rng.random(persons[-1] + 1) < plan.sample_rate)[persons])


def person_batches(images, labels, plan, count, seed=0):
    """person_picks' batches: the images, labels, None (no rows: per-person norms need none) and
    the batch's units.BatchPersons."""
    persons = np.arange(plan.n) // IMAGES_PER_PERSON
    for picked in person_picks(plan, count, seed):
        yield images[picked], labels[picked], None, units.BatchPersons.of(persons[picked])


def fixed_batches(images, labels, hp, count, seed=0):
    """Batches as the non-private baseline samples them: batch_size examples, shuffled."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        picked = rng.choice(len(labels), size=hp.batch_size, replace=False)
        yield images[picked], labels[picked]


def time_torch(algo, images, labels, hp, plan, steps, network):
    import torch
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    def make(mode):
        model = algo.build_network(network)
        optimizer = torch.optim.SGD(model.parameters(), lr=hp.learning_rate, momentum=hp.momentum)
        criterion = torch.nn.CrossEntropyLoss()
        if mode == "hooks":
            model = GradSampleModule(model)
            optimizer = DPOptimizer(optimizer, noise_multiplier=1.0, max_grad_norm=hp.max_grad_norm,
                                    expected_batch_size=plan.expected_batch_size)
        # Opacus' noise on a clipped sum; "-secure": secure_mode noise (4 draws per weight)
        elif mode != "plain":
            optimizer = DPOptimizerFastGradientClipping(
                optimizer, noise_multiplier=1.0, max_grad_norm=hp.max_grad_norm,
                expected_batch_size=plan.expected_batch_size, secure_mode=mode.endswith("-secure"))
        if mode == "ghost":
            model = GradSampleModuleFastGradientClipping(
                model, max_grad_norm=hp.max_grad_norm, use_ghost_clipping=True)
            criterion = DPLossFastGradientClipping(model, optimizer, criterion)

        # the algo's step takes the first layer's patch Grams that a train task
        # makes once, before its steps
        known = algo.data_grams(model, images) if mode.startswith("book-keeping") else None

        def step(x, y, known_rows=None, persons=None):
            optimizer.zero_grad()
            if mode.startswith("book-keeping"):  # the algo's: clipped sum in p.grad, then the noise
                algo.clip_and_sum(model, algo.as_input(x), torch.from_numpy(y), hp.max_grad_norm,
                                  None if known is None else (known[0], known_rows), persons)
            else:
                criterion(model(algo.as_input(x)), torch.from_numpy(y)).backward()
            optimizer.step()
        rows = None if known is None else known[1]
        batches = (fixed_batches(images, labels, hp, steps + WARMUP) if mode == "plain" else
                   person_batches(images, labels, plan, steps + WARMUP)
                   if mode.endswith("persons") else
                   poisson_batches(images, labels, plan, steps + WARMUP, rows=rows))
        return step, batches

    variants = {"Opacus per-example hooks (its default)": "hooks",
                "Opacus ghost clipping, 2 backward passes (before)": "ghost",
                "book-keeping, 1 backward pass (used)": "book-keeping",
                "the same, secure_mode noise": "book-keeping-secure",
                PER_PERSON: "book-keeping-persons"}
    return {PLAIN: make("plain"), **{name: make(mode) for name, mode in variants.items()}}


def time_tf(algo, images, labels, hp, plan, steps, network):
    import tensorflow as tf
    from tensorflow_privacy.privacy.fast_gradient_clipping import clip_grads

    def run(make_step, batches, model=None):
        model = model or algo.build_network(network)
        step = make_step(model, tf.keras.optimizers.SGD(hp.learning_rate, momentum=hp.momentum))
        return (lambda x, y, *rows: step(algo.as_input(x), tf.constant(y), *rows)), batches

    dp_model = algo.build_network(network)
    # its first layer's patch Grams, made once as a task makes them
    known = algo.data_grams(dp_model, images)

    def dp_step(model, optimizer):  # the algo's, at this C and σ = 1
        step = algo.make_dp_step(model, optimizer, plan.expected_batch_size,
                                 algo.noise_generator(RunRandomness.fresh()), None, None
                                 if known is None else known[0])
        return lambda x, y, rows=None: step(x, y, tf.constant(hp.max_grad_norm, tf.float32),
                                            tf.constant(1.0), rows)

    def person_step(model, optimizer):  # the algo's per person
        step = algo.make_dp_step(model, optimizer, plan.expected_batch_size / IMAGES_PER_PERSON,
                                 algo.noise_generator(RunRandomness.fresh()), per_person=True)
        return lambda x, y, rows, persons: step(x, y, tf.constant(hp.max_grad_norm, tf.float32),
                                                tf.constant(1.0), None, persons)

    # TF Privacy's own clipped-gradient routine, same noise and update
    def two_pass(model, optimizer):
        registry = algo.make_layer_registry()

        @tf.function(input_signature=algo.batch_spec(model))
        def step(x, y):
            grads, _, _ = clip_grads.compute_clipped_gradients_and_outputs(
                model, hp.max_grad_norm, registry, x, y, clipping_loss=lambda yt, yp,
                w: model.loss(yt, yp, w))
            optimizer.apply_gradients(
                [(g + tf.random.normal(tf.shape(g), stddev=hp.max_grad_norm), v)
                 for g, v in zip(grads, model.trainable_variables)])
        return step

    return {
        PLAIN: run(algo.make_plain_step, fixed_batches(images, labels, hp, steps + WARMUP)),
        "TF Privacy compute_clipped_gradients (2 passes)": run(
            two_pass, poisson_batches(images, labels, plan, steps + WARMUP)),
        "fast clipping + book-keeping (used)": run(
            dp_step, poisson_batches(images, labels, plan, steps + WARMUP, rows=None
                                     if known is None else known[1]), dp_model),
        PER_PERSON: run(person_step, person_batches(images, labels, plan, steps + WARMUP)),
    }


def time_mindspore(algo, images, labels, hp, plan, steps, network):
    from mindspore import nn

    class Conv2dNet(algo.networks.TutorialCNN):
        """The same network on MindSpore's own nn.Conv2d: what PatchConv2d replaced."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 8, stride=2, pad_mode="pad", padding=3, has_bias=True)
            self.conv2 = nn.Conv2d(16, 32, 4, stride=2, pad_mode="valid", has_bias=True)

        def construct(self, x):
            x = (x - interface.MNIST_MEAN) / interface.MNIST_STD
            x = self.pool(self.act(self.conv1(x)))
            x = self.pool(self.act(self.conv2(x)))
            return self.fc2(self.act(self.fc1(self.flatten(x))))

    def run(make_net, make_step, batches):
        net = make_net()
        step = make_step(net, nn.SGD(net.trainable_params(), learning_rate=hp.learning_rate,
                                     momentum=hp.momentum))

        # the algo's steps index a batch out of the whole set: give them this batch whole
        def timed(x, y, *rows):
            step(x, y.astype(np.int32), np.arange(len(y)), *rows)
            # GRAPH mode runs asynchronously: wait for the update
            net.trainable_params()[0].asnumpy()
        return timed, batches

    # the algo's, at this C and σ = 1, with the data rows a task makes first
    def dp(net, optimizer):
        noise = RunRandomness.fresh().numpy("gradient noise")
        step = algo.make_dp_step(net, optimizer, plan.expected_batch_size, noise)
        return lambda images, labels, batch, rows=None: step(
            images, labels, batch, hp.max_grad_norm, 1.0, rows)

    large, larger = chunks.chunk_sizes(plan.expected_batch_size)
    build = lambda: algo.networks.build_network(network)  # noqa: E731
    variants = {PLAIN: run(build, algo.make_plain_step,
                           fixed_batches(images, labels, hp, steps + WARMUP))}
    # the network PatchConv2d was measured on
    if network.features == "pixels" and network.network == "cnn":
        variants["non-private on nn.Conv2d (before; 8 steps)"] = run(
            Conv2dNet, algo.make_plain_step,
            fixed_batches(images, labels, hp, min(steps, 8) + WARMUP))
    dp_net = build()  # its data rows made once, as a task makes them
    variants[f"book-keeping per-example clipping, chunks of {large} or {larger} (used)"] = run(
        lambda: dp_net, dp, poisson_batches(images, labels, plan, steps + WARMUP,
                                            rows=algo.data_rows(dp_net, images)))
    person_net = build()
    person_step = algo.make_dp_step(
        person_net, nn.SGD(person_net.trainable_params(), learning_rate=hp.learning_rate,
                           momentum=hp.momentum), plan.expected_batch_size / IMAGES_PER_PERSON,
        RunRandomness.fresh().numpy("gradient noise"),
        persons=np.arange(plan.n) // IMAGES_PER_PERSON)

    def per_person(x, y, picked):  # the algo's step indexes the whole set, x = images[picked]
        person_step(images, labels.astype(np.int32), picked, hp.max_grad_norm, 1.0)
        person_net.trainable_params()[0].asnumpy()

    variants[PER_PERSON] = per_person, ((images[picked], labels[picked], picked)
                                        for picked in person_picks(plan, steps + WARMUP))
    return variants


TIMERS = {"torch": time_torch, "tf": time_tf, "mindspore": time_mindspore}


def step_variants(framework, steps, changes):
    """{variant: (step, batches)} of one framework: the asset's hyperparameters with `changes`, its
    network on the embedded data's inputs (scattering features are computed first, outside the
    timing)."""
    algo = load_algo(framework)
    hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME,
                              hyperparameters.Overrides(changes, "--set"))
    network = interface.Network.of(hp)
    images, labels = embedded_train_set()
    plan = task_plan.check_run(framework, hp, len(labels), "default")
    return TIMERS[framework](algo, network.inputs(images), labels, hp, plan, steps, network)


def measure_steps(framework, steps, changes):
    """In a child process: the step timings of one framework, and the process's peak RSS after
    them."""
    warnings.filterwarnings("ignore")
    timings = interleaved_medians(step_variants(framework, steps, changes))
    return timings, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_plain_steps(frameworks, steps, changes):
    """In a child process: every framework's non-private step, taking turns (all frameworks load in
    one process: their environment is one, docs/design.md)."""
    warnings.filterwarnings("ignore")
    return interleaved_medians({framework: step_variants(framework, steps, changes)[PLAIN]
                                for framework in frameworks})


def in_child(function, *args):
    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def print_steps(frameworks, steps, changes):
    described = ", ".join(f"{k} {json.dumps(v)}" for k, v in changes.items())
    print(f"\n## Steps: {os.cpu_count()} CPU(s), median of {steps} steps per variant, each asset's "
          "hyperparameters"
          + (f" with {described}" if described else ""))
    dp_ratios = {}
    for framework in frameworks:
        timings, peak_mb = in_child(measure_steps, framework, steps, changes)
        plain = timings[PLAIN]
        print(f"\n[{framework}] peak RSS of the timing process: {peak_mb:.0f} MB")
        print(f"  {'variant':<62}{'s/step':>9}{'× plain':>9}")
        for name, seconds in timings.items():
            print(f"  {name:<62}{seconds:>9.4f}{seconds / plain:>9.2f}")
            if name.endswith("(used)"):
                dp_ratios[framework] = seconds / plain
            elif name.endswith("(used per person)"):
                dp_ratios[framework + PERSON_SUFFIX] = seconds / plain
    plain = {}
    if "torch" in frameworks and len(frameworks) > 1:
        plain = in_child(measure_plain_steps, frameworks, steps, changes)
        print("\nnon-private steps against torch's, taking turns in one process:")
        for framework, seconds in plain.items():
            print(f"  {framework:<10}{seconds:>9.4f} s{seconds / plain['torch']:>8.2f}×")
    return plain, dp_ratios


def measure_features(rounds):
    """Seconds per image of kymatio's numpy transform and of features.py's, on the run's training
    images, taking turns `rounds` times: the median of each."""
    from mnist_dp.learning import features

    images = embedded_train_set()[0]
    variants = {"kymatio's numpy transform": features.kymatio_scattering,
                "features.py (used)": features.scattering_maps}
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, transform in variants.items():
            start = time.perf_counter()
            transform(images)
            times[name].append((time.perf_counter() - start) / len(images))
    return {name: statistics.median(seconds) for name, seconds in times.items()}


def print_features():
    """Prints the scattering transforms' times; returns features.py's speed-up over kymatio's."""
    timings = in_child(measure_features, FEATURES_ROUNDS)
    print(f"\n## Scattering features of the 4,000 training images, median of {FEATURES_ROUNDS} "
          "turns each")
    print(f"  {'transform':<30}{'ms/image':>10}{'60,000 images':>15}")
    for name, seconds in timings.items():
        print(f"  {name:<30}{seconds * 1e3:>10.3f}{seconds * 60_000:>13.1f} s")
    return timings["kymatio's numpy transform"] / timings["features.py (used)"]


PHASES = ("start", "setup", "features", "first step", "training", "loading model", "predict",
          "score", "saving")


def run_and_measure(command, env):
    """In a fresh child process (so that its only children are the command's): run the command;
    return its exit code, the end of its stderr, its wall time and the peak memory of its largest
    process."""
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    return (proc.returncode, proc.stderr, wall,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def print_default_run(data=None):
    """Runs scripts/run_local.py in a fresh folder (on `data`, if given); returns its wall time and
    the tasks' records."""
    print("\n## The default run: python scripts/run_local.py " + (
        f"--data {data} (fresh output folder, every asset built)" if data else
        "(fresh folder: data generated, every asset built)"))
    with tempfile.TemporaryDirectory(prefix="mnist-dp-benchmark-") as folder:
        records_file = Path(folder) / "timings.jsonl"
        command = [sys.executable, str(REPO / "scripts" / "run_local.py"), "--data",
                   str(data or f"{folder}/data"), "--output", f"{folder}/results"]
        returncode, stderr, wall, largest_mb = in_child(
            run_and_measure, command, {**os.environ, timing.TIMINGS_VARIABLE: str(records_file)})
        if returncode:
            sys.exit(f"error: run_local.py failed (exit {returncode}):\n{stderr[-3000:]}")
        records = [json_input.loads(line, str(records_file))
                   for line in records_file.read_text().splitlines()]
        results = json_input.read(Path(folder) / "results" / "results.json", "results file")

    print(f"\nwall time {wall:.1f} s ({wall / 60:.2f} min), {len(records)} tasks; seconds per task "
          "and phase (start = process start, imports and data loading; first step includes graph "
          "compilation and the first layer's patch Grams):")
    header = "".join(f"{phase:>10}"
                     for phase in ("start", "setup", "features", "1st step", "training", "load",
                                                      "predict", "score", "save"))
    print(f"  {'task':<26}{header}{'total':>9}{'peak MB':>9}")
    totals = dict.fromkeys(PHASES, 0.0)
    for record in records:
        name = " ".join(str(part) for part in (record["function"], record.get("framework") or "",
                                                 {True: "DP",
                                                  False: "baseline"}.get(record.get("dp"), ""))
                        if part)
        phases = record["phases"]
        cells = "".join(f"{phases[p]:>10.1f}" if p in phases else f"{'':>10}" for p in PHASES)
        print(f"  {name:<26}{cells}{sum(phases.values()):>9.1f}{record['peak_rss_mb']:>9.0f}")
        for phase, seconds in phases.items():
            totals[phase] += seconds
    in_tasks = sum(totals.values())
    print(f"  {'all tasks':<26}{''.join(f'{totals[p]:>10.1f}' for p in PHASES)}{in_tasks:>9.1f}")
    print("  outside the tasks (Substra: registration, archives, data copies; data generation): "
          f"{wall - in_tasks:.1f} s")
    print(f"  largest process of the run (run_local.py or a task): {largest_mb:.0f} MB")
    print("\naccuracy and ε of the run:")
    for result in results:
        epsilon = "∞" if result["epsilon"] is None else f"{result['epsilon']:.3f}"
        print(f"  {result['run']:<20} test accuracy {result['test_accuracy']:.4f}, ε (PLD) "
              f"{epsilon} at δ {result['delta']:g}, σ {result['noise_multiplier']:.3f}, "
              f"{result['steps']} steps")
    return wall, records


def print_targets(plain, dp_ratios, speedup, wall, records, data=None):
    print("\n## Targets")

    def line(what, value, limit, unit="", at_least=False):
        met = value >= limit if at_least else value <= limit
        print(f"  {'met   ' if met else 'MISSED'} {what}: {value:.2f}{unit} (target "
              f"{'≥' if at_least else '≤'} {limit}{unit})")

    if speedup is not None:
        line("scattering features, kymatio's time / features.py's", speedup, MIN_FEATURES_SPEEDUP,
             "×", at_least=True)

    if "torch" in plain and "mindspore" in plain:
        line("MindSpore plain step / torch plain step", plain["mindspore"] / plain["torch"],
             MAX_MINDSPORE_VS_TORCH, "×")
    for name, ratio in dp_ratios.items():
        line(f"{name} DP step / its plain step", ratio,
             MAX_PER_PERSON_RATIO if name.endswith(PERSON_SUFFIX) else MAX_DP_RATIO, "×")
    if wall is not None:
        if data is None:  # the embedded data's run; on other data only its tasks have targets
            line("default run", wall, MAX_RUN_SECONDS, " s")
        worst = max(records, key=lambda r: r["peak_rss_mb"])
        line(f"peak memory of a task ({worst['function']} {worst.get('framework') or ''})",
             worst["peak_rss_mb"], MAX_TASK_MB, " MB")
        for record in records:
            if record["function"] == "train" and record.get("dp"):
                line(f"DP train task {record.get('framework')}", sum(record["phases"].values()),
                     MAX_TRAIN_TASK_SECONDS, " s")


def main(argv=None):
    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS), default=None,
                        help="comma-separated, for the step timings (default: "
                             f"{','.join(ALGO_ASSETS)})")
    parser.add_argument("--steps", type=options.integer(1, MAX_TIMED_STEPS), default=None,
                        help=f"timed steps per variant (default: {TIMED_STEPS})")
    parser.add_argument("--skip-run", action="store_true",
                        help="only time the steps, not the default run")
    parser.add_argument("--skip-steps", action="store_true",
                        help="only the default run, not the step timings")
    parser.add_argument("--data", type=Path,
                        help="run the default run, DP only, on these data samples "
                             "(scripts/generate_data.py's output) instead of the embedded data")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a hyperparameter of every asset for the step timings (JSON "
                             "value), e.g. --set network=linear")
    args = parser.parse_args(argv)
    if args.skip_run and args.skip_steps:
        raise UserError("--skip-run with --skip-steps: nothing would be measured; drop one")
    if args.skip_steps:
        options.refuse_unused("with --skip-steps",
                              {"--frameworks": args.frameworks, "--steps": args.steps,
                                                    "--set": args.set})
    if args.skip_run:
        options.refuse_unused("with --skip-run", {"--data": args.data})
    if args.data is not None and not (args.data / "manifest.json").is_file():
        raise UserError(f"--data {args.data}: no manifest.json; write data samples there with "
                        "scripts/generate_data.py --output")
    changes = hyperparameters.parse_assignments(args.set)
    hyperparameters.refuse_keys(changes, set(changes) - set(TIMED_KEYS),
                                "the step timings use the network's keys and the step's "
                                f"({', '.join(TIMED_KEYS)}) only")
    plain, dp_ratios = ({}, {}) if args.skip_steps else print_steps(
        args.frameworks or list(ALGO_ASSETS), args.steps or TIMED_STEPS, changes)
    speedup = None if args.skip_steps else print_features()
    wall, records = (None, []) if args.skip_run else print_default_run(args.data)
    print_targets(plain, dp_ratios, speedup, wall, records, args.data)


if __name__ == "__main__":
    run_cli(main)
