"""mnist_dp/data/samples.py: training data is refused when it holds an example twice, as the model
sees it."""
import shutil

import numpy as np
import pytest

from mnist_dp.data import dataset, samples
from mnist_dp.utils.errors import UserError


def write_sample(folder, images, labels, key="0123456789abcdef" * 4):
    folder.mkdir(parents=True)
    np.save(folder / samples.IMAGES_FILE, images)
    np.save(folder / samples.LABELS_FILE, labels)
    (folder / samples.KEY_FILE).write_text(key + "\n")
    return folder


def test_check_examples_catches_a_shuffled_copy_of_a_sample_in_another_folder(tmp_path):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (50, 28, 28), dtype=np.uint8), rng.integers(0, 10, 50,
                                  dtype=np.uint8)
    a = write_sample(tmp_path / "a", images, labels)
    order = rng.permutation(50)[:20]
    others = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    b = write_sample(tmp_path / "b", np.concatenate([others, images[order]]),
                     np.concatenate([rng.integers(0, 10, 30), labels[order]]).astype(np.int64))
    with pytest.raises(UserError) as caught:
        samples.check_examples([a, b])
    assert str(caught.value) == (f"{b} and {a} share 20 examples (the same image, as the model "
                                 "sees it, with the same label); an example in two samples is "
                                 "trained on twice but would be accounted once: remove the copies")


def test_check_examples_sees_images_as_the_model_does_whatever_their_dtype(tmp_path):
    # The same images stored as uint8 in one sample and as float32 in [0, 1] in
    # another: the same examples.
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8), rng.integers(0, 10, 30,
                                  dtype=np.uint8)
    a = write_sample(tmp_path / "a", images, labels)
    b = write_sample(tmp_path / "b", images[:12].astype(np.float32) / 255, labels[:12])
    with pytest.raises(UserError, match=f"^{b} and {a} share 12 example"):
        samples.check_examples([a, b])
    # ... and copies inside one sample are refused too: each would be trained on twice.
    twice = write_sample(tmp_path / "twice", images[[0, 1, 0]], labels[[0, 1, 0]])
    with pytest.raises(UserError,
                       match=f"^{twice}: 1 example is a copy of others in this sample"):
        samples.check_examples([twice])


def test_check_examples_catches_a_byte_identical_copy(tmp_path):
    dataset.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=2)
    first = dataset.sample_folders(tmp_path / "d", "train")[0]
    copy = shutil.copytree(first, tmp_path / "copy")
    with pytest.raises(UserError, match=f"^{copy} and {first} share 50 example"):
        samples.check_examples([first, copy])


def test_check_examples_passes_disjoint_folders_and_tells_examples_apart_by_their_label(tmp_path):
    dataset.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=3)
    folders = dataset.sample_folders(tmp_path / "d",
                                     "train") + dataset.sample_folders(tmp_path / "d", "test")
    images, labels = np.load(
        folders[0] / samples.IMAGES_FILE), np.load(folders[0] / samples.LABELS_FILE)
    relabelled = write_sample(tmp_path / "relabelled", images, (labels + 1) % 10)
    samples.check_examples([*folders, relabelled])
