"""DeepSeek-VL2: vLLM 0.33.0's hand-written mixin (``deepseek_vl2.py``, with
its ``MlpProjector.forward``) against ``generated/vllm/deepseek_vl2.py``,
method by method, on one fake host.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test below.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CaptureCase, Plan
from parity_testlib import Difference, check_differences

CASES = (
    CaptureCase(13, 1, 0),  # the smallest budget: one 1 x 1 image
    CaptureCase(40, 4, 0),
    CaptureCase(64, 2, 0),
    CaptureCase(101, 3, 0),
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    # vLLM's eager view raises as a whole (no eager forward: None).
    Difference("deepseek_vl2.eager-forward", (r"^eager\[",)),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("deepseek_vl2")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("deepseek_vl2", found, DIFFERENCES)


def test_eager_batches_get_the_graph_rows(model) -> None:
    """A batch above every budget runs eagerly: ours gives the rows a graph
    replay gives; vLLM's mixin has no eager forward (the protocol's body
    returns None), and its post-processing fails on that."""
    case = CaptureCase(101, 3, 0)
    gen = torch.Generator().manual_seed(4)
    batch = model.make_batch(gen, "image", [(1, 1), (2, 3), (3, 1)])
    vllm_host, ours = model.hosts()
    graph = hosts.replay_view(ours, case, [batch])[0]["items"]
    vllm_graph = hosts.replay_view(vllm_host, case, [batch])[0]["items"]
    assert all(torch.equal(a, b) for a, b in zip(graph, vllm_graph, strict=True))
    eager = hosts.eager_view(ours, batch)["items"]
    assert [e.shape[0] for e in eager] == [13, 37, 21]
    assert all(torch.equal(a, b) for a, b in zip(eager, graph, strict=True))
    assert vllm_host.encoder_eager_forward(batch) is None
    with pytest.raises(AttributeError):
        hosts.eager_view(vllm_host, batch)
