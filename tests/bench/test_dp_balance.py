"""``bench/dp_balance.py``: the balance figures on hand-made batches (a
table of cases), then the script on the released towers, its sums checked
against the real-traffic draw and the towers' own item sizes."""

from __future__ import annotations

import json

import pytest
from bench_modules import load_bench_module

from reference_towers.registry import REFERENCE_TOWERS

dp_balance = load_bench_module("dp_balance")
image_traffic = load_bench_module("image_traffic")
Item, Ladder = dp_balance.Item, dp_balance.Ladder

LADDER = Ladder([4, 8, 16], 4)


def items(*rows: int) -> list:
    """Items whose tokens are a quarter of their rows and whose budget unit
    is the row."""
    return [Item(r, r // 4, r) for r in rows]


# (batches, world, expected figures); rows are balanced by greedy LPT.
CASES = {
    "one image: a rank idles": (
        [items(8)],
        2,
        {
            "rows_per_rank": [8, 0],
            "rows_bound": 1.0,
            "imbalance": 2.0,
            "idle_batches": 1.0,
            "gather_padding": 1.0,
            "replay_ratio": 1.0,
        },
    ),
    "two equal images halve the work": (
        [items(4, 4)],
        2,
        {
            "rows_per_rank": [4, 4],
            "rows_bound": 2.0,
            "imbalance": 1.0,
            "gather_padding": 0.0,
            # one GPU replays 8 rows, each rank 4
            "replay_ratio": 2.0,
        },
    ),
    "LPT: the large image alone": (
        [items(12, 4, 4, 4)],
        2,
        {"rows_per_rank": [12, 12], "rows_bound": 2.0, "units_busiest_rank": 1.0},
    ),
    "LPT cannot split 5 4 3 evenly": (
        [items(5, 4, 3)],
        2,
        {"rows_per_rank": [5, 7], "rows_bound": 12 / 7, "imbalance": 14 / 12},
    ),
    "over batches: the busiest rank of each": (
        [items(8), items(4, 4)],
        2,
        {
            "rows_per_rank": [12, 4],
            "rows_bound": 16 / 12,
            "idle_batches": 0.5,
            "batch_imbalance_median": 1.5,
        },
    ),
    "an item above the largest budget runs eagerly": (
        [items(20, 4)],
        2,
        {"rows_per_rank": [20, 4], "replay_ratio": 24 / 20, "units_single": 2.0},
    ),
    "three ranks": (
        [items(4, 4, 4)],
        3,
        {"rows_per_rank": [4, 4, 4], "rows_bound": 3.0, "gather_padding": 0.0},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_balance(case: str) -> None:
    batches, world, expected = CASES[case]
    got = dp_balance.balance(batches, LADDER, LADDER, world)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("dp-balance")
    assert (
        dp_balance.main(
            [
                *("--long-batches", "40"),
                *("--json", str(out / "balance.json")),
                *("--markdown", str(out / "balance.md")),
            ]
        )
        == 0
    )
    return (
        json.loads((out / "balance.json").read_text()),
        (out / "balance.md").read_text(),
    )


def traffic_items(stem: str, batches: int) -> list[list[tuple[int, ...]]]:
    grid = image_traffic.model_grid(stem, REFERENCE_TOWERS[stem].config("full"))
    return [
        [grid(h, w) for h, w in batch]
        for batch in image_traffic.draw_image_batches(17, batches)
    ]


@pytest.mark.parametrize("stem", dp_balance.STEMS)
@pytest.mark.parametrize("workload,batches", [("traffic", 24), ("traffic-long", 40)])
def test_traffic_sums(
    run: tuple[dict, str], stem: str, workload: str, batches: int
) -> None:
    result, _ = run
    figures = result["models"][stem][workload]
    tower = REFERENCE_TOWERS[stem]
    drawn = traffic_items(stem, batches)
    assert figures["batches"] == batches
    assert figures["images"] == sum(len(b) for b in drawn)
    assert sum(figures["rows_per_rank"]) == sum(
        tower.input_size(i) for b in drawn for i in b
    )
    assert sum(figures["tokens_per_rank"]) == sum(
        tower.output_tokens(i) for b in drawn for i in b
    )
    assert figures["idle_batches"] == sum(len(b) < 2 for b in drawn) / batches


@pytest.mark.parametrize("stem", dp_balance.STEMS)
def test_bounds_are_consistent(run: tuple[dict, str], stem: str) -> None:
    result, markdown = run
    for workload, figures in result["models"][stem].items():
        assert 1.0 <= figures["rows_bound"] <= result["world"]
        assert figures["rows_bound"] == pytest.approx(
            result["world"] / figures["imbalance"]
        )
        assert figures["gather_padding"] >= 0.0
        # DP mode shards the batch; it captures the same ladder.
        assert figures["ladder_dp"] == figures["ladder_single"]
        assert f"| {stem} | {workload} | {figures['batches']} |" in markdown
    mixed = result["models"][stem]["mixed"]
    assert (mixed["batches"], mixed["images"], mixed["idle_batches"]) == (1, 16, 0.0)
