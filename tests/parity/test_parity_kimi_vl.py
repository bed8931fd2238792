"""Kimi-VL: vLLM 0.33.0's hand-written mixin (``kimi_vl.py``) against
``generated/vllm/kimi_vl.py``, method by method, on one fake host whose
MoonViT runs vLLM's own metadata builder, RoPE table, position-embedding
resize and forward glue.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test below.
"""

from __future__ import annotations

import ast

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CaptureCase, Plan
from parity_testlib import Difference, check_differences, copy_replay_into_captured

#: The fake RoPE grid holds (64 // 2) ** 2 = 1024 merged tokens per image:
#: the last case is beyond it.
CASES = (
    CaptureCase(64, 1, 0),
    CaptureCase(100, 4, 0),
    CaptureCase(256, 8, 0),
    CaptureCase(30, 4, 0),  # a budget that 4 items do not divide
    CaptureCase(1024, 1, 0),  # the whole RoPE grid in one dummy image
    CaptureCase(2048, 1, 0),
)
CPU = torch.device("cpu")

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "kimi_vl.capture-max-seqlen",
        (
            r"^capture\[.*/(values|forward/calls\[\d+\]/encoder_metadata)/"
            r"max_seqlen\.values$",
            r"^capture\[.*/forward/violations(\.keys|/max_seqlen-too-small)",
        ),
    ),
    Difference(
        "kimi_vl.rope-capacity-error",
        # Both refuse the budget, with another error type and message.
        (r"^(capture|replay)\[b=2048,.*\](\.type_name|\.message|/raised-on-both)$",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("kimi_vl")


def _capture(host, case: CaptureCase) -> dict[str, torch.Tensor]:
    return host.prepare_encoder_cudagraph_capture_inputs(
        case.budget, case.max_batch_size, case.max_frames_per_batch, CPU, torch.float32
    ).values


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("kimi_vl", found, DIFFERENCES)


@pytest.mark.parametrize("case", CASES[:5], ids=str)
def test_capture_max_seqlen_bounds_every_image_within_the_budget(model, case) -> None:
    vllm_host, ours = model.hosts()
    theirs, mine = _capture(vllm_host, case), _capture(ours, case)
    # The longest sequence of a batch within the budget: one image of the
    # whole budget, 2 x 2 patches per token; the dummy's own images may be
    # longer (a RoPE-bounded row layout rounds up).
    longest_real = case.budget * 4
    offsets = mine["cu_seqlens"].tolist()
    longest_dummy = max(b - a for a, b in zip(offsets, offsets[1:], strict=False))
    assert int(mine["max_seqlen"]) == max(longest_real, longest_dummy)
    # vLLM's bound is the budget in tokens: a quarter of the rows.
    assert int(theirs["max_seqlen"]) == case.budget < longest_real


def test_an_image_of_the_whole_budget_is_computed_in_every_row(model) -> None:
    """The reproducer of the finding on vLLM's mixin, on ours: a 16 x 16
    image (64 tokens) in the budget-64 graph, with the captured max_seqlen
    as FlashAttention keeps it."""
    _, ours = model.hosts()
    case = CaptureCase(64, 1, 0)
    captured = _capture(ours, case)
    baked = int(captured["max_seqlen"])
    batch = hosts.kimi_vl_batch([(16, 16)])
    (spec,) = ours.get_encoder_cudagraph_item_specs(batch)
    assert spec.output_tokens == case.budget
    replay = ours.prepare_encoder_cudagraph_replay_buffers(batch, 1, 0).values
    copy_replay_into_captured(ours.get_encoder_cudagraph_config(), captured, replay)
    violations: dict[str, list[str]] = {}
    rows = torch.randn(captured["pixel_values"].shape[0], hosts.WIDTH)
    out = hosts.varlen_attention(rows, captured["cu_seqlens"], baked, violations)
    assert not violations
    assert not out[: 16 * 16].isnan().any()


def test_a_budget_beyond_the_rope_grid_is_refused_with_value_error(
    model, vllm_code
) -> None:
    vllm_host, ours = model.hosts()
    case = CaptureCase(2048, 1, 0)
    # vLLM checks the capacity with a Python assert ...
    with pytest.raises(AssertionError, match="RoPE grid capacity"):
        _capture(vllm_host, case)
    capture = vllm_code.definition(
        hosts.KIMI_VL,
        "KimiVLForConditionalGeneration.prepare_encoder_cudagraph_capture_inputs",
    )
    checks = [n for n in ast.walk(capture) if isinstance(n, ast.Assert)]
    assert len(checks) == 1 and "rope" in ast.unparse(checks[0].test)
    # ... which `python -O` compiles away, leaving a dummy grid taller than
    # the table; ours raises ValueError whatever the flags, naming both sides.
    assert (
        compile("assert False", "<check>", "exec", optimize=1).co_code
        == compile("pass", "<check>", "exec", optimize=1).co_code
    )
    with pytest.raises(ValueError, match=r"RoPE grid: needs ho \* kh <= rope_h"):
        _capture(ours, case)
