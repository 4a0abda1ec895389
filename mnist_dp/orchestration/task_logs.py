"""Where a failed task's log comes from, read as a terminal shows it.

Substra's subprocess mode keeps no log (a task writes straight to our terminal: `OutputTail` keeps
its end); its docker mode keeps a failed task's container (`failed_container_log` reads and removes
it) and joins a failed image build's output into one line (`failed_build_log`); a node serves logs
itself.
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import threading

# How substra's docker backend reports a task whose container failed (it
# names the function's image).
_FAILED_CONTAINER = re.compile(r"Container '(?P<image>[^']+)' exited with status code "
                               r"'(?P<status>-?\d+)'")


def failed_container(message: str) -> tuple | None:
    """(image, exit status) when `message` is how substra's docker backend reports a failed
    container."""
    match = _FAILED_CONTAINER.fullmatch(message)
    return (match["image"], match["status"]) if match else None


def failed_container_log(image: str) -> list | None:
    """The log of the newest exited container of `image` (a failed task), which is then removed:
    substra's docker backend keeps a failed task's container. None if there is none."""
    import docker

    containers = docker.from_env().containers.list(all=True,
                                                   filters={"ancestor": image, "status": "exited"})
    if not containers:
        return None
    container = max(containers, key=lambda c: c.attrs["State"]["FinishedAt"])
    log = container.logs(stdout=True, stderr=True).decode(errors="replace")
    container.remove()
    return terminal_lines(log)


def failed_build_log(build_log: str) -> list:
    """A failed image build's output, which substra joins into one line, split back into its steps;
    the container of the step that failed (the last 'Running in <id>': substra builds without
    forcerm, so Docker keeps it) is removed."""
    import docker

    steps = re.findall(r"---> Running in ([0-9a-f]{12})", build_log)
    if steps:
        with contextlib.suppress(docker.errors.NotFound):
            docker.from_env().containers.get(steps[-1]).remove()
    return [part for step in re.split(r"(?=Step \d+/\d+ : |---> )", build_log)
            for part in textwrap.wrap(step, 160)]


def terminal_lines(text: str) -> list:
    """The lines a terminal would show: a progress bar's redraws (carriage returns) keep their last
    state, and a TTY's CRLF line ends (substra runs containers with a TTY) are plain line ends."""
    return [line.removesuffix("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]


class OutputTail:
    """While active, keep the last bytes written to this process's stdout and stderr (still shown).

    Substra's local mode runs each task as a child process writing straight to our terminal and
    keeps no log (its download_logs raises), so this is the only record of a failed task's output.
    """

    def __init__(self, keep: int = 64 * 1024):
        self.keep = keep
        self.buffer = bytearray()

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self._read_end, write_end = os.pipe()
        for fd in (1, 2):
            os.dup2(write_end, fd)
        os.close(write_end)
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()
        return self

    def _copy(self):
        while chunk := os.read(self._read_end, 65536):
            os.write(self._saved[2], chunk)  # one terminal stream: order is kept
            self.buffer += chunk
            del self.buffer[:-self.keep]

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # closes the pipe's last write ends: the copier sees EOF
        self._thread.join()
        os.close(self._read_end)
        for saved in self._saved.values():
            os.close(saved)
        return False

    def lines(self) -> list:
        return terminal_lines(self.buffer.decode(errors="replace"))


def local_failure(exc: BaseException, tail: OutputTail) -> tuple:
    """(what went wrong, the failed task's log) from an exception Substra's local backend raised
    while running a plan's tasks (ExecutionError, BuildError or a node refusal): a process's exit
    status with the end of our own output (`tail`), a container's exit status with its log, or a
    failed image build with its steps."""
    from substra.sdk.backends.local.compute.spawner.base import BuildError

    cause = exc.args[0] if exc.args else None
    if isinstance(cause, subprocess.CalledProcessError):
        return f"its process exited with status {cause.returncode}", tail.lines()
    if container := failed_container(str(cause)):
        log = failed_container_log(container[0])
        return (f"its container exited with status {container[1]}", tail.lines() if log is None
                else log)
    if isinstance(exc, BuildError):
        return "its Docker image did not build", failed_build_log(str(cause))
    return f"{type(exc).__name__}: {exc}", tail.lines()
