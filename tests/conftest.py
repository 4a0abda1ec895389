"""Shared fixtures: tiny data, tiny hyperparameters, and running a function the way Substra does."""
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from warm_python import WarmServer

from mnist_dp.assets import ALGO_ASSETS, DATASET_ASSET, OBJECTIVE_ASSET
from mnist_dp.data import dataset
from mnist_dp.learning import interface
from mnist_dp.orchestration import archive
from mnist_dp.privacy.data_ledger import LEDGER_FILE
from mnist_dp.privacy.events import NO_CLIPPING, PER_EXAMPLE, DpEvent
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.report import results

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
FRAMEWORKS = sorted(ALGO_ASSETS)
# One epoch on a few hundred images: enough to exercise every code path in seconds.
TINY_HYPERPARAMETERS = {"epochs": 1, "batch_size": 64, "noise_multiplier": 1.0,
                        "target_epsilon": None, "delta": 1e-4}


# The fast loop, `python -m pytest tests -m "not slow"` (under two minutes), runs everything that
# needs no training, no Substra function and no Docker: these folders hold nothing else, and a test
# elsewhere that does is marked itself, as are the few tests that take over 10 s each.
SLOW_FOLDERS = ("assets", "federated", "scripts", "benchmarks")
SLOW_MODULES = ("test_dockerfile.py",)
# Docker-free tests that keep both workers busy while .ci/docker-up runs on a new machine.
BEFORE_DOCKER = ("test_algos.py",)


def is_slow(path: Path) -> bool:
    """Whether every test of the module (or folder) at `path` is slow."""
    where = Path(path).relative_to(REPO / "tests").parts
    return bool(where) and (where[0] in SLOW_FOLDERS or where[-1] in SLOW_MODULES)


def pytest_ignore_collect(collection_path, config):
    """The fast loop does not import the slow modules: importing their frameworks was most of its
    collection time, for tests it deselects anyway."""
    if config.getoption("markexpr") == "not slow" and collection_path.is_relative_to(
            REPO / "tests") and is_slow(collection_path):
        return True
    return None


# before xdist's, which names each test by the xdist_group marked here
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if is_slow(item.fspath):
            item.add_marker(pytest.mark.slow)
    groups = shared_runs(items)
    for group, members in groups.items():
        for item in members:
            item.add_marker(pytest.mark.xdist_group(group))
    # The longest first, so that no worker starts an 8-minute Docker test while the other has
    # nothing left (xdist hands them out in this order): the bundle's image, the other Docker
    # tests, the slow ones, the fast ones; but BEFORE_DOCKER ahead of them all, while CI's
    # docker-up runs beside the tests. A group moves as one, its tests kept together: a worker
    # runs its tests in this order, and a test of another module in between would tear the group's
    # run down, to be made again.
    def cost(item):
        name = Path(item.fspath).name
        return (name not in BEFORE_DOCKER, name not in SLOW_MODULES,
                "docker_daemon" not in item.fixturenames, item.get_closest_marker("slow") is None)

    group_of = {id(item): group for group, members in groups.items() for item in members}
    first = {}  # group -> (its costliest test's cost, where its first test was)
    for position, item in enumerate(items):
        group = group_of.get(id(item), position)
        first[group] = min(first.get(group, (cost(item), position)), (cost(item), position))
    order = {id(item): (*first[group_of.get(id(item), position)], position) for position,
             item in enumerate(items)}
    items.sort(key=lambda item: order[id(item)])


def shared_runs(items):
    """The tests run in parallel (pytest-xdist, `--dist loadgroup` in pyproject.toml). Tests that
    share a module-scoped fixture (a training run, a plan), directly or through another test, must
    go to one worker, so that the run is made once: this groups them, each group named by one of its
    fixtures."""
    group_of = {}  # a fixture, with its parameter, -> the group that holds it
    groups = {}  # group name -> its tests
    for item in items:
        callspec = getattr(item, "callspec", None)
        shared = [
            f"{item.module.__name__}:{name}={callspec.params.get(name, '') if callspec else ''}"
                  for name, definitions in item._fixtureinfo.name2fixturedefs.items()
                  if definitions[-1].scope == "module"]
        if not shared:
            continue
        names = {group_of.get(fixture, fixture) for fixture in shared}
        name = min(names)
        groups[name] = [item, *(member for other in names for member in groups.pop(other, []))]
        for fixture, group in list(group_of.items()):
            if group in names:
                group_of[fixture] = name
        group_of.update(dict.fromkeys(shared, name))
    return groups


def pytest_configure(config):
    # One OpenMP thread in each test worker and the processes it starts (the workers are one per
    # core): two workers each spinning two threads on two cores oversubscribe them.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def docker_daemon():
    """A Docker daemon to build and run the functions' images. Where none answers the test is
    skipped (one line, saying how to start one), except on CI (CI=true), where the docker tests must
    run."""
    import docker

    wait_for_ci_docker_up()
    try:
        return docker.from_env().ping()
    except docker.errors.DockerException as exc:
        reason = (f"no Docker daemon answers ({type(exc).__name__}); bash .ci/docker-up starts one "
                  "on our machines")
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: on CI the docker tests must run")
        pytest.skip(reason)


def wait_for_ci_docker_up(timeout: float = 900.0) -> None:
    """On CI, wait until .ci/docker-up, which .ci/run starts beside the tests, has finished (its
    status file in $MNIST_DP_CI_STATE); fail with its log's last lines if it failed. Elsewhere,
    return at once."""
    state = os.environ.get("MNIST_DP_CI_STATE")
    if not state or not (Path(state) / "docker-up.log").exists():
        return
    status, deadline = Path(state) / "docker-up.status", time.monotonic() + timeout
    while not status.exists():
        if time.monotonic() > deadline:
            pytest.fail(f".ci/docker-up has not finished after {timeout:.0f} s")
        time.sleep(2)
    if status.read_text().strip() != "0":
        log = (Path(state) / "docker-up.log").read_text(errors="replace")
        pytest.fail(".ci/docker-up failed; its log ends:\n" + "\n".join(log.splitlines()[-20:]))


SHARED_DATA = []  # the session's data folders, which many tests train on


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """300 train examples in 2 data samples, 100 test examples, from the embedded MNIST subset."""
    dest = tmp_path_factory.mktemp("data") / "tiny"
    dataset.generate(dest, train_size=300, test_size=100, train_samples=2, seed=1)
    SHARED_DATA.append(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_data_2orgs(tmp_path_factory):
    """The same examples as tiny_data for two organisations, as a deployment has them: each
    organisation's sample under its own identity key, the test set under a third."""
    dest = tmp_path_factory.mktemp("data") / "tiny-federated"
    dataset.generate(dest, train_size=300, test_size=100, train_samples=2, seed=1, organizations=2)
    SHARED_DATA.append(dest)
    return dest


NEIGHBOURS_PUBLIC_SIZE = 200


@pytest.fixture(scope="session")
def neighbours(tmp_path_factory):
    """{name: data folder}: D (201 train images in one sample) and D minus its last image, both
    declaring the public size 200: neighbouring data sets on either side of a batch boundary at a
    batch of 50; both with D's test set."""
    from mnist_dp.data.samples import IMAGES_FILE, LABELS_FILE, read_key
    from mnist_dp.privacy import policy

    root = tmp_path_factory.mktemp("neighbours")
    dataset.generate(root / "D", train_size=NEIGHBOURS_PUBLIC_SIZE + 1, test_size=50,
                     train_samples=1, seed=5)
    whole = root / "D" / "train" / "0"
    policy.declare_size(whole, NEIGHBOURS_PUBLIC_SIZE)
    less = root / "D-1" / "train" / "0"
    dataset.write_sample(less, np.load(whole / IMAGES_FILE)[:-1], np.load(whole / LABELS_FILE)[:-1],
                         read_key(whole))
    policy.declare_size(less, NEIGHBOURS_PUBLIC_SIZE)
    shutil.copytree(root / "D" / "test", root / "D-1" / "test")
    SHARED_DATA.extend([root / "D", root / "D-1"])
    return {"D": root / "D", "D-1": root / "D-1"}


# What may differ between D and D - 1 (`neighbours`) in a released text: a keyed id (a data sample's
# identity, 64 hex digits, shown by its first 8; a run's random id, 32), a compute plan's key, the
# time of day and how long things took, and the data folders the two runs were given.
MASKS = [
    (r"\b[0-9a-f]{64}\b|\b[0-9a-f]{32}\b|\b[0-9a-f]{8}…", "<id>"),
    (r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", "<plan>"),
    (r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?", "<when>"),
    (r"\d+(\.\d+)? ?(s|MB)\b|\d+(\.\d+)?s/it|\d\d:\d\d", "<time>"),
    (r"(D-1|D)\b", "<data>"),
]


def masked(text: str) -> str:
    """`text` with what MASKS names masked."""
    for pattern, mask in MASKS:
        text = re.sub(pattern, mask, text)
    return text


@pytest.fixture(autouse=True)
def nothing_spent_on_the_shared_data():
    """After each test, the session's data folders lose the runs their own ledgers recorded
    (data_ledger.py): each test starts from data nothing was released from, as the data it was
    written for. Tests of what the data's ledger does across runs make data of their own."""
    yield
    for folder in SHARED_DATA:
        for ledger in folder.glob(f"*/*/{LEDGER_FILE}"):
            ledger.unlink()


# Runs a command as root without the capabilities that let root write anywhere: a
# folder of mode 0o555 is then read-only to it, as it would be to a user (tests run as
# root in CI and in the image).
WITHOUT_WRITE_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                          "--inh-caps=-dac_override,-dac_read_search", "--"]


def ledger_event(framework="torch", data=("fp-a",), n=100, batch_size=10, sigma=1.0, epochs=1,
                 steps=None, library_epsilon=(), archive_digest=None):
    """A ledger event as a train task writes it (provenance included), for tests that build model
    files."""

    steps_per_epoch = -(-n // batch_size)
    return DpEvent(framework, tuple(data), n, 1 / steps_per_epoch, sigma, steps
                   or steps_per_epoch * epochs, PER_EXAMPLE if sigma else NO_CLIPPING, 1.0,
                           tuple(library_epsilon), batch_size, steps_per_epoch * epochs,
                           {"function": "train", "archive_digest": archive_digest})


def dp_event(n=60000, batch=250, epochs=60, sigma=1.1, data=("a",)):
    """A DP event of `epochs` epochs at q = 1 / ceil(n / batch), for tests that compute an ε."""
    steps_per_epoch = -(-n // batch)
    return DpEvent("torch", tuple(data), n, 1 / steps_per_epoch, sigma, steps_per_epoch * epochs,
                   PER_EXAMPLE, 1.0, (), batch, steps_per_epoch * epochs,
                   {"function": "train", "archive_digest": None})


def save_model(path, events, weights=b"weights", examples=None, **settings):
    """A model file whose metadata agrees with its last event, as a train task writes it (its
    ledger's examples `examples`, {identity: Examples}, released as a task releases them)."""
    from mnist_dp.privacy import model_file

    last = events[-1]
    hyperparameters = {"delta": 1e-5, "max_epsilon": None, "secure_mode": False, "noise_seed": None,
                       "batch_size": last.batch_size, "max_grad_norm": last.max_grad_norm,
                       "noise_multiplier": last.noise_multiplier,
                       "planned_steps": last.planned_steps,
                       "stopped_by_budget": last.steps < last.planned_steps, **settings}
    model_file.save(path,
                    model_file.ModelFile(last.framework, weights, Ledger(events, examples),
                                         hyperparameters))
    return path


# Every hyperparameter, for tests of the skeleton and the privacy plan without an asset's file.
BASE_HP = {"epochs": 2, "batch_size": 50, "learning_rate": 0.1, "momentum": 0.9,
           "max_grad_norm": 1.0, "noise_multiplier": None, "target_epsilon": 2.0,
           "max_epsilon": None, "delta": 1e-5, "seed": 0, "dp": True, "secure_mode": False,
           "features": "pixels", "network": "cnn", "activation": "tanh", "optimizer": "sgd",
           "ema_decay": 0.0, "noise_decay": 1.0, "clip_quantile": None, "clip_learning_rate": 0.2,
           "clip_count_stddev": None, "noise_seed": None}


def fresh_python(script: str, **env: str) -> subprocess.CompletedProcess:
    """`script` run by this Python in a new process, with this environment and `env`: for what
    only a process's start shows (what an import does, which implementation it picks)."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def independent_epsilon(sigma, q, steps, delta):
    """ε of `steps` Poisson-subsampled Gaussian steps at (σ, q), from dp_accounting alone: none of
    our accounting."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return pld_privacy_accountant.PLDAccountant().compose(event).get_epsilon(delta)


def dict_hp(**changes):
    """BASE_HP with `changes`, parsed as a hyperparameters file is."""
    from mnist_dp import hyperparameters

    return hyperparameters.parse({**BASE_HP, **changes}, "x")


def rewrite_member(path, member, edit):
    """Edit one JSON member of a model file in place, as a user with a zip tool and an editor
    would."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members[member] = json.dumps(edit(json.loads(members[member]))).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)


def ledger_edit(field, value):
    def edit(ledger):
        ledger["events"][-1][field] = value
        return ledger
    return edit


def tiny_hyperparameters(framework, **changes):
    path = ALGO_ASSETS[framework] / "hyperparameters.json"
    return {**json.loads(path.read_text()), **TINY_HYPERPARAMETERS, **changes}


def extract_function(asset_dir, function, dest, hyperparameters=None):
    """Build the function's archive as run_local does and unpack it; returns the folder."""
    replace = None
    if hyperparameters is not None:
        replace = {"hyperparameters.json": json.dumps(hyperparameters).encode()}
    tar_path = archive.build(asset_dir, function, Path(dest) / f"{function}.tar.gz", replace)
    folder = Path(dest) / function
    with tarfile.open(tar_path) as tar:
        tar.extractall(folder, filter="data")
    return folder


WARM_SERVERS: dict[tuple, WarmServer] = {}


def run_python(args, cwd=None) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *args], capture_output=True, text=True, cwd=cwd)`, forked from a
    process that has imported the libraries a script of `args[0]`'s code imports (warm_python.py),
    in this environment."""
    args, script = [str(arg) for arg in args], Path(cwd or ".", args[0])
    # pytest names the running test in the environment: not a difference for the script
    environment = {name: value for name, value in os.environ.items()
                   if name != "PYTEST_CURRENT_TEST"}
    key = (hashlib.sha256(script.read_bytes()).hexdigest(), tuple(sorted(environment.items())))
    if key not in WARM_SERVERS:
        WARM_SERVERS[key] = WarmServer(environment)
    return WARM_SERVERS[key].run(args, cwd or os.getcwd())


def pytest_sessionfinish(session):
    for warm in WARM_SERVERS.values():
        warm.close()


def run_function(script, function, inputs, outputs, check=True, cwd=None, log_level="warning"):
    """Run a substratools function through its command line, as Substra's subprocess mode does (from
    the script's folder, or `cwd`), logging at `log_level`."""
    def resources(mapping, multiple_ids):
        out = []
        for identifier, value in mapping.items():
            values = value if isinstance(value, list) else [value]
            multiple = identifier in multiple_ids
            out += [{"id": identifier, "value": str(v), "multiple": multiple} for v in values]
        return json.dumps(out)

    args = [script, "--function-name", function, "--inputs",
            resources(inputs, ("datasamples", "models", "ledger")), "--outputs",
            resources(outputs, ()), "--log-level", log_level]
    proc = run_python(args, cwd or Path(script).parent)
    if check and proc.returncode != 0:
        raise AssertionError(f"{function} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def assert_one_line_error(proc, *fragments):
    """A function or script that exited 2 with one `error:` line, holding every fragment, and no
    traceback."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0]


def samples(data_dir, split):
    return [str(p) for p in dataset.sample_folders(data_dir, split)]


@pytest.fixture
def opener_path():
    return str(DATASET_ASSET / "opener.py")


@pytest.fixture
def objective_script():
    return OBJECTIVE_ASSET / "metrics.py"


@pytest.fixture
def tmpfs(tmp_path):
    """mount(options) -> a folder on a new tmpfs mounted with `options` ("size=1m", "ro"): a real
    full disk or read-only file system. Unmounted at the end; skipped where mounting is not
    permitted (root without CAP_SYS_ADMIN, or not root)."""
    mounted = []

    def mount(options):
        folder = tmp_path / f"tmpfs-{len(mounted)}"
        folder.mkdir()
        try:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                                  capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("no mount command here: cannot make a small file system for this test")
        if proc.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip()}): it needs "
                        "root with CAP_SYS_ADMIN")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], check=True)


def fill_disk(folder):
    """Fill the file system of `folder` to its last byte (with a file named "filler")."""
    import errno

    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def follow_advice(message: str) -> None:
    """Do literally what an error message advises: remove the files it names ("remove A B, then")
    and run the python command it gives (from the repository's root, as the README's commands run),
    which must succeed."""
    removed = re.search(r"remove (.+?), then", message)
    if removed:
        for path in shlex.split(removed.group(1)):
            os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    command = re.search(r"(python scripts/\S+\.py.*?)(?:;|$)", message)
    assert command, f"no command to follow in: {message}"
    proc = subprocess.run([sys.executable, *shlex.split(command.group(1))[1:]], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"{command.group(1)}: {proc.stderr}"


class StepsThatLearnNothing(interface.Framework):
    """The training hooks of a framework that needs no ML library: its steps change nothing and clip
    nothing. Tests' fake frameworks subclass it and fill in what they look at."""

    name = "torch"

    def optimizer(self, model, training):
        return None

    def dp_step(self, model, optimizer, inputs, labels, step):
        return lambda batch, max_grad_norm, noise_multiplier: 0

    def plain_step(self, model, optimizer, inputs, labels):
        return lambda batch: None

    def end_training(self, model, optimizer, training):
        pass

    def library_epsilon(self, sampling, delta, steps, sigma):
        return {}


def report_files(folder: Path) -> dict:
    """{path in `folder`: bytes} of the reports a run writes in its output folder (results.REPORTS),
    its lock and Substra's work files left out."""
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.relative_to(folder).parts[0] in results.REPORTS}
