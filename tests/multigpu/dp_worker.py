"""One rank of the data-parallel encoder check; run it under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/multigpu/dp_worker.py --device cpu --backend gloo --out DIR
    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        tests/multigpu/dp_worker.py --device cuda --backend nccl --out DIR

Every rank builds the same seeded host (a generated mixin on its reference
tower) for each spec that has one, and an ``EncoderCudaGraphManager`` in DP
mode (``mm_encoder_tp_mode="data"``, ``tensor_parallel_size`` = world size)
over the default ``torch.distributed`` group. Every rank then receives the
same full batches, as vLLM's TP ranks do, and checks on its own:

* each ``execute`` output against the single-process eager per-image
  reference (``REFERENCE_TOWERS[stem].reference_outputs`` on a host that is
  not in DP mode): count, 2-D, the manager dtype and device, shape, finite,
  ``max|out - ref| <= tol * max(1, max|ref|)``;
* that the rank ran exactly its share of the items (the manager's counters)
  and joined exactly one all-gather per ``execute``, idle or not;
* for DeepSeek-V4.1, the tower's eager DP path
  (``run_dp_sharded_vision_tower`` and the host's DP ``eager_reference_outputs``)
  against per-image eager.

Batches (seeded, identical on every rank): one image (every other rank is
idle), ``world - 1`` images (world > 2), random batches, equal sizes (load
ties), one large item plus small ones, more items than two graph batches
per rank, and, on a second manager whose user budgets are below the largest
items, batches where some rank falls back to eager while others replay.

Each rank writes ``DIR/rank<r>.json`` (``tests/multigpu/test_dp.py`` reads
them): the assignment it saw per batch, its local items, gather shapes,
worst errors and failures. Exit status 1 when this rank found a failure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import sys
import time
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

import torch
import torch.distributed as dist

from encoder_cudagraph_runtime import distributed
from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.graph_backends import (
    CudaGraphBackend,
    EagerReplayGraphBackend,
    GraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from reference_towers.deepseek_v4 import (
    DeepseekV41VisionHost,
    run_dp_sharded_vision_tower,
)
from reference_towers.registry import REFERENCE_TOWERS, ReferenceTower
from reference_towers.registry import generated_mixin as load_mixin

MAX_TOKENS = {"tiny": 512, "full": 8192}
"""``max_num_batched_tokens`` = ``max_model_len`` per size (the largest
budget of every mixin)."""

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class Batch:
    kind: str
    manager: str
    """``"default"`` (the mixin's own budget ladder) or ``"eager_ladder"``."""
    items: list[tuple[int, ...]]
    seed: int


# ---------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    p.add_argument(
        "--graph-backend",
        choices=["eager", "cuda"],
        default=None,
        help="EagerReplayGraphBackend (default on cpu) or CudaGraphBackend",
    )
    p.add_argument("--size", choices=["tiny", "full"], default="tiny")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    p.add_argument("--stems", nargs="*", default=None, help="default: all")
    p.add_argument("--random-batches", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--empty-batch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also execute a batch of no items (a zero-row all-gather; vLLM "
        "never does this). Default: on with gloo, off with nccl",
    )
    p.add_argument("--tolerance", type=float, default=None)
    p.add_argument("--timeout-s", type=int, default=300, help="collective timeout")
    p.add_argument("--out", required=True, help="folder for rank<r>.json")
    args = p.parse_args(argv)
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    if args.graph_backend is None:
        args.graph_backend = "cuda" if args.device == "cuda" else "eager"
    if args.empty_batch is None:
        args.empty_batch = args.backend == "gloo"
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args


def init_distributed(args: argparse.Namespace) -> tuple[int, int, torch.device]:
    """Join torchrun's group; returns ``(rank, world_size, device)``."""
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    kwargs: dict[str, Any] = {}
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        if args.backend == "nccl":
            kwargs["device_id"] = device
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        args.backend, timeout=datetime.timedelta(seconds=args.timeout_s), **kwargs
    )
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError("torch.distributed disagrees with torchrun's RANK/WORLD")
    return rank, world, device


def discover_stems() -> list[str]:
    """Specs with a reference tower and a generated standalone mixin, one
    encoder path each: the batches and checks here plan one ladder (a
    two-path model, Step3-VL, is left out of the data-parallel tests)."""
    return sorted(
        stem
        for stem in REFERENCE_TOWERS
        if (REPO_ROOT / "specs" / f"{stem}.yaml").exists()
        and (REPO_ROOT / "generated" / "standalone" / f"{stem}.py").exists()
        and len(REFERENCE_TOWERS[stem].paths) == 1
    )


def make_vllm_config(
    size: str,
    world: int,
    *,
    token_budgets: list[int] | None = None,
    max_items: int = 0,
) -> VllmConfig:
    """DP mode: ``mm_encoder_tp_mode="data"`` with ``world`` TP ranks."""
    tokens = MAX_TOKENS[size]
    return VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(
            max_model_len=tokens,
            multimodal_config=MultiModalConfig(mm_encoder_tp_mode="data"),
        ),
        parallel_config=ParallelConfig(tensor_parallel_size=world),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=list(token_budgets or []),
            encoder_cudagraph_max_vision_items_per_batch=max_items,
        ),
    )


def make_graph_backend(name: str, device: torch.device) -> GraphBackend:
    return CudaGraphBackend(device) if name == "cuda" else EagerReplayGraphBackend()


def eager_ladder(tower: ReferenceTower[Any], size: str) -> tuple[list[int], int]:
    """User budgets ``[cap // 4, cap // 2]``: items above ``cap // 2`` run
    eagerly while smaller ones replay graphs."""
    cap = tower.max_output_tokens(size)
    budgets = sorted({max(1, cap // 4), max(1, cap // 2)})
    return budgets, max(1, min(8, budgets[0]))


# ---------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------


def item_with_tokens_in(
    tower: ReferenceTower[Any], rng: random.Random, size: str, low: int, high: int
) -> tuple[int, ...]:
    """A legal item whose output tokens lie in ``[low, high]`` (tried from a
    random count upwards, since not every count is reachable)."""
    counts = list(range(max(low, 1), high + 1))
    start = rng.randrange(len(counts))
    for tokens in counts[start:] + counts[:start]:
        try:
            return tower.legal_grid(rng, size, output_tokens=tokens)  # type: ignore[arg-type]
        except ValueError:
            continue
    raise ValueError(f"no {tower.name} item with {low}..{high} output tokens")


def plan_batches(
    tower: ReferenceTower[Any],
    size: str,
    world: int,
    max_batch_size: int,
    rng: random.Random,
    random_batches: int,
    empty_batch: bool,
) -> list[Batch]:
    cap = tower.max_output_tokens(size)
    smallest = tower.smallest_item(size)
    seeds = iter(range(1000, 10**6))

    def sample() -> tuple[int, ...]:
        return tower.sample_item(rng, size)  # type: ignore[arg-type]

    batches = [Batch("one_image", "default", [sample()], next(seeds))]
    if world > 2:
        items = [sample() for _ in range(world - 1)]
        batches.append(Batch("fewer_than_ranks", "default", items, next(seeds)))
    for _ in range(random_batches):
        n = rng.randint(world + 1, max(world + 1, 8))
        batches.append(
            Batch("random", "default", [sample() for _ in range(n)], next(seeds))
        )
    batches.append(
        Batch("equal_sizes", "default", [sample()] * (world + 1), next(seeds))
    )
    large = item_with_tokens_in(tower, rng, size, cap * 3 // 4, cap)
    batches.append(
        Batch("skewed", "default", [smallest, large] + [smallest] * world, next(seeds))
    )
    n_many = min(world * max_batch_size + world + 1, 48)
    small_cap = max(tower.output_tokens(smallest), cap // 8)
    many = [
        tower.sample_item(rng, size, max_output_tokens=small_cap)  # type: ignore[arg-type]
        for _ in range(n_many)
    ]
    batches.append(Batch("many", "default", many, next(seeds)))

    budgets, _ = eager_ladder(tower, size)
    above = budgets[-1] + 1
    big = [item_with_tokens_in(tower, rng, size, above, cap) for _ in range(2)]
    small = [
        tower.sample_item(rng, size, max_output_tokens=budgets[0])  # type: ignore[arg-type]
        for _ in range(3)
    ]
    batches.append(Batch("eager_one", "eager_ladder", big[:1], next(seeds)))
    batches.append(Batch("eager_mixed", "eager_ladder", big + small, next(seeds)))
    if empty_batch:
        batches.append(Batch("empty", "default", [], next(seeds)))
    return batches


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------


def compare(
    outputs: list[torch.Tensor],
    refs: list[torch.Tensor],
    *,
    dtype: torch.dtype,
    device: torch.device,
    tol: float,
    expected_tokens: list[int],
    what: str,
) -> tuple[float, list[str]]:
    """Worst normalised error and the problems found."""
    failures: list[str] = []
    worst = 0.0
    if len(outputs) != len(refs):
        return math.inf, [f"{what}: {len(outputs)} outputs for {len(refs)} items"]
    for i, (out, ref) in enumerate(zip(outputs, refs)):
        where = f"{what} item {i}"
        if not isinstance(out, torch.Tensor):
            failures.append(f"{where}: not a tensor ({type(out).__name__})")
            continue
        if out.dim() != 2:
            failures.append(f"{where}: {out.dim()}-D output {tuple(out.shape)}")
        if out.dtype != dtype:
            failures.append(f"{where}: dtype {out.dtype}, expected {dtype}")
        if out.device.type != device.type or (
            device.index is not None and out.device.index != device.index
        ):
            failures.append(f"{where}: on {out.device}, expected {device}")
        if tuple(out.shape) != tuple(ref.shape):
            failures.append(
                f"{where}: shape {tuple(out.shape)}, reference {tuple(ref.shape)}"
            )
            continue
        if out.shape[0] != expected_tokens[i]:
            failures.append(
                f"{where}: {out.shape[0]} rows, output_tokens {expected_tokens[i]}"
            )
        out_f, ref_f = out.float(), ref.float().to(out.device)
        if not bool(torch.isfinite(out_f).all()):
            failures.append(f"{where}: non-finite values")
            worst = math.inf
            continue
        scale = max(1.0, float(ref_f.abs().max())) if ref_f.numel() else 1.0
        err = float((out_f - ref_f).abs().max()) / scale if out_f.numel() else 0.0
        worst = max(worst, err)
        if err > tol:
            failures.append(f"{where}: error {err:.3g} > tolerance {tol:.3g}")
    return worst, failures


class GatherLog:
    """Wraps ``distributed.tensor_model_parallel_all_gather`` (which the
    manager calls through the module) to record what this rank sends."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._orig = distributed.tensor_model_parallel_all_gather

        def recording(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
            self.calls.append(
                {"shape": list(input_.shape), "dtype": str(input_.dtype), "dim": dim}
            )
            return self._orig(input_, dim)

        distributed.tensor_model_parallel_all_gather = recording  # type: ignore[assignment]

    def take(self) -> list[dict[str, Any]]:
        calls, self.calls = self.calls, []
        return calls


def record_dp_shard(manager: EncoderCudaGraphManager, sink: dict[str, Any]) -> None:
    """Make ``manager._dp_shard`` report its plan into ``sink``."""
    original = manager._dp_shard

    def recording(mm_kwargs: dict[str, Any], per_item_out_tokens: list[int]) -> Any:
        result = original(mm_kwargs, per_item_out_tokens)
        _, assignment, per_rank, max_rows = result
        sink.update(
            assignment=list(assignment),
            items_per_rank=list(per_rank),
            max_output_tokens_per_rank=int(max_rows),
        )
        return result

    manager._dp_shard = recording  # type: ignore[method-assign]


def check_deepseek_eager_dp(
    host: DeepseekV41VisionHost,
    mm_kwargs: dict[str, Any],
    refs: list[torch.Tensor],
    *,
    dtype: torch.dtype,
    device: torch.device,
    tol: float,
    expected_tokens: list[int],
) -> dict[str, Any]:
    """``run_dp_sharded_vision_tower`` and the host's DP eager path (both
    all-gather over the real group) against per-image eager."""
    patches = mm_kwargs["patches"].to(host.aligner.w1.weight.dtype)
    grids = [tuple(int(v) for v in row) for row in mm_kwargs["vit_grid"].tolist()]
    with torch.inference_mode():
        rows_ref: list[torch.Tensor] = []
        offset = 0
        for h, w in grids:
            image = patches[offset : offset + h * w]
            rows_ref.append(host.aligner(host.vision(image, h, w), h, w))
            offset += h * w
        rows_dp = run_dp_sharded_vision_tower(host.vision, host.aligner, patches, grids)
        saved = host.multimodal_config
        host.multimodal_config = MultiModalConfig(mm_encoder_tp_mode="data")
        try:
            spans_dp = host.eager_reference_outputs(mm_kwargs)
        finally:
            host.multimodal_config = saved
    err_rows, fail_rows = compare(
        rows_dp,
        rows_ref,
        dtype=dtype,
        device=device,
        tol=tol,
        expected_tokens=[t.shape[0] for t in rows_ref],
        what="run_dp_sharded_vision_tower",
    )
    err_spans, fail_spans = compare(
        spans_dp,
        refs,
        dtype=dtype,
        device=device,
        tol=tol,
        expected_tokens=expected_tokens,
        what="host DP eager_reference_outputs",
    )
    return {
        "max_err_rows": err_rows,
        "max_err_spans": err_spans,
        "failures": fail_rows + fail_spans,
    }


# ---------------------------------------------------------------------------
# One spec
# ---------------------------------------------------------------------------


def run_stem(
    stem: str,
    args: argparse.Namespace,
    rank: int,
    world: int,
    device: torch.device,
    gathers: GatherLog,
) -> dict[str, Any]:
    dtype = DTYPES[args.dtype]
    tol = args.tolerance if args.tolerance is not None else TOLERANCE[dtype]
    tower = REFERENCE_TOWERS[stem]
    managers: dict[str, EncoderCudaGraphManager] = {}
    shard_logs: dict[str, dict[str, Any]] = {}
    budgets, items = eager_ladder(tower, args.size)
    configs = {
        "default": make_vllm_config(args.size, world),
        "eager_ladder": make_vllm_config(
            args.size, world, token_budgets=budgets, max_items=items
        ),
    }
    # Setup runs no collective, so a setup error (the same on every rank)
    # skips the spec on every rank and the others still run in step.
    try:
        start = time.perf_counter()
        # Not in DP mode: its eager_reference_outputs is the single-process,
        # per-image ground truth. The manager's DP mode comes from its config.
        host = tower.build_host(
            load_mixin(stem), args.size, device=device, dtype=dtype, seed=args.seed
        )
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        for name, config in configs.items():
            manager = EncoderCudaGraphManager(
                config,
                device,
                dtype,
                host,
                graph_backend=make_graph_backend(args.graph_backend, device),
            )
            if not manager.use_dp:
                raise AssertionError("the manager is not in DP mode")
            manager.capture()
            shard_logs[name] = {}
            record_dp_shard(manager, shard_logs[name])
            managers[name] = manager
        capture_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - reported per spec
        traceback.print_exc()
        return {"setup_error": f"{type(exc).__name__}: {exc}", "batches": []}

    rng = random.Random(args.seed * 7919 + zlib.crc32(stem.encode()))
    plan = plan_batches(
        tower,
        args.size,
        world,
        managers["default"].max_batch_size,
        rng,
        args.random_batches,
        args.empty_batch,
    )
    records: list[dict[str, Any]] = []
    for batch in plan:
        manager = managers[batch.manager]
        mm_kwargs = tower.make_mm_kwargs(host, batch.items, device, seed=batch.seed)
        expected_tokens = [tower.output_tokens(item) for item in batch.items]
        refs = tower.reference_outputs(host, mm_kwargs)
        counted_before = manager.graph_hits + manager.graph_misses
        gathers.take()
        shard_logs[batch.manager].clear()
        outputs = manager.execute(mm_kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        executed = manager.graph_hits + manager.graph_misses - counted_before
        gather_calls = gathers.take()
        shard = dict(shard_logs[batch.manager])
        max_err, failures = compare(
            outputs,
            refs,
            dtype=dtype,
            device=device,
            tol=tol,
            expected_tokens=expected_tokens,
            what=f"{stem} {batch.kind}",
        )
        assignment = shard.get("assignment", [])
        per_rank = shard.get("items_per_rank", [])
        offsets = [0]
        for count in per_rank:
            offsets.append(offsets[-1] + count)
        local = assignment[offsets[rank] : offsets[rank + 1]] if per_rank else []
        if not shard:
            failures.append(f"{stem} {batch.kind}: _dp_shard was not called")
        if len(gather_calls) != 1:
            failures.append(
                f"{stem} {batch.kind}: {len(gather_calls)} all-gathers, expected 1"
            )
        one_path = len(manager.config.paths) == 1
        if one_path and executed != len(local):
            failures.append(
                f"{stem} {batch.kind}: ran {executed} items, its share is "
                f"{len(local)}"
            )
        record: dict[str, Any] = {
            "kind": batch.kind,
            "manager": batch.manager,
            "n_items": len(batch.items),
            "items": [list(item) for item in batch.items],
            "input_sizes": [tower.input_size(item) for item in batch.items],
            "output_tokens": expected_tokens,
            **shard,
            "local_items": local,
            "idle": len(local) == 0,
            "executed_items": executed if one_path else None,
            "gathers": gather_calls,
            "max_err": max_err,
            "failures": failures,
        }
        if isinstance(host, DeepseekV41VisionHost):
            record["eager_dp"] = check_deepseek_eager_dp(
                host,
                mm_kwargs,
                refs,
                dtype=dtype,
                device=device,
                tol=tol,
                expected_tokens=expected_tokens,
            )
            failures.extend(record["eager_dp"]["failures"])
        records.append(record)

    stats = {name: m.get_cumulative_stats() for name, m in managers.items()}
    max_batch_sizes = {name: m.max_batch_size for name, m in managers.items()}
    for manager in managers.values():
        manager.clear()
    del managers, host
    return {
        "tolerance": tol,
        "build_s": build_s,
        "capture_s": capture_s,
        "max_batch_size": max_batch_sizes,
        "stats": stats,
        "batches": records,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world, device = init_distributed(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "device": str(device),
        "backend": args.backend,
        "graph_backend": args.graph_backend,
        "size": args.size,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "stems": {},
        "setup_errors": {},
        "failures": [],
    }
    start = time.perf_counter()
    gathers = GatherLog()
    stems = args.stems if args.stems else discover_stems()
    result["stem_list"] = stems
    try:
        for stem in stems:
            report = run_stem(stem, args, rank, world, device, gathers)
            result["stems"][stem] = report
            if "setup_error" in report:
                # Judged by the test (a known bug may be expected there).
                result["setup_errors"][stem] = report["setup_error"]
            for batch in report["batches"]:
                result["failures"].extend(batch["failures"])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
    except Exception:  # noqa: BLE001 - reported in the JSON, then exit 1
        result["failures"].append(f"rank {rank} raised:\n{traceback.format_exc()}")
        traceback.print_exc()
    result["seconds"] = time.perf_counter() - start
    result["ok"] = not result["failures"]
    path = out_dir / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(path)
    print(
        f"[rank {rank}/{world}] {'OK' if result['ok'] else 'FAILED'}: "
        f"{sum(len(s['batches']) for s in result['stems'].values())} batches over "
        f"{len(result['stems'])} specs in {result['seconds']:.1f} s; "
        f"{len(result['failures'])} failures, "
        f"{len(result['setup_errors'])} specs not set up",
        flush=True,
    )
    for failure in result["failures"][:20]:
        print(f"[rank {rank}] {failure}", flush=True)
    for stem, error in result["setup_errors"].items():
        print(f"[rank {rank}] {stem} not set up: {error}", flush=True)
    if result["ok"]:
        dist.destroy_process_group()
        return 0
    # A failed rank may leave the others waiting in a collective: exit now so
    # that torchrun stops the group instead of waiting for the timeout.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
