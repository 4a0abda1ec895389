"""assets/objective/metrics.py: the objective's accuracy, and its score function writing it as
Substra's performance file from the predictions file, refusing what it cannot score."""
import json

import numpy as np
import pytest
import substratools

from mnist_dp.assets import OBJECTIVE_ASSET, load_asset_module
from mnist_dp.learning import predictions
from mnist_dp.utils import timing
from mnist_dp.utils.errors import UserError


@pytest.fixture
def metrics(monkeypatch):
    """The objective's module, imported without adding its score function to substratools' registry
    (one per process); the task timing a refused score leaves open is closed afterwards."""
    monkeypatch.setattr(substratools, "register", lambda function, name=None: function)
    monkeypatch.setattr(timing, "_task", None)
    return load_asset_module(OBJECTIVE_ASSET / "metrics.py", "objective_metrics_under_test")


@pytest.mark.parametrize("y_true, y_pred, expected", [
    ([0, 1, 2, 3], [0, 1, 0, 3], 0.75), ([7, 7, 7], [7, 7, 7], 1.0), ([1, 2], [2, 1], 0.0),
    ([0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 9, 9, 9, 9, 9], 0.375),
])
def test_accuracy_is_the_share_of_labels_predicted_right(metrics, y_true, y_pred, expected):
    """Matches over examples, as a Python float."""
    accuracy = metrics.accuracy(np.array(y_true), np.array(y_pred))
    assert accuracy == expected and type(accuracy) is float


def test_score_writes_the_accuracy_of_the_predictions_file_as_the_performance(metrics, tmp_path):
    """5 labels, 4 predicted right: {"all": 0.8} in the performance file."""
    predictions.save(tmp_path / "predictions", [3, 1, 4, 1, 5])
    inputs = {"datasamples": {"labels": np.array([3, 1, 4, 1, 9])},
              "predictions": tmp_path / "predictions"}
    metrics.score(inputs, {"performance": tmp_path / "performance"}, {})
    assert json.loads((tmp_path / "performance").read_text()) == {"all": 0.8}


def test_score_refuses_predictions_of_another_number_of_examples(metrics, tmp_path):
    """Predictions for 4 examples against 5 labels: refused, no performance written."""
    predictions.save(tmp_path / "predictions", [3, 1, 4, 1])
    inputs = {"datasamples": {"labels": np.array([3, 1, 4, 1, 9])},
              "predictions": tmp_path / "predictions"}
    with pytest.raises(UserError, match="expected 5 integer labels, got int64 \\[4\\]"):
        metrics.score(inputs, {"performance": tmp_path / "performance"}, {})
    assert not (tmp_path / "performance").exists()


def test_score_refuses_an_input_it_does_not_use_before_reading_anything(metrics, tmp_path):
    """A model input is refused by name; nothing is read or written."""
    inputs = {"datasamples": {"labels": np.array([1])}, "predictions": tmp_path / "absent",
              "model": tmp_path / "model"}
    with pytest.raises(UserError, match="^input 'model': the score function does not use it "
                                        r"\(it takes datasamples, predictions\); remove it$"):
        metrics.score(inputs, {"performance": tmp_path / "performance"}, {})
    assert not (tmp_path / "performance").exists()
