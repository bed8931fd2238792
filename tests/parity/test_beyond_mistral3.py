"""Mistral3 (``specs/mistral3.yaml``), the HF Pixtral tower over images of
their own sizes (a list of ``(3, H_i, W_i)`` tensors, or one stacked tensor)
and the projector's patch merger, which vLLM 0.33.0 runs eagerly: the
generated mixin through vLLM's manager and the project's runtime on every
budget of the default ladder, against the model's own
``_process_image_input`` (vLLM's tower forward with its packed patch
embedding, position ids and packed-sequence metadata, vLLM's transformer
loop, projector and merger; fake learned layers, three of them), item by
item, under every backend for which the tower passes ``max_seqlen`` (the
others are refused before any capture), with the rotary table of
Transformers 5.17 on (axial ids) and before (flat ids).

A wrong spec that still generates fails the check (``SPEC_MUTATIONS``); so
does a wrong module that no spec can ask for (``MODULE_EDITS``)."""

from __future__ import annotations

import functools

import pytest

import beyond_hosts
from beyond_testlib import (
    MANAGERS,
    OracleModel,
    backend_refusal,
    edited_module_source,
    mutated_source,
    oracle_problems,
)

#: The rotary table's forms: ``axial`` (Transformers 5.17 on), ``flat``.
FORMS = ("axial", "flat")

SPEC_MUTATIONS = (
    # (what is wrong, spec text, mutated text[, the forms that see it])
    (
        "output tokens without the merge",
        "  output_tokens: (h // patch // merge) * (w // patch // merge)\n",
        "  output_tokens: (h // patch) * (w // patch) // merge\n",
    ),
    (
        "the merge group's patches in transposed order",
        "(kernel // merge)[None, :] * width[:, None] + (kernel % merge)[None, :]",
        "(kernel % merge)[None, :] * width[:, None] + (kernel // merge)[None, :]",
    ),
    (
        "the group's channels not interleaved as the unfold lays them out",
        "normed[merge_rows].transpose(1, 2).flatten(1)",
        "normed[merge_rows].flatten(1)",
    ),
    (
        "the rotary ids swapped (column, row)",
        "torch.stack([row, column], dim=-1)",
        "torch.stack([column, row], dim=-1)",
        ("axial",),
    ),
    (
        "the flat rotary ids over the batch's widest image",
        "positions[:, 0] * grid_side + positions[:, 1]",
        "positions[:, 0] * (positions[:, 1].max() + 1) + positions[:, 1]",
        ("flat",),
    ),
    (
        "the patches gathered from the wrong image slot",
        "  - patch_image = image.to(device)\n",
        "  - patch_image = image.flip(0).to(device)\n",
    ),
    (
        "a patch's pixels read column by column",
        "patch_column].flatten(1)",
        "patch_column].transpose(2, 3).flatten(1)",
    ),
    (
        "the input normalisation skipped",
        "  - embeds = normed_pixels.matmul(",
        "  - embeds = (pixels + 0 * normed_pixels).matmul(",
    ),
    (
        "ln_pre skipped",
        "  - hidden = vision_tower.ln_pre(embeds.unsqueeze(0))\n",
        "  - hidden = embeds.unsqueeze(0) + 0 * vision_tower.ln_pre(embeds.unsqueeze(0))\n",
    ),
    (
        "the projector's norm skipped",
        "  - normed = multi_modal_projector.norm(features[0])\n",
        "  - normed = features[0] + 0 * multi_modal_projector.norm(features[0])\n",
    ),
    (
        "the transformer bypassed",
        "  - features = vision_tower.transformer(",
        "  - features = hidden + 0 * vision_tower.transformer(",
    ),
    (
        "the activation skipped",
        "  - activated = multi_modal_projector.act(projected)\n",
        "  - activated = projected + 0 * multi_modal_projector.act(projected)\n",
    ),
)

MODULE_EDITS = (
    # (what is wrong, module text, edited text)
    (
        "the first two images merged into one sequence",
        (
            "torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(\n"
            "            device=pixel_values.device"
        ),
        (
            "torch.cat([counts.new_zeros(1), counts.cumsum(0)[1:]]).to(\n"
            "            device=pixel_values.device"
        ),
    ),
    (
        # The static checks refuse a capture value below the longest image.
        "max_seqlen captured for one merged token per image",
        "max(token_budget * merge**2, int(max_seqlen))",
        "merge**2",
    ),
)


@functools.cache
def _model(form: str) -> OracleModel:
    return beyond_hosts.mistral3(axial=form == "axial")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(form, manager) -> None:
    assert oracle_problems(_model(form), manager=manager) == []


@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_backends_without_max_seqlen_are_refused_before_any_capture(backend) -> None:
    # The tower gives these no max_seqlen: SDPA reads cu_seqlens on the host.
    model = _model("axial")
    message = backend_refusal(model, backend)
    assert message is not None and "--mm-encoder-attn-backend FLASH_ATTN" in message
    assert backend_refusal(model, "FLASH_ATTN") is None


@pytest.mark.parametrize(
    ("why", "old", "new", "forms"),
    [(*m, FORMS)[:4] for m in SPEC_MUTATIONS],
    ids=[m[0] for m in SPEC_MUTATIONS],
)
def test_a_wrong_spec_fails_the_check(tmp_path, why, old, new, forms) -> None:
    source = mutated_source("mistral3", old, new, tmp_path)
    for form in forms:
        assert oracle_problems(_model(form), source), f"{why} ({form})"


@pytest.mark.parametrize(
    ("why", "old", "new"), MODULE_EDITS, ids=[m[0] for m in MODULE_EDITS]
)
def test_a_wrong_module_fails_the_check(why, old, new) -> None:
    source = edited_module_source("mistral3", old, new)
    for form in FORMS:
        assert oracle_problems(_model(form), source), f"{why} ({form})"
