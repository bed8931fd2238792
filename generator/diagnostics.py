"""Located problems in a spec, collected and reported together.

Every problem names the file, line and column, the dotted path of the field,
and what was expected: ``specs/x.yaml:12:5: buffers.cu_seqlens.pad: unknown
strategy 'zero' (expected one of: trailing_sequence, repeat_last)``.
Validation never stops at the first problem and never raises for a user's
mistake: it appends to a :class:`Diagnostics` and the CLI prints them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def printable(text: str) -> str:
    """``text`` with every non-printable character (line breaks, tabs, other
    control and format characters) written as its Python escape, so that a
    diagnostic always stays on one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def field_key(key: str) -> str:
    """A mapping key as a field path shows it: as is, or quoted and escaped
    (``budget.'mi\\nn'``) when it holds a non-printable character."""
    return key if key.isprintable() else repr(key)


@dataclass(frozen=True, order=True)
class Location:
    """A 1-based line and column in a spec file."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True, order=True)
class Diagnostic:
    location: Location
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{self.location}: {where}{self.message}"


@dataclass
class Diagnostics:
    """An append-only list of problems, sorted by position when reported."""

    items: list[Diagnostic] = field(default_factory=list)

    def error(self, location: Location, field_path: str, message: str) -> None:
        # A key or value quoted into a field path or message must not break
        # the one-line ``file:line:col: field: message`` format.
        diag = Diagnostic(location, printable(field_path), printable(message))
        if diag not in self.items:
            self.items.append(diag)

    def __bool__(self) -> bool:
        return bool(self.items)

    def sorted(self) -> list[Diagnostic]:
        return sorted(self.items)


class SpecError(Exception):
    """Raised once validation is complete, carrying every problem found."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        super().__init__("\n".join(str(d) for d in diagnostics))
