"""Where a training run's randomness comes from: its Poisson batches, its gradient noise and
adaptive clipping's count noise.

Private by default. DP's adversary has the code, the hyperparameters, the model file and every
example but one: if they could regenerate the batches and the noise, they would replay training with
and without the target example and see which gives the released weights (ε = ∞ whatever the ledger
says). So every run draws 256 fresh bits from the operating system's CSPRNG (`secrets`), stored
nowhere, and every generator of the run is seeded from them. `noise_seed` (a hyperparameter, null by
default) asks for replayable noise instead, for tests and experiments: the model records it, and
every report says its ε holds only while the seed is secret.

Each use draws from its own stream (`PURPOSES`), so the noise never depends on how many batches were
drawn. How many bits of state each framework's generator gets from it is said where the generator is
made.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

import numpy as np

ENTROPY_BITS = 256
_POOL_WORDS = ENTROPY_BITS // 32  # numpy's SeedSequence keeps 128 bits unless told more
PURPOSES = {"batches": 0, "gradient noise": 1, "count noise": 2,
            # A private search's: how many candidates and their hyperparameters, their
            # scores' noise, each one's run.
            "search": 3, "score noise": 4, "candidate": 5}
REPLAYABLE_WARNING = ("its noise was drawn from noise_seed: its ε holds only while that seed stays "
                      "secret (whoever knows it can replay training); a model for experiments, not "
                      "for release")


@dataclass(frozen=True, repr=False)
class RunRandomness:
    """The seed material of one training run: fresh OS entropy, or derived from noise_seed
    (`replayable`)."""

    entropy: int
    replayable: bool = False

    def __repr__(self) -> str:  # never print the secret
        return f"RunRandomness(replayable={self.replayable})"

    @classmethod
    def fresh(cls) -> RunRandomness:
        return cls(secrets.randbits(ENTROPY_BITS))

    @classmethod
    def for_run(cls, noise_seed: int | None, earlier_runs: int = 0,
                data: tuple = ()) -> RunRandomness:
        """The randomness of a training run: fresh unless `noise_seed` is given. A replayable run's
        seed moves on with the ledger (a continued run must not replay the run before it) and with
        the data (organisations training in parallel from one global model must not draw the same
        noise: the difference of their models would cancel it).

        Args:
          noise_seed: the noise_seed hyperparameter (None: fresh OS entropy).
          earlier_runs: how many runs the model's ledger holds before this one.
          data: the identities of the run's data samples.

        Returns:
          The RunRandomness: fresh, or derived from the three (`replayable`).
        """
        if noise_seed is None:
            return cls.fresh()
        digest = hashlib.sha256(json.dumps([noise_seed, earlier_runs,
                                            sorted(data)]).encode()).digest()
        return cls(int.from_bytes(digest, "big"), replayable=True)

    def _sequence(self, purpose: str) -> np.random.SeedSequence:
        return np.random.SeedSequence(self.entropy, spawn_key=(PURPOSES[purpose],),
                                      pool_size=_POOL_WORDS)

    def candidate(self, index: int) -> RunRandomness:
        """The randomness of a search's `index`-th candidate run: streams of its own, as fresh (or
        as replayable) as the search's."""
        words = np.random.SeedSequence(self.entropy, spawn_key=(PURPOSES["candidate"], index),
                                       pool_size=_POOL_WORDS).generate_state(_POOL_WORDS, np.uint32)
        return RunRandomness(int.from_bytes(words.astype(">u4").tobytes(), "big"), self.replayable)

    def numpy(self, purpose: str) -> np.random.Generator:
        """A numpy generator (PCG64: 128-bit state and 128-bit increment) for `purpose`."""
        return np.random.Generator(np.random.PCG64(self._sequence(purpose)))

    def words(self, purpose: str, count: int, dtype=np.uint32) -> np.ndarray:
        """Seed words for a framework's own generator.

        Args:
          purpose: the stream, one of PURPOSES.
          count: how many words.
          dtype: np.uint32 or np.uint64.

        Returns:
          `count` seed words of `dtype` for `purpose`.
        """
        return self._sequence(purpose).generate_state(count, dtype)


def standard_normal(rng: np.random.Generator, shape: tuple = (), secure: bool = False,
                    dtype=np.float64):
    """N(0, 1) draws.

    Args:
      rng: the generator they are drawn from.
      shape: their shape.
      secure: draw as Opacus' secure_mode draws its noise: the sum of four draws over 2, whose low
        bits no longer reveal the value drawn (the floating-point attack, Mironov 2012).
      dtype: their dtype.

    Returns:
      N(0, 1) draws of `shape` from `rng`.
    """
    if secure:
        return rng.standard_normal((4, *shape), dtype).sum(0) / 2
    return rng.standard_normal(shape, dtype)
