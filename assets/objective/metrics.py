"""The objective: accuracy of predicted labels against the data samples' labels (substratools
1.0)."""
import sys
from pathlib import Path

import numpy as np
import substratools as tools

try:
    import mnist_dp  # noqa: F401 - inside a function archive it sits next to this file
except ModuleNotFoundError:  # run from the repository: make the shared package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mnist_dp.learning import predictions
from mnist_dp.privacy import policy
from mnist_dp.utils import atomic, timing
from mnist_dp.utils.errors import refuse_unknown_inputs, run_cli


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(y_true == y_pred))


@tools.register
def score(inputs, outputs, task_properties):
    """The score function: the accuracy of the predicted labels against the data samples' labels.

    Args:
      inputs: the task's inputs: "datasamples" (the opener's, with the labels) and "predictions"
        (the predictions file); any other is refused, and so is data whose owner's policy forbids
        scoring it (privacy/policy.py).
      outputs: "performance": where the accuracy is written.
      task_properties: substratools' task properties (unused).
    """
    refuse_unknown_inputs("score", inputs, {"datasamples", "predictions"})
    # a train sample's owner may forbid scores on it: an accuracy ε does not cover
    policy.of_data(inputs["datasamples"]).refuse("score_train", "score the test data only")
    timing.begin_task("score")
    y_true = inputs["datasamples"]["labels"]
    y_pred = predictions.load(inputs["predictions"], len(y_true))
    atomic.write_performance(outputs["performance"], accuracy(y_true, y_pred))
    timing.end_task("score")


if __name__ == "__main__":
    run_cli(tools.execute, task=True)
