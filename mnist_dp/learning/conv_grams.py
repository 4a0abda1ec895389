"""A convolution's per-example gradient norms from the Gram matrix of its input pixels (torch's and
tf's norms).

Example i's kernel gradient is Σ_p g_p a_pᵀ over output positions p (g_p: the output gradient there,
a_p: the input patch under it), so its squared norm is Σ_{p,p'} (g_p·g_p')(a_p·a_p'). A patch pair's
dot product a_p·a_p' is a sum of pixel dot products, one per kernel offset: offset (u, v) at
position (i, j) reads padded pixel (s·i + u, s·j + v). So one Gram of the example's unpadded pixels
(H·W)² and a fixed sparse sum give every patch pair: `patch_pair_sums` says which pixel pairs each
one sums (a padding pixel adds 0, so its pairs are left out).

A layer whose input is the data itself (the ScatterNet CNN's first convolution, on the scattering
features) has patch Grams that no weight changes: `patch_grams` computes them once for the whole
training set, packed (the Gram is symmetric), and a step only takes its batch's rows (`packed_pairs`
says which entries of the output gradients' Gram they pair with).
"""
from __future__ import annotations

import functools

import numpy as np

from mnist_dp.learning import blocks

# examples per batched product in patch_grams, a block of its threads (about 7 MB each at 49 pixels)
CHUNK = 250


def pixel_grams_are_smaller(height: int, width: int, kernel_size: int) -> bool:
    """Whether an example's pixel Gram has at most as many entries as its kernel gradient.

    Args:
      height: the height of the layer's input.
      width: its width.
      kernel_size: the number of the kernel's weights (its gradient's entries).

    Returns:
      Whether (height·width)² ≤ kernel_size: then norms from the Gram cost less than from
      per-example gradients.
    """
    return (height * width) ** 2 <= kernel_size


def patch_pixels(in_h: int, in_w: int, out_h: int, out_w: int, kh: int, kw: int, sh: int, sw: int,
                 top: int, left: int) -> np.ndarray:
    """The pixel under each kernel offset of each patch.

    Args:
      in_h: the height H of the unpadded input.
      in_w: its width W.
      out_h: the height of the convolution's output.
      out_w: its width: P = out_h·out_w positions.
      kh: the kernel's height.
      kw: the kernel's width.
      sh: the stride along the rows.
      sw: the stride along the columns.
      top: the rows of padding added above the input before the convolution reads it.
      left: the columns of padding added on its left.

    Returns:
      [P, kh·kw] int64: a row-major index into the unpadded [H, W] input, -1 where the offset reads
      padding; positions and offsets both row-major.
    """
    # [P, 1]
    i, j = np.repeat(np.arange(out_h), out_w)[:, None], np.tile(np.arange(out_w), out_h)[:, None]
    u, v = np.repeat(np.arange(kh), kw), np.tile(np.arange(kw), kh)  # [kh·kw]
    rows, columns = sh * i + u - top, sw * j + v - left  # [P, kh·kw]: the pixel under each offset
    return np.where((rows >= 0) & (rows < in_h) & (columns >= 0) & (columns < in_w),
                    rows * in_w + columns, -1)


@functools.cache
def patch_pair_sums(in_h: int, in_w: int, out_h: int, out_w: int, kh: int, kw: int, sh: int,
                    sw: int, top: int, left: int) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Which pixel pairs make each patch pair.

    Cached: the same read-only arrays for every call.

    Args:
      in_h: the height H of the unpadded input.
      in_w: its width W.
      out_h: the height of the convolution's output.
      out_w: its width: P = out_h·out_w positions, row-major.
      kh: the kernel's height.
      kw: the kernel's width.
      sh: the stride along the rows.
      sw: the stride along the columns.
      top: the rows of padding added above the input before the convolution reads it.
      left: the columns of padding added on its left.

    Returns:
      A sparse 0/1 matrix [(H·W)², P·P] as (indices [n, 2] int64 in row-major order, values
      float32, shape), so that an example's flattened pixel Gram times it is its patch Gram,
      flattened. Pairs with a padding pixel are 0 and left out.
    """
    pixels = patch_pixels(in_h, in_w, out_h, out_w, kh, kw, sh, sw, top, left).T  # -> [kh·kw, P]
    # [kh·kw, P, P]: each offset's pixel pair, per patch pair
    first, second = pixels[:, :, None], pixels[:, None, :]
    inside = ((first >= 0) & (second >= 0)).reshape(-1)
    entries = (first * (in_h * in_w) + second).reshape(-1)[inside]
    pairs = np.broadcast_to(np.arange((out_h * out_w) ** 2),
                            (kh * kw, (out_h * out_w) ** 2)).reshape(-1)[inside]
    # offsets of one patch pair read distinct pixel pairs: no duplicates
    order = np.lexsort((pairs, entries))
    indices, values = np.stack([entries, pairs], 1)[order].astype(np.int64), np.ones(len(order),
                               np.float32)
    indices.flags.writeable = values.flags.writeable = False
    return indices, values, ((in_h * in_w) ** 2, (out_h * out_w) ** 2)


@functools.cache
def packed_pairs(positions: int) -> np.ndarray:
    """The flat indices p·P + p' (p ≤ p', row-major) of a [P, P] Gram's upper triangle: the entries
    `patch_grams` keeps, in its order. Read-only."""
    first, second = np.triu_indices(positions)
    index = first * positions + second
    index.flags.writeable = False
    return index


def patch_grams(pixels: np.ndarray, out_h: int, out_w: int, kh: int, kw: int, sh: int, sw: int,
                top: int, left: int) -> np.ndarray:
    """Each example's patch Gram A (A_pp' = a_p·a_p'), packed.

    Computed in float32, CHUNK examples at a time, in threads: faster, and with less memory at its
    peak, than one product of the whole set.

    Args:
      pixels: [N, C, H, W] (any float dtype): the input of a layer that no weight changes.
      out_h: the height of the convolution's output (as in patch_pair_sums).
      out_w: its width.
      kh: the kernel's height.
      kw: the kernel's width.
      sh: the stride along the rows.
      sw: the stride along the columns.
      top: the rows of padding added above the input.
      left: the columns of padding added on its left.

    Returns:
      [N, P(P+1)/2] float32: the entries of `packed_pairs`, those off the diagonal doubled, so that
      for a symmetric G (the output gradients' Gram) Σ_{p,p'} G_pp' A_pp' is
      Σ_k G[packed_pairs[k]] · row_k.
    """
    import scipy.sparse

    count, channels, height, width = pixels.shape
    indices, values, shape = patch_pair_sums(height, width, out_h, out_w, kh, kw, sh, sw, top, left)
    # [(H·W)², P·P]
    sums = scipy.sparse.csr_matrix((values, (indices[:, 0], indices[:, 1])), shape=shape)
    kept = packed_pairs(out_h * out_w)
    doubled = np.where(kept // (out_h * out_w) == kept % (out_h * out_w), 1, 2).astype(np.float32)
    packed = np.empty((count, len(kept)), np.float32)

    def fill(start: int) -> int:
        block = pixels[start : start + CHUNK].reshape(-1, channels,
                                                      height * width).astype(np.float32)
        grams = np.matmul(block.transpose(0, 2, 1), block).reshape(len(block), -1)  # -> [n, (H·W)²]
        packed[start : start + len(block)] = np.asarray(grams @ sums)[:, kept] * doubled
        return len(block)

    for _ in blocks.in_threads(fill, count, CHUNK):
        pass
    return packed
