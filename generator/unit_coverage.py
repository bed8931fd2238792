"""The most rows a batch within a budget can bring: the bound a unit capture
(``capture.units``) must hold.

A unit capture sizes its buffers from the budget alone, so the static checks
need the largest number of rows of one flat input that a batch the manager
may pack brings: at most ``max_batch_size`` items whose budget tokens sum to
at most the budget. Items come from sampled dims (each item an ``(tokens,
rows)`` point). The bound is the optimum of the linear relaxation, exact
fractions: it is never below what a real batch of the sampled items brings,
so a capture that holds it holds every such batch. A concrete batch that
reaches (or nearly reaches) it is returned with it, for the message.

With the items' points, the relaxation is ``max X * f(t)`` for ``X <=
max_batch_size`` items of average tokens ``t`` with ``X * t <= budget``,
``f`` the upper concave envelope of the points: its optimum lies at a vertex
of the envelope or where ``t = budget / max_batch_size``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import floor


@dataclass(frozen=True)
class ItemPoint:
    """One sampled item: its budget tokens, its rows, and the dims it has."""

    tokens: int
    rows: int
    dims: Mapping[str, int]


@dataclass(frozen=True)
class Witness:
    """A batch that fits: ``count`` items of each point."""

    parts: tuple[tuple[int, ItemPoint], ...]

    @property
    def rows(self) -> int:
        return sum(n * p.rows for n, p in self.parts)

    @property
    def tokens(self) -> int:
        return sum(n * p.tokens for n, p in self.parts)

    def describe(self) -> str:
        parts = []
        for n, p in self.parts:
            dims = ", ".join(f"{d}={v}" for d, v in p.dims.items())
            items = "1 item" if n == 1 else f"{n} items"
            parts.append(f"{items} with {dims}" if dims else items)
        return " and ".join(parts)


def envelope(points: Sequence[ItemPoint]) -> list[ItemPoint]:
    """The vertices of the upper concave envelope of the points, by tokens
    (for equal tokens, the one with the most rows)."""
    best: dict[int, ItemPoint] = {}
    for p in points:
        if p.tokens < 0 or p.rows <= 0:
            continue
        if p.tokens not in best or p.rows > best[p.tokens].rows:
            best[p.tokens] = p
    hull: list[ItemPoint] = []
    for p in sorted(best.values(), key=lambda q: q.tokens):
        while len(hull) >= 2 and _not_above(hull[-2], hull[-1], p):
            hull.pop()
        hull.append(p)
    return hull


def _not_above(a: ItemPoint, b: ItemPoint, c: ItemPoint) -> bool:
    """``b`` lies below the segment from ``a`` to ``c`` (points on it stay:
    each is an item a concrete batch can be made of)."""
    cross = (b.tokens - a.tokens) * (c.rows - a.rows) - (b.rows - a.rows) * (
        c.tokens - a.tokens
    )
    return cross > 0


def most_rows(
    hull: Sequence[ItemPoint], budget: int, max_items: int
) -> tuple[int, Witness | None]:
    """(the bound on the rows of a batch within ``budget`` and ``max_items``
    items, the best concrete batch found)."""
    bound = Fraction(0)
    candidates: list[Witness] = []
    for p in hull:
        count = max_items if p.tokens == 0 else min(max_items, budget // p.tokens)
        if p.tokens == 0:
            bound = max(bound, Fraction(max_items * p.rows))
        else:
            bound = max(bound, min(max_items, Fraction(budget, p.tokens)) * p.rows)
        if count > 0:
            candidates.append(Witness(((count, p),)))
    mean = Fraction(budget, max_items)
    for a, b in zip(hull, hull[1:]):
        if not a.tokens < mean < b.tokens:
            continue
        share = (mean - a.tokens) / (b.tokens - a.tokens)  # of items like b
        bound = max(bound, max_items * (a.rows + share * (b.rows - a.rows)))
        n_b = floor(max_items * share)
        n_a = min(max_items - n_b, (budget - n_b * b.tokens) // max(a.tokens, 1))
        if a.tokens == 0:
            n_a = max_items - n_b
        parts = tuple((n, p) for n, p in ((n_a, a), (n_b, b)) if n > 0)
        if parts:
            candidates.append(Witness(parts))
    best = max(candidates, key=lambda w: w.rows, default=None)
    return floor(bound), best
