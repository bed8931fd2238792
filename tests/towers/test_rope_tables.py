"""The device-gather metadata builders give the host builders' values.

The towers build their packed RoPE tables and merge indices by gathering
from cached per-position / per-grid tensors (``reference_towers.rope_tables``)
instead of computing them on the host for every batch. The host builders
stay as the definition; here both are compared bit for bit on the CPU, and
the caches' own behaviour (LRU order, ``store=False``, table growth) is
checked.
"""

from __future__ import annotations

import random

import pytest
import torch

from reference_towers import deepseek_v4, minimax_vl, qwen2_vl
from reference_towers.rope_tables import AngleTable, GridIndexCache, concat_on_device


def random_segments(rng: random.Random, n: int, *, merge: int = 2, t_max: int = 3):
    return [
        (rng.randint(1, t_max), merge * rng.randint(1, 24), merge * rng.randint(1, 24))
        for _ in range(n)
    ]


@pytest.mark.parametrize("head_dim", [64, 72, 80])
@pytest.mark.parametrize("seed", range(4))
def test_minimax_planes_equal_the_host_builder(head_dim: int, seed: int) -> None:
    rng = random.Random(seed)
    geometry = minimax_vl.rope_geometry(head_dim)
    table = minimax_vl.RotaryPlaneTable(geometry, 10000.0, 2)
    for _ in range(3):  # later calls hit the caches and may grow the table
        segments = random_segments(rng, rng.randint(1, 6))
        cos, sin = table.planes(segments, "cpu")
        ref_cos, ref_sin = minimax_vl.build_rotary_planes(
            segments, geometry=geometry, theta=10000.0, spatial_merge_size=2
        )
        assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_qwen2_vl_tables_equal_the_host_builder(dtype: torch.dtype, seed: int) -> None:
    rng = random.Random(seed)
    table = qwen2_vl.VisionRotaryTable(80, 10000.0, 2)
    for _ in range(3):
        grids = random_segments(rng, rng.randint(1, 6))
        cos, sin = table.cos_sin(grids, torch.device("cpu"), dtype)
        ref_cos, ref_sin = qwen2_vl.vision_rotary_tables(
            grids, head_dim=80, theta=10000.0, spatial_merge_size=2
        )
        assert cos.dtype == dtype
        assert torch.equal(cos, ref_cos.to(dtype)) and torch.equal(
            sin, ref_sin.to(dtype)
        )


def test_qwen2_vl_table_keeps_the_rope_cache_limit() -> None:
    table = qwen2_vl.VisionRotaryTable(80, 10000.0, 2)
    side = qwen2_vl.ROPE_MAX_POSITION + 2
    with pytest.raises(ValueError, match="positions of the vision RoPE cache"):
        table.cos_sin([(1, 2, side)], torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("cached", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_deepseek_vit_metadata_equals_per_image_tables(cached: bool, seed: int) -> None:
    rng = random.Random(seed)
    grids = [(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(rng.randint(1, 6))]
    meta = deepseek_v4.build_packed_vit_metadata(
        grids, rope_dim=32, rope_theta=10000.0, device="cpu", cached=cached
    )
    parts = [deepseek_v4.vision_cos_sin(h, w, 32, 10000.0) for h, w in grids]
    assert torch.equal(meta["vit_cos"], torch.cat([c for c, _ in parts]))
    assert torch.equal(meta["vit_sin"], torch.cat([s for _, s in parts]))
    sizes = [h * w for h, w in grids]
    assert meta["cu_seqlens"].tolist() == [
        sum(sizes[:i]) for i in range(len(sizes) + 1)
    ]
    assert int(meta["max_seqlen"]) == max(sizes)


@pytest.mark.parametrize("r", [2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_deepseek_merge_metadata_follows_its_definition(r: int, seed: int) -> None:
    rng = random.Random(seed)
    grids = [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(rng.randint(1, 5))]
    meta = deepseek_v4.build_packed_merge_metadata(
        grids, r, device="cpu", dtype=torch.bfloat16
    )
    idx, mask = meta["merge_idx"].tolist(), meta["merge_mask"].squeeze(-1).tolist()
    row, offset = 0, 0
    for h, w in grids:
        lh, lw = deepseek_v4.llm_grid(h, w, r)
        for bi in range(lh):
            for bj in range(lw):
                for di in range(r):
                    for dj in range(r):
                        i, j = bi * r + di, bj * r + dj
                        pos = di * r + dj
                        assert idx[row][pos] == offset + min(i, h - 1) * w + min(
                            j, w - 1
                        )
                        assert mask[row][pos] == float(i < h and j < w)
                row += 1
        offset += h * w
    assert row == len(idx)
    assert meta["merge_mask"].dtype == torch.bfloat16


def test_deepseek_merge_metadata_of_no_images() -> None:
    meta = deepseek_v4.build_packed_merge_metadata(
        [], 2, device="cpu", dtype=torch.float32
    )
    assert meta["merge_idx"].shape == (0, 4) and meta["merge_mask"].shape == (0, 4, 1)


def test_grid_index_cache_is_an_lru_and_store_false_leaves_it_alone() -> None:
    built: list[int] = []

    def build(key):
        built.append(key)
        return torch.tensor([key])

    cache = GridIndexCache(build, maxsize=2)
    a = cache.get(1, "cpu")
    assert cache.get(1, "cpu") is a and built == [1]
    cache.get(2, "cpu")
    cache.get(1, "cpu")  # 1 is now the most recent
    cache.get(3, "cpu")  # evicts 2
    assert len(cache) == 2
    cache.get(1, "cpu")
    assert built == [1, 2, 3]
    cache.get(2, "cpu")
    assert built == [1, 2, 3, 2]
    cache.get(9, "cpu", store=False)
    cache.get(9, "cpu", store=False)
    assert built[-2:] == [9, 9] and len(cache) == 2


def test_angle_table_grows_and_keeps_its_values() -> None:
    inv_freq = torch.tensor([1.0, 0.5, 0.01])
    table = AngleTable(lambda: inv_freq)
    cos, sin = table.cos_sin(10, "cpu", torch.float32)
    assert cos.shape == (64, 3)
    big_cos, _ = table.cos_sin(100, "cpu", torch.float32)
    assert big_cos.shape == (128, 3)
    assert torch.equal(big_cos[:64], cos)
    angles = torch.arange(128, dtype=torch.float32)[:, None] * inv_freq
    assert torch.equal(big_cos, angles.cos())
    assert table.cos_sin(50, "cpu", torch.float32)[0] is big_cos


def test_concat_on_device_copies_only_several_parts() -> None:
    a, b = torch.arange(3), torch.arange(2)
    assert concat_on_device([a]) is a
    assert concat_on_device([a, b]).tolist() == [0, 1, 2, 0, 1]
