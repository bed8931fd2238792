"""MiniCPM-V 2.6: vLLM 0.33.0's hand-written mixin (``minicpmv.py``, with its
select-time repacking, the base model's input parsing and 2.6's
``get_vision_hidden_states``) against ``generated/vllm/minicpmv.py``, whose
spec packs the slices into the key's patch grid in replay steps. The fake
tower keeps the patch order (row-major over each image's patch grid) and the
fake resampler weights the patches by their place, so a slice packed into
the wrong cells gives other rows.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from encoder_cudagraph_runtime.defs import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
from parity_hosts import CPU, CaptureCase, HostSettings, Plan
from parity_testlib import Difference, check_differences, copy_replay_into_captured

Q = hosts.MINICPMV_QUERIES

CASES = (
    CaptureCase(Q, 1, 1),
    CaptureCase(4 * Q, 2, 2),
    CaptureCase(20 * Q, 1, 1),  # more slices than vLLM's max_slice_num clamp
)

DIFFERENCES = (
    Difference(
        "minicpmv.capture-slices",
        (
            r"^capture\[b=1280,[^]]*\]/",
            r"^replay\[b=1280,[^]]*\]\[\d+\]/(calls\[\d+\]|captured)/",
        ),
    ),
    Difference(
        "minicpmv.selection",
        (r"^select\[[^]]*\]\]/(selected|reselected)[./]",),
    ),
    Difference(
        "minicpmv.wide-slices-eager",
        (r"^(select\[[^]]*\]\]/)?specs(\[[^]]*\])?\[\d+\]\[2\](\.keys|/default)$",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("minicpmv")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("minicpmv", found, DIFFERENCES)


@pytest.mark.parametrize(
    ("version", "modalities", "tgt_to_tower"),
    [((2, 5), ["image"], False), ((2, 6), ["image", "video"], True)],
)
def test_versions_configs_and_the_towers_tgt_sizes(
    model, version, modalities, tgt_to_tower
) -> None:
    # 2.5 shares the mixin without video, and its tower takes tgt_sizes=None.
    batch = hosts.minicpmv_batch(torch.Generator(), "image", [((4, 6), (3, 2))])
    for host_class in (model.vllm_host, model.our_host):
        host = hosts.minicpmv_parity_host(host_class, version=version)
        assert host.get_encoder_cudagraph_config().modalities == modalities
        selected = host.select_encoder_cudagraph_items(batch, [0])
        keys = selected.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG)
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            Q * 2, 1, 1, CPU, torch.float32, "default", keys
        ).values
        replay = host.prepare_encoder_cudagraph_replay_buffers(selected, 1, 1).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
        host.vpm.reset()
        host.encoder_cudagraph_forward(dict(captured))
        (call,) = host.vpm.calls
        assert (call["tgt_sizes"] is not None) == tgt_to_tower


def test_slices_beyond_the_config_clamp_replay(model) -> None:
    # Finding 9's batch: budgets [2048], one item per batch and one frame per
    # video (the default video limit), an image of 16 slices and its
    # thumbnail (a request's max_slice_nums): vLLM's graphs hold
    # max_batch_size * (max_slice_num + 1) = 10 slices and its replay copy
    # raises; ours hold every slice the budget can bring (2048 // 64) and
    # give the eager path's rows.
    gen = torch.Generator().manual_seed(3)
    batch = hosts.minicpmv_batch(gen, "image", [((8, 8),) * 17])
    rows = {}
    for host_class in (model.vllm_host, model.our_host):
        host = hosts.minicpmv_parity_host(
            host_class, HostSettings(max_frames_per_video=1)
        )
        manager = hosts.runtime_manager(host, [2048], 1)
        manager.capture()
        if host_class is model.vllm_host:
            with pytest.raises(RuntimeError, match="must match the size"):
                manager.execute(batch)
            rows["eager"] = host.encoder_eager_forward(batch)
            continue
        for graph in manager.budget_graphs["default"].values():
            assert graph.input_buffers["minicpmv_pixel_values"].shape[0] == 32
        (rows["graph"],) = manager.execute(batch)
        assert manager.graph_hits == 1
    assert torch.equal(rows["graph"], rows["eager"])


def test_the_selection_is_a_subset_that_replays_the_same_buffers(model) -> None:
    # vLLM's selection passes every key through, adds the slices repacked on
    # the device (F.fold, one launch per slice) and the resolved key under
    # two private keys, and gives tgt_sizes as a list per item. Ours is the
    # chosen items' own slices and their tgt_sizes rows (an int64 host
    # tensor, the processor's type); the packing runs in replay steps, and
    # the buffers the manager copies are vLLM's, value for value.
    gen = torch.Generator().manual_seed(7)
    batch = hosts.minicpmv_batch(
        gen, "image", [((5, 9), (30, 60)), ((2, 70),), ((40, 3),)]
    )
    vllm_host, ours = model.hosts()
    for indices in ([2, 0], [1], [0, 1, 2]):
        theirs = vllm_host.select_encoder_cudagraph_items(batch, indices)
        mine = ours.select_encoder_cudagraph_items(batch, indices)
        assert set(theirs) - set(mine) == {
            "minicpmv_encoder_input_flat",
            "minicpmv_encoder_patch_grid",
        }
        assert set(mine) == {
            "pixel_values",
            "tgt_sizes",
            ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
        }
        assert all(
            a is b
            for i, units in zip(indices, mine["pixel_values"], strict=True)
            for a, b in zip(units, batch["pixel_values"][i], strict=True)
        )
        assert mine["tgt_sizes"].dtype == torch.int64
        assert mine["tgt_sizes"].tolist() == torch.cat(theirs["tgt_sizes"]).tolist()
        keys = mine.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG)
        assert theirs.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG) == keys
        a = vllm_host.prepare_encoder_cudagraph_replay_buffers(theirs, 1, 1).values
        b = ours.prepare_encoder_cudagraph_replay_buffers(mine, 1, 1).values
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def _real_resampler_host(host_class: type, monkeypatch):
    """A host whose resampler is vLLM's Resampler2_5 (4 queries, the 70 x 70
    sincos table), its fake tower giving the resampler's width. (The CPU
    build of torch has no stream to ask whether it captures: none does.)"""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    host = hosts.minicpmv_parity_host(host_class)
    host.resampler = hosts.minicpmv_resampler(width=hosts.WIDTH, queries=4)
    host.config.query_num = 4
    return host


def test_a_slice_wider_than_the_table_runs_eagerly(model, monkeypatch) -> None:
    # Finding 23: a 14 x 71 slice (a 5:1 image's thumbnail) fits no key;
    # vLLM's selection falls back to (70, 70) and its graph clamps the
    # positions past column 69. Ours sends the item to the eager forward
    # (budget tokens above every budget, its real output tokens), which
    # grows the table and gives vLLM's eager rows.
    batch = hosts.minicpmv_batch(
        torch.Generator().manual_seed(1), "image", [((14, 71),)]
    )
    vllm_host = _real_resampler_host(model.vllm_host, monkeypatch)
    ours = _real_resampler_host(model.our_host, monkeypatch)
    (spec,) = ours.get_encoder_cudagraph_item_specs(batch)
    assert spec.output_tokens == 4
    assert spec.get_path_output_tokens("default") > 2**40
    theirs = vllm_host.select_encoder_cudagraph_items(batch, [0])
    assert theirs[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] == ((70, 70),)
    manager = hosts.runtime_manager(ours, [64], 1)
    manager.capture()
    with torch.no_grad():
        (rows,) = manager.execute(batch)
        eager = vllm_host.encoder_eager_forward(batch)
    assert manager.graph_hits == 0 and manager.graph_misses == 1
    assert torch.allclose(rows, eager, atol=1e-6)


def test_the_graphs_keep_the_table_an_eager_call_replaces(model, monkeypatch) -> None:
    # The eager forward of a wide slice re-registers the resampler's
    # pos_embed (_adjust_pos_cache); the captured graphs read the old table
    # by address. The generated capture holds it (capture.keep_alive), so its
    # memory is never handed to another tensor, and its values are the new
    # table's top-left block: every later replay reads what it captured.
    host = _real_resampler_host(model.our_host, monkeypatch)
    captured_table = host.resampler.pos_embed
    host.prepare_encoder_cudagraph_capture_inputs(
        8, 1, 1, CPU, torch.float32, "default", ((32, 32),)
    )
    wide = hosts.minicpmv_batch(torch.Generator(), "image", [((14, 71),)])
    with torch.no_grad():
        host.encoder_eager_forward(wide)
    table = host.resampler.pos_embed
    assert table is not captured_table and table.shape[:2] == (70, 71)
    (held,) = host.__dict__["_encoder_cg_keep_alive"].values()
    assert held is captured_table
    assert torch.equal(table[:70, :70], held)


@pytest.mark.parametrize(
    ("which", "finite"), [("vllm_host", False), ("our_host", True)]
)
def test_the_graphs_padded_slots_write_no_nan(
    model, monkeypatch, which, finite
) -> None:
    # Finding 25: a slot the batch leaves empty replays with tgt_sizes (0, 0),
    # so Resampler2_5's key padding mask is all True and
    # nn.MultiheadAttention writes NaN rows for it (vLLM's graphs). Ours gives
    # the resampler the sizes clamped to one patch: finite rows, and the
    # item's rows unchanged.
    host = _real_resampler_host(getattr(model, which), monkeypatch)
    batch = hosts.minicpmv_batch(torch.Generator().manual_seed(2), "image", [((3, 5),)])
    manager = hosts.runtime_manager(host, [8], 2)
    manager.capture()
    with torch.no_grad():
        (rows,) = manager.execute(batch)
        eager = host.encoder_eager_forward(batch)
    assert manager.graph_hits == 1
    assert torch.allclose(rows, eager, atol=1e-5)
    # The (32, 32) key's graph, the one a 3 x 5 slice replays: 2 slots.
    graph = manager.budget_graphs["default"][(8, ((32, 32),))]
    assert torch.isfinite(graph.output_buffer[:4]).all()
    assert bool(torch.isfinite(graph.output_buffer[4:]).all()) is finite
