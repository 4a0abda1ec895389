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
