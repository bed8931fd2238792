"""The fake hosts of the parity tests: one per model, vLLM's mixin and the
generated one mixed onto the same host class. :data:`MODELS` is the table of
models; :func:`parity` builds one's pair of hosts from its row.

A host's towers are vLLM's own code wherever it is pure Python (metadata
builders, RoPE position ids, merge indices, the forwards' glue), taken from
the wheel by :class:`parity_testlib.WheelCode`. Only learned or
device-specific parts are fakes, deterministic and cheap:

* patch embeddings are fixed linear maps of the pixel rows;
* attention is :func:`varlen_attention`, which keeps FlashAttention's varlen
  contract: each sequence of ``cu_seqlens`` attends to itself, a sequence
  longer than ``max_seqlen`` only gets its first ``max_seqlen`` rows
  computed, and rows no sequence covers are never written (they stay NaN,
  like freshly allocated memory in a poisoned pool). What breaks the
  contract is recorded on the tower (``violations``);
* RoPE tables and the MiniMax 3-D RoPE kernel are position codes;
* projectors and mergers average fixed row groups.

Every call the mixins make into a tower's forward is recorded (``calls``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    SchedulerConfig,
    VllmConfig,
)

from encoder_cudagraph_runtime.defs import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
from host_modules import FakeModule, ModuleOf
from parity_testlib import (
    Difference,
    WheelCode,
    load_generated_vllm_module,
    protocol_stubs,
    vllm_wheel,
    with_protocol,
)

#: Width of the fake towers' hidden rows (and of their output).
WIDTH = 8
#: The fake towers' patch side: small, so that inputs stay small (the mixins
#: read it from the tower like any other size).
PATCH = 2
#: Columns of a flat pixel row: 3 channels x 2 frames x PATCH x PATCH.
PIXEL_COLUMNS = 3 * 2 * PATCH * PATCH
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------
# Settings of one host
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HostSettings:
    """What a host is configured with (one scenario of the config checks)."""

    backend: str = "FLASH_ATTN"
    image_limit: int | None = None
    video_limit: int | None = None
    fp8: str | None = None  # None, "static" (scale file) or "dynamic"
    no_multimodal_config: bool = False
    fused_input_norm: bool = False
    max_model_len: int = 8192
    max_num_batched_tokens: int = 8192
    max_frames_per_video: int = 4
    pruning: bool = False  # the host's is_multimodal_pruning_enabled
    vit_data_parallel: bool = False  # the host's use_data_parallel (Kimi-K2.5)

    def multimodal_config(self) -> MultiModalConfig | None:
        if self.no_multimodal_config:
            return None
        limits = {}
        if self.image_limit is not None:
            limits["image"] = self.image_limit
        if self.video_limit is not None:
            limits["video"] = self.video_limit
        return MultiModalConfig(
            limit_per_prompt=limits,
            mm_encoder_attn_dtype="fp8" if self.fp8 else None,
            mm_encoder_fp8_scale_path="scales.json" if self.fp8 == "static" else None,
        )

    def vllm_config(self) -> VllmConfig:
        return VllmConfig(
            scheduler_config=SchedulerConfig(self.max_num_batched_tokens),
            model_config=ModelConfig(
                max_model_len=self.max_model_len,
                multimodal_config=self.multimodal_config(),
            ),
            compilation_config=CompilationConfig(cudagraph_mm_encoder=True),
        )


# ---------------------------------------------------------------------------
# Shared fakes
# ---------------------------------------------------------------------------


def _as_int(value: Any) -> int | None:
    if value is None:
        return None
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


def varlen_attention(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: Any,
    violations: dict[str, list[str]],
) -> torch.Tensor:
    """Varlen self-attention by FlashAttention's contract, on 2-D rows.

    Each row of a sequence becomes itself plus its sequence's mean (every key
    row of the sequence is read); only the first ``max_seqlen`` rows of a
    sequence are computed and rows outside every sequence are not written:
    both stay NaN. What breaks the contract is added to ``violations`` by
    kind.
    """
    rows = x.shape[0]
    offsets = [int(v) for v in cu_seqlens.tolist()]
    bound = _as_int(max_seqlen)
    out = torch.full_like(x, float("nan"))

    def violation(kind: str, message: str) -> None:
        violations.setdefault(kind, []).append(message)

    if offsets[0] != 0:
        violation("cu_seqlens-start", f"cu_seqlens[0] = {offsets[0]}, not 0")
    for i, (start, end) in enumerate(itertools.pairwise(offsets)):
        if end < start:
            violation("cu_seqlens-decreasing", f"cu_seqlens[{i + 1}] = {end} < {start}")
            continue
        if end > rows:
            violation("offsets-past-rows", f"sequence {i} ends at {end} > {rows}")
            continue
        length = end - start
        if length == 0:
            continue
        done = length if bound is None else min(length, bound)
        if done < length:
            violation(
                "max_seqlen-too-small",
                f"sequence {i} has {length} rows, max_seqlen {bound}: "
                f"{length - done} rows not computed",
            )
        mean = x[start:end].mean(dim=0, keepdim=True)
        out[start : start + done] = x[start : start + done] + mean
    return out


class Recorder(FakeModule):
    """What a tower saw: ``calls`` (one dict per forward) and the attention
    contract ``violations`` of every attention call, by kind."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.violations: dict[str, list[str]] = {}

    def reset(self) -> None:
        self.calls.clear()
        self.violations.clear()


def _snapshot(value: Any) -> Any:
    """A call argument as it was at call time (tensors cloned)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_snapshot(v) for v in value)
    return value


def patch_embedding(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A fake patch embedding: each row to ``WIDTH`` fixed mixes of its
    values (in float32, then cast)."""
    flat = x.reshape(x.shape[0], -1).float()
    return (flat @ _mixing(flat.shape[1], WIDTH)).to(dtype)


@functools.cache
def _mixing(rows: int, cols: int) -> torch.Tensor:
    """A fixed, exactly representable ``rows x cols`` matrix."""
    i = torch.arange(rows)[:, None]
    j = torch.arange(cols)[None, :]
    return (((i * 7 + j * 3) % 11) - 5).float() / 16


def group_means(x: torch.Tensor, group: int) -> torch.Tensor:
    """A fake merger: the mean of each run of ``group`` rows."""
    return x.reshape(-1, group, x.shape[-1]).mean(dim=1)


class _Obj:
    """A plain attribute bag for config-like objects."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


# ---------------------------------------------------------------------------
# One model's parity setup
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelParity:
    """How one model is compared: its two host classes and its inputs."""

    name: str  # the spec stem
    vllm_host: type
    our_host: type
    make_host: Callable[[type, HostSettings], Any]
    modalities: tuple[str, ...]
    make_batch: Callable[..., dict[str, Any]]
    random_grid: Callable[[torch.Generator, str], tuple[int, ...]]
    frames: Callable[[tuple[int, ...]], int]
    #: The encoder paths of the config, in order.
    paths: tuple[str, ...] = ("default",)

    def hosts(self, settings: HostSettings = HostSettings()) -> tuple[Any, Any]:
        """(vLLM's host, ours), built alike from ``settings``."""
        return (
            self.make_host(self.vllm_host, settings),
            self.make_host(self.our_host, settings),
        )


@dataclasses.dataclass(frozen=True)
class VllmSide:
    """What one model's parity takes from vLLM: the wheel's code (the
    generated module is loaded on it, so its ``vllm.*`` imports are the
    same), vLLM's host class and the builder of a host of either class.

    The generated mixin is mixed onto the host's own methods that vLLM's
    host class has too: ``host_methods`` before it (they win, as in vLLM's
    model class), ``host_parts`` after it, ``our_attrs`` in its body."""

    code: WheelCode
    host: type
    make_host: Callable[[type, HostSettings], Any]
    host_methods: tuple[type, ...] = ()
    host_parts: tuple[type, ...] = ()
    our_attrs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ModelRow:
    """One model of :data:`MODELS`: where its vLLM side comes from and what
    its batches are (see :class:`ModelParity`)."""

    vllm_side: Callable[[], VllmSide]
    modalities: tuple[str, ...]
    make_batch: Callable[..., dict[str, Any]]
    random_grid: Callable[[torch.Generator, str], tuple[int, ...]]
    frames: Callable[[tuple[int, ...]], int]
    paths: tuple[str, ...] = ("default",)


def frames_of_t(grid: tuple[int, ...]) -> int:
    """The frames of a ``(t, ...)`` grid."""
    return grid[0]


def one_frame(grid: tuple[int, ...]) -> int:
    """An item of one frame (images)."""
    return 1


def _wheel_code(stubs: dict[str, dict[str, Any]]) -> WheelCode:
    merged = protocol_stubs()
    for module, names in stubs.items():
        merged.setdefault(module, {}).update(names)
    return with_protocol(WheelCode(vllm_wheel(), merged))


def _protocol(code: WheelCode) -> type:
    return code.stubs["vllm.model_executor.models.interfaces"][
        "SupportsEncoderCudaGraph"
    ]


PROTOCOL_METHODS = (
    "get_encoder_cudagraph_config",
    "get_input_modality",
    "get_encoder_cudagraph_budget_range",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
    "postprocess_encoder_output",
)


def _defined(code: WheelCode, module: str, class_name: str) -> list[str]:
    """The protocol methods ``module.class_name`` defines itself."""
    own = code.method_names(module, class_name)
    return [m for m in PROTOCOL_METHODS if m in own]


# ---------------------------------------------------------------------------
# Qwen2-VL
# ---------------------------------------------------------------------------

QWEN2_VL = "vllm.model_executor.models.qwen2_vl"


class _QwenRotary:
    """``get_cos_sin(n)`` of a RoPE cache: position codes, not frequencies."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def get_cos_sin(self, seqlen: int) -> tuple[torch.Tensor, torch.Tensor]:
        codes = torch.arange(seqlen, dtype=torch.float32)[:, None] + torch.arange(
            WIDTH // 2, dtype=torch.float32
        ) / (2 * WIDTH)
        return codes.to(self.dtype), (-codes).to(self.dtype)


class _QwenIdentityNorm:
    input_dtype = None

    def __call__(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype, copy=False)


class _QwenBlock:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def __call__(
        self, x, cu_seqlens, rotary_pos_emb_cos, rotary_pos_emb_sin, max_seqlen=None
    ):
        rows = x[:, 0, :].float() + rotary_pos_emb_cos.float()
        out = varlen_attention(rows, cu_seqlens, max_seqlen, self.recorder.violations)
        return out.to(x.dtype)[:, None, :]


class _QwenTowerParts(Recorder):
    """The learned parts of ``Qwen2VisionTransformer`` and its attributes;
    ``forward`` and the metadata builders are vLLM's (subclass)."""

    def __init__(self, settings: HostSettings, dtype: torch.dtype, norm: Any) -> None:
        super().__init__()
        self.spatial_merge_size = 2
        self.out_hidden_size = WIDTH
        self.attn_backend = AttentionBackendEnum[settings.backend]
        self.patch_embed = _CallablePatchEmbed(
            lambda x: patch_embedding(x, dtype),
            proj=_Obj(in_channels=3),
            patch_size=PATCH,
            temporal_patch_size=2,
        )
        self.input_norm = norm
        self.rotary_pos_emb = _QwenRotary(dtype)
        self.blocks = [_QwenBlock(self)]
        self.merger = lambda x: group_means(x[:, 0, :], 4)
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return CPU

    def __call__(self, x, grid_thw, *, encoder_metadata=None):
        self.calls.append(
            {
                "x": _snapshot(x),
                "grid_thw": _snapshot(grid_thw),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(x, grid_thw, encoder_metadata=encoder_metadata)


class _CallablePatchEmbed(FakeModule):
    """A patch embedding that is both called and read for its sizes."""

    def __init__(self, call: Callable[[torch.Tensor], torch.Tensor], **sizes: Any):
        self.__dict__.update(sizes)
        self._call = call

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(x)


class _QwenProcessingInfo:
    """``Qwen2VLProcessingInfo`` as far as ``get_max_frames_per_video``
    reads it: the frame count comes from the host settings."""

    def __init__(self, frames: int) -> None:
        self.frames = frames

    def get_num_frames_with_most_features(self, seq_len, mm_counts) -> int:
        return self.frames


class _Registry:
    """``MULTIMODAL_REGISTRY``: the processing info of a model config (the
    host's frame count rides on its model config as ``parity_max_frames``)."""

    def get_processing_info(self, model_config):
        return _QwenProcessingInfo(model_config.parity_max_frames)


def _qwen_norm(code: WheelCode, fused: bool) -> Any:
    if not fused:
        return _QwenIdentityNorm()
    # vLLM's own fused normalisation (its native path), on fixed statistics.
    parts = type(
        "_FusedNormParts",
        (),
        {
            "channel": 3,
            "weight": torch.tensor([1 / 51.0, 1 / 64.0, 1 / 32.0]),
            "bias": torch.tensor([-2.0, -1.5, -1.75]),
            "__call__": lambda self, x, dtype: self.forward_native(x, dtype),
        },
    )
    fused_class = code.klass(
        "vllm.model_executor.layers.fusion.mm_input_norm",
        "FusedMMInputNorm",
        ["forward_native", "input_dtype"],
        bases=(parts,),
    )
    return fused_class()


def _qwen2_vl_side() -> VllmSide:
    code = _wheel_code(
        {
            "vllm.multimodal": {"MULTIMODAL_REGISTRY": _Registry()},
            QWEN2_VL: {"Qwen2VLProcessingInfo": _QwenProcessingInfo},
        }
    )
    tower_class = code.klass(
        QWEN2_VL,
        "Qwen2VisionTransformer",
        ["forward", "prepare_encoder_metadata"],
        bases=(_QwenTowerParts,),
        exclude=["device", "dtype"],
    )
    host_methods = code.klass(
        QWEN2_VL, "Qwen2VLForConditionalGeneration", ["get_max_frames_per_video"]
    )
    vllm_mixin = code.klass(
        QWEN2_VL,
        "Qwen2VLForConditionalGeneration",
        _defined(code, QWEN2_VL, "Qwen2VLForConditionalGeneration"),
        bases=(_protocol(code),),
        exclude=["get_max_frames_per_video"],
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        dtype = torch.float32
        tower = tower_class(
            settings, dtype, _qwen_norm(code, settings.fused_input_norm)
        )
        host = host_class()
        vllm_config = settings.vllm_config()
        host.model_config = vllm_config.model_config
        host.model_config.parity_max_frames = settings.max_frames_per_video
        host.multimodal_config = vllm_config.model_config.multimodal_config
        host.visual = tower
        return host

    return VllmSide(
        code=code,
        host=type("VllmQwen2VLHost", (host_methods, vllm_mixin), {}),
        make_host=make_host,
        host_methods=(host_methods,),
    )


def _merged_grid(gen: torch.Generator, modality: str) -> tuple[int, int, int]:
    """A random [t, h, w] patch grid of a tower with a 2 x 2 merge: images
    of 1 x 2..10 x 2..10 patches, videos of 1..3 frames of 2..6 x 2..6."""
    if modality == "image":
        h, w = (2 * torch.randint(1, 6, (2,), generator=gen)).tolist()
        return (1, h, w)
    t = int(torch.randint(1, 4, (1,), generator=gen))
    h, w = (2 * torch.randint(1, 4, (2,), generator=gen)).tolist()
    return (t, h, w)


def qwen_batch(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    *,
    raw: bool = False,
) -> dict[str, Any]:
    """A Qwen2-VL batch of ``grids`` ([t, h, w] patches, h and w even);
    ``raw`` pixels are uint8 bytes (fused normalisation), else float32."""
    rows = sum(t * h * w for t, h, w in grids)
    if raw:
        pixels = torch.randint(
            0, 256, (rows, PIXEL_COLUMNS), generator=gen, dtype=torch.uint8
        )
    else:
        pixels = torch.randn(rows, PIXEL_COLUMNS, generator=gen)
    grid = torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)
    if modality == "image":
        return {"pixel_values": pixels, "image_grid_thw": grid}
    return {"pixel_values_videos": pixels, "video_grid_thw": grid}


# ---------------------------------------------------------------------------
# Qwen2.5-VL
# ---------------------------------------------------------------------------

QWEN2_5_VL = "vllm.model_executor.models.qwen2_5_vl"
MM_ATTENTION = "vllm.model_executor.layers.attention.mm_encoder_attention"


def flashinfer_attention(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    sequence_lengths: torch.Tensor,
    max_seqlen: Any,
    stride: int,
    violations: dict[str, list[str]],
) -> torch.Tensor:
    """FlashInfer's cuDNN varlen attention by its contract, on 2-D rows.

    ``cu_seqlens`` holds two sections: element offsets of each sequence's
    Q/K/O rows (rows x ``stride``), then of its V rows (3 x ``stride``, the
    interleaved QKV buffer); ``sequence_lengths`` the rows of each sequence.
    Each Q row becomes itself plus the mean of its sequence's V rows, read at
    the V offset: a wrong V section reads other rows. Rows no sequence
    covers stay NaN; what breaks the contract lands in ``violations``.
    """
    rows = x.shape[0]
    offsets = [int(v) for v in cu_seqlens.tolist()]
    half = len(offsets) // 2
    qko, v = offsets[:half], offsets[half:]
    lengths = [int(n) for n in sequence_lengths.tolist()]
    bound = _as_int(max_seqlen)
    out = torch.full_like(x, float("nan"))

    def violation(kind: str, message: str) -> None:
        violations.setdefault(kind, []).append(message)

    if len(offsets) % 2 or len(lengths) + 1 != half:
        violation(
            "flashinfer-layout", f"{len(offsets)} offsets, {len(lengths)} lengths"
        )
        return out
    for i, length in enumerate(lengths):
        if length == 0:
            continue
        start, rest = divmod(qko[i], stride)
        v_start, v_rest = divmod(v[i], 3 * stride)
        if rest or v_rest or start + length > rows or v_start + length > rows:
            violation("offsets-past-rows", f"sequence {i}: {qko[i]}, {v[i]}, {length}")
            continue
        done = length if bound is None else min(length, bound)
        if done < length:
            violation("max_seqlen-too-small", f"sequence {i}: {length} > {bound}")
        mean = x[v_start : v_start + length].mean(dim=0, keepdim=True)
        out[start : start + done] = x[start : start + done] + mean
    return out


class _Qwen25Block:
    def __init__(self, tower: Any) -> None:
        self.tower = tower

    def __call__(
        self,
        x,
        *,
        cu_seqlens,
        rotary_pos_emb_cos,
        rotary_pos_emb_sin,
        max_seqlen=None,
        sequence_lengths=None,
    ):
        rows = x[:, 0, :].float() + rotary_pos_emb_cos.float()
        tower = self.tower
        if tower.attn_backend is AttentionBackendEnum.FLASHINFER:
            out = flashinfer_attention(
                rows,
                cu_seqlens,
                sequence_lengths,
                max_seqlen,
                tower.hidden_size // tower.tp_size,
                tower.violations,
            )
        else:
            out = varlen_attention(rows, cu_seqlens, max_seqlen, tower.violations)
        return out.to(x.dtype)[:, None, :]


class _Qwen25TowerParts(Recorder):
    """The learned parts of ``Qwen2_5_VisionTransformer`` and its attributes:
    a window of 2 x 2 merged tokens (``window_size`` 8 with 2-pixel patches),
    one windowed block then one full-attention block. ``forward``, the
    metadata builder, window indices and RoPE gathers are vLLM's (subclass)."""

    def __init__(self, settings: HostSettings, dtype: torch.dtype, norm: Any) -> None:
        super().__init__()
        self.spatial_merge_size = 2
        self.spatial_merge_unit = 4
        self.patch_size = PATCH
        self.window_size = 8
        self.fullatt_block_indexes = (1,)
        self.hidden_size = WIDTH
        self.out_hidden_size = WIDTH
        self.tp_size = 1
        self.fp8_padded_hidden_size = None
        self.attn_backend = AttentionBackendEnum[settings.backend]
        self.patch_embed = _CallablePatchEmbed(
            lambda x: patch_embedding(x, dtype),
            proj=_Obj(in_channels=3),
            patch_size=PATCH,
            temporal_patch_size=2,
        )
        self.input_norm = norm
        self.rotary_pos_emb = _QwenRotary(dtype)
        self._rope_by_thw_cache: dict[tuple[int, int, int], Any] = {}
        self.blocks = [_Qwen25Block(self), _Qwen25Block(self)]
        self.merger = lambda x: group_means(x[:, 0, :], 4)
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return CPU

    def __call__(self, x, grid_thw, *, encoder_metadata=None):
        self.calls.append(
            {
                "x": _snapshot(x),
                "grid_thw": _snapshot(grid_thw),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(x, grid_thw, encoder_metadata=encoder_metadata)


def mm_attention_helpers(code: WheelCode) -> None:
    """vLLM's own encoder-attention metadata helpers (the FlashInfer
    repacking included), without the layer itself, as ``MMEncoderAttention``."""
    code.stubs.setdefault(MM_ATTENTION, {})["MMEncoderAttention"] = code.klass(
        MM_ATTENTION,
        "MMEncoderAttention",
        ["compute_max_seqlen", "maybe_compute_seq_lens", "maybe_recompute_cu_seqlens"],
    )


#: What Qwen2.5-VL's code needs stubbed on CPU.
QWEN25_STUBS = {
    "vllm.multimodal": {"MULTIMODAL_REGISTRY": _Registry()},
    QWEN2_5_VL: {"Qwen2VLProcessingInfo": _QwenProcessingInfo},
}


def qwen25_tower_class(code: WheelCode) -> type:
    """vLLM's ``Qwen2_5_VisionTransformer`` (its forward, metadata builder
    and window indices) on :class:`_Qwen25TowerParts`; instances take
    ``(settings, dtype, norm)``."""
    mm_attention_helpers(code)
    return code.klass(
        QWEN2_5_VL,
        "Qwen2_5_VisionTransformer",
        [
            "forward",
            "prepare_encoder_metadata",
            "get_encoder_cudagraph_max_window_seqs",
        ],
        bases=(_Qwen25TowerParts,),
        exclude=["device", "dtype"],
    )


def qwen25_tower(code: WheelCode, backend: str) -> Any:
    """A Qwen2.5-VL tower of :func:`qwen25_tower_class` under ``backend``,
    float32, its input normalisation not fused."""
    tower_class = qwen25_tower_class(code)
    return tower_class(
        HostSettings(backend=backend), torch.float32, _qwen_norm(code, False)
    )


def _qwen2_5_vl_side() -> VllmSide:
    code = _wheel_code(QWEN25_STUBS)
    tower_class = qwen25_tower_class(code)
    host_class = "Qwen2_5_VLForConditionalGeneration"
    host_methods = code.klass(QWEN2_5_VL, host_class, ["get_max_frames_per_video"])
    vllm_mixin = code.klass(
        QWEN2_5_VL,
        host_class,
        _defined(code, QWEN2_5_VL, host_class),
        bases=(_protocol(code),),
        exclude=["get_max_frames_per_video"],
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        dtype = torch.float32
        norm = _qwen_norm(code, settings.fused_input_norm)
        host = host_class()
        vllm_config = settings.vllm_config()
        host.model_config = vllm_config.model_config
        host.model_config.parity_max_frames = settings.max_frames_per_video
        host.multimodal_config = vllm_config.model_config.multimodal_config
        host.is_multimodal_pruning_enabled = settings.pruning
        host.visual = tower_class(settings, dtype, norm)
        return host

    return VllmSide(
        code=code,
        host=type("VllmQwen2_5_VLHost", (host_methods, vllm_mixin), {}),
        make_host=make_host,
        host_methods=(host_methods,),
    )


# ---------------------------------------------------------------------------
# Qwen3-VL
# ---------------------------------------------------------------------------

QWEN3_VL = "vllm.model_executor.models.qwen3_vl"
#: Side of the fake position-embedding grid (vLLM: 48, a 2304-entry table).
POS_GRID = 4


class _Qwen3Block:
    """A Qwen3-VL (and Cohere Compass) vision block: FlashAttention's or
    FlashInfer's varlen contract, by the tower's backend."""

    def __init__(self, tower: Any) -> None:
        self.tower = tower

    def __call__(
        self,
        x,
        *,
        cu_seqlens,
        rotary_pos_emb_cos,
        rotary_pos_emb_sin,
        max_seqlen=None,
        sequence_lengths=None,
    ):
        rows = x[:, 0, :].float() + rotary_pos_emb_cos.float()[:, : x.shape[-1]]
        tower = self.tower
        if tower.attn_backend is AttentionBackendEnum.FLASHINFER:
            out = flashinfer_attention(
                rows,
                cu_seqlens,
                sequence_lengths,
                max_seqlen,
                tower.hidden_size // tower.tp_size,
                tower.violations,
            )
        else:
            out = varlen_attention(rows, cu_seqlens, max_seqlen, tower.violations)
        return out.to(x.dtype)[:, None, :]


class _Qwen3TowerParts(Recorder):
    """The learned parts of ``Qwen3_VisionTransformer``: a 4 x 4 position
    table, one block, one DeepStack merger after it (output rows twice
    ``WIDTH`` wide). ``forward``, the metadata builder, the position
    interpolation and the RoPE position ids are vLLM's (subclass)."""

    def __init__(self, settings: HostSettings, dtype: torch.dtype, norm: Any) -> None:
        super().__init__()
        self.spatial_merge_size = 2
        self.hidden_size = WIDTH
        self.out_hidden_size = 2 * WIDTH
        self.tp_size = 1
        self.fp8_padded_hidden_size = None
        self.num_grid_per_side = POS_GRID
        self.attn_backend = AttentionBackendEnum[settings.backend]
        self.patch_embed = _CallablePatchEmbed(
            lambda x: patch_embedding(x, dtype),
            proj=_Obj(in_channels=3),
            patch_size=PATCH,
            temporal_patch_size=2,
        )
        codes = torch.arange(POS_GRID * POS_GRID * WIDTH, dtype=torch.float32)
        self.pos_embed = _Obj(weight=(codes.reshape(-1, WIDTH) / 64).to(dtype))
        self.input_norm = norm
        self.rotary_pos_emb = _QwenRotary(dtype)
        self._rot_pos_ids_cache: dict[tuple[int, int, int], Any] = {}
        self.blocks = [_Qwen3Block(self)]
        self.deepstack_visual_indexes = [0]
        self.deepstack_merger_list = [lambda x: -group_means(x[:, 0, :], 4)]
        self.merger = lambda x: group_means(x[:, 0, :], 4)
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return CPU

    def __call__(self, x, grid_thw, *, encoder_metadata=None):
        self.calls.append(
            {
                "x": _snapshot(x),
                "grid_thw": _snapshot(grid_thw),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(x, grid_thw, encoder_metadata=encoder_metadata)


def _qwen3_vl_side() -> VllmSide:
    code = _wheel_code(
        {
            "vllm.multimodal": {"MULTIMODAL_REGISTRY": _Registry()},
            # vLLM picks its Triton kernel when Triton is importable.
            QWEN3_VL: {
                "Qwen3VLProcessingInfo": _QwenProcessingInfo,
                "HAS_TRITON": False,
                "triton_pos_embed_interpolate": None,
            },
        }
    )
    mm_attention_helpers(code)
    tower_class = code.klass(
        QWEN3_VL,
        "Qwen3_VisionTransformer",
        ["forward", "prepare_encoder_metadata"],
        bases=(_Qwen3TowerParts,),
        exclude=["device", "dtype"],
    )
    host_class = "Qwen3VLForConditionalGeneration"
    host_methods = code.klass(QWEN3_VL, host_class, ["get_max_frames_per_video"])
    vllm_mixin = code.klass(
        QWEN3_VL,
        host_class,
        _defined(code, QWEN3_VL, host_class),
        bases=(_protocol(code),),
        exclude=["get_max_frames_per_video"],
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        vllm_config = settings.vllm_config()
        host.model_config = vllm_config.model_config
        host.model_config.parity_max_frames = settings.max_frames_per_video
        host.multimodal_config = vllm_config.model_config.multimodal_config
        host.is_multimodal_pruning_enabled = settings.pruning
        norm = _qwen_norm(code, settings.fused_input_norm)
        host.visual = tower_class(settings, torch.float32, norm)
        return host

    return VllmSide(
        code=code,
        host=type("VllmQwen3VLHost", (host_methods, vllm_mixin), {}),
        make_host=make_host,
        host_methods=(host_methods,),
    )


# ---------------------------------------------------------------------------
# Cohere Compass
# ---------------------------------------------------------------------------

COHERE_COMPASS = "vllm.model_executor.models.cohere_compass"


def _cohere_compass_side() -> VllmSide:
    code = _wheel_code(
        {
            COHERE_COMPASS: {
                "HAS_TRITON": False,
                "triton_pos_embed_interpolate": None,
            },
        }
    )
    mm_attention_helpers(code)
    # The tower is Qwen3-VL's but for its input: cast, never normalised.
    tower_class = code.klass(
        COHERE_COMPASS,
        "Cohere_VisionTransformer",
        ["forward", "prepare_encoder_metadata"],
        bases=(_Qwen3TowerParts,),
        exclude=["device", "dtype"],
    )
    host_class = "CohereCompassForConditionalGeneration"
    vllm_mixin = code.klass(
        COHERE_COMPASS,
        host_class,
        _defined(code, COHERE_COMPASS, host_class),
        bases=(_protocol(code),),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        vllm_config = settings.vllm_config()
        host.model_config = vllm_config.model_config
        host.multimodal_config = vllm_config.model_config.multimodal_config
        host.is_multimodal_pruning_enabled = settings.pruning
        host.visual = tower_class(settings, torch.float32, _QwenIdentityNorm())
        return host

    return VllmSide(
        code=code,
        host=type("VllmCohereCompassHost", (vllm_mixin,), {}),
        make_host=make_host,
    )


# ---------------------------------------------------------------------------
# MiniMax M3
# ---------------------------------------------------------------------------

MINIMAX_TOWER = "vllm.models.minimax_m3.common.vision_tower"
MINIMAX_MIXIN = "vllm.models.minimax_m3.common.encoder_cudagraph"


def merge_window_positions(grid_thw, merge: int) -> torch.Tensor:
    """(3, rows) t/h/w positions of each row, rows in merge-window order
    (the order the ViT patches arrive in)."""
    planes = []
    for t, h, w in grid_thw:
        tt, hh, ww = torch.meshgrid(
            torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"
        )

        def windows(a: torch.Tensor, t=t, h=h, w=w) -> torch.Tensor:
            a = a.reshape(t, h // merge, merge, w // merge, merge)
            return a.permute(0, 1, 3, 2, 4).reshape(-1)

        planes.append(torch.stack([windows(tt), windows(hh), windows(ww)]))
    if not planes:
        return torch.zeros((3, 0), dtype=torch.int64)
    return torch.cat(planes, dim=1)


class _MiniMaxRopeSetup:
    """The fused 3-D RoPE setup kernel: (3, rows, half) position codes."""

    def __call__(self, inv_t, inv_h, inv_w, grid_thw, merge):
        half = inv_t.numel() + inv_h.numel() + inv_w.numel()
        pos = merge_window_positions(grid_thw, merge).float()
        codes = pos[:, :, None] + torch.arange(half, dtype=torch.float32) / (2 * half)
        return codes, -codes


class _MiniMaxEncoder:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def __call__(
        self,
        hidden,
        cu_seqlens,
        rotary_cos,
        rotary_sin,
        max_seqlen,
        *,
        sequence_lengths=None,
    ):
        rows = hidden[:, 0, :].float() + rotary_cos.sum(dim=(0, 2))[:, None]
        out = varlen_attention(rows, cu_seqlens, max_seqlen, self.recorder.violations)
        return out.to(hidden.dtype)[:, None, :]


class _MiniMaxViTParts(FakeModule):
    """The learned parts of ``MiniMaxVLVisionTransformer``; its metadata
    builder and forward are vLLM's (subclass)."""

    def __init__(
        self, settings: HostSettings, dtype: torch.dtype, recorder: Recorder
    ) -> None:
        self.spatial_merge_size = 2
        self.temporal_patch_size = 2
        self.vision_segment_max_frames = None
        self.hidden_size = WIDTH
        self.tp_size = 1
        self.attn_backend = AttentionBackendEnum[settings.backend]
        self.inv_freq_t = self.inv_freq_h = self.inv_freq_w = torch.ones(2)
        self.mrope_setup = _MiniMaxRopeSetup()
        self.embeddings = _CallablePatchEmbed(
            lambda x: patch_embedding(x, dtype),
            num_channels=3,
            temporal_patch_size=2,
            patch_size=PATCH,
        )
        self.pre_layrnorm = lambda x: x
        self.encoder = _MiniMaxEncoder(recorder)
        self.post_layernorm = None
        #: The arguments of every ``prepare_encoder_metadata`` call.
        self.metadata_calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.forward(*args, **kwargs)


class _MetadataCallLog:
    """Records each ``prepare_encoder_metadata`` call (the item count and the
    keyword arguments) in ``metadata_calls``, then runs vLLM's builder."""

    def prepare_encoder_metadata(self, grid_thw, **kwargs: Any):
        self.metadata_calls.append({"items": len(grid_thw), **kwargs})
        return super().prepare_encoder_metadata(grid_thw, **kwargs)


class _MiniMaxModelParts(Recorder):
    """``MiniMaxVLVisionModel`` around a ViT; the forward is vLLM's."""

    def __init__(self, settings: HostSettings, vit_class: type, dtype: torch.dtype):
        super().__init__()
        self.vision_model = vit_class(settings, dtype, self)
        self.spatial_merge_size = 2
        self.dtype = dtype
        self.out_hidden_size = WIDTH
        self.multi_modal_projector = lambda x: x
        self.patch_merge_mlp = lambda x: group_means(x, 4)

    def __call__(self, pixel_values=None, grid_thw=None, *, encoder_metadata=None):
        self.calls.append(
            {
                "pixel_values": _snapshot(pixel_values),
                "grid_thw": _snapshot(grid_thw),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(pixel_values, grid_thw, encoder_metadata=encoder_metadata)


def _minimax_m3_side() -> VllmSide:
    code = _wheel_code({})
    # vLLM's own encoder-attention metadata helpers (the FlashInfer repacking
    # included), without the layer itself.
    code.stubs.setdefault(MM_ATTENTION, {})["MMEncoderAttention"] = code.klass(
        MM_ATTENTION,
        "MMEncoderAttention",
        ["compute_max_seqlen", "maybe_compute_seq_lens", "maybe_recompute_cu_seqlens"],
    )
    vit_parts = code.klass(
        MINIMAX_TOWER,
        "MiniMaxVLVisionTransformer",
        ["forward", "prepare_encoder_metadata"],
        bases=(_MiniMaxViTParts,),
    )

    vit_class = type("MiniMaxVLVisionTransformer", (_MetadataCallLog, vit_parts), {})
    model_class = code.klass(
        MINIMAX_TOWER, "MiniMaxVLVisionModel", ["forward"], bases=(_MiniMaxModelParts,)
    )
    vllm_mixin = code.klass(
        MINIMAX_MIXIN,
        "MiniMaxM3EncoderCudaGraphMixin",
        code.method_names(MINIMAX_MIXIN, "MiniMaxM3EncoderCudaGraphMixin"),
        bases=(_protocol(code),),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        dtype = torch.float32
        host = host_class()
        host.vision_tower = model_class(settings, vit_class, dtype)
        host.multimodal_config = settings.multimodal_config()
        return host

    return VllmSide(
        code=code,
        host=type("VllmMiniMaxM3Host", (vllm_mixin,), {}),
        make_host=make_host,
    )


def _minimax_batch(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    *,
    as_list: bool = False,
) -> dict[str, Any]:
    """A MiniMax M3 image batch of ``grids`` ([1, h, w] patches, h and w
    even); ``as_list`` gives the pixels one tensor per image."""
    assert modality == "image"
    pixels = [torch.randn(t * h * w, PIXEL_COLUMNS, generator=gen) for t, h, w in grids]
    grid = torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)
    values = (
        pixels
        if as_list
        else torch.cat(pixels) if pixels else torch.zeros(0, PIXEL_COLUMNS)
    )
    return {"pixel_values": values, "image_grid_thw": grid}


# ---------------------------------------------------------------------------
# ERNIE-4.5-VL
# ---------------------------------------------------------------------------

ERNIE = "vllm.model_executor.models.ernie45_vl"
#: Columns of an ERNIE pixel row: 3 channels x PATCH x PATCH (no frames).
ERNIE_PIXEL_COLUMNS = 3 * PATCH * PATCH


class _ErnieRotary:
    """``Ernie4_5_VisionRotaryEmbedding(seqlen)``: position codes of
    ``WIDTH // 4`` columns (the tower puts the h and w codes side by side)."""

    def __call__(self, seqlen: Any) -> torch.Tensor:
        steps = torch.arange(WIDTH // 4, dtype=torch.float32) / WIDTH
        return torch.arange(int(seqlen), dtype=torch.float32)[:, None] + steps


class _ErnieBlock:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def __call__(self, x, cu_seqlens, rotary_pos_emb, max_seqlen=None):
        codes = rotary_pos_emb.float().sum(dim=-1, keepdim=True)
        rows = x[:, 0, :].float() + codes
        out = varlen_attention(rows, cu_seqlens, max_seqlen, self.recorder.violations)
        return out.to(x.dtype)[:, None, :]


class _ErnieTowerParts(Recorder):
    """The learned parts of ``Ernie4_5_VisionTransformer``; ``forward`` and
    its metadata helpers are vLLM's (subclass)."""

    def __init__(self, settings: HostSettings, dtype: torch.dtype) -> None:
        super().__init__()
        self.spatial_merge_size = 2
        self.attn_backend = AttentionBackendEnum[settings.backend]
        self.patch_embed = _CallablePatchEmbed(
            lambda x: patch_embedding(x, dtype), in_channels=3, patch_size=PATCH
        )
        self.rotary_pos_emb = _ErnieRotary()
        self.blocks = [_ErnieBlock(self)]
        self.ln = lambda x: x
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return CPU

    def __call__(self, x, grid_thw=None, num_pad=0, *, encoder_metadata=None):
        self.calls.append(
            {
                "x": _snapshot(x),
                "grid_thw": _snapshot(grid_thw),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(x, grid_thw, num_pad, encoder_metadata=encoder_metadata)


class ErnieResampler:
    """``VariableResolutionResamplerModel``: each 2 x 2 merge window of
    ``WIDTH``-wide ViT rows to one token of ``out_dim`` columns. Like the
    real one, it refuses rows of another width (its first linear layer takes
    four ViT rows) and rows that are not the grid's patches (its offsets
    come from the grid)."""

    out_dim = 2 * WIDTH

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, x: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        self.calls.append({"rows": x.shape[0], "grid_thw": _snapshot(grid_thw)})
        if x.shape[-1] != WIDTH:
            raise RuntimeError(f"rows of {x.shape[-1]} columns, not {WIDTH}")
        patches = int(torch.as_tensor(grid_thw).prod(-1).sum())
        if x.shape[0] != patches:
            raise RuntimeError(f"{x.shape[0]} rows for a grid of {patches} patches")
        merged = group_means(x, 4)
        return torch.cat([merged, -merged], dim=-1)


def _ernie45_vl_side() -> VllmSide:
    code = _wheel_code(
        {"vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext}}
    )
    tower_class = code.klass(
        ERNIE,
        "Ernie4_5_VisionTransformer",
        [
            "forward",
            "prepare_encoder_metadata",
            "rot_pos_emb",
            "compute_attn_mask_seqlen",
        ],
        bases=(_ErnieTowerParts,),
        exclude=["device", "dtype"],
    )
    host_name = "Ernie4_5_VLMoeForConditionalGeneration"
    vllm_mixin = code.klass(
        ERNIE, host_name, _defined(code, ERNIE, host_name), bases=(_protocol(code),)
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        host.vision_model = tower_class(settings, torch.float32)
        host.resampler_model = ErnieResampler()
        # vLLM reads the LM width from the config; the resampler is built with it.
        host.config = _Obj(hidden_size=ErnieResampler.out_dim)
        return host

    return VllmSide(
        code=code,
        host=type("VllmErnie45VLHost", (vllm_mixin,), {}),
        make_host=make_host,
    )


def ernie_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict[str, Any]:
    """An ERNIE-4.5-VL image batch of ``grids`` ([1, h, w] patches, h and w
    even)."""
    assert modality == "image"
    rows = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(rows, ERNIE_PIXEL_COLUMNS, generator=gen)
    grid = torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)
    return {"pixel_values": pixels, "image_grid_thw": grid}


# ---------------------------------------------------------------------------
# DeepSeek-VL2
# ---------------------------------------------------------------------------

DEEPSEEK_VL2 = "vllm.model_executor.models.deepseek_vl2"
#: The fake DeepSeek-VL2's tiles: 6 x 6 pixels of 2 x 2 patches, 3 x 3
#: patches per tile, which the projector pads to 4 x 4 and merges to 2 x 2
#: (the released 384 / 14 = 27 patches pad to 28 and merge to 14 the same way).
DV2_SIDE = 6
DV2_PATCH = 2
DV2_EMBED = 2 * WIDTH


class _DeepseekVL2Vision(Recorder):
    """timm's SigLIP ``forward_features``: each tile's patches to
    ``WIDTH``-wide rows, ``(tiles, patches, WIDTH)``."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = _Obj(
            img_size=(DV2_SIDE, DV2_SIDE), patch_size=(DV2_PATCH, DV2_PATCH)
        )

    def forward_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self.calls.append({"pixel_values": _snapshot(pixel_values)})
        tiles = pixel_values.shape[0]
        grid = DV2_SIDE // DV2_PATCH
        patches = pixel_values.reshape(tiles, 3, grid, DV2_PATCH, grid, DV2_PATCH)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(tiles * grid * grid, -1)
        rows = patch_embedding(patches, pixel_values.dtype)
        return rows.reshape(tiles, grid * grid, WIDTH)


class _DeepseekVL2ProjectorParts:
    """``MlpProjector``'s learned layers (a fixed linear map of each merged
    2 x 2 window); its ``forward`` (padding and unfold) is vLLM's."""

    def __init__(self) -> None:
        self.cfg = _Obj(downsample_ratio=2, n_embed=DV2_EMBED)
        self.projector_type = "downsample_mlp_gelu"
        self.layers = lambda x: x @ _mixing(4 * WIDTH, DV2_EMBED)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)


def _deepseek_vl2_side() -> VllmSide:
    code = _wheel_code({})
    projector_class = code.klass(
        DEEPSEEK_VL2, "MlpProjector", ["forward"], bases=(_DeepseekVL2ProjectorParts,)
    )
    host_name = "DeepseekVLV2ForCausalLM"
    vllm_mixin = code.klass(
        DEEPSEEK_VL2,
        host_name,
        [*_defined(code, DEEPSEEK_VL2, host_name), "_proj_hw"],
        bases=(_protocol(code),),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        host.vision = _DeepseekVL2Vision()
        host.projector = projector_class()
        host.vision_config = _Obj(image_size=DV2_SIDE, patch_size=DV2_PATCH)
        host.projector_config = host.projector.cfg
        host.model_config = settings.vllm_config().model_config
        rows = torch.arange(DV2_EMBED, dtype=torch.float32)
        host.image_newline = -1.0 - rows / 64
        host.view_seperator = -2.0 - rows / 64
        host.global_view_pos = "head"
        return host

    return VllmSide(
        code=code,
        host=type("VllmDeepseekVL2Host", (vllm_mixin,), {}),
        make_host=make_host,
    )


def _tile_grid(gen: torch.Generator, modality: str) -> tuple[int, int]:
    """A random ``(tw, th)`` local tile grid of 1..3 x 1..3 tiles."""
    tw, th = torch.randint(1, 4, (2,), generator=gen).tolist()
    return (tw, th)


def deepseek_vl2_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int]]
) -> dict[str, Any]:
    """A DeepSeek-VL2 image batch: per image a global tile and ``tw x th``
    local tiles of pixels, and its ``images_spatial_crop`` row."""
    assert modality == "image"
    tiles = sum(1 + tw * th for tw, th in grids)
    pixels = torch.randn(tiles, 3, DV2_SIDE, DV2_SIDE, generator=gen)
    crop = torch.tensor(grids, dtype=torch.int64).reshape(-1, 2)
    return {"pixel_values": pixels, "images_spatial_crop": crop}


# ---------------------------------------------------------------------------
# DeepSeek-V4.1
# ---------------------------------------------------------------------------

DEEPSEEK_VISION = "vllm.models.deepseek_v4.common.vision"
DEEPSEEK_MIXIN = "vllm.models.deepseek_v41.common.vl_cudagraph"
DEEPSEEK_PREPROCESS = "vllm.models.deepseek_v41.common.mm_preprocess"


class _DeepseekBlock:
    def __init__(self, recorder: Recorder, backend: str) -> None:
        self.recorder = recorder
        self.attn = _Obj(attn=_Obj(attn_backend=AttentionBackendEnum[backend]))

    def __call__(self, x, cos, sin, cu_seqlens=None, max_seqlen=None):
        rows = x.float() + cos[:, 0, :].sum(-1, keepdim=True)
        if cu_seqlens is None:  # the eager forward: one image
            cu_seqlens = torch.tensor([0, x.shape[0]], dtype=torch.int32)
        out = varlen_attention(rows, cu_seqlens, max_seqlen, self.recorder.violations)
        return out.to(x.dtype)


class _DeepseekViTParts(Recorder):
    """The learned parts of ``DeepseekV4ViT``; ``forward`` and
    ``forward_packed`` are vLLM's (subclass)."""

    def __init__(self, settings: HostSettings, dtype: torch.dtype) -> None:
        super().__init__()
        self.rope_dim = 4
        self.rope_theta = 10000.0
        self.patch_embed = lambda x: patch_embedding(x, dtype)
        self.blocks = [_DeepseekBlock(self, settings.backend)]
        self.norm = lambda x: x

    def __call__(self, patches, n_vit_h, n_vit_w):
        self.calls.append(
            {
                "forward": "eager",
                "patches": _snapshot(patches),
                "grid": (n_vit_h, n_vit_w),
            }
        )
        return self.forward(patches, n_vit_h, n_vit_w)

    def record_packed(self, patches, cos, sin, cu_seqlens, max_seqlen):
        self.calls.append(
            {
                "forward": "packed",
                "patches": _snapshot(patches),
                "cos": _snapshot(cos),
                "sin": _snapshot(sin),
                "cu_seqlens": _snapshot(cu_seqlens),
                "max_seqlen": _snapshot(max_seqlen),
            }
        )


class _Linear:
    """A learned linear layer of vLLM's parallel-linear kind: ``(out, bias)``."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype) -> None:
        self.weight = _mixing(rows, cols).to(dtype)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x @ self.weight, None


class _DeepseekAlignerParts(FakeModule):
    """The learned parts of ``DeepseekV4Aligner``; its merge (eager unfold
    and packed gather) is vLLM's (subclass)."""

    def __init__(self, r: int, dtype: torch.dtype) -> None:
        self.downsample_ratio = r
        self.w1 = _Linear(WIDTH * r * r, WIDTH, dtype)
        self.w2 = _Linear(WIDTH, WIDTH, dtype)

    def __call__(self, x, n_vit_h, n_vit_w):
        return self.forward(x, n_vit_h, n_vit_w)


def _deepseek_v41_side() -> VllmSide:
    code = _wheel_code({})
    vit_class = code.klass(
        DEEPSEEK_VISION,
        "DeepseekV4ViT",
        ["forward", "forward_packed"],
        bases=(_DeepseekViTParts,),
    )

    class _RecordingViT(vit_class):
        def forward_packed(self, patches, cos, sin, cu_seqlens, max_seqlen):
            self.record_packed(patches, cos, sin, cu_seqlens, max_seqlen)
            out = super().forward_packed(patches, cos, sin, cu_seqlens, max_seqlen)
            self.calls[-1]["output"] = out.detach().clone()
            return out

    aligner_class = code.klass(
        DEEPSEEK_VISION,
        "DeepseekV4Aligner",
        ["forward", "forward_packed"],
        bases=(_DeepseekAlignerParts,),
    )
    vllm_mixin = code.klass(
        DEEPSEEK_MIXIN,
        "DeepseekV4VLEncoderCudaGraphMixin",
        code.method_names(DEEPSEEK_MIXIN, "DeepseekV4VLEncoderCudaGraphMixin"),
    )
    protocol = _protocol(code)

    def make_host(host_class: type, settings: HostSettings) -> Any:
        dtype = torch.float32
        host = host_class()
        host.vision = _RecordingViT(settings, dtype)
        host.aligner = aligner_class(3, dtype)
        host.config = _Obj(
            vision_downsample_ratio=3, vision_patch_size=PATCH, hidden_size=WIDTH
        )
        host.multimodal_config = settings.multimodal_config()
        host.image_start = torch.full((WIDTH,), 1000.0)
        host.image_newline = torch.full((WIDTH,), 2000.0)
        host.image_end = torch.full((WIDTH,), 3000.0)
        return host

    return VllmSide(
        code=code,
        # vLLM's host class lists the protocol after the mixin.
        host=type("VllmDeepseekV41Host", (vllm_mixin, protocol), {}),
        make_host=make_host,
        host_parts=(protocol,),
    )


def _deepseek_grid(gen: torch.Generator, modality: str) -> tuple[int, int]:
    """A random ``(h, w)`` ViT grid of 1..9 x 1..9 patches."""
    return tuple(torch.randint(1, 10, (2,), generator=gen).tolist())


@functools.cache
def _deepseek_token_types() -> Callable[[int, int], torch.Tensor]:
    """vLLM's ``image_token_types``: the span types of an LLM grid."""
    return _wheel_code({}).function(DEEPSEEK_PREPROCESS, "image_token_types")


def _deepseek_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int]]
) -> dict[str, Any]:
    """A DeepSeek-V4.1 image batch of ViT ``grids`` ([h, w] patches), with
    the LLM grids and span types vLLM's preprocessing derives from them."""
    assert modality == "image"
    token_types = _deepseek_token_types()
    llm = [(-(-h // 3), -(-w // 3)) for h, w in grids]
    rows = sum(h * w for h, w in grids)
    return {
        "patches": torch.randn(rows, 3, PATCH, PATCH, generator=gen),
        "vit_grid": torch.tensor(grids, dtype=torch.int64).reshape(-1, 2),
        "llm_grid": torch.tensor(llm, dtype=torch.int64).reshape(-1, 2),
        "types": (
            torch.cat([token_types(lh, lw) for lh, lw in llm])
            if llm
            else torch.zeros(0, dtype=torch.int64)
        ),
    }


# ---------------------------------------------------------------------------
# Kimi-VL (MoonViT)
# ---------------------------------------------------------------------------

KIMI_VL = "vllm.model_executor.models.kimi_vl"
MOONVIT = "vllm.model_executor.models.moonvit"
#: The fake MoonViT's head dim: RoPE tables are (rows, MOONVIT_HEAD_DIM // 2)
#: complex64.
MOONVIT_HEAD_DIM = 8
#: Its RoPE grid (vLLM's is 512 x 512): small, so that a capture case can
#: exceed it.
MOONVIT_ROPE_GRID = 64


class _CallableForward(FakeModule):
    """A module whose call is its (vLLM) ``forward``."""


class _MoonVitRopeParts:
    """``Rope2DPosEmb``'s sizes; its table and lookups are vLLM's (subclass)."""

    def __init__(self) -> None:
        self.dim = MOONVIT_HEAD_DIM
        self.max_height = self.max_width = MOONVIT_ROPE_GRID
        self.theta_base = 10000
        self.device = "cpu"


class _MoonVitPosEmbParts:
    """``Learnable2DInterpPosEmb``'s learned grid; the bicubic resize to each
    image is vLLM's (subclass)."""

    def __init__(self) -> None:
        self.height = self.width = 4
        self.interpolation_mode = "bicubic"
        self.weight = _mixing(16, WIDTH).reshape(4, 4, WIDTH)


class _MoonVitBlock:
    """A MoonViT encoder layer: its RoPE table as a row code, then varlen
    attention by FlashAttention's contract."""

    def __init__(self, recorder: Recorder, backend: str) -> None:
        self.recorder = recorder
        self.attn = _Obj(attn_backend=AttentionBackendEnum[backend])

    def __call__(self, hidden_states, cu_seqlens, rope_freqs_cis=None, max_seqlen=None):
        code = rope_freqs_cis.real.sum(-1, keepdim=True) + rope_freqs_cis.imag.sum(
            -1, keepdim=True
        )
        rows = hidden_states.float() + code
        out = varlen_attention(rows, cu_seqlens, max_seqlen, self.recorder.violations)
        return out.to(hidden_states.dtype)


def _moonvit_classes(code: WheelCode) -> dict[str, type]:
    """vLLM's MoonViT parts on fake learned layers: the RoPE table, the
    position-embedding resize, the patch embedding's glue, the encoder's
    loop and the tower's metadata builder and forward."""
    rope = code.klass(
        MOONVIT,
        "Rope2DPosEmb",
        [
            "precomputed_freqs_cis",
            "get_freqs_cis_by_seqlens_list",
            "get_freqs_cis_by_seqlens",
        ],
        bases=(_MoonVitRopeParts,),
    )
    pos_emb = code.klass(
        MOONVIT,
        "Learnable2DInterpPosEmb",
        ["get_pos_embeds", "forward"],
        bases=(_MoonVitPosEmbParts, _CallableForward),
    )
    patch_embed = code.klass(
        MOONVIT, "MoonVisionPatchEmbed", ["forward"], bases=(_CallableForward,)
    )
    encoder = code.klass(
        MOONVIT,
        "MoonVitEncoder",
        ["forward", "get_rope_freqs_cis"],
        bases=(_CallableForward,),
    )
    tower = code.klass(
        MOONVIT,
        "MoonVitPretrainedModel",
        ["forward", "prepare_encoder_metadata"],
        bases=(_MoonVitParts,),
    )
    return {
        "rope": rope,
        "pos_emb": pos_emb,
        "patch_embed": patch_embed,
        "encoder": encoder,
        "tower": tower,
    }


class _MoonVitParts(Recorder):
    """The learned parts of ``MoonVitPretrainedModel`` and its sizes; its
    metadata builder and forward are vLLM's (subclass)."""

    def __init__(self, classes: dict[str, type], settings: HostSettings) -> None:
        super().__init__()
        self.merge_kernel_size = (2, 2)
        self.hidden_size = WIDTH
        self.patch_size = PATCH
        patch_embed = classes["patch_embed"]()
        patch_embed.proj = lambda x: patch_embedding(x, torch.float32)
        patch_embed.pos_emb = classes["pos_emb"]()
        self.patch_embed = patch_embed
        encoder = classes["encoder"]()
        encoder.rope_2d = classes["rope"]()
        encoder.blocks = [_MoonVitBlock(self, settings.backend)]
        encoder.final_layernorm = lambda x: x
        self.encoder = encoder

    def parameters(self):
        yield torch.zeros(1)

    def __call__(self, pixel_values, grid_hw=None, *, encoder_metadata=None):
        self.calls.append(
            {
                "pixel_values": _snapshot(pixel_values),
                "grid_hw": _snapshot(grid_hw),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(pixel_values, grid_hw, encoder_metadata=encoder_metadata)


@functools.cache
def _kimi_vl_vllm() -> tuple[WheelCode, type, Callable[[type, HostSettings], Any]]:
    """The wheel's code, vLLM's Kimi-VL host class and the host builder."""
    code = _wheel_code(
        {"vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext}}
    )
    classes = _moonvit_classes(code)
    vllm_mixin = code.klass(
        KIMI_VL,
        "KimiVLForConditionalGeneration",
        _defined(code, KIMI_VL, "KimiVLForConditionalGeneration"),
        bases=(_protocol(code),),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        host.config = _Obj(
            vision_config=_Obj(merge_kernel_size=(2, 2), patch_size=PATCH)
        )
        host.vision_tower = classes["tower"](classes, settings)
        # The projector: the mean of each output token's kh x kw rows.
        host.multi_modal_projector = lambda x: x.mean(dim=1)
        host.hidden_size = WIDTH
        host.model_config = settings.vllm_config().model_config
        return host

    return code, type("VllmKimiVLHost", (vllm_mixin,), {}), make_host


def _kimi_vl_side() -> VllmSide:
    code, vllm_host, make_host = _kimi_vl_vllm()
    return VllmSide(
        code=code,
        host=vllm_host,
        make_host=make_host,
    )


def _kimi_vl_grid(gen: torch.Generator, modality: str) -> tuple[int, int]:
    """A random ``(h, w)`` patch grid, even sides of 2..16 patches."""
    return tuple((2 * torch.randint(1, 9, (2,), generator=gen)).tolist())


def _patch_grid_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int]]
) -> dict[str, Any]:
    """A Kimi-VL image batch: ``(h, w)`` patch grids (even sides) and their
    patches, ``(3, PATCH, PATCH)`` each, image after image."""
    assert modality == "image"
    rows = sum(h * w for h, w in grids)
    return {
        "pixel_values": torch.randn(rows, 3, PATCH, PATCH, generator=gen),
        "image_grid_hws": torch.tensor(grids, dtype=torch.int64).reshape(-1, 2),
    }


def kimi_vl_batch(grids: list[tuple[int, int]], seed: int = 0) -> dict[str, Any]:
    """A Kimi-VL image batch of ``grids`` with seeded random patches."""
    return _patch_grid_batch(torch.Generator().manual_seed(seed), "image", grids)


def kimi_vl_host() -> Any:
    """A host of vLLM's Kimi-VL mixin (2 x 2 merge, PATCH-sized patches)."""
    _, vllm_host, make_host = _kimi_vl_vllm()
    return make_host(vllm_host, HostSettings())


# ---------------------------------------------------------------------------
# Kimi-K3 and Kimi-K2.5 (MoonViT3d)
# ---------------------------------------------------------------------------

KIMI_K25 = "vllm.model_executor.models.kimi_k25"
KIMI_K25_VIT = "vllm.model_executor.models.kimi_k25_vit"
KIMI_K3 = "vllm.models.kimi_k3.nvidia.model"


def _rope_shape(org, interpolation_mode, shape):
    """vLLM's ``get_rope_shape`` without its ``torch.compile`` decorators
    (the same bicubic resize of the learned grid)."""
    return (
        torch.nn.functional.interpolate(
            org.permute((2, 0, 1)).unsqueeze(0), size=shape, mode=interpolation_mode
        )
        .squeeze(0)
        .permute((1, 2, 0))
        .flatten(end_dim=1)
    )


class _RegisterBuffer:
    """``nn.Module.register_buffer`` for a plain object: an attribute."""

    def register_buffer(self, name: str, value: torch.Tensor, persistent=True) -> None:
        setattr(self, name, value)


class _Moon3dRopeParts(_RegisterBuffer):
    """``Rope2DPosEmbRepeated``'s sizes; its table is vLLM's (subclass)."""

    def __init__(self) -> None:
        self.dim = MOONVIT_HEAD_DIM
        self.max_height = self.max_width = MOONVIT_ROPE_GRID
        self.theta_base = 10000


class _Moon3dPosEmbParts:
    """``Learnable2DInterpPosEmbDivided_fixed``'s learned grid and its
    fixed sin-cos time table (vLLM's own function)."""

    def __init__(self, sincos: Callable[..., Any]) -> None:
        self.height = self.width = 4
        self.num_frames = 4
        self.dim = WIDTH
        self.interpolation_mode = "bicubic"
        self.weight = _mixing(16, WIDTH).reshape(4, 4, WIDTH)
        self.time_weight = (
            torch.from_numpy(sincos(self.dim, self.num_frames)).float().unsqueeze(1)
        )


class _Moon3dBlock:
    """A MoonViT3d encoder layer: its RoPE table as a row code, then varlen
    attention by FlashAttention's contract, or FlashInfer's under FLASHINFER
    (what the call carries recorded)."""

    def __init__(self, recorder: Recorder, backend: str) -> None:
        self.recorder = recorder
        self.attn = _Obj(attn_backend=AttentionBackendEnum[backend])
        self.hidden_dim = WIDTH
        self.tp_size = 1

    def __call__(
        self,
        hidden_states,
        cu_seqlens,
        rope_freqs_cis=None,
        max_seqlen=None,
        sequence_lengths=None,
    ):
        code = rope_freqs_cis.real.sum(-1, keepdim=True) + rope_freqs_cis.imag.sum(
            -1, keepdim=True
        )
        rows = hidden_states.float() + code
        if self.attn.attn_backend is AttentionBackendEnum.FLASHINFER:
            out = flashinfer_attention(
                rows,
                cu_seqlens,
                sequence_lengths,
                max_seqlen,
                self.hidden_dim // self.tp_size,
                self.recorder.violations,
            )
        else:
            out = varlen_attention(
                rows, cu_seqlens, max_seqlen, self.recorder.violations
            )
        return out.to(hidden_states.dtype)


class _Moon3dProjector:
    """``KimiK25MultiModalProjector``: the mean of each token's kh x kw rows
    (its parameters give the mixins' cast target)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.weight = torch.zeros(1, dtype=dtype)

    def parameters(self):
        yield self.weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


class _Moon3dParts(Recorder):
    """The learned parts of ``MoonViT3dPretrainedModel`` and its sizes; its
    metadata builders and forward are vLLM's (subclass)."""

    def __init__(self, classes: dict[str, Any], settings: HostSettings) -> None:
        super().__init__()
        self.merge_kernel_size = (2, 2)
        self.patch_size = PATCH
        self.merge_type = "sd2_tpool"
        patch_embed = classes["patch_embed"]()
        patch_embed.proj = _Obj(
            weight=torch.zeros(1),
            out_channels=WIDTH,
            forward_native=lambda x: patch_embedding(x, torch.float32),
        )
        patch_embed.input_norm = classes["input_norm"](settings.fused_input_norm)
        patch_embed.pos_emb = classes["pos_emb"](classes["sincos"])
        self.patch_embed = patch_embed
        encoder = classes["encoder"]()
        encoder.rope_2d = classes["rope"]()
        encoder.blocks = [_Moon3dBlock(self, settings.backend)]
        encoder.final_layernorm = lambda x: x
        self.encoder = encoder

    def __call__(self, pixel_values, grid_thws=None, *, encoder_metadata=None):
        self.calls.append(
            {
                "pixel_values": _snapshot(pixel_values),
                "grid_thws": _snapshot(grid_thws),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(pixel_values, grid_thws, encoder_metadata=encoder_metadata)


@functools.cache
def _moonvit3d_code() -> tuple[WheelCode, dict[str, Any]]:
    """vLLM's MoonViT3d parts (``kimi_k25_vit.py``) on fake learned layers:
    the RoPE table, the position-embedding resize with its time table, the
    patch embedding's glue, the encoder's metadata and loop (with vLLM's
    encoder-attention helpers) and the tower's builders and forward."""
    code = _wheel_code(
        {
            KIMI_K25_VIT: {"get_rope_shape": _rope_shape},
            "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext},
        }
    )
    code.stubs.setdefault(MM_ATTENTION, {})["MMEncoderAttention"] = code.klass(
        MM_ATTENTION,
        "MMEncoderAttention",
        ["compute_max_seqlen", "maybe_compute_seq_lens", "maybe_recompute_cu_seqlens"],
    )
    classes: dict[str, Any] = {
        "rope": code.klass(
            KIMI_K25_VIT,
            "Rope2DPosEmbRepeated",
            ["_precompute_freqs_cis", "get_freqs_cis"],
            bases=(_Moon3dRopeParts,),
        ),
        "pos_emb": code.klass(
            KIMI_K25_VIT,
            "Learnable2DInterpPosEmbDivided_fixed",
            ["get_pos_embeds", "forward"],
            bases=(_Moon3dPosEmbParts, _CallableForward),
        ),
        "sincos": code.function(KIMI_K25_VIT, "get_1d_sincos_pos_embed"),
        "patch_embed": code.klass(
            KIMI_K25_VIT,
            "MoonVision3dPatchEmbed",
            ["forward"],
            bases=(_CallableForward,),
        ),
        "encoder": code.klass(
            KIMI_K25_VIT,
            "MoonViT3dEncoder",
            ["prepare_encoder_metadata", "forward"],
            bases=(_CallableForward,),
        ),
        "input_norm": lambda fused: _qwen_norm(code, fused),
    }
    classes["tower"] = code.klass(
        KIMI_K25_VIT,
        "MoonViT3dPretrainedModel",
        ["forward", "prepare_encoder_cudagraph_metadata"],
        bases=(_Moon3dParts,),
    )
    return code, classes


def _moon3d_host(classes: dict[str, Any], host_class: type, settings: HostSettings):
    """A host of a MoonViT3d tower (2 x 2 merge, PATCH-sized patches) and the
    fake projector; the K3 and K2.5 mixins read their sizes from here."""
    host = host_class()
    host.config = _Obj(
        vision_config=_Obj(merge_kernel_size=(2, 2), patch_size=PATCH),
        text_config=_Obj(hidden_size=WIDTH),
    )
    host.vision_tower = classes["tower"](classes, settings)
    host.mm_projector = _Moon3dProjector(torch.float32)
    host.hidden_size = WIDTH
    host.use_data_parallel = settings.vit_data_parallel
    host.device = CPU
    host.model_config = settings.vllm_config().model_config
    return host


def _thw_grid(gen: torch.Generator, modality: str) -> tuple[int, int, int]:
    """A random ``(t, h, w)`` patch grid of one image (``t = 1``), even
    sides of 2..16 patches."""
    h, w = (2 * torch.randint(1, 9, (2,), generator=gen)).tolist()
    return (1, h, w)


def moon3d_batch(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    *,
    raw: bool = False,
    shape: str = "rows",
) -> dict[str, Any]:
    """A MoonViT3d batch: ``grid_thws`` and their patches, ``(3, PATCH,
    PATCH)`` each, item after item (``raw``: uint8 bytes for the fused input
    normalisation). ``shape`` lays the pixels out as the processor may:
    ``rows``, a ``list`` of per-item tensors, or ``batched`` with a leading
    dim of 1 (5-D)."""
    rows = sum(t * h * w for t, h, w in grids)
    size = (rows, 3, PATCH, PATCH)
    if raw:
        pixels = torch.randint(0, 256, size, generator=gen, dtype=torch.uint8)
    else:
        pixels = torch.randn(size, generator=gen)
    value: Any = pixels
    if shape == "list":
        value = list(pixels.split([t * h * w for t, h, w in grids]))
    elif shape == "batched":
        value = pixels.unsqueeze(0)
    return {
        "pixel_values": value,
        "grid_thws": torch.tensor(grids, dtype=torch.int64).reshape(-1, 3),
    }


@functools.cache
def _kimi_k3_vllm() -> tuple[type, Callable[[type, HostSettings], Any]]:
    code, classes = _moonvit3d_code()
    mixin = code.klass(
        KIMI_K3,
        "KimiK3ForConditionalGeneration",
        _defined(code, KIMI_K3, "KimiK3ForConditionalGeneration"),
        bases=(_protocol(code),),
    )
    return (
        type("VllmKimiK3Host", (mixin,), {}),
        functools.partial(_moon3d_host, classes),
    )


def kimi_k3_vllm_host(settings: HostSettings = HostSettings()) -> Any:
    """A host of vLLM's Kimi-K3 mixin."""
    host_class, make_host = _kimi_k3_vllm()
    return make_host(host_class, settings)


def _kimi_k3_side() -> VllmSide:
    code, _ = _moonvit3d_code()
    host_class, make_host = _kimi_k3_vllm()
    return VllmSide(
        code=code,
        host=host_class,
        make_host=make_host,
        # The model class defines the projector glue the forwards call.
        our_attrs={"_project_encoder_features": host_class._project_encoder_features},
    )


# ---------------------------------------------------------------------------
# Kimi-K2.5 (MoonViT3d, images and video chunks as one modality)
# ---------------------------------------------------------------------------

#: vLLM's Kimi-K2.5 helpers its eager forward calls: its media parsing and
#: its tower-and-projector forward (``vision_tower_forward``, from the wheel).
KIMI_K25_HELPERS = ("_parse_and_validate_media_input", "_process_media_input")


class ViTDataParallelCollective(RuntimeError):
    """vLLM's ``run_dp_sharded_mrope_vision_model`` was called: it spreads
    the items over the tensor-parallel ranks and all-gathers their rows, a
    collective every rank must join (not faked: the hosts are one rank)."""


def _vit_data_parallel(vision_model, pixel_values, grid_thw_list, *, rope_type):
    raise ViTDataParallelCollective(f"{len(grid_thw_list)} items, {rope_type}")


@functools.cache
def _kimi_k25_vllm() -> tuple[type, Callable[[type, HostSettings], Any]]:
    code, classes = _moonvit3d_code()
    # The parsed media: a TensorSchema of the two inputs, read by key.
    code.stubs.setdefault(KIMI_K25, {})["KimiK25MediaPixelInputs"] = dict
    code.stubs.setdefault(KIMI_K25_VIT, {})[
        "run_dp_sharded_mrope_vision_model"
    ] = _vit_data_parallel
    mixin = code.klass(
        KIMI_K25,
        "KimiK25ForConditionalGeneration",
        [
            *_defined(code, KIMI_K25, "KimiK25ForConditionalGeneration"),
            *KIMI_K25_HELPERS,
        ],
        bases=(_protocol(code),),
    )
    return (
        type("VllmKimiK25Host", (mixin,), {}),
        functools.partial(_moon3d_host, classes),
    )


def kimi_k25_vllm_host(settings: HostSettings = HostSettings()) -> Any:
    """A host of vLLM's Kimi-K2.5 mixin."""
    host_class, make_host = _kimi_k25_vllm()
    return make_host(host_class, settings)


def _kimi_k25_grid(gen: torch.Generator, modality: str) -> tuple[int, int, int]:
    """A random ``vision_chunk`` item: mostly an image (``t = 1``), at times a
    video chunk of 2 or 4 frames; even sides of 2..16 patches."""
    t = (1, 1, 1, 2, 4)[int(torch.randint(0, 5, (1,), generator=gen))]
    h, w = (2 * torch.randint(1, 9, (2,), generator=gen)).tolist()
    return (t, h, w)


def _kimi_k25_side() -> VllmSide:
    code, _ = _moonvit3d_code()
    host_class, make_host = _kimi_k25_vllm()
    return VllmSide(
        code=code,
        host=host_class,
        make_host=make_host,
    )


# ---------------------------------------------------------------------------
# Models without a spec yet, for vLLM findings: vLLM's mixin on a fake host
# ---------------------------------------------------------------------------

GLM4_1V = "vllm.model_executor.models.glm4_1v"


class _GlmEmbeddingParts:
    """``Glm4vVisionEmbeddings``' learned table (4 x 4 positions); its
    bicubic interpolation is vLLM's (subclass)."""

    def __init__(self, dtype: torch.dtype) -> None:
        codes = torch.arange(POS_GRID * POS_GRID * WIDTH, dtype=torch.float32)
        self.position_embedding = _Obj(weight=(codes.reshape(-1, WIDTH) / 64).to(dtype))

    def __call__(self, **kwargs: Any) -> torch.Tensor:
        return self.forward(**kwargs)


class _GlmTowerParts(Recorder):
    """The learned parts of ``Glm4vVisionTransformer``: one block (no
    ``sequence_lengths``: vLLM's tower passes none), identity norms, a 2 x 2
    mean as the downsampling convolution. ``forward``, the metadata builder,
    the position interpolation and the RoPE ids are vLLM's (subclass)."""

    def __init__(
        self, settings: HostSettings, dtype: torch.dtype, norm: Any, embeddings: Any
    ) -> None:
        super().__init__()
        self.spatial_merge_size = 2
        self.hidden_size = self.out_hidden_size = WIDTH
        self.tp_size = 1
        self.attn_backend = AttentionBackendEnum[settings.backend]
        self.patch_embed = _CallablePatchEmbed(
            lambda x: patch_embedding(x, dtype),
            proj=_Obj(in_channels=3),
            patch_size=PATCH,
            temporal_patch_size=2,
        )
        self.input_norm = norm
        self.rotary_pos_emb = _QwenRotary(dtype)
        self.embeddings = embeddings
        self.post_conv_layernorm = self.post_layernorm = lambda x: x
        self.blocks = [_Qwen3Block(self)]
        self.downsample = lambda x: x.mean(dim=(2, 3), keepdim=True)
        self.merger = lambda x: x
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return CPU

    def __call__(self, x, grid_thw, *, encoder_metadata=None):
        self.calls.append(
            {
                "x": _snapshot(x),
                "grid_thw": _snapshot(grid_thw),
                "encoder_metadata": _snapshot(encoder_metadata),
            }
        )
        return self.forward(x, grid_thw, encoder_metadata=encoder_metadata)


def _glm4_1v_side() -> VllmSide:
    code = _wheel_code({})
    mm_attention_helpers(code)
    embeddings_class = code.klass(
        GLM4_1V, "Glm4vVisionEmbeddings", ["forward"], bases=(_GlmEmbeddingParts,)
    )
    tower_class = code.klass(
        GLM4_1V,
        "Glm4vVisionTransformer",
        ["forward", "prepare_encoder_metadata"],
        bases=(_GlmTowerParts,),
        exclude=["device", "dtype"],
    )
    host_class = "Glm4vForConditionalGeneration"
    host_methods = code.klass(GLM4_1V, host_class, ["get_max_frames_per_video"])
    vllm_mixin = code.klass(
        GLM4_1V,
        host_class,
        _defined(code, GLM4_1V, host_class),
        bases=(_protocol(code),),
        exclude=["get_max_frames_per_video"],
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        dtype = torch.float32
        host = host_class()
        vllm_config = settings.vllm_config()
        host.model_config = vllm_config.model_config
        host.multimodal_config = vllm_config.model_config.multimodal_config
        host.is_multimodal_pruning_enabled = settings.pruning
        norm = _qwen_norm(code, settings.fused_input_norm)
        host.visual = tower_class(settings, dtype, norm, embeddings_class(dtype))
        return host

    return VllmSide(
        code=code,
        host=type("VllmGlm4vHost", (host_methods, vllm_mixin), {}),
        make_host=make_host,
        host_methods=(host_methods,),
    )


GLM5_NEXT = "vllm.models.glm5next.common.model"
GLM5_NEXT_VISION = "vllm.models.glm5next.common.multimodal"


def _glm5_next_side() -> VllmSide:
    """GLM-5-Next: vLLM's subclass of the GLM-4.1V host overrides only the
    config (no ``pos_embeds`` buffer); its tower builds no position
    embeddings."""
    code = _wheel_code({})
    mm_attention_helpers(code)
    tower_class = code.klass(
        GLM5_NEXT_VISION,
        "Glm5NextVisionTransformer",
        ["forward", "prepare_encoder_metadata"],
        bases=(_GlmTowerParts,),
        exclude=["device", "dtype"],
    )
    glm4 = "Glm4vForConditionalGeneration"
    host_methods = code.klass(GLM4_1V, glm4, ["get_max_frames_per_video"])
    glm4_mixin = code.klass(
        GLM4_1V,
        glm4,
        _defined(code, GLM4_1V, glm4),
        bases=(_protocol(code),),
        exclude=["get_max_frames_per_video"],
    )
    host_class = "Glm5NextForConditionalGeneration"
    vllm_mixin = code.klass(
        GLM5_NEXT,
        host_class,
        _defined(code, GLM5_NEXT, host_class),
        bases=(glm4_mixin,),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        vllm_config = settings.vllm_config()
        host.model_config = vllm_config.model_config
        host.multimodal_config = vllm_config.model_config.multimodal_config
        host.is_multimodal_pruning_enabled = settings.pruning
        norm = _qwen_norm(code, settings.fused_input_norm)
        host.visual = tower_class(settings, torch.float32, norm, None)
        return host

    return VllmSide(
        code=code,
        host=type("VllmGlm5NextHost", (host_methods, vllm_mixin), {}),
        make_host=make_host,
        host_methods=(host_methods,),
    )


def glm4_1v_host() -> Any:
    """A host of vLLM's GLM-4.1V mixin (2 x 2 merge, PATCH-sized patches)."""
    return parity("glm4_1v").hosts()[0]


# ---------------------------------------------------------------------------
# Gemma 3
# ---------------------------------------------------------------------------

GEMMA3 = "vllm.model_executor.models.gemma3_mm"
#: The fake crops: GEMMA3_SIDE x GEMMA3_SIDE pixels, PATCH x PATCH patches
#: (16 positions), pooled 2 x 2 into GEMMA3_TOKENS tokens per crop.
GEMMA3_SIDE = 4 * PATCH
GEMMA3_TOKENS = 4


class _SiglipTower(Recorder):
    """``SiglipVisionModel``: each crop's patches embedded, then dense
    attention within the crop (each row plus its crop's mean): crops never
    see each other, as in SigLIP."""

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self.calls.append({"pixel_values": _snapshot(pixel_values)})
        n, c, side, _ = pixel_values.shape
        per_side = side // PATCH
        patches = pixel_values.reshape(n, c, per_side, PATCH, per_side, PATCH)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(n * per_side**2, -1)
        rows = patch_embedding(patches, pixel_values.dtype).reshape(n, per_side**2, -1)
        return rows + rows.mean(dim=1, keepdim=True)


class _Gemma3ProjectorParts:
    """The learned parts of ``Gemma3MultiModalProjector``; its forward (the
    2-D average pool of each crop's patch grid, the norm and projection) is
    vLLM's (subclass)."""

    def __init__(self) -> None:
        self.patches_per_image = GEMMA3_SIDE // PATCH
        self.tokens_per_side = 2
        kernel = self.patches_per_image // self.tokens_per_side
        self.avg_pool = torch.nn.AvgPool2d(kernel_size=kernel, stride=kernel)
        self.mm_soft_emb_norm = lambda x: x * 0.5
        self.mm_input_projection_weight = _mixing(WIDTH, WIDTH)

    def __call__(self, vision_outputs: torch.Tensor) -> torch.Tensor:
        return self.forward(vision_outputs)


@functools.cache
def _gemma3_vllm() -> tuple[WheelCode, type, Callable[[type, HostSettings], Any]]:
    """(the wheel code, vLLM's Gemma 3 mixin, the host maker)."""
    code = _wheel_code(
        # The TensorSchema only checks shapes: a mapping of the same fields.
        {GEMMA3: {"Gemma3ImagePixelInputs": lambda **fields: fields}}
    )
    projector = code.klass(
        GEMMA3, "Gemma3MultiModalProjector", ["forward"], bases=(_Gemma3ProjectorParts,)
    )
    vllm_mixin = code.klass(
        GEMMA3,
        "Gemma3ForConditionalGeneration",
        _defined(code, GEMMA3, "Gemma3ForConditionalGeneration"),
        bases=(_protocol(code),),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        host.config = _Obj(
            mm_tokens_per_image=GEMMA3_TOKENS,
            vision_config=_Obj(image_size=GEMMA3_SIDE, patch_size=PATCH),
            text_config=_Obj(hidden_size=WIDTH),
        )
        host.model_config = settings.vllm_config().model_config
        host.multimodal_config = settings.multimodal_config()
        # Set by vLLM's __init__: the ViT positions of one crop.
        host.vit_positions_per_patch = (GEMMA3_SIDE // PATCH) ** 2
        host.vision_tower = _SiglipTower()
        host.multi_modal_projector = projector()
        return host

    return code, type("VllmGemma3Host", (vllm_mixin,), {}), make_host


def _gemma3_mm_side() -> VllmSide:
    code, vllm_host, make_host = _gemma3_vllm()
    return VllmSide(
        code=code,
        host=vllm_host,
        make_host=make_host,
    )


def _pan_and_scan_crops(gen: torch.Generator, modality: str) -> tuple[int]:
    """1 crop (pan-and-scan off, the default), or 2..4 crops and the
    original image."""
    return (
        int(torch.tensor([1, 1, 3, 4, 5])[torch.randint(0, 5, (1,), generator=gen)]),
    )


def crops_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int]], *, side=GEMMA3_SIDE
) -> dict[str, Any]:
    """A batch of images of ``n`` crops each (``grids``: ``(n,)``)."""
    assert modality == "image"
    crops = sum(n for (n,) in grids)
    return {
        "pixel_values": torch.randn(crops, 3, side, side, generator=gen),
        "num_patches": torch.tensor([n for (n,) in grids], dtype=torch.int64),
    }


def gemma3_host() -> Any:
    """A host of vLLM's Gemma 3 mixin (default settings)."""
    _, host_class, make_host = _gemma3_vllm()
    return make_host(host_class, HostSettings())


# ---------------------------------------------------------------------------
# InternVL
# ---------------------------------------------------------------------------

INTERNVL = "vllm.model_executor.models.internvl"
#: The fake tiles: 8 x 8 pixels, 4 x 4 patches, pixel-shuffled 2 x 2 into
#: INTERNVL_TOKENS rows per tile.
INTERNVL_SIDE = 4 * PATCH
INTERNVL_TOKENS = 4


class _InternViT(Recorder):
    """``InternVisionModel``: a class row and each tile's patches embedded,
    then dense attention within the tile (tiles never see each other)."""

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self.calls.append({"pixel_values": _snapshot(pixel_values)})
        n, c, side, _ = pixel_values.shape
        per_side = side // PATCH
        patches = pixel_values.reshape(n, c, per_side, PATCH, per_side, PATCH)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(n * per_side**2, -1)
        rows = patch_embedding(patches, pixel_values.dtype).reshape(n, per_side**2, -1)
        rows = torch.cat([rows.mean(dim=1, keepdim=True), rows], dim=1)
        return rows + rows.mean(dim=1, keepdim=True)


class _InternVLParts:
    """The learned parts of ``InternVLChatModel``; ``extract_feature`` and
    ``pixel_shuffle`` are vLLM's (subclass)."""

    def __init__(self) -> None:
        self.downsample_ratio = 0.5
        self.ps_version = "v2"
        weight = _mixing(4 * WIDTH, WIDTH)
        self.mlp1 = lambda x: x @ weight


@functools.cache
def _internvl_vllm() -> tuple[WheelCode, type, Callable[[type, HostSettings], Any]]:
    """(the wheel code, vLLM's InternVL mixin on vLLM's feature extraction,
    the host maker)."""
    code = _wheel_code({})
    model_class = "InternVLChatModel"
    vllm_mixin = code.klass(
        INTERNVL,
        model_class,
        [*_defined(code, INTERNVL, model_class), "extract_feature", "pixel_shuffle"],
        bases=(_InternVLParts, _protocol(code)),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        host.config = _Obj(
            vision_config=_Obj(image_size=INTERNVL_SIDE, patch_size=PATCH),
            text_config=_Obj(hidden_size=WIDTH),
        )
        host.multimodal_config = settings.multimodal_config()
        host.num_image_token = INTERNVL_TOKENS
        host.vision_model = _InternViT()
        return host

    return code, type("VllmInternVLHost", (vllm_mixin,), {}), make_host


def _internvl_side() -> VllmSide:
    code, vllm_host, make_host = _internvl_vllm()
    # vLLM's feature extraction, without its mixin.
    features = code.klass(
        INTERNVL,
        "InternVLChatModel",
        ["extract_feature", "pixel_shuffle"],
        bases=(_InternVLParts,),
    )
    return VllmSide(
        code=code,
        host=vllm_host,
        make_host=make_host,
        host_parts=(features,),
    )


def _internvl_tiles(gen: torch.Generator, modality: str) -> tuple[int]:
    """An image of 1 tile or 3..7 (a grid and the thumbnail); a video of
    1..3 frames, one tile each."""
    if modality == "video":
        return (int(torch.randint(1, 4, (1,), generator=gen)),)
    return (int(torch.tensor([1, 3, 5, 7])[torch.randint(0, 4, (1,), generator=gen)]),)


def _internvl_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int]]
) -> dict[str, Any]:
    """An InternVL batch of tiles under the modality's keys."""
    batch = crops_batch(gen, "image", grids, side=INTERNVL_SIDE)
    if modality == "image":
        return {
            "pixel_values_flat": batch["pixel_values"],
            "image_num_patches": batch["num_patches"],
        }
    return {
        "pixel_values_flat_video": batch["pixel_values"],
        "video_num_patches": batch["num_patches"],
    }


# ---------------------------------------------------------------------------
# Llama 4
# ---------------------------------------------------------------------------

MLLAMA4 = "vllm.model_executor.models.mllama4"
#: The fake chunks: 8 x 8 pixels, 4 x 4 patches, a pixel shuffle of ratio
#: 0.5 into LLAMA4_TOKENS rows (vLLM's get_patch_per_chunk of this config).
LLAMA4_SIDE = 4 * PATCH
LLAMA4_TOKENS = 4


class _Llama4VisionModel(Recorder):
    """``Llama4VisionModel``: each chunk's patches embedded, dense attention
    within the chunk, then its pixel shuffle (4 patch rows into one)."""

    def __call__(self, images_flattened: torch.Tensor) -> torch.Tensor:
        self.calls.append({"images_flattened": _snapshot(images_flattened)})
        n, c, side, _ = images_flattened.shape
        per_side = side // PATCH
        patches = images_flattened.reshape(n, c, per_side, PATCH, per_side, PATCH)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(n * per_side**2, -1)
        rows = patch_embedding(patches, images_flattened.dtype)
        rows = rows.reshape(n, per_side**2, -1)
        rows = rows + rows.mean(dim=1, keepdim=True)
        return rows.reshape(n, per_side**2 // 4, 4, -1).mean(dim=2)


def _no_tower_dp(*args: Any, **kwargs: Any) -> Any:
    """vLLM's tower data parallelism (an all-gather): both Llama 4 mixins
    pass ``use_data_parallel=False``, so it is never reached."""
    raise AssertionError("run_dp_sharded_vision_model called")


class _Llama4Parts:
    """The learned parts of ``Llama4ForConditionalGeneration``; its chunk
    encoding and chunk size are vLLM's (subclass)."""

    def __init__(self) -> None:
        weight = _mixing(WIDTH, WIDTH)
        self.multi_modal_projector = lambda x: x @ weight


@functools.cache
def _llama4_vllm() -> tuple[WheelCode, type, Callable[[type, HostSettings], Any]]:
    """(the wheel code, vLLM's Llama 4 mixin on vLLM's chunk encoding, the
    host maker)."""
    code = _wheel_code({MLLAMA4: {"run_dp_sharded_vision_model": _no_tower_dp}})
    code.stubs.setdefault(MLLAMA4, {})["Mllama4ProcessingInfo"] = code.klass(
        MLLAMA4, "Mllama4ProcessingInfo", ["get_patch_per_chunk"]
    )
    model_class = "Llama4ForConditionalGeneration"
    vllm_mixin = code.klass(
        MLLAMA4,
        model_class,
        _defined(code, MLLAMA4, model_class),
        bases=(_Llama4Parts, _protocol(code)),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        host.config = _Obj(
            vision_config=_Obj(
                image_size=LLAMA4_SIDE,
                patch_size=PATCH,
                pixel_shuffle_ratio=0.5,
                num_channels=3,
            ),
            text_config=_Obj(hidden_size=WIDTH),
        )
        host.vllm_config = settings.vllm_config()
        host.multimodal_config = settings.multimodal_config()
        host.vision_model = _Llama4VisionModel()
        return host

    return code, type("VllmLlama4Host", (vllm_mixin,), {}), make_host


def _mllama4_side() -> VllmSide:
    code, vllm_host, make_host = _llama4_vllm()
    # vLLM's chunk encoding and chunk size, without its mixin.
    helpers = code.klass(
        MLLAMA4,
        "Llama4ForConditionalGeneration",
        ["get_image_patches_per_chunk", "encode_image_chunks"],
        bases=(_Llama4Parts,),
    )
    return VllmSide(
        code=code,
        host=vllm_host,
        make_host=make_host,
        host_parts=(helpers,),
    )


def _llama4_chunks(gen: torch.Generator, modality: str) -> tuple[int]:
    """1 chunk, or a tile grid of 2..6 tiles and the global chunk."""
    return (
        int(torch.tensor([1, 3, 4, 5, 7])[torch.randint(0, 5, (1,), generator=gen)]),
    )


def _llama4_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int]]
) -> dict[str, Any]:
    """A Llama 4 batch: chunks of every image and ``patches_per_image``."""
    batch = crops_batch(gen, modality, grids, side=LLAMA4_SIDE)
    return {
        "pixel_values": batch["pixel_values"],
        "patches_per_image": batch["num_patches"],
    }


# ---------------------------------------------------------------------------
# Idefics3
# ---------------------------------------------------------------------------

IDEFICS3 = "vllm.model_executor.models.idefics3"
IDEFICS2_VISION = "vllm.model_executor.models.idefics2_vision_model"
#: The fake tiles: 8 x 8 pixels, 4 x 4 patches, pixel-shuffled (scale 2)
#: into IDEFICS3_TOKENS rows.
IDEFICS3_SIDE = 4 * PATCH
IDEFICS3_TOKENS = 4


class _Idefics2EmbeddingsParts:
    """The learned parts of ``Idefics2VisionEmbeddings``; its position ids
    are vLLM's (subclass)."""

    def __init__(self) -> None:
        self.num_patches_per_side = IDEFICS3_SIDE // PATCH
        self.position_embedding = _Obj(weight=torch.zeros(1, WIDTH))
        # Read for the dtype pixels are cast to.
        self.patch_embedding = _Obj(weight=torch.zeros(1, dtype=torch.float32))


class _Idefics3ViT(Recorder):
    """``Idefics2VisionTransformer``: each tile's patches embedded with a
    code of their position ids, then dense attention within the tile (no
    attention mask for Idefics3)."""

    def __init__(self, embeddings: Any) -> None:
        super().__init__()
        self.embeddings = embeddings

    def __call__(self, pixel_values, patch_attention_mask=None, position_ids=None):
        self.calls.append(
            {
                "pixel_values": _snapshot(pixel_values),
                "patch_attention_mask": _snapshot(patch_attention_mask),
                "position_ids": _snapshot(position_ids),
            }
        )
        if position_ids is None:
            position_ids = self.embeddings.get_position_ids(patch_attention_mask)
        n, c, side, _ = pixel_values.shape
        per_side = side // PATCH
        patches = pixel_values.reshape(n, c, per_side, PATCH, per_side, PATCH)
        patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(n * per_side**2, -1)
        rows = patch_embedding(patches, pixel_values.dtype).reshape(n, per_side**2, -1)
        rows = rows + position_ids[:, :, None].to(rows.dtype) / 8
        return rows + rows.mean(dim=1, keepdim=True)


class _Idefics3ModelParts(FakeModule):
    """The learned parts of ``Idefics3Model``; its features, patch mask and
    position ids are vLLM's (subclass)."""

    def __init__(self, embeddings: Any, connector: Any) -> None:
        self.config = _Obj(vision_config=_Obj(patch_size=PATCH))
        self.image_seq_len = IDEFICS3_TOKENS
        self.vision_model = _Idefics3ViT(embeddings)
        self.connector = connector


class _Idefics3ConnectorParts(FakeModule):
    """The learned part of ``Idefics3Connector``; its pixel shuffle is
    vLLM's (subclass)."""

    def __init__(self) -> None:
        self.scale_factor = 2
        weight = _mixing(4 * WIDTH, WIDTH)
        self.modality_projection = lambda x: x @ weight

    def __call__(self, image_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.forward(image_hidden_states)


class _Idefics3Schema(dict):
    """``Idefics3ImagePixelInputs`` (a TensorSchema that only checks shapes):
    a mapping of the same fields, an instance of its own class."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)


@functools.cache
def _idefics3_vllm() -> tuple[WheelCode, type, Callable[[type, HostSettings], Any]]:
    """(the wheel code, vLLM's Idefics3 mixin, the host maker: the model's
    features, patch mask and position ids are vLLM's)."""
    code = _wheel_code(
        {
            IDEFICS3: {
                "Idefics3ImagePixelInputs": _Idefics3Schema,
                "Idefics3ImageEmbeddingInputs": type(
                    "Idefics3ImageEmbeddingInputs", (_Idefics3Schema,), {}
                ),
            },
            # The sync checker has nothing to check on CPU.
            "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext},
        }
    )
    embeddings = code.klass(
        IDEFICS2_VISION,
        "Idefics2VisionEmbeddings",
        ["get_position_ids"],
        bases=(_Idefics2EmbeddingsParts,),
    )
    connector = code.klass(
        IDEFICS3, "Idefics3Connector", ["forward"], bases=(_Idefics3ConnectorParts,)
    )
    model = code.klass(
        IDEFICS3,
        "Idefics3Model",
        ["image_pixels_to_features", "get_patch_attention_mask", "get_position_ids"],
        bases=(_Idefics3ModelParts,),
    )
    model_class = "Idefics3ForConditionalGeneration"
    vllm_mixin = code.klass(
        IDEFICS3,
        model_class,
        _defined(code, IDEFICS3, model_class),
        bases=(_protocol(code),),
    )

    def make_host(host_class: type, settings: HostSettings) -> Any:
        host = host_class()
        host.config = _Obj(
            vision_config=_Obj(image_size=IDEFICS3_SIDE, patch_size=PATCH),
            text_config=_Obj(hidden_size=WIDTH),
        )
        host.multimodal_config = settings.multimodal_config()
        host.model = model(embeddings(), connector())
        # The recording tower, where the comparisons look for it.
        host.vision_recorder = host.model.vision_model
        return host

    return code, type("VllmIdefics3Host", (vllm_mixin,), {}), make_host


def _idefics3_side() -> VllmSide:
    code, vllm_host, make_host = _idefics3_vllm()
    return VllmSide(
        code=code,
        host=vllm_host,
        make_host=make_host,
    )


def idefics3_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int]]
) -> dict[str, Any]:
    """An Idefics3 batch: tiles, their pixel masks (int64 as the processor
    makes them; the last tile of each image padded at the bottom right) and
    ``num_patches``."""
    batch = crops_batch(gen, modality, grids, side=IDEFICS3_SIDE)
    tiles = batch["pixel_values"].shape[0]
    mask = torch.ones(tiles, IDEFICS3_SIDE, IDEFICS3_SIDE, dtype=torch.int64)
    end = 0
    for (n,) in grids:
        end += n
        h, w = torch.randint(1, IDEFICS3_SIDE + 1, (2,), generator=gen).tolist()
        mask[end - 1] = 0
        mask[end - 1, :h, :w] = 1
        batch["pixel_values"][end - 1, :, h:, :] = 0
        batch["pixel_values"][end - 1, :, :, w:] = 0
    return {**batch, "pixel_attention_mask": mask}


# ---------------------------------------------------------------------------
# LFM2-VL
# ---------------------------------------------------------------------------

LFM2_VL = "vllm.model_executor.models.lfm2_vl"
LFM2_SIGLIP2 = "vllm.model_executor.models.lfm2_siglip2"
#: Columns of a flat LFM2-VL patch row (3 channels x PATCH x PATCH).
LFM2_PATCH_DIM = 3 * PATCH * PATCH
#: Side of the fake position-embedding grid.
LFM2_POSITIONS = 4


#: The tile size the parity hosts are configured with (mm_processor_kwargs).
LFM2_MIN_TOKENS = 4


class _Lfm2PatchEmbedding(FakeModule):
    """A linear patch embedding: rows mixed to ``WIDTH`` (its dtype is read)."""

    def __init__(self) -> None:
        self.weight = torch.zeros(WIDTH, LFM2_PATCH_DIM)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return patch_embedding(x, x.dtype)


class _Siglip2EmbeddingsParts(FakeModule):
    """The learned parts of ``Siglip2VisionEmbeddings``; its forward and the
    packed position-embedding resize are vLLM's (subclass)."""

    def __init__(self) -> None:
        self.patch_embedding = _Lfm2PatchEmbedding()
        self.position_embedding_size = LFM2_POSITIONS
        table = torch.arange(LFM2_POSITIONS**2 * WIDTH, dtype=torch.float32)
        self.position_embedding = ModuleOf(weight=table.reshape(-1, WIDTH) / 64)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.forward(*args, **kwargs)


class _Lfm2Encoder(Recorder):
    """``Siglip2Encoder``: varlen attention within each tile (FlashAttention's
    contract), on ``(1, rows, WIDTH)`` embeddings; its backend is read."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        attn = _Obj(attn_backend=getattr(AttentionBackendEnum, backend))
        self.layers = [_Obj(self_attn=_Obj(attn=attn))]

    def __call__(self, inputs_embeds, cu_seqlens, max_seqlen, **_: Any):
        self.calls.append(
            {
                "inputs_embeds": _snapshot(inputs_embeds),
                "cu_seqlens": _snapshot(cu_seqlens),
                "max_seqlen": _snapshot(max_seqlen),
            }
        )
        out = varlen_attention(
            inputs_embeds[0], cu_seqlens, max_seqlen, self.violations
        )
        return out.unsqueeze(0)


class _Lfm2Tower(FakeModule):
    """``Siglip2Model``: embeddings, encoder, the optional post layernorm."""

    def __init__(self, embeddings: Any, backend: str, post_layernorm: bool) -> None:
        norm = ModuleOf(lambda x: x * 0.5 + 1) if post_layernorm else None
        self.vision_model = ModuleOf(
            embeddings=embeddings, encoder=_Lfm2Encoder(backend), post_layernorm=norm
        )

    def __call__(self, pixel_values_packed, spatial_shapes, cu_seqlens, max_seqlen):
        model = self.vision_model
        hidden = model.embeddings(pixel_values_packed, spatial_shapes)
        out = model.encoder(
            inputs_embeds=hidden, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen
        )
        return out if model.post_layernorm is None else model.post_layernorm(out)


class _Lfm2ProjectorParts(FakeModule):
    """The learned parts of ``Lfm2VLMultiModalProjector``; its unshuffles
    are vLLM's (subclass)."""

    def __init__(self) -> None:
        self.factor = 2
        self.projector_use_layernorm = False
        first, second = _mixing(4 * WIDTH, WIDTH), _mixing(WIDTH, WIDTH)
        self.linear_1 = lambda x: x @ first
        self.act = lambda x: x * 2
        self.linear_2 = lambda x: x @ second

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.forward(*args, **kwargs)


class _Lfm2Schema(dict):
    """``LFM2VLImageInputs`` (a TensorSchema read by key): a mapping."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)


@contextlib.contextmanager
def _forward_context(attn_metadata: Any, vllm_config: Any) -> Any:
    """``set_forward_context``: the fakes read no forward context."""
    yield


@functools.cache
def _lfm2_vl_vllm() -> tuple[WheelCode, type, Callable[..., Any]]:
    """(the wheel code, vLLM's LFM2-VL mixin and its helpers, the host
    maker; ``min_image_tokens`` is the model-level processor setting)."""
    code = _wheel_code(
        {
            LFM2_VL: {"LFM2VLImageInputs": _Lfm2Schema},
            "vllm.forward_context": {"set_forward_context": _forward_context},
        }
    )
    embeddings = code.klass(
        LFM2_SIGLIP2,
        "Siglip2VisionEmbeddings",
        ["forward", "resize_positional_embeddings_packed"],
        bases=(_Siglip2EmbeddingsParts,),
    )
    projector = code.klass(
        LFM2_VL,
        "Lfm2VLMultiModalProjector",
        ["forward", "forward_with_gather_idx", "forward_from_unshuffled"],
        bases=(_Lfm2ProjectorParts,),
    )
    model_class = "Lfm2VLForConditionalGeneration"
    vllm_mixin = code.klass(
        LFM2_VL,
        model_class,
        _defined(code, LFM2_VL, model_class),
        bases=(_protocol(code),),
    )

    def make_host(
        host_class: type,
        settings: HostSettings,
        min_image_tokens: int = LFM2_MIN_TOKENS,
        post_layernorm: bool = True,
    ) -> Any:
        host = host_class()
        host.config = _Obj(text_config=_Obj(hidden_size=WIDTH))
        host.multimodal_config = settings.multimodal_config()
        if host.multimodal_config is not None:
            host.multimodal_config.mm_processor_kwargs = {
                "min_image_tokens": min_image_tokens
            }
        host.vllm_config = settings.vllm_config()
        host.model_config = host.vllm_config.model_config
        host.multi_modal_projector = projector()
        host.vision_tower = _Lfm2Tower(embeddings(), settings.backend, post_layernorm)
        # The recording tower, where the comparisons look for it.
        host.vision_recorder = host.vision_tower.vision_model.encoder
        return host

    return code, type("VllmLfm2VLHost", (vllm_mixin,), {}), make_host


def _lfm2_vl_side() -> VllmSide:
    code, vllm_host, make_host = _lfm2_vl_vllm()
    # The model's own eager path (and the helpers it calls), which the
    # generated eager forward calls as the drop-in's host.
    eager = code.klass(
        LFM2_VL, "Lfm2VLForConditionalGeneration", ["_process_image_input"]
    )
    return VllmSide(
        code=code,
        host=vllm_host,
        make_host=make_host,
        host_parts=(eager,),
    )


def _lfm2_vl_image(gen: torch.Generator, modality: str) -> tuple[tuple[int, int], ...]:
    """One image: 1 to 3 tiles of 4 to 8 patches a side, even (the 2 x 2
    merge), so every tile has at least LFM2_MIN_TOKENS tokens."""
    tiles = int(torch.randint(1, 4, (1,), generator=gen))
    sides = torch.randint(2, 5, (tiles, 2), generator=gen) * 2
    return tuple((int(h), int(w)) for h, w in sides.tolist())


def lfm2_vl_host(min_image_tokens: int = 64, ours: bool = False) -> Any:
    """A host of vLLM's LFM2-VL mixin (downsample factor 2), or of ours."""
    _, host_class, make_host = _lfm2_vl_vllm()
    if ours:
        host_class = parity("lfm2_vl").our_host
    return make_host(host_class, HostSettings(), min_image_tokens)


def _lfm2_vl_images(
    gen: torch.Generator, modality: str, images: list[Any], **options: Any
) -> dict[str, Any]:
    """:func:`lfm2_vl_batch` called as the battery calls ``make_batch``."""
    return lfm2_vl_batch(gen, list(images), **options)


def lfm2_vl_batch(
    gen: torch.Generator,
    images: list[list[tuple[int, int]]],
    *,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """An LFM2-VL batch: each image a list of tiles of ``(h, w)`` patches;
    ``pixel_values`` ``(tiles, max h * w, patch dim)`` of ``dtype``, zero
    past each tile's patches, as the processor pads them."""
    tiles = [tile for image in images for tile in image]
    longest = max((h * w for h, w in tiles), default=0)
    pixels = torch.zeros(len(tiles), longest, LFM2_PATCH_DIM, dtype=dtype)
    for i, (h, w) in enumerate(tiles):
        pixels[i, : h * w] = torch.randn(h * w, LFM2_PATCH_DIM, generator=gen)
    return {
        "pixel_values": pixels,
        "spatial_shapes": torch.tensor(tiles, dtype=torch.int64).reshape(-1, 2),
        "num_patches": torch.tensor([len(image) for image in images]),
    }


# ---------------------------------------------------------------------------
# The comparisons: every protocol method, on both hosts
# ---------------------------------------------------------------------------


def config_view(config: Any) -> dict[str, Any]:
    """An ``EncoderCudaGraphConfig`` as comparable values (padding logics
    by key: they are functions)."""
    return {
        "modalities": list(config.modalities),
        "buffer_keys": list(config.buffer_keys),
        "out_hidden_size": config.out_hidden_size,
        "padding_logics": sorted(config.padding_logics),
        "max_frames_per_video": config.max_frames_per_video,
        "paths": {
            name: (path.min_token_budget, path.allow_zero_tokens)
            for name, path in config.paths.items()
        },
        "capture_axes": tuple(config.capture_axes),
    }


def specs_view(specs: list[Any]) -> list[tuple[int, int, dict[str, int]]]:
    return [(s.input_size, s.output_tokens, dict(s.path_output_tokens)) for s in specs]


def cu_seqlens_tail(cu_seqlens: torch.Tensor, rows: int) -> str:
    """How a captured ``cu_seqlens`` closes a batch, whatever the row
    counts: ``decreasing`` (breaks the varlen contract), ``covers-rows``
    (the last offset is the captured row count: every row is in a
    sequence) or ``rows-uncovered`` (the rows past the last offset are in
    no sequence: attention never writes them)."""
    values = [int(v) for v in cu_seqlens.tolist()]
    if any(b < a for a, b in itertools.pairwise(values)):
        return "decreasing"
    return "covers-rows" if values[-1] == rows else "rows-uncovered"


@dataclasses.dataclass(frozen=True)
class CaptureCase:
    budget: int
    max_batch_size: int
    max_frames_per_batch: int

    @property
    def label(self) -> str:
        return f"b={self.budget},n={self.max_batch_size},f={self.max_frames_per_batch}"


def settings_label(settings: HostSettings) -> str:
    default = HostSettings()
    changed = [
        f"{f.name}={getattr(settings, f.name)}"
        for f in dataclasses.fields(settings)
        if getattr(settings, f.name) != getattr(default, f.name)
    ]
    return ",".join(changed) or "default"


def compare(
    model: ModelParity,
    label: str,
    run: Callable[[Any], Any],
    settings: HostSettings = HostSettings(),
) -> list[str]:
    """The differing paths of ``run(host)`` on both hosts (fresh ones). A
    method that raises on both hosts is no agreement where a batch is valid
    input (selections, captures, replays, forwards): it is reported as
    ``<label>/raised-on-both`` (configs may refuse alike)."""
    from parity_testlib import Raised, differences, observe

    vllm_host, our_host = model.hosts(settings)

    def seeded(host: Any) -> Any:
        # Random capture fills (``randn``) draw alike on both sides.
        torch.manual_seed(0)
        return observe(lambda: run(host))

    theirs, ours = seeded(vllm_host), seeded(our_host)
    found = differences(theirs, ours, label)
    if (
        isinstance(theirs, Raised)
        and isinstance(ours, Raised)
        and not label.startswith(("config", "budget_range"))
    ):
        found.append(f"{label}/raised-on-both")
    return found


def _capture(
    host: Any, case: CaptureCase, path: str = "default", axis_keys: tuple = ()
) -> dict[str, torch.Tensor]:
    """``path``'s capture inputs of ``case``, called as the manager calls,
    drawn from a fixed seed: a dummy filled with ``torch.randn`` (Kimi-VL's)
    holds the same values on both hosts."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return host.prepare_encoder_cudagraph_capture_inputs(
            case.budget,
            case.max_batch_size,
            case.max_frames_per_batch,
            CPU,
            torch.float32,
            path,
            axis_keys,
        ).values


def capture_view(
    host: Any, case: CaptureCase, path: str = "default", axis_keys: tuple = ()
) -> dict[str, Any]:
    """The capture inputs of ``case`` (on ``path``, for ``axis_keys``) and
    what the capture forward saw."""
    values = _capture(host, case, path, axis_keys)
    tower = model_tower(host)
    tower.reset()
    out = host.encoder_cudagraph_forward(dict(values), path=path)
    return {
        "values": dict(values),
        "forward": {
            "calls": list(tower.calls),
            "shape": tuple(out.shape),
            "violations": dict(tower.violations),
        },
    }


def model_tower(host: Any) -> Recorder:
    """The recording tower of a host (its ``Recorder`` attribute)."""
    towers = [v for v in vars(host).values() if isinstance(v, Recorder)]
    assert len(towers) == 1, f"{type(host).__name__} needs one recording tower"
    return towers[0]


def path_tokens(host: Any, batch: dict[str, Any], path: str) -> int:
    """The batch's rows on ``path`` (0: the manager skips the path)."""
    specs = host.get_encoder_cudagraph_item_specs(batch)
    return sum(int(s.get_path_output_tokens(path)) for s in specs)


def replay_view(
    host: Any,
    case: CaptureCase,
    batches: list[dict[str, Any]],
    paths: tuple[str, ...] = ("default",),
) -> list[dict[str, Any]]:
    """Replays of ``batches`` (in order) into one capture of ``case`` per
    path (and per capture-axis keys): per path with rows, the replay's
    values, the captured buffers after the manager's copy and what the
    forward saw; then the items' final rows from every path's output. With
    capture axes the manager replays what selection returns, in the graph of
    the keys it resolves: so does this."""
    config = host.get_encoder_cudagraph_config()
    captured: dict[tuple, dict[str, torch.Tensor]] = {}
    views = []
    for batch in batches:
        keys: tuple = ()
        if config.capture_axes:
            count = len(host.get_encoder_cudagraph_item_specs(batch))
            batch = host.select_encoder_cudagraph_items(batch, list(range(count)))
            keys = tuple(batch.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG))
        view: dict[str, Any] = {"axis_keys": keys} if keys else {}
        outputs = {}
        for p in paths:
            if path_tokens(host, batch, p) == 0:
                continue
            if (p, keys) not in captured:
                captured[(p, keys)] = _capture(host, case, p, keys)
            seen, outputs[p] = _replay_path(
                host, case, config, captured[(p, keys)], batch, p
            )
            view.update(
                {k if p == "default" else f"{p}/{k}": v for k, v in seen.items()}
            )
        view["items"] = postprocess_view(host, batch, outputs, spread=True)
        views.append(view)
    return views


def _replay_path(host, case, config, captured, batch, path):
    """One path's replay: what the manager copies and the forward sees."""
    from parity_testlib import copy_replay_into_captured

    tower = model_tower(host)
    rows = next(iter(captured.values())).shape[0]
    replay = host.prepare_encoder_cudagraph_replay_buffers(
        batch, case.max_batch_size, case.max_frames_per_batch, path
    ).values
    # None and an absent key mean the same to the manager (left as captured),
    # but a mixin that returns one where vLLM's returns the other differs.
    view: dict[str, Any] = {"replay": dict(replay)}
    copy_replay_into_captured(config, captured, replay)
    # A builder may capture None for a buffer another backend needs
    # (Kimi-K3's sequence_lengths): the manager keeps and skips it.
    view["captured"] = {
        k: v.clone() if v is not None else None for k, v in captured.items()
    }
    if "cu_seqlens" in captured:
        view["cu_seqlens_tail"] = cu_seqlens_tail(captured["cu_seqlens"], rows)
    tower.reset()
    out = host.encoder_cudagraph_forward(dict(captured), path=path)
    view["calls"] = list(tower.calls)
    view["violations"] = dict(tower.violations)
    return view, out


def padding_edges_view(host: Any, case: CaptureCase, key: str) -> dict[str, Any]:
    """``key``'s padding logic where a manager never takes it: offsets that
    fill every captured slot (one item more than ``case`` holds), and a
    buffer that no capture returned. Each: the buffer after the copy, or
    what was raised."""
    from parity_testlib import observe

    captured = _capture(host, case)[key]
    logic = host.get_encoder_cudagraph_config().padding_logics[key]

    def padded(dst: torch.Tensor, entries: int) -> torch.Tensor:
        logic(dst, torch.arange(entries, dtype=dst.dtype))
        return dst.clone()

    return {
        "no-spare-slot": observe(lambda: padded(captured, captured.shape[0])),
        "unregistered": observe(lambda: padded(captured.clone(), 2)),
    }


def postprocess_view(
    host: Any,
    batch: dict[str, Any],
    out: torch.Tensor | dict[str, torch.Tensor],
    spread: bool = False,
) -> Any:
    """Each item's final rows from an encoder output, as the manager asks
    for them (``clone=True``, the batch's kwargs). ``spread`` numbers the
    items as a sub-batch of a larger execute does: ``indices`` are their
    positions there (descending, with gaps) and ``per_item_out_tokens`` is
    indexed by those positions."""
    specs = host.get_encoder_cudagraph_item_specs(batch)
    count = len(specs)
    indices = [2 * (count - j) for j in range(count)] if spread else list(range(count))
    tokens = [0] * (max(indices, default=-1) + 1)
    for idx, spec in zip(indices, specs, strict=True):
        tokens[idx] = spec.output_tokens
    dest: dict[int, torch.Tensor] = {}
    outputs = out if isinstance(out, dict) else {"default": out}
    host.postprocess_encoder_output(
        outputs, indices, tokens, dest, clone=True, batch_mm_kwargs=batch
    )
    return [dest.get(i) for i in indices]


def eager_view(
    host: Any, batch: dict[str, Any], paths: tuple[str, ...] = ("default",)
) -> dict[str, Any]:
    """The eager forward of every path with rows, and the items' rows."""
    tower = model_tower(host)
    tower.reset()
    outputs = {
        p: host.encoder_eager_forward(batch, path=p)
        for p in paths
        if path_tokens(host, batch, p)
    }
    return {
        "calls": list(tower.calls),
        "violations": dict(tower.violations),
        "items": postprocess_view(host, batch, outputs),
    }


def selection_view(host: Any, batch: dict[str, Any], indices: list[int]) -> Any:
    """A selection, its item specs and a re-selection from it (DP)."""
    selected = host.select_encoder_cudagraph_items(batch, indices)
    view: dict[str, Any] = {
        "selected": selected,
        "selected_aliases": aliased_inputs(selected, batch),
        "specs": specs_view(host.get_encoder_cudagraph_item_specs(selected)),
    }
    if indices:
        reselected = host.select_encoder_cudagraph_items(
            selected, list(range(len(indices)))[::-1]
        )
        view["reselected"] = reselected
        view["reselected_aliases"] = aliased_inputs(reselected, selected)
    return view


#: The generated selection of every item in order is the batch's own
#: tensors, vLLM's a copy (docs/vllm-differences.md, every model but those
#: whose selection repacks: a model's parity test lists it where it occurs).
SELECTION_ALIASES = Difference(
    "all.selection-aliases",
    (r"select\[.*\]/(re)?selected_aliases(\.len|\[\d+\])$",),
)


def aliased_inputs(selected: dict[str, Any], batch: dict[str, Any]) -> list[str]:
    """The keys of a selection whose value is the batch's own tensor (the
    same object, not a copy)."""
    return sorted(
        key
        for key, value in selected.items()
        if isinstance(value, torch.Tensor) and any(value is v for v in batch.values())
    )


# ---------------------------------------------------------------------------
# The battery: every protocol method on seeded random inputs
# ---------------------------------------------------------------------------

BACKENDS = ("FLASH_ATTN", "ROCM_AITER_FA", "TRITON_ATTN", "TORCH_SDPA", "FLASHINFER")
MULTIMODAL_SETTINGS = (
    {},
    {"image_limit": 0},
    {"video_limit": 0},
    {"fp8": "static"},
    {"fp8": "dynamic"},
    {"no_multimodal_config": True},
    {"pruning": True},
)
#: (max_model_len, max_num_batched_tokens) of the budget-range checks.
SCHEDULER_LIMITS = ((8192, 8192), (4096, 16384), (32768, 2048), (100, 50))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the battery draws for one model."""

    capture_cases: tuple[CaptureCase, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    batch_options: tuple[tuple[str, Any], ...] = ()  # make_batch keyword args


def compare_configs(model: ModelParity) -> list[str]:
    """The config under every backend and multimodal setting, and the budget
    range under several scheduler limits."""
    found: list[str] = []
    for backend in BACKENDS:
        for extra in MULTIMODAL_SETTINGS:
            settings = HostSettings(backend=backend, **extra)
            found += compare(
                model,
                f"config[{settings_label(settings)}]",
                lambda h: config_view(h.get_encoder_cudagraph_config()),
                settings,
            )
    for max_model_len, max_tokens in SCHEDULER_LIMITS:
        settings = HostSettings(
            max_model_len=max_model_len, max_num_batched_tokens=max_tokens
        )
        found += compare(
            model,
            f"budget_range[{settings_label(settings)}]",
            lambda h, s=settings: h.get_encoder_cudagraph_budget_range(s.vllm_config()),
            settings,
        )
    return found


def _index_lists(gen: torch.Generator, count: int) -> list[list[int]]:
    """Selections of a batch of ``count`` items: none, one, all in order,
    reversed, a random order and a random draw with repeats."""
    lists = [[], [count - 1], list(range(count)), list(range(count))[::-1]]
    lists.append(torch.randperm(count, generator=gen).tolist())
    lists.append(torch.randint(0, count, (count + 1,), generator=gen).tolist())
    return lists


def fitting_batch(
    model: ModelParity,
    gen: torch.Generator,
    modality: str,
    case: CaptureCase,
    count: int,
    settings: HostSettings,
    options: dict[str, Any],
) -> dict[str, Any] | None:
    """A random batch of at most ``count`` items that fits ``case`` on both
    hosts (items, frames and budget tokens as each counts them)."""
    hosts = model.hosts(settings)
    grids: list[Any] = []
    for _ in range(8 * count):
        if len(grids) == count:
            break
        trial = [*grids, model.random_grid(gen, modality)]
        probe = model.make_batch(torch.Generator(), modality, trial, **options)
        frames = sum(model.frames(g) for g in trial)
        if (
            len(trial) <= case.max_batch_size
            and (modality == "image" or frames <= case.max_frames_per_batch)
            and all(
                path_tokens(h, probe, p) <= case.budget
                for h in hosts
                for p in model.paths
            )
        ):
            grids = trial
    if not grids:
        return None
    return model.make_batch(gen, modality, grids, **options)


def compare_batches(
    model: ModelParity,
    plan: Plan,
    settings: HostSettings = HostSettings(),
    prefix: str = "",
) -> list[str]:
    """Item specs, selections, eager forwards, captures and replays (with the
    manager's copy) on seeded random batches."""
    options = dict(plan.batch_options)
    found: list[str] = []
    for seed in plan.seeds:
        gen = torch.Generator().manual_seed(seed)
        for modality in model.modalities:
            count = 1 + seed % 4
            grids = [model.random_grid(gen, modality) for _ in range(count)]
            batch = model.make_batch(gen, modality, grids, **options)
            tag = f"{prefix}{modality},seed={seed}"
            found += compare(
                model,
                f"specs[{tag}]",
                lambda h, b=batch: specs_view(h.get_encoder_cudagraph_item_specs(b)),
                settings,
            )
            for indices in _index_lists(gen, count):
                found += compare(
                    model,
                    f"select[{tag},{indices}]",
                    lambda h, b=batch, i=indices: selection_view(h, b, i),
                    settings,
                )
            found += compare(
                model,
                f"eager[{tag}]",
                lambda h, b=batch: eager_view(h, b, model.paths),
                settings,
            )
    axes = model.hosts(settings)[0].get_encoder_cudagraph_config().capture_axes
    for case in plan.capture_cases:
        for path, keys in itertools.product(model.paths, itertools.product(*axes)):
            where = "" if path == "default" else f",{path}"
            where += f",keys={keys}" if keys else ""
            found += compare(
                model,
                f"{prefix}capture[{case.label}{where}]",
                lambda h, c=case, p=path, k=keys: capture_view(h, c, p, k),
                settings,
            )
        gen = torch.Generator().manual_seed(case.budget * 31 + case.max_batch_size)
        for modality in model.modalities:
            if modality == "video" and case.max_frames_per_batch == 0:
                continue  # the video limit is 0: no video arrives
            batches = [
                fitting_batch(model, gen, modality, case, n, settings, options)
                for n in (case.max_batch_size, 1, case.max_batch_size)
            ]
            batches = [b for b in batches if b is not None]
            found += compare(
                model,
                f"{prefix}replay[{case.label},{modality}]",
                lambda h, c=case, b=batches: replay_view(h, c, b, model.paths),
                settings,
            )
    return found


def compare_padding_edges(
    model: ModelParity, case: CaptureCase, key: str = "cu_seqlens"
) -> list[str]:
    """The differing paths of :func:`padding_edges_view` on both hosts."""
    return compare(
        model,
        f"padding[{case.label},{key}]",
        lambda h: padding_edges_view(h, case, key),
    )


def check_refusals_name_the_same_fix(model: ModelParity) -> dict[str, tuple[str, str]]:
    """Every battery setting whose config either mixin refuses is refused by
    both, with the same exception type, and every command-line option
    vLLM's message names is named by ours. Returns the settings whose
    messages differ: label -> (vLLM's message, ours)."""
    from parity_testlib import Raised, observe

    differing = {}
    for backend in BACKENDS:
        for extra in MULTIMODAL_SETTINGS:
            settings = HostSettings(backend=backend, **extra)
            label = settings_label(settings)
            theirs, ours = (
                observe(host.get_encoder_cudagraph_config)
                for host in model.hosts(settings)
            )
            if not isinstance(theirs, Raised) and not isinstance(ours, Raised):
                continue
            assert isinstance(theirs, Raised) and isinstance(ours, Raised), label
            assert theirs.type_name == ours.type_name, label
            for option in re.findall(r"--[a-z0-9-]+", theirs.message):
                assert option in ours.message, (label, option)
            if theirs.message != ours.message:
                differing[label] = (theirs.message, ours.message)
    return differing


def check_selected_grids_work_everywhere(model: ModelParity) -> None:
    """vLLM's Qwen-family mixins select grids as Python lists, the generated
    ones as int64 host tensors (the processor's type): either selection has
    the same rows, and is valid input to either mixin with equal results."""
    gen = torch.Generator().manual_seed(5)
    for modality in model.modalities:
        grids = (
            [(1, 4, 2), (2, 2, 2), (1, 2, 6)]
            if modality == "video"
            else [(1, 4, 2), (1, 2, 2), (1, 2, 6)]
        )
        batch = model.make_batch(gen, modality, grids)
        key = f"{modality}_grid_thw"
        vllm_host, ours = model.hosts()
        for indices in ([2, 0, 2], []):
            picked = vllm_host.select_encoder_cudagraph_items(batch, indices)
            kept = ours.select_encoder_cudagraph_items(batch, indices)
            assert isinstance(picked[key], list)
            assert kept[key].dtype == torch.int64
            assert kept[key].shape == (len(indices), 3)
            assert kept[key].tolist() == list(picked[key])
            if not indices:
                continue
            for host in (vllm_host, ours):
                views = [
                    (
                        specs_view(host.get_encoder_cudagraph_item_specs(s)),
                        eager_view(host, s)["items"],
                    )
                    for s in (picked, kept)
                ]
                assert views[0][0] == views[1][0]
                assert all(
                    torch.equal(a, b)
                    for a, b in zip(views[0][1], views[1][1], strict=True)
                )


def check_dummy_frames_stop_at_k(model: ModelParity, case: CaptureCase) -> None:
    """For a case with more frame slots per item (``max_frames_per_batch //
    max_batch_size``) than tokens per item (``k``): vLLM's dummy items carry
    every frame slot, a graph several times its budget; the generated ones
    stop at ``k`` frames (a frame has at least one token), a graph of the
    budget, and replay the fitting batch with the most frames alike."""
    k = -(-case.budget // case.max_batch_size)
    frames_per_item = case.max_frames_per_batch // case.max_batch_size
    assert frames_per_item > k
    merged = 4  # 2 x 2 patches per token
    rows, slots = [], []
    for host in model.hosts():
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            case.budget,
            case.max_batch_size,
            case.max_frames_per_batch,
            CPU,
            torch.float32,
        ).values
        rows.append(captured["pixel_values"].shape[0])
        slots.append(captured["cu_seqlens"].shape[0])
    vllm_rows, our_rows = rows
    assert vllm_rows == case.max_batch_size * frames_per_item * merged
    assert our_rows == case.max_batch_size * k * merged >= case.budget * merged
    # One offset per frame: vLLM's every frame slot, ours (with video
    # replays unpadded) the most frames a batch within the budget has.
    frame_slots = max(min(case.budget, case.max_frames_per_batch), case.max_batch_size)
    assert slots == [case.max_frames_per_batch + 1, frame_slots + 1]
    # The batch within the budget with the most frames: one-token frames.
    frames = case.budget // case.max_batch_size
    grids = [(frames, 2, 2)] * case.max_batch_size
    batch = model.make_batch(torch.Generator().manual_seed(2), "video", grids)
    views = [replay_view(host, case, [batch])[0] for host in model.hosts()]
    assert all(not v["violations"] for v in views)
    for ours, theirs in zip(views[1]["items"], views[0]["items"], strict=True):
        assert not ours.isnan().any() and torch.equal(ours, theirs)


def check_torch_sdpa_guard(model: ModelParity, vllm_code: Any) -> None:
    """vLLM's mixin returns a config under TORCH_SDPA, the generated one
    refuses it: vLLM's SDPA attention reads ``cu_seqlens`` on the host (a
    sync a CUDA graph capture refuses). With capture off (pruning) neither
    refuses."""
    from parity_testlib import method_call_receivers

    vllm_host, ours = model.hosts(HostSettings(backend="TORCH_SDPA"))
    assert vllm_host.get_encoder_cudagraph_config().modalities == list(model.modalities)
    with pytest.raises(ValueError, match="TORCH_SDPA"):
        ours.get_encoder_cudagraph_config()
    sdpa = vllm_code.definition(
        "vllm.v1.attention.ops.vit_attn_wrappers", "torch_sdpa_wrapper"
    )
    assert any("cu_seqlens" in r for r in method_call_receivers(sdpa, "tolist"))
    for host in model.hosts(HostSettings(backend="TORCH_SDPA", pruning=True)):
        assert host.get_encoder_cudagraph_config().modalities == []


#: GLM-4.1V's capture cases for the battery (GLM-5-Next's too).
GLM_CASES = (
    CaptureCase(16, 1, 0),
    CaptureCase(32, 4, 0),
    CaptureCase(64, 4, 16),  # videos: 4 frames per item
    CaptureCase(30, 4, 8),  # a budget that 4 items do not divide
    CaptureCase(64, 4, 2),  # fewer frames than items (user-set)
    CaptureCase(48, 3, 12),
    CaptureCase(100, 3, 0),  # vLLM's floor: 99 tokens for budget 100
    CaptureCase(16, 4, 56),  # more frame slots per item (14) than tokens (4)
    CaptureCase(64, 2, 1200),  # vLLM's default: 600 frame slots per item
)


def glm_differences(stem: str) -> tuple[Any, ...]:
    """The differences of the generated GLM-4.1V (and GLM-5-Next, whose vLLM
    mixin is GLM-4.1V's) from vLLM's, by id ``<stem>.<name>``."""
    frames = r"b=(16,n=4,f=56|64,n=2,f=1200)"
    floor = r"b=100,n=3,f=0"
    return (
        Difference(
            f"{stem}.backend-guard",
            (r"^config\[backend=(TORCH_SDPA|FLASHINFER)[,\]]",),
        ),
        Difference(
            f"{stem}.cu-seqlens-padding",
            (
                r"^config\[.*/padding_logics",
                r"replay\[.*/replay/cu_seqlens\.",
                r"replay\[.*/(captured|calls\[\d+\]/encoder_metadata)/cu_seqlens\.values$",
                r"replay\[.*/cu_seqlens_tail$",
                r"replay\[.*/violations(\.keys|/cu_seqlens-decreasing)",
            ),
        ),
        Difference(
            f"{stem}.per-item-tokens",
            (
                rf"^(fused:)?capture\[{floor}\]/(values|forward)/",
                rf"^(fused:)?replay\[{floor},\w+\]\[\d+\]/(captured|calls|cu_seqlens_tail)",
            ),
        ),
        Difference(
            f"{stem}.dummy-frames",
            (
                rf"^(fused:)?capture\[{frames}\]/(values|forward)/",
                rf"^(fused:)?replay\[{frames},\w+\]\[\d+\]/(captured|calls|cu_seqlens_tail)",
            ),
        ),
        Difference(
            f"{stem}.selected-grid",
            (r"^select\[.*/(selected|reselected)/(image|video)_grid_thw",),
        ),
    )


# ---------------------------------------------------------------------------
# Step3-VL
# ---------------------------------------------------------------------------

STEP3_VL = "vllm.model_executor.models.step3_vl"
#: The fake Step3-VL's global view side: 112² of 14² patches, stride 2:
#: 4 rows per global view (vLLM hard-codes the crops: 504², 81 rows).
STEP3_IMAGE_SIZE = 112
STEP3_PATCH = 14


class _Step3Tower(Recorder):
    """``_batched_encoder_forward``'s learned work: ``(views, 3, s, s)`` to
    ``(views * rows, WIDTH)``, each view's rows a code of its pixels and
    its row number (``rows``: vLLM's own count for the side)."""

    def __init__(self, rows_of_side: Callable[[int], int]) -> None:
        super().__init__()
        self.rows_of_side = rows_of_side

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self.calls.append({"pixel_values": _snapshot(pixel_values)})
        views, side = pixel_values.shape[0], pixel_values.shape[-1]
        rows = self.rows_of_side(side)
        level = pixel_values.float().reshape(views, -1).mean(dim=1)
        codes = torch.arange(rows * WIDTH, dtype=torch.float32).reshape(rows, WIDTH)
        out = level[:, None, None] + codes[None] / 64
        return out.reshape(views * rows, WIDTH).to(pixel_values.dtype)


class _Step3HostParts:
    """What Step3-VL's mixin reads of its host besides vLLM's own token
    arithmetic (``_compute_spatial_tokens``, ``img_output_tokens``,
    ``patch_output_tokens``, taken from the wheel)."""

    def _batched_encoder_forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.step3_tower(pixel_values)


@functools.cache
def step3_vl_host_class() -> type:
    """A host class with vLLM's Step3-VL mixin (its two paths, its custom
    post-processing) and vLLM's own token arithmetic."""
    code = _wheel_code({})
    return code.klass(
        STEP3_VL,
        "Step3VLForConditionalGeneration",
        _defined(code, STEP3_VL, "Step3VLForConditionalGeneration"),
        bases=(_Step3HostParts, _protocol(code)),
        exclude=["_batched_encoder_forward"],
    )


def step3_vl_host(host_class: type | None = None, settings=HostSettings()) -> Any:
    """A Step3-VL host: 112² global views (4 rows each), vLLM's 504² crops
    (81 rows each), ``WIDTH``-wide text rows."""
    host = (host_class or step3_vl_host_class())()
    host.config = _Obj(
        vision_config=_Obj(image_size=STEP3_IMAGE_SIZE, patch_size=STEP3_PATCH),
        understand_projector_stride=2,
        hidden_size=WIDTH,
    )
    vllm_config = settings.vllm_config()
    host.model_config = vllm_config.model_config
    host.multimodal_config = vllm_config.model_config.multimodal_config
    host.step3_tower = _Step3Tower(
        lambda side: host._compute_spatial_tokens(side, STEP3_PATCH, 2)
    )
    return host


def step3_vl_batch(
    gen: torch.Generator, modality: str, crops: list[tuple[int]]
) -> dict[str, Any]:
    """A Step3-VL image batch: one global view per item and ``n`` 504² crops
    for an item ``(n,)``, as the processor gives them (stacked global views,
    the crops back to back, the counts as an int64 CPU tensor)."""
    assert modality == "image"
    counts = [n for (n,) in crops]
    side = STEP3_IMAGE_SIZE
    return {
        "pixel_values": torch.randn(len(counts), 3, side, side, generator=gen),
        "patch_pixel_values": torch.randn(sum(counts), 3, 504, 504, generator=gen),
        "num_patches": torch.tensor(counts, dtype=torch.int64),
    }


def step3_vl_grid(gen: torch.Generator, modality: str) -> tuple[int]:
    """A random item: no crops, or 2 to 4 (the processor never makes one)."""
    assert modality == "image"
    return ((0, 2, 3, 4)[int(torch.randint(0, 4, (1,), generator=gen))],)


def _step3_vl_side() -> VllmSide:
    """vLLM's Step3-VL host against one with the generated mixin; both read
    vLLM's own token arithmetic and the same fake tower."""
    code = _wheel_code({})
    token_arithmetic = code.klass(
        STEP3_VL,
        "Step3VLForConditionalGeneration",
        ["img_output_tokens", "patch_output_tokens", "_compute_spatial_tokens"],
        bases=(_Step3HostParts,),
    )
    return VllmSide(
        code=code,
        host=step3_vl_host_class(),
        make_host=lambda host_class, settings: step3_vl_host(host_class, settings),
        host_parts=(token_arithmetic,),
    )


# ---------------------------------------------------------------------------
# Gemma 4
# ---------------------------------------------------------------------------

GEMMA4 = "vllm.model_executor.models.gemma4_mm"
#: The fake Gemma 4 tower's pooling kernel (HF's default) and patch side
#: (small: a patch row is 3 * GEMMA4_PATCH**2 pixels).
GEMMA4_KERNEL = 3
GEMMA4_PATCH = 2


class _Gemma4VisionTower(Recorder):
    """The HF ``Gemma4VisionModel`` parts the graph forward calls, as
    pass-throughs that keep the slot layout: the pooler's slot ``s`` of a
    row is the mean of its patches ``s*k²..(s+1)*k²-1`` (0 for padding
    slots, which HF's pooler fills with zeros), valid when a real patch
    lies there."""

    def __init__(self) -> None:
        super().__init__()
        self.config = _Obj(
            pooling_kernel_size=GEMMA4_KERNEL,
            patch_size=GEMMA4_PATCH,
            num_channels=3,
            standardize=False,
        )
        self.patch_embedder = ModuleOf(
            lambda pv, ids, pad: patch_embedding(
                pv.reshape(-1, pv.shape[-1]), torch.float32
            ).reshape(pv.shape[0], pv.shape[1], WIDTH)
        )
        self.encoder = ModuleOf(
            lambda inputs_embeds, attention_mask, pixel_position_ids: _Obj(
                last_hidden_state=inputs_embeds
            )
        )

    def pooler(
        self, hidden_states, pixel_position_ids, padding_positions, output_length
    ):
        self.calls.append({"output_length": output_length})
        k2 = GEMMA4_KERNEL**2
        rows = hidden_states.shape[0]
        slots = hidden_states.reshape(rows, output_length, k2, WIDTH)
        real = (~padding_positions).reshape(rows, output_length, k2)
        pooled = (slots * real[..., None]).sum(2) / k2
        return pooled, real.any(-1)


class _Gemma4EmbedVision(FakeModule):
    """``embed_vision``: the projection to the text width, a shift here."""

    embedding_projection = _Obj(weight=torch.zeros(1))

    def __call__(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        return inputs_embeds + 1


@functools.cache
def gemma4_host_class() -> type:
    """A host class with vLLM's Gemma 4 mixin (its capture axis of row
    widths, its replay-built gather index); the eager image and video paths
    are not taken (they need the HF tower)."""
    code = _wheel_code({})
    return code.klass(
        GEMMA4,
        "Gemma4ForConditionalGeneration",
        [
            m
            for m in _defined(code, GEMMA4, "Gemma4ForConditionalGeneration")
            if m != "encoder_eager_forward"
        ],
        bases=(_protocol(code),),
    )


def gemma4_host(max_soft_tokens: int = 280) -> Any:
    """A Gemma 4 host whose model-level ``max_soft_tokens`` is the
    checkpoint's 280 (``vision_config.default_output_length``)."""
    host = gemma4_host_class()()
    host.config = _Obj(
        vision_config=_Obj(
            default_output_length=max_soft_tokens, pooling_kernel_size=GEMMA4_KERNEL
        ),
        text_config=_Obj(hidden_size=WIDTH),
    )
    host.multimodal_config = MultiModalConfig()
    host.vision_tower = _Gemma4VisionTower()
    host.model_dtype = torch.float32
    host.embed_vision = _Gemma4EmbedVision()
    return host


def gemma4_frames(grids: list[tuple[int, int]], max_soft_tokens: int):
    """Frames (or images) as HF's processor pads them: each to
    ``max_soft_tokens * k²`` patches, the ``h x w`` real ones first (with
    their positions), the rest at position -1."""
    patches = max_soft_tokens * GEMMA4_KERNEL**2
    columns = 3 * GEMMA4_PATCH**2
    pixels = torch.zeros(len(grids), patches, columns)
    positions = torch.full((len(grids), patches, 2), -1, dtype=torch.long)
    for i, (h, w) in enumerate(grids):
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        positions[i, : h * w] = torch.stack([xs.flatten(), ys.flatten()], -1)
        gen = torch.Generator().manual_seed(i)
        pixels[i, : h * w] = torch.randn(h * w, columns, generator=gen)
    return pixels, positions


def gemma4_processing_count(info: Any, width: int, height: int, max_soft: int) -> int:
    """vLLM's ``Gemma4ProcessingInfo._compute_num_soft_tokens`` (the prompt's
    placeholders for an image or frame) on ``info`` (its HF config)."""
    code = _wheel_code({})
    helper = code.klass(
        GEMMA4,
        "Gemma4ProcessingInfo",
        ["_compute_num_soft_tokens"],
        exclude=["get_hf_config"],
    )
    return helper._compute_num_soft_tokens(info, width, height, max_soft)


# ---------------------------------------------------------------------------
# MiniCPM-V (2.6)
# ---------------------------------------------------------------------------

MINICPMV = "vllm.model_executor.models.minicpmv"
#: The fake MiniCPM-V's patch side; its slices are at most 70 x 70 patches
#: (image_size 140), as the released 980 / 14.
MINICPMV_PATCH = 2
MINICPMV_QUERIES = 64


class _MiniCPMVTower(Recorder):
    """``vpm`` and ``resampler`` as shape-keeping fakes: each slice becomes
    ``query_num`` rows of its pixels' mean."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = _Obj(
            image_size=70 * MINICPMV_PATCH, patch_size=MINICPMV_PATCH
        )
        self._weight = torch.zeros(1)

    def parameters(self):
        yield self._weight

    def __call__(self, pixel_values, patch_attention_mask=None, tgt_sizes=None):
        self.calls.append({"pixel_values": _snapshot(pixel_values)})
        slices = pixel_values.shape[0]
        return (
            pixel_values.reshape(slices, -1, 1)
            .mean(1, keepdim=True)
            .expand(slices, 4, WIDTH)
        )

    def resample(self, embeddings, tgt_sizes):
        return embeddings[:, :1, :].expand(-1, MINICPMV_QUERIES, -1)


@functools.cache
def minicpmv_host_class() -> type:
    """A host class with vLLM's MiniCPM-V mixin (capture axis of patch grids,
    select-time repacking); not its eager path."""
    # `import torch` and `import torch.types` both bind torch.
    code = _wheel_code({MINICPMV: {"torch": torch}})
    mixin = "_MiniCPMVEncoderCudaGraphMixin"
    return code.klass(
        MINICPMV,
        mixin,
        [
            m
            for m in _defined(code, MINICPMV, mixin)
            if m not in ("encoder_eager_forward", "get_max_frames_per_video")
        ],
        bases=(_protocol(code),),
        exclude=["get_max_frames_per_video"],
    )


def minicpmv_host(max_frames_per_video: int = 1) -> Any:
    """A MiniCPM-V 2.6 host: 64 queries per slice, at most 9 slices besides
    the thumbnail by its HF config (``max_slice_num``)."""
    host = minicpmv_host_class()()
    host.version = (2, 6)
    host.config = _Obj(query_num=MINICPMV_QUERIES, max_slice_num=9)
    host.embed_dim = WIDTH
    host.vpm = _MiniCPMVTower()
    host.resampler = host.vpm.resample
    host.get_max_frames_per_video = lambda: max_frames_per_video
    return host


def minicpmv_image(slices: list[tuple[int, int]]) -> dict[str, Any]:
    """One image as the processor gives it: per slice a ``(3, p, h*w*p)``
    tensor (one row of patches) and its ``(h, w)`` in ``tgt_sizes``."""
    p = MINICPMV_PATCH
    gen = torch.Generator().manual_seed(len(slices))
    pixels = [torch.randn(3, p, h * w * p, generator=gen) for h, w in slices]
    return {
        "pixel_values": [pixels],
        "tgt_sizes": [torch.tensor(slices, dtype=torch.int64)],
    }


MINICPMV_RESAMPLER = "vllm.model_executor.layers.resampler"


@functools.cache
def minicpmv_resampler_class() -> type:
    """vLLM's ``Resampler2_5`` (MiniCPM-V 2.5 / 2.6 / 4.0) on its
    ``BaseResampler``, both from the wheel: the 2-D sincos position table
    of ``max_size`` (70, 70), grown by ``_adjust_pos_cache`` in eager calls
    only. ``kv_dim`` equal to ``embed_dim`` keeps ``kv_proj`` an identity
    (no ``ReplicatedLinear``)."""
    code = _wheel_code(
        {
            MINICPMV: {"torch": torch},
            MINICPMV_RESAMPLER: {"ReplicatedLinear": None, "QuantizationConfig": Any},
        }
    )
    base = code.klass(
        MINICPMV_RESAMPLER,
        "BaseResampler",
        ["__init__", "_repeat"],
        bases=(torch.nn.Module,),
    )
    return code.klass(MINICPMV, "Resampler2_5", ["__init__", "forward"], bases=(base,))


def minicpmv_resampler(width: int = 8, queries: int = 4) -> Any:
    """A small ``Resampler2_5`` with seeded random weights (the released
    ones are learned; any non-degenerate ones show the positions)."""
    resampler = minicpmv_resampler_class()(
        num_queries=queries, embed_dim=width, num_heads=2
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in resampler.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=gen))
    return resampler.eval()


# ---------------------------------------------------------------------------
# DeepSeek-OCR
# ---------------------------------------------------------------------------

DEEPSEEK_OCR = "vllm.model_executor.models.deepseek_ocr"
#: The fake DeepSeek-OCR's processor sizes, stubbed into vLLM's processor
#: module: 192² global views and 128² tiles, 64 pixels per output row (16
#: per patch, 4 patches merged, as the released 1024 and 640): 3 x 3 global
#: rows and a newline after each line (12), 2 x 2 rows per tile (4).
OCR_BASE_SIZE = 192
OCR_IMAGE_SIZE = 128
OCR_PROCESSOR = "vllm.transformers_utils.processors.deepseek_ocr"


class _DeepseekOCRImagePixelInputs(_Obj):
    """vLLM's ``TensorSchema`` of the eager ``"default"`` path, as the plain
    record it is to ``_process_image_input``."""

    def __init__(self, type: str, **fields: Any) -> None:  # noqa: A002
        super().__init__(type=type, **fields)


class _DeepseekOCRTower(Recorder):
    """SAM-ViT-B, the CLIP tower and the projector as fixed maps of each
    view's 64 x 64 pixel blocks: ``sam`` gives ``(views, 3, s, s)`` block
    means, ``clip`` a class row and those means again, ``project`` a fixed
    linear map of the concatenation to ``WIDTH`` columns."""

    def sam(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls.append({"sam": _snapshot(pixels)})
        views, side = pixels.shape[0], pixels.shape[-1] // 64
        blocks = pixels.reshape(views, 3, side, 64, side, 64).mean(dim=(3, 5))
        return blocks + torch.arange(side * side).reshape(1, 1, side, side) / 16

    def clip(self, pixels: torch.Tensor, sam: torch.Tensor) -> torch.Tensor:
        self.calls.append({"clip": (tuple(pixels.shape), _snapshot(sam))})
        rows = sam.flatten(2).permute(0, 2, 1)
        return torch.cat([torch.full_like(rows[:, :1], -7.0), 2 * rows], dim=1)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        self.calls.append({"project": _snapshot(features)})
        return features @ _mixing(features.shape[-1], WIDTH)


def _deepseek_ocr_code() -> WheelCode:
    return _wheel_code(
        {
            OCR_PROCESSOR: {"BASE_SIZE": OCR_BASE_SIZE, "IMAGE_SIZE": OCR_IMAGE_SIZE},
            DEEPSEEK_OCR: {
                "DeepseekOCRImagePixelInputs": _DeepseekOCRImagePixelInputs,
                "NestedTensors": Any,
            },
        }
    )


#: vLLM's batched forwards of the two paths (methods of the model class),
#: which the spec calls as host methods.
OCR_BATCHED_FORWARDS = [
    "_batched_encoder_forward_global_path",
    "_batched_encoder_forward_local_path",
]
#: vLLM's own token arithmetic of the host (properties of the model class).
OCR_PROPERTIES = [
    "image_side",
    "global_image_output_token",
    "patch_side",
    "single_patch_output_token",
]


@functools.cache
def deepseek_ocr_host_class() -> type:
    """A host class with vLLM's DeepSeek-OCR mixin (its two paths, its
    batched path helpers, its post-processing with ``_assemble_patch_grid``)
    and its eager ``"default"`` path (``_process_image_input``)."""
    code = _deepseek_ocr_code()
    host_name = "DeepseekOCRForCausalLM"
    return code.klass(
        DEEPSEEK_OCR,
        host_name,
        [*_defined(code, DEEPSEEK_OCR, host_name), *OCR_PROPERTIES],
        bases=(_protocol(code),),
    )


def deepseek_ocr_host(host_class: type, settings: HostSettings = HostSettings()):
    """A DeepSeek-OCR host on the fake tower, ``WIDTH``-wide rows."""
    host = host_class()
    tower = _DeepseekOCRTower()
    host.ocr_tower = tower
    host.sam_model = tower.sam
    host.vision_model = tower.clip
    host.projector = tower.project
    host.projector_config = _Obj(n_embed=WIDTH)
    host.model_config = settings.vllm_config().model_config
    rows = torch.arange(WIDTH, dtype=torch.float32)
    host.image_newline = -1.0 - rows / 64
    host.view_seperator = -2.0 - rows / 64
    return host


def deepseek_ocr_batch(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int]]
) -> dict[str, Any]:
    """A DeepSeek-OCR image batch as the processor gives it: one global view
    per image, the tiles of the tiled ones back to back, ``[tw, th]`` per
    image (``[1, 1]``: untiled) as an int64 CPU tensor."""
    assert modality == "image"
    tiles = sum(tw * th for tw, th in grids if tw > 1 or th > 1)
    base, tile = OCR_BASE_SIZE, OCR_IMAGE_SIZE
    return {
        "pixel_values": torch.randn(len(grids), 3, base, base, generator=gen),
        "images_crop": torch.randn(tiles, 3, tile, tile, generator=gen),
        "images_spatial_crop": torch.tensor(grids, dtype=torch.int64).reshape(-1, 2),
    }


#: Grids the processor makes: untiled, or 2 to 6 tiles (MIN_CROPS, MAX_CROPS).
OCR_GRIDS = ((1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (3, 2), (2, 3), (1, 3))


def deepseek_ocr_grid(gen: torch.Generator, modality: str) -> tuple[int, int]:
    assert modality == "image"
    return OCR_GRIDS[int(torch.randint(0, len(OCR_GRIDS), (1,), generator=gen))]


def _deepseek_ocr_side() -> VllmSide:
    """vLLM's DeepSeek-OCR host against one with the generated mixin; both
    have vLLM's own token properties and batched forwards, and the same fake
    tower."""
    code = _deepseek_ocr_code()
    host_parts = code.klass(
        DEEPSEEK_OCR,
        "DeepseekOCRForCausalLM",
        [*OCR_PROPERTIES, *OCR_BATCHED_FORWARDS],
    )
    return VllmSide(
        code=code,
        host=deepseek_ocr_host_class(),
        make_host=deepseek_ocr_host,
        host_parts=(host_parts,),
    )


# ---------------------------------------------------------------------------
# Gemma 4 (the parity battery; the fakes are those of its findings above)
# ---------------------------------------------------------------------------

#: Soft tokens per image the battery draws (the model-level 280 covers them).
GEMMA4_SOFT_TOKENS = (70, 140, 280)


class _TorchOnTheHost:
    """``torch`` for vLLM's Gemma 4 eager path on CPU: its chunking reads
    the accelerator's free memory, which a CPU run has none of (a plenty
    that keeps every bucket in one chunk, as a GPU with room does)."""

    accelerator = _Obj(get_memory_info=lambda: (1 << 40, 1 << 41))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


@functools.cache
def _gemma4_vllm() -> tuple[WheelCode, type]:
    """(the wheel code, vLLM's Gemma 4 host class with its eager image path:
    vLLM's own ``_process_image_input`` on the fake tower)."""
    code = _wheel_code(
        {
            GEMMA4: {
                "torch": _TorchOnTheHost(),
                "gpu_sync_allowed": contextlib.nullcontext,
                # The TensorSchema only checks shapes: a mapping of the fields.
                "Gemma4ImagePixelInputs": lambda **fields: fields,
                "Gemma4VideoInputs": lambda **fields: fields,
            }
        }
    )
    vllm_mixin = code.klass(
        GEMMA4,
        "Gemma4ForConditionalGeneration",
        _defined(code, GEMMA4, "Gemma4ForConditionalGeneration"),
        bases=(_protocol(code),),
    )
    return code, type("VllmGemma4Host", (vllm_mixin,), {})


def gemma4_make_host(host_class: type, settings: HostSettings) -> Any:
    """A Gemma 4 host of the checkpoint's model-level 280 soft tokens."""
    host = host_class()
    host.config = _Obj(
        vision_config=_Obj(
            default_output_length=280,
            pooling_kernel_size=GEMMA4_KERNEL,
            position_embedding_size=64,
        ),
        text_config=_Obj(hidden_size=WIDTH),
    )
    host.multimodal_config = settings.multimodal_config()
    host.vision_tower = _Gemma4VisionTower()
    host.model_dtype = torch.float32
    host.embed_vision = _Gemma4EmbedVision()
    host._enable_mm_lora = False
    return host


def gemma4_random_image(gen: torch.Generator, modality: str) -> tuple[int, int, int]:
    """(h, w, soft tokens): a patch grid within a row of that many soft
    tokens (``soft * k²`` patches), as the processor resizes an image."""
    assert modality == "image"
    soft = GEMMA4_SOFT_TOKENS[int(torch.randint(0, 3, (1,), generator=gen))]
    side = int((soft * GEMMA4_KERNEL**2) ** 0.5)
    h, w = (int(v) for v in torch.randint(1, side + 1, (2,), generator=gen))
    return h, w, soft


def gemma4_batch(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    *,
    lists: bool = False,
) -> dict[str, Any]:
    """Images as HF's processor pads them (``gemma4_frames``), batched as
    vLLM's field config does: one tensor when every image has the same
    number of patches (unless ``lists``), else a list of per-image tensors."""
    assert modality == "image"
    pixels, positions = [], []
    for h, w, soft in grids:
        pv, pp = gemma4_frames([(h, w)], soft)
        noise = torch.randn(pv.shape, generator=gen) * (pp != -1).all(-1, True)
        pixels.append(pv[0] + noise[0])
        positions.append(pp[0])
    if not lists and len({p.shape[0] for p in pixels}) == 1:
        return {
            "pixel_values": torch.stack(pixels),
            "pixel_position_ids": torch.stack(positions),
        }
    return {"pixel_values": pixels, "pixel_position_ids": positions}


def _gemma4_mm_side() -> VllmSide:
    """vLLM's Gemma 4 host (its eager image path included) against one with
    the generated mixin, on the same fake tower."""
    code, vllm_host = _gemma4_vllm()
    host_parts = code.klass(
        GEMMA4,
        "Gemma4ForConditionalGeneration",
        [
            "_get_max_soft_tokens",
            "_parse_and_validate_image_input",
            "_process_image_input",
        ],
    )
    return VllmSide(
        code=code,
        host=vllm_host,
        make_host=gemma4_make_host,
        host_parts=(host_parts,),
    )


# ---------------------------------------------------------------------------
# MiniCPM-V (by spec: the vLLM host with its eager path and resampler table)
# ---------------------------------------------------------------------------


class _MiniCPMVPatchTower(Recorder):
    """``vpm`` as a patch embedding that keeps the patch order: each
    ``p x p`` patch of a slice image becomes ``WIDTH`` fixed mixes of its
    pixels, row-major over the image's patch grid, masked by
    ``patch_attention_mask`` (the real Idefics2 tower reads positions from
    ``tgt_sizes``; the row-major order is what the graph and the eager path
    must agree on)."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = _Obj(
            image_size=70 * MINICPMV_PATCH, patch_size=MINICPMV_PATCH
        )
        self._weight = torch.zeros(1)

    def parameters(self):
        yield self._weight

    def __call__(self, pixel_values, patch_attention_mask=None, tgt_sizes=None):
        self.calls.append(
            {
                "pixel_values": _snapshot(pixel_values),
                "patch_attention_mask": _snapshot(patch_attention_mask),
                "tgt_sizes": _snapshot(tgt_sizes),
            }
        )
        p = MINICPMV_PATCH
        slices, channels, height, width = pixel_values.shape
        patches = (
            pixel_values.reshape(slices, channels, height // p, p, width // p, p)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(slices, (height // p) * (width // p), channels * p * p)
        )
        embedded = patches.float() @ _mixing(channels * p * p, WIDTH)
        return embedded * patch_attention_mask.reshape(slices, -1, 1)


class _MiniCPMVResampler:
    """``resampler`` as an order-sensitive pooling: each slice's ``h * w``
    patch rows weighted by their place (1, 2, ...), then ``query_num`` rows
    scaled 1, 2, ...; a slice of 0 patches (the graph's padding) gives 0.
    ``pos_embed`` is the table the graphs read (held at capture)."""

    def __init__(self) -> None:
        self.pos_embed = torch.zeros(70, 70, WIDTH)

    def __call__(self, embeddings, tgt_sizes):
        counts = tgt_sizes.prod(-1)
        place = torch.arange(1, embeddings.shape[1] + 1, dtype=torch.float32)
        weights = place[None, :] * (place[None, :] <= counts[:, None])
        pooled = (embeddings * weights[..., None]).sum(1)
        scale = torch.arange(1, MINICPMV_QUERIES + 1, dtype=torch.float32)
        return pooled[:, None, :] * scale[None, :, None]


def _flatten_bn(x, *, concat: bool = False):
    """vLLM 0.33.0's ``utils.flatten_bn`` as written there (its four
    ``@overload`` stubs give the wheel loader five bindings of the name)."""
    if isinstance(x, torch.Tensor):
        return x.flatten(0, 1)
    if concat:
        return torch.cat(x)
    return [x_n for x_b in x for x_n in x_b]


@functools.cache
def _minicpmv_vllm() -> tuple[WheelCode, type, type]:
    """(the wheel code, vLLM's MiniCPM-V 2.6 host class: the mixin, the base
    model's input parsing and 2.6's ``get_vision_hidden_states``, the eager
    path's parts for the generated mixin's host)."""
    code = _wheel_code(
        {
            MINICPMV: {
                "torch": torch,
                "gpu_sync_allowed": contextlib.nullcontext,
                "flatten_bn": _flatten_bn,
            }
        }
    )
    parsing = code.klass(
        MINICPMV, "MiniCPMVBaseModel", ["_parse_and_validate_multimodal_inputs"]
    )
    hidden = code.klass(
        MINICPMV, "MiniCPMV2_6", ["get_vision_hidden_states"], bases=(parsing,)
    )
    mixin = "_MiniCPMVEncoderCudaGraphMixin"
    vllm_mixin = code.klass(
        MINICPMV,
        mixin,
        [m for m in _defined(code, MINICPMV, mixin) if m != "get_max_frames_per_video"],
        bases=(_protocol(code), hidden),
        exclude=["get_max_frames_per_video"],
    )
    return code, vllm_mixin, hidden


def minicpmv_parity_host(
    host_class: type, settings: HostSettings = HostSettings(), version=(2, 6)
) -> Any:
    """A MiniCPM-V host (2.6 unless told): 64 queries per slice, at most 9
    slices besides the thumbnail by its HF config, slices of at most 70 x 70
    patches (image_size 140, patch 2), the resampler's table 70 x 70."""
    host = host_class()
    host.version = version
    host.config = _Obj(query_num=MINICPMV_QUERIES, max_slice_num=9)
    host.embed_dim = WIDTH
    host.vpm = _MiniCPMVPatchTower()
    host.resampler = _MiniCPMVResampler()
    host.get_max_frames_per_video = lambda: settings.max_frames_per_video
    return host


def minicpmv_batch(
    gen: torch.Generator, modality: str, items: list[tuple[tuple[int, int], ...]]
) -> dict[str, Any]:
    """Items as the processor gives them: per item a list of slices (video
    frames), each ``(3, p, h * w * p)``, and per item its ``(slices, 2)``
    ``tgt_sizes`` (a batched field: a list of CPU tensors)."""
    p = MINICPMV_PATCH
    pixels = [
        [torch.randn(3, p, h * w * p, generator=gen) for h, w in slices]
        for slices in items
    ]
    sizes = [torch.tensor(slices, dtype=torch.int64) for slices in items]
    if modality == "video":
        return {"video_pixel_values": pixels, "video_tgt_sizes": sizes}
    return {"pixel_values": pixels, "tgt_sizes": sizes}


def minicpmv_item(gen: torch.Generator, modality: str) -> tuple[tuple[int, int], ...]:
    """One image of 1 to 3 slices, or one video of 1 to 3 one-slice frames,
    each 2 to 40 patches tall and 2 to 70 wide (every key gets batches)."""
    count = int(torch.randint(1, 4, (1,), generator=gen))
    heights = torch.randint(2, 41, (count,), generator=gen).tolist()
    widths = torch.randint(2, 71, (count,), generator=gen).tolist()
    return tuple(zip(heights, widths, strict=True))


def _minicpmv_side() -> VllmSide:
    code, vllm_mixin, hidden = _minicpmv_vllm()
    return VllmSide(
        code=code,
        host=type("VllmMiniCPMVHost", (vllm_mixin,), {}),
        make_host=minicpmv_parity_host,
        host_parts=(hidden,),
    )


def runtime_manager(
    host: Any, budgets: list[int], items: int, max_frames: int | None = None
) -> Any:
    """The runtime's manager on ``host`` with these budgets, items per batch
    and (when given) a user-set ``encoder_cudagraph_max_frames_per_batch``,
    its graphs replayed eagerly on CPU."""
    from encoder_cudagraph_runtime.config import CompilationConfig, VllmConfig
    from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
    from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager

    base = HostSettings().vllm_config()
    config = VllmConfig(
        scheduler_config=base.scheduler_config,
        model_config=base.model_config,
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=budgets,
            encoder_cudagraph_max_vision_items_per_batch=items,
            encoder_cudagraph_max_frames_per_batch=max_frames,
        ),
    )
    return EncoderCudaGraphManager(
        config, CPU, torch.float32, host, graph_backend=EagerReplayGraphBackend()
    )


# ---------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------

#: Every model with a spec: its vLLM side, modalities, batches, item grids,
#: frames per item and (when not only ``default``) encoder paths.
MODELS: dict[str, ModelRow] = {
    "qwen2_vl": ModelRow(
        _qwen2_vl_side, ("image", "video"), qwen_batch, _merged_grid, frames_of_t
    ),
    "qwen2_5_vl": ModelRow(
        _qwen2_5_vl_side, ("image", "video"), qwen_batch, _merged_grid, frames_of_t
    ),
    "qwen3_vl": ModelRow(
        _qwen3_vl_side, ("image", "video"), qwen_batch, _merged_grid, frames_of_t
    ),
    "cohere_compass": ModelRow(
        _cohere_compass_side, ("image",), qwen_batch, _merged_grid, frames_of_t
    ),
    "minimax_m3": ModelRow(
        _minimax_m3_side, ("image",), _minimax_batch, _merged_grid, frames_of_t
    ),
    "ernie45_vl": ModelRow(
        _ernie45_vl_side, ("image",), ernie_batch, _merged_grid, frames_of_t
    ),
    "deepseek_vl2": ModelRow(
        _deepseek_vl2_side, ("image",), deepseek_vl2_batch, _tile_grid, one_frame
    ),
    "deepseek_v41": ModelRow(
        _deepseek_v41_side, ("image",), _deepseek_batch, _deepseek_grid, one_frame
    ),
    "kimi_vl": ModelRow(
        _kimi_vl_side, ("image",), _patch_grid_batch, _kimi_vl_grid, one_frame
    ),
    "kimi_k3": ModelRow(_kimi_k3_side, ("image",), moon3d_batch, _thw_grid, one_frame),
    "kimi_k25": ModelRow(
        _kimi_k25_side, ("vision_chunk",), moon3d_batch, _kimi_k25_grid, one_frame
    ),
    "glm4_1v": ModelRow(
        _glm4_1v_side, ("image", "video"), qwen_batch, _merged_grid, frames_of_t
    ),
    "glm5_next": ModelRow(
        _glm5_next_side, ("image", "video"), qwen_batch, _merged_grid, frames_of_t
    ),
    "gemma3_mm": ModelRow(
        _gemma3_mm_side, ("image",), crops_batch, _pan_and_scan_crops, one_frame
    ),
    "internvl": ModelRow(
        _internvl_side,
        ("image", "video"),
        _internvl_batch,
        _internvl_tiles,
        frames_of_t,
    ),
    "mllama4": ModelRow(
        _mllama4_side, ("image",), _llama4_batch, _llama4_chunks, one_frame
    ),
    "idefics3": ModelRow(
        _idefics3_side, ("image",), idefics3_batch, _llama4_chunks, one_frame
    ),
    "lfm2_vl": ModelRow(
        _lfm2_vl_side,
        ("image",),
        _lfm2_vl_images,
        _lfm2_vl_image,
        one_frame,
    ),
    "step3_vl": ModelRow(
        _step3_vl_side,
        ("image",),
        step3_vl_batch,
        step3_vl_grid,
        one_frame,
        paths=("global", "local"),
    ),
    "deepseek_ocr": ModelRow(
        _deepseek_ocr_side,
        ("image",),
        deepseek_ocr_batch,
        deepseek_ocr_grid,
        one_frame,
        paths=("global", "local"),
    ),
    "gemma4_mm": ModelRow(
        _gemma4_mm_side, ("image",), gemma4_batch, gemma4_random_image, one_frame
    ),
    "minicpmv": ModelRow(
        _minicpmv_side, ("image", "video"), minicpmv_batch, minicpmv_item, len
    ),
}


def generated_mixin(stem: str, code: WheelCode) -> type:
    """The mixin class of ``generated/vllm/<stem>.py``, loaded on ``code``."""
    module = load_generated_vllm_module(stem, code)
    (mixin,) = (
        value
        for name, value in vars(module).items()
        if isinstance(value, type) and name.endswith("EncoderCudaGraphMixin")
    )
    return mixin


@functools.cache
def parity(stem: str) -> ModelParity:
    """Model ``stem`` of :data:`MODELS`: vLLM's host and one with the
    generated mixin, mixed onto the same host methods."""
    row = MODELS[stem]
    side = row.vllm_side()
    ours = generated_mixin(stem, side.code)
    our_host = type(
        f"Generated{ours.__name__.removesuffix('EncoderCudaGraphMixin')}Host",
        (*side.host_methods, ours, *side.host_parts),
        dict(side.our_attrs),
    )
    return ModelParity(
        name=stem,
        vllm_host=side.host,
        our_host=our_host,
        make_host=side.make_host,
        modalities=row.modalities,
        make_batch=row.make_batch,
        random_grid=row.random_grid,
        frames=row.frames,
        paths=row.paths,
    )
