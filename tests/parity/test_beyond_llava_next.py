"""LLaVA-NeXT (``specs/llava_next.yaml``), whose token counts come from host
steps (``items.output_tokens: {steps, at_most}``); its oracle check and
mutations are ``beyond_cases.LLAVA_NEXT``'s rows. Each item's count from its
steps equals the rows vLLM's ``_merge_image_patch_embeddings`` gives it, and
an item whose count passes the spec's bound is refused."""

from __future__ import annotations

import pytest
import torch

import beyond_hosts
from beyond_testlib import mixin_class, wheel_code
from parity_testlib import load_generated_vllm_module


@pytest.fixture(scope="module")
def model():
    return beyond_hosts.llava_next()


@pytest.fixture(scope="module")
def host(model):
    code = wheel_code(model)
    mixin = mixin_class(load_generated_vllm_module(model.stem, code))
    return model.make_host(code, model.host_class(code, mixin), "FLASH_ATTN")


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
