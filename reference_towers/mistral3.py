"""Mistral3's HF Pixtral vision tower, projector and host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``PixtralHFVisionModel`` (``vllm/model_executor/models/pixtral.py``, the
tower of Hugging Face-format Pixtral checkpoints) and
``Mistral3MultiModalProjector`` (``mistral3.py``), with the vision half of
``Mistral3ForConditionalGeneration``. Each image is its own ``(3, H_i,
W_i)`` tensor: the input normalisation and the bias-free patch
convolution's weight as one matrix product over every image's patches
(``pixtral_patch_embed``: the host always builds an input norm, the
identity unless the processor's normalisation moves to the device) →
``ln_pre`` (RMSNorm) → pre-RMSNorm blocks with Transformers' axial 2-D
RoPE (cos / sin of ``head_dim``, ``rotate_half``) and per-image varlen
attention, gated MLP → projector: RMSNorm, patch merger (each ``m×m``
window of an image's patch grid, channel-major, one bias-free Linear),
``linear_1`` → activation → ``linear_2`` to the text width → split per
image. The layers it shares with the Mistral-format tower (RMSNorm, vLLM's
linear conventions, the varlen attention, the packed sequence metadata, the
merger's window order) come from :mod:`reference_towers.pixtral`.

Host API (what a Mistral3 mixin reads), with vLLM's names and meaning:

* host: ``config.{vision_config, text_config.hidden_size,
  spatial_merge_size, projector_hidden_act, multimodal_projector_bias,
  vision_feature_layer}``, ``multimodal_config``,
  ``model_config.max_model_len``, ``vision_tower``,
  ``multi_modal_projector``, ``_parse_and_validate_image_input(**kwargs)``,
  ``_process_image_input(image_input)``, ``embed_multimodal(**kwargs)``;
* ``vision_tower``: ``config``, ``input_norm`` (``(patches, C·p²)``,
  dtype → normalised rows in that dtype), ``patch_conv`` (its ``weight``),
  ``ln_pre``, ``transformer.layers[i]`` (``layer(hidden_states, cos, sin,
  cu_seqlens, max_seqlen, sequence_lengths)``),
  ``transformer(x, (cos, sin), cu_seqlens, max_seqlen, sequence_lengths,
  return_all_hidden_states=False)``,
  ``transformer.layers[i].attention.attn.attn_backend``,
  ``patch_positional_embedding`` (``inv_freq`` 1-D fp32: the axial table of
  Transformers 5.17 and later; ``(x, position_ids)`` with ``(N, 2)`` (row,
  column) ids → ``(cos, sin)`` ``(N, head_dim)`` in ``x``'s dtype),
  ``dtype``, ``device``, ``forward(pixel_values)`` → a tuple of ``(h·w,
  D)``;
* ``multi_modal_projector``: ``norm``, ``patch_merger``
  (``merging_layer``, ``forward(features, image_sizes)`` with sizes in
  pixels), ``linear_1`` / ``linear_2`` (returning ``(output, bias)``), ``act``.

Full-size figures (``full()``) are Mistral-Small-3.1-24B-Instruct-2503's
Hugging Face ``config.json``: vision width 1024, 24 layers, 16 heads, MLP
4096, patch 14, ``image_size`` 1540, SiLU-gated MLP (``hidden_act``
``silu``), RoPE theta 1e4; ``spatial_merge_size`` 2, projector GELU
(exact), no projector biases, ``vision_feature_layer`` -1 (every layer);
text width 5120, ``max_model_len`` 131072. The RMSNorm eps (1e-5) of
``ln_pre``, the blocks and the projector's norm is vLLM's code. The
processor's resize rule is ``bench/image_traffic.py``'s
``mistral3_image_size`` (sides floored, where mistral_common rounds).

Deliberate differences from vLLM, none visible to a mixin:

* The RoPE's ``inv_freq`` is recomputed when the host is initialised and
  cast (it is a non-persistent fp32 buffer, as in Transformers; the host is
  built on the meta device and cast whole).
* FLASHINFER is refused (the reference runtime has none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import ModelConfig, MultiModalConfig
from reference_towers._layers import ReleasedSizes, init_reference_weights_
from reference_towers.pixtral import (
    EncoderAttention,
    RMSNorm,
    VllmLinear,
    packed_sequence_metadata,
    window_rows,
)

__all__ = [
    "IdentityInputNorm",
    "Mistral3Config",
    "Mistral3MultiModalProjector",
    "Mistral3PatchMerger",
    "Mistral3TextConfig",
    "Mistral3VisionHost",
    "PixtralHFVisionModel",
    "PixtralVisionConfig",
    "PixtralVisionRotaryEmbedding",
    "apply_rotary_pos_emb",
    "pixtral_patch_embed",
]

#: The gated MLP's activations (vLLM's ``get_act_and_mul_fn``).
_ACT_AND_MUL = {"silu": F.silu, "gelu": F.gelu}


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PixtralVisionConfig:
    """Transformers' ``PixtralVisionConfig`` (the values the tower reads)."""

    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 1540
    patch_size: int = 14
    hidden_act: str = "silu"
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        problems = []
        if min(self.hidden_size, self.num_attention_heads, self.patch_size) < 1:
            problems.append("sizes must be positive")
        elif self.hidden_size % self.num_attention_heads:
            problems.append("hidden_size is not a multiple of num_attention_heads")
        elif self.head_dim % 4:
            problems.append("head dim must be a multiple of 4 (axial RoPE)")
        if self.hidden_act not in _ACT_AND_MUL:
            problems.append(f"unknown hidden_act {self.hidden_act!r}")
        if problems:
            raise ValueError("invalid PixtralVisionConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rope_parameters(self) -> dict[str, Any]:
        return {"rope_type": "axial", "rope_theta": self.rope_theta}


@dataclass(frozen=True)
class Mistral3TextConfig:
    hidden_size: int = 5120


@dataclass(frozen=True)
class Mistral3Config(ReleasedSizes):
    """The host's ``config`` (Transformers' ``Mistral3Config`` names) plus
    the model length. Defaults are the ``full`` values."""

    vision_config: PixtralVisionConfig = field(default_factory=PixtralVisionConfig)
    text_config: Mistral3TextConfig = field(default_factory=Mistral3TextConfig)
    spatial_merge_size: int = 2
    projector_hidden_act: str = "gelu"
    multimodal_projector_bias: bool = False
    vision_feature_layer: int = -1
    max_model_len: int = 131072

    def __post_init__(self) -> None:
        if self.vision_feature_layer != -1:
            raise ValueError("only vision_feature_layer -1 (every layer) is built")
        if self.projector_hidden_act != "gelu":
            raise ValueError("only the GELU projector is built")
        if self.vision_config.image_size % self.cell:
            raise ValueError("image_size is not a multiple of patch x merge")

    @property
    def patch_size(self) -> int:
        return self.vision_config.patch_size

    @property
    def cell(self) -> int:
        """Pixels a side of one output token (``patch · merge``)."""
        return self.vision_config.patch_size * self.spatial_merge_size

    @property
    def max_tokens_per_side(self) -> int:
        """Output tokens a side of the largest image the processor emits."""
        return self.vision_config.image_size // self.cell

    @classmethod
    def tiny(cls) -> Mistral3Config:
        """A tower that runs in milliseconds on a CPU: patch 14 and merge 2
        as released (items are pixel sizes), images up to 224 px a side (8×8
        output tokens, the driver's tiny cap of 64), width 64, head dim 32, 2
        layers, text width 96, model length 512; projector biases on so that
        a dropped one shows."""
        return cls(
            vision_config=PixtralVisionConfig(
                hidden_size=64,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=2,
                image_size=224,
            ),
            text_config=Mistral3TextConfig(hidden_size=96),
            multimodal_projector_bias=True,
            max_model_len=512,
        )

    @classmethod
    def full(cls) -> Mistral3Config:
        """Mistral-Small-3.1-24B-Instruct-2503's (module docstring)."""
        return cls()


# ---------------------------------------------------------------------------
# Tower
# ---------------------------------------------------------------------------


class IdentityInputNorm(nn.Module):
    """vLLM's input norm when the processor normalises on the host: a cast
    to the tower dtype."""

    @property
    def input_dtype(self) -> torch.dtype | None:
        return None

    def forward(
        self, pixel_values: torch.Tensor, visual_dtype: torch.dtype
    ) -> torch.Tensor:
        return pixel_values.to(visual_dtype, copy=False)


class PixtralVisionRotaryEmbedding(nn.Module):
    """Transformers' axial 2-D RoPE (5.17 and later): ``inv_freq`` holds the
    even then the odd frequencies ``theta^(-2j / head_dim)``; a patch at
    ``(r, c)`` gets angles ``r·f_even`` then ``c·f_odd``, the pair repeated
    to ``head_dim`` (``rotate_half`` halves)."""

    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.attention_scaling = 1.0
        self.register_buffer("inv_freq", self._inv_freq(), persistent=False)

    def _inv_freq(self) -> torch.Tensor:
        dim = self.config.head_dim
        freqs = 1.0 / (
            self.config.rope_theta
            ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)
        )
        return torch.cat([freqs[0::2], freqs[1::2]])

    def reset_inv_freq(self) -> None:
        """Recompute the fp32 buffer (after ``to_empty`` or a cast)."""
        self.inv_freq = self._inv_freq().to(self.inv_freq.device)

    @torch.no_grad()
    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids[..., None].float() * self.inv_freq.to(
            device=x.device, dtype=torch.float32
        )
        quarter = angles.shape[-1] // 2
        # Rows with the even frequencies, columns with the odd ones.
        halves = torch.cat([angles[:, 0, :quarter], angles[:, 1, quarter:]], dim=-1)
        full = torch.cat([halves, halves], dim=-1)
        return full.cos().to(x.dtype), full.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformers' ``apply_rotary_pos_emb`` (half-split rotation)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class PixtralHFMLP(nn.Module):
    """``down_proj(act(gate) · up)``, gate first in ``gate_up_proj``."""

    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        width, inner = config.hidden_size, config.intermediate_size
        self.gate_up_proj = VllmLinear(width, 2 * inner, bias=False)
        self.down_proj = VllmLinear(inner, width, bias=False)
        self.act = _ACT_AND_MUL[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        out, _ = self.down_proj(self.act(gate) * up)
        return out


class PixtralHFAttention(nn.Module):
    """Bias-free fused QKV → Transformers' RoPE → varlen attention →
    bias-free out; returns ``(output, None)`` as vLLM's does."""

    def __init__(
        self, config: PixtralVisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.config = config
        self.head_dim = config.head_dim
        self.n_heads = config.num_attention_heads
        self.tp_size = 1
        width = config.hidden_size
        self.qkv_proj = VllmLinear(width, 3 * width, bias=False)
        self.o_proj = VllmLinear(width, width, bias=False)
        self.attn = EncoderAttention(self.n_heads, self.head_dim, attn_backend)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
        sequence_lengths: torch.Tensor | None,
    ) -> tuple[torch.Tensor, None]:
        batch, patches, _ = hidden_states.shape
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = (
            t.reshape(batch, patches, self.n_heads, self.head_dim)
            for t in qkv.chunk(3, dim=-1)
        )
        cos, sin = position_embeddings
        # (patches, head_dim) tables against (batch, heads, patches, head_dim).
        q, k = apply_rotary_pos_emb(
            q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=0
        )
        out = self.attn(
            q.transpose(1, 2).contiguous(),
            k.transpose(1, 2).contiguous(),
            v,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            sequence_lengths=sequence_lengths,
        )
        out, _ = self.o_proj(out.reshape(batch, patches, -1))
        return out, None


class PixtralHFTransformerBlock(nn.Module):
    def __init__(
        self, config: PixtralVisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size)
        self.attention = PixtralHFAttention(config, attn_backend)
        self.feed_forward = PixtralHFMLP(config)
        self.ffn_norm = RMSNorm(config.hidden_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        rotary_pos_emb_cos: torch.Tensor,
        rotary_pos_emb_sin: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
        sequence_lengths: torch.Tensor | None,
    ) -> torch.Tensor:
        r, _ = self.attention(
            self.attention_norm(hidden_states),
            position_embeddings=(rotary_pos_emb_cos, rotary_pos_emb_sin),
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            sequence_lengths=sequence_lengths,
        )
        h = hidden_states + r
        return h + self.feed_forward(self.ffn_norm(h))


class PixtralHFTransformer(nn.Module):
    def __init__(
        self, config: PixtralVisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            PixtralHFTransformerBlock(config, attn_backend)
            for _ in range(config.num_hidden_layers)
        )

    def forward(
        self,
        x: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
        sequence_lengths: torch.Tensor | None,
        return_all_hidden_states: bool,
    ) -> torch.Tensor | list[torch.Tensor]:
        cos, sin = position_embeddings
        states = [x]
        for layer in self.layers:
            x = layer(x, cos, sin, cu_seqlens, max_seqlen, sequence_lengths)
            states.append(x)
        return states if return_all_hidden_states else x


def pixtral_patch_embed(
    images: Sequence[torch.Tensor], weight: torch.Tensor, input_norm: nn.Module
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Every image's patches as rows ``(C, p, p)`` (images in order,
    patches row-major), normalised by ``input_norm`` to the weight dtype,
    times the patch convolution's weight: ``(1, Σ h·w, D)`` and the grids."""
    out_channels, channels, p, _ = weight.shape
    rows, grids = [], []
    for image in images:
        _, height, width = image.shape
        h, w = height // p, width // p
        grids.append((h, w))
        patches = image[:, : h * p, : w * p].reshape(channels, h, p, w, p)
        rows.append(patches.permute(1, 3, 0, 2, 4).reshape(h * w, channels * p * p))
    normed = input_norm(torch.cat(rows), weight.dtype)
    projected = F.linear(normed, weight.reshape(out_channels, -1))
    return projected.unsqueeze(0), grids


class PixtralHFVisionModel(nn.Module):
    """Patch embedding of every image at once → ``ln_pre`` → blocks
    (attention within each image) → one ``(h·w, D)`` tensor per image."""

    def __init__(
        self,
        config: PixtralVisionConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.input_norm = IdentityInputNorm()
        self.patch_conv = nn.Conv2d(
            config.num_channels,
            config.hidden_size,
            kernel_size=config.patch_size,
            stride=config.patch_size,
            bias=False,
        )
        self.ln_pre = RMSNorm(config.hidden_size)
        self.transformer = PixtralHFTransformer(config, attn_backend)
        self.patch_positional_embedding = PixtralVisionRotaryEmbedding(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_conv.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_conv.weight.device

    def forward(self, pixel_values: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        images = [image.to(device=self.device) for image in pixel_values]
        embeds, grids = pixtral_patch_embed(
            images, self.patch_conv.weight, self.input_norm
        )
        sizes = [h * w for h, w in grids]
        x = self.ln_pre(embeds)
        positions = torch.cat(
            [torch.cartesian_prod(torch.arange(h), torch.arange(w)) for h, w in grids]
        ).reshape(-1, 2)
        rope = self.patch_positional_embedding(x, positions.to(self.device))
        attention = self.transformer.layers[0].attention
        cu_seqlens, max_seqlen, sequence_lengths = packed_sequence_metadata(
            sizes, attention.attn.attn_backend, self.device
        )
        out = self.transformer(
            x,
            rope,
            cu_seqlens,
            max_seqlen,
            sequence_lengths,
            return_all_hidden_states=False,
        )
        return torch.split(out.squeeze(0), sizes)


# ---------------------------------------------------------------------------
# Projector and host
# ---------------------------------------------------------------------------


class Mistral3PatchMerger(nn.Module):
    """The merger of :class:`reference_towers.pixtral.PatchMerger` with
    image sizes in pixels and a plain ``nn.Linear``."""

    def __init__(
        self, vision_hidden_size: int, spatial_merge_size: int, patch_size: int
    ) -> None:
        super().__init__()
        self.vision_hidden_size = vision_hidden_size
        self.spatial_merge_size = spatial_merge_size
        self.patch_size = patch_size
        self.merging_layer = nn.Linear(
            vision_hidden_size * spatial_merge_size**2, vision_hidden_size, bias=False
        )

    def forward(
        self, image_features: torch.Tensor, image_sizes: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        p = self.patch_size
        grids = [(int(h) // p, int(w) // p) for h, w in image_sizes]
        rows = window_rows(image_features, grids, self.spatial_merge_size)
        return self.merging_layer(rows)


class Mistral3MultiModalProjector(nn.Module):
    """``linear_2(act(linear_1(merger(norm(x)))))``."""

    def __init__(self, config: Mistral3Config) -> None:
        super().__init__()
        vision, text = config.vision_config.hidden_size, config.text_config.hidden_size
        bias = config.multimodal_projector_bias
        self.norm = RMSNorm(vision)
        self.patch_merger = Mistral3PatchMerger(
            vision, config.spatial_merge_size, config.vision_config.patch_size
        )
        self.linear_1 = VllmLinear(vision, text, bias=bias)
        self.act = nn.GELU()
        self.linear_2 = VllmLinear(text, text, bias=bias)

    def forward(
        self, image_features: torch.Tensor, image_sizes: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        x = self.patch_merger(self.norm(image_features), image_sizes)
        x, _ = self.linear_1(x)
        x, _ = self.linear_2(self.act(x))
        return x


class Mistral3VisionHost(nn.Module):
    """The vision half of vLLM's ``Mistral3ForConditionalGeneration``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`), so host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: Mistral3Config,
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
        self.vision_tower = PixtralHFVisionModel(config.vision_config, attn_backend)
        self.multi_modal_projector = Mistral3MultiModalProjector(config)

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`), tower first, then projector."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vision_tower,
            generator,
            residual_branch_outputs=("o_proj", "down_proj"),
            num_residual_branches=2 * self.config.vision_config.num_hidden_layers,
        )
        init_reference_weights_(
            self.multi_modal_projector,
            generator,
            residual_branch_outputs=(),
            num_residual_branches=1,
        )
        self.vision_tower.patch_positional_embedding.reset_inv_freq()

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        self.vision_tower.to(dtype=dtype)
        self.multi_modal_projector.to(dtype=dtype)
        self.vision_tower.patch_positional_embedding.reset_inv_freq()

    # -- vLLM's entry points -------------------------------------------------

    def _parse_and_validate_image_input(self, **kwargs: object) -> dict | None:
        pixel_values = kwargs.pop("pixel_values", None)
        if pixel_values is None:
            return None
        return {"type": "pixel_values_pixtral", "pixel_values": pixel_values}

    def _process_image_input(
        self, image_input: Mapping[str, Any]
    ) -> tuple[torch.Tensor, ...]:
        """vLLM's semantics: the tower over every image at once, the
        projector over all features with each image's pixel size, a split
        per image."""
        images = image_input["pixel_values"]
        sizes = [(image.shape[-2], image.shape[-1]) for image in images]
        features = self.vision_tower(images)
        tokens = [f.shape[0] // self.config.spatial_merge_size**2 for f in features]
        embeds = self.multi_modal_projector(torch.cat(features), sizes)
        return tuple(torch.split(embeds, tokens))

    def embed_multimodal(self, **kwargs: object) -> tuple[torch.Tensor, ...]:
        image_input = self._parse_and_validate_image_input(**kwargs)
        if image_input is None:
            return ()
        return self._process_image_input(image_input)

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each image's ``(h·w / m², text)`` embeddings in item
        order, one ``_process_image_input`` call per image."""
        return [
            self._process_image_input({"pixel_values": [image]})[0]
            for image in mm_kwargs["pixel_values"]
        ]
