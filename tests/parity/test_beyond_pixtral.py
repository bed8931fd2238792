"""Pixtral (``specs/pixtral.yaml``, Mistral-format checkpoints), whose images
are each their own ``(3, H, W)`` tensor and which vLLM 0.33.0 runs eagerly:
the generated mixin through vLLM's manager and the project's runtime on
every budget of the default ladder, against the model's own
``embed_multimodal`` (vLLM's ``VisionTransformer.forward`` with its RoPE
table and packed metadata, its ``PatchMerger`` and adapter; fake learned
layers), item by item, under every backend for which the tower's metadata
is the plain offsets and the longest sequence (the others are refused
before any capture). Both checkpoint forms: Pixtral-12B's (no merger, no
pre-projector norm) and Mistral-Small-3.1's (a norm and a 2 x 2 merger).

A wrong spec that still generates fails the check (``SPEC_MUTATIONS``); so
does a wrong module that no spec can ask for (``MODULE_EDITS``)."""

from __future__ import annotations

import pytest

import beyond_hosts
from beyond_testlib import (
    MANAGERS,
    backend_refusal,
    edited_module_source,
    mutated_source,
    oracle_problems,
)

#: The checkpoint forms: Pixtral-12B's and Mistral-Small-3.1's (merger).
FORMS = {"pixtral-12b": False, "mistral-small-3.1": True}
BOTH = tuple(FORMS)
MERGER = ("mistral-small-3.1",)

SPEC_MUTATIONS = (
    # (what is wrong, the forms that show it, spec text, mutated text)
    (
        "each image's patches gathered transposed",
        BOTH,
        "pixels[patch_index[:, 0], :, patch_index[:, 1], :, patch_index[:, 2]]",
        "pixels[patch_index[:, 0], :, patch_index[:, 2], :, patch_index[:, 1]]",
    ),
    (
        "the RoPE rows of the transposed positions",
        BOTH,
        "freqs_cis[patch_index[:, 1], patch_index[:, 2]]",
        "freqs_cis[patch_index[:, 2], patch_index[:, 1]]",
    ),
    (
        "the first two images merged into one sequence",
        BOTH,
        "torch.cat([counts.new_zeros(1), counts.cumsum(0)])",
        "torch.cat([counts.new_zeros(1), counts.cumsum(0)[1:]])",
    ),
    (
        "each merge group's patches read column by column",
        MERGER,
        "(kernel // merge)[None, :] * width[:, None] + (kernel % merge)[None, :]",
        "(kernel % merge)[None, :] * width[:, None] + (kernel // merge)[None, :]",
    ),
    (
        "the merge groups laid out patch by patch, not channel by channel",
        MERGER,
        "normed[merge_rows].transpose(1, 2).flatten(1)",
        "normed[merge_rows].flatten(1)",
    ),
    (
        "the pre-projector norm skipped",
        MERGER,
        "pre_mm_projector_norm(encoded) if",
        "encoded if",
    ),
    (
        "output tokens without the merge",
        MERGER,
        "  output_tokens: (h // (patch * merge)) * (w // (patch * merge))\n",
        "  output_tokens: (h // patch) * (w // patch) // merge\n",
    ),
)

MODULE_EDITS = (
    # (what is wrong, the forms that show it, module text, edited text)
    (
        # The spec cannot ask for it: the static checks refuse a capture
        # value below the longest image of the budget, token_budget * merge**2.
        "max_seqlen captured for one patch per token",
        MERGER,
        "max(token_budget * merge**2, int(max_seqlen))",
        "token_budget",
    ),
    (
        "the transformer's blocks skipped",
        BOTH,
        "encoded = self.vision_encoder.transformer(\n            hidden,",
        "encoded = (lambda x, **_: x)(\n            hidden,",
    ),
)


@pytest.fixture(scope="module", params=BOTH)
def form(request):
    return request.param


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(form, manager) -> None:
    assert oracle_problems(beyond_hosts.pixtral(FORMS[form]), manager=manager) == []


@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_backends_the_metadata_does_not_fit_are_refused_before_any_capture(
    backend,
) -> None:
    # SDPA reads cu_seqlens on the host; FlashInfer needs scaled, bucketed
    # offsets and sequence lengths that the spec does not build.
    model = beyond_hosts.pixtral()
    message = backend_refusal(model, backend)
    assert message is not None and "--mm-encoder-attn-backend FLASH_ATTN" in message
    assert backend_refusal(model, "FLASH_ATTN") is None


def _cases(table):
    return [
        pytest.param(FORMS[form], old, new, id=f"{why} ({form})")
        for why, forms, old, new in table
        for form in forms
    ]


@pytest.mark.parametrize(("merger", "old", "new"), _cases(SPEC_MUTATIONS))
def test_a_wrong_spec_fails_the_check(tmp_path, merger, old, new) -> None:
    model = beyond_hosts.pixtral(merger)
    assert oracle_problems(model, mutated_source(model.stem, old, new, tmp_path))


@pytest.mark.parametrize(("merger", "old", "new"), _cases(MODULE_EDITS))
def test_a_wrong_module_fails_the_check(merger, old, new) -> None:
    model = beyond_hosts.pixtral(merger)
    assert oracle_problems(model, edited_module_source(model.stem, old, new))
