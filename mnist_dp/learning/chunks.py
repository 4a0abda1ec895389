"""Fixed-shape chunks of a Poisson batch, for a framework that compiles its step once per input shape (MindSpore's
GRAPH mode): Poisson batches vary in size, so a batch is cut into chunks of three fixed sizes, the padding masked
out."""
from __future__ import annotations

import math

import numpy as np


def chunk_sizes(expected_batch_size):
    """GRAPH mode compiles once per input shape, and Poisson batches vary in size, so a batch is cut into
    chunks of fixed sizes (padding masked out): a large one, the power of two at or above the expected
    batch, and an eighth of it for the rest. A batch of 500 ± 22 is one chunk of 512, or of 576."""
    large = max(16, 1 << math.ceil(math.log2(max(expected_batch_size, 1))))
    return large, large // 8


def padded_chunks(indices, sizes):
    """Yield (indices padded to a chunk size, mask) covering `indices` (at least one chunk, maybe empty).
    `sizes` = (large, small)."""
    large, small = sizes
    start = 0
    while True:
        size = _next_chunk_size(len(indices) - start, large, small)
        part = indices[start : start + size]
        mask = np.zeros(size, np.float32)
        mask[: len(part)] = 1
        yield np.concatenate([part, np.zeros(size - len(part), part.dtype)]), mask
        start += size
        if start >= len(indices):
            return


def _next_chunk_size(left, large, small):
    """Large chunks while more than large + small are left; then one chunk of large + small (a second call of a
    small chunk cost MindSpore a graph's fixed time, 4 ms more than as many more rows in one), one large chunk if
    more than half of one is left, else small ones."""
    if left > large + small:
        return large
    if left > large:
        return large + small
    return large if left > large // 2 else small
