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

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        n, p = pixel_values.shape[0], self.patch
        grid = self.side // p
        patches = (
            pixel_values.reshape(n, 3, grid, p, grid, p)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(n, grid * grid, 3 * p * p)
        )
        x = self.embed(patches) + self.positions.to(patches.dtype)
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
# Mistral3: the HF Pixtral tower over per-image (3, H_i, W_i) tensors
# ---------------------------------------------------------------------------

MISTRAL3 = "vllm.model_executor.models.mistral3"
PIXTRAL = "vllm.model_executor.models.pixtral"
#: Pixels: 2-pixel patches, a 2 x 2 merge, images of at most 16 x 16 pixels
#: (8 x 8 patches, 16 tokens) in the graphs.
MISTRAL3_PATCH, MISTRAL3_MERGE, MISTRAL3_SIDE = 2, 2, 16
#: Layers of the fake transformer: the graph must run every one, in order.
MISTRAL3_DEPTH = 3


def _flat_position_ids(patch_embeds_list: list, max_width: int) -> torch.Tensor:
    """Transformers before 5.17: one id per patch, ``row * max_width +
    column`` over each image's grid (what vLLM imports from Transformers)."""
    ids = []
    for patches in patch_embeds_list:
        rows, columns = patches.shape[-2:]
        row = torch.arange(rows)[:, None].expand(rows, columns)
        column = torch.arange(columns)[None, :].expand(rows, columns)
        ids.append((row * max_width + column).reshape(-1))
    return torch.cat(ids)


class _AxialRotary:
    """Transformers' axial 2-D RoPE table (5.17 on): ``(rows, 2)`` ids of
    (row, column), a 1-d ``inv_freq``; the cos and sin of each patch, half
    of the angles from its row, half from its column."""

    def __init__(self, head_dim: int) -> None:
        freq = 1.0 / (100 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.inv_freq = torch.cat([freq[0::2], freq[1::2]])

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor):
        angles = position_ids[..., None].float() * self.inv_freq.to(x.device)
        return self._layout(angles.cos()).to(x.dtype), self._layout(angles.sin()).to(
            x.dtype
        )

    @staticmethod
    def _layout(table: torch.Tensor) -> torch.Tensor:
        by_row, by_column = table.chunk(2, dim=-1)
        half = torch.cat([by_row[:, 0], by_column[:, 1]], dim=-1)
        return torch.cat([half, half], dim=-1)


class _FlatRotary:
    """Transformers' flat RoPE table (before 5.17): a 2-d ``inv_freq`` with
    one row of angles per flat id. Four times the ids of the widest grid, so
    an image larger than the config's (eager only) does not index past it."""

    def __init__(self, head_dim: int, side: int) -> None:
        ids = torch.arange(4 * side * side).float()[:, None]
        self.inv_freq = ids * (torch.arange(head_dim).float() + 1) / 37

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor):
        angles = self.inv_freq[position_ids]
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


class _Mistral3Layer:
    """A transformer layer by FlashAttention's contract, ``(1, rows, width)``:
    the rows plus their RoPE cos and sin (scaled by the layer's place in the
    list), then each row plus its sequence's mean; ``sequence_lengths`` must
    be None (FlashInfer's only)."""

    def __init__(self, tower: Any, index: int, backend: str) -> None:
        self.tower, self.index = tower, index
        self.attention = _Obj(
            attn=_Obj(attn_backend=AttentionBackendEnum[backend]), tp_size=1
        )

    def __call__(self, x, cos, sin, cu_seqlens, max_seqlen, sequence_lengths):
        violations = self.tower.violations
        if sequence_lengths is not None:
            violations.setdefault("sequence_lengths", []).append("not None")
        scale = (self.index + 1) / 4
        rows = x[0].float() + (cos.float() - sin.float() / 2) * scale
        out = parity_hosts.varlen_attention(rows, cu_seqlens, max_seqlen, violations)
        return out.to(x.dtype)[None]


class _Mistral3TowerParts(parity_hosts.Recorder):
    """The learned parts of ``PixtralHFVisionModel``: the input
    normalisation (a scale and shift per channel), the patch convolution's
    weight, ``ln_pre``, the rotary table and ``MISTRAL3_DEPTH`` layers.
    ``forward`` is vLLM's (subclass), and so is the transformer's."""

    def __init__(self, code: WheelCode, backend: str, axial: bool) -> None:
        super().__init__()
        p = MISTRAL3_PATCH
        self.config = _Obj(
            image_size=MISTRAL3_SIDE,
            patch_size=p,
            num_channels=3,
            hidden_size=WIDTH,
            num_attention_heads=1,
            num_hidden_layers=MISTRAL3_DEPTH,
        )
        self.patch_conv = _Obj(weight=_mixing(WIDTH, 3 * p * p).view(WIDTH, 3, p, p))
        self.patch_positional_embedding = (
            _AxialRotary(WIDTH) if axial else _FlatRotary(WIDTH, MISTRAL3_SIDE // p)
        )
        transformer_class = code.klass(
            PIXTRAL, "PixtralHFTransformer", ["forward"], bases=(CallsForward,)
        )
        self.transformer = transformer_class()
        self.transformer.layers = [
            _Mistral3Layer(self, i, backend) for i in range(MISTRAL3_DEPTH)
        ]

    dtype = torch.float32
    device = parity_hosts.CPU

    @staticmethod
    def input_norm(pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows of ``(channels, patch, patch)`` pixels; each channel its own
        scale and shift, as the fused input norm's layout has them."""
        n = pixels.shape[0]
        scale = torch.tensor([0.5, -1.0, 2.0])[None, :, None]
        shift = torch.tensor([0.25, 0.0, -0.5])[None, :, None]
        return (
            (pixels.float().reshape(n, 3, -1) * scale + shift).reshape(n, -1).to(dtype)
        )

    @staticmethod
    def ln_pre(x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=-1, keepdim=True) / 2


def _mistral3_projector(code: WheelCode) -> Any:
    """vLLM's projector and patch merger (their forwards) on fixed linears
    (returning ``(out, None)`` as vLLM's parallel linears do)."""
    projector = code.klass(
        MISTRAL3, "Mistral3MultiModalProjector", ["forward"], bases=(CallsForward,)
    )()
    merger = code.klass(
        MISTRAL3, "Mistral3PatchMerger", ["forward"], bases=(CallsForward,)
    )()
    merger.spatial_merge_size = MISTRAL3_MERGE
    merger.patch_size = MISTRAL3_PATCH
    merger.merging_layer = FixedLinear(WIDTH * MISTRAL3_MERGE**2, WIDTH)
    projector.norm = lambda x: x * (x.pow(2).mean(dim=-1, keepdim=True) + 1).rsqrt()
    projector.patch_merger = merger
    linear_1, linear_2 = FixedLinear(WIDTH, 2 * WIDTH), FixedLinear(2 * WIDTH, WIDTH)
    projector.linear_1 = lambda x: (linear_1(x), None)
    projector.act = torch.tanh
    projector.linear_2 = lambda x: (linear_2(x), None)
    return projector


def _mistral3_host_class(code: WheelCode, mixin: type) -> type:
    parity_hosts.mm_attention_helpers(code)
    return code.klass(
        MISTRAL3,
        "Mistral3ForConditionalGeneration",
        ["_parse_and_validate_image_input", "_process_image_input"],
        bases=(mixin,),
    )


def _mistral3_host(axial: bool):
    def make_host(code: WheelCode, host_class: type, backend: str) -> Any:
        tower_class = code.klass(
            PIXTRAL,
            "PixtralHFVisionModel",
            ["forward"],
            bases=(_Mistral3TowerParts, CallsForward),
            exclude=["dtype", "device"],
        )
        host = host_class()
        host.vision_tower = tower_class(code, backend, axial)
        host.config = _Obj(
            vision_config=host.vision_tower.config,
            spatial_merge_size=MISTRAL3_MERGE,
            text_config=_Obj(hidden_size=WIDTH),
        )
        host.multi_modal_projector = _mistral3_projector(code)
        return host

    return make_host


def mistral3_batches() -> list[dict[str, Any]]:
    """Images of their own sizes (multiples of 4 pixels: 2-pixel patches,
    2 x 2 groups), as lists, and one stacked tensor of equal sizes; images
    taller or wider than 16 pixels run eagerly, as do batches past the
    ladder's top (128 tokens)."""
    gen = torch.Generator().manual_seed(3)
    sizes = [
        [(4, 4)],
        [(8, 12), (16, 4), (4, 16)],
        [(20, 8)],
        [(16, 16), (12, 8), (4, 24), (8, 8)],
        [(16, 16)] * 9,
        [(12, 16), (4, 4), (16, 12), (8, 4), (16, 8)],
    ]
    batches: list[dict[str, Any]] = [
        {"pixel_values": [torch.randn(3, h, w, generator=gen) for h, w in mix]}
        for mix in sizes
    ]
    batches.append({"pixel_values": torch.randn(3, 3, 8, 12, generator=gen)})
    return batches


def mistral3(axial: bool = True) -> OracleModel:
    return OracleModel(
        stem="mistral3",
        stubs={
            MISTRAL3: {"Mistral3ImagePixelInputs": schema_as_dict},
            PIXTRAL: {
                "TRANSFORMERS_WITH_AXIAL_ROPE": axial,
                "flat_position_ids_in_meshgrid": _flat_position_ids,
            },
        },
        host_class=_mistral3_host_class,
        make_host=_mistral3_host(axial),
        eager=lambda host, batch: list(
            host._process_image_input(
                {"type": "pixel_values_pixtral", "pixel_values": batch["pixel_values"]}
            )
        ),
        batches=mistral3_batches,
        backends=("FLASH_ATTN", "ROCM_AITER_FA", "TRITON_ATTN"),
        max_num_batched_tokens=128,
        violations=lambda host: host.vision_tower.violations,
    )


# ---------------------------------------------------------------------------
# PaliGemma: SigLIP over one fixed-size view per image, a linear projector
# ---------------------------------------------------------------------------

PALIGEMMA = "vllm.model_executor.models.paligemma"
PALIGEMMA_SIDE, PALIGEMMA_PATCH = 8, 2
#: Tokens of one image: (8 // 2) ** 2.
PALIGEMMA_TOKENS = 16


class _SiglipTower(TileTower):
    """:class:`TileTower` with what vLLM's host code reads of
    ``SiglipVisionModel``: its patch embedding (``get_input_embeddings``,
    whose weight's dtype the images are cast to) and ``dtype``."""

    dtype = torch.float32

    def get_input_embeddings(self) -> Any:
        return _Obj(weight=self.embed.weight)

    def __call__(self, pixel_values: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if pixel_values.dtype != self.dtype:
            raise TypeError(f"{pixel_values.dtype} pixels, a {self.dtype} tower")
        return super().__call__(pixel_values)


def _paligemma_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        PALIGEMMA,
        "PaliGemmaForConditionalGeneration",
        ["_parse_and_validate_image_input", "_process_image_input"],
        bases=(mixin,),
    )


def _paligemma_host(code: WheelCode, host_class: type, backend: str) -> Any:
    del backend  # SigLIP attends within each image: no varlen kernel
    host = host_class()
    host.config = _Obj(
        vision_config=_Obj(
            image_size=PALIGEMMA_SIDE, patch_size=PALIGEMMA_PATCH, projection_dim=WIDTH
        ),
    )
    host.vision_tower = _SiglipTower(PALIGEMMA_SIDE, PALIGEMMA_PATCH)
    host.multi_modal_projector = FixedLinear(WIDTH, WIDTH)
    return host


def one_view_batches(side: int, seed: int) -> list[dict[str, Any]]:
    """1 to 5 images of ``side x side`` pixels, one stacked tensor as the
    processor gives them (16 tokens each: 4 and 5 images exceed the
    ladder's top, 48 tokens, and are split or run eagerly)."""
    gen = torch.Generator().manual_seed(seed)
    counts = [1, 3, 5, 2, 4, 1]
    return [
        {"pixel_values": torch.randn(n, 3, side, side, generator=gen)} for n in counts
    ]


def paligemma() -> OracleModel:
    return OracleModel(
        stem="paligemma",
        stubs={
            PALIGEMMA: {
                "PaliGemmaImagePixelInputs": schema_as_dict,
                "PaliGemmaImageEmbeddingInputs": schema_as_dict,
            }
        },
        host_class=_paligemma_host_class,
        make_host=_paligemma_host,
        eager=lambda host, batch: list(
            host._process_image_input(
                {"type": "pixel_values", "data": batch["pixel_values"]}
            )
        ),
        batches=lambda: one_view_batches(PALIGEMMA_SIDE, 27),
    )


#: Every model of vLLM 0.33.0 without a hand-written mixin that has a spec:
#: its oracle (the catalog's models have parity rows in parity_hosts.MODELS).
ORACLES = {
    "cohere2_vision": cohere2_vision,
    "dots_ocr": dots_ocr,
    "eagle2_5_vl": eagle2_5_vl,
    "mistral3": mistral3,
    "paligemma": paligemma,
    "qwen2_5_omni": qwen2_5_omni,
}
