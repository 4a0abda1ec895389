"""Speed and memory of a DP-SGD step against a non-private step, then accuracy and ε, per framework.

For each framework, in a fresh child process (so its peak memory is its own):
1. times optimizer steps (forward + backward + update) of the CNN at the default expected batch
   size: the non-private step and each DP variant, median over --steps Poisson-sampled batches;
   prints seconds per step, the ratio to the non-private step measured in the same run, and the
   process's peak RSS;
2. trains the asset's default hyperparameters (DP and non-private) on the embedded 4,000 / 1,000
   MNIST split and prints test accuracy and ε (PLD) at δ, and the accuracy gap to torch.

    python benchmarks/benchmark.py [--frameworks torch,tf] [--steps 30] [--skip-training]
"""
import argparse
import concurrent.futures
import multiprocessing
import os
import resource
import statistics
import time
import warnings

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from mnist_dp import data, training
from mnist_dp import hyperparameters as hp_file
from mnist_dp.assets import ALGO_ASSETS, load_asset_module
from mnist_dp.privacy import Ledger


def load_algo(framework):
    return load_asset_module(ALGO_ASSETS[framework] / "algo.py", f"algo_{framework}")


def embedded_split(seed=0):
    images, labels = data.load_embedded()
    (tr_x, tr_y), (te_x, te_y) = data.split_train_test(images, labels, 4000, 1000, seed)
    def scale(images):  # as the opener scales uint8 pixels
        return images.astype(np.float32) / 255.0

    return (scale(tr_x), tr_y.astype(np.int64)), (scale(te_x), te_y.astype(np.int64))


def median_seconds(step, batches, warmup=3):
    times = []
    for x, y in batches:
        start = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])


def poisson_batches(images, labels, plan, count, seed=0):
    """Batches as a DP train task samples them: each example in w.p. q = plan.sample_rate."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        picked = np.flatnonzero(rng.random(plan.n) < plan.sample_rate)
        yield images[picked], labels[picked]


def expected_batch_size(plan):
    return plan.n * plan.sample_rate  # E[B] = n·q, what a DP step divides the noisy sum by


def time_torch(algo, images, labels, hp, plan, steps):
    import torch
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    def make(mode):
        model = algo.SampleConvNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=hp.learning_rate, momentum=hp.momentum)
        criterion = torch.nn.CrossEntropyLoss()
        # Opacus' make_private rounds E[B] down to an int: the same here.
        if mode == "hooks":
            model = GradSampleModule(model)
            optimizer = DPOptimizer(optimizer, noise_multiplier=1.0, max_grad_norm=hp.max_grad_norm,
                                    expected_batch_size=int(expected_batch_size(plan)))
        elif mode.startswith("ghost"):  # "ghost-secure": with the secure_mode noise (4 Gaussian draws per weight)
            model = GradSampleModuleFastGradientClipping(model, max_grad_norm=hp.max_grad_norm, use_ghost_clipping=True)
            optimizer = DPOptimizerFastGradientClipping(optimizer, noise_multiplier=1.0, max_grad_norm=hp.max_grad_norm,
                                                        expected_batch_size=int(expected_batch_size(plan)),
                                                        secure_mode=mode == "ghost-secure")
            criterion = DPLossFastGradientClipping(model, optimizer, criterion)

        def step(x, y):
            optimizer.zero_grad()
            criterion(model(torch.from_numpy(x[:, None])), torch.from_numpy(y)).backward()
            optimizer.step()
        return step

    variants = {"non-private": "plain", "Opacus per-example hooks": "hooks",
                f"Opacus ghost clipping{' (used)' if algo.GRAD_SAMPLE_MODE == 'ghost' else ''}": "ghost",
                "Opacus ghost clipping, secure_mode noise": "ghost-secure"}
    return {name: median_seconds(make(mode), poisson_batches(images, labels, plan, steps + 3))
            for name, mode in variants.items()}


def time_tf(algo, images, labels, hp, plan, steps):
    import tensorflow as tf
    from tensorflow_privacy.privacy.fast_gradient_clipping import clip_grads

    def run(make_step):
        model = algo.build_model(0)
        step = make_step(model, tf.keras.optimizers.SGD(hp.learning_rate, momentum=hp.momentum))
        return median_seconds(lambda x, y: step(tf.constant(x[..., None]), tf.constant(y)),
                              poisson_batches(images, labels, plan, steps + 3))

    def two_pass(model, optimizer):  # TF Privacy's own clipped-gradient routine, same noise and update
        registry = algo.make_layer_registry()

        @tf.function(input_signature=algo.BATCH_SPEC)
        def step(x, y):
            grads, _, _ = clip_grads.compute_clipped_gradients_and_outputs(
                model, hp.max_grad_norm, registry, x, y, clipping_loss=lambda yt, yp, w: model.loss(yt, yp, w))
            optimizer.apply_gradients(
                [(g + tf.random.normal(tf.shape(g), stddev=hp.max_grad_norm), v)
                 for g, v in zip(grads, model.trainable_variables)])
        return step

    return {
        "non-private": run(algo.make_plain_step),
        "TF Privacy compute_clipped_gradients (2 passes)": run(two_pass),
        "fast clipping + book-keeping (used)": run(
            lambda m, o: algo.make_dp_step(m, o, hp.max_grad_norm, 1.0, expected_batch_size(plan))),
    }


def time_mindspore(algo, images, labels, hp, plan, steps):
    import mindspore as ms
    from mindspore import nn

    def fresh():
        net = algo.SampleConvNet()
        return net, nn.SGD(net.trainable_params(), learning_rate=hp.learning_rate, momentum=hp.momentum)

    net, optimizer = fresh()
    plain = algo.make_plain_step(net, optimizer)
    rng = np.random.default_rng(0)
    # GRAPH mode compiles per input shape: the plain step gets fixed batches of the expected size.
    size = round(expected_batch_size(plan))
    fixed = ((x, y) for x, y in ((images[i], labels[i]) for i in
                                 (rng.choice(plan.n, size, replace=False) for _ in range(steps + 3))))
    plain_seconds = median_seconds(
        lambda x, y: plain(ms.Tensor(x[:, None]), ms.Tensor(y.astype(np.int32))).asnumpy(), fixed)

    net, optimizer = fresh()
    clipped_sum = algo.ClippedGradientSum(net, optimizer.parameters, hp.max_grad_norm)
    update = algo.NoisyUpdate(optimizer, hp.max_grad_norm, 1.0, expected_batch_size(plan), 0)

    def dp_step(x, y):
        total = None
        for index, mask in algo.padded_chunks(np.arange(len(y)), algo.CHUNK_SIZE):
            part = clipped_sum(ms.Tensor(x[index][:, None]), ms.Tensor(y[index].astype(np.int32)), ms.Tensor(mask))
            total = part if total is None else tuple(a + b for a, b in zip(total, part))
        update(total)
        total[0].asnumpy()  # wait for the asynchronous graph to finish

    return {"non-private (fixed batch)": plain_seconds,
            f"vmap per-example clipping, {algo.CHUNK_SIZE}-example chunks (used)": median_seconds(
                dp_step, poisson_batches(images, labels, plan, steps + 3))}


TIMERS = {"torch": time_torch, "tf": time_tf, "mindspore": time_mindspore}


def train_default(algo, framework, train, test, hp):
    """One train task's run, through the training skeleton (fresh model, no input ledger)."""
    plan = training.check_run(framework, hp, len(train[1]), "default")
    sigma = training.resolve_noise_multiplier(hp, plan, [])
    model = algo.FRAMEWORK.new_model(hp.seed)
    start = time.perf_counter()
    result = training.fit(algo.FRAMEWORK, model, *train, hp, plan, sigma, lambda steps: "")
    seconds = time.perf_counter() - start
    accuracy = float(np.mean(training.predicted_labels(algo.FRAMEWORK, model, test[0]) == test[1]))
    event = training.dp_event(framework, ("train",), hp, plan, result)
    return {"dp": hp.dp, "sigma": sigma, "steps": result.steps, "test_accuracy": accuracy,
            "epsilon": Ledger([event]).epsilon(hp.delta), "delta": hp.delta, "train_seconds": seconds,
            "library_epsilon": result.library_epsilon}


def measure(framework, steps, skip_training):
    """Runs in a child process: timings, peak RSS after them, then the default-config training."""
    warnings.filterwarnings("ignore")
    algo = load_algo(framework)
    hp = hp_file.load(ALGO_ASSETS[framework] / hp_file.FILE_NAME)
    train, test = embedded_split()
    plan = training.check_run(framework, hp, len(train[1]), "default")
    timings = TIMERS[framework](algo, *train, hp, plan, steps)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    runs = [] if skip_training else [
        train_default(algo, framework, train, test, hp_file.parse({**hp.to_json(), "dp": dp}, "default"))
        for dp in (True, False)]
    return timings, peak_mb, runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=",".join(ALGO_ASSETS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant (default: %(default)s)")
    parser.add_argument("--skip-training", action="store_true", help="only time the steps")
    args = parser.parse_args(argv)
    frameworks = [f for f in args.frameworks.split(",") if f]
    accuracy = {}
    print(f"{os.cpu_count()} CPU(s), median of {args.steps} Poisson-sampled steps per variant, expected batch from "
          "each asset's hyperparameters.json")
    for framework in frameworks:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            timings, peak_mb, runs = pool.submit(measure, framework, args.steps, args.skip_training).result()
        base = next(seconds for name, seconds in timings.items() if name.startswith("non-private"))
        print(f"\n[{framework}] peak RSS of the timing process: {peak_mb:.0f} MB")
        print(f"  {'variant':<50}{'s/step':>9}{'ratio':>8}")
        for name, seconds in timings.items():
            print(f"  {name:<50}{seconds:>9.4f}{seconds / base:>8.2f}")
        for run in runs:
            extra = "".join(f", {k}: {v:.3f}" for k, v in run["library_epsilon"].items())
            print(f"  default config, dp={run['dp']}: test accuracy {run['test_accuracy']:.4f}, σ {run['sigma']:.3f}, "
                  f"{run['steps']} steps, ε (PLD) {run['epsilon']:.3f} at δ {run['delta']:g}{extra}, "
                  f"{run['train_seconds']:.1f} s")
            if run["dp"]:
                accuracy[framework] = run["test_accuracy"]
    if "torch" in accuracy:
        for framework, value in accuracy.items():
            if framework != "torch":
                print(f"\n{framework} vs torch test accuracy (DP, same hyperparameters and data): "
                      f"{100 * (value - accuracy['torch']):+.1f} points")


if __name__ == "__main__":
    main()
