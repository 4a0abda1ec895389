"""Generated persons (subjects.npy): the spec, the assignment, and generate_data writing them."""
import json

import numpy as np
import pytest

from mnist_dp.data import dataset, samples, subjects
from mnist_dp.utils.errors import UserError


@pytest.mark.parametrize("spec, sizes", [("10", (10, 10)), ("1-50", (1, 50)), (" 3 - 7 ", (3, 7))])
def test_a_spec_is_k_or_lo_hi(spec, sizes):
    assert subjects.parse(spec) == sizes


@pytest.mark.parametrize("spec", ["0", "5-3", "a", "1-", "-3", "1.5", "100001"])
def test_a_bad_spec_is_one_line(spec):
    with pytest.raises(UserError, match=r"^--images-per-subject .*: give K or LO-HI"):
        subjects.parse(spec)


def test_each_person_has_between_lo_and_hi_consecutive_images():
    persons = subjects.assign(1000, (1, 50), np.random.default_rng(0), first=7)
    ids, first_at, counts = np.unique(persons, return_index=True, return_counts=True)
    assert persons[0] == 7 and np.all(np.diff(persons) >= 0)  # consecutive, ids from `first`
    assert counts[:-1].min() >= 1 and counts.max() <= 50 and len(set(counts)) > 10  # skewed
    assert np.array_equal(ids, np.arange(7, 7 + len(ids)))
    assert np.array_equal(subjects.assign(25, (10, 10), np.random.default_rng(0)),
                          np.repeat([0, 1, 2], 10)[:25])


def test_generate_data_writes_the_persons_of_every_train_sample_and_keeps_them_when_rewritten(
        tmp_path):
    manifest = dataset.generate(tmp_path / "d", train_size=300, test_size=100, train_samples=3,
                                images_per_subject=(2, 5))
    folders = dataset.sample_folders(tmp_path / "d", "train")
    persons = [np.load(f / samples.SUBJECTS_FILE) for f in folders]
    assert all(p.dtype == np.int64 and len(p) == samples.sample_size(f) for p,
               f in zip(persons, folders))
    # every person in one sample, with 2 to 5 images
    assert not set(persons[0]) & set(persons[1]) and not set(persons[1]) & set(persons[2])
    counts = np.unique(np.concatenate(persons), return_counts=True)[1]
    assert counts.max() <= 5 and np.sort(counts)[3:].min() >= 2  # a sample's last may have fewer
    assert not (tmp_path / "d" / "test" / "0" / samples.SUBJECTS_FILE).exists()
    assert manifest["images_per_subject"] == [2, 5]
    # what a plan counts, as the scripts' checks before a plan count it: persons, else examples
    read = [samples.read_sample(f) for f in folders]
    assert samples.unit_count(read) == len(np.unique(np.concatenate(persons)))
    assert samples.unit_count([samples.read_sample(f) for f in dataset.sample_folders(
        tmp_path / "d", "test")]) == 100
    written = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert written["images_per_subject"] == [2, 5]
    # the command that writes it again keeps them (and the fingerprints cover them)
    command = dataset.regenerate_command(tmp_path / "d", manifest, 3)
    assert "--images-per-subject 2-5" in command
    before = samples.sample_fingerprint(folders[0])
    (folders[0] / samples.SUBJECTS_FILE).unlink()
    assert samples.sample_fingerprint(folders[0]) != before
