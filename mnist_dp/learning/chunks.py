"""Fixed-shape chunks of a Poisson batch, for a framework that compiles its step once per input
shape (MindSpore's GRAPH mode): Poisson batches vary in size, so a batch is cut into chunks of two
fixed sizes, the padding masked out."""
from __future__ import annotations

import math

import numpy as np


def chunk_sizes(expected_batch_size):
    """GRAPH mode compiles once per input shape, and Poisson batches vary in size, so a batch is cut
    into chunks of two fixed sizes (padding masked out): the power of two at or above the expected
    batch, and an eighth more. A batch of 500 ± 22 is one chunk of 512, or of 576."""
    large = max(16, 1 << math.ceil(math.log2(max(expected_batch_size, 1))))
    return large, large + large // 8


def padded_chunks(indices, sizes):
    """Yield (indices padded to a chunk size, mask) covering `indices` (at least one chunk, maybe
    empty). `sizes` = (large, larger): chunks of `larger` while more than `large` is left, then one
    of the two. Only two shapes ever: a third would cost MindSpore a graph compilation in a train
    task, for the rare batch above `larger` (3.4 standard deviations at the default batch, about one
    in a task's 3,600)."""
    large, larger = sizes
    start = 0
    while True:
        size = large if len(indices) - start <= large else larger
        part = indices[start : start + size]
        mask = np.zeros(size, np.float32)
        mask[: len(part)] = 1
        yield np.concatenate([part, np.zeros(size - len(part), part.dtype)]), mask
        start += size
        if start >= len(indices):
            return
