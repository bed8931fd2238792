"""Kimi-K2.5: vLLM 0.33.0's hand-written mixin (``kimi_k25.py``) against
``generated/vllm/kimi_k25.py``, method by method, on one fake host whose
MoonViT3d runs vLLM's own metadata builders (``kimi_k25_vit.py``) and whose
eager forward is vLLM's media parsing and ``vision_tower_forward``.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown right by a test below.
"""

from __future__ import annotations

import ast

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CPU, CaptureCase, HostSettings, Plan
from parity_testlib import Difference, check_differences, method_call_receivers

#: Beyond the RoPE grid: both refuse the capture, with other error types.
BEYOND_ROPE = CaptureCase(4096, 1, 1)
#: One frame slot per item (the manager's default for a config without
#: max_frames_per_video). The fake RoPE grid holds (64 // 2) ** 2 = 1024
#: merged tokens per image.
CASES = (
    CaptureCase(64, 1, 1),
    CaptureCase(100, 4, 4),
    CaptureCase(256, 8, 8),  # FlashInfer: 9 sequences captured, bucket 16
    CaptureCase(30, 4, 4),  # a budget that 4 items do not divide
    CaptureCase(1024, 1, 1),  # the whole RoPE grid in one dummy image
    CaptureCase(300, 1, 1),  # a dummy of 10 x 32 tokens: 1280 > 4 * 300 rows
    BEYOND_ROPE,
)
FLASHINFER = HostSettings(backend="FLASHINFER")
VIT_DP = HostSettings(vit_data_parallel=True)

#: The battery's prefixes: the default run, FlashInfer's, the ViT's own DP.
_ANY = r"^(flashinfer:|dp:)?"
DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference("kimi_k25.backend-guard", (r"^config\[backend=TORCH_SDPA[,\]]",)),
    Difference(
        "kimi_k25.buffer-keys", (r"^config\[[^\]]*\]/buffer_keys(\.len|\[\d+\])$",)
    ),
    Difference(
        "kimi_k25.none-buffers",
        (
            _ANY + r"capture\[[^\]]*\]/(values|forward/calls\[\d+\]/encoder_metadata)"
            r"(\.keys|/sequence_lengths)$",
            _ANY + r"replay\[[^\]]*\]\[\d+\]/(captured|calls\[\d+\]/encoder_metadata)"
            r"(\.keys|/sequence_lengths)$",
        ),
    ),
    Difference(
        "kimi_k25.capture-max-seqlen",
        (
            _ANY + r"capture\[b=300,n=1,f=1\]/(values|forward/calls\[\d+\]/"
            r"encoder_metadata)/max_seqlen\.values$",
            _ANY + r"capture\[b=300,n=1,f=1\]/forward/violations"
            r"(\.keys|/max_seqlen-too-small)",
        ),
    ),
    Difference(
        "kimi_k25.multi-frame-eager",
        (
            r"(^|/)specs(\[[^\]]*\])+(\[1\]|\.keys|/default)$",
            r"^eager\[(flashinfer:)?vision_chunk,[^\]]*\]/items\[\d+\]\.(shape|values)$",
        ),
    ),
    Difference(
        "kimi_k25.flashinfer-sections",
        (
            r"^flashinfer:replay\[[^\]]*\]\[\d+\]/(captured|calls\[\d+\]/"
            r"encoder_metadata)/cu_seqlens\.values$",
            r"^flashinfer:replay\[[^\]]*\]\[\d+\]/items\[\d+\]\.values$",
            r"^flashinfer:replay\[[^\]]*\]\[\d+\]/violations",
        ),
    ),
    Difference("kimi_k25.eager-this-rank", (r"^eager\[dp:",)),
    Difference(
        "kimi_k25.rope-capacity-error",
        (
            _ANY + r"(capture|replay)\[b=4096,n=1,f=1[^\]]*\]"
            r"(\.type_name|\.message|/raised-on-both)$",
        ),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("kimi_k25")


def _capture(host, case: CaptureCase) -> dict[str, torch.Tensor]:
    return host.prepare_encoder_cudagraph_capture_inputs(
        case.budget, case.max_batch_size, case.max_frames_per_batch, CPU, torch.float32
    ).values


def _batch(grids, seed: int = 0) -> dict:
    return hosts.moon3d_batch(
        torch.Generator().manual_seed(seed), "vision_chunk", grids
    )


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    found += hosts.compare_batches(model, Plan(CASES), FLASHINFER, prefix="flashinfer:")
    # A batch with a video chunk (seed 2) under the ViT's own data parallelism.
    found += hosts.compare_batches(model, Plan(CASES[:1], seeds=(2,)), VIT_DP, "dp:")
    check_differences("kimi_k25", found, DIFFERENCES)


def test_torch_sdpa_is_refused_where_vllm_would_read_the_offsets(
    model, vllm_code
) -> None:
    vllm_host, ours = model.hosts(HostSettings(backend="TORCH_SDPA"))
    assert vllm_host.get_encoder_cudagraph_config().modalities == ["vision_chunk"]
    with pytest.raises(ValueError, match="TORCH_SDPA"):
        ours.get_encoder_cudagraph_config()
    sdpa = vllm_code.definition(
        "vllm.v1.attention.ops.vit_attn_wrappers", "torch_sdpa_wrapper"
    )
    # A host read of the device offsets, which a CUDA graph capture refuses.
    assert any("cu_seqlens" in r for r in method_call_receivers(sdpa, "tolist"))


def test_buffer_keys_name_every_buffer_the_graph_reads(model) -> None:
    vllm_host, ours = model.hosts(FLASHINFER)
    case = CaptureCase(64, 2, 2)
    for host in (vllm_host, ours):
        captured = _capture(host, case)
        tower = hosts.model_tower(host)
        tower.reset()
        host.encoder_cudagraph_forward(dict(captured))
        # FlashInfer's sequence lengths are captured and read by the graph
        # (and the manager copies every captured value at replay) ...
        assert tower.calls[0]["encoder_metadata"]["sequence_lengths"] is not None
        keys = host.get_encoder_cudagraph_config().buffer_keys
        assert set(keys) - {"pixel_values"} <= set(captured)
        missing = set(captured) - set(keys)
        # ... but vLLM's buffer_keys leave them out; ours list them.
        assert missing == ({"sequence_lengths"} if host is vllm_host else set())


def test_a_none_buffer_is_one_the_manager_and_the_tower_skip(model) -> None:
    vllm_host, ours = model.hosts()
    case = CaptureCase(100, 4, 4)
    theirs, mine = _capture(vllm_host, case), _capture(ours, case)
    assert "sequence_lengths" not in theirs and mine["sequence_lengths"] is None
    # The tower reads it with .get(): vLLM's own graph forward on our values
    # (the key with None) computes what it computes on its own.
    assert torch.equal(
        vllm_host.encoder_cudagraph_forward(dict(theirs)),
        vllm_host.encoder_cudagraph_forward(dict(mine)),
    )
    batch = _batch([(1, 4, 6), (1, 2, 2)])
    views = [hosts.replay_view(h, case, [batch])[0] for h in (vllm_host, ours)]
    for a, b in zip(views[0]["items"], views[1]["items"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("settings", [HostSettings(), FLASHINFER], ids=str)
def test_the_capture_dummy_runs_within_its_max_seqlen(model, settings) -> None:
    # Budget 300 in one item: the RoPE-bounded dummy is 10 rows of 32 tokens,
    # 1280 patches, beyond vLLM's max_seqlen of 4 * 300.
    case = CaptureCase(300, 1, 1)
    results = []
    for host in model.hosts(settings):
        captured = _capture(host, case)
        tower = hosts.model_tower(host)
        tower.reset()
        host.encoder_cudagraph_forward(dict(captured))
        results.append((int(captured["max_seqlen"]), dict(tower.violations)))
    (vllm_bound, vllm_violations), (our_bound, our_violations) = results
    assert vllm_bound == 1200 and "max_seqlen-too-small" in vllm_violations
    assert our_bound == 1280 and not our_violations


def test_a_video_chunk_counts_its_real_tokens_and_runs_eagerly(model) -> None:
    """A 4-frame chunk of 8 x 8 patches has 16 output tokens: vLLM says
    2**30 (which the data-parallel gather allocates rows for, finding 19);
    ours says 16 and keeps it out of every budget instead. Through the
    runtime's manager, the chunk's rows are the eager forward's and the
    image's are the graph's."""
    vllm_host, ours = model.hosts()
    batch = _batch([(4, 8, 8), (1, 4, 6)])
    vllm_chunk, vllm_image = vllm_host.get_encoder_cudagraph_item_specs(batch)
    chunk, image = ours.get_encoder_cudagraph_item_specs(batch)
    assert vllm_chunk.output_tokens == 2**30
    assert chunk.output_tokens == 16 and chunk.get_path_output_tokens("default") > 2**60
    assert image.output_tokens == vllm_image.output_tokens == 6
    manager = hosts.runtime_manager(ours, [64], 2)
    manager.capture()
    rows = manager.execute(batch)
    assert [r.shape[0] for r in rows] == [16, 6]
    eager = [
        ours.encoder_eager_forward(ours.select_encoder_cudagraph_items(batch, [i]))
        for i in (0, 1)
    ]
    for got, want in zip(rows, eager, strict=True):
        assert torch.allclose(got, want)


def test_flashinfer_replays_read_the_v_rows_of_their_own_batch(model) -> None:
    # 8 items per batch: 9 sequences captured (bucket 16), 3 replayed
    # (bucket 8): vLLM's padding logic repeats the last V offset over the
    # captured V section; ours pads each section on its own.
    case = CaptureCase(256, 8, 8)
    batch = _batch([(1, 4, 4), (1, 2, 6), (1, 6, 2)], seed=3)
    results = []
    for host in model.hosts(FLASHINFER):
        replayed = hosts.replay_view(host, case, [batch])[0]
        eager = hosts.eager_view(host, batch)["items"]
        results.append((replayed, eager))
    (vllm_view, vllm_eager), (our_view, our_eager) = results
    captured = vllm_view["captured"]["cu_seqlens"]
    assert captured.shape[0] == 2 * (16 + 1)
    # The wrapper splits the buffer in the middle: vLLM's V section is the
    # replay's last V offset, 17 times (the V rows past the batch's).
    v_total = int(vllm_view["replay"]["cu_seqlens"][-1])
    assert captured[17:].tolist() == [v_total] * 17
    assert not any(
        torch.allclose(r, e)
        for r, e in zip(vllm_view["items"], vllm_eager, strict=True)
    )
    assert not our_view["violations"]
    for r, e in zip(our_view["items"], our_eager, strict=True):
        assert torch.allclose(r, e)


def test_the_eager_forward_runs_on_this_rank_alone(model) -> None:
    """With the ViT's data parallelism on, vLLM's eager forward spreads the
    batch over the ranks again (a collective, finding 22); ours computes the
    rows here, the same as vLLM's forward does on one rank."""
    batch = _batch([(4, 4, 4), (1, 2, 6)])
    vllm_dp, ours_dp = model.hosts(VIT_DP)
    vllm_one_rank, _ = model.hosts()
    with pytest.raises(hosts.ViTDataParallelCollective):
        vllm_dp.encoder_eager_forward(batch)
    assert torch.equal(
        ours_dp.encoder_eager_forward(batch), vllm_one_rank.encoder_eager_forward(batch)
    )


def test_a_budget_beyond_the_rope_grid_is_refused_with_value_error(
    model, vllm_code
) -> None:
    vllm_host, ours = model.hosts()
    # vLLM checks the capacity with a Python assert, which `python -O`
    # compiles away (then the capture builds a dummy taller than the table) ...
    with pytest.raises(AssertionError, match="RoPE grid capacity"):
        _capture(vllm_host, BEYOND_ROPE)
    capture = vllm_code.definition(
        hosts.KIMI_K25,
        "KimiK25ForConditionalGeneration.prepare_encoder_cudagraph_capture_inputs",
    )
    checks = [n for n in ast.walk(capture) if isinstance(n, ast.Assert)]
    assert len(checks) == 1 and "rope" in ast.unparse(checks[0].test).lower()
    # ... ours raises ValueError whatever the flags, naming both sides.
    with pytest.raises(ValueError, match=r"RoPE grid: needs ho \* kh <= rope_h"):
        _capture(ours, BEYOND_ROPE)
