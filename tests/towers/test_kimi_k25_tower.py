"""Kimi-K2.5 reference tower (MoonViT3d + projector): configuration,
metadata and helpers against vLLM's own code, an independent dense
derivation of a video chunk, vLLM's and the generated mixin run on the host
with images and video chunks in one ``vision_chunk`` batch, registry entry."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tower_testlib import manager_for
from towers_vllm_source import (
    bind,
    mm_encoder_attention,
    runtime_namespace,
    vllm_mixin,
)

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers.kimi_k25 import (
    KimiK25Config,
    image_merge_gather_index,
    time_sincos_table,
    tpool_patch_merger,
)
from reference_towers.registry import REFERENCE_TOWERS, generated_mixin

TOWER = REFERENCE_TOWERS["kimi_k25"]
VIT = "vllm/model_executor/models/kimi_k25_vit.py"
KIMI = "vllm/model_executor/models/kimi_k25.py"
FUSED = "vllm/transformers_utils/processors/kimi_k25_vision_fused.py"
MIXIN_METHODS = [
    "get_encoder_cudagraph_config",
    "get_encoder_cudagraph_budget_range",
    "_get_grid_thw_list",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
    "_parse_and_validate_media_input",
    "_process_media_input",
]
# (t, h, w): the learned grid's own size, strips, odd block counts, chunks.
IMAGES = [(1, 8, 8), (1, 2, 2), (1, 6, 10), (1, 2, 40)]
CHUNKS = [(4, 6, 4), (2, 2, 2), (3, 8, 8)]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


# -- vLLM's code from the wheel ------------------------------------------------


def _vllm_namespace(source) -> dict:
    ns = runtime_namespace()
    ns["nn"] = torch.nn
    mm_encoder_attention(source, ns)
    source.load(
        VIT,
        [
            "get_rope_shape",
            "get_1d_sincos_pos_embed_from_grid",
            "get_1d_sincos_pos_embed",
            "tpool_patch_merger",
            "build_image_merge_gather_idx",
            "mm_projector_forward",
            "vision_tower_forward",
        ],
        ns,
    )
    return ns


def _vllm_tower(source, tower, backend=AttentionBackendEnum.FLASH_ATTN):
    """A stand-in for vLLM's ``MoonViT3dPretrainedModel`` holding ``tower``'s
    position grid, whose metadata code (position and time embeddings, RoPE
    table, sequences, merge index) is vLLM's own."""
    ns = _vllm_namespace(source)
    rope_cls = source.make_class(
        "Rope2DPosEmbRepeated",
        VIT,
        "Rope2DPosEmbRepeated",
        ["_precompute_freqs_cis", "get_freqs_cis"],
        ns,
        (torch.nn.Module,),
    )
    rope = rope_cls()
    ours = tower.encoder.rope_2d
    rope.dim, rope.max_height, rope.max_width = ours.dim, 512, 512
    rope.theta_base = 10000
    pos_cls = source.make_class(
        "PosEmb", VIT, "Learnable2DInterpPosEmbDivided_fixed", ["get_pos_embeds"], ns
    )
    pos = pos_cls()
    weight = tower.patch_embed.pos_emb.weight
    pos.weight, pos.num_frames, pos.interpolation_mode = weight, 4, "bicubic"
    pos.time_weight = (
        torch.from_numpy(ns["get_1d_sincos_pos_embed"](weight.shape[-1], 4))
        .float()
        .unsqueeze(1)
    )
    block = SimpleNamespace(
        attn=SimpleNamespace(attn_backend=backend),
        hidden_dim=weight.shape[-1],
        tp_size=1,
    )
    encoder = bind(
        SimpleNamespace(rope_2d=rope, blocks=[block]),
        source.load(VIT, ["prepare_encoder_metadata"], ns, cls="MoonViT3dEncoder"),
    )
    stand_in = SimpleNamespace(
        encoder=encoder,
        patch_embed=SimpleNamespace(pos_emb=pos),
        merge_kernel_size=tower.merge_kernel_size,
    )
    bind(
        stand_in,
        source.load(
            VIT,
            ["prepare_encoder_cudagraph_metadata"],
            ns,
            cls="MoonViT3dPretrainedModel",
        ),
    )
    return stand_in, ns


def _assert_same_metadata(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        mine = ours[key]
        if value is None:
            assert mine is None, key
            continue
        assert (mine.dtype, mine.device, mine.shape) == (
            value.dtype,
            value.device,
            value.shape,
        ), key
        assert torch.equal(mine, value), key


# -- configuration and attribute paths ------------------------------------------


def test_full_config_values():
    config = KimiK25Config.full()
    v = config.vision_config
    assert (v.patch_size, v.init_pos_emb_height, v.init_pos_emb_width) == (14, 64, 64)
    assert (v.init_pos_emb_time, v.num_hidden_layers, v.hidden_size) == (4, 27, 1152)
    assert (v.num_attention_heads, v.intermediate_size) == (16, 4304)
    assert tuple(v.merge_kernel_size) == (2, 2)
    assert config.text_config.hidden_size == 7168
    assert (config.in_patch_limit, config.patch_limit_on_one_side) == (16384, 512)
    assert (config.frames_per_chunk, config.max_model_len) == (4, 262144)


def test_mixin_attribute_paths(kimi_k25_host):
    tower = kimi_k25_host.vision_tower
    assert tower.merge_kernel_size == (2, 2) and tower.patch_size == 14
    assert (tower.encoder.rope_2d.max_height, tower.encoder.rope_2d.max_width) == (
        512,
        512,
    )
    assert tower.patch_embed.input_norm.input_dtype is None
    assert all(
        b.attn.attn_backend is AttentionBackendEnum.FLASH_ATTN
        for b in tower.encoder.blocks
    )
    assert kimi_k25_host.config.text_config.hidden_size == 96
    assert next(kimi_k25_host.mm_projector.parameters()).dtype == torch.float32
    names = {name for name, _ in kimi_k25_host.named_parameters()}
    assert {
        "vision_tower.patch_embed.proj.weight",
        "vision_tower.patch_embed.pos_emb.weight",
        "vision_tower.encoder.blocks.1.wqkv.bias",
        "vision_tower.encoder.final_layernorm.weight",
        "mm_projector.pre_norm.weight",
        "mm_projector.linear_2.bias",
    } <= names


def test_the_time_table_survives_build_and_cast():
    """``to_empty`` and the bf16 cast: the fixed time table is refilled and
    cast with the tower, as vLLM's ``.to(dtype)`` casts the buffer."""
    host = TOWER.build_host(object, "tiny", device="cpu", dtype=torch.bfloat16)
    table = host.vision_tower.patch_embed.pos_emb.time_weight
    assert table.dtype == torch.bfloat16 and table.shape == (4, 1, 64)
    assert torch.equal(table, time_sincos_table(64, 4).bfloat16())


# -- metadata and helpers against vLLM -----------------------------------------------


def test_time_table_matches_vllm(vllm_source):
    ns = _vllm_namespace(vllm_source)
    for dim, frames in ((64, 4), (1152, 4), (6, 3)):
        theirs = torch.from_numpy(ns["get_1d_sincos_pos_embed"](dim, frames))
        assert torch.equal(time_sincos_table(dim, frames), theirs.float().unsqueeze(1))


def test_merge_helpers_match_vllm(vllm_source):
    ns = _vllm_namespace(vllm_source)
    ours = image_merge_gather_index(IMAGES, (2, 2))
    theirs = ns["build_image_merge_gather_idx"](IMAGES, (2, 2))
    assert ours.dtype == theirs.dtype and (ours == theirs).all()
    with pytest.raises(ValueError, match="T == 1"):
        image_merge_gather_index([(2, 2, 2)], (2, 2))
    grids = IMAGES + CHUNKS
    x = torch.randn(sum(t * h * w for t, h, w in grids), 5)
    pooled = tpool_patch_merger(x, grids, (2, 2))
    expected = ns["tpool_patch_merger"](x, torch.tensor(grids), (2, 2))
    assert all(torch.equal(a, b) for a, b in zip(pooled, expected, strict=True))
    # Images: the pooling is exact, the gather is the merger.
    rows = sum(h * w for _, h, w in IMAGES)
    gathered = x[:rows][torch.from_numpy(ours)]
    assert torch.equal(gathered, torch.cat(pooled[: len(IMAGES)]))


@pytest.mark.parametrize(
    "backend", [AttentionBackendEnum.FLASH_ATTN, AttentionBackendEnum.FLASHINFER]
)
@pytest.mark.parametrize(
    "grids, kwargs",
    [
        (IMAGES + CHUNKS, {}),
        ([(3, 6, 10), (1, 2, 2)], {"max_batch_size": 5}),
        ([(1, 2, 40)], {"max_batch_size": 3, "max_seqlen_override": 512}),
    ],
)
def test_encoder_metadata_matches_vllm(vllm_source, grids, kwargs, backend):
    host = TOWER.build_host(
        object, "tiny", device="cpu", dtype=torch.float32, attn_backend=backend
    )
    tower = host.vision_tower
    vllm, _ = _vllm_tower(vllm_source, tower, backend)
    ours = tower.encoder.prepare_encoder_metadata(grids, device="cpu", **kwargs)
    theirs = vllm.encoder.prepare_encoder_metadata(grids, device="cpu", **kwargs)
    _assert_same_metadata(ours, theirs)
    # The position embeddings of every grid, frames included.
    assert torch.equal(
        tower.patch_embed.pos_emb.get_pos_embeds(grids),
        vllm.patch_embed.pos_emb.get_pos_embeds(grids),
    )


@pytest.mark.parametrize(
    "grids, kwargs",
    [
        (IMAGES, {"max_batch_size": None}),
        ([(1, 6, 10), (1, 2, 2)], {"max_batch_size": 4, "max_seqlen_override": 90}),
    ],
)
def test_graph_metadata_matches_vllm(vllm_source, kimi_k25_host, grids, kwargs):
    tower = kimi_k25_host.vision_tower
    vllm, _ = _vllm_tower(vllm_source, tower)
    ours = tower.prepare_encoder_cudagraph_metadata(grids, device="cpu", **kwargs)
    theirs = vllm.prepare_encoder_cudagraph_metadata(grids, device="cpu", **kwargs)
    _assert_same_metadata(ours, theirs)


def test_metadata_values(kimi_k25_host):
    encoder = kimi_k25_host.vision_tower.encoder
    meta = encoder.prepare_encoder_metadata(
        [(3, 6, 10), (1, 2, 2)], device="cpu", max_batch_size=4
    )
    assert meta["cu_seqlens"].tolist() == [0, 180, 184, 184, 184]
    assert meta["max_seqlen"].item() == 180 and meta["max_seqlen"].device.type == "cpu"
    assert meta["sequence_lengths"] is None
    # Every frame of a chunk has the frame's RoPE rows.
    rope = meta["rope_freqs_cis"]
    assert torch.equal(rope[:60], rope[60:120]) and torch.equal(
        rope[:60], rope[120:180]
    )


# -- forward ------------------------------------------------------------------------


def _dense_derivation(host, patches, grid):
    """Tower and projector for one item from the module weights: patch embed
    plus the interpolated grid and the time table, one softmax attention
    over all ``t·h·w`` rows with the RoPE as real 2×2 rotations, then the
    mean over frames and the kh×kw blocks."""
    tower, (t, h, w) = host.vision_tower, grid
    heads, dim, n = 2, 64, t * h * w
    head_dim = dim // heads
    weight = tower.patch_embed.proj.weight
    x = patches.reshape(n, -1) @ weight.reshape(dim, -1).T + tower.patch_embed.proj.bias
    plane = tower.patch_embed.pos_emb.weight.permute(2, 0, 1)[None]
    plane = F.interpolate(plane, size=(h, w), mode="bicubic")[0].permute(1, 2, 0)
    frames = torch.arange(t, dtype=torch.float32)[:, None]
    omega = 1e4 ** -(torch.arange(dim // 2) / (dim / 2))
    time = torch.cat([(frames * omega).sin(), (frames * omega).cos()], -1)
    pos = plane.reshape(1, h * w, dim) + (time[:, None] if t > 1 else 0)
    x = x + pos.reshape(n, dim)
    rows = (torch.arange(n) % (h * w)) // w
    cols = torch.arange(n) % w
    pair = torch.arange(head_dim // 2)
    freq = 1e4 ** (-4 * (pair // 2) / head_dim)
    angle = torch.where(pair % 2 == 0, cols[:, None] * freq, rows[:, None] * freq)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]

    def rotate(v):
        even, odd = v[..., 0::2], v[..., 1::2]
        return torch.stack(
            [even * cos - odd * sin, even * sin + odd * cos], -1
        ).flatten(-2)

    for block in tower.encoder.blocks:
        normed = F.layer_norm(x, (dim,), block.norm0.weight, block.norm0.bias, 1e-5)
        q, k, v = block.wqkv(normed).reshape(n, 3, heads, head_dim).unbind(1)
        scores = torch.einsum("qhd,khd->hqk", rotate(q), rotate(k)) * head_dim**-0.5
        x = x + block.wo(
            torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, dim)
        )
        hidden = F.layer_norm(x, (dim,), block.norm1.weight, block.norm1.bias, 1e-5)
        x = x + block.mlp.fc1(F.gelu(block.mlp.fc0(hidden), approximate="tanh"))
    final = tower.encoder.final_layernorm
    x = F.layer_norm(x, (dim,), final.weight, final.bias, 1e-5)
    x = x.reshape(t, h // 2, 2, w // 2, 2, dim).mean(0).permute(0, 2, 1, 3, 4)
    projector = host.mm_projector
    x = F.layer_norm(
        x.reshape(-1, 4, dim),
        (dim,),
        projector.pre_norm.weight,
        projector.pre_norm.bias,
        1e-5,
    )
    x = F.gelu(projector.linear_1(x.reshape(-1, 4 * dim)))
    return projector.linear_2(x)


@pytest.mark.parametrize("grid", [(1, 6, 10), (3, 4, 6), (4, 2, 2)])
def test_host_matches_an_independent_dense_derivation(kimi_k25_host, grid):
    kwargs = TOWER.make_mm_kwargs(kimi_k25_host, [grid], "cpu", seed=2)
    (out,) = kimi_k25_host.eager_reference_outputs(kwargs)
    _close(out, _dense_derivation(kimi_k25_host, kwargs["pixel_values"], grid))


def test_packed_images_equal_per_item(kimi_k25_host):
    tower = kimi_k25_host.vision_tower
    pixels = TOWER.make_mm_kwargs(kimi_k25_host, IMAGES, "cpu")["pixel_values"]
    rows = pixels.shape[0]
    meta = tower.prepare_encoder_cudagraph_metadata(
        IMAGES, max_batch_size=8, max_seqlen_override=rows, device="cpu"
    )
    packed = tower(pixels, None, encoder_metadata=meta)
    assert packed.shape == (rows // 4, 4, 64)
    eager = tower(pixels, torch.tensor(IMAGES))
    assert [f.shape[0] for f in eager] == [h * w // 4 for _, h, w in IMAGES]
    _close(packed, torch.cat(eager))


# -- the mixins on the host: images and video chunks in one batch -------------------


def _run_vision_chunks(host) -> None:
    """Images and video chunks in one execute: the chunks run eagerly (no
    graph holds them), the images replay graphs, every item matches the
    reference."""
    manager = manager_for(host, 512, token_budgets=[64, 300], max_items_per_batch=4)
    batches = [
        [(1, 6, 10), (4, 6, 4), (1, 2, 2), (2, 2, 2)],
        [(3, 8, 8)],
        [(1, 2, 510), (4, 2, 2)],
    ]
    for seed, items in enumerate(batches):
        kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=seed)
        outputs = manager.execute(kwargs)
        expected = TOWER.reference_outputs(host, kwargs)
        assert [o.shape for o in outputs] == [
            (TOWER.output_tokens(i), 96) for i in items
        ]
        for out, ref in zip(outputs, expected, strict=True):
            _close(out, ref)
    items = [i for b in batches for i in b]
    assert manager.graph_hits == sum(t == 1 for t, _, _ in items)
    assert manager.graph_misses == sum(t != 1 for t, _, _ in items)


def test_generated_mixin_sends_video_chunks_eagerly():
    host = TOWER.build_host(
        generated_mixin("kimi_k25"),
        "tiny",
        device="cpu",
        dtype=torch.float32,
        multimodal_config=MultiModalConfig(),
    )
    _run_vision_chunks(host)


def test_vllms_mixin_runs_on_the_host(vllm_source):
    ns = _vllm_namespace(vllm_source)
    ns["KimiK25MediaPixelInputs"] = lambda **fields: fields
    mixin = vllm_mixin(
        vllm_source, KIMI, "KimiK25ForConditionalGeneration", MIXIN_METHODS, ns
    )
    host = TOWER.build_host(
        mixin,
        "tiny",
        device="cpu",
        dtype=torch.float32,
        multimodal_config=MultiModalConfig(),
    )
    host.use_data_parallel = False
    _run_vision_chunks(host)


# -- registry entry -----------------------------------------------------------------


def test_legal_grids_are_what_the_processor_emits(vllm_source):
    resize = vllm_source.load(FUSED, ["navit_resize_image"], {"math": math})[
        "navit_resize_image"
    ]
    rng = random.Random(0)
    for size in ("tiny", "full"):
        config = TOWER.config(size)

        def processor(width, height, config=config):
            out = resize(
                width,
                height,
                14,
                2,
                config.in_patch_limit,
                config.patch_limit_on_one_side,
                None,
            )
            grid = (
                1,
                (out["new_height"] + out["pad_height"]) // 14,
                (out["new_width"] + out["pad_width"]) // 14,
            )
            kept = (out["new_width"], out["new_height"]) == (width, height)
            return grid, out["num_tokens"], kept

        for _ in range(400):
            grid, tokens, kept = processor(rng.randint(1, 7200), rng.randint(1, 7200))
            assert TOWER.output_tokens(grid) == tokens
            if kept:
                assert TOWER.is_legal(grid, size), grid
        for _ in range(200):
            _, h, w = item = TOWER.sample_item(rng, size)
            # The smallest image that pads to this grid is kept as it is.
            assert processor(14 * (w - 2) + 1, 14 * (h - 2) + 1) == (
                item,
                TOWER.output_tokens(item),
                True,
            )
    assert not TOWER.is_legal((2, 4, 4), "full")  # chunks are not images
    assert TOWER.is_legal_chunk((4, 4, 4), "full")
    assert not TOWER.is_legal_chunk((5, 4, 4), "full")  # 4 frames a chunk
    assert not TOWER.is_legal((1, 3, 4), "full") and not TOWER.is_legal((4, 4), "full")
    assert not TOWER.is_legal((1, 132, 132), "full")  # 130 · 130 patches > 16384
    assert TOWER.is_legal((1, 130, 130), "full")


def test_mm_kwargs_layout(kimi_k25_host):
    items = [(1, 6, 10), (2, 2, 4)]
    kwargs = TOWER.make_mm_kwargs(kimi_k25_host, items, "cpu", seed=4)
    assert set(kwargs) == {"pixel_values", "grid_thws"}
    pixels, grid = kwargs["pixel_values"], kwargs["grid_thws"]
    assert pixels.shape == (60 + 16, 3, 14, 14) and pixels.dtype == torch.float32
    assert grid.tolist() == [[1, 6, 10], [2, 2, 4]]
    assert grid.dtype == torch.int64 and grid.device.type == "cpu"
    generator = torch.Generator().manual_seed(4)
    image = torch.rand((1, 3, 6 * 14, 10 * 14), generator=generator) * 2 - 1
    assert torch.equal(pixels[13], image[0, :, 14:28, 42:56])  # row 1, column 3
    chunk = torch.rand((2, 3, 2 * 14, 4 * 14), generator=generator) * 2 - 1
    # Frame 1, row 1, column 2: after frame 0's 8 patches.
    assert torch.equal(pixels[60 + 8 + 4 + 2], chunk[1, :, 14:28, 28:42])
    outputs = TOWER.reference_outputs(kimi_k25_host, kwargs)
    assert [o.shape for o in outputs] == [(15, 96), (2, 96)]
