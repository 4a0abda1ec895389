import numpy as np
import pytest

from mnist_dp.learning import predictions
from mnist_dp.utils.errors import UserError


def test_labels_round_trip_through_an_extensionless_path(tmp_path):
    predictions.save(tmp_path / "p", [3, 0, 9])
    assert predictions.load(tmp_path / "p", 3).tolist() == [3, 0, 9]


@pytest.mark.parametrize("labels, message",
                         [([1, 99], "1 predicted label outside 0-9 .e.g. 99."),
                                             ([-1, 2], "outside 0-9 .e.g. -1.")])
def test_a_label_outside_the_classes_is_refused_not_scored_as_wrong(tmp_path, labels, message):
    predictions.save(tmp_path / "p", labels)
    with pytest.raises(UserError, match=message):
        predictions.load(tmp_path / "p", 2)


def test_wrong_count_or_type_is_refused(tmp_path):
    predictions.save(tmp_path / "p", [1, 2])
    with pytest.raises(UserError, match="expected 3 integer labels"):
        predictions.load(tmp_path / "p", 3)
    np.save(tmp_path / "f.npy", np.array([0.5, 1.0]))
    with pytest.raises(UserError, match="expected 2 integer labels"):
        predictions.load(tmp_path / "f.npy", 2)
