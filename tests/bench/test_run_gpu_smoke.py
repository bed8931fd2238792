"""``bench/run_gpu.sh`` in its CPU smoke mode: the stages the GPU run uses
(``smoke overhead profile traffic traffic-new launch``; ``bench`` is covered by
``test_bench_smoke.py``) run on the tiny towers with the eager-replay
backend, and what they write is checked.

On a CPU in fp32 the timings mean nothing, but the computations must be
right: every graph and eager path equals the eager reference, the tuner's
prediction equals what the manager packed, and the reports render.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_modules import REPO_ROOT, load_bench_module

from encoder_cudagraph_runtime.manager import LONG_CALL_MS

STAGES = (
    "smoke",
    "overhead",
    "profile",
    "traffic",
    "traffic-new",
    "traffic-beyond",
    "launch",
    "padding",
)
LADDERS = ("default", "fine", "tuned")
POLICIES = ("vllm", "cost")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu-smoke")
    env = {**os.environ, "GEN_MIXIN_SMOKE": "1", "OUT": str(out)}
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "bench" / "run_gpu.sh"), *STAGES],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return out


def test_every_stage_ran(smoke_run: Path) -> None:
    summary = (smoke_run / "summary.log").read_text()
    for stage in STAGES:
        assert f"=== {stage}: rc=0" in summary, summary


def test_padding_measures_both_ways(smoke_run: Path) -> None:
    """Issue #27: DeepSeek-V4.1's replay at half its budget with one trailing
    padding sequence and with zero-length sequences, each item against its
    own eager forward."""
    padding = json.loads((smoke_run / "padding.json").read_text())
    (result,) = padding["results"]
    assert result["padding_fraction"] == 0.5 and result["correct"]
    assert set(result["variants"]) == {"trailing_sequence", "repeat_last"}
    for variant in result["variants"].values():
        assert variant["finite"] and variant["replays"] == 1
        assert variant["max_rel_diff_vs_eager_per_item"] <= 1e-4
    assert result["faster_replay"] in result["variants"]


@pytest.fixture(scope="module")
def traffic(smoke_run: Path) -> dict[str, Any]:
    return json.loads((smoke_run / "traffic.json").read_text())


def test_traffic_outputs_equal_eager(traffic: dict[str, Any]) -> None:
    assert set(traffic["models"]) == {"deepseek_v41", "minimax_m3"}
    assert traffic["skipped"] == {}
    check_traffic_outputs(traffic)


def check_traffic_outputs(traffic: dict[str, Any]) -> None:
    """Every measured batch and workload of a traffic run equals eager."""
    assert traffic["benchmark"] == "encoder_traffic"
    assert not traffic["errors"], traffic["errors"]
    for stem, model in traffic["models"].items():
        rows = model["batches"] + model["old_workloads"]
        assert model["batches"], stem
        for row in model["batches"]:
            assert row["check_ideal"] < 1e-4, (stem, row["items"])
            # A model of several encoder paths: vLLM's packing on the default
            # and fine ladders (the rest is recorded as not applicable).
            for ladder in model["ladders_measured"]:
                for policy in model["policies_measured"]:
                    entry = row["graph"][ladder][policy]
                    assert entry["check_vs_eager"] < 1e-4, (stem, ladder, policy)
                    assert entry["speedup"] > 0
        for row in model["old_workloads"]:
            for entry in row["graph"].values():
                assert entry["check_vs_eager"] < 1e-4, (stem, row["resolution"])
        assert all(r["best_ms"] <= r["eager_ms"]["median"] for r in rows)


def test_traffic_new_measures_or_skips_each_new_model(smoke_run: Path) -> None:
    """``traffic-new``: every new model is measured (Step3-VL's two encoder
    paths too), or listed with the reason it cannot be (no spec yet); no
    issue #6 workloads."""
    result = json.loads((smoke_run / "traffic-new.json").read_text())
    encoders = load_bench_module("bench_encoders")
    new = load_bench_module("bench_traffic").NEW_MODELS
    assert set(result["models"]) | set(result["skipped"]) == set(new)
    assert "step3_vl" in result["models"]
    for stem in new:
        reason = encoders.unusable_reason(stem, "tiny", multi_path=True)
        assert result["skipped"].get(stem) == reason, stem
    assert result["params"]["old_workloads"] is False
    check_traffic_outputs(result)
    for model in result["models"].values():
        assert model["old_workloads"] == []


def test_traffic_beyond_measures_the_models_vllm_runs_eagerly(smoke_run: Path) -> None:
    """``traffic-beyond`` (issue #26): Pixtral's and Mistral3's per-image
    tensors through the real-traffic benchmark, every output equal to eager;
    the tuner plans with the reference towers' constants (Pixtral's 14-px
    patches merged 2 x 2, not the spec's Pixtral-12B defaults; the tiny
    towers' 224-px side), so its predicted waste is what the manager packs."""
    result = json.loads((smoke_run / "traffic-beyond.json").read_text())
    beyond = load_bench_module("bench_traffic").BEYOND_MODELS
    assert set(result["models"]) == set(beyond) and result["skipped"] == {}
    check_traffic_outputs(result)
    constants = {
        "pixtral": {"patch": 14, "merge": 2, "side": 224},
        "mistral3": {"side": 224},
    }
    for stem, model in result["models"].items():
        assert model["tuner_constants"] == constants[stem], stem
        waste = model["tuned_waste"]
        assert waste["predicted_measured"] == pytest.approx(waste["measured"], abs=1e-9)


def test_traffic_of_a_model_beyond_the_seeds(tmp_path: Path) -> None:
    """Qwen2-VL through the same code (its items named after its spec's grid
    dims), and Step3-VL with its two encoder paths."""
    out = tmp_path / "traffic.json"
    proc = subprocess.run(
        [
            sys.executable,
            "bench/bench_traffic.py",
            *("--device", "cpu", "--size", "tiny", "--quick", "--out", str(out)),
            *("--models", "qwen2_vl,step3_vl", "--skip-unusable", "--no-old-workloads"),
            *("--batches", "1", "--max-batches", "1"),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert list(result["models"]) == ["qwen2_vl", "step3_vl"]
    assert result["skipped"] == {}
    check_traffic_outputs(result)
    model = result["models"]["qwen2_vl"]
    assert len(model["batches"]) == 1
    waste = model["tuned_waste"]
    assert waste["measured"] == pytest.approx(waste["predicted_measured"], abs=1e-12)


def test_traffic_padding_and_plans(traffic: dict[str, Any]) -> None:
    for model in traffic["models"].values():
        for row in model["batches"]:
            for ladder in LADDERS:
                vllm = row["graph"][ladder]["vllm"]
                cost = row["graph"][ladder]["cost"]
                # vLLM's packing replays every item; a plan may run some eagerly.
                assert vllm["padding"]["rows_used"] == row["budget_tokens"]
                assert cost["padding"]["rows_used"] <= row["budget_tokens"]
                assert vllm["plan"]["source"] == "vllm"
                planned = sum(u["items"] for u in cost["plan"]["units"])
                assert planned == row["images"]
                # The recorded prediction is the plan's own.
                assert cost["predicted_ms"] == pytest.approx(
                    sum(u["predicted_ms"] for u in cost["plan"]["units"])
                )
                if cost["plan"]["source"] == "vllm":
                    assert cost["padding"] == vllm["padding"]
        for ladder in LADDERS:
            for policy in POLICIES:
                s = model["summary"][ladder][policy]
                graph = sum(
                    r["graph"][ladder][policy]["graph_ms"]["median"]
                    for r in model["batches"]
                )
                assert s["graph_ms_total"] == pytest.approx(graph)
                assert s["vs_best"] == pytest.approx(s["best_ms_total"] / graph)


def test_tuned_ladder_is_the_tuners(traffic: dict[str, Any]) -> None:
    for model in traffic["models"].values():
        tuned = model["ladders"]["tuned"]
        config = model["tuner"]["compilation_config"]
        assert tuned["budgets"] == config["encoder_cudagraph_token_budgets"]
        assert (
            tuned["max_batch_size"]
            == config["encoder_cudagraph_max_vision_items_per_batch"]
        )
        # Same packing, same budget tokens (the spec's formula and the
        # mixin's item specs): the prediction is exact on these batches.
        waste = model["tuned_waste"]
        assert waste["measured"] == pytest.approx(
            waste["predicted_measured"], abs=1e-12
        )
        assert model["ladders"]["tuned"]["cost_model"]["graph"]["replay_ms"]


def test_traffic_targets_and_report(traffic: dict[str, Any]) -> None:
    names = {t["name"] for t in traffic["targets"]}
    assert names == {t["name"] for t in load_bench_module("bench_traffic").TARGETS}
    graph_plans = any(
        entry["cost"]["plan"].get("kind") in ("graphs", "mixed")
        for model in traffic["models"].values()
        for batch in model["batches"]
        for entry in batch["graph"].values()
    )
    for t in traffic["targets"]:
        # A target over the batches whose plan replays a graph has nothing
        # to check when every plan ran eagerly: not a pass.
        vacuous = t["name"] == "no_graph_plan_slower_than_eager" and not graph_plans
        assert t["passed"] in ((None,) if vacuous else (True, False)), t["name"]
    render = load_bench_module("render_results")
    markdown = render.render_markdown(traffic)
    assert "## Real-traffic encoder benchmark" in markdown
    for stem in traffic["models"]:
        assert f"### {stem}" in markdown


def test_recorded_predictions_replay_offline(traffic: dict[str, Any]) -> None:
    """``bench/replay_traffic.py`` reads the run: every batch decided once
    per ladder, and the run's own totals come back out of it."""
    replayed = load_bench_module("replay_traffic").replay(traffic)
    for stem, model in traffic["models"].items():
        for ladder in LADDERS:
            r = replayed[stem][ladder]
            assert [d["index"] for d in r["decisions"]] == [
                b["index"] for b in model["batches"]
            ]
            for policy, key in (("vllm", "vllm"), ("cost", "run_cost_aware")):
                s = model["summary"][ladder][policy]
                assert r[key]["speedup"] == pytest.approx(s["speedup"])
                assert r[key]["vs_best"] == pytest.approx(s["vs_best"])
        for ladder in LADDERS:
            samples = model["ladders"][ladder]["calibration_samples"]
            # A unit of LONG_CALL_MS is timed without its replay alone.
            assert all(
                g["replay_ms"] > 0 if g["ms"] < LONG_CALL_MS else g["replay_ms"] is None
                for g in samples["graph"]
            )
            # Refitted from those samples (the later ladders with the first
            # one's eager cost): every batch decided once more.
            refitted = replayed[stem][ladder]["refitted"]
            assert 0 < refitted["vs_best"] and refitted["worst_batch"] > 0
        assert model["ladders"]["default"]["calibration_samples"]["eager"]
        # The top of vLLM's range for the spec, what `vllm serve` builds.
        assert (
            model["tuner"]["max_budget"] == model["ladders"]["default"]["budgets"][-1]
        )


def test_launch_profile(smoke_run: Path) -> None:
    result = json.loads((smoke_run / "launch.json").read_text())
    assert set(result["models"]) == {"minimax_m3", "deepseek_v41"}
    for model in result["models"].values():
        assert len(model["passes"]) == 2
        for one in model["passes"]:
            for workload in one["workloads"].values():
                split = workload["execute"]
                # No device to queue work on: that condition is not measured.
                assert split["queued"] is None
                for condition in ("idle", "back_to_back"):
                    parts = split[condition]
                    assert parts["total"] >= parts["replay"] > 0
                assert workload["budgets_replayed"]
            assert all(v["idle"] > 0 for v in one["launch"].values())
    markdown = subprocess.run(
        [
            sys.executable,
            "bench/profile_launch.py",
            "--render",
            str(smoke_run / "launch.json"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "### minimax_m3" in markdown and "| 448x2 | idle |" in markdown
