"""Skywork-R1V (``specs/skyworkr1v.yaml``), an InternVL-layout tile model
on an InternViT tower that vLLM 0.33.0 runs eagerly: the generated mixin
through vLLM's manager (and the runtime's) on every budget of the default
ladder, against the model's own ``_process_image_input`` (its
``extract_feature``, which drops the tower's CLS row, and its pixel shuffle;
fake learned layers), item by item; and a wrong spec that the check
catches, per mutation."""

from __future__ import annotations

import pytest

import beyond_hosts
from beyond_testlib import MANAGERS, mutated_source, oracle_problems

MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "a token too many per tile",
        "  output_tokens: n * tokens\n",
        "  output_tokens: n * (tokens + 1)\n",
    ),
    (
        "the tile side doubled",
        "      shape: [units, 3, side, side]\n",
        "      shape: [units, 3, 2 * side, 2 * side]\n",
    ),
    (
        "the graph's rows in the wrong order",
        "  - extract_feature(pixel_values_flat).flatten(0, -2)\n\neager_forward:",
        "  - extract_feature(pixel_values_flat.flip(0)).flatten(0, -2)\n\n"
        "eager_forward:",
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.skyworkr1v()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


@pytest.mark.parametrize(
    ("why", "old", "new"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_a_wrong_spec_fails_the_check(model, tmp_path, why, old, new) -> None:
    problems = oracle_problems(model, mutated_source(model.stem, old, new, tmp_path))
    assert problems, why
