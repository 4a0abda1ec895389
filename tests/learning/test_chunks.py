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


@pytest.mark.parametrize("count", [0, 1, 17, 40, 200])
def test_person_grids_lay_out_each_person_in_a_row_of_one_chunk(count):
    rng = np.random.default_rng(count)
    indices = np.sort(rng.choice(1000, count, replace=False))
    persons = rng.integers(0, max(count // 3, 1), count) * 7  # any integers, unsorted
    slots = max(np.bincount(persons // 7).max(initial=0), 1)
    got = list(chunks.person_grids(indices, persons, (4, 5), slots))
    assert len(got) >= 1
    kept, seen = [], set()
    for index, mask, person_mask in got:
        assert len(person_mask) in (4, 5) and index.shape == mask.shape == (len(person_mask)
                                                                              * slots,)
        for row, (row_index, row_mask) in enumerate(zip(index.reshape(-1, slots),
                                                         mask.reshape(-1, slots))):
            ids = set(persons[np.searchsorted(indices, row_index[row_mask > 0])])
            # a row: one person, all their examples first, or padding (its person_mask 0)
            assert len(ids) == person_mask[row] and not seen & ids
            if ids:
                assert row_mask.sum() == np.sum(persons == ids.copy().pop())
                assert row_mask[:int(row_mask.sum())].all()
            seen |= ids
            kept += list(row_index[row_mask > 0])
    assert sorted(kept) == sorted(indices)  # every example once
    assert seen == set(persons)


def test_a_person_larger_than_a_row_is_refused():
    with pytest.raises(ValueError, match="more examples than a row of 18"):
        list(chunks.person_grids(np.arange(19), np.zeros(19), (16, 18), 18))
