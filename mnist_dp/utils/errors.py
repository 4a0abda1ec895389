"""User-facing errors: one clear line and a non-zero exit, never a bare traceback."""
import codecs
import contextlib
import errno
import os
import select
import shutil
import signal
import sys


class UserError(Exception):
    """A problem the user can fix (bad file, bad value). Printed as one line, exit code 2."""

    user_error = True


def refuse_unknown_inputs(function: str, inputs: dict, known: set) -> None:
    """Refuse a substratools function's input that is not one it uses: an input it would ignore is
    refused, not ignored.

    Args:
      function: the function's name, which the error names.
      inputs: its task inputs but the opener.
      known: the inputs it uses.
    """
    unknown = sorted(set(inputs) - set(known))
    if unknown:
        raise UserError(f"input {unknown[0]!r}: the {function} function does not use it (it takes "
                        f"{', '.join(sorted(known))}); remove it")


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
_SPELLED = {"ε": "eps", "δ": "delta", "σ": "sigma", "∞": "inf", "≤": "<=", "≥": ">=", "·": "*",
            "×": "x", "…": "...", "–": "-", "—": "-", "√": "sqrt", "‖": "|", "→": "->"}


def _spell_out(error: UnicodeEncodeError):
    text = error.object[error.start:error.end]
    return "".join(_SPELLED.get(c, f"\\u{ord(c):04x}") for c in text), error.end


codecs.register_error("mnist_dp.spell_out", _spell_out)


def ascii_output() -> None:
    """Make this process print ASCII only, spelling out ε, δ, σ, …"""
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="ascii", errors="mnist_dp.spell_out")


def in_docker_terminal() -> bool:
    """Whether this process writes to a terminal inside a Docker container: how Substra's docker
    backend runs a task. It reads the task's output one byte at a time (docker-py streams a TTY's
    log in chunks of 1) and decodes each byte as UTF-8, so a single non-ASCII character in a task's
    warning or error fails the whole compute plan."""
    return sys.stderr.isatty() and os.path.exists("/.dockerenv")


def run_cli(main, *args, explain=None, task=False):
    """Run `main`, turning user errors, Ctrl-C and SIGTERM into one line on stderr and a non-zero
    exit.

    An OSError the machine's state explains (a full disk, a read-only folder) is one line too
    (explain_os_error).

    Args:
      main: the function to run.
      *args: its arguments.
      explain: `explain(exc)` may name other exceptions a user can act on (a Substra node's
        refusal): it returns the line to print, or None to let the exception through.
      task: `main` is a Substra function, whose output is ASCII in Substra's docker backend
        (in_docker_terminal).

    Returns:
      What `main` returns.
    """
    if task and in_docker_terminal():
        ascii_output()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = main(*args)
        sys.stdout.flush()  # here, so that a reader gone (below) is not Python's complaint at exit
        return result
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a socket's, say: a real failure
        # `| head` (grep -q, less) has read all it wanted: normal use, so exit quietly, as the
        # Python docs say (stdout to devnull, or the interpreter's last flush fails again), with the
        # status of a tool that SIGPIPE ended.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except Terminated:
        print("terminated", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # re-raised unless it is a user error (or explained)
        if is_user_error(exc):
            message = str(exc)
        else:
            message = ((explain(exc) if explain else None) or (task and _explain_workspace(exc))
                       or explain_os_error(exc))
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


# What to do about an OSError that is the machine's state, not the code's fault: a full disk, a
# read-only or forbidden path, a folder or a file where the other is needed.
_OS_ADVICE = {
    errno.ENOSPC: "free space on that disk, or write somewhere else",
    errno.EDQUOT: "free space within your disk quota, or write somewhere else",
    errno.EROFS: "write somewhere else, or mount that file system read-write",
    errno.EACCES: "check its permissions and its folder's, or use another path",
    errno.EPERM: "check its permissions and its folder's, or use another path",
    errno.EISDIR: "a folder stands where a file is read or written: move it away",
    errno.ENOTDIR: "a file stands where a folder is needed on that path: move it away",
}


def os_advice(exc: BaseException) -> str | None:
    """What to do about an OSError that is the machine's state (a full disk, a read-only or
    forbidden path), or None."""
    return _OS_ADVICE.get(exc.errno) if isinstance(exc, OSError) else None


def cannot_write(folder, reason, advice: str | None = None) -> UserError:
    """The error for a folder this process cannot write in.

    Args:
      folder: the folder.
      reason: why (e.g. the OSError's strerror).
      advice: what to do; None: choose a folder you can write to.

    Returns:
      The UserError, for the caller to raise.
    """
    advice = advice or "choose a folder you can write to"
    return UserError(f"{folder}: cannot write in this folder ({reason}); {advice}")


@contextlib.contextmanager
def writing_in(folder):
    """Turn an OSError (permissions, read-only or full disk) into a UserError naming `folder` and
    what to do."""
    try:
        yield
    except OSError as exc:
        # numpy's short write ("N requested and M written")
        if exc.errno is None and _nearly_full(folder):
            exc = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise cannot_write(folder, exc.strerror or exc, os_advice(exc)) from None


def _nearly_full(folder) -> bool:
    try:
        return shutil.disk_usage(folder).free < 2**20
    except OSError:
        return False


def explain_os_error(exc: BaseException) -> str | None:
    """One line for an OSError a user can act on (see _OS_ADVICE) that names its file; None for any
    other (a missing file or a bad argument may be the code's mistake: its traceback is kept)."""
    if isinstance(exc, OSError) and exc.filename is not None and os_advice(exc):
        return f"{exc.filename}: {exc.strerror}; {os_advice(exc)}"
    return None


def _explain_workspace(exc: BaseException) -> str | None:
    """substratools creates chainkeys/ and model/ in the working directory before it runs any
    function."""
    from substratools import workspace

    if not isinstance(exc, OSError) or exc.filename is None:
        return None
    folders = {os.path.abspath(os.path.dirname(path)) for path in (workspace.DEFAULT_CHAINKEYS_PATH,
                                                                   workspace.DEFAULT_LOG_PATH)}
    if os.path.abspath(str(exc.filename)) not in folders:
        return None
    return (f"{exc.filename}: substratools cannot create this folder ({exc.strerror}); it makes "
            "chainkeys/ and model/ in the working directory of every function: run the function "
            "from a writable folder with free space")


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has exited (a pipe without readers polls as an
    error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, ValueError, OSError):  # stdout replaced or closed
        return False
