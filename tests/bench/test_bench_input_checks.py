"""CPU smoke test of ``bench/bench_input_checks.py``: the quick mode times
the checks of every generated mixin with a tower, and its result says what
the README's security paragraph quotes (cost per item, fit, target)."""

from __future__ import annotations

import json

import pytest

from bench_modules import load_bench_module

pytest.importorskip("torch")


def test_quick_run_times_every_spec_with_a_tower(tmp_path) -> None:
    bench = load_bench_module("bench_input_checks")
    from reference_towers.registry import stems_with_generated_mixin

    out = tmp_path / "checks.json"
    result = bench.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [m["stem"] for m in result["models"]] == stems_with_generated_mixin()
    for model in result["models"]:
        assert [b["items"] for b in model["batches"]] == list(bench.QUICK_BATCH_SIZES)
        assert all(b["full_check_us"] > 0 for b in model["batches"])
        assert model["passed"] == (
            model["full_check"]["us_per_item"] < bench.TARGET_US_PER_ITEM
        )


def test_the_fit_recovers_a_line() -> None:
    bench = load_bench_module("bench_input_checks")
    per_item, per_call = bench.fit([1, 4, 16], [12.0, 18.0, 42.0])
    assert per_item == pytest.approx(2.0) and per_call == pytest.approx(10.0)


def test_pixels_move_to_the_device_metadata_stays_on_the_host() -> None:
    import torch

    bench = load_bench_module("bench_input_checks")
    pixels = torch.zeros(2, 3, device="meta")
    moved, where = bench.on_device(
        {"pixels": pixels, "grid": torch.ones(2, 2, dtype=torch.int64)}, "cpu"
    )
    assert where == "cpu"
    assert moved["pixels"].device.type == "cpu" and moved["pixels"].shape == (2, 3)
    assert moved["grid"].device.type == "cpu"


def test_a_batch_too_large_for_the_device_keeps_its_pixels_on_meta() -> None:
    import torch

    bench = load_bench_module("bench_input_checks")
    rows = bench.MAX_DEVICE_BYTES // 4 + 1
    moved, where = bench.on_device(
        {
            "pixels": torch.zeros(rows, device="meta"),
            "grid": torch.ones(1, 2, dtype=torch.int64),
        },
        "cpu",
    )
    assert where == "meta" and moved["pixels"].device.type == "meta"
    assert moved["grid"].device.type == "cpu"
