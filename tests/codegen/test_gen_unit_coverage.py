"""The bound a unit capture must hold (generator/unit_coverage.py): never
below what a real batch brings, and a batch that fits to show it."""

from __future__ import annotations

import itertools
import random

import pytest

from generator.unit_coverage import ItemPoint, envelope, most_rows


def tiles(tokens_per_tile: int, counts) -> list[ItemPoint]:
    """Images of ``n`` tiles of ``tokens_per_tile`` tokens each."""
    return [ItemPoint(n * tokens_per_tile, n, {"n": n}) for n in counts]


@pytest.mark.parametrize(
    ("points", "budget", "max_items", "bound", "witness_rows"),
    [
        # Tiles: one image may hold every tile, so max_items does not matter.
        (tiles(256, range(1, 65)), 1024, 1, 4, 4),
        (tiles(256, range(1, 65)), 1000, 8, 3, 3),
        (tiles(256, range(1, 65)), 8192, 3, 32, 32),
        # One view per item (a global image): max_items bounds it.
        (tiles(256, [1]), 1024, 2, 2, 2),
        (tiles(256, [1]), 1024, 8, 4, 4),
        # Items of at most 5 crops (pan-and-scan): 2 items, 2560 rows max.
        (tiles(256, range(1, 6)), 8192, 2, 10, 10),
        # Two kinds: a cheap one-row item and a 10-token, 20-row one.
        ([ItemPoint(1, 1, {}), ItemPoint(10, 20, {})], 10, 2, 20, 20),
        # The relaxation's 1.1 items of the second kind: a bound of 22, one
        # above the best real batch (one of each).
        ([ItemPoint(1, 1, {}), ItemPoint(10, 20, {})], 11, 2, 22, 21),
        # Items without budget tokens: max_items of them fit any budget.
        ([ItemPoint(0, 3, {}), ItemPoint(4, 4, {})], 4, 5, 16, 16),
        # Nothing fits: no rows, no batch.
        (tiles(256, [1, 2]), 100, 4, 0, None),
    ],
)
def test_bound_and_witness(points, budget, max_items, bound, witness_rows) -> None:
    got, witness = most_rows(envelope(points), budget, max_items)
    assert got == bound
    if witness_rows is None:
        assert witness is None or witness.rows == 0
    else:
        assert witness is not None and witness.rows == witness_rows
        assert witness.tokens <= budget
        assert sum(n for n, _ in witness.parts) <= max_items


def test_points_on_the_envelope_are_kept() -> None:
    # Collinear points are items a witness can be made of.
    hull = envelope(tiles(16, [1, 2, 3, 4]))
    assert [p.rows for p in hull] == [1, 2, 3, 4]


def _brute_force(points, budget, max_items) -> int:
    best = 0
    for n in range(max_items + 1):
        for combo in itertools.combinations_with_replacement(points, n):
            if sum(p.tokens for p in combo) <= budget:
                best = max(best, sum(p.rows for p in combo))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_never_below_a_real_batch(seed: int) -> None:
    rng = random.Random(seed)
    points = [ItemPoint(rng.randint(0, 12), rng.randint(1, 9), {}) for _ in range(4)]
    budget, max_items = rng.randint(1, 30), rng.randint(1, 4)
    bound, witness = most_rows(envelope(points), budget, max_items)
    exact = _brute_force(points, budget, max_items)
    assert bound >= exact
    if witness is not None:
        assert witness.tokens <= budget
        assert sum(n for n, _ in witness.parts) <= max_items
        assert witness.rows <= exact
