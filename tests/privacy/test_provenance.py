import tarfile

from conftest import ALGO_ASSETS, FRAMEWORKS

from mnist_dp.orchestration import archive
from mnist_dp.privacy import provenance


def unpacked(tmp_path):
    tar_path = archive.build(ALGO_ASSETS[FRAMEWORKS[0]], "train", tmp_path / "train.tar.gz")
    with tarfile.open(tar_path) as tar:
        tar.extractall(tmp_path / "fn", filter="data")
        names = set(tar.getnames())
    return tar_path, tmp_path / "fn", names


def test_a_function_running_from_its_archive_records_the_archives_digest(tmp_path):
    tar_path, folder, names = unpacked(tmp_path)
    listed = set(__import__("json").loads((folder / provenance.MANIFEST_FILE).read_text())["files"])
    assert listed == names - {provenance.MANIFEST_FILE}  # every other file of the archive
    (folder / "__pycache__").mkdir()  # what running it adds is not part of it
    (folder / "__pycache__" / "algo.pyc").write_bytes(b"x")
    digest = archive.archive_digest(tar_path)
    assert digest.startswith("sha256:")
    assert provenance.running_code(folder, "train") == {"function": "train",
                                   "archive_digest": digest}


def test_changed_files_or_no_archive_record_no_digest(tmp_path):
    _, folder, _ = unpacked(tmp_path)
    (folder / "hyperparameters.json").write_text('{"epochs": 1000}')
    assert provenance.running_code(folder, "train")["archive_digest"] is None
    # the repository
    assert provenance.running_code(ALGO_ASSETS[FRAMEWORKS[0]], "train")["archive_digest"] is None


def test_other_hyperparameters_make_another_archive_digest(tmp_path):
    one = archive.build(ALGO_ASSETS[FRAMEWORKS[0]], "train", tmp_path / "a.tar.gz",
                        {"hyperparameters.json": b"{}"})
    two = archive.build(ALGO_ASSETS[FRAMEWORKS[0]], "train", tmp_path / "b.tar.gz",
                        {"hyperparameters.json": b"{ }"})
    assert archive.archive_digest(one) != archive.archive_digest(two)
