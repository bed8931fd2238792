"""Data-parallel encoder throughput: 2 GPUs (``mm_encoder_tp_mode="data"``)
against 1 GPU (the same manager without DP, in a single process).

Two workloads (``--workload``), for every spec with a reference tower:

``mixed``
    One batch of 16 seeded images with sides drawn from 224..1344 px
    (height and width independently), mapped to legal grids of the tower
    the way its processor would (patch grid, merge multiple, shrunk to the
    tower's per-image cap).
``traffic``
    The first 24 batches (1-16 images, mostly 1-4) of the real-traffic
    draw that ``bench/bench_traffic.py`` measures (``bench/image_traffic.py``,
    seed 17), each image resized by the model's own processor rule; a
    model without a rule (``image_traffic.NO_RESIZE_RULE``) is skipped.

An ``EncoderCudaGraphManager`` with captured CUDA graphs encodes them.
After warm-up, each ``execute`` is timed (device synchronised; in DP mode
the slowest rank's time); a pass is every batch once, and the median pass
is reported as images/s.

    # 1 GPU: no process group, tensor_parallel_size 1
    PYTHONPATH=. python bench/bench_dp.py --out single.json
    # 2 GPUs: torchrun, DP over the world group, compared with single.json
    PYTHONPATH=. python -m torch.distributed.run --standalone \\
        --nproc_per_node=2 bench/bench_dp.py --baseline single.json --out dp.json

``bench/run_dp.sh OUT`` runs both for each workload (and the multigpu
tests). The target is a ratio >= 1.7 for 16 mixed images; the real-traffic
ratio has no target (``bench/dp_balance.py`` computes the bound its
sharding allows: ``docs/data-parallel.md``). Both runs draw the same weights on the
device from one seed (a CUDA generator, identical on every GPU), so the DP
run also checks its per-image output means against the 1-GPU run's.

``--device cpu`` (gloo, tiny towers, eager-replay graphs) only checks the
script itself.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import image_traffic
from bench_traffic import DEFAULT_MAX_TOKENS

from encoder_cudagraph_runtime.attention_backends import (
    AttentionBackendEnum,
)
from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.dp_sharding import plan_dp_shard
from encoder_cudagraph_runtime.graph_backends import (
    CudaGraphBackend,
    EagerReplayGraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from reference_towers.registry import REFERENCE_TOWERS, ReferenceTower
from reference_towers.registry import generated_mixin as load_mixin

#: ``max_num_batched_tokens`` = ``max_model_len`` per workload and size: the
#: largest budget of the ladder. The real-traffic workload takes the
#: real-traffic benchmark's, whose ladder has a graph for every image of the
#: seed models (8192 would leave Qwen2-VL's camera photos, up to 16224
#: tokens, to the eager path).
MAX_TOKENS = {
    "mixed": {"tiny": 512, "full": 8192},
    "traffic": DEFAULT_MAX_TOKENS,
}
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
TARGET_RATIO = 1.7
WORKLOADS = ("mixed", "traffic")
#: The mixed workload: images per batch, side range in px, seed.
MIXED_IMAGES = 16
MIXED_SIDES = (224, 1344)
MIXED_SEED = 0
#: The real-traffic workload: bench_traffic.py's seed and its number of
#: batches measured whatever the time (its ``BATCHES["full"]``).
TRAFFIC_SEED = 17
TRAFFIC_BATCHES = 24
CHECKSUM_RTOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if cuda else "cpu"
    )
    p.add_argument("--size", choices=["tiny", "full"], default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    p.add_argument("--stems", nargs="*", default=None, help="default: all specs")
    p.add_argument("--workload", choices=WORKLOADS, default="mixed")
    p.add_argument("--images", type=int, default=MIXED_IMAGES, help="mixed")
    p.add_argument("--min-side", type=int, default=MIXED_SIDES[0], help="mixed")
    p.add_argument("--max-side", type=int, default=MIXED_SIDES[1], help="mixed")
    p.add_argument(
        "--batches", type=int, default=TRAFFIC_BATCHES, help="traffic: batches"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help=f"images and weights (default: {MIXED_SEED} mixed, {TRAFFIC_SEED} "
        "traffic)",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument(
        "--init",
        choices=["device", "cpu"],
        default=None,
        help="draw weights on the device (default on cuda: fast) or with the "
        "registry's CPU build_host (default on cpu; about a minute of one CPU "
        "core per process for the full towers)",
    )
    p.add_argument("--baseline", default=None, help="1-GPU JSON to compare with")
    p.add_argument("--target", type=float, default=TARGET_RATIO)
    p.add_argument("--out", default=None, help="JSON result (rank 0)")
    args = p.parse_args()
    if args.size is None:
        args.size = "full" if args.device == "cuda" else "tiny"
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.init is None:
        args.init = "device" if args.device == "cuda" else "cpu"
    if args.seed is None:
        args.seed = MIXED_SEED if args.workload == "mixed" else TRAFFIC_SEED
    return args


# ---------------------------------------------------------------------------
# Process group
# ---------------------------------------------------------------------------


def init(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=600)}
        if args.device == "cuda":
            kwargs["device_id"] = device
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", **kwargs)
    return rank, world, device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def max_over_ranks(value: float, world: int, device: torch.device) -> float:
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def gather_objects(obj: Any, world: int) -> list[Any]:
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


# ---------------------------------------------------------------------------
# Models and inputs
# ---------------------------------------------------------------------------


def workload_stems(stems: list[str], workload: str) -> tuple[list[str], dict[str, str]]:
    """The stems the workload can run, and why the others cannot (a model
    without a resize rule has no real-traffic items)."""
    if workload == "mixed":
        return stems, {}
    skipped = {
        stem: image_traffic.NO_RESIZE_RULE[stem]
        for stem in stems
        if stem in image_traffic.NO_RESIZE_RULE
    }
    return [s for s in stems if s not in skipped], skipped


def discover_stems() -> list[str]:
    return sorted(
        stem
        for stem in REFERENCE_TOWERS
        if (REPO_ROOT / "specs" / f"{stem}.yaml").exists()
        and (REPO_ROOT / "generated" / "standalone" / f"{stem}.py").exists()
    )


def build_host(
    tower: ReferenceTower[Any],
    mixin: type,
    size: str,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    init: str,
) -> Any:
    """The host with seeded weights.

    ``init == "device"`` lays the host out on the meta device, materialises
    it on ``device`` and runs the tower's own ``reference_init_weights``
    with ``torch.Generator`` handing out a generator of ``device``: the
    same scheme and seed as the registry's ``build_host`` but drawn on the
    GPU (other values than the CPU draw, the same on every GPU).
    """
    if init == "cpu":
        return tower.build_host(mixin, size, device=device, dtype=dtype, seed=seed)  # type: ignore[arg-type]
    with torch.device("meta"):
        host = tower.host_class(mixin)(
            tower.config(size),  # type: ignore[arg-type]
            multimodal_config=None,
            attn_backend=AttentionBackendEnum.FLASH_ATTN,
        )
    host.to_empty(device=device)
    cpu_generator = torch.Generator

    def device_generator(*_: Any, **__: Any) -> torch.Generator:
        return cpu_generator(device=device)

    torch.Generator = device_generator  # type: ignore[misc,assignment]
    try:
        host.reference_init_weights(seed)
    finally:
        torch.Generator = cpu_generator  # type: ignore[misc]
    host.reference_cast_tower(dtype)
    host.to(device)
    host.eval()
    host.requires_grad_(False)
    return host


def image_sides(
    seed: int, images: int, min_side: int, max_side: int
) -> list[tuple[int, int]]:
    """``(height, width)`` in pixels, seeded, shared by every tower."""
    rng = random.Random(seed)
    return [
        (rng.randint(min_side, max_side), rng.randint(min_side, max_side))
        for _ in range(images)
    ]


def image_item(
    tower: ReferenceTower[Any], size: str, height: int, width: int
) -> tuple[int, ...]:
    """The legal item of an ``height x width`` image: the patch grid rounded
    to the tower's merge unit, shrunk (aspect kept) until the tower takes
    it, as the processors resize large images."""
    smallest = tower.smallest_item(size)  # type: ignore[arg-type]
    config = tower.config(size)  # type: ignore[arg-type]
    patch = getattr(config, "vision_patch_size", None) or config.patch_size
    unit = smallest[-1]  # 1 for (h, w) grids, the merge size for (t, h, w)
    scale = 1.0
    while True:
        h = max(unit, round(height * scale / (patch * unit)) * unit)
        w = max(unit, round(width * scale / (patch * unit)) * unit)
        item = (h, w) if len(smallest) == 2 else (1, h, w)
        if tower.is_legal(item, size):  # type: ignore[arg-type]
            return item
        if h == unit and w == unit:
            return smallest
        scale *= 0.97


def mixed_batches(
    stem: str,
    size: str,
    seed: int = MIXED_SEED,
    images: int = MIXED_IMAGES,
    sides: tuple[int, int] = MIXED_SIDES,
) -> list[list[tuple[int, ...]]]:
    """The mixed workload of ``stem``: one batch of ``images`` items."""
    tower = REFERENCE_TOWERS[stem]
    return [
        [image_item(tower, size, h, w) for h, w in image_sides(seed, images, *sides)]
    ]


def traffic_batches(
    stem: str, size: str, seed: int = TRAFFIC_SEED, batches: int = TRAFFIC_BATCHES
) -> list[list[tuple[int, ...]]]:
    """The real-traffic workload of ``stem``: ``batches`` seeded batches,
    each image resized by the model's processor rule (``KeyError`` for a
    model without one)."""
    grid = image_traffic.model_grid(stem, REFERENCE_TOWERS[stem].config(size))
    return [
        [grid(h, w) for h, w in batch]
        for batch in image_traffic.draw_image_batches(seed, batches)
    ]


def workload_batches(
    stem: str, args: argparse.Namespace
) -> list[list[tuple[int, ...]]]:
    if args.workload == "mixed":
        sides = (args.min_side, args.max_side)
        return mixed_batches(stem, args.size, args.seed, args.images, sides)
    return traffic_batches(stem, args.size, args.seed, args.batches)


def make_config(workload: str, size: str, world: int) -> VllmConfig:
    """DP (``"data"``, TP = world) when ``world > 1``; else the default
    single-GPU configuration."""
    tokens = MAX_TOKENS[workload][size]
    return VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(
            max_model_len=tokens,
            multimodal_config=MultiModalConfig(
                mm_encoder_tp_mode="data" if world > 1 else "weights"
            ),
        ),
        parallel_config=ParallelConfig(tensor_parallel_size=world),
        compilation_config=CompilationConfig(cudagraph_mm_encoder=True),
    )


# ---------------------------------------------------------------------------
# One tower
# ---------------------------------------------------------------------------


def timed_pass(
    manager: EncoderCudaGraphManager,
    batches: list[dict[str, Any]],
    world: int,
    device: torch.device,
) -> tuple[float, list[torch.Tensor]]:
    """Every batch executed once: the sum of each ``execute``'s time (the
    slowest rank's), and the outputs of all items in order."""
    total = 0.0
    outputs: list[torch.Tensor] = []
    for mm_kwargs in batches:
        barrier(world)
        sync(device)
        t0 = time.perf_counter()
        outputs.extend(manager.execute(mm_kwargs))
        sync(device)
        total += max_over_ranks(time.perf_counter() - t0, world, device)
    return total, outputs


def rank_shares(specs: list[list[Any]], world: int) -> list[dict[str, Any]]:
    """Each rank's share of the workload under the manager's sharding: item
    indices per batch, input rows and output tokens summed over batches."""
    shares: list[dict[str, Any]] = [
        {"items": [], "input_rows": 0, "output_tokens": 0} for _ in range(world)
    ]
    for batch in specs:
        plan = plan_dp_shard(
            [s.input_size for s in batch], [s.output_tokens for s in batch], world
        )
        for r, share in enumerate(shares):
            items = plan.rank_items(r)
            share["items"].append(items)
            share["input_rows"] += sum(batch[i].input_size for i in items)
            share["output_tokens"] += plan.tokens_per_rank[r]
    return shares


def bench_stem(
    stem: str,
    args: argparse.Namespace,
    rank: int,
    world: int,
    device: torch.device,
) -> dict[str, Any]:
    dtype = DTYPES[args.dtype]
    tower = REFERENCE_TOWERS[stem]
    start = time.perf_counter()
    host = build_host(
        tower, load_mixin(stem), args.size, device, dtype, args.seed, args.init
    )
    sync(device)
    build_s = time.perf_counter() - start

    item_batches = workload_batches(stem, args)
    batches = [
        tower.make_mm_kwargs(host, items, device, seed=args.seed + 1 + b)
        for b, items in enumerate(item_batches)
    ]
    graph_backend = (
        CudaGraphBackend(device) if device.type == "cuda" else EagerReplayGraphBackend()
    )
    manager = EncoderCudaGraphManager(
        make_config(args.workload, args.size, world),
        device,
        dtype,
        host,
        graph_backend=graph_backend,
    )
    assert manager.use_dp == (world > 1)
    start = time.perf_counter()
    manager.capture()
    capture_s = time.perf_counter() - start

    for _ in range(args.warmup):
        timed_pass(manager, batches, world, device)
    manager.reset_padding_stats()
    hits, misses = manager.graph_hits, manager.graph_misses
    times: list[float] = []
    outputs: list[torch.Tensor] = []
    for _ in range(args.iters):
        elapsed, outputs = timed_pass(manager, batches, world, device)
        times.append(elapsed)
    median = statistics.median(times)
    checksums = [float(out.float().abs().mean()) for out in outputs]
    padding = manager.get_padding_stats()
    specs = [host.get_encoder_cudagraph_item_specs(kw) for kw in batches]
    flat_specs = [s for batch in specs for s in batch]
    iters = max(args.iters, 1)
    local = {
        "rank": rank,
        "graph_hits": (manager.graph_hits - hits) // iters,
        "graph_misses": (manager.graph_misses - misses) // iters,
        "rows_replayed": padding["rows_replayed"] // iters,
        "rows_used": padding["rows_used"] // iters,
        "waste_fraction": padding["waste_fraction"],
    }
    per_rank = gather_objects(local, world)
    if world > 1:
        for entry, share in zip(per_rank, rank_shares(specs, world)):
            entry.update(share)

    manager.clear()
    del manager, host, outputs, batches
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    images = len(flat_specs)
    output_tokens = sum(s.output_tokens for s in flat_specs)
    return {
        "items": [list(item) for items in item_batches for item in items],
        "batch_sizes": [len(items) for items in item_batches],
        "input_rows": sum(s.input_size for s in flat_specs),
        "output_tokens": output_tokens,
        "build_s": build_s,
        "capture_s": capture_s,
        "times_s": times,
        "median_s": median,
        "min_s": min(times),
        "images_per_s": images / median,
        "output_tokens_per_s": output_tokens / median,
        "checksums": checksums,
        "per_rank": per_rank,
    }


def compare_with_baseline(
    result: dict[str, Any], baseline: dict[str, Any], target: float | None
) -> dict[str, Any]:
    """Speed-up per tower and overall, and whether outputs agree (the
    ``meets_target`` entries are ``None`` without a ``target``)."""
    rtol = CHECKSUM_RTOL[DTYPES[result["dtype"]]]
    per_stem: dict[str, Any] = {}
    dp_total = single_total = 0.0
    images = 0
    for stem, dp in result["stems"].items():
        single = baseline["stems"].get(stem)
        if single is None:
            continue
        ratio = single["median_s"] / dp["median_s"]
        same_items = single["items"] == dp["items"]
        diffs = [
            abs(a - b) / max(abs(b), 1e-6)
            for a, b in zip(dp["checksums"], single["checksums"])
        ]
        per_stem[stem] = {
            "single_images_per_s": single["images_per_s"],
            "dp_images_per_s": dp["images_per_s"],
            "ratio": ratio,
            "meets_target": None if target is None else ratio >= target,
            "same_items": same_items,
            "outputs_match_single": same_items
            and len(diffs) == len(dp["items"])
            and max(diffs, default=0.0) <= rtol,
            "max_checksum_rel_diff": max(diffs, default=0.0),
        }
        dp_total += dp["median_s"]
        single_total += single["median_s"]
        images += len(dp["items"])
    overall = single_total / dp_total if dp_total else math.nan
    return {
        "target_ratio": target,
        "per_stem": per_stem,
        "overall_ratio": overall,
        "overall_single_images_per_s": images / single_total if single_total else None,
        "overall_dp_images_per_s": images / dp_total if dp_total else None,
        "meets_target": (
            None if target is None else bool(per_stem) and overall >= target
        ),
        "all_stems_meet_target": (
            None
            if target is None
            else bool(per_stem) and all(v["meets_target"] for v in per_stem.values())
        ),
        "outputs_match_single": bool(per_stem)
        and all(v["outputs_match_single"] for v in per_stem.values()),
    }


def target_word(met: bool | None, yes: str, no: str, target: float | None) -> str:
    if target is None:
        return "no target"
    return f"target {target}x {yes if met else no}"


def nccl_version() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - informational only
        return None
    if isinstance(version, tuple):
        return ".".join(map(str, version))
    return str(version)


def main() -> int:
    args = parse_args()
    rank, world, device = init(args)
    stems, skipped = workload_stems(args.stems or discover_stems(), args.workload)
    result: dict[str, Any] = {
        "benchmark": "bench_dp",
        "created_unix": time.time(),
        "mode": f"dp{world}" if world > 1 else "single",
        "world_size": world,
        "device": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        ),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "nccl": nccl_version() if device.type == "cuda" else None,
        "size": args.size,
        "dtype": args.dtype,
        "init": args.init,
        "workload": args.workload,
        "skipped": skipped,
        "params": {
            "images": args.images if args.workload == "mixed" else None,
            "sides": (
                [args.min_side, args.max_side] if args.workload == "mixed" else None
            ),
            "batches": args.batches if args.workload == "traffic" else 1,
            "seed": args.seed,
            "warmup": args.warmup,
            "iters": args.iters,
        },
        "stems": {},
    }
    for stem in stems:
        report = bench_stem(stem, args, rank, world, device)
        result["stems"][stem] = report
        if rank == 0:
            print(
                f"[{result['mode']}] {stem}: {report['images_per_s']:.1f} images/s "
                f"(median {report['median_s'] * 1e3:.1f} ms over {args.iters}, "
                f"{report['output_tokens']} output tokens; capture "
                f"{report['capture_s']:.1f} s, build {report['build_s']:.1f} s)",
                flush=True,
            )
    if args.baseline and Path(args.baseline).exists():
        baseline = json.loads(Path(args.baseline).read_text())
        if baseline.get("workload", "mixed") != args.workload:
            sys.exit(
                f"--baseline {args.baseline} ran the {baseline.get('workload')!r} "
                f"workload, not {args.workload!r}"
            )
        target = args.target if args.workload == "mixed" else None
        result["comparison"] = compare_with_baseline(result, baseline, target)
        if rank == 0:
            comp = result["comparison"]
            for stem, v in comp["per_stem"].items():
                print(
                    f"{stem}: {v['single_images_per_s']:.1f} -> "
                    f"{v['dp_images_per_s']:.1f} images/s, x{v['ratio']:.2f} "
                    f"({target_word(v['meets_target'], 'meets', 'BELOW', target)}; "
                    f"outputs {'match' if v['outputs_match_single'] else 'DIFFER'})",
                    flush=True,
                )
            print(
                f"overall: x{comp['overall_ratio']:.2f} "
                f"({comp['overall_single_images_per_s']:.1f} -> "
                f"{comp['overall_dp_images_per_s']:.1f} images/s), "
                f"{target_word(comp['meets_target'], 'met', 'NOT met', target)}",
                flush=True,
            )
    if rank == 0 and args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    if world > 1:
        barrier(world)
        dist.destroy_process_group()
    # Below the speed target is a result; DP outputs that differ from the
    # 1-GPU run's are an error.
    comparison = result.get("comparison")
    return 1 if comparison and not comparison["outputs_match_single"] else 0


if __name__ == "__main__":
    sys.exit(main())
