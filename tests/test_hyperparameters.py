import json

import pytest

from conftest import ALGO_ASSETS, FRAMEWORKS
from mnist_dp import hyperparameters
from mnist_dp.errors import UserError


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_asset_ships_valid_hyperparameters_with_the_same_keys(framework):
    hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME)
    assert hp.dp and hp.delta <= 1e-5


@pytest.mark.parametrize("changes, message", [
    ({"noise_multiplier": 0.0, "target_epsilon": None}, "noise_multiplier"),
    ({"noise_multiplier": -1.0, "target_epsilon": None}, "noise_multiplier"),
    ({"noise_multiplier": 1.0, "target_epsilon": 3.0}, "exactly one"),
    ({"noise_multiplier": None, "target_epsilon": None}, "exactly one"),
    ({"target_epsilon": 0}, "target_epsilon"),
    ({"epochs": 0}, "epochs"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"learning_rate": float("nan")}, "learning_rate"),
    ({"max_grad_norm": 0}, "max_grad_norm"),
    ({"momentum": 1.0}, "momentum"),
    ({"dp": "yes"}, "dp"),
    ({"lr": 0.1}, "unknown"),
])
def test_bad_values_are_named(tmp_path, changes, message):
    values = {**json.loads((ALGO_ASSETS[FRAMEWORKS[0]] / "hyperparameters.json").read_text()), **changes}
    path = tmp_path / "hp.json"
    path.write_text(json.dumps(values))
    with pytest.raises(UserError, match=message) as caught:
        hyperparameters.load(path)
    assert str(path) in str(caught.value)


def test_missing_key_and_bad_json(tmp_path):
    path = tmp_path / "hp.json"
    path.write_text('{"epochs": 1}')
    with pytest.raises(UserError, match="missing"):
        hyperparameters.load(path)
    path.write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        hyperparameters.load(path)


def test_baseline_ignores_noise_settings(tmp_path):
    values = {**json.loads((ALGO_ASSETS[FRAMEWORKS[0]] / "hyperparameters.json").read_text()),
              "dp": False, "noise_multiplier": None, "target_epsilon": None}
    assert hyperparameters.parse(values, "x").dp is False


def test_overrides_file(tmp_path):
    assert hyperparameters.load_overrides(None) == {}
    path = tmp_path / "o.json"
    path.write_text('{"epochs": 2}')
    assert hyperparameters.load_overrides(path) == {"epochs": 2}
    path.write_text("[1]")
    with pytest.raises(UserError, match="JSON object"):
        hyperparameters.load_overrides(path)
    with pytest.raises(UserError, match="cannot read"):
        hyperparameters.load_overrides(tmp_path / "missing.json")
