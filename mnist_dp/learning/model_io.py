"""A framework's model as the tasks meet it: loaded from a model file and checked (the network the
hyperparameters name, finite weights), run on images a batch at a time (logits, labels), and the
task's outputs: checked writable before the work, ε saved as Substra's performance.
"""
from __future__ import annotations

import logging
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np

from mnist_dp.learning.interface import PREDICT_BATCH_SIZE, Framework, Network
from mnist_dp.privacy import model_file
from mnist_dp.privacy.ledger import Ledger
from mnist_dp.utils import atomic
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted

# substratools configures the "substratools" logger (level from --log-level); log under it.
log = logging.getLogger("substratools.mnist_dp")


# What a framework's loader raises on bytes that are not its weights for the network (torch's
# unpickler, np.load, a name or a shape the network lacks); a framework may raise UserError itself.
_NOT_WEIGHTS = (UserError, pickle.UnpicklingError, EOFError, RuntimeError, ValueError, KeyError,
                TypeError, OSError, zipfile.BadZipFile)


def load_weights(framework: Framework, saved: model_file.ModelFile, path, network: Network):
    """The model of the weights of a model file, checked.

    Weights that are not the framework's for `network`, or not finite, are refused naming the file:
    its digests only say it was not edited since.

    Args:
      framework: the algo's Framework.
      saved: the model file at `path`, as read.
      path: the model file's path, named in errors.
      network: the network the weights are loaded into.

    Returns:
      The framework's model. Raises UserError when the weights cannot be loaded or are not finite.
    """
    try:
        model = framework.load_model(saved.weights, network)
    except _NOT_WEIGHTS as exc:
        # Its first sentence: torch's unpickler goes on for lines about torch.load's options.
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                     "").split(". ")[0][:150]
        detail = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        raise UserError(f"{path}: its weights cannot be loaded into this {framework.name} network "
                        f"({detail}); the file was not written by this bundle's {framework.name} "
                        "algo: use one it trained") from None
    check_finite(framework, model, str(path),
                 "its training diverged: use another model, or train again with a lower "
                 "learning_rate or max_grad_norm")
    return model


def non_finite(framework: Framework, model) -> tuple:
    """(how many of the model's weights are NaN or infinite, how many weights it has)."""
    arrays = [np.asarray(a) for a in framework.weight_arrays(model)]
    return sum(a.size - int(np.count_nonzero(np.isfinite(a)))
               for a in arrays), sum(a.size for a in arrays)


def check_finite(framework: Framework, model, where: str, todo: str) -> None:
    """No model with a NaN or infinite weight is saved or used: a diverged run must fail, not pass
    on garbage.

    Args:
      framework: the algo's Framework.
      model: the framework's model, refused with a UserError if a weight is NaN or infinite.
      where: what the error names first.
      todo: what the error tells the user to do.
    """
    bad, total = non_finite(framework, model)
    if bad:
        raise UserError(f"{where}: {bad} of the model's {total} weights are NaN or infinite; "
                        f"{todo}")


def load_input_model(framework: Framework, inputs: dict, network: Network):
    """The task's input model, if it has one, and its ledger.

    Args:
      framework: the algo's Framework.
      inputs: the task's inputs: "model", when given, is the path of the input model file.
      network: the network the hyperparameters name; the input model's must be the same.

    Returns:
      (its model, its ledger), checked (load_weights); (None, an empty Ledger) without one. Raises
      UserError when the input model's network is not `network`.
    """
    if inputs.get("model"):
        saved = model_file.load(inputs["model"], framework.name)
        theirs = Network.of_saved(saved)
        if theirs != network:
            raise UserError(f"input model: its network is {theirs.describe()}, the hyperparameters "
                            f"say {network.describe()}; set features, network and activation as "
                            "the input model's")
        log.info("continuing from input model: %s in its ledger",
                 counted(len(saved.ledger.events), "earlier training run"))
        return load_weights(framework, saved, inputs["model"], network), saved.ledger
    return None, Ledger()


def predict_in_batches(framework: Framework, model, images: np.ndarray,
                       network: Network) -> np.ndarray:
    """Class scores of images, a batch at a time.

    Args:
      framework: the algo's Framework.
      model: the framework's model.
      images: the images [N, 28, 28].
      network: the model's network, which makes its inputs from the images (Network.inputs).

    Returns:
      Class scores [N, 10] (before softmax); the predicted label is their argmax.
    """
    return logits(framework, model, network.inputs(images))


def logits(framework: Framework, model, inputs: np.ndarray) -> np.ndarray:
    """Class scores of the network's inputs, a batch at a time.

    Args:
      framework: the algo's Framework; its `predict_batch_size` is the batch size (else
        PREDICT_BATCH_SIZE).
      model: the framework's model.
      inputs: the network's inputs (Network.inputs) [N, ...].

    Returns:
      Class scores [N, 10].
    """
    batch_size = getattr(framework, "predict_batch_size", PREDICT_BATCH_SIZE)
    return np.concatenate([framework.batch_logits(model, inputs[i : i + batch_size])
                           for i in range(0, len(inputs), batch_size)] or [np.zeros((0, 10))])


def predicted_labels(framework: Framework, model, images: np.ndarray,
                     network: Network) -> np.ndarray:
    """The label the model predicts for each image.

    Args:
      framework: the algo's Framework.
      model: the framework's model.
      images: the images [N, 28, 28].
      network: the model's network, which makes its inputs from the images (Network.inputs).

    Returns:
      The labels [N] (int64): the argmax of predict_in_batches' class scores.
    """
    return np.argmax(predict_in_batches(framework, model, images, network), axis=1).astype(np.int64)


def check_outputs_writable(outputs: dict) -> None:
    """Fail before the work, not after it: every output path must be a file we can create."""
    for identifier, path in outputs.items():
        path = Path(path)
        if path.is_dir():
            raise UserError(f"output {identifier!r}: {path} is a folder; give a file path")
        if not path.parent.is_dir():
            raise UserError(f"output {identifier!r}: folder {path.parent} does not exist")
        if not os.access(path.parent, os.W_OK | os.X_OK):  # a read-only mount, permissions
            raise UserError(f"output {identifier!r}: folder {path.parent} is not writable; make it "
                            "writable or choose another path")


def save_epsilon(path, epsilon: float) -> None:
    # Substra's performance file (a non-private model's ε = inf is JSON's non-standard `Infinity`).
    atomic.write_performance(path, float(epsilon))
