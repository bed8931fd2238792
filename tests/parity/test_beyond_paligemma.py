"""PaliGemma (``specs/paligemma.yaml``), SigLIP over one fixed-size view per
image (one ``(N, 3, S, S)`` tensor, no count or grid key: a ``tensors``
input) and a linear projector, which vLLM 0.33.0 runs eagerly: the
generated mixin through vLLM's manager and the project's runtime on every
budget of the default ladder, against the model's own
``_process_image_input`` (fake SigLIP tower and projector), item by item.
SigLIP attends within each image: no attention backend changes the rows.

A wrong spec that still generates fails the check (``SPEC_MUTATIONS``); so
does a wrong module that no spec can ask for (``MODULE_EDITS``)."""

from __future__ import annotations

import pytest

import beyond_hosts
from beyond_testlib import (
    MANAGERS,
    edited_module_source,
    mutated_source,
    oracle_problems,
)

SPEC_MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "a token too many per image",
        "  output_tokens: (side // patch) ** 2\n",
        "  output_tokens: (side // patch) ** 2 + 1\n",
    ),
    (
        "the graph reads the images in reverse",
        "_image_pixels_to_features(vision_tower, pixel_values)",
        "_image_pixels_to_features(vision_tower, pixel_values.flip(0))",
    ),
    (
        "the projector skipped in the graph",
        "  - multi_modal_projector(features).flatten(0, -2)\n",
        "  - (features + 0 * multi_modal_projector(features)).flatten(0, -2)\n",
    ),
    (
        "the tokens of an image flattened column by column",
        "  - multi_modal_projector(features).flatten(0, -2)\n",
        "  - multi_modal_projector(features).transpose(0, 1).flatten(0, -2)\n",
    ),
)

MODULE_EDITS = (
    # (what is wrong, module text, edited text)
    (
        # The static checks refuse a capture tensor with room for fewer
        # images than a budget holds.
        "one image captured per budget",
        "(min(max_batch_size, token_budget // (side // patch) ** 2), 3, side, side)",
        "(1, 3, side, side)",
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.paligemma()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


@pytest.mark.parametrize(
    ("why", "old", "new"), SPEC_MUTATIONS, ids=[m[0] for m in SPEC_MUTATIONS]
)
def test_a_wrong_spec_fails_the_check(model, tmp_path, why, old, new) -> None:
    problems = oracle_problems(model, mutated_source(model.stem, old, new, tmp_path))
    assert problems, why


@pytest.mark.parametrize(
    ("why", "old", "new"), MODULE_EDITS, ids=[m[0] for m in MODULE_EDITS]
)
def test_a_wrong_module_fails_the_check(model, why, old, new) -> None:
    problems = oracle_problems(model, edited_module_source(model.stem, old, new))
    assert problems, why
