"""Does a model's poisoned-pool run fail under some kernel setting, or after
some other run in the same process?

GPU runs F4 and G found NaN rows in a MiniCPM-V graph's output buffer when
the free blocks of the graph pool held NaN, after a DeepSeek-V4.1 run in the
process. Run H located it with this script: the buffer was that of a graph
that had not replayed (the equivalence driver then checked every graph at a
replayed budget; it checks the graphs that replayed since). The script runs
the poisoned-pool equivalence driver (``tests/equivalence_driver.py``, the
``tiny`` tower, bf16, CUDA graphs) once per kernel setting and prints how
many batches left a non-finite output buffer under each:

* ``default``: PyTorch's own choice of SDPA kernel and the
  ``nn.MultiheadAttention`` fast path;
* ``no_mem_efficient`` / ``no_cudnn``: one SDPA kernel switched off;
* ``math_sdpa``: flash, memory-efficient and cuDNN SDPA off;
* ``no_mha_fastpath``: ``nn.MultiheadAttention`` without its fused path.

Settings are global torch flags, set before the driver captures and reset
after. One JSON line per setting goes to ``--json`` (default stdout only),
with how many bytes of the pool's free blocks the poison reached.
``--before STEM:SIZE`` runs plain (unpoisoned) driver runs first in the same
process, ``--between`` then resets state before the poisoned runs: the
towers' caches, cuBLAS's workspaces, the side capture stream.

    PYTHONPATH=. python bench/diagnose_pool_reads.py minicpmv --json out.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
for path in (REPO_ROOT, REPO_ROOT / "tests"):  # run as a script from anywhere
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import equivalence_driver as drv  # noqa: E402

from encoder_cudagraph_runtime import graph_backends  # noqa: E402
from encoder_cudagraph_runtime.attention_backends import (  # noqa: E402
    AttentionBackendEnum,
)
from encoder_cudagraph_runtime.graph_backends import CudaGraphBackend  # noqa: E402

SDPA_FLAGS = ("flash", "mem_efficient", "cudnn", "math")


@contextlib.contextmanager
def _sdpa_off(*kernels: str) -> Iterator[None]:
    cuda = torch.backends.cuda
    saved = {k: getattr(cuda, f"{k}_sdp_enabled")() for k in SDPA_FLAGS}
    try:
        for k in kernels:
            getattr(cuda, f"enable_{k}_sdp")(False)
        yield
    finally:
        for k, on in saved.items():
            getattr(cuda, f"enable_{k}_sdp")(on)


@contextlib.contextmanager
def _mha_fastpath_off() -> Iterator[None]:
    saved = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(saved)


SETTINGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "default": contextlib.nullcontext,
    "no_mem_efficient": lambda: _sdpa_off("mem_efficient"),
    "no_cudnn": lambda: _sdpa_off("cudnn"),
    "math_sdpa": lambda: _sdpa_off("flash", "mem_efficient", "cudnn"),
    "no_mha_fastpath": _mha_fastpath_off,
}


def _clear_caches() -> list[str]:
    """Clear every functools cache of the reference towers' modules; the
    names cleared."""
    cleared = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("reference_towers"):
            continue
        for attr, value in vars(module).items():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()
                cleared.append(f"{name}.{attr}")
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return cleared


def _clear_cublas() -> list[str]:
    """Free cuBLAS's per-stream workspaces (re-made at the next matmul)."""
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    return ["cublas workspaces"]


def _new_side_stream() -> list[str]:
    """Forget the backend's side capture stream: the next capture makes a
    new one."""
    dropped = [
        f"side stream of device {i}" for i in graph_backends._SIDE_CAPTURE_STREAMS
    ]
    graph_backends._SIDE_CAPTURE_STREAMS.clear()
    return dropped


# What may run between the --before runs and the poisoned ones.
BETWEEN: dict[str, Callable[[], list[str]]] = {
    "caches": _clear_caches,
    "cublas": _clear_cublas,
    "side_stream": _new_side_stream,
}


def _run_driver(stem: str, size: str, batches: int, poison: bool) -> dict[str, Any]:
    """One equivalence-driver run as the GPU suite's (bf16, CUDA graphs)."""
    device = torch.device("cuda", torch.cuda.current_device())
    return drv.run_equivalence(
        stem,
        size,
        device=device,
        dtype=torch.bfloat16,
        graph_backend=CudaGraphBackend(device),
        attn_backend=AttentionBackendEnum.FLASH_ATTN,
        tolerance=2e-2,
        seed=0,
        num_batches=batches,
        poison_pool=poison,
    )


def run_setting(stem: str, name: str, batches: int) -> dict[str, object]:
    with SETTINGS[name]():
        summary = _run_driver(stem, "tiny", batches, poison=True)
    failures = summary.get("failures") or []
    return {
        "stem": stem,
        "setting": name,
        "batches": summary["batches"],
        "nonfinite_buffers": summary["nonfinite_buffers"],
        "num_failures": summary["num_failures"],
        "worst_rel_err": summary["worst_rel_err"],
        "first_failure": str(failures[0])[:400] if failures else None,
        # How much of the pool the poison reached: a pass means little where
        # it missed the blocks the graphs use.
        "poison": {
            phase: {
                k: result.get(k)
                for k in ("poisoned_bytes", "poisoned_blocks", "pool_free_bytes")
            }
            for phase, result in summary.get("phases", {}).items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stem")
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS))
    parser.add_argument("--batches", type=int, default=80)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--before",
        nargs="*",
        default=[],
        metavar="STEM:SIZE",
        help="plain (unpoisoned) runs first, in this process",
    )
    parser.add_argument(
        "--between",
        nargs="*",
        default=[],
        choices=list(BETWEEN),
        help="after the --before runs: caches (the reference towers' "
        "functools caches, garbage, the CUDA cache), cublas (its "
        "workspaces), side_stream (a new side capture stream)",
    )
    parser.add_argument(
        "--clear-after-before",
        action="store_true",
        help="the same as --between caches (run G)",
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {list(SETTINGS)}")
    befores = [b.split(":") for b in args.before]
    if any(len(b) != 2 for b in befores):
        parser.error(f"--before takes STEM:SIZE, got {args.before}")
    for before, (stem, size) in zip(args.before, befores):
        summary = _run_driver(stem, size, args.batches, poison=False)
        print(json.dumps({"before": before, "nonfinite": summary["nonfinite"]}))
    between = args.between + (["caches"] if args.clear_after_before else [])
    for action in dict.fromkeys(between):
        print(json.dumps({"between": action, "cleared": BETWEEN[action]()}))
    for name in args.settings:
        try:
            line = run_setting(args.stem, name, args.batches)
        except Exception as exc:  # a setting a kernel refuses is a finding too
            line = {"stem": args.stem, "setting": name, "error": repr(exc)[:400]}
        print(json.dumps(line), flush=True)
        if args.json:
            with args.json.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
