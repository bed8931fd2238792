"""Issue #27: the tuner's ladder, judged under vLLM's packing, on real image
sizes (``bench/image_traffic.py``'s draws through each towered model's
resize rules) with ``tuning.max_budget`` at the top of vLLM's own range.

On the training sample and on held-out samples of the same distribution
(other seeds) and of the second workload (other size weights), no batch
costs more rows (replayed budgets plus eager rows) on the tuned ladder than
on vLLM's default ladder for the spec's range, the sum is no worse, and the
ladder is never one giant budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_modules import REPO_ROOT, load_bench_module

from generator.ladder_tuner import LadderWaste, ladder_waste, spec_traffic
from generator.plan import make_plan
from generator.resolve import load_spec
from reference_towers.registry import REFERENCE_TOWERS

traffic = load_bench_module("image_traffic")

TOWERED = (
    "minimax_m3",
    "deepseek_v41",
    "qwen2_vl",
    "qwen2_5_vl",
    "internvl",
    "kimi_vl",
    "kimi_k25",
)
STEP = ["--max-num-batched-tokens", "16384", "--max-model-len", "16384"]
TRAIN_SEED, HELD_OUT_SEEDS = 18, (19, 20)


def draw(stem: str, seed: int, n: int, workload: str = "default") -> list:
    config = REFERENCE_TOWERS[stem].config("full")
    grid = traffic.model_grid(stem, config)
    sizes, shares = traffic.WORKLOADS[workload]
    pixels = traffic.draw_image_batches(seed, n, sizes, shares)
    return [[grid(h, w) for h, w in batch] for batch in pixels]


def write(tmp_path: Path, name: str, document: dict) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(document))
    return path


def packed(stem: str, path: Path, budgets: list[int], items: int) -> LadderWaste:
    spec = load_spec(REPO_ROOT / "specs" / f"{stem}.yaml")
    return ladder_waste(spec_traffic(spec, {}, path).batches, budgets, items)


@pytest.mark.parametrize("stem", TOWERED)
def test_tuned_ladder_is_never_worse_than_the_default(
    tmp_path: Path, stem: str
) -> None:
    config = REFERENCE_TOWERS[stem].config("full")
    spec_path = REPO_ROOT / "specs" / f"{stem}.yaml"
    default = make_plan(
        load_spec(spec_path), max_num_batched_tokens=16384, max_model_len=16384
    )
    top = default.budgets[-1]
    train = write(
        tmp_path,
        "train",
        traffic.traffic_document(
            stem, draw(stem, TRAIN_SEED, 200), config, "train", {"max_budget": top}
        ),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "generator.cli", "plan", str(spec_path), *STEP]
        + ["--traffic", str(train), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    tuned = report["tuned"]["budgets"]
    items = report["tuned"]["max_vision_items_per_batch"]
    assert report["current"]["budgets"] == default.budgets
    assert report["prediction_packing"] == "vllm"
    assert report["packings"]["vllm"]["tuned"]["batches_worse_than_current"] == 0
    # Never one giant budget: every budget vLLM's default ladder has stays.
    assert set(default.budgets) <= set(tuned) and tuned[-1] == top

    samples = {"train": train}
    for seed in HELD_OUT_SEEDS:
        batches = draw(stem, seed, 300)
        document = traffic.traffic_document(stem, batches, config, f"seed {seed}")
        samples[f"held-out {seed}"] = write(tmp_path, f"held{seed}", document)
    second = draw(stem, HELD_OUT_SEEDS[0], 300, "second")
    samples["second workload"] = write(
        tmp_path, "second", traffic.traffic_document(stem, second, config, "second")
    )
    for name, path in samples.items():
        before = packed(stem, path, default.budgets, default.max_batch_size)
        after = packed(stem, path, tuned, items)
        worse = [(a, b) for a, b in zip(after.per_batch, before.per_batch) if a > b]
        assert not worse, f"{name}: batches costing more rows {worse}"
        assert sum(after.per_batch) <= sum(before.per_batch), name
