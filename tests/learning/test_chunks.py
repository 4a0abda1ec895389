"""mnist_dp/learning/chunks.py: a Poisson batch in chunks of fixed sizes, every index once."""
import numpy as np
import pytest

from mnist_dp.learning import chunks


@pytest.mark.parametrize("count, sizes", [(500, [512]), (512, [512]), (513, [576]), (576, [576]),
                                          (577, [576, 512]), (1100, [576, 576]),
                                          (1153, [576, 576, 512]), (200, [512]), (0, [512])])
def test_padded_chunks_cover_every_index_once(count, sizes):
    indices = np.arange(count)
    got = list(chunks.padded_chunks(indices, chunks.chunk_sizes(500)))
    assert [len(index) for index, _ in got] == sizes
    # every index once; an empty Poisson batch is still one (all-masked) step
    assert np.array_equal(np.concatenate([index[mask > 0] for index, mask in got]), indices)


def test_chunk_sizes_follow_the_expected_batch():
    assert chunks.chunk_sizes(500) == (512, 576)
    assert chunks.chunk_sizes(8) == (16, 18)
    assert chunks.chunk_sizes(4096) == (4096, 4608)
