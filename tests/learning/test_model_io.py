"""mnist_dp/learning/model_io.py: weights loaded from a model file and checked (the framework can
load them, they are finite, the input model is the hyperparameters' network), and a model run on
images a batch at a time; on a fake framework of numpy vectors, without any ML library."""
import logging
import pickle
import zipfile

import numpy as np
import pytest
from conftest import ledger_event, save_model

from mnist_dp.learning import interface, model_io
from mnist_dp.learning.interface import PREDICT_BATCH_SIZE, Network
from mnist_dp.privacy import model_file
from mnist_dp.utils.errors import UserError

CNN = Network("pixels", "tanh", "cnn")
PATH = "/models/round-3.model"


class Vectors(interface.Framework):
    """A framework whose model is one float32 vector, saved as b"VEC" then its bytes; it scores
    class k of an input by -(k - the input's first value)², and records what it loads and runs."""

    name = "torch"

    def __init__(self, error=None):
        self.error, self.loaded, self.batches = error, [], []

    def load_model(self, weights, network):
        if self.error is not None:
            raise self.error
        if not weights.startswith(b"VEC"):
            raise ValueError("not a vector")
        self.loaded.append(network)
        return np.frombuffer(weights[3:], np.float32).copy()

    def weight_arrays(self, model):
        return [model[:2], model[2:]]

    def batch_logits(self, model, inputs):
        self.batches.append(inputs.shape)
        first = inputs.reshape(len(inputs), -1)[:, 0].astype(np.float64)
        return -(np.arange(10) - first[:, None]) ** 2


def vector(*values) -> bytes:
    return b"VEC" + np.array(values, np.float32).tobytes()


def saved(weights: bytes) -> model_file.ModelFile:
    return model_file.ModelFile("torch", weights)


# --- load_weights, non_finite, check_finite


def test_weights_the_framework_loads_come_back_as_its_model():
    """The framework's model of the file's weights, built for the network asked."""
    framework = Vectors()
    model = model_io.load_weights(framework, saved(vector(1, 2, 3)), PATH, CNN)
    np.testing.assert_array_equal(model, np.array([1, 2, 3], np.float32))
    assert framework.loaded == [CNN]


@pytest.mark.parametrize("error, detail", [
    (None, "ValueError: not a vector"),
    (pickle.UnpicklingError("Weights only load failed. This file can still be loaded, to do so you "
                            "have two options\n(1) In PyTorch 2.6 we changed the default"),
     "UnpicklingError: Weights only load failed"),
    (zipfile.BadZipFile("\n   \n  File is not a zip file  \nat offset 0"),
     "BadZipFile: File is not a zip file"),
    (RuntimeError("size mismatch " * 20), "RuntimeError: " + ("size mismatch " * 20)[:150]),
    (KeyError("conv1.weight"), "KeyError: 'conv1.weight'"), (EOFError(), "EOFError"),
    (OSError("Invalid argument. Open it elsewhere"), "OSError: Invalid argument"),
    (TypeError("expected bytes"), "TypeError: expected bytes"),
    (UserError("unknown layer"), "UserError: unknown layer"),
], ids=["own", "unpickling", "bad-zip", "long", "key", "no-message", "os", "type", "user"])
def test_weights_the_framework_cannot_load_are_refused_naming_the_file(error, detail):
    """The file is named, with the first sentence of the framework's error (150 characters at
    most)."""
    with pytest.raises(UserError) as refused:
        model_io.load_weights(Vectors(error), saved(b"\x80\x02 not weights"), PATH, CNN)
    assert str(refused.value) == (f"{PATH}: its weights cannot be loaded into this torch network "
                                  f"({detail}); the file was not written by this bundle's torch "
                                  "algo: use one it trained")
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


@pytest.mark.parametrize("error", [AttributeError("'NoneType' object has no attribute 'eval'"),
                                   ZeroDivisionError("division by zero"), MemoryError()])
def test_an_error_that_is_not_about_the_weights_is_not_blamed_on_the_file(error):
    """A bug or a machine's limit in the framework's loading surfaces as itself."""
    with pytest.raises(type(error)) as raised:
        model_io.load_weights(Vectors(error), saved(vector(1.0)), PATH, CNN)
    assert raised.value is error


def test_weights_that_are_nan_or_infinite_are_refused_naming_the_file():
    """A diverged model is refused: how many of its weights are not finite, out of how many."""
    weights = vector(1.0, np.nan, 2.0, np.inf, -np.inf, 0.0)
    with pytest.raises(UserError) as refused:
        model_io.load_weights(Vectors(), saved(weights), PATH, CNN)
    assert str(refused.value) == (f"{PATH}: 3 of the model's 6 weights are NaN or infinite; its "
                                  "training diverged: use another model, or train again with a "
                                  "lower learning_rate or max_grad_norm")


class Arrays(Vectors):
    """Vectors whose weight arrays are given as they are: any shapes, lists, integers."""

    def weight_arrays(self, model):
        return model


def test_non_finite_counts_nan_and_both_infinities_across_every_array():
    """(non-finite weights, all weights), over arrays of any shape, dtype, or plain lists."""
    arrays = [np.array([[np.nan, 1.0], [2.0, np.inf]], np.float32), [3.0, -np.inf, 4.0],
              np.arange(4), np.full((2, 0), np.nan)]
    assert model_io.non_finite(Arrays(), arrays) == (3, 11)
    assert model_io.non_finite(Arrays(), [np.zeros((3, 2)), [1e308, -1e308]]) == (0, 8)
    assert model_io.non_finite(Arrays(), []) == (0, 0)


def test_check_finite_passes_a_finite_model_and_names_where_and_what_to_do_otherwise():
    """No word for finite weights; otherwise the count, where, and the advice given."""
    assert model_io.check_finite(Arrays(), [np.ones(5, np.float16)], "aggregate", "x") is None
    with pytest.raises(UserError) as refused:
        model_io.check_finite(Arrays(), [np.ones(5), np.array([np.nan] * 2 + [0.0])],
                              "aggregate: the average", "nothing was saved")
    assert str(refused.value) == ("aggregate: the average: 2 of the model's 8 weights are NaN or "
                                  "infinite; nothing was saved")


# --- load_input_model


def input_model(path, weights=None, **network):
    """A model file of one run holding `weights` (1, 2, 3 by default), of the tanh CNN on pixels
    unless `network` says otherwise."""
    weights = vector(1, 2, 3) if weights is None else weights
    settings = {"features": "pixels", "network": "cnn", "activation": "tanh", **network}
    event = ledger_event()
    return save_model(path, [event], weights, **settings), event


@pytest.mark.parametrize("inputs", [{}, {"model": None}, {"model": ""}],
                         ids=["absent", "none", "empty"])
def test_without_an_input_model_training_starts_afresh(inputs):
    """No model and an empty ledger; nothing is loaded."""
    framework = Vectors()
    model, ledger = model_io.load_input_model(framework, inputs, CNN)
    assert model is None and ledger.events == [] and framework.loaded == []


def test_an_input_model_of_the_hyperparameters_network_is_continued_with_its_ledger(tmp_path):
    """Its weights loaded for that network, its ledger returned, its earlier runs logged."""
    path, event = input_model(tmp_path / "m")
    framework, records = Vectors(), []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    model_io.log.addHandler(handler)
    # setLevel, not .level: it clears the logger's cache of what an earlier test found disabled
    level = model_io.log.level
    model_io.log.setLevel(logging.INFO)
    try:
        model, ledger = model_io.load_input_model(framework, {"model": str(path)}, CNN)
    finally:
        model_io.log.removeHandler(handler)
        model_io.log.setLevel(level)
    np.testing.assert_array_equal(model, np.array([1, 2, 3], np.float32))
    assert ledger.events == [event] and framework.loaded == [CNN]
    assert [r.getMessage() for r in records] == [
        "continuing from input model: 1 earlier training run in its ledger"]


@pytest.mark.parametrize("settings, theirs", [
    ({"features": "scattering", "network": "linear"},
     "network 'linear' on features 'scattering', activation 'tanh'"),
    ({"activation": "relu"}, "network 'cnn' on features 'pixels', activation 'relu'"),
    ({"network": "linear"}, "network 'linear' on features 'pixels', activation 'tanh'"),
], ids=["features", "activation", "network"])
def test_an_input_model_of_another_network_is_refused_before_loading(tmp_path, settings, theirs):
    """Naming both networks and what to set; the weights are never handed to the framework."""
    path, _ = input_model(tmp_path / "m", **settings)
    framework = Vectors()
    with pytest.raises(UserError) as refused:
        model_io.load_input_model(framework, {"model": str(path)}, CNN)
    assert str(refused.value) == (f"input model: its network is {theirs}, the hyperparameters say "
                                  "network 'cnn' on features 'pixels', activation 'tanh'; set "
                                  "features, network and activation as the input model's")
    assert framework.loaded == []


def test_an_input_model_saved_before_the_activation_option_is_the_relu_cnn(tmp_path):
    """A model file without activation is the ReLU CNN: refused for tanh, loaded for relu."""
    path = save_model(tmp_path / "old", [ledger_event()], vector(5.0), features="pixels")
    with pytest.raises(UserError, match="its network is network 'cnn' on features 'pixels', "
                                        "activation 'relu', the hyperparameters say"):
        model_io.load_input_model(Vectors(), {"model": str(path)}, CNN)
    relu = Network("pixels", "relu", "cnn")
    model, _ = model_io.load_input_model(Vectors(), {"model": str(path)}, relu)
    np.testing.assert_array_equal(model, np.array([5.0], np.float32))


def test_an_input_model_with_weights_that_are_not_finite_is_refused_naming_it(tmp_path):
    """The input model's path is the one named."""
    path, _ = input_model(tmp_path / "m", vector(np.nan, 1.0))
    with pytest.raises(UserError, match=f"^{path}: 1 of the model's 2 weights are NaN"):
        model_io.load_input_model(Vectors(), {"model": str(path)}, CNN)


# --- logits, predict_in_batches, predicted_labels


def by_hand(first_values) -> np.ndarray:
    """Vectors' scores computed without batches: -(k - x)² for each class k."""
    return np.array([[-(k - x) ** 2 for k in range(10)] for x in first_values], np.float64)


def test_logits_are_computed_predict_batch_size_inputs_at_a_time_in_order():
    """Batches of PREDICT_BATCH_SIZE and the remainder, their scores concatenated in order."""
    n = 2 * PREDICT_BATCH_SIZE + 5
    inputs = (np.arange(n) % 10).astype(np.float32).reshape(n, 1)
    framework = Vectors()
    scores = model_io.logits(framework, None, inputs)
    assert framework.batches == [(PREDICT_BATCH_SIZE, 1)] * 2 + [(5, 1)]
    np.testing.assert_array_equal(scores, by_hand(np.arange(n) % 10))


class SmallBatches(Vectors):
    predict_batch_size = 7


def test_a_frameworks_own_predict_batch_size_sets_its_batches():
    """A framework's predict_batch_size replaces PREDICT_BATCH_SIZE."""
    values = np.random.default_rng(0).integers(0, 10, 23)
    framework = SmallBatches()
    scores = model_io.logits(framework, None, values.reshape(23, 1, 1))
    assert framework.batches == [(7, 1, 1)] * 3 + [(2, 1, 1)]
    np.testing.assert_array_equal(scores, by_hand(values))


def test_no_inputs_give_no_scores_and_run_no_batch():
    """Zero inputs: an empty [0, 10] array, the framework never called."""
    framework = Vectors()
    scores = model_io.logits(framework, None, np.zeros((0, 28, 28), np.float32))
    assert scores.shape == (0, 10) and framework.batches == []
    labels = model_io.predicted_labels(framework, None, np.zeros((0, 28, 28), np.float32), CNN)
    assert labels.shape == (0,) and labels.dtype == np.int64


def test_predicted_labels_are_the_argmax_of_each_images_scores_as_int64():
    """On pixels the images themselves are scored; the label is the best-scoring class."""
    labels = np.array([3, 0, 9, 9, 1, 7, 2, 5, 4, 8, 6])
    images = np.zeros((len(labels), 28, 28), np.float32)
    images[:, 0, 0] = labels + 0.2  # class `label` scores -0.04, the best
    framework = SmallBatches()
    predicted = model_io.predicted_labels(framework, None, images, CNN)
    assert predicted.dtype == np.int64 and predicted.tolist() == labels.tolist()
    assert framework.batches == [(7, 28, 28), (4, 28, 28)]


def test_a_network_on_scattering_features_is_given_features_not_images():
    """predict_in_batches scores the network's inputs: scattering features [N, 3969]."""
    framework = SmallBatches()
    images = np.random.default_rng(1).random((9, 28, 28)).astype(np.float32)
    scores = model_io.predict_in_batches(framework, None, images,
                                         Network("scattering", "tanh", "linear"))
    assert scores.shape == (9, 10) and framework.batches == [(7, 3969), (2, 3969)]


# --- the task's outputs


def test_an_output_path_that_is_a_folder_or_in_a_missing_folder_is_refused_before_the_work(
        tmp_path):
    """Each output must be a file that can be created: a folder, or a file in a missing folder,
    is refused naming the output."""
    (tmp_path / "model").mkdir()
    with pytest.raises(UserError, match=f"output 'model': {tmp_path / 'model'} is a folder"):
        model_io.check_outputs_writable({"model": tmp_path / "model"})
    with pytest.raises(UserError, match=f"output 'epsilon': folder {tmp_path / 'no'} does not"):
        model_io.check_outputs_writable({"epsilon": tmp_path / "no" / "epsilon"})
    model_io.check_outputs_writable({"model": tmp_path / "m", "epsilon": tmp_path / "e"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_epsilon_is_saved_as_the_performance_substra_reads_infinity_included(tmp_path):
    """substratools' performance file ({"all": value}); a non-private model's ε = inf as JSON's
    non-standard `Infinity`, which Substra reads back."""
    import json

    model_io.save_epsilon(tmp_path / "e", 1.25)
    assert json.loads((tmp_path / "e").read_text()) == {"all": 1.25}
    model_io.save_epsilon(tmp_path / "inf", float("inf"))
    assert (tmp_path / "inf").read_text() == '{"all": Infinity}'
    assert json.loads((tmp_path / "inf").read_text()) == {"all": float("inf")}
