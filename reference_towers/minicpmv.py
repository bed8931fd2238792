"""MiniCPM-V 2.6 vision half (Idefics2 ViT + ``Resampler2_5``) in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's vision path of
``MiniCPMV2_6`` (``vllm/model_executor/models/minicpmv.py``) on its
``Idefics2VisionTransformer`` (``idefics2_vision_model.py``):

* embeddings (``Idefics2VisionEmbeddings``, V:47-151): the stride-``p``
  patch Conv2d over the batch's pixels, flattened row-major, plus a learned
  ``(image_size / p)²`` table looked up at bucketed position ids
  (``get_position_ids``, V:77-136): ``i // stride``, ``i % stride`` of each
  real patch ``i`` (the stride is the slice's own width ``tgt_sizes[:, 1]``
  for a ``(B, 1, L)`` mask, the mask's width for a 2-D ``(B, H, W)`` one)
  divided by the slice's sides and bucketised on ``1/n .. (n-1)/n``; padded
  patches get position 0;
* encoder layers (V:294-327, pre-norm attention and tanh-GELU MLP) with the
  additive padding mask of ``Idefics2VisionTransformer.forward``
  (``apply_encoder_attention_mask=True`` for 2.6; V:480-487): keys of
  padded patches get ``finfo(dtype).min``, through
  ``F.scaled_dot_product_attention`` (V:228-242);
* ``post_layernorm``;
* ``Resampler2_5`` (M:171-272, on ``BaseResampler`` of
  ``layers/resampler.py``): a ``(max_size, D)`` 2-D sincos table (version
  2.5 layout: the first half of the width encodes the column, the second
  the row), grown and re-registered by ``_adjust_pos_cache`` when a slice
  is wider or taller (skipped while a CUDA graph is captured), the key
  padding mask ``seq >= h·w``, ``kv_proj`` (no bias), ``ln_kv``, ``ln_q``
  on the learned queries, ``nn.MultiheadAttention`` (queries, keys ``x +
  pos``, values ``x``), ``ln_post`` and ``@ proj``.

``get_vision_hidden_states`` is 2.6's (M:2191-2222): every slice ``(3, p,
h·w·p)`` zero-padded to the widest, the patch mask of each slice's ``h·w``
patches, ``vpm`` then ``resampler``: ``(slices, query_num, embed_dim)``.

Host API (what the generated mixin reads): ``vpm`` (``embeddings.
patch_size``, ``embeddings.image_size`` and ``forward(pixel_values,
patch_attention_mask, tgt_sizes)``), ``resampler`` (``pos_embed``,
``max_size``, ``forward(x, tgt_sizes)``), ``config.query_num``,
``version``, ``embed_dim``, ``get_vision_hidden_states(data)`` and
``get_max_frames_per_video()``.

Full-size figures (``full()``): SigLIP-400M, 27 layers of width 1152, 16
heads, MLP 4304 (vLLM's ``vit_so400m_patch16_224`` row in
``transformers_utils/configs/radio.py``: the same encoder), tanh-GELU,
LayerNorm eps 1e-6 (Idefics2VisionConfig's defaults); patch 14 and image
size 980 (side 70), ``query_num`` 64, text width 3584 (Qwen2-7B),
``max_slice_num`` 9, ``drop_vision_last_layer`` false: MiniCPM-V 2.6's
released config, **from memory** (not checked against the checkpoint
here). The resampler's table starts at vLLM's hard-coded ``(70, 70)`` and
has ``embed_dim // 128`` heads (M:2171-2189).

Deliberate differences from vLLM, none visible to a mixin: no tensor or
data parallelism (``use_data_parallel``'s sharded encoder drops the mask;
not modelled), no quantisation, the resampler is built in the tower dtype
(vLLM builds it in fp16 and casts it to the model dtype, the same values).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers._layers import (
    ReleasedSizes,
    activation,
    grid_rows,
    init_reference_weights_,
)

__all__ = [
    "MiniCPMVConfig",
    "MiniCPMVImagePixelInputs",
    "MiniCPMVVisionConfig",
    "MiniCPMVVisionHost",
    "Resampler2_5",
    "sincos_table_2d",
    "slice_pixels",
]

RESAMPLER_MAX_SIZE = (70, 70)
"""``Resampler2_5``'s default ``max_size`` (M:178), which 2.6 keeps."""

MAX_FRAMES_PER_VIDEO = 16
"""vLLM's ``_MAX_FRAMES_PER_VIDEO`` (M:122)."""


class MiniCPMVImagePixelInputs(dict):
    """The image input of MiniCPM-V's ``get_vision_hidden_states``: ``type``,
    ``pixel_values`` (every slice, ``(3, p, h * w * p)``) and ``tgt_sizes``
    ``(slices, 2)``, read by key. ``validate`` is the schema's switch (this
    one checks nothing)."""

    def __init__(self, *, validate: bool = True, **fields: Any) -> None:
        super().__init__(**fields)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MiniCPMVVisionConfig:
    """The checkpoint's ``vision_config`` (an ``Idefics2VisionConfig``)."""

    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 980
    patch_size: int = 14
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6


@dataclass(frozen=True)
class MiniCPMVConfig(ReleasedSizes):
    """The host's ``config`` plus processor values; defaults are the
    ``full`` values (see the module docstring)."""

    vision_config: MiniCPMVVisionConfig = field(default_factory=MiniCPMVVisionConfig)
    hidden_size: int = 3584
    """The text width: the resampler's output (``embed_dim``)."""
    query_num: int = 64
    version: float = 2.6
    max_slice_num: int = 9
    drop_vision_last_layer: bool = False
    slice_patch_limit: int = 1088
    """Processor: at most this many patches a slice. ``find_best_resize``
    aims each slice at ``scale_resolution²`` (448², 32 x 32 patches) and
    rounds both sides to the patch; 33² bounds that rounding (an upper
    bound of the tower's own, not the processor's exact set)."""
    max_model_len: int = 8192

    def __post_init__(self) -> None:
        vision = self.vision_config
        problems = []
        if vision.hidden_size % vision.num_attention_heads:
            problems.append("hidden_size is no multiple of the heads")
        if self.hidden_size % 128:
            problems.append("the resampler needs hidden_size // 128 heads")
        if vision.image_size % vision.patch_size:
            problems.append("image_size is no multiple of patch_size")
        if problems:
            raise ValueError("invalid MiniCPMVConfig: " + "; ".join(problems))

    @property
    def max_side(self) -> int:
        """Patches a side of the full slice (``image_size // patch_size``)."""
        return self.vision_config.image_size // self.vision_config.patch_size

    @classmethod
    def tiny(cls) -> MiniCPMVConfig:
        """A tower that runs on a CPU: patch 2, side 34 (so that slices
        wider or taller than 32 patches replay the 32 x 64 and 64 x 32 keys;
        the full-side key needs both sides past 32, more patches than a tiny
        slice has, and is replayed by ``full`` only), width 16 in 2 layers;
        text width 128 (one resampler head), 64 queries and 9 slices as
        released; slices of at most 96 patches. The graphs' slots are the
        spec's fixed 32 x 32 and 32 x 64 patch grids whatever the size, so
        they dominate the cost."""
        return cls(
            vision_config=MiniCPMVVisionConfig(
                hidden_size=16,
                intermediate_size=24,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=68,
                patch_size=2,
            ),
            hidden_size=128,
            slice_patch_limit=96,
            max_model_len=512,
        )

    @classmethod
    def full(cls) -> MiniCPMVConfig:
        return cls()


def version_of(config: MiniCPMVConfig) -> tuple[int, ...]:
    """vLLM's ``get_version_by_config`` (M:471-481) for a config with a
    ``version``."""
    return tuple(int(x) for x in str(config.version).split("."))


# ---------------------------------------------------------------------------
# Tables and layouts
# ---------------------------------------------------------------------------


def sincos_table_2d(embed_dim: int, max_size: tuple[int, int]) -> np.ndarray:
    """``get_2d_sincos_pos_embed(embed_dim, max_size, version=(2, 5))``:
    ``(H, W, D)`` float32. Of each 1-D half (``D / 2`` wide), ``sin`` then
    ``cos`` of ``pos · 10000^(-i / (D / 4))``; the first half is over the
    column (``meshgrid`` puts ``w`` first), the second over the row."""
    if embed_dim % 4:
        raise ValueError(
            f"the 2-D sincos table needs a width divisible by 4, got {embed_dim}"
        )
    rows, cols = max_size
    cw, rh = np.meshgrid(
        np.arange(cols, dtype=np.float32), np.arange(rows, dtype=np.float32)
    )

    def half(pos: np.ndarray) -> np.ndarray:
        quarter = embed_dim // 4
        omega = np.arange(quarter, dtype=np.float32) / np.float32(embed_dim / 4.0)
        omega = 1.0 / 10000**omega
        angles = np.einsum("hw,d->hwd", pos, omega)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)

    return np.concatenate([half(cw), half(rh)], axis=-1)


def slice_pixels(image: torch.Tensor, patch_size: int) -> torch.Tensor:
    """The processor's slice layout (``reshape_by_patch``): ``(C, h·p,
    w·p)`` → ``(C, p, h·w·p)``, the patches side by side in row-major
    order."""
    c, height, width = image.shape
    p = patch_size
    h, w = height // p, width // p
    return image.reshape(c, h, p, w, p).permute(0, 2, 1, 3, 4).reshape(c, p, h * w * p)


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class Idefics2VisionEmbeddings(nn.Module):
    def __init__(self, config: MiniCPMVVisionConfig) -> None:
        super().__init__()
        self.embed_dim = config.hidden_size
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.patch_embedding = nn.Conv2d(
            config.num_channels,
            self.embed_dim,
            kernel_size=self.patch_size,
            stride=self.patch_size,
        )
        self.num_patches_per_side = self.image_size // self.patch_size
        self.position_embedding = nn.Embedding(
            self.num_patches_per_side**2, self.embed_dim
        )

    def get_position_ids(
        self, patch_attention_mask: torch.Tensor, tgt_sizes: torch.Tensor | None
    ) -> torch.Tensor:
        batch = patch_attention_mask.shape[0]
        device = patch_attention_mask.device
        n = self.num_patches_per_side
        boundaries = torch.arange(1 / n, 1.0, 1 / n, device=device)
        flat_mask = patch_attention_mask.view(batch, -1)
        if tgt_sizes is not None:
            tgt_sizes = tgt_sizes.to(device)
            nb_h, nb_w = tgt_sizes[:, 0], tgt_sizes[:, 1]
        elif patch_attention_mask.dim() == 3:
            nb_h = patch_attention_mask[:, :, 0].sum(dim=1)
            nb_w = patch_attention_mask[:, 0, :].sum(dim=1)
        else:
            nb_h = torch.ones(batch, device=device)
            nb_w = patch_attention_mask.sum(dim=1)
        nb_h = nb_h.clamp(min=1).unsqueeze(1)
        nb_w = nb_w.clamp(min=1).unsqueeze(1)
        i = torch.arange(flat_mask.shape[-1], device=device).unsqueeze(0)
        if patch_attention_mask.dim() == 3 and patch_attention_mask.shape[1] > 1:
            stride = patch_attention_mask.shape[2]
        else:
            stride = nb_w
        bucket_h = torch.bucketize((i // stride) / nb_h, boundaries, right=True)
        bucket_w = torch.bucketize((i % stride) / nb_w, boundaries, right=True)
        ids = (bucket_h * n + bucket_w).to(torch.long)
        return torch.where(flat_mask, ids, 0).to(self.position_embedding.weight.device)

    def forward(
        self,
        pixel_values: torch.Tensor,
        patch_attention_mask: torch.Tensor,
        tgt_sizes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        weight = self.patch_embedding.weight
        embeddings = self.patch_embedding(pixel_values.to(weight.dtype))
        embeddings = embeddings.flatten(2).transpose(1, 2)
        ids = self.get_position_ids(patch_attention_mask, tgt_sizes)
        return embeddings + self.position_embedding(ids)


class Idefics2VisionAttention(nn.Module):
    def __init__(
        self, config: MiniCPMVVisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)
        # vLLM keeps the backend on MMEncoderAttention, used only without a
        # mask (never for 2.6, which always passes one).
        self.attn_backend = attn_backend

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        batch, rows, width = hidden.shape
        q, k, v = (
            t.view(batch, rows, self.num_heads, self.head_dim).transpose(1, 2)
            for t in self.qkv_proj(hidden).chunk(3, dim=-1)
        )
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attention_mask, dropout_p=0.0, scale=self.scale
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, rows, width))


class Idefics2EncoderLayer(nn.Module):
    def __init__(
        self, config: MiniCPMVVisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        width, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(width, eps=eps)
        self.self_attn = Idefics2VisionAttention(config, attn_backend)
        self.layer_norm2 = nn.LayerNorm(width, eps=eps)
        self.fc1 = nn.Linear(width, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, width)
        self.act = activation(config.hidden_act)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.layer_norm1(hidden), attention_mask)
        return hidden + self.fc2(self.act(self.fc1(self.layer_norm2(hidden))))


class Idefics2VisionTransformer(nn.Module):
    """``Idefics2VisionTransformer(apply_encoder_attention_mask=True)``."""

    def __init__(
        self,
        config: MiniCPMVVisionConfig,
        attn_backend: AttentionBackendEnum,
        num_layers: int,
    ) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Idefics2VisionEmbeddings(config)
        self.layers = nn.ModuleList(
            Idefics2EncoderLayer(config, attn_backend) for _ in range(num_layers)
        )
        self.post_layernorm = nn.LayerNorm(
            config.hidden_size, eps=config.layer_norm_eps
        )

    def forward(
        self,
        pixel_values: torch.Tensor,
        patch_attention_mask: torch.Tensor | None = None,
        tgt_sizes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch = pixel_values.shape[0]
        p = self.config.patch_size
        flat_mask = None
        if patch_attention_mask is None:
            patch_attention_mask = torch.ones(
                (batch, pixel_values.shape[2] // p, pixel_values.shape[3] // p),
                dtype=torch.bool,
                device=pixel_values.device,
            )
        else:
            flat_mask = patch_attention_mask.view(batch, -1)
        hidden = self.embeddings(pixel_values, patch_attention_mask, tgt_sizes)
        attention_mask = None
        if flat_mask is not None:
            # Additive: padded keys get the dtype's most negative value.
            low = torch.finfo(hidden.dtype).min
            attention_mask = ((~flat_mask).to(hidden.dtype) * low)[:, None, None, :]
        for layer in self.layers:
            hidden = layer(hidden, attention_mask)
        return self.post_layernorm(hidden)


class Resampler2_5(nn.Module):
    """vLLM's ``Resampler2_5`` with a ``kv_proj`` (``kv_dim != embed_dim``)."""

    def __init__(
        self,
        num_queries: int,
        embed_dim: int,
        num_heads: int,
        kv_dim: int,
        max_size: tuple[int, int] = RESAMPLER_MAX_SIZE,
    ) -> None:
        super().__init__()
        self.num_queries = num_queries
        self.embed_dim = embed_dim
        self.query = nn.Parameter(torch.empty(num_queries, embed_dim))
        self.kv_proj = nn.Linear(kv_dim, embed_dim, bias=False)
        self.attn = nn.MultiheadAttention(embed_dim, num_heads)
        self.ln_q = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_kv = nn.LayerNorm(embed_dim, eps=1e-6)
        self.ln_post = nn.LayerNorm(embed_dim, eps=1e-6)
        self.proj = nn.Parameter(torch.empty(embed_dim, embed_dim))
        self.max_size = max_size
        self._set_2d_pos_cache(max_size)

    def _set_2d_pos_cache(
        self, max_size: tuple[int, int], device: torch.device | str = "cpu"
    ) -> None:
        table = torch.from_numpy(sincos_table_2d(self.embed_dim, max_size))
        # Re-registering replaces the tensor (a new address), as vLLM's does.
        self.register_buffer("pos_embed", table.float().to(device), persistent=False)

    def reference_reset_pos_cache(self) -> None:
        """The table at ``max_size`` again (after ``to_empty``), on the
        buffer's device and in its dtype."""
        old = self.pos_embed
        self._set_2d_pos_cache(self.max_size, old.device)
        self.pos_embed = self.pos_embed.to(old.dtype)

    def _adjust_pos_cache(self, tgt_sizes: torch.Tensor, device: torch.device) -> None:
        max_h = int(tgt_sizes[:, 0].max().item())
        max_w = int(tgt_sizes[:, 1].max().item())
        if max_h > self.max_size[0] or max_w > self.max_size[1]:
            self.max_size = (max(max_h, self.max_size[0]), max(max_w, self.max_size[1]))
            self._set_2d_pos_cache(self.max_size, device)

    def forward(self, x: torch.Tensor, tgt_sizes: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != tgt_sizes.shape[0]:
            raise ValueError(f"{x.shape[0]} slices, {tgt_sizes.shape[0]} tgt_sizes")
        batch, device, dtype = x.shape[0], x.device, x.dtype
        capturing = (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        )
        if not capturing:
            self._adjust_pos_cache(tgt_sizes, device)
        tgt_sizes = tgt_sizes.to(device)
        patch_len = tgt_sizes[:, 0] * tgt_sizes[:, 1]
        seq = torch.arange(x.shape[1], device=device).unsqueeze(0)
        tgt_w = tgt_sizes[:, 1].unsqueeze(1).clamp(min=1)
        h_idx = (seq // tgt_w).clamp(max=self.pos_embed.shape[0] - 1)
        w_idx = (seq % tgt_w).clamp(max=self.pos_embed.shape[1] - 1)
        key_padding_mask = seq >= patch_len.unsqueeze(1)
        pos = self.pos_embed[h_idx, w_idx].to(dtype)
        pos = torch.where(key_padding_mask.unsqueeze(-1), torch.zeros_like(pos), pos)
        pos = pos.permute(1, 0, 2)
        x = self.ln_kv(self.kv_proj(x)).permute(1, 0, 2)
        q = self.ln_q(self.query).unsqueeze(1).repeat(1, batch, 1)
        out = self.attn(q, x + pos, x, key_padding_mask=key_padding_mask)[0]
        return self.ln_post(out.permute(1, 0, 2)) @ self.proj


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class MiniCPMVVisionHost(nn.Module):
    """The vision half of vLLM's ``MiniCPMV2_6``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`), so host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: MiniCPMVConfig,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.version = version_of(config)
        vision = config.vision_config
        layers = vision.num_hidden_layers - int(config.drop_vision_last_layer)
        self.vpm = Idefics2VisionTransformer(vision, attn_backend, layers)
        self.embed_dim = config.hidden_size
        self.resampler = Resampler2_5(
            num_queries=config.query_num,
            embed_dim=self.embed_dim,
            num_heads=self.embed_dim // 128,
            kv_dim=vision.hidden_size,
        )

    # -- what the mixin calls ----------------------------------------------

    def get_max_frames_per_video(self) -> int:
        """``MiniCPMVProcessingInfo.get_num_frames_with_most_features``
        (M:806-820) with no images: a frame is one slice (video
        ``max_slice_nums`` 1, M:793) of ``query_num`` tokens; at most 16."""
        mm_config = self.multimodal_config or MultiModalConfig()
        videos = mm_config.get_limit_per_prompt("video")
        frames = (self.config.max_model_len // self.config.query_num) // max(videos, 1)
        return max(min(frames, MAX_FRAMES_PER_VIDEO), 1)

    def get_vision_hidden_states(self, data: Mapping[str, Any]) -> torch.Tensor:
        """2.6's (M:2191-2222): ``(slices, query_num, embed_dim)``."""
        pixel_values = data["pixel_values"]
        tgt_sizes = data["tgt_sizes"]
        batch = len(pixel_values)
        p_rows = pixel_values[0].shape[-2]
        widest = max(item.shape[-1] for item in pixel_values)
        first = pixel_values[0]
        padded = torch.zeros(
            (batch, 3, p_rows, widest), dtype=first.dtype, device=first.device
        )
        for i, item in enumerate(pixel_values):
            padded[i, ..., : item.shape[-1]] = item
        num_patches = tgt_sizes.prod(-1)
        mask = torch.zeros(
            (batch, int(num_patches.max().item())),
            dtype=torch.bool,
            device=first.device,
        )
        for i, n in enumerate(num_patches.tolist()):
            mask[i, :n] = True
        embedding = self.vpm(
            padded, patch_attention_mask=mask.unsqueeze(1), tgt_sizes=tgt_sizes
        )
        return self.resampler(embedding, tgt_sizes)

    # -- reference-only -----------------------------------------------------

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (ViT first, then the
        resampler) and the sincos table."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vpm,
            generator,
            residual_branch_outputs=("out_proj", "fc2"),
            num_residual_branches=2 * len(self.vpm.layers),
        )
        width = self.embed_dim
        with torch.no_grad():
            resampler = self.resampler
            resampler.query.normal_(0.0, 1.0, generator=generator)
            for linear in (resampler.kv_proj, resampler.attn.out_proj):
                linear.weight.normal_(
                    0.0, linear.in_features**-0.5, generator=generator
                )
            resampler.attn.out_proj.bias.normal_(0.0, 0.02, generator=generator)
            resampler.attn.in_proj_weight.normal_(0.0, width**-0.5, generator=generator)
            resampler.attn.in_proj_bias.normal_(0.0, 0.02, generator=generator)
            for norm in (resampler.ln_q, resampler.ln_kv, resampler.ln_post):
                norm.weight.normal_(1.0, 0.05, generator=generator)
                norm.bias.normal_(0.0, 0.02, generator=generator)
            resampler.proj.normal_(0.0, width**-0.5, generator=generator)
        resampler.reference_reset_pos_cache()

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        # vLLM casts the ViT and the resampler (its table buffer too) to the
        # model dtype.
        self.vpm.to(dtype=dtype)
        self.resampler.to(dtype=dtype)

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each image's ``(slices · query_num, embed_dim)``
        rows, one ``get_vision_hidden_states`` call per image."""
        key = "pixel_values" if "pixel_values" in mm_kwargs else "video_pixel_values"
        grid_key = "tgt_sizes" if key == "pixel_values" else "video_tgt_sizes"
        items = mm_kwargs[key]
        sizes = mm_kwargs[grid_key]
        if (
            isinstance(sizes, (list, tuple))
            and sizes
            and isinstance(sizes[0], torch.Tensor)
        ):
            sizes = torch.cat(list(sizes))
        elif isinstance(sizes, torch.Tensor) and sizes.ndim == 3:
            sizes = sizes.reshape(-1, 2)
        rows = grid_rows(sizes, 2)
        if len(rows) != sum(len(slices) for slices in items):
            raise ValueError(
                f"{len(rows)} tgt_sizes rows for {sum(map(len, items))} slices"
            )
        out, offset = [], 0
        for slices in items:
            tgt = torch.tensor(rows[offset : offset + len(slices)], dtype=torch.int64)
            offset += len(slices)
            data = MiniCPMVImagePixelInputs(
                type="pixel_values", pixel_values=list(slices), tgt_sizes=tgt
            )
            out.append(self.get_vision_hidden_states(data).reshape(-1, self.embed_dim))
        return out
