"""Pieces of ``bench/bench_traffic.py`` that decide what the GPU run
measures: the calibration batches, the tuner's replay cost, and the
interleaved rounds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_modules import load_bench_module

from encoder_cudagraph_runtime.cost_aware import CostModel, EagerCost, GraphCost

bench = load_bench_module("bench_traffic")
Schedule = load_bench_module("bench_encoders").Schedule


def test_calibration_spans_the_training_sizes() -> None:
    train = [[(1, 10, 10), (1, 40, 54)], [(1, 20, 20)], [(1, 56, 40), (1, 10, 10)]]
    batches = bench.calibration_batches(train, quick=False)
    singles = batches[: len(bench.CALIBRATION_SINGLES)]
    assert all(len(b) == 1 for b in singles)
    sizes = [math.prod(b[0]) for b in singles]
    # Smallest and largest item of the sample, ascending in between.
    assert (sizes[0], sizes[-1]) == (100, 2240) and sizes == sorted(sizes)
    groups = batches[len(singles) :]
    assert [len(b) for b in groups] == [
        sum(n for _, n in group) for group in bench.CALIBRATION_GROUPS
    ]
    assert [(1, 10, 10)] * 8 in groups  # the host-bound many-small batch


@pytest.mark.parametrize(
    ("rows", "singles"),
    [
        # Two modes (run J's DeepSeek-V4.1: thumbnails and scans): the
        # quantiles jump from 1,300 to 8,100; the item nearest their
        # geometric mean (3,245) closes that gap, as 200 and 500 close the
        # smaller ones below.
        (
            list(range(100, 1600, 100)) + [3000] + list(range(8000, 8900, 100)),
            [100, 200, 300, 500, 800, 1300, 3000, 8100, 8600, 8800],
        ),
        # No two quantiles more than twice apart: the quantiles alone.
        (list(range(1000, 1900, 100)), [1000, 1100, 1200, 1400, 1600, 1700, 1800]),
        # A gap with no item in it stays.
        ([100, 5000], [100, 5000]),
    ],
    ids=["two-modes", "no-gap", "empty-gap"],
)
def test_calibration_singles_close_the_gaps_between_quantiles(
    rows: list[int], singles: list[int]
) -> None:
    train = [[(1, r)] for r in rows]
    batches = bench.calibration_batches(train, quick=False)
    # Quantiles of few items repeat: the manager times each size once.
    assert sorted({b[0][1] for b in batches if len(b) == 1}) == singles


def test_rounds_interleave_the_calls_in_a_shuffled_order() -> None:
    events: list[str] = []
    calls = {name: (lambda name=name: events.append(name)) for name in "abc"}
    before = {"b": lambda: events.append("before b")}
    after = {"c": lambda: events.append("after c")}
    schedule = Schedule(warmup=0, min_iters=3, max_iters=5, target_s=0.0)
    rounds = bench.measure_rounds(calls, lambda: None, schedule, before, after)
    order = [e for e in events if e in calls]
    rounds_seen = [order[i : i + 3] for i in range(0, len(order), 3)]
    # One call of each per round, each hook next to its own call, in the
    # seeded order of each round.
    assert rounds_seen == [bench.round_order(list("abc"), r) for r in range(3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds_seen)
    assert events.index("before b") == events.index("b") - 1
    assert events.index("after c") == events.index("c") + 1
    assert {name: len(v) for name, v in rounds.samples.items()} == {
        "a": 3,
        "b": 3,
        "c": 3,
    }
    assert len(rounds.host_probe_us) == 3 and min(rounds.host_probe_us) > 0


def _scripted_gauge(probes: list[float], warmup: list[float]) -> object:
    """A gauge whose probes read ``warmup`` then ``probes`` in order (then
    the quiet level for ever)."""
    script = iter(warmup + probes)
    return bench.HostGauge(lambda: next(script, 100.0), warmup=len(warmup))


@pytest.mark.parametrize(
    ("probes", "takes", "retakes", "noisy"),
    [
        # Round probe, then before / after each take.
        ([100, 100, 100], 1, 0, 0),  # quiet around the call: kept
        ([100, 100, 200, 100, 100], 2, 1, 0),  # slow after the first take
        ([100, 140, 100, 100, 100], 2, 1, 0),  # over 1.3x the quiet 100
        ([100, 125, 125], 1, 0, 0),  # within 1.3x
        ([100] + [200, 200] * 4, 4, 3, 1),  # never quiet: the last take kept
    ],
)
def test_a_call_is_timed_again_while_the_host_is_slow(probes, takes, retakes, noisy) -> None:  # type: ignore[no-untyped-def]
    gauge = _scripted_gauge(probes, warmup=[100.0] * 8)
    durations = iter([5.0, 4.0, 3.0, 2.0])
    timed: list[float] = []
    after: list[str] = []

    def call() -> None:
        timed.append(next(durations))

    schedule = Schedule(warmup=0, min_iters=1, max_iters=1, target_s=0.0)
    rounds = bench.measure_rounds(
        {"eager": call},
        lambda: None,
        schedule,
        after={"eager": lambda: after.append("x")},
        gauge=gauge,
    )
    assert len(timed) == takes
    assert rounds.retakes == {"eager": retakes} and rounds.noisy == {"eager": noisy}
    assert len(rounds.samples["eager"]) == len(rounds.first_takes["eager"]) == 1
    assert after == ["x"]  # once, after the kept take
    assert rounds.quiet_probe_us == 100.0


def test_the_quiet_level_is_the_lower_quartile_of_recent_probes() -> None:
    gauge = _scripted_gauge(
        [], warmup=[900.0, 480.0, 500.0, 470.0, 880.0, 490.0, 460.0, 950.0]
    )
    assert gauge.quiet_us() == 480.0  # sorted: 460 470 480 490 500 880 900 950
    assert gauge.is_quiet(600.0) and not gauge.is_quiet(480.0, 640.0)


def test_without_a_gauge_each_call_is_timed_once() -> None:
    calls = {"a": lambda: None}
    schedule = Schedule(warmup=0, min_iters=2, max_iters=2, target_s=0.0)
    rounds = bench.measure_rounds(calls, lambda: None, schedule)
    assert len(rounds.samples["a"]) == 2
    assert rounds.first_takes == {} and rounds.quiet_probe_us is None


def test_the_round_order_varies_every_call_s_predecessor() -> None:
    """GPU run D: with a rotation each call kept its predecessor in all
    rounds but one; shuffled, eight calls over six rounds meet several."""
    names = [f"c{i}" for i in range(8)]
    orders = [bench.round_order(names, r) for r in range(6)]
    assert orders == [bench.round_order(names, r) for r in range(6)]  # seeded
    for name in names:
        before = {o[o.index(name) - 1] if o.index(name) else None for o in orders}
        assert len(before) >= 3, (name, before)


@pytest.mark.parametrize(
    ("eager", "graph", "expected"),
    [
        # The same call in two host modes, timed side by side: 1.0, where
        # the medians of the two lists (56 / 65) would say 0.86.
        ([56.0, 56.0, 65.0], [65.0, 56.0, 65.0], 1.0),
        ([10.0, 20.0, 30.0], [5.0, 10.0, 10.0], 2.0),
        ([10.0], [0.0], None),
    ],
)
def test_paired_ratio_compares_calls_of_the_same_round(eager, graph, expected) -> None:  # type: ignore[no-untyped-def]
    assert bench.paired_ratio(eager, graph) == expected


@pytest.mark.parametrize(
    ("aa_ratios", "expected"),
    [
        # Slower or faster against itself: the same distance from 1.
        ([1.0, 0.9, 1.02], 0.9),
        ([1.0, 1.25], 0.8),
        # Rows of a JSON from before the A/A call, or a ratio not measured.
        ([None, None], None),
        ([], None),
    ],
)
def test_aa_floor_is_the_eager_call_s_worst_distance_from_itself(
    aa_ratios, expected
) -> None:  # type: ignore[no-untyped-def]
    rows = [{"aa_ratio": r} for r in aa_ratios]
    floor = bench.aa_floor(rows)
    assert floor == (None if expected is None else pytest.approx(expected))


def test_the_worst_batch_target_carries_the_aa_floor_and_the_eager_plan_bound() -> None:
    row = {
        "eager_ms": {"median": 20.0},
        "graph": {
            "default": {
                "cost": {
                    "plan": {"kind": "eager"},
                    "host_overhead_us": {"median": 400.0},
                }
            }
        },
    }
    model = {
        "summary": {
            "default": {
                "cost": {
                    "speedup_per_batch": {"min": 0.85},
                    "worst_batch": 22,
                    "aa_floor": 0.84,
                }
            }
        },
        "batches": [row],
    }
    values = bench._target_values("no_batch_slower_than_eager", model, "default")
    where = {
        "batch": 22,
        "aa_floor": 0.84,
        "eager_plan_bound": pytest.approx(20 / 20.4),
    }
    assert values == [(0.85, where)]


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        # (plan kind, speedup) per batch: the all-eager plan's 0.80 (A/A
        # noise on the eager forward itself) is not a graph plan's.
        ([("eager", 0.80), ("graphs", 0.99), ("mixed", 0.98)], (0.98, 2)),
        ([("graphs", 1.2), ("mixed", 0.91), ("eager", 1.0)], (0.91, 1)),
        ([("eager", 0.80), ("eager", 1.0)], None),
    ],
)
def test_the_graph_plan_target_leaves_all_eager_plans_out(cells, expected) -> None:  # type: ignore[no-untyped-def]
    batches = [
        {"index": i, "graph": {"fine": {"cost": {"plan": {"kind": k}, "speedup": x}}}}
        for i, (k, x) in enumerate(cells)
    ]
    model = {"summary": {"fine": {"cost": {}}}, "batches": batches}
    values = bench._target_values("no_graph_plan_slower_than_eager", model, "fine")
    assert values == (
        [] if expected is None else [(expected[0], {"batch": expected[1]})]
    )


@pytest.mark.parametrize(
    ("stem", "item", "dims"),
    [
        # One grid of three dims: the item's values in the spec's order.
        ("qwen2_vl", (1, 16, 20), {"t": 1, "h": 16, "w": 20}),
        ("minimax_m3", (1, 40, 54), {"t": 1, "h": 40, "w": 54}),
        # DeepSeek-V4.1's merged grid is derived: ceil(16 / 3), ceil(20 / 3).
        ("deepseek_v41", (16, 20), {"h": 16, "w": 20, "lh": 6, "lw": 7}),
    ],
)
def test_items_in_the_specs_dims(
    stem: str, item: tuple[int, ...], dims: dict[str, int]
) -> None:
    from reference_towers.registry import REFERENCE_TOWERS

    config = REFERENCE_TOWERS[stem].config("tiny")
    assert bench.spec_dims(stem, item, config) == dims


def test_count_items_take_the_count_dim(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tower of view counts (InternVL's tiles) against a spec whose one
    per-item input is a count."""
    from bench_modules import REPO_ROOT

    spec = REPO_ROOT / "tests" / "codegen" / "data" / "valid" / "tiles_count.yaml"
    (tmp_path / "internvl.yaml").write_text(spec.read_text())
    monkeypatch.setattr(bench.image_traffic, "SPECS_DIR", tmp_path)
    assert bench.spec_dims("internvl", (13,), None) == {"n": 13}


def test_items_no_grid_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"item \(16, 20\) after the spec's grid dims"):
        bench.spec_dims("qwen2_vl", (16, 20), None)


@pytest.mark.parametrize(
    ("stem", "spec", "size", "multi_path", "reason"),
    [
        ("minimax_m3", True, "full", False, None),
        ("no_such_model", True, "full", True, "no reference tower"),
        ("internvl", False, "tiny", True, "no spec specs/internvl.yaml"),
        ("internvl", True, "tiny", False, None),
        (
            "step3_vl",
            True,
            "full",
            False,
            "encoder paths global, local: the benchmarks measure the one default path",
        ),
        # The real-traffic benchmark times every path.
        ("step3_vl", True, "full", True, None),
    ],
)
def test_unusable_models_and_why(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    stem: str,
    spec: bool,
    size: str,
    multi_path: bool,
    reason: str | None,
) -> None:
    encoders = load_bench_module("bench_encoders")
    monkeypatch.setattr(encoders, "SPECS_DIR", tmp_path)
    if spec:
        (tmp_path / f"{stem}.yaml").write_text("")  # only its presence counts
    assert encoders.unusable_reason(stem, size, multi_path=multi_path) == reason


@pytest.mark.parametrize(
    ("stem", "size", "pixels", "item"),
    [
        # The seed models keep bench_encoders' own rule: MiniMax M3 shrinks
        # 896² px under its 672² max_pixels.
        ("minimax_m3", "full", (896, 896), (1, 48, 48)),
        # The new towers take their processor's: 896² px is 2 x 2 InternVL
        # tiles (more than half of their pixels) plus the thumbnail.
        ("internvl", "full", (896, 896), (5,)),
        ("internvl", "tiny", (224, 224), (1,)),
        # Kimi-VL's tiny 256-patch limit halves 448² px: 8 x 8 kernels.
        ("kimi_vl", "tiny", (448, 448), (16, 16)),
        # A grid the registry's legality leaves out, within the token cap.
        ("kimi_vl", "full", (2049, 1250), (84, 52)),
    ],
)
def test_benchmark_grids(
    stem: str, size: str, pixels: tuple[int, int], item: tuple[int, ...]
) -> None:
    from reference_towers.registry import REFERENCE_TOWERS

    encoders = load_bench_module("bench_encoders")
    assert encoders.pixels_to_item(REFERENCE_TOWERS[stem], size, *pixels) == item


def test_a_recorded_cost_model_reads_back_with_its_budget_factors() -> None:
    """``traffic.json`` stores ``CostModel.as_dict()`` (string keys);
    ``bench/replay_traffic.py`` must price the budgets as the run did."""
    graph = GraphCost({64: 2.0, 128: 3.0}, 8, 0.1, 1e-5, 0.0, {128: 1.1})
    model = CostModel(graph, EagerCost(fixed_ms=5.0), 0.04, 0.03)
    recorded = json.loads(json.dumps(model.as_dict()))
    back = load_bench_module("replay_traffic").cost_model_of(recorded)
    assert back == model
    assert back.graph.predict(128, 100, 10_000) == graph.predict(128, 100, 10_000)


def _row(eager_ms: float, kind: str, overhead_us: float | None) -> dict:
    entry = {"plan": {"kind": kind}}
    if overhead_us is not None:
        entry["host_overhead_us"] = {"median": overhead_us}
    return {"eager_ms": {"median": eager_ms}, "graph": {"fine": {"cost": entry}}}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        # 200 µs of the manager's own host work on a 17 ms eager plan.
        ([_row(17.0, "eager", 200.0), _row(50.0, "eager", 200.0)], 17.0 / 17.2),
        # Graph and mixed plans are not bounded this way.
        ([_row(17.0, "graphs", 900.0), _row(50.0, "eager", 500.0)], 50.0 / 50.5),
        ([_row(17.0, "mixed", 200.0)], None),
        ([_row(17.0, "eager", None)], None),  # no overhead recorded
    ],
)
def test_an_eager_plan_is_bounded_by_the_manager_s_own_host_time(rows, expected) -> None:  # type: ignore[no-untyped-def]
    bound = bench.eager_plan_bound(rows, "fine")
    assert bound == (None if expected is None else pytest.approx(expected))


def test_startup_seconds_per_ladder() -> None:
    """Capture and calibration seconds per ladder (issue #27's 15 s per
    ladder), a ladder not calibrated (several paths) as None."""
    ladders = {
        "default": {
            "capture": {"num_graphs": 9, "seconds": 3.5},
            "calibration_s": 9.8,
            "calibration_report": {"device_ms": 9700.0},
        },
        "fine": {"capture": {"num_graphs": 33, "seconds": 6.0}, "calibration_s": None},
    }
    assert bench.startup_seconds(ladders) == {
        "default": {
            "graphs": 9,
            "capture_s": 3.5,
            "calibration_s": 9.8,
            "calibration_calls_s": 9.7,
        },
        "fine": {
            "graphs": 33,
            "capture_s": 6.0,
            "calibration_s": None,
            "calibration_calls_s": None,
        },
    }
