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
    # Per example only: an image's features do not depend on the others in
    # its batch (no privacy cost).
    np.testing.assert_allclose(features.scattering(images[2:3]), out[2:3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out[0], out[1])  # different digits, different features


def test_the_networks_are_given_the_features_in_float16():
    """Half the memory of a train task's features; each number within float16's rounding of the
    float32 one."""
    images = sources.load_embedded()[0][:5].astype(np.float32) / 255
    given, computed = features.transform(images, "scattering"), features.scattering(images)
    assert given.dtype == np.float16 and given.shape == computed.shape
    np.testing.assert_allclose(given.astype(np.float32), computed, rtol=2.0 ** -11, atol=2.0 ** -24)
    assert given.nbytes * 2 == computed.nbytes


def test_pixels_pass_through_and_unknown_features_are_refused():
    images = np.zeros((2, 28, 28), np.float32)
    assert features.transform(images, "pixels") is images
    with pytest.raises(ValueError, match="unknown features"):
        features.transform(images, "hog")


def test_the_batched_transform_gives_kymatios_numbers():
    """features.py computes kymatio's scattering2d itself, batched: the same numbers within float32
    rounding, in kymatio's channel order, across block boundaries (features._BATCH images a block)
    and for a lone image."""
    images = sources.load_embedded()[0][:260].astype(np.float32) / 255  # 260: more than two blocks
    reference = features.kymatio_scattering(images)  # -> [260, 81, 7, 7]
    maps = features.scattering_maps(images)
    assert maps.shape == reference.shape == (260, 81, 7, 7) and maps.dtype == np.float32
    np.testing.assert_allclose(maps, reference, rtol=0, atol=2e-6)
    np.testing.assert_allclose(features.scattering_maps(images[255:256]), reference[255:256],
                               rtol=0, atol=2e-6)
    # and the features are the group normalisation of those numbers
    groups = reference.reshape(260, features.GROUPS, -1)
    normalised = (
        groups - groups.mean(axis=2, keepdims=True)) / np.sqrt(groups.var(axis=2,
                             keepdims=True) + 1e-5)
    np.testing.assert_allclose(features.scattering(images), normalised.reshape(260, -1), rtol=0,
                               atol=1e-4)
