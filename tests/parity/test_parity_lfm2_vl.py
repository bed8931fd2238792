"""LFM2-VL: vLLM 0.33.0's hand-written mixin (``lfm2_vl.py``, on vLLM's own
packed position embeddings, eager path and projector unshuffles) against
``generated/vllm/lfm2_vl.py``, whose spec builds in steps what vLLM builds in
six private helpers (packed pixels, position embeddings, offsets, gather
indices).

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test.
"""

from __future__ import annotations

import ast

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import LFM2_MIN_TOKENS as M
from parity_hosts import CaptureCase, HostSettings, Plan
from parity_testlib import (
    Difference,
    check_differences,
    copy_replay_into_captured,
    method_call_receivers,
)

CASES = (
    CaptureCase(M, 1, 0),
    CaptureCase(4 * M + 1, 4, 0),  # a partial last tile
    CaptureCase(16 * M, 2, 0),  # more tiles than images per batch
)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "lfm2_vl.backend-guard",
        (r"^config\[backend=(TORCH_SDPA|FLASHINFER)",),
    ),
    Difference(
        "lfm2_vl.cu-seqlens-slots",
        (
            r"^(bf16:)?capture\[[^]]*\]/(values|forward/calls\[0\])/cu_seqlens\.",
            r"^(bf16:)?replay\[[^]]*\]\[\d+\]/(captured|calls\[0\])/cu_seqlens\.",
        ),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("lfm2_vl")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    # Pixels in another dtype than the model's (float32 here).
    found += hosts.compare_batches(
        model,
        Plan(CASES[:2], seeds=(0,), batch_options=(("dtype", torch.bfloat16),)),
        prefix="bf16:",
    )
    check_differences("lfm2_vl", found, DIFFERENCES)


def test_capture_guards_the_backends_vllm_cannot_capture(model, vllm_code) -> None:
    # vLLM's mixin returns a config under TORCH_SDPA and FLASHINFER ...
    for backend in ("TORCH_SDPA", "FLASHINFER"):
        vllm_host, ours = model.hosts(HostSettings(backend=backend))
        assert vllm_host.get_encoder_cudagraph_config().modalities == ["image"]
        with pytest.raises(ValueError, match=backend):
            ours.get_encoder_cudagraph_config()
    # ... but its TORCH_SDPA attention reads cu_seqlens on the host (a sync a
    # CUDA graph capture refuses) ...
    sdpa = vllm_code.definition(
        "vllm.v1.attention.ops.vit_attn_wrappers", "torch_sdpa_wrapper"
    )
    assert any("cu_seqlens" in r for r in method_call_receivers(sdpa, "tolist"))
    # ... and FlashInfer's cuDNN path needs sequence_lengths, which neither
    # the tower's metadata nor its attention call provides.
    attention = vllm_code.definition(hosts.LFM2_SIGLIP2, "Siglip2Attention.forward")
    keywords = {
        k.arg
        for n in ast.walk(attention)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.attn"
        for k in n.keywords
    }
    assert "cu_seqlens" in keywords and "sequence_lengths" not in keywords


def test_tiles_below_the_minimum_fit_the_captured_offsets(model) -> None:
    # Finding 17's batch: the budget-64 graph of a model-level minimum of 64
    # tokens, two images of one 2 x 32-patch tile (16 tokens each), as the
    # processor makes them under a request's lower minimum. vLLM captured two
    # offsets and its padding copy raises; ours has a slot for every tile a
    # batch within the budget can bring (token_budget + 1), and the graph's
    # rows are the eager path's.
    vllm_host = hosts.lfm2_vl_host(min_image_tokens=64)
    ours = hosts.lfm2_vl_host(min_image_tokens=64, ours=True)
    case = CaptureCase(64, 2, 0)
    batch = hosts.lfm2_vl_batch(torch.Generator().manual_seed(0), [[(2, 32)]] * 2)
    for host in (vllm_host, ours):
        specs = host.get_encoder_cudagraph_item_specs(batch)
        assert [s.output_tokens for s in specs] == [16, 16]
    rows = {}
    for host in (vllm_host, ours):
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            64, 2, 0, torch.device("cpu"), torch.float32
        ).values
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 2, 0).values
        config = host.get_encoder_cudagraph_config()
        if host is vllm_host:
            assert captured["cu_seqlens"].tolist() == [0, 256]
            with pytest.raises(RuntimeError):
                copy_replay_into_captured(config, captured, replay)
            continue
        assert captured["cu_seqlens"].shape == (65,)
        copy_replay_into_captured(config, captured, replay)
        assert captured["cu_seqlens"][:3].tolist() == [0, 64, 128]
        rows["graph"] = host.encoder_cudagraph_forward(dict(captured))[:32]
    rows["eager"] = vllm_host.encoder_eager_forward(batch)
    assert torch.equal(rows["graph"], rows["eager"])


def test_a_tower_without_post_layernorm(model) -> None:
    # The post layernorm is None when the tower keeps fewer layers: both
    # mixins skip it, and their graphs give the eager path's rows.
    code, vllm_class, make_host = hosts._lfm2_vl_vllm()
    batch = hosts.lfm2_vl_batch(torch.Generator().manual_seed(2), [[(4, 4), (2, 6)]])
    for host_class in (vllm_class, model.our_host):
        host = make_host(host_class, HostSettings(), post_layernorm=False)
        values = host.prepare_encoder_cudagraph_capture_inputs(
            64, 1, 0, torch.device("cpu"), torch.float32
        ).values
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 1, 0).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), values, replay)
        out = host.encoder_cudagraph_forward(dict(values))[:7]
        assert torch.equal(out, vllm_class.encoder_eager_forward(host, batch))
