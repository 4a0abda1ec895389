"""mnist_dp/data/dataset_folder.py: the manifest that marks a folder as generate_data's, what an
output folder must be, data whose ledgers record runs never replaced, moving a new dataset in, and
the leftovers of killed runs removed (those of a running writer left alone)."""
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import REPO, WITHOUT_WRITE_OVERRIDE

from mnist_dp.data import dataset, dataset_folder
from mnist_dp.privacy.data_ledger import LEDGER_FILE
from mnist_dp.utils.errors import UserError

SCRIPT = REPO / "scripts" / "generate_data.py"
LEGACY = {"source": "embedded", "seed": 0, "train_examples": 4000, "test_examples": 1000,
          "train_samples": 1}


def write_folder(dest, manifest=None, entries=("train/0", "test/0"), tag="old"):
    """A dataset folder laid out as generate_data's: `entries` (folders holding a file `tag`) and
    manifest.json (`manifest`, JSON-dumped unless bytes; none when None)."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        (dest / entry).mkdir(parents=True)
        (dest / entry / "content").write_text(tag)
    if manifest is not None:
        data = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
        (dest / "manifest.json").write_bytes(data)
    return dest


def ours(dest, **manifest):
    return write_folder(dest, {"written_by": "mnist_dp generate_data", **manifest})


def tree(folder):
    """{relative path: text} of every file under `folder`."""
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def script_error(*args, prefix=(), **kwargs) -> str:
    """The only stderr line of generate_data.py run with `args` (under `prefix`), after checking
    that it failed as a user error (exit 2, no traceback)."""
    proc = subprocess.run([*prefix, sys.executable, SCRIPT, *map(str, args)], capture_output=True,
                          text=True, **kwargs)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.fixture
def dead_pid():
    """The pid of a process that has ended."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(gone.stdout)


# --- the manifest


def test_a_manifest_generate_data_wrote_is_read_back_as_ours(tmp_path):
    """A manifest whose written_by is generate_data's mark is returned whole."""
    ours(tmp_path / "d", seed=3, organizations=2)
    assert dataset_folder.WRITTEN_BY == "mnist_dp generate_data"
    assert dataset_folder.read_manifest(tmp_path / "d") == {
        "written_by": "mnist_dp generate_data", "seed": 3, "organizations": 2}


def test_a_legacy_manifest_is_ours_only_with_exactly_its_five_keys(tmp_path):
    """A manifest from before written_by is ours when its keys are the legacy ones, no more, no
    fewer."""
    write_folder(tmp_path / "legacy", LEGACY)
    write_folder(tmp_path / "more", {**LEGACY, "organizations": 1})
    write_folder(tmp_path / "fewer", {k: v for k, v in LEGACY.items() if k != "seed"})
    assert dataset_folder.read_manifest(tmp_path / "legacy") == LEGACY
    assert dataset_folder.read_manifest(tmp_path / "more") is None
    assert dataset_folder.read_manifest(tmp_path / "fewer") is None


@pytest.mark.parametrize("manifest", [
    {"written_by": "another tool"}, {**LEGACY, "written_by": "another tool"}, {"written_by": None},
    ["mnist_dp generate_data"], "mnist_dp generate_data", None,
], ids=["other-writer", "legacy-keys-other-writer", "null-writer", "list", "string", "null"])
def test_a_manifest_of_other_json_is_not_ours(tmp_path, manifest):
    """JSON that is not an object with generate_data's mark (or the legacy keys) is not ours."""
    write_folder(tmp_path / "d", json.dumps(manifest).encode())
    assert dataset_folder.read_manifest(tmp_path / "d") is None


@pytest.mark.parametrize("content", [b"", b"not json", b'{"written_by": ',
                                     b'\xff\xfe{"written_by": "mnist_dp generate_data"}'],
                         ids=["empty", "text", "truncated", "not-utf8"])
def test_a_manifest_that_is_not_json_is_not_ours(tmp_path, content):
    """A manifest.json that cannot be parsed marks nothing: not ours, and no error."""
    write_folder(tmp_path / "d", content)
    assert dataset_folder.read_manifest(tmp_path / "d") is None


def test_a_missing_manifest_is_not_ours(tmp_path):
    """No folder, no manifest, or a folder named manifest.json: not ours."""
    write_folder(tmp_path / "empty", entries=())
    write_folder(tmp_path / "unmarked")
    (write_folder(tmp_path / "folder", entries=()) / "manifest.json").mkdir()
    for name in ("missing", "empty", "unmarked", "folder"):
        assert dataset_folder.read_manifest(tmp_path / name) is None, name


def test_a_manifest_holding_a_key_twice_is_named_rather_than_guessed(tmp_path):
    """JSON the bundle refuses to read (a key given twice) is a UserError naming the file."""
    write_folder(tmp_path / "d", b'{"written_by": "x", "written_by": "mnist_dp generate_data"}')
    with pytest.raises(UserError, match=r'manifest\.json: key "written_by" is given twice'):
        dataset_folder.read_manifest(tmp_path / "d")


def test_force_never_touches_a_folder_generate_data_did_not_write(tmp_path):
    """The script refuses, in one line and even with --force, a folder without our manifest."""
    userdir = tmp_path / "userdir"
    userdir.mkdir()
    (userdir / "notes.txt").write_text("mine")
    line = script_error("--output", userdir, "--force")
    assert line == (f"error: {userdir}: holds files generate_data did not write (notes.txt); "
                    "choose a new or empty folder")
    assert [p.name
            for p in userdir.iterdir()] == ["notes.txt"] and (
                    userdir / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["userdir"]  # no temporary folder left either


# --- check_output


def test_an_output_that_is_a_file_or_a_dangling_link_is_refused(tmp_path):
    """An output path that is not a folder is refused saying what it is, and left as it was."""
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    for name, what in (("file", "a file"), ("link", "not a folder")):
        for force in (False, True):
            with pytest.raises(UserError) as refused:
                dataset_folder.check_output(tmp_path / name, force)
            assert str(refused.value) == (f"{tmp_path / name}: is {what}; the data samples are "
                                          "written to a folder: give the path of a new folder")
    assert (tmp_path / "file").read_text() == "not a folder" and (tmp_path / "link").is_symlink()


def test_an_output_that_is_a_file_is_one_clear_error(tmp_path):
    """The script and the scripts' default data both refuse a file as the output, in one line."""
    path = tmp_path / "data"
    path.write_text("not a folder")
    line = script_error("--output", path)
    assert line == (f"error: {path}: is a file; the data samples are written to a folder: give the "
                    "path of a new folder")
    with pytest.raises(UserError, match="is a file"):
        dataset.generate_default_if_missing(path, train_samples=1)
    assert path.read_text() == "not a folder"


@pytest.mark.parametrize("read_only", ["parent folder", "output folder"])
def test_a_folder_that_cannot_be_written_is_named(tmp_path, read_only):
    """A read-only parent or output folder is named up front, and nothing is written in it."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    output = locked / "data" if read_only == "parent folder" else locked
    line = script_error("--output", output, prefix=WITHOUT_WRITE_OVERRIDE, cwd=tmp_path)
    assert (line == f"error: {locked}: cannot write in this folder (permission denied); choose a "
                    "folder you can write to")
    assert list(locked.iterdir()) == []


def test_a_missing_or_empty_output_passes_without_force(tmp_path):
    """Nothing to lose: a new or empty folder is accepted as it is, and not created."""
    (tmp_path / "empty").mkdir()
    assert dataset_folder.check_output(tmp_path / "empty", False) is None
    assert dataset_folder.check_output(tmp_path / "new" / "d", False) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


@pytest.mark.parametrize("force", [False, True])
def test_foreign_files_are_refused_even_with_force_naming_five_of_them(tmp_path, force):
    """A folder of files generate_data did not write is refused, the first five names listed."""
    dest = tmp_path / "d"
    dest.mkdir()
    for name in ("g", "b", "f", "a", "e", "c", "d"):
        (dest / name).write_text("mine")
    with pytest.raises(UserError) as refused:
        dataset_folder.check_output(dest, force)
    assert str(refused.value) == (f"{dest}: holds files generate_data did not write (a, b, c, d, "
                                  "e, ...); choose a new or empty folder")
    assert len(list(dest.iterdir())) == 7


def test_a_manifest_that_is_not_ours_is_refused_asking_to_restore_it(tmp_path):
    """A folder whose manifest.json is not generate_data's may hold the user's files: refused."""
    dest = write_folder(tmp_path / "d", {"written_by": "another tool"}, entries=())
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as refused:
        dataset_folder.check_output(dest, True)
    assert str(refused.value) == (
        f"{dest}: its manifest.json is unreadable or not generate_data's, so it may hold files "
        "generate_data did not write (manifest.json, notes.txt): restore that file, or choose a "
        "new or empty folder")


def test_our_folder_is_refused_without_force_and_accepted_with_it(tmp_path):
    """A folder generate_data wrote (new or legacy manifest) is replaced only when asked."""
    for dest in (ours(tmp_path / "d"), write_folder(tmp_path / "legacy", LEGACY)):
        before = tree(dest)
        with pytest.raises(UserError) as refused:
            dataset_folder.check_output(dest, False)
        assert str(refused.value) == (
            f"{dest} already holds data samples generate_data wrote; pass --force to replace them "
            "(its train/, test/ and manifest.json; other files in it are kept)")
        assert dataset_folder.check_output(dest, True) is None
        assert tree(dest) == before


# --- refuse_losing_ledgers


def test_a_sample_whose_ledger_records_runs_keeps_its_folder_from_being_replaced(tmp_path):
    """A non-empty data_ledger.LEDGER_FILE in a data sample refuses --force, naming that file, and
    without --force the same refusal comes first: advice to pass --force would not work."""
    dest = ours(tmp_path / "d")
    write_folder(dest, entries=("train/1",))
    ledger = dest / "train" / "1" / LEDGER_FILE
    ledger.write_text('{"run": 1}\n')
    message = (f"{dest}: its data samples' own ledgers record the runs released from them "
               f"({ledger}): replacing or splitting them again would lose what they have spent; "
               "keep this folder, and write the new data to another one with the keys of its "
               "organisations, whose ledgers the new samples then share (--output OTHER "
               f"--key-from {dest / 'train' / '0'}, one sample per organisation, with "
               "generate_data.py; --data OTHER with the scripts)")
    with pytest.raises(UserError) as refused:
        dataset_folder.refuse_losing_ledgers(dest)
    assert str(refused.value) == message
    for force in (True, False):
        with pytest.raises(UserError) as refused:
            dataset_folder.check_output(dest, force)
        assert str(refused.value) == message
    assert ledger.read_text() == '{"run": 1}\n'


def test_the_refusal_names_the_first_ledger_and_counts_the_others(tmp_path):
    """Ledgers in train and test samples: the first train sample's named, the rest counted."""
    dest = ours(tmp_path / "d")
    write_folder(dest, entries=("train/1",))
    for sample in ("test/0", "train/1", "train/0"):
        (dest / sample / LEDGER_FILE).write_text("{}\n")
    with pytest.raises(UserError, match=f"\\({dest / 'train' / '0' / LEDGER_FILE} and 2 more\\): "):
        dataset_folder.refuse_losing_ledgers(dest)


def test_empty_ledgers_and_other_files_lose_nothing(tmp_path):
    """Empty ledgers, other files of a sample, or no samples at all: nothing is refused."""
    dest = ours(tmp_path / "d")
    (dest / "train" / "0" / LEDGER_FILE).write_text("")
    (dest / "test" / "0" / "notes.jsonl").write_text('{"run": 1}\n')
    assert dataset_folder.refuse_losing_ledgers(dest) is None
    assert dataset_folder.check_output(dest, True) is None
    assert dataset_folder.refuse_losing_ledgers(tmp_path / "missing") is None


# --- move_in


@pytest.mark.parametrize("dest_exists", [False, True], ids=["missing", "empty"])
def test_a_dataset_moves_into_a_missing_or_empty_folder_whole(tmp_path, dest_exists):
    """The built folder becomes the output folder, and is gone from where it was built."""
    tmp = write_folder(tmp_path / ".d-partial", {"written_by": "new"}, tag="new")
    built = tree(tmp)
    if dest_exists:
        (tmp_path / "d").mkdir()
    dataset_folder.move_in(tmp, tmp_path / "d")
    assert tree(tmp_path / "d") == built and not tmp.exists()


def test_moving_into_our_folder_replaces_our_entries_and_keeps_the_users_files(tmp_path):
    """train/, test/ and manifest.json are replaced; a user's other files stay; the old entries go
    into the built folder's replaced/, removed with it."""
    dest = ours(tmp_path / "d")
    (dest / "notes.txt").write_text("mine")
    write_folder(dest, entries=("plots",), tag="plot")
    tmp = write_folder(tmp_path / ".d-partial", {"written_by": "new"},
                       entries=("train/0", "train/1", "test/0"), tag="new")
    dataset_folder.move_in(tmp, dest)
    assert tree(dest) == {"manifest.json": '{"written_by": "new"}', "notes.txt": "mine",
                          "plots/content": "plot", "test/0/content": "new",
                          "train/0/content": "new", "train/1/content": "new"}
    assert tree(tmp) == {"replaced/train/0/content": "old", "replaced/test/0/content": "old"}


def test_moving_into_our_folder_that_lost_its_test_folder(tmp_path):
    """An entry of ours missing from the folder is simply added."""
    dest = write_folder(tmp_path / "d", {"written_by": "mnist_dp generate_data"},
                        entries=("train/0",))
    tmp = write_folder(tmp_path / ".d-partial", {"written_by": "new"}, tag="new")
    dataset_folder.move_in(tmp, dest)
    assert tree(dest) == {"manifest.json": '{"written_by": "new"}', "test/0/content": "new",
                          "train/0/content": "new"}
    assert tree(tmp) == {"replaced/train/0/content": "old"}


# --- remove_abandoned


def partial_folders(parent):
    return sorted(p for p in parent.iterdir() if "-partial-" in p.name)


def test_a_killed_run_leaves_a_partial_folder_that_the_next_run_removes(tmp_path):
    """A generate_data run killed while writing leaves its partial folder; the next run removes
    it."""
    for attempt in range(3):
        # 4,000 sample folders take about a second to write: the run is killed in the middle.
        proc = subprocess.Popen([sys.executable, SCRIPT, "--output", tmp_path / f"d{attempt}",
                                 "--train-samples", "4000"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if any((p / "train").is_dir() for p in partial_folders(tmp_path)):
                break
            time.sleep(0.002)
        proc.kill()
        proc.wait()
        if partial_folders(tmp_path):
            break
    else:
        pytest.fail("generate_data ended each time before it could be killed in the middle of "
                    "writing")
    [partial] = partial_folders(tmp_path)
    assert (partial.name.startswith(f".d{attempt}-partial-{proc.pid}-")
            and (partial / "train").is_dir())
    assert not (tmp_path / f"d{attempt}").exists()  # the interrupted run left no half dataset
    dataset.generate(tmp_path / "next", train_size=50, test_size=10)
    assert partial_folders(tmp_path) == []


def test_partial_folders_of_a_running_writer_or_not_laid_out_as_ours_are_left_alone(
        tmp_path, dead_pid):
    """generate removes a dead writer's partial folder, not a live one's nor one of other files."""
    abandoned = tmp_path / f".d-partial-{dead_pid}-0123abcd"
    running = tmp_path / f".d-partial-{os.getpid()}-0123abcd"  # this test's own process: alive
    not_ours = tmp_path / f".notes-partial-{dead_pid}-0123abcd"
    for folder in (abandoned, running):
        (folder / "train" / "0").mkdir(parents=True)
    not_ours.mkdir()
    (not_ours / "diary.txt").write_text("mine")
    dataset.generate(tmp_path / "d", train_size=50, test_size=10)
    assert partial_folders(tmp_path) == sorted([running, not_ours])


def test_a_dead_writers_folder_of_our_entries_is_removed_saying_so(tmp_path, dead_pid, capsys):
    """Every entry a partial folder may hold (replaced/ too): removed, one line printed."""
    partial = write_folder(tmp_path / f".data-partial-{dead_pid}-9f", {},
                           entries=("train/0", "test/0", "replaced/train/0"))
    (tmp_path / "data").mkdir()
    dataset_folder.remove_abandoned(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    assert capsys.readouterr().out == (f"removed {partial}: left by a generate_data run (pid "
                                       f"{dead_pid}) that was interrupted\n")


@pytest.mark.parametrize("name", ["d-partial-{pid}-ab", ".d-partial-{pid}-AB", ".d-partial-{pid}",
                                  ".d-partial-0-ab", ".d-partial-12345678-ab",
                                  ".d-partial-{pid}-ab.bak"])
def test_only_folders_named_as_ours_are_removed(tmp_path, dead_pid, capsys, name):
    """A name that is not `.NAME-partial-<pid>-<hex>` (pid of 1 to 7 digits) is not ours."""
    folder = write_folder(tmp_path / name.format(pid=dead_pid))
    dataset_folder.remove_abandoned(tmp_path)
    assert tree(folder) == {"test/0/content": "old", "train/0/content": "old"}
    assert capsys.readouterr().out == ""


def test_a_link_or_a_file_named_as_a_partial_folder_is_left_alone(tmp_path, dead_pid):
    """Only a real folder is removed: not a link (nor what it points to), not a file."""
    target = write_folder(tmp_path / "target")
    (tmp_path / f".d-partial-{dead_pid}-ab").symlink_to(target)
    (tmp_path / f".e-partial-{dead_pid}-ab").write_text("a file")
    dataset_folder.remove_abandoned(tmp_path)
    assert (tmp_path / f".d-partial-{dead_pid}-ab").is_symlink()
    assert tree(target) == {"test/0/content": "old", "train/0/content": "old"}
    assert (tmp_path / f".e-partial-{dead_pid}-ab").read_text() == "a file"


def test_a_writer_running_as_another_user_counts_as_running(tmp_path, dead_pid, monkeypatch):
    """A pid that exists but may not be signalled (another user's process) is a running writer."""
    folder = write_folder(tmp_path / f".d-partial-{dead_pid}-ab")

    def not_permitted(pid, signal):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", not_permitted)
    dataset_folder.remove_abandoned(tmp_path)
    assert folder.is_dir()


def test_a_missing_parent_has_nothing_to_remove(tmp_path):
    """A parent folder that does not exist yet is no error."""
    assert dataset_folder.remove_abandoned(tmp_path / "missing") is None


# --- folder_entries, listed


def test_folder_entries_are_every_name_sorted_and_none_for_a_missing_folder(tmp_path):
    """Hidden names included, sorted by code point; a missing folder has no entries."""
    for name in ("b", ".hidden", "A"):
        (tmp_path / name).write_text("")
    (tmp_path / "c").mkdir()
    assert dataset_folder.folder_entries(tmp_path) == [".hidden", "A", "b", "c"]
    assert dataset_folder.folder_entries(tmp_path / "missing") == []


def test_listed_shows_at_most_the_limit_then_an_ellipsis():
    """Names joined by commas, cut after `limit` (5 by default) with ", ..."."""
    assert dataset_folder.listed([]) == ""
    assert dataset_folder.listed(list("abcde")) == "a, b, c, d, e"
    assert dataset_folder.listed(list("abcdef")) == "a, b, c, d, e, ..."
    assert dataset_folder.listed(list("abc"), limit=2) == "a, b, ..."
