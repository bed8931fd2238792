"""Phi-3-Vision (``specs/phi3v.yaml``), CLIP crops with an HD transform per
image that vLLM 0.33.0 runs eagerly: the generated mixin through vLLM's
manager (and the runtime's) on every budget of the default ladder, against
the model's own ``_process_image_input`` (vLLM's ``Phi3HDImageEmbedding``:
its forward, ``get_img_features`` and HD transform with the 2 x 2 merge, on
a CLIP-like crop tower, fixed separators and projection), item by item; and
a wrong spec that the check catches, per mutation."""

from __future__ import annotations

import pytest

import beyond_hosts
from beyond_testlib import MANAGERS, mutated_source, oracle_problems

MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "crops gathered from the wrong slots",
        "      - crop_rows = (image * 17 + slot).to(device)\n",
        "      - crop_rows = (image * 16 + slot).to(device)\n",
    ),
    (
        "the 2 x 2 patches merged across rows",
        ".view(p, 12, 2, 12, 2, -1).permute(0, 1, 3, 2, 4, 5)",
        ".view(p, 2, 12, 2, 12, -1).permute(0, 2, 4, 1, 3, 5)",
    ),
    (
        "the sub-crops laid out column by column",
        ".reshape(gh, gw, 12, 12, -1).permute(0, 2, 1, 3, 4)",
        ".reshape(gw, gh, 12, 12, -1).permute(1, 2, 0, 3, 4)",
    ),
    (
        "the global view's lines without sub_GN",
        "    - glb = torch.cat([crops[0], line_end.expand(12, 1, -1)], dim=1).flatten(0, 1)\n",
        "    - glb = torch.cat([crops[0], crops[0][:, :1]], dim=1).flatten(0, 1)\n",
    ),
    (
        "the global view taken from the last crop",
        "    - glb = torch.cat([crops[0],",
        "    - glb = torch.cat([crops[p - 1],",
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.phi3v()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


@pytest.mark.parametrize(
    ("why", "old", "new"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_a_wrong_spec_fails_the_check(model, tmp_path, why, old, new) -> None:
    problems = oracle_problems(model, mutated_source(model.stem, old, new, tmp_path))
    assert problems, why
