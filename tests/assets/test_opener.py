import shutil

import numpy as np
import pytest
from conftest import DATASET_ASSET

from mnist_dp.assets import load_asset_module
from mnist_dp.data import samples

opener = load_asset_module(DATASET_ASSET / "opener.py", "opener")


KEY = "0123456789abcdef" * 4


def make_sample(folder, images=None, labels=None, key=KEY):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(folder / "images.npy", rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
            if images is None else images)
    np.save(folder / "labels.npy", np.arange(5, dtype=np.uint8) if labels is None else labels)
    if key is not None:
        (folder / "identity.key").write_text(key + "\n")
    return folder


def test_reads_and_concatenates_samples_in_the_order_of_their_content(tmp_path):
    a, b = make_sample(tmp_path / "a"), make_sample(tmp_path / "b", labels=np.full(5, 9))
    got = opener.MnistOpener().get_data([str(b), str(a)])
    assert got["images"].shape == (10, 28, 28) and got["images"].dtype == np.float32
    assert 0 <= got["images"].min() and got["images"].max() <= 1
    assert got["labels"].dtype == np.int64 and sorted(
        got["labels"].tolist()) == list(range(5)) + [9] * 5
    assert [s["n"] for s in got["samples"]] == [5, 5]
    identities = [s["identity"] for s in got["samples"]]
    assert identities == sorted(identities)
    # Substra names sample folders after random keys: neither the names nor the order given matter.
    renamed = [shutil.copytree(a, tmp_path / "z"), shutil.copytree(b, tmp_path / "y")]
    for folders in ([a, b], renamed, renamed[::-1]):
        again = opener.MnistOpener().get_data([str(f) for f in folders])
        assert again["labels"].tolist() == got["labels"].tolist()
        assert [{**s, "examples": s["examples"].tolist(), "folder": None}
                for s in again["samples"]] == \
            [{**s, "examples": s["examples"].tolist(), "folder": None} for s in got["samples"]]
        # where each sample's ledger is
        assert {s["folder"] for s in again["samples"]} == set(map(str, folders))


def test_identity_depends_on_content_and_key_only(tmp_path):
    import hashlib

    a, b = make_sample(tmp_path / "a"), make_sample(tmp_path / "b")
    c = make_sample(tmp_path / "c", labels=np.array([1, 1, 1, 1, 1]))
    d = make_sample(tmp_path / "d", key="f" * 64)
    # One folder at a time: a and b share every example, so the opener refuses them together.
    ids = [opener.MnistOpener().get_data([str(f)])["samples"][0]["identity"] for f in (a, b, c, d)]
    assert ids[0] == ids[1] and len({ids[0], ids[2], ids[3]}) == 3
    # Whoever holds the data but not the key cannot compute it: it is not the content hash.
    content = hashlib.sha256((a / "images.npy").read_bytes()
                             + (a / "labels.npy").read_bytes()).hexdigest()
    assert content not in ids


@pytest.mark.parametrize("key, message",
                         [(None, "no identity.key.*--add-key"), ("abc", "64 hexadecimal digits")])
def test_a_sample_without_a_valid_identity_key_is_refused_saying_how_to_add_one(
        tmp_path, key, message):
    folder = make_sample(tmp_path / "a", key=key)
    with pytest.raises(opener.DataSampleError, match=message):
        opener.MnistOpener().get_data([str(folder)])


def test_float_pixels_in_range_are_accepted(tmp_path):
    folder = make_sample(tmp_path / "a", images=np.full((5, 28, 28), 0.5, np.float64))
    assert opener.MnistOpener().get_data([str(folder)])["images"].dtype == np.float32


@pytest.mark.parametrize("images, labels, message", [
    (np.zeros((5, 28, 27), np.uint8), None, "shape"),
    (np.zeros((5, 28, 28), np.int32), None, "dtype"),
    (np.full((5, 28, 28), np.nan, np.float32), None, "NaN"),
    (np.full((5, 28, 28), 2.0, np.float32), None, r"\[0, 1\]"),
    (None, np.array([0, 1, 2, 3, 10]), "0-9"), (None, np.array([0, 1, 2, 3, -1]), "0-9"),
    (None, np.array([0, 1, 2]), "3 labels for 5 images"),
    (None, np.array([0.0, 1, 2, 3, 4]), "integer"),
    (np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.uint8), "no example"),
])
def test_bad_sample_is_rejected_naming_the_file(tmp_path, images, labels, message):
    folder = make_sample(tmp_path / "bad", images, labels)
    with pytest.raises(opener.DataSampleError, match=message) as caught:
        opener.MnistOpener().get_data([str(folder)])
    assert str(tmp_path / "bad") in str(caught.value)


def test_missing_folder_missing_file_and_pickles(tmp_path):
    with pytest.raises(opener.DataSampleError, match="not found"):
        opener.MnistOpener().get_data([str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(opener.DataSampleError, match="images.npy: file missing"):
        opener.MnistOpener().get_data([str(tmp_path / "empty")])
    folder = make_sample(tmp_path / "pickled", images=np.array([{"a": 1}], dtype=object))
    with pytest.raises(opener.DataSampleError, match="not a readable"):
        opener.MnistOpener().get_data([str(folder)])
    with pytest.raises(opener.DataSampleError, match="no data sample"):
        opener.MnistOpener().get_data([])


def test_a_file_given_as_a_data_sample_is_named_as_a_file(tmp_path):
    folder = make_sample(tmp_path / "a")
    path = folder / "images.npy"
    with pytest.raises(opener.DataSampleError) as caught:
        opener.MnistOpener().get_data([str(path)])
    assert str(caught.value) == (f"{path}: is a file, not a data sample folder (a folder holding "
                                 "images.npy and labels.npy)")


def test_samples_sharing_an_example_are_named_for_training_to_refuse(tmp_path):
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), rng.integers(0, 10, 40)
    a = make_sample(tmp_path / "a", images, labels)
    shuffled = rng.permutation(40)[:15]
    others = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    b = make_sample(tmp_path / "b", np.concatenate([others, images[shuffled]]),
                    np.concatenate([rng.integers(0, 10, 5), labels[shuffled]]).astype(np.uint8))
    copy = shutil.copytree(a, tmp_path / "copy")
    as_floats = make_sample(tmp_path / "floats", images[:7].astype(np.float32) / 255, labels[:7])
    for folders, count in (([a, b], 15), ([copy, a], 40), ([a, as_floats], 7)):
        got = opener.MnistOpener().get_data([str(f) for f in folders])
        assert got["copies"] == (f"{folders[1]} and {folders[0]} share {count} examples (the "
                                 "same image, as the model sees it, with the same label); an "
                                 "example in two samples is trained on twice but would be "
                                 "accounted once: remove the copies")
    # The same images under other labels are other examples.
    relabelled = make_sample(tmp_path / "relabelled", images, (labels + 1) % 10)
    got = opener.MnistOpener().get_data([str(a), str(relabelled)])
    assert got["copies"] is None and len(got["labels"]) == 80
    twice = make_sample(tmp_path / "twice", images[[0, 0]], np.array([3, 3]))
    assert opener.MnistOpener().get_data([str(twice)])["copies"].startswith(
        f"{twice}: 1 example is a copy of others")


def test_an_example_is_what_the_model_sees_and_is_named_under_its_samples_key(tmp_path):
    rng = np.random.default_rng(2)
    images, labels = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8), np.arange(6, dtype=np.uint8)
    stored = [make_sample(tmp_path / "u8", images, labels),
              make_sample(tmp_path / "f32", images.astype(np.float32) / 255, labels),
              make_sample(tmp_path / "f64", images.astype(np.float64) / 255, labels)]
    read = [opener.read_sample(str(folder)) for folder in stored]
    assert read[0].digests == read[1].digests == read[2].digests
    assert len({r.identity for r in read}) == 3  # other files, other samples; the same examples
    assert read[0].ids.tolist() == read[1].ids.tolist() and read[0].ids.dtype == np.uint64
    negative_zero = make_sample(tmp_path / "negzero", np.where(images == 0, -0.0, images / 255),
                                labels)
    assert opener.read_sample(str(negative_zero)).digests == read[0].digests
    # under another key: other ids, another key id; nothing of the key is in them
    other = opener.read_sample(str(make_sample(tmp_path / "other", images, labels, key="f" * 64)))
    assert not set(other.ids.tolist()) & set(
        read[0].ids.tolist()) and other.key_id != read[0].key_id
    assert len(read[0].key_id) == 16 and read[0].key_id not in KEY


def test_fake_data_has_the_real_form():
    fake = opener.MnistOpener().fake_data(7)
    assert fake["images"].shape == (7, 28, 28) and fake["labels"].shape == (7,)
    assert fake["samples"][0]["n"] == 7


def test_the_scripts_compute_the_same_identity_and_size_as_the_opener(tmp_path):

    folder = make_sample(tmp_path / "a", labels=np.array([3, 1, 4, 1, 5]))
    sample = opener.MnistOpener().get_data([str(folder)])["samples"][0]
    assert samples.sample_identity(folder) == sample["identity"]
    assert samples.sample_size(folder) == sample["n"] == 5


def test_subjects_name_each_images_person_under_the_key_and_change_the_identity(tmp_path):
    plain = opener.read_sample(str(make_sample(tmp_path / "plain")))
    assert plain.persons is None and np.array_equal(plain.units, plain.ids)
    ints = make_sample(tmp_path / "ints")
    np.save(ints / "subjects.npy", np.array([7, 7, 8, 9, 7], dtype=np.int16))
    texts = make_sample(tmp_path / "texts", labels=np.full(5, 3))
    np.save(texts / "subjects.npy", np.array(["7", "a", "a", "b", "é"]))
    a, b = opener.read_sample(str(ints)), opener.read_sample(str(texts))
    # one person's images share an id, in a sample and across samples under one key (7 and "7")
    assert a.persons[0] == a.persons[1] == a.persons[4] == b.persons[0] != a.persons[2]
    assert b.persons[1] == b.persons[2] and len(set(b.persons.tolist())) == 4
    assert not set(a.persons.tolist()) & set(a.ids.tolist())  # not the examples' names
    other = opener.read_sample(str(make_sample(tmp_path / "other", key="f" * 64)))
    np.save(tmp_path / "other" / "subjects.npy", np.array([7, 7, 8, 9, 7]))
    other = opener.read_sample(str(tmp_path / "other"))
    assert not set(other.persons.tolist()) & set(a.persons.tolist())  # keyed per organisation
    # the persons are part of what the sample is, and what a task receives
    assert a.identity != plain.identity and a.ids.tolist() == plain.ids.tolist()
    got = opener.MnistOpener().get_data([str(ints), str(tmp_path / "plain")])
    assert {("persons" in s) for s in got["samples"]} == {True, False}


@pytest.mark.parametrize("subjects, message", [
    (np.arange(4), "one subject id per image: shape [5], got [4]"),
    (np.arange(10).reshape(5, 2), "one subject id per image"),
    (np.array([1.0, 2.0, np.nan, 4.0, 5.0]), "must be integers or text, got dtype float64"),
    (np.array([True] * 5), "must be integers or text, got dtype bool"),
    (np.array(["a", "b", "NaN", "c", "d"]), "subject id 2 is 'NaN', a missing value"),
    (np.array(["a", "", "b", "c", "d"]), "subject id 1 is '', a missing value"),
    (np.array([b"a", b"\xff", b"b", b"c", b"d"]), "byte-string subject ids must be UTF-8 text"),
    (np.array(["a", {}, 1, 2, 3], dtype=object), "not Python objects"),
])
def test_bad_subjects_are_one_error_naming_the_file(tmp_path, subjects, message):
    folder = make_sample(tmp_path / "s")
    np.save(folder / "subjects.npy", subjects, allow_pickle=True)
    with pytest.raises(opener.DataSampleError) as caught:
        opener.read_sample(str(folder))
    assert str(caught.value).startswith(f"{folder / 'subjects.npy'}: ") and message in str(
        caught.value) and "\n" not in str(caught.value)
