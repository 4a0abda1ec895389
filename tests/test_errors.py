"""One error line and exit 2; a Substra function's output in ASCII in a Docker terminal, its symbols spelled out."""
import subprocess
import sys

from conftest import REPO

CODE = """
import logging, sys
sys.path.insert(0, {repo!r})
from mnist_dp import errors

def main():
    logging.getLogger("x").warning("ε = 2.998 at δ = 1e-05, σ·C ≤ ∞ …")
    raise errors.UserError("max_epsilon = 0.1 is below the ε of a single step (ζ)")

if {ascii}:
    errors.ascii_output()  # what run_cli(task=True) does in Substra's docker backend (a terminal in a container)
errors.run_cli(main, task=True)
"""


def run(ascii):
    return subprocess.run([sys.executable, "-c", CODE.format(repo=str(REPO), ascii=ascii)], capture_output=True)


def test_a_user_error_is_one_line_and_exit_2_and_a_docker_tasks_output_is_ascii():
    proc = run(ascii=True)
    assert proc.returncode == 2
    proc.stderr.decode("ascii")  # Substra's docker backend decodes it one byte at a time
    assert proc.stderr.decode().splitlines() == [
        "eps = 2.998 at delta = 1e-05, sigma*C <= inf ...",
        "error: max_epsilon = 0.1 is below the eps of a single step (\\u03b6)"]
    piped = run(ascii=False)  # a task whose output is a pipe (the subprocess backend), or a script, keeps them
    assert piped.returncode == 2 and "below the ε of a single step (ζ)" in piped.stderr.decode()
