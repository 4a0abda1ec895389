"""scripts/add_dataset_objective.py against a local client (subprocess backend)."""
import json
import subprocess
import sys

import pytest
from conftest import REPO, run_python

from mnist_dp.assets import load_asset_module
from mnist_dp.utils.errors import UserError

SCRIPT = REPO / "scripts" / "add_dataset_objective.py"


def test_writes_the_keys_file_and_a_rerun_reuses_every_key(
        tmp_path, tiny_data, capsys, monkeypatch):
    # A node keeps its assets and its organisation between runs; a local client keeps them for its
    # lifetime, so both runs share one client here (a new local client would be a new organisation).
    from mnist_dp.orchestration import connection

    client = connection.connect("subprocess", work_dir=tmp_path)
    monkeypatch.setattr(connection, "connect", lambda *args: client)
    script = load_asset_module(SCRIPT, "add_dataset_objective")
    keys_file = tmp_path / "assets_keys.json"
    argv = ["--data", str(tiny_data), "--keys-file", str(keys_file), "--folds", "2"]
    script.main(argv)
    first = json.loads(keys_file.read_text())
    assert [len(fold) for fold in first["train_data_sample_keys"]] == [1, 1]
    assert first["data"] == str(tiny_data) and first[
        "organization_id"] == client.organization_info().organization_id
    assert all(key in first["fingerprints"] for key in
               [first["dataset_key"], first["objective_key"], *first["test_data_sample_keys"]])
    counts = len(client.list_dataset()), len(client.list_data_sample()), len(client.list_function())
    script.main(argv)
    assert json.loads(keys_file.read_text()) == first
    assert (len(client.list_dataset()), len(client.list_data_sample()),
            len(client.list_function())) == counts
    assert "keys written to" in capsys.readouterr().out
    # no temporary left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["assets_keys.json", "local-worker"]


def test_help_and_bad_input(tmp_path, tiny_data):
    def run(*args):
        return run_python([SCRIPT, *args], tmp_path)

    assert "--keys-file" in run("--help").stdout
    proc = run("--data", tiny_data, "--folds", 5)
    assert proc.returncode == 2 and "--folds 5" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "assets_keys.json").write_text("[")
    proc = run("--data", tiny_data)
    assert (proc.returncode == 2 and "assets_keys.json: not valid JSON" in proc.stderr
            and "move it away" in proc.stderr)
    assert (tmp_path / "assets_keys.json").read_text() == "["  # never overwritten
    (tmp_path / "assets_keys.json").unlink()
    (tmp_path / "images.npy").write_text("not a folder")
    proc = run("--data", tmp_path / "images.npy")
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"error: {tmp_path / 'images.npy'}: is a file")
    assert ("Traceback" not in proc.stderr
            and (tmp_path / "images.npy").read_text() == "not a folder")


def test_missing_keys_file_for_the_train_script(tmp_path):
    script = load_asset_module(REPO / "scripts" / "add_train_algo_cnn_dp.py",
                               "add_train_algo_cnn_dp")
    with pytest.raises(UserError, match="run scripts/add_dataset_objective.py first"):
        script.main(["--keys-file", str(tmp_path / "none.json")])


def test_examples_shared_between_an_organisations_samples_are_refused_at_registration(
        tmp_path, tiny_data):
    from test_run_local import shuffled_copy

    data = shuffled_copy(tiny_data, tmp_path / "data")
    proc = run_python([SCRIPT, "--data", data], tmp_path)
    assert (proc.returncode == 2 and "share 150 examples" in proc.stderr
            and "Traceback" not in proc.stderr)
    assert not (tmp_path / "assets_keys.json").exists()  # nothing registered


def test_a_read_only_keys_folder_is_one_line(tmp_path, tiny_data):
    from conftest import WITHOUT_WRITE_OVERRIDE

    (tmp_path / "ro").mkdir(mode=0o555)
    proc = subprocess.run([*WITHOUT_WRITE_OVERRIDE, sys.executable, SCRIPT, "--data", tiny_data,
                           "--keys-file", tmp_path / "ro" / "keys.json"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert (proc.returncode == 2 and proc.stderr.startswith("error: ")
            and "Traceback" not in proc.stderr), proc.stderr
    assert "Permission denied" in proc.stderr


def test_a_declared_size_far_from_the_data_is_refused_in_one_line_before_anything_is_registered(
        tmp_path, tiny_data):
    """--public-size far from a sample's count is refused before it is written; a declaration
    written by hand far from a fold's count is refused before anything is registered; one within a
    tenth is declared and registered."""
    import shutil

    from mnist_dp.privacy import policy

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    before = {f: f.read_text() for f in data.glob(f"train/*/{policy.POLICY_FILE}")}

    def run(*args):
        return run_python([SCRIPT, "--data", data, *args], tmp_path)

    proc = run("--public-size", 200)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (f"{data / 'train' / '0'}: holds 150 images but declares a public size of 200, more "
            "than 10% away") in proc.stderr
    assert {f: f.read_text() for f in before} == before  # nothing declared
    policy.declare_size(data / "train" / "1", 100)
    proc = run("--folds", 2)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{data}, fold 2: holds 150 images but declares a public size of 100" in proc.stderr
    assert not (tmp_path / "assets_keys.json").exists()  # nothing registered
    proc = run("--public-size", 160)
    assert proc.returncode == 0, proc.stderr
    assert [policy.read(f).public_size for f in sorted(data.glob("train/*"))] == [160, 160]
