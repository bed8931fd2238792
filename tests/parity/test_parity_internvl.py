"""InternVL: vLLM 0.33.0's hand-written mixin (``internvl.py``, on vLLM's
own ``extract_feature`` and ``pixel_shuffle``) against
``generated/vllm/internvl.py``.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import INTERNVL_TOKENS as T
from parity_hosts import CaptureCase, Plan
from parity_testlib import Difference, check_differences

CASES = (
    CaptureCase(T, 1, 1),
    CaptureCase(4 * T, 4, 8),
    CaptureCase(6 * T + 3, 8, 8),  # a budget of a partial tile
    CaptureCase(16 * T, 2, 2),  # more tiles than items per batch
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "internvl.selected-counts",
        (r"^select\[.*/(selected|reselected)/(image|video)_num_patches",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("internvl")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    check_differences("internvl", found, DIFFERENCES)


def test_selected_counts_stay_tensors_and_work_everywhere(model) -> None:
    gen = torch.Generator().manual_seed(5)
    for modality in ("image", "video"):
        batch = model.make_batch(gen, modality, [(3,), (1,), (5,)])
        key = f"{modality}_num_patches"
        vllm_host, ours = model.hosts()
        for indices in ([2, 0, 2], []):
            picked = vllm_host.select_encoder_cudagraph_items(batch, indices)
            kept = ours.select_encoder_cudagraph_items(batch, indices)
            # The processor hands tile counts over as an int64 tensor on the
            # host; ours keeps that, vLLM's selection makes a list.
            assert isinstance(picked[key], list)
            assert kept[key].dtype == torch.int64
            assert kept[key].shape == (len(indices),)
            assert kept[key].tolist() == picked[key]
            if not indices:
                continue
            # Either selection is valid input to either mixin, with equal results.
            for host in (vllm_host, ours):
                views = [
                    (
                        hosts.specs_view(host.get_encoder_cudagraph_item_specs(s)),
                        hosts.eager_view(host, s)["items"],
                    )
                    for s in (picked, kept)
                ]
                assert views[0][0] == views[1][0]
                assert all(
                    torch.equal(a, b)
                    for a, b in zip(views[0][1], views[1][1], strict=True)
                )
