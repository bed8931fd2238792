"""LLaVA-NeXT (``specs/llava_next.yaml``), an anyres tile model vLLM 0.33.0
does not graph: the generated mixin through vLLM's manager on every budget
of its default ladder, against the model's own ``_process_image_input``
(its tower glue, projector and ``_merge_image_patch_embeddings``, fake
learned layers, Hugging Face's anyres helpers as stand-ins), item by item;
each item's token count from its steps against the rows vLLM's merge gives;
an item whose count passes the spec's bound refused; and a wrong spec that
the check catches, per mutation."""

from __future__ import annotations

import pytest
import torch

import beyond_hosts
from beyond_testlib import (
    MANAGERS,
    mixin_class,
    mutated_source,
    oracle_problems,
    wheel_code,
)
from parity_testlib import load_generated_vllm_module

MUTATIONS = (
    # (what is wrong, spec text, mutated text)
    (
        "the count without the newline rows",
        "unpadded.shape[1] * (unpadded.shape[2] + 1)",
        "unpadded.shape[1] * unpadded.shape[2]",
    ),
    (
        "the count of the grid before the cut",
        "      - unpadded = unpad_image(grid, (ih, iw))\n",
        "      - unpadded = grid\n",
    ),
    (
        "the image's sides swapped in the search",
        "      - tile_rows, tile_cols = get_anyres_image_grid_shape((ih, iw), "
        "config.image_grid_pinpoints, side)\n      - grid",
        "      - tile_rows, tile_cols = get_anyres_image_grid_shape((iw, ih), "
        "config.image_grid_pinpoints, side)\n      - grid",
    ),
    (
        "the projector skipped in the graph",
        "  - multi_modal_projector(features).flatten(0, 1)[real_rows]",
        "  - features.flatten(0, 1)[real_rows]",
    ),
    (
        "the class row kept in the graph",
        "  - features = vision_tower(tiles, select_layers=select_layers, "
        "feature_select_strategy=config.vision_feature_select_strategy)\n"
        "  - multi_modal_projector",
        "  - features = vision_tower(tiles, select_layers=select_layers, "
        'feature_select_strategy="full")\n'
        "  - multi_modal_projector",
    ),
    (
        "the real rows gathered at four tiles per image",
        "real_rows = (image * 5 *",
        "real_rows = (image * 4 *",
    ),
    (
        "the bound below the count of a full grid",
        "    at_most: p * (side // patch) ** 2 + (p - 1) * (side // patch)\n",
        "    at_most: p * (side // patch) ** 2\n",
    ),
    (
        "the grid's lines read column-major",
        "    - padded = tiles.permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)\n",
        "    - padded = tiles.permute(4, 1, 3, 0, 2).flatten(1, 2).flatten(2, 3)\n",
    ),
    (
        "no newline after each line",
        "    - lines = torch.cat([unpadded, newline.to(unpadded.dtype)], dim=-1)"
        ".flatten(1, 2).transpose(0, 1)\n",
        "    - lines = torch.cat([unpadded, unpadded[:, :, :1]], dim=-1)"
        ".flatten(1, 2).transpose(0, 1)\n",
    ),
)


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.llava_next()


@pytest.fixture(scope="module")
def host(model):
    code = wheel_code(model)
    mixin = mixin_class(load_generated_vllm_module(model.stem, code))
    return model.make_host(code, model.host_class(code, mixin), "FLASH_ATTN")


@pytest.mark.parametrize("manager", MANAGERS[:1])
def test_graphs_and_eager_forward_match_vllms_eager_path(model, manager) -> None:
    assert oracle_problems(model, manager=manager) == []


def test_each_count_is_the_rows_of_vllms_merge(model, host) -> None:
    for batch in model.batches():
        with torch.inference_mode():
            merged = model.eager(host, batch)
        specs = host.get_encoder_cudagraph_item_specs(batch)
        assert [s.output_tokens for s in specs] == [m.shape[0] for m in merged]


def test_a_count_past_the_bound_is_refused(model, host) -> None:
    # A 2 x 2 grid (13 x 13 pixels) sent with fewer tiles than it needs: its
    # count (16 + 8 * 9 = 88) passes the bound of 2 tiles (2 * 16 + 4 = 36).
    side = beyond_hosts.LLAVA_NEXT_SIDE
    batch = {
        "pixel_values": [torch.zeros(2, 3, side, side)],
        "image_sizes": torch.tensor([[13, 13]]),
    }
    with pytest.raises(
        ValueError, match=r"item 0: .* gave 88, not an int in 1 \.\. 36"
    ):
        host.get_encoder_cudagraph_item_specs(batch)


@pytest.mark.parametrize(
    ("why", "old", "new"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_a_wrong_spec_fails_the_check(model, tmp_path, why, old, new) -> None:
    problems = oracle_problems(model, mutated_source(model.stem, old, new, tmp_path))
    assert problems, why
