"""MiniMax M3: vLLM 0.33.0's hand-written mixin
(``vllm/models/minimax_m3/common/encoder_cudagraph.py``, on its tower's own
``prepare_encoder_metadata``) against ``generated/vllm/minimax_m3.py``.

The battery finds no difference: the document lists none for MiniMax M3.
"""

from __future__ import annotations

import pytest

import parity_hosts as hosts
from parity_hosts import CaptureCase, Plan
from parity_testlib import check_differences

CASES = (
    CaptureCase(16, 1, 0),
    CaptureCase(32, 4, 0),
    CaptureCase(30, 4, 0),  # a budget that 4 items do not divide
    CaptureCase(64, 3, 0),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.minimax_m3()


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    # Pixels may arrive as one tensor per image.
    found += hosts.compare_batches(
        model,
        Plan(CASES[1:3], seeds=(1, 2), batch_options=(("as_list", True),)),
        prefix="list:",
    )
    check_differences("minimax_m3", found, ())
