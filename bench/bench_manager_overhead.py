"""Host overhead of ``EncoderCudaGraphManager.execute``.

Measures everything ``execute()`` spends on the host except the model's own
methods and ``graph.replay()``: sorting, packing, dictionary work, the
replay copies into the captured buffers, statistics and result ordering.
The manager's built-in timing (``enable_timing``) splits each execute into
total / model / replay with ``time.perf_counter_ns``; overhead is the rest.

The model is trivial (one captured buffer, ``y = 2 * x``) so that nothing
but the manager matters; every item has the same number of rows, so each
execute is a single batch of ``n`` items (reported as ``replays``).

Target: overhead <= 30 us per batch + 2 us per item, checked per batch size
(median over iterations) and reported with a least-squares fit.

    PYTHONPATH=. python bench/bench_manager_overhead.py --out results.json

Without CUDA (or with ``--device cpu``) it runs on the CPU with the
eager-replay graph backend: useful to check the script, not representative
of GPU numbers (CPU tensor ops are cheaper to launch than CUDA kernels).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import torch

from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.defs import (
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
)
from encoder_cudagraph_runtime.graph_backends import (
    CudaGraphBackend,
    EagerReplayGraphBackend,
    GraphBackend,
)
from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager

HIDDEN = 64
TARGET_US_PER_BATCH = 30.0
TARGET_US_PER_ITEM = 2.0


class TrivialModel(SupportsEncoderCudaGraph):
    """One captured buffer and one kernel: the cheapest possible mixin.

    ``mm_kwargs`` is ``{"x": (rows, HIDDEN) tensor, "lens": [rows per item]}``.
    """

    def __init__(self, min_budget: int, max_budget: int) -> None:
        self.min_budget = min_budget
        self.max_budget = max_budget

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        return EncoderCudaGraphConfig(
            modalities=["image"], buffer_keys=["x"], out_hidden_size=HIDDEN
        )

    def get_encoder_cudagraph_budget_range(self, vllm_config: Any) -> tuple[int, int]:
        return self.min_budget, self.max_budget

    def get_encoder_cudagraph_item_specs(
        self, mm_kwargs: dict[str, Any]
    ) -> list[EncoderItemSpec]:
        return [EncoderItemSpec(n, n) for n in mm_kwargs["lens"]]

    def select_encoder_cudagraph_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> dict[str, Any]:
        lens = mm_kwargs["lens"]
        if indices == list(range(len(lens))):
            return {"x": mm_kwargs["x"], "lens": lens}
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        x = mm_kwargs["x"]
        parts = [x[starts[i] : starts[i + 1]] for i in indices]
        return {
            "x": torch.cat(parts) if parts else x[:0],
            "lens": [lens[i] for i in indices],
        }

    def prepare_encoder_cudagraph_capture_inputs(
        self,
        token_budget: int,
        max_batch_size: int,
        max_frames_per_batch: int,
        device: torch.device,
        dtype: torch.dtype,
        path: str = "default",
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        return EncoderCudaGraphCaptureInputs(
            values={"x": torch.zeros(token_budget, HIDDEN, device=device, dtype=dtype)}
        )

    def prepare_encoder_cudagraph_replay_buffers(
        self,
        mm_kwargs: dict[str, Any],
        max_batch_size: int,
        max_frames_per_batch: int,
        path: str = "default",
    ) -> EncoderCudaGraphReplayBuffers:
        return EncoderCudaGraphReplayBuffers(values={"x": mm_kwargs["x"]})

    def encoder_cudagraph_forward(
        self, inputs: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        return inputs["x"] * 2

    def encoder_eager_forward(
        self, mm_kwargs: dict[str, Any], path: str = "default"
    ) -> torch.Tensor:
        return mm_kwargs["x"] * 2


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[pos]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b * x``."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = (
        sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var else 0.0
    )
    return mean_y - slope * mean_x, slope


def run(args: argparse.Namespace) -> dict[str, Any]:
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available()
    )
    device = torch.device("cuda" if use_cuda else "cpu")
    dtype = torch.bfloat16 if use_cuda else torch.float32
    backend: GraphBackend = (
        CudaGraphBackend(device) if use_cuda else EagerReplayGraphBackend()
    )
    sync = torch.cuda.synchronize if use_cuda else (lambda: None)

    model = TrivialModel(args.min_budget, args.max_budget)
    config = VllmConfig(
        model_config=ModelConfig(multimodal_config=MultiModalConfig()),
        compilation_config=CompilationConfig(cudagraph_mm_encoder=True),
    )
    manager = EncoderCudaGraphManager(
        config, device, dtype, model, graph_backend=backend
    )
    if manager.max_batch_size < args.max_items:
        raise SystemExit(
            f"max_batch_size {manager.max_batch_size} < --max-items {args.max_items}; "
            "widen the budget range"
        )
    with torch.inference_mode():
        manager.capture()
    sync()

    rows: list[dict[str, Any]] = []
    for n in range(1, args.max_items + 1):
        lens = [args.tokens_per_item] * n
        kwargs = {
            "x": torch.randn(sum(lens), HIDDEN, device=device, dtype=dtype),
            "lens": lens,
        }
        with torch.inference_mode():
            for _ in range(args.warmup):
                manager.execute(kwargs)
            sync()
            manager.enable_timing()
            samples: dict[str, list[float]] = {
                k: [] for k in ("overhead", "total", "model", "replay")
            }
            replays_before = manager.graph_hits
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                for _ in range(args.iters):
                    manager.execute(kwargs)
                    timing = manager.timing
                    assert timing is not None
                    samples["overhead"].append(timing.last_overhead_ns / 1e3)
                    samples["total"].append(timing.last_total_ns / 1e3)
                    samples["model"].append(timing.last_model_ns / 1e3)
                    samples["replay"].append(timing.last_replay_ns / 1e3)
                    # Keep the GPU queue short so the host never blocks on a
                    # full launch queue inside the timed region.
                    sync()
            finally:
                if gc_was_enabled:
                    gc.enable()
            manager.enable_timing(False)
        batches = (manager.graph_hits - replays_before) / (args.iters * n)
        median = {k: statistics.median(v) for k, v in samples.items()}
        rows.append(
            {
                "items": n,
                "rows": sum(lens),
                "replays_per_execute": batches,
                "overhead_us_median": median["overhead"],
                "overhead_us_p90": percentile(samples["overhead"], 0.9),
                "overhead_us_min": min(samples["overhead"]),
                "overhead_us_per_item": median["overhead"] / n,
                "total_us_median": median["total"],
                "model_us_median": median["model"],
                "replay_us_median": median["replay"],
                "target_us": TARGET_US_PER_BATCH + TARGET_US_PER_ITEM * n,
                "meets_target": median["overhead"]
                <= TARGET_US_PER_BATCH + TARGET_US_PER_ITEM * n,
            }
        )
        print(
            f"items={n:>2} overhead median {median['overhead']:7.2f} us "
            f"(p90 {rows[-1]['overhead_us_p90']:7.2f}, total {median['total']:7.2f}, "
            f"model {median['model']:7.2f}, replay {median['replay']:6.2f})",
            file=sys.stderr,
        )

    intercept, slope = fit_line(
        [float(r["items"]) for r in rows], [r["overhead_us_median"] for r in rows]
    )
    manager.clear()
    return {
        "benchmark": "manager_host_overhead",
        "created_unix": time.time(),
        "device": (
            torch.cuda.get_device_name(device)
            if use_cuda
            else platform.processor() or "cpu"
        ),
        "backend": backend.name,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": str(dtype),
        "params": {
            "iters": args.iters,
            "warmup": args.warmup,
            "tokens_per_item": args.tokens_per_item,
            "budget_range": [args.min_budget, args.max_budget],
            "token_budgets": manager.token_budgets,
            "max_batch_size": manager.max_batch_size,
        },
        "target": {
            "us_per_batch": TARGET_US_PER_BATCH,
            "us_per_item": TARGET_US_PER_ITEM,
        },
        "fit": {"us_per_batch": intercept, "us_per_item": slope},
        "meets_target": all(r["meets_target"] for r in rows)
        and intercept <= TARGET_US_PER_BATCH
        and slope <= TARGET_US_PER_ITEM,
        "results": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output path")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--max-items", type=int, default=32)
    parser.add_argument("--tokens-per-item", type=int, default=16)
    parser.add_argument("--min-budget", type=int, default=32)
    parser.add_argument("--max-budget", type=int, default=1024)
    args = parser.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    fit = result["fit"]
    print(
        f"fit: {fit['us_per_batch']:.2f} us/batch + {fit['us_per_item']:.3f} us/item; "
        f"target met: {result['meets_target']}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
