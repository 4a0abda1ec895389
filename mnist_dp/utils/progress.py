"""Progress bars of long work inside a task (scattering features, training steps).

A bar is drawn on a terminal, and also where a script runs the task as a child whose output it
copies to its own terminal (Substra's subprocess mode gives the task a pipe): the script says so
with VARIABLE (`show_in_tasks`). A bar shows counts and its text only, never a rate or a time: a
step's time depends on its Poisson batch size, which is secret randomness.
"""
from __future__ import annotations

import contextlib
import os
import sys
from unittest import mock

# "1": the task's output reaches a terminal through the script that runs it
VARIABLE = "MNIST_DP_PROGRESS"
FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} {unit}s{postfix}"


def bar(total: int, desc: str, unit: str, shown: bool = True):
    """A tqdm bar of `total` `unit`s named `desc`.

    Args:
      total: the count it reaches.
      desc: its name.
      unit: what it counts.
      shown: False for none (a search's candidates: their number is secret).

    Returns:
      The bar, disabled when not `shown` or when no terminal sees it.
    """
    from tqdm import tqdm

    # None: a terminal's only
    disable = True if not shown else False if os.environ.get(VARIABLE) == "1" else None
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, bar_format=FORMAT,
                mininterval=1.0)


def show_in_tasks() -> None:
    """Let the tasks this process runs as children draw their bars, when this process writes to a
    terminal."""
    if sys.stderr.isatty():
        os.environ[VARIABLE] = "1"


class Lines:
    """A library's progress bar where no terminal sees it: one line per step it counts
    ("Compute plan progress: 3/9"), never a bar; tqdm's interface as Substra and substrafl use
    it."""

    def __init__(self, iterable=None, total=None, desc=None, **_):
        self.iterable, self.total, self.desc, self.n = iterable, total, desc or "progress", 0

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update()

    def update(self, n: int = 1) -> None:
        if n:  # a poll that found nothing new says nothing
            self.n += n
            print(f"{self.desc}: {self.n}/{self.total}", file=sys.stderr, flush=True)

    def set_postfix_str(self, *_, **__) -> None:
        pass

    def close(self) -> None:
        pass


def counter(total: int, desc: str, unit: str):
    """A bar of `total` `unit`s on a terminal; elsewhere one line per step (Lines)."""
    from tqdm import tqdm

    return (tqdm if sys.stderr.isatty() else Lines)(total=total, desc=desc, unit=unit)


@contextlib.contextmanager
def library_bars(*modules):
    """While the block runs, the tqdm bars of library `modules` (each module's own `tqdm` name)
    are one line per step (Lines) where no terminal sees them; on a terminal they stay bars."""
    if sys.stderr.isatty():
        yield
        return
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(mock.patch.object(module, "tqdm", Lines))
        yield
