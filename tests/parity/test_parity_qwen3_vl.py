"""Qwen3-VL: vLLM 0.33.0's hand-written mixin (``qwen3_vl.py``, on its
tower's own metadata builder, position interpolation and RoPE ids) against
``generated/vllm/qwen3_vl.py``, method by method, on one fake host.

The battery runs under FlashAttention, with vLLM's fused uint8 input
normalisation, and under FlashInfer. Every difference must be one of
``DIFFERENCES``, each listed in docs/vllm-differences.md and shown right by a
test (the padding ones by the findings' reproducers).
"""

from __future__ import annotations

import pytest

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
    Difference("qwen3_vl.backend-guard", (r"^config\[backend=TORCH_SDPA[,\]]",)),
    Difference(
        "qwen3_vl.cu-seqlens-padding",
        (
            r"^config\[.*/padding_logics",
            r"replay\[.*/(captured|calls\[\d+\]/encoder_metadata)/cu_seqlens\.values$",
            r"replay\[.*/cu_seqlens_tail$",
            r"replay\[.*/violations(\.keys|/cu_seqlens-decreasing|/offsets-past-rows)",
            # Under FlashInfer vLLM's V offsets read the wrong rows.
            r"^fi:replay\[.*/items\[\d+\]\.values$",
        ),
    ),
    Difference(
        "qwen3_vl.dummy-frames",
        (
            r"^(fi:|fused:)?capture\[b=16,n=4,f=56\]/(values|forward)/",
            r"^(fi:|fused:)?replay\[b=16,n=4,f=56,\w+\]\[\d+\]/(captured|calls|cu_seqlens_tail)",
        ),
    ),
    Difference(
        "qwen3_vl.video-replay-unpadded",
        (r"replay\[.*,video\]\[\d+\]/replay/(cu_seqlens|sequence_lengths\w*)\.",),
    ),
    Difference(
        "qwen3_vl.selected-grid",
        (r"^select\[.*/(selected|reselected)/(image|video)_grid_thw",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("qwen3_vl")


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
    check_differences("qwen3_vl", found, DIFFERENCES)


def test_capture_guards_torch_sdpa_which_vllm_cannot_capture(model, vllm_code) -> None:
    hosts.check_torch_sdpa_guard(model, vllm_code)


def test_selected_grids_stay_tensors_and_work_everywhere(model) -> None:
    hosts.check_selected_grids_work_everywhere(model)


def test_dummy_frames_stop_at_the_tokens_of_an_item(model) -> None:
    hosts.check_dummy_frames_stop_at_k(model, CASES[-1])
