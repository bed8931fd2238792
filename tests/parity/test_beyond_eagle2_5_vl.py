"""Eagle2.5-VL (``specs/eagle2_5_vl.yaml``), a SigLIP tile model with
InternVL's pixel shuffle that vLLM 0.33.0 runs eagerly: the generated mixin
through vLLM's manager (and the runtime's) on every budget of the default
ladder, against the model's own ``_process_image_input`` (its
``extract_feature`` and pixel shuffle, fake learned layers), item by item;
and a wrong spec that the check catches, per mutation."""

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
        '"forced if forced > 0 else image", "forced if forced > 0 else image"]',
        '"2 * (forced if forced > 0 else image)", "2 * (forced if forced > 0 else image)"]',
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
    return beyond_hosts.eagle2_5_vl()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


def test_tiles_of_force_image_size_match_vllms_eager_path() -> None:
    assert oracle_problems(beyond_hosts.eagle2_5_vl(forced=True)) == []


@pytest.mark.parametrize(
    ("why", "old", "new"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_a_wrong_spec_fails_the_check(model, tmp_path, why, old, new) -> None:
    problems = oracle_problems(model, mutated_source(model.stem, old, new, tmp_path))
    assert problems, why


def test_the_vision_configs_side_alone_fails_under_force_image_size(tmp_path) -> None:
    source = mutated_source(
        "eagle2_5_vl",
        '"forced if forced > 0 else image", "forced if forced > 0 else image"]',
        "image, image]",
        tmp_path,
    )
    assert oracle_problems(beyond_hosts.eagle2_5_vl(forced=True), source)
