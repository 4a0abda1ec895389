import tarfile
from pathlib import Path

import pytest
from substra.sdk.backends.local.compute.spawner.subprocess import _get_entrypoint_from_dockerfile

from conftest import ALGO_ASSETS, OBJECTIVE_ASSET
from mnist_dp import archive
from mnist_dp.errors import UserError

FUNCTIONS = [(ALGO_ASSETS[f], fn) for f in sorted(ALGO_ASSETS) for fn in ("train", "predict")] + [
    (OBJECTIVE_ASSET, "score")]


@pytest.mark.parametrize("asset, function", FUNCTIONS, ids=lambda v: getattr(v, "name", v))
def test_archive_is_self_contained_and_substra_reads_its_entrypoint(tmp_path, asset, function):
    path = archive.build(asset, function, tmp_path / "f.tar.gz")
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path / "x", filter="data")
    script, name = _get_entrypoint_from_dockerfile(tmp_path / "x")  # substra's own parser
    assert name == function and script in names
    assert "mnist_dp/__init__.py" in names and "mnist_dp/errors.py" in names
    # every shared module imported, transitively, is inside
    needed = archive.shared_modules([tmp_path / "x" / script])
    assert {f"mnist_dp/{m}.py" for m in needed} <= names
    assert not any(n.startswith("Dockerfile.") or n == "description.md" for n in names)


def test_every_dockerfile_has_one_exec_form_entrypoint():
    for asset, function in FUNCTIONS:
        dockerfile = archive.dockerfile_path(asset, function)
        text = dockerfile.read_text()
        assert text.count("ENTRYPOINT") == 1, dockerfile
        assert text.splitlines()[1].startswith("FROM python:3.11"), dockerfile


def test_hyperparameters_can_be_replaced(tmp_path):
    asset = ALGO_ASSETS[sorted(ALGO_ASSETS)[0]]
    path = archive.build(asset, "train", tmp_path / "f.tar.gz", {"hyperparameters.json": b"{}"})
    with tarfile.open(path) as tar:
        assert tar.extractfile("hyperparameters.json").read() == b"{}"
    with pytest.raises(UserError, match="no such file"):
        archive.build(asset, "train", tmp_path / "g.tar.gz", {"nope.json": b""})


def test_bad_entrypoint_is_refused(tmp_path):
    (tmp_path / "algo.py").write_text("")
    (tmp_path / "Dockerfile.train").write_text('ENTRYPOINT python3 algo.py --function-name train\n')
    with pytest.raises(UserError, match="ENTRYPOINT must look like"):
        archive.build(tmp_path, "train", tmp_path / "a.tar.gz")
    (tmp_path / "Dockerfile.train").write_text('ENTRYPOINT ["python3", "algo.py", "--function-name", "predict"]\n')
    with pytest.raises(UserError, match="expected 'train'"):
        archive.build(tmp_path, "train", tmp_path / "a.tar.gz")
    with pytest.raises(UserError, match="missing"):
        archive.build(tmp_path, "score", Path(tmp_path) / "a.tar.gz")
