import json
import os
import stat

import pytest

from mnist_dp.learning import model_io, predictions
from mnist_dp.privacy import model_file
from mnist_dp.utils import atomic
from mnist_dp.utils.errors import UserError


def test_write_json_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "keys.json"
    atomic.write_json(path, {"a": 1})
    atomic.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["keys.json"]


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "keys.json"
    atomic.write_json(path, {"a": 1})
    with pytest.raises(ValueError):
        atomic.write_json(path, {"a": float("nan")})  # strict JSON
    with pytest.raises(RuntimeError):
        with atomic.replacing(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash half-way")
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["keys.json"]


def test_an_output_folder_is_held_by_one_process_at_a_time(tmp_path):
    import subprocess
    import sys

    folder = tmp_path / "results"
    with atomic.exclusive(folder, "--output folder"):
        other = subprocess.run([sys.executable, "-c",
                                "import sys; from mnist_dp.utils import atomic\nwith "
                                f"atomic.exclusive({str(folder)!r}, '--output folder'): pass"],
                               capture_output=True, text=True,
                               cwd=atomic.Path(atomic.__file__).parents[2])
        assert ("another run (process" in other.stderr
                and "is writing to this --output folder" in other.stderr)
    with atomic.exclusive(folder, "--output folder"):  # released when the holder is done
        pass
    assert not (folder / atomic.LOCK_FILE).exists()  # no lock naming a process that has ended


def test_a_lock_removed_by_the_run_that_ends_is_not_held_by_a_run_that_opened_it_before(
        tmp_path, monkeypatch):
    """A run that opened the lock file just before the holder removed it must not take that
    removed file, which a third run could not see: it takes the one at the path."""
    folder = tmp_path / "results"
    folder.mkdir()
    opened = []
    real_open = open

    def open_then_lose_it(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        if not opened:  # the holder ends between this run's open and its lock
            opened.append(path)
            atomic.os.unlink(path)
        return handle

    monkeypatch.setattr("builtins.open", open_then_lose_it)
    with atomic.exclusive(folder, "--output folder"):
        assert (folder / atomic.LOCK_FILE).read_text() == f"{atomic.os.getpid()}\n"
    assert len(opened) == 1


def test_an_output_folder_that_is_a_file_or_cannot_be_written_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(atomic.UserError, match="is a file; --output folder must be a folder"):
        with atomic.exclusive(tmp_path / "file", "--output folder"):
            pass
    with pytest.raises(atomic.UserError, match="cannot write it"):
        atomic.write_json(tmp_path / "file" / "keys.json", {})
    assert (tmp_path / "file").read_text() == "mine"


def _model(path, weights):
    from conftest import ledger_event, save_model

    return save_model(path, [ledger_event()], weights)


# Every file a task writes, as (write(path, version), read(path)): a model, predictions, the ε
# (performance) file; and a report's JSON.
WRITERS = {
    "model": (lambda path, v: _model(path, bytes([v]) * 50_000),
              lambda path: model_file.load(path).weights[0]),
    "predictions": (lambda path, v: predictions.save(path, [v] * 10_000),
                    lambda path: predictions.load(path, 10_000)[0]),
    "epsilon": (lambda path, v: model_io.save_epsilon(path, v),
                lambda path: json.loads(path.read_text())["all"]),
    "report": (lambda path, v: atomic.write_json(path, [v] * 10_000),
               lambda path: json.loads(path.read_text())[0]),
}


@pytest.mark.parametrize("name", WRITERS)
def test_a_full_disk_is_one_user_error_and_the_previous_file_stays_readable(name, tmpfs):
    from conftest import fill_disk

    write, read = WRITERS[name]
    disk = tmpfs("size=1m")
    path = disk / name  # extension-less, as Substra's output paths
    write(path, 1)
    before = path.read_bytes()
    fill_disk(disk)
    with pytest.raises(UserError) as error:
        write(path, 2)
    assert str(error.value).startswith(f"{path}: cannot write it (No space left on device) (the "
                                       "previous file is unchanged); free space on the disk of "
                                       f"{disk}")
    assert path.read_bytes() == before and read(path) == 1
    # no temporary file left
    assert sorted(p.name for p in disk.iterdir()) == sorted(["filler", name])
    (disk / "filler").unlink()
    write(path, 2)  # space again: written
    assert read(path) == 2


def test_a_read_only_folder_is_one_user_error(tmpfs):
    disk = tmpfs("ro")
    with pytest.raises(UserError, match=f"^{disk}/model: cannot write it .Read-only file system.; "
                                        f"make {disk} writable or choose another path$"):
        _model(disk / "model", b"w")


def test_a_replaced_file_keeps_its_mode_and_a_new_one_gets_the_umask(tmp_path):
    path = tmp_path / "results.json"
    old = os.umask(0o027)
    try:
        atomic.write_json(path, {})
        assert stat.S_IMODE(path.stat().st_mode) == 0o640  # not mkstemp's 0600
        path.chmod(0o604)
        atomic.write_json(path, {"a": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o604
    finally:
        os.umask(old)
