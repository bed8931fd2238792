"""Gemma 4: vLLM 0.33.0's hand-written mixin (``gemma4_mm.py``, on vLLM's
own eager image path) against ``generated/vllm/gemma4_mm.py``, whose spec
reads the images as padded inputs (a list of per-image rows or one tensor)
and captures one graph per budget and row width, images only.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from generator.diagnostics import SpecError
from generator.resolve import load_spec
from parity_hosts import CaptureCase, Plan
from parity_testlib import (
    REPO,
    Difference,
    check_differences,
    copy_replay_into_captured,
)

CASES = (
    CaptureCase(280, 1, 0),
    CaptureCase(600, 4, 0),
    CaptureCase(1200, 8, 0),
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "gemma4_mm.images-only",
        (r"^config\[[^]]*\]/(modalities|max_frames_per_video)",),
    ),
    Difference(
        "gemma4_mm.widest-key-budget",
        (
            r"^budget_range\[",
            r"^specs\[",
            r"^select\[.*\]/specs\[",
            r"^(lists,)?capture\[[^]]*\]/values/(pixel_values|pixel_position_ids)\.",
            r"^(lists,)?replay\[.*\]/captured/(pixel_values|pixel_position_ids)\.",
        ),
    ),
    Difference(
        "gemma4_mm.capture-gather",
        (r"^(lists,)?capture\[[^]]*\]/values/gather_indices\.values$",),
    ),
    Difference(
        "gemma4_mm.empty-selection-key",
        (
            r"^select\[(lists,)?image,seed=\d+,\[\]\]/selected/encoder_cudagraph_axis_keys",
        ),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("gemma4_mm")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    found += hosts.compare_batches(
        model, Plan(CASES, batch_options=(("lists", True),)), prefix="lists,"
    )
    check_differences("gemma4_mm", found, DIFFERENCES)


def test_videos_are_left_to_the_eager_path(model) -> None:
    # Ours captures images only: vLLM's runner sends a modality the config
    # does not list to the eager path, which keeps each frame's valid slots.
    vllm_host, ours = model.hosts()
    assert ours.get_encoder_cudagraph_config().modalities == ["image"]
    assert vllm_host.get_encoder_cudagraph_config().modalities == ["image", "video"]
    # vLLM's video graph gathers every frame's 70 slots (finding 8): the
    # 2-frame video of 64-token frames has 140 graph rows for 128 prompt
    # placeholders, frame 0's empty slots 64..69 before frame 1's first.
    pixels, positions = hosts.gemma4_frames([(24, 24), (24, 24)], 70)
    video = {
        "pixel_values_videos": pixels,
        "pixel_position_ids_videos": positions,
        "video_frame_counts": torch.tensor([2]),
    }
    (spec,) = vllm_host.get_encoder_cudagraph_item_specs(video)
    assert spec.output_tokens == 140
    gather = vllm_host.prepare_encoder_cudagraph_replay_buffers(video, 1, 32).values[
        "gather_indices"
    ]
    valid = (positions != -1).all(-1).reshape(2, 70, 9).any(-1).reshape(-1)
    assert not valid[gather[64:70]].any()


def test_every_image_counts_the_widest_key(model, tmp_path) -> None:
    # Four 70-token images: vLLM packs a list batch by its widest image (70
    # each, 280 in all) into one budget-280 graph of width 70; ours counts
    # every image as the widest key (280): one image per budget-280 graph.
    # Each image gets the same rows either way.
    vllm_host, ours = model.hosts()
    batch = hosts.gemma4_batch(
        torch.Generator().manual_seed(3), "image", [(10, 10, 70)] * 4, lists=True
    )
    counted = [
        [s.get_path_output_tokens("default") for s in specs]
        for specs in map(
            lambda h: h.get_encoder_cudagraph_item_specs(batch), (vllm_host, ours)
        )
    ]
    assert counted == [[70] * 4, [280] * 4]
    rows = {}
    for host, indices in ((vllm_host, [0, 1, 2, 3]), (ours, [2])):
        picked = host.select_encoder_cudagraph_items(batch, indices)
        keys = picked.pop("encoder_cudagraph_axis_keys")
        assert keys == (70,)
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            280, 8, 0, torch.device("cpu"), torch.float32, "default", keys
        ).values
        replay = host.prepare_encoder_cudagraph_replay_buffers(picked, 8, 0).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
        out = host.encoder_cudagraph_forward(dict(captured))
        start = 70 * indices.index(2)
        rows[host is ours] = out[start : start + 70]
    assert torch.equal(rows[False], rows[True])
    # Counting each image by its own width instead is what the coverage
    # check refuses: the graph of width 70 holds token_budget // 280 rows.
    text = (REPO / "specs" / "gemma4_mm.yaml").read_text(encoding="utf-8")
    own = tmp_path / "gemma4_own_width.yaml"
    own.write_text(
        text.replace("  budget_tokens: m\n", "  budget_tokens: p // kernel**2\n")
    )
    with pytest.raises(SpecError, match="a graph takes only the items its key covers"):
        load_spec(own)


def test_capture_gather_values_never_reach_a_replay(model) -> None:
    # vLLM captures zeros, ours the dummy rows' own slots; every replay
    # overwrites the whole buffer (the batch's indices, then zeros).
    vllm_host, ours = model.hosts()
    batch = hosts.gemma4_batch(
        torch.Generator().manual_seed(4), "image", [(20, 30, 280), (5, 7, 280)]
    )
    seen = []
    for host in (vllm_host, ours):
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            1200, 8, 0, torch.device("cpu"), torch.float32, "default", (280,)
        ).values
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 8, 0).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
        seen.append(captured["gather_indices"])
    assert torch.equal(seen[0], seen[1])


def test_an_empty_selection_replays_a_captured_key(model) -> None:
    # vLLM's key of an empty list selection is (0,), which no graph has;
    # ours is the first captured key, as for every selection.
    vllm_host, ours = model.hosts()
    batch = hosts.gemma4_batch(
        torch.Generator().manual_seed(5), "image", [(4, 4, 70), (9, 9, 140)]
    )
    (widths,) = ours.get_encoder_cudagraph_config().capture_axes
    theirs = vllm_host.select_encoder_cudagraph_items(batch, [])
    mine = ours.select_encoder_cudagraph_items(batch, [])
    assert theirs["encoder_cudagraph_axis_keys"] == (0,) and 0 not in widths
    assert mine["encoder_cudagraph_axis_keys"] == (widths[0],)


def test_an_image_wider_than_every_key_runs_eagerly(model) -> None:
    # Finding 7's image: a request-level max_soft_tokens of 560 above the
    # model's 280. vLLM's manager finds no graph for its key (560,) and
    # stops; ours counts it above every budget, so the manager runs it on
    # the eager path, with the eager path's rows.
    vllm_host, ours = model.hosts()
    pixels, positions = hosts.gemma4_frames([(60, 60)], 560)
    batch = {"pixel_values": list(pixels), "pixel_position_ids": list(positions)}
    (spec,) = ours.get_encoder_cudagraph_item_specs(batch)
    assert spec.output_tokens == 560 and spec.get_path_output_tokens("default") > 2**40
    manager = hosts.runtime_manager(ours, [560], 1)
    manager.capture()
    (rows,) = manager.execute(batch)
    assert manager.graph_hits == 0
    assert torch.equal(rows, vllm_host.encoder_eager_forward(batch))
