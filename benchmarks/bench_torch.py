"""Speed of a DP-SGD step against a non-private step (same model, same run), then the default config.

1. Times optimizer steps (forward + backward + step) of the SampleConvNet at the default expected
   batch size: plain SGD, Opacus with per-example gradient hooks (its default), Opacus ghost clipping.
   Prints seconds per step and the ratio to the non-private step measured in the same run.
2. Trains the asset's default hyperparameters (DP and non-private baseline) on the embedded data and
   prints test accuracy and ε (PLD, δ from the config).

    python benchmarks/bench_torch.py [--steps 30] [--skip-training]
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from mnist_dp import data, training  # noqa: E402
from mnist_dp import hyperparameters as hp_file  # noqa: E402
from mnist_dp.plan import ALGO_ASSETS  # noqa: E402
from mnist_dp.privacy import DpEvent, Ledger  # noqa: E402


def load_algo():
    spec = importlib.util.spec_from_file_location("algo_torch_dp", ALGO_ASSETS["torch"] / "algo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def embedded_split(seed=0):
    images, labels = data.load_embedded()
    (tr_x, tr_y), (te_x, te_y) = data.split_train_test(images, labels, 4000, 1000, seed)
    as_float = lambda x: (x.astype(np.float32) / 255.0)  # noqa: E731 - the opener's scaling
    return (as_float(tr_x), tr_y.astype(np.int64)), (as_float(te_x), te_y.astype(np.int64))


def seconds_per_step(algo, mode, images, labels, hp, steps, warmup=3):
    model = algo.SampleConvNet()
    dataset = TensorDataset(torch.from_numpy(images[:, None]), torch.from_numpy(labels))
    loader = DataLoader(dataset, batch_size=hp.batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=hp.learning_rate, momentum=hp.momentum)
    criterion = nn.CrossEntropyLoss()
    if mode != "non-private":
        from opacus import PrivacyEngine

        private = PrivacyEngine().make_private(
            module=model, optimizer=optimizer, criterion=criterion, data_loader=loader, noise_multiplier=1.0,
            max_grad_norm=hp.max_grad_norm, poisson_sampling=True, grad_sample_mode=mode)
        model, optimizer, *rest = private
        criterion, loader = rest if mode == "ghost" else (criterion, rest[0])
    times = []
    while len(times) < steps + warmup:
        for x, y in loader:
            start = time.perf_counter()
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            times.append(time.perf_counter() - start)
            if len(times) == steps + warmup:
                break
    return statistics.median(times[warmup:])


def train_default(algo, train, test, hp):
    plan = training.SamplingPlan.from_hyperparameters(len(train[1]), hp, "default")
    sigma = training.resolve_noise_multiplier(hp, plan, [])
    model = algo.FRAMEWORK.new_model(hp.seed)
    start = time.perf_counter()
    result = algo.FRAMEWORK.fit(model, *train, hp, plan, sigma, lambda steps: "")
    seconds = time.perf_counter() - start
    accuracy = float(np.mean(algo.FRAMEWORK.predict(model, test[0]) == test[1]))
    event = DpEvent("torch", ("train",), plan.n, result.sample_rate, result.noise_multiplier, result.steps,
                    result.clipping, hp.max_grad_norm)
    return {"dp": hp.dp, "sigma": sigma, "steps": result.steps, "test_accuracy": accuracy,
            "epsilon": Ledger([event]).epsilon(hp.delta), "delta": hp.delta, "train_seconds": seconds,
            **{k: v for k, v in result.library_epsilon.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per mode (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--skip-training", action="store_true", help="only time the steps")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    algo = load_algo()
    hp = hp_file.load(ALGO_ASSETS["torch"] / hp_file.FILE_NAME)
    train, test = embedded_split()

    print(f"torch {torch.__version__}, {args.threads} thread(s), expected batch {hp.batch_size}, "
          f"median of {args.steps} steps")
    baseline = seconds_per_step(algo, "non-private", *train, hp, args.steps)
    print(f"{'mode':<28}{'s/step':>10}{'ratio':>8}")
    print(f"{'non-private SGD':<28}{baseline:>10.4f}{1:>8.2f}")
    for mode, label in (("hooks", "Opacus hooks (default)"), ("ghost", "Opacus ghost clipping")):
        seconds = seconds_per_step(algo, mode, *train, hp, args.steps)
        marker = "  <- used by the asset" if mode == algo.GRAD_SAMPLE_MODE else ""
        print(f"{label:<28}{seconds:>10.4f}{seconds / baseline:>8.2f}{marker}")

    if not args.skip_training:
        print("\ndefault hyperparameters, 4,000 train / 1,000 test embedded MNIST images:")
        for dp in (True, False):
            record = train_default(algo, train, test, hp_file.parse({**hp.to_json(), "dp": dp}, "default"))
            print(json.dumps(record))


if __name__ == "__main__":
    main()
