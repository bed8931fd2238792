"""Llama 4: vLLM 0.33.0's hand-written mixin (``mllama4.py``, on vLLM's own
``encode_image_chunks`` and ``get_image_patches_per_chunk``) against
``generated/vllm/mllama4.py``.

The battery finds no difference: the document lists none for Llama 4.
"""

from __future__ import annotations

import pytest

import parity_hosts as hosts
from parity_hosts import LLAMA4_TOKENS as T
from parity_hosts import CaptureCase, Plan
from parity_testlib import check_differences

CASES = (
    CaptureCase(T, 1, 0),
    CaptureCase(4 * T, 4, 0),
    CaptureCase(6 * T + 3, 8, 0),  # a budget of a partial chunk: one spare chunk
    CaptureCase(16 * T, 2, 0),  # more chunks than images per batch
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("mllama4")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("mllama4", found, (hosts.SELECTION_ALIASES,))
