"""Idefics3: vLLM 0.33.0's hand-written mixin (``idefics3.py``, on its
model's own ``image_pixels_to_features``, patch mask, position ids and
connector) against ``generated/vllm/idefics3.py``.

The battery finds no difference: the document lists none for Idefics3 (the
selected tile counts differ in their device only, which a CPU run cannot
observe; the test below shows ours stay on the host).
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import IDEFICS3_TOKENS as T
from parity_hosts import CaptureCase, Plan
from parity_testlib import check_differences

CASES = (
    CaptureCase(T, 1, 0),
    CaptureCase(4 * T, 4, 0),
    CaptureCase(6 * T + 3, 8, 0),  # a budget of a partial tile: one spare tile
    CaptureCase(16 * T, 2, 0),  # more tiles than images per batch
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("idefics3")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("idefics3", found, (hosts.SELECTION_ALIASES,))


def test_selected_tile_counts_stay_on_the_host(model) -> None:
    # Pixels and masks on a device (the meta device stands in for the GPU):
    # the selection's counts stay where the processor put them, so reading
    # the selection's item specs needs nothing from the device.
    _, ours = model.hosts()
    batch = model.make_batch(torch.Generator().manual_seed(3), "image", [(1,), (4,)])
    on_device = {
        key: value if key == "num_patches" else value.to("meta")
        for key, value in batch.items()
    }
    selected = ours.select_encoder_cudagraph_items(on_device, [1, 0])
    assert selected["num_patches"].device.type == "cpu"
    assert selected["pixel_values"].device.type == "meta"
    specs = ours.get_encoder_cudagraph_item_specs(selected)
    assert [s.output_tokens for s in specs] == [4 * T, T]
