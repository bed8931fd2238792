"""CPU smoke test of ``bench/bench_encoders.py``: the quick mode on the tiny
towers with the eager-replay backend, in a subprocess, then the shape of its
JSON and the markdown / plot renderers on it.

The numbers themselves mean nothing on a CPU, but correctness does: in fp32
on the CPU the manager's outputs and the exact-shape "ideal" graph must
match the eager path, so the benchmark is checked to be timing the same
computation three ways.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from bench_modules import load_bench_module

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench" / "bench_encoders.py"
RENDER = REPO_ROOT / "bench" / "render_results.py"
MERGE = REPO_ROOT / "bench" / "merge_results.py"

TOP_KEYS = {
    "benchmark",
    "schema_version",
    "created_unix",
    "environment",
    "params",
    "methodology",
    "models",
    "targets",
    "all_targets_passed",
    "elapsed_s",
}
ENV_KEYS = {"python", "torch", "cuda", "device", "device_type", "graph_backend"}
STATS_KEYS = {"median", "q1", "q3", "iqr", "n"}
LADDER_KEYS = {"budgets", "max_batch_size", "capture"}
CAPTURE_KEYS = {"num_graphs", "seconds", "pool_bytes", "backend"}
GRAPH_KEYS = {
    "graph_ms",
    "speedup",
    "efficiency",
    "host_overhead_us",
    "host_model_us",
    "host_replay_us",
    "host_total_us",
    "padding",
    "check_vs_eager",
}
PADDING_KEYS = {
    "replays",
    "rows_replayed",
    "rows_used",
    "padding_waste",
    "waste_fraction",
    "input_padding_waste",
    "eager_batches",
}
ROW_KEYS = {
    "kind",
    "images",
    "items",
    "pixels",
    "output_tokens",
    "input_rows",
    "eager_ms",
    "ideal_ms",
    "graph",
    "check",
}
MIXED_SUMMARY_KEYS = {
    "speedup",
    "efficiency",
    "padding_waste",
    "eager_ms_total",
    "graph_ms_total",
    "ideal_ms_total",
    "host_overhead_us",
}
TARGET_NAMES = {
    "speedup_small_batches",
    "efficiency_uniform",
    "efficiency_mixed",
    "padding_mixed",
    "host_overhead_8_images",
}


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p
    )
    # One intra-op thread: the tiny towers gain nothing from more, and a
    # loaded CI machine loses a lot to oversubscription.
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--device",
            "cpu",
            "--size",
            "tiny",
            "--quick",
            "--out",
            str(out / "bench.json"),
            "--markdown",
            str(out / "bench.md"),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        # Every single-path tower with a resize rule, about 10 s each on a
        # quiet CPU (nine with Pixtral and Mistral3, issue #26), several
        # times that on a loaded one.
        timeout=240,
        check=False,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {
        "result": json.loads((out / "bench.json").read_text()),
        "markdown": (out / "bench.md").read_text(),
        "stderr": proc.stderr,
        "elapsed": elapsed,
        "dir": out,
    }


def test_top_level_and_environment(quick_run: dict[str, Any]) -> None:
    result = quick_run["result"]
    assert TOP_KEYS <= result.keys()
    assert result["benchmark"] == "encoder_graphs"
    assert ENV_KEYS <= result["environment"].keys()
    assert result["environment"]["graph_backend"] == "eager-replay"
    params = result["params"]
    assert params["quick"] is True and params["size"] == "tiny"
    assert set(result["methodology"]) >= {
        "eager_ms",
        "graph_ms",
        "ideal_ms",
        "host_overhead_us",
        "padding_waste",
    }


def test_every_spec_with_a_tower_is_benchmarked(quick_run: dict[str, Any]) -> None:
    from reference_towers.registry import REFERENCE_TOWERS

    # Towers with several encoder paths (Step3-VL) are not measured yet, nor
    # towers without a resize rule (MiniCPM-V).
    stems = {
        p.stem
        for p in (REPO_ROOT / "specs").glob("*.yaml")
        if p.stem in REFERENCE_TOWERS
        and REFERENCE_TOWERS[p.stem].paths == ("default",)
        and p.stem not in load_bench_module("image_traffic").NO_RESIZE_RULE
    }
    assert {"deepseek_v41", "minimax_m3"} <= stems
    assert set(quick_run["result"]["models"]) == stems


def test_model_entries(quick_run: dict[str, Any]) -> None:
    bench = _load("bench_encoders_for_test", BENCH)
    result = quick_run["result"]
    params = result["params"]
    for stem, model in result["models"].items():
        assert set(model["ladders"]) == {"default", "fine"}, stem
        for ladder in model["ladders"].values():
            assert LADDER_KEYS <= ladder.keys()
            assert CAPTURE_KEYS <= ladder["capture"].keys()
            assert ladder["capture"]["num_graphs"] == len(ladder["budgets"])
        lo, hi = model["budget_range"]
        assert model["ladders"]["default"]["budgets"][-1] == hi
        assert model["ladders"]["fine"]["budgets"] == bench.fine_ladder(
            lo, hi, tuple(params["fine_ladder"]["steps"])
        )
        assert model["ladders"]["fine"]["max_batch_size"] == (
            params["fine_ladder"]["max_items"]
        )

        uniform = model["uniform"]
        assert {(r["resolution"], r["images"]) for r in uniform} == {
            (res, n) for res in params["resolutions"] for n in params["image_counts"]
        }
        rows = uniform + model["mixed"]["batches"]
        assert len(model["mixed"]["batches"]) == params["mixed"]["batches"]
        for row in rows:
            assert ROW_KEYS <= row.keys()
            assert len(row["items"]) == len(row["pixels"]) == row["images"]
            for key in ("eager_ms", "ideal_ms"):
                assert STATS_KEYS <= row[key].keys()
                assert row[key]["median"] > 0
            # fp32 on the CPU: the ideal graph computes the eager rows.
            assert row["check"]["ideal_vs_eager"] < 1e-4, (stem, row["items"])
            assert set(row["graph"]) == {"default", "fine"}
            for entry in row["graph"].values():
                assert GRAPH_KEYS <= entry.keys()
                assert STATS_KEYS <= entry["graph_ms"].keys()
                assert entry["graph_ms"]["median"] > 0
                assert entry["speedup"] > 0 and entry["efficiency"] > 0
                assert entry["check_vs_eager"] < 1e-4, (stem, row["items"])
                padding = entry["padding"]
                assert PADDING_KEYS <= padding.keys()
                assert padding["rows_used"] == row["budget_tokens"]
                # Budgets count output tokens unless the spec says otherwise
                # (DeepSeek-V4.1: ViT patches, the encoder's input rows).
                assert row["budget_tokens"] in (row["output_tokens"], row["input_rows"])
                assert padding["rows_replayed"] >= padding["rows_used"]
                assert padding["padding_waste"] == pytest.approx(
                    padding["rows_replayed"] / padding["rows_used"] - 1
                )
                assert padding["eager_batches"] == 0
                assert entry["host_overhead_us"]["n"] == entry["graph_ms"]["n"]
        for ladder in ("default", "fine"):
            summary = model["mixed"]["summary"][ladder]
            assert MIXED_SUMMARY_KEYS <= summary.keys()
            assert summary["padding_waste"] >= 0


def test_targets(quick_run: dict[str, Any]) -> None:
    result = quick_run["result"]
    targets = {t["name"]: t for t in result["targets"]}
    assert set(targets) == TARGET_NAMES
    for target in targets.values():
        assert target["passed"] in (True, False, None)
        assert set(target["per_ladder"]) == {"default", "fine"}
        # The quick workloads reach every target (8 images, <= 4 of <= 448²).
        assert target["passed"] is not None, target["name"]
    assert isinstance(result["all_targets_passed"], bool)
    assert "PASS" in quick_run["stderr"] or "FAIL" in quick_run["stderr"]
    # The seed models gate; the others are evaluated under info_models.
    others = sorted(set(result["models"]) - {"deepseek_v41", "minimax_m3"})
    for target in targets.values():
        if others:
            assert target["info_models"]["models"] == others
        else:
            assert "info_models" not in target


def test_targets_gate_on_the_seed_models_only(quick_run: dict[str, Any]) -> None:
    bench = _load("bench_encoders_for_targets", BENCH)
    models = quick_run["result"]["models"]
    seeds = {k: v for k, v in models.items() if k in bench.TARGET_MODELS}
    assert seeds, "the smoke run measures the seed models"
    gated = bench.evaluate_targets(models)
    alone = bench.evaluate_targets(seeds)
    assert [t["passed"] for t in gated] == [t["passed"] for t in alone]
    assert [t["per_ladder"] for t in gated] == [t["per_ladder"] for t in alone]


def test_merge_replaces_models_and_reevaluates(quick_run: dict[str, Any]) -> None:
    merge = _load("merge_results_for_test", MERGE).merge
    result = quick_run["result"]
    stem = next(m for m in result["models"] if m in ("deepseek_v41", "minimax_m3"))
    rerun = json.loads(json.dumps({**result, "models": {stem: result["models"][stem]}}))
    # A rerun in which this model got 10x slower: its speedups become the
    # worst, which only a re-evaluation of the targets can show.
    for row in rerun["models"][stem]["uniform"]:
        for entry in row["graph"].values():
            entry["speedup"] /= 10
    merged = merge([("first", result), ("rerun", rerun)])
    assert merged["sources"][stem] == "rerun"
    assert set(merged["sources"]) == set(result["models"])
    assert merged["models"][stem] is rerun["models"][stem]
    # The targets come from the merged models, not the first run's.
    speedup = next(t for t in merged["targets"] if t["name"] == "speedup_small_batches")
    gated = [m for m in merged["models"] if m in ("deepseek_v41", "minimax_m3")]
    expected = min(
        row["graph"]["fine"]["speedup"]
        for m in gated or merged["models"]
        for row in merged["models"][m]["uniform"]
        if row["images"] <= 4 and row["resolution"] <= 448
    )
    assert speedup["per_ladder"]["fine"]["worst"]["value"] == expected
    env = dict(result["environment"])
    env.pop("git_commit", None)  # a merge spans runs
    assert merged["environment"] == env


def test_markdown(quick_run: dict[str, Any]) -> None:
    markdown = quick_run["markdown"]
    assert "### Targets" in markdown
    for stem in quick_run["result"]["models"]:
        assert f"### {stem}" in markdown
    render = _load("render_results_for_test", RENDER)
    assert render.render_markdown(quick_run["result"]) == markdown


def test_plot(quick_run: dict[str, Any]) -> None:
    pytest.importorskip("matplotlib")
    render = _load("render_results_for_plot", RENDER)
    path = quick_run["dir"] / "bench.png"
    render.render_plot(quick_run["result"], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
