"""Where a run's batches and noise come from: fresh OS entropy by default, noise_seed when asked."""
import numpy as np

from mnist_dp.privacy.randomness import ENTROPY_BITS, PURPOSES, RunRandomness


def test_by_default_every_run_draws_fresh_entropy_and_never_shows_it():
    first, second = RunRandomness.for_run(None), RunRandomness.for_run(None, 0, ("a",))
    assert not first.replayable and first.entropy != second.entropy
    # 256 random bits (the top ones are rarely all 0)
    assert first.entropy.bit_length() > ENTROPY_BITS - 16
    assert str(first.entropy) not in repr(first)
    assert first.numpy("batches").random() != second.numpy("batches").random()


def test_a_noise_seed_replays_and_moves_on_with_the_ledger_and_the_data():
    runs = {RunRandomness.for_run(0, runs, data).entropy for runs in (0, 2)
            for data in (("a",), ("b",), ("a", "b"))}
    # a continued run, and organisations training in parallel, draw different noise
    assert len(runs) == 6
    # the data, not its order
    assert RunRandomness.for_run(0, 2, ("b", "a")) == RunRandomness.for_run(0, 2, ("a", "b"))
    assert RunRandomness.for_run(1, 0, ("a",)) != RunRandomness.for_run(0, 0, ("a",))
    assert (RunRandomness.for_run(7).replayable
            and RunRandomness.for_run(7) == RunRandomness.for_run(7))


def test_each_purpose_has_its_own_stream_and_words_of_either_width():
    randomness = RunRandomness.for_run(3)
    draws = {purpose: randomness.numpy(purpose).random(4).tolist() for purpose in PURPOSES}
    assert len({tuple(d) for d in draws.values()}) == len(PURPOSES)
    words = randomness.words("gradient noise", 624)
    assert words.dtype == np.uint32 and len(set(words.tolist())) > 600
    assert randomness.words("gradient noise", 3, np.uint64).dtype == np.uint64
