import json

import pytest

from mnist_dp import atomic


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
        other = subprocess.run([sys.executable, "-c", "import sys; from mnist_dp import atomic\n"
                                f"with atomic.exclusive({str(folder)!r}, '--output folder'): pass"],
                               capture_output=True, text=True, cwd=atomic.Path(atomic.__file__).parents[1])
        assert "another run (process" in other.stderr and "is writing to this --output folder" in other.stderr
    with atomic.exclusive(folder, "--output folder"):  # released when the holder is done
        pass


def test_an_output_folder_that_is_a_file_or_cannot_be_written_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(atomic.UserError, match="is a file; --output folder must be a folder"):
        with atomic.exclusive(tmp_path / "file", "--output folder"):
            pass
    with pytest.raises(atomic.UserError, match="cannot write it"):
        atomic.write_json(tmp_path / "file" / "keys.json", {})
    assert (tmp_path / "file").read_text() == "mine"
