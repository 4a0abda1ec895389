"""One error line and exit 2; a Substra function's output in ASCII in a Docker terminal, its symbols
spelled out."""
import subprocess
import sys

import pytest
from conftest import REPO

CODE = """
import logging, sys
sys.path.insert(0, {repo!r})
from mnist_dp.utils import errors

def main():
    logging.getLogger("x").warning("ε = 2.998 at δ = 1e-05, σ·C ≤ ∞ …")
    raise errors.UserError("max_epsilon = 0.1 is below the ε of a single step (ζ)")

if {ascii}:
    # what run_cli(task=True) does in Substra's docker backend (a terminal in a container)
    errors.ascii_output()
errors.run_cli(main, task=True)
"""


def run(ascii):
    return subprocess.run([sys.executable, "-c", CODE.format(repo=str(REPO), ascii=ascii)],
                          capture_output=True)


def test_a_user_error_is_one_line_and_exit_2_and_a_docker_tasks_output_is_ascii():
    proc = run(ascii=True)
    assert proc.returncode == 2
    proc.stderr.decode("ascii")  # Substra's docker backend decodes it one byte at a time
    assert proc.stderr.decode().splitlines() == [
        "eps = 2.998 at delta = 1e-05, sigma*C <= inf ...",
        "error: max_epsilon = 0.1 is below the eps of a single step (\\u03b6)"]
    # a task whose output is a pipe (the subprocess backend), or a script, keeps them
    piped = run(ascii=False)
    assert piped.returncode == 2 and "below the ε of a single step (ζ)" in piped.stderr.decode()


def run_main(body, tmp_path):
    """Run `body` (the lines of main) under run_cli in a new process."""
    script = tmp_path / "main.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom mnist_dp.utils import "
                      "errors\n\ndef "
                      "main():\n" + "".join(f"    {line}\n" for line in body.splitlines()) +
                      "\nerrors.run_cli(main)\n")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True)


def test_a_full_disk_or_a_read_only_file_system_is_one_line_naming_the_file(tmpfs, tmp_path):
    # no inode left for a new file: ENOSPC naming it
    read_only, full = tmpfs("ro"), tmpfs("nr_inodes=1")
    for path, line in ((read_only / "out.txt",
                        "Read-only file system; write somewhere else, or mount that file system "
                        "read-write"),
                       (full / "out.txt", "No space left on device; free space on that disk, or "
                                          "write somewhere else")):
        proc = run_main(f"open({str(path)!r}, 'w')", tmp_path)
        assert (proc.returncode, proc.stderr) == (2, f"error: {path}: {line}\n")


@pytest.mark.parametrize("make, body, line", [
    (lambda p: p.mkdir(), "open({path!r}, 'w')",
     "Is a directory; a folder stands where a file is read or written: move it away"),
    (lambda p: p.write_text("notes"), "open({path!r} + '/x', 'w')",
     "Not a directory; a file stands where a folder is needed on that path: move it away"),
])
def test_a_folder_or_a_file_where_the_other_is_needed_is_one_line_naming_it(tmp_path, make, body,
                                                                           line):
    path = tmp_path / "earlier"
    make(path)
    proc = run_main(body.format(path=str(path)), tmp_path)
    named = f"{path}/x" if "/x" in body else str(path)
    assert (proc.returncode, proc.stderr) == (2, f"error: {named}: {line}\n")


def test_an_os_error_that_may_be_the_codes_mistake_keeps_its_traceback(tmp_path):
    # a missing file: a wrong path in code
    proc = run_main(f"open({str(tmp_path / 'no-such-file')!r})", tmp_path)
    assert (proc.returncode == 1 and "Traceback" in proc.stderr
            and "FileNotFoundError" in proc.stderr)


def test_a_broken_pipe_that_is_not_stdout_keeps_its_traceback(tmp_path):
    # A connection closed by its other end (a Substra node's, say) is a failure, not a
    # reader that has had enough.
    proc = run_main("import socket\nours, theirs = "
                    "socket.socketpair()\ntheirs.close()\nours.sendall(b'x' * 100_000)", tmp_path)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "BrokenPipeError" in proc.stderr
