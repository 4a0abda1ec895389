"""The `predictions` artefact passed from predict to score: a .npy array of int64 class labels."""
import numpy as np

from mnist_dp.utils import atomic
from mnist_dp.utils.errors import UserError
from mnist_dp.utils.words import counted

NUM_CLASSES = 10


def save(path, labels) -> None:
    # Through a file handle: np.save(path) would append ".npy" to Substra's extension-less path.
    with atomic.replacing(path) as tmp, open(tmp, "wb") as f:
        np.save(f, np.asarray(labels, dtype=np.int64), allow_pickle=False)


def load(path, n_expected: int) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            labels = np.load(f, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{path}: predictions file not found") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a predictions file (.npy of int labels): {exc}") from None
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != n_expected:
        raise UserError(f"{path}: expected {n_expected} integer labels, got {labels.dtype} "
                        f"{list(labels.shape)}")
    outside = labels[(labels < 0) | (labels >= NUM_CLASSES)]
    if outside.size:  # scored as merely wrong, a broken predict function would go unnoticed
        raise UserError(f"{path}: {counted(outside.size, 'predicted label')} outside "
                        f"0-{NUM_CLASSES - 1} (e.g. {outside[0]}); the predict function is broken")
    return labels
