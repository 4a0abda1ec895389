"""A convolution's per-example gradient norms from Gram matrices of its input pixels (torch's conv_weight_norms).

Example i's kernel gradient is Σ_p g_p a_pᵀ over output positions p (g_p: the output gradient there, a_p: the input
patch under it), so its squared norm is Σ_{p,p'} (g_p·g_p')(a_p·a_p'). The patches' dot products are sums of pixel
dot products, one per kernel offset. With stride s, offset (u, v) at position (i, j) reads padded pixel
(s·i + u, s·j + v): pixel (i + u // s, j + v // s) of the phase (u mod s, v mod s), the pixels whose row and
column leave those remainders. So only each phase's own pixel Gram is needed (a quarter of all pixel pairs at
s = 2), and `patch_pair_index` says where each patch pair's terms lie in them.
"""
from __future__ import annotations

import functools

import numpy as np


def phase_size(span: int, stride: int) -> int:
    """Pixels of a phase along one axis of `span` padded pixels (padding to a multiple of the stride makes every
    phase this size)."""
    return -(-span // stride)


@functools.cache
def patch_pair_index(out_h: int, out_w: int, kh: int, kw: int, sh: int, sw: int, hs: int, ws: int) -> np.ndarray:
    """[kh·kw·P·P] indices (int64) into the flattened phase Grams [sh·sw, hs·ws, hs·ws] (phase r·sw + c, pixels
    row-major): for each kernel offset (u, v), then each pair of output positions (p, p') (row-major, P = out_h·out_w),
    the pair of pixels under that offset. Summing over the offsets gives the patch Gram [P, P]. Cached: one array
    for every call, which callers read only."""
    i, j = np.repeat(np.arange(out_h), out_w), np.tile(np.arange(out_w), out_h)  # [P]
    u, v = np.repeat(np.arange(kh), kw)[:, None], np.tile(np.arange(kw), kh)[:, None]  # [kh·kw, 1]
    pixels = (i + u // sh) * ws + j + v // sw  # [kh·kw, P]: the pixel under each offset and position, in its phase
    first = ((u % sh) * sw + v % sw) * (hs * ws) + pixels  # its row in the phases' stacked Grams
    return (first[:, :, None] * (hs * ws) + pixels[:, None, :]).reshape(-1).astype(np.int64)
