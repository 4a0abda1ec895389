"""Fixed-shape chunks of a Poisson batch, for a framework that compiles its step once per input
shape (MindSpore's GRAPH mode): Poisson batches vary in size, so a batch is cut into chunks of two
fixed sizes, the padding masked out; per person, chunks of two fixed numbers of persons, each a
row of a grid (person_grids)."""
from __future__ import annotations

import math

import numpy as np

from mnist_dp.privacy.units import person_rows


def chunk_sizes(expected_batch_size):
    """GRAPH mode compiles once per input shape, and Poisson batches vary in size, so a batch is cut
    into chunks of two fixed sizes (padding masked out): the power of two at or above the expected
    batch, and an eighth more. A batch of 500 ± 22 is one chunk of 512, or of 576."""
    large = max(16, 1 << math.ceil(math.log2(max(expected_batch_size, 1))))
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


def person_grids(indices, persons, rows, slots):
    """Fixed-shape chunks of a batch of whole persons, laid out as grids: a row of `slots` examples
    per person (padded), so that a person's gradient is one batched product over their row. Chunks
    of rows[1] persons while more than rows[0] are left, then one of the two (padded_chunks' rule,
    over persons).

    Args:
      indices: the batch's examples [B].
      persons: each one's person [B], any integers.
      rows: (large, larger) persons a chunk.
      slots: examples a row: at least the most examples one person has (ValueError otherwise).

    Yields:
      (indices [R·slots], padded with 0, mask [R·slots]: 1 for an example, 0 for padding,
      person_mask [R]: 1 for a row holding a person): at least one chunk, maybe empty.
    """
    layout = person_rows(persons, -1)[1]
    count = len(layout)
    if layout.shape[1] > slots:
        raise ValueError(f"a person has more examples than a row of {slots}")
    # a padding row to index when there is no person
    layout = np.pad(layout, ((0, 1 if count == 0 else 0), (0, slots - layout.shape[1])),
                    constant_values=-1)
    filled = (layout >= 0).astype(np.float32)
    grid = np.append(indices, 0).astype(np.asarray(indices).dtype)[layout]  # padding: -1 -> 0
    for members, person_mask in padded_chunks(np.arange(count), rows):
        yield (grid[members].reshape(-1), (filled[members] * person_mask[:, None]).reshape(-1),
               person_mask)
