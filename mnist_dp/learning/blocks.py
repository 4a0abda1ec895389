"""Work on a data set block by block, several blocks at once in threads: numpy's matrix products and
scipy's FFT release the GIL, so the blocks fill the cores."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator

THREADS = min(4, os.cpu_count() or 1)  # blocks at once; each block's memory bounds it


def in_threads(fill: Callable[[int], int], count: int, size: int) -> Iterator[int]:
    """Run `fill` on every block of a data set, THREADS blocks at once.

    One BLAS thread each: OpenBLAS's own threads on top of the blocks' oversubscribe the cores.

    Args:
      fill: what a block does, called with the block's start.
      count: the data set's length: the blocks start at range(0, count, size).
      size: the block size: the step between block starts.

    Yields:
      What fill(start) returned for every block start, in order.
    """
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(THREADS) as pool:
        yield from pool.map(fill, range(0, count, size))
