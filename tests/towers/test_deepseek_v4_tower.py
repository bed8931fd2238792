"""DeepSeek-V4.1 reference tower: geometry, metadata and packed == eager."""

from __future__ import annotations

import math

import pytest
import torch

import reference_towers.deepseek_v4 as dsv4
from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers.deepseek_v4 import (
    IMAGE,
    IMAGE_END,
    IMAGE_NEW_LINE,
    IMAGE_START,
    DeepseekV41Config,
    DeepseekV41VisionHost,
    apply_rotary,
    build_image_span_types,
    build_packed_merge_metadata,
    build_packed_vit_metadata,
    image_span_length,
    run_dp_sharded_vision_tower,
    vision_cos_sin,
)
from reference_towers.registry import REFERENCE_TOWERS

TOWER = REFERENCE_TOWERS["deepseek_v41"]
# Multiples of r = 3 and not, square, tall, wide, a single patch.
GRIDS = [(1, 1), (3, 3), (4, 7), (7, 4), (9, 6), (2, 11), (5, 5)]


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-5)


def _patches(host: DeepseekV41VisionHost, grids, seed: int = 0) -> torch.Tensor:
    kwargs = TOWER.make_mm_kwargs(host, grids, "cpu", seed=seed)
    return kwargs["patches"].to(torch.float32)


# -- configuration -------------------------------------------------------------


def test_full_config_values():
    config = DeepseekV41Config.full()
    assert (config.vision_dim, config.vision_n_heads, config.vision_inter_dim) == (
        1024,
        16,
        2816,
    )
    assert (config.vision_patch_size, config.vision_downsample_ratio) == (14, 3)
    assert config.vision_rope_theta == 10000.0
    assert config.vision_max_n_token == 1024
    assert config.hidden_size == 5120
    assert config.vision_layers == config.vision_n_layers == 24


@pytest.mark.parametrize(
    "kwargs",
    [{"vision_dim": 100}, {"vision_dim": 96}, {"hidden_size": 0}],
    ids=["dim-not-multiple-of-heads", "head-dim-not-multiple-of-4", "zero-hidden"],
)
def test_invalid_config_rejected(kwargs):
    with pytest.raises(ValueError, match="invalid DeepseekV41Config"):
        DeepseekV41Config(**kwargs)


def test_full_host_shapes_on_meta_device():
    with torch.device("meta"):
        host = DeepseekV41VisionHost(DeepseekV41Config.full())
    assert len(host.vision.blocks) == 24
    assert host.vision.rope_dim == 32
    assert host.vision.patch_embed.proj.weight.shape == (1024, 3 * 14 * 14)
    assert host.vision.blocks[0].attn.wqkv.weight.shape == (3 * 1024, 1024)
    assert host.vision.blocks[0].mlp.w1.weight.shape == (2 * 2816, 1024)
    assert host.aligner.w1.weight.shape == (5120, 1024 * 9)
    assert host.aligner.out_dim == 5120
    assert host.image_start.shape == (5120,)


# -- 2-D RoPE ------------------------------------------------------------------


def test_rope_tables_match_the_formula():
    n_h, n_w, dim, theta = 3, 5, 8, 10000.0
    cos, sin = vision_cos_sin(n_h, n_w, dim, theta)
    assert cos.shape == sin.shape == (n_h * n_w, 1, dim)
    assert cos.dtype == torch.float32
    for i in range(n_h):
        for j in range(n_w):
            for c in range(dim):
                position = i if c < dim // 2 else j
                angle = position * theta ** (-2 * (c % (dim // 2)) / dim)
                assert cos[i * n_w + j, 0, c].item() == pytest.approx(
                    math.cos(angle), abs=1e-6
                )
                assert sin[i * n_w + j, 0, c].item() == pytest.approx(
                    math.sin(angle), abs=1e-6
                )


def test_rotation_quarters_follow_row_and_column():
    head_dim = 32
    n_h, n_w = 3, 4
    cos, sin = vision_cos_sin(n_h, n_w, head_dim // 2, 10000.0)
    x = torch.randn(1, 1, head_dim).expand(n_h * n_w, 1, head_dim)
    out = apply_rotary(x, cos, sin).reshape(n_h, n_w, head_dim)
    q = head_dim // 4
    row_dims = torch.cat([torch.arange(0, q), torch.arange(2 * q, 3 * q)])
    col_dims = torch.cat([torch.arange(q, 2 * q), torch.arange(3 * q, 4 * q)])
    # Row quarters depend only on the row, column quarters only on the column.
    _close(out[:, :, row_dims], out[:, :1, row_dims].expand(-1, n_w, -1))
    _close(out[:, :, col_dims], out[:1, :, col_dims].expand(n_h, -1, -1))
    assert not torch.allclose(out[0, 0, row_dims], out[1, 0, row_dims])
    assert not torch.allclose(out[0, 0, col_dims], out[0, 1, col_dims])
    # A rotation: the norm of every (c, c + hd/2) pair is unchanged.
    pairs = x.reshape(n_h, n_w, 2, head_dim // 2).norm(dim=2)
    _close(out.reshape(n_h, n_w, 2, head_dim // 2).norm(dim=2), pairs)


# -- packed metadata -----------------------------------------------------------


def test_vit_metadata_offsets_tables_and_max_seqlen():
    rope_dim, theta = 16, 10000.0
    meta = build_packed_vit_metadata(
        GRIDS, rope_dim=rope_dim, rope_theta=theta, device="cpu"
    )
    sizes = [h * w for h, w in GRIDS]
    expected_cu = [0]
    for size in sizes:
        expected_cu.append(expected_cu[-1] + size)
    assert meta["cu_seqlens"].dtype == torch.int32
    assert meta["cu_seqlens"].tolist() == expected_cu
    assert meta["max_seqlen"].dim() == 0
    assert meta["max_seqlen"].dtype == torch.int32
    assert meta["max_seqlen"].device.type == "cpu"
    assert meta["max_seqlen"].item() == max(sizes)
    assert meta["vit_cos"].shape == (sum(sizes), 1, rope_dim)
    for (h, w), start in zip(GRIDS, expected_cu, strict=False):
        cos, sin = vision_cos_sin(h, w, rope_dim, theta)
        _close(meta["vit_cos"][start : start + h * w], cos, atol=0)
        _close(meta["vit_sin"][start : start + h * w], sin, atol=0)


def test_vit_metadata_override_uncached_and_empty():
    uncached = build_packed_vit_metadata(
        [(3, 30)] * 2,
        rope_dim=16,
        rope_theta=10000.0,
        device="cpu",
        max_seqlen_override=999,
        cached=False,
    )
    assert uncached["max_seqlen"].item() == 999
    cached = build_packed_vit_metadata(
        [(3, 30)] * 2, rope_dim=16, rope_theta=10000.0, device="cpu"
    )
    _close(uncached["vit_cos"], cached["vit_cos"], atol=0)
    empty = build_packed_vit_metadata([], rope_dim=16, rope_theta=1e4, device="cpu")
    assert empty["vit_cos"].shape == (0, 1, 16)
    assert empty["cu_seqlens"].tolist() == [0]
    assert empty["max_seqlen"].item() == 0


def test_uncached_metadata_leaves_the_cache_alone():
    from reference_towers.deepseek_v4 import _VIT_ROWS

    _VIT_ROWS.clear()
    build_packed_vit_metadata(
        [(3, 60)], rope_dim=16, rope_theta=1e4, device="cpu", cached=False
    )
    assert len(_VIT_ROWS) == 0
    build_packed_vit_metadata([(3, 60)] * 3, rope_dim=16, rope_theta=1e4, device="cpu")
    assert len(_VIT_ROWS) == 1


def _brute_force_merge(grids, r):
    idx, mask = [], []
    offset = 0
    for h, w in grids:
        for bi in range(-(-h // r)):
            for bj in range(-(-w // r)):
                row_idx, row_mask = [], []
                for di in range(r):
                    for dj in range(r):
                        y, x = bi * r + di, bj * r + dj
                        row_mask.append(float(y < h and x < w))
                        row_idx.append(offset + min(y, h - 1) * w + min(x, w - 1))
                idx.append(row_idx)
                mask.append(row_mask)
        offset += h * w
    return idx, mask


def test_merge_metadata_matches_brute_force():
    r = 3
    meta = build_packed_merge_metadata(GRIDS, r, device="cpu", dtype=torch.float64)
    idx, mask = _brute_force_merge(GRIDS, r)
    assert meta["merge_idx"].dtype == torch.int64
    assert meta["merge_idx"].tolist() == idx
    assert meta["merge_mask"].dtype == torch.float64
    assert meta["merge_mask"].shape == (len(idx), r * r, 1)
    assert meta["merge_mask"].squeeze(-1).tolist() == mask


def test_merge_metadata_empty():
    meta = build_packed_merge_metadata([], 3, device="cpu", dtype=torch.float32)
    assert meta["merge_idx"].shape == (0, 9)
    assert meta["merge_mask"].shape == (0, 9, 1)


# -- aligner -------------------------------------------------------------------


def test_aligner_merge_order_matches_definition(deepseek_host, monkeypatch):
    """Feature ``c·r² + di·r + dj`` of block ``(bi, bj)`` is channel ``c`` of
    patch ``(bi·r+di, bj·r+dj)``, zero past the edge, in both forms."""
    aligner = deepseek_host.aligner
    monkeypatch.setattr(aligner, "_project", lambda merged: merged)
    r, d = aligner.downsample_ratio, 5
    for h, w in [(4, 7), (3, 3), (1, 2)]:
        x = torch.randn(h * w, d)
        expected = torch.zeros(-(-h // r) * -(-w // r), d * r * r)
        row = 0
        for bi in range(-(-h // r)):
            for bj in range(-(-w // r)):
                for c in range(d):
                    for di in range(r):
                        for dj in range(r):
                            y, z = bi * r + di, bj * r + dj
                            if y < h and z < w:
                                expected[row, c * r * r + di * r + dj] = x[y * w + z, c]
                row += 1
        _close(aligner(x, h, w), expected, atol=0)
        meta = build_packed_merge_metadata([(h, w)], r, device="cpu", dtype=x.dtype)
        _close(aligner.forward_packed(x, **meta), expected, atol=0)


def test_aligner_packed_equals_per_image(deepseek_host):
    aligner = deepseek_host.aligner
    dim = deepseek_host.config.vision_dim
    xs = [torch.randn(h * w, dim) for h, w in GRIDS]
    per_image = torch.cat([aligner(x, h, w) for x, (h, w) in zip(xs, GRIDS)])
    meta = build_packed_merge_metadata(GRIDS, 3, device="cpu", dtype=torch.float32)
    _close(aligner.forward_packed(torch.cat(xs), **meta), per_image)


# -- ViT -----------------------------------------------------------------------


def _packed_vit(host, patches, grids):
    meta = build_packed_vit_metadata(
        grids,
        rope_dim=host.vision.rope_dim,
        rope_theta=host.vision.rope_theta,
        device="cpu",
    )
    return host.vision.forward_packed(
        patches,
        meta["vit_cos"],
        meta["vit_sin"],
        meta["cu_seqlens"],
        meta["max_seqlen"],
    )


@pytest.mark.parametrize(
    "grids", [GRIDS, [(6, 6)], [(1, 1), (1, 1)], [(2, 11), (9, 6)]], ids=str
)
def test_vit_packed_equals_per_image(deepseek_host, grids):
    patches = _patches(deepseek_host, grids)
    per_image, offset = [], 0
    for h, w in grids:
        per_image.append(deepseek_host.vision(patches[offset : offset + h * w], h, w))
        offset += h * w
    _close(_packed_vit(deepseek_host, patches, grids), torch.cat(per_image))


def test_vit_attends_within_each_image_only(deepseek_host):
    grids = [(3, 4), (2, 5)]
    patches = _patches(deepseek_host, grids, seed=1)
    reference = _packed_vit(deepseek_host, patches, grids)
    changed = patches.clone()
    changed[12:] = torch.rand_like(changed[12:])  # only the second image
    _close(_packed_vit(deepseek_host, changed, grids)[:12], reference[:12])


def test_sdpa_backend_gives_the_same_result():
    host = TOWER.build_host(
        type("M", (), {}),
        "tiny",
        device="cpu",
        dtype=torch.float32,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
    )
    assert (
        host.vision.blocks[0].attn.attn.attn_backend is AttentionBackendEnum.TORCH_SDPA
    )
    patches = _patches(host, GRIDS)
    reference = REFERENCE_TOWERS["deepseek_v41"].build_host(
        type("N", (), {}), "tiny", device="cpu", dtype=torch.float32
    )
    _close(_packed_vit(host, patches, GRIDS), _packed_vit(reference, patches, GRIDS))


def test_patch_dtype_mismatch_is_rejected(deepseek_host):
    with pytest.raises(TypeError, match="cast them"):
        deepseek_host.vision(torch.zeros(1, 3, 14, 14, dtype=torch.bfloat16), 1, 1)


def test_rope_rows_must_match_patches(deepseek_host):
    patches = _patches(deepseek_host, [(2, 2)])
    meta = build_packed_vit_metadata(
        [(2, 3)], rope_dim=16, rope_theta=1e4, device="cpu"
    )
    with pytest.raises(ValueError, match="RoPE tables"):
        deepseek_host.vision.forward_packed(
            patches, meta["vit_cos"], meta["vit_sin"], meta["cu_seqlens"], 6
        )


# -- spans and the host's reference ----------------------------------------------


def test_span_types_layout():
    types = build_image_span_types(2, 3)
    assert types.dtype == torch.int64
    assert types.tolist() == [
        IMAGE_START,
        *[IMAGE] * 3,
        IMAGE_NEW_LINE,
        *[IMAGE] * 3,
        IMAGE_NEW_LINE,
        IMAGE_END,
    ]
    assert (IMAGE_START, IMAGE, IMAGE_NEW_LINE, IMAGE_END) == (0, 1, 2, 3)
    for lh, lw in [(1, 1), (4, 2), (3, 7)]:
        types = build_image_span_types(lh, lw)
        assert types.numel() == image_span_length(lh, lw) == lh * (lw + 1) + 2
        assert int((types == IMAGE).sum()) == lh * lw


def test_reference_spans_place_rows_and_delimiters(deepseek_host):
    grids = [(4, 7), (1, 1), (9, 6)]
    kwargs = TOWER.make_mm_kwargs(deepseek_host, grids, "cpu", seed=3)
    spans = TOWER.reference_outputs(deepseek_host, kwargs)
    patches = kwargs["patches"].to(torch.float32)
    offset = 0
    for span, (h, w) in zip(spans, grids, strict=True):
        rows = deepseek_host.aligner(
            deepseek_host.vision(patches[offset : offset + h * w], h, w), h, w
        )
        offset += h * w
        lh, lw = -(-h // 3), -(-w // 3)
        types = build_image_span_types(lh, lw)
        assert span.shape == (image_span_length(lh, lw), 96)
        _close(span[types == IMAGE], rows)
        _close(span[0], deepseek_host.image_start)
        _close(span[-1], deepseek_host.image_end)
        newlines = span[types == IMAGE_NEW_LINE]
        _close(newlines, deepseek_host.image_newline.expand(lh, -1))


def test_bf16_tiny_is_finite_and_close_to_fp32(deepseek_host):
    bf16 = TOWER.build_host(
        type("M", (), {}), "tiny", device="cpu", dtype=torch.bfloat16
    )
    assert bf16.image_start.dtype == torch.float32
    assert bf16.aligner.w1.weight.dtype == torch.bfloat16
    kwargs = TOWER.make_mm_kwargs(bf16, GRIDS, "cpu")
    for low, high in zip(
        TOWER.reference_outputs(bf16, kwargs),
        TOWER.reference_outputs(deepseek_host, kwargs),
        strict=True,
    ):
        assert low.dtype == torch.bfloat16
        assert torch.isfinite(low).all()
        assert (low.float() - high).abs().max() < 0.1 * high.abs().max()


# -- data-parallel eager path ----------------------------------------------------


def test_dp_with_one_rank_equals_per_image(deepseek_host):
    kwargs = TOWER.make_mm_kwargs(deepseek_host, GRIDS, "cpu")
    patches = kwargs["patches"].to(torch.float32)
    out = run_dp_sharded_vision_tower(
        deepseek_host.vision, deepseek_host.aligner, patches, kwargs["vit_grid"]
    )
    expected = deepseek_host.reference_encode_images(patches, GRIDS)
    assert len(out) == len(expected)
    for a, b in zip(out, expected, strict=True):
        _close(a, b)


def test_dp_with_two_simulated_ranks_restores_image_order(deepseek_host, monkeypatch):
    """Rank 1 runs first and its padded rows are replayed into rank 0's
    all-gather, so rank 0 sees what a real 2-rank all-gather returns."""
    kwargs = TOWER.make_mm_kwargs(deepseek_host, GRIDS, "cpu")
    patches = kwargs["patches"].to(torch.float32)
    sent: dict[int, torch.Tensor] = {}
    rank = {"value": 1}

    def all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        assert dim == 0
        sent[rank["value"]] = tensor
        if rank["value"] == 1:
            return torch.cat([torch.full_like(tensor, float("nan")), tensor])
        return torch.cat([tensor, sent[1]])

    monkeypatch.setattr(dsv4, "get_tensor_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr(dsv4, "get_tensor_model_parallel_rank", lambda: rank["value"])
    monkeypatch.setattr(dsv4, "tensor_model_parallel_all_gather", all_gather)
    run_dp_sharded_vision_tower(
        deepseek_host.vision, deepseek_host.aligner, patches, GRIDS
    )
    rank["value"] = 0
    out = run_dp_sharded_vision_tower(
        deepseek_host.vision, deepseek_host.aligner, patches, GRIDS
    )
    assert sent[0].shape == sent[1].shape  # padded to one shape
    expected = deepseek_host.reference_encode_images(patches, GRIDS)
    for a, b in zip(out, expected, strict=True):
        _close(a, b)


def test_host_in_data_parallel_mode_with_one_rank(deepseek_host):
    dp_host = TOWER.build_host(
        type("M", (), {}),
        "tiny",
        device="cpu",
        dtype=torch.float32,
        multimodal_config=MultiModalConfig(mm_encoder_tp_mode="data"),
    )
    assert dp_host.reference_use_data_parallel
    kwargs = TOWER.make_mm_kwargs(dp_host, GRIDS, "cpu")
    for a, b in zip(
        TOWER.reference_outputs(dp_host, kwargs),
        TOWER.reference_outputs(deepseek_host, kwargs),
        strict=True,
    ):
        _close(a, b, atol=0)
