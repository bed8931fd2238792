"""Fixtures of the parity tests (their shared code is parity_testlib and
parity_hosts)."""

from __future__ import annotations

import pytest

from parity_testlib import WheelCode, protocol_stubs, vllm_wheel


@pytest.fixture(scope="session")
def vllm_code() -> WheelCode:
    """vLLM 0.33.0's code from its wheel (the tests skip without it)."""
    return WheelCode(vllm_wheel(), protocol_stubs())
