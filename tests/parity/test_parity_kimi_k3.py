"""Kimi-K3: vLLM 0.33.0's hand-written mixin (``kimi_k3/nvidia/model.py``)
against ``generated/vllm/kimi_k3.py``, method by method, on one fake host
whose MoonViT3d runs vLLM's own metadata builder (``kimi_k25_vit.py``).

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test below.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CaptureCase, HostSettings, Plan
from parity_testlib import Difference, check_differences

#: The fake RoPE grid holds (64 // 2) ** 2 = 1024 merged tokens per image.
CASES = (
    CaptureCase(64, 1, 0),
    CaptureCase(100, 4, 0),
    CaptureCase(256, 8, 0),
    CaptureCase(30, 4, 0),  # a budget that 4 items do not divide
    CaptureCase(1024, 1, 0),  # the whole RoPE grid in one dummy image
)
#: Beyond the RoPE grid: both mixins refuse the capture (a refusal on both
#: sides is no agreement the battery counts, so it is checked on its own).
BEYOND_ROPE = CaptureCase(4096, 1, 0)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "kimi_k3.multi-frame-eager",
        (r"(^|/)specs(\[[^\]]*\])+(\.keys|/default)$",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("kimi_k3")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    # vLLM's fused uint8 input normalisation: raw pixels, captured as uint8.
    found += hosts.compare_batches(
        model,
        Plan(CASES[:2], seeds=(0,), batch_options=(("raw", True),)),
        HostSettings(fused_input_norm=True),
        prefix="fused:",
    )
    # Pixels as a list of per-image tensors and with a leading batch dim.
    for shape in ("list", "batched"):
        found += hosts.compare_batches(
            model,
            Plan(CASES[:2], seeds=(0,), batch_options=(("shape", shape),)),
            prefix=f"{shape}:",
        )
    check_differences("kimi_k3", found, DIFFERENCES)


def test_an_item_of_several_frames_runs_eagerly_instead_of_failing(model) -> None:
    """A grid with t = 2 has 4 tokens: vLLM's budget count puts it in a
    graph, whose replay refuses it (the tower's image merge index needs
    t == 1); ours counts it above every budget, so it runs eagerly."""
    batch = hosts.moon3d_batch(torch.Generator().manual_seed(0), "image", [(2, 4, 4)])
    results = []
    for host in model.hosts():
        manager = hosts.runtime_manager(host, [64], 1)
        manager.capture()
        try:
            results.append(manager.execute(batch))
        except ValueError as exc:
            results.append(exc)
    vllm_result, ours = results
    assert isinstance(vllm_result, ValueError) and "T == 1" in str(vllm_result)
    (rows,) = ours
    (eager,) = hosts.postprocess_view(
        model.hosts()[1], batch, model.hosts()[1].encoder_eager_forward(batch)
    )
    assert torch.equal(rows, eager)


def test_a_budget_beyond_the_rope_grid_is_refused_on_both_sides(model) -> None:
    case = BEYOND_ROPE
    for host in model.hosts():
        with pytest.raises(ValueError, match="(?i)rope"):
            host.prepare_encoder_cudagraph_capture_inputs(
                case.budget,
                case.max_batch_size,
                case.max_frames_per_batch,
                torch.device("cpu"),
                torch.float32,
            )
