"""One error line and exit 2; a Substra function's output in ASCII, its symbols spelled out."""
import subprocess
import sys

from conftest import REPO

CODE = """
import logging, sys
sys.path.insert(0, {repo!r})
from mnist_dp.errors import UserError, run_cli

def main():
    logging.getLogger("x").warning("ε = 2.998 at δ = 1e-05, σ·C ≤ ∞ …")
    raise UserError("max_epsilon = 0.1 is below the ε of a single step (ζ)")

run_cli(main, task={task})
"""


def run(task):
    code = CODE.format(repo=str(REPO), task=task)
    return subprocess.run([sys.executable, "-c", code], capture_output=True)


def test_a_user_error_is_one_line_and_exit_2_and_a_tasks_output_is_ascii():
    proc = run(task=True)
    assert proc.returncode == 2
    proc.stderr.decode("ascii")  # Substra's docker backend decodes it one byte at a time
    assert proc.stderr.decode().splitlines() == [
        "eps = 2.998 at delta = 1e-05, sigma*C <= inf ...",
        "error: max_epsilon = 0.1 is below the eps of a single step (\\u03b6)"]
    script = run(task=False)  # a script in a terminal keeps its symbols
    assert script.returncode == 2 and "below the ε of a single step" in script.stderr.decode()
