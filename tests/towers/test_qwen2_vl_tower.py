"""Qwen2-VL reference tower: layout, 2-D RoPE, per-frame metadata, packed ==
eager, an independent dense re-derivation, capture/replay, registry entry."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers.qwen2_vl import (
    Qwen2VisionConfig,
    Qwen2VisionTransformer,
    Qwen2VLVisionHost,
    apply_vision_rotary,
    frame_patch_positions,
    frame_seqlens,
    vision_rotary_tables,
)
from reference_towers.registry import REFERENCE_TOWERS

TOWER = REFERENCE_TOWERS["qwen2_vl"]
IMAGES = [(1, 2, 2), (1, 4, 6), (1, 8, 2), (1, 6, 6), (1, 2, 14)]
VIDEOS = [(3, 2, 4), (1, 4, 4), (4, 2, 2), (2, 6, 4)]


class PlainMixin:
    """Stands in for a generated mixin: adds nothing."""


@pytest.fixture(scope="module")
def host() -> Qwen2VLVisionHost:
    return TOWER.build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-5)


def _kwargs(host, items, modality, seed=0):
    return TOWER.make_mm_kwargs(host, items, "cpu", seed=seed, modality=modality)


def _pixels(host, items, modality, seed=0) -> torch.Tensor:
    key = "pixel_values" if modality == "image" else "pixel_values_videos"
    return _kwargs(host, items, modality, seed)[key]


def _offsets(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


# -- configuration and attribute paths ------------------------------------------


def test_full_config_values():
    config = Qwen2VisionConfig.full()
    assert (config.embed_dim, config.depth, config.num_heads) == (1280, 32, 16)
    assert (config.mlp_ratio, config.mlp_hidden_dim) == (4.0, 5120)
    assert (config.in_channels, config.patch_size) == (3, 14)
    assert (config.temporal_patch_size, config.spatial_merge_size) == (2, 2)
    assert (config.hidden_size, config.hidden_act) == (3584, "quick_gelu")
    assert (config.norm_eps, config.rope_theta) == (1e-6, 10000.0)
    assert config.head_dim == 80
    assert config.patch_dim == 1176
    assert config.merged_dim == 5120
    assert config.max_patches_per_frame == 65536  # 12845056 / 14²
    assert config.max_frames_per_video == 14


def test_tiny_config_values():
    config = Qwen2VisionConfig.tiny()
    assert (config.embed_dim, config.depth, config.num_heads) == (64, 2, 2)
    assert (config.head_dim, config.mlp_hidden_dim, config.hidden_size) == (32, 128, 96)
    assert config.patch_dim == 1176
    assert config.max_patches_per_frame == 256
    assert config.max_frames_per_video == 4


def test_invalid_config_rejected():
    with pytest.raises(ValueError, match="not a multiple"):
        Qwen2VisionConfig(embed_dim=100, num_heads=3)
    with pytest.raises(ValueError, match="multiple of 4"):
        Qwen2VisionConfig(embed_dim=36, num_heads=2)
    with pytest.raises(ValueError, match="unknown activation"):
        Qwen2VisionConfig(hidden_act="relu6")
    with pytest.raises(ValueError, match="max_pixels"):
        Qwen2VisionConfig(max_pixels=100)
    with pytest.raises(ValueError, match="unknown size"):
        Qwen2VisionConfig.for_size("huge")  # type: ignore[arg-type]


def test_full_host_shapes_on_meta_device():
    with torch.device("meta"):
        full = Qwen2VLVisionHost(Qwen2VisionConfig.full())
    visual = full.visual
    assert visual.patch_embed.proj.weight.shape == (1280, 3, 2, 14, 14)
    assert visual.patch_embed.proj.bias is None
    assert len(visual.blocks) == 32
    block = visual.blocks[0]
    assert block.attn.qkv.weight.shape == (3 * 1280, 1280)
    assert block.attn.qkv.bias.shape == (3 * 1280,)
    assert block.attn.proj.weight.shape == (1280, 1280)
    assert block.mlp.fc1.weight.shape == (5120, 1280)
    assert block.norm1.eps == block.norm2.eps == 1e-6
    assert visual.merger.ln_q.normalized_shape == (1280,)
    assert visual.merger.mlp[0].weight.shape == (5120, 5120)
    assert visual.merger.mlp[2].weight.shape == (3584, 5120)
    assert isinstance(visual.merger.mlp[1], torch.nn.GELU)
    assert visual.out_hidden_size == 3584
    # vLLM's parameter names (so a checkpoint would load by name).
    names = {name for name, _ in visual.named_parameters()}
    assert {
        "patch_embed.proj.weight",
        "blocks.0.norm1.weight",
        "blocks.0.attn.qkv.bias",
        "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc2.bias",
        "merger.ln_q.weight",
        "merger.mlp.0.weight",
        "merger.mlp.2.bias",
    } <= names


def test_mixin_attribute_paths():
    mm = MultiModalConfig(limit_per_prompt={"video": 2})
    bf16 = TOWER.build_host(
        PlainMixin,
        "tiny",
        device="cpu",
        dtype=torch.bfloat16,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
        multimodal_config=mm,
    )
    assert bf16.multimodal_config is mm
    assert bf16.get_max_frames_per_video() == 4
    visual = bf16.visual
    assert visual.spatial_merge_size == 2
    assert visual.out_hidden_size == 96
    assert visual.dtype == torch.bfloat16
    assert visual.device == torch.device("cpu")
    assert visual.input_norm.input_dtype is None
    embed = visual.patch_embed
    assert (embed.proj.in_channels, embed.patch_size) == (3, 14)
    assert embed.temporal_patch_size == 2
    assert visual.attn_backend is AttentionBackendEnum.TORCH_SDPA
    assert all(
        b.attn.attn.attn_backend is AttentionBackendEnum.TORCH_SDPA
        for b in visual.blocks
    )
    visual.attn_backend = AttentionBackendEnum.FLASH_ATTN
    assert visual.attn_backend is AttentionBackendEnum.FLASH_ATTN
    assert all(
        b.attn.attn.attn_backend is AttentionBackendEnum.FLASH_ATTN
        for b in visual.blocks
    )
    full = Qwen2VLVisionHost.__new__(Qwen2VLVisionHost)
    full.config = Qwen2VisionConfig.full()
    assert full.get_max_frames_per_video() == 14


# -- layout and 2-D RoPE ----------------------------------------------------------


@pytest.mark.parametrize("hw", [(2, 2), (4, 6), (6, 4), (2, 10), (8, 8)])
def test_patch_positions_follow_vllms_merge_order(hw):
    """vLLM's rot_pos_emb: row/column maps of (h, w), reshaped to
    (h/m, m, w/m, m), permuted to (h/m, w/m, m, m), flattened."""
    h, w = hw
    m = 2
    rows_map = torch.arange(h)[:, None].expand(h, w)
    cols_map = torch.arange(w)[None, :].expand(h, w)

    def layout(coords: torch.Tensor) -> torch.Tensor:
        return coords.reshape(h // m, m, w // m, m).permute(0, 2, 1, 3).reshape(-1)

    rows, cols = frame_patch_positions(h, w, m)
    assert rows.tolist() == layout(rows_map).tolist()
    assert cols.tolist() == layout(cols_map).tolist()
    # Every m² consecutive rows are one m×m block.
    blocks = torch.stack([rows // m, cols // m], -1).reshape(-1, m * m, 2)
    assert (blocks == blocks[:, :1]).all()
    with pytest.raises(ValueError, match="blocks"):
        frame_patch_positions(3, 4, m)


def _independent_rope(grid, head_dim, theta=10000.0, max_position=64):
    """vLLM's route: a (position, frequency) cache of cos|sin for a NeoX RoPE
    of rotary_dim = head_dim/2, gathered by (row, col) ids, flattened."""
    rotary_dim = head_dim // 2
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)
    )
    freqs = torch.einsum(
        "i,j -> ij", torch.arange(max_position, dtype=torch.float), inv_freq
    )
    cos_cache, sin_cache = freqs.cos(), freqs.sin()
    ids = []
    for t, h, w in grid:
        hh = torch.arange(h)[:, None].expand(h, w).reshape(h // 2, 2, w // 2, 2)
        ww = torch.arange(w)[None, :].expand(h, w).reshape(h // 2, 2, w // 2, 2)
        pair = torch.stack(
            [hh.permute(0, 2, 1, 3).flatten(), ww.permute(0, 2, 1, 3).flatten()], -1
        )
        ids.append(pair.repeat(t, 1))
    ids = torch.cat(ids)
    return cos_cache[ids].flatten(1), sin_cache[ids].flatten(1)


def test_rotary_tables_match_an_independent_computation(host):
    grid = [*IMAGES, *VIDEOS]
    cos, sin = vision_rotary_tables(
        grid, head_dim=32, theta=10000.0, spatial_merge_size=2
    )
    expected_cos, expected_sin = _independent_rope(grid, 32)
    assert cos.shape == (sum(t * h * w for t, h, w in grid), 16)
    assert torch.equal(cos, expected_cos)
    assert torch.equal(sin, expected_sin)
    # The tower hands them out rows first, in its dtype, on its device.
    meta = host.visual.prepare_encoder_metadata(grid)
    assert torch.equal(meta["rotary_pos_emb_cos"], expected_cos)
    assert torch.equal(meta["rotary_pos_emb_sin"], expected_sin)
    # Full head dim 80: 10 frequencies per axis, 40 columns.
    full_cos, _ = vision_rotary_tables(
        [(1, 4, 4)], head_dim=80, theta=10000.0, spatial_merge_size=2
    )
    assert torch.equal(full_cos, _independent_rope([(1, 4, 4)], 80)[0])


def test_rotary_tables_repeat_per_frame_and_follow_the_tower_dtype():
    cos, sin = vision_rotary_tables(
        [(3, 4, 2)], head_dim=32, theta=10000.0, spatial_merge_size=2
    )
    assert torch.equal(cos[8:16], cos[:8]) and torch.equal(sin[16:], sin[:8])
    bf16 = TOWER.build_host(PlainMixin, "tiny", device="cpu", dtype=torch.bfloat16)
    meta = bf16.visual.prepare_encoder_metadata([(3, 4, 2)])
    assert meta["rotary_pos_emb_cos"].dtype == torch.bfloat16
    assert torch.equal(meta["rotary_pos_emb_cos"], cos.bfloat16())


def test_vision_rotary_is_hf_rotate_half():
    """Hugging Face's form: emb = cat(freqs, freqs); x·cos + rotate_half(x)·sin."""
    cos, sin = vision_rotary_tables(
        [(1, 4, 6)], head_dim=32, theta=10000.0, spatial_merge_size=2
    )
    x = torch.randn(24, 3, 32, generator=torch.Generator().manual_seed(3))
    cos_full = torch.cat([cos, cos], -1)[:, None]
    sin_full = torch.cat([sin, sin], -1)[:, None]
    rotate_half = torch.cat([-x[..., 16:], x[..., :16]], -1)
    _close(apply_vision_rotary(x, cos, sin), x * cos_full + rotate_half * sin_full)
    # Patch (0, 0) is not rotated; norms are preserved.
    _close(apply_vision_rotary(x, cos, sin)[0], x[0], atol=0)
    _close(apply_vision_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    with pytest.raises(ValueError, match="columns"):
        apply_vision_rotary(torch.randn(24, 3, 16), cos, sin)


def test_rope_scores_depend_on_relative_position_only():
    """q·k after the rotation is a function of (Δrow, Δcol) alone."""
    h = w = 8
    cos, sin = vision_rotary_tables(
        [(1, h, w)], head_dim=32, theta=10000.0, spatial_merge_size=2
    )
    rows, cols = frame_patch_positions(h, w, 2)
    index = {(r, c): i for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist()))}
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 32, generator=generator).expand(h * w, 1, 32)
    k = torch.randn(1, 1, 32, generator=generator).expand(h * w, 1, 32)
    rq = apply_vision_rotary(q, cos, sin)[:, 0]
    rk = apply_vision_rotary(k, cos, sin)[:, 0]

    def score(a, b):
        return (rq[index[a]] * rk[index[b]]).sum()

    _close(score((1, 2), (3, 5)), score((4, 1), (6, 4)))
    _close(score((0, 0), (2, 3)), score((5, 4), (7, 7)))
    assert not torch.allclose(score((1, 2), (3, 5)), score((1, 2), (5, 3)))


# -- encoder metadata ---------------------------------------------------------------


def test_cu_seqlens_has_one_sequence_per_frame(host):
    grid = [(1, 4, 6), (3, 2, 4), (2, 2, 2)]
    assert frame_seqlens(grid) == [24, 8, 8, 8, 4, 4]
    meta = host.visual.prepare_encoder_metadata(grid)
    assert meta["cu_seqlens"].dtype == torch.int32
    assert meta["cu_seqlens"].device.type == "cpu"
    assert meta["cu_seqlens"].tolist() == [0, 24, 32, 40, 48, 52, 56]
    assert meta["max_seqlen"].dim() == 0
    assert meta["max_seqlen"].dtype == torch.int32
    assert meta["max_seqlen"].device.type == "cpu"
    assert meta["max_seqlen"].item() == 24
    assert set(meta) == {
        "rotary_pos_emb_cos",
        "rotary_pos_emb_sin",
        "cu_seqlens",
        "max_seqlen",
    }
    # A tensor grid gives the same offsets.
    tensor_meta = host.visual.prepare_encoder_metadata(torch.tensor(grid))
    assert torch.equal(tensor_meta["cu_seqlens"], meta["cu_seqlens"])


def test_cu_seqlens_padding_and_max_seqlen_override(host):
    visual = host.visual
    grid = [(1, 4, 6), (3, 2, 4)]
    offsets = [0, 24, 32, 40, 48]
    # pad_to = max_batch_size (4 frames already: 5 entries stay).
    assert (
        visual.prepare_encoder_metadata(grid, max_batch_size=2)["cu_seqlens"].tolist()
        == offsets
    )
    assert visual.prepare_encoder_metadata(grid, max_batch_size=6)[
        "cu_seqlens"
    ].tolist() == offsets + [48, 48]
    # max_frames_per_batch wins over max_batch_size, even when smaller.
    padded = visual.prepare_encoder_metadata(
        grid, max_batch_size=8, max_frames_per_batch=7, max_seqlen_override=640
    )
    assert padded["cu_seqlens"].tolist() == offsets + [48, 48, 48]
    assert padded["max_seqlen"].item() == 640
    assert padded["max_seqlen"].dtype == torch.int32
    smaller = visual.prepare_encoder_metadata(
        grid, max_batch_size=8, max_frames_per_batch=3
    )
    assert smaller["cu_seqlens"].tolist() == offsets  # never truncated
    # max_frames_per_batch=0 (videos disabled) is a value, not "absent".
    zero = visual.prepare_encoder_metadata(
        grid, max_batch_size=8, max_frames_per_batch=0
    )
    assert zero["cu_seqlens"].tolist() == offsets
    # The RoPE tables are never padded.
    assert padded["rotary_pos_emb_cos"].shape == (48, 16)
    empty = visual.prepare_encoder_metadata([], max_batch_size=3)
    assert empty["cu_seqlens"].tolist() == [0, 0, 0, 0]
    assert empty["max_seqlen"].item() == 0
    assert empty["rotary_pos_emb_cos"].shape == (0, 16)


def test_sdpa_backend_still_reports_max_seqlen():
    sdpa = TOWER.build_host(
        PlainMixin,
        "tiny",
        device="cpu",
        dtype=torch.float32,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
    )
    meta = sdpa.visual.prepare_encoder_metadata([(2, 4, 4)])
    assert meta["max_seqlen"].item() == 16


def test_oversized_grids_are_rejected(host):
    with pytest.raises(ValueError, match="8192"):
        vision_rotary_tables(
            [(1, 2, 8194)], head_dim=32, theta=1e4, spatial_merge_size=2
        )
    with pytest.raises(ValueError, match="bad grid row"):
        host.visual.prepare_encoder_metadata([(0, 2, 2)])


# -- tower ------------------------------------------------------------------------


def test_patch_embed_is_the_conv3d(host):
    embed = host.visual.patch_embed
    pixels = _pixels(host, IMAGES[:2], "image")
    as_conv = F.conv3d(
        pixels.reshape(-1, 3, 2, 14, 14), embed.proj.weight, stride=(2, 14, 14)
    ).reshape(pixels.shape[0], -1)
    _close(embed(pixels), as_conv)
    with pytest.raises(ValueError, match="pixel rows"):
        embed(pixels[:, :100])


@pytest.mark.parametrize(
    ("items", "modality"),
    [
        (IMAGES, "image"),
        ([(1, 2, 2)], "image"),
        (VIDEOS, "video"),
        ([(4, 6, 6), (1, 2, 2), (2, 2, 8)], "video"),
    ],
    ids=str,
)
def test_packed_forward_equals_per_item_eager(host, items, modality):
    visual = host.visual
    kwargs = _kwargs(host, items, modality, seed=1)
    pixels = next(iter(kwargs.values()))
    meta = visual.prepare_encoder_metadata(items)
    packed = visual(pixels, None, encoder_metadata=meta)
    per_item = TOWER.reference_outputs(host, kwargs)
    assert [p.shape for p in per_item] == [
        (TOWER.output_tokens(item), 96) for item in items
    ]
    _close(packed, torch.cat(per_item))
    # The grid path builds the same metadata.
    _close(visual(pixels, [list(item) for item in items]), packed, atol=0)
    # Padding cu_seqlens with empty sequences changes nothing.
    padded = visual.prepare_encoder_metadata(
        items, max_frames_per_batch=len(frame_seqlens(items)) + 3
    )
    _close(visual(pixels, None, encoder_metadata=padded), packed, atol=0)


def test_forward_checks_its_inputs(host):
    visual = host.visual
    pixels = _pixels(host, [(1, 4, 4)], "image")
    with pytest.raises(ValueError, match="grid_thw or encoder_metadata"):
        visual(pixels, None)
    with pytest.raises(ValueError, match="pixel rows but RoPE tables"):
        visual(pixels[:-4], [(1, 4, 4)])
    meta = visual.prepare_encoder_metadata([(1, 4, 4)])
    del meta["max_seqlen"]
    with pytest.raises(ValueError, match="lacks 'max_seqlen'"):
        visual(pixels, None, encoder_metadata=meta)


def test_attention_stays_within_each_frame(host):
    visual = host.visual
    items = [(3, 4, 4)]
    pixels = _pixels(host, items, "video", seed=4)
    reference = visual(pixels, items)
    changed = pixels.clone()
    changed[16:32] = torch.randn_like(changed[16:32])  # the second frame only
    out = visual(changed, items)
    _close(out[:4], reference[:4])
    _close(out[8:], reference[8:])
    assert not torch.allclose(out[4:8], reference[4:8], atol=1e-3)


def test_video_frames_are_not_told_apart_by_position(host):
    """No temporal RoPE: a video of identical frames gives identical rows."""
    visual = host.visual
    frame = _pixels(host, [(1, 4, 2)], "image", seed=5)
    out = visual(frame.repeat(3, 1), [(3, 4, 2)])
    _close(out[2:4], out[:2])
    _close(out[4:], out[:2])


def _naive_forward(
    visual: Qwen2VisionTransformer,
    config: Qwen2VisionConfig,
    pixels: torch.Tensor,
    grid,
) -> torch.Tensor:
    """The Qwen2-VL tower re-derived in fp64 from the weights alone: Conv3d,
    Hugging Face's rotate_half RoPE, dense attention with a block-diagonal
    frame mask, explicit LayerNorm / QuickGELU / erf GELU."""
    w = {k: v.double() for k, v in visual.state_dict().items()}
    c, tp, p, m = 3, 2, 14, 2
    heads, head_dim = config.num_heads, config.head_dim
    x = F.conv3d(
        pixels.double().reshape(-1, c, tp, p, p),
        w["patch_embed.proj.weight"],
        stride=(tp, p, p),
    ).reshape(pixels.shape[0], -1)
    n = x.shape[0]
    cos, sin = _independent_rope(grid, head_dim)
    cos = torch.cat([cos, cos], -1).double()[:, None]
    sin = torch.cat([sin, sin], -1).double()[:, None]
    frame_id = torch.repeat_interleave(
        torch.arange(len(frame_seqlens(grid))), torch.tensor(frame_seqlens(grid))
    )
    allowed = frame_id[:, None] == frame_id[None, :]

    def norm(x, prefix):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + config.norm_eps) * w[
            f"{prefix}.weight"
        ] + w[f"{prefix}.bias"]

    def linear(x, prefix):
        return x @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]

    def rope(t):
        return (
            t * cos
            + torch.cat([-t[..., head_dim // 2 :], t[..., : head_dim // 2]], -1) * sin
        )

    for i in range(config.depth):
        b = f"blocks.{i}"
        qkv = linear(norm(x, f"{b}.norm1"), f"{b}.attn.qkv")
        q, k, v = qkv.reshape(n, 3, heads, head_dim).unbind(1)
        q, k = rope(q), rope(k)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
        scores = scores.masked_fill(~allowed, float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1)
        x = x + linear(attn, f"{b}.attn.proj")
        hidden = linear(norm(x, f"{b}.norm2"), f"{b}.mlp.fc1")
        hidden = hidden * torch.sigmoid(1.702 * hidden)
        x = x + linear(hidden, f"{b}.mlp.fc2")
    x = norm(x, "merger.ln_q").reshape(n // (m * m), -1)
    x = linear(x, "merger.mlp.0")
    x = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    return linear(x, "merger.mlp.2")


@pytest.mark.parametrize(
    ("items", "modality"), [(IMAGES[:3], "image"), (VIDEOS[:2], "video")], ids=str
)
def test_tower_matches_an_independent_dense_derivation(host, items, modality):
    pixels = _pixels(host, items, modality, seed=6)
    expected = _naive_forward(host.visual, host.config, pixels, items)
    actual = host.visual(pixels, items)
    _close(actual.double(), expected, atol=2e-5)


def test_pixels_are_cast_to_the_tower_dtype():
    bf16 = TOWER.build_host(PlainMixin, "tiny", device="cpu", dtype=torch.bfloat16)
    # The processor's fp32 pixels (make_mm_kwargs casts them as vLLM does).
    pixels = _pixels(bf16, [(1, 4, 4)], "image").float()
    out = bf16.visual(pixels, [(1, 4, 4)])
    same = bf16.visual(pixels.bfloat16(), [(1, 4, 4)])
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, same)
    assert bf16.visual.dtype == torch.bfloat16  # no module mutation


def test_bf16_tiny_is_finite_and_close_to_fp32(host):
    bf16 = TOWER.build_host(PlainMixin, "tiny", device="cpu", dtype=torch.bfloat16)
    for items, modality in ((IMAGES, "image"), (VIDEOS, "video")):
        kwargs = _kwargs(bf16, items, modality)
        for low, high in zip(
            TOWER.reference_outputs(bf16, kwargs),
            TOWER.reference_outputs(host, kwargs),
            strict=True,
        ):
            assert low.dtype == torch.bfloat16
            assert torch.isfinite(low).all()
            assert (low.float() - high).abs().max() < 0.1 * high.abs().max()


# -- capture and replay as vLLM's Qwen2-VL mixin drives them ----------------------


def _capture_buffers(visual, budget, max_batch_size, max_frames_per_batch):
    """Dummy grids and metadata as vLLM's capture builds them."""
    m = visual.spatial_merge_size
    per_item = -(-budget // max_batch_size)
    frames = max_frames_per_batch // max_batch_size
    if frames > 1:
        grid = [[frames, m, -(-per_item // frames) * m]] * max_batch_size
    else:
        grid = [[1, m, per_item * m]] * max_batch_size
    embed = visual.patch_embed
    patch_dim = embed.proj.in_channels * embed.temporal_patch_size * embed.patch_size**2
    rows = sum(t * h * w for t, h, w in grid)
    pixels = torch.zeros(
        rows, patch_dim, dtype=visual.input_norm.input_dtype or visual.dtype
    )
    meta = visual.prepare_encoder_metadata(
        grid,
        max_batch_size=max_batch_size,
        max_frames_per_batch=max_frames_per_batch,
        max_seqlen_override=budget * m * m,
        device="cpu",
    )
    return {**meta, "pixel_values": pixels}


def _replay(buffers, values):
    """The manager's copies: scalars as they are, rows zeroed then in front."""
    for name, buf in buffers.items():
        src = values[name]
        if src.ndim == 0:
            buf.copy_(src)
        else:
            buf.zero_()
            buf[: src.shape[0]].copy_(src)


@pytest.mark.parametrize(
    ("modality", "items", "mbs", "mfpb"),
    [
        ("image", [(1, 4, 6), (1, 8, 8)], 2, 8),
        ("video", [(3, 2, 4), (4, 4, 4)], 2, 8),
        ("image", [(1, 2, 2), (1, 4, 4), (1, 2, 6)], 3, 2),
        ("video", [(2, 4, 4)], 3, 2),
    ],
    ids=str,
)
def test_capture_replay_equals_eager(host, modality, items, mbs, mfpb):
    visual = host.visual
    budget = 40
    buffers = _capture_buffers(visual, budget, mbs, mfpb)
    assert buffers["cu_seqlens"].shape[0] == max(mfpb, mbs) + 1
    assert buffers["rotary_pos_emb_cos"].shape[0] == buffers["pixel_values"].shape[0]
    assert buffers["pixel_values"].shape[0] >= budget * 4
    kwargs = _kwargs(host, items, modality, seed=9)
    grid = next(v for k, v in kwargs.items() if k.endswith("grid_thw")).tolist()
    pixels = next(v for k, v in kwargs.items() if k.startswith("pixel_values"))
    if modality == "image":
        real = visual.prepare_encoder_metadata(grid, max_batch_size=mbs)
    else:
        real = visual.prepare_encoder_metadata(grid, max_frames_per_batch=mfpb)
    _replay(buffers, {**real, "pixel_values": pixels})
    if modality == "image" and mfpb > mbs:
        # Padded to mbs + 1 entries only: the buffer's tail is zeroed, so
        # the offsets fall back to 0 (empty or negative sequences).
        tail = buffers["cu_seqlens"][mbs + 1 :]
        assert (tail == 0).all() and tail.numel() == mfpb - mbs
    values = dict(buffers)
    out = visual(values.pop("pixel_values"), None, encoder_metadata=values)
    assert out.shape == (buffers["pixel_values"].shape[0] // 4, 96)
    assert torch.isfinite(out).all()
    expected = torch.cat(TOWER.reference_outputs(host, kwargs))
    _close(out[: expected.shape[0]], expected)


# -- registry entry -------------------------------------------------------------------


def test_registry_entry_and_modalities():
    assert TOWER.name == "qwen2_vl"
    assert TOWER.modality == "image"
    assert TOWER.modalities == ("image", "video")
    assert TOWER.host_cls is Qwen2VLVisionHost
    assert TOWER.sizes == ("tiny", "full")
    for name in ("deepseek_v41", "minimax_m3"):
        assert REFERENCE_TOWERS[name].modalities == ("image",)


def test_item_formulas_and_legality():
    assert TOWER.input_size((3, 4, 6)) == 72
    assert TOWER.output_tokens((3, 4, 6)) == 18
    assert TOWER.output_tokens((1, 2, 2)) == 1
    assert (
        TOWER.max_output_tokens("tiny")
        == TOWER.max_output_tokens("tiny", modality="video")
        == 64
    )
    assert TOWER.max_output_tokens("full") == 16384
    assert TOWER.smallest_item("tiny", modality="video") == (1, 2, 2)
    assert TOWER.is_legal((1, 4, 6), "tiny")
    assert TOWER.is_legal((1, 4, 6), "tiny", modality="video")
    assert TOWER.is_legal((4, 4, 4), "tiny", modality="video")
    assert not TOWER.is_legal((2, 4, 6), "tiny")  # an image has t = 1
    assert not TOWER.is_legal((5, 2, 2), "tiny", modality="video")  # > 4 frames
    assert TOWER.is_legal((14, 2, 2), "full", modality="video")
    assert not TOWER.is_legal((15, 2, 2), "full", modality="video")
    assert not TOWER.is_legal((1, 3, 4), "tiny")  # not a multiple of m
    assert not TOWER.is_legal((1, 18, 18), "tiny")  # 81 tokens > 64
    assert TOWER.is_legal((4, 8, 4), "tiny", modality="video")  # 32 tokens
    assert not TOWER.is_legal((4, 8, 10), "tiny", modality="video")  # 80 tokens
    # smart_resize's aspect-ratio bound (200).
    assert TOWER.is_legal((1, 2, 400), "full")
    assert not TOWER.is_legal((1, 2, 402), "full")
    assert not TOWER.is_legal((1, 2, 2, 2), "tiny")
    with pytest.raises(ValueError, match="no 'audio' items"):
        TOWER.is_legal((1, 2, 2), "tiny", modality="audio")


@pytest.mark.parametrize("modality", ["image", "video"])
def test_random_items_are_legal(modality):
    rng = random.Random(0)
    frames = set()
    for _ in range(300):
        item = TOWER.sample_item(rng, "tiny", modality=modality)
        assert TOWER.is_legal(item, "tiny", modality=modality)
        frames.add(item[0])
        capped = TOWER.sample_item(rng, "full", max_output_tokens=40, modality=modality)
        assert TOWER.is_legal(capped, "full", modality=modality)
        assert TOWER.output_tokens(capped) <= 40
        grid = TOWER.legal_grid(rng, "tiny", max_output_tokens=10, modality=modality)
        assert TOWER.output_tokens(grid) <= 10
    assert frames == ({1} if modality == "image" else {1, 2, 3, 4})


@pytest.mark.parametrize("modality", ["image", "video"])
def test_exact_output_token_counts(modality):
    rng = random.Random(1)
    for tokens in range(1, TOWER.max_output_tokens("tiny") + 1):
        for _ in range(3):
            item = TOWER.legal_grid(
                rng, "tiny", output_tokens=tokens, modality=modality
            )
            assert TOWER.output_tokens(item) == tokens
            assert TOWER.is_legal(item, "tiny", modality=modality)
    for impossible in (0, 65):
        with pytest.raises(ValueError, match="no legal"):
            TOWER.legal_grid(rng, "tiny", output_tokens=impossible, modality=modality)
    full = TOWER.legal_grid(rng, "full", output_tokens=16384, modality=modality)
    assert TOWER.is_legal(full, "full", modality=modality)
    # A prime above the aspect-ratio bound has no image shape (1×p blocks);
    # a video can still reach it only with t dividing it, which it does not.
    with pytest.raises(ValueError, match="no legal"):
        TOWER.legal_grid(rng, "full", output_tokens=211, modality=modality)


def test_other_towers_take_the_modality_keyword():
    rng = random.Random(2)
    for name in ("deepseek_v41", "minimax_m3"):
        tower = REFERENCE_TOWERS[name]
        item = tower.sample_item(rng, "tiny", modality="image")
        assert tower.is_legal(item, "tiny", modality="image")
        exact = tower.legal_grid(rng, "tiny", output_tokens=10, modality="image")
        assert tower.output_tokens(exact) == 10
        assert tower.smallest_item("tiny", modality="image") == tower.smallest_item(
            "tiny"
        )
        assert tower.max_output_tokens("tiny", modality="image") == (
            tower.max_output_tokens("tiny")
        )
        with pytest.raises(ValueError, match="no 'video' items"):
            tower.sample_item(rng, "tiny", modality="video")
        with pytest.raises(ValueError, match="no 'video' items"):
            tower.legal_grid(rng, "tiny", output_tokens=4, modality="video")
        with pytest.raises(ValueError, match="no 'video' items"):
            tower.is_legal(item, "tiny", modality="video")
        with pytest.raises(ValueError, match="no 'video' items"):
            tower.make_mm_kwargs(None, [item], "cpu", modality="video")


# -- mm_kwargs --------------------------------------------------------------------------


def test_image_mm_kwargs_layout(host):
    items = [(1, 4, 6), (1, 2, 2)]
    kwargs = _kwargs(host, items, "image", seed=6)
    assert set(kwargs) == {"pixel_values", "image_grid_thw"}
    pixels = kwargs["pixel_values"]
    assert pixels.shape == (24 + 4, 1176) and pixels.dtype == torch.float32
    assert kwargs["image_grid_thw"].tolist() == [[1, 4, 6], [1, 2, 2]]
    assert kwargs["image_grid_thw"].dtype == torch.int64
    mean = torch.tensor(TOWER._MEAN)[:, None, None]
    std = torch.tensor(TOWER._STD)[:, None, None]
    generator = torch.Generator().manual_seed(6)
    offset = 0
    for _, h, w in items:
        image = (torch.rand((3, h * 14, w * 14), generator=generator) - mean) / std
        rows, cols = frame_patch_positions(h, w, 2)
        for r, (y, x) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
            block = image[:, y * 14 : (y + 1) * 14, x * 14 : (x + 1) * 14]
            features = pixels[offset + r].reshape(3, 2, 14, 14)
            assert torch.equal(features[:, 0], block)
            assert torch.equal(features[:, 1], block)  # repeated to T frames
        offset += h * w
    with pytest.raises(ValueError, match="t == 1"):
        _kwargs(host, [(2, 2, 2)], "image")


def test_video_mm_kwargs_layout(host):
    items = [(2, 2, 4), (1, 2, 2)]
    kwargs = _kwargs(host, items, "video", seed=7)
    assert set(kwargs) == {"pixel_values_videos", "video_grid_thw"}
    pixels = kwargs["pixel_values_videos"]
    assert pixels.shape == (16 + 4, 1176) and pixels.dtype == torch.float32
    assert kwargs["video_grid_thw"].tolist() == [[2, 2, 4], [1, 2, 2]]
    assert kwargs["video_grid_thw"].dtype == torch.int64
    mean = torch.tensor(TOWER._MEAN)[:, None, None]
    std = torch.tensor(TOWER._STD)[:, None, None]
    generator = torch.Generator().manual_seed(7)
    offset = 0
    for t, h, w in items:
        frames = [
            (torch.rand((3, h * 14, w * 14), generator=generator) - mean) / std
            for _ in range(2 * t)
        ]
        rows, cols = frame_patch_positions(h, w, 2)
        for ti in range(t):
            for r, (y, x) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
                features = pixels[offset + ti * h * w + r].reshape(3, 2, 14, 14)
                for tt in range(2):
                    block = frames[2 * ti + tt][
                        :, y * 14 : (y + 1) * 14, x * 14 : (x + 1) * 14
                    ]
                    assert torch.equal(features[:, tt], block)
        offset += t * h * w
    # Distinct frames inside one temporal patch.
    assert not torch.equal(
        pixels[0].reshape(3, 2, 14, 14)[:, 0], pixels[0].reshape(3, 2, 14, 14)[:, 1]
    )


def test_empty_mm_kwargs(host):
    for modality, keys in (
        ("image", ("pixel_values", "image_grid_thw")),
        ("video", ("pixel_values_videos", "video_grid_thw")),
    ):
        kwargs = _kwargs(host, [], modality)
        assert kwargs[keys[0]].shape == (0, 1176)
        assert kwargs[keys[1]].shape == (0, 3)
        assert TOWER.reference_outputs(host, kwargs) == []


def test_reference_outputs_take_vllms_modality_keys(host):
    rng = random.Random(3)
    for modality in ("image", "video"):
        items = [TOWER.sample_item(rng, "tiny", modality=modality) for _ in range(4)]
        kwargs = _kwargs(host, items, modality)
        assert host.reference_modality(kwargs) == modality
        outputs = TOWER.reference_outputs(host, kwargs)
        assert [o.shape for o in outputs] == [
            (TOWER.output_tokens(i), 96) for i in items
        ]
        assert all(
            o.dtype == torch.float32 and torch.isfinite(o).all() for o in outputs
        )
        # A list of per-item pixel tensors works too (vLLM may pass one).
        key = "pixel_values" if modality == "image" else "pixel_values_videos"
        split = dict(kwargs)
        split[key] = list(kwargs[key].split([TOWER.input_size(i) for i in items]))
        for a, b in zip(TOWER.reference_outputs(host, split), outputs, strict=True):
            _close(a, b, atol=0)
        bad = dict(kwargs)
        bad[key] = kwargs[key][:-1]
        with pytest.raises(ValueError, match="rows"):
            TOWER.reference_outputs(host, bad)
