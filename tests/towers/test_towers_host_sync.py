"""The seed towers never make the host wait for the device on the paths the
benchmarks time.

vLLM hands a model its pixels on the device, in the model dtype, and its
grids on the CPU (``keep_on_cpu``); its metadata builders ship host data
with ``async_tensor_h2d`` (pinned memory, ``non_blocking``). A benchmark
whose inputs or towers do otherwise times host synchronisations that vLLM
never pays (run A of 2026-12-01 saw MiniMax M3's model code wait 30 ms for
queued work in every execute). Checked here on the CPU, with the meta device
standing in for the GPU (it holds no data, so any host read of a device
tensor fails) and a :class:`HostSyncRecorder` watching every host-to-device
copy:

* ``make_mm_kwargs`` places each seed's inputs as vLLM does;
* the replay path as the manager drives it (item specs, selection, replay
  buffers, replay copy, the captured forward, postprocess) and the eager
  forward read nothing back and copy only through ``async_tensor_h2d``,
  for grids the towers' caches have never seen and again for grids they
  hold;
* every replay buffer is on the device in its captured buffer's dtype, so
  the manager's replay copy is a copy, never a conversion.

The attention kernels (the runtime's) are replaced by a stand-in of the same
shape; ``test_replay_path_never_synchronises_on_cuda`` (``-m gpu``) runs the
real ones under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from tower_testlib import HostSyncRecorder, manager_for, shapes_only_attention

import reference_towers._layers as layers
import reference_towers.deepseek_v4 as dsv4
from reference_towers.registry import REFERENCE_TOWERS, Item, generated_mixin

DTYPE = torch.bfloat16
"""The GPU runs' dtype; the tiny towers' fp32 would hide a missing cast."""

META = torch.device("meta")


@dataclass(frozen=True)
class Case:
    """One seed batch and where vLLM puts each of its ``mm_kwargs``."""

    stem: str
    modality: str
    items: tuple[Item, ...]
    device_keys: tuple[str, ...]
    """Pixels: on the device, in the model dtype."""
    host_keys: tuple[str, ...]
    """Grids and other metadata: int64 on the CPU."""

    @property
    def id(self) -> str:
        return f"{self.stem}-{self.modality}"


CASES = (
    Case(
        "deepseek_v41",
        "image",
        ((4, 7), (1, 1), (9, 6), (4, 7)),
        ("patches",),
        ("vit_grid", "llm_grid", "types"),
    ),
    Case(
        "minimax_m3",
        "image",
        ((1, 4, 6), (1, 2, 2), (1, 6, 4), (1, 4, 6)),
        ("pixel_values",),
        ("image_grid_thw",),
    ),
    Case(
        "qwen2_vl",
        "image",
        ((1, 4, 6), (1, 2, 2), (1, 6, 4), (1, 4, 6)),
        ("pixel_values",),
        ("image_grid_thw",),
    ),
    Case(
        "qwen2_vl",
        "video",
        ((2, 2, 4), (1, 2, 2), (3, 4, 2)),
        ("pixel_values_videos",),
        ("video_grid_thw",),
    ),
)


@pytest.fixture(autouse=True)
def _fresh_deepseek_caches() -> Iterator[None]:
    """DeepSeek-V4.1's per-grid tables are module-wide: empty them, so the
    first pass of a test meets grids it has never seen (the other towers'
    caches belong to their fresh hosts)."""
    dsv4._VIT_ROWS.clear()
    dsv4._MERGE_TABLES.clear()
    dsv4._vit_angle_table.cache_clear()
    yield


def _meta_host(case: Case) -> Any:
    tower = REFERENCE_TOWERS[case.stem]
    assert all(tower.is_legal(i, "tiny", modality=case.modality) for i in case.items)
    return tower.build_host(
        generated_mixin(case.stem), "tiny", device=META, dtype=DTYPE
    )


def _mm_kwargs(case: Case, host: Any, device: torch.device) -> dict[str, Any]:
    tower = REFERENCE_TOWERS[case.stem]
    return tower.make_mm_kwargs(
        host, list(case.items), device, seed=3, modality=case.modality
    )


def _capture_frames(case: Case) -> int:
    """Frame slots of a video graph the batch fits with one to spare; 0 for
    images."""
    if case.modality != "video":
        return 0
    return sum(item[0] for item in case.items) + 1


@dataclass(frozen=True)
class Capture:
    """One captured graph's buffers and the limits they were sized for."""

    buffers: dict[str, Any]
    max_batch_size: int
    max_frames: int


def _capture(case: Case, host: Any, device: torch.device) -> Capture:
    """Buffers of a graph the batch fits, one item and frame slot to spare
    (so every padding logic pads)."""
    tower = REFERENCE_TOWERS[case.stem]
    budget = sum(tower.budget_tokens(item) for item in case.items)
    max_batch = len(case.items) + 1
    max_frames = _capture_frames(case)
    buffers = host.prepare_encoder_cudagraph_capture_inputs(
        budget, max_batch, max_frames, device, DTYPE, "default", ()
    ).values
    return Capture(dict(buffers), max_batch, max_frames)


def _replay_copy(host: Any, buffers: dict[str, Any], values: dict[str, Any]) -> None:
    """The manager's replay copy (its plain form): padding logic, or the
    rows in front and zeros behind."""
    logics = host.get_encoder_cudagraph_config().padding_logics
    for key, buf in buffers.items():
        src = values.get(key)
        if src is None:
            continue
        if src.ndim == 0:
            buf.copy_(src)
        elif key in logics:
            logics[key](buf, src)
        else:
            buf.zero_()
            buf[: src.shape[0]].copy_(src)


def _replay(case: Case, host: Any, kw: dict[str, Any], capture: Capture) -> dict:
    """One execute's replay path, the items in reverse order (a selection
    that moves rows); returns the replay buffers."""
    specs = host.get_encoder_cudagraph_item_specs(kw)
    order = list(reversed(range(len(specs))))
    selected = host.select_encoder_cudagraph_items(kw, order)
    values = host.prepare_encoder_cudagraph_replay_buffers(
        selected, capture.max_batch_size, capture.max_frames, "default"
    ).values
    _replay_copy(host, capture.buffers, values)
    with torch.inference_mode():
        out = host.encoder_cudagraph_forward({**capture.buffers}, path="default")
    dest: list[Any] = [None] * len(specs)
    host.postprocess_encoder_output(
        {"default": out},
        order,
        [s.output_tokens for s in specs],
        dest,
        clone=True,
        batch_mm_kwargs=selected,
    )
    assert all(d is not None and d.device == out.device for d in dest)
    return dict(values)


def _eager(host: Any, kw: dict[str, Any]) -> None:
    """The eager forward and postprocess, as the benchmarks' baseline runs."""
    specs = host.get_encoder_cudagraph_item_specs(kw)
    with torch.inference_mode():
        out = host.encoder_eager_forward(kw, path="default")
    dest: list[Any] = [None] * len(specs)
    host.postprocess_encoder_output(
        {"default": out},
        list(range(len(specs))),
        [s.output_tokens for s in specs],
        dest,
        batch_mm_kwargs=kw,
    )
    assert all(d is not None and d.device == out.device for d in dest)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_mm_kwargs_are_placed_as_vllm_places_them(case):
    kw = _mm_kwargs(case, _meta_host(case), META)
    assert set(kw) == {*case.device_keys, *case.host_keys}
    for key in case.device_keys:
        assert (kw[key].device, kw[key].dtype) == (META, DTYPE), key
    for key in case.host_keys:
        assert (kw[key].device.type, kw[key].dtype) == ("cpu", torch.int64), key


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_replay_path_stays_off_the_host(case, monkeypatch):
    monkeypatch.setattr(layers, "varlen_attention", shapes_only_attention)
    host = _meta_host(case)
    capture = _capture(case, host, META)
    kw = _mm_kwargs(case, host, META)
    for rerun in ("new grids", "cached grids"):
        recorder = HostSyncRecorder(monkeypatch)
        with recorder:
            values = _replay(case, host, kw, capture)
        assert recorder.blocking == [], rerun
        # Not vacuous: cu_seqlens at least went through async_tensor_h2d.
        assert recorder.transfers, rerun
        for key, value in values.items():
            buf = capture.buffers[key]
            assert value.device == META, key
            assert value.dtype == buf.dtype, key


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_eager_forward_stays_off_the_host(case, monkeypatch):
    monkeypatch.setattr(layers, "varlen_attention", shapes_only_attention)
    host = _meta_host(case)
    kw = _mm_kwargs(case, host, META)
    for rerun in ("new grids", "cached grids"):
        recorder = HostSyncRecorder(monkeypatch)
        with recorder:
            _eager(host, kw)
        assert recorder.blocking == [], rerun
        assert recorder.transfers, rerun


def test_recorder_catches_what_blocks(monkeypatch):
    """The recorder itself: each way of waiting for the device is caught."""
    recorder = HostSyncRecorder(monkeypatch)
    on_device = torch.zeros(3, device=META)
    with recorder:
        with pytest.raises(AssertionError, match="_local_scalar_dense"):
            on_device.sum().item()
        with pytest.raises(AssertionError, match="_to_copy"):
            on_device.cpu()
        torch.tensor([0, 3], device=META)
        torch.arange(3).to(META)
        on_device.copy_(torch.ones(3))
        torch.arange(3).to(META, non_blocking=True)
        dsv4.async_tensor_h2d([0, 3], META, dtype=torch.int32)
        torch.arange(2, device=META) * 3
    ops = [(t.op, t.staged, t.non_blocking, t.blocks) for t in recorder.transfers]
    assert ops == [
        ("torch.tensor", False, False, True),
        ("aten::_to_copy", False, False, True),
        ("aten::copy_", False, False, True),
        ("aten::_to_copy", False, True, True),
        ("aten::_to_copy", True, True, False),
    ]
    assert recorder.transfers[0].where.startswith("towers/test_towers_host_sync.py")


# -- GPU -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_replay_path_never_synchronises_on_cuda(case):
    """The real kernels: one warm-up execute, then the replay path and the
    eager forward of grids never seen, and again of the same grids, with
    every synchronising CUDA call raising."""
    from encoder_cudagraph_runtime.graph_backends import CudaGraphBackend

    tower = REFERENCE_TOWERS[case.stem]
    device = torch.device("cuda", torch.cuda.current_device())
    host = tower.build_host(
        generated_mixin(case.stem), "tiny", device=device, dtype=DTYPE
    )
    # One graph the batch fits with room to spare (the models' smallest
    # budget is 64), so that capture stays cheap and every execute replays.
    budget = max(64, 2 * sum(tower.budget_tokens(item) for item in case.items))
    manager = manager_for(
        host,
        budget,
        token_budgets=(budget,),
        max_items_per_batch=len(case.items) + 1,
        max_frames_per_batch=_capture_frames(case) or None,
        device=device,
        dtype=DTYPE,
        graph_backend=CudaGraphBackend(device),
    )
    rng = random.Random(5)
    warm = [tower.sample_item(rng, "tiny", modality=case.modality)]
    manager.execute(
        tower.make_mm_kwargs(host, warm, device, seed=1, modality=case.modality)
    )
    kw = _mm_kwargs(case, host, device)
    expected = tower.reference_outputs(host, kw)
    torch.cuda.synchronize(device)
    for _ in ("new grids", "cached grids"):
        torch.cuda.set_sync_debug_mode("error")
        try:
            outputs = manager.execute(kw)
            _eager(host, kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert manager.graph_hits > 0
        for out, ref in zip(outputs, expected, strict=True):
            scale = max(1.0, ref.abs().max().item())
            assert (out.float() - ref.float()).abs().max().item() <= 2e-2 * scale
