"""Fixed-shape chunks of a Poisson batch, for a framework that compiles its step once per input
shape (MindSpore's GRAPH mode): Poisson batches vary in size, so a batch is cut into chunks of two
fixed sizes, the padding masked out."""
from __future__ import annotations

import math

import numpy as np


def chunk_sizes(expected_batch_size, largest=1):
    """GRAPH mode compiles once per input shape, and Poisson batches vary in size, so a batch is cut
    into chunks of two fixed sizes (padding masked out): the power of two at or above the expected
    batch (and at or above `largest`, the most examples of one person), and an eighth more. A batch
    of 500 ± 22 is one chunk of 512, or of 576."""
    large = max(16, 1 << math.ceil(math.log2(max(expected_batch_size, largest, 1))))
    return large, large + large // 8


def padded(part, size):
    """`part` padded with zeros to `size`, and its mask: 1 for its entries, 0 for the padding."""
    mask = np.zeros(size, np.float32)
    mask[: len(part)] = 1
    return np.concatenate([part, np.zeros(size - len(part), part.dtype)]), mask


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
        yield padded(indices[start : start + size], size)
        start += size
        if start >= len(indices):
            return


def person_chunks(indices, persons, sizes):
    """padded_chunks for a batch of whole persons: no person is cut between two chunks, so that a
    chunk's clipped sum sees each of its persons' examples.

    Args:
      indices: the batch's examples [B].
      persons: each one's person [B], any integers.
      sizes: (large, larger), larger at least the most examples one person has (ValueError
        otherwise).

    Yields:
      (indices padded to a chunk size, mask, each example's person in the chunk (0..P-1, 0 for
      padding), 1 for each of the chunk's P persons): at least one chunk, maybe empty.
    """
    large, larger = sizes
    order = np.argsort(persons, kind="stable")
    indices, persons = indices[order], persons[order]
    # where each person's examples begin, and the end
    bounds = np.r_[np.flatnonzero(np.r_[True, persons[1:] != persons[:-1]]) if len(persons) else [],
                   len(persons)].astype(np.int64)
    begin = 0
    while True:
        end = int(bounds[np.searchsorted(bounds, begin + larger, side="right") - 1])
        if end == begin < len(persons):
            raise ValueError(f"a person has more examples than a chunk of {larger}")
        groups = np.unique(persons[begin:end], return_inverse=True)[1].astype(np.int64)
        size = large if end - begin <= large else larger
        persons_in_chunk = groups.max() + 1 if len(groups) else 0
        # the person mask is the mask of the P persons' padding
        yield (*padded(indices[begin:end], size), padded(groups, size)[0],
               padded(np.arange(persons_in_chunk), size)[1])
        begin = end
        if begin >= len(persons):
            return
