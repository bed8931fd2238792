"""Greedy packing and budget choice.

``reference_pack`` below is a deliberately literal transcription of the
rules in ``docs/protocol.md`` ("Execution"; dicts, linear scans, no
bisect), written independently of ``encoder_cudagraph_runtime.packing``;
property tests compare the two, the examples check hand-derived batches.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_fakes import FakeEncoder, make_manager

from encoder_cudagraph_runtime.packing import (
    fitting_budget,
    pack_items,
    smallest_fitting_budget,
)

POW2 = [64, 128, 256, 512, 1024]


def ref_budget(budgets: list[int], tokens: int) -> int | None:
    if tokens == 0:
        return 0
    candidates = [b for b in budgets if b >= tokens]
    return min(candidates) if candidates else None


def reference_pack(
    items: list[dict[str, int]],
    out_tokens: list[int],
    budgets: dict[str, list[int]],
    max_batch_size: int,
) -> list[tuple[list[int], dict[str, int | None]]]:
    paths = list(budgets)
    order = sorted(range(len(items)), key=lambda i: out_tokens[i])
    batches: list[tuple[list[int], dict[str, int]]] = []
    batch: list[int] = []
    cur = {p: 0 for p in paths}
    for i in order:
        item = items[i]
        fits = len(batch) < max_batch_size and all(
            cur[p] + item[p] <= max(budgets[p]) for p in paths
        )
        defer = False
        if fits:
            for p in paths:
                if item[p] == 0:
                    continue
                b_cur = ref_budget(budgets[p], cur[p])
                b_item = ref_budget(budgets[p], item[p])
                b_merged = ref_budget(budgets[p], cur[p] + item[p])
                if b_cur + b_item < b_merged and b_item >= b_cur:
                    defer = True
        if batch and (not fits or defer):
            batches.append((batch, dict(cur)))
            batch, cur = [], {p: 0 for p in paths}
        batch.append(i)
        for p in paths:
            cur[p] += item[p]
    if batch:
        batches.append((batch, dict(cur)))
    return [
        (indices, {p: ref_budget(budgets[p], tokens[p]) for p in paths})
        for indices, tokens in batches
    ]


def run_pack(
    items: list[dict[str, int]],
    out_tokens: list[int],
    budgets: dict[str, list[int]],
    max_batch_size: int,
) -> list[tuple[list[int], dict[str, int | None]]]:
    paths = list(budgets)
    packed = pack_items(
        [[item[p] for item in items] for p in paths],
        out_tokens,
        [budgets[p] for p in paths],
        max_batch_size,
    )
    for batch in packed:
        # Reported row counts must be the sums over the batch's items.
        assert batch.path_tokens == [
            sum(items[i][p] for i in batch.indices) for p in paths
        ]
    return [(b.indices, dict(zip(paths, b.path_budgets))) for b in packed]


def single(rows: list[int]) -> list[dict[str, int]]:
    return [{"default": r} for r in rows]


class TestExamples:
    def test_protocol_defer_example(self) -> None:
        # cur 100 (b 128) + item 500 (b 512) = 640 < b(600) = 1024: close.
        assert run_pack(single([100, 500]), [100, 500], {"default": POW2}, 8) == [
            ([0], {"default": 128}),
            ([1], {"default": 512}),
        ]

    def test_no_defer_when_merging_is_not_worse(self) -> None:
        # sorted: 20 then 100; 64 + 128 < b(120) = 128 is false: merge.
        assert run_pack(single([100, 20]), [100, 20], {"default": POW2}, 8) == [
            ([1, 0], {"default": 128})
        ]

    def test_no_defer_when_item_smaller_than_batch(self) -> None:
        # 150, 150, 150 -> cur 450 (b 512); item 200 (b 256): 512 + 256 < 1024
        # but b(item) 256 < b(cur) 512, so the item joins: 650 -> 1024.
        rows = [150, 150, 150, 200]
        assert run_pack(single(rows), rows, {"default": POW2}, 8) == [
            ([0, 1, 2, 3], {"default": 1024})
        ]

    def test_max_batch_size_closes(self) -> None:
        assert run_pack(single([1, 1, 1]), [1, 1, 1], {"default": POW2}, 2) == [
            ([0, 1], {"default": 64}),
            ([2], {"default": 64}),
        ]

    def test_oversized_item_is_a_singleton_eager_batch(self) -> None:
        assert run_pack(single([2000, 10]), [2000, 10], {"default": POW2}, 8) == [
            ([1], {"default": 64}),
            ([0], {"default": None}),
        ]

    def test_two_oversized_items_stay_apart(self) -> None:
        assert run_pack(single([2000, 3000]), [2000, 3000], {"default": POW2}, 8) == [
            ([0], {"default": None}),
            ([1], {"default": None}),
        ]

    def test_largest_budget_limit(self) -> None:
        # 600 + 500 = 1100 > 1024 -> close; sorted order is 500, 600.
        assert run_pack(single([600, 500]), [600, 500], {"default": POW2}, 8) == [
            ([1], {"default": 512}),
            ([0], {"default": 1024}),
        ]

    def test_ties_keep_original_order(self) -> None:
        assert run_pack(single([5, 5, 5]), [5, 5, 5], {"default": POW2}, 8) == [
            ([0, 1, 2], {"default": 64})
        ]

    def test_zero_row_items(self) -> None:
        assert run_pack(single([0, 0, 30]), [0, 0, 30], {"default": POW2}, 8) == [
            ([0, 1, 2], {"default": 64})
        ]

    def test_multi_path_defer_on_one_path(self) -> None:
        budgets = {"default": POW2, "thumb": [0, 16, 32, 64]}
        items = [{"default": 100, "thumb": 0}, {"default": 500, "thumb": 4}]
        # default path: 128 + 512 < 1024 and 512 >= 128 -> defer.
        assert run_pack(items, [100, 504], budgets, 8) == [
            ([0], {"default": 128, "thumb": 0}),
            ([1], {"default": 512, "thumb": 16}),
        ]

    def test_multi_path_largest_budget_on_second_path(self) -> None:
        budgets = {"default": POW2, "thumb": [0, 16, 32]}
        items = [{"default": 10, "thumb": 20}, {"default": 10, "thumb": 20}]
        # thumb: 20 + 20 = 40 > 32 -> the second item starts a new batch.
        assert run_pack(items, [30, 30], budgets, 8) == [
            ([0], {"default": 64, "thumb": 32}),
            ([1], {"default": 64, "thumb": 32}),
        ]

    def test_empty(self) -> None:
        assert run_pack([], [], {"default": POW2}, 8) == []


class TestFittingBudget:
    @pytest.mark.parametrize(
        ("tokens", "expected"),
        [(1, 64), (64, 64), (65, 128), (1024, 1024), (1025, None)],
    )
    def test_smallest_fitting(self, tokens: int, expected: int | None) -> None:
        assert smallest_fitting_budget(POW2, tokens) == expected
        assert fitting_budget(POW2, tokens) == expected

    def test_zero_tokens(self) -> None:
        assert fitting_budget(POW2, 0) == 0
        assert fitting_budget([0, 16], 0) == 0
        assert fitting_budget([0, 16], 1) == 16

    def test_manager_helpers(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 64)))
        assert manager._find_smallest_fitting_budget_given_tokens(9) == 16
        assert manager._find_smallest_fitting_budget_given_tokens(65) is None
        assert manager._find_smallest_fitting_budget_given_tokens(3, [4, 6]) == 4
        assert manager._path_fitting_budget("default", 0) == 0
        assert manager._path_fitting_budget("default", 33) == 64
        assert manager._path_fitting_budget("default", 65) is None


budget_lists = st.lists(st.integers(1, 300), min_size=1, max_size=6).map(sorted)


@st.composite
def packing_cases(draw):  # type: ignore[no-untyped-def]
    num_paths = draw(st.integers(1, 3))
    paths = ["default"] + [f"p{i}" for i in range(1, num_paths)]
    budgets = {}
    for p in paths:
        b = draw(budget_lists)
        if draw(st.booleans()):
            b = [0, *b]
        budgets[p] = b
    n = draw(st.integers(0, 25))
    items = [{p: draw(st.integers(0, 350)) for p in paths} for _ in range(n)]
    if draw(st.booleans()):
        out_tokens = [sum(item.values()) for item in items]
    else:
        out_tokens = [draw(st.integers(0, 50)) for _ in range(n)]
    max_batch_size = draw(st.integers(1, 8))
    return items, out_tokens, budgets, max_batch_size


@settings(max_examples=400, deadline=None)
@given(packing_cases())
def test_packing_matches_reference(case) -> None:  # type: ignore[no-untyped-def]
    items, out_tokens, budgets, max_batch_size = case
    assert run_pack(items, out_tokens, budgets, max_batch_size) == reference_pack(
        items, out_tokens, budgets, max_batch_size
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 1500), max_size=30),
    st.integers(1, 16),
)
def test_single_path_pow2_matches_reference(
    rows: list[int], max_batch_size: int
) -> None:
    assert run_pack(single(rows), rows, {"default": POW2}, max_batch_size) == (
        reference_pack(single(rows), rows, {"default": POW2}, max_batch_size)
    )
