"""Phi-4-multimodal (``specs/phi4mm.yaml``, images), SigLIP crops with patch
masks and an HD transform per image that vLLM 0.33.0 runs eagerly: the
generated mixin through vLLM's manager (and the runtime's) on every budget of
the default ladder, against the model's own ``_process_image_input`` (vLLM's
``Phi4MMImageEncoder.forward`` and ``get_img_features`` on a masked tile
tower, the real pooling, fixed separators and projection), item by item,
batches given as lists and as padded tensors; and a wrong spec, or a wrong
module, that the check catches."""

from __future__ import annotations

import pytest

import beyond_hosts
from beyond_testlib import (
    MANAGERS,
    edited_module_source,
    mutated_source,
    oracle_problems,
)

MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "the graph runs the crops without their masks",
        "get_img_features(pixels, masks.bool())",
        "get_img_features(pixels, torch.ones_like(masks).bool())",
    ),
    (
        "the masks gathered in another order than the crops",
        "  - masks = image_attention_mask.flatten(0, 1)[crop_rows]\n",
        "  - masks = image_attention_mask.flatten(0, 1)[crop_rows.flip(0)]\n",
    ),
    (
        "crops gathered from the wrong slots",
        "      - crop_rows = (image * 37 + slot).to(device)\n",
        "      - crop_rows = (image * 36 + slot).to(device)\n",
    ),
    (
        "the sub-crops laid out column by column",
        ".reshape(gh, gw, side, side, -1).permute(0, 2, 1, 3, 4)",
        ".reshape(gw, gh, side, side, -1).permute(1, 2, 0, 3, 4)",
    ),
    (
        "the useful height read along a row of the mask",
        "    - useful_h = int(grid_mask[:, 0].sum())\n",
        "    - useful_h = int(grid_mask[0, :].sum())\n",
    ),
    (
        "sub_GN where glb_GN goes",
        "torch.cat([sub, vision_encoder.glb_GN[0], glb])",
        "torch.cat([sub, vision_encoder.sub_GN[0, 0], glb])",
    ),
)

#: Module edits no spec can ask for: each item's mask cut by its index in the
#: batch instead of its place in the selection.
MODULE_EDITS = (
    (
        "the mask of the item at the selection's index, not its place",
        'batch_mm_kwargs["image_attention_mask"][\n                position\n',
        'batch_mm_kwargs["image_attention_mask"][\n                idx\n',
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.phi4mm()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


@pytest.mark.parametrize(
    ("why", "old", "new"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
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
