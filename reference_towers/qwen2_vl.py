"""Qwen2-VL vision encoder and its host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``Qwen2VisionTransformer`` (``vllm/model_executor/models/qwen2_vl.py``):
patch embed (a Conv3d with stride = kernel, run as one matmul) → pre-norm ViT
blocks with a 2-D vision RoPE and per-frame varlen attention → patch merger
(LayerNorm, m×m rows concatenated, two-layer GELU MLP to the text width). The
host stands in for the vision half of ``Qwen2VLForConditionalGeneration``.

The attributes and signatures a mixin modelled on vLLM's Qwen2-VL mixin reads
exist with vLLM's meaning:

* host: ``visual``, ``multimodal_config``, ``get_max_frames_per_video()``;
* ``visual``: ``spatial_merge_size``, ``out_hidden_size`` (text width),
  ``dtype``, ``device`` (of the patch-embed weight), ``attn_backend``,
  ``input_norm.input_dtype`` (``None``: no fused normalisation),
  ``patch_embed.{proj.in_channels, patch_size, temporal_patch_size}``,
  ``prepare_encoder_metadata(grid_thw, *, max_batch_size=None,
  max_frames_per_batch=None, max_seqlen_override=None, device=None)`` and
  ``forward(x, grid_thw, *, encoder_metadata=None)`` → ``(N / m², text)``.

Input rows follow the Qwen2-VL processor: an item of ``(t, h, w)`` patches
(``t`` temporal patches of ``T`` frames each; images have ``t = 1``, their
one frame repeated ``T`` times) gives ``t·h·w`` rows ordered
(t, block-row, block-col, mh, mw), so that every m×m block is m² consecutive
rows, with features ordered (C, T, p, p).

Attention runs within each *frame* (``h·w`` rows), never across frames or
items: ``cu_seqlens`` has one sequence per temporal patch. The RoPE is 2-D
(row and column of the patch in its frame); the temporal index does not
enter the ViT.

Deliberate differences from vLLM, none visible to a mixin:

* ``max_seqlen`` is a 0-dim int32 CPU tensor for every backend. vLLM returns
  ``None`` (unless overridden) for backends other than FLASH_ATTN,
  ROCM_AITER_FA and TRITON_ATTN; those ignore it.
* ``input_norm`` is always the identity cast (vLLM's ``IdentityInputNorm``);
  the fused uint8 normalisation of ``mm_device_do_normalize`` is not modelled.
* RoPE tables are computed per call on the host and copied to the device,
  rather than gathered on the device from a cache of 8192 positions; the
  values are the same (fp32 products, cos/sin, then cast to the tower dtype
  as vLLM's cache is), and grids past 8192 patches a side are rejected as
  vLLM's cache would overflow.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d
from reference_towers._layers import (
    ReleasedSizes,
    VarlenAttention,
    VarlenAttentionMetadata,
    activation,
    grid_rows,
    init_reference_weights_,
)
from reference_towers.rope_tables import AngleTable, GridIndexCache, concat_on_device

__all__ = [
    "ROPE_MAX_POSITION",
    "Qwen2VLVisionHost",
    "Qwen2VisionConfig",
    "Qwen2VisionTransformer",
    "apply_vision_rotary",
    "frame_patch_positions",
    "frame_seqlens",
    "VisionRotaryTable",
    "vision_rotary_tables",
]

Grids = Sequence[Sequence[int]] | torch.Tensor

# vLLM builds the vision RoPE cache for this many positions per axis.
ROPE_MAX_POSITION = 8192


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen2VisionConfig(ReleasedSizes):
    """The checkpoint's ``vision_config`` plus the host-level values the
    tower and the registry read. Defaults are the ``full`` values (see
    :meth:`full`); field names follow Hugging Face's ``Qwen2VLVisionConfig``.
    """

    embed_dim: int = 1280
    depth: int = 32
    num_heads: int = 16
    mlp_ratio: float = 4.0
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    hidden_size: int = 3584
    """Output (text) width of the merger: the language model's hidden size."""
    hidden_act: str = "quick_gelu"
    """Activation of the block MLPs. vLLM hard-codes QuickGELU, which is the
    checkpoint's value; the merger always uses exact GELU."""
    norm_eps: float = 1e-6
    """LayerNorm eps of the blocks and the merger. vLLM passes the *text*
    config's ``rms_norm_eps`` (1e-6 for Qwen2-VL; 1e-6 also as fallback)."""
    rope_theta: float = 10000.0
    """Base of the vision RoPE (vLLM's ``get_rope`` default; not in the
    checkpoint)."""
    max_pixels: int = 12845056
    """Processor bound on resized pixels per frame (``longest_edge`` of the
    checkpoint's ``preprocessor_config.json``: 16384·28²)."""
    max_frames_per_video: int = 14
    """What :meth:`Qwen2VLVisionHost.get_max_frames_per_video` reports, and
    the cap on ``t`` of a legal video item (see there)."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if is_number and value <= 0:
                problems.append(f"{f.name} must be positive, got {value}")
        if self.embed_dim % self.num_heads:
            problems.append(
                f"embed_dim {self.embed_dim} is not a multiple of num_heads "
                f"{self.num_heads}"
            )
        elif (self.embed_dim // self.num_heads) % 4:
            problems.append(
                "head dim must be a multiple of 4 (half of it is rotated, "
                "split evenly between rows and columns)"
            )
        if int(self.embed_dim * self.mlp_ratio) <= 0:
            problems.append("mlp_ratio gives an empty MLP")
        activation(self.hidden_act)  # raises on unknown names
        if self.max_pixels < (self.patch_size * self.spatial_merge_size) ** 2:
            problems.append("max_pixels is below one m×m block of patches")
        if problems:
            raise ValueError("invalid Qwen2VisionConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        """``int(embed_dim · mlp_ratio)``, as vLLM's block computes it."""
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def patch_dim(self) -> int:
        """Features of one input row: C·T·p²."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merged_dim(self) -> int:
        """Merger input width: D·m²."""
        return self.embed_dim * self.spatial_merge_size**2

    @property
    def max_patches_per_frame(self) -> int:
        return self.max_pixels // self.patch_size**2

    @classmethod
    def tiny(cls) -> Qwen2VisionConfig:
        """A tower that runs in milliseconds on a CPU.

        Patch, temporal and merge sizes and channels stay at the released
        values so that input rows and grids have the real layout. Head dim 32
        gives 8 RoPE frequencies per axis; a text width (96) distinct from
        D·m² (256) catches swapped dimensions. The pixel bound is lowered to
        64 output tokens per frame, videos to 4 frames.
        """
        return cls(
            embed_dim=64,
            depth=2,
            num_heads=2,
            mlp_ratio=2.0,
            hidden_size=96,
            max_pixels=64 * (14 * 2) ** 2,
            max_frames_per_video=4,
        )

    @classmethod
    def full(cls) -> Qwen2VisionConfig:
        """Qwen2-VL-7B-Instruct's dimensions.

        Vision config (Hugging Face ``Qwen2VLVisionConfig`` defaults, which
        are the 7B checkpoint's): embed 1280, depth 32, 16 heads, MLP ratio 4
        (5120), QuickGELU, 3 channels, p = 14, T = 2, m = 2, text width 3584;
        LayerNorm eps 1e-6 (the text ``rms_norm_eps``); RoPE base 1e4;
        ``max_pixels`` 12845056 (the checkpoint's processor config; the
        transformers class default is 28²·1280); 14 frames per video (vLLM's
        ``_MAX_FRAMES_PER_VIDEO``, the most ``get_num_frames_with_most_features``
        reports).
        """
        return cls()


# ---------------------------------------------------------------------------
# Grid metadata: positions, RoPE tables, per-frame offsets
# ---------------------------------------------------------------------------


def frame_patch_positions(
    h: int, w: int, spatial_merge_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, col)`` of every patch of one ``h×w`` frame, in row order.

    Rows run over m×m blocks (block-row, block-col), then over the patches
    inside a block (mh, mw): the processor's order, which lets the merger
    take m² consecutive rows as one block.
    """
    m = spatial_merge_size
    if h % m or w % m:
        raise ValueError(f"frame {h}×{w} is not made of {m}×{m} blocks")
    index = torch.arange(h * w)
    band, in_band = index // (m * w), index % (m * w)
    block_col, in_block = in_band // (m * m), in_band % (m * m)
    rows = band * m + in_block // m
    cols = block_col * m + in_block % m
    return rows, cols


def rotary_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """The ``head_dim / 4`` inverse frequencies of each axis.

    vLLM's vision RoPE is a NeoX RoPE of ``rotary_dim = head_dim / 2``
    (``partial_rotary_factor`` 0.5), whose frequencies are
    ``theta^(-2i / rotary_dim)``; computed in fp32 exactly as it does.
    """
    rotary_dim = head_dim // 2
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim
    return 1.0 / (theta**exponents)


def vision_rotary_tables(
    grid_thw: Grids,
    *,
    head_dim: int,
    theta: float,
    spatial_merge_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)`` of shape ``(Σ t·h·w, head_dim / 2)`` on the CPU.

    Row ``r`` belongs to the patch at ``(row, col)`` of its frame; its columns
    are ``[angles of row (head_dim/4) | angles of col (head_dim/4)]`` with
    angle ``position · inv_freq``. Every frame of an item repeats the same
    table (no temporal position).
    """
    inv_freq = rotary_inv_freq(head_dim, theta)
    per_item: list[torch.Tensor] = []
    for t, h, w in grid_rows(grid_thw, 3):
        if max(h, w) > ROPE_MAX_POSITION:
            raise ValueError(
                f"grid {h}×{w} exceeds the {ROPE_MAX_POSITION} positions of "
                "the vision RoPE cache"
            )
        rows, cols = frame_patch_positions(h, w, spatial_merge_size)
        angles = torch.cat(
            [rows.float()[:, None] * inv_freq, cols.float()[:, None] * inv_freq],
            dim=1,
        )
        per_item.append(angles.repeat(t, 1))
    if per_item:
        angles = torch.cat(per_item)
    else:
        angles = torch.zeros((0, head_dim // 2))
    return angles.cos(), angles.sin()


def rotary_rows(t: int, h: int, w: int, spatial_merge_size: int) -> torch.Tensor:
    """``(t·h·w, 2)`` int64 ``(row, col)`` of every patch of one item, frames
    repeated: the positions :func:`vision_rotary_tables` turns into angles."""
    rows, cols = frame_patch_positions(h, w, spatial_merge_size)
    return torch.stack([rows, cols], dim=1).repeat(t, 1)


class VisionRotaryTable:
    """:func:`vision_rotary_tables` as a device gather, in the tower dtype.

    vLLM keeps the vision RoPE cos/sin per position on the device and
    gathers rows by ``(row, col)``; here the per-position table is an
    :class:`AngleTable` (the values of :func:`vision_rotary_tables`) and
    every grid's positions are cached on the device (:class:`GridIndexCache`),
    so a batch costs one concatenation and two gathers, no host math.
    """

    def __init__(self, head_dim: int, theta: float, spatial_merge_size: int) -> None:
        self.head_dim = head_dim
        self._angles = AngleTable(lambda: rotary_inv_freq(head_dim, theta))
        self._rows = GridIndexCache(
            lambda grid: rotary_rows(*grid, spatial_merge_size)  # type: ignore[misc]
        )

    def cos_sin(
        self,
        grids: Sequence[tuple[int, int, int]],
        device: torch.device,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Σ t·h·w, head_dim / 2)`` cos/sin of ``grids`` on ``device``."""
        if not grids:
            empty = torch.zeros((0, self.head_dim // 2), dtype=dtype, device=device)
            return empty, empty.clone()
        positions = max(max(h, w) for _, h, w in grids)
        if positions > ROPE_MAX_POSITION:
            raise ValueError(
                f"grid side {positions} exceeds the {ROPE_MAX_POSITION} positions "
                "of the vision RoPE cache"
            )
        cos_table, sin_table = self._angles.cos_sin(positions, device, dtype)
        unique = {grid: self._rows.get(grid, device) for grid in grids}
        index = concat_on_device([unique[grid] for grid in grids])
        rows = index.shape[0]
        return (
            cos_table[index].reshape(rows, -1),
            sin_table[index].reshape(rows, -1),
        )


def apply_vision_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """NeoX rotation of ``x`` ``(rows, heads, head_dim)`` by ``(rows,
    head_dim / 2)`` tables: dims ``i`` and ``i + head_dim/2`` form a pair
    turned by angle column ``i``; computed in ``x``'s dtype as vLLM's native
    ``ApplyRotaryEmb`` does."""
    half = x.shape[-1] // 2
    if cos.shape[-1] != half:
        raise ValueError(
            f"rotary tables have {cos.shape[-1]} columns, head dim {x.shape[-1]} "
            f"needs {half}"
        )
    cos = cos[:, None, :].to(x.dtype)
    sin = sin[:, None, :].to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, second * cos + first * sin), -1)


def frame_seqlens(grid_thw: Grids) -> list[int]:
    """One attention sequence per temporal patch: ``h·w`` rows, ``t`` times."""
    return [h * w for t, h, w in grid_rows(grid_thw, 3) for _ in range(t)]


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class Qwen2VisionInputNorm(nn.Module):
    """vLLM's ``IdentityInputNorm``: casts pixels to the tower dtype.

    ``input_dtype`` is ``None``: the mixin allocates capture pixels in the
    tower dtype (it would be uint8 with fused on-device normalisation).
    """

    @property
    def input_dtype(self) -> torch.dtype | None:
        return None

    def forward(
        self, pixel_values: torch.Tensor, visual_dtype: torch.dtype
    ) -> torch.Tensor:
        return pixel_values.to(visual_dtype, copy=False)


class Qwen2VisionPatchEmbed(nn.Module):
    """``(N, C·T·p²)`` rows → ``(N, D)``: a bias-free Conv3d whose kernel and
    stride are ``(T, p, p)``, i.e. one matmul with the flattened kernel."""

    def __init__(self, config: Qwen2VisionConfig) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.temporal_patch_size = config.temporal_patch_size
        self.embed_dim = config.embed_dim
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(
            config.in_channels,
            config.embed_dim,
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


class Qwen2VisionAttention(nn.Module):
    """Fused biased qkv → 2-D RoPE on q, k → varlen attention → biased proj."""

    def __init__(
        self, config: Qwen2VisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        dim = config.embed_dim
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn = VarlenAttention(self.num_heads, self.head_dim, attn_backend)

    def forward(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor | VarlenAttentionMetadata,
        rotary_pos_emb_cos: torch.Tensor,
        rotary_pos_emb_sin: torch.Tensor,
        max_seqlen: torch.Tensor | int | None,
    ) -> torch.Tensor:
        n = x.shape[0]
        # The fused weight is [q; k; v], each head-major.
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, self.head_dim).unbind(1)
        q = apply_vision_rotary(q, rotary_pos_emb_cos, rotary_pos_emb_sin)
        k = apply_vision_rotary(k, rotary_pos_emb_cos, rotary_pos_emb_sin)
        out = self.attn(q, k, v, cu_seqlens, max_seqlen)
        return self.proj(out.reshape(n, -1))


class Qwen2VisionMLP(nn.Module):
    def __init__(self, config: Qwen2VisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.embed_dim, config.mlp_hidden_dim)
        self.act = activation(config.hidden_act)
        self.fc2 = nn.Linear(config.mlp_hidden_dim, config.embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Qwen2VisionBlock(nn.Module):
    """Pre-norm block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(
        self, config: Qwen2VisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.embed_dim, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(config.embed_dim, eps=config.norm_eps)
        self.attn = Qwen2VisionAttention(config, attn_backend)
        self.mlp = Qwen2VisionMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor | VarlenAttentionMetadata,
        rotary_pos_emb_cos: torch.Tensor,
        rotary_pos_emb_sin: torch.Tensor,
        max_seqlen: torch.Tensor | int | None,
    ) -> torch.Tensor:
        x = x + self.attn(
            self.norm1(x),
            cu_seqlens,
            rotary_pos_emb_cos,
            rotary_pos_emb_sin,
            max_seqlen,
        )
        return x + self.mlp(self.norm2(x))


class Qwen2VisionPatchMerger(nn.Module):
    """``ln_q`` over D, each m² consecutive rows concatenated (one m×m
    block), then ``mlp``: Linear(D·m², D·m²) → GELU → Linear(D·m², text).
    The ``ModuleList`` keeps vLLM's parameter names (``mlp.0``, ``mlp.2``)."""

    def __init__(self, config: Qwen2VisionConfig) -> None:
        super().__init__()
        self.group = config.spatial_merge_size**2
        self.hidden_size = config.merged_dim
        self.ln_q = nn.LayerNorm(config.embed_dim, eps=config.norm_eps)
        self.mlp = nn.ModuleList(
            [
                nn.Linear(self.hidden_size, self.hidden_size),
                nn.GELU(),
                nn.Linear(self.hidden_size, config.hidden_size),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] % self.group:
            raise ValueError(
                f"{x.shape[0]} rows do not split into blocks of {self.group}"
            )
        x = self.ln_q(x).reshape(-1, self.hidden_size)
        for layer in self.mlp:
            x = layer(x)
        return x


class Qwen2VisionTransformer(nn.Module):
    """Patch embed → blocks → merger: ``(N, C·T·p²)`` → ``(N / m², text)``."""

    def __init__(
        self,
        config: Qwen2VisionConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.spatial_merge_size = config.spatial_merge_size
        self.out_hidden_size = config.hidden_size
        self.num_heads = config.num_heads
        self.embed_dim = config.embed_dim
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        self.rotary_table = VisionRotaryTable(
            self.head_dim, self.rope_theta, self.spatial_merge_size
        )
        self.patch_embed = Qwen2VisionPatchEmbed(config)
        self.input_norm = Qwen2VisionInputNorm()
        self.blocks = nn.ModuleList(
            Qwen2VisionBlock(config, attn_backend) for _ in range(config.depth)
        )
        self.merger = Qwen2VisionPatchMerger(config)
        self._attn_backend = attn_backend

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the patch-embed weight (follows ``.to(dtype)``)."""
        return self.patch_embed.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embed.proj.weight.device

    @property
    def attn_backend(self) -> AttentionBackendEnum:
        """The ViT attention backend (what the mixin's guard reads).

        Setting it switches every block, so metadata and kernels agree.
        """
        return self._attn_backend

    @attn_backend.setter
    def attn_backend(self, backend: AttentionBackendEnum) -> None:
        self._attn_backend = backend
        for block in self.blocks:
            block.attn.attn.attn_backend = backend

    def rot_pos_emb(self, grid_thw: Grids) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, ``(Σ t·h·w, head_dim / 2)`` in the tower dtype on the
        tower device (vLLM's cache has the model dtype and lives there)."""
        # Gathered on the device: the values of vision_rotary_tables without
        # its host work.
        return self.rotary_table.cos_sin(
            grid_rows(grid_thw, 3), self.device, self.dtype
        )

    def prepare_encoder_metadata(
        self,
        grid_thw: Grids,
        *,
        max_batch_size: int | None = None,
        max_frames_per_batch: int | None = None,
        max_seqlen_override: int | None = None,
        device: torch.device | str | None = None,
    ) -> dict[str, torch.Tensor]:
        """Every grid-dependent input of :meth:`forward`, as tensors.

        Args:
            grid_thw: ``[t, h, w]`` per item.
            max_batch_size, max_frames_per_batch: pad ``cu_seqlens`` to
                ``pad_to + 1`` entries by repeating the last offset, with
                ``pad_to = max_frames_per_batch`` when it is given, else
                ``max_batch_size`` (vLLM: capture passes both, image replay
                the batch size, video replay the frame count). Never
                truncated.
            max_seqlen_override: report this ``max_seqlen``. It is read on the
                host at kernel launch, so frozen into a captured graph:
                capture passes a worst case.
            device: where ``cu_seqlens`` goes (default: the tower's). The RoPE
                tables always go to the tower's device, as in vLLM.

        Returns:
            ``rotary_pos_emb_cos``, ``rotary_pos_emb_sin``: ``(Σ t·h·w,
            head_dim / 2)`` in the tower dtype (rows first, so the manager's
            default copy pads them); ``cu_seqlens``: int32 frame offsets;
            ``max_seqlen``: 0-dim int32 on the CPU, the override or else the
            longest frame (0 without frames).
        """
        if device is None:
            device = self.device
        rotary_cos, rotary_sin = self.rot_pos_emb(grid_thw)
        lengths = frame_seqlens(grid_thw)
        offsets = [0, *itertools.accumulate(lengths)]
        pad_to = (
            max_frames_per_batch if max_frames_per_batch is not None else max_batch_size
        )
        if pad_to is not None and len(lengths) < pad_to:
            offsets += [offsets[-1]] * (pad_to - len(lengths))
        if max_seqlen_override is not None:
            max_seqlen = max_seqlen_override
        else:
            max_seqlen = max(lengths, default=0)
        return {
            "rotary_pos_emb_cos": rotary_cos,
            "rotary_pos_emb_sin": rotary_sin,
            "cu_seqlens": async_tensor_h2d(offsets, device, dtype=torch.int32),
            "max_seqlen": torch.tensor(max_seqlen, dtype=torch.int32),
        }

    def forward(
        self,
        x: torch.Tensor,
        grid_thw: Grids | None = None,
        *,
        encoder_metadata: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``(N, C·T·p²)`` pixel rows → ``(N / m², out_hidden_size)``.

        Pixels are cast to the tower dtype (``input_norm``). With
        ``encoder_metadata`` (the CUDA graph path) no host work happens and
        ``grid_thw`` is ignored; without it the metadata is built from
        ``grid_thw``.
        """
        x = self.input_norm(x.to(device=self.device), self.dtype)
        x = self.patch_embed(x)
        if encoder_metadata is None:
            if grid_thw is None:
                raise ValueError("need grid_thw or encoder_metadata")
            encoder_metadata = self.prepare_encoder_metadata(grid_thw)
        meta = {}
        for key in (
            "rotary_pos_emb_cos",
            "rotary_pos_emb_sin",
            "cu_seqlens",
            "max_seqlen",
        ):
            value = encoder_metadata.get(key)
            if value is None:
                raise ValueError(f"encoder_metadata lacks {key!r}")
            meta[key] = value
        if meta["rotary_pos_emb_cos"].shape[0] != x.shape[0]:
            raise ValueError(
                f"{x.shape[0]} pixel rows but RoPE tables for "
                f"{meta['rotary_pos_emb_cos'].shape[0]}"
            )
        # Built once for all blocks, as vLLM builds its attention metadata.
        attn_metadata = VarlenAttentionMetadata(meta["cu_seqlens"], meta["max_seqlen"])
        for block in self.blocks:
            x = block(
                x,
                attn_metadata,
                meta["rotary_pos_emb_cos"],
                meta["rotary_pos_emb_sin"],
                None,
            )
        return self.merger(x)


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class Qwen2VLVisionHost(nn.Module):
    """The vision half of vLLM's ``Qwen2VLForConditionalGeneration``.

    A generated mixin is mixed in front of this class (see
    :mod:`reference_towers.registry`), so host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    :meth:`get_max_frames_per_video` is the exception: vLLM's mixin defines
    it on top of ``model_config``, which the standalone host does not have,
    so the host supplies a fixed value instead (a mixin that defines its own
    wins, by the MRO).
    """

    def __init__(
        self,
        config: Qwen2VisionConfig,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.visual = Qwen2VisionTransformer(config, attn_backend)

    def get_max_frames_per_video(self) -> int:
        """Frames per video the encoder CUDA graph config declares.

        vLLM derives it from the processor: ``get_num_frames_with_most_features(
        seq_len=max_model_len, mm_counts={"video": video limit per prompt})``,
        i.e. how many frames of the largest image fit the model length,
        divided by the video limit and capped at 14 (never below 1). Here it
        is the fixed ``config.max_frames_per_video``. vLLM counts raw frames;
        this reference treats the number as a cap on temporal patches
        (``t``), which is what a batch's frame capacity must hold.
        """
        return self.config.max_frames_per_video

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`)."""
        init_reference_weights_(
            self.visual,
            torch.Generator().manual_seed(seed),
            residual_branch_outputs=("attn.proj", "mlp.fc2"),
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
        if isinstance(pixel_values, (list, tuple)):
            pixel_values = torch.cat(list(pixel_values))
        items = grid_rows(grids, 3)
        needed = sum(t * h * w for t, h, w in items)
        if needed != pixel_values.shape[0]:
            raise ValueError(
                f"pixel values have {pixel_values.shape[0]} rows, grids need {needed}"
            )
        out: list[torch.Tensor] = []
        offset = 0
        for t, h, w in items:
            rows = pixel_values[offset : offset + t * h * w]
            out.append(self.visual(rows, [[t, h, w]]))
            offset += t * h * w
        return out
