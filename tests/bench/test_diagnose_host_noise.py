"""``bench/diagnose_host_noise.py``: what it reads from ``/proc`` and how it
sorts a call into quick and slow."""

from __future__ import annotations

import json
import os

from bench_modules import load_bench_module

noise = load_bench_module("diagnose_host_noise")


def _call(total_ms: float, probe_us: float, switches: int = 0) -> dict:
    return {
        "enqueue_ms": total_ms,
        "total_ms": total_ms,
        "probe_us": probe_us,
        "involuntary_switches": switches,
        "steal_jiffies": 1,
        "core": 3,
    }


def test_calls_over_a_quarter_above_the_fastest_count_as_slow() -> None:
    calls = [_call(17.0, 440), _call(18.0, 450), _call(31.0, 1000, 2), _call(21.0, 460)]
    summary = noise.summarize(calls)
    assert summary["min_ms"] == 17.0 and summary["max_ms"] == 31.0
    assert summary["slow_share"] == 0.25  # 21.0 <= 1.25 x 17 is quick
    assert summary["probe_us_slow"] == 1000 and summary["probe_us_quick"] == 450
    assert summary["switches_slow"] == 2 and summary["switches_quick"] == 0
    assert summary["steal_total"] == 4 and summary["cores"] == [3]


def test_proc_readings_name_this_process_threads_and_an_allowed_core() -> None:
    allowed = os.sched_getaffinity(0)
    assert noise.current_core() in range(os.cpu_count() or 1)
    assert noise.quiet_core() in allowed
    assert str(os.getpid()) in noise.thread_cpu_jiffies()
    assert noise.steal_jiffies() >= 0


def test_one_setting_runs_in_a_child_and_reports_every_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "noise.json"
    argv = ["--settings", "pinned_one_thread", "--size", "tiny", "--calls", "2"]
    assert noise.main([*argv, "--out", str(out)]) == 0
    entry = json.loads(out.read_text())["settings"]["pinned_one_thread"]
    assert entry["torch_threads"] == 1
    assert entry["pinned_core"] in range(os.cpu_count() or 1)
    assert set(entry["calls"]) == {"minimax_m3#12", "minimax_m3#20", "deepseek_v41#5"}
    for call in entry["calls"].values():
        assert len(call["samples"]) == 2
        assert 0 < call["min_ms"] <= call["median_ms"] <= call["max_ms"]
