"""Progress bars inside a task (mnist_dp/utils/progress.py): drawn where the script that runs the
task copies its output to a terminal, never for a search's candidates, and never with a rate or a
time."""
import io
import os
import subprocess
import sys

from mnist_dp.utils import progress

DRAW = """import time
from mnist_dp.utils import progress
with progress.bar(3, "train (torch)", "step", shown={shown}) as bar:
    for _ in range(3):
        time.sleep(0.01)
        bar.update()
"""


def drawn(shown=True, **env) -> str:
    """What a task's bar writes to its stderr, a pipe as in Substra's subprocess mode."""
    proc = subprocess.run([sys.executable, "-c", DRAW.format(shown=shown)], capture_output=True,
                          text=True, env={**env, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_a_task_draws_its_bar_when_the_script_says_a_terminal_sees_it():
    assert drawn() == ""  # a pipe, and nobody said a terminal is at its end
    shown = drawn(**{progress.VARIABLE: "1"})
    assert "train (torch): 100% 3/3 steps" in shown
    # no timing
    assert "it/s" not in shown and "s/step" not in shown and "<" not in shown and "00:" not in shown
    assert drawn(shown=False, **{progress.VARIABLE: "1"}) == ""  # a search's candidates: never


def test_the_script_says_so_only_when_it_writes_to_a_terminal(monkeypatch):
    monkeypatch.delenv(progress.VARIABLE, raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    progress.show_in_tasks()
    assert progress.VARIABLE not in os.environ
