"""Pieces of ``bench/bench_traffic.py`` that decide what the GPU run
measures: the calibration batches, the tuner's replay cost, and the
interleaved rounds."""

from __future__ import annotations

import math

import pytest
from bench_modules import load_bench_module

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
    ("replay_ms", "host_ms", "expected"),
    [
        # 26 ms per 8192 rows between the two largest graphs; the smallest
        # replays in 4 ms: about 1260 rows, 1575 with 1 ms of host work.
        ({64: 4.0, 8192: 30.0, 16384: 56.0}, 0.0, 1260),
        ({64: 4.0, 8192: 30.0, 16384: 56.0}, 1.0, 1575),
        # No growth to measure: the smallest budget.
        ({64: 4.0, 128: 4.0}, 0.0, 64),
        ({64: 4.0}, 0.0, 64),
    ],
)
def test_replay_cost_rows(replay_ms, host_ms, expected) -> None:  # type: ignore[no-untyped-def]
    assert bench.replay_cost_rows(replay_ms, host_ms) == expected


def test_rounds_interleave_the_calls() -> None:
    events: list[str] = []
    calls = {name: (lambda name=name: events.append(name)) for name in "abc"}
    before = {"b": lambda: events.append("before b")}
    after = {"c": lambda: events.append("after c")}
    schedule = Schedule(warmup=0, min_iters=3, max_iters=5, target_s=0.0)
    samples = bench.measure_rounds(calls, lambda: None, schedule, before, after)
    assert events == ["a", "before b", "b", "c", "after c"] * 3
    assert {name: len(v) for name, v in samples.items()} == {"a": 3, "b": 3, "c": 3}
