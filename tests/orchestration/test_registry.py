"""The keys file and registration with reuse, against a local Substra client (subprocess
backend)."""
import json

import pytest

from mnist_dp.orchestration import connection, registry
from mnist_dp.utils.errors import UserError


@pytest.fixture
def client(tmp_path):
    return connection.connect("subprocess", work_dir=tmp_path)


def test_reuse_or_register_registers_once_per_content(client, tmp_path, tiny_data):
    keys = registry.KeysFile(tmp_path / "keys.json")
    calls = []

    def register():
        calls.append(1)
        return registry.register_dataset(client, registry.KeysFile(), f"MNIST {len(calls)}",
                                         client.organization_info().organization_id)

    first = keys.reuse_or_register(client, "dataset", "content-a", register)
    assert keys.reuse_or_register(client, "dataset", "content-a",
                                  register) == first and len(calls) == 1
    assert keys.reuse_or_register(client, "dataset", "content-b",
                                  register) != first and len(calls) == 2
    # A key the node does not know (e.g. a keys file from another node) is
    # registered again and dropped.
    keys.content["fingerprints"] = {"not-on-this-node": "content-c"}
    fresh = keys.reuse_or_register(client, "dataset", "content-c", register)
    assert len(calls) == 3 and json.loads(
        keys.path.read_text())["fingerprints"] == {fresh: "content-c"}


def test_keys_file_holds_folds_and_a_rerun_reuses_every_key(client, tmp_path, tiny_data):
    path = tmp_path / "assets_keys.json"
    registry.register_dataset_objective(client, registry.KeysFile(path), tiny_data, 2,
                                        tmp_path / "build")
    written = json.loads(path.read_text())
    assert {"dataset_key", "objective_key", "train_data_sample_keys", "test_data_sample_keys",
            "organization_id", "data", "fingerprints"} <= set(written)
    # 2 train samples, 2 folds
    assert [len(fold) for fold in written["train_data_sample_keys"]] == [1, 1]
    assert len(written["test_data_sample_keys"]) == 1
    datasets, functions = len(client.list_dataset()), len(client.list_function())

    registry.register_dataset_objective(client, registry.KeysFile(path), tiny_data, 2,
                                        tmp_path / "build")
    assert json.loads(path.read_text()) == written
    assert (len(client.list_dataset()), len(client.list_function())) == (datasets, functions)
    assert sorted(p.name
                  for p in tmp_path.iterdir()) == ["assets_keys.json", "build", "local-worker"]


def test_a_failure_half_way_keeps_the_keys_obtained(client, tmp_path, tiny_data, monkeypatch):
    def broken(*args):
        raise UserError("objective refused")

    monkeypatch.setattr(registry, "register_objective", broken)
    path = tmp_path / "assets_keys.json"
    with pytest.raises(UserError, match="objective refused"):
        registry.register_dataset_objective(client, registry.KeysFile(path), tiny_data, 1,
                                            tmp_path / "build")
    written = json.loads(path.read_text())
    assert "objective_key" not in written
    assert client.get_dataset(written["dataset_key"]).key == written["dataset_key"]
    assert len(written["fingerprints"]) == 1 + 2 + 1  # dataset, 2 train samples, 1 test sample


def test_bad_keys_file_and_bad_folds(client, tmp_path, tiny_data):
    path = tmp_path / "assets_keys.json"
    path.write_text("{not json")
    with pytest.raises(UserError, match=r"assets_keys.json: not valid JSON \(.*\); fix the keys "
                                        r"file or move it away"):
        registry.KeysFile(path)
    path.write_text("{}")
    with pytest.raises(UserError, match="no 'dataset_key'.*add_dataset_objective"):
        registry.KeysFile(path).require("dataset_key")
    with pytest.raises(UserError, match="--folds 3"):
        registry.register_dataset_objective(client, registry.KeysFile(path), tiny_data, 3,
                                            tmp_path / "build")



@pytest.mark.parametrize("field, value", [
    ("fingerprints", ["a"]), ("fingerprints", {"key": 3}), ("algos", {"torch": "train"}),
    ("algos", []), ("compute_plans", {"torch": {"key": "k"}}), ("dataset_key", 7),
])
def test_a_keys_file_field_of_another_shape_is_refused_when_read_before_any_work(tmp_path, field,
                                                                                 value):
    """Every field a script reads back is checked as the file is read: a second run of
    add_dataset_objective.py (fingerprints) or add_train_algo_cnn_dp.py (algos) must not crash
    after registering."""
    path = tmp_path / "assets_keys.json"
    path.write_text(json.dumps({"organization_id": "MyOrg1MSP", field: value}))
    with pytest.raises(UserError, match=f"^{path}: {field} = .* must be an object|^{path}: "
                                        f"{field} = .* must be an asset key"):
        registry.KeysFile(path)


def test_a_keys_file_with_a_key_given_twice_is_refused(tmp_path):
    path = tmp_path / "assets_keys.json"
    path.write_text('{"dataset_key": "a", "objective_key": "b", "dataset_key": "c"}')
    with pytest.raises(UserError, match=f'^{path}: key "dataset_key" is given twice; keep one'):
        registry.KeysFile(path)
