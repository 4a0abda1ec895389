"""Every file the bundle reads is one error line naming it when malformed, however it is malformed:
nested too deeply for Python's parser, or a model's metadata missing a field or holding another
shape than the one written."""
import hashlib
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO, ledger_event, rewrite_member, save_model

from mnist_dp import hyperparameters, search_space
from mnist_dp.orchestration import registry
from mnist_dp.privacy import data_ledger, model_file
from mnist_dp.utils.errors import UserError

DEEP = "[" * 100_000 + "]" * 100_000  # far deeper than Python's recursion limit


@pytest.mark.parametrize("reader", [
    lambda path: hyperparameters.load(path), lambda path: hyperparameters.load_overrides(path),
    lambda path: search_space.load(path), lambda path: registry.KeysFile(path),
])
def test_json_nested_too_deeply_is_one_line_naming_the_file(tmp_path, reader):
    path = tmp_path / "file.json"
    path.write_text(DEEP)
    with pytest.raises(UserError, match=rf"^{path}: nested too deeply to read"):
        reader(path)


def test_a_data_ledger_line_nested_too_deeply_is_refused_naming_the_line(tmp_path):
    data_ledger.path_of(tmp_path).write_text(DEEP + "\n")
    with pytest.raises(UserError, match=rf"^{data_ledger.path_of(tmp_path)}: line 1 is not a run "
                                        r"record .*nested too"):
        data_ledger.read([tmp_path])


def deep_member(path, member):
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    members[member] = DEEP.encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda meta: {k: v for k, v in meta.items() if k != "framework"},
     "its metadata has no framework"),
    (lambda meta: {**meta, "framework": ["torch"]}, "its metadata has no framework"),
    (lambda meta: {**meta, "hyperparameters": 3}, "its metadata has no hyperparameters"),
    (lambda meta: {k: v for k, v in meta.items() if k != "ledger_sha256"},
     "its metadata has no ledger_sha256"),
    (lambda meta: {**meta, "hyperparameters": {**meta["hyperparameters"],
                                               "aggregate_of": [{"run_id": ["x"]}]}},
     "its metadata is not as a train task writes it"),
    (lambda meta: {**meta, "hyperparameters": {**meta["hyperparameters"], "clip_quantile": 0.5,
                                               "clip_count_stddev": "x"}},
     "its metadata is not as a train task writes it"),
])
def test_a_model_whose_metadata_is_malformed_is_one_line_naming_it(tmp_path, edit, message):
    path = save_model(tmp_path / "m", [ledger_event()])
    rewrite_member(path, "meta.json", edit)
    with pytest.raises(UserError, match=rf"^{path}: {message}"):
        model_file.load(path)


def test_the_report_of_a_model_without_its_framework_is_one_line_and_exit_2(tmp_path):
    path = save_model(tmp_path / "m", [ledger_event()])
    rewrite_member(path, "meta.json",
                   lambda meta: {k: v for k, v in meta.items() if k != "framework"})
    proc = subprocess.run([sys.executable, REPO / "scripts" / "privacy_report.py", path],
                          capture_output=True, text=True)
    assert (proc.returncode == 2 and proc.stderr.startswith(f"error: {path}: ")
            and proc.stderr.count("\n") == 1)


@pytest.mark.parametrize("member", ["meta.json", "ledger.json"])
def test_a_model_member_nested_too_deeply_is_one_line_naming_it(tmp_path, member):
    path = save_model(tmp_path / "m", [ledger_event()])
    if member == "ledger.json":  # its digest recomputed, as whoever edits it would
        rewrite_member(path, "meta.json",
                       lambda meta: {**meta, "ledger_sha256": hashlib.sha256(DEEP.encode())
                                                        .hexdigest()})
    deep_member(path, member)
    with pytest.raises(UserError, match=rf"^{path}: .*nested too deeply"):
        model_file.load(path)
