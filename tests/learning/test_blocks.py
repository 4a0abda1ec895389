"""mnist_dp/learning/blocks.py: in_threads fills every block, yields what each returned in block
order, and runs them with one BLAS thread each, restoring the BLAS threads after."""
import threading

from threadpoolctl import threadpool_info, threadpool_limits

from mnist_dp.learning import blocks


def blas_threads() -> set:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def test_every_block_start_is_filled_and_the_results_come_in_block_order():
    """count 10, blocks of 4: starts 0, 4, 8 once each; block 0 ends last but still comes first."""
    later_started = threading.Event()
    filled = []

    def fill(start):
        filled.append(start)
        if start == 0:
            later_started.wait(timeout=2)  # lets block 4 (another thread) finish before block 0
        else:
            later_started.set()
        return start * 10

    assert list(blocks.in_threads(fill, 10, 4)) == [0, 40, 80]
    assert sorted(filled) == [0, 4, 8]


def test_no_block_for_no_items():
    """count 0: fill is never called."""
    assert list(blocks.in_threads(lambda start: 1 / 0, 0, 4)) == []


def test_blocks_run_with_one_blas_thread_and_the_limit_ends_with_them():
    """Inside fill, every BLAS library has one thread; afterwards, the limit set before is back."""
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        seen = list(blocks.in_threads(lambda start: blas_threads(), 3, 1))
        # a BLAS another test loaded may be single-threaded: it reports 1 under any limit
        assert seen == [{1}] * 3 and blas_threads() == before and 2 in before
