"""The fixed scattering features every framework's linear classifier is given."""
import numpy as np
import pytest

from mnist_dp.data import sources
from mnist_dp.learning import features


def test_scattering_gives_3969_group_normalised_numbers_per_image():
    images = sources.load_embedded()[0][:5].astype(np.float32) / 255
    out = features.scattering(images)
    assert out.shape == (5, features.SCATTERING_DIM) and out.dtype == np.float32
    groups = out.reshape(5, features.GROUPS, -1)
    np.testing.assert_allclose(groups.mean(axis=2), 0, atol=1e-4)
    # (x - mean) / sqrt(var + 1e-5), as torch's GroupNorm: groups of small variance keep std below 1
    assert np.all(groups.std(axis=2) <= 1 + 1e-5) and np.median(groups.std(axis=2)) > 0.3
    # Per example only: an image's features do not depend on the others in its batch (no privacy cost).
    np.testing.assert_allclose(features.scattering(images[2:3]), out[2:3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out[0], out[1])  # different digits, different features


def test_pixels_pass_through_and_unknown_features_are_refused():
    images = np.zeros((2, 28, 28), np.float32)
    assert features.transform(images, "pixels") is images
    with pytest.raises(ValueError, match="unknown features"):
        features.transform(images, "hog")
