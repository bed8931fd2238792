"""DeepSeek-V4.1's padding sequence, measured both ways (issue #27).

A batch smaller than its budget leaves padding rows in the graph's buffers.
One trailing sequence over them (``pad: trailing_sequence``) makes
attention run over every padding row as one sequence, a cost quadratic in
the padding. vLLM's own mixin repeats the last offset (``pad:
repeat_last``): zero-length sequences, no attention work, and the padding
rows' ViT outputs are never written (the aligner's masked gather keeps them
out of image rows). The spec used the first until H100 run I (half a
budget: 84 vs 61 ms at 16384 patches, 552 vs 233 ms at 65536) and uses the
second since.

This script renders the spec a second time with ``trailing_sequence`` (the
rest of the spec unchanged), builds the reference tower on both mixins with the same
weights, captures one budget per variant, replays a batch that fills half
of it and, per variant: checks every item against the tower's eager forward
run on that item alone (no NaN or Inf, max relative difference), times the
execute and the replay alone (medians of interleaved rounds) and prints
which is faster::

    PYTHONPATH=. python bench/measure_padding.py --out padding.json
    PYTHONPATH=. python bench/measure_padding.py --device cpu --size tiny \\
        --out /tmp/padding.json       # CPU smoke, seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_encoders import (  # noqa: E402
    SPECS_DIR,
    build_vllm_config,
    eager_call,
    environment,
    images_only_config,
    max_rel_diff,
)

from encoder_cudagraph_runtime.graph_backends import (  # noqa: E402
    CudaGraphBackend,
    EagerReplayGraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from generator.emit import render_spec  # noqa: E402
from reference_towers.registry import REFERENCE_TOWERS  # noqa: E402

STEM = "deepseek_v41"
#: The spec's ``cu_seqlens`` rule, and what each variant replaces it with.
SPEC_PAD = "    pad: repeat_last\n    slots: max_batch_size + 1\n"
VARIANTS = {
    "trailing_sequence": "    pad: trailing_sequence\n    slots: max_batch_size + 2\n",
    "repeat_last": SPEC_PAD,
}
#: Budgets (ViT patches) and the batch that fills half of each: images of
#: ``grid`` patches. Full: 2048-patch images (a 448x896 px screenshot),
#: tiny: 8x8 patches.
FULL = {"budgets": (16384, 65536), "grid": (32, 64), "max_items": 32}
TINY = {"budgets": (512,), "grid": (8, 8), "max_items": 4}


def variant_mixin(name: str, tmp: Path) -> type:
    """The DeepSeek-V4.1 standalone mixin rendered with ``cu_seqlens``
    padded the ``name`` way, imported from ``tmp``."""
    text = (SPECS_DIR / f"{STEM}.yaml").read_text()
    if text.count(SPEC_PAD) != 1:
        raise SystemExit(f"specs/{STEM}.yaml no longer has {SPEC_PAD!r} once")
    folder = tmp / name
    folder.mkdir()
    spec = folder / f"{STEM}.yaml"
    spec.write_text(text.replace(SPEC_PAD, VARIANTS[name]))
    (rendered,) = render_spec(spec, ("standalone",), folder / "out")
    module_path = folder / f"{STEM}_{name}.py"
    module_path.write_text(rendered.source)
    loader = importlib.util.spec_from_file_location(f"padding_{name}", module_path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    sys.modules[loader.name] = module
    loader.loader.exec_module(module)
    (mixin,) = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and obj.__module__ == module.__name__
        and "encoder_cudagraph_forward" in vars(obj)
    ]
    return mixin


def time_ms(
    fn: Callable[[], object], sync: Callable[[], None], rounds: int
) -> list[float]:
    out = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter_ns()
        fn()
        sync()
        out.append((time.perf_counter_ns() - start) / 1e6)
    return out


def measure_budget(
    hosts: dict[str, Any],
    budget: int,
    setup: dict[str, Any],
    dtype: torch.dtype,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Both variants at ``budget`` on a batch of half its patches."""
    tower = REFERENCE_TOWERS[STEM]
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    h, w = setup["grid"]
    images = max(1, budget // 2 // (h * w))
    items = [(h, w)] * images
    any_host = next(iter(hosts.values()))
    kw = tower.make_mm_kwargs(any_host, items, device, seed=5)
    references = [
        eager_call(any_host, any_host.select_encoder_cudagraph_items(kw, [i]))[1][0]
        for i in range(images)
    ]
    managers, out = {}, {}
    for name, host in hosts.items():
        backend = (
            CudaGraphBackend() if device.type == "cuda" else EagerReplayGraphBackend()
        )
        manager = EncoderCudaGraphManager(
            build_vllm_config(budget, [budget], min(setup["max_items"], budget)),
            device,
            dtype,
            host,
            graph_backend=backend,
        )
        manager.capture()
        managers[name] = manager
        outputs = manager.execute(kw)
        sync()
        finite = all(bool(torch.isfinite(o).all()) for o in outputs)
        out[name] = {
            "finite": finite,
            "max_rel_diff_vs_eager_per_item": max_rel_diff(outputs, references),
            "replays": manager.get_padding_stats()["replays"],
        }
    rounds: dict[str, dict[str, list[float]]] = {
        n: {"execute": [], "replay": []} for n in hosts
    }
    for _ in range(args.warmup):
        for manager in managers.values():
            manager.execute(kw)
    for _ in range(args.rounds):
        for name, manager in managers.items():
            rounds[name]["execute"] += time_ms(lambda m=manager: m.execute(kw), sync, 1)
            graph = manager.budget_graphs["default"][budget].graph
            rounds[name]["replay"] += time_ms(graph.replay, sync, 1)
    for name in hosts:
        for what, values in rounds[name].items():
            out[name][f"{what}_ms"] = statistics.median(values)
    for manager in managers.values():
        manager.clear()
    faster = min(hosts, key=lambda n: out[n]["replay_ms"])
    correct = all(
        v["finite"]
        and v["max_rel_diff_vs_eager_per_item"] is not None
        and v["max_rel_diff_vs_eager_per_item"] <= args.tolerance
        for v in out.values()
    )
    return {
        "budget": budget,
        "images": images,
        "rows": images * h * w,
        "padding_fraction": 1 - images * h * w / budget,
        "variants": out,
        "faster_replay": faster,
        "correct": correct,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--budgets", type=int, nargs="+", help="default: per size")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.02,
        help="max relative difference per item against eager (bf16: 2%%)",
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds, no warm-up")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 2, 0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup = FULL if args.size == "full" else TINY
    dtype = (
        torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        hosts = {
            name: REFERENCE_TOWERS[STEM].build_host(
                variant_mixin(name, Path(tmp)),
                args.size,
                device=args.device,
                dtype=dtype,
                multimodal_config=images_only_config(),
            )
            for name in VARIANTS
        }
        with torch.inference_mode():
            results = [
                measure_budget(hosts, budget, setup, dtype, args)
                for budget in args.budgets or setup["budgets"]
            ]
    for r in results:
        cells = ", ".join(
            f"{name} replay {v['replay_ms']:.2f} ms / execute {v['execute_ms']:.2f} ms "
            f"(max rel diff {v['max_rel_diff_vs_eager_per_item']}, finite {v['finite']})"
            for name, v in r["variants"].items()
        )
        print(
            f"budget {r['budget']}: {r['images']} images, {r['rows']} rows "
            f"({100 * r['padding_fraction']:.0f}% padding): {cells}; faster: "
            f"{r['faster_replay']}; correct: {r['correct']}"
        )
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "padding_sequence",
                "environment": environment(
                    torch.device(args.device),
                    (
                        CudaGraphBackend()
                        if torch.device(args.device).type == "cuda"
                        else EagerReplayGraphBackend()
                    ),
                ),
                "size": args.size,
                "results": results,
                "elapsed_s": time.perf_counter() - started,
            },
            indent=1,
        )
    )
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
