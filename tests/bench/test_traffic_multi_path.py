"""``bench/bench_traffic.py`` on a model of two encoder paths (Step3-VL's
``global`` views and ``local`` crops), tiny tower on the CPU: every batch is
measured with both paths replayed (the global path alone for crop-less
images), its outputs equal eager, the padding is counted per path, and what
does not generalise to paths is recorded as not applicable, not as a figure.
"""

from __future__ import annotations

from typing import Any

import pytest
from bench_modules import load_bench_module

bench = load_bench_module("bench_traffic")

# Pixel sizes and the tiny tower's crops (its long side is capped at 1008 px):
# 300² has none (long side under 728, square), 1000² is 2 x 2 crops, 700x1200
# px is scaled to 588x1008, 1 x 2 crops, and a 220x1000 strip (aspect over 4)
# is cut in 220 px windows, 5 along its width.
PIXEL_BATCHES = [
    [(300, 300)],
    [(1000, 1000), (300, 300), (700, 1200)],
    [(220, 1000)],
    [(300, 300)] * 3,
]
CROPS = [[0], [4, 0, 2], [5], [0, 0, 0]]


@pytest.fixture(scope="module")
def step3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(
        bench.image_traffic,
        "draw_image_batches",
        lambda seed, n, *workload: [list(b) for b in PIXEL_BATCHES][:n],
    )
    out = tmp_path_factory.mktemp("multi-path") / "traffic.json"
    args = bench.parse_args(
        [
            *("--device", "cpu", "--size", "tiny", "--quick", "--out", str(out)),
            *("--models", "step3_vl", "--batches", "4", "--max-batches", "4"),
        ]
    )
    try:
        result = bench.run(args)
    finally:
        monkeypatch.undo()
    assert not result["errors"], result["errors"]
    return result


def test_every_batch_replays_the_paths_it_has_rows_on(step3: dict[str, Any]) -> None:
    model = step3["models"]["step3_vl"]
    assert [r["items"] for r in model["batches"]] == [[[c] for c in b] for b in CROPS]
    for row, crops in zip(model["batches"], CROPS, strict=True):
        assert row["check_ideal"] < 1e-4
        assert row["path_input_rows"] == {"global": len(crops), "local": sum(crops)}
        for ladder in ("default", "fine"):
            entry = row["graph"][ladder]["vllm"]
            assert entry["check_vs_eager"] < 1e-4, (row["index"], ladder)
            paths = entry["padding"]["paths"]
            assert paths["global"]["replays"] >= 1
            # A batch of crop-less images leaves the local path out.
            assert (paths["local"]["replays"] >= 1) == (sum(crops) > 0)
            for path, padding in paths.items():
                budgets = model["ladders"][ladder]["path_budgets"][path]
                replayed = padding["budgets_replayed"]
                assert set(replayed) <= set(budgets)
                assert padding["rows_used"] == sum(row["path_rows"][path])
                assert padding["rows_replayed"] == sum(
                    b * n for b, n in replayed.items()
                )
                assert padding["rows_replayed"] >= padding["rows_used"]
                assert padding["input_rows_used"] == row["path_input_rows"][path]
                assert padding["input_rows_replayed"] >= padding["input_rows_used"]
                assert padding["eager_batches"] == 0
            # The totals are the two paths'.
            assert entry["padding"]["rows_used"] == row["budget_tokens"]
            assert entry["padding"]["rows_replayed"] == sum(
                p["rows_replayed"] for p in paths.values()
            )


@pytest.mark.parametrize(
    ("index", "path", "rows", "views"),
    [
        # 5 crops are 405 local rows: the local budgets double from 81 to the
        # 512 cap (81, 162, 324, 512), so one replay of 512, which holds
        # 512 // 81 = 6 crops.
        (2, "local", (512, 405), (6, 5)),
        (2, "global", (169, 169), (1, 1)),
        # 3 global views are 507 rows: budget 512 (169, 338, 512), whose
        # graph holds min(3 items, 512 // 169) = 3 views: budget rows are
        # padded, views are not.
        (3, "global", (512, 507), (3, 3)),
        (3, "local", (0, 0), (0, 0)),
    ],
)
def test_padding_in_budget_rows_and_in_views(
    step3: dict[str, Any],
    index: int,
    path: str,
    rows: tuple[int, int],
    views: tuple[int, int],
) -> None:
    row = step3["models"]["step3_vl"]["batches"][index]
    for ladder in ("default", "fine"):
        padding = row["graph"][ladder]["vllm"]["padding"]["paths"][path]
        assert (padding["rows_replayed"], padding["rows_used"]) == rows
        assert (padding["input_rows_replayed"], padding["input_rows_used"]) == views


def test_totals_per_path_and_what_is_not_applicable(step3: dict[str, Any]) -> None:
    model = step3["models"]["step3_vl"]
    assert model["paths"] == ["global", "local"]
    assert set(model["summary"]) == {"default", "fine"}
    assert all(set(s) == {"vllm"} for s in model["summary"].values())
    assert set(model["not_applicable"]) == {"tuned", "cost", "old_workloads"}
    assert model["tuned_waste"] is None and model["tuner"] is None
    for ladder in ("default", "fine"):
        s = model["summary"][ladder]["vllm"]
        for path, w in s["paths"].items():
            paddings = [
                r["graph"][ladder]["vllm"]["padding"]["paths"][path]
                for r in model["batches"]
            ]
            replayed = sum(p["rows_replayed"] for p in paddings)
            used = sum(p["rows_used"] for p in paddings)
            assert w["padding_waste"] == pytest.approx(replayed / used - 1)
        eager = [r["eager_ms"]["median"] for r in model["batches"]]
        graph = [
            r["graph"][ladder]["vllm"]["graph_ms"]["median"] for r in model["batches"]
        ]
        assert s["speedup"] == pytest.approx(sum(eager) / sum(graph))
        assert s["speedup_per_batch"]["min"] == pytest.approx(
            min(e / g for e, g in zip(eager, graph, strict=True))
        )
    # No target has a figure for it; each says why.
    for target in step3["targets"]:
        assert target["passed"] is None
        assert {c["model"] for c in target["not_applicable"]} == {"step3_vl"}


def test_report_and_replay_say_not_applicable(step3: dict[str, Any]) -> None:
    render = load_bench_module("render_results")
    markdown = render.render_markdown(step3)
    assert "| tuned | n/a (multi-path) |" in markdown
    assert "| default | cost | n/a (multi-path) |" in markdown
    assert "Padding per encoder path" in markdown
    assert "| default | local | 0, 81, 162, 324, 512 |" in markdown
    replayed = load_bench_module("replay_traffic").replay(step3)
    assert replayed["step3_vl"] == {
        "not_applicable": step3["models"]["step3_vl"]["not_applicable"]["cost"]
    }
