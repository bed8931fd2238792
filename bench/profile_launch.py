"""Why an execute of 8 large images costs the manager more host time (issue
#17, item 5).

On the H200 of issue #6 the manager's host overhead at 896² x 8 stayed
above 150 µs while 448² x 8 was at 93-125 µs with the same ops, and
``cudaGraphLaunch`` took 934 µs against 380 µs. This script measures, for
MiniMax M3 and DeepSeek-V4.1 at 448² x 8 and 896² x 8 (fine ladder):

``execute``
    the manager's host split (total / model / replay / overhead, µs,
    median) of ``execute`` in three conditions: **idle** (device
    synchronised before, as the benchmark runs it), **queued** (the device
    busy with ``--queued-ms`` of spinning work when ``execute`` starts),
    **back-to-back** (right after another execute, no synchronisation);
``launch``
    the host time of ``graph.replay()`` alone (``cudaGraphLaunch``) for the
    workloads' budgets and the smallest and largest one, idle and queued,
    and of a control graph of ``--control-kernels`` tiny kernels;
``runtime_calls``
    CUDA runtime calls of one idle execute from ``torch.profiler``
    (``cudaGraphLaunch``, ``cudaMemcpyAsync``, ``cudaLaunchKernel``, ...), with
    their host time.
``host_probe_us``
    a fixed pure-Python workload (dictionaries, small sorts: what the
    manager's own host work is made of), timed before each workload: the
    host's speed at that moment. Run A (2026-12-01) saw the same executes'
    overhead and the control graph's launch move by up to 2x between two
    passes seconds apart; the probe tells host speed from code.

Everything runs twice in the same process (``pass 1`` and ``pass 2``), so
run-to-run variation shows next to the effects. A small JSON and a markdown
summary go to ``--out`` and ``--markdown``.

    PYTHONPATH=. python bench/profile_launch.py --out launch.json [--markdown launch.md]
    python bench/profile_launch.py --render launch.json      # markdown to stdout
    PYTHONPATH=. python bench/profile_launch.py --device cpu --size tiny --quick \\
        --out /tmp/launch.json          # CPU smoke (no queued condition)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_encoders import (  # noqa: E402
    FINE_MAX_ITEMS,
    build_vllm_config,
    environment,
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

MODELS = ("minimax_m3", "deepseek_v41")
WORKLOADS = ((448, 8), (896, 8))
QUICK_WORKLOADS = ((224, 2), (448, 2))
CONDITIONS = ("idle", "queued", "back_to_back")


class Device:
    """Synchronisation and busy work on the benchmark device."""

    def __init__(self, use_cuda: bool) -> None:
        self.cuda = use_cuda
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.cycles_per_ms = self._calibrate_sleep() if use_cuda else 0.0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _calibrate_sleep(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
            enable_timing=True
        )
        torch.cuda._sleep(1000)  # warm the kernel up
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        return 10_000_000 / start.elapsed_time(end)

    def busy(self, ms: float) -> bool:
        """Queue ``ms`` of spinning on the device (False on the CPU)."""
        if not self.cuda:
            return False
        torch.cuda._sleep(int(ms * self.cycles_per_ms))
        return True


def host_us(fn: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e3


def execute_split(
    manager: EncoderCudaGraphManager,
    kw: dict[str, Any],
    dev: Device,
    condition: str,
    iters: int,
    queued_ms: float,
) -> dict[str, float] | None:
    """Median host µs of execute's parts in ``condition``."""
    parts: dict[str, list[float]] = {
        k: [] for k in ("total", "model", "replay", "overhead")
    }
    for _ in range(iters):
        dev.sync()
        if condition == "queued" and not dev.busy(queued_ms):
            return None
        if condition == "back_to_back":
            manager.execute(kw)
        manager.execute(kw)
        timing = manager.timing
        assert timing is not None
        parts["total"].append(timing.last_total_ns / 1e3)
        parts["model"].append(timing.last_model_ns / 1e3)
        parts["replay"].append(timing.last_replay_ns / 1e3)
        parts["overhead"].append(timing.last_overhead_ns / 1e3)
        dev.sync()
    return {k: statistics.median(v) for k, v in parts.items()}


def launch_us(
    replay: Callable[[], None], dev: Device, iters: int, queued_ms: float
) -> dict[str, float | None]:
    """Median host µs of one ``replay()``, idle and queued."""
    out: dict[str, float | None] = {}
    for condition in ("idle", "queued"):
        samples = []
        for _ in range(iters):
            dev.sync()
            if condition == "queued" and not dev.busy(queued_ms):
                break
            samples.append(host_us(replay))
            dev.sync()
        out[condition] = statistics.median(samples) if samples else None
    return out


def _probe_work() -> dict[int, list[int]]:
    table: dict[int, list[int]] = {}
    for i in range(2000):
        table[i % 97] = sorted((i, i ^ 5, i % 7))
    return table


def host_probe_us(iters: int) -> float:
    """Median host µs of :func:`_probe_work` (see ``host_probe_us`` in the
    module docstring)."""
    return statistics.median(host_us(_probe_work) for _ in range(max(iters, 3)))


def control_graph(dev: Device, kernels: int) -> Callable[[], None]:
    """A graph of ``kernels`` tiny kernels (the launch cost per node)."""
    x = torch.zeros(16, device=dev.device)
    if not dev.cuda:
        return lambda: [x.add_(1) for _ in range(kernels)] and None
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1)
    return graph.replay


def runtime_calls(fn: Callable[[], object], dev: Device) -> list[dict[str, Any]]:
    """Host µs of the CUDA runtime calls (and the manager's ops) of one
    call of ``fn``, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.cuda else [])
    fn()
    dev.sync()
    with profile(activities=activities) as prof:
        fn()
        dev.sync()
    rows = []
    for event in prof.key_averages():
        name = event.key
        wanted = name.startswith(("cuda", "aten::_foreach"))
        if wanted or name in ("aten::copy_", "aten::narrow"):
            rows.append(
                {"name": name, "calls": event.count, "host_us": event.cpu_time_total}
            )
    return sorted(rows, key=lambda r: -r["host_us"])[:12]


def profile_model(stem: str, args: argparse.Namespace, dev: Device) -> dict[str, Any]:
    tower = REFERENCE_TOWERS[stem]
    dtype = torch.bfloat16 if dev.cuda else torch.float32
    host = images_only_host(stem, args.size, dev.device, dtype)
    out: dict[str, Any] = {"passes": []}
    with torch.inference_mode():
        lo, hi = host.get_encoder_cudagraph_budget_range(
            build_vllm_config(args.max_tokens)
        )
        cfg = build_vllm_config(args.max_tokens, fine_ladder(lo, hi), FINE_MAX_ITEMS)
        backend = (
            CudaGraphBackend(dev.device) if dev.cuda else EagerReplayGraphBackend()
        )
        manager = EncoderCudaGraphManager(
            cfg, dev.device, dtype, host, graph_backend=backend
        )
        manager.capture()
        manager.enable_timing()
        workloads = QUICK_WORKLOADS if args.quick else WORKLOADS
        batches = {}
        for res, n in workloads:
            item = pixels_to_item(tower, args.size, res, res)
            batches[f"{res}x{n}"] = tower.make_mm_kwargs(
                host, [item] * n, dev.device, seed=n
            )
        control = control_graph(dev, args.control_kernels)
        for _ in range(2):
            out["passes"].append(one_pass(manager, batches, control, dev, args))
        manager.clear()
    del host
    return out


def one_pass(
    manager: EncoderCudaGraphManager,
    batches: dict[str, dict[str, Any]],
    control: Callable[[], None],
    dev: Device,
    args: argparse.Namespace,
) -> dict[str, Any]:
    result: dict[str, Any] = {"workloads": {}, "launch": {}}
    budgets: set[int] = {manager.token_budgets[0], manager.token_budgets[-1]}
    for name, kw in batches.items():
        manager.reset_padding_stats()
        manager.execute(kw)
        dev.sync()
        replayed = manager.get_padding_stats()["paths"]["default"]["budgets"]
        budgets |= set(replayed)
        result["workloads"][name] = {
            "host_probe_us": host_probe_us(args.iters),
            "budgets_replayed": {str(b): e["replays"] for b, e in replayed.items()},
            "execute": {
                c: execute_split(manager, kw, dev, c, args.iters, args.queued_ms)
                for c in CONDITIONS
            },
            "runtime_calls": runtime_calls(lambda kw=kw: manager.execute(kw), dev),
        }
    graphs = manager.budget_graphs["default"]
    for budget in sorted(budgets):
        result["launch"][str(budget)] = launch_us(
            graphs[budget].graph.replay, dev, args.iters, args.queued_ms
        )
    result["launch"][f"control_{args.control_kernels}_kernels"] = launch_us(
        control, dev, args.iters, args.queued_ms
    )
    return result


def _pair(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None else f"{a:.0f} / {b:.0f}"


def render_markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    out = [
        "## Manager host time at 8 large images",
        "",
        f"{env.get('device')}, torch {env.get('torch')}; queued work "
        f"{result['params']['queued_ms']} ms; medians of {result['params']['iters']} "
        "executes, µs; two identical passes (pass 1 / pass 2).",
        "",
    ]
    for stem, model in result["models"].items():
        first, second = model["passes"]
        out += [f"### {stem}", ""]
        out += [
            "| workload | condition | total | model | replay | overhead |",
            "|---|---|---|---|---|---|",
        ]
        for name in first["workloads"]:
            for condition in CONDITIONS:
                a = first["workloads"][name]["execute"][condition]
                b = second["workloads"][name]["execute"][condition]
                if a is None or b is None:
                    continue
                cells = " | ".join(
                    f"{a[k]:.0f} / {b[k]:.0f}"
                    for k in ("total", "model", "replay", "overhead")
                )
                out.append(f"| {name} | {condition} | {cells} |")
        probes = ", ".join(
            f"{name} {_pair(first['workloads'][name].get('host_probe_us'), second['workloads'][name].get('host_probe_us'))}"
            for name in first["workloads"]
        )
        out += ["", f"Host probe before each workload (µs, pass 1 / pass 2): {probes}."]
        out += ["", "| graph.replay() host µs | idle | queued |", "|---|---|---|"]
        for budget in first["launch"]:
            cells = [
                _pair(first["launch"][budget][key], second["launch"][budget][key])
                for key in ("idle", "queued")
            ]
            out.append(f"| {budget} | {cells[0]} | {cells[1]} |")
        out.append("")
        for name, w in first["workloads"].items():
            calls = ", ".join(
                f"{c['name']} {c['host_us']:.0f} ({c['calls']})"
                for c in w["runtime_calls"][:6]
            )
            out.append(f"- {name}, one idle execute (pass 1): {calls}")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--render", type=Path, help="print the markdown of this JSON and exit"
    )
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--iters", type=int)
    parser.add_argument("--queued-ms", type=float, default=30.0)
    parser.add_argument("--control-kernels", type=int, default=600)
    args = parser.parse_args(argv)
    if args.render is not None:
        sys.stdout.write(render_markdown(json.loads(args.render.read_text())))
        return 0
    if args.out is None:
        parser.error("--out is required (or --render)")
    args.max_tokens = 16384 if args.size == "full" else 512
    if args.iters is None:
        args.iters = 2 if args.quick else 10
    if args.quick:
        args.control_kernels = min(args.control_kernels, 50)
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available()
    )
    dev = Device(use_cuda)
    backend = CudaGraphBackend(dev.device) if use_cuda else EagerReplayGraphBackend()
    result: dict[str, Any] = {
        "benchmark": "manager_launch_profile",
        "environment": environment(dev.device, backend),
        "params": {
            "size": args.size,
            "iters": args.iters,
            "queued_ms": args.queued_ms,
            "control_kernels": args.control_kernels,
            "sleep_cycles_per_ms": dev.cycles_per_ms,
        },
        "models": {},
    }
    for stem in [s for s in args.models.split(",") if s]:
        result["models"][stem] = profile_model(stem, args, dev)
        print(f"[{stem}] done", file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(render_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
