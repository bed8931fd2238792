"""Walk the seed mixins' capture → replay → postprocess sequence on the CPU.

Each test drives the towers through exactly the attribute paths and calls the
seed mixins (``seeds/000`` and ``seeds/002``) make, with the buffer handling
the manager and the seeds' padding logic perform (zero the capture buffer,
copy the real rows in front, complete ``cu_seqlens`` with one trailing padding
sequence), and checks the result against the host's eager ground truth. If a
generated mixin reproduces the seeds, this is the behaviour it gets.
"""

from __future__ import annotations

import torch

from reference_towers.deepseek_v4 import (
    IMAGE,
    IMAGE_END,
    IMAGE_NEW_LINE,
    build_packed_merge_metadata,
    build_packed_vit_metadata,
)
from reference_towers.registry import REFERENCE_TOWERS

MAX_BATCH_SIZE = 4


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def _replay_into(capture: torch.Tensor, real: torch.Tensor, dim: int = 0) -> None:
    """The manager's default padding: zero, then the real rows in front."""
    capture.zero_()
    capture.narrow(dim, 0, real.shape[dim]).copy_(real)


def _complete_cu_seqlens(capture: torch.Tensor, real: torch.Tensor, total: int) -> None:
    """The seeds' padding: real offsets, then one sequence up to ``total``."""
    n = min(real.shape[0], capture.shape[0])
    capture[:n].copy_(real[:n])
    capture[n:] = total


def test_deepseek_capture_replay_postprocess(deepseek_host):
    tower = REFERENCE_TOWERS["deepseek_v41"]
    host = deepseek_host
    items = [(4, 7), (1, 1), (9, 6)]
    mm_kwargs = tower.make_mm_kwargs(host, items, "cpu", seed=7)
    budget = sum(tower.output_tokens(item) for item in items) + 5

    # Capture (seed: prepare_encoder_cudagraph_capture_inputs).
    r = host.config.vision_downsample_ratio
    p = host.config.vision_patch_size
    per_item = -(-budget // MAX_BATCH_SIZE)
    grids = [[r, r * per_item]] * MAX_BATCH_SIZE
    total = r * r * per_item * MAX_BATCH_SIZE
    dtype = host.aligner.w1.weight.dtype
    meta = build_packed_vit_metadata(
        grids,
        rope_dim=host.vision.rope_dim,
        rope_theta=host.vision.rope_theta,
        device="cpu",
        max_seqlen_override=total,
        cached=False,
    )
    cu_seqlens = torch.full((MAX_BATCH_SIZE + 2,), total, dtype=torch.int32)
    real_offsets = meta.pop("cu_seqlens")
    cu_seqlens[: real_offsets.numel()] = real_offsets
    buffers = {
        "patches": torch.zeros(total, 3, p, p, dtype=dtype),
        **meta,
        "cu_seqlens": cu_seqlens,
        **build_packed_merge_metadata(grids, r, device="cpu", dtype=dtype),
    }
    assert buffers["max_seqlen"].item() == total

    # Replay (seed: prepare_encoder_cudagraph_replay_buffers + padding).
    vit_grid = mm_kwargs["vit_grid"].tolist()
    real = {
        "patches": mm_kwargs["patches"].to(dtype),
        **build_packed_vit_metadata(
            vit_grid,
            rope_dim=host.vision.rope_dim,
            rope_theta=host.vision.rope_theta,
            device="cpu",
        ),
        **build_packed_merge_metadata(vit_grid, r, device="cpu", dtype=dtype),
    }
    for key in ("patches", "vit_cos", "vit_sin", "merge_idx", "merge_mask"):
        _replay_into(buffers[key], real[key])
    _complete_cu_seqlens(buffers["cu_seqlens"], real["cu_seqlens"], total)

    # The graph body (seed: encoder_cudagraph_forward).
    vit_out = host.vision.forward_packed(
        buffers["patches"],
        buffers["vit_cos"],
        buffers["vit_sin"],
        buffers["cu_seqlens"],
        buffers["max_seqlen"],
    )
    rows = host.aligner.forward_packed(
        vit_out, buffers["merge_idx"], buffers["merge_mask"]
    )
    assert rows.shape == (per_item * MAX_BATCH_SIZE, host.config.hidden_size)
    assert torch.isfinite(rows).all()

    # Span assembly (seed: postprocess_encoder_output) as one gather.
    types = mm_kwargs["types"]
    n_rows = sum(lh * lw for lh, lw in mm_kwargs["llm_grid"].tolist())
    is_image = types == IMAGE
    source = torch.where(
        is_image,
        is_image.cumsum(0) - 1,
        n_rows + (types == IMAGE_NEW_LINE).long() + 2 * (types == IMAGE_END).long(),
    )
    delimiters = torch.stack([host.image_start, host.image_newline, host.image_end])
    spans = torch.cat([rows[:n_rows], delimiters.to(rows.dtype)])[source]
    expected = tower.reference_outputs(host, mm_kwargs)
    _close(spans, torch.cat(expected))

    # The eager fallback (seed: encoder_eager_forward) gives the same rows.
    eager = torch.cat(
        [
            host.aligner(host.vision(chunk, h, w), h, w)
            for chunk, (h, w) in zip(
                real["patches"].split([h * w for h, w in vit_grid]),
                vit_grid,
                strict=True,
            )
        ]
    )
    _close(eager, rows[:n_rows])


def test_minimax_capture_replay(minimax_host):
    tower_ref = REFERENCE_TOWERS["minimax_m3"]
    host = minimax_host
    tower = host.vision_tower
    items = [(1, 4, 6), (1, 2, 2), (1, 6, 4)]
    mm_kwargs = tower_ref.make_mm_kwargs(host, items, "cpu", seed=8)
    budget = sum(tower_ref.output_tokens(item) for item in items) + 3

    # Capture (seed: prepare_encoder_cudagraph_capture_inputs).
    m = tower.spatial_merge_size
    per_item = -(-budget // MAX_BATCH_SIZE)
    grids = [[1, m, per_item * m]] * MAX_BATCH_SIZE
    embeddings = tower.vision_model.embeddings
    patch_dim = (
        embeddings.num_channels
        * embeddings.temporal_patch_size
        * embeddings.patch_size**2
    )
    total = sum(t * h * w for t, h, w in grids)
    meta = tower.vision_model.prepare_encoder_metadata(
        grids,
        device="cpu",
        max_batch_size=MAX_BATCH_SIZE + 1,
        max_seqlen_override=total,
    )
    buffers = {
        "pixel_values": torch.zeros(total, patch_dim, dtype=tower.dtype),
        **{k: v for k, v in meta.items() if v is not None},
    }
    assert buffers["cu_seqlens"].shape == (MAX_BATCH_SIZE + 2,)
    assert buffers["rotary_cos"].shape[1] == total

    # Replay (seed: prepare_encoder_cudagraph_replay_buffers + padding).
    grid_list = mm_kwargs["image_grid_thw"].tolist()
    real = tower.vision_model.prepare_encoder_metadata(grid_list, device="cpu")
    real.pop("max_seqlen")  # the captured bound stays
    assert real.pop("sequence_lengths") is None
    _replay_into(buffers["pixel_values"], mm_kwargs["pixel_values"])
    _replay_into(buffers["rotary_cos"], real["rotary_cos"], dim=1)
    _replay_into(buffers["rotary_sin"], real["rotary_sin"], dim=1)
    _complete_cu_seqlens(buffers["cu_seqlens"], real["cu_seqlens"], total)

    # The graph body (seed: encoder_cudagraph_forward).
    pixel_values = buffers.pop("pixel_values")
    out = tower(pixel_values, grid_thw=None, encoder_metadata=buffers)
    assert out.shape == (per_item * MAX_BATCH_SIZE, tower.out_hidden_size)
    assert torch.isfinite(out).all()
    expected = tower_ref.reference_outputs(host, mm_kwargs)
    n_out = sum(e.shape[0] for e in expected)
    _close(out[:n_out], torch.cat(expected))

    # The eager fallback (seed: encoder_eager_forward) on the whole batch.
    eager = tower(
        pixel_values=mm_kwargs["pixel_values"].type(tower.dtype), grid_thw=grid_list
    )
    _close(eager, torch.cat(expected))
