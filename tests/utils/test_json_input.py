"""mnist_dp/utils/json_input.py: every JSON file the bundle reads is read strictly, and each way it
can be wrong is one UserError naming the file (tests/utils/test_malformed_files.py drives the same
through every reader)."""
import json

import pytest

from mnist_dp.utils.errors import UserError
from mnist_dp.utils.json_input import loads, read
from mnist_dp.utils.options import MAX_DIGITS


def test_a_valid_file_reads_as_pythons_json_does(tmp_path):
    value = {"dp": True, "epochs": 30, "delta": 1e-5, "seed": None, "list": [1, "a"], "ε": "δ"}
    (tmp_path / "ok.json").write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
    assert read(tmp_path / "ok.json", "hyperparameters file") == value


@pytest.mark.parametrize("text, message", [
    ('{"dp": true, "dp": false}', 'key "dp" is given twice'),
    ('{"a": {"b": 1, "b": 2}}', 'key "b" is given twice'),
    ("1" * (MAX_DIGITS + 1), f"an integer of {MAX_DIGITS + 1:,} digits"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
])
def test_what_pythons_json_would_accept_silently_or_with_a_traceback_is_refused(text, message):
    with pytest.raises(UserError, match=f"^f.json: {message}"):
        loads(text, "f.json")


@pytest.mark.parametrize("make, message", [
    (lambda path: None, "hyperparameters file not found"),
    (lambda path: path.mkdir(), "is a folder; give the path of the hyperparameters file"),
    (lambda path: path.write_bytes(b'{"a": "\xff"}'), "not UTF-8 text"),
    (lambda path: path.write_text('{"a": 1,}'), "not valid JSON"),
])
def test_a_file_that_cannot_be_read_as_json_is_one_error_naming_it(tmp_path, make, message):
    path = tmp_path / "hp.json"
    make(path)
    with pytest.raises(UserError) as refused:
        read(path, "hyperparameters file")
    assert str(refused.value).startswith(f"{path}: ") and message in str(refused.value)
