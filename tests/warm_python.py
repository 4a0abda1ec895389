"""`python script args...` in a process forked from one that has already imported the script's
libraries.

A test that runs an algo's command line pays the frameworks' import in every new process (seconds
each, most of a tiny task). A `WarmServer` forks a child per run. The child starts from the server's
environment, runs the script as `__main__` with the run's arguments and working directory, writes
its output to files and exits with the script's code: the code, arguments and environment of a new
process. Then the server imports the installed packages' modules the child imported, after the
environment variables the child set (a script sets some before its imports), so the next child finds
them imported. The server never runs a script itself, and imports no module of the repository.

What differs from a new process is when a library is imported, so what a library does at import
shows only in the first run of a server: a test of that runs `fresh_python` (conftest.py).

Run as a program, this file is the server: a run's request is one JSON line on its stdin, and its
exit code one line on its stdout.
"""
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path


class WarmServer:
    """A server in environment `env`; `run` is `subprocess.run(capture_output=True, text=True)` of
    `python *argv` in `cwd`. Give one server scripts of the same code: it keeps what they import."""

    def __init__(self, env: dict):
        self.server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True, env=env)

    def run(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = {"argv": argv, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            reply = self.server.stdout.readline()
            if not reply:
                raise RuntimeError(f"the warm server of {argv[0]} stopped")
            return subprocess.CompletedProcess([sys.executable, *request["argv"]], int(reply),
                                               out.read_text(), err.read_text())

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait()


def serve() -> None:
    """Run each request on stdin in a forked child, then import what the child imported."""
    replies = os.fdopen(os.dup(1), "w")
    silent = os.open(os.devnull, os.O_RDWR)
    os.dup2(silent, 1)
    start_environment = dict(os.environ)
    learned = Path(tempfile.mkdtemp(), "learned.json")
    for line in sys.stdin:
        sys.stdout.flush(), sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(json.loads(line), start_environment, silent, learned)
        replies.write(f"{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}\n")
        replies.flush()
        if learned.exists():  # not when the child was killed before writing it
            import_what_the_child_did(json.loads(learned.read_text()))
            learned.unlink()


def child(request: dict, environment: dict, stdin: int, learned: Path) -> None:
    """Run the request as the script's `__main__` and exit with its code (never returns)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(environment)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.chdir(request["cwd"])
    before = installed_modules()
    code = run_as_main(request["argv"])
    learned.write_text(json.dumps({"environment": dict(os.environ),
                                   "modules": sorted(installed_modules() - before)}))
    raise SystemExit(code)


def run_as_main(argv: list[str]) -> int:
    """The exit code of `python *argv`, run in this process."""
    sys.argv, sys.path[0] = argv, os.path.dirname(os.path.realpath(argv[0]))
    try:
        runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter does: traceback, exit code 1
        traceback.print_exc()
        return 1


def installed_modules() -> set[str]:
    """The names of the imported modules that installed packages hold (site-packages)."""
    return {name for name, module in list(sys.modules.items())
            if "site-packages" in (getattr(module, "__file__", None) or "")}


def import_what_the_child_did(learned: dict) -> None:
    """Set the environment the child ended with, then import the installed modules it imported."""
    os.environ.update(learned["environment"])
    for name in learned["modules"]:
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001, S112 - a module that imports only in its context
            continue


if __name__ == "__main__":
    serve()
