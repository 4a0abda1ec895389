import json

import pytest
from conftest import ALGO_ASSETS, FRAMEWORKS, REPO

from mnist_dp import hyperparameters
from mnist_dp.utils.errors import UserError


def test_docs_hyperparameters_md_names_every_hyperparameter_and_network():
    text = (REPO / "docs" / "hyperparameters.md").read_text()
    assert [key for key in hyperparameters.KEYS if f"`{key}`" not in text] == []
    assert [name for name in hyperparameters.NETWORKS if f'`"{name}"`' not in text] == []


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_asset_ships_valid_hyperparameters_with_the_same_keys(framework):
    hp = hyperparameters.load(ALGO_ASSETS[framework] / hyperparameters.FILE_NAME)
    assert hp.dp and hp.delta <= 1e-5


@pytest.mark.parametrize("changes, message", [
    ({"noise_multiplier": 0.0, "target_epsilon": None}, "noise_multiplier"),
    ({"noise_multiplier": -1.0, "target_epsilon": None}, "noise_multiplier"),
    ({"noise_multiplier": 1.0, "target_epsilon": 3.0}, "exactly one"),
    ({"noise_multiplier": None, "target_epsilon": None}, "exactly one"),
    ({"target_epsilon": 0}, "target_epsilon"), ({"epochs": 0}, "epochs"),
    ({"batch_size": 2.5}, "batch_size"), ({"learning_rate": float("nan")}, "learning_rate"),
    ({"max_grad_norm": 0}, "max_grad_norm"), ({"momentum": 1.0}, "momentum"), ({"dp": "yes"}, "dp"),
    ({"lr": 0.1}, "unknown"), ({"features": "wavelets"},
     "features = \"wavelets\" must be one of \\['pixels', 'scattering'\\]"),
    ({"network": "resnet"},
     "network = \"resnet\" must be one of \\['cnn', 'small_cnn', 'linear'\\]"),
    ({"features": "pixels", "network": "linear"},
     "network = \"linear\" takes features \\['scattering'\\], not \"pixels\""),
    ({"activation": "sigmoid"}, "activation"), ({"optimizer": "rmsprop"}, "optimizer"),
    ({"ema_decay": 1.0}, "ema_decay"), ({"noise_decay": 0}, "noise_decay"),
    ({"clip_quantile": 1.5}, "clip_quantile"), ({"clip_count_stddev": -1.0}, "clip_count_stddev"),
])
def test_bad_values_are_named(tmp_path, changes, message):
    values = {**json.loads((ALGO_ASSETS[FRAMEWORKS[0]] / "hyperparameters.json").read_text()),
              **changes}
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
    assert not hyperparameters.load_overrides(None)
    path = tmp_path / "o.json"
    path.write_text('{"epochs": 2}')
    assert hyperparameters.load_overrides(path).values == {"epochs": 2}
    path.write_text("[1]")
    with pytest.raises(UserError, match="JSON object"):
        hyperparameters.load_overrides(path)
    with pytest.raises(UserError, match="not found"):
        hyperparameters.load_overrides(tmp_path / "missing.json")
    with pytest.raises(UserError, match="is a folder"):
        hyperparameters.load_overrides(tmp_path)
    path.write_bytes('{"epochs": 2} # é'.encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8 text"):
        hyperparameters.load_overrides(path)


@pytest.mark.parametrize("changes, message", [
    ({"dp": "false"}, 'dp = "false" is a string; it must be true or false'),
    ({"epochs": 2.0}, "epochs = 2.0 is a decimal number; it must be an integer"),
    ({"seed": True}, "seed = true is a boolean"), ({"delta": "1e-5"}, 'delta = "1e-5" is a string'),
    ({"learning_rate": [0.1]}, "learning_rate = .0.1. is an array"),
    ({"epochs": 1000000000}, "epochs = 1000000000 must be an integer from 1 to 10,000"),
    ({"target_epsilon": 1e9, "noise_multiplier": None},
     "target_epsilon = 1000000000.0 must be a number in .0, 100]"),
    ({"seed": -1}, "seed = -1 must be an integer from 0"),
    ({"delta": 1}, "delta = 1 must be a number in .0, 1."), ({"noise_seed": "7"},
     'noise_seed = "7" is a string; it must be an integer from 0 to 2147483647 or null'),
    ({"noise_seed": 7.0}, "noise_seed = 7.0 is a decimal number"),
    ({"noise_seed": -1}, "noise_seed = -1 must be an integer from 0 to 2147483647 or null"),
])
def test_every_hyperparameter_has_its_exact_json_type_and_an_error_names_the_users_file(
        tmp_path, changes, message):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(changes))
    with pytest.raises(UserError, match=message) as caught:
        hyperparameters.load_overrides(path)
    assert str(caught.value).startswith(f"{path}: ")


def test_replayable_noise_and_secure_mode_exclude_each_other(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"noise_seed": 3, "secure_mode": True}))
    asset = ALGO_ASSETS[FRAMEWORKS[0]] / hyperparameters.FILE_NAME
    with pytest.raises(UserError,
                       match="noise_seed = 3 makes the noise replayable, secure_mode asks"):
        hyperparameters.load(asset, hyperparameters.load_overrides(path))
    assert hyperparameters.load(asset).noise_seed is None  # fresh noise by default


def test_an_error_from_combining_the_users_file_with_the_assets_names_both(tmp_path):
    path = tmp_path / "mine.json"
    # the asset's target_epsilon stays: both given
    path.write_text(json.dumps({"noise_multiplier": 1.0}))
    asset = ALGO_ASSETS[FRAMEWORKS[0]] / hyperparameters.FILE_NAME
    with pytest.raises(UserError, match="exactly one") as caught:
        hyperparameters.load(asset, hyperparameters.load_overrides(path))
    assert str(caught.value).startswith(f"{asset} with {path}: ")


def test_a_key_given_twice_is_refused_naming_the_file_and_the_key(tmp_path):
    # Python's json keeps the last of the two: this file would train without DP under
    # a first line saying true.
    asset = json.loads((ALGO_ASSETS[FRAMEWORKS[0]] / hyperparameters.FILE_NAME).read_text())
    text = json.dumps(asset, indent=2)
    path = tmp_path / "hyperparameters.json"
    path.write_text(text.replace('"dp": true,', '"dp": true,\n  "dp": false,'))
    with pytest.raises(UserError, match=f'^{path}: key "dp" is given twice; keep one'):
        hyperparameters.load(path)
    overrides = tmp_path / "o.json"
    overrides.write_text('{"epochs": 2, "batch_size": 100, "epochs": 3}')
    with pytest.raises(UserError, match=f'^{overrides}: key "epochs" is given twice'):
        hyperparameters.load_overrides(overrides)
    path.write_text(text)  # the same keys once each: read
    assert hyperparameters.load(path).dp is asset["dp"]


def test_command_line_assignments_are_json_values_checked_as_a_files():
    assert hyperparameters.parse_assignments(["epochs=3", "activation=relu", "ema_decay=0.5",
                                              "max_epsilon=null"]) == {
        "epochs": 3, "activation": "relu", "ema_decay": 0.5, "max_epsilon": None}
    for items, message in ((["epochs"], "expected key=value"),
                           (["epochs=1", "epochs=2"], "given twice"),
                           (["epochs=1.5"], "--set: epochs = 1.5 is a decimal number"),
                           (["colour=red"], "colour")):
        with pytest.raises(UserError, match=message):
            hyperparameters.parse_assignments(items)


@pytest.mark.parametrize("changes, says", [
    ({"optimizer": "adam", "momentum": 0.5}, "momentum has no effect with optimizer \"adam\""),
    ({"network": "linear", "features": "scattering", "activation": "relu"},
     "activation has no effect with a network of one layer"),
    ({"clip_learning_rate": 0.5}, "clip_learning_rate has no effect with clip_quantile null"),
    ({"clip_count_stddev": 3.0}, "clip_count_stddev has no effect with clip_quantile null"),
])
def test_a_change_that_would_have_no_effect_is_refused_naming_the_users_file(changes, says):
    asset = ALGO_ASSETS["torch"] / hyperparameters.FILE_NAME
    with pytest.raises(UserError, match=f"^mine.json: {says}"):
        hyperparameters.load(asset, hyperparameters.Overrides(changes, "mine.json"))
    honoured = {**changes, "optimizer": "sgd", "network": "cnn", "clip_quantile": 0.5}
    assert hyperparameters.load(asset, hyperparameters.Overrides(honoured, "mine.json"))


def test_the_optimizers_settings_are_the_training_keys_and_no_privacy_setting():
    """What a framework's optimizer hook is given (Hyperparameters.training): four keys, none of
    which the privacy plan decides."""
    hp = hyperparameters.parse(json.loads((ALGO_ASSETS["torch"] / "hyperparameters.json")
                                          .read_text()), "x")
    training = hp.training
    assert training == hyperparameters.Training(hp.optimizer, hp.learning_rate, hp.momentum,
                                                hp.ema_decay)
    assert not {"delta", "max_grad_norm", "noise_multiplier", "secure_mode"} & set(vars(training))
