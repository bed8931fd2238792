"""Qwen2.5-VL: vLLM 0.33.0's hand-written mixin (``qwen2_5_vl.py``, on its
tower's own metadata builder, window indices and RoPE gathers) against
``generated/vllm/qwen2_5_vl.py``, method by method, on one fake host.

The battery runs under FlashAttention, with vLLM's fused uint8 input
normalisation, and under FlashInfer (whose two-section ``cu_seqlens`` the
fake attention reads as cuDNN does). Every difference must be one of
``DIFFERENCES``, each listed in docs/vllm-differences.md and shown right by a
test below.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CaptureCase, HostSettings, Plan
from parity_testlib import Difference, check_differences

CASES = (
    CaptureCase(16, 1, 0),
    CaptureCase(32, 4, 0),
    CaptureCase(64, 4, 16),  # videos: 4 frames per item
    CaptureCase(30, 4, 8),  # a budget that 4 items do not divide
    CaptureCase(64, 4, 2),  # fewer frames than items (user-set)
    CaptureCase(48, 3, 12),
    CaptureCase(16, 4, 56),  # more frame slots per item (14) than tokens (4)
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference("qwen2_5_vl.backend-guard", (r"^config\[backend=TORCH_SDPA[,\]]",)),
    Difference(
        "qwen2_5_vl.dummy-frames",
        (
            r"^(fi:)?capture\[b=16,n=4,f=56\]/(values|forward)/",
            r"^(fi:)?replay\[b=16,n=4,f=56,\w+\]\[\d+\]/(captured|calls|cu_seqlens_tail)",
        ),
    ),
    Difference(
        "qwen2_5_vl.video-replay-unpadded",
        (r"replay\[.*,video\]\[\d+\]/replay/(cu_seqlens|sequence_lengths\w*)\.",),
    ),
    Difference(
        "qwen2_5_vl.selected-grid",
        (r"^select\[.*/(selected|reselected)/(image|video)_grid_thw",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("qwen2_5_vl")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    found += hosts.compare_batches(
        model,
        Plan(CASES[:3], seeds=(0,), batch_options=(("raw", True),)),
        HostSettings(fused_input_norm=True),
        prefix="fused:",
    )
    found += hosts.compare_batches(
        model, Plan(CASES, seeds=(1,)), HostSettings(backend="FLASHINFER"), "fi:"
    )
    check_differences("qwen2_5_vl", found, DIFFERENCES)


def test_capture_guards_torch_sdpa_which_vllm_cannot_capture(model, vllm_code) -> None:
    hosts.check_torch_sdpa_guard(model, vllm_code)


def test_selected_grids_stay_tensors_and_work_everywhere(model) -> None:
    hosts.check_selected_grids_work_everywhere(model)


def test_flashinfer_replays_compute_every_row_with_the_right_v_offsets(model) -> None:
    # The battery finds both mixins alike under FlashInfer; here both are
    # also right: a batch with fewer sequences than captured, replayed
    # after a larger one, computes every real row from its own V rows.
    case = CaptureCase(64, 4, 16)
    gen = torch.Generator().manual_seed(4)
    big = model.make_batch(gen, "image", [(1, 4, 4), (1, 6, 2), (1, 2, 8), (1, 4, 2)])
    small = model.make_batch(gen, "image", [(1, 2, 6)])
    for host in model.hosts(HostSettings(backend="FLASHINFER")):
        views = hosts.replay_view(host, case, [big, small])
        eager = hosts.eager_view(host, small)
        assert not views[-1]["violations"]
        for replayed, expected in zip(views[-1]["items"], eager["items"], strict=True):
            assert not replayed.isnan().any()
            assert torch.allclose(replayed, expected)


def test_dummy_frames_stop_at_the_tokens_of_an_item(model) -> None:
    hosts.check_dummy_frames_stop_at_k(model, CASES[-1])
