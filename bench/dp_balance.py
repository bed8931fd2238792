"""How evenly the data-parallel sharding splits the encoder's work: a CPU
computation, no device, no timing.

For each model and workload, every batch is sharded over ``--world`` ranks
as the manager shards it in DP mode (:func:`~encoder_cudagraph_runtime.
dp_sharding.plan_dp_shard`: greedy LPT over ``input_size``), and each
rank's share, like the whole batch on one GPU, is packed into replay units
as the manager packs it (:func:`~encoder_cudagraph_runtime.packing.
pack_items` on the budget ladder the manager resolves for
``bench/bench_dp.py``'s configuration). Items are the workloads of
``bench/bench_dp.py`` on the ``full`` towers: ``mixed`` (16 images),
``traffic`` (the 24 real-traffic batches it times) and ``traffic-long``
(the same draw continued to ``--long-batches`` batches: the workload's
long-run figures). Per model and workload:

``rows_per_rank``, ``tokens_per_rank``
    Input rows and output tokens each rank runs, summed over batches.
``imbalance``
    Σ over batches of the busiest rank's rows / Σ of the mean rank's rows
    (1.0 is even; ``world`` is one rank doing everything).
``rows_bound``
    ``world / imbalance`` = Σ rows / Σ busiest rank's rows: the throughput
    of ``world`` ranks over one if a rank's time were its input rows, with
    nothing else (no per-execute cost, no gather): an upper bound.
``replay_ratio``
    The same ratio with the rows each side actually runs: the budgets its
    graphs replay (padding included) and the rows of items run eagerly, in
    budget tokens; one GPU packs the whole batch, each rank its share. An
    estimate, not a bound: padding rows cost less than real ones.
``units``
    Replays and eager calls per batch, one GPU against the busiest rank:
    each carries a fixed cost the row bounds leave out.
``idle_batches``
    Share of batches with fewer items than ranks: a rank waits at the
    gather, and the batch runs no faster than on one GPU.
``gather_padding``
    Rows the all-gather moves beyond the real ones (every rank sends the
    busiest rank's output tokens), as a share of the real ones.

    PYTHONPATH=. python bench/dp_balance.py [--json out.json] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_dp
import torch

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.dp_sharding import plan_dp_shard
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from encoder_cudagraph_runtime.packing import pack_items
from reference_towers.registry import REFERENCE_TOWERS, generated_mixin

STEMS = ("deepseek_v41", "qwen2_vl", "minimax_m3")
WORLD = 2
LONG_BATCHES = 2000


@dataclass(frozen=True)
class Item:
    rows: int
    """``input_size``: what the sharding balances."""
    tokens: int
    """``output_tokens``: what the gather moves."""
    budget_tokens: int
    """Rows of the item in the graphs' budget unit."""


@dataclass(frozen=True)
class Ladder:
    budgets: list[int]
    max_batch_size: int


@dataclass(frozen=True)
class Packed:
    units: int
    """Graph replays and eager calls."""
    rows_run: int
    """Budgets replayed plus rows of eager items, in budget tokens."""


def manager_ladder(stem: str, workload: str, size: str, world: int) -> Ladder:
    """The budgets and batch size ``bench/bench_dp.py``'s manager resolves
    for ``workload``, from a host laid out on the meta device (no weights,
    no device)."""
    tower = REFERENCE_TOWERS[stem]
    if tuple(tower.paths) != ("default",):
        raise ValueError(f"{stem}: several encoder paths {tower.paths}")
    with torch.device("meta"):
        host = tower.host_class(generated_mixin(stem))(
            tower.config(size),
            multimodal_config=None,
            attn_backend=AttentionBackendEnum.FLASH_ATTN,
        )
    manager = EncoderCudaGraphManager(
        bench_dp.make_config(workload, size, world),
        torch.device("meta"),
        torch.bfloat16,
        host,
        graph_backend=EagerReplayGraphBackend(),
    )
    return Ladder(list(manager.token_budgets), manager.max_batch_size)


def pack(items: list[Item], ladder: Ladder) -> Packed:
    """What the manager's packing runs for ``items`` on one process."""
    if not items:
        return Packed(0, 0)
    batches = pack_items(
        [[i.budget_tokens for i in items]],
        [i.tokens for i in items],
        [ladder.budgets],
        ladder.max_batch_size,
    )
    rows = sum(
        b.path_tokens[0] if b.path_budgets[0] is None else b.path_budgets[0]
        for b in batches
    )
    return Packed(len(batches), rows)


def shard_batch(batch: list[Item], world: int) -> list[list[Item]]:
    """Each rank's items, as the manager's DP mode assigns them."""
    plan = plan_dp_shard([i.rows for i in batch], [i.tokens for i in batch], world)
    return [[batch[i] for i in plan.rank_items(r)] for r in range(world)]


def balance(batches: list[list[Item]], single: Ladder, dp: Ladder, world: int) -> dict:
    """The figures of the module docstring for one model and workload."""
    rows = [0] * world
    tokens = [0] * world
    busiest_rows = busiest_run = single_run = 0
    busiest_units = single_units = 0
    idle = gathered = real_tokens = 0
    per_batch: list[float] = []
    for batch in batches:
        shares = shard_batch(batch, world)
        share_rows = [sum(i.rows for i in s) for s in shares]
        share_tokens = [sum(i.tokens for i in s) for s in shares]
        packed = [pack(s, dp) for s in shares]
        whole = pack(batch, single)
        for r in range(world):
            rows[r] += share_rows[r]
            tokens[r] += share_tokens[r]
        busiest_rows += max(share_rows)
        busiest_run += max(p.rows_run for p in packed)
        busiest_units += max(p.units for p in packed)
        single_run += whole.rows_run
        single_units += whole.units
        idle += len(batch) < world
        gathered += world * max(share_tokens)
        real_tokens += sum(share_tokens)
        per_batch.append(max(share_rows) * world / sum(share_rows))
    total = sum(rows)
    return {
        "batches": len(batches),
        "images": sum(len(b) for b in batches),
        "rows_per_rank": rows,
        "tokens_per_rank": tokens,
        "imbalance": busiest_rows * world / total,
        "batch_imbalance_median": statistics.median(per_batch),
        "rows_bound": total / busiest_rows,
        "replay_ratio": single_run / busiest_run,
        "units_single": single_units / len(batches),
        "units_busiest_rank": busiest_units / len(batches),
        "idle_batches": idle / len(batches),
        "gather_padding": gathered / real_tokens - 1,
    }


#: Each workload's items and configuration: bench_dp's workload of that name.
BENCH_WORKLOAD = {"mixed": "mixed", "traffic": "traffic", "traffic-long": "traffic"}


def workload_items(stem: str, workload: str, size: str, long_batches: int) -> list:
    if workload == "mixed":
        return bench_dp.mixed_batches(stem, size)
    batches = bench_dp.TRAFFIC_BATCHES if workload == "traffic" else long_batches
    return bench_dp.traffic_batches(stem, size, batches=batches)


def model_balance(stem: str, args: argparse.Namespace) -> dict[str, Any]:
    tower = REFERENCE_TOWERS[stem]
    result: dict[str, Any] = {}
    for workload, config in BENCH_WORKLOAD.items():
        single = manager_ladder(stem, config, args.size, 1)
        dp = manager_ladder(stem, config, args.size, args.world)
        batches = [
            [
                Item(
                    tower.input_size(i), tower.output_tokens(i), tower.budget_tokens(i)
                )
                for i in items
            ]
            for items in workload_items(stem, workload, args.size, args.long_batches)
        ]
        result[workload] = {
            **balance(batches, single, dp, args.world),
            "ladder_single": asdict(single),
            "ladder_dp": asdict(dp),
        }
    return result


def render_markdown(result: dict[str, Any]) -> str:
    world = result["world"]
    lines = [
        (
            "| model | workload | batches | images | input rows per rank | output "
            "tokens per rank | imbalance (max/mean) | median batch max/mean | rows "
            f"bound ({world} ranks) | replay ratio | units: 1 GPU / busiest rank | "
            "batches with an idle rank | gather padding |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for stem, model in result["models"].items():
        for workload, b in model.items():
            lines.append(
                f"| {stem} | {workload} | {b['batches']} | {b['images']} | "
                f"{' / '.join(map(str, b['rows_per_rank']))} | "
                f"{' / '.join(map(str, b['tokens_per_rank']))} | "
                f"{b['imbalance']:.3f} | {b['batch_imbalance_median']:.3f} | "
                f"{b['rows_bound']:.2f}x | {b['replay_ratio']:.2f}x | "
                f"{b['units_single']:.2f} / {b['units_busiest_rank']:.2f} | "
                f"{b['idle_batches']:.0%} | {b['gather_padding']:.1%} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stems", nargs="*", default=list(STEMS))
    p.add_argument("--world", type=int, default=WORLD)
    p.add_argument("--size", choices=["tiny", "full"], default="full")
    p.add_argument("--long-batches", type=int, default=LONG_BATCHES)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = {
        "benchmark": "dp_balance",
        "world": args.world,
        "size": args.size,
        "long_batches": args.long_batches,
        "models": {stem: model_balance(stem, args) for stem in args.stems},
    }
    markdown = render_markdown(result)
    print(markdown, end="")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
