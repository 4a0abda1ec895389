import ast
import importlib.metadata
import re
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ALGO_ASSETS, DATASET_ASSET, OBJECTIVE_ASSET, REPO
from substra.sdk.backends.local.compute.spawner.subprocess import _get_entrypoint_from_dockerfile

from mnist_dp.orchestration import archive
from mnist_dp.utils.errors import UserError

FUNCTIONS = [(ALGO_ASSETS[f], fn) for f in sorted(ALGO_ASSETS)
             for fn in ("train", "predict", "aggregate", "tune")] + [
    (OBJECTIVE_ASSET, "score")]


@pytest.mark.parametrize("asset, function", FUNCTIONS, ids=lambda v: getattr(v, "name", v))
def test_archive_is_self_contained_and_substra_reads_its_entrypoint(tmp_path, asset, function):
    path = archive.build(asset, function, tmp_path / "f.tar.gz")
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path / "x", filter="data")
    script, name = _get_entrypoint_from_dockerfile(tmp_path / "x")  # substra's own parser
    assert name == function and script in names
    assert "mnist_dp/__init__.py" in names and "mnist_dp/utils/errors.py" in names
    # every shared module imported, transitively, is inside, with the __init__ of each subpackage
    needed = archive.shared_modules([tmp_path / "x" / script])
    assert {f"mnist_dp/{m}" for m in needed} <= names
    packages = {n.rsplit("/", 1)[0] for n in names if n.startswith("mnist_dp/")}
    assert {f"{package}/__init__.py" for package in packages} <= names
    assert not any(n.startswith("Dockerfile.") or n == "description.md" for n in names)
    assert (
        tmp_path / "x" / "Dockerfile").read_bytes() == archive.function_dockerfile(asset, function)


def test_every_asset_has_one_dockerfile_with_one_exec_form_entrypoint():
    for asset in {asset for asset, _ in FUNCTIONS}:
        dockerfile = archive.dockerfile_path(asset)
        text = dockerfile.read_text()
        assert text.count("ENTRYPOINT") == 1, dockerfile
        assert [line for line in text.splitlines() if line.startswith("FROM")] == [
            "FROM python:3.11.7-slim-bookworm"], dockerfile
        assert not list(asset.glob("Dockerfile.*")), asset


def test_each_functions_dockerfile_is_the_assets_but_for_the_function_it_runs():
    for asset, function in FUNCTIONS:
        made = archive.function_dockerfile(asset, function).decode()
        own = archive.dockerfile_path(asset).read_text()
        assert made.count(f'"--function-name", "{function}"') == 1
        assert made.splitlines()[:-1] == own.splitlines()[:-1] and made.splitlines()[-1].startswith(
            "ENTRYPOINT")


def test_hyperparameters_can_be_replaced(tmp_path):
    asset = ALGO_ASSETS[sorted(ALGO_ASSETS)[0]]
    path = archive.build(asset, "train", tmp_path / "f.tar.gz", {"hyperparameters.json": b"{}"})
    with tarfile.open(path) as tar:
        assert tar.extractfile("hyperparameters.json").read() == b"{}"
    with pytest.raises(UserError, match="no such file"):
        archive.build(asset, "train", tmp_path / "g.tar.gz", {"nope.json": b""})
    # a file the asset does not have is added (a search file), never in place of one it has
    path = archive.build(asset, "tune", tmp_path / "h.tar.gz", add={"search.json": b"{}"})
    with tarfile.open(path) as tar:
        assert tar.extractfile("search.json").read() == b"{}"
    with pytest.raises(UserError, match="cannot add"):
        archive.build(asset, "tune", tmp_path / "i.tar.gz", add={"hyperparameters.json": b"{}"})


def test_bad_entrypoint_is_refused(tmp_path):
    (tmp_path / "algo.py").write_text("")
    with pytest.raises(UserError, match="missing"):
        archive.build(tmp_path, "train", Path(tmp_path) / "a.tar.gz")
    (tmp_path / "Dockerfile").write_text('ENTRYPOINT python3 algo.py --function-name train\n')
    with pytest.raises(UserError, match="ENTRYPOINT must look like"):
        archive.build(tmp_path, "train", tmp_path / "a.tar.gz")
    (tmp_path / "Dockerfile").write_text('ENTRYPOINT ["python3", "other.py", "--function-name", '
                                         '"train"]\n')
    with pytest.raises(UserError, match="'other.py' is not in"):
        archive.build(tmp_path, "train", tmp_path / "a.tar.gz")
    (tmp_path / "Dockerfile").write_text('ENTRYPOINT ["python3", "algo.py", "--function-name", '
                                         '"train"]\n')
    with pytest.raises(UserError, match="no function 'fit' in the contract"):
        archive.build(tmp_path, "fit", tmp_path / "a.tar.gz")


def test_unchanged_archives_are_byte_identical(tmp_path):  # so the keys file recognises them
    a = archive.build(OBJECTIVE_ASSET, "score", tmp_path / "a.tar.gz").read_bytes()
    assert archive.build(OBJECTIVE_ASSET, "score", tmp_path / "b.tar.gz").read_bytes() == a


# --- Dockerfiles, checked statically (the docker tests build and run them) -----------------------

def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_pins() -> dict:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[_canonical(name)] = version.strip()
    return pins


def pip_installs(dockerfile: Path) -> dict:
    """{package: version} of every `pip install` in a Dockerfile (pins are required:
    `name==version`)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    packages = {}
    for command in re.findall(r"pip install ([^\n&;]*)", text):
        for token in command.split():
            if token.startswith("-") or token.startswith("http"):
                continue
            assert "==" in token, f"{dockerfile}: {token} is not pinned"
            name, version = token.split("==")
            packages[_canonical(name)] = version
    return packages


def third_party_imports(files) -> set:
    """Top-level modules imported anywhere in these files (lazy imports too), minus stdlib and local
    ones."""
    local = {Path(f).stem for f in files} | {"mnist_dp", "__future__"}
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_import"
                  and isinstance(node.args[0], ast.Constant)):  # mnist_dp.utils.lazy's
                found.add(node.args[0].value.split(".")[0])
    return found - local - set(sys.stdlib_module_names)


@pytest.mark.parametrize("asset, function", FUNCTIONS, ids=lambda v: getattr(v, "name", v))
def test_dockerfile_is_pinned_and_installs_exactly_what_the_function_imports(
        tmp_path, asset, function):
    dockerfile = archive.dockerfile_path(asset)
    base = re.search(r"^FROM (\S+)", dockerfile.read_text(), re.M).group(1)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?",
                        base), f"{dockerfile}: {base}"
    installed = pip_installs(dockerfile)
    pins = requirement_pins()
    for name, version in installed.items():
        assert pins.get(name) == version, (
            f"{dockerfile}: {name}=={version} but requirements.txt pins {pins.get(name)}")

    with tarfile.open(archive.build(asset, function, tmp_path / "f.tar.gz")) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    # The opener runs in the function's container too.
    files = list((tmp_path / "x").rglob("*.py")) + [DATASET_ASSET / "opener.py"]
    distributions = importlib.metadata.packages_distributions()
    needed = {module: {_canonical(d) for d in distributions.get(module, [module])}
              for module in third_party_imports(files)}
    missing = {module for module, dists in needed.items() if not dists & set(installed)}
    assert not missing, f"{dockerfile}: imported but not installed: {sorted(missing)}"
    unused = set(installed) - set().union(*needed.values())
    assert not unused, (
        f"{dockerfile}: installed but imported by nothing in the archive: {sorted(unused)}")


DOCKERFILES = sorted({archive.dockerfile_path(asset) for asset,
                      _ in FUNCTIONS}) + [REPO / "Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_dockerfile_leaves_no_package_caches_or_lists(dockerfile):
    for run in re.findall(r"^RUN (.*)$", dockerfile.read_text().replace("\\\n", " "), re.M):
        if "pip install" in run:
            assert "--no-cache-dir" in run, f"{dockerfile}: {run}"
        if "apt-get install" in run:
            assert ("--no-install-recommends" in run
                    and "rm -rf /var/lib/apt/lists/*" in run), f"{dockerfile}: {run}"


def test_a_full_disk_while_building_an_archive_is_one_line_naming_it_and_leaves_none(tmpfs):
    from conftest import fill_disk

    disk = tmpfs("size=256k")
    fill_disk(disk)
    dest = disk / "archives" / "torch-train.tar.gz"
    with pytest.raises(UserError, match=rf"^{dest}: cannot write it \(No space left on device\); "
                                        "free space"):
        archive.build(ALGO_ASSETS["torch"], "train", dest)
    assert not any(p.name.endswith(".tar.gz") or p.name.startswith(".torch-train")
                   for p in disk.rglob("*"))
