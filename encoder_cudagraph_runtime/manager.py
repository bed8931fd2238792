"""Budget-batched encoder CUDA graphs: the standalone ``EncoderCudaGraphManager``.

Behaviour follows ``vllm/v1/worker/encoder_cudagraph.py`` of vLLM 0.33.0:
given the same configuration, model and item specs, this manager resolves
the same budgets and batch size, forms the same batches, replays the same
budget per batch and path, falls back to eager on the same paths, copies
replay data the same way and counts the same hits and misses.

One option changes those decisions, and it is off by default:
cost-aware execution (``cost_aware=True``, :mod:`~encoder_cudagraph_runtime.cost_aware`)
plans each execute from measured graph and eager costs once
:meth:`~EncoderCudaGraphManager.calibrate_cost_model` has run.

What it adds besides, none of which changes those decisions:

* a pluggable graph backend (:mod:`encoder_cudagraph_runtime.graph_backends`),
  so everything but the CUDA graph itself runs and is tested on a CPU;
* padding-waste statistics per path and budget (:meth:`get_padding_stats`);
* an optional plain-text capture progress line on stderr and a capture
  report (graph count, seconds, pool bytes: :meth:`get_capture_report`);
* a :meth:`clear` that actually returns the pool's memory;
* a cheaper replay copy that zeroes only the rows an earlier replay wrote,
  used for the graphs whose buffers pass the capture-time checks of
  :mod:`~encoder_cudagraph_runtime.buffer_aliasing` (the others get vLLM's
  plain copy; ``docs/runtime.md``);
* optional host-overhead timing of :meth:`execute`
  (:meth:`get_timing_stats`), which splits wall time into time inside model
  methods, time inside ``graph.replay()`` and the manager's own overhead.

Lifecycle: construct (resolves budgets), :meth:`capture` once (or again after
:meth:`clear`), then :meth:`execute` per modality group.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
import math
import sys
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import torch

from encoder_cudagraph_runtime import distributed
from encoder_cudagraph_runtime.budget_ladder import (
    generate_budgets,
    path_budgets,
    resolve_budget_ladder,
)
from encoder_cudagraph_runtime.buffer_aliasing import (
    changed_inputs,
    overlapping_owners,
    snapshot_inputs,
)
from encoder_cudagraph_runtime.config import VllmConfig
from encoder_cudagraph_runtime.cost_aware import (
    CalibrationEstimate,
    CostModel,
    EagerSample,
    ExecutionStats,
    GraphSample,
    calibrated_cost_model,
    plan_execution,
)
from encoder_cudagraph_runtime.defs import (
    ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
    BudgetGraphMapKey,
    BudgetGraphMetadata,
    CaptureAxisKeys,
    EncoderCudaGraphConfig,
    EncoderItemSpec,
)
from encoder_cudagraph_runtime.dp_sharding import (
    DPShardPlan,
    pad_local_output,
    plan_dp_shard,
    unshard_gathered,
)
from encoder_cudagraph_runtime.graph_backends import (
    CudaGraphBackend,
    GraphBackend,
    MemoryCounters,
    ReplayableGraph,
)
from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph
from encoder_cudagraph_runtime.packing import (
    PackedBatch,
    fitting_budget,
    pack_items,
    smallest_fitting_budget,
)

__all__ = [
    "BudgetGraphMapKey",
    "BudgetGraphMetadata",
    "CaptureReport",
    "EncoderCudaGraphManager",
    "ExecuteTiming",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# Above this many graphs (budgets x axis combinations) capture warns: each
# graph costs capture time and pool memory.
_MANY_GRAPHS_WARNING_THRESHOLD = 64

_perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class CaptureReport:
    """What one :meth:`EncoderCudaGraphManager.capture` call cost."""

    backend: str
    num_graphs: int
    """Graphs captured (all paths, budgets and axis combinations)."""
    seconds: float
    """Wall time of the capture, device synchronised at the end."""
    pool_bytes: int | None
    """Bytes held by the graph pool's segments right after capture (CUDA
    backend with allocator snapshots), else ``None``."""
    reserved_bytes_delta: int | None
    """Growth of ``torch.cuda.memory_reserved`` over the capture."""
    allocated_bytes_delta: int | None
    """Growth of ``torch.cuda.memory_allocated`` over the capture (captured
    buffers, output buffers, live pool blocks)."""
    plain_copy_graphs: int = 0
    """Graphs replayed with vLLM's plain copy instead of the written-rows
    shortcut: their buffers share memory with another captured buffer, or
    their forward wrote its inputs (see
    :mod:`~encoder_cudagraph_runtime.buffer_aliasing`)."""


@dataclass
class ExecuteTiming:
    """Host-time split of :meth:`EncoderCudaGraphManager.execute` calls.

    ``overhead = total - model - replay`` is the manager's own host cost
    (sorting, packing, dictionary work, its default replay copies, result
    ordering). ``model`` is every call into model code: the protocol
    methods and the model's padding logics (``padding_logics`` of its
    config), which replace the default copy for their buffers.
    Nanoseconds, from ``time.perf_counter_ns``; no device synchronisation,
    so GPU execution time only shows up where the host waits for the GPU.
    """

    executes: int = 0
    items: int = 0
    total_ns: int = 0
    model_ns: int = 0
    replay_ns: int = 0
    last_items: int = 0
    last_total_ns: int = 0
    last_model_ns: int = 0
    last_replay_ns: int = 0
    # Accumulators of the execute in progress.
    _cur_model_ns: int = field(default=0, repr=False)
    _cur_replay_ns: int = field(default=0, repr=False)

    @property
    def overhead_ns(self) -> int:
        return self.total_ns - self.model_ns - self.replay_ns

    @property
    def last_overhead_ns(self) -> int:
        return self.last_total_ns - self.last_model_ns - self.last_replay_ns

    def as_dict(self) -> dict[str, int | float]:
        executes = max(self.executes, 1)
        return {
            "executes": self.executes,
            "items": self.items,
            "total_ns": self.total_ns,
            "model_ns": self.model_ns,
            "replay_ns": self.replay_ns,
            "overhead_ns": self.overhead_ns,
            "overhead_us_per_execute": self.overhead_ns / executes / 1e3,
            "last_items": self.last_items,
            "last_total_ns": self.last_total_ns,
            "last_model_ns": self.last_model_ns,
            "last_replay_ns": self.last_replay_ns,
            "last_overhead_ns": self.last_overhead_ns,
        }


#: Default :attr:`EncoderCudaGraphManager.calibration_limit_ms`: with the
#: capture's replay timing, calibration stays under 15 s per ladder.
CALIBRATION_LIMIT_MS = 10_000.0

#: A timed call whose first run takes at least this long is timed by that
#: run alone: its one-time costs are small beside it, and each repeat of a
#: 65k-token Qwen2-VL replay (1.6 s on an H100) costs as much as hundreds of
#: small units (issue #27: capture and calibration of such ladders).
LONG_CALL_MS = 100.0

#: Calibration starts a call only if this multiple of its estimate
#: (:class:`~encoder_cudagraph_runtime.cost_aware.CalibrationEstimate`)
#: still fits its time limit: the estimate rests on smaller units.
CALIBRATION_ESTIMATE_MARGIN = 1.25


@dataclass(frozen=True)
class _CalibrationUnit:
    """One selection of a warm-up batch that calibration times."""

    mm_kwargs: dict[str, Any]
    selection: list[int]
    rows: tuple[int, ...]
    """The selection's rows, ascending."""
    tokens: list[int]
    """Output tokens of every item of ``mm_kwargs``."""
    item_rows: list[int]
    """Rows of every item of ``mm_kwargs``."""


class _CaptureProgress:
    """A dependency-free progress line for capture.

    On a terminal the line is redrawn in place; otherwise (logs, CI) one line
    per graph is written so the output stays readable.
    """

    def __init__(self, total: int, stream: IO[str]) -> None:
        self.total = total
        self.stream = stream
        self.done = 0
        self.start = time.perf_counter()
        self.inplace = bool(getattr(stream, "isatty", lambda: False)())

    def step(self, path: str, budget: int, axis_keys: CaptureAxisKeys) -> None:
        self.done += 1
        width = len(str(self.total))
        axes = f" axes={axis_keys}" if axis_keys else ""
        line = (
            f"encoder CUDA graphs [{self.done:>{width}}/{self.total}] "
            f"path={path} budget={budget}{axes} "
            f"{time.perf_counter() - self.start:.1f}s"
        )
        end = "" if self.inplace and self.done < self.total else "\n"
        prefix = "\r" if self.inplace else ""
        self.stream.write(prefix + line + end)
        self.stream.flush()


class EncoderCudaGraphManager:
    """Captures one graph per (path, token budget, axis combination) and
    packs each execute's items into as few, as small, replays as possible.

    Args:
        vllm_config: runtime configuration (budgets, items per batch, video
            limit, TP size and encoder TP mode are read from it).
        device: device of the captured buffers.
        dtype: encoder dtype (capture inputs, DP gather buffers).
        model: the model implementing :class:`SupportsEncoderCudaGraph`.
        graph_backend: how graphs are captured and replayed; default
            :class:`~encoder_cudagraph_runtime.graph_backends.CudaGraphBackend`
            on ``device``. Use
            :class:`~encoder_cudagraph_runtime.graph_backends.EagerReplayGraphBackend`
            without a GPU.
        progress: write a capture progress line to ``progress_stream``.
        progress_stream: where progress goes (default ``sys.stderr``).
        collect_timing: time every :meth:`execute` (see
            :class:`ExecuteTiming`); can be toggled later with
            :meth:`enable_timing`.
        cost_aware: plan each execute from measured costs instead of
            vLLM's packing once :meth:`calibrate_cost_model` has run (see
            :mod:`~encoder_cudagraph_runtime.cost_aware`); capture then
            times every graph once. Off by default: vLLM's behaviour.
            Single-path models without capture axes only.
        clock: nanosecond clock of the cost-aware timings (default
            ``time.perf_counter_ns``; tests pass a virtual one).

    Raises:
        ValueError: invalid budget range, user items per batch above the
            smallest user budget, an empty capture axis, no paths, or a
            path minimum budget outside ``(0, largest budget]``.
        NotImplementedError: several paths combined with capture axes;
            ``cost_aware`` with several paths or capture axes.
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        dtype: torch.dtype,
        model: SupportsEncoderCudaGraph,
        *,
        graph_backend: GraphBackend | None = None,
        progress: bool = False,
        progress_stream: IO[str] | None = None,
        collect_timing: bool = False,
        cost_aware: bool = False,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.vllm_config = vllm_config
        self.device = device
        self.dtype = dtype
        self.model = model
        self.graph_backend: GraphBackend = (
            graph_backend if graph_backend is not None else CudaGraphBackend(device)
        )
        self.progress = progress
        self.progress_stream = progress_stream
        self.config: EncoderCudaGraphConfig = model.get_encoder_cudagraph_config()

        compilation = vllm_config.compilation_config
        user_budgets = compilation.encoder_cudagraph_token_budgets
        user_max_items = compilation.encoder_cudagraph_max_vision_items_per_batch
        user_max_frames = compilation.encoder_cudagraph_max_frames_per_batch
        multimodal_config = vllm_config.model_config.multimodal_config

        self._capture_axes: tuple[CaptureAxisKeys, ...] = tuple(
            tuple(axis) for axis in self.config.capture_axes
        )
        if any(len(axis) == 0 for axis in self._capture_axes):
            raise ValueError(
                "Every encoder CUDA graph capture axis must be non-empty "
                f"(capture_axes={self._capture_axes})."
            )
        if len(self.config.paths) > 1 and self._capture_axes:
            raise NotImplementedError(
                "Encoder CUDA graphs with several paths cannot use capture " "axes yet."
            )

        self.token_budgets: list[int]
        self.max_batch_size: int
        self._resolve_budgets(user_budgets, user_max_items)

        assert multimodal_config is not None
        if multimodal_config.get_limit_per_prompt("video") == 0:
            self.max_frames_per_batch = 0
        elif user_max_frames is not None:
            self.max_frames_per_batch = user_max_frames
        else:
            self.max_frames_per_batch = (
                self.max_batch_size * self.config.max_frames_per_video
            )

        self.use_dp = (
            multimodal_config is not None
            and multimodal_config.mm_encoder_tp_mode == "data"
            and vllm_config.parallel_config.tensor_parallel_size > 1
        )

        self.budget_graphs: dict[str, dict[BudgetGraphMapKey, BudgetGraphMetadata]] = {}
        self.graph_pool: Any | None = None
        # Per captured graph (by id of its BudgetGraphMetadata, which
        # budget_graphs keeps alive until clear()), the leading rows of each
        # default-copied buffer that the last write may have left non-zero;
        # later rows are zero. Absent: the whole buffer (capture's values).
        self._written_rows: dict[int, dict[str, int]] = {}
        # Graphs (by id of their BudgetGraphMetadata) whose buffers break the
        # shortcut's assumptions, with the reason: replayed with vLLM's plain
        # copy (see buffer_aliasing).
        self._plain_copy: dict[int, str] = {}
        self.graph_hits = 0
        self.graph_misses = 0
        self.log_stats_interval = 100

        if not self.config.paths:
            raise ValueError(
                "The encoder CUDA graph config needs at least one path "
                "(paths is empty)."
            )
        self.path_token_budgets: dict[str, list[int]] = {
            path: path_budgets(
                path,
                self.token_budgets,
                path_config.min_token_budget,
                path_config.allow_zero_tokens,
            )
            for path, path_config in self.config.paths.items()
        }

        # Hot-path caches of facts that are fixed from here on.
        self._paths: tuple[str, ...] = tuple(self.path_token_budgets)
        self._path_budget_lists: list[list[int]] = [
            self.path_token_budgets[path] for path in self._paths
        ]

        # Additions beyond vLLM (observability only).
        self._padding: dict[str, dict[int, list[int]]] = {}
        self._eager: dict[str, list[int]] = {}
        self._capture_report: CaptureReport | None = None
        self._timer: ExecuteTiming | None = ExecuteTiming() if collect_timing else None

        # Cost-aware execution (off by default).
        self._clock: Callable[[], int] = clock or _perf_ns
        self._replay_ms: dict[int, float] = {}
        self._cost_model: CostModel | None = None
        self._calibration: tuple[list[EagerSample], list[GraphSample]] = ([], [])
        self._calibration_report: dict[str, Any] = {}
        #: Device time a calibration may spend timing units (issue #27:
        #: 252 s on a ladder up to 147k DeepSeek-V4.1 patches, against
        #: 10-31 s on the others); settable.
        self.calibration_limit_ms = CALIBRATION_LIMIT_MS
        self._execution = ExecutionStats()
        self._cost_aware = False
        self.cost_aware = cost_aware
        self._planned_budgets = [
            b for b in self.path_token_budgets.get("default", []) if b != 0
        ]

        logger.info(
            "EncoderCudaGraphManager: path budgets=%s, max_batch_size=%d, "
            "max_frames_per_batch=%d, use_dp=%s, capture_axes=%s, backend=%s",
            self.path_token_budgets,
            self.max_batch_size,
            self.max_frames_per_batch,
            self.use_dp,
            self._capture_axes,
            getattr(self.graph_backend, "name", type(self.graph_backend).__name__),
        )

    # ------------------------------------------------------------------
    # Budget resolution
    # ------------------------------------------------------------------

    def _resolve_budgets(self, user_budgets: list[int], user_max_items: int) -> None:
        """Set ``token_budgets`` and ``max_batch_size``
        (:func:`~encoder_cudagraph_runtime.budget_ladder.resolve_budget_ladder`;
        the model's range is only queried when something is left to infer)."""
        self.token_budgets, self.max_batch_size = resolve_budget_ladder(
            user_budgets,
            user_max_items,
            lambda: self.model.get_encoder_cudagraph_budget_range(self.vllm_config),
        )

    @staticmethod
    def _generate_budgets(min_budget: int, max_budget: int) -> list[int]:
        """vLLM's name for :func:`~encoder_cudagraph_runtime.budget_ladder.generate_budgets`."""
        return generate_budgets(min_budget, max_budget)

    # ------------------------------------------------------------------
    # Queries
    # ------------------------------------------------------------------

    def supports_modality(self, modality: str) -> bool:
        """Whether ``execute`` handles inputs of ``modality``."""
        return modality in self.config.modalities

    def is_captured(self) -> bool:
        """Whether a capture is in place (a pool is held)."""
        return self.graph_pool is not None

    def _num_graphs_for_budgets(self, budgets: list[int]) -> int:
        nonzero = sum(1 for budget in budgets if budget != 0)
        return nonzero * math.prod(len(axis) for axis in self._capture_axes)

    def get_num_graphs_to_capture(self) -> int:
        """Graphs :meth:`capture` records: non-zero budgets of every path
        times the number of axis combinations."""
        return sum(
            self._num_graphs_for_budgets(budgets)
            for budgets in self.path_token_budgets.values()
        )

    def _get_graph_set(
        self, path: str = "default"
    ) -> dict[BudgetGraphMapKey, BudgetGraphMetadata]:
        """The captured graphs of ``path`` (created empty on first use)."""
        graph_set = self.budget_graphs.get(path)
        if graph_set is None:
            graph_set = self.budget_graphs[path] = {}
        return graph_set

    def _find_smallest_fitting_budget_given_tokens(
        self, total_tokens: int, budgets: list[int] | None = None
    ) -> int | None:
        """Smallest budget ``>= total_tokens`` (global budgets by default)."""
        return smallest_fitting_budget(
            self.token_budgets if budgets is None else budgets, total_tokens
        )

    def _path_fitting_budget(self, path: str, tokens: int) -> int | None:
        """``path``'s budget for ``tokens`` rows: 0 when idle, ``None`` when
        too big for every budget."""
        return fitting_budget(self.path_token_budgets[path], tokens)

    # ------------------------------------------------------------------
    # Capture and release
    # ------------------------------------------------------------------

    def capture(self, graph_pool: Any = None) -> None:
        """Capture every path's non-zero budgets (largest first) times every
        axis combination into ``graph_pool``.

        Largest first lets the smaller graphs reuse the pool blocks the
        larger ones freed, so the pool ends up about the size of the largest
        graph. ``graph_pool=None`` asks the backend for a fresh pool.
        """
        if graph_pool is None:
            graph_pool = self.graph_backend.graph_pool_handle()
        self.graph_pool = graph_pool
        # Every graph is captured anew: its checks too.
        self._plain_copy.clear()

        num_graphs = self.get_num_graphs_to_capture()
        if num_graphs > _MANY_GRAPHS_WARNING_THRESHOLD:
            logger.warning(
                "Capturing %d encoder CUDA graphs; every capture axis key "
                "multiplies the graphs per budget, consider fewer keys.",
                num_graphs,
            )
        progress = (
            _CaptureProgress(num_graphs, self.progress_stream or sys.stderr)
            if self.progress and num_graphs > 0
            else None
        )

        backend = self.graph_backend
        memory_before = backend.memory_counters()
        start = time.perf_counter()
        for path, budgets in self.path_token_budgets.items():
            for token_budget in sorted(budgets, reverse=True):
                if token_budget == 0:
                    continue
                for axis_keys in itertools.product(*self._capture_axes):
                    self._capture_budget_graph(
                        token_budget, path=path, axis_keys=axis_keys
                    )
                    if progress is not None:
                        progress.step(path, token_budget, axis_keys)
        backend.synchronize()
        seconds = time.perf_counter() - start
        memory_after = backend.memory_counters()
        self._flag_shared_buffers()

        self._capture_report = CaptureReport(
            backend=getattr(backend, "name", type(backend).__name__),
            num_graphs=num_graphs,
            seconds=seconds,
            pool_bytes=backend.pool_bytes(graph_pool),
            reserved_bytes_delta=_delta(memory_before, memory_after, "reserved"),
            allocated_bytes_delta=_delta(memory_before, memory_after, "allocated"),
            plain_copy_graphs=len(self._plain_copy),
        )
        logger.info(
            "Captured %d encoder CUDA graphs across %d paths in %.2fs "
            "(pool bytes: %s).",
            num_graphs,
            len(self.path_token_budgets),
            seconds,
            self._capture_report.pool_bytes,
        )

    def _capture_budget_graph(
        self,
        token_budget: int,
        path: str = "default",
        axis_keys: CaptureAxisKeys = (),
    ) -> None:
        """Capture the graph of one (path, budget, axis combination)."""
        logger.debug(
            "Capturing encoder graph: path=%s budget=%d max_batch_size=%d "
            "max_frames_per_batch=%d axis_keys=%s",
            path,
            token_budget,
            self.max_batch_size,
            self.max_frames_per_batch,
            axis_keys,
        )
        graph_set = self._get_graph_set(path)
        values = self.model.prepare_encoder_cudagraph_capture_inputs(
            token_budget,
            self.max_batch_size,
            self.max_frames_per_batch,
            self.device,
            self.dtype,
            path,
            axis_keys,
        ).values

        # Warm-up outside the graph (on the capture stream): lazy
        # initialisation (kernel selection, workspaces) must not happen during
        # capture, and the output's shape and dtype size the output buffer.
        # The buffer is an ordinary allocation on the caller's stream, so it
        # is not part of the pool whose memory the next capture reuses.
        # Comparing the inputs before and after tells whether the forward
        # writes them (the written-rows shortcut assumes it never does).
        with self.graph_backend.capture_scope(), torch.inference_mode():
            before = snapshot_inputs(values)
            warmup = self.model.encoder_cudagraph_forward({**values}, path=path)
            written = changed_inputs(values, before)
            del before
        with torch.inference_mode():
            output_buffer = torch.empty_like(warmup)
        del warmup

        forward = functools.partial(self.model.encoder_cudagraph_forward, path=path)
        graph = self.graph_backend.capture(
            forward, values, output_buffer, self.graph_pool
        )
        key: BudgetGraphMapKey = (
            token_budget if not axis_keys else (token_budget, axis_keys)
        )
        graph_set[key] = BudgetGraphMetadata(
            token_budget=token_budget,
            max_batch_size=self.max_batch_size,
            max_frames_per_batch=self.max_frames_per_batch,
            graph=graph,
            input_buffers=values,
            output_buffer=output_buffer,
            axis_keys=axis_keys,
        )
        # A new graph's buffers hold the capture values everywhere (its id
        # may be that of a replaced, freed one).
        self._written_rows.pop(id(graph_set[key]), None)
        self._plain_copy.pop(id(graph_set[key]), None)
        if self._cost_aware:
            self._replay_ms[token_budget] = self._time_ms(graph.replay, repeats=1)
        if written:
            self._plain_copy[id(graph_set[key])] = (
                f"the forward writes its inputs {written}"
            )

    def _flag_shared_buffers(self) -> None:
        """Mark the graphs whose buffers share memory with any other
        captured tensor for vLLM's plain replay copy."""
        metas = {
            id(meta): meta
            for graph_set in self.budget_graphs.values()
            for meta in graph_set.values()
        }
        shared = overlapping_owners(
            {owner: meta.input_buffers for owner, meta in metas.items()}
        )
        for owner in shared:
            self._plain_copy.setdefault(
                owner, "its buffers share memory with other captured buffers"
            )
        for owner, reason in self._plain_copy.items():
            meta = metas.get(owner)
            if meta is None:
                continue
            logger.info(
                "Encoder graph budget=%d axis_keys=%s: %s; replays zero the "
                "whole buffers, as vLLM does.",
                meta.token_budget,
                meta.axis_keys,
                reason,
            )

    def clear(self) -> None:
        """Drop every graph, captured buffer and the pool, and give their
        memory back to the device.

        The graphs are what keeps a private pool alive; once they and the
        buffers are unreferenced, a garbage collection (for cycles) and
        ``empty_cache`` return the pool's segments, so capture -> clear ->
        capture does not grow memory.
        """
        self.graph_backend.synchronize()
        for graph_set in self.budget_graphs.values():
            graph_set.clear()
        self._written_rows.clear()
        self._plain_copy.clear()
        self._replay_ms.clear()
        self._cost_model = None
        self._calibration = ([], [])
        self.graph_pool = None
        gc.collect()
        self.graph_backend.release_cached_memory()

    def get_capture_report(self) -> CaptureReport | None:
        """Cost of the latest :meth:`capture` (``None`` before any)."""
        return self._capture_report

    # ------------------------------------------------------------------
    # Model calls (optionally timed)
    # ------------------------------------------------------------------

    def _call_model(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
        """Call a model method, charging its time to the model when timing."""
        timer = self._timer
        if timer is None:
            return fn(*args, **kwargs)
        start = _perf_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            timer._cur_model_ns += _perf_ns() - start

    def _replay(self, graph: ReplayableGraph) -> None:
        timer = self._timer
        if timer is None:
            graph.replay()
            return
        start = _perf_ns()
        try:
            graph.replay()
        finally:
            timer._cur_replay_ns += _perf_ns() - start

    def _get_item_specs(self, mm_kwargs: dict[str, Any]) -> list[EncoderItemSpec]:
        """The model's item specs (it may read sizes off device tensors)."""
        return self._call_model(self.model.get_encoder_cudagraph_item_specs, mm_kwargs)

    def _select_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> tuple[dict[str, Any], CaptureAxisKeys]:
        """The sub-batch kwargs of ``indices`` and its capture-axis keys.

        The keys are removed from the returned dict, so no other model
        method sees the reserved entry; their count must match the axes.
        """
        selected = self._call_model(
            self.model.select_encoder_cudagraph_items, mm_kwargs, indices
        )
        axis_keys = selected.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, ())
        if len(axis_keys) != len(self._capture_axes):
            raise ValueError(
                f"select_encoder_cudagraph_items returned {len(axis_keys)} "
                f"capture axis keys; capture_axes has {len(self._capture_axes)} "
                "axes and needs exactly one key per axis."
            )
        return selected, axis_keys

    def _get_per_item_out_tokens(self, mm_kwargs: dict[str, Any]) -> list[int]:
        return [spec.output_tokens for spec in self._get_item_specs(mm_kwargs)]

    # ------------------------------------------------------------------
    # Replay
    # ------------------------------------------------------------------

    @staticmethod
    def _copy_padded_buffer(dst: torch.Tensor, src: torch.Tensor) -> None:
        """Default replay copy: ``src`` in the leading rows, zeros in every
        row after them (stale rows of a larger earlier batch must not leak
        into this replay).

        vLLM writes this as ``dst.zero_(); dst[:n].copy_(src)``. The buffer
        ends up identical here, with fewer bytes written and, on an exact
        fit, fewer kernel launches:

        * ``n == rows``: ``dst[:rows]`` is ``dst`` itself and ``copy_``
          writes every element (broadcasting included), so the zero fill
          would be overwritten entirely: one copy, no fill.
        * ``n < rows``: the fill of the head rows would be overwritten by
          the copy, so only the tail ``dst[n:]`` is zeroed. Both views come
          from one ``split_with_sizes`` call (the same views as ``dst[:n]``
          and ``dst[n:]``, for the host cost of one slice). Head and tail do
          not overlap, so their order does not matter (``src`` is the
          model's fresh replay value, never a view of the captured buffer).
        * anything else (a 0-d tensor, more rows than the buffer holds):
          vLLM's own two statements, so the same error is raised at the
          same point.
        """
        if src.ndim > 0 and dst.ndim > 0:
            n = src.shape[0]
            rows = dst.shape[0]
            if n == rows:
                dst.copy_(src)
                return
            if n < rows:
                head, tail = dst.split_with_sizes((n, rows - n))
                tail.zero_()
                head.copy_(src)
                return
        dst.zero_()
        dst[: src.shape[0]].copy_(src)

    def _plain_replay_copy(
        self, meta: BudgetGraphMetadata, replay_values: dict[str, Any]
    ) -> None:
        """vLLM's replay copy, key by key in captured order: the padding
        logic, or the whole buffer zeroed behind the batch's rows. For
        graphs whose buffers share memory or are written by the forward."""
        padding_logics = self.config.padding_logics
        for name, buf in meta.input_buffers.items():
            src = replay_values.get(name)
            if src is None:
                continue
            if src.ndim == 0:
                buf.copy_(src)
                continue
            logic = padding_logics.get(name)
            if logic is not None:
                self._call_model(logic, buf, src)
            else:
                self._copy_padded_buffer(buf, src)

    def _shortcut_replay_copy(
        self, meta: BudgetGraphMetadata, replay_values: dict[str, Any]
    ) -> None:
        """The replay copy with the written-rows shortcut.

        Default copies are batched into two multi-tensor calls (zero every
        stale tail, copy every head) instead of two ops per buffer: the
        buffers end up as :meth:`_copy_padded_buffer` leaves them, for a
        fraction of its host dispatch cost on models with many buffers. Only
        rows a previous write may have left non-zero are zeroed
        (``written``): replays of same-size batches zero nothing. That, and
        doing custom logics first, is only right because capture checked
        that this graph's buffers share no memory with any other captured
        buffer and that its forward leaves them unchanged
        (:meth:`_flag_shared_buffers`, :meth:`_capture_budget_graph`).
        """
        padding_logics = self.config.padding_logics
        written = self._written_rows.setdefault(id(meta), {})
        heads: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        tails: list[torch.Tensor] = []
        # Only captured keys are written; extra replay keys are ignored.
        for name, buf in meta.input_buffers.items():
            src = replay_values.get(name)
            if src is None:
                continue
            if src.ndim == 0:
                # Scalars are copied as they are; padding logic is for rows.
                buf.copy_(src)
                continue
            logic = padding_logics.get(name)
            if logic is not None:
                # The model's own code: its time is the model's.
                self._call_model(logic, buf, src)
                continue
            n = src.shape[0]
            rows = buf.shape[0] if buf.ndim > 0 else -1
            if n == rows:
                heads.append(buf)
                srcs.append(src)
            elif 0 <= n < rows:
                heads.append(buf.narrow(0, 0, n))
                srcs.append(src)
                stale = written.get(name, rows)
                if stale > n:
                    tails.append(buf.narrow(0, n, stale - n))
            else:
                # More rows than captured (or a 0-d buffer): vLLM's two
                # statements, which raise the same error at the same point.
                written.pop(name, None)
                self._copy_padded_buffer(buf, src)
                continue
            written[name] = n
        if tails:
            torch._foreach_zero_(tails)
        if heads:
            torch._foreach_copy_(heads, srcs)

    def _run_budget_graph(
        self,
        mm_kwargs: dict[str, Any],
        token_budget: int,
        path: str = "default",
        axis_keys: CaptureAxisKeys = (),
        num_items: int | None = None,
    ) -> torch.Tensor | None:
        """Replay ``path``'s graph of ``token_budget`` for this sub-batch.

        ``num_items`` is the sub-batch's item count when the caller knows it
        (the packer does); otherwise the model's item specs are asked, one
        more model call per replay.

        Returns the graph's full output buffer (padding rows included), or
        ``None`` when no such graph was captured (counted as misses).
        """
        graph_set = self._get_graph_set(path)
        if num_items is None:
            num_items = len(self._get_item_specs(mm_kwargs))
        key: BudgetGraphMapKey = (
            token_budget if not axis_keys else (token_budget, axis_keys)
        )
        meta = graph_set.get(key)
        if meta is None:
            self.graph_misses += num_items
            return None

        replay_values = self._call_model(
            self.model.prepare_encoder_cudagraph_replay_buffers,
            mm_kwargs,
            self.max_batch_size,
            self.max_frames_per_batch,
            path,
        ).values
        if id(meta) in self._plain_copy:
            self._plain_replay_copy(meta, replay_values)
        else:
            self._shortcut_replay_copy(meta, replay_values)
        self._replay(meta.graph)
        self.graph_hits += num_items
        return meta.output_buffer

    def _execute_local(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """Pack this process' items into budget batches and run them."""
        item_specs = self._get_item_specs(mm_kwargs)
        if self._cost_aware and self._cost_model is not None:
            return self._execute_planned(mm_kwargs, item_specs)
        num_items = len(item_specs)
        paths = self._paths
        per_path_tokens = [
            [spec.get_path_output_tokens(path) for spec in item_specs] for path in paths
        ]
        per_item_out_tokens = [spec.output_tokens for spec in item_specs]
        batches = pack_items(
            per_path_tokens,
            per_item_out_tokens,
            self._path_budget_lists,
            self.max_batch_size,
        )

        results: dict[int, torch.Tensor] = {}
        for batch in batches:
            self._run_batch(mm_kwargs, batch, per_item_out_tokens, results)
        return [results[i] for i in range(num_items)]

    def _run_batch(
        self,
        mm_kwargs: dict[str, Any],
        batch: PackedBatch,
        per_item_out_tokens: list[int],
        results: dict[int, torch.Tensor],
    ) -> None:
        """Run every path of one packed batch and postprocess into
        ``results``: graph replay where a budget fits, eager otherwise."""
        batch_kwargs, axis_keys = self._select_items(mm_kwargs, batch.indices)
        outputs: dict[str, torch.Tensor] = {}
        all_eager = True
        for path, tokens, budget in zip(
            self._paths, batch.path_tokens, batch.path_budgets
        ):
            if tokens == 0:
                continue
            if budget is None:
                with torch.inference_mode():
                    outputs[path] = self._call_model(
                        self.model.encoder_eager_forward, batch_kwargs, path=path
                    )
                self._record_eager(path, tokens)
                continue
            all_eager = False
            output = self._run_budget_graph(
                batch_kwargs,
                budget,
                path=path,
                axis_keys=axis_keys,
                num_items=len(batch.indices),
            )
            if output is None:
                raise AssertionError(
                    f"no encoder CUDA graph for path={path!r} budget={budget} "
                    f"axis_keys={axis_keys!r}: capture() has not run (or was "
                    "cleared), or the model selected an axis combination "
                    "outside capture_axes"
                )
            self._record_padding(path, budget, tokens)
            outputs[path] = output
        if all_eager:
            self.graph_misses += len(batch.indices)

        # The graph output buffers are overwritten by the next replay, so
        # results must be copies.
        self._call_model(
            self.model.postprocess_encoder_output,
            outputs,
            batch.indices,
            per_item_out_tokens,
            results,
            clone=True,
            batch_mm_kwargs=batch_kwargs,
        )

    # ------------------------------------------------------------------
    # Cost-aware execution (docs/runtime.md)
    # ------------------------------------------------------------------

    @property
    def cost_aware(self) -> bool:
        """Whether calibrated executes are planned by cost (see
        :mod:`~encoder_cudagraph_runtime.cost_aware`); settable."""
        return self._cost_aware

    @cost_aware.setter
    def cost_aware(self, enabled: bool) -> None:
        if enabled:
            self._check_cost_aware_supported()
        self._cost_aware = bool(enabled)

    @property
    def cost_model(self) -> CostModel | None:
        """The calibrated cost model (``None`` before calibration)."""
        return self._cost_model

    def _check_cost_aware_supported(self) -> None:
        paths = self.config.paths
        single = list(paths) == ["default"] and not paths["default"].allow_zero_tokens
        if not single or self._capture_axes:
            raise NotImplementedError(
                "Cost-aware encoder execution supports one 'default' path "
                "without zero-token batches or capture axes; this model has "
                f"paths {list(paths)} and capture_axes {self._capture_axes}."
            )

    def _time_ms(self, fn: Callable[[], object], repeats: int = 2) -> float:
        """Milliseconds of ``clock`` of device-synchronised calls of ``fn``:
        the first call's when it took at least :data:`LONG_CALL_MS`, else
        the fastest of ``repeats`` calls after it."""
        first = self._time_call(fn)
        if first >= LONG_CALL_MS:
            return first
        return min(self._time_call(fn) for _ in range(max(1, repeats)))

    def _time_call(self, fn: Callable[[], object]) -> float:
        sync = self.graph_backend.synchronize
        sync()
        start = self._clock()
        fn()
        sync()
        return (self._clock() - start) / 1e6

    @staticmethod
    def _calls_ms(estimate_ms: float, repeats: int) -> float:
        """What :meth:`_time_ms` spends on a call of ``estimate_ms``."""
        calls = 1 if estimate_ms >= LONG_CALL_MS else 1 + max(1, repeats)
        return calls * estimate_ms

    def set_cost_model(self, cost_model: CostModel) -> None:
        """Use ``cost_model`` (a saved or synthetic one) for planning; it
        must price every captured budget."""
        self._check_cost_aware_supported()
        missing = set(self._default_budgets()) - set(cost_model.graph.replay_ms)
        if missing:
            raise ValueError(f"the cost model has no replay time for {sorted(missing)}")
        self._cost_model = cost_model

    def _default_budgets(self) -> list[int]:
        return self._planned_budgets

    def calibrate_cost_model(
        self,
        batches: list[dict[str, Any]],
        *,
        repeats: int = 2,
        eager_from: CostModel | None = None,
        error_floor: float = 0.02,
    ) -> CostModel:
        """Fit the cost model from timed runs of warm-up ``batches`` (the
        ``mm_kwargs`` of typical executes, small and large: the fit is only
        as good as the rows they span) and use it.

        Graph replays not yet timed (``cost_aware`` off at capture) are timed
        first, once each: every captured budget is priced. Then every
        distinct selection (each batch whole, and each of its items alone)
        runs as one eager unit (fastest of ``repeats``) and, where it fits a
        budget, as one graph unit at its smallest fitting budget and (single
        items) the next one, the way :meth:`execute` runs units, each
        followed by its graph's replay alone; calls of
        :data:`LONG_CALL_MS` once, and only while they fit
        :attr:`calibration_limit_ms` (:meth:`_calibration_samples`). The
        eager form is the one the samples show, the serial one where they
        cannot tell for a tower that declares it encodes item by item.
        ``eager_from``: reuse that model's eager cost and
        error instead of timing eager calls (eager cost does not depend on
        the ladder). The samples stay readable in
        :attr:`calibration_samples`; statistics are left as they were.
        """
        self._check_cost_aware_supported()
        if not self.is_captured():
            raise RuntimeError("calibrate_cost_model() needs capture() first")
        if not batches:
            raise ValueError("calibrate_cost_model() needs at least one batch")
        if not any(self._get_item_specs(mm_kwargs) for mm_kwargs in batches):
            raise ValueError("the calibration batches have no items")
        start = self._clock()
        graphs = self._get_graph_set("default")
        # Every captured budget is priced, whatever the limit: the planner
        # needs each one's replay time (set_cost_model refuses a model
        # without). The limit is what is left for the units.
        for budget in self._default_budgets():
            if budget not in self._replay_ms:
                self._replay_ms[budget] = self._time_ms(graphs[budget].graph.replay, 1)
        saved = self._save_counters()
        try:
            # Captured buffers made in inference mode are written there only.
            with torch.inference_mode():
                eager, graph = self._calibration_samples(
                    batches, repeats, eager_from is None, start
                )
        finally:
            self._restore_counters(saved)
        self._calibration = (eager, graph)
        model = calibrated_cost_model(
            self._replay_ms,
            self.max_batch_size,
            eager,
            graph,
            reuse_eager=eager_from,
            declared_serial=self._eager_declared_per_item(),
            error_floor=error_floor,
        )
        self._cost_model = model
        logger.info("Encoder cost model: %s", self._cost_model)
        return self._cost_model

    @property
    def calibration_samples(self) -> dict[str, list[dict[str, Any]]]:
        """The timed units of the latest calibration (milliseconds)."""
        eager, graph = self._calibration
        return {
            "eager": [dataclasses.asdict(s) for s in eager],
            "graph": [dataclasses.asdict(s) for s in graph],
        }

    def _calibration_samples(
        self, batches: list[dict[str, Any]], repeats: int, time_eager: bool, start: int
    ) -> tuple[list[EagerSample], list[GraphSample]]:
        """Timed units of the distinct selections of ``batches``, smallest
        first, within :attr:`calibration_limit_ms` of device time since
        ``start`` (a ``clock`` value): each call, the eager one and each
        graph unit on its own, is made only if its estimate from the calls
        timed so far (:class:`CalibrationEstimate`) still fits; the calls
        left out are counted in :attr:`calibration_report`. Large budgets
        then keep the fit's extrapolation (their cost factor 1) instead of
        minutes of timed replays (issue #27: one replay of a 147k-patch
        DeepSeek-V4.1 budget takes as long as hundreds of small units), and
        a unit whose graph calls do not fit still has its eager call timed
        where that fits: the eager fit's form shows in such units."""
        units = self._calibration_units(batches)
        deadline = start + self.calibration_limit_ms * 1e6
        eager: list[EagerSample] = []
        graph: list[GraphSample] = []
        skipped = {"units": 0, "eager_calls": 0, "graph_units": 0}
        for unit in sorted(units, key=lambda u: sum(u.rows)):
            estimate = CalibrationEstimate.of(
                self._replay_ms, self.max_batch_size, eager, graph
            )
            timed = 0
            if time_eager:
                # The first eager call whatever the limit: the fit needs one.
                ms = self._calls_ms(estimate.eager_ms(unit.rows), repeats)
                if not eager or self._fits(ms, deadline):
                    eager.append(self._time_eager_unit(unit, repeats))
                    timed += 1
                else:
                    skipped["eager_calls"] += 1
            for budget in self._unit_budgets(unit):
                # The unit, then its replay alone (LONG_CALL_MS: not for long ones).
                unit_ms = estimate.graph_unit_ms(budget, unit.rows)
                calls = 1 if unit_ms >= LONG_CALL_MS else 2
                if self._fits(calls * self._calls_ms(unit_ms, repeats), deadline):
                    graph.append(self._time_graph_unit(unit, budget, repeats))
                    timed += 1
                else:
                    skipped["graph_units"] += 1
            skipped["units"] += timed == 0
        self._calibration_report = {
            "units": len(units),
            "skipped": skipped["units"],
            "skipped_eager_calls": skipped["eager_calls"],
            "skipped_graph_units": skipped["graph_units"],
            "device_ms": (self._clock() - start) / 1e6,
            "limit_ms": self.calibration_limit_ms,
        }
        return eager, graph

    def _fits(self, estimate_ms: float, deadline: float) -> bool:
        """Whether calls estimated at ``estimate_ms`` end before ``deadline``
        (with :data:`CALIBRATION_ESTIMATE_MARGIN`)."""
        margin = CALIBRATION_ESTIMATE_MARGIN
        return self._clock() + margin * estimate_ms * 1e6 <= deadline

    def _calibration_units(
        self, batches: list[dict[str, Any]]
    ) -> list[_CalibrationUnit]:
        """Each batch whole and each of its items alone, once per distinct
        multiset of rows."""
        units = []
        seen: set[tuple[int, ...]] = set()
        for mm_kwargs in batches:
            specs = self._get_item_specs(mm_kwargs)
            rows = [spec.get_path_output_tokens("default") for spec in specs]
            tokens = [spec.output_tokens for spec in specs]
            selections = [list(range(len(specs)))] + [[i] for i in range(len(specs))]
            for selection in selections:
                key = tuple(sorted(rows[i] for i in selection))
                if selection and key not in seen:
                    seen.add(key)
                    units.append(
                        _CalibrationUnit(mm_kwargs, selection, key, tokens, rows)
                    )
        return units

    @property
    def calibration_report(self) -> dict[str, Any]:
        """The latest calibration's units, those left wholly untimed
        (``skipped``) and the eager calls and graph units left out to stay
        within :attr:`calibration_limit_ms`, and the device time it took
        (the pricing of budgets not timed at capture included)."""
        return dict(self._calibration_report)

    def _time_eager_unit(self, unit: _CalibrationUnit, repeats: int) -> EagerSample:
        run = functools.partial(
            self._run_eager_unit,
            unit.mm_kwargs,
            unit.selection,
            unit.item_rows,
            unit.tokens,
            {},
            largest_first=True,
        )
        return EagerSample(unit.rows, self._time_ms(run, repeats))

    def _unit_budgets(self, unit: _CalibrationUnit) -> list[int]:
        """The budgets ``unit`` is timed at as a graph unit: its smallest
        fitting budget and, for a single item, the next one (padding varies
        then at equal rows); none above every budget or ``max_batch_size``."""
        budgets = self._default_budgets()
        first = bisect_left(budgets, sum(unit.rows))
        if len(unit.selection) > self.max_batch_size:
            return []
        return budgets[first : first + (2 if len(unit.selection) == 1 else 1)]

    def _time_graph_unit(
        self, unit: _CalibrationUnit, budget: int, repeats: int
    ) -> GraphSample:
        """``unit`` as a graph unit at ``budget``, then (unless the unit took
        :data:`LONG_CALL_MS`: the replay is then nearly all of it) the
        replay alone with the batch left in its buffers."""
        run = functools.partial(
            self._run_graph_unit,
            unit.mm_kwargs,
            unit.selection,
            budget,
            sum(unit.rows),
            unit.tokens,
            {},
        )
        unit_ms = self._time_ms(run, repeats)
        if unit_ms >= LONG_CALL_MS:
            return GraphSample(budget, unit.rows, unit_ms)
        replay = self._get_graph_set("default")[budget].graph.replay
        return GraphSample(budget, unit.rows, unit_ms, self._time_ms(replay, repeats))

    def _save_counters(self) -> tuple[Any, ...]:
        return (
            self.graph_hits,
            self.graph_misses,
            {p: {b: list(e) for b, e in d.items()} for p, d in self._padding.items()},
            {p: list(e) for p, e in self._eager.items()},
        )

    def _restore_counters(self, saved: tuple[Any, ...]) -> None:
        self.graph_hits, self.graph_misses, self._padding, self._eager = saved

    def _execute_planned(
        self, mm_kwargs: dict[str, Any], item_specs: list[EncoderItemSpec]
    ) -> list[torch.Tensor]:
        """Run this process' items as the cost model's plan says."""
        assert self._cost_model is not None
        rows = [spec.get_path_output_tokens("default") for spec in item_specs]
        tokens = [spec.output_tokens for spec in item_specs]
        plan = plan_execution(
            rows,
            self._default_budgets(),
            self.max_batch_size,
            self._cost_model,
            sort_keys=tokens,
        )
        self._execution.record(plan)
        results: dict[int, torch.Tensor] = {}
        for unit in plan.units:
            indices = list(unit.positions)
            if unit.budget is None:
                self._run_eager_unit(
                    mm_kwargs,
                    indices,
                    rows,
                    tokens,
                    results,
                    largest_first=self._eager_per_item(),
                )
            else:
                self._run_graph_unit(
                    mm_kwargs, indices, unit.budget, unit.rows, tokens, results
                )
        return [results[i] for i in range(len(item_specs))]

    def _run_graph_unit(
        self,
        mm_kwargs: dict[str, Any],
        indices: list[int],
        budget: int,
        rows: int,
        per_item_out_tokens: list[int],
        results: dict[int, torch.Tensor],
    ) -> None:
        """Replay ``budget`` for the items ``indices`` (as a packed batch)."""
        batch = PackedBatch(indices, [rows], [budget])
        self._run_batch(mm_kwargs, batch, per_item_out_tokens, results)

    def _eager_per_item(self) -> bool:
        """Whether the tower encodes item by item: the model says so
        (:meth:`_eager_declared_per_item`), or the calibrated eager cost has
        the serial form."""
        return self._eager_declared_per_item() or (
            self._cost_model is not None and self._cost_model.eager.serial
        )

    def _eager_declared_per_item(self) -> bool:
        """``encoder_eager_forward_per_item``, which generated standalone
        mixins of towers that encode item by item set."""
        return getattr(self.model, "encoder_eager_forward_per_item", False) is True

    def _run_eager_unit(
        self,
        mm_kwargs: dict[str, Any],
        indices: list[int],
        item_rows: list[int],
        per_item_out_tokens: list[int],
        results: dict[int, torch.Tensor],
        *,
        largest_first: bool,
    ) -> None:
        """One unpadded ``encoder_eager_forward`` call on the items
        ``indices`` (``item_rows``: the rows of every item of ``mm_kwargs``),
        in their order or ``largest_first``: the whole ``mm_kwargs`` as they
        are when they hold exactly these items in that order, else their
        selection.

        Largest first for a tower that encodes item by item
        (:meth:`_eager_per_item`; calibration times every tower that way): it
        launches a small item's kernels faster than the device runs a large
        one's, so after a large item they queue behind its work, before it
        the device idles while they launch (DeepSeek-V4.1 on an H200, a
        thumbnail and a photo: 85-93 ms in the drawn order, 70-73 ms largest
        first; run E). A batched forward gains nothing from the order, and a
        unit of every item then passes the caller's batch unselected, as
        vLLM's eager path does (MiniMax M3 in run F: two-image batches
        reordered into a selection took 7-12% longer than the baseline).

        Its output is a fresh tensor that no later call overwrites, so
        postprocess runs without clones.
        """
        if largest_first:
            indices = sorted(indices, key=lambda i: (-item_rows[i], i))
        rows = sum(item_rows[i] for i in indices)
        if indices == list(range(len(per_item_out_tokens))):
            batch_kwargs = mm_kwargs
        else:
            batch_kwargs = self._select_items(mm_kwargs, indices)[0]
        with torch.inference_mode():
            output = self._call_model(
                self.model.encoder_eager_forward, batch_kwargs, path="default"
            )
        self._record_eager("default", rows)
        self.graph_misses += len(indices)
        self._call_model(
            self.model.postprocess_encoder_output,
            {"default": output},
            indices,
            per_item_out_tokens,
            results,
            clone=False,
            batch_mm_kwargs=batch_kwargs,
        )

    def get_execution_stats(self) -> dict[str, Any]:
        """What cost-aware executes decided: plans by kind (``graphs``,
        ``mixed``, ``eager``) and by source (``vllm``: vLLM's packing kept;
        ``cheapest``: the planner's), units and items per kind, predicted
        time against vLLM's packing and all-eager, the last plan, and the
        cost model."""
        return {
            "cost_aware": self._cost_aware,
            "calibrated": self._cost_model is not None,
            **self._execution.as_dict(),
            "cost_model": (
                None if self._cost_model is None else self._cost_model.as_dict()
            ),
        }

    def reset_execution_stats(self) -> None:
        self._execution = ExecutionStats()

    # ------------------------------------------------------------------
    # Data parallel
    # ------------------------------------------------------------------

    def _dp_shard(
        self, mm_kwargs: dict[str, Any], per_item_out_tokens: list[int]
    ) -> tuple[dict[str, Any], list[int], list[int], int]:
        """This rank's sub-batch plus the layout every rank agrees on.

        Returns ``(local_mm_kwargs, assignment, items_per_rank,
        max_output_tokens_per_rank)``; see
        :func:`~encoder_cudagraph_runtime.dp_sharding.plan_dp_shard`. An idle
        rank still selects (with ``[]``) and later joins the all-gather.
        """
        world_size = distributed.get_tensor_model_parallel_world_size()
        rank = distributed.get_tensor_model_parallel_rank()
        input_sizes = [spec.input_size for spec in self._get_item_specs(mm_kwargs)]
        plan = plan_dp_shard(input_sizes, per_item_out_tokens, world_size)
        local_kwargs = self._select_items(mm_kwargs, plan.rank_items(rank))[0]
        return (
            local_kwargs,
            plan.assignment,
            plan.items_per_rank,
            plan.max_output_tokens_per_rank,
        )

    def _dp_gather(
        self,
        local_outputs: list[torch.Tensor],
        per_item_out_tokens: list[int],
        image_rank_assignment: list[int],
        images_per_rank: list[int],
        max_output_tokens_per_rank: int,
    ) -> list[torch.Tensor]:
        """All-gather every rank's (padded) outputs and return all items'
        outputs in original order. Outputs are 2-D ``(rows, out_hidden)``."""
        offsets = [0]
        for count in images_per_rank:
            offsets.append(offsets[-1] + count)
        tokens_per_rank = [
            sum(per_item_out_tokens[i] for i in image_rank_assignment[a:b])
            for a, b in zip(offsets[:-1], offsets[1:])
        ]
        plan = DPShardPlan(
            assignment=image_rank_assignment,
            items_per_rank=images_per_rank,
            offsets=offsets,
            tokens_per_rank=tokens_per_rank,
            max_output_tokens_per_rank=max_output_tokens_per_rank,
        )
        local = pad_local_output(
            local_outputs,
            max_output_tokens_per_rank,
            self.config.out_hidden_size,
            self.device,
            self.dtype,
        )
        gathered = distributed.tensor_model_parallel_all_gather(local, dim=0)
        return unshard_gathered(gathered, plan, per_item_out_tokens)

    # ------------------------------------------------------------------
    # Entry point
    # ------------------------------------------------------------------

    def execute(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        """Encode every item of ``mm_kwargs``; one output per item, in item
        order.

        Runs in inference mode, as vLLM's runner always calls it (captured
        buffers made under inference mode can only be written there).
        """
        timer = self._timer
        start = _perf_ns() if timer is not None else 0
        if timer is not None:
            timer._cur_model_ns = 0
            timer._cur_replay_ns = 0

        if torch.is_inference_mode_enabled():
            result = self._execute(mm_kwargs)
        else:
            with torch.inference_mode():
                result = self._execute(mm_kwargs)

        total = self.graph_hits + self.graph_misses
        if total > 0 and total % self.log_stats_interval == 0:
            stats = self.get_cumulative_stats()
            logger.debug(
                "Encoder CUDA graph stats: hits=%d misses=%d hit_rate=%.1f%%",
                stats["graph_hits"],
                stats["graph_misses"],
                stats["hit_rate"] * 100,
            )

        if timer is not None:
            elapsed = _perf_ns() - start
            timer.executes += 1
            timer.items += len(result)
            timer.total_ns += elapsed
            timer.model_ns += timer._cur_model_ns
            timer.replay_ns += timer._cur_replay_ns
            timer.last_items = len(result)
            timer.last_total_ns = elapsed
            timer.last_model_ns = timer._cur_model_ns
            timer.last_replay_ns = timer._cur_replay_ns
        return result

    def _execute(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        if not self.use_dp:
            return self._execute_local(mm_kwargs)
        per_item_out_tokens = self._get_per_item_out_tokens(mm_kwargs)
        local_kwargs, assignment, per_rank, max_rows = self._dp_shard(
            mm_kwargs, per_item_out_tokens
        )
        local_outputs = self._execute_local(local_kwargs)
        return self._dp_gather(
            local_outputs, per_item_out_tokens, assignment, per_rank, max_rows
        )

    # ------------------------------------------------------------------
    # Statistics
    # ------------------------------------------------------------------

    def get_cumulative_stats(self) -> dict[str, Any]:
        """Cumulative counters, as vLLM reports them.

        Counted in items: every graph replay adds its batch's item count to
        ``graph_hits`` (a batch that replays two paths counts its items
        twice), a batch that replays nothing adds its items to
        ``graph_misses``. ``num_budgets`` counts captured graphs over all
        paths and axis combinations; ``token_budgets`` is the global list.
        """
        total = self.graph_hits + self.graph_misses
        return {
            "graph_hits": self.graph_hits,
            "graph_misses": self.graph_misses,
            "hit_rate": self.graph_hits / total if total > 0 else 0.0,
            "num_budgets": sum(len(g) for g in self.budget_graphs.values()),
            "token_budgets": self.token_budgets,
        }

    def _record_padding(self, path: str, budget: int, rows: int) -> None:
        per_budget = self._padding.get(path)
        if per_budget is None:
            per_budget = self._padding[path] = {}
        entry = per_budget.get(budget)
        if entry is None:
            per_budget[budget] = [1, budget, rows]
        else:
            entry[0] += 1
            entry[1] += budget
            entry[2] += rows

    def _record_eager(self, path: str, rows: int) -> None:
        entry = self._eager.get(path)
        if entry is None:
            self._eager[path] = [1, rows]
        else:
            entry[0] += 1
            entry[1] += rows

    def get_padding_stats(self) -> dict[str, Any]:
        """How much of the replayed rows were padding.

        Returns ``{"paths": {path: {"budgets": {budget: entry}, "eager_batches",
        "eager_rows", **totals}}, **totals}`` where ``entry`` and the totals
        hold ``replays``, ``rows_replayed`` (budget per replay),
        ``rows_used`` (real rows), ``rows_wasted`` and ``waste_fraction``.
        Eager batches replay nothing and are listed separately.
        """

        def summary(replays: int, replayed: int, used: int) -> dict[str, Any]:
            return {
                "replays": replays,
                "rows_replayed": replayed,
                "rows_used": used,
                "rows_wasted": replayed - used,
                "waste_fraction": (replayed - used) / replayed if replayed else 0.0,
            }

        paths: dict[str, Any] = {}
        grand = [0, 0, 0]
        for path in self._paths:
            per_budget = self._padding.get(path, {})
            budgets = {
                budget: summary(*entry) for budget, entry in sorted(per_budget.items())
            }
            totals = [sum(entry[i] for entry in per_budget.values()) for i in range(3)]
            eager_batches, eager_rows = self._eager.get(path, (0, 0))
            paths[path] = {
                "budgets": budgets,
                "eager_batches": eager_batches,
                "eager_rows": eager_rows,
                **summary(*totals),
            }
            for i in range(3):
                grand[i] += totals[i]
        return {"paths": paths, **summary(*grand)}

    def reset_padding_stats(self) -> None:
        self._padding.clear()
        self._eager.clear()

    # ------------------------------------------------------------------
    # Host-overhead timing
    # ------------------------------------------------------------------

    def enable_timing(self, enabled: bool = True) -> None:
        """Start (fresh counters) or stop timing :meth:`execute`."""
        self._timer = ExecuteTiming() if enabled else None

    def reset_timing(self) -> None:
        """Zero the timing counters (timing stays on if it was on)."""
        if self._timer is not None:
            self._timer = ExecuteTiming()

    @property
    def timing(self) -> ExecuteTiming | None:
        """The live timing counters, ``None`` while timing is off."""
        return self._timer

    def get_timing_stats(self) -> dict[str, int | float] | None:
        """:meth:`ExecuteTiming.as_dict` of the counters, or ``None``."""
        return None if self._timer is None else self._timer.as_dict()


def _delta(
    before: MemoryCounters | None, after: MemoryCounters | None, name: str
) -> int | None:
    if before is None or after is None:
        return None
    return int(getattr(after, name)) - int(getattr(before, name))
