"""Where the time of one ``manager.execute`` goes (issue #6 diagnostics).

For every spec with a reference tower, on a few uniform workloads:

* ``graph_ms`` with query-chunked attention on and off (two managers on the
  fine ladder, captured with ``GEN_MIXIN_QUERY_CHUNKS`` = 1 / 0), the ideal
  exact-shape replay, and the manager's host split (overhead / model);
* ``--cprofile``: the host functions of ``execute`` by own time (each
  execute synchronised, as the benchmark runs them), and the host time of
  every torch op;
* ``--kernels``: ``torch.profiler`` kernel totals of one execute against one
  ideal replay.

    PYTHONPATH=. python bench/profile_execute.py --out profile.json \\
        --text profile.txt --cprofile --kernels --plain

Diagnostics, not the benchmark: ``bench/bench_encoders.py`` makes the
numbers the README quotes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_encoders import (  # noqa: E402
    FINE_MAX_ITEMS,
    build_vllm_config,
    capture_ideal,
    discover_stems,
    fine_ladder,
    images_only_host,
    pixels_to_item,
)

from encoder_cudagraph_runtime.graph_backends import (  # noqa: E402
    CudaGraphBackend,
    EagerReplayGraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from reference_towers.registry import REFERENCE_TOWERS  # noqa: E402

WORKLOADS = ((224, 1), (224, 16), (448, 1), (448, 8), (896, 4))


def timed(fn, sync, iters: int) -> float:
    """Median milliseconds of ``iters`` synchronised calls after two warm-ups."""
    for _ in range(2):
        fn()
        sync()
    samples = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter_ns()
        fn()
        sync()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(samples)


def kernel_table(fn, sync, rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows)


def host_op_table(fn, sync, rows: int = 25) -> str:
    """Host (CPU) time of every op over 10 synchronised calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            fn()
            sync()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text", type=Path, required=True)
    parser.add_argument("--size", default="full", choices=("full", "tiny"))
    parser.add_argument("--models")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--workloads",
        help="comma-separated RESxN (default: "
        + ",".join(f"{r}x{n}" for r, n in WORKLOADS)
        + ")",
    )
    parser.add_argument(
        "--plain", action="store_true", help="also capture without query chunks"
    )
    parser.add_argument(
        "--cprofile-at",
        default="448x8",
        help="comma-separated RESxN profiled with --cprofile (default 448x8)",
    )
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def backend():
        return CudaGraphBackend(device) if cuda else EagerReplayGraphBackend()

    stems = args.models.split(",") if args.models else discover_stems(args.size)

    def parse(spec: str) -> list[tuple[int, int]]:
        return [tuple(int(v) for v in w.split("x")) for w in spec.split(",")]  # type: ignore[misc]

    workloads = parse(args.workloads) if args.workloads else list(WORKLOADS)
    cprofile_at = set(parse(args.cprofile_at))
    max_tokens = 16384 if args.size == "full" else 512
    text = io.StringIO()
    result: dict[str, Any] = {"device": str(device), "models": {}}

    def say(line: str) -> None:
        print(line, flush=True)
        text.write(line + "\n")

    for stem in stems:
        tower = REFERENCE_TOWERS[stem]
        host = images_only_host(stem, args.size, device, dtype)
        rows_out: list[dict[str, Any]] = []
        managers: dict[str, EncoderCudaGraphManager] = {}
        with torch.inference_mode():
            lo, hi = host.get_encoder_cudagraph_budget_range(
                build_vllm_config(max_tokens)
            )
            cfg = build_vllm_config(max_tokens, fine_ladder(lo, hi), FINE_MAX_ITEMS)
            variants = [("chunked", "1")] + ([("plain", "0")] if args.plain else [])
            for name, flag in variants:
                os.environ["GEN_MIXIN_QUERY_CHUNKS"] = flag
                manager = EncoderCudaGraphManager(
                    cfg, device, dtype, host, graph_backend=backend()
                )
                manager.capture()
                manager.enable_timing()
                managers[name] = manager
            os.environ.pop("GEN_MIXIN_QUERY_CHUNKS")
            template = host.prepare_encoder_cudagraph_capture_inputs(
                lo, 1, 0, device, dtype, "default", ()
            ).values
            for res, n in workloads:
                item = pixels_to_item(tower, args.size, res, res)
                kw = tower.make_mm_kwargs(host, [item] * n, device, seed=res + n)
                ideal = capture_ideal(host, backend(), kw, template)
                row: dict[str, Any] = {
                    "workload": f"{res}^2 x{n}",
                    "ideal_ms": timed(ideal.graph.replay, sync, args.iters),
                }
                for name, manager in managers.items():
                    row[f"graph_ms_{name}"] = timed(
                        lambda m=manager: m.execute(kw), sync, args.iters
                    )
                    manager.reset_timing()
                    for _ in range(args.iters):
                        manager.execute(kw)
                        sync()
                    stats = manager.get_timing_stats()
                    row[f"host_us_{name}"] = {
                        part: round(stats[f"{part}_ns"] / stats["executes"] / 1e3, 1)
                        for part in ("total", "model", "replay", "overhead")
                    }
                say(f"[{stem}] {json.dumps(row)}")
                if args.kernels and (res, n) in ((224, 16), (448, 1)):
                    for name in managers:
                        say(f"--- [{stem}] {row['workload']} execute ({name}) kernels")
                        say(kernel_table(lambda m=managers[name]: m.execute(kw), sync))
                    say(f"--- [{stem}] {row['workload']} ideal replay kernels")
                    say(kernel_table(ideal.graph.replay, sync))
                if args.cprofile and (res, n) in cprofile_at:
                    manager = managers["chunked"]
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(100):
                        # Synchronised, as the benchmark times it: host work
                        # shows as its own, not as waiting for the device.
                        manager.execute(kw)
                        sync()
                    prof.disable()
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
                    say(f"--- [{stem}] {row['workload']} cProfile (100 executes)")
                    say(buf.getvalue())
                    say(
                        f"--- [{stem}] {row['workload']} host time per op (10 executes)"
                    )
                    say(host_op_table(lambda m=manager: m.execute(kw), sync))
                del ideal
                rows_out.append(row)
            for manager in managers.values():
                manager.clear()
        result["models"][stem] = rows_out
        del host, managers
        if cuda:
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.text.write_text(text.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
