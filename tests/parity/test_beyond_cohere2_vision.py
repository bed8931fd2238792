"""Cohere2-Vision (``specs/cohere2_vision.yaml``), a SigLIP tile model
vLLM 0.33.0 does not graph: the generated mixin through vLLM's manager on
every budget of its default ladder, against the model's own
``embed_multimodal`` (vLLM's tower glue and projector, fake learned layers),
item by item; and a wrong spec that the check catches, per mutation."""

from __future__ import annotations

import pytest

import beyond_hosts
from beyond_testlib import MANAGERS, mutated_source, oracle_problems

MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "tokens per tile off by the shuffle",
        "output_tokens: n * (side // patch // shuffle) ** 2",
        "output_tokens: n * (side // patch) ** 2 // shuffle",
    ),
    (
        "the projector skipped in the graph",
        "  - multi_modal_projector(features).flatten(0, -2)\n\neager_forward:",
        "  - features.flatten(0, 1)\n\neager_forward:",
    ),
    (
        "the tiles flattened into the wrong rows",
        "    - multi_modal_projector(features).flatten(0, -2)\n",
        "    - multi_modal_projector(features).transpose(1, 2).flatten(0, -2)\n",
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.cohere2_vision()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


@pytest.mark.parametrize(
    ("why", "old", "new"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_a_wrong_spec_fails_the_check(model, tmp_path, why, old, new) -> None:
    problems = oracle_problems(model, mutated_source(model.stem, old, new, tmp_path))
    assert problems, why
