"""PaddleOCR-VL (``specs/paddleocr_vl.yaml``), a SigLIP tower without a
packed entry point that builds its metadata image by image (the position
table resized to each image, 2-D RoPE ids restarting at every frame, the
projector's 2 x 2 merge per image) and that vLLM 0.33.0 runs eagerly: the
generated mixin, whose per-item builder builds the same, through vLLM's
manager and the project's runtime on every budget of the default ladder,
against the model's own ``_process_image_input`` (vLLM's embeddings with the
bilinear resize, encoder, RoPE table, offsets and ``max_seqlen``, and the
projector's merge; fake learned layers, three encoder layers), item by item,
under every backend for which the encoder passes ``max_seqlen`` (the others
are refused before any capture).

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

_LAYER_CALL = (
    "      - hidden = layer(hidden, cu_seqlens=cu_seqlens, "
    "rotary_pos_emb=rotary_pos_emb, max_seqlen=max_seqlen)\n"
)

SPEC_MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "RoPE ids numbered over the image, not frame by frame",
        "      - position = torch.arange(t * h * w, device=device) % (h * w)\n",
        "      - position = torch.arange(t * h * w, device=device)\n",
    ),
    (
        "the position table resized to w x h",
        ".position_embedding.weight, h, w, True)",
        ".position_embedding.weight, w, h, True)",
    ),
    (
        "the position table once per image, not once per frame",
        "[:h * w].repeat(t, 1)",
        "[:h * w].repeat(1, 1)",
    ),
    (
        "RoPE ids (column, row) instead of (row, column)",
        "torch.stack([position // w, position % w], dim=-1)",
        "torch.stack([position % w, position // w], dim=-1)",
    ),
    (
        "merge windows read as runs of four patches in a row",
        ".reshape(t, h // 2, 2, w // 2, 2).permute(0, 1, 3, 2, 4).flatten()",
        ".flatten()",
    ),
    (
        "every image's patches indexed from the batch's first",
        "  - merged = normed[merge_rows + merge_starts]",
        "  - merged = normed[merge_rows + 0 * merge_starts]",
    ),
    (
        "every layer run twice",
        _LAYER_CALL,
        _LAYER_CALL + _LAYER_CALL,
    ),
    (
        "the post-layernorm skipped",
        "mlp_AR.pre_norm(visual.vision_model.post_layernorm(hidden).squeeze(0))",
        "mlp_AR.pre_norm(hidden.squeeze(0))",
    ),
)

MODULE_EDITS = (
    # (what is wrong, module text, edited text)
    (
        "the last layer left out",
        "for layer in self.visual.vision_model.encoder.layers:",
        "for layer in self.visual.vision_model.encoder.layers[:-1]:",
    ),
    (
        "the layers skipped",
        "for layer in self.visual.vision_model.encoder.layers:",
        "for layer in self.visual.vision_model.encoder.layers[:0]:",
    ),
    (
        "the first two images merged into one sequence",
        "lengths.cumsum(0)]).to(\n            device=pixel_values.device",
        "lengths.cumsum(0)[1:]]).to(\n            device=pixel_values.device",
    ),
    (
        # The spec cannot ask for it: the static checks refuse a capture
        # value below token_budget * 4.
        "max_seqlen captured for one merged token per row",
        "max(token_budget * 4, int(max_seqlen))",
        "token_budget",
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.paddleocr_vl()


@pytest.mark.parametrize("manager", MANAGERS)
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


@pytest.mark.parametrize("backend", ["TORCH_SDPA", "FLASHINFER"])
def test_backends_without_max_seqlen_are_refused_before_any_capture(
    model, backend
) -> None:
    # The encoder gives these no max_seqlen: SDPA reads cu_seqlens on the host.
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
