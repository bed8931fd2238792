"""The oracle setups of the beyond-the-catalog specs: per model, the host
made of its vLLM methods (from the wheel) and the fakes of its learned
layers, each of which reads every row it is given.

* A tile tower (SigLIP, CLIP) is :class:`TileTower`: every patch of a tile
  is embedded by a fixed linear map, gets a code of its position, and is
  added the mean of its tile (attention within the tile), so every pixel of
  a tile moves every output row of it and nothing crosses tiles.
* Linear layers are :class:`FixedLinear`: fixed, exactly representable
  weights.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import parity_hosts
import torch
from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from beyond_testlib import OracleModel, vllm_config
from parity_testlib import WheelCode

#: Width of the fake towers' rows.
WIDTH = 8


class _Obj:
    """A plain attribute bag for config-like objects."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


@functools.cache
def _mixing(rows: int, cols: int) -> torch.Tensor:
    """A fixed, exactly representable ``rows x cols`` matrix."""
    i = torch.arange(rows)[:, None]
    j = torch.arange(cols)[None, :]
    return (((i * 7 + j * 3) % 11) - 5).float() / 16


class CallsForward:
    """What ``nn.Module`` gives a vLLM module class taken from the wheel:
    calling it runs its ``forward``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


class FixedLinear:
    """``x @ W`` with fixed weights, ``in_features -> out_features``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        self.weight = _mixing(in_features, out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.to(x.dtype)


class TileTower:
    """A SigLIP-like tower over ``(n, 3, side, side)`` tiles: ``(n, S, WIDTH)``
    rows, ``S = (side // patch) ** 2``, one per patch in raster order."""

    def __init__(self, side: int, patch: int) -> None:
        self.side, self.patch = side, patch
        self.embed = FixedLinear(3 * patch * patch, WIDTH)
        count = (side // patch) ** 2
        self.positions = torch.arange(count * WIDTH).float().view(count, WIDTH) / 64

    def patch_rows(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Each patch embedded, plus the code of its position."""
        n, p = pixel_values.shape[0], self.patch
        grid = self.side // p
        patches = (
            pixel_values.reshape(n, 3, grid, p, grid, p)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(n, grid * grid, 3 * p * p)
        )
        return self.embed(patches) + self.positions.to(patches.dtype)

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_rows(pixel_values)
        return x + x.mean(dim=1, keepdim=True)


def schema_as_dict(**fields: Any) -> dict[str, Any]:
    """A model's ``TensorSchema`` input, read by key (its shape checks need
    vLLM's TensorSchema machinery, which the hosts do not exercise)."""
    fields.pop("resolve_bindings", None)
    return fields


# ---------------------------------------------------------------------------
# Cohere2-Vision: SigLIP tiles, the projector's pixel shuffle
# ---------------------------------------------------------------------------

COHERE2 = "vllm.model_executor.models.cohere2_vision"
COHERE2_SIDE, COHERE2_PATCH, COHERE2_SHUFFLE = 8, 2, 2
#: Tokens of one tile: (8 // 2 // 2) ** 2.
COHERE2_TOKENS = 4
COHERE2_INTERMEDIATE = 6


def _cohere2_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        COHERE2,
        "Cohere2VisionForConditionalGeneration",
        ["embed_multimodal"],
        bases=(mixin,),
        exclude=["dtype"],
    )


def _cohere2_projector(code: WheelCode, config: _Obj) -> Any:
    """vLLM's projector (its pixel shuffle and forward) on fixed linears and
    vLLM's SwiGLU split (``MulAndSilu``: silu of the first half times the
    second)."""
    projector = code.klass(
        COHERE2,
        "Cohere2VisionMultiModalProjector",
        ["forward", "pixel_shuffle"],
        bases=(CallsForward,),
    )()
    projector.downsample_factor = config.downsample_factor
    wide = WIDTH * config.downsample_factor**2
    projector.linear_1 = FixedLinear(wide, 2 * COHERE2_INTERMEDIATE)
    projector.act = lambda x: torch.nn.functional.silu(
        x[..., :COHERE2_INTERMEDIATE]
    ) * (x[..., COHERE2_INTERMEDIATE:])
    projector.linear_2 = FixedLinear(COHERE2_INTERMEDIATE, WIDTH)
    return projector


def _cohere2_host(code: WheelCode, host_class: type, backend: str) -> Any:
    del backend  # SigLIP tiles attend within themselves: no varlen kernel
    config = _Obj(
        vision_config=_Obj(image_size=COHERE2_SIDE, patch_size=COHERE2_PATCH),
        downsample_factor=COHERE2_SHUFFLE,
        text_config=_Obj(hidden_size=WIDTH),
    )
    host = host_class()
    host.config = config
    host.vision_tower = TileTower(COHERE2_SIDE, COHERE2_PATCH)
    host.multi_modal_projector = _cohere2_projector(code, config)
    return host


def cohere2_batches() -> list[dict[str, Any]]:
    """Images of 1 to 13 tiles (the processor's crops), as
    vLLM's processor gives them: the tiles back to back, the counts a
    tensor. 13 tiles (52 tokens) exceed the ladder's top (48): eager."""
    gen = torch.Generator().manual_seed(26)
    mixes = [[1], [3, 1, 2], [13], [12, 1, 5, 2], [4, 4, 4, 4, 1], [2, 13, 1]]
    side = COHERE2_SIDE
    return [
        {
            "pixel_values": torch.randn(sum(m), 3, side, side, generator=gen),
            "num_patches": torch.tensor(m),
        }
        for m in mixes
    ]


def cohere2_vision() -> OracleModel:
    return OracleModel(
        stem="cohere2_vision",
        stubs={COHERE2: {"Cohere2VisionImagePixelInputs": schema_as_dict}},
        host_class=_cohere2_host_class,
        make_host=_cohere2_host,
        eager=lambda host, batch: list(host.embed_multimodal(**batch)),
        batches=cohere2_batches,
    )


# ---------------------------------------------------------------------------
# Qwen2.5-Omni (thinker): Qwen2.5-VL's NaViT-style varlen tower
# ---------------------------------------------------------------------------

OMNI = "vllm.model_executor.models.qwen2_5_omni_thinker"


def _omni_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        OMNI,
        "Qwen2_5OmniConditionalGenerationMixin",
        ["_process_image_input"],
        bases=(mixin,),
    )


def _omni_host(code: WheelCode, host_class: type, backend: str) -> Any:
    host = host_class()
    host.vllm_config = vllm_config(1)
    host.visual = parity_hosts.qwen25_tower(code, backend)
    return host


def omni_batches() -> list[dict[str, Any]]:
    """Images of [1, h, w] patches (h, w even: the 2 x 2 merge) as the
    processor gives them, rows back to back; a 24 x 24 image is 144 tokens,
    above the ladder's top (128): eager. The windows are 4 x 4 patches, so
    sides of 2 to 24 make partial and whole windows."""
    grids = [
        [(1, 2, 2)],
        [(1, 4, 6), (1, 8, 8), (1, 2, 10)],
        [(1, 24, 24)],
        [(1, 16, 12), (1, 6, 6), (1, 10, 4), (1, 2, 2)],
        [(1, 6, 22), (1, 24, 24), (1, 4, 4)],
        [(1, 12, 12)] * 5,
    ]
    gen = torch.Generator().manual_seed(26)
    return [parity_hosts.qwen_batch(gen, "image", g) for g in grids]


def qwen2_5_omni() -> OracleModel:
    return OracleModel(
        stem="qwen2_5_omni",
        stubs=parity_hosts.QWEN25_STUBS,
        host_class=_omni_host_class,
        make_host=_omni_host,
        eager=lambda host, batch: list(
            host._process_image_input({"type": "pixel_values", **batch})
        ),
        batches=omni_batches,
        backends=("FLASH_ATTN", "FLASHINFER"),
        max_num_batched_tokens=128,
        violations=lambda host: host.visual.violations,
    )


# ---------------------------------------------------------------------------
# Eagle2.5-VL: SigLIP tiles, InternVL's pixel shuffle and mlp1
# ---------------------------------------------------------------------------

EAGLE = "vllm.model_executor.models.eagle2_5_vl"
EAGLE_SIDE, EAGLE_PATCH = 8, 2
#: Tokens of one tile: (8 // 2) ** 2 patches, a quarter after the shuffle.
EAGLE_TOKENS = 4


def _eagle_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        EAGLE,
        "Eagle2_5_VLForConditionalGeneration",
        ["_process_image_input", "extract_feature", "pixel_shuffle"],
        bases=(mixin,),
    )


def _eagle_host(forced: bool) -> Any:
    """Hosts whose tiles are the vision config's side, or, when ``forced``,
    the config's ``force_image_size`` (the vision config then says 6)."""

    def make_host(code: WheelCode, host_class: type, backend: str) -> Any:
        del backend  # SigLIP tiles attend within themselves: no varlen kernel
        host = host_class()
        host.config = _Obj(
            force_image_size=EAGLE_SIDE if forced else None,
            vision_config=_Obj(
                image_size=6 if forced else EAGLE_SIDE, patch_size=EAGLE_PATCH
            ),
            text_config=_Obj(hidden_size=WIDTH),
        )
        host.downsample_ratio = 0.5
        host.num_image_token = EAGLE_TOKENS
        host.vision_model = TileTower(EAGLE_SIDE, EAGLE_PATCH)
        host.mlp1 = FixedLinear(WIDTH * 4, WIDTH)
        return host

    return make_host


def eagle_batches() -> list[dict[str, Any]]:
    """Images of 1 to 13 tiles, the tiles back to back and the counts a
    tensor, as the processor gives them; 13 tiles (52 tokens) exceed the
    ladder's top (48): eager."""
    gen = torch.Generator().manual_seed(25)
    mixes = [[1], [2, 5], [13], [6, 1, 1, 3], [1, 13, 2], [3, 3, 3, 3]]
    return [
        {
            "pixel_values_flat": torch.randn(
                sum(m), 3, EAGLE_SIDE, EAGLE_SIDE, generator=gen
            ),
            "image_num_patches": torch.tensor(m),
        }
        for m in mixes
    ]


def eagle2_5_vl(forced: bool = False) -> OracleModel:
    return OracleModel(
        stem="eagle2_5_vl",
        stubs={},
        host_class=_eagle_host_class,
        make_host=_eagle_host(forced),
        eager=lambda host, batch: list(
            host._process_image_input(
                {
                    "type": "pixel_values",
                    "pixel_values_flat": batch["pixel_values_flat"],
                    "num_patches": batch["image_num_patches"],
                }
            )
        ),
        batches=eagle_batches,
    )


# ---------------------------------------------------------------------------
# dots.ocr: a varlen tower without a packed entry point, blocks in a list
# ---------------------------------------------------------------------------

DOTS = "vllm.model_executor.models.dots_ocr"
VISION = "vllm.model_executor.models.vision"
#: Blocks of the fake tower: the graph must run every one, in order.
DOTS_DEPTH = 3
#: The merger's rows are wider than the language model's: the host keeps
#: the first ``config.hidden_size`` columns.
DOTS_MERGED_WIDTH = 2 * WIDTH


class _DotsBlock:
    """A transformer block by FlashAttention's contract: the rows plus their
    RoPE codes (scaled by the block's place in the list), then each row plus
    its sequence's mean (``parity_hosts.varlen_attention``)."""

    def __init__(self, tower: Any, index: int) -> None:
        self.tower, self.index = tower, index

    def __call__(self, x, cu_seqlens, rotary_pos_emb, max_seqlen=None):
        rows = x.float() + rotary_pos_emb.float() * (self.index + 1) / 4
        violations = self.tower.violations
        return parity_hosts.varlen_attention(
            rows, cu_seqlens, max_seqlen, violations
        ).to(x.dtype)


class _DotsTowerParts(parity_hosts.Recorder):
    """The learned parts of ``DotsVisionTransformer``: a patch embedding of
    each row, ``DOTS_DEPTH`` blocks, a post-trunk norm and a merger of each
    run of merge x merge rows (order inside the run matters). ``forward``,
    ``rot_pos_emb`` and ``compute_attn_mask_seqlen`` are vLLM's (subclass),
    the rotary table vLLM's ``VisionRotaryEmbedding``."""

    def __init__(self, code: WheelCode, backend: str) -> None:
        super().__init__()
        self.config = _Obj(
            num_channels=3,
            temporal_patch_size=2,
            patch_size=parity_hosts.PATCH,
            embed_dim=4 * WIDTH,
            num_attention_heads=2,  # head_dim 16: RoPE rows of WIDTH
            post_norm=True,
        )
        self.spatial_merge_size = 2
        self.attn_backend = AttentionBackendEnum[backend]
        rotary = code.klass(
            DOTS, "VisionRotaryEmbedding", ["forward"], bases=(CallsForward,)
        )()
        rotary.inv_freq = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
        self.rotary_pos_emb = rotary
        self.blocks = [_DotsBlock(self, i) for i in range(DOTS_DEPTH)]
        self.merge_linear = FixedLinear(4 * WIDTH, DOTS_MERGED_WIDTH)

    dtype = torch.float32
    device = parity_hosts.CPU

    def patch_embed(self, x: torch.Tensor, grid_thw: Any = None) -> torch.Tensor:
        return parity_hosts.patch_embedding(x, self.dtype)

    def post_trunk_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=-1, keepdim=True) / 2

    def merger(self, x: torch.Tensor) -> torch.Tensor:
        return self.merge_linear(x.reshape(-1, 4 * WIDTH))


def _dots_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        DOTS, "DotsOCRForCausalLM", ["_process_image_input"], bases=(mixin,)
    )


def _dots_host(code: WheelCode, host_class: type, backend: str) -> Any:
    tower_class = code.klass(
        DOTS,
        "DotsVisionTransformer",
        ["forward", "rot_pos_emb", "get_pos_ids_by_grid", "compute_attn_mask_seqlen"],
        bases=(_DotsTowerParts, CallsForward),
        exclude=["dtype", "device"],
    )
    host = host_class()
    host.config = _Obj(hidden_size=WIDTH)
    host.use_data_parallel = False
    host.vision_tower = tower_class(code, backend)
    return host


def dots_ocr() -> OracleModel:
    return OracleModel(
        stem="dots_ocr",
        # The data-parallel path is not taken (use_data_parallel is False).
        stubs={VISION: {"run_dp_sharded_mrope_vision_model": None}},
        host_class=_dots_host_class,
        make_host=_dots_host,
        eager=lambda host, batch: list(
            host._process_image_input({"type": "pixel_values", **batch})
        ),
        batches=omni_batches,
        backends=("FLASH_ATTN", "ROCM_AITER_FA", "TRITON_ATTN"),
        max_num_batched_tokens=128,
        violations=lambda host: host.vision_tower.violations,
    )


# ---------------------------------------------------------------------------
# Phi-4-multimodal: SigLIP crops with patch masks, the HD transform
# ---------------------------------------------------------------------------

PHI4MM = "vllm.model_executor.models.phi4mm"
#: 8 x 8-pixel crops of 2 x 2-pixel patches: a 4 x 4 patch mask per crop and,
#: after the 2 x 2 pooling, 2 x 2 tokens per crop.
PHI4MM_CROP, PHI4MM_PATCH, PHI4MM_SIDE = 8, 2, 2
PHI4MM_HIDDEN = 6


class MaskedTileTower(TileTower):
    """A SigLIP tower with a patch mask (``patch_attention_mask``): each
    patch's row is scaled by whether it is kept, and every row of a crop gets
    the mean of its kept rows, so the mask and every kept pixel of a crop
    move every row of it, and nothing crosses crops."""

    def __call__(self, pixel_values, patch_attention_mask=None) -> torch.Tensor:
        x = self.patch_rows(pixel_values)
        kept = patch_attention_mask.reshape(x.shape[0], -1, 1).to(x.dtype)
        mean = (x * kept).sum(1, keepdim=True) / kept.sum(1, keepdim=True).clamp(1)
        return x * (1 + kept) + mean


class _FirstParameter:
    """``next(encoder.parameters())``, which vLLM reads for the dtype."""

    def parameters(self):
        return iter([self.glb_GN])


def _phi4mm_projection(
    width: int = WIDTH, hidden: int = PHI4MM_HIDDEN
) -> torch.nn.Sequential:
    """``img_projection``: two linear layers with a GELU, fixed weights."""
    layers = torch.nn.Sequential(
        torch.nn.Linear(width, hidden),
        torch.nn.GELU(),
        torch.nn.Linear(hidden, hidden),
    )
    with torch.no_grad():
        for layer in (layers[0], layers[2]):
            layer.weight.copy_(_mixing(*layer.weight.shape))
            layer.bias.copy_(torch.arange(layer.bias.shape[0]) / 8)
    return layers


def _phi4mm_encoder(code: WheelCode) -> Any:
    """vLLM's ``Phi4MMImageEncoder`` (its forward, the HD transform, and
    ``get_img_features``) on a masked tile tower, the real 2 x 2 pooling and
    learned separators of distinct values."""
    encoder = code.klass(
        PHI4MM,
        "Phi4MMImageEncoder",
        ["forward", "get_img_features"],
        bases=(CallsForward, _FirstParameter),
    )()
    encoder.img_processor = MaskedTileTower(PHI4MM_CROP, PHI4MM_PATCH)
    encoder.type_feature = "patch"
    encoder.image_token_compression = torch.nn.AvgPool2d(kernel_size=2, stride=2)
    encoder.crop_size = PHI4MM_CROP
    encoder.base_feat_height_target = PHI4MM_SIDE
    encoder.base_feat_height_reduction = 1
    encoder.num_img_tokens = PHI4MM_SIDE**2
    encoder.image_dim_out = WIDTH
    encoder.hd_transform_order = "sub_glb"
    encoder.sub_GN = torch.arange(WIDTH).float().view(1, 1, 1, WIDTH) / 4 - 3
    encoder.glb_GN = torch.arange(WIDTH).float().view(1, 1, WIDTH) / 2 + 5
    encoder.img_projection = _phi4mm_projection()
    return encoder


def _phi4mm_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        PHI4MM, "Phi4MMForCausalLM", ["_process_image_input"], bases=(mixin,)
    )


def _phi4mm_host(code: WheelCode, host_class: type, backend: str) -> Any:
    del backend  # SigLIP crops attend within themselves: no varlen kernel
    host = host_class()
    host.config = _Obj(hidden_size=PHI4MM_HIDDEN)
    host.vision_encoder = _phi4mm_encoder(code)
    return host


def _phi4mm_image(gen, gh: int, gw: int, uh: int, uw: int, pad: int):
    """One image of ``gh x gw`` crops whose useful area is ``uh x uw``
    tokens (the processor's mask), a global view first and ``pad`` crops of
    padding after: (pixels, mask, size, tokens)."""
    crops = 1 + gh * gw + pad
    patches = 2 * PHI4MM_SIDE  # the mask's side per crop
    pixels = torch.randn(crops, 3, PHI4MM_CROP, PHI4MM_CROP, generator=gen)
    area = torch.zeros(gh * patches, gw * patches)
    area[: 2 * uh, : 2 * uw] = 1
    sub = area.view(gh, patches, gw, patches).permute(0, 2, 1, 3)
    mask = torch.zeros(crops, patches, patches)
    mask[0] = 1
    mask[1 : 1 + gh * gw] = sub.reshape(gh * gw, patches, patches)
    size = [gh * PHI4MM_CROP, gw * PHI4MM_CROP]
    tokens = uh * (uw + 1) + 1 + PHI4MM_SIDE * (PHI4MM_SIDE + 1)
    return pixels, mask, size, tokens


def phi4mm_batches() -> list[dict[str, Any]]:
    """Images of 1 x 1 to 5 x 8 crops with useful areas cut inside their last
    crop or at its edge, as vLLM hands them over: a list when the crop counts
    differ, one tensor padded to the widest image (padding crops with a zero
    mask) when the processor padded them; 5 x 8 crops (41 with the global
    view) exceed a captured image's 37: eager."""
    gen = torch.Generator().manual_seed(26)
    mixes = [
        ([(1, 1, 1, 2, 0)], False),
        ([(2, 3, 3, 5, 0), (1, 2, 2, 3, 0), (3, 1, 5, 2, 0)], False),
        ([(2, 2, 4, 4, 1), (1, 3, 1, 6, 0)], True),
        ([(5, 8, 9, 15, 0), (1, 1, 2, 2, 0)], False),
        ([(6, 6, 12, 11, 0)], False),
        ([(2, 2, 3, 3, 0), (1, 1, 1, 1, 3), (4, 1, 7, 2, 0), (1, 4, 2, 8, 0)], True),
    ]
    batches = []
    for images, stacked in mixes:
        parts = [_phi4mm_image(gen, *image) for image in images]
        pixels, masks = [p[0] for p in parts], [p[1] for p in parts]
        if stacked:  # the processor padded them to the widest: one tensor
            widest = max(p.shape[0] for p in pixels)
            pixels = [
                torch.cat([p, p.new_zeros(widest - p.shape[0], *p.shape[1:])])
                for p in pixels
            ]
            masks = [
                torch.cat([m, m.new_zeros(widest - m.shape[0], *m.shape[1:])])
                for m in masks
            ]
            pixels, masks = torch.stack(pixels), torch.stack(masks)
        batches.append(
            {
                "input_image_embeds": pixels,
                "image_attention_mask": masks,
                "image_sizes": torch.tensor([p[2] for p in parts]),
                "num_img_tokens": [p[3] for p in parts],
            }
        )
    return batches


def phi4mm() -> OracleModel:
    return OracleModel(
        stem="phi4mm",
        # The HD transform reads the mask's counts under gpu_sync_allowed().
        stubs={
            "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext}
        },
        host_class=_phi4mm_host_class,
        make_host=_phi4mm_host,
        eager=lambda host, batch: list(
            host._process_image_input(
                {
                    "pixel_values": batch["input_image_embeds"],
                    "image_sizes": batch["image_sizes"],
                    "image_attention_mask": batch["image_attention_mask"],
                }
            )
        ),
        batches=phi4mm_batches,
        # Budgets of 1, 2 and 4 images of 37 crops (4 tokens each).
        max_num_batched_tokens=4 * 37 * PHI4MM_SIDE**2,
    )


# ---------------------------------------------------------------------------
# Phi-3-Vision: CLIP crops, the HD transform with a 2 x 2 merge
# ---------------------------------------------------------------------------

PHI3V = "vllm.model_executor.models.phi3v"
#: vLLM's transform fixes the crop: 336 pixels, 24 x 24 rows of 1024.
PHI3V_CROP, PHI3V_GRID, PHI3V_WIDTH = 336, 24, 1024
PHI3V_HIDDEN = 6


class ClipCrops:
    """A CLIP tower over ``(n, 3, 336, 336)`` crops: ``(n, 577, 1024)``, a
    class row then one row per 14 x 14 patch. A patch's row is its mean pixel
    plus the crop's, times a fixed code, plus a code of its position: every
    pixel of a crop moves every row of it, nothing crosses crops, and rows
    out of place differ (a scalar per patch keeps CPU time small)."""

    def __init__(self) -> None:
        rows = PHI3V_GRID**2 + 1
        self.scale = torch.arange(PHI3V_WIDTH).float() / PHI3V_WIDTH + 0.5
        self.positions = (
            torch.arange(rows)[:, None] * 3 + torch.arange(PHI3V_WIDTH)[None, :] % 7
        ).float() / 64

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        n, g = pixel_values.shape[0], PHI3V_GRID
        patches = pixel_values.reshape(n, 3, g, 14, g, 14).mean(dim=(1, 3, 5))
        crop = patches.mean(dim=(1, 2))[:, None]
        values = torch.cat([crop, patches.reshape(n, g * g) + crop], dim=1)
        return values[..., None] * self.scale + self.positions


def _phi3v_embedding(code: WheelCode) -> Any:
    """vLLM's ``Phi3HDImageEmbedding`` (its forward, ``get_img_features`` and
    HD transform) on a CLIP-like crop tower, separators of distinct values
    and a fixed two-layer projection."""
    embedding = code.klass(
        PHI3V,
        "Phi3HDImageEmbedding",
        ["forward", "get_img_features", "hd_feature_transform"],
        bases=(CallsForward, _FirstParameter),
    )()
    wide = 4 * PHI3V_WIDTH
    embedding.img_processor = ClipCrops()
    embedding.type_feature = "patch"
    embedding.image_dim_out = PHI3V_WIDTH
    embedding.num_img_tokens = (PHI3V_GRID // 2) ** 2
    embedding.hd_transform_order = "sub_glb"
    embedding.sub_GN = torch.arange(wide).float().view(1, 1, 1, wide) / 512 - 3
    embedding.glb_GN = torch.arange(wide).float().view(1, 1, wide) / 256 + 5
    embedding.img_projection = _phi4mm_projection(wide, PHI3V_HIDDEN)
    return embedding


def _phi3v_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        PHI3V, "Phi3VForCausalLM", ["_process_image_input"], bases=(mixin,)
    )


def _phi3v_host(code: WheelCode, host_class: type, backend: str) -> Any:
    del backend  # CLIP crops attend within themselves: no varlen kernel
    host = host_class()
    host.config = _Obj(hidden_size=PHI3V_HIDDEN)
    host.vision_embed_tokens = _phi3v_embedding(code)
    return host


def phi3v_batches() -> list[dict[str, Any]]:
    """Images of 1 x 1 to 4 x 5 crops, each batch one tensor padded to its
    widest image (zero crops), as the processor and vLLM's batching give
    them (vLLM's transform reads the 5-d shape); 4 x 5 crops (21 with the
    global view) exceed a captured image's 17: eager."""
    gen = torch.Generator().manual_seed(26)
    mixes = [[(1, 1)], [(2, 1), (1, 1)], [(4, 5)], [(1, 2), (2, 2), (1, 1)]]
    batches = []
    for grids in mixes:
        widest = max(1 + h * w for h, w in grids)
        pixels = torch.zeros(len(grids), widest, 3, PHI3V_CROP, PHI3V_CROP)
        for i, (h, w) in enumerate(grids):
            pixels[i, : 1 + h * w] = torch.randn(
                1 + h * w, 3, PHI3V_CROP, PHI3V_CROP, generator=gen
            )
        sizes = [[h * PHI3V_CROP, w * PHI3V_CROP] for h, w in grids]
        batches.append({"pixel_values": pixels, "image_sizes": torch.tensor(sizes)})
    return batches


def phi3v() -> OracleModel:
    return OracleModel(
        stem="phi3v",
        stubs={},
        host_class=_phi3v_host_class,
        make_host=_phi3v_host,
        eager=lambda host, batch: list(
            host._process_image_input({"type": "pixel_values", **batch})
        ),
        batches=phi3v_batches,
        # Budgets of 1 and 2 images of 17 crops (576 rows each).
        max_num_batched_tokens=2 * 17 * PHI3V_GRID**2,
    )


#: Every model of vLLM 0.33.0 without a hand-written mixin that has a spec:
#: its oracle (the catalog's models have parity rows in parity_hosts.MODELS).
ORACLES = {
    "cohere2_vision": cohere2_vision,
    "dots_ocr": dots_ocr,
    "eagle2_5_vl": eagle2_5_vl,
    "phi3v": phi3v,
    "phi4mm": phi4mm,
    "qwen2_5_omni": qwen2_5_omni,
}
