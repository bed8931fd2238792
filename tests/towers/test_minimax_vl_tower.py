"""MiniMax M3 reference tower: 3-D RoPE geometry, metadata, packed == eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from reference_towers.minimax_vl import (
    MiniMaxM3VisionConfig,
    MiniMaxM3VisionHost,
    apply_partial_mrope,
    build_rotary_planes,
    rope_geometry,
    token_positions,
)
from reference_towers.registry import REFERENCE_TOWERS

TOWER = REFERENCE_TOWERS["minimax_m3"]
ITEMS = [(1, 2, 2), (1, 4, 6), (1, 8, 2), (1, 6, 6), (1, 2, 14)]


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-5)


def _pixels(host, items, seed=0) -> torch.Tensor:
    return TOWER.make_mm_kwargs(host, items, "cpu", seed=seed)["pixel_values"]


# -- configuration -------------------------------------------------------------


def test_full_config_values():
    config = MiniMaxM3VisionConfig.full()
    assert (config.hidden_size, config.num_attention_heads) == (1280, 16)
    assert (config.num_hidden_layers, config.intermediate_size) == (32, 5120)
    assert (config.patch_size, config.temporal_patch_size) == (14, 2)
    assert config.spatial_merge_size == 2
    assert config.patch_dim == 3 * 2 * 14 * 14 == 1176
    assert (config.text_hidden_size, config.projector_hidden_size) == (6144, 6144)
    assert config.max_patches_per_image == 2304  # 672² / 14²


def test_full_host_shapes_on_meta_device():
    with torch.device("meta"):
        host = MiniMaxM3VisionHost(MiniMaxM3VisionConfig.full())
    tower = host.vision_tower
    vit = tower.vision_model
    assert vit.embeddings.patch_embedding.weight.shape == (1280, 3, 2, 14, 14)
    assert len(vit.encoder.layers) == 32
    assert vit.encoder.layers[0].self_attn.qkv_proj.weight.shape == (3 * 1280, 1280)
    assert tower.multi_modal_projector.linear_1.weight.shape == (6144, 1280)
    assert tower.patch_merge_mlp.linear_1.weight.shape == (6144, 4 * 6144)
    assert tower.out_hidden_size == 6144
    assert vit.rope_geometry.rotary_dim == 78


def test_invalid_config_rejected():
    with pytest.raises(ValueError, match="not a multiple"):
        MiniMaxM3VisionConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="unknown activation"):
        MiniMaxM3VisionConfig(hidden_act="relu6")


# -- 3-D RoPE ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head_dim", "axis", "rotary", "half", "section"),
    [
        (64, 20, 60, 30, 10),
        (80, 26, 78, 39, 13),
        (32, 10, 30, 15, 5),
        (72, 24, 72, 36, 12),
    ],
)
def test_rope_geometry(head_dim, axis, rotary, half, section):
    geometry = rope_geometry(head_dim)
    assert (geometry.axis_dim, geometry.rotary_dim) == (axis, rotary)
    assert (geometry.half_rot, geometry.section) == (half, section)


@pytest.mark.parametrize("grid", [(1, 2, 2), (1, 4, 6), (3, 6, 4), (2, 2, 10)])
def test_token_positions_follow_the_processor_layout(grid):
    """Derive positions by pushing (t, h, w) coordinate maps through the
    processor's reshape/permute, independently of the arithmetic."""
    t, h, w = grid
    m = 2
    tt, hh, ww = torch.meshgrid(
        torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"
    )

    def layout(coords: torch.Tensor) -> torch.Tensor:
        blocks = coords.reshape(t, h // m, m, w // m, m)
        return blocks.permute(0, 1, 3, 2, 4).reshape(-1)

    tpos, hpos, wpos = token_positions(t, h, w, m)
    assert tpos.tolist() == layout(tt).tolist()
    assert hpos.tolist() == layout(hh).tolist()
    assert wpos.tolist() == layout(ww).tolist()


def test_rotary_planes_values_and_zero_columns():
    geometry = rope_geometry(32)
    sec, theta = geometry.section, 10000.0
    segments = [(1, 2, 4), (2, 4, 2)]
    cos, sin = build_rotary_planes(
        segments, geometry=geometry, theta=theta, spatial_merge_size=2
    )
    total = 8 + 16
    assert cos.shape == sin.shape == (3, total, geometry.half_rot)
    assert cos.dtype == torch.float32
    inv_freq = theta ** (
        -torch.arange(0, geometry.axis_dim, 2).double() / geometry.axis_dim
    )
    offset = 0
    for t, h, w in segments:
        positions = token_positions(t, h, w, 2)
        rows = slice(offset, offset + t * h * w)
        for axis in range(3):
            angles = positions[axis].double()[:, None] * inv_freq[None, :]
            own = slice(axis * sec, (axis + 1) * sec)
            _close(cos[axis, rows, own], angles.cos().float())
            _close(sin[axis, rows, own], angles.sin().float())
            mask = torch.ones(geometry.half_rot, dtype=torch.bool)
            mask[own] = False
            assert (cos[axis, rows][:, mask] == 0).all()
            assert (sin[axis, rows][:, mask] == 0).all()
        offset += t * h * w


def test_partial_rope_rotates_pairs_and_passes_the_tail():
    geometry = rope_geometry(32)
    half, rot = geometry.half_rot, geometry.rotary_dim
    cos, sin = build_rotary_planes(
        [(1, 4, 4)], geometry=geometry, theta=1e4, spatial_merge_size=2
    )
    x = torch.randn(16, 3, 32)
    out = apply_partial_mrope(x, cos, sin, geometry)
    _close(out[..., rot:], x[..., rot:], atol=0)
    pair_norm = torch.stack([x[..., :half], x[..., half:rot]]).norm(dim=0)
    _close(torch.stack([out[..., :half], out[..., half:rot]]).norm(dim=0), pair_norm)
    # Token 0 sits at (0, 0, 0): no rotation at all.
    _close(out[0], x[0])
    # Column i of the first pair member: x_i·cos − x_{i+half}·sin on its plane.
    sec = geometry.section
    for i in range(half):
        plane = i // sec
        c, s = cos[plane, :, i, None], sin[plane, :, i, None]
        _close(out[:, :, i], x[:, :, i] * c - x[:, :, i + half] * s)


def test_plane_rows_must_match_tokens():
    geometry = rope_geometry(32)
    cos, sin = build_rotary_planes(
        [(1, 2, 4)], geometry=geometry, theta=1e4, spatial_merge_size=2
    )
    with pytest.raises(ValueError, match="must match exactly"):
        apply_partial_mrope(torch.randn(6, 2, 32), cos, sin, geometry)


# -- encoder metadata ------------------------------------------------------------


def test_metadata_offsets_padding_and_max_seqlen(minimax_host):
    vit = minimax_host.vision_tower.vision_model
    meta = vit.prepare_encoder_metadata(ITEMS, device="cpu")
    lengths = [t * h * w for t, h, w in ITEMS]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    assert meta["cu_seqlens"].dtype == torch.int32
    assert meta["cu_seqlens"].tolist() == offsets
    assert meta["max_seqlen"].dim() == 0
    assert meta["max_seqlen"].dtype == torch.int32
    assert meta["max_seqlen"].device.type == "cpu"
    assert meta["max_seqlen"].item() == max(lengths)
    assert meta["sequence_lengths"] is None
    assert meta["rotary_cos"].shape == (3, sum(lengths), vit.rope_geometry.half_rot)

    padded = vit.prepare_encoder_metadata(
        ITEMS, device="cpu", max_batch_size=8, max_seqlen_override=500
    )
    assert padded["cu_seqlens"].tolist() == offsets + [offsets[-1]] * (8 - len(ITEMS))
    assert padded["max_seqlen"].item() == 500
    _close(padded["rotary_cos"], meta["rotary_cos"], atol=0)

    # Already at max_batch_size: nothing to pad.
    exact = vit.prepare_encoder_metadata(ITEMS, device="cpu", max_batch_size=len(ITEMS))
    assert exact["cu_seqlens"].tolist() == offsets

    empty = vit.prepare_encoder_metadata([], device="cpu", max_batch_size=3)
    assert empty["cu_seqlens"].tolist() == [0, 0, 0, 0]
    assert empty["rotary_cos"].shape == (3, 0, vit.rope_geometry.half_rot)
    assert empty["max_seqlen"].item() == 0


def test_videos_are_split_into_frame_segments(minimax_host):
    vit = minimax_host.vision_tower.vision_model
    assert vit.vision_segment_max_frames == 4
    meta = vit.prepare_encoder_metadata([(9, 2, 2), (1, 2, 2)], device="cpu")
    assert meta["cu_seqlens"].tolist() == [0, 16, 32, 36, 40]
    assert meta["max_seqlen"].item() == 16
    # Temporal positions restart in every segment.
    sec = vit.rope_geometry.section
    t_angle = meta["rotary_sin"][0, :, 0]
    assert (t_angle[[0, 16, 32, 36]] == 0).all()
    assert (t_angle[[4, 20]] != 0).all()
    _close(meta["rotary_cos"][:, 16:32], meta["rotary_cos"][:, :16], atol=0)
    assert sec > 0


def test_sdpa_backend_reports_no_max_seqlen():
    host = TOWER.build_host(
        type("M", (), {}),
        "tiny",
        device="cpu",
        dtype=torch.float32,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
    )
    vit = host.vision_tower.vision_model
    assert vit.attn_backend is AttentionBackendEnum.TORCH_SDPA
    assert all(
        layer.self_attn.attn.attn_backend is AttentionBackendEnum.TORCH_SDPA
        for layer in vit.encoder.layers
    )
    assert vit.prepare_encoder_metadata(ITEMS, device="cpu")["max_seqlen"].item() == 0


def test_backend_setter_reaches_every_layer(minimax_host):
    vit = minimax_host.vision_tower.vision_model
    vit.attn_backend = AttentionBackendEnum.FLASHINFER
    try:
        assert all(
            layer.self_attn.attn.attn_backend is AttentionBackendEnum.FLASHINFER
            for layer in vit.encoder.layers
        )
        with pytest.raises(NotImplementedError, match="FlashInfer"):
            vit.prepare_encoder_metadata(ITEMS, device="cpu")
    finally:
        vit.attn_backend = AttentionBackendEnum.FLASH_ATTN


# -- tower -----------------------------------------------------------------------


def test_patch_embed_is_the_conv3d(minimax_host):
    embeddings = minimax_host.vision_tower.vision_model.embeddings
    pixels = _pixels(minimax_host, ITEMS[:2])
    as_conv = F.conv3d(
        pixels.reshape(-1, 3, 2, 14, 14),
        embeddings.patch_embedding.weight,
        stride=(2, 14, 14),
    ).reshape(pixels.shape[0], -1)
    _close(embeddings(pixels), as_conv)


def test_pixel_dtype_mismatch_is_rejected(minimax_host):
    tower = minimax_host.vision_tower
    with pytest.raises(TypeError, match="vision_tower.dtype"):
        tower(torch.zeros(4, 1176, dtype=torch.bfloat16), grid_thw=[[1, 2, 2]])
    assert tower.dtype == torch.float32  # unchanged


@pytest.mark.parametrize("items", [ITEMS, [(1, 2, 2)], [(1, 6, 6), (1, 6, 6)]], ids=str)
def test_packed_forward_equals_per_image(minimax_host, items):
    tower = minimax_host.vision_tower
    pixels = _pixels(minimax_host, items)
    packed = tower(pixels, grid_thw=[list(item) for item in items])
    kwargs = {"pixel_values": pixels, "image_grid_thw": torch.tensor(items)}
    per_image = TOWER.reference_outputs(minimax_host, kwargs)
    assert [p.shape[0] for p in per_image] == [t * h * w // 4 for t, h, w in items]
    assert packed.shape == (sum(p.shape[0] for p in per_image), 96)
    _close(packed, torch.cat(per_image))


def test_metadata_path_equals_grid_path(minimax_host):
    tower = minimax_host.vision_tower
    pixels = _pixels(minimax_host, ITEMS, seed=2)
    meta = tower.vision_model.prepare_encoder_metadata(ITEMS, device="cpu")
    _close(
        tower(pixels, grid_thw=None, encoder_metadata=meta),
        tower(pixels, grid_thw=ITEMS),
        atol=0,
    )


def test_attention_stays_within_each_image(minimax_host):
    tower = minimax_host.vision_tower
    items = [(1, 4, 4), (1, 2, 6)]
    pixels = _pixels(minimax_host, items, seed=4)
    reference = tower(pixels, grid_thw=items)
    changed = pixels.clone()
    changed[16:] = torch.randn_like(changed[16:])
    _close(tower(changed, grid_thw=items)[:4], reference[:4])


def test_bf16_tiny_is_finite_and_close_to_fp32(minimax_host):
    bf16 = TOWER.build_host(
        type("M", (), {}), "tiny", device="cpu", dtype=torch.bfloat16
    )
    assert bf16.vision_tower.dtype == torch.bfloat16
    kwargs = TOWER.make_mm_kwargs(bf16, ITEMS, "cpu")
    for low, high in zip(
        TOWER.reference_outputs(bf16, kwargs),
        TOWER.reference_outputs(minimax_host, kwargs),
        strict=True,
    ):
        assert low.dtype == torch.bfloat16
        assert torch.isfinite(low).all()
        assert (low.float() - high).abs().max() < 0.1 * high.abs().max()
