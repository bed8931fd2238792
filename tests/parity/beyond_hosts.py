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
# Skywork-R1V: InternViT tiles (a CLS row first), InternVL's shuffle and mlp1
# ---------------------------------------------------------------------------

SKYWORK = "vllm.model_executor.models.skyworkr1v"


class ClsTileTower(TileTower):
    """An InternViT-like tower: :class:`TileTower`'s rows after a CLS row (the
    tile's mean, halved), ``(n, 1 + S, WIDTH)``; a host that kept the CLS row
    would have a row too many and every row of the shuffle shifted."""

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        rows = super().__call__(pixel_values)
        return torch.cat([rows.mean(dim=1, keepdim=True) / 2, rows], dim=1)


def _skywork_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        SKYWORK,
        "SkyworkR1VChatModel",
        ["_process_image_input", "extract_feature", "pixel_shuffle"],
        bases=(mixin,),
    )


def _skywork_host(code: WheelCode, host_class: type, backend: str) -> Any:
    del backend  # InternViT tiles attend within themselves: no varlen kernel
    host = host_class()
    host.config = _Obj(
        # The processor and vLLM's input check use the vision config's side;
        # force_image_size only enters num_image_token (the same side here).
        force_image_size=None,
        vision_config=_Obj(image_size=EAGLE_SIDE, patch_size=EAGLE_PATCH),
        text_config=_Obj(hidden_size=WIDTH),
    )
    host.downsample_ratio = 0.5
    host.ps_version = "v2"
    host.num_image_token = EAGLE_TOKENS
    host.vision_model = ClsTileTower(EAGLE_SIDE, EAGLE_PATCH)
    host.mlp1 = FixedLinear(WIDTH * 4, WIDTH)
    return host


def skyworkr1v() -> OracleModel:
    return OracleModel(
        stem="skyworkr1v",
        stubs={},
        host_class=_skywork_host_class,
        make_host=_skywork_host,
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
# Qwen3-Omni (thinker): a varlen tower without a packed entry point, DeepStack
# ---------------------------------------------------------------------------

QWEN3_OMNI = "vllm.model_executor.models.qwen3_omni_moe_thinker"
#: Blocks of the fake tower, and the blocks after which DeepStack keeps the
#: hidden states (the first and the second: a tap one block off, or the
#: taps' order, changes the rows).
QWEN3_OMNI_DEPTH = 3
QWEN3_OMNI_DEEPSTACK = [0, 1]
#: The learned position table's side (the tower interpolates it to a grid).
QWEN3_OMNI_POS_GRID = 4


class _OmniRotary:
    """``get_cos_sin(n)`` of a RoPE cache (vLLM's ``get_rope``): position
    codes, ``WIDTH // 4`` per position, so a row of ``(h, w)`` codes is
    ``WIDTH // 2`` wide (one head, half its width rotated)."""

    def get_cos_sin(self, seqlen: int) -> tuple[torch.Tensor, torch.Tensor]:
        codes = torch.arange(int(seqlen), dtype=torch.float32)[:, None] + torch.arange(
            WIDTH // 4, dtype=torch.float32
        ) / (2 * WIDTH)
        return codes, -codes / 2


class _OmniTable:
    """An ``nn.Embedding``: rows of a fixed table by index."""

    def __init__(self, rows: int) -> None:
        codes = torch.arange(rows * WIDTH, dtype=torch.float32)
        self.weight = codes.reshape(rows, WIDTH) / 64
        self.embedding_dim = WIDTH

    def __call__(self, indices: torch.Tensor) -> torch.Tensor:
        return self.weight[indices]


class _OmniBlock:
    """A ``Qwen3_VisionBlock`` by FlashAttention's contract, on ``(rows, 1,
    WIDTH)``: the rows plus their RoPE codes (cos and sin side by side),
    scaled by the block's place in the list, then each row plus its
    sequence's mean."""

    def __init__(self, tower: Any, index: int) -> None:
        self.tower, self.index = tower, index

    def __call__(
        self,
        x,
        *,
        cu_seqlens,
        rotary_pos_emb_cos,
        rotary_pos_emb_sin,
        max_seqlen,
        sequence_lengths,
    ):
        codes = torch.cat([rotary_pos_emb_cos, rotary_pos_emb_sin], dim=-1).float()
        rows = x[:, 0, :].float() + codes * (self.index + 1) / 4
        violations = self.tower.violations
        out = parity_hosts.varlen_attention(rows, cu_seqlens, max_seqlen, violations)
        return out.to(x.dtype)[:, None, :]


class _OmniMerger:
    """A patch merger: each run of merge x merge rows (order inside the run
    matters) through a fixed linear map, scaled by ``scale``."""

    def __init__(self, scale: float) -> None:
        self.linear, self.scale = FixedLinear(4 * WIDTH, WIDTH), scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.reshape(-1, 4 * WIDTH)) * self.scale


class _OmniTowerParts(parity_hosts.Recorder):
    """The learned parts of ``Qwen3Omni_VisionTransformer`` and the
    attributes its ``__init__`` sets: ``QWEN3_OMNI_DEPTH`` blocks, a learned
    position table, the merger and one DeepStack merger per kept block.
    ``forward``, ``rot_pos_emb``, ``fast_pos_embed_interpolate`` and
    ``compute_attn_mask_seqlen`` are vLLM's (subclass)."""

    def __init__(self, backend: str, positions: bool) -> None:
        super().__init__()
        self.hidden_size = WIDTH
        self.num_heads = 1
        self.patch_size = parity_hosts.PATCH
        self.spatial_merge_size = 2
        self.spatial_merge_unit = 4
        self.temporal_patch_size = 2
        self.num_grid_per_side = QWEN3_OMNI_POS_GRID
        self.apply_vit_abs_pos_embed = positions
        self.deepstack_visual_indexes = QWEN3_OMNI_DEEPSTACK
        self.attn_backend = AttentionBackendEnum[backend]
        self.patch_embed = parity_hosts._CallablePatchEmbed(
            lambda x: parity_hosts.patch_embedding(x, torch.float32),
            proj=_Obj(in_channels=3),
        )
        self.pos_embed = _OmniTable(QWEN3_OMNI_POS_GRID**2)
        self.rotary_pos_emb = _OmniRotary()
        self.blocks = [_OmniBlock(self, i) for i in range(QWEN3_OMNI_DEPTH)]
        self.merger = _OmniMerger(1.0)
        self.merger_list = [_OmniMerger(-(i + 2) / 2) for i in QWEN3_OMNI_DEEPSTACK]

    dtype = torch.float32
    device = parity_hosts.CPU


def _qwen3_omni_host_class(code: WheelCode, mixin: type) -> type:
    """The thinker's image path: ``_process_image_input``, which the
    thinker inherits unchanged from Qwen2.5-Omni's mixin."""
    return code.klass(
        OMNI,
        "Qwen2_5OmniConditionalGenerationMixin",
        ["_process_image_input"],
        bases=(mixin,),
    )


def _qwen3_omni_host(positions: bool):
    """Hosts whose tower adds its interpolated position table, or, without
    ``positions``, none (``apply_vit_abs_pos_embed`` off)."""

    def make_host(code: WheelCode, host_class: type, backend: str) -> Any:
        return _qwen3_omni_tower_host(code, host_class, backend, positions)

    return make_host


def _qwen3_omni_tower_host(
    code: WheelCode, host_class: type, backend: str, positions: bool
) -> Any:
    parity_hosts.mm_attention_helpers(code)
    tower_class = code.klass(
        QWEN3_OMNI,
        "Qwen3Omni_VisionTransformer",
        [
            "forward",
            "rot_pos_emb",
            "fast_pos_embed_interpolate",
            "compute_attn_mask_seqlen",
        ],
        bases=(_OmniTowerParts, CallsForward),
        exclude=["dtype", "device"],
    )
    host = host_class()
    host.vllm_config = vllm_config(1)
    host.visual = tower_class(backend, positions)
    host.visual_dim = WIDTH
    host.multiscale_dim = WIDTH * len(QWEN3_OMNI_DEEPSTACK)
    return host


def qwen3_omni(positions: bool = True) -> OracleModel:
    return OracleModel(
        stem="qwen3_omni",
        # The logger is read only on the fallback for ROCm's RDNA3 (not taken).
        stubs={**parity_hosts.QWEN25_STUBS, QWEN3_OMNI: {"logger": None}},
        host_class=_qwen3_omni_host_class,
        make_host=_qwen3_omni_host(positions),
        eager=lambda host, batch: list(
            host._process_image_input({"type": "pixel_values", **batch})
        ),
        batches=omni_batches,
        backends=("FLASH_ATTN", "ROCM_AITER_FA", "TRITON_ATTN"),
        max_num_batched_tokens=128,
        violations=lambda host: host.visual.violations,
    )


#: Every model of vLLM 0.33.0 without a hand-written mixin that has a spec:
#: its oracle (the catalog's models have parity rows in parity_hosts.MODELS).
ORACLES = {
    "cohere2_vision": cohere2_vision,
    "dots_ocr": dots_ocr,
    "eagle2_5_vl": eagle2_5_vl,
    "qwen2_5_omni": qwen2_5_omni,
    "qwen3_omni": qwen3_omni,
    "skyworkr1v": skyworkr1v,
}
