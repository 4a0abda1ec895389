"""mnist_dp/learning/functions.py: an algo asset registers train, predict, aggregate, tune and
genesis with substratools, each calling its own body with the asset's framework and hyperparameters
file (the genesis, which trains nothing, with neither), and refusing an input it does not use."""
from pathlib import Path

import pytest
import substratools

from mnist_dp.learning import functions, search, skeleton
from mnist_dp.utils.errors import UserError

FRAMEWORK = object()  # stands for the asset's Framework: run only passes it on
HYPERPARAMETERS = Path("/asset/hyperparameters.json")

# Every input each function takes (the opener aside), as docs/design.md's contract lists them.
INPUTS = {"train": {"datasamples", "model", "ledger"}, "tune": {"datasamples", "ledger"},
          "predict": {"datasamples", "model"}, "aggregate": {"models"}, "genesis": {"datasamples"}}


@pytest.fixture
def asset(monkeypatch):
    """run(FRAMEWORK, HYPERPARAMETERS) with substratools' registry, its command line and the four
    bodies replaced by recorders: (the functions registered by name, the calls made)."""
    registered, calls = {}, []

    def register(function, name=None):
        assert name not in registered, f"{name} registered twice"
        registered[name] = function

    monkeypatch.setattr(substratools, "register", register)
    monkeypatch.setattr(functions, "run_cli", lambda main,
                        task=False: calls.append(("cli", main, task)))
    for module, body in ((skeleton, "train"), (skeleton, "predict"), (skeleton, "aggregate"),
                         (search, "tune"), (skeleton, "genesis")):
        monkeypatch.setattr(module, body, lambda *args, body=body: calls.append((body, *args)))
    functions.run(FRAMEWORK, HYPERPARAMETERS)
    return registered, calls


def test_the_five_functions_are_registered_by_name_then_the_command_line_runs(asset):
    """Registered as train, predict, aggregate, tune and genesis, each named so; then substratools'
    CLI."""
    registered, calls = asset
    assert sorted(registered) == ["aggregate", "genesis", "predict", "train", "tune"]
    assert all(function.__name__ == name for name, function in registered.items())
    assert calls == [("cli", substratools.execute, True)]


@pytest.mark.parametrize("name, with_path", [
    ("train", True), ("predict", False), ("aggregate", True), ("tune", True),
    ("genesis", False)])
def test_each_function_calls_its_own_body_with_the_assets_framework(asset, name, with_path):
    """Its own body (not the last defined), given framework, inputs, outputs, hyperparameters."""
    registered, calls = asset
    inputs = {identifier: f"<{identifier}>" for identifier in INPUTS[name]}
    outputs = {"out": "<out>"}
    registered[name](inputs, outputs, {})
    path = [HYPERPARAMETERS] if with_path else []  # predict reads no hyperparameters
    framework = [] if name == "genesis" else [FRAMEWORK]  # it only seals what the data records
    assert calls[1:] == [(name, *framework, inputs, outputs, *path)]


def test_a_function_accepts_a_subset_of_its_inputs(asset):
    """train without its optional model and ledger still runs."""
    registered, calls = asset
    registered["train"]({"datasamples": "<d>"}, {}, {})
    assert calls[1:] == [("train", FRAMEWORK, {"datasamples": "<d>"}, {}, HYPERPARAMETERS)]


@pytest.mark.parametrize("name, extra, takes", [
    ("aggregate", "datasamples", "models"), ("predict", "ledger", "datasamples, model"),
    ("train", "predictions", "datasamples, ledger, model"),
    ("tune", "model", "datasamples, ledger"),
])
def test_an_input_a_function_does_not_use_is_refused_before_its_body_runs(asset, name, extra,
                                                                           takes):
    """The refusal names the input, the function and what it takes; the body is never called."""
    registered, calls = asset
    inputs = {**{identifier: "<x>" for identifier in INPUTS[name]}, extra: "<extra>"}
    with pytest.raises(UserError, match=rf"^input '{extra}': the {name} function does not use it "
                                        rf"\(it takes {takes}\); remove it$"):
        registered[name](inputs, {}, {})
    assert calls[1:] == []
