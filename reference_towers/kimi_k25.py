"""Kimi-K2.5 vision encoder (MoonViT3d), projector and host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``MoonViT3dPretrainedModel`` and ``KimiK25MultiModalProjector``
(``vllm/model_executor/models/kimi_k25_vit.py``) and of the vision half of
``KimiK25ForConditionalGeneration`` (``kimi_k25.py``). MoonViT3d is Kimi-VL's
MoonViT (:mod:`reference_towers.kimi_vl`, whose blocks, 2-D RoPE table,
``apply_rope`` and projector are imported, not copied) on ``(t, h, w)`` grids:

* patch embed: the identity input norm (a cast to the tower dtype), the
  biased stride-``p`` Conv2d as one matmul, plus the learned ``H×W`` grid
  bicubically interpolated to ``h×w`` and, for ``t > 1``, a fixed 1-D
  sin/cos table over the frames (``time_weight``, ``(T, 1, D)``) added to
  every frame (``Learnable2DInterpPosEmbDivided_fixed``, lines 124-183);
* ``Rope2DPosEmbRepeated`` (249-318): Kimi-VL's 512×512 table, each frame
  given the same ``h×w`` rows (repeated ``t`` times);
* one attention sequence per item of ``t·h·w`` patches (``video_attn_type``
  ``spatial_temporal``, 545; cu_seqlens 580-615);
* merge: with ``encoder_metadata`` holding ``pos_embeds`` (the graph path,
  images only) one gather by ``merge_gather_idx`` ``(tokens, kh·kw)``
  (681-706, 777-790); otherwise ``tpool_patch_merger`` (656-678): the mean
  over the ``t`` frames of every patch, then the ``kh×kw`` blocks;
* projector ``patchmerger`` (932-961): Kimi-VL's (LayerNorm, kh·kw rows
  concatenated, Linear → exact GELU → Linear to the text width).

Host API (what the Kimi-K2.5 mixin reads): ``vision_tower``
(``merge_kernel_size``, ``patch_size``, ``encoder.rope_2d.{max_height,
max_width}``, ``encoder.blocks[i].attn.attn_backend``,
``patch_embed.input_norm.input_dtype`` (``None``),
``encoder.prepare_encoder_metadata(grid_thw_list, *, device,
max_batch_size=None, max_seqlen_override=None)``,
``prepare_encoder_cudagraph_metadata(grid_thw_list, *, max_batch_size,
max_seqlen_override=None, device)`` and ``forward(pixel_values, grid_thws,
*, encoder_metadata=None)``), ``mm_projector``, ``config.text_config
.hidden_size``. Metadata keys, shapes and dtypes are vLLM's:
``rope_freqs_cis`` ``(Σ t·h·w, head_dim / 2)`` complex64,
``sequence_lengths`` (``None`` but under FlashInfer), ``max_seqlen`` 0-dim
int32 on the CPU (the override, else vLLM's ``compute_max_seqlen``),
``cu_seqlens`` int32 (padded to ``max_batch_size`` sequences by repeating the
last offset; FlashInfer's two-section layout under FLASHINFER); the graph
builder adds ``pos_embeds`` ``(Σ h·w, D)`` and ``merge_gather_idx`` int64
``(Σ h·w / (kh·kw), kh·kw)``, refusing ``t != 1``. Input rows are the
processor's patches ``(Σ t·h·w, 3, p, p)``, frame by frame, row-major.

Full-size figures (``full()``): the vision tower is vLLM's ``Kimi-K2.5``
vision config defaults (patch 14, 64×64 learned grid, 4 frames of time
table, 27 layers, width 1152, 16 heads, MLP 4304, merge 2×2, tanh-GELU
blocks: MoonViT's); the text width 7168 (Kimi-K2's DeepSeek-V3 layout) and
``max_model_len`` 262144 (a 256K context). Processor (vLLM's
``KimiK25FusedVisionProcessor`` with the checkpoint's ``media_proc_cfg``):
``in_patch_limit`` 16384, ``patch_limit_on_one_side`` 512, 4 frames per
video chunk (``temporal_merge_kernel_size``); these three values were not
checked against the checkpoint here and are the least certain.

Deliberate differences from vLLM, none visible to a mixin:

* The RoPE table is Kimi-VL's (CPU fp32, cached per device).
* The attention runs through the runtime's varlen kernels; under
  FLASHINFER the metadata is vLLM's but the forward refuses to run (the
  runtime has no FlashInfer kernel). FP8 attention is not modelled.
* ``input_norm`` is always the identity cast (vLLM's ``IdentityInputNorm``):
  the fused uint8 normalisation of ``mm_device_do_normalize`` is left out.
* Data-parallel sharding of the eager path (``vision_tower_forward`` with
  ``use_data_parallel``) is not modelled: the tower runs unsharded.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import ModelConfig, MultiModalConfig
from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d
from reference_towers._layers import ReleasedSizes, grid_rows, init_reference_weights_
from reference_towers.kimi_vl import (
    ROPE_GRID,
    ROPE_THETA,
    KimiVLMultiModalProjector,
    KimiVLTextConfig,
    Learnable2DInterpPosEmb,
    MoonVisionPatchEmbed,
    MoonViTConfig,
    MoonVitEncoder,
    Rope2DPosEmb,
    _positive_fields,
    merge_gather_index,
)
from reference_towers.qwen2_5_vl import (
    backend_cu_seqlens,
    backend_max_seqlen,
    backend_sequence_lengths,
)
from reference_towers.qwen2_vl import Qwen2VisionInputNorm

__all__ = [
    "KimiK25Config",
    "KimiK25VisionConfig",
    "KimiK25VisionHost",
    "MoonViT3dPretrainedModel",
    "image_merge_gather_index",
    "time_sincos_table",
    "tpool_patch_merger",
]

Grids = Sequence[Sequence[int]] | torch.Tensor


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KimiK25VisionConfig(MoonViTConfig):
    """The checkpoint's ``vision_config``: MoonViT's fields plus the frames
    of the time table (``init_pos_emb_time``, the most frames an item may
    have)."""

    init_pos_emb_time: int = 4


@dataclass(frozen=True)
class KimiK25Config(ReleasedSizes):
    """The host's ``config`` (``vision_config``, ``text_config``) plus
    processor and model-length values; defaults are the ``full`` values (see
    the module docstring)."""

    vision_config: KimiK25VisionConfig = field(default_factory=KimiK25VisionConfig)
    text_config: KimiVLTextConfig = field(
        default_factory=lambda: KimiVLTextConfig(hidden_size=7168)
    )
    in_patch_limit: int = 16384
    """Processor: images with more whole patches are downscaled."""
    patch_limit_on_one_side: int = 512
    """Processor: images wider or taller than this many patches are
    downscaled (then padded up to the merge kernel)."""
    frames_per_chunk: int = 4
    """Processor: frames of a video chunk (``temporal_merge_kernel_size``)."""
    max_model_len: int = 262144

    def __post_init__(self) -> None:
        problems = _positive_fields(self)
        if self.frames_per_chunk > self.vision_config.init_pos_emb_time:
            problems.append("frames_per_chunk exceeds the time table")
        if problems:
            raise ValueError("invalid KimiK25Config: " + "; ".join(problems))

    @classmethod
    def tiny(cls) -> KimiK25Config:
        """A tower that runs in milliseconds on a CPU.

        Patch size, merge kernel, RoPE grid, the 4-frame time table and the
        side limit stay at the released values; Kimi-VL's tiny widths (head
        dim 32, an 8×8 learned grid, text width 96 distinct from D·kh·kw =
        256). The patch limit is lowered to 256, so an image has at most 255
        output tokens (a 2×510 strip) and every count up to that is
        reachable; the model length is the driver's tiny 512.
        """
        return cls(
            vision_config=KimiK25VisionConfig(
                init_pos_emb_height=8,
                init_pos_emb_width=8,
                num_attention_heads=2,
                num_hidden_layers=2,
                hidden_size=64,
                intermediate_size=96,
            ),
            text_config=KimiVLTextConfig(hidden_size=96),
            in_patch_limit=256,
            max_model_len=512,
        )

    @classmethod
    def full(cls) -> KimiK25Config:
        return cls()


# ---------------------------------------------------------------------------
# Grid metadata
# ---------------------------------------------------------------------------


def time_sincos_table(dim: int, frames: int) -> torch.Tensor:
    """vLLM's ``get_1d_sincos_pos_embed(dim, frames)`` as ``(frames, 1,
    dim)`` fp32: frame ``f`` holds ``sin(f·ω_i)`` then ``cos(f·ω_i)`` for
    ``ω_i = 10000^(-i / (dim / 2))`` (computed in float32, as numpy does)."""
    if dim % 2:
        raise ValueError(f"the time table needs an even width, got {dim}")
    omega = np.arange(dim // 2, dtype=np.float32) / np.float32(dim / 2.0)
    omega = (1.0 / 10000**omega).astype(np.float32)
    angles = np.outer(np.arange(frames, dtype=np.float32), omega)
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    return torch.from_numpy(table.astype(np.float32)).unsqueeze(1)


def image_merge_gather_index(
    grid_thws: Sequence[Sequence[int]], merge_kernel_size: tuple[int, int]
) -> np.ndarray:
    """The graph path's merge index, ``(Σ h·w / (kh·kw), kh·kw)`` int64:
    Kimi-VL's order, one row per merged token. Only images (``t == 1``)."""
    if any(t != 1 for t, _, _ in grid_thws):
        raise ValueError("Image encoder CUDA graphs require grid T == 1")
    flat = merge_gather_index([(h, w) for _, h, w in grid_thws], merge_kernel_size)
    return flat.reshape(-1, merge_kernel_size[0] * merge_kernel_size[1])


def tpool_patch_merger(
    x: torch.Tensor, grids: Sequence[tuple[int, int, int]], kernel: tuple[int, int]
) -> list[torch.Tensor]:
    """Each item's rows ``(t·h·w, D)`` averaged over its ``t`` frames, then
    grouped ``kh×kw``: one ``(h·w / (kh·kw), kh·kw, D)`` tensor per item."""
    kh, kw = kernel
    out = []
    for rows, (t, h, w) in zip(x.split([t * h * w for t, h, w in grids]), grids):
        pooled = rows.view(t, h // kh, kh, w // kw, kw, -1).mean(dim=0)
        out.append(pooled.permute(0, 2, 1, 3, 4).reshape(-1, kh * kw, x.shape[-1]))
    return out


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class Learnable2DInterpPosEmbDividedFixed(Learnable2DInterpPosEmb):
    """Kimi-VL's interpolated learned grid, plus for ``t > 1`` frames the
    fixed time table row ``f`` added to frame ``f``."""

    def __init__(self, height: int, width: int, num_frames: int, dim: int) -> None:
        super().__init__(height, width, dim)
        self.num_frames = num_frames
        self.register_buffer(
            "time_weight", time_sincos_table(dim, num_frames), persistent=False
        )

    def reset_time_weight(self) -> None:
        """Refill the table (``to_empty`` leaves buffers uninitialised)."""
        table = time_sincos_table(self.weight.shape[-1], self.num_frames)
        with torch.no_grad():
            self.time_weight.copy_(table)

    def get_pos_embeds(self, grid_thws: Sequence[Sequence[int]]) -> torch.Tensor:
        """``(Σ t·h·w, D)``, frame by frame, items in order."""
        parts = []
        for t, h, w in grid_thws:
            if t > self.num_frames:
                raise ValueError(f"t:{t} > num_frames:{self.num_frames}")
            plane = super().get_pos_embeds([(h, w)])
            if t != 1:
                plane = plane.unsqueeze(0).repeat(t, 1, 1) + self.time_weight[:t]
            parts.append(plane.reshape(-1, plane.shape[-1]))
        if not parts:
            return self.weight.new_zeros((0, self.weight.shape[-1]))
        return torch.cat(parts)


class MoonVision3dPatchEmbed(MoonVisionPatchEmbed):
    """Kimi-VL's patch embed behind the identity input norm, with the
    time-aware position embeddings."""

    def __init__(self, config: KimiK25VisionConfig) -> None:
        super().__init__(config)
        self.input_norm = Qwen2VisionInputNorm()
        self.pos_emb = Learnable2DInterpPosEmbDividedFixed(
            config.init_pos_emb_height,
            config.init_pos_emb_width,
            config.init_pos_emb_time,
            config.hidden_size,
        )

    def forward(
        self,
        x: torch.Tensor,
        grid_thws: Sequence[Sequence[int]] | None,
        *,
        pos_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.input_norm(x.flatten(1), self.proj.weight.dtype).view_as(x)
        if pos_embeds is None:
            if grid_thws is None:
                raise ValueError("need grid_thws or pos_embeds")
            pos_embeds = self.pos_emb.get_pos_embeds(grid_thws)
        return super().forward(x, pos_embeds)


class Rope2DPosEmbRepeated(Rope2DPosEmb):
    """Kimi-VL's 2-D RoPE table; every frame of an item gets its ``h×w``
    rows."""

    def get_freqs_cis(
        self, grid_thws: Sequence[Sequence[int]], device: torch.device | str
    ) -> torch.Tensor:
        """``(Σ t·h·w, dim / 2)`` complex64."""
        parts = [
            self.get_freqs_cis_by_seqlens_list([(h, w)], device).repeat(t, 1)
            for t, h, w in grid_thws
        ]
        if not parts:
            return self.precomputed_freqs_cis(device).new_zeros((0, self.dim // 2))
        return torch.cat(parts)


class MoonViT3dEncoder(MoonVitEncoder):
    """Kimi-VL's blocks and final norm; one sequence of ``t·h·w`` patches
    per item."""

    def __init__(
        self, config: KimiK25VisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__(config, attn_backend)
        self.hidden_size = config.hidden_size
        self.rope_2d = Rope2DPosEmbRepeated(
            config.head_dim, ROPE_GRID, ROPE_GRID, ROPE_THETA
        )

    def prepare_encoder_metadata(
        self,
        grid_thw_list: Grids,
        *,
        device: torch.device | str,
        max_batch_size: int | None = None,
        max_seqlen_override: int | None = None,
    ) -> dict[str, torch.Tensor | None]:
        """``rope_freqs_cis``, ``sequence_lengths``, ``max_seqlen`` and
        ``cu_seqlens`` of vLLM's ``MoonViT3dEncoder.prepare_encoder_metadata``
        (``max_batch_size``: pad ``cu_seqlens`` to that many sequences by
        repeating the last offset)."""
        device = torch.device(device)
        grids = grid_rows(grid_thw_list, 3)
        lengths = [t * h * w for t, h, w in grids]
        offsets = np.array([0, *itertools.accumulate(lengths)], dtype=np.int32)
        if max_batch_size is not None and len(lengths) < max_batch_size:
            tail = np.full(max_batch_size - len(lengths), offsets[-1], np.int32)
            offsets = np.concatenate([offsets, tail])
        backend = self.blocks[0].attn.attn_backend
        if max_seqlen_override is not None:
            max_seqlen = int(max_seqlen_override)
        else:
            max_seqlen = backend_max_seqlen(backend, offsets)
        return {
            "rope_freqs_cis": self.rope_2d.get_freqs_cis(grids, device),
            "sequence_lengths": backend_sequence_lengths(backend, offsets, device),
            "max_seqlen": torch.tensor(max_seqlen, dtype=torch.int32),
            "cu_seqlens": backend_cu_seqlens(
                backend, offsets, self.hidden_size, device
            ),
        }

    def run(
        self, x: torch.Tensor, meta: Mapping[str, torch.Tensor | None]
    ) -> torch.Tensor:
        """The blocks and final norm over ``x`` with ``meta``'s sequences."""
        if self.blocks[0].attn.attn_backend == AttentionBackendEnum.FLASHINFER:
            raise NotImplementedError(
                "the reference runtime has no FlashInfer kernel (the metadata is "
                "vLLM's; the forward is not emulated)"
            )
        return self(
            x,
            cu_seqlens=meta["cu_seqlens"],
            rope_freqs_cis=meta["rope_freqs_cis"],
            max_seqlen=meta["max_seqlen"],
        )


class MoonViT3dPretrainedModel(nn.Module):
    """Patch embed → encoder → merge: ``(N, 3, p, p)`` → the packed
    ``(Σ h·w / (kh·kw), kh·kw, D)`` (graph path) or one tensor per item
    (eager path)."""

    def __init__(
        self,
        config: KimiK25VisionConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.merge_kernel_size = tuple(config.merge_kernel_size)
        self.patch_size = config.patch_size
        self.patch_embed = MoonVision3dPatchEmbed(config)
        self.encoder = MoonViT3dEncoder(config, attn_backend)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid_thws: Grids | None,
        *,
        encoder_metadata: Mapping[str, torch.Tensor | None] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """With ``encoder_metadata`` holding ``pos_embeds`` (the graph
        path): one gather, no host work, ``grid_thws`` unused. Otherwise
        (vLLM's eager path) ``grid_thws`` is required and ``encoder_metadata``
        (the encoder's, built from the grids when ``None``) is used as
        given."""
        meta = encoder_metadata
        if meta is not None and "pos_embeds" in meta:
            x = self.patch_embed(pixel_values, None, pos_embeds=meta["pos_embeds"])
            return self.encoder.run(x, meta)[meta["merge_gather_idx"]]
        if grid_thws is None:
            raise ValueError("need grid_thws without pos_embeds in encoder_metadata")
        grids = grid_rows(grid_thws, 3)
        if meta is None:
            meta = self.encoder.prepare_encoder_metadata(
                grids, device=pixel_values.device
            )
        x = self.encoder.run(self.patch_embed(pixel_values, grids), meta)
        return tpool_patch_merger(x, grids, self.merge_kernel_size)

    def prepare_encoder_cudagraph_metadata(
        self,
        grid_thw_list: Grids,
        *,
        max_batch_size: int | None,
        max_seqlen_override: int | None = None,
        device: torch.device | str,
    ) -> dict[str, torch.Tensor | None]:
        """The encoder's metadata plus ``pos_embeds`` and ``merge_gather_idx``
        for the graph path (images only)."""
        grids = grid_rows(grid_thw_list, 3)
        meta = self.encoder.prepare_encoder_metadata(
            grids,
            device=device,
            max_batch_size=max_batch_size,
            max_seqlen_override=max_seqlen_override,
        )
        gather = image_merge_gather_index(grids, self.merge_kernel_size)
        meta["pos_embeds"] = self.patch_embed.pos_emb.get_pos_embeds(grids).to(device)
        meta["merge_gather_idx"] = async_tensor_h2d(gather, torch.device(device))
        return meta


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class KimiK25VisionHost(nn.Module):
    """The vision half of vLLM's ``KimiK25ForConditionalGeneration``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`), so host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: KimiK25Config,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.model_config = ModelConfig(
            max_model_len=config.max_model_len, multimodal_config=multimodal_config
        )
        self.hidden_size = config.text_config.hidden_size
        self.vision_tower = MoonViT3dPretrainedModel(config.vision_config, attn_backend)
        self.mm_projector = KimiVLMultiModalProjector(config)

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (tower first, then
        projector) and the fixed time table."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vision_tower,
            generator,
            residual_branch_outputs=("wo", "mlp.fc1"),
            num_residual_branches=2 * self.config.vision_config.num_hidden_layers,
        )
        init_reference_weights_(
            self.mm_projector,
            generator,
            residual_branch_outputs=(),
            num_residual_branches=1,
        )
        self.vision_tower.patch_embed.pos_emb.reset_time_weight()

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        # vLLM casts the whole tower (the time table buffer too) and the
        # projector to the model dtype.
        self.vision_tower.to(dtype=dtype)
        self.mm_projector.to(dtype=dtype)

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each item's ``(h·w / (kh·kw), text)`` embeddings in
        item order, one tower and projector call per item (a video chunk's
        frames pooled over time)."""
        pixel_values = mm_kwargs["pixel_values"]
        grids = grid_rows(mm_kwargs["grid_thws"], 3)
        needed = sum(t * h * w for t, h, w in grids)
        if needed != pixel_values.shape[0]:
            raise ValueError(
                f"pixel values have {pixel_values.shape[0]} patches, grids need "
                f"{needed}"
            )
        projector_dtype = self.mm_projector.linear_1.weight.dtype
        out: list[torch.Tensor] = []
        offset = 0
        for t, h, w in grids:
            rows = t * h * w
            (features,) = self.vision_tower(
                pixel_values[offset : offset + rows], [(t, h, w)]
            )
            out.append(self.mm_projector(features.to(projector_dtype)))
            offset += rows
        return out
