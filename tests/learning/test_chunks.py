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
    assert chunks.chunk_sizes(8, largest=40) == (64, 72)  # a person's examples fit in one chunk


@pytest.mark.parametrize("count", [0, 1, 17, 40, 200])
def test_person_chunks_keep_each_persons_examples_together(count):
    rng = np.random.default_rng(count)
    indices = np.sort(rng.choice(1000, count, replace=False))
    persons = rng.integers(0, max(count // 3, 1), count) * 7  # any integers, unsorted
    got = list(chunks.person_chunks(indices, persons, (16, 18)))
    assert len(got) >= 1 and all(len(index) in (16, 18) for index, *_ in got)
    kept = np.concatenate([index[mask > 0] for index, mask, *_ in got])
    assert sorted(kept) == sorted(indices)  # every example once
    seen = set()
    for index, mask, groups, person_mask in got:
        ids = persons[np.searchsorted(indices, index[mask > 0])]
        assert not seen & set(ids)  # no person in two chunks
        seen |= set(ids)
        # the chunk's persons are 0..P-1, in the order of their ids, and person_mask marks P
        assert np.array_equal(groups[mask > 0], np.unique(ids, return_inverse=True)[1])
        assert person_mask.sum() == len(set(ids)) and person_mask[:len(set(ids))].all()


def test_a_person_larger_than_a_chunk_is_refused():
    with pytest.raises(ValueError, match="more examples than a chunk of 18"):
        list(chunks.person_chunks(np.arange(19), np.zeros(19), (16, 18)))
