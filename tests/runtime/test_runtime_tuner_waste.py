"""The ladder tuner predicts the padding the manager really replays: its
packing of a traffic sample gives the manager's padding statistics, also
where the budgets count another unit than output tokens (DeepSeek-V4.1's
ViT patches, packed in output-token order)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from runtime_fakes import (
    FakeEncoder,
    SpecItemsEncoder,
    make_items,
    make_kwargs,
    make_manager,
)

from generator.ladder_tuner import TrafficBatch, ladder_waste, spec_traffic
from generator.resolve import load_spec
from reference_towers.registry import REFERENCE_TOWERS, generated_mixin

SPECS = Path(__file__).resolve().parents[2] / "specs"


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


def budget_unit_specs() -> list[str]:
    """Stems whose budgets count something else than output tokens
    (``items.budget_tokens``) and that have a reference host."""
    return [
        path.stem
        for path in sorted(SPECS.glob("*.yaml"))
        if load_spec(path).items.budget_tokens is not None
        and path.stem in REFERENCE_TOWERS
    ]


def test_every_budget_unit_spec_is_replayed() -> None:
    # Gemma 4's budgets count rows too; it has no reference host to count
    # items with (docs/vllm-findings.md, finding 10).
    assert budget_unit_specs() == ["deepseek_v41"]


def random_grids(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """DeepSeek-V4.1 ViT grids: small ranges, so that items of equal
    output tokens (equal merged grids) but other patch counts are common."""
    return [(rng.randint(1, 24), rng.randint(1, 24)) for _ in range(n)]


@pytest.mark.parametrize("stem", budget_unit_specs())
@pytest.mark.parametrize(
    ("budgets", "max_items"),
    [
        ([64, 128, 256, 512, 1024, 2048, 4096], 64),
        ([64, 96, 160, 288, 320, 544, 576, 1088, 2048, 4096], 16),
        ([64, 256, 1024], 4),
    ],
)
def test_tuner_predicts_the_managers_waste_on_a_mixins_items(
    tmp_path: Path, stem: str, budgets: list[int], max_items: int
) -> None:
    """The same batches through the manager (packing by the generated
    mixin's own item specs) and through ``gen-mixin plan --traffic``'s
    reading of a traffic file (the spec's formulas): the rows replayed,
    used and run eagerly, and the replays, are equal. Half the items leave
    the merged grid out (the tuner derives it)."""
    tower = REFERENCE_TOWERS[stem]
    host = tower.build_host(
        generated_mixin(stem), "tiny", device="cpu", dtype=torch.float32
    )
    fake = SpecItemsEncoder(host, budget_range=(64, budgets[-1]))
    manager = make_manager(fake, budgets=budgets, max_items=max_items)
    manager.capture()
    rng = random.Random(len(budgets))
    r = tower.config("tiny").vision_downsample_ratio
    document: dict = {"batches": []}
    for i in range(40):
        grids = random_grids(rng, rng.choice([1, 2, 3, 5, 8, 16, 20]))
        mixin_kwargs = tower.make_mm_kwargs(host, grids, "meta", seed=i)
        manager.execute(fake.make_kwargs(mixin_kwargs, seed=i))
        document["batches"].append(
            [
                (
                    {"h": h, "w": w}
                    if j % 2
                    else {"h": h, "w": w, "lh": -(-h // r), "lw": -(-w // r)}
                )
                for j, (h, w) in enumerate(grids)
            ]
        )
    path = tmp_path / "traffic.json"
    path.write_text(json.dumps(document))
    spec = load_spec(SPECS / f"{stem}.yaml")
    predicted = ladder_waste(spec_traffic(spec, {}, path).batches, budgets, max_items)
    stats = manager.get_padding_stats()
    assert (predicted.replayed, predicted.used, predicted.replays) == (
        stats["rows_replayed"],
        stats["rows_used"],
        stats["replays"],
    )
    assert predicted.eager_rows == stats["paths"]["default"]["eager_rows"]
