"""Qwen2.5-VL reference tower: configuration, windows, metadata against vLLM's
own code and an independent derivation, packed == per item, window
locality, vLLM's mixin run on the host, registry entry."""

from __future__ import annotations

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
from encoder_cudagraph_runtime.config import (
    MultiModalConfig,
)
from reference_towers.qwen2_5_vl import (
    Qwen2_5_VLVisionConfig,
    Qwen2_5_VLVisionHost,
    flashinfer_row_offsets,
    window_partition,
)
from reference_towers.qwen2_vl import frame_patch_positions, vision_rotary_tables
from reference_towers.registry import REFERENCE_TOWERS

TOWER = REFERENCE_TOWERS["qwen2_5_vl"]
FA = AttentionBackendEnum.FLASH_ATTN
FLASHINFER = AttentionBackendEnum.FLASHINFER
SDPA = AttentionBackendEnum.TORCH_SDPA
BACKENDS = [FA, FLASHINFER, SDPA, AttentionBackendEnum.TRITON_ATTN]

QWEN = "vllm/model_executor/models/qwen2_5_vl.py"
ROPE_BASE = "vllm/model_executor/layers/rotary_embedding/base.py"
LAYERNORM_OPS = "vllm/ir/ops/layernorm.py"
MIXIN_METHODS = [
    "get_encoder_cudagraph_config",
    "get_input_modality",
    "get_encoder_cudagraph_budget_range",
    "_get_pixel_values_by_modality",
    "_get_grid_thw_by_modality",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
]
# (t, h, w): partial windows, exact multiples, strips, a 2×2 image, videos.
GRIDS = [(1, 2, 2), (1, 8, 8), (1, 10, 12), (1, 2, 30), (1, 18, 4), (2, 6, 10)]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def _host(backend=FA, **config) -> Qwen2_5_VLVisionHost:
    host = Qwen2_5_VLVisionHost(
        Qwen2_5_VLVisionConfig(**{**vars(Qwen2_5_VLVisionConfig.tiny()), **config}),
        attn_backend=backend,
    )
    host.reference_init_weights(0)
    return host.eval()


def _pixels(host, grids, seed=0):
    modality = "image" if all(t == 1 for t, _, _ in grids) else "video"
    kwargs = TOWER.make_mm_kwargs(host, grids, "cpu", seed=seed, modality=modality)
    return kwargs["pixel_values" if modality == "image" else "pixel_values_videos"]


def _windows_by_loops(t, h, w, m=2, side=4):
    """Window order and cumulative window rows, by enumeration."""
    lh, lw = h // m, w // m
    order, ends = [], []
    for frame in range(t):
        for top in range(0, lh, side):
            for left in range(0, lw, side):
                order += [
                    frame * lh * lw + r * lw + c
                    for r in range(top, min(top + side, lh))
                    for c in range(left, min(left + side, lw))
                ]
                ends.append(len(order) * m * m)
    return order, ends


# -- vLLM's code from the wheel ------------------------------------------------


def _vllm_visual(source, visual):
    """A stand-in for vLLM's ``Qwen2_5_VisionTransformer``, configured like
    ``visual``, whose metadata methods are vLLM's own."""
    ns = runtime_namespace()
    mm_encoder_attention(source, ns)
    rotary = SimpleNamespace(
        rotary_dim=visual.hidden_size // visual.num_heads // 2,
        base=10000.0,
        max_position_embeddings=8192,
    )
    bind(
        rotary,
        source.load(
            ROPE_BASE,
            ["_compute_inv_freq", "_compute_cos_sin_cache", "get_cos_sin"],
            ns,
            cls="RotaryEmbeddingBase",
        ),
    )
    rotary.cos_sin_cache = rotary._compute_cos_sin_cache().to(visual.dtype)
    stand_in = SimpleNamespace(
        window_size=visual.window_size,
        patch_size=visual.patch_size,
        spatial_merge_size=visual.spatial_merge_size,
        spatial_merge_unit=visual.spatial_merge_size**2,
        hidden_size=visual.hidden_size,
        tp_size=1,
        fp8_padded_hidden_size=None,
        attn_backend=visual.attn_backend,
        device=visual.device,
        rotary_pos_emb=rotary,
        _rope_by_thw_cache=ns["LRUCache"](capacity=1024),
    )
    methods = source.load(
        QWEN,
        [
            "rotary_pos_emb_thw",
            "get_window_index_thw",
            "get_rope_by_thw",
            "invert_permutation",
            "get_encoder_cudagraph_max_window_seqs",
            "prepare_encoder_metadata",
        ],
        ns,
        cls="Qwen2_5_VisionTransformer",
    )
    return bind(stand_in, methods)


def _vllm_mixin(source) -> type:
    """vLLM's hand-written Qwen2.5-VL protocol methods, as a mixin class."""
    ns = runtime_namespace()
    source.load(
        QWEN,
        ["_pad_cumulative_seqlens_buffer", "_pad_flashinfer_cu_seqlens_buffer"],
        ns,
    )
    return vllm_mixin(
        source, QWEN, "Qwen2_5_VLForConditionalGeneration", MIXIN_METHODS, ns
    )


def _assert_same_metadata(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if value is None:
            assert ours[key] is None, key
            continue
        mine = ours[key]
        assert (mine.dtype, mine.device, mine.shape) == (
            value.dtype,
            value.device,
            value.shape,
        ), key
        assert torch.equal(mine, value), key


# -- configuration and attribute paths ------------------------------------------


def test_full_config_values():
    c = Qwen2_5_VLVisionConfig.full()
    assert (c.hidden_size, c.depth, c.num_heads, c.head_dim) == (1280, 32, 16, 80)
    assert (c.intermediate_size, c.hidden_act) == (3420, "silu")
    assert (c.in_channels, c.patch_size, c.temporal_patch_size) == (3, 14, 2)
    assert (c.spatial_merge_size, c.window_size, c.window_tokens) == (2, 112, 4)
    assert c.fullatt_block_indexes == (7, 15, 23, 31)
    assert (c.out_hidden_size, c.rms_norm_eps, c.rope_theta) == (3584, 1e-6, 1e4)
    assert (c.max_patches_per_frame, c.max_frames_per_video) == (65536, 14)
    assert c.max_model_len == 128000


def test_tiny_config_keeps_the_released_layout():
    tiny, full = Qwen2_5_VLVisionConfig.tiny(), Qwen2_5_VLVisionConfig.full()
    for name in ("patch_size", "temporal_patch_size", "spatial_merge_size"):
        assert getattr(tiny, name) == getattr(full, name)
    assert tiny.window_tokens == full.window_tokens == 4
    assert 0 < len(tiny.fullatt_block_indexes) < tiny.depth
    assert tiny.out_hidden_size != tiny.hidden_size * 4


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 100, "num_heads": 3}, "not a multiple"),
        ({"hidden_size": 36, "num_heads": 2}, "multiple of 4"),
        ({"window_size": 20}, "below one merged token"),
        ({"fullatt_block_indexes": (40,)}, "fullatt_block_indexes"),
        ({"hidden_act": "relu6"}, "unknown activation"),
        ({"max_pixels": 100}, "max_pixels"),
    ],
)
def test_invalid_config_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        Qwen2_5_VLVisionConfig(**change)


def test_full_host_has_vllms_parameter_names_and_shapes():
    with torch.device("meta"):
        host = Qwen2_5_VLVisionHost(Qwen2_5_VLVisionConfig.full())
    shapes = {name: tuple(p.shape) for name, p in host.named_parameters()}
    expected = {
        "visual.patch_embed.proj.weight": (1280, 3, 2, 14, 14),
        "visual.blocks.0.norm1.weight": (1280,),
        "visual.blocks.0.attn.qkv.weight": (3840, 1280),
        "visual.blocks.0.attn.qkv.bias": (3840,),
        "visual.blocks.0.attn.proj.weight": (1280, 1280),
        "visual.blocks.0.attn.proj.bias": (1280,),
        "visual.blocks.31.mlp.gate_up_proj.weight": (2 * 3420, 1280),
        "visual.blocks.31.mlp.gate_up_proj.bias": (2 * 3420,),
        "visual.blocks.31.mlp.down_proj.weight": (1280, 3420),
        "visual.merger.ln_q.weight": (1280,),
        "visual.merger.mlp.0.weight": (5120, 5120),
        "visual.merger.mlp.2.weight": (3584, 5120),
        "visual.merger.mlp.2.bias": (3584,),
    }
    assert {k: shapes[k] for k in expected} == expected
    assert "visual.patch_embed.proj.bias" not in shapes
    assert sum(k.endswith("norm2.weight") for k in shapes) == 32


def test_mixin_attribute_paths():
    mm = MultiModalConfig(limit_per_prompt={"video": 2})
    host = TOWER.build_host(
        object, "tiny", device="cpu", dtype=torch.bfloat16, multimodal_config=mm
    )
    visual = host.visual
    assert host.multimodal_config is mm and host.model_config.multimodal_config is mm
    assert host.model_config.max_model_len == 512
    assert host.is_multimodal_pruning_enabled is False
    assert host.get_max_frames_per_video() == 4
    assert (visual.spatial_merge_size, visual.patch_size, visual.window_size) == (
        2,
        14,
        112,
    )
    assert visual.fullatt_block_indexes == [1, 3]
    assert (visual.out_hidden_size, visual.hidden_size) == (96, 64)
    assert visual.dtype == torch.bfloat16 and visual.device.type == "cpu"
    assert visual.attn_backend is FA and visual.input_norm.input_dtype is None
    embed = visual.patch_embed
    assert (embed.proj.in_channels, embed.patch_size, embed.temporal_patch_size) == (
        3,
        14,
        2,
    )
    index, ends = visual.get_window_index_thw(1, 10, 12)
    assert index.dtype == torch.int64 and ends.dtype == torch.int32


def test_attention_backend_switches_the_kernels():
    host = _host()
    host.visual.attn_backend = SDPA
    assert {b.attn.attn.attn_backend for b in host.visual.blocks} == {SDPA}
    host.visual.attn_backend = FLASHINFER
    # FlashInfer is emulated with FlashAttention on decoded offsets.
    assert {b.attn.attn.attn_backend for b in host.visual.blocks} == {FA}


# -- windows ------------------------------------------------------------------------


@pytest.mark.parametrize("grid", GRIDS)
def test_windows_match_an_enumeration(grid):
    index, ends = window_partition(*grid, 2, 4)
    order, expected_ends = _windows_by_loops(*grid)
    assert index.tolist() == order
    assert ends.tolist() == expected_ends and ends.dtype == torch.int32
    assert sorted(index.tolist()) == list(range(index.numel()))


def test_windows_match_vllm(vllm_source, qwen2_5_vl_host):
    vllm = _vllm_visual(vllm_source, qwen2_5_vl_host.visual)
    rng = random.Random(0)
    for _ in range(200):
        t, h, w = rng.randint(1, 3), 2 * rng.randint(1, 30), 2 * rng.randint(1, 30)
        expected = vllm.get_window_index_thw(t, h, w)
        actual = qwen2_5_vl_host.visual.get_window_index_thw(t, h, w)
        assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))
        assert [a.dtype for a in actual] == [e.dtype for e in expected]


def test_max_window_seqs_matches_vllm_and_bounds_every_batch(
    vllm_source, qwen2_5_vl_host
):
    visual = qwen2_5_vl_host.visual
    vllm = _vllm_visual(vllm_source, visual)
    rng = random.Random(1)
    for _ in range(300):
        budget, mbs = rng.randint(1, 600), rng.randint(1, 8)
        mfpb = mbs * rng.randint(1, 4)
        bound = visual.get_encoder_cudagraph_max_window_seqs(budget, mbs, mfpb)
        assert bound == vllm.get_encoder_cudagraph_max_window_seqs(budget, mbs, mfpb)
        # Any batch of at most mbs items, mfpb frames and budget tokens.
        grids, tokens, frames = [], 0, 0
        for _ in range(mbs):
            t = rng.randint(1, max(1, min(3, mfpb - frames)))
            bh, bw = rng.randint(1, 40), rng.randint(1, 40)
            if frames + t > mfpb or tokens + t * bh * bw > budget:
                continue
            grids.append((t, 2 * bh, 2 * bw))
            tokens, frames = tokens + t * bh * bw, frames + t
        windows = sum(window_partition(*g, 2, 4)[1].numel() for g in grids)
        assert windows <= bound


# -- metadata ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "grids, kwargs",
    [
        ([(1, 10, 12), (1, 2, 2)], {}),
        ([(1, 10, 12), (1, 2, 30)], {"max_batch_size": 4}),
        ([(2, 6, 10), (3, 4, 4)], {"max_frames_per_batch": 9, "max_batch_size": 3}),
        (
            [(1, 2, 64)],
            {
                "max_batch_size": 4,
                "max_frames_per_batch": 8,
                "max_window_seqs_per_batch": 30,
                "max_seqlen_override": 512,
                "max_seqlen_window_override": 64,
            },
        ),
    ],
)
def test_metadata_matches_vllm(vllm_source, backend, grids, kwargs):
    host = _host(backend)
    vllm = _vllm_visual(vllm_source, host.visual)
    _assert_same_metadata(
        host.visual.prepare_encoder_metadata(grids, **kwargs),
        vllm.prepare_encoder_metadata(grids, **kwargs),
    )


def test_metadata_follows_the_windows(qwen2_5_vl_host):
    visual = qwen2_5_vl_host.visual
    grids = [(1, 10, 12), (2, 6, 10)]
    meta = visual.prepare_encoder_metadata(grids, max_batch_size=4)
    index = meta["window_index"]
    expected_index, window_rows = [], [0]
    tokens = rows = 0
    for t, h, w in grids:
        order, ends = _windows_by_loops(t, h, w)
        expected_index += [tokens + i for i in order]
        window_rows += [rows + e for e in ends]
        tokens, rows = tokens + len(order), rows + t * h * w
    assert index.tolist() == expected_index
    assert torch.equal(index[meta["reverse_indices"]], torch.arange(index.numel()))
    # One full-attention sequence per frame, padded by repeating the last.
    assert meta["cu_seqlens"].tolist() == [0, 120, 180, 240, 240]
    assert meta["cu_window_seqlens"].tolist() == window_rows
    assert meta["max_seqlen_full"].item() == 120
    assert meta["max_seqlen_window"].item() == 64
    assert meta["max_seqlen_full"].device.type == "cpu"
    # The RoPE rows are the item-order tables permuted in blocks of m² rows.
    cos, _ = vision_rotary_tables(grids, head_dim=32, theta=1e4, spatial_merge_size=2)
    _close(meta["rotary_pos_emb_cos"], cos.view(-1, 4, 16)[index].reshape(-1, 16))


def test_flashinfer_metadata_layout():
    visual = _host(FLASHINFER).visual
    meta = visual.prepare_encoder_metadata([(1, 10, 12), (1, 2, 2)], max_batch_size=3)
    rows, width = [0, 120, 124, 124], 64
    expected = [r * width for r in rows] + [124 * width] * 5
    expected += [r * 3 * width for r in rows] + [124 * 3 * width] * 5
    assert meta["cu_seqlens"].tolist() == expected  # two sections of 8 + 1
    assert meta["sequence_lengths_full"].tolist() == [120, 4, 0] + [0] * 5
    assert meta["max_seqlen_full"].item() == 1024  # the smallest bucket
    assert torch.equal(
        flashinfer_row_offsets(meta["cu_seqlens"], width)[:4],
        torch.tensor(rows, dtype=torch.int32),
    )
    sdpa = _host(SDPA).visual.prepare_encoder_metadata([(1, 10, 12)])
    assert sdpa["max_seqlen_full"].item() == sdpa["max_seqlen_window"].item() == 0
    assert sdpa["sequence_lengths_window"] is None


# -- forward --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", [FA, FLASHINFER])
@pytest.mark.parametrize(
    "grids", [[(1, 10, 12), (1, 2, 2), (1, 2, 30)], [(2, 6, 10), (1, 4, 4)]]
)
def test_packed_forward_equals_per_item(backend, grids):
    host = _host(backend)
    visual = host.visual
    pixels = _pixels(host, grids)
    per_item, offset = [], 0
    for t, h, w in grids:
        per_item.append(visual(pixels[offset : offset + t * h * w], [(t, h, w)]))
        offset += t * h * w
    # Capture-style padding of every offset table changes nothing.
    meta = visual.prepare_encoder_metadata(
        grids,
        max_batch_size=6,
        max_frames_per_batch=8,
        max_window_seqs_per_batch=40,
        max_seqlen_override=4 * offset,
        max_seqlen_window_override=64,
    )
    _close(visual(pixels, None, encoder_metadata=meta), torch.cat(per_item))
    _close(visual(pixels, grids), torch.cat(per_item))


@pytest.mark.parametrize("fullatt, locality", [((), True), ((1, 3), False)])
def test_window_blocks_keep_windows_apart(fullatt, locality):
    """Windowed blocks never mix windows; a full-attention block does."""
    host = _host(fullatt_block_indexes=fullatt)
    grid = [(1, 16, 16)]  # 8×8 merged tokens: four 4×4 windows
    pixels = _pixels(host, grid)
    changed = pixels.clone()
    index, _ = window_partition(1, 16, 16, 2, 4)
    first_window = index[:16]  # merged tokens of the top-left window
    rows = (first_window[:, None] * 4 + torch.arange(4)).reshape(-1)
    changed[rows] += 1.0
    before, after = host.visual(pixels, grid), host.visual(changed, grid)
    others = torch.ones(64, dtype=torch.bool)
    others[first_window] = False
    assert not torch.allclose(before[first_window], after[first_window])
    assert torch.equal(before[others], after[others]) == locality


def _dense_derivation(visual, pixels, grid):
    """The tower in processor order with attention masks instead of window
    permutations: per frame for full-attention blocks, per window (from the
    patch coordinates) for the others."""
    t, h, w = grid
    m, side, heads = 2, 4, visual.num_heads
    rows, cols = frame_patch_positions(h, w, m)
    rows, cols = rows.repeat(t), cols.repeat(t)
    frame = torch.arange(t * h * w) // (h * w)
    window = (frame * 1000 + rows // m // side) * 1000 + cols // m // side
    head_dim = visual.hidden_size // heads
    inv = 1.0 / (1e4 ** (torch.arange(0, head_dim // 2, 2).float() / (head_dim // 2)))
    angles = torch.cat([rows[:, None] * inv, cols[:, None] * inv], dim=1)
    cos, sin = angles.cos(), angles.sin()

    def rms(x, norm):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight

    def rotate(x):  # (n, heads, head_dim), NeoX halves
        a, b = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        c, s_ = cos[:, None], sin[:, None]
        return torch.cat([a * c - b * s_, b * c + a * s_], dim=-1)

    weight = visual.patch_embed.proj.weight
    x = pixels @ weight.reshape(weight.shape[0], -1).T
    n = x.shape[0]
    for i, block in enumerate(visual.blocks):
        groups = frame if i in visual.fullatt_block_indexes else window
        allowed = groups[:, None] == groups[None, :]
        q, k, v = (
            F.linear(rms(x, block.norm1), block.attn.qkv.weight, block.attn.qkv.bias)
            .reshape(n, 3, heads, head_dim)
            .unbind(1)
        )
        q, k = rotate(q), rotate(k)
        scores = torch.einsum("qhd,khd->hqk", q, k) * head_dim**-0.5
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(n, -1)
        x = x + F.linear(attn, block.attn.proj.weight, block.attn.proj.bias)
        gate, up = F.linear(
            rms(x, block.norm2),
            block.mlp.gate_up_proj.weight,
            block.mlp.gate_up_proj.bias,
        ).chunk(2, -1)
        x = x + F.linear(
            F.silu(gate) * up, block.mlp.down_proj.weight, block.mlp.down_proj.bias
        )
    merger = visual.merger
    x = rms(x, merger.ln_q).reshape(n // 4, -1)
    x = F.gelu(F.linear(x, merger.mlp[0].weight, merger.mlp[0].bias))
    return F.linear(x, merger.mlp[2].weight, merger.mlp[2].bias)


@pytest.mark.parametrize("grid", [(1, 10, 12), (1, 2, 30), (2, 6, 10), (1, 16, 16)])
def test_tower_matches_an_independent_dense_derivation(qwen2_5_vl_host, grid):
    visual = qwen2_5_vl_host.visual
    pixels = _pixels(qwen2_5_vl_host, [grid])
    _close(visual(pixels, [grid]), _dense_derivation(visual, pixels, grid))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_vllm(vllm_source, dtype):
    ops = vllm_source.load(
        LAYERNORM_OPS,
        ["rms_norm", "fused_add_rms_norm"],
        {"torch": torch, "Tensor": torch.Tensor},
    )
    norm = _host().visual.blocks[0].norm2.to(dtype)
    x = torch.randn(7, 64, dtype=dtype) * 3
    residual = torch.randn(7, 64, dtype=dtype)
    assert torch.equal(norm(x), ops["rms_norm"](x, norm.weight, norm.eps))
    ours = norm(x, residual=residual)
    theirs = ops["fused_add_rms_norm"](x, residual, norm.weight, norm.eps)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


# -- vLLM's own mixin on the host --------------------------------------------------


@pytest.mark.parametrize(
    "backend, modality, batches",
    [
        (FA, "image", [[(1, 10, 12), (1, 2, 2)], [(1, 16, 14)], [(1, 2, 30)] * 3]),
        (FA, "video", [[(2, 6, 10), (1, 4, 4)], [(3, 2, 6)]]),
        (FLASHINFER, "image", [[(1, 10, 12), (1, 2, 2), (1, 4, 4)]]),
    ],
)
def test_vllms_mixin_runs_on_the_host(vllm_source, backend, modality, batches):
    """vLLM's hand-written mixin, captured and replayed by the runtime
    manager, gives the registry's reference outputs: the host API is the
    one it reads, with vLLM's meaning."""
    host = TOWER.build_host(
        _vllm_mixin(vllm_source),
        "tiny",
        device="cpu",
        dtype=torch.float32,
        attn_backend=backend,
        multimodal_config=MultiModalConfig(),
    )
    manager = manager_for(
        host, 512, token_budgets=[64], max_items_per_batch=3, max_frames_per_batch=6
    )
    for seed, items in enumerate(batches):
        kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=seed, modality=modality)
        outputs = manager.execute(kwargs)
        expected = TOWER.reference_outputs(host, kwargs)
        assert len(outputs) == len(expected)
        for out, ref in zip(outputs, expected, strict=True):
            _close(out, ref)
    assert manager.graph_hits > 0


# -- registry entry -----------------------------------------------------------------


def test_registry_entry_types_inputs_as_vllm_does():
    host = TOWER.build_host(object, "tiny", device="cpu", dtype=torch.bfloat16)
    images = TOWER.make_mm_kwargs(host, [(1, 4, 6), (1, 2, 2)], "cpu", seed=3)
    assert set(images) == {"pixel_values", "image_grid_thw"}
    assert images["pixel_values"].shape == (28, 1176)
    assert images["pixel_values"].dtype == torch.bfloat16
    assert images["image_grid_thw"].dtype == torch.int64
    assert images["image_grid_thw"].device.type == "cpu"
    # The same pixels as Qwen2-VL's processor rows, in the model dtype.
    qwen2 = REFERENCE_TOWERS["qwen2_vl"].make_mm_kwargs(
        host, [(1, 4, 6), (1, 2, 2)], "cpu", seed=3
    )
    assert torch.equal(images["pixel_values"], qwen2["pixel_values"].bfloat16())
    videos = TOWER.make_mm_kwargs(host, [(2, 4, 4)], "cpu", modality="video")
    assert set(videos) == {
        "pixel_values_videos",
        "video_grid_thw",
        "second_per_grid_ts",
    }
    assert videos["second_per_grid_ts"].tolist() == [1.0]
    assert TOWER.modalities == ("image", "video")
    rng = random.Random(0)
    for modality in TOWER.modalities:
        for _ in range(50):
            item = TOWER.sample_item(rng, "full", modality=modality)
            assert TOWER.is_legal(item, "full", modality=modality)
