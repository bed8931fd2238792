"""End-to-end encoder CUDA graph benchmark of the generated mixins (issue #6).

For every spec stem that has a reference tower (``specs/<stem>.yaml`` and
``REFERENCE_TOWERS[stem]``), takes images and runs one encoder path, the
generated standalone mixin is mixed into the reference host and measured on
image workloads:

* uniform: 1, 2, 4, 8, 16 images of 224², 448², 896² pixels;
* mixed: seeded batches of 1..16 images whose sides lie in 224..1344 px with
  an aspect ratio in 1:2..2:1 (the same pixel sizes for every model).

Pixels become the model's grid the way its processor would: sides rounded to
the patch (DeepSeek-V4.1: patch 14, so 224² is a 16x16 ViT grid) or to
patch x merge (MiniMax M3, Qwen2-VL: 28 px, so 224² is t=1, 16x16 patches),
then shrunk to the model's per-image limit (MiniMax M3 ``max_pixels`` =
672²: its 896² images are 48x48 patches; DeepSeek-V4.1's span cap of
``vision_max_n_token`` tokens). Every grid is checked with the registry's
``is_legal`` and the JSON records it. The other towers (InternVL, Kimi-VL)
take their processor's rule from ``image_traffic``, checked against the
per-item token cap.

What is measured, per workload (all latencies: ``torch.cuda.synchronize()``,
``t0 = perf_counter_ns()``, the call, ``torch.cuda.synchronize()``, ``t1``;
median and IQR over the timed iterations, after warm-up, garbage collector
off):

``eager_ms``
    What vLLM runs without encoder graphs, whole batch:
    ``get_encoder_cudagraph_item_specs`` (for the per-item token counts),
    ``encoder_eager_forward(mm_kwargs)`` (DeepSeek-V4.1: its per-image loop;
    MiniMax M3 / Qwen2-VL: one packed varlen forward), then
    ``postprocess_encoder_output`` over all items (``clone=False``: eager
    output is not overwritten by later calls, so no copies are needed).
    Chosen over ``manager.execute`` without graphs because the manager has
    no "graphs off" mode: a budget ladder that forces eager would split the
    batch into one-item batches, which is not what vLLM's eager path does.
``graph_ms``
    ``manager.execute(mm_kwargs)`` end to end (item specs, packing,
    selection, replay-buffer preparation and host-to-device copies, padded
    copies into the captured buffers, replay, postprocess), for each ladder.
    Timing instrumentation (``enable_timing``) is on during these iterations
    (14 ``perf_counter_ns`` calls, well under 1 us).
``ideal_ms``
    A CUDA graph captured at this batch's exact shape, no padding: the
    mixin's ``prepare_encoder_cudagraph_replay_buffers`` for the whole batch
    gives the real buffers (cloned, so the graph owns them; ``cu_seqlens``
    exact, ending at the real row count); ``max_seqlen``, which replay
    leaves out, is the largest item's input rows in the capture template's
    type; ``encoder_cudagraph_forward`` is warmed up and captured on them
    through the same graph backend as the manager. Only ``graph.replay()``
    is timed. Ladder-independent.
``speedup`` = eager median / graph median; ``efficiency`` = ideal median /
graph median.
``host_overhead_us``
    The manager's own host time per execute from its timing stats
    (``last_overhead_ns`` = total - model methods - ``graph.replay()``),
    median and IQR over the same iterations as ``graph_ms``; the model
    methods' host time (``host_model_us``) and the replay launch
    (``host_replay_us``) are recorded too.
``padding``
    ``get_padding_stats()`` of one execute: ``rows_replayed`` (sum of the
    replayed budgets) and ``rows_used`` (real output rows);
    ``padding_waste = rows_replayed / rows_used - 1`` (the manager's own
    ``waste_fraction`` = wasted / replayed is kept as well). Budgets are in
    output tokens; ``input_padding_waste`` is the same ratio over encoder
    input rows (the captured input buffer's rows per replayed budget against
    the items' ``input_size``), which is what the ViT computes on.
``capture``
    ``get_capture_report()`` per ladder: graphs, seconds, pool bytes,
    reserved / allocated growth.

Ladders: ``default`` is the manager's own (no user budgets: the spec's
minimum budget doubled up to ``max_num_batched_tokens`` = ``max_model_len``
= ``--max-tokens``); ``fine`` passes ``encoder_cudagraph_token_budgets`` =
``round_up(min_budget * 1.25**i, 16)`` up to the same maximum, with
``encoder_cudagraph_max_vision_items_per_batch`` = 16. A log-uniform batch
size wastes on average ``r ln r / (r - 1) - 1`` of its used rows to padding
for a ratio ``r``: 18 % for sqrt(2) (too close to the 20 % target), 11.6 %
for 1.25, 38.6 % for 2. Budgets are multiples of the 16 items per batch so
that the capture dummies, whose rows are ``max_batch_size * ceil(budget /
max_batch_size)`` items' worth, hold exactly the budget; 16 items covers
every workload here in one batch.

The video limit is 0 (images only), so video-capable mixins capture image
dummies.

    PYTHONPATH=. python bench/bench_encoders.py --out bench.json \\
        [--markdown bench.md] [--plot bench.png]
    PYTHONPATH=. python bench/bench_encoders.py --device cpu --size tiny --quick \\
        --out /tmp/bench.json          # CPU smoke (eager-replay backend)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # `python3 bench/bench_encoders.py` as is
    sys.path.insert(0, str(REPO_ROOT))
BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:  # image_traffic, a sibling script
    sys.path.insert(0, str(BENCH_DIR))

import image_traffic  # noqa: E402

from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.graph_backends import (
    CudaGraphBackend,
    EagerReplayGraphBackend,
    GraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from reference_towers.registry import REFERENCE_TOWERS, ReferenceTower
from reference_towers.registry import generated_mixin as load_mixin

SCHEMA_VERSION = 1
SPECS_DIR = REPO_ROOT / "specs"

RESOLUTIONS = (224, 448, 896)
IMAGE_COUNTS = (1, 2, 4, 8, 16)
QUICK_RESOLUTIONS = (224, 448)
QUICK_IMAGE_COUNTS = (1, 8)

MIXED_SIDES = (224, 1344)
MIXED_ASPECT = (0.5, 2.0)
MIXED_IMAGES = (1, 16)
MIXED_BATCHES = 20
QUICK_MIXED_BATCHES = 3
QUICK_MIXED_IMAGES = (1, 4)

DEFAULT_MAX_TOKENS = {"full": 16384, "tiny": 512}
# The finer ladder: four budgets per octave, 2^k * {1, 1.25, 1.5, 1.75} times
# the minimum. Keeping the powers of two matters: vLLM's defer rule closes a
# batch when b(cur) + b(item) < b(cur + item), which on a geometric ladder of
# ratio 1.25 splits batches of equal power-of-two images into one replay per
# image (run 2 measured that: 4 x 448² MiniMax images took 4 replays). With
# 2^k entries such batches merge, and the three steps in between bound the
# rounding of a merged batch to 25%.
FINE_STEPS = (1.0, 1.25, 1.5, 1.75)
FINE_MAX_ITEMS = 64

LADDERS = ("default", "fine")

#: Issue #6 sets its targets on the full towers of the two seed models;
#: every other model is measured the same way and reported, not gated.
TARGET_MODELS = ("deepseek_v41", "minimax_m3")

TARGETS: tuple[dict[str, Any], ...] = (
    {
        "name": "speedup_small_batches",
        "description": "speedup (eager / graph) >= 2x for batches of up to 4 "
        "images of at most 448²",
        "metric": "speedup",
        "op": ">=",
        "threshold": 2.0,
        "gating_ladders": ["default", "fine"],
    },
    {
        "name": "efficiency_uniform",
        "description": "efficiency (ideal / graph) >= 0.85 on every uniform "
        "workload (fine ladder)",
        "metric": "efficiency",
        "op": ">=",
        "threshold": 0.85,
        "gating_ladders": ["fine"],
    },
    {
        "name": "efficiency_mixed",
        "description": "efficiency (sum ideal / sum graph) >= 0.80 on the "
        "mixed workload (fine ladder)",
        "metric": "efficiency",
        "op": ">=",
        "threshold": 0.80,
        "gating_ladders": ["fine"],
    },
    {
        "name": "padding_mixed",
        "description": "padding waste (rows replayed / rows used - 1) <= 20 % "
        "on the mixed workload (fine ladder)",
        "metric": "padding_waste",
        "op": "<=",
        "threshold": 0.20,
        "gating_ladders": ["fine"],
    },
    {
        "name": "host_overhead_8_images",
        "description": "manager host overhead <= 150 us per execute for a "
        "batch of 8 images",
        "metric": "host_overhead_us",
        "op": "<=",
        "threshold": 150.0,
        "gating_ladders": ["default", "fine"],
    },
)


# ---------------------------------------------------------------------------
# Discovery and hosts
# ---------------------------------------------------------------------------


def unusable_reason(stem: str, size: str, *, multi_path: bool = False) -> str | None:
    """Why the benchmarks cannot measure ``stem`` at ``size`` (``None``: they
    can): it needs a spec (and so its generated mixin), a reference tower of
    that size that takes images, a resize rule (``image_traffic``), and one
    encoder path (the benchmarks time
    the ``"default"`` path's graphs) unless ``multi_path`` (the real-traffic
    benchmark times every path)."""
    if not (SPECS_DIR / f"{stem}.yaml").is_file():
        return f"no spec specs/{stem}.yaml"
    tower = REFERENCE_TOWERS.get(stem)
    if tower is None:
        return "no reference tower"
    if size not in tower.sizes:
        return f"no {size} reference tower"
    if "image" not in getattr(tower, "modalities", (tower.modality,)):
        return "the tower takes no images"
    if stem in image_traffic.NO_RESIZE_RULE:
        return image_traffic.NO_RESIZE_RULE[stem]
    if tuple(tower.paths) != ("default",) and not multi_path:
        return (
            f"encoder paths {', '.join(tower.paths)}: the benchmarks measure "
            "the one default path"
        )
    return None


def discover_stems(size: str) -> list[str]:
    """Spec stems the benchmarks can measure at ``size``
    (:func:`unusable_reason`)."""
    return [
        path.stem
        for path in sorted(SPECS_DIR.glob("*.yaml"))
        if unusable_reason(path.stem, size) is None
    ]


def images_only_config() -> MultiModalConfig:
    return MultiModalConfig(limit_per_prompt={"video": 0})


def images_only_host(
    stem: str, size: str, device: torch.device, dtype: torch.dtype
) -> Any:
    """The reference tower of ``stem`` (``size``) on the generated standalone
    mixin, for images only: the host every benchmark measures."""
    return REFERENCE_TOWERS[stem].build_host(
        load_mixin(stem),
        size,
        device=device,
        dtype=dtype,
        multimodal_config=images_only_config(),
    )


def build_vllm_config(
    max_tokens: int, budgets: Sequence[int] = (), max_items: int = 0
) -> VllmConfig:
    return VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=max_tokens),
        model_config=ModelConfig(
            max_model_len=max_tokens, multimodal_config=images_only_config()
        ),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=list(budgets),
            encoder_cudagraph_max_vision_items_per_batch=max_items,
        ),
    )


def fine_ladder(
    min_budget: int, max_budget: int, steps: tuple[float, ...] = FINE_STEPS
) -> list[int]:
    """``min_budget * 2**k * step`` (rounded down) below ``max_budget``, for
    every step, then ``max_budget``."""
    budgets = {max_budget}
    octave = min_budget
    while octave < max_budget:
        for step in steps:
            budget = int(octave * step)
            if budget < max_budget:
                budgets.add(budget)
        octave *= 2
    return sorted(budgets)


# ---------------------------------------------------------------------------
# Pixels -> grids
# ---------------------------------------------------------------------------


def pixels_to_item(
    tower: ReferenceTower[Any],
    size: str,
    height: int,
    width: int,
    max_tokens: int | None = None,
) -> tuple[int, ...]:
    """The legal grid the model's processor would make of a ``height x
    width`` image (see the module docstring). The seed models and Qwen2-VL
    keep this benchmark's own approximation, so that their figures stay
    comparable across runs; the other towers take their processor's rule
    from ``image_traffic``. Tiled towers (InternVL) are given the largest
    ``max_dynamic_patch`` whose images fit ``max_tokens``, as a deployment
    with that budget would set it."""
    config = tower.config(size)  # type: ignore[arg-type]
    if max_tokens is not None and hasattr(config, "max_dynamic_patch"):
        config = internvl_capped(config, max_tokens // tower.view_tokens)
    if not any(hasattr(config, field) for field in ("vision_patch_size", "max_pixels")):
        # The processor's own grid, checked against the per-item cap only:
        # Kimi-VL's processor emits grids of shrunk images that the
        # registry's legality bound leaves out (docs/real-traffic.md).
        item = image_traffic.model_grid(tower.name, config)(height, width)
        if tower.output_tokens(item) > tower.max_output_tokens(size):  # type: ignore[arg-type]
            raise ValueError(
                f"{tower.name}: {item} for {height}x{width} px exceeds the "
                "per-item token cap"
            )
        return item
    if hasattr(config, "vision_patch_size"):  # DeepSeek-V4.1: (n_vit_h, n_vit_w)
        p = config.vision_patch_size
        h, w = max(1, round(height / p)), max(1, round(width / p))
        cap = tower.max_output_tokens(size)  # type: ignore[arg-type]
        while not tower.is_legal((h, w), size):  # type: ignore[arg-type]
            # The processor shrinks images whose span exceeds the cap,
            # keeping the aspect ratio.
            scale = min(0.99, math.sqrt(cap / tower.output_tokens((h, w))))
            h, w = max(1, math.floor(h * scale)), max(1, math.floor(w * scale))
        return (h, w)
    vision = getattr(config, "vision_config", None)
    if hasattr(vision, "merge_kernel_size"):  # Kimi-VL: (h, w) patches
        p = vision.patch_size
        kh, kw = vision.merge_kernel_size
        h = max(kh, round(height / (p * kh)) * kh)
        w = max(kw, round(width / (p * kw)) * kw)
        while not tower.is_legal((h, w), size):  # type: ignore[arg-type]
            # The processor scales an image over its token limit down.
            h, w = max(kh, h - kh) if h >= w else h, max(kw, w - kw) if w > h else w
        return (h, w)
    # Patch + merge towers (MiniMax M3, Qwen2-VL): Qwen2-VL's smart_resize.
    p = config.patch_size
    m = config.spatial_merge_size
    factor = p * m
    hb = max(factor, round(height / factor) * factor)
    wb = max(factor, round(width / factor) * factor)
    max_pixels = config.max_pixels
    if hb * wb > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        hb = max(factor, math.floor(height / beta / factor) * factor)
        wb = max(factor, math.floor(width / beta / factor) * factor)
    item = (1, hb // p, wb // p)
    while not tower.is_legal(item, size):  # type: ignore[arg-type]
        _, h, w = item
        if h >= w and h > m:
            item = (1, h - m, w)
        elif w > m:
            item = (1, h, w - m)
        else:
            raise ValueError(f"no legal grid for {height}x{width} px")
    return item


def internvl_capped(config: Any, max_tiles: int) -> Any:
    """``config`` with ``max_dynamic_patch`` lowered until a grid and its
    thumbnail are at most ``max_tiles`` tiles (at least one tile)."""
    high = config.max_dynamic_patch
    thumbnail = 1 if config.use_thumbnail else 0
    while high > 1 and high + thumbnail > max_tiles:
        high -= 1
    low = min(config.min_dynamic_patch, high)
    return dataclasses.replace(config, min_dynamic_patch=low, max_dynamic_patch=high)


def mixed_pixel_batches(
    seed: int, batches: int, images: tuple[int, int]
) -> list[list[tuple[int, int]]]:
    """Seeded ``(height, width)`` lists: sides in ``MIXED_SIDES``, aspect in
    ``MIXED_ASPECT``, ``images`` images per batch (inclusive range)."""
    rng = random.Random(seed)
    out = []
    for _ in range(batches):
        n = rng.randint(*images)
        sizes = []
        while len(sizes) < n:
            h = rng.randint(*MIXED_SIDES)
            w = rng.randint(*MIXED_SIDES)
            if MIXED_ASPECT[0] <= w / h <= MIXED_ASPECT[1]:
                sizes.append((h, w))
        out.append(sizes)
    return out


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """How often one measurement runs."""

    warmup: int
    min_iters: int
    max_iters: int
    target_s: float
    """Stop after ``min_iters`` once this much time has been spent."""


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(samples)
    if not ordered:
        return {"median": None, "q1": None, "q3": None, "iqr": None, "n": 0}
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "median": statistics.median(ordered),
        "q1": q1,
        "q3": q3,
        "iqr": q3 - q1,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def measure(
    fn: Callable[[], Any],
    sync: Callable[[], None],
    schedule: Schedule,
    after: Callable[[], None] | None = None,
    warmup: int | None = None,
) -> list[float]:
    """Milliseconds per call of ``fn``, device synchronised before and after
    each call; ``after`` runs after each timed call (outside the timing)."""
    for _ in range(schedule.warmup if warmup is None else warmup):
        fn()
        sync()
    samples: list[float] = []
    # No collection pass here (one costs 0.1 s or more with torch loaded);
    # turning the collector off is enough to keep its pauses out of timing.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        while len(samples) < schedule.max_iters:
            sync()
            t0 = time.perf_counter_ns()
            fn()
            sync()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
            if after is not None:
                after()
            if (
                len(samples) >= schedule.min_iters
                and time.perf_counter() - start >= schedule.target_s
            ):
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


# ---------------------------------------------------------------------------
# The three ways of running a batch
# ---------------------------------------------------------------------------


def eager_call(
    host: Any, mm_kwargs: dict[str, Any], paths: Sequence[str] = ("default",)
) -> tuple[Any, list[Any]]:
    """vLLM's path without encoder graphs: the whole batch eagerly, on every
    one of ``paths`` that has rows (as the manager skips a path a batch
    leaves out), then the mixin's postprocess. Returns (raw encoder output:
    the tensor of the one default path, else a dict by path; per-item
    outputs)."""
    specs = host.get_encoder_cudagraph_item_specs(mm_kwargs)
    per_item = [spec.output_tokens for spec in specs]
    raw = {
        path: host.encoder_eager_forward(mm_kwargs, path=path)
        for path in paths
        if path == "default" or any(s.get_path_output_tokens(path) for s in specs)
    }
    dest: list[Any] = [None] * len(specs)
    host.postprocess_encoder_output(
        raw,
        list(range(len(specs))),
        per_item,
        dest,
        clone=False,
        batch_mm_kwargs=mm_kwargs,
    )
    return (raw["default"] if tuple(paths) == ("default",) else raw), dest


@dataclass
class IdealGraph:
    graph: Any
    inputs: dict[str, Any]
    output: torch.Tensor
    capture_s: float


def capture_ideal(
    host: Any,
    backend: GraphBackend,
    mm_kwargs: dict[str, Any],
    template: dict[str, Any],
    path: str = "default",
) -> IdealGraph:
    """A graph of ``encoder_cudagraph_forward`` of ``path`` on this batch's
    own, unpadded buffers (see ``ideal_ms`` in the module docstring);
    ``template``: that path's capture inputs (the buffers a path's graph
    holds, of the config's ``buffer_keys``)."""
    config = host.get_encoder_cudagraph_config()
    specs = host.get_encoder_cudagraph_item_specs(mm_kwargs)
    replay = host.prepare_encoder_cudagraph_replay_buffers(
        mm_kwargs, len(specs), 0, path
    ).values
    inputs: dict[str, Any] = {}
    keys = config.buffer_keys
    if path != "default":
        # Each path captures its own subset of the buffer keys.
        keys = [key for key in keys if key in template]
    for key in keys:
        value = replay.get(key)
        tmpl = template.get(key)
        if value is None and tmpl is None and key in template:
            # An optional buffer, None under this backend (as captured).
            inputs[key] = None
            continue
        if isinstance(value, torch.Tensor):
            # A copy the graph owns, in the captured buffer's dtype and device:
            # the manager's replay copy converts the same way (MiniMax M3's
            # fp32 pixels land in its bf16 buffer, for example).
            if isinstance(tmpl, torch.Tensor):
                inputs[key] = value.to(tmpl.device, tmpl.dtype, copy=True)
            else:
                inputs[key] = value.clone()
            continue
        if "max_seqlen" in key and (
            isinstance(tmpl, int) or (isinstance(tmpl, torch.Tensor) and tmpl.ndim == 0)
        ):
            exact = max(spec.input_size for spec in specs)
            inputs[key] = (
                torch.tensor(exact, dtype=tmpl.dtype, device=tmpl.device)
                if isinstance(tmpl, torch.Tensor)
                else exact
            )
            continue
        raise ValueError(
            f"ideal capture: the replay buffers have no {key!r} and its exact "
            "value is unknown"
        )
    forward = functools.partial(host.encoder_cudagraph_forward, path=path)
    start = time.perf_counter()
    # Warm-up as the manager does: outside the graph, on the capture stream.
    with backend.capture_scope():
        warm = forward({**inputs})
    output = torch.empty_like(warm)
    del warm
    graph = backend.capture(forward, inputs, output, backend.graph_pool_handle())
    backend.synchronize()
    return IdealGraph(graph, inputs, output, time.perf_counter() - start)


def max_rel_diff(out: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> Any:
    """``max |out - ref| / max(1, max |ref|)`` over items (``None`` on a
    shape mismatch)."""
    worst = 0.0
    for a, b in zip(out, ref, strict=True):
        if a.shape != b.shape:
            return None
        if a.numel() == 0:
            continue
        b = b.float()
        scale = max(1.0, b.abs().max().item())
        worst = max(worst, (a.float() - b).abs().max().item() / scale)
    return worst


# ---------------------------------------------------------------------------
# One model
# ---------------------------------------------------------------------------


@dataclass
class Workload:
    kind: str  # "uniform" | "mixed"
    pixels: list[tuple[int, int]]
    items: list[tuple[int, ...]]
    mm_kwargs: dict[str, Any]
    resolution: int | None = None
    index: int | None = None


def graph_input_rows(
    manager: EncoderCudaGraphManager, budget: int, path: str = "default"
) -> int | None:
    """Rows of the first row buffer captured for ``path``'s ``budget`` (the
    encoder's input: patches / pixel values; views for fixed-size views)."""
    meta = manager.budget_graphs.get(path, {}).get(budget)
    if meta is None:
        return None
    for key in manager.config.buffer_keys:
        buf = meta.input_buffers.get(key)
        if isinstance(buf, torch.Tensor) and buf.ndim > 0:
            return int(buf.shape[0])
    return None


def padding_summary(
    manager: EncoderCudaGraphManager, input_rows_used: int, path: str = "default"
) -> dict[str, Any]:
    """The padding of ``path``'s replays since the manager's last reset, in
    budget rows and in the rows of the graphs' first input buffer (of which
    the batch used ``input_rows_used``)."""
    stats = manager.get_padding_stats()["paths"].get(path, {})
    budgets = {int(b): e["replays"] for b, e in stats.get("budgets", {}).items()}
    input_replayed = 0
    for budget, replays in budgets.items():
        rows = graph_input_rows(manager, budget, path)
        if rows is None:
            input_replayed = None
            break
        input_replayed += rows * replays
    eager_batches = stats.get("eager_batches", 0)
    replayed, used = stats.get("rows_replayed", 0), stats.get("rows_used", 0)
    return {
        "replays": stats.get("replays", 0),
        "budgets_replayed": budgets,
        "rows_replayed": replayed,
        "rows_used": used,
        "padding_waste": (replayed / used - 1.0) if used else None,
        "waste_fraction": stats.get("waste_fraction", 0.0),
        "eager_batches": eager_batches,
        "input_rows_replayed": input_replayed,
        "input_rows_used": input_rows_used,
        "input_padding_waste": (
            input_replayed / input_rows_used - 1.0
            if input_replayed is not None and input_rows_used and not eager_batches
            else None
        ),
    }


class ModelBench:
    """Every measurement of one spec stem."""

    def __init__(self, stem: str, args: argparse.Namespace, ctx: dict[str, Any]):
        self.stem = stem
        self.args = args
        self.device: torch.device = ctx["device"]
        self.dtype: torch.dtype = ctx["dtype"]
        self.sync: Callable[[], None] = ctx["sync"]
        self.make_backend: Callable[[], GraphBackend] = ctx["make_backend"]
        self.tower = REFERENCE_TOWERS[stem]
        self.log = ctx["log"]
        self.started: float = ctx["started"]
        self._warned_late = False

    def over_time(self) -> bool:
        """Past ``--soft-limit-s``: the remaining measurements use the short
        ``schedule_late`` so that the whole run stays near its time limit."""
        late = time.perf_counter() - self.started > self.args.soft_limit_s
        if late and not self._warned_late:
            self._warned_late = True
            self.log(
                f"past the soft limit of {self.args.soft_limit_s:.0f}s: "
                "shortening the remaining measurements"
            )
        return late

    def run(self) -> dict[str, Any]:
        args = self.args
        t_model = time.perf_counter()
        mixin = load_mixin(self.stem)
        t0 = time.perf_counter()
        host = self.tower.build_host(
            mixin,
            args.size,
            device=self.device,
            dtype=self.dtype,
            multimodal_config=images_only_config(),
        )
        build_s = time.perf_counter() - t0
        n_params = sum(p.numel() for p in host.parameters())
        self.log(
            f"[{self.stem}] built {mixin.__name__} on "
            f"{self.tower.host_cls.__name__} ({n_params / 1e6:.1f}M "
            f"params) in {build_s:.1f}s"
        )
        result: dict[str, Any] = {
            "spec": self.stem,
            "mixin": mixin.__name__,
            "host": self.tower.host_cls.__name__,
            "size": args.size,
            "params": n_params,
            "build_s": build_s,
        }
        managers: dict[str, EncoderCudaGraphManager] = {}
        try:
            with torch.inference_mode():
                self._run(host, result, managers)
        finally:
            for manager in managers.values():
                manager.clear()
            managers.clear()
            del host
            gc.collect()
            self.make_backend().release_cached_memory()
        result["elapsed_s"] = time.perf_counter() - t_model
        if self.device.type == "cuda":
            result["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(
                self.device
            )
            # What is left once the model is gone (should be ~0).
            result["memory_allocated_after_bytes"] = torch.cuda.memory_allocated(
                self.device
            )
            torch.cuda.reset_peak_memory_stats(self.device)
        return result

    # -- phases -----------------------------------------------------------

    def _run(
        self,
        host: Any,
        result: dict[str, Any],
        managers: dict[str, EncoderCudaGraphManager],
    ) -> None:
        args = self.args
        tower = self.tower
        backend = self.make_backend()

        # Ladders: the manager's default, and the finer one.
        default_cfg = build_vllm_config(args.max_tokens)
        min_budget, max_budget = host.get_encoder_cudagraph_budget_range(default_cfg)
        fine = fine_ladder(min_budget, max_budget)
        configs = {
            "default": default_cfg,
            "fine": build_vllm_config(args.max_tokens, fine, args.fine_items),
        }
        result["budget_range"] = [min_budget, max_budget]
        result["ladders"] = {}
        for name, cfg in configs.items():
            compilation = cfg.compilation_config
            manager = EncoderCudaGraphManager(
                cfg, self.device, self.dtype, host, graph_backend=self.make_backend()
            )
            manager.capture()
            managers[name] = manager
            report = manager.get_capture_report()
            assert report is not None
            result["ladders"][name] = {
                "budgets": list(manager.token_budgets),
                "max_batch_size": manager.max_batch_size,
                "user_budgets": list(compilation.encoder_cudagraph_token_budgets),
                "user_max_items": (
                    compilation.encoder_cudagraph_max_vision_items_per_batch
                ),
                "capture": {
                    "backend": report.backend,
                    "num_graphs": report.num_graphs,
                    "seconds": report.seconds,
                    "pool_bytes": report.pool_bytes,
                    "reserved_bytes_delta": report.reserved_bytes_delta,
                    "allocated_bytes_delta": report.allocated_bytes_delta,
                },
            }
            self.log(
                f"[{self.stem}] ladder {name}: {report.num_graphs} graphs "
                f"{manager.token_budgets} max_batch_size={manager.max_batch_size} "
                f"captured in {report.seconds:.1f}s, pool "
                f"{_mib(report.pool_bytes)}"
            )
            manager.enable_timing()

        # The capture template tells the ideal graph what max_seqlen looks like.
        template = host.prepare_encoder_cudagraph_capture_inputs(
            min_budget, 1, 0, self.device, self.dtype, "default", ()
        ).values

        # Workloads.
        resolutions = QUICK_RESOLUTIONS if args.quick else RESOLUTIONS
        counts = QUICK_IMAGE_COUNTS if args.quick else IMAGE_COUNTS
        result["grids"] = {
            str(res): list(pixels_to_item(tower, args.size, res, res, max_budget))
            for res in resolutions
        }
        result["uniform"] = []
        seed = args.seed
        for res in resolutions:
            item = tuple(result["grids"][str(res)])
            for n in counts:
                seed += 1
                workload = Workload(
                    kind="uniform",
                    pixels=[(res, res)] * n,
                    items=[item] * n,
                    mm_kwargs=tower.make_mm_kwargs(
                        host, [item] * n, self.device, seed=seed
                    ),
                    resolution=res,
                )
                result["uniform"].append(
                    self._workload(host, backend, managers, workload, template)
                )
                del workload

        pixel_batches = mixed_pixel_batches(
            args.seed,
            args.mixed_batches,
            QUICK_MIXED_IMAGES if args.quick else MIXED_IMAGES,
        )
        mixed_rows = []
        for i, pixels in enumerate(pixel_batches):
            items = [
                pixels_to_item(tower, args.size, h, w, max_budget) for h, w in pixels
            ]
            workload = Workload(
                kind="mixed",
                pixels=pixels,
                items=items,
                mm_kwargs=tower.make_mm_kwargs(
                    host, items, self.device, seed=args.seed + 1000 + i
                ),
                index=i,
            )
            mixed_rows.append(
                self._workload(host, backend, managers, workload, template)
            )
            del workload
        result["mixed"] = {
            "batches": mixed_rows,
            "summary": {
                ladder: summarize_mixed(mixed_rows, ladder) for ladder in LADDERS
            },
        }
        for ladder, s in result["mixed"]["summary"].items():
            self.log(
                f"[{self.stem}] mixed {ladder}: speedup {_fmt(s['speedup'])}x "
                f"efficiency {_fmt(s['efficiency'])} padding waste "
                f"{_pct(s['padding_waste'])} overhead "
                f"{_fmt(s['host_overhead_us']['median'], 1)} us"
            )

    def _workload(
        self,
        host: Any,
        backend: GraphBackend,
        managers: dict[str, EncoderCudaGraphManager],
        workload: Workload,
        template: dict[str, Any],
    ) -> dict[str, Any]:
        args = self.args
        tower = self.tower
        kw = workload.mm_kwargs
        uniform = workload.kind == "uniform"
        schedule = args.schedule_uniform if uniform else args.schedule_mixed
        if self.over_time():
            schedule = args.schedule_late
        n = len(workload.items)
        input_rows = sum(tower.input_size(item) for item in workload.items)
        row: dict[str, Any] = {
            "kind": workload.kind,
            "images": n,
            "resolution": workload.resolution,
            "index": workload.index,
            "pixels": [list(p) for p in workload.pixels],
            "items": [list(item) for item in workload.items],
            "output_tokens": sum(tower.output_tokens(item) for item in workload.items),
            # What the budgets count (path_output_tokens when the spec sets
            # budget_tokens, e.g. DeepSeek's aligner rows): padding is
            # measured against these.
            "budget_tokens": sum(
                spec.get_path_output_tokens("default")
                for spec in host.get_encoder_cudagraph_item_specs(kw)
            ),
            "input_rows": input_rows,
        }

        # Eager, with one untimed call kept as the reference.
        ref_raw, ref_items = eager_call(host, kw)
        row["eager_ms"] = summarize(
            measure(lambda: eager_call(host, kw), self.sync, schedule)
        )

        # Ideal: exact-shape graph, replay only.
        ideal = capture_ideal(host, backend, kw, template)
        ideal.graph.replay()
        self.sync()
        row["ideal_capture_s"] = ideal.capture_s
        row["check"] = {"ideal_vs_eager": max_rel_diff([ideal.output], [ref_raw])}
        row["ideal_ms"] = summarize(measure(ideal.graph.replay, self.sync, schedule))
        del ideal
        if self.device.type == "cuda":
            # Freed by reference counting (no cycles): return its pool.
            torch.cuda.empty_cache()

        # The manager, per ladder.
        row["graph"] = {}
        for ladder, manager in managers.items():
            manager.reset_padding_stats()
            outputs = manager.execute(kw)  # first warm-up: padding of one execute
            self.sync()
            padding = padding_summary(manager, input_rows)
            check = max_rel_diff(outputs, ref_items)
            del outputs
            graph_ms, samples = self._measure_graph(manager, kw, schedule)
            entry = {
                "graph_ms": summarize(graph_ms),
                "host_overhead_us": summarize(samples["overhead"]),
                "host_model_us": summarize(samples["model"]),
                "host_replay_us": summarize(samples["replay"]),
                "host_total_us": summarize(samples["total"]),
                "padding": padding,
                "check_vs_eager": check,
            }
            entry["speedup"] = ratio(
                row["eager_ms"]["median"], entry["graph_ms"]["median"]
            )
            entry["efficiency"] = ratio(
                row["ideal_ms"]["median"], entry["graph_ms"]["median"]
            )
            row["graph"][ladder] = entry
        del ref_raw, ref_items

        label = (
            f"{workload.resolution}² x{n:<2}"
            if uniform
            else f"mixed#{workload.index:<2} x{n:<2}"
        )
        parts = [
            (
                f"[{self.stem}] {label} eager {_fmt(row['eager_ms']['median'])} "
                f"ms ideal {_fmt(row['ideal_ms']['median'])} ms"
            )
        ]
        for ladder, entry in row["graph"].items():
            parts.append(
                f"{ladder}: graph {_fmt(entry['graph_ms']['median'])} ms "
                f"x{_fmt(entry['speedup'])} eff {_fmt(entry['efficiency'])} "
                f"waste {_pct(entry['padding']['padding_waste'])} "
                f"ovh {_fmt(entry['host_overhead_us']['median'], 1)} us"
            )
        self.log(" | ".join(parts))
        return row

    def _measure_graph(
        self,
        manager: EncoderCudaGraphManager,
        mm_kwargs: dict[str, Any],
        schedule: Schedule,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """``graph_ms`` samples, and the manager's host-time split (us) of
        the same executes."""
        samples: dict[str, list[float]] = {
            k: [] for k in ("overhead", "model", "replay", "total")
        }

        def record() -> None:
            timing = manager.timing
            assert timing is not None
            samples["overhead"].append(timing.last_overhead_ns / 1e3)
            samples["model"].append(timing.last_model_ns / 1e3)
            samples["replay"].append(timing.last_replay_ns / 1e3)
            samples["total"].append(timing.last_total_ns / 1e3)

        graph_ms = measure(
            lambda: manager.execute(mm_kwargs),
            self.sync,
            schedule,
            after=record,
            # The padding execute before this was the first warm-up call.
            warmup=max(0, schedule.warmup - 1),
        )
        return graph_ms, samples


def summarize_mixed(rows: list[dict[str, Any]], ladder: str) -> dict[str, Any]:
    """Totals over the mixed batches: sums of per-batch medians, and the
    per-batch ratios' median / IQR."""
    eager = sum(r["eager_ms"]["median"] for r in rows)
    ideal = sum(r["ideal_ms"]["median"] for r in rows)
    graph = sum(r["graph"][ladder]["graph_ms"]["median"] for r in rows)
    replayed = sum(r["graph"][ladder]["padding"]["rows_replayed"] for r in rows)
    used = sum(r["graph"][ladder]["padding"]["rows_used"] for r in rows)
    in_replayed = [r["graph"][ladder]["padding"]["input_rows_replayed"] for r in rows]
    in_used = sum(r["input_rows"] for r in rows)
    return {
        "batches": len(rows),
        "images": sum(r["images"] for r in rows),
        "eager_ms_total": eager,
        "ideal_ms_total": ideal,
        "graph_ms_total": graph,
        "speedup": ratio(eager, graph),
        "efficiency": ratio(ideal, graph),
        "speedup_per_batch": summarize([r["graph"][ladder]["speedup"] for r in rows]),
        "efficiency_per_batch": summarize(
            [r["graph"][ladder]["efficiency"] for r in rows]
        ),
        "rows_replayed": replayed,
        "rows_used": used,
        "padding_waste": replayed / used - 1.0 if used else None,
        "input_padding_waste": (
            sum(in_replayed) / in_used - 1.0
            if in_used and all(v is not None for v in in_replayed)
            else None
        ),
        "eager_batches": sum(
            r["graph"][ladder]["padding"]["eager_batches"] for r in rows
        ),
        "host_overhead_us": summarize(
            [r["graph"][ladder]["host_overhead_us"]["median"] for r in rows]
        ),
    }


# ---------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------


def _target_values(
    target: dict[str, Any], models: dict[str, Any], ladder: str
) -> list[tuple[float | None, dict[str, Any]]]:
    """(value, where) pairs a target checks on one ladder."""
    name = target["name"]
    values: list[tuple[float | None, dict[str, Any]]] = []
    for stem, model in models.items():
        if name == "efficiency_mixed" or name == "padding_mixed":
            summary = model["mixed"]["summary"][ladder]
            values.append(
                (summary[target["metric"]], {"model": stem, "workload": "mixed"})
            )
            continue
        for row in model["uniform"]:
            res, n = row["resolution"], row["images"]
            if name == "speedup_small_batches" and not (n <= 4 and res <= 448):
                continue
            if name == "host_overhead_8_images" and n != 8:
                continue
            entry = row["graph"][ladder]
            value = (
                entry["host_overhead_us"]["median"]
                if target["metric"] == "host_overhead_us"
                else entry[target["metric"]]
            )
            values.append((value, {"model": stem, "resolution": res, "images": n}))
    return values


def evaluate_targets(models: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target on every ladder; a target passes when every value it
    checks on its gating ladders meets the threshold (``None`` when nothing
    was measured). Only :data:`TARGET_MODELS` gate (all models when none of
    them was measured); the others are evaluated alike under ``info``."""
    gated = {k: v for k, v in models.items() if k in TARGET_MODELS} or models
    others = {k: v for k, v in models.items() if k not in gated}
    out = _evaluate(gated)
    if others:
        for entry, info in zip(out, _evaluate(others), strict=True):
            entry["info_models"] = {
                "models": sorted(others),
                "per_ladder": info["per_ladder"],
                "passed": info["passed"],
            }
    return out


def _evaluate(models: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for target in TARGETS:
        threshold = target["threshold"]
        lower_is_better = target["op"] == "<="

        def meets(value: float, lower: bool = lower_is_better, t: float = threshold):
            return value <= t if lower else value >= t

        per_ladder = {}
        for ladder in LADDERS:
            values = _target_values(target, models, ladder)
            known = [(v, w) for v, w in values if v is not None]
            if not known:
                per_ladder[ladder] = {"checked": 0, "passed": None, "worst": None}
                continue
            pick = max if lower_is_better else min
            worst_v, worst_w = pick(known, key=lambda vw: vw[0])
            failing = [{"value": v, **w} for v, w in known if not meets(v)]
            per_ladder[ladder] = {
                "checked": len(values),
                # A value that could not be computed counts as a miss.
                "passed": not failing and len(known) == len(values),
                "worst": {"value": worst_v, **worst_w},
                "failing": failing,
            }
        gating = [per_ladder[name]["passed"] for name in target["gating_ladders"]]
        out.append(
            {
                **target,
                "per_ladder": per_ladder,
                "passed": None if any(g is None for g in gating) else all(gating),
            }
        )
    return out


# ---------------------------------------------------------------------------
# Environment and entry point
# ---------------------------------------------------------------------------


def environment(device: torch.device, backend: GraphBackend) -> dict[str, Any]:
    from encoder_cudagraph_runtime.varlen_attention import flash_varlen_kernel_name

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device_type": device.type,
        "graph_backend": backend.name,
        "cpu_count": os.cpu_count(),
        # Resolving it imports torch's varlen module (seconds); only the GPU
        # path uses it.
        "flash_varlen_kernel": (
            flash_varlen_kernel_name() if device.type == "cuda" else None
        ),
    }
    try:
        import flash_attn  # type: ignore[import-not-found]

        env["flash_attn"] = getattr(flash_attn, "__version__", "unknown")
    except ImportError:
        env["flash_attn"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device"] = torch.cuda.get_device_name(device)
        env["device_memory_bytes"] = props.total_memory
        env["capability"] = f"{props.major}.{props.minor}"
        try:
            env["driver"] = (
                subprocess.run(
                    [
                        "nvidia-smi",
                        "--query-gpu=driver_version",
                        "--format=csv,noheader",
                    ],
                    capture_output=True,
                    check=False,
                    text=True,
                    timeout=10,
                )
                .stdout.split("\n")[0]
                .strip()
                or None
            )
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
    else:
        env["device"] = platform.processor() or "cpu"
    try:
        env["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                cwd=REPO_ROOT,
                capture_output=True,
                check=False,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    return env


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.0f} MiB"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output path")
    parser.add_argument("--markdown", type=Path, help="also write a markdown report")
    parser.add_argument("--plot", type=Path, help="also write a PNG plot")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few workloads and iterations (CPU smoke / CI)",
    )
    parser.add_argument(
        "--models", help="comma-separated spec stems (default: every one found)"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="max_num_batched_tokens = max_model_len (default 16384 full, 512 tiny)",
    )
    parser.add_argument("--fine-items", type=int, default=FINE_MAX_ITEMS)
    parser.add_argument("--mixed-batches", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, help="warm-up calls per measurement")
    parser.add_argument("--min-iters", type=int, help="timed calls at least")
    parser.add_argument("--max-iters", type=int, help="timed calls at most")
    parser.add_argument(
        "--target-s", type=float, help="time per measurement before stopping"
    )
    parser.add_argument(
        "--soft-limit-s",
        type=float,
        default=330.0,
        help="after this many seconds, measure with warm-up 1 and 3 timed calls",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a target is missed"
    )
    args = parser.parse_args(argv)
    if args.max_tokens is None:
        args.max_tokens = DEFAULT_MAX_TOKENS[args.size]
    if args.mixed_batches is None:
        args.mixed_batches = QUICK_MIXED_BATCHES if args.quick else MIXED_BATCHES
    if args.quick:
        # Each measurement is preceded by an untimed call anyway (the eager
        # reference, the ideal capture's check replay, the padding execute).
        uniform = Schedule(warmup=0, min_iters=2, max_iters=2, target_s=0.0)
        mixed = uniform
    else:
        uniform = Schedule(warmup=2, min_iters=5, max_iters=30, target_s=0.15)
        mixed = Schedule(warmup=1, min_iters=3, max_iters=10, target_s=0.05)

    def override(s: Schedule) -> Schedule:
        return Schedule(
            warmup=s.warmup if args.warmup is None else args.warmup,
            min_iters=s.min_iters if args.min_iters is None else args.min_iters,
            max_iters=max(
                s.max_iters if args.max_iters is None else args.max_iters,
                s.min_iters if args.min_iters is None else args.min_iters,
            ),
            target_s=s.target_s if args.target_s is None else args.target_s,
        )

    args.schedule_uniform = override(uniform)
    args.schedule_mixed = override(mixed)
    args.schedule_late = Schedule(warmup=1, min_iters=3, max_iters=3, target_s=0.0)
    return args


def run(
    args: argparse.Namespace,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Benchmark every model; ``checkpoint`` gets the partial result after
    each one (a crash or time-out later still leaves those numbers)."""
    started = time.perf_counter()
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available()
    )
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if use_cuda
        else (torch.device("cpu"))
    )
    dtype = torch.bfloat16 if use_cuda else torch.float32

    def make_backend() -> GraphBackend:
        return CudaGraphBackend(device) if use_cuda else EagerReplayGraphBackend()

    sync = (lambda: torch.cuda.synchronize(device)) if use_cuda else (lambda: None)

    def log(line: str) -> None:
        print(
            f"[{time.perf_counter() - started:6.1f}s] {line}",
            file=sys.stderr,
            flush=True,
        )

    stems = discover_stems(args.size)
    if args.models:
        wanted = [s.strip() for s in args.models.split(",") if s.strip()]
        unknown = sorted(set(wanted) - set(stems))
        if unknown:
            raise SystemExit(
                f"unknown or unusable spec stems: {unknown} (found {stems})"
            )
        stems = wanted
    backend = make_backend()
    result: dict[str, Any] = {
        "benchmark": "encoder_graphs",
        "schema_version": SCHEMA_VERSION,
        "created_unix": time.time(),
        "environment": environment(device, backend),
        "params": {
            "size": args.size,
            "dtype": str(dtype),
            "quick": args.quick,
            "stems": stems,
            "resolutions": list(QUICK_RESOLUTIONS if args.quick else RESOLUTIONS),
            "image_counts": list(QUICK_IMAGE_COUNTS if args.quick else IMAGE_COUNTS),
            "mixed": {
                "batches": args.mixed_batches,
                "images_per_batch": list(
                    QUICK_MIXED_IMAGES if args.quick else MIXED_IMAGES
                ),
                "sides_px": list(MIXED_SIDES),
                "aspect": list(MIXED_ASPECT),
                "seed": args.seed,
            },
            "max_num_batched_tokens": args.max_tokens,
            "max_model_len": args.max_tokens,
            "fine_ladder": {"steps": list(FINE_STEPS), "max_items": args.fine_items},
            "multimodal_limit_per_prompt": {"video": 0},
            "schedule": {
                "uniform": dataclasses.asdict(args.schedule_uniform),
                "mixed": dataclasses.asdict(args.schedule_mixed),
                "late": dataclasses.asdict(args.schedule_late),
                "soft_limit_s": args.soft_limit_s,
            },
        },
        "methodology": METHODOLOGY,
        "models": {},
    }
    log(
        f"models {stems} on {result['environment']['device']} "
        f"({backend.name}, {dtype}), max tokens {args.max_tokens}"
    )
    ctx = {
        "started": started,
        "device": device,
        "dtype": dtype,
        "sync": sync,
        "make_backend": make_backend,
        "log": log,
    }
    result["errors"] = {}
    for stem in stems:
        try:
            result["models"][stem] = ModelBench(stem, args, ctx).run()
        except Exception:  # noqa: BLE001 - keep the other models' numbers
            error = traceback.format_exc()
            log(f"[{stem}] FAILED:\n{error}")
            result["errors"][stem] = error
        # Outside the handler, whose traceback still holds the model's frames.
        gc.collect()
        make_backend().release_cached_memory()
        result["elapsed_s"] = time.perf_counter() - started
        if checkpoint is not None:
            checkpoint(result)
    result["targets"] = evaluate_targets(result["models"])
    gating = [t["passed"] for t in result["targets"] if t["passed"] is not None]
    result["all_targets_passed"] = bool(gating) and all(gating)
    result["complete"] = not result["errors"]
    result["elapsed_s"] = time.perf_counter() - started
    return result


METHODOLOGY = {
    "timing": "torch.cuda.synchronize(); t0 = perf_counter_ns(); call; "
    "torch.cuda.synchronize(); t1 (no synchronize on CPU). Median and IQR "
    "(inclusive quartiles) over timed iterations after warm-up, gc disabled.",
    "eager_ms": "get_encoder_cudagraph_item_specs + encoder_eager_forward(whole "
    "batch) + postprocess_encoder_output(all items, clone=False): vLLM without "
    "encoder graphs (DeepSeek-V4.1's eager forward is its per-image loop).",
    "graph_ms": "manager.execute(mm_kwargs) end to end, host preparation and "
    "postprocess included; manager timing instrumentation on.",
    "ideal_ms": "graph.replay() of encoder_cudagraph_forward captured on this "
    "batch's own replay buffers (cloned, unpadded, exact cu_seqlens; max_seqlen "
    "= largest item's input rows), same graph backend as the manager.",
    "speedup": "eager_ms median / graph_ms median",
    "efficiency": "ideal_ms median / graph_ms median",
    "host_overhead_us": "manager timing stats last_overhead_ns (execute total - "
    "model methods - graph.replay()) per execute, over the graph_ms iterations",
    "padding_waste": "get_padding_stats() of one execute: rows_replayed / "
    "rows_used - 1 (output-token budgets); input_padding_waste: captured "
    "input-buffer rows of the replayed budgets / items' input_size - 1",
    "mixed": "sums of per-batch medians (speedup, efficiency) and of rows "
    "(padding) over all mixed batches",
    "check": "max |out - ref| / max(1, max |ref|) against the eager outputs "
    "(ideal: raw encoder rows; graph: per-item results); informational",
}


def print_summary(result: dict[str, Any]) -> None:
    lines = [
        (
            f"encoder graph benchmark: {len(result['models'])} models in "
            f"{result['elapsed_s']:.1f}s"
        )
    ]
    for stem in result["errors"]:
        lines.append(f"  ERROR {stem}: no numbers (see the traceback above)")
    for target in result["targets"]:
        status = {True: "PASS", False: "FAIL", None: "n/a "}[target["passed"]]
        details = []
        for ladder, r in target["per_ladder"].items():
            worst = r["worst"]
            if worst is None:
                details.append(f"{ladder}: n/a")
                continue
            where = ", ".join(f"{k}={v}" for k, v in worst.items() if k != "value")
            gate = "" if ladder in target["gating_ladders"] else " (info)"
            verdict = "pass" if r["passed"] else "fail"
            details.append(
                f"{ladder}{gate}: {verdict}, worst {worst['value']:.3g} ({where})"
            )
        lines.append(f"  {status} {target['description']}: " + "; ".join(details))
    print("\n".join(lines), file=sys.stderr)


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args, checkpoint=lambda partial: write_json(args.out, partial))
    write_json(args.out, result)
    print_summary(result)
    if args.markdown or args.plot:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import render_results

        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(render_results.render_markdown(result))
        if args.plot:
            try:
                render_results.render_plot(result, args.plot)
            except ImportError as exc:
                print(f"no plot: {exc}", file=sys.stderr)
    if result["errors"]:
        return 2
    if args.strict and not result["all_targets_passed"]:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
