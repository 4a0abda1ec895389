"""mnist_dp/data/sources.py: reading each source (embedded, IDX, npz), the stratified split, and
the checks of a source's arrays, each refusal naming the file and what is wrong."""
import gzip
import struct

import numpy as np
import pytest
from test_dataset import save_npz, write_idx

from mnist_dp.data import sources
from mnist_dp.utils.errors import UserError

IMAGES, LABELS = 2051, 2049  # the IDX magic numbers of MNIST's image and label files


def labelled(counts):
    """Images holding their own index (in their first two pixels); counts[c] labels of class c."""
    labels = np.repeat(np.arange(len(counts)), counts).astype(np.uint8)
    images = np.zeros((len(labels), 28, 28), np.uint8)
    images[:, 0, 0], images[:, 0, 1] = np.arange(len(labels)) // 256, np.arange(len(labels)) % 256
    return images, labels


def index_of(images):
    return images[:, 0, 0].astype(int) * 256 + images[:, 0, 1]


def test_the_embedded_subset_is_500_of_each_digit_in_class_order_and_a_fresh_copy():
    """load_embedded: 5,000 uint8 28x28 images, 500 per class in order; callers may edit theirs."""
    images, labels = sources.load_embedded()
    assert images.shape == (sources.EMBEDDED_SIZE, 28, 28) == (5000, 28, 28)
    assert images.dtype == labels.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    assert np.all(np.diff(labels.astype(int)) >= 0)
    assert images.max() > 200 and images.min() == 0  # pixels, not [0, 1] floats
    images[:] = 0
    labels[:] = 9
    again, again_labels = sources.load_embedded()
    assert again.max() > 0 and again_labels[0] == 0


@pytest.mark.parametrize("name", ["t10k-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz"])
def test_read_idx_reads_the_header_dimensions_and_values_plain_or_gzipped(tmp_path, name):
    """An IDX file: a big-endian magic, its dimensions, one byte per value; gzipped or not."""
    payload = struct.pack(">II", LABELS, 4) + bytes([7, 0, 9, 3])
    path = tmp_path / name
    path.write_bytes(gzip.compress(payload) if name.endswith(".gz") else payload)
    labels = sources.read_idx(path, LABELS)
    assert labels.tolist() == [7, 0, 9, 3] and labels.dtype == np.uint8
    images = np.arange(2 * 3 * 2).reshape(2, 3, 2)
    write_idx(tmp_path / "images", images, IMAGES)
    assert np.array_equal(sources.read_idx(tmp_path / "images", IMAGES), images)


HEADER_SAYS_4 = r"IDX header says \(4,\) but the file holds"


@pytest.mark.parametrize("content, message", [
    (struct.pack(">II", IMAGES, 4) + bytes(4), r"not an MNIST IDX file \(magic number 0x00000801"),
    (struct.pack(">I", LABELS), r"not an MNIST IDX file"),
    (struct.pack(">II", LABELS, 4) + bytes(3), f"{HEADER_SAYS_4} 3 values"),
    (struct.pack(">II", LABELS, 4) + bytes(5), f"{HEADER_SAYS_4} 5 values"),
])
def test_read_idx_refuses_a_file_whose_header_does_not_match(tmp_path, content, message):
    """A wrong magic, a file shorter than a header, more or fewer values than the header says."""
    (tmp_path / "labels").write_bytes(content)
    with pytest.raises(UserError, match=f"^{tmp_path / 'labels'}: {message}"):
        sources.read_idx(tmp_path / "labels", LABELS)


def test_read_idx_names_a_gz_file_that_is_not_gzip(tmp_path):
    """A .gz that gzip cannot read is one UserError naming the file, not a traceback."""
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    path.write_bytes(struct.pack(">II", LABELS, 1) + b"\x05")
    with pytest.raises(UserError, match=f"^{path}: cannot read IDX file"):
        sources.read_idx(path, LABELS)


def test_an_idx_folder_gives_the_train_and_test_splits_from_its_four_files(tmp_path):
    """load_idx_folder pairs train-* and t10k-* files, plain or gzipped, in that order."""
    rng = np.random.default_rng(0)
    arrays = {"train": (rng.integers(0, 256, (6, 28, 28)), np.arange(6) % 10),
              "t10k": (rng.integers(0, 256, (4, 28, 28)), np.arange(4) + 5)}
    for prefix, (images, labels) in arrays.items():
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images, IMAGES)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", labels, LABELS)
    (train_x, train_y), (test_x, test_y) = sources.load_source(tmp_path)
    assert np.array_equal(train_x, arrays["train"][0]) and train_y.tolist() == [0, 1, 2, 3, 4, 5]
    assert np.array_equal(test_x, arrays["t10k"][0]) and test_y.tolist() == [5, 6, 7, 8]
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(UserError,
                       match=f"^{tmp_path}: no file matching 't10k-labels-idx1-ubyte\\*'"):
        sources.load_source(tmp_path)


def test_an_npz_source_gives_its_four_arrays(tmp_path):
    """load_source reads a Keras-style mnist.npz as ((x_train, y_train), (x_test, y_test))."""
    images = np.full((3, 28, 28), 17, np.uint8)
    (train_x, train_y), (test_x, test_y) = sources.load_source(save_npz(tmp_path / "m.npz", images))
    assert np.array_equal(train_x, images) and train_y.tolist() == [0, 1, 2]
    assert test_x.shape == (10, 28, 28) and test_y.tolist() == list(range(10))


@pytest.mark.parametrize("write", [
    lambda path: np.savez(path, x_train=np.zeros((2, 28, 28))),  # a key missing
    lambda path: np.savez(path, x_train=np.array([None]), y_train=[1], x_test=[1], y_test=[1]),
    lambda path: path.write_bytes(b"not a zip"),
    lambda path: None,  # no such file
])
def test_an_npz_that_is_not_a_keras_mnist_is_refused_naming_it(tmp_path, write):
    """Missing arrays, pickled objects, a file that is no npz or no file at all: one UserError."""
    path = tmp_path / "mnist.npz"
    write(path)
    with pytest.raises(UserError,
                       match=f"^{path}: not a Keras-style mnist.npz with x_train, y_train"):
        sources.load_source(path)


def test_a_source_that_is_neither_a_folder_nor_an_npz_is_refused(tmp_path):
    """Any other file is refused by name, whatever it holds."""
    (tmp_path / "mnist.csv").write_text("0,1,2\n")
    with pytest.raises(UserError,
                       match="mnist.csv: not a folder of MNIST IDX files nor a .npz file"):
        sources.load_source(tmp_path / "mnist.csv")


@pytest.mark.parametrize("size, expected", [
    (30, [5, 10, 15]),  # exactly half of each class
    (31, [5, 10, 16]),  # 5.17, 10.33, 15.5: the one left over goes to the largest remainder
    (32, [5, 11, 16]),  # two left over: the two largest remainders
    (60, [10, 20, 30]), (0, [0, 0, 0]),
])
def test_stratified_indices_keep_the_class_proportions_and_add_up_exactly(size, expected):
    """Largest-remainder counts per class, drawn without replacement among that class."""
    _, labels = labelled([10, 20, 30])
    picked = sources.stratified_indices(labels, size, np.random.default_rng(4))
    assert len(picked) == size and len(set(picked.tolist())) == size
    assert np.bincount(labels[picked], minlength=3).tolist() == expected


def test_stratified_indices_are_shuffled_and_seeded():
    """Not in class order; the same generator seed draws the same indices, another seed others."""
    _, labels = labelled([50] * 10)
    draw = [sources.stratified_indices(labels, 200, np.random.default_rng(s)) for s in (1, 1, 2)]
    assert np.array_equal(draw[0], draw[1]) and not np.array_equal(draw[0], draw[2])
    assert np.any(np.diff(labels[draw[0]].astype(int)) < 0)


def test_stratified_indices_refuse_more_than_the_source_holds():
    """Asking for more examples than there are is a UserError with both numbers."""
    with pytest.raises(UserError, match="^asked for 61 examples but the source has only 60$"):
        sources.stratified_indices(labelled([10, 20, 30])[1], 61, np.random.default_rng(0))


def test_split_train_test_is_disjoint_stratified_on_both_sides_and_keeps_pairs():
    """100 (10 a class) -> 50 train, 20 test, 5 and 2 a class, none shared, images with labels."""
    images, labels = labelled([10] * 10)
    (train_x, train_y), (test_x, test_y) = sources.split_train_test(images, labels, 50, 20, seed=3)
    assert np.bincount(train_y, minlength=10).tolist() == [5] * 10
    assert np.bincount(test_y, minlength=10).tolist() == [2] * 10
    train, test = index_of(train_x), index_of(test_x)
    assert not set(train.tolist()) & set(test.tolist())
    assert np.array_equal(labels[train], train_y) and np.array_equal(labels[test], test_y)
    again = sources.split_train_test(images, labels, 50, 20, seed=3)
    assert np.array_equal(again[0][0], train_x) and np.array_equal(again[1][0], test_x)


def test_split_train_test_refuses_more_than_the_source_holds():
    """train + test beyond the examples available is refused, naming the three numbers."""
    images, labels = labelled([10] * 10)
    with pytest.raises(UserError, match=r"^train 90 \+ test 11 examples exceed the 100 available$"):
        sources.split_train_test(images, labels, 90, 11, seed=0)


def test_checked_arrays_cast_in_range_integers_to_uint8_unchanged():
    """uint8 passes as it is; int64 pixels in 0-255 and int32 digits become equal uint8 values."""
    images = np.array([0, 255, 128] * 784, np.int64).reshape(3, 28, 28)
    labels = np.array([0, 9, 4], np.int32)
    out_images, out_labels = sources.checked_arrays(images, labels, "src", "train")
    assert out_images.dtype == out_labels.dtype == np.uint8
    assert np.array_equal(out_images, images) and out_labels.tolist() == [0, 9, 4]
    same, _ = sources.checked_arrays(images.astype(np.uint8), labels, "src", "train")
    assert np.array_equal(same, images)


@pytest.mark.parametrize("images, labels, got", [
    (np.zeros((3, 28, 27)), np.zeros(3), r"\(3, 28, 27\) and \(3,\)"),
    (np.zeros((3, 784)), np.zeros(3), r"\(3, 784\) and \(3,\)"),
    (np.zeros((3, 28, 28)), np.zeros((3, 1)), r"\(3, 28, 28\) and \(3, 1\)"),
    (np.zeros((3, 28, 28)), np.zeros(4), r"\(3, 28, 28\) and \(4,\)"),
])
def test_checked_arrays_refuse_shapes_other_than_n_images_with_n_labels(images, labels, got):
    """Images not [n, 28, 28], labels not [n]: the message gives both shapes found."""
    expected = rf"^src: expected test images \[n, 28, 28\] with n labels, got {got}$"
    with pytest.raises(UserError, match=expected):
        sources.checked_arrays(images, labels, "src", "test")


@pytest.mark.parametrize("images, found", [
    (np.full((2, 28, 28), np.nan), "float64, all NaN"), (np.zeros((2, 28, 28), bool), "bool"),
    (np.zeros((0, 28, 28), np.float32), "float32"),
])
def test_checked_arrays_describe_images_that_are_not_pixels(images, found):
    """All NaN, booleans, floats with no values: the message says what they are, then what to do."""
    expected = f"^src: train images are {found}; images must be uint8 pixels 0-255"
    with pytest.raises(UserError, match=expected):
        sources.checked_arrays(images, np.zeros(len(images), np.uint8), "src", "train")
