"""User-facing errors: one clear line and a non-zero exit, never a bare traceback."""
import sys


class UserError(Exception):
    """A problem the user can fix (bad file, bad value). Printed as one line, exit code 2."""

    user_error = True


def is_user_error(exc: BaseException) -> bool:
    # Duck-typed so that self-contained modules (the opener) can raise their own class with
    # `user_error = True` without importing this package.
    return bool(getattr(exc, "user_error", False))


def run_cli(main, *args, **kwargs):
    """Run `main`, turning user errors and Ctrl-C into one line on stderr and a non-zero exit."""
    try:
        return main(*args, **kwargs)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a user error
        if not is_user_error(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
