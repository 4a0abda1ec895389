"""mnist_dp/data/keys.py: new keys, written once; keys added to a user's samples, one
organisation's samples made to know each other's keys, and the advice that gives folders a key."""
import os
import re

import numpy as np
import pytest
from conftest import follow_advice
from test_identity_keys import run_generate_data

from mnist_dp.data import dataset, samples
from mnist_dp.data import keys as identity_keys
from mnist_dp.utils.errors import UserError

KEY_A, KEY_B, KEY_C = "a" * 64, "0123456789abcdef" * 4, "f" * 63 + "0"


def sample(folder, key=None, first=0):
    """A data sample folder of three distinct examples (their images start at pixel value `first`),
    with identity key `key` written as a user would (none if None)."""
    folder.mkdir(parents=True)
    np.save(folder / samples.IMAGES_FILE, np.arange(first, first + 3, dtype=np.uint8)[:, None, None]
            * np.ones((3, 28, 28), np.uint8))
    np.save(folder / samples.LABELS_FILE, np.array([1, 2, 3], np.uint8))
    if key is not None:
        (folder / samples.KEY_FILE).write_text(key + "\n")
    return folder


def test_a_new_key_is_64_lowercase_hex_digits_and_another_each_time():
    """new_key: 256 bits as 64 hex digits, never the same twice."""
    keys = {identity_keys.new_key() for _ in range(20)}
    assert len(keys) == 20 and all(re.fullmatch("[0-9a-f]{64}", key) for key in keys)


def test_write_key_writes_a_key_only_its_owner_reads_and_never_replaces_one(tmp_path):
    """The file is the key and a newline, mode 600, read back as written; a second write fails."""
    folder = sample(tmp_path / "s")
    identity_keys.write_key(folder, KEY_B)
    path = folder / samples.KEY_FILE
    assert path.read_text() == KEY_B + "\n" and path.stat().st_mode & 0o777 == 0o600
    assert samples.read_key(folder) == KEY_B
    with pytest.raises(FileExistsError):
        identity_keys.write_key(folder, KEY_A)
    assert path.read_text() == KEY_B + "\n"


def test_add_key_gives_the_folders_without_a_key_one_new_key_and_keeps_the_others(tmp_path):
    """Folders without a key get one key, the same; one with a key keeps it; again, nothing."""
    keyed = sample(tmp_path / "k", KEY_A)
    first, second = sample(tmp_path / "1"), sample(tmp_path / "2")
    assert identity_keys.add_key([keyed, first, second]) == [first, second]
    assert samples.read_key(first) == samples.read_key(second) not in (KEY_A, KEY_B)
    assert samples.read_key(keyed) == KEY_A
    assert identity_keys.add_key([str(keyed), str(first), str(second)]) == []


def test_add_key_writes_the_key_it_is_given(tmp_path):
    """With `key`, the folders without one get that key (another sample's of their organisation)."""
    folder = sample(tmp_path / "s")
    assert identity_keys.add_key([folder], KEY_B) == [folder]
    assert samples.read_key(folder) == KEY_B


def test_add_key_refuses_a_folder_that_is_not_a_sample_before_writing_any_key(tmp_path):
    """A folder without images.npy and labels.npy is refused by name; the one before gets none."""
    folder, other = sample(tmp_path / "s"), tmp_path / "other"
    other.mkdir()
    with pytest.raises(UserError, match=f"^{other}: not a data sample folder "
                                        r"\(it needs images.npy and labels.npy\)$"):
        identity_keys.add_key([folder, other])
    assert not (folder / samples.KEY_FILE).exists()


def test_add_key_refuses_a_broken_key_before_writing_any_key(tmp_path):
    """A key file that is no key is refused, never replaced, and no other folder gets a key."""
    folder, broken = sample(tmp_path / "s"), sample(tmp_path / "b", "not a key")
    with pytest.raises(samples.KeyFileProblem, match=f"^{broken / samples.KEY_FILE}"):
        identity_keys.add_key([folder, broken])
    assert not (folder / samples.KEY_FILE).exists()
    assert (broken / samples.KEY_FILE).read_text() == "not a key\n"


def test_same_organization_adds_every_other_key_to_each_ring_keeping_what_it_held(tmp_path):
    """Keys A, A, B, B's ring holding C: the A folders get [B], B gets A and C; 3 keys in all."""
    a1, a2 = sample(tmp_path / "a1", KEY_A), sample(tmp_path / "a2", KEY_A, first=3)
    b = sample(tmp_path / "b", KEY_B, first=6)
    (b / samples.RING_FILE).write_text(KEY_C + "\n")
    assert identity_keys.same_organization([a1, a2, b]) == (3, 0)
    assert samples.read_ring(a1) == samples.read_ring(a2) == [KEY_B]
    assert samples.read_ring(b) == sorted([KEY_A, KEY_C])
    assert [samples.read_key(f) for f in (a1, a2, b)] == [KEY_A, KEY_A, KEY_B]


def test_same_organization_writes_no_ring_when_the_samples_share_one_key(tmp_path):
    """Folders already under one key have no other key to know: no ring file."""
    folders = [sample(tmp_path / "1", KEY_A), sample(tmp_path / "2", KEY_A, first=3)]
    assert identity_keys.same_organization(folders) == (1, 0)
    assert not any((f / samples.RING_FILE).exists() for f in folders)


def test_same_organization_refuses_a_folder_that_is_not_a_sample_before_writing(tmp_path):
    """Refused by name before any ring or ledger is written in the valid folder."""
    folder, other = sample(tmp_path / "s", KEY_A), tmp_path / "other"
    other.mkdir()
    with pytest.raises(UserError, match=f"^{other}: not a data sample folder"):
        identity_keys.same_organization([folder, other])
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [samples.IMAGES_FILE, samples.LABELS_FILE, samples.KEY_FILE])


def test_of_organization_gives_each_folder_its_key_id(tmp_path):
    """Folders under one key share an id, another key has another; an id is 16 hex digits."""
    folders = [sample(tmp_path / "1", KEY_A), sample(tmp_path / "2", KEY_B),
               sample(tmp_path / "3", KEY_A.upper(), first=3)]
    ids = identity_keys.of_organization(folders)
    assert list(ids) == folders and ids[folders[0]] == ids[folders[2]] != ids[folders[1]]
    assert all(re.fullmatch("[0-9a-f]{16}", i) for i in ids.values())
    assert KEY_A[:16] not in ids.values()


def test_of_organization_refuses_a_missing_key_with_the_key_of_a_sample_that_has_one(tmp_path):
    """The advice gives the key of the first sample with one, even listed after; else a new one."""
    missing, keyed = sample(tmp_path / "missing"), sample(tmp_path / "keyed", KEY_A)
    with pytest.raises(UserError) as refused:
        identity_keys.of_organization([missing, keyed])
    message = str(refused.value)
    assert message.startswith(f"{missing}: no {samples.KEY_FILE}")
    assert message.endswith(f"--add-key {missing} --key-from {keyed}")
    with pytest.raises(UserError) as refused:
        identity_keys.of_organization([missing])
    assert str(refused.value).endswith(f"--add-key {missing}")


def test_rekey_advice_names_the_files_to_remove_and_the_command(tmp_path):
    """One folder: a new key of its own; two: another sample's key; paths quoted for a shell."""
    one, two, three = tmp_path / "a", tmp_path / "b c", tmp_path / "k"
    assert identity_keys.rekey_advice([one], None) == (
        f"give {one} a key of its own: remove {one}/identity.key, then run: python "
        f"scripts/generate_data.py --add-key {one}")
    assert identity_keys.rekey_advice([one, two], three) == (
        f"give {one} {two} the key of {three}, as the rest of their organisation: remove "
        f"{one}/identity.key '{two}/identity.key', then run: python scripts/generate_data.py "
        f"--add-key {one} '{two}' --key-from {three}")


def test_rekey_advice_followed_literally_gives_the_folders_the_key(tmp_path):
    """Doing what it says (a path with a space too) puts the folders under key_from's key."""
    keyed = sample(tmp_path / "keyed", KEY_A)
    folders = [sample(tmp_path / "my sample", KEY_B, first=3),
               sample(tmp_path / "x", KEY_C, first=6)]
    follow_advice(identity_keys.rekey_advice(folders, keyed))
    assert [samples.read_key(f) for f in folders] == [KEY_A, KEY_A]


def test_same_organization_gives_each_folder_the_others_keys_and_one_ledger(tmp_path):
    """Through generate_data.py: each keeps its key, its ring names the other's, one ledger file."""
    for name in ("first", "second"):  # one source written twice, each under a new key
        dataset.generate(tmp_path / name, train_size=60, test_size=20, train_samples=1)
    folders = [*dataset.sample_folders(tmp_path / "first", "train"),
               *dataset.sample_folders(tmp_path / "second", "train")]
    # a ledger with nothing yet, and a folder without one
    (folders[0] / "privacy_ledger.jsonl").write_text("")
    own = [samples.read_key(f) for f in folders]
    proc = run_generate_data("--same-organization", *folders)
    assert proc.returncode == 0, proc.stderr
    assert "2 data sample folders made one organisation's: its 2 keys" in proc.stdout
    # each sample keeps its own key, so its identity
    assert [samples.read_key(f) for f in folders] == own
    assert [samples.read_ring(f) for f in folders] == [[own[1]], [own[0]]]
    assert all(oct((f / samples.RING_FILE).stat().st_mode)[-3:] == "600" for f in folders)
    first, second = (os.stat(f / "privacy_ledger.jsonl") for f in folders)
    # one file: a run on either is on both
    assert (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)
    read = samples.read_sample(folders[1])
    assert list(read.aliases) == [samples.key_id(folders[0])]
    # the same images
    assert set(read.aliases[samples.key_id(folders[0])]) == set(samples.read_sample(folders[0]).ids)
    # again: nothing changes
    assert run_generate_data("--same-organization", *folders).returncode == 0
    assert [samples.read_ring(f) for f in folders] == [[own[1]], [own[0]]]
