"""Equivalence driver: a generated mixin, captured and replayed by the
runtime manager, must give for every image what the tower's own per-image
eager forward gives, for every batch shape the manager can form.

This is an importable helper, not a test module (pytest collects only
``test_*.py``). The CPU suite (``tests/equivalence/``) and the GPU suite
(``tests/gpu/test_equivalence_gpu.py``) both call :func:`run_equivalence`::

    summary = run_equivalence(
        "minimax_m3", "tiny", device="cpu", dtype=torch.float32,
        graph_backend=EagerReplayGraphBackend(), num_batches=30, tolerance=1e-4,
    )
    assert_equivalent(summary)

What one run does, for one spec stem:

1. imports ``generated.standalone.<stem>``, takes the mixin (the one class
   defined in that module) and builds the host with
   ``REFERENCE_TOWERS[stem].build_host(mixin, size, ...)``;
2. builds a :class:`VllmConfig` whose budget ladder is the manager's
   default, derived from the mixin's own ``get_encoder_cudagraph_budget_range``
   with ``max_num_batched_tokens = max_model_len = DEFAULT_MAX_TOKENS[size]``
   (tiny 512, full 8192), creates an :class:`EncoderCudaGraphManager` and
   captures;
3. draws seeded batches of several kinds (:data:`BATCH_KINDS`): random
   items (1..``max_batch_size``), the smallest legal grid, items whose budget
   tokens (what the budgets count: output tokens, or the spec's
   ``budget_tokens``) sit exactly on a budget boundary (``b - 1``, ``b``,
   ``b + 1`` through ``budget_item(budget_tokens=...)``), batches whose
   *total* budget tokens sit on every budget boundary, more items than ``max_batch_size`` (the
   manager splits), and items above the largest budget (eager fallback).
   Towers that take several modalities (``tower.modalities``, e.g. Qwen2-VL
   images and videos) get batches of each, one modality per ``execute``.
   Towers with several encoder paths (``tower.paths``, Step3-VL's global
   views and crops) are planned per path: boundary batches sit on each
   path's budgets (``tower.path_tokens``), eager items exceed some path's
   largest budget, and the budgets to replay are those of each path that a
   legal batch can reach (``PhasePlan.coverage``);
4. runs ``manager.execute`` and compares every item with
   ``REFERENCE_TOWERS[stem].reference_outputs(host, mm_kwargs)``:
   same shape, dtype and device, finite, and
   ``max|out - ref| <= tolerance * max(1, max|ref|)``; it also checks that
   every graph output buffer is finite after each execute, that results of
   the previous execute are not overwritten by later replays, and that
   hits + misses count what vLLM's manager counts (each item once per
   replayed path, once if it replayed none);
5. returns a JSON-serialisable summary (batches, items, graph hits/misses,
   eager fallbacks, worst abs/rel error, max padding waste, failures);
   :func:`assert_equivalent` turns it into a pass/fail with coverage checks.

Planning is separate from running (:func:`plan_phases`,
:func:`plan_batches`, :func:`predict_packing`): on a meta-device host the
exact batches of a run, and how the manager's packing rules will split them,
are known without a model, so the CPU suite can check what the GPU suite will
cover.

Eager fallback needs an item larger than the largest budget. With the
default ladder almost no *legal* item is: the per-item caps (tiny: 64
output tokens, 549 DeepSeek-V4.1 patches; full: 9189 DeepSeek-V4.1 patches,
576 MiniMax M3 output tokens) are mostly below the largest budget (512 /
8192). The run therefore adds an ``eager_ladder`` phase: a second manager
configured as a user would, with ``encoder_cudagraph_token_budgets =
[cap // 4, cap // 2]`` and items per batch at most the smaller, so that legal
items above ``cap // 2`` fall back to the eager forward, mixed in the same
``execute`` with items that replay graphs.
"""

from __future__ import annotations

import inspect
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
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
from reference_towers.registry import REFERENCE_TOWERS, ReferenceTower, Size
from reference_towers.registry import generated_mixin as load_mixin

__all__ = [
    "BATCH_KINDS",
    "CPU_RUN",
    "CPU_RUN_OVERRIDES",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PHASE_KINDS",
    "DEFAULT_TOLERANCE",
    "EAGER_PHASE_KINDS",
    "GPU_RUNS",
    "GPU_RUN_OVERRIDES",
    "REPO_ROOT",
    "PhasePlan",
    "PlannedBatch",
    "assert_equivalent",
    "build_host",
    "build_manager",
    "build_meta_host",
    "build_vllm_config",
    "cpu_run",
    "discover_spec_stems",
    "eager_ladder",
    "gpu_plan_problems",
    "gpu_run",
    "load_mixin",
    "load_spec",
    "max_item_tokens",
    "plan_batches",
    "plan_phases",
    "poison_graph_pool",
    "predict_packing",
    "protocol_shadowed_host_methods",
    "run_equivalence",
    "tower_modalities",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
SPECS_DIR = REPO_ROOT / "specs"

DEFAULT_MAX_TOKENS: dict[str, int] = {"tiny": 512, "full": 8192}
"""``max_num_batched_tokens`` and ``max_model_len`` per size; the mixins'
largest budget is their minimum."""

DEFAULT_TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.bfloat16: 2e-2,
    torch.float16: 1e-2,
}
"""``max|out - ref| <= tol * max(1, max|ref|)`` per item."""

BATCH_KINDS = (
    "total_boundary",
    "random",
    "item_boundary",
    "smallest",
    "over_max_batch",
    "single",
    "eager",
    "mixed",
)
"""Every batch kind (see :func:`plan_batches`)."""

DEFAULT_PHASE_KINDS = (
    "total_boundary",
    "random",
    "item_boundary",
    "smallest",
    "total_boundary",
    "over_max_batch",
    "single",
    "eager",
    "mixed",
)
"""Batch kinds, in the order the default phase cycles through them
(``eager`` only where some legal item exceeds the largest budget)."""

EAGER_PHASE_KINDS = (
    "eager",
    "item_boundary",
    "total_boundary",
    "random",
    "eager",
    "over_max_batch",
    "mixed",
    "smallest",
    "single",
)
"""Kinds of the eager-ladder phase: eager fallback first and often."""

CPU_RUN: dict[str, Any] = {"num_batches": 30}
"""Settings of the CPU suite's run (``tiny``, fp32, eager-replay backend)."""

GPU_RUNS: dict[str, dict[str, Any]] = {
    "tiny": {"num_batches": 150},
    "full": {
        "num_batches": 150,
        "max_items": 8,
        "over_max_extra": 2,
        "max_random_tokens": 1024,
    },
}
"""Settings of the GPU suite's runs per size (bf16, CUDA graphs). ``full``
bounds the items of random-count batches to 8, over-max batches to
``max_batch_size + 1 .. + 2`` small items and randomly sized items to 1024
tokens (the DeepSeek-V4.1 / MiniMax M3 caps already are; Qwen2-VL's is
16384), so the per-image eager reference stays fast; boundary and eager
batches still take the items a budget needs."""

CPU_RUN_OVERRIDES: dict[str, dict[str, Any]] = {
    # Each 728² global view alone costs a CPU about 0.3 s in the tiny tower
    # (the released view geometry): 12 batches still reach every batch kind.
    "step3_vl": {"num_batches": 12},
    # MiniCPM-V's graph slots are the spec's fixed 32 x 32 to 64 x 32 patch
    # grids (1024-2048 ViT rows a slice) at every size: budgets up to 256
    # (three graphs a key) and 12 batches reach every batch kind and budget.
    "minicpmv": {"num_batches": 12, "max_tokens": 256},
}
"""Per spec stem: settings of the CPU run that differ from :data:`CPU_RUN`."""

GPU_RUN_OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    # Step3-VL's full tower (63 layers, 1792 wide) runs ~16 ViT rows per
    # output token (2704 per global view, 1296 per crop): with the default
    # 8192-token ladder its 150 batches would cost about twelve times
    # Qwen2-VL's. Budgets up to 2048 (five graphs per path), items of at most
    # 512 output tokens where drawn at random, at most 4 items, bring that to
    # about four times; every kind, path budget, split and eager fallback
    # stays covered (tests/equivalence checks the plan).
    "step3_vl": {
        "full": {
            "max_tokens": 2048,
            "max_random_tokens": 512,
            "max_items": 4,
            "over_max_extra": 1,
        }
    },
    # MiniCPM-V captures every budget once per patch-grid key, each slot a
    # fixed grid (1024, 2048, 2048 and 4900 ViT rows through SigLIP-400M)
    # whatever the slice: the default 8192-token ladder would run 255 slots of
    # every key at capture (2.5M rows) and up to 128 x 4900 rows a replay.
    # Budgets up to 2048 (six graphs a key, 32 slots at most) keep every key,
    # split and eager fallback (the eager ladder's) covered.
    "minicpmv": {"full": {"max_tokens": 2048}},
}
"""Per spec stem and size: settings of the GPU run that differ from
:data:`GPU_RUNS` (never the batch count: that is the bar)."""


def cpu_run(stem: str) -> dict[str, Any]:
    """The CPU suite's run settings for ``stem``."""
    return {**CPU_RUN, **CPU_RUN_OVERRIDES.get(stem, {})}


def gpu_run(stem: str, size: str) -> dict[str, Any]:
    """The GPU suite's run settings for ``stem`` at ``size``."""
    return {**GPU_RUNS[size], **GPU_RUN_OVERRIDES.get(stem, {}).get(size, {})}


_MAX_FAILURES_KEPT = 20


# ---------------------------------------------------------------------------
# Discovery, host and manager
# ---------------------------------------------------------------------------


def discover_spec_stems(specs_dir: Path = SPECS_DIR) -> list[str]:
    """Every ``specs/*.yaml`` stem with a reference tower, sorted.

    A new spec plus a ``REFERENCE_TOWERS`` entry is picked up with no change
    to the tests."""
    return sorted(
        p.stem for p in specs_dir.glob("*.yaml") if p.stem in REFERENCE_TOWERS
    )


def load_spec(stem: str) -> dict[str, Any]:
    """The spec YAML as plain data (for guard expectations)."""
    import yaml

    with open(SPECS_DIR / f"{stem}.yaml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def protocol_shadowed_host_methods(stem: str, host_cls: type) -> list[str]:
    """Host methods that a ``SupportsEncoderCudaGraph`` protocol stub
    shadows in the composed host class ``host_cls`` (mixin first).

    A mixin deriving from the protocol puts the protocol's stub bodies
    (``...``, returning ``None``) in front of the tower's host class in the
    MRO, so a method the spec expects the host to provide resolves to the
    stub (Qwen2-VL's ``get_max_frames_per_video`` returned ``None`` that way
    before the registry put host methods first). Must be empty."""
    from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph

    tower_host = REFERENCE_TOWERS[stem].host_cls
    shadowed = []
    for name, value in vars(tower_host).items():
        if name.startswith("__") or not callable(value):
            continue
        stub = vars(SupportsEncoderCudaGraph).get(name)
        if stub is not None and inspect.getattr_static(host_cls, name) is stub:
            shadowed.append(name)
    return sorted(shadowed)


def build_host(
    stem: str,
    size: Size,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    multimodal_config: MultiModalConfig | None = None,
    seed: int = 0,
    mixin: type | None = None,
) -> Any:
    """The reference host with the generated mixin (or ``mixin``: another
    implementation of the protocol, e.g. vLLM's own) mixed in front."""
    return REFERENCE_TOWERS[stem].build_host(
        mixin or load_mixin(stem),
        size,
        device=device,
        dtype=dtype,
        attn_backend=attn_backend,
        multimodal_config=multimodal_config,
        seed=seed,
    )


def build_vllm_config(
    size: Size,
    *,
    max_tokens: int | None = None,
    token_budgets: Sequence[int] = (),
    max_items_per_batch: int = 0,
    multimodal_config: MultiModalConfig | None = None,
) -> VllmConfig:
    """A config with encoder graphs on; the ladder is the manager's default
    unless ``token_budgets`` / ``max_items_per_batch`` are given."""
    tokens = DEFAULT_MAX_TOKENS[size] if max_tokens is None else max_tokens
    return VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(
            max_model_len=tokens,
            multimodal_config=(
                multimodal_config
                if multimodal_config is not None
                else MultiModalConfig()
            ),
        ),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=list(token_budgets),
            encoder_cudagraph_max_vision_items_per_batch=max_items_per_batch,
        ),
    )


def build_manager(
    host: Any,
    vllm_config: VllmConfig,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    graph_backend: GraphBackend,
) -> EncoderCudaGraphManager:
    return EncoderCudaGraphManager(
        vllm_config,
        torch.device(device),
        dtype,
        host,
        graph_backend=graph_backend,
    )


def tower_modalities(tower: ReferenceTower[Any]) -> tuple[str, ...]:
    """Every modality the tower takes (``("image",)`` for towers that
    predate the ``modalities`` attribute)."""
    return tuple(getattr(tower, "modalities", (tower.modality,)))


def _modality_kwargs(modality: str) -> dict[str, str]:
    """``modality=`` for the registry's item calls; left out for images, the
    default, so towers without the keyword keep working."""
    return {} if modality == "image" else {"modality": modality}


def max_item_tokens(tower: ReferenceTower[Any], size: Size) -> int:
    """The largest per-item budget-token cap over the tower's modalities."""
    return max(
        tower.max_budget_tokens(size, **_modality_kwargs(m))
        for m in tower_modalities(tower)
    )


def eager_ladder(
    tower: ReferenceTower[Any], size: Size, max_batch_size: int
) -> tuple[list[int], int]:
    """User budgets ``[cap // 4, cap // 2]`` and items per batch for the
    eager-fallback phase: legal items above ``cap // 2`` exceed every budget."""
    cap = min(
        tower.max_budget_tokens(size, **_modality_kwargs(m))
        for m in tower_modalities(tower)
    )
    budgets = sorted({max(1, cap // 4), max(1, cap // 2)})
    return budgets, max(1, min(max_batch_size, budgets[0]))


# ---------------------------------------------------------------------------
# Batch planning (pure: tower geometry and a seeded rng only)
# ---------------------------------------------------------------------------


@dataclass
class PlannedBatch:
    """One ``execute`` call: its kind, modality, items and pixel seed."""

    kind: str
    modality: str
    items: list[tuple[int, ...]]
    seed: int
    note: str = ""


@dataclass
class _Planner:
    tower: ReferenceTower[Any]
    size: Size
    budgets: list[int]
    max_batch_size: int
    max_items: int
    """Bound on items of the kinds that draw a random count."""
    over_max_extra: int
    """``over_max_batch`` draws ``max_batch_size + 1 .. + over_max_extra``."""
    max_random_tokens: int | None
    """Bound on the tokens of randomly sized items (not of boundary, cap or
    eager items)."""
    rng: random.Random
    modality: str = "image"
    counters: dict[str, int] = field(default_factory=dict)
    path_budgets: dict[str, list[int]] = field(default_factory=dict)
    """Each encoder path's budgets (the manager's ``path_token_budgets``);
    used by towers with several paths, whose boundaries are per path."""
    _pools: dict[str, dict[str, dict[int, list[tuple[int, ...]]]]] = field(
        default_factory=dict
    )
    _fewest: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    # -- the tower, for the current modality --------------------------------

    @property
    def _kw(self) -> dict[str, str]:
        return _modality_kwargs(self.modality)

    @property
    def cap(self) -> int:
        return self.tower.max_budget_tokens(self.size, **self._kw)

    @property
    def random_cap(self) -> int:
        if self.max_random_tokens is None:
            return self.cap
        return max(self.min_tokens, min(self.cap, self.max_random_tokens))

    @property
    def smallest(self) -> tuple[int, ...]:
        return self.tower.smallest_item(self.size, **self._kw)

    @property
    def min_tokens(self) -> int:
        return self.tower.budget_tokens(self.smallest)

    @property
    def has_eager(self) -> bool:
        if self.multi_path:
            return any(
                max(self._pool(p)) > self.path_budgets[p][-1] for p in self.path_budgets
            )
        return self.cap > self.budgets[-1]

    # -- several encoder paths ------------------------------------------------

    @property
    def multi_path(self) -> bool:
        return len(self.path_budgets) > 1

    def _pool(self, path: str) -> dict[int, list[tuple[int, ...]]]:
        """Legal items of the current modality by their rows on ``path``: one
        drawn per reachable budget-token count (deterministic)."""
        if self.modality not in self._pools:
            pools: dict[str, dict[int, list[tuple[int, ...]]]] = {
                p: {} for p in self.path_budgets
            }
            for t in range(self.min_tokens, self.cap + 1):
                if not self._reachable(t):
                    continue
                item = self.tower.budget_item(
                    random.Random(t), self.size, budget_tokens=t, **self._kw
                )
                for p, rows in self.tower.path_tokens(item).items():
                    found = pools[p].setdefault(rows, [])
                    if item not in found:
                        found.append(item)
            self._pools[self.modality] = pools
        return self._pools[self.modality][path]

    def _fewest_items(self, path: str) -> list[int]:
        """``[s]``: the fewest legal items whose rows on ``path`` sum to ``s``
        (up to the path's largest budget + 1; a large number if none)."""
        key = (self.modality, path)
        if key in self._fewest:
            return self._fewest[key]
        top = self.path_budgets[path][-1] + 1
        values = [v for v in self._pool(path) if v > 0]
        never = 1 << 30
        fewest = [0] + [never] * top
        for total in range(1, top + 1):
            fewest[total] = 1 + min(
                (fewest[total - v] for v in values if v <= total), default=never - 1
            )
        self._fewest[key] = fewest
        return fewest

    def _fits_one_batch(self, total: int, path: str) -> bool:
        fewest = self._fewest_items(path)
        return 0 < total < len(fewest) and fewest[total] <= self.max_batch_size

    def path_coverage(self, path: str) -> list[int]:
        """The budgets of ``path`` that a legal batch can replay: some total
        of at most ``max_batch_size`` items lies above the next smaller
        budget and within this one."""
        budgets = [b for b in self.path_budgets[path] if b > 0]
        return [
            b
            for lo, b in zip([0, *budgets], budgets)
            if any(self._fits_one_batch(t, path) for t in range(lo + 1, b + 1))
        ]

    def _path_targets(self) -> list[tuple[str, int]]:
        """(path, total rows) of the boundary batches: every budget exactly,
        then minus one, then plus one, where reachable; a budget none of
        those reach gets the largest reachable total within it."""
        exact, minus, plus, fallback = [], [], [], []
        for path in self.path_budgets:
            budgets = [b for b in self.path_budgets[path] if b > 0]
            for lo, b in zip([0, *budgets], budgets):
                hits = [
                    (group, b + d)
                    for group, d in ((exact, 0), (minus, -1), (plus, 1))
                    if self._fits_one_batch(b + d, path)
                ]
                for group, total in hits:
                    group.append((path, total))
                inside = [
                    t for t in range(lo + 1, b + 1) if self._fits_one_batch(t, path)
                ]
                if inside and not any(lo < t <= b for _, t in hits):
                    fallback.append((path, inside[-1]))
        return exact + minus + plus + fallback

    def _path_total_items(self, path: str, total: int) -> list[tuple[int, ...]]:
        """Items whose rows on ``path`` sum to ``total`` (the fewest), each
        drawn at random among the legal items with its rows there; on the
        other paths the smaller is preferred when the batch would overflow."""
        fewest = self._fewest_items(path)
        pool = self._pool(path)
        items: list[tuple[int, ...]] = []
        left = total
        while left > 0:
            options = [
                v
                for v in pool
                if 0 < v <= left and fewest[left - v] == fewest[left] - 1
            ]
            value = self.rng.choice(sorted(options))
            items.append(self.rng.choice(pool[value]))
            left -= value
        for other in self.path_budgets:
            if other == path:
                continue
            rows = sum(self.tower.path_tokens(i)[other] for i in items)
            if rows > self.path_budgets[other][-1]:
                items = [
                    min(
                        pool[self.tower.path_tokens(i)[path]],
                        key=lambda c: self.tower.path_tokens(c)[other],
                    )
                    for i in items
                ]
        self.rng.shuffle(items)
        return items

    def _path_oversized_item(self, smallest: bool) -> tuple[int, ...]:
        """A legal item above the largest budget of some path: the one with
        the fewest budget tokens (just over a boundary) or a random one."""
        choices = sorted(
            {
                item
                for p, budgets in self.path_budgets.items()
                for rows, found in self._pool(p).items()
                if rows > budgets[-1]
                for item in found
            }
        )
        if smallest:
            return min(choices, key=self.tower.budget_tokens)
        return self.rng.choice(choices)

    def _item(
        self, tokens: int | None = None, max_tokens: int | None = None
    ) -> tuple[int, ...]:
        if tokens is not None:
            return self.tower.budget_item(
                self.rng, self.size, budget_tokens=tokens, **self._kw
            )
        cap = (
            self.random_cap if max_tokens is None else min(max_tokens, self.random_cap)
        )
        return self.tower.budget_item(
            self.rng, self.size, max_budget_tokens=cap, **self._kw
        )

    def _reachable(self, tokens: int) -> bool:
        """Whether some legal item has exactly ``tokens`` budget tokens."""
        if not self.min_tokens <= tokens <= self.cap:
            return False
        try:
            self.tower.budget_item(
                random.Random(0), self.size, budget_tokens=tokens, **self._kw
            )
        except ValueError:
            return False
        return True

    def _reachable_in(self, lo: int, hi: int) -> int:
        """A random reachable token count in ``[lo, hi]``."""
        for _ in range(200):
            t = self.rng.randint(lo, hi)
            if self._reachable(t):
                return t
        for t in range(hi, lo - 1, -1):
            if self._reachable(t):
                return t
        raise RuntimeError(f"no legal {self.modality} item with {lo}..{hi} tokens")

    def _largest_reachable(self, hi: int) -> int:
        """The largest reachable token count up to ``hi`` (``hi`` itself,
        drawn as :meth:`_reachable_in` draws it, when reachable: a tower whose
        counts step by more than one, as Step3-VL's crops, may miss it)."""
        if self._reachable(hi):
            return self._reachable_in(hi, hi)
        return next(t for t in range(hi, self.min_tokens - 1, -1) if self._reachable(t))

    # -- batch kinds ----------------------------------------------------------

    def _nth(self, kind: str) -> int:
        n = self.counters.get(kind, 0)
        self.counters[kind] = n + 1
        return n

    def _count(self) -> int:
        return self.rng.randint(1, max(1, min(self.max_batch_size, self.max_items)))

    def _split_total(self, total: int) -> list[int] | None:
        """Reachable item token counts summing to ``total``, as even as
        possible (so that packing keeps them together when they fit)."""
        if total < self.min_tokens:
            return None
        n = max(1, math.ceil(total / self.cap))
        while n <= total // self.min_tokens:
            base, extra = divmod(total, n)
            parts = [base + 1] * extra + [base] * (n - extra)
            if all(self._reachable(p) for p in parts):
                self.rng.shuffle(parts)
                return parts
            n += 1
        return None

    def kind_items(self, kind: str) -> tuple[list[tuple[int, ...]], str] | None:
        """Items of one batch of ``kind``, or ``None`` when this ladder
        cannot form it."""
        rng = self.rng
        if kind == "random":
            return [self._item() for _ in range(self._count())], ""
        if kind == "single":
            # The smallest, the largest and a random item in turn.
            i = self._nth(kind) % 3
            if i == 0:
                return [self.smallest], "smallest"
            if i == 1:
                return [self._item(tokens=self._reachable_in(1, self.random_cap))], ""
            return [self._item(tokens=self._largest_reachable(self.cap))], "cap"
        if kind == "smallest":
            n = self._count()
            items = [self.smallest] * n
            if n > 1 and rng.random() < 0.5:
                items[rng.randrange(n)] = self._item()
            return items, ""
        if kind in ("item_boundary", "total_boundary", "eager") and self.multi_path:
            return self._path_kind_items(kind)
        if kind == "item_boundary":
            targets = [
                b + d
                for b in self.budgets
                for d in (-1, 0, 1)
                if self._reachable(b + d)
            ]
            if not targets:
                return None
            t = targets[self._nth(kind) % len(targets)]
            items = [self._item(tokens=t)]
            room = max(0, min(self.max_batch_size, self.max_items) - 1)
            items += [self._item() for _ in range(rng.randint(0, min(2, room)))]
            rng.shuffle(items)
            return items, f"an item of {t} tokens"
        if kind == "total_boundary":
            # Every budget exactly first, then every budget - 1, then + 1.
            n = self._nth(kind)
            nb = len(self.budgets)
            total = self.budgets[n % nb] + (0, -1, 1)[(n // nb) % 3]
            parts = self._split_total(total)
            if parts is None:
                return None
            return [self._item(tokens=t) for t in parts], f"{total} tokens in total"
        if kind == "over_max_batch":
            n = self.max_batch_size + rng.randint(1, max(1, self.over_max_extra))
            # Small items, so that the item count (not tokens) splits.
            small = max(self.min_tokens, min(self.cap, self.budgets[0] // 4))
            items = [self._item(max_tokens=small) for _ in range(n)]
            return items, f"{n} items > max_batch_size {self.max_batch_size}"
        if kind == "eager":
            if not self.has_eager:
                return None
            largest = self.budgets[-1]
            big = [
                self._item(tokens=self._reachable_in(largest + 1, self.cap))
                for _ in range(rng.randint(1, 2))
            ]
            if self._nth(kind) % 2 == 0 and self._reachable(largest + 1):
                big[0] = self._item(tokens=largest + 1)
            room = max(0, min(3, self.max_items - len(big)))
            small = [
                self._item(max_tokens=largest) for _ in range(rng.randint(0, room))
            ]
            items = big + small
            rng.shuffle(items)
            return items, f"{len(big)} above the largest budget {largest}"
        if kind == "mixed":
            items = []
            for _ in range(self._count()):
                r = rng.random()
                if r < 0.2:
                    items.append(self.smallest)
                elif r < 0.4:
                    cap = self.random_cap
                    items.append(self._item(tokens=self._largest_reachable(cap)))
                else:
                    items.append(self._item())
            return items, ""
        raise ValueError(f"unknown batch kind {kind!r}")

    def _path_kind_items(self, kind: str) -> tuple[list[tuple[int, ...]], str] | None:
        """The boundary and eager kinds of a tower with several paths: each
        path's budgets are its own (a batch's rows on a path pick that
        path's graph)."""
        rng = self.rng
        if kind == "total_boundary":
            targets = self._path_targets()
            path, total = targets[self._nth(kind) % len(targets)]
            return self._path_total_items(path, total), f"{total} {path} rows in total"
        if kind == "item_boundary":
            targets = [
                (path, rows)
                for path, budgets in self.path_budgets.items()
                for rows in sorted(self._pool(path))
                if rows > 0 and any(rows - b in (-1, 0, 1) for b in budgets if b > 0)
            ]
            if not targets:
                return None
            path, rows = targets[self._nth(kind) % len(targets)]
            items = [rng.choice(self._pool(path)[rows])]
            room = max(0, min(self.max_batch_size, self.max_items) - 1)
            items += [self._item() for _ in range(rng.randint(0, min(2, room)))]
            rng.shuffle(items)
            return items, f"an item of {rows} {path} rows"
        assert kind == "eager"
        if not self.has_eager:
            return None
        first_small = self._nth(kind) % 2 == 0
        big = [
            self._path_oversized_item(smallest=first_small and i == 0)
            for i in range(rng.randint(1, 2))
        ]
        room = max(0, min(3, self.max_items - len(big)))
        items = big + [self._item() for _ in range(rng.randint(0, room))]
        rng.shuffle(items)
        return items, f"{len(big)} above a path's largest budget"


def plan_batches(
    tower: ReferenceTower[Any],
    size: Size,
    *,
    budgets: Sequence[int],
    max_batch_size: int,
    num_batches: int,
    seed: int,
    max_items: int | None = None,
    over_max_extra: int | None = None,
    max_random_tokens: int | None = None,
    kinds: Sequence[str] = DEFAULT_PHASE_KINDS,
    modalities: Sequence[str] | None = None,
    path_budgets: dict[str, list[int]] | None = None,
) -> list[PlannedBatch]:
    """``num_batches`` seeded batches cycling through ``kinds``; the batches
    of each kind alternate between ``modalities`` (every modality of the
    tower by default; one modality per ``execute``, as vLLM groups them).

    A kind that cannot be formed under these budgets (``eager`` when no
    legal item exceeds the largest budget) is skipped. The ``k``-th
    ``total_boundary`` batch sums to budget ``k mod n`` exactly, then to
    every budget ``- 1``, then ``+ 1``, so every budget is replayed once
    there are as many such batches as budgets."""
    rng = random.Random(seed)
    modalities = tuple(modalities or tower_modalities(tower))
    planner = _Planner(
        tower=tower,
        size=size,
        budgets=sorted(budgets),
        max_batch_size=max_batch_size,
        max_items=max_items if max_items is not None else max_batch_size,
        over_max_extra=(
            over_max_extra if over_max_extra is not None else max_batch_size + 1
        ),
        max_random_tokens=max_random_tokens,
        rng=rng,
        path_budgets=dict(path_budgets or {"default": sorted(budgets)}),
    )
    plans: list[PlannedBatch] = []
    made_of_kind: dict[str, int] = {}
    i = 0
    misses = 0
    while len(plans) < num_batches:
        kind = kinds[i % len(kinds)]
        # Each kind alternates between the modalities.
        planner.modality = modalities[made_of_kind.get(kind, 0) % len(modalities)]
        i += 1
        made = planner.kind_items(kind)
        if made is None:
            misses += 1
            if misses > 10 * len(kinds) + num_batches:
                raise RuntimeError(f"cannot form batches of kinds {list(kinds)}")
            continue
        items, note = made
        made_of_kind[kind] = made_of_kind.get(kind, 0) + 1
        plans.append(
            PlannedBatch(
                kind,
                planner.modality,
                list(items),
                seed * 100_003 + len(plans),
                note,
            )
        )
    return plans


# ---------------------------------------------------------------------------
# Poisoned graph pool (CUDA only)
# ---------------------------------------------------------------------------


class _PoisonGraph:
    """A CUDA graph that writes NaN over the blocks of a graph pool that were
    free after capture (the intermediates the encoder graphs share)."""

    def __init__(self, graph: Any, nbytes: int, nblocks: int, free_bytes: int) -> None:
        self.graph = graph
        self.nbytes = nbytes
        """Bytes of free pool blocks the poison writes."""
        self.nblocks = nblocks
        self.free_bytes = free_bytes
        """Bytes of the pool's free blocks before poisoning."""

    def replay(self) -> None:
        self.graph.replay()


def _capture_stream(graph_backend: Any, device: torch.device) -> Any:
    """The stream the backend captures on (its side stream when the current
    stream is the default one): pool blocks are reused only on their stream."""
    side = getattr(graph_backend, "_side_stream", lambda: None)()
    return side if side is not None else torch.cuda.current_stream(device)


def poison_graph_pool(
    pool: Any, device: torch.device, graph_backend: Any = None
) -> _PoisonGraph:
    """Capture, into ``pool`` on the backend's capture stream, one
    allocation per free block of the pool, each filled with NaN; replay it
    once.

    Allocations during a capture come from the pool's free blocks (best fit,
    same stream), so replaying this graph overwrites the memory the encoder
    graphs use for their intermediates with NaN: an encoder graph that reads
    a pool row it did not write in the same replay (vLLM PR #57136) then
    returns NaN. Only the bytes of allocations that landed inside a block
    that was free before count towards ``nbytes``.

    Blocks of the allocator's small segments (2 MiB segments serving
    requests of at most 1 MiB) are filled with pieces of at most 1 MiB: a
    larger request would be served from a large segment instead, missing
    the free block entirely.
    """
    pool_id = tuple(pool)
    small_request = 1 << 20  # the caching allocator's kSmallSize
    free: dict[int, tuple[int, bool]] = {}  # start -> (size, in a small segment)
    for segment in torch.cuda.memory_snapshot():
        if tuple(segment.get("segment_pool_id", ())) != pool_id:
            continue
        small = segment.get("segment_type") == "small"
        address = int(segment.get("address", 0))
        for block in segment.get("blocks", ()):
            # Blocks are listed in address order; older releases omit it.
            start = int(block.get("address", address))
            address = start + int(block["size"])
            if block.get("state") == "inactive" and int(block["size"]) >= 512:
                free[start] = (int(block["size"]), small)
    pieces: list[int] = []
    for size, small in free.values():
        step = small_request if small else size
        pieces += [min(step, size - off) for off in range(0, size, step)]
    spans = sorted((start, start + size) for start, (size, _) in free.items())

    def inside_free(ptr: int, size: int) -> bool:
        return any(lo <= ptr and ptr + size <= hi for lo, hi in spans)

    stream = _capture_stream(graph_backend, device)
    graph = torch.cuda.CUDAGraph()
    nbytes = nblocks = 0
    with torch.cuda.device(device):
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            keep = []
            for size in sorted(pieces, reverse=True):
                t = torch.empty(size // 4, dtype=torch.float32, device=device)
                t.fill_(float("nan"))
                keep.append(t)
                if inside_free(t.data_ptr(), size):
                    nbytes += size
                    nblocks += 1
            del keep
        torch.cuda.current_stream(device).wait_stream(stream)
    poison = _PoisonGraph(
        graph, nbytes, nblocks, sum(size for size, _ in free.values())
    )
    poison.replay()
    torch.cuda.synchronize(device)
    return poison


# ---------------------------------------------------------------------------
# Phases: which managers a run builds and what each executes
# ---------------------------------------------------------------------------


@dataclass
class PhasePlan:
    """One manager of a run and the batches it executes."""

    name: str
    vllm_config: VllmConfig
    token_budgets: list[int]
    max_batch_size: int
    batches: list[PlannedBatch]
    path_budgets: dict[str, list[int]] = field(default_factory=dict)
    """Each path's budgets (``path_token_budgets``; 0: the path left out)."""
    coverage: dict[str, list[int]] = field(default_factory=dict)
    """Per path, the budgets its batches must replay: those a legal batch
    can reach (every budget of a single-path tower)."""


def build_meta_host(
    stem: str,
    size: Size,
    *,
    attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    multimodal_config: MultiModalConfig | None = None,
    mixin: type | None = None,
) -> Any:
    """A host on the meta device (no memory, no weights): enough for the
    manager to resolve budgets, so a run can be planned without running it."""
    tower = REFERENCE_TOWERS[stem]
    with torch.device("meta"):
        return tower.host_class(mixin or load_mixin(stem))(
            tower.config(size),
            multimodal_config=multimodal_config,
            attn_backend=attn_backend,
        )


def _resolve_ladder(
    host: Any, vllm_config: VllmConfig
) -> tuple[list[int], int, dict[str, list[int]]]:
    """The manager's own budget and batch-size resolution (no capture): the
    budgets, the items per batch and each path's budgets."""
    manager = EncoderCudaGraphManager(
        vllm_config,
        torch.device("cpu"),
        torch.float32,
        host,
        graph_backend=EagerReplayGraphBackend(),
    )
    paths = {p: list(b) for p, b in manager.path_token_budgets.items()}
    return list(manager.token_budgets), manager.max_batch_size, paths


def _path_caps(tower: ReferenceTower[Any], size: Size) -> dict[str, int]:
    """The most rows one legal item puts on each path (the budget-token cap
    for a single path)."""
    if len(tower.paths) == 1:
        return {tower.paths[0]: max_item_tokens(tower, size)}
    caps = dict.fromkeys(tower.paths, 0)
    for modality in tower_modalities(tower):
        kw = _modality_kwargs(modality)
        probe = random.Random(0)
        for t in range(
            tower.budget_tokens(tower.smallest_item(size, **kw)),
            tower.max_budget_tokens(size, **kw) + 1,
        ):
            try:
                item = tower.budget_item(probe, size, budget_tokens=t, **kw)
            except ValueError:
                continue
            for p, rows in tower.path_tokens(item).items():
                caps[p] = max(caps[p], rows)
    return caps


def _coverage(
    tower: ReferenceTower[Any],
    size: Size,
    budgets: list[int],
    max_batch_size: int,
    path_budgets: dict[str, list[int]],
) -> dict[str, list[int]]:
    """Per path, the budgets a legal batch can replay (see
    :meth:`_Planner.path_coverage`); every budget for a single path."""
    if len(path_budgets) == 1:
        return {p: [x for x in b if x > 0] for p, b in path_budgets.items()}
    planner = _Planner(
        tower=tower,
        size=size,
        budgets=sorted(budgets),
        max_batch_size=max_batch_size,
        max_items=max_batch_size,
        over_max_extra=1,
        max_random_tokens=None,
        rng=random.Random(0),
        path_budgets=path_budgets,
    )
    covered: dict[str, set[int]] = {p: set() for p in path_budgets}
    for modality in tower_modalities(tower):
        planner.modality = modality
        for p in path_budgets:
            covered[p].update(planner.path_coverage(p))
    return {p: sorted(c) for p, c in covered.items()}


def plan_phases(
    stem: str,
    size: Size,
    host: Any,
    *,
    num_batches: int,
    seed: int = 0,
    max_tokens: int | None = None,
    max_items: int | None = None,
    over_max_extra: int | None = None,
    max_random_tokens: int | None = None,
    eager_batches: int | None = None,
    multimodal_config: MultiModalConfig | None = None,
) -> list[PhasePlan]:
    """The phases of :func:`run_equivalence` with their batches.

    ``default``: the manager's default ladder. ``eager_ladder`` (when no legal
    item exceeds the default's largest budget, see the module docstring):
    user budgets from :func:`eager_ladder`. ``host`` may be a meta host
    (:func:`build_meta_host`)."""
    tower = REFERENCE_TOWERS[stem]
    mm_config = multimodal_config or MultiModalConfig()
    default_config = build_vllm_config(
        size, max_tokens=max_tokens, multimodal_config=mm_config
    )
    budgets, max_batch_size, path_budgets = _resolve_ladder(host, default_config)
    caps = _path_caps(tower, size)
    if any(caps[p] > b[-1] for p, b in path_budgets.items()):
        eager_batches = 0  # the default phase draws eager items itself
    elif eager_batches is None:
        eager_batches = max(2, num_batches // 5)
    eager_batches = max(0, min(eager_batches, num_batches - 1))

    def batches(
        budgets: list[int],
        mbs: int,
        n: int,
        seed: int,
        kinds: Sequence[str],
        path_budgets: dict[str, list[int]],
    ) -> list[PlannedBatch]:
        return plan_batches(
            tower,
            size,
            budgets=budgets,
            max_batch_size=mbs,
            num_batches=n,
            seed=seed,
            max_items=max_items,
            over_max_extra=over_max_extra,
            max_random_tokens=max_random_tokens,
            kinds=kinds,
            path_budgets=path_budgets,
        )

    phases = [
        PhasePlan(
            "default",
            default_config,
            budgets,
            max_batch_size,
            batches(
                budgets,
                max_batch_size,
                num_batches - eager_batches,
                seed,
                DEFAULT_PHASE_KINDS,
                path_budgets,
            ),
            path_budgets,
            _coverage(tower, size, budgets, max_batch_size, path_budgets),
        )
    ]
    if eager_batches:
        user_budgets, user_items = eager_ladder(tower, size, max_batch_size)
        config = build_vllm_config(
            size,
            max_tokens=max_tokens,
            token_budgets=user_budgets,
            max_items_per_batch=user_items,
            multimodal_config=mm_config,
        )
        budgets, max_batch_size, path_budgets = _resolve_ladder(host, config)
        phases.append(
            PhasePlan(
                "eager_ladder",
                config,
                budgets,
                max_batch_size,
                batches(
                    budgets,
                    max_batch_size,
                    eager_batches,
                    seed + 1,
                    EAGER_PHASE_KINDS,
                    path_budgets,
                ),
                path_budgets,
                _coverage(tower, size, budgets, max_batch_size, path_budgets),
            )
        )
    return phases


def predict_packing(stem: str, phase: PhasePlan) -> dict[str, Any]:
    """What the manager's packing rules make of a phase's batches (from
    :func:`encoder_cudagraph_runtime.packing.pack_items`, no model run):
    replays per budget (per ``(path, budget)`` in ``replays_per_path_budget``;
    a single path's rows are its budget tokens), eager batches (a batch with
    some path too big for its budgets) and executes split in several."""
    tower = REFERENCE_TOWERS[stem]
    paths = list(phase.path_budgets or {"default": phase.token_budgets})
    per_budget: dict[int, int] = {}
    per_path_budget: dict[str, dict[int, int]] = {p: {} for p in paths}
    eager = splits = 0
    for batch in phase.batches:
        packed = _pack(tower, phase, batch.items)[1]
        splits += len(packed) > 1
        for unit in packed:
            if None in unit.path_budgets:
                eager += 1
            for path, budget in zip(paths, unit.path_budgets, strict=True):
                if budget:
                    counts = per_path_budget[path]
                    counts[budget] = counts.get(budget, 0) + 1
                    per_budget[budget] = per_budget.get(budget, 0) + 1
    return {
        "replays_per_budget": dict(sorted(per_budget.items())),
        "replays_per_path_budget": {
            p: dict(sorted(c.items())) for p, c in per_path_budget.items()
        },
        "eager_batches": eager,
        "split_executes": splits,
        "max_items": max((len(b.items) for b in phase.batches), default=0),
        "input_rows": sum(
            tower.input_size(item) for b in phase.batches for item in b.items
        ),
    }


def gpu_plan_problems(stem: str, size: Size, host: Any) -> list[str]:
    """What the GPU run of ``stem`` at ``size`` would miss, from its plan on
    ``host`` (a meta host: :func:`build_meta_host`): the bar's batch count,
    every budget of every path a legal batch can reach replayed (every
    budget, for a single path), some execute split, some eager fallback,
    only legal items. Empty when the plan covers all."""
    tower = REFERENCE_TOWERS[stem]
    run = gpu_run(stem, size)
    phases = plan_phases(stem, size, host, seed=0, **run)
    problems = []
    planned = sum(len(p.batches) for p in phases)
    if planned != run["num_batches"] or planned < GPU_RUNS[size]["num_batches"]:
        problems.append(f"{planned} batches planned, the bar is {GPU_RUNS[size]}")
    predicted = {p.name: predict_packing(stem, p) for p in phases}
    default = next(p for p in phases if p.name == "default")
    replayed = predicted["default"]["replays_per_path_budget"]
    for path, budgets in default.coverage.items():
        if set(replayed[path]) != set(budgets):
            problems.append(f"path {path!r} replays {replayed[path]}, not {budgets}")
    if len(default.path_budgets) == 1:
        if set(default.coverage["default"]) != set(default.token_budgets):
            problems.append(f"coverage {default.coverage} != {default.token_budgets}")
    if predicted["default"]["split_executes"] == 0:
        problems.append("no execute splits")
    if predicted.get("eager_ladder", predicted["default"])["eager_batches"] == 0:
        problems.append("no batch falls back to the eager forward")
    for batch in (b for p in phases for b in p.batches):
        kw = _modality_kwargs(batch.modality)
        if not all(tower.is_legal(item, size, **kw) for item in batch.items):
            problems.append(f"illegal items in {batch}")
    return problems


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


@dataclass
class _Stats:
    batches: int = 0
    items: int = 0
    replays: int = 0
    eager_batches: int = 0
    eager_items: int = 0
    split_executes: int = 0
    worst_abs_err: float = 0.0
    worst_rel_err: float = 0.0
    worst: dict[str, Any] = field(default_factory=dict)
    max_padding_waste: float = 0.0
    rows_replayed: int = 0
    rows_used: int = 0
    nonfinite: int = 0
    nonfinite_buffers: int = 0
    """Graph output buffers (of the replayed graphs) that held NaN/Inf
    after an execute: counted in ``nonfinite`` and ``failures`` too."""
    aliasing: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    budgets_replayed: set[tuple[str, int]] = field(default_factory=set)
    """(path, budget) of every graph replayed."""
    failures: list[str] = field(default_factory=list)
    num_failures: int = 0
    over_bar: list[dict[str, Any]] = field(default_factory=list)
    """Items over the tolerance, each beside the noise of the eager
    reference itself (:func:`_noise_floor`)."""

    def fail(self, message: str) -> None:
        self.num_failures += 1
        if len(self.failures) < _MAX_FAILURES_KEPT:
            self.failures.append(message)


def _padding_totals(manager: EncoderCudaGraphManager) -> dict[str, Any]:
    stats = manager.get_padding_stats()
    per_budget: dict[tuple[str, int], int] = {}
    eager_batches = 0
    for name, path in stats["paths"].items():
        eager_batches += path["eager_batches"]
        for budget, entry in path["budgets"].items():
            per_budget[(name, int(budget))] = entry["replays"]
    return {
        "replays": stats["replays"],
        "rows_replayed": stats["rows_replayed"],
        "rows_used": stats["rows_used"],
        "eager_batches": eager_batches,
        "per_budget": per_budget,
    }


class _CountedGraph:
    """A captured graph that records its key in ``replayed`` at each replay
    (every other attribute is the graph's own)."""

    def __init__(self, graph: Any, key: tuple[str, Any], replayed: set) -> None:
        self._graph, self._key, self._replayed = graph, key, replayed

    def replay(self) -> None:
        self._replayed.add(self._key)
        self._graph.replay()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._graph, name)


def _count_replays(manager: EncoderCudaGraphManager) -> set[tuple[str, Any]]:
    """Wrap every captured graph of ``manager`` so that its replays are
    recorded; returns the set of ``(path, graph key)`` replayed so far (filled
    as the manager replays)."""
    replayed: set[tuple[str, Any]] = set()
    for path, graphs in manager.budget_graphs.items():
        for key, meta in graphs.items():
            meta.graph = _CountedGraph(meta.graph, (path, key), replayed)
    return replayed


def _output_buffers(
    manager: EncoderCudaGraphManager, replayed: set[tuple[str, Any]]
) -> list[tuple[tuple[str, Any], torch.Tensor]]:
    """``((path, graph key), output buffer)`` of the graphs replayed since
    capture (by graph, not budget: a model with capture axes has a graph per
    axis key at each budget).

    Capture allocates each output buffer with ``empty_like`` (as vLLM does)
    and only records the copy into it, so until a graph's first replay its
    buffer holds whatever the allocator handed out (NaN too, where an
    earlier computation of the process left NaN); nothing reads it then.
    """
    return [
        ((path, key), meta.output_buffer)
        for path, graphs in manager.budget_graphs.items()
        for key, meta in graphs.items()
        if (path, key) in replayed
    ]


def _nonfinite_rows(key: tuple[str, Any], buf: torch.Tensor) -> str:
    """Where a graph's output buffer holds NaN/Inf: its key and the rows."""
    bad = ~torch.isfinite(buf.reshape(buf.shape[0], -1)).all(dim=1)
    rows = bad.nonzero().flatten().tolist()
    span = (
        f"rows {rows[0]}-{rows[-1]}, {len(rows)} of {buf.shape[0]}"
        if rows
        else "no row"
    )
    return f"path {key[0]!r}, key {key[1]!r}, shape {tuple(buf.shape)}: {span}"


def _compare(
    out: Any,
    ref: torch.Tensor,
    stats: _Stats,
    where: str,
) -> float | None:
    """Check one item's shape, dtype and finiteness (failures recorded) and
    return its relative error (``None`` when it could not be compared); the
    caller holds it against the tolerance."""
    if not isinstance(out, torch.Tensor):
        stats.fail(f"{where}: output is {type(out).__name__}, not a tensor")
        return None
    if out.shape != ref.shape or out.dtype != ref.dtype or out.device != ref.device:
        stats.fail(
            f"{where}: output {tuple(out.shape)} {out.dtype} {out.device} vs "
            f"reference {tuple(ref.shape)} {ref.dtype} {ref.device}"
        )
        return None
    if not bool(torch.isfinite(ref).all()):
        stats.nonfinite += 1
        stats.fail(f"{where}: the eager reference is not finite")
        return None
    if not bool(torch.isfinite(out).all()):
        stats.nonfinite += 1
        bad = int((~torch.isfinite(out)).any(dim=-1).sum()) if out.ndim else 1
        stats.fail(f"{where}: {bad} output rows hold NaN/Inf")
        return None
    if ref.numel() == 0:
        return 0.0
    diff = (out.float() - ref.float()).abs().max().item()
    scale = max(1.0, ref.float().abs().max().item())
    rel = diff / scale
    stats.worst_abs_err = max(stats.worst_abs_err, diff)
    if rel > stats.worst_rel_err:
        stats.worst_rel_err = rel
        stats.worst = {"where": where, "abs_err": diff, "ref_absmax": scale}
    return rel


def _over_bar_message(
    where: str, out: torch.Tensor, ref: torch.Tensor, tol: float
) -> str:
    diff = (out.float() - ref.float()).abs().max().item()
    scale = max(1.0, ref.float().abs().max().item())
    return f"{where}: max abs err {diff:.3e} > {tol:g} * max(1, |ref|max {scale:.3e})"


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (out.float() - ref.float()).abs().max().item()
    return diff / max(1.0, ref.float().abs().max().item())


def _noise_floor(
    tower: ReferenceTower[Any],
    host: Any,
    mm_kwargs: dict[str, Any],
    index: int,
    out: torch.Tensor,
    ref: torch.Tensor,
) -> dict[str, Any]:
    """How far the eager reference of item ``index`` moves by itself: the
    item run alone (eager, unpadded) against the item in its batch (the
    reference), and the graph's result against both. Kernels and bf16
    rounding depend on the batch's layout, so an alone-vs-batched distance
    near the graph's error says the graph is as close to the batched
    reference as another eager run is, not that it computes a wrong thing."""
    try:
        with torch.inference_mode():
            single = host.select_encoder_cudagraph_items(mm_kwargs, [index])
            (alone,) = tower.reference_outputs(host, single)
    except Exception as exc:  # a diagnostic only: never hide the failure itself
        return {"error": repr(exc)}
    return {
        "graph_vs_batched_eager": _rel_err(out, ref),
        "graph_vs_alone_eager": _rel_err(out, alone),
        "alone_vs_batched_eager": _rel_err(alone, ref),
    }


def _pack(
    tower: ReferenceTower[Any], phase: PhasePlan, items: Sequence[tuple[int, ...]]
) -> tuple[list[str], list[Any]]:
    """The phase's paths and the replay units the manager's packing rules
    make of ``items`` (see :func:`encoder_cudagraph_runtime.packing`)."""
    from encoder_cudagraph_runtime.packing import pack_items

    paths = list(phase.path_budgets or {"default": phase.token_budgets})
    budgets = [phase.path_budgets.get(p, phase.token_budgets) for p in paths]
    if len(paths) == 1:
        tokens = [[tower.budget_tokens(item) for item in items]]
    else:
        rows = [tower.path_tokens(item) for item in items]
        tokens = [[r[p] for r in rows] for p in paths]
    outputs = [tower.output_tokens(item) for item in items]
    return paths, pack_items(tokens, outputs, budgets, phase.max_batch_size)


def _expected_counters(
    tower: ReferenceTower[Any], phase: PhasePlan, items: Sequence[tuple[int, ...]]
) -> tuple[int, int]:
    """(graph hits, graph misses) the manager counts for one execute, as
    vLLM's counts them: each replay of a path counts the unit's items as
    hits (an item with rows on two paths counts twice); a unit with no
    replay counts its items as misses."""
    hits = misses = 0
    for unit in _pack(tower, phase, items)[1]:
        replayed = sum(1 for b in unit.path_budgets if b)
        if replayed:
            hits += replayed * len(unit.indices)
        else:
            misses += len(unit.indices)
    return hits, misses


def _oversized(
    tower: ReferenceTower[Any],
    item: tuple[int, ...],
    budgets: list[int],
    largest: dict[str, int],
) -> bool:
    """Whether ``item`` alone exceeds the largest budget (of some path)."""
    if len(largest) <= 1:
        return tower.budget_tokens(item) > budgets[-1]
    return any(rows > largest[p] for p, rows in tower.path_tokens(item).items())


def _run_phase(
    phase: PhasePlan,
    *,
    tower: ReferenceTower[Any],
    host: Any,
    device: torch.device,
    dtype: torch.dtype,
    graph_backend: GraphBackend,
    tol: float,
    poison_pool: bool,
    stats: _Stats,
    truth: Callable[[dict[str, Any]], list[torch.Tensor]] | None = None,
) -> dict[str, Any]:
    manager = build_manager(
        host, phase.vllm_config, device=device, dtype=dtype, graph_backend=graph_backend
    )
    if (list(manager.token_budgets), manager.max_batch_size) != (
        phase.token_budgets,
        phase.max_batch_size,
    ):
        raise AssertionError(
            f"{phase.name}: manager resolved {manager.token_budgets} / "
            f"{manager.max_batch_size}, the plan {phase.token_budgets} / "
            f"{phase.max_batch_size}"
        )
    start = time.perf_counter()
    manager.capture()
    capture_s = time.perf_counter() - start
    replayed_graphs = _count_replays(manager)
    poison = None
    if poison_pool:
        if not isinstance(graph_backend, CudaGraphBackend):
            raise ValueError("poison_pool needs the CUDA graph backend")
        poison = poison_graph_pool(manager.graph_pool, device, graph_backend)
    budgets = phase.token_budgets
    largest = {p: b[-1] for p, b in phase.path_budgets.items()}
    items_before = stats.items
    expected_hits = expected_misses = 0
    replayed_here: set[tuple[str, int]] = set()
    previous: list[tuple[torch.Tensor, torch.Tensor]] = []
    for b, plan in enumerate(phase.batches):
        note = f", {plan.note}" if plan.note else ""
        where_batch = f"{phase.name} batch {b} ({plan.modality} {plan.kind}{note})"
        mm_kwargs = tower.make_mm_kwargs(
            host, plan.items, device, seed=plan.seed, **_modality_kwargs(plan.modality)
        )
        if poison is not None:
            poison.replay()
        before = _padding_totals(manager)
        outputs = manager.execute(mm_kwargs)
        after = _padding_totals(manager)
        with torch.inference_mode():
            refs = tower.reference_outputs(host, mm_kwargs)

        stats.batches += 1
        stats.items += len(plan.items)
        hits, misses = _expected_counters(tower, phase, plan.items)
        expected_hits += hits
        expected_misses += misses
        kind = plan.kind if plan.modality == "image" else f"{plan.modality}:{plan.kind}"
        stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
        replays = after["replays"] - before["replays"]
        eager = after["eager_batches"] - before["eager_batches"]
        stats.replays += replays
        stats.eager_batches += eager
        stats.eager_items += sum(
            1 for item in plan.items if _oversized(tower, item, budgets, largest)
        )
        if replays + eager > 1:
            stats.split_executes += 1
        replayed = after["rows_replayed"] - before["rows_replayed"]
        used = after["rows_used"] - before["rows_used"]
        stats.rows_replayed += replayed
        stats.rows_used += used
        if replayed:
            stats.max_padding_waste = max(
                stats.max_padding_waste, (replayed - used) / replayed
            )
        for budget, count in after["per_budget"].items():
            if count > before["per_budget"].get(budget, 0):
                stats.budgets_replayed.add(budget)
                replayed_here.add(budget)

        if len(outputs) != len(plan.items) or len(refs) != len(plan.items):
            stats.fail(
                f"{where_batch}: {len(outputs)} outputs, {len(refs)} references "
                f"for {len(plan.items)} items"
            )
            continue
        for i, (out, ref) in enumerate(zip(outputs, refs)):
            item = plan.items[i]
            where = (
                f"{where_batch} item {i} {item} ({tower.output_tokens(item)} tokens)"
            )
            rel = _compare(out, ref, stats, where)
            if rel is None or rel <= tol:
                continue
            entry = {
                "where": where,
                **_noise_floor(tower, host, mm_kwargs, i, out, ref),
            }
            if truth is not None:
                # Below fp32 the bar holds the graph to the truth when the two
                # rounded results stray apart: within ``tol`` of the fp32 twin.
                exact = truth(mm_kwargs)[i]
                entry["graph_vs_fp32"] = _rel_err(out, exact)
                entry["eager_vs_fp32"] = _rel_err(ref, exact)
            entry["within_bar_of_fp32"] = entry.get("graph_vs_fp32", math.inf) <= tol
            if len(stats.over_bar) < _MAX_FAILURES_KEPT:
                stats.over_bar.append(entry)
            if not entry["within_bar_of_fp32"]:
                stats.fail(_over_bar_message(where, out, ref, tol))
        for k, (key, buf) in enumerate(_output_buffers(manager, replayed_graphs)):
            if not bool(torch.isfinite(buf).all()):
                stats.nonfinite += 1
                stats.nonfinite_buffers += 1
                stats.fail(
                    f"{where_batch}: graph output buffer {k} ({_nonfinite_rows(key, buf)}) "
                    "holds NaN/Inf"
                )
        # Results of the previous execute must survive this one's replays.
        for j, (out, snapshot) in enumerate(previous):
            if not torch.equal(out, snapshot):
                stats.aliasing += 1
                stats.fail(
                    f"{where_batch}: item {j} of the previous batch changed "
                    "(an output aliases a graph buffer)"
                )
        previous = [
            (out, out.clone()) for out in outputs if isinstance(out, torch.Tensor)
        ]

    cumulative = manager.get_cumulative_stats()
    phase_items = stats.items - items_before
    # One count per item and replayed path (per item for a single path).
    counted = cumulative["graph_hits"] + cumulative["graph_misses"]
    if counted != expected_hits + expected_misses:
        stats.fail(
            f"{phase.name}: hits {cumulative['graph_hits']} + misses "
            f"{cumulative['graph_misses']} != {expected_hits + expected_misses} "
            f"(items {phase_items}, each once per replayed path)"
        )
    summary = {
        "token_budgets": budgets,
        "max_batch_size": manager.max_batch_size,
        "num_graphs": cumulative["num_budgets"],
        "capture_s": round(capture_s, 3),
        "batches": len(phase.batches),
        "items": phase_items,
        "graph_hits": cumulative["graph_hits"],
        "graph_misses": cumulative["graph_misses"],
        "eager_fallbacks": _padding_totals(manager)["eager_batches"],
        "padding_waste": manager.get_padding_stats()["waste_fraction"],
        "path_budgets": phase.path_budgets,
        "path_coverage": phase.coverage,
        "path_budgets_replayed": {
            p: sorted(b for q, b in replayed_here if q == p) for p in phase.path_budgets
        },
    }
    if poison is not None:
        summary["poisoned_bytes"] = poison.nbytes
        summary["poisoned_blocks"] = poison.nblocks
        summary["pool_free_bytes"] = poison.free_bytes
    # The poison graph holds the pool too: drop it before the manager frees it.
    poison = None
    manager.clear()
    return summary


def run_equivalence(
    stem: str,
    size: Size,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    graph_backend: GraphBackend | Callable[[], GraphBackend],
    num_batches: int = 30,
    seed: int = 0,
    tolerance: float | None = None,
    attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    max_tokens: int | None = None,
    max_items: int | None = None,
    over_max_extra: int | None = None,
    max_random_tokens: int | None = None,
    eager_batches: int | None = None,
    poison_pool: bool = False,
    mixin: type | None = None,
) -> dict[str, Any]:
    """Run the equivalence check of one spec; see the module docstring.

    Args:
        stem: spec stem (``specs/<stem>.yaml``, a ``REFERENCE_TOWERS`` key).
        size: ``"tiny"`` or ``"full"``.
        device, dtype: where and in what the host runs (the eager reference
            runs there too, in the same dtype).
        graph_backend: a backend, or a zero-argument factory of one.
        num_batches: ``execute`` calls in total (all phases).
        seed: drives weights, items and pixels.
        tolerance: ``max|out - ref| <= tolerance * max(1, max|ref|)`` per
            item; :data:`DEFAULT_TOLERANCE` of ``dtype`` when ``None``.
        attn_backend: the tower's ViT attention backend.
        max_tokens: ``max_num_batched_tokens`` = ``max_model_len``
            (:data:`DEFAULT_MAX_TOKENS` of ``size`` when ``None``).
        max_items: bound on items of the kinds that draw a random count
            (default ``max_batch_size``); boundary and over-max kinds take
            what they need.
        over_max_extra: ``over_max_batch`` batches hold ``max_batch_size + 1
            .. + over_max_extra`` small items (default ``max_batch_size + 1``).
        max_random_tokens: bound on the tokens of randomly sized items
            (default: the tower's per-item cap); boundary, cap and eager
            items are exempt.
        eager_batches: batches of the eager-ladder phase (default: a fifth,
            at least 2; none when the default phase can draw eager items).
        poison_pool: (CUDA) fill the pool's free blocks with NaN after
            capture and before every execute (:func:`poison_graph_pool`).
        mixin: the protocol implementation to check (default: the
            generated ``generated.standalone.<stem>`` mixin), e.g. vLLM's own.

    Returns:
        A JSON-serialisable summary; ``failures`` lists mismatches (empty
        when the mixin is right). :func:`assert_equivalent` checks it.
    """
    start = time.perf_counter()
    device = torch.device(device)
    tower = REFERENCE_TOWERS[stem]
    tol = DEFAULT_TOLERANCE[dtype] if tolerance is None else tolerance
    backend = (
        graph_backend()
        if isinstance(graph_backend, type) or not hasattr(graph_backend, "capture")
        else graph_backend
    )
    # The host keeps the config's multimodal_config, as vLLM's hosts do.
    mm_config = MultiModalConfig()
    host = build_host(
        stem,
        size,
        device=device,
        dtype=dtype,
        attn_backend=attn_backend,
        multimodal_config=mm_config,
        seed=seed,
        mixin=mixin,
    )
    phases = plan_phases(
        stem,
        size,
        host,
        num_batches=num_batches,
        seed=seed,
        max_tokens=max_tokens,
        max_items=max_items,
        over_max_extra=over_max_extra,
        max_random_tokens=max_random_tokens,
        eager_batches=eager_batches,
        multimodal_config=mm_config,
    )
    stats = _Stats()
    truth = None
    if dtype != torch.float32:
        truth = _FP32Truth(stem, size, host, device=device, seed=seed)
    results: dict[str, Any] = {}
    default_budgets_replayed: list[int] = []
    default_path_replayed: dict[str, list[int]] = {}
    for phase in phases:
        results[phase.name] = _run_phase(
            phase,
            tower=tower,
            host=host,
            device=device,
            dtype=dtype,
            graph_backend=backend,
            tol=tol,
            poison_pool=poison_pool,
            stats=stats,
            truth=truth,
        )
        if phase.name == "default":
            default_budgets_replayed = sorted({b for _, b in stats.budgets_replayed})
            default_path_replayed = results[phase.name]["path_budgets_replayed"]

    return {
        "spec": stem,
        "size": size,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "graph_backend": getattr(backend, "name", type(backend).__name__),
        "attn_backend": attn_backend.name,
        "seed": seed,
        "tolerance": tol,
        "tolerance_rule": (
            "max|out-ref| <= tolerance * max(1, max|ref|) per item; below fp32, "
            "an item over it passes when within it of the fp32 twin (over_bar)"
        ),
        "batches": stats.batches,
        "items": stats.items,
        "graph_hits": sum(p["graph_hits"] for p in results.values()),
        "graph_misses": sum(p["graph_misses"] for p in results.values()),
        "eager_fallbacks": stats.eager_batches,
        "eager_items": stats.eager_items,
        "replays": stats.replays,
        "split_executes": stats.split_executes,
        "worst_abs_err": stats.worst_abs_err,
        "worst_rel_err": stats.worst_rel_err,
        "worst": stats.worst,
        "max_padding_waste": stats.max_padding_waste,
        "padding_waste": (
            (stats.rows_replayed - stats.rows_used) / stats.rows_replayed
            if stats.rows_replayed
            else 0.0
        ),
        "default_budgets": results["default"]["token_budgets"],
        "default_budgets_replayed": default_budgets_replayed,
        "default_path_coverage": results["default"]["path_coverage"],
        "default_path_budgets_replayed": default_path_replayed,
        "budgets_replayed": sorted({b for _, b in stats.budgets_replayed}),
        "kinds": dict(sorted(stats.kinds.items())),
        "nonfinite": stats.nonfinite,
        "nonfinite_buffers": stats.nonfinite_buffers,
        "aliasing": stats.aliasing,
        "phases": results,
        "num_failures": stats.num_failures,
        "failures": stats.failures,
        "over_bar": stats.over_bar,
        "over_bar_within_fp32": sum(
            1 for e in stats.over_bar if e["within_bar_of_fp32"]
        ),
        "seconds": round(time.perf_counter() - start, 3),
    }


def assert_equivalent(
    summary: dict[str, Any], *, require_coverage: bool = True
) -> None:
    """Fail with the run's failures; with ``require_coverage`` also demand
    that every default budget was replayed, that some graph was replayed,
    that the manager split at least one execute and (where an eager phase
    ran) fell back to the eager forward."""
    problems = list(summary["failures"])
    if summary["num_failures"] > len(problems):
        problems.append(f"... {summary['num_failures'] - len(problems)} more")
    if require_coverage:
        for path, budgets in summary["default_path_coverage"].items():
            replayed = summary["default_path_budgets_replayed"].get(path, [])
            missing = sorted(set(budgets) - set(replayed))
            if missing:
                where = "" if path == "default" else f" of path {path!r}"
                problems.append(f"default budgets{where} never replayed: {missing}")
        if summary["graph_hits"] == 0:
            problems.append("no graph was replayed")
        if summary["split_executes"] == 0:
            problems.append("no execute was split into several batches")
        if "eager_ladder" in summary["phases"] and summary["eager_fallbacks"] == 0:
            problems.append("no batch fell back to the eager forward")
    if problems:
        head = (
            f"{summary['spec']} {summary['size']} {summary['dtype']} on "
            f"{summary['device']} ({summary['graph_backend']}): "
        )
        raise AssertionError(head + "\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------
# One item, diagnosed
# ---------------------------------------------------------------------------


def _as_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    if isinstance(value, dict):
        return {k: _as_fp32(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as_fp32(v) for v in value)
    return value


def _fp32_twin(stem: str, size: Size, host: Any, *, device, seed: int) -> Any:
    """The host's tower in fp32, with exactly the host's (rounded) weights,
    on TORCH_SDPA (the flash varlen kernel has no fp32)."""
    twin = build_host(
        stem,
        size,
        device=device,
        dtype=torch.float32,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
        multimodal_config=MultiModalConfig(),
        seed=seed,
    )
    ours = host.state_dict()
    with torch.no_grad():
        for name, value in twin.state_dict().items():
            if value.is_floating_point():
                value.copy_(ours[name].float())
    return twin


class _FP32Truth:
    """The fp32 twin's outputs for a batch: the twin is built at first use
    (an item over the bar is rare), and the last batch's outputs are kept
    (several items of one batch)."""

    def __init__(self, stem: str, size: Size, host: Any, *, device, seed: int):
        self._args = (stem, size, host, device, seed)
        self._twin: Any = None
        self._last: tuple[dict[str, Any], list[torch.Tensor]] | None = None

    def __call__(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        if self._last is not None and self._last[0] is mm_kwargs:
            return self._last[1]
        stem, size, host, device, seed = self._args
        if self._twin is None:
            self._twin = _fp32_twin(stem, size, host, device=device, seed=seed)
        with torch.inference_mode():
            outputs = REFERENCE_TOWERS[stem].reference_outputs(
                self._twin, _as_fp32(mm_kwargs)
            )
        self._last = (mm_kwargs, outputs)
        return outputs


def diagnose_item(
    stem: str,
    size: Size,
    *,
    batch: int,
    item: int,
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    graph_backend: Callable[[], GraphBackend],
    phase_name: str = "default",
    seed: int = 0,
) -> dict[str, Any]:
    """Where one item's graph result stands: batch ``batch`` of the GPU run's
    phase replayed after the batches before it (as the suite runs it) and on
    a freshly captured manager (a difference: state left by earlier replays),
    against the eager reference in ``dtype`` and an fp32 truth with the same
    weights. Relative errors as the suite's bar measures them."""
    device = torch.device(device)
    tower = REFERENCE_TOWERS[stem]
    host = build_host(
        stem,
        size,
        device=device,
        dtype=dtype,
        multimodal_config=MultiModalConfig(),
        seed=seed,
    )
    wanted = inspect.signature(plan_phases).parameters
    settings = {k: v for k, v in gpu_run(stem, size).items() if k in wanted}
    (phase,) = [
        p
        for p in plan_phases(
            stem,
            size,
            host,
            seed=seed,
            multimodal_config=MultiModalConfig(),
            **settings,
        )
        if p.name == phase_name
    ]

    def kwargs_of(b: int) -> dict[str, Any]:
        plan = phase.batches[b]
        return tower.make_mm_kwargs(
            host, plan.items, device, seed=plan.seed, **_modality_kwargs(plan.modality)
        )

    def graph_result(batches: range) -> torch.Tensor:
        manager = build_manager(
            host,
            phase.vllm_config,
            device=device,
            dtype=dtype,
            graph_backend=graph_backend(),
        )
        manager.capture()
        for b in batches:
            outputs = manager.execute(kwargs_of(b))
        result = outputs[item].clone()
        manager.clear()
        return result

    in_sequence = graph_result(range(batch + 1))
    fresh = graph_result(range(batch, batch + 1))
    mm_kwargs = kwargs_of(batch)
    with torch.inference_mode():
        eager = tower.reference_outputs(host, mm_kwargs)[item]
        twin = _fp32_twin(stem, size, host, device=device, seed=seed)
        truth = tower.reference_outputs(twin, _as_fp32(mm_kwargs))[item]
    return {
        "spec": stem,
        "size": size,
        "phase": phase_name,
        "batch": batch,
        "item": item,
        "item_dims": list(phase.batches[batch].items[item]),
        "batch_items": len(phase.batches[batch].items),
        "dtype": str(dtype).removeprefix("torch."),
        "graph_in_sequence_vs_eager": _rel_err(in_sequence, eager),
        "graph_fresh_vs_eager": _rel_err(fresh, eager),
        "graph_in_sequence_vs_fresh": _rel_err(in_sequence, fresh),
        "graph_vs_fp32": _rel_err(in_sequence, truth),
        "eager_vs_fp32": _rel_err(eager, truth),
        "fp32_absmax": truth.abs().max().item(),
    }
