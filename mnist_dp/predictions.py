"""The `predictions` artefact passed from predict to score: a .npy array of int64 class labels."""
import numpy as np

from mnist_dp.errors import UserError


def save(path, labels) -> None:
    # Through a file handle: np.save(path) would append ".npy" to Substra's extension-less path.
    with open(path, "wb") as f:
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
        raise UserError(f"{path}: expected {n_expected} integer labels, got {labels.dtype} {list(labels.shape)}")
    return labels
