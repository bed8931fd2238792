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
from host_modules import FakeModule, ModuleOf
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


class CallsForward(FakeModule):
    """What ``nn.Module`` gives a vLLM module class taken from the wheel:
    calling it runs its ``forward``."""


class FixedLinear(FakeModule):
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


class _DotsBlock(FakeModule):
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
        self.blocks = torch.nn.ModuleList(
            _DotsBlock(self, i) for i in range(DOTS_DEPTH)
        )
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


class _OmniBlock(FakeModule):
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


class _OmniMerger(FakeModule):
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
        self.blocks = torch.nn.ModuleList(
            _OmniBlock(self, i) for i in range(QWEN3_OMNI_DEPTH)
        )
        self.merger = _OmniMerger(1.0)
        self.merger_list = torch.nn.ModuleList(
            _OmniMerger(-(i + 2) / 2) for i in QWEN3_OMNI_DEEPSTACK
        )

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


# ---------------------------------------------------------------------------
# PaddleOCR-VL: a SigLIP tower that builds its metadata image by image
# ---------------------------------------------------------------------------

PADDLE = "vllm.model_executor.models.paddleocr_vl"
#: Layers of the fake encoder: the graph must run every one, in order.
PADDLE_DEPTH = 3
#: The learned position table's side (the checkpoint's is 27): resized
#: bilinearly to each image's h x w patches, so its values move every row.
PADDLE_TABLE = 4
#: Columns of the language model's rows (the projector's output).
PADDLE_TEXT_WIDTH = 2 * WIDTH


def _rearrange(x: torch.Tensor, pattern: str, **sizes: int) -> torch.Tensor:
    """einops' ``rearrange`` (not installed here) for the two patterns
    PaddleOCR-VL's embeddings and projector use."""
    if pattern == "b l c h w -> (b l) c h w":
        return x.flatten(0, 1)
    if pattern == "(t h p1 w p2) d -> (t h w) (p1 p2 d)":
        t, h, p1, w, p2 = (sizes[k] for k in ("t", "h", "p1", "w", "p2"))
        x = x.reshape(t, h, p1, w, p2, x.shape[-1]).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(t * h * w, -1)
    raise NotImplementedError(pattern)


def _to_device(data: Any, dtype: torch.dtype, device: Any, **_: Any) -> torch.Tensor:
    """``async_tensor_h2d`` on a CPU-only machine: a copy of ``data``."""
    return torch.as_tensor(data, dtype=dtype, device=device)


class _PaddleLayer(FakeModule):
    """An encoder layer by FlashAttention's contract: the rows plus their
    RoPE angles mixed in (scaled by the layer's place in the list), then each
    row plus its sequence's mean (``parity_hosts.varlen_attention``)."""

    def __init__(self, encoder: Any, index: int) -> None:
        self.encoder, self.index = encoder, index

    def __call__(self, hidden, *, cu_seqlens, rotary_pos_emb, max_seqlen):
        angles = rotary_pos_emb.float() @ _mixing(rotary_pos_emb.shape[-1], WIDTH)
        rows = hidden[0].float() + angles * (self.index + 1) / 4
        violations = self.encoder.violations
        out = parity_hosts.varlen_attention(rows, cu_seqlens, max_seqlen, violations)
        return out.to(hidden.dtype).unsqueeze(0)


class _PaddlePatchEmbedding(FakeModule):
    """The patch convolution: each ``(3, p, p)`` patch to ``WIDTH`` fixed
    mixes, shaped ``(n, WIDTH, 1, 1)`` as a stride-``p`` convolution gives."""

    weight = torch.zeros(1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return parity_hosts.patch_embedding(x, x.dtype)[..., None, None]


class _PaddleEncoderParts(parity_hosts.Recorder):
    """``SiglipEncoder``'s learned parts: ``PADDLE_DEPTH`` layers; its
    rotary table is vLLM's ``SigLIPRotaryEmbedding``."""

    def __init__(self, code: WheelCode, backend: str, heads: int) -> None:
        super().__init__()
        self.attn_backend = AttentionBackendEnum[backend]
        self.layers = torch.nn.ModuleList(
            _PaddleLayer(self, i) for i in range(PADDLE_DEPTH)
        )
        rotary = code.klass(
            PADDLE, "SigLIPRotaryEmbedding", ["forward"], bases=(CallsForward,)
        )()
        dim = WIDTH // heads // 2
        rotary.inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.rotary_pos_emb = rotary


class _PaddleVisualParts:
    """``SiglipVisionModel``'s dtype (a property of its patch weights)."""

    dtype = torch.float32


def _paddle_visual(code: WheelCode, backend: str) -> Any:
    """vLLM's SigLIP vision model (embeddings, encoder, transformer and model
    forwards, the position table's resize) on fake learned parts."""
    heads = 1
    config = _Obj(
        num_channels=3,
        patch_size=parity_hosts.PATCH,
        hidden_size=WIDTH,
        num_attention_heads=heads,
    )
    embeddings = code.klass(
        PADDLE,
        "SiglipVisionEmbeddings",
        ["forward", "interpolate_pos_encoding"],
        bases=(CallsForward,),
    )()
    embeddings.patch_embedding = _PaddlePatchEmbedding()
    side = PADDLE_TABLE
    table = _mixing(side * side, WIDTH) + torch.arange(side * side)[:, None] / 8
    embeddings.position_embedding = _Obj(weight=table)
    encoder = code.klass(
        PADDLE,
        "SiglipEncoder",
        ["forward", "flatten_list"],
        bases=(_PaddleEncoderParts, CallsForward),
    )(code, backend, heads)
    transformer = code.klass(
        PADDLE, "SiglipVisionTransformer", ["forward"], bases=(CallsForward,)
    )()
    transformer.config = config
    transformer.embeddings = embeddings
    transformer.encoder = encoder
    transformer.post_layernorm = ModuleOf(
        lambda x: x - x.mean(dim=-1, keepdim=True) / 2
    )
    visual = code.klass(
        PADDLE,
        "SiglipVisionModel",
        ["forward"],
        bases=(_PaddleVisualParts, CallsForward),
        exclude=["dtype", "device"],
    )()
    visual.vision_model = transformer
    return visual


def _paddle_projector(code: WheelCode) -> Any:
    """vLLM's projector (its per-image 2 x 2 merge) on a fake norm,
    activation and fixed linears."""
    projector = code.klass(PADDLE, "Projector", ["forward"], bases=(CallsForward,))()
    projector.merge_kernel_size = (2, 2)
    projector.hidden_size = 4 * WIDTH
    projector.pre_norm = ModuleOf(lambda x: x * 2 - x.mean(dim=-1, keepdim=True))
    projector.linear_1 = FixedLinear(4 * WIDTH, 4 * WIDTH)
    projector.act = ModuleOf(torch.tanh)
    projector.linear_2 = FixedLinear(4 * WIDTH, PADDLE_TEXT_WIDTH)
    projector.linear_2.out_features = PADDLE_TEXT_WIDTH
    return projector


def _paddle_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        PADDLE,
        "PaddleOCRVLForConditionalGeneration",
        ["encode_image", "_process_image_input"],
        bases=(mixin,),
    )


def _paddle_host(code: WheelCode, host_class: type, backend: str) -> Any:
    host = host_class()
    host.visual = _paddle_visual(code, backend)
    host.mlp_AR = _paddle_projector(code)
    return host


def paddle_batches() -> list[dict[str, Any]]:
    """Images of [t, h, w] patches (h, w even: the 2 x 2 merge), the patches
    ``(n, 3, p, p)`` back to back as the processor gives them; a 24 x 24
    image is 144 tokens, above the ladder's top (128): eager."""
    mixes = [
        [(1, 4, 4)],
        [(1, 4, 6), (1, 2, 2), (1, 6, 4)],
        [(2, 4, 4), (1, 8, 2)],
        [(1, 10, 6), (1, 2, 8), (1, 4, 4), (1, 2, 2)],
        [(1, 24, 24), (1, 4, 2)],
    ]
    out = []
    for b, grids in enumerate(mixes):
        rows = sum(t * h * w for t, h, w in grids)
        gen = torch.Generator().manual_seed(100 + b)
        pixels = torch.randn(
            rows, 3, parity_hosts.PATCH, parity_hosts.PATCH, generator=gen
        )
        out.append({"pixel_values": pixels, "image_grid_thw": torch.tensor(grids)})
    return out


def paddleocr_vl() -> OracleModel:
    return OracleModel(
        stem="paddleocr_vl",
        stubs={
            PADDLE: {
                "rearrange": _rearrange,
                "torch_int": int,
                "PIN_MEMORY": False,
                "async_tensor_h2d": _to_device,
            }
        },
        host_class=_paddle_host_class,
        make_host=_paddle_host,
        eager=lambda host, batch: list(host._process_image_input(_Obj(**batch))),
        batches=paddle_batches,
        backends=("FLASH_ATTN", "ROCM_AITER_FA", "TRITON_ATTN"),
        max_num_batched_tokens=128,
        violations=lambda host: host.visual.vision_model.encoder.violations,
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
        bases=(_FirstParameter, CallsForward),
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
        bases=(_FirstParameter, CallsForward),
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


# ---------------------------------------------------------------------------
# Pixtral (Mistral format): per-image (3, H, W) tensors, 2-D RoPE, a merger
# ---------------------------------------------------------------------------

PIXTRAL = "vllm.model_executor.models.pixtral"
DISTRIBUTED = "vllm.distributed"
PIXTRAL_PATCH = 2
#: The largest image side (``vision_args.image_size``): 16 x 16 patches.
PIXTRAL_SIDE = 32
#: Blocks of the fake transformer: the graph must run every one, in order.
PIXTRAL_DEPTH = 2


class _PixtralPatchConv(FakeModule):
    """The patch convolution (kernel and stride one patch, no bias) with
    fixed weights: every pixel of a patch moves its row."""

    def __init__(self) -> None:
        size = 3 * PIXTRAL_PATCH * PIXTRAL_PATCH
        self.weight = _mixing(WIDTH, size).view(WIDTH, 3, PIXTRAL_PATCH, PIXTRAL_PATCH)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.to(x.dtype)
        return torch.nn.functional.conv2d(x, weight, stride=PIXTRAL_PATCH)


class _PixtralBlock:
    """A transformer block by FlashAttention's contract: the rows plus their
    RoPE rows (scaled by the block's place in the list), then each row plus
    its sequence's mean (``parity_hosts.varlen_attention``). ``sequence
    lengths`` must be None under the backends the spec allows."""

    def __init__(self, tower: Any, index: int, backend: str) -> None:
        self.tower, self.index = tower, index
        self.attention = _Obj(attn=_Obj(attn_backend=AttentionBackendEnum[backend]))

    def __call__(self, x, freqs_cis, cu_seqlens, max_seqlen, sequence_lengths):
        violations = self.tower.violations
        if sequence_lengths is not None:
            violations.setdefault("sequence_lengths", []).append(
                "sequence_lengths given under a backend that takes none"
            )
        if x.shape[0] != 1 or freqs_cis.shape[0] != x.shape[1]:
            violations.setdefault("shapes", []).append(
                f"rows {tuple(x.shape)}, RoPE rows {tuple(freqs_cis.shape)}"
            )
        rows = x[0].float() + freqs_cis.flatten(1).float() * (self.index + 1) / 4
        out = parity_hosts.varlen_attention(rows, cu_seqlens, max_seqlen, violations)
        return out.to(x.dtype)[None]


class _PixtralTowerParts(parity_hosts.Recorder):
    """The learned parts of vLLM's ``VisionTransformer``: the patch
    convolution, ``ln_pre`` (row-wise) and the blocks of its ``Transformer``
    (vLLM's forward over the fake blocks); ``forward`` and the RoPE table
    (``freqs_cis``, ``precompute_freqs_cis_2d``) are vLLM's (subclass). One
    head of ``WIDTH`` columns: a RoPE row is ``WIDTH`` wide."""

    def __init__(self, code: WheelCode, args: _Obj, backend: str) -> None:
        super().__init__()
        self.args = args
        self._freqs_cis = None
        self.patch_conv = _PixtralPatchConv()
        transformer = code.klass(
            PIXTRAL, "Transformer", ["forward"], bases=(CallsForward,)
        )()
        transformer.layers = [
            _PixtralBlock(self, i, backend) for i in range(PIXTRAL_DEPTH)
        ]
        self.transformer = transformer

    dtype = torch.float32
    device = parity_hosts.CPU

    def ln_pre(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=-1, keepdim=True) / 2


def _pixtral_args(merger: bool) -> _Obj:
    """``VisionEncoderArgs``: Pixtral-12B's form (no merger, no norm) or
    Mistral-Small-3.1's (a 2 x 2 patch merger after a norm)."""
    return _Obj(
        hidden_size=WIDTH,
        num_channels=3,
        image_size=PIXTRAL_SIDE,
        patch_size=PIXTRAL_PATCH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=PIXTRAL_DEPTH,
        num_attention_heads=1,
        rope_theta=10000.0,
        image_token_id=10,
        adapter_bias=False,
        spatial_merge_size=2 if merger else 1,
        add_pre_mm_projector_layer_norm=merger,
        mm_projector_id="patch_merge" if merger else "",
    )


def _pixtral_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        PIXTRAL,
        "PixtralForConditionalGeneration",
        ["embed_multimodal", "_parse_and_validate_image_input", "_process_image_input"],
        bases=(mixin,),
    )


def _pixtral_host(merger: bool) -> Any:
    def make_host(code: WheelCode, host_class: type, backend: str) -> Any:
        parity_hosts.mm_attention_helpers(code)
        args = _pixtral_args(merger)
        tower_class = code.klass(
            PIXTRAL,
            "VisionTransformer",
            ["forward", "freqs_cis"],
            bases=(_PixtralTowerParts, CallsForward),
            exclude=["dtype", "device"],
        )
        host = host_class()
        host.vision_args = args
        host.vision_encoder = tower_class(code, args, backend)
        host.pre_mm_projector_norm = (
            (lambda x: x * 0.75 + x.mean(dim=-1, keepdim=True)) if merger else None
        )
        host.patch_merger = None
        if merger:
            host.patch_merger = code.klass(
                PIXTRAL, "PatchMerger", ["forward", "permute"], bases=(CallsForward,)
            )()
            host.patch_merger.spatial_merge_size = args.spatial_merge_size
            host.patch_merger.merging_layer = FixedLinear(4 * WIDTH, WIDTH)
        adapter = code.klass(
            PIXTRAL, "VisionLanguageAdapter", ["forward"], bases=(CallsForward,)
        )()
        adapter.w_in = FixedLinear(WIDTH, 2 * WIDTH)
        adapter.gelu = torch.nn.functional.gelu
        adapter.w_out = FixedLinear(2 * WIDTH, WIDTH)
        adapter.w_out.output_size = WIDTH
        host.vision_language_adapter = adapter
        return host

    return make_host


def pixtral_batches(merger: bool) -> Any:
    """Images of their own sizes (multiples of the patch, or of the 2 x 2
    merge group), as a list or one stacked tensor when the sizes agree, as
    vLLM's processor gives them (batches 2 and 5 stacked); sides up to the
    table's 32 pixels, one image a row of patches as wide as it. Without
    the merger a 32 x 32 image is 256 tokens, above the ladder's top (128):
    eager."""
    step = PIXTRAL_PATCH * (2 if merger else 1)
    sizes = [
        [(1, 1)],
        [(2, 3), (8, 8), (1, 5)],
        [(PIXTRAL_SIDE // step, PIXTRAL_SIDE // step)],
        [(4, 2), (3, 3), (5, 1), (1, 1)],
        [(2, 8), (PIXTRAL_SIDE // step, PIXTRAL_SIDE // step), (2, 2)],
        [(3, 4)] * 4,
        [(6, 6), (3, 8), (1, PIXTRAL_SIDE // step)],
    ]

    def batches() -> list[dict[str, Any]]:
        gen = torch.Generator().manual_seed(26)
        out = []
        for b, mix in enumerate(sizes):
            images = [torch.randn(3, h * step, w * step, generator=gen) for h, w in mix]
            same = len({img.shape for img in images}) == 1
            stacked = same and b % 3 == 2
            out.append({"images": torch.stack(images) if stacked else images})
        return out

    return batches


def pixtral(merger: bool = False) -> OracleModel:
    """Pixtral-12B's form, or with ``merger`` Mistral-Small-3.1's."""
    return OracleModel(
        stem="pixtral",
        stubs={
            PIXTRAL: {"PixtralImagePixelInputs": schema_as_dict},
            VISION: {"is_vit_use_data_parallel": lambda: False},
            DISTRIBUTED: {"get_tensor_model_parallel_world_size": lambda: 1},
        },
        host_class=_pixtral_host_class,
        make_host=_pixtral_host(merger),
        eager=lambda host, batch: list(host.embed_multimodal(**batch)),
        batches=pixtral_batches(merger),
        backends=("FLASH_ATTN", "ROCM_AITER_FA", "TRITON_ATTN"),
        max_num_batched_tokens=128,
        violations=lambda host: host.vision_encoder.violations,
    )


# ---------------------------------------------------------------------------
# Mistral3: the HF Pixtral tower over per-image (3, H_i, W_i) tensors
# ---------------------------------------------------------------------------

MISTRAL3 = "vllm.model_executor.models.mistral3"
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


class _AxialRotary(FakeModule):
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


class _FlatRotary(FakeModule):
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
    def _input_norm(pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows of ``(channels, patch, patch)`` pixels; each channel its own
        scale and shift, as the fused input norm's layout has them."""
        n = pixels.shape[0]
        scale = torch.tensor([0.5, -1.0, 2.0])[None, :, None]
        shift = torch.tensor([0.25, 0.0, -0.5])[None, :, None]
        return (
            (pixels.float().reshape(n, 3, -1) * scale + shift).reshape(n, -1).to(dtype)
        )

    @staticmethod
    def _ln_pre(x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=-1, keepdim=True) / 2

    # vLLM's are RMSNorm modules.
    input_norm = ModuleOf(_input_norm)
    ln_pre = ModuleOf(_ln_pre)


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
    projector.norm = ModuleOf(
        lambda x: x * (x.pow(2).mean(dim=-1, keepdim=True) + 1).rsqrt()
    )
    projector.patch_merger = merger
    linear_1, linear_2 = FixedLinear(WIDTH, 2 * WIDTH), FixedLinear(2 * WIDTH, WIDTH)
    projector.linear_1 = ModuleOf(lambda x: (linear_1(x), None))
    projector.act = ModuleOf(torch.tanh)
    projector.linear_2 = ModuleOf(lambda x: (linear_2(x), None))
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
# LLaVA-NeXT: CLIP tiles, each image's anyres grid merged after the graph
# ---------------------------------------------------------------------------

LLAVA_NEXT = "vllm.model_executor.models.llava_next"
LLAVA = "vllm.model_executor.models.llava"
LLAVA_NEXT_SIDE, LLAVA_NEXT_PATCH = 8, 2
#: Tokens of one tile: (8 // 2) ** 2.
LLAVA_NEXT_TOKENS = 16
#: The released checkpoints' pinpoints, scaled to 8-pixel tiles: grids of
#: 1 x 2, 2 x 1, 2 x 2, 1 x 3 and 3 x 1 tiles.
LLAVA_NEXT_PINPOINTS = [[8, 16], [16, 8], [16, 16], [8, 24], [24, 8]]


def best_resolution(size: tuple[int, int], pinpoints: list) -> tuple[int, int]:
    """The ``(height, width)`` pinpoint Hugging Face's anyres search picks for
    an image of ``size``: the most of the image kept when it is scaled to
    fit, then the least area wasted (its float arithmetic, on purpose)."""
    height, width = size
    best, kept_best, waste_best = None, 0, float("inf")
    for pin_h, pin_w in pinpoints:
        scale = min(pin_w / width, pin_h / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = pin_w * pin_h - kept
        if kept > kept_best or (kept == kept_best and waste < waste_best):
            best, kept_best, waste_best = (pin_h, pin_w), kept, waste
    return best


def anyres_grid_shape(image_size, grid_pinpoints: list, patch_size: int):
    """``get_anyres_image_grid_shape``: the tile grid ``(rows, columns)`` of
    an image of ``image_size`` (a tuple or a tensor row)."""
    if not isinstance(image_size, (list, tuple)):
        image_size = image_size.tolist()
    height, width = best_resolution(tuple(image_size), grid_pinpoints)
    return height // patch_size, width // patch_size


def unpad_to_aspect(tensor: torch.Tensor, original_size) -> torch.Tensor:
    """``unpad_image``: ``(c, h, w)`` cut back to the image's aspect ratio,
    the padding split evenly on both sides (rounded as Hugging Face does)."""
    if not isinstance(original_size, (list, tuple)):
        original_size = original_size.tolist()
    height, width = original_size
    rows, cols = tensor.shape[1:]
    if width / height > cols / rows:
        kept = int(round(height * (cols / width), 7))
        cut = (rows - kept) // 2
        return tensor[:, cut : rows - cut, :]
    kept = int(round(width * (rows / height), 7))
    cut = (cols - kept) // 2
    return tensor[:, :, cut : cols - cut]


class _ClipTiles(TileTower):
    """vLLM's CLIP tower over tiles: the selected layers' rows, the class
    row kept or dropped by the feature strategy (a strategy or layers the
    spec passes wrong change the rows)."""

    def __call__(self, pixel_values, *, select_layers, feature_select_strategy):
        rows = super().__call__(pixel_values)
        if select_layers is not None:
            rows = torch.cat([rows] * len(select_layers), dim=-1)
        if feature_select_strategy == "default":
            return rows
        if feature_select_strategy == "full":
            return torch.cat([rows.mean(dim=1, keepdim=True), rows], dim=1)
        raise ValueError(f"feature strategy {feature_select_strategy!r}")


def _llava_next_host_class(code: WheelCode, mixin: type) -> type:
    return code.klass(
        LLAVA_NEXT,
        "LlavaNextForConditionalGeneration",
        ["_process_image_input"],
        bases=(mixin,),
    )


def _llava_projector(code: WheelCode) -> Any:
    """vLLM's LLaVA projector (its forward) on fixed linears."""
    projector = code.klass(
        LLAVA, "LlavaMultiModalProjector", ["forward"], bases=(CallsForward,)
    )()
    linear_1, linear_2 = FixedLinear(WIDTH, 2 * WIDTH), FixedLinear(2 * WIDTH, WIDTH)
    projector.linear_1 = ModuleOf(lambda x: (linear_1(x), None))
    projector.act = ModuleOf(torch.tanh)
    projector.linear_2 = ModuleOf(lambda x: (linear_2(x), None))
    return projector


def _llava_next_host(code: WheelCode, host_class: type, backend: str) -> Any:
    del backend  # CLIP tiles attend within themselves: no varlen kernel
    host = host_class()
    host.config = _Obj(
        vision_config=_Obj(image_size=LLAVA_NEXT_SIDE, patch_size=LLAVA_NEXT_PATCH),
        image_grid_pinpoints=LLAVA_NEXT_PINPOINTS,
        vision_feature_select_strategy="default",
        text_config=_Obj(hidden_size=WIDTH),
    )
    host.select_layers = None
    host.vision_tower = _ClipTiles(LLAVA_NEXT_SIDE, LLAVA_NEXT_PATCH)
    host.multi_modal_projector = _llava_projector(code)
    host.image_newline = torch.nn.Parameter(torch.arange(WIDTH).float() / 8 - 3)
    return host


def llava_next_tiles(size: tuple[int, int]) -> int:
    """The processor's tiles of an image: its base view and its grid's."""
    rows, cols = anyres_grid_shape(size, LLAVA_NEXT_PINPOINTS, LLAVA_NEXT_SIDE)
    return 1 + rows * cols


def llava_next_batches() -> list[dict[str, Any]]:
    """Images of many aspect ratios (every pinpoint picked, cuts of both
    sides, exact fits), as lists of their own tile counts, padded to a
    prompt's widest (more tiles than the grid), and stacked; an image padded
    past 5 tiles runs eagerly, as do batches past the ladder's top (128)."""
    gen = torch.Generator().manual_seed(31)
    side = LLAVA_NEXT_SIDE
    mixes = [
        [((10, 30), 0)],
        [((30, 10), 0), ((20, 20), 0), ((7, 9), 0)],
        [((16, 8), 2), ((8, 24), 0)],
        [((49, 97), 0), ((100, 33), 0), ((13, 13), 1), ((5, 40), 0)],
        [((24, 9), 3)],
        [((12, 40), 0)] * 6,
    ]
    batches: list[dict[str, Any]] = []
    for mix in mixes:
        tiles = [llava_next_tiles(size) + pad for size, pad in mix]
        batches.append(
            {
                "pixel_values": [
                    torch.randn(n, 3, side, side, generator=gen) for n in tiles
                ],
                "image_sizes": torch.tensor([size for size, _ in mix]),
            }
        )
    # One prompt's images, padded to its widest and stacked.
    sizes = [(30, 12), (9, 30), (25, 25)]
    widest = max(llava_next_tiles(size) for size in sizes)
    batches.append(
        {
            "pixel_values": torch.randn(
                len(sizes), widest, 3, side, side, generator=gen
            ),
            "image_sizes": torch.tensor(sizes),
        }
    )
    return batches


class _EmbeddingInputs:
    """``LlavaNextImageEmbeddingInputs``: never what the oracle passes."""


def llava_next() -> OracleModel:
    return OracleModel(
        stem="llava_next",
        stubs={
            LLAVA_NEXT: {
                "get_anyres_image_grid_shape": anyres_grid_shape,
                "unpad_image": unpad_to_aspect,
                "LlavaNextImageEmbeddingInputs": _EmbeddingInputs,
            }
        },
        host_class=_llava_next_host_class,
        make_host=_llava_next_host,
        eager=lambda host, batch: list(
            host._process_image_input({"type": "pixel_values", **batch})
        ),
        batches=llava_next_batches,
        max_num_batched_tokens=128,
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
    "llava_next": llava_next,
    "mistral3": mistral3,
    "paddleocr_vl": paddleocr_vl,
    "paligemma": paligemma,
    "phi3v": phi3v,
    "phi4mm": phi4mm,
    "pixtral": pixtral,
    "qwen2_5_omni": qwen2_5_omni,
    "qwen3_omni": qwen3_omni,
    "skyworkr1v": skyworkr1v,
}
