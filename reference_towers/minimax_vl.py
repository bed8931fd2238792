"""MiniMax M3 vision tower and its host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``vllm/models/minimax_m3/common/vision_tower.py`` (``MiniMaxVLVisionModel``:
CLIP-style ViT with partial 3-D RoPE → per-row projector → m×m patch merger)
and of the vision half of ``MiniMaxM3SparseForConditionalGeneration``. The
attributes and signatures the MiniMax M3 mixin uses exist with vLLM's
meaning:

* host: ``vision_tower``, ``multimodal_config``;
* ``vision_tower``: ``spatial_merge_size``, ``out_hidden_size`` (text width),
  ``dtype`` (the patch-embed weight dtype), ``forward(pixel_values,
  grid_thw=None, *, encoder_metadata=None)`` → ``(N / m², text hidden)``;
* ``vision_tower.vision_model``: ``attn_backend``,
  ``embeddings.{num_channels, temporal_patch_size, patch_size}``,
  ``prepare_encoder_metadata(grid_thw, *, device, max_batch_size=None,
  max_seqlen_override=None)``.

Input rows follow the processor: an image of ``(t, h, w)`` patches gives
``t·h·w`` rows ordered (t, block-row, block-col, mh, mw), so each m×m block is
m² consecutive rows, with features ordered (C, T, p, p).

One deliberate difference: vLLM's patch embed converts its own weights when
``pixel_values`` arrive in another dtype (a module mutation that must never
happen during capture). Here a mismatch raises ``TypeError`` instead, so a
mixin that forgets the cast fails loudly rather than silently changing the
tower.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
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
    "MiniMaxM3VisionConfig",
    "MiniMaxM3VisionHost",
    "MiniMaxVLVisionModel",
    "MiniMaxVLVisionTransformer",
    "RopeGeometry",
    "apply_partial_mrope",
    "RotaryPlaneTable",
    "build_rotary_planes",
    "rope_geometry",
    "token_positions",
]

Grids = Sequence[Sequence[int]] | torch.Tensor

# Backends whose varlen metadata is the raw token offsets (vLLM's
# ``MMEncoderAttention.compute_max_seqlen`` reports a real maximum for these).
_MAX_SEQLEN_BACKENDS = (
    AttentionBackendEnum.FLASH_ATTN,
    AttentionBackendEnum.ROCM_AITER_FA,
    AttentionBackendEnum.TRITON_ATTN,
)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MiniMaxM3VisionConfig(ReleasedSizes):
    """The checkpoint's ``vision_config`` plus the host-level fields the tower
    reads (text width, projector width). Defaults are the ``full`` values
    (see :meth:`full`)."""

    hidden_size: int = 1280
    num_attention_heads: int = 16
    num_hidden_layers: int = 32
    intermediate_size: int = 5120
    patch_size: int = 14
    num_channels: int = 3
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    rope_theta: float = 10000.0
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    vision_segment_max_frames: int | None = 4
    """Videos longer than this are attended in segments of at most this many
    temporal patches (``None``: no limit). Images have ``t = 1``."""
    text_hidden_size: int = 6144
    projector_hidden_size: int | None = 6144
    """Inner width of both MLPs; ``None`` means the text width."""
    projector_hidden_act: str = "gelu"
    multimodal_projector_bias: bool = True
    patch_merge_bias: bool = True
    max_pixels: int = 451584
    """Image processor bound on resized pixels (672²): an image has at most
    ``max_pixels / p²`` patches."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if value <= 0:
                    problems.append(f"{f.name} must be positive, got {value}")
        if self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        elif rope_geometry(self.hidden_size // self.num_attention_heads).axis_dim < 2:
            problems.append("head dim too small for a 3-D RoPE")
        for name in ("hidden_act", "projector_hidden_act"):
            activation(getattr(self, name))  # raises on unknown names
        if self.max_pixels < (self.patch_size * self.spatial_merge_size) ** 2:
            problems.append("max_pixels is below one m×m block of patches")
        if problems:
            raise ValueError("invalid MiniMaxM3VisionConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_dim(self) -> int:
        """Features of one input row: C·T·p²."""
        return self.num_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def max_patches_per_image(self) -> int:
        return self.max_pixels // self.patch_size**2

    @classmethod
    def tiny(cls) -> MiniMaxM3VisionConfig:
        """A tower that runs in milliseconds on a CPU.

        Patch, temporal and merge sizes stay at the released values so that
        input rows and grids have the real layout. Head dim 32 gives a 3-D
        RoPE of 3×10 dims with 2 dims passed through; a projector width
        distinct from the text width catches swapped dimensions. The pixel
        bound is lowered to 64 output tokens per image.
        """
        return cls(
            hidden_size=64,
            num_attention_heads=2,
            num_hidden_layers=2,
            intermediate_size=128,
            text_hidden_size=96,
            projector_hidden_size=80,
            max_pixels=64 * (14 * 2) ** 2,
        )

    @classmethod
    def full(cls) -> MiniMaxM3VisionConfig:
        """The released model's dimensions.

        Vision config of the MiniMax-M3 checkpoint (hidden 1280, 16 heads,
        32 layers, MLP 5120, GELU, LayerNorm eps 1e-5, RoPE base 1e4,
        ``vision_segment_max_frames`` 4, projector width 6144), text width
        6144 (vLLM's ``MiniMaxM3TextConfig`` default), p = 14, T = 2, m = 2
        and 672² pixels (vLLM's processor).
        """
        return cls()


# ---------------------------------------------------------------------------
# Partial 3-D RoPE
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeGeometry:
    """How a head is split for the 3-D RoPE.

    ``axis_dim`` (a) dims turn with each of t, h, w; ``rotary_dim = 3a`` dims
    are rotated (NeoX pairs ``(i, i + half_rot)``), the rest pass through.
    Column ``i < half_rot`` of the cos/sin tables belongs to axis
    ``i // section`` (0: t, 1: h, 2: w).
    """

    head_dim: int
    axis_dim: int

    @property
    def rotary_dim(self) -> int:
        return 3 * self.axis_dim

    @property
    def half_rot(self) -> int:
        return self.rotary_dim // 2

    @property
    def section(self) -> int:
        return self.axis_dim // 2


def rope_geometry(head_dim: int) -> RopeGeometry:
    """``a = 2·⌊⌊rope_dims/3⌋/2⌋`` with ``rope_dims = 2·⌊head_dim/2⌋``."""
    rope_dims = 2 * (head_dim // 2)
    return RopeGeometry(head_dim=head_dim, axis_dim=2 * ((rope_dims // 3) // 2))


def token_positions(
    t: int, h: int, w: int, spatial_merge_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tpos, hpos, wpos)`` of every input row of one ``(t, h, w)`` segment.

    Rows within a frame are ordered by m×m block (block-row, block-col, then
    row and column inside the block), the processor's order.
    """
    m = spatial_merge_size
    local = torch.arange(t * h * w)
    tpos = local // (h * w)
    in_frame = local % (h * w)
    block_row = in_frame // (m * w)
    in_band = in_frame % (m * w)
    block_col = in_band // (m * m)
    in_block = in_band % (m * m)
    hpos = block_row * m + in_block // m
    wpos = block_col * m + in_block % m
    return tpos, hpos, wpos


def _axis_inv_freq(axis_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (
        theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim)
    )


def build_rotary_planes(
    segments: Sequence[tuple[int, int, int]],
    *,
    geometry: RopeGeometry,
    theta: float,
    spatial_merge_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(3, N, half_rot)`` fp32 cos/sin planes of packed segments.

    Plane ``k`` holds axis ``k``'s angles in its own section of columns
    (``[k·s, (k+1)·s)`` with ``s = a/2``); every other column is zero, which
    vLLM leaves uninitialised because its kernel never reads it. Positions
    restart at every segment. Computed on the CPU, in fp32.
    """
    sec = geometry.section
    inv_freq = _axis_inv_freq(geometry.axis_dim, theta)
    total = sum(t * h * w for t, h, w in segments)
    cos = torch.zeros((3, total, geometry.half_rot), dtype=torch.float32)
    sin = torch.zeros_like(cos)
    offset = 0
    for t, h, w in segments:
        n = t * h * w
        for axis, pos in enumerate(token_positions(t, h, w, spatial_merge_size)):
            angles = pos.to(torch.float32)[:, None] * inv_freq[None, :]
            cols = slice(axis * sec, (axis + 1) * sec)
            cos[axis, offset : offset + n, cols] = angles.cos()
            sin[axis, offset : offset + n, cols] = angles.sin()
        offset += n
    return cos, sin


def _stack_planes(geometry: RopeGeometry) -> Callable[[torch.Tensor], torch.Tensor]:
    """Arrange a ``(P, section)`` cos or sin table as ``(P · 3, half_rot)``:
    row ``3p + k`` is plane ``k``'s row for position ``p`` (its section of
    columns filled, the rest zero, as :func:`build_rotary_planes` leaves
    them)."""
    sec, half = geometry.section, geometry.half_rot

    def arrange(table: torch.Tensor) -> torch.Tensor:
        planes = torch.zeros((table.shape[0], 3, half), dtype=table.dtype)
        for axis in range(3):
            planes[:, axis, axis * sec : (axis + 1) * sec] = table
        return planes.reshape(-1, half)

    return arrange


def plane_rows(t: int, h: int, w: int, spatial_merge_size: int) -> torch.Tensor:
    """``(3, t·h·w)`` int64 rows of one segment in a :func:`_stack_planes`
    table: ``3 · position + axis``."""
    axes = token_positions(t, h, w, spatial_merge_size)
    return torch.stack([3 * pos + axis for axis, pos in enumerate(axes)])


class RotaryPlaneTable:
    """:func:`build_rotary_planes` as a device gather.

    The per-position planes live on the device (:class:`AngleTable`) and
    each segment's rows into them are cached per grid
    (:class:`GridIndexCache`); a batch costs one concatenation and two
    gathers, with the same values as :func:`build_rotary_planes`.
    """

    def __init__(
        self, geometry: RopeGeometry, theta: float, spatial_merge_size: int
    ) -> None:
        self.geometry = geometry
        self._angles = AngleTable(
            lambda: _axis_inv_freq(geometry.axis_dim, theta),
            arrange=_stack_planes(geometry),
        )
        self._rows = GridIndexCache(
            lambda seg: plane_rows(*seg, spatial_merge_size)  # type: ignore[misc]
        )

    def planes(
        self, segments: Sequence[tuple[int, int, int]], device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, N, half_rot)`` fp32 cos/sin planes of packed ``segments``
        on ``device``."""
        if not segments:
            empty = torch.zeros(
                (3, 0, self.geometry.half_rot), dtype=torch.float32, device=device
            )
            return empty, empty.clone()
        positions = max(max(seg) for seg in segments)
        cos_table, sin_table = self._angles.cos_sin(positions, device, torch.float32)
        unique = {seg: self._rows.get(seg, device) for seg in segments}
        rows = concat_on_device([unique[seg] for seg in segments], dim=1)
        return cos_table[rows], sin_table[rows]


def apply_partial_mrope(
    x: torch.Tensor,
    rotary_cos: torch.Tensor,
    rotary_sin: torch.Tensor,
    geometry: RopeGeometry,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of every head, in fp32.

    ``x`` is ``(N, heads, head_dim)``; pair ``(x[i], x[i + half_rot])`` for
    ``i < half_rot`` turns by the angle in column ``i`` of plane
    ``i // section``; dims ``>= rotary_dim`` pass through unchanged.

    vLLM's kernel finds plane ``k`` at ``k · N · half_rot``, i.e. it derives
    the plane stride from the number of rows it rotates; planes with another
    row count would be misread, so they are rejected here.
    """
    n = x.shape[0]
    if rotary_cos.shape[1] != n or rotary_sin.shape[1] != n:
        raise ValueError(
            f"rotary planes have {rotary_cos.shape[1]}/{rotary_sin.shape[1]} rows "
            f"for {n} tokens; they must match exactly"
        )
    sec, half, rot = geometry.section, geometry.half_rot, geometry.rotary_dim
    # Per column, the plane of its axis: (N, half_rot), broadcast over heads.
    cos = torch.cat([rotary_cos[k, :, k * sec : (k + 1) * sec] for k in range(3)], -1)
    sin = torch.cat([rotary_sin[k, :, k * sec : (k + 1) * sec] for k in range(3)], -1)
    cos, sin = cos[:, None, :].float(), sin[:, None, :].float()
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:rot]
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., rot:]], -1)
    return rotated.to(x.dtype)


# ---------------------------------------------------------------------------
# ViT
# ---------------------------------------------------------------------------


class MiniMaxVLPatchEmbed(nn.Module):
    """Conv3d with kernel = stride = (T, p, p) and no bias, applied to rows
    that are exactly one kernel each: a bias-free linear map. The weight keeps
    the checkpoint's Conv3d shape ``(D, C, T, p, p)``."""

    def __init__(self, config: MiniMaxM3VisionConfig) -> None:
        super().__init__()
        self.num_channels = config.num_channels
        self.temporal_patch_size = config.temporal_patch_size
        self.patch_size = config.patch_size
        self.hidden_size = config.hidden_size
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.patch_embedding = nn.Conv3d(
            config.num_channels,
            config.hidden_size,
            kernel_size=kernel,
            stride=kernel,
            bias=False,
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.patch_embedding.weight
        if pixel_values.dtype != weight.dtype:
            # vLLM would convert the module to the input dtype here (see the
            # module docstring); refuse instead of mutating the tower.
            raise TypeError(
                f"pixel_values are {pixel_values.dtype} but the tower is "
                f"{weight.dtype}: cast them to vision_tower.dtype first"
            )
        if pixel_values.dim() != 2 or pixel_values.shape[1] != weight[0].numel():
            raise ValueError(
                f"pixel_values must be (N, {weight[0].numel()}), got "
                f"{tuple(pixel_values.shape)}"
            )
        return F.linear(pixel_values, weight.reshape(weight.shape[0], -1))


class MiniMaxVLAttention(nn.Module):
    def __init__(
        self, config: MiniMaxM3VisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.geometry = rope_geometry(self.head_dim)
        dim = config.hidden_size
        self.qkv_proj = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)
        self.attn = VarlenAttention(self.num_heads, self.head_dim, attn_backend)

    def forward(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor | VarlenAttentionMetadata,
        rotary_cos: torch.Tensor,
        rotary_sin: torch.Tensor,
        max_seqlen: torch.Tensor | int | None,
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x).reshape(n, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.unbind(1)
        q = apply_partial_mrope(q, rotary_cos, rotary_sin, self.geometry)
        k = apply_partial_mrope(k, rotary_cos, rotary_sin, self.geometry)
        out = self.attn(q, k, v, cu_seqlens, max_seqlen)
        return self.out_proj(out.reshape(n, -1))


class MiniMaxVLEncoderLayer(nn.Module):
    """CLIP-style pre-norm block (all projections biased)."""

    def __init__(
        self, config: MiniMaxM3VisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        dim = config.hidden_size
        self.layer_norm1 = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.self_attn = MiniMaxVLAttention(config, attn_backend)
        self.layer_norm2 = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(dim, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, dim)
        self.act = activation(config.hidden_act)

    def forward(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor | VarlenAttentionMetadata,
        rotary_cos: torch.Tensor,
        rotary_sin: torch.Tensor,
        max_seqlen: torch.Tensor | int | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(
            self.layer_norm1(x), cu_seqlens, rotary_cos, rotary_sin, max_seqlen
        )
        return x + self.fc2(self.act(self.fc1(self.layer_norm2(x))))


class MiniMaxVLEncoder(nn.Module):
    def __init__(
        self, config: MiniMaxM3VisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            MiniMaxVLEncoderLayer(config, attn_backend)
            for _ in range(config.num_hidden_layers)
        )


class MiniMaxVLVisionTransformer(nn.Module):
    """Patch embed → ``pre_layrnorm`` → encoder layers; no post-layernorm
    (the released checkpoint uses the last hidden state before it)."""

    def __init__(
        self,
        config: MiniMaxM3VisionConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        self.spatial_merge_size = config.spatial_merge_size
        self.temporal_patch_size = config.temporal_patch_size
        self.vision_segment_max_frames = config.vision_segment_max_frames
        self.rope_theta = config.rope_theta
        self.rope_geometry = rope_geometry(config.head_dim)
        self.rotary_planes = RotaryPlaneTable(
            self.rope_geometry, self.rope_theta, self.spatial_merge_size
        )
        self.embeddings = MiniMaxVLPatchEmbed(config)
        self.pre_layrnorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = MiniMaxVLEncoder(config, attn_backend)
        self._attn_backend = attn_backend

    @property
    def attn_backend(self) -> AttentionBackendEnum:
        """The ViT attention backend (the attribute the mixin's guard reads).

        Setting it switches every layer, so the metadata and the kernels can
        never disagree.
        """
        return self._attn_backend

    @attn_backend.setter
    def attn_backend(self, backend: AttentionBackendEnum) -> None:
        self._attn_backend = backend
        for layer in self.encoder.layers:
            layer.self_attn.attn.attn_backend = backend

    def segments(self, grid_thw: Grids) -> list[tuple[int, int, int]]:
        """Attention segments: grids split into chunks of at most
        ``vision_segment_max_frames`` temporal patches."""
        limit = self.vision_segment_max_frames
        out: list[tuple[int, int, int]] = []
        for t, h, w in grid_rows(grid_thw, 3):
            if limit is None or t <= limit:
                out.append((t, h, w))
            else:
                out.extend((min(limit, t - s), h, w) for s in range(0, t, limit))
        return out

    def prepare_encoder_metadata(
        self,
        grid_thw: Grids,
        *,
        device: torch.device | str,
        max_batch_size: int | None = None,
        max_seqlen_override: int | None = None,
    ) -> dict[str, torch.Tensor | None]:
        """Every grid-dependent input of :meth:`forward`, as tensors.

        The eager path builds it per call; CUDA graph capture builds it for
        dummy grids (padded to fixed sizes), replay for the real grids
        (unpadded: the mixin's padding logic completes the buffers).

        Args:
            grid_thw: ``[t, h, w]`` per item.
            device: device of ``cu_seqlens`` and the planes.
            max_batch_size: pad ``cu_seqlens`` to ``max_batch_size + 1``
                entries by repeating the last offset (empty trailing
                segments); ``None``: no padding.
            max_seqlen_override: report this ``max_seqlen``. It is read on the
                host at kernel launch and so frozen into a captured graph:
                capture passes a worst case.

        Returns:
            ``rotary_cos``, ``rotary_sin``: ``(3, N, half_rot)`` fp32;
            ``cu_seqlens``: int32 segment offsets; ``max_seqlen``: 0-dim int32
            on the CPU (0 for backends that do not use it, as in vLLM);
            ``sequence_lengths``: ``None`` (only FlashInfer needs it).
        """
        if self.attn_backend in (
            AttentionBackendEnum.FLASHINFER,
            AttentionBackendEnum.TRITON_FLASHINFER,
        ):
            raise NotImplementedError(
                "the reference tower has no FlashInfer metadata (padded "
                "sequence lengths, element-offset cu_seqlens)"
            )
        segments = self.segments(grid_thw)
        lengths = [t * h * w for t, h, w in segments]
        offsets = [0, *itertools.accumulate(lengths)]
        if max_batch_size is not None and len(lengths) < max_batch_size:
            offsets += [offsets[-1]] * (max_batch_size - len(lengths))
        if max_seqlen_override is not None:
            max_seqlen = max_seqlen_override
        elif self.attn_backend in _MAX_SEQLEN_BACKENDS:
            max_seqlen = max(lengths, default=0)
        else:
            max_seqlen = 0
        # Gathered on the device from cached tables: the values of
        # build_rotary_planes without its host work.
        rotary_cos, rotary_sin = self.rotary_planes.planes(segments, device)
        return {
            "rotary_cos": rotary_cos,
            "rotary_sin": rotary_sin,
            "cu_seqlens": async_tensor_h2d(offsets, device, dtype=torch.int32),
            "max_seqlen": torch.tensor(max_seqlen, dtype=torch.int32),
            "sequence_lengths": None,
        }

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid_thw: Grids | None = None,
        *,
        encoder_metadata: Mapping[str, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        """``(N, C·T·p²)`` rows → ``(N, D)``.

        With ``encoder_metadata`` (the CUDA graph path) no host work happens:
        the call only launches kernels. Without it, metadata is built from
        ``grid_thw``.
        """
        hidden = self.pre_layrnorm(self.embeddings(pixel_values))
        if encoder_metadata is None:
            if grid_thw is None:
                raise ValueError("need grid_thw or encoder_metadata")
            encoder_metadata = self.prepare_encoder_metadata(
                grid_thw, device=hidden.device
            )
        if encoder_metadata.get("sequence_lengths") is not None:
            raise NotImplementedError("sequence_lengths is FlashInfer-only")
        meta = {}
        for key in ("cu_seqlens", "rotary_cos", "rotary_sin", "max_seqlen"):
            value = encoder_metadata.get(key)
            if value is None:
                raise ValueError(f"encoder_metadata lacks {key!r}")
            meta[key] = value
        # Built once for all layers, as vLLM builds its attention metadata.
        attn_metadata = VarlenAttentionMetadata(meta["cu_seqlens"], meta["max_seqlen"])
        for layer in self.encoder.layers:
            hidden = layer(
                hidden, attn_metadata, meta["rotary_cos"], meta["rotary_sin"], None
            )
        return hidden


# ---------------------------------------------------------------------------
# Projector, patch merger, full model
# ---------------------------------------------------------------------------


class MiniMaxVLMultiModalProjector(nn.Module):
    """Per row: ``linear_1`` (D → mid) → act → ``linear_2`` (mid → text)."""

    def __init__(self, config: MiniMaxM3VisionConfig) -> None:
        super().__init__()
        mid = config.projector_hidden_size or config.text_hidden_size
        bias = config.multimodal_projector_bias
        self.linear_1 = nn.Linear(config.hidden_size, mid, bias=bias)
        self.linear_2 = nn.Linear(mid, config.text_hidden_size, bias=bias)
        self.act = activation(config.projector_hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class MiniMaxVLPatchMerger(nn.Module):
    """Each m² consecutive rows (one m×m block) are concatenated and mapped
    back to the text width: (N, text) → (N/m², m²·text) → MLP → (N/m², text)."""

    def __init__(self, config: MiniMaxM3VisionConfig) -> None:
        super().__init__()
        self.spatial_merge_size = config.spatial_merge_size
        mid = config.projector_hidden_size or config.text_hidden_size
        bias = config.patch_merge_bias
        merged = config.text_hidden_size * config.spatial_merge_size**2
        self.linear_1 = nn.Linear(merged, mid, bias=bias)
        self.linear_2 = nn.Linear(mid, config.text_hidden_size, bias=bias)
        self.act = activation(config.projector_hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.spatial_merge_size**2
        if x.shape[0] % group:
            raise ValueError(f"{x.shape[0]} rows do not split into blocks of {group}")
        x = x.reshape(x.shape[0] // group, -1)
        return self.linear_2(self.act(self.linear_1(x)))


class MiniMaxVLVisionModel(nn.Module):
    """ViT → projector → patch merger: ``(N, C·T·p²)`` → ``(N/m², text)``."""

    def __init__(
        self,
        config: MiniMaxM3VisionConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.spatial_merge_size = config.spatial_merge_size
        self.out_hidden_size = config.text_hidden_size
        self.vision_model = MiniMaxVLVisionTransformer(config, attn_backend)
        self.multi_modal_projector = MiniMaxVLMultiModalProjector(config)
        self.patch_merge_mlp = MiniMaxVLPatchMerger(config)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the patch-embed weight: what ``pixel_values`` must be.

        A property (vLLM stores it once) so that it follows ``.to(dtype)``.
        """
        return self.vision_model.embeddings.patch_embedding.weight.dtype

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid_thw: Grids | None = None,
        *,
        encoder_metadata: Mapping[str, torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        hidden = self.vision_model(
            pixel_values, grid_thw, encoder_metadata=encoder_metadata
        )
        return self.patch_merge_mlp(self.multi_modal_projector(hidden))


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class MiniMaxM3VisionHost(nn.Module):
    """The vision half of vLLM's ``MiniMaxM3SparseForConditionalGeneration``.

    A generated mixin is mixed in front of this class (see
    :mod:`reference_towers.registry`), so host methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: MiniMaxM3VisionConfig,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.vision_tower = MiniMaxVLVisionModel(config, attn_backend)

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`)."""
        init_reference_weights_(
            self.vision_tower,
            torch.Generator().manual_seed(seed),
            residual_branch_outputs=("self_attn.out_proj", "fc2"),
            num_residual_branches=2 * self.config.num_hidden_layers,
        )

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        self.vision_tower.to(dtype=dtype)

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each image's ``(t·h·w / m², text hidden)`` embeddings
        in item order, one tower call per image (so no packing is involved)."""
        pixel_values = mm_kwargs["pixel_values"]
        if isinstance(pixel_values, (list, tuple)):
            pixel_values = torch.cat(list(pixel_values))
        pixel_values = pixel_values.to(self.vision_tower.dtype)
        out: list[torch.Tensor] = []
        offset = 0
        for t, h, w in grid_rows(mm_kwargs["image_grid_thw"], 3):
            rows = pixel_values[offset : offset + t * h * w]
            out.append(self.vision_tower(rows, grid_thw=[[t, h, w]]))
            offset += t * h * w
        if offset != pixel_values.shape[0]:
            raise ValueError(
                f"pixel_values has {pixel_values.shape[0]} rows, grids need {offset}"
            )
        return out
