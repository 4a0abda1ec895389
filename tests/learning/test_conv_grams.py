"""conv_grams: the patch Grams it builds from pixel Grams equal those of the patches themselves."""
import numpy as np
import pytest

from mnist_dp.learning import conv_grams


def patches(pixels, out_h, out_w, kh, kw, sh, sw, top, left):
    """[N, P, C·kh·kw]: the input under each output position (row-major), zeros where the padding
    is."""
    count, channels, height, width = pixels.shape
    padded = np.zeros((count, channels, height + top + kh + sh * out_h,
                       width + left + kw + sw * out_w))
    padded[:, :, top : top + height, left : left + width] = pixels
    return np.stack([padded[:, :, sh * i : sh * i + kh, sw * j : sw * j + kw].reshape(count, -1)
                     for i in range(out_h) for j in range(out_w)], 1)


@pytest.mark.parametrize("channels, size, kernel, stride, padding", [
    (81, 7, 3, 2, 1),  # the ScatterNet CNN's first layer
    (16, 4, 3, 1, 1),  # its second
    (3, 6, 2, 2, 0),  # a stride as wide as the kernel, no padding
    (2, 6, 1, 2, 0),  # a last row and column never read
])
def test_patch_grams_are_the_grams_of_the_patches_packed(channels, size, kernel, stride, padding):
    rng = np.random.default_rng(0)
    # as the features are stored
    pixels = rng.normal(size=(5, channels, size, size)).astype(np.float16)
    out = (size + 2 * padding - kernel) // stride + 1
    geometry = (out, out, kernel, kernel, stride, stride, padding, padding)
    under = patches(pixels.astype(np.float64), *geometry)
    expected = np.einsum("npk,nqk->npq", under, under).reshape(5, -1)  # [N, P·P]
    grams = rng.normal(size=(5, out * out, out * out))
    # symmetric, as the output gradients' Grams are
    grams = (grams + grams.transpose(0, 2, 1)).reshape(5, -1)
    packed = conv_grams.patch_grams(pixels, *geometry)
    assert packed.dtype == np.float32 and packed.shape == (5, out * out * (out * out + 1) // 2)
    np.testing.assert_allclose((grams[:, conv_grams.packed_pairs(out * out)] * packed).sum(1),
                               (grams * expected).sum(1), rtol=1e-5)
