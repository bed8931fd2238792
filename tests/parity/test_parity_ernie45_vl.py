"""ERNIE-4.5-VL: vLLM 0.33.0's hand-written mixin (``ernie45_vl.py``, on its
tower's own ``prepare_encoder_metadata`` and ``forward``) against
``generated/vllm/ernie45_vl.py``, method by method, on one fake host.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test below.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CPU, CaptureCase, Plan
from parity_testlib import Difference, check_differences, observe

CASES = (
    CaptureCase(16, 1, 0),
    CaptureCase(32, 4, 0),
    CaptureCase(30, 4, 0),  # a budget that 4 items do not divide
    CaptureCase(64, 3, 0),
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "ernie45_vl.capture-max-seqlen",
        (
            r"capture\[.*/(values|forward/calls\[\d+\]/encoder_metadata)/"
            r"max_seqlen\.values$",
        ),
    ),
    # vLLM's eager view raises as a whole (its post-processing fails).
    Difference("ernie45_vl.eager-rows", (r"^eager\[",)),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("ernie45_vl")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("ernie45_vl", found, DIFFERENCES)


def test_capture_max_seqlen_bounds_every_sequence_within_the_budget(model) -> None:
    for case in CASES:
        vllm_values, ours = (
            host.prepare_encoder_cudagraph_capture_inputs(
                case.budget, case.max_batch_size, 0, CPU, torch.float32
            ).values
            for host in model.hosts()
        )
        # The longest sequence of a batch within the budget is one image of
        # budget tokens, 2 x 2 patches each: vLLM's bound. Ours is the
        # dummy's row count, never below it.
        tightest = case.budget * 4
        assert int(vllm_values["max_seqlen"]) == tightest
        assert int(ours["max_seqlen"]) == ours["pixel_values"].shape[0] >= tightest


def _graph_items(host, case: CaptureCase, batch) -> list[torch.Tensor]:
    """The items' rows of a replay of ``batch`` into the graph of ``case``."""
    return hosts.replay_view(host, case, [batch])[0]["items"]


def test_eager_batches_get_the_graph_rows_resampled_once(model) -> None:
    """A batch gives the same rows whether it replays a graph or runs
    eagerly (the manager post-processes both); vLLM's eager rows are already
    resampled, and its post-processing resamples them again and fails."""
    case = CaptureCase(64, 3, 0)
    gen = torch.Generator().manual_seed(3)
    batch = model.make_batch(gen, "image", [(1, 4, 4), (1, 2, 6), (1, 6, 2)])
    vllm_host, ours = model.hosts()
    graph = _graph_items(ours, case, batch)
    assert all(
        torch.equal(a, b)
        for a, b in zip(graph, _graph_items(vllm_host, case, batch), strict=True)
    )
    eager = hosts.eager_view(ours, batch)["items"]
    assert [e.shape for e in eager] == [(4, 16), (3, 16), (3, 16)]
    assert all(torch.allclose(a, b) for a, b in zip(eager, graph, strict=True))
    assert observe(lambda: hosts.eager_view(vllm_host, batch)).type_name == (
        "RuntimeError"
    )
