"""InternVL vision encoder (InternViT + pixel shuffle + ``mlp1``) and its
host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's
``InternVisionModel`` (``vllm/model_executor/models/intern_vit.py``) and of
the vision half of ``InternVLChatModel``
(``vllm/model_executor/models/internvl.py``): an image is cut by the
processor into fixed ``image_size²`` tiles (448² for the released models);
each tile runs alone through the ViT — patch conv, a class token, learned
position embeddings, pre-norm blocks with dense attention and layer scales
``ls1``/``ls2`` — its class token is dropped, the ``32×32`` patch grid is
pixel-shuffled by ``downsample_ratio`` (2×2 neighbours into one row) and
``mlp1`` (LayerNorm → Linear → GELU → Linear) maps each row to the text
width: ``num_image_token`` = 256 rows per tile. Tiles never see each other,
so a batch of tiles is one dense ``(tiles, 1025, D)`` forward: no
``cu_seqlens``, no ``max_seqlen``, nothing read on the host.

What a mixin modelled on vLLM's InternVL mixin reads exists with vLLM's
name and meaning:

* host: ``config.text_config.hidden_size`` (graph output width),
  ``config.vision_config.image_size`` (capture tiles are that square),
  ``num_image_token`` (output rows per tile), ``extract_feature(
  pixel_values)`` ``(tiles, 3, S, S)`` → ``(tiles, num_image_token, text)``,
  ``multimodal_config``;
* also as vLLM has them: ``vision_model``, ``mlp1``, ``pixel_shuffle(x,
  scale_factor)``, ``patch_size``, ``patch_tokens``, ``downsample_ratio``,
  ``ps_version``, and ``config.{downsample_ratio, force_image_size,
  select_layer, ps_version, min_dynamic_patch, max_dynamic_patch,
  dynamic_image_size, use_thumbnail}``;
* ``vision_model.encoder.layers[i].attn.attn.attn_backend`` (vLLM keeps it on
  ``MMEncoderAttention``; the InternVL mixin has no backend guard).

Inputs as vLLM hands them to the model (``mm_kwargs``): images
``pixel_values_flat`` ``(Σ tiles, 3, S, S)`` with ``image_num_patches``
(tiles per image, an int64 CPU tensor); videos ``pixel_values_flat_video``
with ``video_num_patches`` (one tile per frame). Pixels are ImageNet-
normalised and arrive in the model dtype (vLLM's processing context casts
floating outputs to it).

Full size (:meth:`InternVLConfig.full`): InternVL3-2B, the model vLLM's
InternVL encoder CUDA graph PR measured. Its vision tower is
InternViT-300M-448px-V2_5, the one InternVL3-1B/2B/8B share; the figures are
those of the published InternVL3-1B ``config.json`` (read here from a public
dump of it): vision hidden 1024, 24 layers, 16 heads, intermediate 4096,
GELU, ``layer_norm`` eps 1e-6, qkv bias, no qk normalisation, image 448,
patch 14; chat config ``downsample_ratio`` 0.5, ``force_image_size`` 448,
``select_layer`` -1, ``ps_version`` "v2", ``min_dynamic_patch`` 1,
``max_dynamic_patch`` 12, ``dynamic_image_size`` and ``use_thumbnail`` on.
Text width 1536: the hidden size of Qwen2.5-1.5B, InternVL3-2B's language
model (not read from the 2B checkpoint here). ``mlp1``'s LayerNorm has
PyTorch's default eps 1e-5 (vLLM builds it without one; the dump shows
1e-05). Frames per video: 16, a guess (vLLM derives the frame count from
the model length; nothing in the checkpoint fixes it).

Deliberate differences from vLLM, none visible to a mixin:

* attention is ``F.scaled_dot_product_attention`` for every backend (vLLM
  dispatches to FlashAttention, SDPA, ...; the same softmax attention);
* no tensor parallelism, data-parallel sharding or dummy heads (vLLM's
  ``InternVLChatModel`` builds the ViT with ``num_dummy_heads=0``);
* ``force_image_size`` must equal ``vision_config.image_size`` (vLLM sizes
  ``num_image_token`` from the one and capture tiles from the other; the
  released configs agree);
* the language model, ``image_token_id`` and the prompt replacement are not
  modelled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers._layers import (
    DenseAttention,
    ReleasedSizes,
    activation,
    init_reference_weights_,
)

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "InternVLConfig",
    "InternVLTextConfig",
    "InternVLVisionHost",
    "InternVisionConfig",
    "InternVisionModel",
    "image_tile_counts",
    "pixel_shuffle",
]

# The InternVL processor's normalisation (``build_transform``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# The processor emits RGB tiles; vLLM's patch conv has 3 input channels
# whatever the vision config says.
IN_CHANNELS = 3

NORM_TYPES = ("layer_norm", "rms_norm")
PS_VERSIONS = ("v1", "v2")


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _positive_fields(obj: Any) -> list[str]:
    """Problems with the numeric fields of ``obj`` that are not positive."""
    problems = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if is_number and value <= 0 and f.name != "select_layer":
            problems.append(f"{f.name} must be positive, got {value}")
    return problems


@dataclass(frozen=True)
class InternVisionConfig:
    """The checkpoint's ``vision_config`` (Hugging Face ``InternVisionConfig``
    field names); defaults are the ``full`` values."""

    hidden_size: int = 1024
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    image_size: int = 448
    patch_size: int = 14
    hidden_act: str = "gelu"
    """Block MLP activation (vLLM's ``get_act_fn``: exact GELU)."""
    layer_norm_eps: float = 1e-6
    """eps of ``norm1``/``norm2`` and of the qk norms."""
    norm_type: str = "layer_norm"
    """``"layer_norm"`` (InternViT-300M) or ``"rms_norm"`` (InternViT-6B)."""
    qkv_bias: bool = True
    qk_normalization: bool = False
    """RMSNorm over the whole q and k width (all heads together), as the
    6B ViTs have."""

    def __post_init__(self) -> None:
        problems = _positive_fields(self)
        if self.hidden_size % self.num_attention_heads:
            problems.append(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.image_size % self.patch_size:
            problems.append(
                f"image_size {self.image_size} is not a multiple of patch_size "
                f"{self.patch_size}"
            )
        if self.norm_type not in NORM_TYPES:
            problems.append(f"norm_type must be one of {NORM_TYPES}")
        activation(self.hidden_act)  # raises on unknown names
        if problems:
            raise ValueError("invalid InternVisionConfig: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def grid(self) -> int:
        """Patches per tile side."""
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid**2


@dataclass(frozen=True)
class InternVLTextConfig:
    """The one field of the language model's config the vision half reads."""

    hidden_size: int = 1536


@dataclass(frozen=True)
class InternVLConfig(ReleasedSizes):
    """The checkpoint's ``InternVLChatConfig`` as far as the vision half and
    the processor's tiling read it; defaults are the ``full`` values."""

    vision_config: InternVisionConfig = field(default_factory=InternVisionConfig)
    text_config: InternVLTextConfig = field(default_factory=InternVLTextConfig)
    downsample_ratio: float = 0.5
    force_image_size: int | None = 448
    select_layer: int = -1
    """The ViT layer whose output is used (negative: from the end); vLLM
    builds only the layers up to it."""
    ps_version: str = "v2"
    min_dynamic_patch: int = 1
    max_dynamic_patch: int = 12
    dynamic_image_size: bool = True
    use_thumbnail: bool = True
    max_frames_per_video: int = 16
    """Not a checkpoint field: the cap on frames (tiles) of a legal video
    item (see the module docstring)."""

    def __post_init__(self) -> None:
        problems = _positive_fields(self)
        vision = self.vision_config
        if self.force_image_size not in (None, vision.image_size):
            problems.append(
                f"force_image_size {self.force_image_size} differs from "
                f"vision_config.image_size {vision.image_size} (not modelled)"
            )
        factor = round(1 / self.downsample_ratio)
        if self.downsample_ratio * factor != 1:
            problems.append(
                f"downsample_ratio {self.downsample_ratio} is not 1 / an integer"
            )
        elif vision.grid % factor:
            problems.append(
                f"a {vision.grid}×{vision.grid} patch grid does not pixel-shuffle "
                f"by {factor}"
            )
        if not 1 <= self.vit_layers <= vision.num_hidden_layers:
            problems.append(
                f"select_layer {self.select_layer} is outside the "
                f"{vision.num_hidden_layers} ViT layers"
            )
        if self.ps_version not in PS_VERSIONS:
            problems.append(f"ps_version must be one of {PS_VERSIONS}")
        if self.min_dynamic_patch > self.max_dynamic_patch:
            problems.append("min_dynamic_patch exceeds max_dynamic_patch")
        if problems:
            raise ValueError("invalid InternVLConfig: " + "; ".join(problems))

    @property
    def image_size(self) -> int:
        """``force_image_size or vision_config.image_size`` (vLLM's)."""
        return self.force_image_size or self.vision_config.image_size

    @property
    def patch_tokens(self) -> int:
        return (self.image_size // self.vision_config.patch_size) ** 2

    @property
    def num_image_token(self) -> int:
        """Output rows per tile: ``int(patch_tokens · downsample_ratio²)``."""
        return int(self.patch_tokens * self.downsample_ratio**2)

    @property
    def vit_layers(self) -> int:
        """ViT layers vLLM builds for ``select_layer``."""
        layers = self.vision_config.num_hidden_layers
        if self.select_layer < 0:
            return layers + self.select_layer + 1
        return self.select_layer + 1

    @classmethod
    def tiny(cls) -> InternVLConfig:
        """A tower that runs in a fraction of a second on a CPU.

        The tile geometry is the released one (448² tiles of 14² patches, a
        32×32 grid shuffled 2×2: 256 output rows per tile, 1025 ViT rows), so
        items, budgets and inputs have the real layout and size; only the
        widths and depths shrink (ViT 32 wide with 2 heads of 16, 2 layers;
        text width 96, distinct from the 128-wide shuffled rows). Images take
        1 or 3..5 tiles (``max_dynamic_patch`` 4 plus the thumbnail), videos
        up to 4 frames.
        """
        return cls(
            vision_config=InternVisionConfig(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
            ),
            text_config=InternVLTextConfig(hidden_size=96),
            max_dynamic_patch=4,
            max_frames_per_video=4,
        )

    @classmethod
    def full(cls) -> InternVLConfig:
        """InternVL3-2B's dimensions (sources in the module docstring)."""
        return cls()


def image_tile_counts(config: InternVLConfig) -> tuple[int, ...]:
    """Every tile count the processor can emit for one image, ascending.

    The processor picks a grid of ``i×j`` tiles with ``min_dynamic_patch <=
    i·j <= max_dynamic_patch`` (both 1 without ``dynamic_image_size``) and,
    with ``use_thumbnail``, adds a whole-image thumbnail tile to any grid of
    more than one tile. Every product in the range is some ``1×n`` grid.
    """
    if config.dynamic_image_size:
        low, high = config.min_dynamic_patch, config.max_dynamic_patch
    else:
        low = high = 1
    thumbnail = 1 if config.use_thumbnail else 0
    return tuple(
        sorted(
            {
                blocks + (thumbnail if blocks != 1 else 0)
                for blocks in range(low, high + 1)
            }
        )
    )


# ---------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------


class InternRMSNorm(nn.Module):
    """vLLM's ``RMSNorm``: normalised in fp32, scaled by the weight in the
    weight's dtype, returned in the input dtype."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.to(self.weight.dtype) * self.weight).to(dtype)


def _norm(config: InternVisionConfig, width: int) -> nn.Module:
    if config.norm_type == "rms_norm":
        return InternRMSNorm(width, config.layer_norm_eps)
    return nn.LayerNorm(width, eps=config.layer_norm_eps)


class InternVisionEmbeddings(nn.Module):
    """Patch conv (stride = kernel, with bias) → ``[class; patches]`` → plus
    the learned position table (bicubically resized for a grid other than
    the configured one, which fixed tiles never have)."""

    def __init__(self, config: InternVisionConfig) -> None:
        super().__init__()
        self.embed_dim = config.hidden_size
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.class_embedding = nn.Parameter(torch.randn(1, 1, self.embed_dim))
        self.patch_embedding = nn.Conv2d(
            IN_CHANNELS,
            self.embed_dim,
            kernel_size=self.patch_size,
            stride=self.patch_size,
        )
        self.num_patches = config.num_patches
        self.num_positions = self.num_patches + 1
        self.position_embedding = nn.Parameter(
            torch.randn(1, self.num_positions, self.embed_dim)
        )

    def _resized_patch_positions(self, h: int, w: int) -> torch.Tensor:
        """The patch rows of the position table resized to ``h×w`` (bicubic,
        computed in fp32, returned in the table's dtype), ``(1, h·w, D)``."""
        table = self.position_embedding[:, 1:, :]
        side = self.image_size // self.patch_size
        grid = table.float().reshape(1, side, side, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
        return grid.reshape(1, -1, h * w).permute(0, 2, 1).to(table.dtype)

    def position_table(self, h: int, w: int) -> torch.Tensor:
        """``(1, 1 + h·w, D)``: the table as it is when ``h·w`` is the
        configured patch count (vLLM compares counts, not shapes)."""
        if self.num_patches == h * w:
            return self.position_embedding
        return torch.cat(
            [self.position_embedding[:, :1, :], self._resized_patch_positions(h, w)],
            dim=1,
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype))  # (B, D, h, w)
        batch, _, h, w = patches.shape
        patches = patches.flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(batch, 1, -1).to(dtype)
        embeddings = torch.cat([cls, patches], dim=1)
        return embeddings + self.position_table(h, w).to(dtype)


class InternAttention(nn.Module):
    """Fused qkv (``[q; k; v]``) → optional RMSNorm of q and k over their full
    width → dense attention per tile → ``proj`` (with bias)."""

    def __init__(
        self, config: InternVisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        dim = config.hidden_size
        self.qkv = nn.Linear(dim, 3 * dim, bias=config.qkv_bias)
        self.qk_normalization = config.qk_normalization
        if self.qk_normalization:
            self.q_norm = InternRMSNorm(dim, config.layer_norm_eps)
            self.k_norm = InternRMSNorm(dim, config.layer_norm_eps)
        self.proj = nn.Linear(dim, dim)
        self.attn = DenseAttention(
            config.num_attention_heads, config.head_dim, attn_backend
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.qk_normalization:
            q, k = self.q_norm(q), self.k_norm(k)
        return self.proj(self.attn(q, k, v))


class InternMLP(nn.Module):
    def __init__(self, config: InternVisionConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class InternVisionEncoderLayer(nn.Module):
    """``x + attn(norm1(x))·ls1``, then ``x + mlp(norm2(x))·ls2``."""

    def __init__(
        self, config: InternVisionConfig, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.attn = InternAttention(config, attn_backend)
        self.mlp = InternMLP(config)
        self.norm1 = _norm(config, config.hidden_size)
        self.norm2 = _norm(config, config.hidden_size)
        self.ls1 = nn.Parameter(torch.ones(config.hidden_size))
        self.ls2 = nn.Parameter(torch.ones(config.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x)) * self.ls1
        return x + self.mlp(self.norm2(x)) * self.ls2


class InternVisionEncoder(nn.Module):
    def __init__(
        self,
        config: InternVisionConfig,
        num_layers: int,
        attn_backend: AttentionBackendEnum,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            InternVisionEncoderLayer(config, attn_backend) for _ in range(num_layers)
        )

    def forward(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x)
        return x


class InternVisionModel(nn.Module):
    """Embeddings → encoder: ``(tiles, 3, S, S)`` → ``(tiles, 1 + (S/p)², D)``
    (the class token first)."""

    def __init__(
        self,
        config: InternVisionConfig,
        *,
        num_hidden_layers_override: int | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        layers = num_hidden_layers_override or config.num_hidden_layers
        self.embeddings = InternVisionEmbeddings(config)
        self.encoder = InternVisionEncoder(config, layers, attn_backend)

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        pixel_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if pixel_embeds is not None:
            hidden = pixel_embeds
        elif pixel_values is None:
            raise ValueError("You have to specify pixel_values or pixel_embeds")
        elif pixel_values.ndim != 4:
            raise ValueError(f"wrong pixel_values size: {tuple(pixel_values.shape)}")
        else:
            hidden = self.embeddings(pixel_values)
        return self.encoder(inputs_embeds=hidden)


def pixel_shuffle(
    x: torch.Tensor, scale_factor: float, ps_version: str
) -> torch.Tensor:
    """vLLM's ``pixel_shuffle``: ``(n, w, h, c)`` → ``(n, h·s, w·s, c/s²)``
    for ``s = scale_factor`` (0.5 merges 2×2 neighbours); ``"v1"`` keeps the
    transposed grid the original code produced, ``"v2"`` transposes back."""
    n, w, h, c = x.shape
    x = x.reshape(n, w, int(h * scale_factor), int(c / scale_factor))
    x = x.permute(0, 2, 1, 3).contiguous()
    x = x.reshape(
        n,
        int(h * scale_factor),
        int(w * scale_factor),
        int(c / (scale_factor * scale_factor)),
    )
    if ps_version != "v1":
        x = x.permute(0, 2, 1, 3).contiguous()
    return x


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class InternVLVisionHost(nn.Module):
    """The vision half of vLLM's ``InternVLChatModel``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`); host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: InternVLConfig,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.patch_size = config.vision_config.patch_size
        self.patch_tokens = config.patch_tokens
        self.num_image_token = config.num_image_token
        self.downsample_ratio = config.downsample_ratio
        self.ps_version = config.ps_version
        self.vision_model = InternVisionModel(
            config.vision_config,
            num_hidden_layers_override=config.vit_layers,
            attn_backend=attn_backend,
        )
        vit_width = config.vision_config.hidden_size
        shuffled = vit_width * round(1 / config.downsample_ratio) ** 2
        text = config.text_config.hidden_size
        self.mlp1 = nn.Sequential(
            nn.LayerNorm(shuffled),
            nn.Linear(shuffled, text),
            nn.GELU(),
            nn.Linear(text, text),
        )

    def pixel_shuffle(self, x: torch.Tensor, scale_factor: float = 0.5) -> torch.Tensor:
        return pixel_shuffle(x, scale_factor, self.ps_version)

    def extract_feature(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``(tiles, 3, S, S)`` → ``(tiles, num_image_token, text width)``:
        ViT, class token dropped, pixel shuffle, ``mlp1``."""
        vit_embeds = self.vision_model(pixel_values=pixel_values)[:, 1:, :]
        side = int(vit_embeds.shape[1] ** 0.5)
        vit_embeds = vit_embeds.reshape(vit_embeds.shape[0], side, side, -1)
        vit_embeds = self.pixel_shuffle(vit_embeds, scale_factor=self.downsample_ratio)
        vit_embeds = vit_embeds.reshape(vit_embeds.shape[0], -1, vit_embeds.shape[-1])
        return self.mlp1(vit_embeds)

    # -- reference-only ------------------------------------------------------

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`): the layer scales as gains, the
        class token and position table as unit-scale tables."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vision_model,
            generator,
            residual_branch_outputs=("attn.proj", "mlp.fc2"),
            num_residual_branches=2 * self.config.vit_layers,
            gains=("ls1", "ls2"),
            embeddings=("class_embedding", "position_embedding"),
        )
        init_reference_weights_(
            self.mlp1, generator, residual_branch_outputs=(), num_residual_branches=1
        )

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        self.to(dtype=dtype)

    @staticmethod
    def reference_modality(mm_kwargs: Mapping[str, Any]) -> str:
        """``"image"`` when ``pixel_values_flat`` is present, else
        ``"video"`` (vLLM's ``get_input_modality``)."""
        return "image" if "pixel_values_flat" in mm_kwargs else "video"

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each item's ``(tiles · num_image_token, text)`` rows,
        one ``extract_feature`` call per item (so no tile shares a batch with
        another item's)."""
        if self.reference_modality(mm_kwargs) == "image":
            pixels, counts = (
                mm_kwargs["pixel_values_flat"],
                mm_kwargs["image_num_patches"],
            )
        else:
            pixels = mm_kwargs["pixel_values_flat_video"]
            counts = mm_kwargs["video_num_patches"]
        counts = [int(n) for n in counts]
        if sum(counts) != pixels.shape[0]:
            raise ValueError(
                f"{pixels.shape[0]} tiles, but the counts {counts} need {sum(counts)}"
            )
        text = self.config.text_config.hidden_size
        out, offset = [], 0
        for n in counts:
            out.append(
                self.extract_feature(pixels[offset : offset + n]).reshape(-1, text)
            )
            offset += n
        return out
