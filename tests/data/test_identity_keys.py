"""Identity keys a user's hands have been on: every refusal says what to do, and doing it literally
makes the refused check pass (the pre-registration check every script runs:
dataset.check_organization_keys)."""
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, WITHOUT_WRITE_OVERRIDE, follow_advice

from mnist_dp.data import dataset, samples
from mnist_dp.data import keys as identity_keys
from mnist_dp.utils.errors import UserError

GENERATE_DATA = REPO / "scripts" / "generate_data.py"


@pytest.fixture
def data(tmp_path):
    """One organisation's data: two train samples under one key, the test sample under its own."""
    dest = tmp_path / "data"
    dataset.generate(dest, train_size=60, test_size=20, train_samples=2)
    return dest


def check(data):
    train = dataset.sample_folders(data, "train")
    dataset.check_organization_keys(data, [train])
    return [samples.read_key(folder) for folder in [*train, *dataset.sample_folders(data, "test")]]


def break_key(path, how):
    if how == "missing":
        path.unlink()
    elif how == "dangling link":
        path.unlink()
        path.symlink_to(path.parent / "gone.key")
    elif how == "a folder":
        path.unlink()
        path.mkdir()
    elif how == "too short":
        path.write_text(path.read_text().strip()[:-1] + "\n")
    elif how == "not ASCII":
        path.write_text("é" * 64 + "\n", encoding="utf-8")


@pytest.mark.parametrize("sample", ["train/1", "test/0"])
@pytest.mark.parametrize("how", ["missing", "dangling link", "a folder", "too short", "not ASCII"])
def test_a_broken_key_is_refused_with_advice_that_works_when_followed(data, sample, how):
    before = check(data)
    break_key(data / sample / samples.KEY_FILE, how)
    with pytest.raises(UserError) as refused:
        check(data)
    message = str(refused.value)
    assert (message.startswith(str(data / sample))
            and "python scripts/generate_data.py --add-key" in message)
    follow_advice(message)
    after = check(data)
    if sample == "train/1":  # the organisation's other sample's key: its data stays under one key
        assert "--key-from" in message and after == before
    else:  # the test sample alone under its key: a new one
        assert after[:2] == before[:2] and after[2] != before[2]


def test_an_unreadable_key_is_to_be_made_readable_not_replaced(data):
    key = data / "train" / "1" / samples.KEY_FILE
    key.chmod(0)
    try:
        proc = subprocess.run([*WITHOUT_WRITE_OVERRIDE, sys.executable, "-c",
                               "from mnist_dp.data import samples; "
                               f"samples.read_key({str(key.parent)!r})"], capture_output=True,
                              text=True)
    finally:
        key.chmod(0o600)
    assert "make it readable to this user" in proc.stderr and "--add-key" not in proc.stderr


def test_a_key_in_uppercase_is_the_same_key(data):
    before = check(data)
    path = data / "train" / "1" / samples.KEY_FILE
    path.write_text(path.read_text().upper())
    assert check(data) == before


def run_generate_data(*args):
    return subprocess.run([sys.executable, GENERATE_DATA, *map(str, args)], capture_output=True,
                          text=True)


@pytest.mark.parametrize("how", ["dangling link", "too short", "a folder"])
def test_add_key_refuses_a_folder_whose_key_is_broken_and_its_advice_works(data, how):
    folder = data / "train" / "1"
    break_key(folder / samples.KEY_FILE, how)
    proc = run_generate_data("--add-key", folder)
    lines = proc.stderr.strip().splitlines()
    assert (proc.returncode == 2 and len(lines) == 1
            and lines[0].startswith(f"error: {folder / samples.KEY_FILE}"))
    follow_advice(lines[0].removeprefix("error: "))
    assert samples.read_key(folder)  # a valid key now
    proc = run_generate_data("--add-key", folder)
    assert proc.returncode == 0 and "0 of 1 folder (each had a valid key)" in proc.stdout


def test_add_key_refuses_the_options_of_a_new_data_set(data):
    proc = run_generate_data("--add-key", data / "train" / "1", "--force", "--seed", "3")
    assert proc.returncode == 2
    assert proc.stderr == "error: --seed and --force have no effect with --add-key; drop them\n"


def test_one_organisation_may_evaluate_on_test_data_under_its_own_key(data):
    train, test = dataset.sample_folders(data, "train"), dataset.sample_folders(data, "test")[0]
    (test / samples.KEY_FILE).unlink()
    # registered at that organisation only: nobody else's key
    identity_keys.add_key([test], samples.read_key(train[0]))
    dataset.check_organization_keys(data, [train], test_everywhere=True)
    (train[1] / samples.KEY_FILE).unlink()
    # a second organisation, under its own key: it would be given the test data too
    identity_keys.add_key([train[1]])
    with pytest.raises(UserError, match="the test data is under organisation 1's identity key"):
        dataset.check_organization_keys(data, [train[:1], train[1:]], test_everywhere=True)


@pytest.mark.parametrize("as_written", [True, False])
def test_too_few_samples_for_the_organisations_gives_a_command_that_loses_nothing(data, as_written):
    from mnist_dp.orchestration import registry

    if not as_written:  # a sample of the user's own: never written over
        shutil.copytree(data / "train" / "1", data / "train" / "2")
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    kept = samples.read_key(data / "train" / "0")
    with pytest.raises(UserError) as refused:
        registry.split_among(data, 4, flag="--organizations")
    follow_advice(str(refused.value))
    if as_written:  # written again in place, organisation 1 keeping its key
        registry.split_among(data, 4)
        assert samples.read_key(data / "train" / "0") == kept
        # one key per organisation
        assert len({samples.read_key(data / "train" / str(k)) for k in range(4)}) == 4
    else:  # untouched; the new data is elsewhere
        assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before
        registry.split_among(data.parent / "data-4-samples", 4)


def test_a_ring_file_that_is_not_keys_is_one_line_naming_it(data):
    folder = data / "train" / "0"
    (folder / samples.RING_FILE).write_text("not a key\n")
    with pytest.raises(UserError, match=rf"^{folder / samples.RING_FILE}: key 1 is not 64 "
                                        r"hexadecimal digits; "
                                        "remove the file and run scripts/generate_data.py "
                                        "--same-organization again"):
        samples.read_sample(folder)
    proc = run_generate_data("--same-organization", folder, "--seed", "3")
    assert (proc.returncode == 2
            and proc.stderr == "error: --seed has no effect with --same-organization; drop it\n")


def test_the_advice_for_more_organisations_keeps_every_organisations_key(tmp_path):
    from mnist_dp.orchestration import registry

    data = tmp_path / "data"
    dataset.generate(data, train_size=60, test_size=20, train_samples=2, organizations=2)
    kept = [samples.read_key(data / "train" / str(k)) for k in range(2)]
    with pytest.raises(UserError) as refused:
        registry.split_among(data, 3, flag="--organizations")
    assert f"--key-from {data / 'train' / '0'} {data / 'train' / '1'}" in str(refused.value)
    follow_advice(str(refused.value))
    registry.split_among(data, 3)
    # as docs/data.md promises
    assert [samples.read_key(data / "train" / str(k)) for k in range(2)] == kept
    assert samples.read_key(data / "train" / "2") not in kept
