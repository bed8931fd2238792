"""Qwen2-VL: vLLM 0.33.0's hand-written mixin (``qwen2_vl.py``) against
``generated/vllm/qwen2_vl.py``, method by method, on one fake host.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right (or at least as right) by
a test below.
"""

from __future__ import annotations

import ast

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CaptureCase, HostSettings, Plan
from parity_testlib import (
    Difference,
    check_differences,
    copy_replay_into_captured,
    method_call_receivers,
)

CASES = (
    CaptureCase(16, 1, 0),
    CaptureCase(32, 4, 0),
    CaptureCase(64, 4, 16),  # videos: 4 frames per item
    CaptureCase(30, 4, 8),  # a budget that 4 items do not divide
    CaptureCase(64, 4, 2),  # fewer frames than items (user-set)
    CaptureCase(48, 3, 12),
)
CPU = torch.device("cpu")

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "qwen2_vl.backend-guard",
        (r"^config\[backend=(TORCH_SDPA|FLASHINFER)[,\]]",),
    ),
    Difference(
        "qwen2_vl.cu-seqlens-padding",
        (
            r"^config\[.*/padding_logics",
            r"replay\[.*/replay/cu_seqlens\.",
            r"replay\[.*/(captured|calls\[\d+\]/encoder_metadata)/cu_seqlens\.values$",
            r"replay\[.*/cu_seqlens_tail$",
            r"replay\[.*/violations(\.keys|/cu_seqlens-decreasing)",
        ),
    ),
    Difference(
        "qwen2_vl.replay-max-seqlen",
        (
            r"replay\[.*/replay\.keys$",
            r"replay\[.*/replay/max_seqlen\.",
            r"replay\[.*/(captured|calls\[\d+\]/encoder_metadata)/max_seqlen\.values$",
        ),
    ),
    Difference(
        "qwen2_vl.selected-grid",
        (r"^select\[.*/(selected|reselected)/(image|video)_grid_thw",),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("qwen2_vl")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    # vLLM's fused uint8 input normalisation, with raw pixel bytes.
    found += hosts.compare_batches(
        model,
        Plan(CASES[:3], seeds=(0,), batch_options=(("raw", True),)),
        HostSettings(fused_input_norm=True),
        prefix="fused:",
    )
    check_differences("qwen2_vl", found, DIFFERENCES)


def test_capture_guards_the_backends_vllm_cannot_capture(model, vllm_code) -> None:
    # vLLM's mixin returns a config under TORCH_SDPA and FLASHINFER ...
    for backend in ("TORCH_SDPA", "FLASHINFER"):
        vllm_host, ours = model.hosts(HostSettings(backend=backend))
        assert vllm_host.get_encoder_cudagraph_config().modalities == ["image", "video"]
        with pytest.raises(ValueError, match=backend):
            ours.get_encoder_cudagraph_config()
    # ... but its TORCH_SDPA attention reads cu_seqlens on the host (a sync a
    # CUDA graph capture refuses) ...
    sdpa = vllm_code.definition(
        "vllm.v1.attention.ops.vit_attn_wrappers", "torch_sdpa_wrapper"
    )
    assert any("cu_seqlens" in r for r in method_call_receivers(sdpa, "tolist"))
    # ... and FlashInfer's cuDNN path needs sequence_lengths, which neither
    # Qwen2-VL's metadata nor its attention call provides.
    attention = vllm_code.definition(hosts.QWEN2_VL, "Qwen2VisionAttention.forward")
    keywords = {
        k.arg
        for n in ast.walk(attention)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.attn"
        for k in n.keywords
    }
    assert "cu_seqlens" in keywords and "sequence_lengths" not in keywords
    flashinfer = vllm_code.definition(
        "vllm.model_executor.layers.attention.mm_encoder_attention",
        "MMEncoderAttention._forward_flashinfer",
    )
    assert "sequence_lengths" in {a.arg for a in flashinfer.args.args}


def test_max_seqlen_replay_copy_is_a_dead_write_in_vllm(model, vllm_code) -> None:
    # The FlashAttention wrapper turns max_seqlen into a Python int on the
    # host, so the value is fixed when the graph is captured.
    wrapper = vllm_code.definition(
        "vllm.v1.attention.ops.vit_attn_wrappers", "flash_attn_maxseqlen_wrapper"
    )
    assert "max_seqlen" in method_call_receivers(wrapper, "item")
    case = CaptureCase(64, 4, 16)
    batch = model.make_batch(torch.Generator().manual_seed(3), "image", [(1, 4, 4)])
    captured_bounds = []
    items = []
    for host in model.hosts():
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            case.budget,
            case.max_batch_size,
            case.max_frames_per_batch,
            CPU,
            torch.float32,
        ).values
        bound = int(captured["max_seqlen"])
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 4, 16).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
        captured_bounds.append((bound, int(captured["max_seqlen"])))
        items.append(
            hosts.postprocess_view(
                host, batch, host.encoder_cudagraph_forward(dict(captured))
            )
        )
    (vllm_before, vllm_after), (ours_before, ours_after) = captured_bounds
    # vLLM overwrites the host scalar with this batch's 16 rows, a value the
    # graph never reads; ours keeps the bound the graph was captured with.
    assert vllm_after == 16 < vllm_before
    assert ours_after == ours_before
    assert all(torch.equal(a, b) for a, b in zip(*items, strict=True))


def test_selected_grids_stay_tensors_and_work_everywhere(model) -> None:
    hosts.check_selected_grids_work_everywhere(model)
