"""The ladder tuner predicts the padding the manager really replays: its
packing of a traffic sample gives the manager's padding statistics."""

from __future__ import annotations

import random

import pytest
from runtime_fakes import FakeEncoder, make_items, make_kwargs, make_manager

from generator.ladder_tuner import TrafficBatch, ladder_waste


@pytest.mark.parametrize(
    ("budgets", "max_items"), [([8, 24, 40, 64], 4), ([8, 16, 32, 64], 8)]
)
def test_predicted_waste_is_the_managers(budgets: list[int], max_items: int) -> None:
    rng = random.Random(1)
    batches = [
        TrafficBatch(
            tuple(
                rng.choice([3, 8, 9, 17, 30, 41, 70]) for _ in range(rng.randint(1, 9))
            )
        )
        for _ in range(40)
    ]
    manager = make_manager(
        FakeEncoder(budget_range=(8, 64)), budgets=budgets, max_items=max_items
    )
    manager.capture()
    for i, batch in enumerate(batches):
        manager.execute(make_kwargs(make_items(list(batch.rows), seed=i)))
    stats = manager.get_padding_stats()
    predicted = ladder_waste(batches, budgets, max_items)
    assert (predicted.replayed, predicted.used, predicted.replays) == (
        stats["rows_replayed"],
        stats["rows_used"],
        stats["replays"],
    )
    assert predicted.eager_rows == stats["paths"]["default"]["eager_rows"]
    assert predicted.eager_rows > 0  # the 70-row items run eagerly
