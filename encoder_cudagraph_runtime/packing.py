"""Greedy packing of encoder items into budget batches (vLLM 0.33.0 rules).

Pure functions on token counts, used by the manager and tested directly.

The rules, per execute:

1. Items are visited in ascending ``output_tokens`` (stable for ties).
2. A batch keeps a running row count per path. An item *fits* when the
   batch has fewer than ``max_batch_size`` items and, on every path, the
   running count plus the item's rows stays within that path's largest
   budget.
3. A non-empty batch is closed before the item when it does not fit, or
   when it fits but *deferring* pays off: on some path where the item has
   rows, ``b(cur) + b(item) < b(cur + item)`` and ``b(item) >= b(cur)``,
   with ``b(x)`` the smallest path budget ``>= x`` and ``b(0) = 0``. That is,
   replaying the batch and the item separately costs fewer padded rows than
   replaying them together, and the item alone is at least as big as the
   batch (splitting off smaller items would fragment packing).
4. The item then always joins the (possibly new) batch, so an item larger
   than every budget becomes a batch of its own.
5. Each path of a closed batch gets budget 0 (no rows), its smallest budget
   holding the rows, or ``None`` (too big: that path runs eagerly).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "PackedBatch",
    "fitting_budget",
    "pack_items",
    "packed_rows",
    "smallest_fitting_budget",
]


@dataclass(slots=True)
class PackedBatch:
    """One replay unit: items and, per path (in path order), rows and budget."""

    indices: list[int]
    """Original item indices, in packing (ascending size) order."""
    path_tokens: list[int]
    """Rows of the batch on each path."""
    path_budgets: list[int | None]
    """Budget each path replays: 0 = path unused, ``None`` = eager."""


def smallest_fitting_budget(budgets: Sequence[int], tokens: int) -> int | None:
    """The smallest entry of ascending ``budgets`` that is ``>= tokens``, or
    ``None`` when every budget is smaller."""
    i = bisect_left(budgets, tokens)
    return budgets[i] if i < len(budgets) else None


def fitting_budget(budgets: Sequence[int], tokens: int) -> int | None:
    """A path's budget for ``tokens`` rows: 0 for none, else the smallest
    fitting budget (``None`` when oversized)."""
    if tokens == 0:
        return 0
    return smallest_fitting_budget(budgets, tokens)


def pack_items(
    per_path_tokens: Sequence[Sequence[int]],
    sort_tokens: Sequence[int],
    path_budgets: Sequence[Sequence[int]],
    max_batch_size: int,
) -> list[PackedBatch]:
    """Split items into batches with the rules of the module docstring.

    Args:
        per_path_tokens: for each path, the rows of every item on it.
        sort_tokens: per item sort key (``EncoderItemSpec.output_tokens``).
        path_budgets: for each path, its ascending budgets (may start with
            0 for paths that allow zero tokens).
        max_batch_size: most items per batch.

    Returns:
        The batches in the order they were formed.
    """
    order = sorted(range(len(sort_tokens)), key=sort_tokens.__getitem__)
    if len(per_path_tokens) == 1:
        return _pack_one_path(
            per_path_tokens[0], order, path_budgets[0], max_batch_size
        )
    return _pack_many_paths(per_path_tokens, order, path_budgets, max_batch_size)


def packed_rows(
    rows: Sequence[int],
    sort_tokens: Sequence[int],
    budgets: Sequence[int],
    max_batch_size: int,
) -> list[tuple[int | None, int]]:
    """``(budget, rows)`` of each replay unit of one path's items, as
    :func:`pack_items` forms them and the manager's padding statistics
    count them (``None``: run eagerly, unpadded). ``gen-mixin plan
    --traffic`` predicts the manager's padding with it."""
    return [
        (batch.path_budgets[0], batch.path_tokens[0])
        for batch in pack_items([rows], sort_tokens, [budgets], max_batch_size)
    ]


def _pack_one_path(
    tokens: Sequence[int],
    order: list[int],
    budgets: Sequence[int],
    max_batch_size: int,
) -> list[PackedBatch]:
    """:func:`pack_items` for the common single-path case.

    This loop runs for every item of every execute, so it avoids per-item
    containers and most budget lookups: it tracks ``b_cur``, the budget of
    the running count, and when ``cur + item`` still fits in ``b_cur`` the
    merged budget equals ``b_cur`` and deferring cannot pay off
    (``b_cur + b(item) < b_cur`` is impossible), so no lookup is needed.
    Same decisions as :func:`_pack_many_paths`.
    """
    largest = max(budgets)
    num_budgets = len(budgets)

    def budget_of(rows: int) -> int:
        # 0 for no rows; for oversized counts any value works (the next
        # item can never fit such a batch), so clamp to the largest.
        if rows == 0:
            return 0
        i = bisect_left(budgets, rows)
        return budgets[i] if i < num_budgets else largest

    batches: list[PackedBatch] = []
    batch: list[int] = []
    cur = 0
    b_cur = 0
    for idx in order:
        item = tokens[idx]
        if batch:
            merged = cur + item
            if len(batch) < max_batch_size and merged <= largest:
                if merged <= b_cur:
                    batch.append(idx)
                    cur = merged
                    continue
                # merged > b_cur >= 0 implies item > 0.
                b_item = budgets[bisect_left(budgets, item)]
                b_merged = budgets[bisect_left(budgets, merged)]
                if not (b_cur + b_item < b_merged and b_item >= b_cur):
                    batch.append(idx)
                    cur = merged
                    b_cur = b_merged
                    continue
            batches.append(PackedBatch(batch, [cur], [fitting_budget(budgets, cur)]))
        batch = [idx]
        cur = item
        b_cur = budget_of(item)
    if batch:
        batches.append(PackedBatch(batch, [cur], [fitting_budget(budgets, cur)]))
    return batches


def _should_defer(
    cur: list[int], item: list[int], path_budgets: Sequence[Sequence[int]]
) -> bool:
    """Rule 3's deferral test; only valid when the item fits."""
    for p, budgets in enumerate(path_budgets):
        rows = item[p]
        if rows == 0:
            continue
        b_cur = fitting_budget(budgets, cur[p])
        b_item = fitting_budget(budgets, rows)
        b_merged = fitting_budget(budgets, cur[p] + rows)
        assert b_cur is not None and b_item is not None and b_merged is not None
        if b_cur + b_item < b_merged and b_item >= b_cur:
            return True
    return False


def _pack_many_paths(
    per_path_tokens: Sequence[Sequence[int]],
    order: list[int],
    path_budgets: Sequence[Sequence[int]],
    max_batch_size: int,
) -> list[PackedBatch]:
    num_paths = len(per_path_tokens)
    largest = [max(budgets) for budgets in path_budgets]
    batches: list[PackedBatch] = []

    def close(indices: list[int], cur: list[int]) -> None:
        budgets = [fitting_budget(path_budgets[p], cur[p]) for p in range(num_paths)]
        batches.append(PackedBatch(indices, cur, budgets))

    batch: list[int] = []
    cur = [0] * num_paths
    for idx in order:
        item = [per_path_tokens[p][idx] for p in range(num_paths)]
        if batch:
            fits = len(batch) < max_batch_size and all(
                cur[p] + item[p] <= largest[p] for p in range(num_paths)
            )
            if not fits or _should_defer(cur, item, path_budgets):
                close(batch, cur)
                batch = []
                cur = [0] * num_paths
        batch.append(idx)
        for p in range(num_paths):
            cur[p] += item[p]
    if batch:
        close(batch, cur)
    return batches
