"""A small CPU model implementing ``SupportsEncoderCudaGraph`` for the
manager tests, plus helpers to build configs and batches.

The fake encoder is row-wise with one per-sequence term, so that a wrong
replay copy (stale rows, wrong offsets, unpadded metadata) changes the
result:

    out_p(x) = 2 * x + mean_over_own_sequence(x) + scale + axis_value + 100 * p

for path number ``p`` (config order). ``cu_seqlens`` carries the sequence
offsets; at replay it is padded with one trailing sequence covering the
padding rows, using the buffer's row count registered at capture by
``data_ptr`` (the way the MiniMax M3 mixin does it, ``pad: trailing_sequence``).

Every protocol call is appended to ``model.calls`` as ``(method, details)``
so tests can check what the manager called, in which order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    ParallelConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.defs import (
    ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphPaddingLogic,
    EncoderCudaGraphPathConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
)
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager

HIDDEN = 4


@dataclass
class FakeItem:
    """One encoder item: its rows on each path and its features."""

    path_rows: dict[str, int]
    axis: int = 0
    input_size: int | None = None
    features: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def output_tokens(self) -> int:
        return sum(self.path_rows.values())


def make_items(
    rows: Sequence[int | dict[str, int]],
    *,
    seed: int = 0,
    axes: Sequence[int] | None = None,
    input_sizes: Sequence[int] | None = None,
) -> list[FakeItem]:
    """Items with seeded random features; an int means ``{"default": n}``."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for i, r in enumerate(rows):
        path_rows = {"default": r} if isinstance(r, int) else dict(r)
        feats = {
            path: torch.randn(n, HIDDEN, generator=gen) for path, n in path_rows.items()
        }
        items.append(
            FakeItem(
                path_rows=path_rows,
                axis=0 if axes is None else axes[i],
                input_size=None if input_sizes is None else input_sizes[i],
                features=feats,
            )
        )
    return items


def make_kwargs(items: list[FakeItem], scale: float = 0.5) -> dict[str, Any]:
    return {"items": list(items), "scale": torch.tensor(scale)}


def expected_item_output(
    item: FakeItem, paths: Sequence[str], scale: float, axis_value: float = 0.0
) -> torch.Tensor:
    """Independent reference of one item's final output (paths in order)."""
    parts = []
    for p, path in enumerate(paths):
        x = item.features.get(path)
        if x is None or x.shape[0] == 0:
            continue
        parts.append(2 * x + x.mean(dim=0, keepdim=True) + scale + axis_value + 100 * p)
    if not parts:
        return torch.zeros(0, HIDDEN)
    return torch.cat(parts, dim=0)


def _segment_forward(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: torch.Tensor,
    axis_value: torch.Tensor,
    path_offset: float,
) -> torch.Tensor:
    """Pure-tensor forward (no host reads): fixed shapes, capturable."""
    rows = x.shape[0]
    num_seqs = cu_seqlens.numel() - 1
    positions = torch.arange(rows, dtype=cu_seqlens.dtype)
    seg = torch.searchsorted(cu_seqlens, positions, right=True) - 1
    seg = seg.clamp(0, max(num_seqs - 1, 0))
    sums = torch.zeros(max(num_seqs, 1), x.shape[1], dtype=x.dtype)
    sums.index_add_(0, seg, x)
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).clamp(min=1).to(x.dtype)
    if num_seqs == 0:
        lengths = torch.ones(1, dtype=x.dtype)
    means = sums / lengths[:, None]
    return 2 * x + means[seg] + scale + axis_value + path_offset


class FakeEncoder(SupportsEncoderCudaGraph):
    """Configurable CPU fake of a graph-capable vision encoder."""

    def __init__(
        self,
        *,
        budget_range: tuple[int, int] = (8, 64),
        paths: dict[str, EncoderCudaGraphPathConfig] | None = None,
        capture_axes: tuple[tuple[Hashable, ...], ...] = (),
        padding_logics: dict[str, EncoderCudaGraphPaddingLogic] | None = None,
        modalities: Sequence[str] = ("image",),
        max_frames_per_video: int = 1,
        pad_cu_seqlens: bool = True,
    ) -> None:
        self.budget_range = budget_range
        self.paths = (
            dict(paths)
            if paths is not None
            else {"default": EncoderCudaGraphPathConfig()}
        )
        self.capture_axes = capture_axes
        self.extra_padding_logics = dict(padding_logics or {})
        self.modalities = list(modalities)
        self.max_frames_per_video = max_frames_per_video
        self.pad_cu_seqlens = pad_cu_seqlens
        self.calls: list[tuple[str, Any]] = []
        self._rows_by_ptr: dict[int, int] = {}
        self.multi_path = list(self.paths) != ["default"]

    # -- helpers -----------------------------------------------------------

    def _path_offset(self, path: str) -> float:
        return 100.0 * list(self.paths).index(path)

    def _fill_cu_seqlens(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Trailing padding sequence: every slot after the real offsets
        holds the buffer's total rows."""
        self.calls.append(("pad_cu_seqlens", (dst.numel(), src.numel())))
        total = self._rows_by_ptr[dst.data_ptr()]
        dst.fill_(total)
        dst[: src.shape[0]].copy_(src)

    def calls_named(self, name: str) -> list[Any]:
        return [details for method, details in self.calls if method == name]

    # -- protocol ------------------------------------------------------------

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        logics: dict[str, EncoderCudaGraphPaddingLogic] = {}
        if self.pad_cu_seqlens:
            logics["cu_seqlens"] = self._fill_cu_seqlens
        logics.update(self.extra_padding_logics)
        return EncoderCudaGraphConfig(
            modalities=list(self.modalities),
            buffer_keys=["x", "cu_seqlens", "scale", "axis_value"],
            out_hidden_size=HIDDEN,
            padding_logics=logics,
            max_frames_per_video=self.max_frames_per_video,
            paths=dict(self.paths),
            capture_axes=self.capture_axes,
        )

    def get_encoder_cudagraph_budget_range(
        self, vllm_config: VllmConfig
    ) -> tuple[int, int]:
        self.calls.append(("budget_range", None))
        return self.budget_range

    def get_encoder_cudagraph_item_specs(
        self, mm_kwargs: dict[str, Any]
    ) -> list[EncoderItemSpec]:
        items: list[FakeItem] = mm_kwargs["items"]
        self.calls.append(("item_specs", len(items)))
        return [
            EncoderItemSpec(
                input_size=(
                    item.input_size
                    if item.input_size is not None
                    else item.output_tokens
                ),
                output_tokens=item.output_tokens,
                path_output_tokens=dict(item.path_rows) if self.multi_path else {},
            )
            for item in items
        ]

    def select_encoder_cudagraph_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> dict[str, Any]:
        self.calls.append(("select", list(indices)))
        items = [mm_kwargs["items"][i] for i in indices]
        selected: dict[str, Any] = {"items": items, "scale": mm_kwargs["scale"]}
        if self.capture_axes:
            first_keys = tuple(axis[0] for axis in self.capture_axes)
            keys = (
                tuple(max(item.axis for item in items) for _ in self.capture_axes)
                if items
                else first_keys
            )
            selected[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] = keys
        return selected

    def prepare_encoder_cudagraph_capture_inputs(
        self,
        token_budget: int,
        max_batch_size: int,
        max_frames_per_batch: int,
        device: torch.device,
        dtype: torch.dtype,
        path: str = "default",
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        self.calls.append(
            (
                "capture_inputs",
                (token_budget, max_batch_size, max_frames_per_batch, path, axis_keys),
            )
        )
        cu = torch.full((max_batch_size + 2,), token_budget, dtype=torch.int64)
        cu[0] = 0
        self._rows_by_ptr[cu.data_ptr()] = token_budget
        axis_value = float(axis_keys[0]) if axis_keys else 0.0
        return EncoderCudaGraphCaptureInputs(
            values={
                "x": torch.zeros(token_budget, HIDDEN, dtype=dtype, device=device),
                "cu_seqlens": cu,
                "scale": torch.tensor(1.0, dtype=dtype),
                "axis_value": torch.tensor(axis_value, dtype=dtype),
            }
        )

    def prepare_encoder_cudagraph_replay_buffers(
        self,
        mm_kwargs: dict[str, Any],
        max_batch_size: int,
        max_frames_per_batch: int,
        path: str = "default",
    ) -> EncoderCudaGraphReplayBuffers:
        items: list[FakeItem] = mm_kwargs["items"]
        self.calls.append(("replay_buffers", (len(items), path)))
        rows = [item.path_rows.get(path, 0) for item in items]
        cu = torch.zeros(len(rows) + 1, dtype=torch.int64)
        if rows:
            cu[1:] = torch.cumsum(torch.tensor(rows), 0)
        return EncoderCudaGraphReplayBuffers(
            values={
                "x": self._features(items, path),
                "cu_seqlens": cu,
                "scale": mm_kwargs["scale"],
                "axis_value": None,
            }
        )

    def _features(self, items: list[FakeItem], path: str) -> torch.Tensor:
        parts = [item.features[path] for item in items if path in item.features]
        if not parts:
            return torch.zeros(0, HIDDEN)
        return torch.cat(parts, dim=0)

    def encoder_cudagraph_forward(
        self, inputs: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        self.calls.append(("graph_forward", (inputs["x"].shape[0], path)))
        return _segment_forward(
            inputs.pop("x"),
            inputs["cu_seqlens"],
            inputs["scale"],
            inputs["axis_value"],
            self._path_offset(path),
        )

    def encoder_eager_forward(
        self, mm_kwargs: dict[str, Any], path: str = "default"
    ) -> torch.Tensor:
        items: list[FakeItem] = mm_kwargs["items"]
        self.calls.append(("eager_forward", (len(items), path)))
        rows = [item.path_rows.get(path, 0) for item in items]
        cu = torch.zeros(len(rows) + 1, dtype=torch.int64)
        if rows:
            cu[1:] = torch.cumsum(torch.tensor(rows), 0)
        axis_value = 0.0
        if self.capture_axes and items:
            axis_value = float(max(item.axis for item in items))
        return _segment_forward(
            self._features(items, path),
            cu,
            mm_kwargs["scale"],
            torch.tensor(axis_value),
            self._path_offset(path),
        )

    def postprocess_encoder_output(
        self,
        outputs: dict[str, torch.Tensor],
        indices: list[int],
        per_item_out_tokens: list[int],
        dest: dict[int, torch.Tensor] | list[torch.Tensor | None],
        clone: bool = False,
        batch_mm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.calls.append(
            ("postprocess", (list(indices), sorted(outputs), clone, batch_mm_kwargs))
        )
        if not self.multi_path:
            super().postprocess_encoder_output(
                outputs, indices, per_item_out_tokens, dest, clone, batch_mm_kwargs
            )
            return
        assert batch_mm_kwargs is not None
        items: list[FakeItem] = batch_mm_kwargs["items"]
        offsets = dict.fromkeys(outputs, 0)
        for idx, item in zip(indices, items):
            parts = []
            for path in self.paths:
                n = item.path_rows.get(path, 0)
                if n == 0 or path not in outputs:
                    continue
                parts.append(outputs[path][offsets[path] : offsets[path] + n])
                offsets[path] += n
            out = torch.cat(parts, 0) if parts else torch.zeros(0, HIDDEN)
            dest[idx] = out.clone() if clone else out


def make_vllm_config(
    *,
    budgets: Sequence[int] = (),
    max_items: int = 0,
    max_frames: int | None = None,
    video_limit: int | None = None,
    tp_size: int = 1,
    tp_mode: str = "weights",
) -> VllmConfig:
    limits = {} if video_limit is None else {"video": video_limit}
    return VllmConfig(
        model_config=ModelConfig(
            multimodal_config=MultiModalConfig(
                limit_per_prompt=limits, mm_encoder_tp_mode=tp_mode  # type: ignore[arg-type]
            )
        ),
        parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=list(budgets),
            encoder_cudagraph_max_vision_items_per_batch=max_items,
            encoder_cudagraph_max_frames_per_batch=max_frames,
        ),
    )


def make_manager(
    model: FakeEncoder | None = None,
    *,
    cost_aware: bool = False,
    clock: Any = None,
    **config_kwargs: Any,
) -> EncoderCudaGraphManager:
    """A CPU manager over ``model`` with the eager-replay backend."""
    return EncoderCudaGraphManager(
        make_vllm_config(**config_kwargs),
        torch.device("cpu"),
        torch.float32,
        model if model is not None else FakeEncoder(),
        graph_backend=EagerReplayGraphBackend(),
        cost_aware=cost_aware,
        clock=clock,
    )


class SharedStorageEncoder(FakeEncoder):
    """A fake whose graphs share one ``x`` storage: budget ``b``'s buffer is
    the first ``b`` rows of one model-owned tensor (a model may allocate its
    capture inputs that way; the protocol does not forbid it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.x_store = torch.zeros(self.budget_range[1] * 4, HIDDEN)

    def prepare_encoder_cudagraph_capture_inputs(
        self,
        token_budget: int,
        max_batch_size: int,
        max_frames_per_batch: int,
        device: torch.device,
        dtype: torch.dtype,
        path: str = "default",
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        inputs = super().prepare_encoder_cudagraph_capture_inputs(
            token_budget,
            max_batch_size,
            max_frames_per_batch,
            device,
            dtype,
            path,
            axis_keys,
        )
        shared = self.x_store[:token_budget]
        shared.zero_()
        inputs.values["x"] = shared
        return inputs


class InputWritingEncoder(FakeEncoder):
    """A fake whose captured forward writes its ``x`` input after reading
    it (scratch reuse, an in-place activation on an input view): outputs
    stay right, but the buffer no longer holds what the replay copied.
    Every graph forward records the ``x`` it was given."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen_x: list[torch.Tensor] = []

    def encoder_cudagraph_forward(
        self, inputs: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        x = inputs["x"]
        self.seen_x.append(x.clone())
        out = super().encoder_cudagraph_forward(inputs, path)
        x.fill_(7.0)
        return out


class VirtualClock:
    """A nanosecond clock that only moves when a fake says its work took
    time, so that cost calibration is exact and deterministic."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def advance_ms(self, ms: float) -> None:
        self.ns += round(ms * 1e6)


class TimedFakeEncoder(FakeEncoder):
    """A fake whose forwards take synthetic time on a :class:`VirtualClock`:
    a graph forward ``graph_ms(buffer_rows)``, an eager forward
    ``eager_ms(rows of each item)``. Host work costs nothing.

    With ``attention_ms_per_sq``, a graph forward also costs that much per
    squared sequence length in its ``cu_seqlens`` (the padding sequence
    included), and its capture dummies are ``max_batch_size`` equal
    sequences sharing the budget, as the project's mixins capture them.
    """

    def __init__(  # type: ignore[no-untyped-def]
        self, clock: VirtualClock, graph_ms, eager_ms, attention_ms_per_sq=0.0, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.graph_ms = graph_ms
        self.eager_ms = eager_ms
        self.attention_ms_per_sq = attention_ms_per_sq

    def prepare_encoder_cudagraph_capture_inputs(  # type: ignore[no-untyped-def]
        self, token_budget, max_batch_size, *args, **kwargs
    ) -> EncoderCudaGraphCaptureInputs:
        inputs = super().prepare_encoder_cudagraph_capture_inputs(
            token_budget, max_batch_size, *args, **kwargs
        )
        if self.attention_ms_per_sq:
            cu = inputs.values["cu_seqlens"]
            share = token_budget // max_batch_size
            cu[: max_batch_size + 1] = torch.arange(max_batch_size + 1) * share
        return inputs

    def encoder_cudagraph_forward(
        self, inputs: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        lengths = inputs["cu_seqlens"].diff()
        attention = self.attention_ms_per_sq * float((lengths * lengths).sum())
        self.clock.advance_ms(self.graph_ms(inputs["x"].shape[0]) + attention)
        return super().encoder_cudagraph_forward(inputs, path)

    def encoder_eager_forward(
        self, mm_kwargs: dict[str, Any], path: str = "default"
    ) -> torch.Tensor:
        rows = [item.path_rows.get(path, 0) for item in mm_kwargs["items"]]
        self.clock.advance_ms(self.eager_ms(rows))
        return super().encoder_eager_forward(mm_kwargs, path)


class SpecItemsEncoder(FakeEncoder):
    """A fake whose items are counted by a generated mixin: item specs and
    sub-batch selection are the mixin's own (on a reference host, the
    mixin's ``mm_kwargs`` under ``"mixin"``), graphs and eager forwards the
    fake's, on items of the mixin's path rows. The manager then packs by
    exactly what the mixin reports (budget unit, output tokens, order)."""

    def __init__(self, host: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host = host
        # Outputs are the fake's rows per item, not the mixin's output tokens.
        self.multi_path = True

    def make_kwargs(self, mixin_kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
        specs = self.host.get_encoder_cudagraph_item_specs(mixin_kwargs)
        rows = [spec.get_path_output_tokens("default") for spec in specs]
        return {**make_kwargs(make_items(rows, seed=seed)), "mixin": mixin_kwargs}

    def get_encoder_cudagraph_item_specs(
        self, mm_kwargs: dict[str, Any]
    ) -> list[EncoderItemSpec]:
        self.calls.append(("item_specs", len(mm_kwargs["items"])))
        return self.host.get_encoder_cudagraph_item_specs(mm_kwargs["mixin"])

    def select_encoder_cudagraph_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> dict[str, Any]:
        selected = super().select_encoder_cudagraph_items(mm_kwargs, indices)
        selected["mixin"] = self.host.select_encoder_cudagraph_items(
            mm_kwargs["mixin"], indices
        )
        return selected
