"""User-facing errors: one clear line and a non-zero exit, never a bare traceback."""
import codecs
import os
import signal
import sys


class UserError(Exception):
    """A problem the user can fix (bad file, bad value). Printed as one line, exit code 2."""

    user_error = True


def is_user_error(exc: BaseException) -> bool:
    # Duck-typed so that self-contained modules (the opener) can raise their own class with
    # `user_error = True` without importing this package.
    return bool(getattr(exc, "user_error", False))


class Terminated(KeyboardInterrupt):
    """SIGTERM (e.g. `kill`, a scheduler's time limit): unwound like Ctrl-C, so that temporary files
    and child processes are cleaned up on the way out."""


def _terminate(signum, frame):
    raise Terminated()


# The symbols our messages use, spelled out where only ASCII may be printed (see ascii_output).
_SPELLED = {"ε": "eps", "δ": "delta", "σ": "sigma", "∞": "inf", "≤": "<=", "≥": ">=", "·": "*", "×": "x",
            "…": "...", "–": "-", "—": "-", "√": "sqrt", "‖": "|", "→": "->"}


def _spell_out(error: UnicodeEncodeError):
    text = error.object[error.start:error.end]
    return "".join(_SPELLED.get(c, f"\\u{ord(c):04x}") for c in text), error.end


codecs.register_error("mnist_dp.spell_out", _spell_out)


def ascii_output() -> None:
    """Make this process print ASCII only, spelling out ε, δ, σ, …"""
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="ascii", errors="mnist_dp.spell_out")


def in_docker_terminal() -> bool:
    """Whether this process writes to a terminal inside a Docker container: how Substra's docker backend runs a
    task. It reads the task's output one byte at a time (docker-py streams a TTY's log in chunks of 1) and
    decodes each byte as UTF-8, so a single non-ASCII character in a task's warning or error fails the whole
    compute plan."""
    return sys.stderr.isatty() and os.path.exists("/.dockerenv")


def run_cli(main, *args, explain=None, task=False):
    """Run `main`, turning user errors, Ctrl-C and SIGTERM into one line on stderr and a non-zero exit.

    `explain(exc)` may name other exceptions a user can act on (a Substra node's refusal): it returns
    the line to print, or None to let the exception through. `task`: a Substra function, whose output is
    ASCII in Substra's docker backend (in_docker_terminal).
    """
    if task and in_docker_terminal():
        ascii_output()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return main(*args)
    except Terminated:
        print("terminated", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # re-raised unless it is a user error (or explained)
        message = str(exc) if is_user_error(exc) else explain(exc) if explain else None
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
