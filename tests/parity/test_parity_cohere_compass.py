"""Cohere Compass: vLLM 0.33.0's hand-written mixin (``cohere_compass.py``,
on its tower's own metadata builder, position interpolation and RoPE ids)
against ``generated/vllm/cohere_compass.py``, method by method, on one fake
host.

Images only. The battery runs under FlashAttention and under FlashInfer, with
captures whose user-set ``max_frames_per_batch`` exceeds the items (the
builder pads the captured offsets to it). Every difference must be one of
``DIFFERENCES``, each listed in docs/vllm-differences.md and shown right by a
test (the padding one by the findings' reproducers).
"""

from __future__ import annotations

import pytest

import parity_hosts as hosts
from parity_hosts import CaptureCase, HostSettings, Plan
from parity_testlib import Difference, check_differences

CASES = (
    CaptureCase(16, 1, 1),
    CaptureCase(32, 4, 4),  # the automatic max_frames_per_batch of an image model
    CaptureCase(30, 4, 8),  # a user-set max_frames_per_batch above the items
    CaptureCase(64, 8, 16),
    CaptureCase(48, 3, 3),
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference("cohere_compass.backend-guard", (r"^config\[backend=TORCH_SDPA[,\]]",)),
    Difference(
        "cohere_compass.cu-seqlens-padding",
        (
            r"^config\[.*/padding_logics",
            r"replay\[.*/(captured|calls\[\d+\]/encoder_metadata)/cu_seqlens\.values$",
            r"replay\[.*/cu_seqlens_tail$",
            r"replay\[.*/violations(\.keys|/cu_seqlens-decreasing|/offsets-past-rows)",
            r"^fi:replay\[.*/items\[\d+\]\.values$",
        ),
    ),
    Difference(
        "cohere_compass.selected-grid",
        (r"^select\[.*/(selected|reselected)/image_grid_thw",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("cohere_compass")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    found += hosts.compare_batches(
        model, Plan(CASES, seeds=(1,)), HostSettings(backend="FLASHINFER"), "fi:"
    )
    check_differences("cohere_compass", found, DIFFERENCES)


def test_capture_guards_torch_sdpa_which_vllm_cannot_capture(model, vllm_code) -> None:
    hosts.check_torch_sdpa_guard(model, vllm_code)


def test_selected_grids_stay_tensors_and_work_everywhere(model) -> None:
    hosts.check_selected_grids_work_everywhere(model)
