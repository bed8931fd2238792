"""DeepSeek-OCR: vLLM 0.33.0's hand-written mixin (``deepseek_ocr.py``: two
encoder paths, global views and local tiles, its batched path helpers and
its post-processing with ``_assemble_patch_grid``) against
``generated/vllm/deepseek_ocr.py``, on one fake host with vLLM's own token
properties and processor sizes stubbed small (192² views, 128² tiles).

The battery compares every path's captures, replays and eager forwards and
the assembled items, and finds two differences, each shown right below:
the items' ``output_tokens`` and the config's ``buffer_keys``.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CaptureCase, Plan
from parity_testlib import Difference, check_differences

# Global views are 12 rows here (3 x 3 and a newline per line), tiles 4.
CASES = (
    CaptureCase(12, 1, 0),  # the smallest budget: one view, up to 3 tiles
    CaptureCase(48, 4, 0),
    CaptureCase(24, 3, 0),  # fewer views than items per batch
    CaptureCase(40, 2, 0),
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "deepseek_ocr.output-tokens", (r"specs(\[image,seed=\d+\])?\[\d+\]\[1\]$",)
    ),
    Difference(
        "deepseek_ocr.buffer-keys", (r"^config\[.*\]/buffer_keys(\.len|\[1\])$",)
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("deepseek_ocr")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("deepseek_ocr", found, DIFFERENCES)


def _prompt_tokens(width: int, height: int) -> int:
    """The image's placeholders in the prompt: vLLM's own
    ``DeepseekOCRProcessingInfo.get_num_image_tokens`` (on the stubbed
    processor sizes)."""
    code = hosts._deepseek_ocr_code()
    info = code.klass(
        hosts.DEEPSEEK_OCR, "DeepseekOCRProcessingInfo", ["get_num_image_tokens"]
    )
    return info().get_num_image_tokens(image_width=width, image_height=height)


@pytest.mark.parametrize(
    ("size", "grid"),
    [
        ((100, 90), (1, 1)),
        ((256, 128), (2, 1)),
        ((256, 256), (2, 2)),
        ((120, 360), (1, 3)),
    ],
)
def test_output_tokens_are_the_rows_written_and_the_prompts_placeholders(
    model, size: tuple[int, int], grid: tuple[int, int]
) -> None:
    """``EncoderItemSpec.output_tokens`` is "the number of output tokens
    after encoder processing". vLLM's counts the global rows and the tiles'
    blocks, not the newline after each tile line nor the separator row that
    its own post-processing appends: fewer rows than it writes, and than the
    prompt's placeholders. Ours counts what is written. (Latent in 0.33.0:
    the manager sorts by it, and only its data-parallel gather, which this
    model does not enable, would place rows by it.)"""
    count_tiles = hosts._deepseek_ocr_code().function(
        hosts.OCR_PROCESSOR, "count_tiles"
    )
    width, height = size
    if grid != (1, 1):  # the processor's tiling of the image
        assert (
            tuple(count_tiles(width, height, image_size=hosts.OCR_IMAGE_SIZE)) == grid
        )
    placeholders = _prompt_tokens(width, height)
    batch = hosts.deepseek_ocr_batch(torch.Generator(), "image", [grid])
    vllm_host, ours = model.hosts()
    written = hosts.eager_view(vllm_host, batch, model.paths)["items"][0].shape[0]
    (theirs,) = vllm_host.get_encoder_cudagraph_item_specs(batch)
    (mine,) = ours.get_encoder_cudagraph_item_specs(batch)
    assert mine.output_tokens == written == placeholders
    tw, th = grid
    lines = th * 2 if grid != (1, 1) else 0  # 2 x 2 rows per tile here
    assert theirs.output_tokens == written - lines - 1
    assert mine.path_output_tokens == theirs.path_output_tokens


def test_buffer_keys_list_every_captured_buffer(model) -> None:
    """``buffer_keys`` are "the tensor buffers recorded into the CUDA
    graph": vLLM's leave out the local path's ``images_crop``, which its
    own capture records (documentation only in 0.33.0: the manager copies
    what each capture returned)."""
    vllm_host, ours = model.hosts()
    captured = [
        key
        for path in model.paths
        for key in hosts.capture_view(vllm_host, CASES[1], path)["values"]
    ]
    assert captured == ["pixel_values", "images_crop"]
    assert vllm_host.get_encoder_cudagraph_config().buffer_keys == ["pixel_values"]
    assert ours.get_encoder_cudagraph_config().buffer_keys == captured


def test_results_through_the_manager_are_fresh_tensors_on_both_sides(model) -> None:
    """Step3-VL's finding 6 (a result that is a view of a graph's output
    buffer) is not DeepSeek-OCR's: vLLM appends the separator row to every
    image with ``torch.cat``, so each result is a tensor of its own, as
    ours. With one item per batch, two untiled images replay the same
    global graph; a tiled one replays both paths. Both hosts give the same
    rows, none sharing memory."""
    batch = hosts.deepseek_ocr_batch(
        torch.Generator().manual_seed(3), "image", [(1, 1), (1, 1), (3, 2)]
    )
    results = []
    for host in model.hosts():
        manager = hosts.runtime_manager(host, [48], 1)
        manager.capture()
        results.append(manager.execute(batch))
        # Each path's replay counts its items: the tiled image twice.
        assert manager.graph_hits == 4
    theirs, ours = results
    assert [r.shape[0] for r in ours] == [13, 13, 13 + 4 * 7]
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))
    assert not torch.equal(ours[0], ours[1])
    for side in results:
        storages = {r.untyped_storage().data_ptr() for r in side}
        assert len(storages) == 3


def test_assembled_items_are_the_models_own_eager_rows(model) -> None:
    """vLLM's ``encoder_eager_forward(path="default")`` is the model's own
    per-image path (``_process_image_input``: each image's tiles through
    ``_encode_local_features``, its global view, the separator). The
    manager never asks for it (the config has no ``default`` path), and ours
    refuses it; what ours assembles from the two paths is its rows, item
    for item."""
    batch = hosts.deepseek_ocr_batch(
        torch.Generator().manual_seed(5), "image", [(2, 3), (1, 1), (3, 1)]
    )
    vllm_host, ours = model.hosts()
    default = vllm_host.encoder_eager_forward(batch)
    assembled = hosts.eager_view(ours, batch, model.paths)["items"]
    assert torch.equal(default, torch.cat(assembled))
    with pytest.raises(ValueError, match="no encoder path 'default'"):
        ours.encoder_eager_forward(batch)
