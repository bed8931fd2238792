"""``bench/run_dp.sh`` in its CPU smoke mode: the data-parallel benchmark
(``bench/bench_dp.py``) on both workloads, 1 process then 2 gloo processes,
tiny towers, eager-replay graphs; what it writes is checked.

The ``tests`` step is left out: it is ``tests/multigpu``'s ``cpu-gloo`` run,
which that folder's own tests run. The timings mean nothing on a CPU; the
outputs, the workloads and each rank's share must be right.
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

from encoder_cudagraph_runtime.load_balance import get_load_balance_assignment
from reference_towers.registry import REFERENCE_TOWERS

STEMS = ("deepseek_v41", "qwen2_vl", "minimax_m3")
TRAFFIC_BATCHES = 4  # run_dp.sh's smoke value
# workload -> (1-process JSON, 2-process JSON)
FILES = {
    "mixed": ("dp_single.json", "dp_bench.json"),
    "traffic": ("dp_traffic_single.json", "dp_traffic.json"),
}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dp-smoke")
    # run_dp.sh calls python3: this interpreter's.
    path = os.pathsep.join((str(Path(sys.executable).parent), os.environ["PATH"]))
    env = {**os.environ, "GEN_MIXIN_SMOKE": "1", "PATH": path}
    env.pop("DP_STEMS", None)
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "bench" / "run_dp.sh"), str(out), *FILES],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return out


def load(out: Path, workload: str) -> tuple[dict[str, Any], dict[str, Any]]:
    single, dp = FILES[workload]
    return (
        json.loads((out / single).read_text()),
        json.loads((out / dp).read_text()),
    )


def test_every_step_ran(smoke_run: Path) -> None:
    summary = (smoke_run / "dp_summary.log").read_text()
    for log in ("dp_bench_single", "dp_bench_dp", "dp_traffic_single", "dp_traffic_dp"):
        assert f"=== dp/{log}: rc=0" in summary, summary
    assert "=== dp: status=0" in summary


@pytest.mark.parametrize("workload", list(FILES))
def test_dp_outputs_match_one_process(smoke_run: Path, workload: str) -> None:
    single, dp = load(smoke_run, workload)
    assert (single["mode"], dp["mode"]) == ("single", "dp2")
    assert single["workload"] == dp["workload"] == workload
    assert list(dp["stems"]) == list(STEMS)
    comparison = dp["comparison"]
    assert comparison["outputs_match_single"]
    for stem in STEMS:
        entry = comparison["per_stem"][stem]
        assert entry["same_items"] and entry["outputs_match_single"], stem
        assert len(dp["stems"][stem]["checksums"]) == len(dp["stems"][stem]["items"])
    # Only the mixed workload has a speed target.
    has_target = workload == "mixed"
    assert (comparison["target_ratio"] is not None) == has_target


def test_traffic_workload_is_bench_traffics_draw(smoke_run: Path) -> None:
    """The real-traffic batches: bench_traffic.py's seeded draw, each image
    resized by the model's processor rule on the tiny tower."""
    image_traffic = load_bench_module("image_traffic")
    _, dp = load(smoke_run, "traffic")
    assert dp["params"]["seed"] == 17 and dp["params"]["batches"] == TRAFFIC_BATCHES
    pixels = image_traffic.draw_image_batches(17, TRAFFIC_BATCHES)
    for stem in STEMS:
        grid = image_traffic.model_grid(stem, REFERENCE_TOWERS[stem].config("tiny"))
        report = dp["stems"][stem]
        assert report["batch_sizes"] == [len(batch) for batch in pixels]
        expected = [list(grid(h, w)) for batch in pixels for h, w in batch]
        assert report["items"] == expected, stem


@pytest.mark.parametrize("workload", list(FILES))
def test_each_rank_ran_its_share(smoke_run: Path, workload: str) -> None:
    """Per batch the ranks split the items as the greedy LPT over input
    rows does, every item on one rank; the rows add up."""
    _, dp = load(smoke_run, workload)
    for stem in STEMS:
        tower = REFERENCE_TOWERS[stem]
        report = dp["stems"][stem]
        items = iter(report["items"])
        batches = [
            [tuple(next(items)) for _ in range(n)] for n in report["batch_sizes"]
        ]
        ranks = report["per_rank"]
        assert [r["rank"] for r in ranks] == [0, 1]
        for b, batch in enumerate(batches):
            sizes = [tower.input_size(item) for item in batch]
            order, counts, _ = get_load_balance_assignment(sizes, 2)
            assert ranks[0]["items"][b] + ranks[1]["items"][b] == order, (stem, b)
            assert [len(r["items"][b]) for r in ranks] == counts
        rows = [
            sum(
                tower.input_size(batches[b][i])
                for b, share in enumerate(r["items"])
                for i in share
            )
            for r in ranks
        ]
        assert [r["input_rows"] for r in ranks] == rows
        assert sum(rows) == report["input_rows"]
