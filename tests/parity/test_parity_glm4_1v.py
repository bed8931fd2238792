"""GLM-4.1V: vLLM 0.33.0's hand-written mixin (``glm4_1v.py``, on its
tower's own metadata builder, bicubic position interpolation and RoPE ids)
against ``generated/vllm/glm4_1v.py``, method by method, on one fake host.

Every difference must be one of ``DIFFERENCES``, each listed in
docs/vllm-differences.md and shown right by a test (some by the findings'
reproducers).
"""

from __future__ import annotations

import ast

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CPU, CaptureCase, Plan
from parity_testlib import check_differences, copy_replay_into_captured

CASES = hosts.GLM_CASES
DIFFERENCES = (*hosts.glm_differences("glm4_1v"), hosts.SELECTION_ALIASES)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("glm4_1v")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    found += hosts.compare_batches(
        model,
        Plan(CASES[:3], seeds=(0,), batch_options=(("raw", True),)),
        hosts.HostSettings(fused_input_norm=True),
        prefix="fused:",
    )
    check_differences("glm4_1v", found, DIFFERENCES)


def test_capture_guards_the_backends_vllm_cannot_capture(model, vllm_code) -> None:
    hosts.check_torch_sdpa_guard(model, vllm_code)
    vllm_host, ours = model.hosts(hosts.HostSettings(backend="FLASHINFER"))
    assert vllm_host.get_encoder_cudagraph_config().modalities == ["image", "video"]
    with pytest.raises(ValueError, match="FLASHINFER"):
        ours.get_encoder_cudagraph_config()
    # FlashInfer's cuDNN path needs sequence_lengths, which GLM-4.1V's tower
    # never passes to its blocks (eager or captured alike).
    forward = vllm_code.definition(hosts.GLM4_1V, "Glm4vVisionTransformer.forward")
    keywords = {
        k.arg
        for n in ast.walk(forward)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "blk"
        for k in n.keywords
    }
    assert "cu_seqlens" in keywords and "sequence_lengths" not in keywords
    wrapper = vllm_code.definition(
        "vllm.v1.attention.ops.vit_attn_wrappers", "flashinfer_wrapper"
    )
    asserted = {
        ast.unparse(n.test) for n in ast.walk(wrapper) if isinstance(n, ast.Assert)
    }
    assert "sequence_lengths is not None" in asserted


def test_ceil_rounding_replays_an_item_of_the_whole_budget(model) -> None:
    # Finding 4: vLLM's 100 // 3 = 33 tokens per dummy item hold 396 rows; a
    # 20 x 20-patch image is 100 tokens, fits, and needs 400.
    case = CaptureCase(100, 3, 0)
    batch = model.make_batch(torch.Generator().manual_seed(6), "image", [(1, 20, 20)])
    vllm_host, ours = model.hosts()
    for host, rows in ((vllm_host, 396), (ours, 408)):
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            case.budget, case.max_batch_size, 0, CPU, torch.float32
        ).values
        assert captured["pixel_values"].shape[0] == rows
    with pytest.raises(RuntimeError):
        hosts.replay_view(vllm_host, case, [batch])
    view = hosts.replay_view(ours, case, [batch])[0]
    (eager,) = hosts.eager_view(ours, batch)["items"]
    assert not view["violations"] and torch.allclose(view["items"][0], eager)


@pytest.mark.parametrize("case", [CASES[-2], CASES[-1]], ids=["f=56", "f=1200"])
def test_dummy_frames_stop_at_the_tokens_of_an_item(model, case) -> None:
    hosts.check_dummy_frames_stop_at_k(model, case)


def test_selected_grids_stay_tensors_and_work_everywhere(model) -> None:
    hosts.check_selected_grids_work_everywhere(model)


def test_replay_copy_into_fewer_slots_than_vllm_captures(model) -> None:
    # vLLM captures max_frames_per_batch + 1 offsets (1201 here); ours at
    # most token_budget + 1 (65): every batch within the budget still fits.
    case = CaptureCase(64, 2, 1200)
    lengths = []
    for host in model.hosts():
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            case.budget,
            case.max_batch_size,
            case.max_frames_per_batch,
            CPU,
            torch.float32,
        ).values
        lengths.append(captured["cu_seqlens"].shape[0])
    assert lengths == [1201, 65]
    batch = model.make_batch(torch.Generator().manual_seed(8), "video", [(64, 2, 2)])
    ours = model.hosts()[1]
    captured = ours.prepare_encoder_cudagraph_capture_inputs(
        case.budget, case.max_batch_size, case.max_frames_per_batch, CPU, torch.float32
    ).values
    replay = ours.prepare_encoder_cudagraph_replay_buffers(batch, 2, 1200).values
    copy_replay_into_captured(ours.get_encoder_cudagraph_config(), captured, replay)
    assert captured["cu_seqlens"].tolist() == [4 * i for i in range(65)]
