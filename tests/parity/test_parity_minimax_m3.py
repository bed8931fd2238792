"""MiniMax M3: vLLM 0.33.0's hand-written mixin
(``vllm/models/minimax_m3/common/encoder_cudagraph.py``, on its tower's own
``prepare_encoder_metadata``) against ``generated/vllm/minimax_m3.py``.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown by a test below.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CPU, CaptureCase, Plan
from parity_testlib import Difference, check_differences, copy_replay_into_captured

CASES = (
    CaptureCase(16, 1, 0),
    CaptureCase(32, 4, 0),
    CaptureCase(30, 4, 0),  # a budget that 4 items do not divide
    CaptureCase(64, 3, 0),
)
#: 4 items per batch: 6 captured cu_seqlens slots (5 offsets and a spare).
EDGE = CaptureCase(64, 4, 0)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "minimax_m3.error-messages",
        (
            r"^config\[[^\]]*fp8=dynamic[^\]]*\]\.message$",
            r"^padding\[.*\]/unregistered\.message$",
        ),
    ),
    Difference(
        "minimax_m3.replay-none-buffers",
        (r"replay\[.*\]\[\d+\]/replay(\.keys|/sequence_lengths)$",),
    ),
    Difference(
        "minimax_m3.cu-seqlens-strict",
        (r"^padding\[.*\]/no-spare-slot\.",),
    ),
    Difference(
        "minimax_m3.capture-metadata-call",
        (r"^metadata\[.*\]/capture(\.keys|/max_batch_size)$",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("minimax_m3")


def _batch(grids, seed: int = 0) -> dict:
    return hosts.parity("minimax_m3").make_batch(
        torch.Generator().manual_seed(seed), "image", grids
    )


def _metadata_calls(host, case: CaptureCase) -> dict:
    """The tower builder's arguments at capture and at replay."""
    vit = host.vision_tower.vision_model
    vit.metadata_calls.clear()
    host.prepare_encoder_cudagraph_capture_inputs(
        case.budget, case.max_batch_size, 0, CPU, torch.float32
    )
    host.prepare_encoder_cudagraph_replay_buffers(
        _batch([(1, 4, 2), (1, 2, 2)]), case.max_batch_size, 0
    )
    capture, replay = vit.metadata_calls
    return {"capture": capture, "replay": replay}


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    # Pixels may arrive as one tensor per image.
    found += hosts.compare_batches(
        model,
        Plan(CASES[1:3], seeds=(1, 2), batch_options=(("as_list", True),)),
        prefix="list:",
    )
    found += hosts.compare_padding_edges(model, EDGE)
    for case in CASES:
        found += hosts.compare(
            model, f"metadata[{case.label}]", lambda h, c=case: _metadata_calls(h, c)
        )
    check_differences("minimax_m3", found, DIFFERENCES)


def test_refusals_are_vllms_and_say_why(model) -> None:
    """The same refusals with the same exception types, each naming the
    option that lifts it; only dynamic FP8's message differs: ours adds why
    it cannot be captured."""
    differing = hosts.check_refusals_name_the_same_fix(model)
    assert set(differing) == {
        hosts.settings_label(hosts.HostSettings(backend=b, fp8="dynamic"))
        for b in hosts.BACKENDS
    }
    for theirs, ours in differing.values():
        assert "amax history on the host" in ours
        assert "amax" not in theirs


def test_a_none_replay_buffer_is_one_the_manager_skips(model) -> None:
    """vLLM's replay returns the tower's ``sequence_lengths: None`` (it is
    only built under FlashInfer, which both refuse), ours leaves the key
    out; the manager skips ``None`` and copies only captured keys, and
    neither capture has it: the captured buffers are the same."""
    batch = _batch([(1, 4, 2), (1, 2, 6)])
    captured = []
    for host in model.hosts():
        values = host.prepare_encoder_cudagraph_capture_inputs(
            EDGE.budget, EDGE.max_batch_size, 0, CPU, torch.float32
        ).values
        assert "sequence_lengths" not in values
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 4, 0).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), values, replay)
        captured.append((replay, values))
    (vllm_replay, theirs), (our_replay, ours) = captured
    assert "sequence_lengths" in vllm_replay and vllm_replay["sequence_lengths"] is None
    assert "sequence_lengths" not in our_replay
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_padding_refuses_offsets_without_a_spare_slot(model) -> None:
    """4 items per batch capture 6 offsets: 5 and the spare slot the padding
    sequence needs. A manager never sends more than 4 items (5 offsets);
    given 6, vLLM copies them and leaves the last offset below the captured
    rows (the rows its own comment says FlashAttention returns NaN for),
    ours refuses. A buffer no capture returned is refused by both."""
    vllm_view, our_view = (
        hosts.padding_edges_view(host, EDGE, "cu_seqlens") for host in model.hosts()
    )
    assert vllm_view["no-spare-slot"].tolist() == list(range(6))
    assert our_view["no-spare-slot"].type_name == "RuntimeError"
    assert "leave no spare slot" in our_view["no-spare-slot"].message
    assert vllm_view["unregistered"].type_name == "RuntimeError"
    assert our_view["unregistered"].type_name == "RuntimeError"
    # With the most items a manager sends, both close the batch alike.
    for host in model.hosts():
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            EDGE.budget, EDGE.max_batch_size, 0, CPU, torch.float32
        ).values
        pad = host.get_encoder_cudagraph_config().padding_logics["cu_seqlens"]
        pad(captured["cu_seqlens"], torch.arange(5, dtype=torch.int32))
        rows = captured["pixel_values"].shape[0]
        assert captured["cu_seqlens"].tolist() == [0, 1, 2, 3, 4, rows]


def test_capture_builds_the_same_offsets_with_its_own_spare_slot(model) -> None:
    """vLLM has the tower pad ``cu_seqlens`` to ``max_batch_size + 1``
    sequences; ours builds the dummy's own offsets and adds the spare slot
    itself, as vLLM's DeepSeek-V4.1 mixin does: the same buffer."""
    vllm_host, ours = model.hosts()
    assert _metadata_calls(vllm_host, EDGE)["capture"]["max_batch_size"] == 5
    assert "max_batch_size" not in _metadata_calls(ours, EDGE)["capture"]
    theirs, mine = (
        host.prepare_encoder_cudagraph_capture_inputs(
            EDGE.budget, EDGE.max_batch_size, 0, CPU, torch.float32
        ).values["cu_seqlens"]
        for host in (vllm_host, ours)
    )
    assert torch.equal(theirs, mine) and theirs.shape == (6,)
