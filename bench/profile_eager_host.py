"""Why the eager calls of the real-traffic benchmark are bimodal (issue #17
diagnostics).

GPU run D timed the cost-aware manager's eager plans 8-10 ms slower than the
baseline's eager call in some rounds, though both run the same code. This
script times, for a few real-traffic batches whose plan is eager, in
interleaved rounds and in a shuffled order per round:

* ``eager_a`` and ``eager_b``: the baseline eager call twice (an A/A
  control: how far the same code differs from itself);
* ``manager``: ``manager.execute`` with the cost-aware plan (default ladder);
* ``graph``: the exact-shape graph replay of the batch (one launch: the
  GPU time without the host);

each with its host time until the call returns (``enqueue_ms``, before the
device is synchronised) and its wall time (``total_ms``), on an idle host
and with ``--load`` busy-looping processes beside it. ``profile`` holds one
profiled call of each kind per host mode: kernels launched, the sum of
their device time, and the host calls that waited for the device.

``--order``: instead, the eager call on a few multi-item batches as drawn
and with the items largest first (a tower that encodes item by item hides a
small item's launches under a large one's work only when the large one comes
first).

    PYTHONPATH=. python bench/profile_eager_host.py --out eager_host.json
    PYTHONPATH=. python bench/profile_eager_host.py --order --out eager_order.json

Diagnostics, not the benchmark: ``bench/bench_traffic.py`` makes the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import image_traffic  # noqa: E402
from bench_encoders import (  # noqa: E402
    build_vllm_config,
    capture_ideal,
    eager_call,
    images_only_host,
)
from bench_traffic import TRAIN_BATCHES, calibration_batches  # noqa: E402
from profile_launch import host_probe_us  # noqa: E402

from encoder_cudagraph_runtime.graph_backends import (  # noqa: E402
    CudaGraphBackend,
    EagerReplayGraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from reference_towers.registry import REFERENCE_TOWERS  # noqa: E402

# Real-traffic batches of the benchmark's seed (17) by model: in run D the
# cost-aware plan of each ran eagerly (DeepSeek-V4.1 9, 13, 22; MiniMax M3 0)
# or replayed graphs slower than eager (MiniMax M3 12).
DEFAULT_BATCHES = {"deepseek_v41": (9, 13, 22), "minimax_m3": (0, 12)}
MODES = ("idle", "loaded")
# Run E2's two-item batches whose eager call took 20-30 % longer than the
# cost model's fit (a small image before a large one), and two whose
# large image comes first (fitted within 3 %).
ORDER_BATCHES = {"deepseek_v41": (0, 12, 15, 19, 7, 23), "minimax_m3": (15, 16)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_BATCHES))
    p.add_argument("--size", default="full")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--load", type=int, default=os.cpu_count() or 4)
    p.add_argument("--quick", action="store_true", help="one batch, 2 rounds (smoke)")
    p.add_argument(
        "--order", action="store_true", help="only the item-order comparison"
    )
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


@contextlib.contextmanager
def busy_host(processes: int) -> Iterator[None]:
    """``processes`` busy-looping Python processes while the block runs."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(processes)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(host ms until ``fn`` returns, wall ms until the device is done)."""
    sync()
    t0 = time.perf_counter_ns()
    fn()
    t1 = time.perf_counter_ns()
    sync()
    t2 = time.perf_counter_ns()
    return (t1 - t0) / 1e6, (t2 - t0) / 1e6


def rounds(calls: dict[str, Callable[[], object]], n: int, seed: int) -> dict:
    """``n`` rounds of every call in a shuffled order; per call the samples
    and per round the host probe."""
    order = random.Random(seed)
    out: dict[str, Any] = {name: {"enqueue_ms": [], "total_ms": []} for name in calls}
    probes = []
    for _ in range(n):
        probes.append(host_probe_us(3))
        names = list(calls)
        order.shuffle(names)
        for name in names:
            enqueue, total = timed(calls[name])
            out[name]["enqueue_ms"].append(enqueue)
            out[name]["total_ms"].append(total)
    out["host_probe_us"] = probes
    return out


def profiled(fn: Callable[[], object]) -> dict[str, Any]:
    """Kernels, their device time and the host's waits of one call."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    sync()
    with profile(activities=activities) as prof:
        fn()
        sync()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    waits = {}
    for e in prof.key_averages():
        if any(w in e.key for w in ("Synchronize", "Memcpy", "item", "_local_scalar")):
            waits[e.key] = {"count": e.count, "cpu_ms": e.cpu_time_total / 1e3}
    return {
        "kernels": len(kernels),
        "kernel_ms": sum(e.device_time_total for e in kernels) / 1e3,
        "host_waits": waits,
    }


def summary(samples: dict[str, list[float]]) -> dict[str, float]:
    total, enqueue = samples["total_ms"], samples["enqueue_ms"]
    return {
        "total_median": statistics.median(total),
        "total_min": min(total),
        "total_max": max(total),
        "enqueue_median": statistics.median(enqueue),
        "host_bound_share": sum(e >= 0.9 * t for e, t in zip(enqueue, total))
        / len(total),
    }


def order_run(stem: str, args: argparse.Namespace, log: Callable[[str], None]) -> dict:
    """The eager call on each of ``ORDER_BATCHES[stem]`` as drawn and with
    its items largest first (by input rows), in interleaved rounds."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    tower = REFERENCE_TOWERS[stem]
    grid = image_traffic.model_grid(stem, tower.config(args.size))
    host = images_only_host(stem, args.size, device, dtype)
    wanted = ORDER_BATCHES[stem][: 1 if args.quick else None]
    measured = image_traffic.draw_image_batches(args.seed, max(wanted) + 1)
    out: dict[str, Any] = {}
    with torch.inference_mode():
        for index in wanted:
            drawn = [grid(h, w) for h, w in measured[index]]
            largest_first = sorted(drawn, key=math.prod, reverse=True)
            calls = {}
            for name, items in (("drawn", drawn), ("largest_first", largest_first)):
                kw = tower.make_mm_kwargs(host, items, device, seed=1000 + index)
                calls[name] = lambda kw=kw: eager_call(host, kw)
                calls[name]()
            raw = rounds(calls, args.rounds, seed=index)
            s = {n: summary(raw[n]) for n in calls}
            out[str(index)] = {
                "drawn": [list(i) for i in drawn],
                "raw": raw,
                "summary": s,
            }
            log(
                f"[{stem}] order, batch {index} {drawn}: "
                + ", ".join(
                    f"{n} {v['total_median']:.1f} ms (min {v['total_min']:.1f}, "
                    f"enqueue {v['enqueue_median']:.1f})"
                    for n, v in s.items()
                )
            )
    return out


def model_run(stem: str, args: argparse.Namespace, log: Callable[[str], None]) -> dict:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32

    def backend() -> Any:
        return CudaGraphBackend(device) if cuda else EagerReplayGraphBackend()

    tower = REFERENCE_TOWERS[stem]
    grid = image_traffic.model_grid(stem, tower.config(args.size))
    host = images_only_host(stem, args.size, device, dtype)
    measured = image_traffic.draw_image_batches(
        args.seed, max(DEFAULT_BATCHES[stem]) + 1
    )
    train = image_traffic.draw_image_batches(args.seed + 1, TRAIN_BATCHES)
    train_items = [[grid(h, w) for h, w in batch] for batch in train]
    out: dict[str, Any] = {"batches": {}}
    with torch.inference_mode():
        manager = EncoderCudaGraphManager(
            build_vllm_config(args.max_tokens),
            device,
            dtype,
            host,
            graph_backend=backend(),
            cost_aware=True,
        )
        manager.capture()
        calib = [
            tower.make_mm_kwargs(host, b, device, seed=50 + i)
            for i, b in enumerate(calibration_batches(train_items, False))
        ]
        manager.calibrate_cost_model(calib)
        template = host.prepare_encoder_cudagraph_capture_inputs(
            min(manager.token_budgets), 1, 0, device, dtype, "default", ()
        ).values
        for index in DEFAULT_BATCHES[stem][: 1 if args.quick else None]:
            items = [grid(h, w) for h, w in measured[index]]
            kw = tower.make_mm_kwargs(host, items, device, seed=1000 + index)
            ideal = capture_ideal(host, backend(), kw, template)
            manager.execute(kw)
            plan = manager.get_execution_stats()["last_plan"]
            calls = {
                "eager_a": lambda kw=kw: eager_call(host, kw),
                "eager_b": lambda kw=kw: eager_call(host, kw),
                "manager": lambda kw=kw: manager.execute(kw),
                "graph": ideal.graph.replay,
            }
            for fn in calls.values():
                fn()
            entry: dict[str, Any] = {
                "pixels": [list(p) for p in measured[index]],
                "items": [list(i) for i in items],
                "plan": plan,
            }
            for mode in MODES:
                load = (
                    busy_host(args.load)
                    if mode == "loaded"
                    else contextlib.nullcontext()
                )
                with load:
                    raw = rounds(calls, args.rounds, seed=index)
                    prof = {
                        name: profiled(calls[name])
                        for name in ("eager_a", "manager", "graph")
                    }
                entry[mode] = {
                    "raw": raw,
                    "summary": {n: summary(raw[n]) for n in calls},
                    "profile": prof,
                }
                s = entry[mode]["summary"]
                log(
                    f"[{stem}] batch {index} {mode}: "
                    + ", ".join(
                        f"{n} {v['total_median']:.1f} ms (min {v['total_min']:.1f}, "
                        f"max {v['total_max']:.1f}, enqueue {v['enqueue_median']:.1f}, "
                        f"host-bound {100 * v['host_bound_share']:.0f}%)"
                        for n, v in s.items()
                    )
                    + f"; probe {statistics.median(raw['host_probe_us']):.0f} µs; "
                    + ", ".join(
                        f"{n}: {p['kernels']} kernels {p['kernel_ms']:.1f} ms"
                        for n, p in prof.items()
                    )
                )
            out["batches"][str(index)] = entry
            del ideal
        manager.clear()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()

    def log(line: str) -> None:
        print(
            f"[{time.perf_counter() - started:6.1f}s] {line}",
            file=sys.stderr,
            flush=True,
        )

    if args.quick:
        args.rounds, args.load = 2, 1
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "load_processes": args.load,
        "rounds": args.rounds,
        "models": {},
    }
    for stem in args.models.split(","):
        if args.order:
            result["models"][stem] = {"order": order_run(stem, args, log)}
        else:
            result["models"][stem] = model_run(stem, args, log)
        args.out.write_text(json.dumps(result, indent=1))
    result["elapsed_s"] = time.perf_counter() - started
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
