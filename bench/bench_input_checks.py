"""Host time of the generated mixins' input checks (issue #16 item 6).

Every generated mixin checks ``mm_kwargs`` on the host before anything runs
(``_checked_grids``): item specs check the whole batch (integer grids, item
counts, every flat input's rows against the grids, derived grids, span
types), selection its grids and indices. The manager calls item specs once
per execute and selection once per packed batch, so the time added per
execute is one full check plus, per packed batch, the grid reads that
selection did before the checks too.

For every spec with a reference tower, on batches of ``n`` random legal
images, this times the full check (``_checked_grids(mm_kwargs)``) and a
selection's check (``_checked_grids(mm_kwargs, [0])``): the minimum over
rounds of the mean of a burst of calls (the minimum filters a shared
machine's noise). A least-squares line over ``n`` gives the cost per item
(slope) and per execute (intercept). Target: under 5 us per item for the
full check, per spec.

    PYTHONPATH=. python bench/bench_input_checks.py --out checks.json
    PYTHONPATH=. python bench/bench_input_checks.py --device cuda --size full

On a GPU machine the flat inputs live on the device and the grids and span
types on the host, as vLLM hands them over; only shapes of device tensors
are read, so the figure is host time either way.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from reference_towers.registry import (
    REFERENCE_TOWERS,
    generated_mixin,
    stems_with_generated_mixin,
)

TARGET_US_PER_ITEM = 5.0
BATCH_SIZES = (1, 4, 16, 64, 128)
QUICK_BATCH_SIZES = (1, 4, 16)

#: Inputs that stay on the host on a GPU machine (grids, counts and span
#: types are host metadata; the mixins read them as Python ints).
HOST_INPUT_DTYPES = (torch.int32, torch.int64)


#: The most bytes of pixels a batch allocates on the device; a larger batch
#: keeps them on the meta device (128 full-size images are tens of GiB).
MAX_DEVICE_BYTES = 2 << 30


def on_device(mm_kwargs: dict[str, Any], device: str) -> tuple[dict[str, Any], str]:
    """The batch as vLLM hands it over, and where its pixels are: float
    tensors on ``device`` (uninitialised), integer metadata on the host. The
    pixels are drawn on the meta device: the checks read their shapes only,
    and reading a shape costs the host the same on any device (drawing 128
    full-size images took GPU run D's stage past two minutes)."""
    pixels = [
        v
        for v in mm_kwargs.values()
        if isinstance(v, torch.Tensor) and v.dtype not in HOST_INPUT_DTYPES
    ]
    nbytes = sum(v.numel() * v.element_size() for v in pixels)
    where = device if nbytes <= MAX_DEVICE_BYTES else "meta"
    batch = {
        key: (
            torch.empty(value.shape, dtype=value.dtype, device=where)
            if isinstance(value, torch.Tensor) and value.dtype not in HOST_INPUT_DTYPES
            else value
        )
        for key, value in mm_kwargs.items()
    }
    return batch, where


def _size_rank(size: str) -> int:
    return {"tiny": 0, "full": 1}.get(size, 2)


def meta_host(stem: str, size: str) -> Any:
    """The reference host on the meta device: its config and modules without
    weights, which is all the checks read."""
    tower = REFERENCE_TOWERS[stem]
    with torch.device("meta"):
        return tower.host_class(generated_mixin(stem))(tower.config(size))


def time_us(fn, *, burst: int, rounds: int) -> float:
    """Minimum over ``rounds`` of the mean time of ``burst`` calls, in us."""
    for _ in range(burst):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(burst):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / burst / 1000)
    return best


def fit(ns: list[int], us: list[float]) -> tuple[float, float]:
    """``(us_per_item, us_per_call)``: least squares ``us = a * n + b``."""
    slope, intercept = statistics.linear_regression(ns, us)
    return slope, intercept


def bench_stem(stem: str, args: argparse.Namespace) -> dict[str, Any]:
    tower = REFERENCE_TOWERS[stem]
    host = meta_host(stem, args.size)
    rng = random.Random(args.seed)
    sizes = QUICK_BATCH_SIZES if args.quick else BATCH_SIZES
    rows = []
    for n in sizes:
        # Small legal items: the checks read shapes, whose cost does not
        # grow with the image, and drawing full-size pixels takes minutes.
        items = [
            tower.legal_grid(rng, min(tower.sizes, key=_size_rank)) for _ in range(n)
        ]
        mm_kwargs, where = on_device(
            tower.make_mm_kwargs(host, items, "meta", seed=n), args.device
        )
        host.get_encoder_cudagraph_item_specs(mm_kwargs)  # valid: no error
        full = time_us(
            lambda: host._checked_grids(mm_kwargs), burst=args.burst, rounds=args.rounds
        )
        select = time_us(
            lambda: host._checked_grids(mm_kwargs, [0]),
            burst=args.burst,
            rounds=args.rounds,
        )
        rows.append(
            {
                "items": n,
                "pixels_on": where,
                "full_check_us": full,
                "selection_check_us": select,
            }
        )
    ns = [r["items"] for r in rows]
    per_item, per_call = fit(ns, [r["full_check_us"] for r in rows])
    sel_item, sel_call = fit(ns, [r["selection_check_us"] for r in rows])
    return {
        "stem": stem,
        "batches": rows,
        "full_check": {"us_per_item": per_item, "us_per_execute": per_call},
        "selection_check": {"us_per_item": sel_item, "us_per_batch": sel_call},
        "passed": per_item < TARGET_US_PER_ITEM,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"input checks on {result['environment']['device']} "
        f"({result['environment']['processor']}), {result['params']['size']} towers",
        f"{'spec':<14} {'items':>5} {'full us':>9} {'select us':>10}",
    ]
    for model in result["models"]:
        for row in model["batches"]:
            lines.append(
                f"{model['stem']:<14} {row['items']:>5} {row['full_check_us']:>9.1f} "
                f"{row['selection_check_us']:>10.1f}"
            )
        full = model["full_check"]
        lines.append(
            f"{model['stem']:<14} fit: {full['us_per_item']:.2f} us/item + "
            f"{full['us_per_execute']:.1f} us/execute "
            f"(target < {TARGET_US_PER_ITEM} us/item: "
            f"{'ok' if model['passed'] else 'MISSED'})"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="where pixel tensors live")
    parser.add_argument("--size", default="tiny", choices=("tiny", "full"))
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="three batch sizes, few rounds"
    )
    parser.add_argument("--out", type=Path, help="write the JSON result here")
    args = parser.parse_args(argv)
    if args.quick:
        args.burst, args.rounds = min(args.burst, 5), min(args.rounds, 3)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(1)  # the checks are host Python; one thread, as vLLM's runner
    start = time.perf_counter()
    models = [bench_stem(stem, args) for stem in stems_with_generated_mixin()]
    result = {
        "benchmark": "input_checks",
        "environment": {
            "device": args.device,
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "params": vars(args) | {"out": str(args.out) if args.out else None},
        "target_us_per_item": TARGET_US_PER_ITEM,
        "models": models,
        "all_targets_passed": all(m["passed"] for m in models),
        "elapsed_s": time.perf_counter() - start,
    }
    print(render(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["all_targets_passed"] else 1)
