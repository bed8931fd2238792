"""Located problems in a spec, collected and reported together.

Every problem names the file, line and column, the dotted path of the field,
and what was expected: ``specs/x.yaml:12:5: buffers.cu_seqlens.pad: unknown
strategy 'zero' (expected one of: trailing_sequence, repeat_last)``.
Validation never stops at the first problem and never raises for a user's
mistake: it appends to a :class:`Diagnostics` and the CLI prints them all.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache


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


#: "Did you mean" compares a word in full (difflib's ratio) with at most this
#: many candidates: those sharing the most character pairs with it, found
#: through an index. A hostile spec can have thousands of unknown names
#: against hundreds of declared ones; each costs little this way.
CLOSEST_COMPARED = 3


def _pairs(word: str) -> dict[str, None]:
    """The word's character pairs, padded at both ends, in order, once each."""
    padded = f"\0{word}\0"
    return dict.fromkeys(padded[i : i + 2] for i in range(len(padded) - 1))


@lru_cache(maxsize=64)
def _pair_index(candidates: frozenset[str]) -> dict[str, tuple[str, ...]]:
    index: dict[str, list[str]] = {}
    for name in sorted(candidates):
        for pair in _pairs(name):
            index.setdefault(pair, []).append(name)
    return {pair: tuple(names) for pair, names in index.items()}


def closest_name(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like ``word`` (difflib's ratio at least 0.6), or
    ``None``; deterministic, and cheap whatever the number of candidates."""
    pool = frozenset(candidates)
    if len(pool) > CLOSEST_COMPARED:
        index = _pair_index(pool)
        shared: Counter[str] = Counter()
        for pair in _pairs(word):
            shared.update(index.get(pair, ()))
        pool = frozenset(name for name, _ in shared.most_common(CLOSEST_COMPARED))
    close = difflib.get_close_matches(word, sorted(pool), n=1)
    return close[0] if close else None


@dataclass(frozen=True, order=True)
class Location:
    """A 1-based line and column in a spec file."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        # A path can hold any character but '/' and NUL, line breaks too.
        return f"{printable(self.file)}:{self.line}:{self.col}"


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
    """An append-only list of problems, sorted by position when reported;
    a problem reported twice is kept once (in constant time: a hostile spec
    can hold a hundred thousand problems)."""

    items: list[Diagnostic] = field(default_factory=list)
    _seen: set[Diagnostic] = field(default_factory=set, repr=False, compare=False)

    def error(self, location: Location, field_path: str, message: str) -> None:
        # A key or value quoted into a field path or message must not break
        # the one-line ``file:line:col: field: message`` format.
        diag = Diagnostic(location, printable(field_path), printable(message))
        if diag not in self._seen:
            self._seen.add(diag)
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


class RenderError(RuntimeError):
    """The templates, the emitters or the formatter failed: a bug in
    gen-mixin, not in the spec. It lives here, with :class:`SpecError`, so
    that the spec model and the emitters can raise it without importing the
    renderer (which imports them)."""
