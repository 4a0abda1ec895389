"""Progress bars of long work inside a task (scattering features, training steps).

A bar is drawn on a terminal, and also where a script runs the task as a child whose output it
copies to its own terminal (Substra's subprocess mode gives the task a pipe): the script says so
with VARIABLE (`show_in_tasks`). A bar shows counts and its text only, never a rate or a time: a
step's time depends on its Poisson batch size, which is secret randomness.
"""
from __future__ import annotations

import os
import sys

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
