"""DeepSeek-V4.1 vision tower (ViT + aligner) and its host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``vllm/models/deepseek_v4/common/vision.py`` and of the vision half of
``DeepseekV41ForCausalLM``, so that generated encoder CUDA graph mixins can
run on a GPU without vLLM. Every attribute path and call signature the
DeepSeek-V4.1 mixin uses exists here with the same meaning:

* host: ``vision``, ``aligner``, ``config``, ``multimodal_config`` and the
  fp32 delimiter parameters ``image_start``, ``image_newline``, ``image_end``;
* ``vision.forward(patches, n_vit_h, n_vit_w)`` (one image, dense) and
  ``vision.forward_packed(patches, cos, sin, cu_seqlens, max_seqlen)``
  (varlen, capturable), ``vision.rope_dim``, ``vision.rope_theta``,
  ``vision.blocks[i].attn.attn.attn_backend``;
* ``aligner.forward(x, n_vit_h, n_vit_w)``, ``aligner.forward_packed(x,
  merge_idx, merge_mask)``, ``aligner.w1``, ``aligner.w2``,
  ``aligner.downsample_ratio``, ``aligner.out_dim``;
* :func:`build_packed_vit_metadata`, :func:`build_packed_merge_metadata`,
  :func:`run_dp_sharded_vision_tower`, and the span roles ``IMAGE_START``,
  ``IMAGE``, ``IMAGE_NEW_LINE``, ``IMAGE_END``.

Architecture (``MODELS.md`` section 1): patches ``(h·w, 3, p, p)`` in
row-major grid order → Linear(3p² → D) → pre-norm blocks (RMSNorm,
attention with 2-D RoPE, SiLU-gated MLP) → RMSNorm → aligner (zero-pad to
multiples of r, r×r blocks in ``F.unfold`` order, Linear → GELU → Linear to
the text width). An image becomes the span ``[START] + ([IMAGE]·lw +
[NEW_LINE])·lh + [END]`` with ``(lh, lw) = (ceil(h/r), ceil(w/r))``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from encoder_cudagraph_runtime.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
)
from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d
from encoder_cudagraph_runtime.load_balance import get_load_balance_assignment
from reference_towers._layers import (
    ReleasedSizes,
    VarlenAttention,
    VarlenAttentionMetadata,
    grid_rows,
    init_reference_weights_,
)
from reference_towers.rope_tables import AngleTable, GridIndexCache, concat_on_device

__all__ = [
    "IMAGE",
    "IMAGE_END",
    "IMAGE_NEW_LINE",
    "IMAGE_START",
    "IMAGE_TOKEN_ID",
    "DeepseekV41Config",
    "DeepseekV41VisionHost",
    "DeepseekV4Aligner",
    "DeepseekV4ViT",
    "apply_rotary",
    "build_image_span_types",
    "build_packed_merge_metadata",
    "build_packed_vit_metadata",
    "cached_vision_cos_sin",
    "image_span_length",
    "llm_grid",
    "run_dp_sharded_vision_tower",
    "vision_cos_sin",
]

# Span roles of DeepSeek-V4.1 (``deepseek_v41/common/mm_preprocess.py``).
# DeepSeek-V4's own preprocessing numbers them differently; not used here.
IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END = range(4)

# The token id every image-span position carries in ``input_ids``.
IMAGE_TOKEN_ID = 129264

Grids = Sequence[Sequence[int]] | torch.Tensor


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DeepseekV41Config(ReleasedSizes):
    """The fields of vLLM's flattened ``DeepseekV41Config`` the tower reads.

    Names follow vLLM (``vision_*`` for the tower, text fields as they are);
    defaults are the ``full`` values (see :meth:`full`).
    """

    vision_dim: int = 1024
    vision_n_heads: int = 16
    vision_inter_dim: int = 2816
    vision_patch_size: int = 14
    vision_rope_theta: float = 10000.0
    vision_downsample_ratio: int = 3
    vision_n_layers: int = 24
    vision_max_n_token: int = 1024
    """Largest span one image may take (the processor shrinks larger ones)."""
    hidden_size: int = 5120
    """Width of the text model, and so of the aligner output and delimiters."""

    def __post_init__(self) -> None:
        problems = [
            f"{f.name} must be positive, got {getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) <= 0
        ]
        if self.vision_dim % self.vision_n_heads:
            problems.append(
                f"vision_dim {self.vision_dim} is not a multiple of "
                f"vision_n_heads {self.vision_n_heads}"
            )
        elif (self.vision_dim // self.vision_n_heads) % 4:
            # rope_dim = head_dim / 2 angles split into a row and a column half.
            problems.append(
                f"head dim {self.vision_dim // self.vision_n_heads} must be a "
                "multiple of 4 for the 2-D RoPE"
            )
        if self.vision_max_n_token < 4:
            problems.append("vision_max_n_token must be >= 4 (the 1x1 span)")
        if problems:
            raise ValueError("invalid DeepseekV41Config: " + "; ".join(problems))

    @property
    def vision_layers(self) -> int:
        """Alias of :attr:`vision_n_layers` (vLLM's name)."""
        return self.vision_n_layers

    @property
    def vision_head_dim(self) -> int:
        return self.vision_dim // self.vision_n_heads

    @classmethod
    def tiny(cls) -> DeepseekV41Config:
        """A tower that runs in milliseconds on a CPU.

        Patch size, merge ratio and RoPE base stay at the released values, so
        grid geometry is the real one; the span cap is lowered so that random
        items stay small.
        """
        return cls(
            vision_dim=64,
            vision_n_heads=2,
            vision_inter_dim=128,
            vision_n_layers=2,
            vision_max_n_token=64,
            hidden_size=96,
        )

    @classmethod
    def full(cls) -> DeepseekV41Config:
        """The released model's tower dimensions.

        Vision defaults of vLLM's ``DeepseekV41Config``; the text width 5120
        is DeepSeek-V4.1's (vLLM's V4.1 kernels hard-code it). The vision
        layer count comes from the checkpoint and is not in vLLM's sources:
        24 is an assumption.
        """
        return cls()


# ---------------------------------------------------------------------------
# 2-D RoPE
# ---------------------------------------------------------------------------


def vision_cos_sin(
    n_h: int, n_w: int, rope_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables of an ``n_h × n_w`` patch grid, uncached.

    ``inv_freq[j] = theta^(-2j / rope_dim)`` for ``j < rope_dim / 2``; patch
    ``(i, j)`` (row-major row ``i·n_w + j``) gets the angles
    ``[i·inv_freq, j·inv_freq]``, row half first.

    Returns:
        ``cos``, ``sin``: ``(n_h·n_w, 1, rope_dim)`` fp32 on the CPU (the
        singleton axis broadcasts over heads).
    """
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim)
    )
    rows = torch.arange(n_h, dtype=torch.float32).repeat_interleave(n_w)
    cols = torch.arange(n_w, dtype=torch.float32).repeat(n_h)
    angles = torch.cat([rows[:, None] * inv_freq, cols[:, None] * inv_freq], dim=1)
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


@functools.lru_cache(maxsize=32)
def cached_vision_cos_sin(
    n_h: int, n_w: int, rope_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`vision_cos_sin` behind an LRU cache (real grids repeat a lot).

    The returned tensors are shared between callers: never modify them.
    """
    return vision_cos_sin(n_h, n_w, rope_dim, theta)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the whole head, in fp32.

    ``x`` is ``(rows, heads, head_dim)`` and ``cos``/``sin`` are ``(rows, 1,
    head_dim / 2)``: pair ``(x[c], x[c + head_dim/2])`` turns by angle ``c``.
    With the table layout of :func:`vision_cos_sin`, head dims ``[0, hd/4)``
    and ``[hd/2, 3hd/4)`` turn with the patch row, the others with its column.
    """
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


# ---------------------------------------------------------------------------
# ViT
# ---------------------------------------------------------------------------


class DeepseekV4RMSNorm(nn.Module):
    """RMSNorm with its math in fp32 whatever the activation dtype.

    The weight is created in fp32; a module-wide ``.to(dtype)`` casts it, as
    vLLM's host does with ``self.vision.to(dtype=model_config.dtype)``.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)


class DeepseekV4PatchEmbed(nn.Module):
    def __init__(self, config: DeepseekV41Config) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * config.vision_patch_size**2, config.vision_dim)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        if patches.dtype != self.proj.weight.dtype:
            # vLLM's linear layer would fail the same way; say what to do.
            raise TypeError(
                f"patches are {patches.dtype} but the ViT is "
                f"{self.proj.weight.dtype}: cast them to "
                "aligner.w1.weight.dtype first, as the host does"
            )
        return self.proj(patches.flatten(1))


class DeepseekV4VisionAttention(nn.Module):
    def __init__(
        self, config: DeepseekV41Config, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.n_heads = config.vision_n_heads
        self.head_dim = config.vision_head_dim
        dim = config.vision_dim
        self.wqkv = nn.Linear(dim, 3 * dim)
        self.wo = nn.Linear(dim, dim)
        # ``attn.attn.attn_backend`` is the path the mixin's guard reads.
        self.attn = VarlenAttention(self.n_heads, self.head_dim, attn_backend)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cu_seqlens: torch.Tensor | VarlenAttentionMetadata | None = None,
        max_seqlen: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = (
            t.reshape(n, self.n_heads, self.head_dim)
            for t in self.wqkv(x).chunk(3, dim=-1)
        )
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out = self.attn(q, k, v, cu_seqlens, max_seqlen)
        return self.wo(out.reshape(n, -1))


class DeepseekV4VisionMLP(nn.Module):
    def __init__(self, config: DeepseekV41Config) -> None:
        super().__init__()
        # One fused projection: [gate | up] (vLLM's MergedColumnParallelLinear).
        self.w1 = nn.Linear(config.vision_dim, 2 * config.vision_inter_dim, bias=False)
        self.w2 = nn.Linear(config.vision_inter_dim, config.vision_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w1(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class DeepseekV4VisionBlock(nn.Module):
    def __init__(
        self, config: DeepseekV41Config, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.norm1 = DeepseekV4RMSNorm(config.vision_dim)
        self.attn = DeepseekV4VisionAttention(config, attn_backend)
        self.norm2 = DeepseekV4RMSNorm(config.vision_dim)
        self.mlp = DeepseekV4VisionMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cu_seqlens: torch.Tensor | VarlenAttentionMetadata | None = None,
        max_seqlen: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens, max_seqlen)
        return x + self.mlp(self.norm2(x))


class DeepseekV4ViT(nn.Module):
    """The ViT: bidirectional attention within each image, 2-D RoPE."""

    def __init__(
        self,
        config: DeepseekV41Config,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.rope_dim = config.vision_head_dim // 2
        self.rope_theta = config.vision_rope_theta
        self.patch_size = config.vision_patch_size
        self.patch_embed = DeepseekV4PatchEmbed(config)
        self.blocks = nn.ModuleList(
            DeepseekV4VisionBlock(config, attn_backend)
            for _ in range(config.vision_n_layers)
        )
        self.norm = DeepseekV4RMSNorm(config.vision_dim)

    def forward(
        self, patches: torch.Tensor, n_vit_h: int, n_vit_w: int
    ) -> torch.Tensor:
        """One image, dense: ``(h·w, 3, p, p)`` patches → ``(h·w, D)``."""
        if patches.shape[0] != n_vit_h * n_vit_w:
            raise ValueError(
                f"{patches.shape[0]} patches for a {n_vit_h}x{n_vit_w} grid"
            )
        x = self.patch_embed(patches)
        cos, sin = cached_vision_cos_sin(
            n_vit_h, n_vit_w, self.rope_dim, self.rope_theta
        )
        cos, sin = async_tensor_h2d(cos, x.device), async_tensor_h2d(sin, x.device)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)

    def forward_packed(
        self,
        patches: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
    ) -> torch.Tensor:
        """Several images packed along rows (the CUDA graph path).

        Metadata comes from :func:`build_packed_vit_metadata`. Nothing here
        reads a device tensor on the host (``max_seqlen`` lives on the CPU),
        so the call can be captured; rows past ``cu_seqlens[-1]`` belong to
        no sequence and must not be relied on.
        """
        if cos.shape[0] != patches.shape[0] or sin.shape[0] != patches.shape[0]:
            raise ValueError(
                f"RoPE tables have {cos.shape[0]}/{sin.shape[0]} rows for "
                f"{patches.shape[0]} patches"
            )
        x = self.patch_embed(patches)
        # Built once for all blocks, as vLLM builds its attention metadata.
        attn_metadata = VarlenAttentionMetadata(cu_seqlens, max_seqlen)
        for block in self.blocks:
            x = block(x, cos, sin, attn_metadata)
        return self.norm(x)


# ---------------------------------------------------------------------------
# Aligner
# ---------------------------------------------------------------------------


def llm_grid(n_vit_h: int, n_vit_w: int, downsample_ratio: int) -> tuple[int, int]:
    """Aligner grid ``(ceil(h/r), ceil(w/r))`` of a ViT grid."""
    r = downsample_ratio
    return -(-n_vit_h // r), -(-n_vit_w // r)


class DeepseekV4Aligner(nn.Module):
    """r×r spatial merge followed by a two-layer GELU projector."""

    def __init__(self, config: DeepseekV41Config) -> None:
        super().__init__()
        self.downsample_ratio = config.vision_downsample_ratio
        self.out_dim = config.hidden_size
        in_dim = config.vision_dim * self.downsample_ratio**2
        self.w1 = nn.Linear(in_dim, config.hidden_size)
        self.w2 = nn.Linear(config.hidden_size, config.hidden_size)

    def _project(self, merged: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(merged)))

    def forward(self, x: torch.Tensor, n_vit_h: int, n_vit_w: int) -> torch.Tensor:
        """One image: ``(h·w, D)`` ViT rows → ``(lh·lw, hidden)``.

        The map is zero-padded at the bottom and right to multiples of r, cut
        into r×r blocks in reading order, and each block is flattened
        channel-major (feature ``c·r² + di·r + dj``, the ``F.unfold`` order the
        checkpoint was trained with).
        """
        r = self.downsample_ratio
        grid = x.reshape(n_vit_h, n_vit_w, -1).permute(2, 0, 1)
        grid = F.pad(grid, (0, -n_vit_w % r, 0, -n_vit_h % r))
        merged = F.unfold(grid.unsqueeze(0), r, stride=r).squeeze(0).transpose(0, 1)
        return self._project(merged)

    def forward_packed(
        self, x: torch.Tensor, merge_idx: torch.Tensor, merge_mask: torch.Tensor
    ) -> torch.Tensor:
        """Packed form of :meth:`forward` (the CUDA graph path).

        ``merge_idx[row, di·r + dj]`` names the packed ViT row of block
        position ``(di, dj)`` and ``merge_mask`` zeroes the positions the
        eager path pads; see :func:`build_packed_merge_metadata`. A gather and
        a multiply replace pad + unfold, so the shapes are static.
        """
        rows, r2 = merge_idx.shape
        gathered = (x[merge_idx] * merge_mask).reshape(rows, r2, -1)
        # (row, block position, channel) -> channel-major, like F.unfold.
        merged = gathered.transpose(1, 2).reshape(rows, -1)
        return self._project(merged)


# ---------------------------------------------------------------------------
# Packed metadata
# ---------------------------------------------------------------------------


def build_packed_vit_metadata(
    grids: Grids,
    *,
    rope_dim: int,
    rope_theta: float,
    device: torch.device | str,
    max_seqlen_override: int | None = None,
    cached: bool = True,
) -> dict[str, torch.Tensor]:
    """Metadata of :meth:`DeepseekV4ViT.forward_packed` for images packed in
    the order of ``grids``.

    Args:
        grids: ``[n_vit_h, n_vit_w]`` per image.
        rope_dim, rope_theta: the ViT's (``vision.rope_dim``, ``.rope_theta``).
        device: where every tensor but ``max_seqlen`` goes.
        max_seqlen_override: the ``max_seqlen`` to report instead of the
            largest image. FlashAttention reads ``max_seqlen`` on the host at
            launch, so under graph capture its value is frozen into the
            graph: capture passes a worst case.
        cached: keep this batch's grids in the per-grid cache. Capture
            passes ``False`` so that its one-off dummy grids do not push real
            grids out of it.

    Returns:
        ``vit_cos``, ``vit_sin``: ``(Σ h·w, 1, rope_dim)`` fp32;
        ``cu_seqlens``: ``(len(grids) + 1,)`` int32 offsets;
        ``max_seqlen``: 0-dim int32 on the CPU.
    """
    grid_list = grid_rows(grids, 2)
    offsets = [0, *itertools.accumulate(n_h * n_w for n_h, n_w in grid_list)]
    if grid_list:
        # Gathered on the device from cached tables: the values of
        # vision_cos_sin without its host work or a host-to-device copy.
        positions = max(max(grid) for grid in grid_list)
        cos_table, sin_table = _vit_angle_table(rope_dim, rope_theta).cos_sin(
            positions, device, torch.float32
        )
        unique = {grid: _VIT_ROWS.get(grid, device, store=cached) for grid in grid_list}
        index = concat_on_device([unique[grid] for grid in grid_list])
        vit_cos = cos_table[index].reshape(-1, 1, rope_dim)
        vit_sin = sin_table[index].reshape(-1, 1, rope_dim)
    else:
        vit_cos = torch.zeros((0, 1, rope_dim), dtype=torch.float32, device=device)
        vit_sin = torch.zeros((0, 1, rope_dim), dtype=torch.float32, device=device)
    lengths = [b - a for a, b in itertools.pairwise(offsets)]
    max_seqlen = max(lengths, default=0)
    if max_seqlen_override is not None:
        max_seqlen = max_seqlen_override
    return {
        "vit_cos": vit_cos,
        "vit_sin": vit_sin,
        "cu_seqlens": async_tensor_h2d(offsets, device, dtype=torch.int32),
        # Read on the host when the kernel is launched: stays on the CPU.
        "max_seqlen": torch.tensor(max_seqlen, dtype=torch.int32),
    }


def image_merge_tables(
    n_h: int, n_w: int, downsample_ratio: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's :func:`build_packed_merge_metadata`, its ViT rows counted
    from 0: ``(lh·lw, r²)`` int64 indices and ``(lh·lw, r²)`` bool mask."""
    r = downsample_ratio
    di = torch.arange(r).repeat_interleave(r)  # block position -> row offset
    dj = torch.arange(r).repeat(r)  # block position -> column offset
    lh, lw = llm_grid(n_h, n_w, r)
    bi = torch.arange(lh).repeat_interleave(lw)
    bj = torch.arange(lw).repeat(lh)
    rows = bi[:, None] * r + di[None, :]
    cols = bj[:, None] * r + dj[None, :]
    mask = (rows < n_h) & (cols < n_w)
    index = rows.clamp(max=n_h - 1) * n_w + cols.clamp(max=n_w - 1)
    return index, mask


def vit_grid_rows(n_h: int, n_w: int) -> torch.Tensor:
    """``(n_h·n_w, 2)`` int64 ``(row, col)`` of every patch, row-major: the
    positions :func:`vision_cos_sin` turns into angles."""
    rows = torch.arange(n_h).repeat_interleave(n_w)
    cols = torch.arange(n_w).repeat(n_h)
    return torch.stack([rows, cols], dim=1)


@functools.lru_cache(maxsize=8)
def _vit_angle_table(rope_dim: int, theta: float) -> AngleTable:
    """Per-position cos/sin of :func:`vision_cos_sin` (same inverse
    frequencies), on the device."""

    def inv_freq() -> torch.Tensor:
        exponents = torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim
        return 1.0 / (theta**exponents)

    return AngleTable(inv_freq)


def _merge_tables(key: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
    n_h, n_w, r, dtype = key  # type: ignore[misc]
    index, mask = image_merge_tables(n_h, n_w, r)
    return index, mask.unsqueeze(-1).to(dtype)


# Per-grid device tensors of the packed metadata (positions for the RoPE
# gather; image-local merge indices and masks).
_VIT_ROWS = GridIndexCache(lambda grid: vit_grid_rows(*grid))  # type: ignore[misc]
_MERGE_TABLES = GridIndexCache(_merge_tables)


def build_packed_merge_metadata(
    grids: Grids,
    downsample_ratio: int,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """Gather indices and mask of :meth:`DeepseekV4Aligner.forward_packed`.

    For aligner row ``(bi, bj)`` of an image with grid ``(h, w)`` whose ViT
    rows start at ``offset``, block position ``(di, dj)`` reads row
    ``offset + min(bi·r+di, h−1)·w + min(bj·r+dj, w−1)``. Positions past the
    bottom/right edge, which the eager path zero-pads, are clamped to a row of
    the same image (any in-range row would do) and masked to 0.

    Returns:
        ``merge_idx``: ``(Σ lh·lw, r²)`` int64; ``merge_mask``:
        ``(Σ lh·lw, r², 1)`` in ``dtype`` (1 inside the image, 0 outside).
    """
    grid_list = grid_rows(grids, 2)
    r = downsample_ratio
    if not grid_list:
        return {
            "merge_idx": torch.zeros((0, r * r), dtype=torch.int64, device=device),
            "merge_mask": torch.zeros((0, r * r, 1), dtype=dtype, device=device),
        }
    # Each grid's image-local indices and mask are cached on the device; the
    # batch adds every image's first ViT row to its aligner rows there.
    unique = {grid: _MERGE_TABLES.get((*grid, r, dtype), device) for grid in grid_list}
    parts = [unique[grid] for grid in grid_list]
    # Fresh tensors (a concatenation, a sum), never the cached ones.
    merge_mask = torch.cat([mask for _, mask in parts])
    if len(parts) == 1:
        # One image starts at ViT row 0: its local indices are the batch's.
        merge_idx = parts[0][0].clone()
    else:
        local_idx = torch.cat([idx for idx, _ in parts])
        # Each aligner row's image start, spelled out on the host (NumPy:
        # microseconds) and sent in one copy.
        starts = np.fromiter(
            itertools.accumulate((h * w for h, w in grid_list[:-1]), initial=0),
            dtype=np.int64,
            count=len(grid_list),
        )
        counts = np.fromiter((idx.shape[0] for idx, _ in parts), dtype=np.int64)
        row_offsets = async_tensor_h2d(np.repeat(starts, counts), device)
        merge_idx = local_idx + row_offsets[:, None]
    return {"merge_idx": merge_idx, "merge_mask": merge_mask}


# ---------------------------------------------------------------------------
# Data-parallel eager path
# ---------------------------------------------------------------------------


def run_dp_sharded_vision_tower(
    vision_model: DeepseekV4ViT,
    aligner: DeepseekV4Aligner,
    patches: torch.Tensor,
    vit_grid: Grids,
) -> list[torch.Tensor]:
    """Encode images spread over the tensor-parallel ranks
    (``--mm-encoder-tp-mode data``).

    Every rank holds the whole tower and the whole batch. Images are
    balanced over ranks by patch count
    (:func:`~encoder_cudagraph_runtime.load_balance.get_load_balance_assignment`),
    each rank encodes its share image by image, and one all-gather
    exchanges the results. All-gather needs one shape on every rank, so each
    rank pads its rows to the largest rank's count, which every rank can
    compute from the grids alone.

    Returns:
        One ``(lh·lw, hidden)`` tensor per image, in the input order.
    """
    grids = grid_rows(vit_grid, 2)
    world = get_tensor_model_parallel_world_size()
    rank = get_tensor_model_parallel_rank()

    sizes = [h * w for h, w in grids]
    starts = [0, *itertools.accumulate(sizes)]
    order, counts, _ = get_load_balance_assignment(sizes, world)
    bounds = [0, *itertools.accumulate(counts)]
    images_of = [order[bounds[g] : bounds[g + 1]] for g in range(world)]

    r = aligner.downsample_ratio
    rows_of_image = [lh * lw for lh, lw in (llm_grid(h, w, r) for h, w in grids)]
    padded_rows = max(
        (sum(rows_of_image[i] for i in images) for images in images_of), default=0
    )

    local: list[torch.Tensor] = []
    for i in images_of[rank]:
        h, w = grids[i]
        local.append(
            aligner(vision_model(patches[starts[i] : starts[i + 1]], h, w), h, w)
        )
    embeds = torch.cat(local) if local else patches.new_zeros((0, aligner.out_dim))
    if embeds.shape[0] < padded_rows:
        pad = embeds.new_zeros((padded_rows - embeds.shape[0], embeds.shape[1]))
        embeds = torch.cat([embeds, pad])
    gathered = tensor_model_parallel_all_gather(embeds.contiguous(), dim=0)

    out: dict[int, torch.Tensor] = {}
    for g, images in enumerate(images_of):
        offset = g * padded_rows
        for i in images:
            out[i] = gathered[offset : offset + rows_of_image[i]]
            offset += rows_of_image[i]
    return [out[i] for i in range(len(grids))]


# ---------------------------------------------------------------------------
# Image spans
# ---------------------------------------------------------------------------


def image_span_length(n_llm_h: int, n_llm_w: int) -> int:
    """Tokens of one image's span: a row of ``lw`` images plus a newline per
    aligner row, and the start and end delimiters."""
    return n_llm_h * (n_llm_w + 1) + 2


def build_image_span_types(n_llm_h: int, n_llm_w: int) -> torch.Tensor:
    """Span roles in reading order: ``[START] + ([IMAGE]·lw + [NEW_LINE])·lh
    + [END]``, int64 (the processor's ``types`` for one image)."""
    row = [IMAGE] * n_llm_w + [IMAGE_NEW_LINE]
    return torch.tensor([IMAGE_START, *row * n_llm_h, IMAGE_END], dtype=torch.int64)


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class DeepseekV41VisionHost(nn.Module):
    """The vision half of vLLM's ``DeepseekV41ForCausalLM``.

    A generated mixin is mixed in front of this class (see
    :mod:`reference_towers.registry`), so host methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: DeepseekV41Config,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.vision = DeepseekV4ViT(config, attn_backend)
        self.aligner = DeepseekV4Aligner(config)
        # Learned delimiter embeddings; fp32 in the checkpoint and kept fp32
        # when the tower is cast (they are cast to the output dtype on use).
        hidden = config.hidden_size
        self.image_start = nn.Parameter(torch.zeros(hidden, dtype=torch.float32))
        self.image_newline = nn.Parameter(torch.zeros(hidden, dtype=torch.float32))
        self.image_end = nn.Parameter(torch.zeros(hidden, dtype=torch.float32))

    @property
    def reference_use_data_parallel(self) -> bool:
        """Whether images are sharded over ranks (``mm_encoder_tp_mode``)."""
        mm = self.multimodal_config
        return mm is not None and mm.mm_encoder_tp_mode == "data"

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`); the delimiters are unit-scale."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vision,
            generator,
            residual_branch_outputs=("attn.wo", "mlp.w2"),
            num_residual_branches=2 * self.config.vision_n_layers,
        )
        init_reference_weights_(
            self.aligner,
            generator,
            residual_branch_outputs=(),
            num_residual_branches=1,
        )
        # Unit-scale delimiters, comparable to the aligner rows around them.
        with torch.no_grad():
            for delimiter in (self.image_start, self.image_newline, self.image_end):
                delimiter.normal_(0.0, 1.0, generator=generator)

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        """Cast the ViT and aligner, not the delimiters (as vLLM's host)."""
        self.vision.to(dtype=dtype)
        self.aligner.to(dtype=dtype)

    def reference_encode_images(
        self, patches: torch.Tensor, vit_grid: Grids
    ) -> list[torch.Tensor]:
        """Aligner rows of each image, one dense tower call per image (or
        sharded over ranks in data-parallel mode), like vLLM's eager path."""
        grids = grid_rows(vit_grid, 2)
        patches = patches.to(self.aligner.w1.weight.dtype)
        if (
            self.reference_use_data_parallel
            and get_tensor_model_parallel_world_size() > 1
        ):
            return run_dp_sharded_vision_tower(
                self.vision, self.aligner, patches, grids
            )
        out: list[torch.Tensor] = []
        offset = 0
        for h, w in grids:
            image = patches[offset : offset + h * w]
            out.append(self.aligner(self.vision(image, h, w), h, w))
            offset += h * w
        return out

    def reference_build_span(
        self, image_rows: torch.Tensor, types: torch.Tensor
    ) -> torch.Tensor:
        """One image's span: aligner rows at IMAGE slots in reading order, the
        delimiters (cast to the rows' dtype) at the others."""
        types = types.to(image_rows.device)
        is_image = types == IMAGE
        if int(is_image.sum()) != image_rows.shape[0]:
            raise ValueError(
                f"span has {int(is_image.sum())} IMAGE slots for "
                f"{image_rows.shape[0]} aligner rows"
            )
        span = image_rows.new_empty((types.numel(), image_rows.shape[1]))
        span[is_image] = image_rows
        for role, vector in (
            (IMAGE_START, self.image_start),
            (IMAGE_NEW_LINE, self.image_newline),
            (IMAGE_END, self.image_end),
        ):
            span[types == role] = vector.to(image_rows.dtype)
        return span

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each image's final span embeddings
        ``(lh·(lw+1)+2, hidden)``, in item order, computed eagerly image by
        image."""
        vit_grid = grid_rows(mm_kwargs["vit_grid"], 2)
        llm = grid_rows(mm_kwargs["llm_grid"], 2)
        types = mm_kwargs["types"]
        rows = self.reference_encode_images(mm_kwargs["patches"], vit_grid)
        spans: list[torch.Tensor] = []
        offset = 0
        for image_rows, (lh, lw) in zip(rows, llm, strict=True):
            length = image_span_length(lh, lw)
            spans.append(
                self.reference_build_span(image_rows, types[offset : offset + length])
            )
            offset += length
        if offset != types.numel():
            raise ValueError(f"types has {types.numel()} entries, spans need {offset}")
        return spans
