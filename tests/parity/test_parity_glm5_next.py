"""GLM-5-Next: vLLM 0.33.0's mixin (GLM-4.1V's, inherited by
``Glm5NextForConditionalGeneration``, whose config drops ``pos_embeds``) on
its own tower against ``generated/vllm/glm5_next.py``.

vLLM's mixin is GLM-4.1V's, so the differences are GLM-4.1V's, each shown
by the GLM-4.1V tests; the battery runs here on GLM-5-Next's tower.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CaptureCase, HostSettings, Plan
from parity_testlib import check_differences

DIFFERENCES = (*hosts.glm_differences("glm5_next"), hosts.SELECTION_ALIASES)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("glm5_next")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model)
    found += hosts.compare_batches(model, Plan(hosts.GLM_CASES, seeds=(0, 1)))
    found += hosts.compare_batches(
        model,
        Plan(hosts.GLM_CASES[:3], seeds=(0,), batch_options=(("raw", True),)),
        HostSettings(fused_input_norm=True),
        prefix="fused:",
    )
    check_differences("glm5_next", found, DIFFERENCES)


def test_no_position_embedding_buffer(model) -> None:
    for host in model.hosts():
        config = host.get_encoder_cudagraph_config()
        assert "pos_embeds" not in config.buffer_keys
        values = host.prepare_encoder_cudagraph_capture_inputs(
            64, 4, 16, hosts.CPU, torch.float32
        ).values
        assert set(config.buffer_keys) == set(values)


@pytest.mark.parametrize("case", [CaptureCase(16, 4, 56)], ids=["f=56"])
def test_dummy_frames_stop_at_the_tokens_of_an_item(model, case) -> None:
    hosts.check_dummy_frames_stop_at_k(model, case)
