"""MiniCPM-V's position table under real CUDA graphs (finding 23).

An eager batch with a slice longer than ``Resampler2_5``'s 70 x 70 table
makes ``_adjust_pos_cache`` re-register ``pos_embed`` as a new tensor; the
graphs captured before keep reading the old one's address. The generated
mixin holds that tensor (``capture.keep_alive``), so memory allocated and
filled afterwards cannot land there and later replays stay right. Without
the hold (the control), the same steps put the fill into the graphs' table.

Run with ``PYTHONPATH=. python -m pytest -m gpu tests/gpu``; skipped
without CUDA. The ``tiny`` tower in fp32 (its resampler table is the
released 70 x 70; the bar allows for TF32 convolutions).
"""

from __future__ import annotations

import equivalence_driver as drv
import pytest
import torch

from encoder_cudagraph_runtime.graph_backends import CudaGraphBackend
from reference_towers.registry import REFERENCE_TOWERS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

TOWER = REFERENCE_TOWERS["minicpmv"]
WIDE_SLICE = ((1, 80),)
"""A slice 80 patches wide: past the table (and the tiny side of 34, so the
mixin runs it eagerly)."""
GRAPH_ITEMS = [((3, 5),), ((2, 33), (1, 4), (1, 4)), ((33, 2),)]
"""Items of the 32 x 32, 32 x 64 and 64 x 32 keys."""


def _replay_after_the_table_is_replaced(keep: bool):
    device = torch.device("cuda", torch.cuda.current_device())
    host = drv.build_host("minicpmv", "tiny", device=device, dtype=torch.float32)
    manager = drv.build_manager(
        host,
        drv.build_vllm_config("tiny", token_budgets=[256], max_items_per_batch=4),
        device=device,
        dtype=torch.float32,
        graph_backend=CudaGraphBackend(device),
    )
    manager.capture()
    if not keep:
        host.__dict__["_encoder_cg_keep_alive"].clear()
    old = host.resampler.pos_embed
    shape, dtype = old.shape, old.dtype
    del old
    manager.execute(TOWER.make_mm_kwargs(host, [WIDE_SLICE], device, seed=1))
    assert host.resampler.max_size == (70, 80)
    assert host.resampler.pos_embed.shape[:2] == (70, 80)
    # Memory of the old table's size, filled: where the allocator reuses a
    # freed block, the graphs read this.
    fill = [
        torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(64)
    ]
    torch.cuda.synchronize(device)
    mm_kwargs = TOWER.make_mm_kwargs(host, GRAPH_ITEMS, device, seed=2)
    outputs = [out.clone() for out in manager.execute(mm_kwargs)]
    refs = TOWER.reference_outputs(host, mm_kwargs)
    hits = manager.get_cumulative_stats()["graph_hits"]
    del fill
    manager.clear()
    return outputs, refs, hits


def test_replays_after_an_eager_call_regrows_the_table_stay_right():
    outputs, refs, hits = _replay_after_the_table_is_replaced(keep=True)
    assert hits == len(GRAPH_ITEMS)
    for out, ref in zip(outputs, refs, strict=True):
        assert torch.isfinite(out).all()
        scale = max(1.0, ref.float().abs().max().item())
        assert (out.float() - ref.float()).abs().max().item() <= 1e-2 * scale


def test_without_the_hold_the_graphs_read_the_freed_table():
    """The control: the fill reaches the table the graphs captured."""
    outputs, _, _ = _replay_after_the_table_is_replaced(keep=False)
    assert any(not torch.isfinite(out).all() for out in outputs)
