"""Gemma 3: vLLM 0.33.0's hand-written mixin (``gemma3_mm.py``, on vLLM's
own projector forward) against ``generated/vllm/gemma3_mm.py``.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test.
"""

from __future__ import annotations

import pytest

import parity_hosts as hosts
from parity_hosts import GEMMA3_TOKENS as T
from parity_hosts import CaptureCase, Plan
from parity_testlib import Difference, check_differences

CASES = (
    CaptureCase(T, 1, 0),
    CaptureCase(4 * T, 4, 0),
    CaptureCase(6 * T + 3, 8, 0),  # a budget of a partial crop
    CaptureCase(16 * T, 2, 0),  # more crops than images per batch
    CaptureCase(5 * T, 1, 0),  # one pan-and-scan image, one image per batch
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    # vLLM captures min(token_budget // T, max_batch_size) crops: fewer than
    # the budget's in the last two cases, whose large images then fail there.
    Difference(
        "gemma3_mm.crops-by-budget",
        (r"^(capture|replay)\[b=(64,n=2|20,n=1),",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("gemma3_mm")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("gemma3_mm", found, DIFFERENCES)
