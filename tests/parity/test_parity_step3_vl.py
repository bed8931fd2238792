"""Step3-VL: vLLM 0.33.0's hand-written mixin (``step3_vl.py``: two encoder
paths, global views and 504² crops, and a custom per-item merge) against
``generated/vllm/step3_vl.py``, on one fake host with vLLM's own token
arithmetic (``img_output_tokens``, ``patch_output_tokens``).

The battery compares every path's captures, replays and eager forwards and
the merged items, and finds one difference: the type of the item specs'
token counts. vLLM's crop-less items alias the graph output (a finding);
the battery compares values, so that is shown by a test below.
"""

from __future__ import annotations

import typing

import pytest
import torch

import parity_hosts as hosts
from encoder_cudagraph_runtime.defs import EncoderItemSpec
from parity_hosts import CaptureCase, Plan
from parity_testlib import Difference, check_differences

# Global views are 4 rows here, crops 81.
CASES = (
    CaptureCase(162, 2, 0),  # one 2-crop image, or two crop-less ones
    CaptureCase(324, 4, 0),
    CaptureCase(100, 3, 0),  # no image with crops fits: crop-less batches
    CaptureCase(405, 1, 0),  # one image per batch, up to 5 crops
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "step3_vl.int-token-counts",
        (r"specs(\[image,seed=\d+\])?\[\d+\](\[[01]\]|\[2\]/local)(\.\w+)?$",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("step3_vl")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("step3_vl", found, DIFFERENCES)


def test_token_counts_are_the_ints_the_protocol_declares(model) -> None:
    """vLLM iterates the ``num_patches`` tensor: its specs hold 0-dim
    tensors where ``EncoderItemSpec`` declares ints, and every sum the
    manager makes of them is a tensor too. Ours are ints of the same
    values."""
    hints = typing.get_type_hints(EncoderItemSpec)
    assert hints["input_size"] is int and hints["output_tokens"] is int
    vllm_host, our_host = model.hosts()
    batch = hosts.step3_vl_batch(torch.Generator(), "image", [(0,), (3,)])
    theirs = vllm_host.get_encoder_cudagraph_item_specs(batch)
    ours = our_host.get_encoder_cudagraph_item_specs(batch)
    assert all(isinstance(s.output_tokens, torch.Tensor) for s in theirs)
    assert isinstance(
        sum(s.get_path_output_tokens("local") for s in theirs), torch.Tensor
    )
    for mine, vllm in zip(ours, theirs, strict=True):
        assert type(mine.input_size) is int and type(mine.output_tokens) is int
        assert type(mine.get_path_output_tokens("local")) is int
        assert (mine.input_size, mine.output_tokens) == (
            int(vllm.input_size),
            int(vllm.output_tokens),
        )
        for path in model.paths:
            assert mine.get_path_output_tokens(path) == int(
                vllm.get_path_output_tokens(path)
            )


def test_crop_less_items_are_copies_not_views_of_the_graph_output(model) -> None:
    """The same merged rows, but vLLM hands a crop-less image a view of the
    global graph's output buffer (ignoring ``clone=True``), which the next
    replay overwrites; ours copies every item out."""
    batch = hosts.step3_vl_batch(torch.Generator(), "image", [(0,), (2,)])
    global_out = torch.randn(2 * 4, hosts.WIDTH)
    local_out = torch.randn(2 * 81, hosts.WIDTH)
    results = []
    for host in model.hosts():
        dest: dict[int, torch.Tensor] = {}
        host.postprocess_encoder_output(
            {"global": global_out, "local": local_out},
            [0, 1],
            [4, 4 + 2 * 81],
            dest,
            clone=True,
            batch_mm_kwargs=batch,
        )
        results.append(dest)
    theirs, ours = results
    for idx in (0, 1):
        assert torch.equal(theirs[idx], ours[idx])
    storage = global_out.untyped_storage().data_ptr()
    assert theirs[0].untyped_storage().data_ptr() == storage
    assert all(o.untyped_storage().data_ptr() != storage for o in ours.values())
    assert torch.equal(ours[1], torch.cat([local_out, global_out[4:]]))
