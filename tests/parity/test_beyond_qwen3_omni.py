"""Qwen3-Omni's thinker (``specs/qwen3_omni.yaml``), images: a varlen tower
with learned position embeddings, 2-D RoPE, a patch merger and DeepStack
mergers, without a packed entry point, that vLLM 0.33.0 runs eagerly: the
generated mixin through vLLM's manager and the project's runtime on every
budget of the default ladder, against the thinker's own
``_process_image_input`` (vLLM's tower forward, position interpolation, RoPE
tables, offsets and ``max_seqlen``; fake learned layers, three blocks, the
hidden states after the first two kept for the DeepStack mergers), item by
item, under every backend for which the tower passes ``max_seqlen`` (the
others are refused before any capture).

A wrong spec that still generates fails the check (``SPEC_MUTATIONS``); so
does a wrong module that no spec can ask for (``MODULE_EDITS``): the last
block left out, a DeepStack tap one block late, merged sequences, a
``max_seqlen`` captured too small."""

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
    "rotary_pos_emb_cos=rotary_pos_emb_cos, rotary_pos_emb_sin=rotary_pos_emb_sin, "
    "max_seqlen=max_seqlen, sequence_lengths=None)\n"
)
_DEEPSTACK_MERGE = "merger(deepstack[level])"

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
        "the DeepStack mergers read the last hidden state",
        _DEEPSTACK_MERGE,
        "merger(hidden + 0 * deepstack[level])",
    ),
    (
        "the DeepStack levels in reverse",
        _DEEPSTACK_MERGE,
        "merger(deepstack[-1 - level])",
    ),
    (
        "the position embeddings in reverse",
        "dtype)) + pos_embeds)",
        "dtype)) + pos_embeds.flip(0))",
    ),
    (
        "the graph reads the rows in reverse",
        "visual.patch_embed(pixel_values.to(visual.dtype))",
        "visual.patch_embed(pixel_values.flip(0).to(visual.dtype))",
    ),
)

MODULE_EDITS = (
    # (what is wrong, module text, edited text)
    (
        "the last block left out",
        "enumerate(self.visual.blocks)",
        "enumerate(self.visual.blocks[:-1])",
    ),
    (
        "each DeepStack tap one block late",
        "if layer in self.visual.deepstack_visual_indexes:",
        "if layer - 1 in self.visual.deepstack_visual_indexes:",
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
    return beyond_hosts.qwen3_omni()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


def test_a_tower_without_absolute_positions_matches_vllms_eager_path() -> None:
    # apply_vit_abs_pos_embed off: the tower adds no position table.
    assert oracle_problems(beyond_hosts.qwen3_omni(positions=False)) == []


def test_positions_added_whatever_the_flag_fail_without_them(tmp_path) -> None:
    source = mutated_source(
        "qwen3_omni",
        "if visual.apply_vit_abs_pos_embed else rotary_pos_emb_cos.new_zeros(",
        "if True else rotary_pos_emb_cos.new_zeros(",
        tmp_path,
    )
    assert oracle_problems(beyond_hosts.qwen3_omni(positions=False), source)


@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_backends_without_max_seqlen_are_refused_before_any_capture(
    model, backend
) -> None:
    # SDPA reads cu_seqlens on the host; FlashInfer needs the sequence
    # lengths the tower computes on the host.
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
