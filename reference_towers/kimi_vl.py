"""Kimi-VL vision encoder (MoonViT), projector and host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``MoonVitPretrainedModel`` (``vllm/model_executor/models/moonvit.py``) and
``KimiVLMultiModalProjector`` (``kimi_vl.py``): patch embed (a biased Conv2d
with stride = kernel, run as one matmul) plus learned 2-D position
embeddings interpolated (bicubic) to each grid → pre-LayerNorm blocks with a
2-D RoPE applied as complex ``rope_freqs_cis`` and per-image varlen
attention, tanh-GELU MLP → final LayerNorm → patch merger as one gather
(``merge_gather_idx``) → projector (LayerNorm, kh·kw rows concatenated,
Linear → GELU → Linear to the text width). The host stands in for the vision
half of ``KimiVLForConditionalGeneration``.

Host API (what vLLM's Kimi-VL mixin reads), with vLLM's names and meaning:

* host: ``config.vision_config.{merge_kernel_size, patch_size}``,
  ``config.text_config.hidden_size``, ``hidden_size`` (text width),
  ``model_config.max_model_len``, ``multimodal_config``, ``vision_tower``,
  ``multi_modal_projector`` (``(Σ, kh·kw, D)`` → ``(Σ, text)``);
* ``vision_tower``: ``merge_kernel_size``, ``patch_size``, ``hidden_size``,
  ``encoder.rope_2d.{max_height, max_width, dim}``,
  ``encoder.blocks[i].attn.attn_backend``,
  ``prepare_encoder_metadata(grid_hws_list, *, max_batch_size=None,
  max_seqlen_override=None, device=None)`` and ``forward(pixel_values,
  grid_hw, *, encoder_metadata=None)``: with metadata the packed
  ``(Σ h·w / (kh·kw), kh·kw, D)``, without it one ``(h·w / (kh·kw), kh·kw,
  D)`` tensor per image (vLLM's legacy path).

``prepare_encoder_metadata`` returns vLLM's keys with vLLM's shapes, dtypes,
padding and devices: ``pos_embeds`` ``(Σ h·w, D)`` in the tower dtype;
``rope_freqs_cis`` ``(Σ h·w, head_dim / 2)`` complex64; ``cu_seqlens`` int32,
one sequence per image, padded to ``max_batch_size`` sequences by repeating
the last offset; ``max_seqlen`` 0-dim int32 on the CPU (the override, else
the largest ``h·w``); ``merge_gather_idx`` int64 ``(Σ h·w,)``. Input rows are
the processor's patches ``(Σ h·w, 3, p, p)`` in row-major order per image.

Full-size figures (``full()``) are Kimi-VL-A3B-Instruct's. Vision
(``config.json`` ``vision_config``, also vLLM's ``MoonViTConfig`` defaults):
patch 14, 64×64 learned position grid, 27 layers, width 1152, 16 heads,
MLP 4304, merge kernel 2×2; text (``text_config``): hidden 2048,
``max_position_embeddings`` 131072 (vLLM's default ``max_model_len``). The
RoPE grid (512×512, base 1e4), the LayerNorm eps (1e-5: PyTorch's default
in the blocks, the final norm and the projector), tanh-GELU in the blocks
and exact GELU in the projector are vLLM's code. Processor
(``preprocessor_config.json``, read from a verbatim mirror of the
checkpoint): ``in_token_limit`` 4096, ``pad_input`` true, mean = std = 0.5,
and its remote code (read in a port) refuses 512 patches a side. The
configs were read from copies of the checkpoint's files (derived checkpoints and a
mirror), not from the original repository; vLLM's ``MoonViTConfig``
defaults agree with every vision value, while the text width and length
rest on those copies alone.

Deliberate differences from vLLM, none visible to a mixin:

* The RoPE table ``precomputed_freqs_cis`` is computed on the CPU in fp32
  and cached per device; vLLM computes it on the accelerator
  (``current_platform.device_type``), so ``torch.polar`` may differ in the
  last bit there. Eager and graph paths share the table either way.
* The legacy path (no ``encoder_metadata``) builds the metadata from the
  grids and runs the packed path, then splits the result per image; vLLM
  runs the same arithmetic per image in Python (same values: attention
  never crosses images, the merger is a reshape).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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

__all__ = [
    "KimiVLConfig",
    "KimiVLMultiModalProjector",
    "KimiVLTextConfig",
    "KimiVLVisionHost",
    "MoonViTConfig",
    "MoonVitPretrainedModel",
    "Rope2DPosEmb",
    "apply_rope",
    "merge_gather_index",
    "rope_2d_table",
]

Grids = Sequence[Sequence[int]] | torch.Tensor

# LayerNorm eps of blocks, final norm and projector (vLLM: nn.LayerNorm's
# default in moonvit.py, an explicit 1e-5 in the projector).
LAYER_NORM_EPS = 1e-5

# vLLM's MoonVitEncoder builds Rope2DPosEmb(head_dim, 512, 512) with the
# default base.
ROPE_GRID = 512
ROPE_THETA = 10000.0


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _positive_fields(obj: Any) -> list[str]:
    problems = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if is_number and value <= 0:
            problems.append(f"{f.name} must be positive, got {value}")
    return problems


@dataclass(frozen=True)
class MoonViTConfig:
    """The checkpoint's ``vision_config`` (vLLM's ``MoonViTConfig`` field
    names)."""

    patch_size: int = 14
    init_pos_emb_height: int = 64
    init_pos_emb_width: int = 64
    num_attention_heads: int = 16
    num_hidden_layers: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    merge_kernel_size: tuple[int, int] = (2, 2)

    def __post_init__(self) -> None:
        problems = _positive_fields(self)
        if self.hidden_size % self.num_attention_heads:
            problems.append("hidden_size is not a multiple of num_attention_heads")
        elif (self.hidden_size // self.num_attention_heads) % 4:
            problems.append("head dim must be a multiple of 4 (Rope2DPosEmb)")
        if len(self.merge_kernel_size) != 2 or min(self.merge_kernel_size) < 1:
            problems.append("merge_kernel_size must be two positive ints")
        if problems:
            raise ValueError("invalid MoonViTConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class KimiVLTextConfig:
    """The one text-config value the vision half reads."""

    hidden_size: int = 2048


@dataclass(frozen=True)
class KimiVLConfig(ReleasedSizes):
    """The host's ``config`` (vLLM's ``KimiVLConfig``: ``vision_config``,
    ``text_config``) plus processor and model-length values. Defaults are
    the ``full`` values (see the module docstring)."""

    vision_config: MoonViTConfig = field(default_factory=MoonViTConfig)
    text_config: KimiVLTextConfig = field(default_factory=KimiVLTextConfig)
    in_token_limit: int = 4096
    """Processor: images with more patches (floored) are downscaled."""
    max_patches_per_side: int = 511
    """Processor: its remote code raises for 512 patches a side or more."""
    max_model_len: int = 131072
    """``model_config.max_model_len`` of the host."""

    def __post_init__(self) -> None:
        problems = _positive_fields(self)
        if problems:
            raise ValueError("invalid KimiVLConfig: " + "; ".join(problems))

    @classmethod
    def tiny(cls) -> KimiVLConfig:
        """A tower that runs in milliseconds on a CPU.

        Patch size, merge kernel and RoPE grid stay at the released values.
        Head dim 32 gives 8 RoPE frequencies per axis; an 8×8 learned
        position grid makes almost every grid interpolate; a text width (96)
        distinct from D·kh·kw (256) catches swapped dimensions. The processor
        limit is lowered to 256 patches, so an image has at most 255 output
        tokens (a 2×510 strip) and every count up to that is reachable; the
        model length is the driver's tiny 512.
        """
        return cls(
            vision_config=MoonViTConfig(
                init_pos_emb_height=8,
                init_pos_emb_width=8,
                num_attention_heads=2,
                num_hidden_layers=2,
                hidden_size=64,
                intermediate_size=96,
            ),
            text_config=KimiVLTextConfig(hidden_size=96),
            in_token_limit=256,
            max_model_len=512,
        )

    @classmethod
    def full(cls) -> KimiVLConfig:
        """Kimi-VL-A3B-Instruct's dimensions (sources in the module
        docstring)."""
        return cls()


# ---------------------------------------------------------------------------
# Grid metadata
# ---------------------------------------------------------------------------


def merge_gather_index(
    grid_hws: Sequence[tuple[int, int]], merge_kernel_size: tuple[int, int]
) -> np.ndarray:
    """int64 rows that put every merge block's ``kh·kw`` patches next to
    each other: block ``(bh, bw)`` of an ``h×w`` image gathers rows
    ``(bh·kh + i)·w + bw·kw + j`` of that image, ``(i, j)`` row-major, blocks
    row-major, images one after another."""
    kh, kw = merge_kernel_size
    parts = []
    offset = 0
    for h, w in grid_hws:
        block_row = np.arange(h // kh).reshape(-1, 1, 1, 1)
        block_col = np.arange(w // kw).reshape(1, -1, 1, 1)
        i = np.arange(kh).reshape(1, 1, -1, 1)
        j = np.arange(kw).reshape(1, 1, 1, -1)
        rows = (block_row * kh + i) * w + block_col * kw + j
        parts.append(offset + rows.reshape(-1))
        offset += h * w
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(parts).astype(np.int64)


@functools.lru_cache(maxsize=4)
def rope_2d_table(dim: int, height: int, width: int, theta: float) -> torch.Tensor:
    """vLLM's ``Rope2DPosEmb.precomputed_freqs_cis`` on the CPU in fp32:
    ``(height, width, dim / 2)`` complex64 (see :class:`Rope2DPosEmb`).
    Cached: never modify it."""
    with torch.device("cpu"):
        flat = torch.arange(height * width).float()
        cols, rows = flat % width, flat // width
        exponents = torch.arange(0, dim, 4)[: dim // 4].float()
        freqs = 1.0 / (theta ** (exponents / dim))
        col_cis = torch.polar(torch.ones(()), torch.outer(cols, freqs))
        row_cis = torch.polar(torch.ones(()), torch.outer(rows, freqs))
        return torch.stack([col_cis, row_cis], dim=-1).reshape(height, width, -1)


def apply_rope(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's MoonViT ``apply_rope``: adjacent dims ``(2i, 2i+1)`` form one
    complex number, multiplied by ``freqs_cis`` ``(rows, head_dim / 2)`` in
    fp32, cast back to the input dtype."""
    if freqs_cis.dtype != torch.complex64:
        raise TypeError(f"freqs_cis must be complex64, got {freqs_cis.dtype}")
    if xq.shape[-1] != 2 * freqs_cis.shape[-1] or xq.shape[0] != freqs_cis.shape[0]:
        raise ValueError(
            f"rope table {tuple(freqs_cis.shape)} does not fit {tuple(xq.shape)}"
        )
    cis = freqs_cis.unsqueeze(-2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * cis).flatten(-2).type_as(x)

    return rotate(xq), rotate(xk)


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class Learnable2DInterpPosEmb(nn.Module):
    """A learned ``(H, W, D)`` position grid, bicubically interpolated (in the
    weight dtype, ``align_corners=False``) to each image's ``h×w``; the grid
    itself for an image of exactly ``H×W``."""

    def __init__(self, height: int, width: int, dim: int) -> None:
        super().__init__()
        self.height, self.width = height, width
        self.interpolation_mode = "bicubic"
        self.weight = nn.Parameter(torch.empty(height, width, dim))

    def get_pos_embeds(self, grid_hws: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``(Σ h·w, D)`` row-major per image, images in order."""
        parts = []
        for h, w in grid_hws:
            if (h, w) == (self.height, self.width):
                parts.append(self.weight.flatten(end_dim=1))
                continue
            grid = F.interpolate(
                self.weight.permute(2, 0, 1).unsqueeze(0),
                size=(h, w),
                mode=self.interpolation_mode,
            )
            parts.append(grid.squeeze(0).permute(1, 2, 0).flatten(end_dim=1))
        if not parts:
            return self.weight.new_zeros((0, self.weight.shape[-1]))
        return torch.cat(parts)


class MoonVisionPatchEmbed(nn.Module):
    """``(N, 3, p, p)`` patches → ``(N, D)`` (a biased Conv2d with stride =
    kernel, one matmul with the flattened kernel) plus position embeddings."""

    def __init__(self, config: MoonViTConfig) -> None:
        super().__init__()
        p = config.patch_size
        self.patch_size = (p, p)
        self.proj = nn.Conv2d(3, config.hidden_size, kernel_size=p, stride=p)
        self.pos_emb = Learnable2DInterpPosEmb(
            config.init_pos_emb_height, config.init_pos_emb_width, config.hidden_size
        )

    def forward(self, x: torch.Tensor, pos_embeds: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight
        if x.dim() != 4 or x.shape[1:] != weight.shape[1:]:
            raise ValueError(
                f"patches must be (N, {', '.join(map(str, weight.shape[1:]))}), "
                f"got {tuple(x.shape)}"
            )
        embedded = F.linear(
            x.reshape(x.shape[0], -1),
            weight.reshape(weight.shape[0], -1),
            self.proj.bias,
        )
        return embedded + pos_embeds


class Rope2DPosEmb(nn.Module):
    """vLLM's 2-D RoPE table: entry ``(r, c)`` holds, for frequency ``i <
    dim / 4`` with ``f_i = theta^(-4i / dim)``, ``cis(c·f_i)`` at column
    ``2i`` and ``cis(r·f_i)`` at column ``2i + 1`` (columns first, as the
    code has it; vLLM's docstring names the axes the other way round)."""

    def __init__(self, dim: int, max_height: int, max_width: int, theta: float):
        super().__init__()
        self.dim, self.max_height, self.max_width = dim, max_height, max_width
        self.theta_base = theta
        self._tables: dict[torch.device, torch.Tensor] = {}

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, max_height={self.max_height}, "
            f"max_width={self.max_width}, theta_base={self.theta_base}"
        )

    def precomputed_freqs_cis(self, device: torch.device | str) -> torch.Tensor:
        """``(max_height, max_width, dim / 2)`` complex64 on ``device``
        (see :func:`rope_2d_table`), copied there once."""
        device = torch.device(device)
        table = self._tables.get(device)
        if table is None:
            table = rope_2d_table(
                self.dim, self.max_height, self.max_width, self.theta_base
            )
            table = self._tables[device] = table.to(device)
        return table

    def get_freqs_cis_by_seqlens_list(
        self, grid_hws: Sequence[tuple[int, int]], device: torch.device | str
    ) -> torch.Tensor:
        """``(Σ h·w, dim / 2)`` complex64, row-major per image."""
        too_big = [
            (h, w)
            for h, w in grid_hws
            if not (1 <= h <= self.max_height and 1 <= w <= self.max_width)
        ]
        if too_big:
            raise ValueError(
                f"grids {too_big} exceed the {self.max_height}×{self.max_width} "
                "RoPE grid"
            )
        table = self.precomputed_freqs_cis(device)
        if not grid_hws:
            return table.new_zeros((0, self.dim // 2))
        return torch.cat(
            [table[:h, :w].reshape(-1, self.dim // 2) for h, w in grid_hws]
        )


class MoonVitMLP(nn.Module):
    def __init__(self, config: MoonViTConfig) -> None:
        super().__init__()
        self.fc0 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc1 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation = activation("gelu_pytorch_tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(self.activation(self.fc0(x)))


class MoonVitEncoderLayer(nn.Module):
    """``x + wo(attn(rope(wqkv(norm0(x)))))``, then ``x + mlp(norm1(x))``."""

    def __init__(
        self, config: MoonViTConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.norm0 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.norm1 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.mlp = MoonVitMLP(config)
        self.wqkv = nn.Linear(dim, 3 * dim)
        self.wo = nn.Linear(dim, dim)
        self.attn = VarlenAttention(self.num_heads, self.head_dim, attn_backend)

    def forward(
        self,
        x: torch.Tensor,
        attn_metadata: VarlenAttentionMetadata,
        rope_freqs_cis: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.wqkv(self.norm0(x)).reshape(n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)
        q, k = apply_rope(q, k, rope_freqs_cis)
        x = x + self.wo(self.attn(q, k, v, attn_metadata).reshape(n, -1))
        return x + self.mlp(self.norm1(x))


class MoonVitEncoder(nn.Module):
    def __init__(
        self, config: MoonViTConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.rope_2d = Rope2DPosEmb(config.head_dim, ROPE_GRID, ROPE_GRID, ROPE_THETA)
        self.blocks = nn.ModuleList(
            MoonVitEncoderLayer(config, attn_backend)
            for _ in range(config.num_hidden_layers)
        )
        self.final_layernorm = nn.LayerNorm(config.hidden_size, eps=LAYER_NORM_EPS)

    def forward(
        self,
        x: torch.Tensor,
        *,
        cu_seqlens: torch.Tensor,
        rope_freqs_cis: torch.Tensor,
        max_seqlen: torch.Tensor,
    ) -> torch.Tensor:
        # Built once for all blocks, as vLLM builds its attention metadata.
        attn_metadata = VarlenAttentionMetadata(cu_seqlens, max_seqlen)
        for block in self.blocks:
            x = block(x, attn_metadata, rope_freqs_cis)
        return self.final_layernorm(x)


class MoonVitPretrainedModel(nn.Module):
    """Patch embed → encoder → patch merger: ``(N, 3, p, p)`` →
    ``(N / (kh·kw), kh·kw, D)``."""

    def __init__(
        self,
        config: MoonViTConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.merge_kernel_size = tuple(config.merge_kernel_size)
        self.hidden_size = config.hidden_size
        self.patch_size = config.patch_size
        self.patch_embed = MoonVisionPatchEmbed(config)
        self.encoder = MoonVitEncoder(config, attn_backend)
        self._attn_backend = attn_backend

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embed.proj.weight.device

    @property
    def attn_backend(self) -> AttentionBackendEnum:
        """The blocks' attention backend; setting it switches every block."""
        return self._attn_backend

    @attn_backend.setter
    def attn_backend(self, backend: AttentionBackendEnum) -> None:
        self._attn_backend = backend
        for block in self.encoder.blocks:
            block.attn.attn_backend = backend

    def prepare_encoder_metadata(
        self,
        grid_hws_list: Grids,
        *,
        max_batch_size: int | None = None,
        max_seqlen_override: int | None = None,
        device: torch.device | str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Every grid-dependent input of the packed :meth:`forward`.

        Args:
            grid_hws_list: ``(h, w)`` patches per image.
            max_batch_size: pad ``cu_seqlens`` to this many sequences by
                repeating the last offset (zero-length sequences).
            max_seqlen_override: report this ``max_seqlen``. It is read on
                the host at kernel launch, so frozen into a captured graph.
            device: where the tensors go (default: the tower's).
        """
        device = torch.device(self.device if device is None else device)
        grids = grid_rows(grid_hws_list, 2)
        lengths = [h * w for h, w in grids]
        offsets = np.array([0, *itertools.accumulate(lengths)], dtype=np.int32)
        if max_batch_size is not None and len(lengths) < max_batch_size:
            tail = np.full(max_batch_size - len(lengths), offsets[-1], np.int32)
            offsets = np.concatenate([offsets, tail])
        if max_seqlen_override is not None:
            max_seqlen = int(max_seqlen_override)
        else:
            max_seqlen = max(lengths, default=0)
        gather = merge_gather_index(grids, self.merge_kernel_size)
        return {
            "pos_embeds": self.patch_embed.pos_emb.get_pos_embeds(grids).to(device),
            "rope_freqs_cis": self.encoder.rope_2d.get_freqs_cis_by_seqlens_list(
                grids, device
            ),
            "cu_seqlens": async_tensor_h2d(offsets, device),
            "max_seqlen": torch.tensor(max_seqlen, dtype=torch.int32),
            "merge_gather_idx": async_tensor_h2d(gather, device),
        }

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid_hw: Grids | None = None,
        *,
        encoder_metadata: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """With ``encoder_metadata`` (the CUDA graph path): the packed
        ``(Σ, kh·kw, D)``, no host work, ``grid_hw`` unused. Without it
        (vLLM's legacy path): one tensor per image of ``grid_hw``."""
        if encoder_metadata is not None:
            return self._packed(pixel_values, encoder_metadata)
        if grid_hw is None:
            raise ValueError("need grid_hw or encoder_metadata")
        grids = grid_rows(grid_hw, 2)
        packed = self._packed(pixel_values, self.prepare_encoder_metadata(grids))
        kh, kw = self.merge_kernel_size
        return list(packed.split([(h // kh) * (w // kw) for h, w in grids]))

    def _packed(
        self, pixel_values: torch.Tensor, meta: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        x = self.patch_embed(pixel_values.to(self.device), meta["pos_embeds"])
        x = self.encoder(
            x,
            cu_seqlens=meta["cu_seqlens"],
            rope_freqs_cis=meta["rope_freqs_cis"],
            max_seqlen=meta["max_seqlen"],
        )
        kh, kw = self.merge_kernel_size
        return x.index_select(0, meta["merge_gather_idx"]).view(
            -1, kh * kw, x.shape[-1]
        )


class KimiVLMultiModalProjector(nn.Module):
    """``pre_norm`` over D, the kh·kw rows of a block concatenated, then
    ``linear_1`` (→ same width) → GELU → ``linear_2`` (→ text width)."""

    def __init__(self, config: KimiVLConfig) -> None:
        super().__init__()
        vision = config.vision_config
        self.hidden_size = vision.hidden_size * math.prod(vision.merge_kernel_size)
        self.pre_norm = nn.LayerNorm(vision.hidden_size, eps=LAYER_NORM_EPS)
        self.linear_1 = nn.Linear(self.hidden_size, self.hidden_size)
        self.linear_2 = nn.Linear(self.hidden_size, config.text_config.hidden_size)
        self.act = activation("gelu")

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        x = self.pre_norm(image_features).view(-1, self.hidden_size)
        return self.linear_2(self.act(self.linear_1(x)))


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class KimiVLVisionHost(nn.Module):
    """The vision half of vLLM's ``KimiVLForConditionalGeneration``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`), so host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: KimiVLConfig,
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
        self.hidden_size = config.text_config.hidden_size
        self.vision_tower = MoonVitPretrainedModel(config.vision_config, attn_backend)
        self.multi_modal_projector = KimiVLMultiModalProjector(config)

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`), tower first, then projector."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vision_tower,
            generator,
            residual_branch_outputs=("wo", "mlp.fc1"),
            num_residual_branches=2 * self.config.vision_config.num_hidden_layers,
        )
        init_reference_weights_(
            self.multi_modal_projector,
            generator,
            residual_branch_outputs=(),
            num_residual_branches=1,
        )

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        self.vision_tower.to(dtype=dtype)
        self.multi_modal_projector.to(dtype=dtype)

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each image's ``(h·w / (kh·kw), text)`` embeddings in
        item order, one tower and projector call per image."""
        pixel_values = mm_kwargs["pixel_values"]
        grids = grid_rows(mm_kwargs["image_grid_hws"], 2)
        needed = sum(h * w for h, w in grids)
        if needed != pixel_values.shape[0]:
            raise ValueError(
                f"pixel values have {pixel_values.shape[0]} patches, grids need "
                f"{needed}"
            )
        out: list[torch.Tensor] = []
        offset = 0
        for h, w in grids:
            (features,) = self.vision_tower(
                pixel_values[offset : offset + h * w], [(h, w)]
            )
            out.append(self.multi_modal_projector(features))
            offset += h * w
        return out
