"""Command-line options every entry point shares: each number bounded and each list checked by
argparse, before any work starts. A bad option is one `error:` line naming it and exit 2 (run_cli),
like every other user error.

    parser = options.ArgumentParser(__doc__)
    parser.add_argument("--rounds", type=options.integer(1, MAX_TASKS), default=1, help=...)
    parser.add_argument("--frameworks", type=options.names(ALGO_ASSETS), default=..., help=...)
"""
from __future__ import annotations

import argparse
import math

from mnist_dp.utils.errors import UserError

MAX_SEED = 2**31 - 1  # every framework's seed type and numpy's hold it
# Organisations (or folds) sharing one dataset: each is a Substra client and a dataset of its own;
# beyond this a typo (an extra digit) is likelier than a federation.
MAX_ORGANIZATIONS = 1_000
# Digits of the longest integer read from a command line or a JSON file: no count, size or seed of
# this bundle has more. Python refuses to convert more than 4,300 (sys.get_int_max_str_digits)
# with a ValueError of its own.
MAX_DIGITS = 40


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are UserErrors (one line naming the option, exit 2 through
    run_cli) instead of a usage block; its help keeps the description's line breaks."""

    def __init__(self, description: str, **kwargs):
        super().__init__(description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


def _int(text: str) -> int:
    digits = text.strip().lstrip("+-")
    if len(digits) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(digits):,} digits")
    return int(text)


def _bounded(convert, inside, what: str, shown=str):
    """An argparse type: `convert(text)` where `inside(value)`; else an error saying it is not
    `what`."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what}") from None
        if not inside(value):
            raise argparse.ArgumentTypeError(f"{shown(value)} is not {what}")
        return value

    return parse


def integer(low: int, high: int):
    """An argparse type: an integer from `low` to `high`."""
    return _bounded(_int, lambda v: low <= v <= high, f"an integer from {low:,} to {high:,}",
                    "{:,}".format)


def number(low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    """An argparse type: a finite number in the interval from `low` to `high`.

    Args:
      low: the interval's low end.
      high: its high end.
      low_open: leave `low` out.
      high_open: leave `high` out.

    Returns:
      The type: a function of the option's text that returns it as a float, or raises
      argparse.ArgumentTypeError.
    """
    def inside(v):
        return math.isfinite(v) and (low < v if low_open
                                     else low <= v) and (v < high if high_open else v <= high)

    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return _bounded(float, inside, f"a number in {interval}", "{:g}".format)


def comma_list(item, *, at_least: int = 1):
    """An argparse type: comma-separated items, each read by `item` (an argparse type), none twice,
    at least `at_least` of them (so that a command cannot run on nothing and report success)."""
    def parse(text: str) -> list:
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
        if len(values) < at_least:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: give at least {at_least}, "
                                             "comma-separated")
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"{text[:40]!r}: {', '.join(twice)} given twice")
        return values

    return parse


def choice(known):
    """An argparse type: one of `known` (a dict's keys or a sequence)."""
    def parse(text: str) -> str:
        if text not in known:
            raise argparse.ArgumentTypeError(f"unknown {text[:40]!r}; choose among "
                                             f"{', '.join(known)}")
        return text

    return parse


def names(known):
    """An argparse type: comma-separated names, each one of `known`, at least one, none twice."""
    return comma_list(choice(known))


def refuse_unused(mode: str, given: dict) -> None:
    """Refuse, in one line, the options in `given` ({flag: its value; None, False or [] when not
    given}) that have no effect in `mode` (e.g. "with --strategy fedavg"): an option silently
    ignored lets a user believe it was applied."""
    unused = [flag for flag, value in given.items() if value is not None and value is not False
              and value != []]
    if unused:
        has, them = ("has", "it") if len(unused) == 1 else ("have", "them")
        raise UserError(f"{' and '.join(unused)} {has} no effect {mode}; drop {them}")
