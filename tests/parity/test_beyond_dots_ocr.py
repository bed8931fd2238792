"""dots.ocr (``specs/dots_ocr.yaml``), a varlen tower with 2-D RoPE and a
patch merger that has no packed entry point and that vLLM 0.33.0 runs
eagerly: the generated mixin through vLLM's manager and the project's
runtime on every budget of the default ladder, against the model's own
``_process_image_input`` (vLLM's tower forward, RoPE table, offsets and
``max_seqlen``; fake learned layers, three blocks), item by item, under
every backend for which the tower passes ``max_seqlen`` (the others are
refused before any capture).

A wrong spec that still generates fails the check (``SPEC_MUTATIONS``); so
does a wrong module that no spec can ask for (``MODULE_EDITS``): blocks
skipped, the last block left out, merged sequences."""

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

_BLOCK_CALL = (
    "      - hidden = block(hidden, cu_seqlens=cu_seqlens, "
    "rotary_pos_emb=rotary_pos_emb, max_seqlen=max_seqlen)\n"
)

SPEC_MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "output tokens without the merge",
        "  output_tokens: t * (h // merge) * (w // merge)\n",
        "  output_tokens: t * h * w // merge\n",
    ),
    (
        "every block run twice",
        _BLOCK_CALL,
        _BLOCK_CALL + _BLOCK_CALL,
    ),
    (
        "the post-trunk norm skipped",
        "  - vision_tower.merger(normed)[:, :config.hidden_size]\n",
        "  - vision_tower.merger(hidden + 0 * normed)[:, :config.hidden_size]\n",
    ),
    (
        "the graph reads the rows in reverse",
        "pixel_values.to(vision_tower.dtype), None)",
        "pixel_values.flip(0).to(vision_tower.dtype), None)",
    ),
)

MODULE_EDITS = (
    # (what is wrong, module text, edited text)
    (
        "the last block left out",
        "for block in self.vision_tower.blocks:",
        "for block in self.vision_tower.blocks[:-1]:",
    ),
    (
        "the blocks skipped",
        "for block in self.vision_tower.blocks:",
        "for block in self.vision_tower.blocks[:0]:",
    ),
    (
        "the first two images merged into one sequence",
        "lengths.cumsum(0)]).to(\n            device=pixel_values.device",
        "lengths.cumsum(0)[1:]]).to(\n            device=pixel_values.device",
    ),
    (
        # The spec cannot ask for it: the static checks refuse a capture
        # value below token_budget * merge**2.
        "max_seqlen captured for one merged token per row",
        "max(token_budget * merge**2, int(max_seqlen))",
        "token_budget",
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.dots_ocr()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_backends_without_max_seqlen_are_refused_before_any_capture(
    model, backend
) -> None:
    # The tower gives these no max_seqlen: SDPA reads cu_seqlens on the host.
    message = backend_refusal(model, backend)
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
