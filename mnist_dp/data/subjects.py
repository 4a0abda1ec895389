"""Who is who in generated data: each train image's person, written as a sample's subjects.npy, for
demos and benchmarks of per-person privacy (`generate_data.py --images-per-subject`).

A spec is "K", every person K images (a sample's last person fewer), or "LO-HI", each person's
count drawn uniformly from LO..HI: a skewed split, most persons several images and some many. A
person's images are consecutive in a sample, whose images are already shuffled, and every person is
in one sample only; ids are integers, unique across the train samples.
"""
from __future__ import annotations

import re

import numpy as np

from mnist_dp.data.samples import SUBJECTS_FILE
from mnist_dp.utils.errors import UserError

MAX_IMAGES = 100_000  # per person: far more than any MNIST-format data set gives one writer


def parse(spec: str) -> tuple[int, int]:
    """`--images-per-subject`'s value "K" or "LO-HI" -> (LO, HI) images per person, 1 ≤ LO ≤ HI.
    An argparse type: a bad value raises UserError (one line, exit 2)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", str(spec))
    low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, 0)
    if not match or not 1 <= low <= high <= MAX_IMAGES:
        raise UserError(f"--images-per-subject {spec}: give K or LO-HI, whole numbers with "
                        f"1 ≤ LO ≤ HI ≤ {MAX_IMAGES:,} (images per person)")
    return low, high


def assign(n: int, sizes: tuple[int, int], rng: np.random.Generator, first: int = 0) -> np.ndarray:
    """Each of `n` consecutive images' person.

    Args:
      n: the sample's images.
      sizes: (LO, HI), images per person (parse).
      rng: draws each person's count when LO < HI.
      first: the first person's id.

    Returns:
      int64 [n]: ids from `first` up, each person's images consecutive.
    """
    low, high = sizes
    counts, total = [], 0
    while total < n:
        counts.append(int(rng.integers(low, high + 1)) if low < high else low)
        total += counts[-1]
    return np.repeat(np.arange(first, first + len(counts), dtype=np.int64), counts)[:n]


def write(folder, subjects: np.ndarray) -> None:
    """Write a sample's subjects.npy (int64, one id per image)."""
    np.save(folder / SUBJECTS_FILE, np.ascontiguousarray(subjects, dtype=np.int64))
