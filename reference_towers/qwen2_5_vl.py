"""Qwen2.5-VL vision encoder and its host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``Qwen2_5_VisionTransformer`` (``vllm/model_executor/models/qwen2_5_vl.py``):
patch embed (a bias-free Conv3d with stride = kernel, run as one matmul) →
rows permuted into *window order* → pre-RMSNorm blocks with a 2-D vision RoPE,
each attending either inside its local window (``cu_window_seqlens``) or
inside its whole frame (``cu_seqlens``, the ``fullatt_block_indexes``
blocks), SiLU-gated MLP → patch merger (RMSNorm, m×m rows concatenated,
two-layer GELU MLP to the text width) → rows permuted back
(``reverse_indices``). The host stands in for the vision half of
``Qwen2_5_VLForConditionalGeneration``.

Host API (what vLLM's Qwen2.5-VL mixin reads), with vLLM's names and meaning:

* host: ``visual``, ``multimodal_config``, ``model_config.max_model_len``,
  ``is_multimodal_pruning_enabled``, ``get_max_frames_per_video()``;
* ``visual``: ``spatial_merge_size``, ``patch_size``, ``window_size``,
  ``fullatt_block_indexes``, ``out_hidden_size`` (text width), ``hidden_size``
  (ViT width), ``dtype``, ``device`` (of the patch-embed weight),
  ``attn_backend``, ``input_norm.input_dtype`` (``None``: no fused
  normalisation), ``patch_embed.{proj.in_channels, patch_size,
  temporal_patch_size}``, ``get_window_index_thw(t, h, w)``,
  ``get_encoder_cudagraph_max_window_seqs(token_budget, max_batch_size,
  max_frames_per_batch)``, ``prepare_encoder_metadata(grid_thw, *,
  max_batch_size=None, max_frames_per_batch=None,
  max_window_seqs_per_batch=None, max_seqlen_override=None,
  max_seqlen_window_override=None, device=None)`` and ``forward(x, grid_thw,
  *, encoder_metadata=None)`` → ``(N / m², out_hidden_size)`` in item order.

``prepare_encoder_metadata`` returns vLLM's ten keys with vLLM's shapes,
dtypes, padding and devices: ``rotary_pos_emb_cos`` / ``_sin`` ``(N,
head_dim / 2)`` in window order, tower dtype; ``window_index`` /
``reverse_indices`` ``(N / m²,)`` int64; ``cu_seqlens`` (one sequence per
frame, padded to ``max_frames_per_batch`` or else ``max_batch_size``
sequences by repeating the last offset) and ``cu_window_seqlens`` (one per
non-empty window, padded to ``max_window_seqs_per_batch``), int32;
``max_seqlen_full`` / ``max_seqlen_window``: 0-dim int32 on the CPU, the
override or vLLM's ``compute_max_seqlen`` (the longest sequence for
FLASH_ATTN, ROCM_AITER_FA, TRITON_ATTN and FLASHINFER, bucketed for
FLASHINFER, else 0); ``sequence_lengths_full`` / ``_window``: ``None``
except under FLASHINFER. Under FLASHINFER both ``cu_*`` tensors are vLLM's
two-section layout (``maybe_recompute_cu_seqlens``): row offsets scaled by
the ViT width, then scaled by three times it, each section padded to a batch
bucket (8, 16, 32, 64, then multiples of 8) by repeating its last value,
and ``sequence_lengths_*`` the per-sequence lengths zero-padded to the same
bucket. The windows are ``window_size / patch_size / m`` merged tokens a
side, cut from the top-left of every frame (partial windows at the bottom and
right edges).

Input rows follow the Qwen2-VL processor: an item of ``(t, h, w)`` patches
gives ``t·h·w`` rows ordered (t, block-row, block-col, mh, mw) with features
(C, T, p, p); images have ``t = 1``.

Full-size figures (``full()``) are Qwen2.5-VL-7B-Instruct's. Its
``config.json`` sets only ``vision_config.hidden_size`` 1280,
``in_chans`` 3, ``spatial_patch_size`` 14 and ``tokens_per_second`` 2
(seen in ``Qwen/Qwen2.5-VL-7B-Instruct-AWQ``'s config, whose
``_name_or_path`` is the 7B checkpoint, and in verbatim copies of it); the
rest are the defaults of transformers' ``Qwen2_5_VLVisionConfig``: depth 32,
16 heads, ``intermediate_size`` 3420, ``hidden_act`` silu, patch 14, T = 2,
m = 2, ``window_size`` 112, ``fullatt_block_indexes`` [7, 15, 23, 31],
``out_hidden_size`` 3584 (the 7B text width; the 72B checkpoint sets its
own 8192 and 3456). A module dump of the released model shows the same
shapes (qkv 1280 → 3840, gate/up 1280 → 3420, merger 5120 → 5120 → 3584,
RMSNorm eps 1e-6). The top-level ``rms_norm_eps`` is 1e-6 (vLLM passes it
as the vision ``norm_eps``) and ``max_position_embeddings`` 128000 (vLLM's
default ``max_model_len``; some copies of the config say 32768, so this one
value is the least certain; only ``model_config.max_model_len`` reads it).
The processor (``preprocessor_config.json``): ``max_pixels`` 12845056,
``min_pixels`` 3136, CLIP mean/std. RoPE base 1e4
and 8192 cached positions are vLLM's ``get_rope`` arguments; 14 frames per
video is vLLM's ``_MAX_FRAMES_PER_VIDEO``.

Deliberate differences from vLLM, none visible to a mixin:

* FLASHINFER is emulated: the metadata is vLLM's exactly, but the runtime
  has no FlashInfer kernel, so the blocks read the row offsets back from the
  first section of ``cu_*`` (dividing by the ViT width, on the device) and
  run FlashAttention with the reported ``max_seqlen``; ``sequence_lengths_*``
  are not read. FP8 attention (``fp8_padded_hidden_size``) is not modelled:
  it is ``None``, as in vLLM without FP8.
* ``input_norm`` is always the identity cast (vLLM's ``IdentityInputNorm``);
  the fused uint8 normalisation of ``mm_device_do_normalize`` is not modelled.
* RoPE tables are gathered on the device from a cache of per-position
  cos/sin (fp32 products, then cast to the tower dtype, as vLLM's cache is)
  by per-grid window-ordered position indices, instead of vLLM's LRU of
  per-grid tables; the values are the same.
* ``get_max_frames_per_video`` returns ``config.max_frames_per_video``
  instead of asking the processor (which needs a model config and the
  multimodal registry), and ``is_multimodal_pruning_enabled`` asks
  ``multimodal_config.is_multimodal_pruning_enabled()`` when the config has
  it (the runtime's does not model EVS pruning: ``False``). With pruning on,
  vLLM post-processes video embeddings eagerly; the reference does not.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import ModelConfig, MultiModalConfig
from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d
from reference_towers._layers import (
    ReleasedSizes,
    VarlenAttention,
    VarlenAttentionMetadata,
    activation,
    grid_rows,
    init_reference_weights_,
)
from reference_towers.qwen2_vl import (
    ROPE_MAX_POSITION,
    Qwen2VisionInputNorm,
    apply_vision_rotary,
    rotary_inv_freq,
    rotary_rows,
)
from reference_towers.rope_tables import AngleTable, GridIndexCache, concat_on_device

__all__ = [
    "FLASHINFER_BATCH_BUCKETS",
    "FLASHINFER_MAX_SEQLEN_BUCKETS",
    "Qwen2_5_VLVisionConfig",
    "Qwen2_5_VLVisionHost",
    "Qwen2_5_VisionTransformer",
    "backend_cu_seqlens",
    "backend_max_seqlen",
    "backend_sequence_lengths",
    "flashinfer_row_offsets",
    "window_partition",
]

Grids = Sequence[Sequence[int]] | torch.Tensor

# vLLM's FlashInfer buckets (``mm_encoder_attention.py``): sequence counts are
# padded up to one of these (then to multiples of the first), max_seqlen to
# one of the second (then to multiples of the last).
FLASHINFER_BATCH_BUCKETS = (8, 16, 32, 64)
FLASHINFER_MAX_SEQLEN_BUCKETS = tuple(k * 1024 for k in (1, 2, 4, 8, 16, 32, 64, 128))

# Backends for which vLLM's compute_max_seqlen reports a real maximum.
_MAX_SEQLEN_BACKENDS = (
    AttentionBackendEnum.FLASH_ATTN,
    AttentionBackendEnum.ROCM_AITER_FA,
    AttentionBackendEnum.TRITON_ATTN,
    AttentionBackendEnum.FLASHINFER,
)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen2_5_VLVisionConfig(ReleasedSizes):
    """The checkpoint's ``vision_config`` plus the host-level values the
    tower and the registry read. Defaults are the ``full`` values (see
    :meth:`full`); field names follow transformers' ``Qwen2_5_VLVisionConfig``.
    """

    hidden_size: int = 1280
    """ViT width."""
    depth: int = 32
    num_heads: int = 16
    intermediate_size: int = 3420
    hidden_act: str = "silu"
    """Activation of the gated block MLPs (``act(gate) * up``)."""
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112
    """Window side in pixels: ``window_size / patch_size / m`` merged tokens."""
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    """Blocks that attend over the whole frame; the others stay in windows."""
    out_hidden_size: int = 3584
    """Output (text) width of the merger."""
    rms_norm_eps: float = 1e-6
    """RMSNorm eps of blocks and merger (vLLM: the top-level config's)."""
    rope_theta: float = 10000.0
    """Base of the vision RoPE (vLLM's ``get_rope`` default)."""
    max_pixels: int = 12845056
    """Processor bound on resized pixels per frame."""
    max_frames_per_video: int = 14
    """What :meth:`Qwen2_5_VLVisionHost.get_max_frames_per_video` reports and
    the cap on ``t`` of a legal video item."""
    max_model_len: int = 128000
    """``model_config.max_model_len`` of the host (vLLM's default, the
    checkpoint's ``max_position_embeddings``)."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if is_number and value <= 0:
                problems.append(f"{f.name} must be positive, got {value}")
        if self.hidden_size % self.num_heads:
            problems.append(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads "
                f"{self.num_heads}"
            )
        elif self.head_dim % 4:
            problems.append(
                "head dim must be a multiple of 4 (half of it is rotated, split "
                "evenly between rows and columns)"
            )
        if self.window_tokens < 1:
            problems.append(
                f"window_size {self.window_size} is below one merged token "
                f"({self.patch_size * self.spatial_merge_size} pixels)"
            )
        bad = [i for i in self.fullatt_block_indexes if not 0 <= i < self.depth]
        if bad:
            problems.append(f"fullatt_block_indexes {bad} are not blocks of {self}")
        activation(self.hidden_act)  # raises on unknown names
        if self.max_pixels < (self.patch_size * self.spatial_merge_size) ** 2:
            problems.append("max_pixels is below one m×m block of patches")
        if problems:
            raise ValueError("invalid Qwen2_5_VLVisionConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def window_tokens(self) -> int:
        """Window side in merged tokens (vLLM's ``vit_merger_window_size``)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @property
    def patch_dim(self) -> int:
        """Features of one input row: C·T·p²."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def max_patches_per_frame(self) -> int:
        return self.max_pixels // self.patch_size**2

    @classmethod
    def tiny(cls) -> Qwen2_5_VLVisionConfig:
        """A tower that runs in milliseconds on a CPU.

        Patch, temporal, merge and window sizes stay at the released values,
        so inputs, grids and windows (4×4 merged tokens) have the real
        layout. Four blocks, two of them full-attention (1 and 3), so both
        kinds run and a swapped index shows. Head dim 32 gives 8 RoPE
        frequencies per axis; a text width (96) distinct from D·m² (256)
        catches swapped dimensions. The pixel bound is lowered to 64 output
        tokens per frame (up to four windows), videos to 4 frames, the model
        length to the driver's tiny 512.
        """
        return cls(
            hidden_size=64,
            depth=4,
            num_heads=2,
            intermediate_size=96,
            fullatt_block_indexes=(1, 3),
            out_hidden_size=96,
            max_pixels=64 * (14 * 2) ** 2,
            max_frames_per_video=4,
            max_model_len=512,
        )

    @classmethod
    def full(cls) -> Qwen2_5_VLVisionConfig:
        """Qwen2.5-VL-7B-Instruct's dimensions (sources in the module
        docstring)."""
        return cls()


# ---------------------------------------------------------------------------
# Windows and backend-specific varlen metadata
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def window_partition(
    t: int, h: int, w: int, spatial_merge_size: int, window_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows of one ``(t, h, w)`` item, on the CPU.

    Every frame's ``(h / m) × (w / m)`` merged tokens are cut into windows of
    ``window_tokens`` a side from the top-left (partial ones at the bottom and
    right edges); windows are taken frame by frame, row-major, and tokens
    inside a window row-major.

    Returns:
        ``window_index``: int64 ``(t·(h/m)·(w/m),)``, the processor-order
        merged token at each window-order position; ``window_ends``: int32,
        the cumulative ViT row count (``m²`` rows per token) at the end of
        each window (no leading 0). Cached: never modify them.
    """
    m, s = spatial_merge_size, window_tokens
    lh, lw = h // m, w // m
    rows_of_windows, cols_of_windows = -(-lh // s), -(-lw // s)
    frame = torch.arange(t).view(t, 1, 1)
    row = torch.arange(lh).view(1, lh, 1)
    col = torch.arange(lw).view(1, 1, lw)
    window = (frame * rows_of_windows + row // s) * cols_of_windows + col // s
    key = window * (s * s) + (row % s) * s + col % s
    window_index = torch.argsort(key.reshape(-1))
    counts = torch.bincount(window.reshape(-1))
    window_ends = (torch.cumsum(counts, 0) * m * m).to(torch.int32)
    return window_index, window_ends


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def flashinfer_batch_bucket(num_seqs: int) -> int:
    """The sequence count FlashInfer metadata is padded to."""
    for bucket in FLASHINFER_BATCH_BUCKETS:
        if bucket >= num_seqs:
            return bucket
    return _round_up(num_seqs, FLASHINFER_BATCH_BUCKETS[0])


def backend_max_seqlen(backend: AttentionBackendEnum, offsets: np.ndarray) -> int:
    """vLLM's ``MMEncoderAttention.compute_max_seqlen`` over row offsets."""
    value = 0
    if backend in _MAX_SEQLEN_BACKENDS and len(offsets) >= 2:
        value = int((offsets[1:] - offsets[:-1]).max())
    if backend == AttentionBackendEnum.FLASHINFER:
        if value <= 0:
            return FLASHINFER_MAX_SEQLEN_BUCKETS[0]
        for bucket in FLASHINFER_MAX_SEQLEN_BUCKETS:
            if bucket >= value:
                return bucket
        return _round_up(value, FLASHINFER_MAX_SEQLEN_BUCKETS[-1])
    return value


def _pad_repeating_last(values: np.ndarray, length: int) -> np.ndarray:
    """``values`` extended to ``length`` entries with copies of its last."""
    if len(values) >= length:
        return values
    tail = np.full(length - len(values), values[-1], dtype=values.dtype)
    return np.concatenate([values, tail])


def backend_sequence_lengths(
    backend: AttentionBackendEnum, offsets: np.ndarray, device: torch.device
) -> torch.Tensor | None:
    """vLLM's ``maybe_compute_seq_lens``: FlashInfer's per-sequence lengths,
    zero-padded to the batch bucket; ``None`` for other backends."""
    if backend != AttentionBackendEnum.FLASHINFER:
        return None
    lengths = offsets[1:] - offsets[:-1]
    padded = np.zeros(flashinfer_batch_bucket(len(lengths)), dtype=lengths.dtype)
    padded[: len(lengths)] = lengths
    return async_tensor_h2d(padded, device)


def backend_cu_seqlens(
    backend: AttentionBackendEnum,
    offsets: np.ndarray,
    hidden_size: int,
    device: torch.device,
) -> torch.Tensor:
    """vLLM's ``maybe_recompute_cu_seqlens`` (unsharded, no FP8): the int32
    row offsets on ``device``; FlashInfer gets two sections, the offsets
    times ``hidden_size`` (q, k, out strides) then times ``3·hidden_size``
    (v's stride in the fused qkv), each padded to the batch bucket + 1
    entries by repeating its last value."""
    if backend == AttentionBackendEnum.FLASHINFER:
        length = flashinfer_batch_bucket(len(offsets) - 1) + 1
        scaled = offsets * hidden_size
        offsets = np.concatenate(
            [
                _pad_repeating_last(scaled, length),
                _pad_repeating_last(scaled * 3, length),
            ]
        )
    return async_tensor_h2d(offsets, device)


def flashinfer_row_offsets(cu_seqlens: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """Row offsets back from a FlashInfer two-section ``cu_seqlens`` (its
    first section divided by the ViT width), on the device."""
    return cu_seqlens[: cu_seqlens.shape[0] // 2] // hidden_size


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class Qwen2_5_RMSNorm(nn.Module):
    """vLLM's ``RMSNorm`` (``ir.ops.rms_norm``): fp32 statistics, the
    normalised value cast to the weight dtype, times the weight, cast back.

    Called with ``residual``, it is vLLM's ``fused_add_rms_norm``: the sum
    ``x + residual`` is formed in fp32, normalised from that fp32 sum, and
    returned rounded as the new residual.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _normalise(self, x32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32.to(self.weight.dtype) * self.weight).to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._normalise(x.float(), x.dtype)
        total = x.float() + residual.float()
        return self._normalise(total, x.dtype), total.to(x.dtype)


class Qwen2_5_VisionPatchEmbed(nn.Module):
    """``(N, C·T·p²)`` rows → ``(N, D)``: a bias-free Conv3d whose kernel and
    stride are ``(T, p, p)``, i.e. one matmul with the flattened kernel."""

    def __init__(self, config: Qwen2_5_VLVisionConfig) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.temporal_patch_size = config.temporal_patch_size
        self.hidden_size = config.hidden_size
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(
            config.in_channels,
            config.hidden_size,
            kernel_size=kernel,
            stride=kernel,
            bias=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        if x.dim() != 2 or x.shape[1] != weight[0].numel():
            raise ValueError(
                f"pixel rows must be (N, {weight[0].numel()}), got {tuple(x.shape)}"
            )
        return F.linear(x, weight.reshape(weight.shape[0], -1))


class Qwen2_5_VisionAttention(nn.Module):
    """Fused biased qkv ([q; k; v], head-major) → 2-D RoPE on q, k → varlen
    attention → biased proj."""

    def __init__(self, config: Qwen2_5_VLVisionConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        dim = config.hidden_size
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        # The tower sets the kernel backend (see its attn_backend).
        self.attn = VarlenAttention(
            self.num_heads, self.head_dim, AttentionBackendEnum.FLASH_ATTN
        )

    def forward(
        self,
        x: torch.Tensor,
        attn_metadata: VarlenAttentionMetadata,
        rotary_pos_emb_cos: torch.Tensor,
        rotary_pos_emb_sin: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, self.head_dim).unbind(1)
        q = apply_vision_rotary(q, rotary_pos_emb_cos, rotary_pos_emb_sin)
        k = apply_vision_rotary(k, rotary_pos_emb_cos, rotary_pos_emb_sin)
        out = self.attn(q, k, v, attn_metadata)
        return self.proj(out.reshape(n, -1))


class Qwen2_5_VisionMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with the fused, biased ``gate_up_proj``
    ([gate; up]) of vLLM."""

    def __init__(self, config: Qwen2_5_VLVisionConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act(gate) * up)


class Qwen2_5_VisionBlock(nn.Module):
    """``x + attn(norm1(x))``, then vLLM's fused add-norm: ``residual = x +
    attn_out`` and ``residual + mlp(norm2(residual))``."""

    def __init__(self, config: Qwen2_5_VLVisionConfig) -> None:
        super().__init__()
        self.norm1 = Qwen2_5_RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm2 = Qwen2_5_RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Qwen2_5_VisionAttention(config)
        self.mlp = Qwen2_5_VisionMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        attn_metadata: VarlenAttentionMetadata,
        rotary_pos_emb_cos: torch.Tensor,
        rotary_pos_emb_sin: torch.Tensor,
    ) -> torch.Tensor:
        attn_out = self.attn(
            self.norm1(x), attn_metadata, rotary_pos_emb_cos, rotary_pos_emb_sin
        )
        normed, residual = self.norm2(x, residual=attn_out)
        return residual + self.mlp(normed)


class Qwen2_5_VisionPatchMerger(nn.Module):
    """``ln_q`` (RMSNorm over D), each m² consecutive rows concatenated, then
    ``mlp``: Linear(D·m², D·m²) → GELU → Linear(D·m², text). The
    ``ModuleList`` keeps vLLM's parameter names (``mlp.0``, ``mlp.2``)."""

    def __init__(self, config: Qwen2_5_VLVisionConfig) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = Qwen2_5_RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = nn.ModuleList(
            [
                nn.Linear(self.hidden_size, self.hidden_size),
                nn.GELU(),
                nn.Linear(self.hidden_size, config.out_hidden_size),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x).reshape(-1, self.hidden_size)
        for layer in self.mlp:
            x = layer(x)
        return x


class WindowedRotaryTable:
    """The per-row RoPE cos/sin of a batch in window order, gathered on the
    device: positions ``(row, col)`` of every patch (frames repeated),
    permuted by the item's window index in blocks of m² rows, are cached per
    grid on the device and index a per-position :class:`AngleTable`."""

    def __init__(self, config: Qwen2_5_VLVisionConfig) -> None:
        self.head_dim = config.head_dim
        self._m = config.spatial_merge_size
        self._window_tokens = config.window_tokens
        self._angles = AngleTable(
            lambda: rotary_inv_freq(config.head_dim, config.rope_theta)
        )
        self._positions = GridIndexCache(self._window_order_positions)

    def _window_order_positions(self, grid: Any) -> torch.Tensor:
        t, h, w = grid
        positions = rotary_rows(t, h, w, self._m).view(-1, self._m**2, 2)
        window_index, _ = window_partition(t, h, w, self._m, self._window_tokens)
        return positions[window_index].reshape(-1, 2)

    def cos_sin(
        self,
        grids: Sequence[tuple[int, ...]],
        device: torch.device,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not grids:
            empty = torch.zeros((0, self.head_dim // 2), dtype=dtype, device=device)
            return empty, empty.clone()
        side = max(max(h, w) for _, h, w in grids)
        if side > ROPE_MAX_POSITION:
            raise ValueError(
                f"grid side {side} exceeds the {ROPE_MAX_POSITION} positions of "
                "the vision RoPE cache"
            )
        cos_table, sin_table = self._angles.cos_sin(side, device, dtype)
        unique = {grid: self._positions.get(grid, device) for grid in grids}
        index = concat_on_device([unique[grid] for grid in grids])
        rows = index.shape[0]
        return (
            cos_table[index].reshape(rows, -1),
            sin_table[index].reshape(rows, -1),
        )


class Qwen2_5_VisionTransformer(nn.Module):
    """Patch embed → window order → blocks → merger → item order:
    ``(N, C·T·p²)`` → ``(N / m², out_hidden_size)``."""

    _METADATA_KEYS = (
        "rotary_pos_emb_cos",
        "rotary_pos_emb_sin",
        "window_index",
        "reverse_indices",
        "cu_seqlens",
        "cu_window_seqlens",
        "max_seqlen_full",
        "max_seqlen_window",
    )

    def __init__(
        self,
        config: Qwen2_5_VLVisionConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_heads
        self.out_hidden_size = config.out_hidden_size
        self.window_size = config.window_size
        self.patch_size = config.patch_size
        self.spatial_merge_size = config.spatial_merge_size
        self.fullatt_block_indexes = list(config.fullatt_block_indexes)
        self.spatial_merge_unit = config.spatial_merge_size**2
        self.tp_size = 1
        self.fp8_padded_hidden_size: int | None = None
        self.rotary_table = WindowedRotaryTable(config)
        self.patch_embed = Qwen2_5_VisionPatchEmbed(config)
        self.input_norm = Qwen2VisionInputNorm()
        self.blocks = nn.ModuleList(
            Qwen2_5_VisionBlock(config) for _ in range(config.depth)
        )
        self.merger = Qwen2_5_VisionPatchMerger(config)
        self.attn_backend = attn_backend

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the patch-embed weight (follows ``.to(dtype)``)."""
        return self.patch_embed.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embed.proj.weight.device

    @property
    def attn_backend(self) -> AttentionBackendEnum:
        """The ViT attention backend (what metadata and the mixin's padding
        choice follow). Setting it switches every block's kernel:
        FlashAttention for the emulated FLASHINFER, else the backend itself."""
        return self._attn_backend

    @attn_backend.setter
    def attn_backend(self, backend: AttentionBackendEnum) -> None:
        self._attn_backend = backend
        kernel = (
            AttentionBackendEnum.FLASH_ATTN
            if backend == AttentionBackendEnum.FLASHINFER
            else backend
        )
        for block in self.blocks:
            block.attn.attn.attn_backend = kernel

    @property
    def window_tokens(self) -> int:
        """vLLM's ``vit_merger_window_size``: merged tokens per window side."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    def get_window_index_thw(
        self, grid_t: int, grid_h: int, grid_w: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's per-item window index (int64) and cumulative window row
        ends (int32, no leading 0), both on the CPU."""
        window_index, window_ends = window_partition(
            int(grid_t),
            int(grid_h),
            int(grid_w),
            self.spatial_merge_size,
            self.window_tokens,
        )
        return window_index.clone(), window_ends.clone()

    def get_encoder_cudagraph_max_window_seqs(
        self, token_budget: int, max_batch_size: int, max_frames_per_batch: int
    ) -> int:
        """vLLM's bound on the window sequences of a batch of at most
        ``token_budget`` merged tokens: a thin strip of windows,
        ``ceil(token_budget / window side)``, plus one partial window per
        item or frame, never more than the tokens themselves."""
        side = self.window_tokens
        strip = -(-token_budget // side)
        return min(token_budget, max(max_batch_size, max_frames_per_batch) + strip)

    def prepare_encoder_metadata(
        self,
        grid_thw: Grids,
        *,
        max_batch_size: int | None = None,
        max_frames_per_batch: int | None = None,
        max_window_seqs_per_batch: int | None = None,
        max_seqlen_override: int | None = None,
        max_seqlen_window_override: int | None = None,
        device: torch.device | str | None = None,
    ) -> dict[str, torch.Tensor | None]:
        """Every grid-dependent input of :meth:`forward` (see the module
        docstring for keys, layouts and backends).

        Args:
            grid_thw: ``[t, h, w]`` per item.
            max_batch_size, max_frames_per_batch: pad ``cu_seqlens`` to that
                many sequences (``max_frames_per_batch`` wins when given).
            max_window_seqs_per_batch: pad ``cu_window_seqlens`` likewise.
            max_seqlen_override, max_seqlen_window_override: report these
                ``max_seqlen`` values. They are read on the host at kernel
                launch, so frozen into a captured graph: capture passes
                worst cases.
            device: where the tensors go (default: the tower's).
        """
        device = torch.device(self.device if device is None else device)
        grids = grid_rows(grid_thw, 3)
        m, s = self.spatial_merge_size, self.window_tokens
        window_parts: list[torch.Tensor] = []
        window_ends: list[torch.Tensor] = [torch.zeros(1, dtype=torch.int32)]
        tokens = rows = 0
        for t, h, w in grids:
            index, ends = window_partition(t, h, w, m, s)
            window_parts.append(index + tokens)
            window_ends.append(ends + rows)
            tokens += index.numel()
            rows += t * h * w
        if window_parts:
            window_index = torch.cat(window_parts)
        else:
            window_index = torch.zeros(0, dtype=torch.int64)
        reverse_indices = torch.empty_like(window_index)
        reverse_indices[window_index] = torch.arange(window_index.numel())
        frame_lengths = [h * w for t, h, w in grids for _ in range(t)]
        offsets = np.array([0, *itertools.accumulate(frame_lengths)], dtype=np.int32)
        pad_to = (
            max_frames_per_batch if max_frames_per_batch is not None else max_batch_size
        )
        if pad_to is not None:
            offsets = _pad_repeating_last(offsets, pad_to + 1)
        window_offsets = torch.cat(window_ends).numpy()
        if max_window_seqs_per_batch is not None:
            window_offsets = _pad_repeating_last(
                window_offsets, max_window_seqs_per_batch + 1
            )
        cos, sin = self.rotary_table.cos_sin(grids, self.device, self.dtype)
        backend = self.attn_backend
        full = (
            backend_max_seqlen(backend, offsets)
            if max_seqlen_override is None
            else max_seqlen_override
        )
        window = (
            backend_max_seqlen(backend, window_offsets)
            if max_seqlen_window_override is None
            else max_seqlen_window_override
        )
        return {
            "rotary_pos_emb_cos": cos.to(device),
            "rotary_pos_emb_sin": sin.to(device),
            "window_index": async_tensor_h2d(window_index, device),
            "reverse_indices": async_tensor_h2d(reverse_indices, device),
            "cu_seqlens": backend_cu_seqlens(
                backend, offsets, self.hidden_size, device
            ),
            "cu_window_seqlens": backend_cu_seqlens(
                backend, window_offsets, self.hidden_size, device
            ),
            "max_seqlen_full": torch.tensor(full, dtype=torch.int32),
            "max_seqlen_window": torch.tensor(window, dtype=torch.int32),
            "sequence_lengths_full": backend_sequence_lengths(backend, offsets, device),
            "sequence_lengths_window": backend_sequence_lengths(
                backend, window_offsets, device
            ),
        }

    def _attention_metadata(
        self, cu_seqlens: torch.Tensor, max_seqlen: torch.Tensor
    ) -> VarlenAttentionMetadata:
        """What the kernels read: row offsets (decoded for FlashInfer)."""
        if self.attn_backend == AttentionBackendEnum.FLASHINFER:
            cu_seqlens = flashinfer_row_offsets(cu_seqlens, self.hidden_size)
        return VarlenAttentionMetadata(cu_seqlens, max_seqlen)

    def forward(
        self,
        x: torch.Tensor,
        grid_thw: Grids | None = None,
        *,
        encoder_metadata: Mapping[str, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """``(N, C·T·p²)`` pixel rows → ``(N / m², out_hidden_size)``.

        With ``encoder_metadata`` (the CUDA graph path) no host work happens
        and ``grid_thw`` is ignored; without it the metadata is built from
        ``grid_thw``.
        """
        x = self.input_norm(x.to(device=self.device), self.dtype)
        x = self.patch_embed(x)
        if encoder_metadata is None:
            if grid_thw is None:
                raise ValueError("need grid_thw or encoder_metadata")
            encoder_metadata = self.prepare_encoder_metadata(grid_thw)
        missing = [k for k in self._METADATA_KEYS if encoder_metadata.get(k) is None]
        if missing:
            raise ValueError(f"encoder_metadata lacks {missing}")
        meta = {k: encoder_metadata[k] for k in self._METADATA_KEYS}
        rows, unit = x.shape[0], self.spatial_merge_unit
        if meta["rotary_pos_emb_cos"].shape[0] != rows:
            raise ValueError(
                f"{rows} pixel rows but RoPE tables for "
                f"{meta['rotary_pos_emb_cos'].shape[0]}"
            )
        x = x.reshape(rows // unit, unit, -1)[meta["window_index"]].reshape(rows, -1)
        # Built once per forward for all blocks, as vLLM builds its metadata.
        full = self._attention_metadata(meta["cu_seqlens"], meta["max_seqlen_full"])
        window = self._attention_metadata(
            meta["cu_window_seqlens"], meta["max_seqlen_window"]
        )
        for index, block in enumerate(self.blocks):
            x = block(
                x,
                full if index in self.fullatt_block_indexes else window,
                meta["rotary_pos_emb_cos"],
                meta["rotary_pos_emb_sin"],
            )
        if x.dtype == torch.float16:
            # vLLM's cast_overflow_tensors (Qwen2.5-VL-3B overflows fp16).
            limit = torch.finfo(x.dtype).max - 1000
            x = x.clamp(min=-limit, max=limit)
        return self.merger(x)[meta["reverse_indices"]]


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class Qwen2_5_VLVisionHost(nn.Module):
    """The vision half of vLLM's ``Qwen2_5_VLForConditionalGeneration``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`), so host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: Qwen2_5_VLVisionConfig,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.model_config = ModelConfig(
            max_model_len=config.max_model_len,
            multimodal_config=multimodal_config,
        )
        pruning = getattr(multimodal_config, "is_multimodal_pruning_enabled", None)
        self.is_multimodal_pruning_enabled = bool(pruning()) if pruning else False
        self.visual = Qwen2_5_VisionTransformer(config, attn_backend)

    def get_max_frames_per_video(self) -> int:
        """``config.max_frames_per_video`` (vLLM asks the processor how many
        frames of the largest image fit the model length, at most 14); a cap
        on ``t`` here, as for Qwen2-VL."""
        return self.config.max_frames_per_video

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`)."""
        init_reference_weights_(
            self.visual,
            torch.Generator().manual_seed(seed),
            residual_branch_outputs=("attn.proj", "mlp.down_proj"),
            num_residual_branches=2 * self.config.depth,
        )

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        self.visual.to(dtype=dtype)

    @staticmethod
    def reference_modality(mm_kwargs: Mapping[str, Any]) -> str:
        """``"image"`` when ``image_grid_thw`` is present, else ``"video"``
        (vLLM's ``get_input_modality``)."""
        return "image" if "image_grid_thw" in mm_kwargs else "video"

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each item's ``(t·h·w / m², text)`` embeddings in item
        order, one tower call per item (so nothing is packed)."""
        if self.reference_modality(mm_kwargs) == "image":
            pixel_values, grids = mm_kwargs["pixel_values"], mm_kwargs["image_grid_thw"]
        else:
            pixel_values = mm_kwargs["pixel_values_videos"]
            grids = mm_kwargs["video_grid_thw"]
        items = grid_rows(grids, 3)
        needed = sum(math.prod(item) for item in items)
        if needed != pixel_values.shape[0]:
            raise ValueError(
                f"pixel values have {pixel_values.shape[0]} rows, grids need {needed}"
            )
        out: list[torch.Tensor] = []
        offset = 0
        for item in items:
            size = math.prod(item)
            out.append(self.visual(pixel_values[offset : offset + size], [item]))
            offset += size
        return out
