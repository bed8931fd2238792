"""DeepSeek-V4.1: vLLM 0.33.0's hand-written mixin
(``vllm/models/deepseek_v41/common/vl_cudagraph.py``, on the DeepSeek-V4
vision helpers ``build_packed_vit_metadata`` / ``build_packed_merge_metadata``)
against ``generated/vllm/deepseek_v41.py``.

Every difference the battery finds must be one of ``DIFFERENCES``, each
listed in docs/vllm-differences.md and shown by a test below.
"""

from __future__ import annotations

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CPU, CaptureCase, HostSettings, Plan
from parity_testlib import Difference, check_differences, copy_replay_into_captured

CASES = (
    CaptureCase(16, 1, 0),
    CaptureCase(64, 4, 0),
    CaptureCase(30, 4, 0),  # a budget that 4 items do not divide
    CaptureCase(128, 3, 0),
)
#: 4 items per batch: 5 offsets at most, in 6 captured cu_seqlens slots
#: (vLLM) or 5 (ours).
EDGE = CaptureCase(64, 4, 0)

DIFFERENCES = (
    hosts.SELECTION_ALIASES,
    Difference(
        "deepseek_v41.budget-unit",
        (
            r"specs\[.*/default$",
            # The largest budget: a step's output tokens in vLLM, the patches
            # they can bring (r * r each) here.
            r"budget_range\[.*\]\[1\]$",
            r"specs\[.*\.keys$",
            r"capture\[.*/values/",
            r"capture\[.*/forward/shape",
            r"replay\[.*/captured/\w+\.(shape|values)$",
            # What the packed ViT receives and returns: the captured buffers.
            r"(capture\[.*/forward/|replay\[.*/)calls\[\d+\]/"
            r"(patches|cos|sin|output)\.",
            r"capture\[.*/forward/calls\[\d+\]/(cu_seqlens|max_seqlen)\.values$",
            # A batch of exactly the budget's patches fills our captured rows
            # (its last offset is their count), never vLLM's r * r as many.
            r"replay\[.*/cu_seqlens_tail$",
        ),
    ),
    Difference(
        "deepseek_v41.cu-seqlens-slots",
        (
            r"capture\[.*/forward/calls\[\d+\]/cu_seqlens\.shape$",
            r"replay\[.*/(captured|calls\[\d+\])/cu_seqlens\.(shape|values)$",
            r"^padding\[.*\]/(no-spare-slot|unregistered)\.(shape|values)$",
        ),
    ),
    Difference(
        "deepseek_v41.error-messages",
        (r"^config\[[^\]]*\](/capture)?\.message$",),
    ),
    Difference(
        "deepseek_v41.replay-max-seqlen",
        (
            r"replay\[.*/replay\.keys$",
            r"replay\[.*/replay/max_seqlen\.",
            r"replay\[.*/(captured|calls\[\d+\])/max_seqlen\.values$",
        ),
    ),
)


@pytest.fixture(scope="module")
def model() -> hosts.ModelParity:
    return hosts.parity("deepseek_v41")


def test_every_difference_from_vllm_is_listed(model) -> None:
    found = hosts.compare_configs(model) + hosts.compare_batches(model, Plan(CASES))
    found += hosts.compare_padding_edges(model, EDGE)
    # The capture refuses an image limit of 0 (the config does not).
    found += hosts.compare(
        model,
        "config[image_limit=0]/capture",
        lambda h: hosts.capture_view(h, EDGE),
        HostSettings(image_limit=0),
    )
    check_differences("deepseek_v41", found, DIFFERENCES)


def test_refusals_are_vllms_and_name_the_model() -> None:
    """The same refusals with the same exception types, each naming the
    option that lifts it; the messages are the template's: dynamic FP8's
    says why it cannot be captured, the backend refusal puts a comma before
    its alternative, the capture refusal under an image limit of 0 names the
    model."""
    model = hosts.parity("deepseek_v41")
    differing = hosts.check_refusals_name_the_same_fix(model)
    refused = {"TORCH_SDPA", "FLASHINFER"}
    assert set(differing) == {
        hosts.settings_label(HostSettings(backend=b, **extra))
        for b in hosts.BACKENDS
        for extra in hosts.MULTIMODAL_SETTINGS
        if extra.get("fp8") == "dynamic" or b in refused
    }
    for theirs, ours in differing.values():
        if "FP8" in ours:
            assert "amax history on the host" in ours
        else:
            assert ours == theirs.replace("FLASH_ATTN or", "FLASH_ATTN, or")
    raised = []
    for host in model.hosts(HostSettings(image_limit=0)):
        with pytest.raises(RuntimeError, match="image limit is 0") as info:
            hosts.capture_view(host, EDGE)
        raised.append(str(info.value))
    assert "DeepSeek-V4.1" in raised[1] and "DeepSeek-V4.1" not in raised[0]


def test_padding_repeats_the_last_offset_into_one_slot_fewer(model) -> None:
    """Both sides close a batch with zero-length sequences (the tail repeats
    the last offset) and pad whatever buffer and offsets they are given.
    vLLM captures ``max_batch_size + 2`` slots, ours ``max_batch_size + 1``,
    the offsets of a full batch: vLLM's extra slot only ever holds one more
    zero-length sequence."""
    vllm_view, our_view = (
        hosts.padding_edges_view(host, EDGE, "cu_seqlens") for host in model.hosts()
    )
    assert vllm_view["no-spare-slot"].tolist() == list(range(6))
    assert our_view["no-spare-slot"].tolist() == list(range(5))
    assert vllm_view["unregistered"].tolist() == [0, 1] + [1] * 4
    assert our_view["unregistered"].tolist() == [0, 1] + [1] * 3
    batch = model.make_batch(
        torch.Generator().manual_seed(2), "image", [(3, 4), (2, 2)]
    )
    theirs, ours = (
        _replayed(host, EDGE, batch)["cu_seqlens"] for host in model.hosts()
    )
    assert ours.tolist() == [0, 12, 16, 16, 16]
    assert theirs.tolist() == ours.tolist() + [16]


def _replayed(host, case: CaptureCase, batch) -> dict[str, torch.Tensor]:
    captured = host.prepare_encoder_cudagraph_capture_inputs(
        case.budget, case.max_batch_size, 0, CPU, torch.float32
    ).values
    replay = host.prepare_encoder_cudagraph_replay_buffers(
        batch, case.max_batch_size, 0
    ).values
    copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
    return captured


def _budget_for(host, batch, ladder: list[int]) -> int:
    tokens = sum(
        s.get_path_output_tokens("default")
        for s in host.get_encoder_cudagraph_item_specs(batch)
    )
    return next(b for b in ladder if b >= tokens)


def test_patch_budgets_fit_every_batch_with_fewer_padding_patches(model) -> None:
    # The automatic ladder of budget range (64, 8192): 64, 128, ..., 8192.
    ladder = [64 * 2**i for i in range(8)]
    gen = torch.Generator().manual_seed(4)
    captured_patches = {"vllm": 0, "ours": 0}
    real = 0
    for _ in range(12):
        count = int(torch.randint(1, 4, (1,), generator=gen))
        grids = [
            tuple(torch.randint(1, 40, (2,), generator=gen).tolist())
            for _ in range(count)
        ]
        batch = model.make_batch(gen, "image", grids)
        real += sum(h * w for h, w in grids)
        for side, host in zip(("vllm", "ours"), model.hosts(), strict=True):
            case = CaptureCase(_budget_for(host, batch, ladder), 4, 0)
            patches = _replayed(host, case, batch)["patches"]
            # Both captures hold every batch within their budget ...
            assert patches.shape[0] >= sum(h * w for h, w in grids)
            captured_patches[side] += patches.shape[0]
    # ... and counted in patches, the ViT runs on fewer padding patches.
    assert real <= captured_patches["ours"] < captured_patches["vllm"]


@pytest.mark.parametrize("pixels", [224, 448, 896])
def test_the_largest_budget_holds_a_step_of_images_on_both_sides(model, pixels) -> None:
    """A scheduler step full of images (their output tokens summed within
    ``min(max_num_batched_tokens, max_model_len)``) fits the largest budget
    of vLLM's mixin, counted in output tokens, and of ours, counted in
    patches (r * r per output token at most); a largest budget of the step's
    token count in patches would hold a fifth to an eighth of it."""
    settings = HostSettings(max_num_batched_tokens=16384, max_model_len=32768)
    side = pixels // 14  # patches per side at patch size 14
    for host in model.hosts():
        r = host.config.vision_downsample_ratio
        lh = lw = -(-side // r)
        per_image = lh * (lw + 1) + 2
        batch = model.make_batch(
            torch.Generator().manual_seed(5),
            "image",
            [(side, side)] * (16384 // per_image),
        )
        tokens = sum(
            s.get_path_output_tokens("default")
            for s in host.get_encoder_cudagraph_item_specs(batch)
        )
        _, largest = host.get_encoder_cudagraph_budget_range(settings.vllm_config())
        assert tokens <= largest
    patches = len(batch["vit_grid"]) * side * side
    # In patches the step is 5.8x (224 px) to 8.1x (896 px) its tokens: a
    # largest budget of 16384 patches would hold less than a fifth of it.
    assert patches > 5 * 16384


def test_both_leave_the_padding_vit_rows_unwritten(model) -> None:
    case = CaptureCase(64, 4, 0)
    batch = model.make_batch(
        torch.Generator().manual_seed(2), "image", [(3, 4), (2, 2)]
    )
    vit_rows, items = [], []
    for host in model.hosts():
        captured = _replayed(host, case, batch)
        host.vision.reset()
        out = host.encoder_cudagraph_forward(dict(captured))
        vit_rows.append(host.vision.calls[-1]["output"])
        items.append(hosts.postprocess_view(host, batch, out))
    real = 3 * 4 + 2 * 2
    # Zero-length sequences on both sides: attention never writes the ViT
    # rows past the real ones (NaN here; zeros on CUDA, where vLLM's
    # FlashAttention wrapper allocates its output with torch.zeros during
    # capture, a fill the graph replays); the aligner's masked gather keeps
    # them out of the image rows.
    for vit in vit_rows:
        assert vit[real:].isnan().all() and not vit[:real].isnan().any()
    assert vit_rows[1].shape[0] < vit_rows[0].shape[0]  # patches: fewer rows
    assert all(torch.equal(a, b) for a, b in zip(*items, strict=True))


def test_max_seqlen_replay_copy_is_a_dead_write_in_vllm(model) -> None:
    case = CaptureCase(64, 4, 0)
    batch = model.make_batch(torch.Generator().manual_seed(3), "image", [(2, 3)])
    bounds = []
    for host in model.hosts():
        captured = host.prepare_encoder_cudagraph_capture_inputs(
            case.budget, case.max_batch_size, 0, CPU, torch.float32
        ).values
        before = int(captured["max_seqlen"])
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 4, 0).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
        bounds.append((before, int(captured["max_seqlen"])))
    # vLLM's packed-ViT attention reads max_seqlen on the host at capture
    # (see the Qwen2-VL test of the same difference); the copy vLLM asks for
    # overwrites the captured scalar with this batch's 6 rows.
    (vllm_before, vllm_after), (ours_before, ours_after) = bounds
    assert vllm_after == 6 < vllm_before
    assert ours_after == ours_before
