"""What every ``gen-mixin`` subcommand shares: exit codes, an argument parser
that exits 2, bounded integer arguments, and one-line problem reports.

Kept apart from :mod:`generator.cli` so that the subcommands (``plan``) do
not import the command that dispatches to them.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from generator.diagnostics import SpecError, printable
from generator.limits import MAX_INTEGER

EXIT_OK, EXIT_STALE, EXIT_INVALID, EXIT_INTERNAL = 0, 1, 2, 3

#: User text echoed in a message is cut to this many characters.
ECHO_LIMIT = 60


def echo(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` quoted for a one-line message: escaped, and cut short when
    long (a command-line value can have thousands of characters)."""
    if len(text) > limit:
        return repr(printable(text[:limit]))[:-1] + f"...' ({len(text)} characters)"
    return repr(printable(text))


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line exits 2 with one escaped line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_INVALID, f"{self.prog}: error: {printable(message)}\n")


_INTEGER = re.compile(r"\s*([+-]?)([0-9]+)\s*")


def bounded_int(low: int, high: int = MAX_INTEGER) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in ``low..high``, checked on the
    text's length first (Python refuses to convert more than 4300 digits)."""

    def parse(text: str) -> int:
        match = _INTEGER.fullmatch(text)
        if match is None:
            raise argparse.ArgumentTypeError(f"{echo(text)} is not an integer")
        digits = match.group(2).lstrip("0") or "0"
        value = int(match.group(1) + digits) if len(digits) <= 19 else None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{echo(text)} is out of range (expected {low} to {high})"
            )
        return value

    parse.__name__ = "integer"  # argparse names the type in some messages
    return parse


def print_spec_error(err: SpecError) -> None:
    for diag in err.diagnostics:
        print(diag, file=sys.stderr)
    count = len(err.diagnostics)
    print(
        f"gen-mixin: {count} problem{'s' if count != 1 else ''} found", file=sys.stderr
    )


def print_error(message: str) -> None:
    """A problem that belongs to no spec position (an output path, the
    command line): ``gen-mixin: error: <message>``, on one line."""
    print(f"gen-mixin: error: {printable(message)}", file=sys.stderr)
