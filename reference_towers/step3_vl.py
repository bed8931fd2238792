"""Step3-VL vision encoder (ViT + two stride convolutions + projector) and
its host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``Step3VisionTransformer`` and of the vision half of
``Step3VLForConditionalGeneration`` (``vllm/model_executor/models/
step3_vl.py``). The processor turns an image into one *global* view (the
whole image resized to ``image_size²``, 728² released) and ``num_patches``
*local* crops of 504² (0, or 2 and more for large or elongated images).
Both run through the same encoder, each view alone:

* embeddings: patch conv (with bias), a class token, the learned position
  table (``nn.Embedding`` of ``(image_size/p)² + 1`` rows; bicubically
  resized with antialiasing for the 36×36 grid of a crop), then three more
  copies of the class row in front (vLLM's tensor-parallel padding): ``4 +
  (side/p)²`` rows;
* blocks that normalise the branch *output*: ``x + LN1(attn(x))``, then ``x +
  LN2(mlp(x))``; dense attention per view, QuickGELU MLP;
* the 4 leading rows dropped (``[:, 4:]``), the patch grid put back as an
  image, ``vit_downsampler`` (Conv2d k=2, stride ``understand_projector_stride``)
  and ``vit_downsampler2`` (Conv2d k=3, s=2, p=1), then
  ``vit_large_projector`` to the text width: ``img_output_tokens`` (169)
  rows per global view, ``patch_output_tokens`` (81) per crop.

An item's final rows are its crops' rows in crop order, then its global
rows (``_process_image_input``): ``81·num_patches + 169`` in all.

What a mixin modelled on vLLM's Step3-VL mixin reads exists with vLLM's name
and meaning:

* host: ``config.hidden_size`` (text width), ``config.vision_config.{
  image_size, patch_size}``, ``config.understand_projector_stride``,
  ``img_output_tokens``, ``patch_output_tokens``,
  ``_compute_spatial_tokens(size, patch_size, stride)``,
  ``_batched_encoder_forward(pixel_values)`` ``(views, 3, s, s)`` →
  ``(views · tokens, text)``, ``model_config.max_model_len``,
  ``multimodal_config``;
* also as vLLM has them: ``vision_model`` (``embeddings``,
  ``transformer.layers``), ``vit_downsampler``, ``vit_downsampler2``,
  ``vit_large_projector``, ``_get_vision_model_output(x)`` (ViT without the
  4 leading rows), ``_process_image_features(x)``, ``device``, ``dtype``
  (of the first parameter);
* ``vision_model.transformer.layers[i].self_attn.attn.attn_backend``.

Inputs as vLLM hands them to the model (``mm_kwargs``): ``pixel_values``
``(n, 3, S, S)``, ``patch_pixel_values`` ``(Σ num_patches, 3, 504, 504)``
(``(0, 3, 504, 504)`` when no image has crops), both CLIP-normalised in the
model dtype (vLLM's processing context casts floating outputs to it; the
tower itself casts nothing), and ``num_patches`` (an int64 CPU tensor).

Full size (:meth:`Step3VLConfig.full`), stepfun-ai/step3: vision encoder as
vLLM's ``Step3VisionEncoderConfig`` defaults (hidden 1792, 63 layers, 16
heads of 112, intermediate 3072, ``output_hidden_size`` 4096, image 728,
patch 14, QuickGELU, LayerNorm eps 1e-5); text width 7168
(``Step3TextConfig`` default); ``understand_projector_stride`` 2, inferred
(the config class defaults to 1, but vLLM's ``Step3VLImageProcessor`` hard
codes 169 global and 81 crop feature tokens, which only stride 2 gives:
stride 1 would give 676 and 324, and the prompt would not match the
features); ``projector_bias`` True (config default; a guess for the
checkpoint). The checkpoint's own config.json could not be read here. The
reference caps crops per image at 36 (the 6×6 grid of a 3024² image, the
processor's largest square input); the processor emits more for very
elongated images (a 3024×32 image gives 95 crops), which the reference does
not draw.

Deliberate differences from vLLM, none visible to a mixin:

* attention is ``F.scaled_dot_product_attention`` for every backend;
* no tensor parallelism or data-parallel sharding;
* the position table is read as ``position_embedding.weight`` rather than
  looked up through a ``position_ids`` buffer (the same rows);
* ``model_config`` is a stand-in holding ``max_model_len`` (from the config)
  and the multimodal config; vLLM's is the engine's model config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import ModelConfig, MultiModalConfig
from reference_towers._layers import (
    DenseAttention,
    ReleasedSizes,
    activation,
    init_reference_weights_,
)

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "CROP_SIZE",
    "NUM_PAD_ROWS",
    "Step3VLConfig",
    "Step3VLVisionHost",
    "Step3VisionEncoderConfig",
    "Step3VisionTransformer",
    "resized_position_table",
    "spatial_tokens",
]

# Local crops are this square; vLLM's processor and mixin hard-code it.
CROP_SIZE = 504

# Leading rows the encoder output carries before the patches: the class row
# and its three tensor-parallel padding copies (``[:, 4:]`` drops them).
NUM_PAD_ROWS = 4

# The Step3-VL processor's normalisation (CLIP's).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _problems_with_positive_fields(obj: Any) -> list[str]:
    problems = []
    for name, value in vars(obj).items():
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if is_number and value <= 0:
            problems.append(f"{name} must be positive, got {value}")
    return problems


@dataclass(frozen=True)
class Step3VisionEncoderConfig:
    """vLLM's ``Step3VisionEncoderConfig``; defaults are the ``full`` values."""

    hidden_size: int = 1792
    intermediate_size: int = 3072
    output_hidden_size: int = 4096
    """Width after ``vit_downsampler`` (twice that after the second conv)."""
    num_hidden_layers: int = 63
    num_attention_heads: int = 16
    num_channels: int = 3
    image_size: int = 728
    patch_size: int = 14
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        problems = _problems_with_positive_fields(self)
        if self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        for size, what in (
            (self.image_size, "image_size"),
            (CROP_SIZE, "the crop size"),
        ):
            if size % self.patch_size:
                problems.append(f"{what} {size} is not a multiple of patch_size")
        activation(self.hidden_act)  # raises on unknown names
        if problems:
            raise ValueError("invalid Step3VisionEncoderConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_patches(self) -> int:
        """Rows of the position table, less the class row."""
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class Step3VLConfig(ReleasedSizes):
    """vLLM's ``Step3VLConfig`` as far as the vision half reads it, plus two
    reference-only fields; defaults are the ``full`` values."""

    vision_config: Step3VisionEncoderConfig = field(
        default_factory=Step3VisionEncoderConfig
    )
    hidden_size: int = 7168
    """The text width (vLLM sets it from ``text_config.hidden_size``)."""
    understand_projector_stride: int = 2
    projector_bias: bool = True
    max_patches_per_image: int = 36
    """Reference only: the most crops a legal item has."""
    max_model_len: int = 65536
    """Reference only: what the host's ``model_config`` reports
    (``Step3TextConfig.max_position_embedding``)."""

    def __post_init__(self) -> None:
        problems = _problems_with_positive_fields(self)
        for size in (self.vision_config.image_size, CROP_SIZE):
            if (
                spatial_tokens(
                    size,
                    self.vision_config.patch_size,
                    self.understand_projector_stride,
                )
                < 1
            ):
                problems.append(f"a {size}² view leaves no tokens after the convs")
        if problems:
            raise ValueError("invalid Step3VLConfig: " + "; ".join(problems))

    @property
    def global_view_patches(self) -> int:
        """ViT patches of the global view (``(image_size / p)²``)."""
        return self.vision_config.num_patches

    @property
    def crop_patches(self) -> int:
        """ViT patches of one crop (``(504 / p)²``)."""
        return (CROP_SIZE // self.vision_config.patch_size) ** 2

    @property
    def img_output_tokens(self) -> int:
        return spatial_tokens(
            self.vision_config.image_size,
            self.vision_config.patch_size,
            self.understand_projector_stride,
        )

    @property
    def patch_output_tokens(self) -> int:
        return spatial_tokens(
            CROP_SIZE, self.vision_config.patch_size, self.understand_projector_stride
        )

    @classmethod
    def tiny(cls) -> Step3VLConfig:
        """A tower that runs in well under a second per item on a CPU.

        The view geometry is the released one (728² global views and 504²
        crops of 14² patches, stride 2: 169 and 81 output rows), so items,
        budgets and inputs have the real layout; widths and depths shrink
        (ViT 32 wide with 2 heads, 2 layers; convs to 24 then 48; text width
        96). Items take 0 or 2..6 crops, so the largest (655 rows) exceeds
        the CPU suite's 512-token budget.
        """
        return cls(
            vision_config=Step3VisionEncoderConfig(
                hidden_size=32,
                intermediate_size=64,
                output_hidden_size=24,
                num_hidden_layers=2,
                num_attention_heads=2,
            ),
            hidden_size=96,
            max_patches_per_image=6,
            max_model_len=4096,
        )

    @classmethod
    def full(cls) -> Step3VLConfig:
        """stepfun-ai/step3's dimensions (sources in the module docstring)."""
        return cls()


def spatial_tokens(size: int, patch_size: int, stride: int) -> int:
    """Output rows of one ``size²`` view: the ``g×g`` patch grid (``g = size //
    patch_size``) after a k=2 conv of ``stride`` and a k=3, s=2, p=1 conv."""
    grid = size // patch_size
    first = (grid - 2) // stride + 1
    second = (first - 1) // 2 + 1
    return second * second


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


def resized_position_table(table: torch.Tensor, patches: int) -> torch.Tensor:
    """vLLM's ``get_abs_pos``: the ``(1, 1 + N, D)`` position table for a view
    of ``patches`` patches. Unchanged when the square grids agree; else the
    patch rows are resized bicubically with antialiasing (in fp32, back to
    the table's dtype) and the class row is kept in front."""
    dim = table.shape[-1]
    rows = table.squeeze(0)
    cls_row, grid_rows = rows[:1], rows[1:]
    src = int(math.sqrt(rows.shape[0] - 1))
    tgt = int(math.sqrt(patches))
    if src == tgt:
        return table
    grid = grid_rows.reshape(1, src, src, dim).permute(0, 3, 1, 2).float()
    grid = F.interpolate(
        grid, size=(tgt, tgt), mode="bicubic", antialias=True, align_corners=False
    ).to(table.dtype)
    grid = grid.permute(0, 2, 3, 1).reshape(tgt * tgt, dim)
    return torch.cat([cls_row, grid], dim=0).reshape(1, tgt * tgt + 1, dim)


class Step3VisionEmbeddings(nn.Module):
    """Patch conv → ``[class; patches]`` + position table → three more copies
    of the first row in front."""

    def __init__(self, config: Step3VisionEncoderConfig) -> None:
        super().__init__()
        self.embed_dim = config.hidden_size
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.class_embedding = nn.Parameter(torch.randn(1, self.embed_dim))
        self.patch_embedding = nn.Conv2d(
            config.num_channels,
            self.embed_dim,
            kernel_size=self.patch_size,
            stride=self.patch_size,
            bias=True,
        )
        self.num_patches = config.num_patches
        self.pad_tp_size = NUM_PAD_ROWS
        self.position_embedding = nn.Embedding(self.num_patches + 1, self.embed_dim)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch = pixel_values.shape[0]
        patches = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(batch, 1, -1)
        embeddings = torch.cat([cls, patches], dim=1)
        table = self.position_embedding.weight.unsqueeze(0)
        embeddings = embeddings + resized_position_table(table, patches.shape[1])
        copies = embeddings[:, :1, :].repeat(1, self.pad_tp_size - 1, 1)
        return torch.cat([copies, embeddings], dim=1)


class Step3VisionAttention(nn.Module):
    """Fused biased ``qkv_proj`` (``[q; k; v]``) → dense attention per view →
    biased ``out_proj``."""

    def __init__(
        self, config: Step3VisionEncoderConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        dim = config.hidden_size
        self.qkv_proj = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)
        self.attn = DenseAttention(
            config.num_attention_heads, config.head_dim, attn_backend
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).chunk(3, dim=-1)
        return self.out_proj(self.attn(q, k, v))


class Step3VisionMLP(nn.Module):
    def __init__(self, config: Step3VisionEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Step3VisionEncoderLayer(nn.Module):
    """``x + layer_norm1(attn(x))``, then ``x + layer_norm2(mlp(x))``: the
    norms act on the branch outputs, not on the block input."""

    def __init__(
        self, config: Step3VisionEncoderConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.self_attn = Step3VisionAttention(config, attn_backend)
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = Step3VisionMLP(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.layer_norm1(self.self_attn(hidden_states))
        return hidden_states + self.layer_norm2(self.mlp(hidden_states))


class Step3VisionEncoder(nn.Module):
    def __init__(
        self, config: Step3VisionEncoderConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            Step3VisionEncoderLayer(config, attn_backend)
            for _ in range(config.num_hidden_layers)
        )

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        hidden_states = inputs_embeds
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states


class Step3VisionTransformer(nn.Module):
    """``(views, C, s, s)`` → ``(views, 4 + (s/p)², D)``."""

    def __init__(
        self,
        config: Step3VisionEncoderConfig,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.image_size = config.image_size
        self.embeddings = Step3VisionEmbeddings(config)
        self.transformer = Step3VisionEncoder(config, attn_backend)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.transformer(inputs_embeds=self.embeddings(pixel_values))


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class Step3VLVisionHost(nn.Module):
    """The vision half of vLLM's ``Step3VLForConditionalGeneration``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`); host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses. The
    ``_``-prefixed methods are vLLM's own helpers, which its mixin calls.
    """

    def __init__(
        self,
        config: Step3VLConfig,
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
        vision = config.vision_config
        self.vision_model = Step3VisionTransformer(vision, attn_backend)
        self.vit_downsampler = nn.Conv2d(
            vision.hidden_size,
            vision.output_hidden_size,
            kernel_size=2,
            stride=config.understand_projector_stride,
        )
        self.vit_downsampler2 = nn.Conv2d(
            vision.output_hidden_size,
            vision.output_hidden_size * 2,
            kernel_size=3,
            stride=2,
            padding=1,
        )
        self.vit_large_projector = nn.Linear(
            vision.output_hidden_size * 2,
            config.hidden_size,
            bias=config.projector_bias,
        )

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @staticmethod
    def _compute_spatial_tokens(size: int, patch_size: int, stride: int) -> int:
        return spatial_tokens(size, patch_size, stride)

    @property
    def img_output_tokens(self) -> int:
        """Rows of one global view (169 released)."""
        return self.config.img_output_tokens

    @property
    def patch_output_tokens(self) -> int:
        """Rows of one 504² crop (81 released)."""
        return self.config.patch_output_tokens

    def _get_vision_model_output(self, input_tensor: torch.Tensor) -> torch.Tensor:
        """ViT rows without the class row and its three padding copies."""
        return self.vision_model(input_tensor)[:, NUM_PAD_ROWS:]

    def _process_image_features(self, image_features: torch.Tensor) -> torch.Tensor:
        """``(views, g², D)`` → the two convs → ``(views, tokens, text)``."""
        batch, patches = image_features.shape[:2]
        side = int(math.sqrt(patches))
        grid = image_features.permute(0, 2, 1).reshape(batch, -1, side, side)
        grid = self.vit_downsampler2(self.vit_downsampler(grid))
        rows = grid.reshape(batch, grid.shape[1], -1).permute(0, 2, 1)
        return self.vit_large_projector(rows)

    def _batched_encoder_forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``(views, 3, s, s)`` → ``(views · tokens, text)``, views in order."""
        features = self._process_image_features(
            self._get_vision_model_output(pixel_values)
        )
        return features.reshape(-1, features.shape[-1])

    # -- reference-only ------------------------------------------------------

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`). Each block's two LayerNorms are
        further scaled by ``1 / sqrt(2 · layers)``: they set the size of what
        a branch adds to the residual stream (the norm comes after the
        branch), which must stay O(1) after all 63 blocks in bf16."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vision_model,
            generator,
            residual_branch_outputs=(),
            num_residual_branches=1,
            embeddings=("class_embedding",),
        )
        layers = self.vision_model.transformer.layers
        branch_scale = 1.0 / math.sqrt(2 * len(layers))
        with torch.no_grad():
            for layer in layers:
                for norm in (layer.layer_norm1, layer.layer_norm2):
                    norm.weight.mul_(branch_scale)
                    norm.bias.mul_(branch_scale)
        for projector in (
            self.vit_downsampler,
            self.vit_downsampler2,
            self.vit_large_projector,
        ):
            init_reference_weights_(
                projector,
                generator,
                residual_branch_outputs=(),
                num_residual_branches=1,
            )

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        self.to(dtype=dtype)

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each item's ``(81·num_patches + 169, text)`` rows, its
        crops' rows then its global rows, each view run alone (vLLM's
        ``_process_image_input`` order, with nothing batched)."""
        pixel_values = mm_kwargs["pixel_values"]
        crops = mm_kwargs["patch_pixel_values"]
        counts = [int(n) for n in mm_kwargs["num_patches"]]
        if len(counts) != pixel_values.shape[0] or sum(counts) != crops.shape[0]:
            raise ValueError(
                f"{pixel_values.shape[0]} images and {crops.shape[0]} crops do not "
                f"match num_patches {counts}"
            )
        out, offset = [], 0
        for i, n in enumerate(counts):
            parts = [
                self._batched_encoder_forward(crops[offset + j : offset + j + 1])
                for j in range(n)
            ]
            parts.append(self._batched_encoder_forward(pixel_values[i : i + 1]))
            out.append(torch.cat(parts))
            offset += n
        return out
