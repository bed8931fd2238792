"""Qwen2.5-Omni's thinker (``specs/qwen2_5_omni.yaml``), a NaViT-style
varlen tower (Qwen2.5-VL's, windowed and full attention over ``cu_seqlens``)
that vLLM 0.33.0 runs eagerly: the generated mixin through vLLM's manager on
every budget of its default ladder, against the thinker's own
``_process_image_input`` (vLLM's tower forward, metadata builder and window
order, fake learned layers), item by item, under FlashAttention and
FlashInfer.

A wrong spec that still generates fails the check (``SPEC_MUTATIONS``); so
does a wrong module that no spec can ask for, because the static checks
refuse it (``MODULE_EDITS``): the check sees merged sequences, decreasing
offsets and a captured ``max_seqlen`` too small for a replayed batch."""

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

SPEC_MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "output tokens without the merge",
        "  output_tokens: t * (h // merge) * (w // merge)\n",
        "  output_tokens: t * h * w // merge\n",
    ),
    (
        "the graph reads the rows in reverse",
        "  - visual(pixel_values, None, encoder_metadata=rest)\n",
        "  - visual(pixel_values.flip(0), None, encoder_metadata=rest)\n",
    ),
)

MODULE_EDITS = (
    # (what is wrong, module text, edited text)
    (
        "max_seqlen captured for half the budget",
        "max_seqlen_override=token_budget * merge**2,",
        "max_seqlen_override=token_budget * merge**2 // 2,",
    ),
    (
        "cu_seqlens padded with zeros",
        (
            "        dst[n:].copy_(src[n - 1 :].expand(dst.shape[0] - n))\n\n\n"
            "def _pad_flashinfer"
        ),
        "        dst[n:].zero_()\n\n\ndef _pad_flashinfer",
    ),
    (
        "the first two images merged into one sequence",
        '"cu_seqlens": metadata["cu_seqlens"],',
        (
            '"cu_seqlens": torch.cat([metadata["cu_seqlens"][:1], '
            'metadata["cu_seqlens"][2:]]),'
        ),
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.qwen2_5_omni()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


def test_torch_sdpa_is_refused_before_any_capture(model) -> None:
    # The tower's TORCH_SDPA path reads cu_seqlens on the host: no graph.
    message = backend_refusal(model, "TORCH_SDPA")
    assert message is not None and "--mm-encoder-attn-backend FLASH_ATTN" in message
    assert backend_refusal(model, "FLASH_ATTN") is None


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
