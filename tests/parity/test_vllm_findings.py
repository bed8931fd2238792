"""Bugs in vLLM 0.33.0's hand-written mixins (docs/vllm-findings.md), each
reproduced by running vLLM's own code, read from the wheel, on CPU.

"Fits" below means what the manager packs by: at most ``max_batch_size``
items and at most the budget in budget tokens. Such a batch is replayed into
the graph of that budget; the replay must not fail and must compute every
real row.
"""

from __future__ import annotations

import ast

import pytest
import torch

import parity_hosts as hosts
from parity_hosts import CPU, CaptureCase
from encoder_cudagraph_runtime.defs import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG
from encoder_cudagraph_runtime.budget_ladder import resolve_budget_ladder
from parity_testlib import copy_replay_into_captured


def _capture(host, case: CaptureCase) -> dict[str, torch.Tensor]:
    return host.prepare_encoder_cudagraph_capture_inputs(
        case.budget, case.max_batch_size, case.max_frames_per_batch, CPU, torch.float32
    ).values


def _fits(host, batch, case: CaptureCase) -> bool:
    specs = host.get_encoder_cudagraph_item_specs(batch)
    return len(specs) <= case.max_batch_size and (
        sum(s.output_tokens for s in specs) <= case.budget
    )


@pytest.mark.parametrize(
    ("case", "modality", "grids", "offsets"),
    [
        # Images into a graph captured with room for videos (the automatic
        # max_frames_per_batch is max_batch_size * max_frames_per_video).
        (
            CaptureCase(64, 4, 16),
            "image",
            [(1, 4, 4), (1, 2, 6)],
            [0, 16, 28, 28, 28] + [0] * 12,
        ),
        # Videos into a graph with fewer frame slots than items (a user-set
        # max_frames_per_batch below max_vision_items_per_batch).
        (CaptureCase(64, 4, 2), "video", [(1, 2, 4), (1, 4, 2)], [0, 8, 16, 0, 0]),
    ],
)
def test_qwen2_vl_replay_leaves_a_decreasing_cu_seqlens(
    case, modality, grids, offsets
) -> None:
    model = hosts.parity("qwen2_vl")
    vllm_host, ours = model.hosts()
    batch = model.make_batch(torch.Generator().manual_seed(0), modality, grids)
    assert _fits(vllm_host, batch, case)
    results = []
    for host in (vllm_host, ours):
        captured = _capture(host, case)
        replay = host.prepare_encoder_cudagraph_replay_buffers(
            batch, case.max_batch_size, case.max_frames_per_batch
        ).values
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
        tower = hosts.model_tower(host)
        tower.reset()
        host.encoder_cudagraph_forward(dict(captured))
        results.append((captured["cu_seqlens"], dict(tower.violations)))
    (vllm_cu, vllm_violations), (our_cu, our_violations) = results
    # vLLM pads the replay's cu_seqlens to a length that depends on the
    # modality, shorter than the captured buffer; the manager's default copy
    # zeroes the rest: the offsets fall back to 0, against the varlen contract.
    assert vllm_cu.tolist() == offsets
    assert "cu_seqlens-decreasing" in vllm_violations
    assert not (our_cu[1:] < our_cu[:-1]).any() and not our_violations


@pytest.mark.parametrize("stem", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_qwen2_vl_more_frames_than_the_user_set_maximum_fail_at_replay(stem) -> None:
    # encoder_cudagraph_max_frames_per_batch=2 with 2 items per batch: the
    # manager packs by items and tokens, not frames, so two videos of 3 and 2
    # frames (10 tokens) go to the budget-64 graph, whose cu_seqlens has
    # slots for 2 frames. The generated module sizes cu_seqlens the same
    # way and fails alike (see the findings document). Qwen2.5-VL and
    # Qwen3-VL copy the mechanism.
    model = hosts.parity(stem)
    case = CaptureCase(64, 2, 2)
    batch = model.make_batch(
        torch.Generator().manual_seed(1), "video", [(3, 2, 2), (2, 2, 2)]
    )
    for host in model.hosts():
        assert _fits(host, batch, case)
        captured = _capture(host, case)
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 2, 2).values
        with pytest.raises(RuntimeError):
            copy_replay_into_captured(
                host.get_encoder_cudagraph_config(), captured, replay
            )


def test_kimi_vl_captures_max_seqlen_below_an_image_within_the_budget() -> None:
    host = hosts.kimi_vl_host()
    case = CaptureCase(64, 1, 0)
    captured = _capture(host, case)
    # The graph keeps the max_seqlen it was captured with: token_budget,
    # counted in output tokens.
    baked = int(captured["max_seqlen"])
    assert baked == case.budget
    # A 16 x 16-patch image is 64 output tokens after the 2 x 2 merge: it
    # fits the budget, and its one attention sequence has 256 rows.
    patches = 16 * 16
    batch = {
        "pixel_values": torch.randn(
            patches, 3, hosts.PATCH, hosts.PATCH, generator=torch.Generator()
        ),
        "image_grid_hws": torch.tensor([[16, 16]]),
    }
    assert _fits(host, batch, case)
    replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 1, 0).values
    copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)
    violations: dict[str, list[str]] = {}
    rows = torch.randn(captured["pixel_values"].shape[0], hosts.WIDTH)
    out = hosts.varlen_attention(rows, captured["cu_seqlens"], baked, violations)
    # FlashAttention launches query blocks for max_seqlen rows per sequence:
    # 192 of the image's 256 rows are never computed.
    assert violations["max_seqlen-too-small"]
    assert int(out[:patches].isnan().any(dim=1).sum()) == patches - baked


def test_glm4_1v_floor_rounding_captures_fewer_rows_than_the_budget() -> None:
    host = hosts.glm4_1v_host()
    case = CaptureCase(100, 3, 0)
    captured = _capture(host, case)
    # 100 // 3 = 33 tokens per dummy item: 99 tokens, 396 pixel rows.
    assert captured["pixel_values"].shape[0] == 3 * 33 * 4
    # One 20 x 20-patch image is 100 tokens: it fits the budget-100 graph.
    batch = {
        "pixel_values": torch.randn(400, hosts.PIXEL_COLUMNS),
        "image_grid_thw": torch.tensor([[1, 20, 20]]),
    }
    assert _fits(host, batch, case)
    replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 3, 0).values
    with pytest.raises(RuntimeError, match="396"):
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)


def test_gemma3_clamps_the_captured_crops_to_the_items_per_batch() -> None:
    host = hosts.gemma3_host()
    tokens = hosts.GEMMA3_TOKENS  # per crop (256 in the released models)
    # A user-set encoder_cudagraph_max_vision_items_per_batch of 1.
    case = CaptureCase(4 * tokens, 1, 0)
    captured = _capture(host, case)
    # min(token_budget // tokens, max_batch_size) = 1 crop.
    assert captured["pixel_values"].shape[0] == 1
    # One image of 4 pan-and-scan crops (3 crops and the original) is
    # 4 * tokens: it fits the graph.
    batch = hosts.crops_batch(torch.Generator().manual_seed(0), "image", [(4,)])
    assert _fits(host, batch, case)
    replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 1, 0).values
    with pytest.raises(RuntimeError, match="broadcast"):
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)


def test_gemma3_clamp_bites_with_the_automatic_ladder_at_large_limits() -> None:
    # No user setting but pan-and-scan and large limits: the released models'
    # 256 tokens per crop, --max-num-batched-tokens 131072 and a 131072-token
    # model length. The manager's automatic ladder and items per batch:
    budgets, max_items = resolve_budget_ladder([], 0, lambda: (256, 131072))
    assert (budgets[-1], max_items) == (131072, 256)
    host = hosts.gemma3_host()
    host.config.mm_tokens_per_image = 256
    case = CaptureCase(budgets[-1], max_items, 0)
    captured = _capture(host, case)
    # min(131072 // 256, 256) = 256 crops, half of what the budget holds.
    assert captured["pixel_values"].shape[0] == 256
    # 100 pan-and-scan images of 4 crops: 102400 tokens, 100 items: it fits.
    batch = hosts.crops_batch(torch.Generator().manual_seed(0), "image", [(4,)] * 100)
    assert _fits(host, batch, case)
    replay = host.prepare_encoder_cudagraph_replay_buffers(batch, max_items, 0).values
    with pytest.raises(RuntimeError, match="256.*400"):
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)


def test_idefics3_selection_moves_the_tile_counts_to_the_pixels_device() -> None:
    # The processor keeps num_patches on the host; vLLM's selection rebuilds
    # it on pixel_values' device (a host-to-device copy), and every later
    # read of the selection's item specs (the manager reads them before each
    # replay) copies it back with .tolist(): a blocking sync per replayed
    # batch on a GPU. The meta device stands in for the GPU: its tensors
    # hold no data the host could read back.
    _, host_class, make_host = hosts._idefics3_vllm()
    host = make_host(host_class, hosts.HostSettings())
    batch = hosts.idefics3_batch(
        torch.Generator().manual_seed(0), "image", [(1,), (3,)]
    )
    on_device = {
        key: value if key == "num_patches" else value.to("meta")
        for key, value in batch.items()
    }
    assert on_device["num_patches"].device.type == "cpu"
    selected = host.select_encoder_cudagraph_items(on_device, [1])
    assert selected["num_patches"].device.type == "meta"
    with pytest.raises(NotImplementedError, match="meta"):
        host.get_encoder_cudagraph_item_specs(selected)


def test_lfm2_vl_tiles_below_the_minimum_overflow_the_captured_offsets() -> None:
    # The mixin sizes cu_seqlens for ceil(budget / min_image_tokens) tiles,
    # min_image_tokens being the model-level setting (64 here). The budget-64
    # graph has room for one tile. Two images of one 2 x 32-patch tile are
    # 16 tokens each (after the 2 x 2 merge): the processor makes such tiles
    # when its minimum is lower than the one the mixin reads (a request's
    # mm_processor_kwargs, or a checkpoint whose preprocessor config sets it
    # while its model config does not). They fit the budget and the items.
    host = hosts.lfm2_vl_host(min_image_tokens=64)
    case = CaptureCase(64, 2, 0)
    captured = _capture(host, case)
    assert captured["cu_seqlens"].tolist() == [0, 256]
    batch = hosts.lfm2_vl_batch(torch.Generator().manual_seed(0), [[(2, 32)]] * 2)
    assert _fits(host, batch, case)
    replay = host.prepare_encoder_cudagraph_replay_buffers(batch, 2, 0).values
    assert replay["cu_seqlens"].tolist() == [0, 64, 128]
    with pytest.raises(RuntimeError, match=r"\(2\).*\(3\)"):
        copy_replay_into_captured(host.get_encoder_cudagraph_config(), captured, replay)


def _inside_sync_allowed(tree, call: str) -> list[bool]:
    """For each call of ``call`` in ``tree``: whether a ``with
    gpu_sync_allowed()`` block encloses it."""
    found = []

    def visit(node, allowed: bool) -> None:
        if isinstance(node, ast.With) and any(
            "gpu_sync_allowed" in ast.unparse(item.context_expr) for item in node.items
        ):
            allowed = True
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(call):
            found.append(allowed)
        for child in ast.iter_child_nodes(node):
            visit(child, allowed)

    visit(tree, False)
    return found


def test_kimi_vl_selection_puts_the_grid_where_replay_must_read_it_back(
    vllm_code,
) -> None:
    vllm_host = hosts.kimi_vl_host()
    batch = hosts.kimi_vl_batch([(4, 6), (2, 2)])
    # The pixel values live on the accelerator; the meta device stands in for
    # it on CPU: a tensor there has no data the host can read.
    batch["pixel_values"] = batch["pixel_values"].to("meta")
    picked = vllm_host.select_encoder_cudagraph_items(batch, [1, 0])
    # vLLM builds the selected grid on the pixels' device ...
    assert picked["image_grid_hws"].device.type == "meta"
    # ... and the replay reads it back to the host (`.tolist()`): on a GPU a
    # blocking copy before every replay, which the manager makes outside
    # gpu_sync_allowed (unlike its item-spec and selection calls).
    with pytest.raises(NotImplementedError):
        vllm_host.prepare_encoder_cudagraph_replay_buffers(picked, 2, 0)
    manager = vllm_code.definition(
        "vllm.v1.worker.encoder_cudagraph", "EncoderCudaGraphManager"
    )
    assert _inside_sync_allowed(
        manager, "prepare_encoder_cudagraph_replay_buffers"
    ) == [False]
    assert all(_inside_sync_allowed(manager, "get_encoder_cudagraph_item_specs"))


# Qwen2-VL's mechanism in the mixins that copy it without a padding logic:
# the builder pads the captured cu_seqlens to max_frames_per_batch, an image
# replay's to max_batch_size, and the manager's default copy zeroes the rest.
QWEN_FAMILY_DEFAULT_COPY = ["qwen3_vl", "cohere_compass", "glm4_1v"]


@pytest.mark.parametrize("stem", QWEN_FAMILY_DEFAULT_COPY)
def test_qwen_family_replay_leaves_a_decreasing_cu_seqlens(stem) -> None:
    model = hosts.parity(stem)
    case = CaptureCase(64, 4, 16)
    batch = model.make_batch(
        torch.Generator().manual_seed(0), "image", [(1, 4, 4), (1, 2, 6)]
    )
    views = []
    for host in model.hosts():
        assert _fits(host, batch, case)
        views.append(hosts.replay_view(host, case, [batch])[0])
    vllm_view, our_view = views
    assert (
        vllm_view["captured"]["cu_seqlens"].tolist() == [0, 16, 28, 28, 28] + [0] * 12
    )
    assert "cu_seqlens-decreasing" in vllm_view["violations"]
    ours = our_view["captured"]["cu_seqlens"]
    assert not (ours[1:] < ours[:-1]).any() and not our_view["violations"]


@pytest.mark.parametrize("stem", ["qwen3_vl", "cohere_compass"])
def test_qwen_family_flashinfer_replay_reads_v_rows_at_wrong_offsets(stem) -> None:
    # 8 items and 16 frame slots (F = 2): the capture's sections are padded to
    # the batch bucket of 16 sequences, an image replay's to that of 8; the
    # default copy puts the replay's V section where the Q/K/O one ends.
    model = hosts.parity(stem)
    settings = hosts.HostSettings(backend="FLASHINFER")
    case = CaptureCase(128, 8, 16)
    batch = model.make_batch(
        torch.Generator().manual_seed(3), "image", [(1, 4, 4), (1, 2, 6), (1, 6, 2)]
    )
    results = []
    for host in model.hosts(settings):
        assert _fits(host, batch, case)
        replayed = hosts.replay_view(host, case, [batch])[0]
        eager = hosts.eager_view(host, batch)["items"]
        results.append((replayed, eager))
    (vllm_view, vllm_eager), (our_view, our_eager) = results
    captured = vllm_view["captured"]["cu_seqlens"]
    assert captured.shape[0] == 2 * (16 + 1)
    # The V section starts inside the Q/K/O offsets of the replay.
    assert captured[17:].tolist() != vllm_view["replay"]["cu_seqlens"][9:].tolist()
    assert any(
        not torch.allclose(r, e, equal_nan=False)
        for r, e in zip(vllm_view["items"], vllm_eager, strict=True)
    )
    assert not our_view["violations"]
    for r, e in zip(our_view["items"], our_eager, strict=True):
        assert torch.allclose(r, e)


def test_glm4_1v_captures_600_frames_per_dummy_item() -> None:
    # Every video may have 600 frames (GLM-4.1V's constant), so the automatic
    # max_frames_per_batch is 600 x max_batch_size and every dummy item gets
    # 600 frames of at least one token: with the automatic 64 items per batch,
    # the budget-64 graph holds 64 x 600 tokens (38 400, 600 times its budget),
    # in 153 600 pixel rows with 38 401 cu_seqlens offsets; every replay runs
    # them all. A batch within the budget has at most 64 frames.
    model = hosts.parity("glm4_1v")
    vllm_host, ours = model.hosts()
    case = CaptureCase(64, 64, 64 * vllm_host.get_max_frames_per_video())
    assert case.max_frames_per_batch == 38400
    shapes = []
    for host in (vllm_host, ours):
        captured = _capture(host, case)
        shapes.append(
            (captured["pixel_values"].shape[0], captured["cu_seqlens"].shape[0])
        )
    assert shapes[0] == (64 * 600 * 4, 38401)
    # The generated mixin: k = 1 token per item, one frame each.
    assert shapes[1] == (64 * 4, 65)


def test_step3_vl_results_of_crop_less_images_alias_the_graph_output() -> None:
    """Two crop-less images, one item per batch: both replay the global
    path's smallest graph. vLLM's post-processing returns each image's rows
    as a view of that graph's output buffer (``clone`` is ignored), so the
    second replay rewrites the first image's result."""
    from encoder_cudagraph_runtime.config import CompilationConfig, VllmConfig
    from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
    from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager

    host = hosts.step3_vl_host()
    rows = host.img_output_tokens
    batch = hosts.step3_vl_batch(
        torch.Generator().manual_seed(0), "image", [(0,), (0,)]
    )
    settings = hosts.HostSettings()
    config = settings.vllm_config()
    config = VllmConfig(
        scheduler_config=config.scheduler_config,
        model_config=config.model_config,
        # encoder_cudagraph_max_vision_items_per_batch: 1; the budgets of the
        # global path double from its minimum (4 rows) up to 81.
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=[host.patch_output_tokens],
            encoder_cudagraph_max_vision_items_per_batch=1,
        ),
    )
    manager = EncoderCudaGraphManager(
        config, CPU, torch.float32, host, graph_backend=EagerReplayGraphBackend()
    )
    manager.capture()
    first, second = manager.execute(batch)
    alone = [
        host._batched_encoder_forward(batch["pixel_values"][i : i + 1]) for i in (0, 1)
    ]
    assert manager.graph_hits == 2
    assert manager.path_token_budgets["global"][0] == rows
    # The second image is right; the first holds the second's rows.
    assert torch.equal(second, alone[1])
    assert torch.equal(first, alone[1]) and not torch.equal(first, alone[0])
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()


_runtime_manager = hosts.runtime_manager


def test_gemma4_an_image_of_a_request_level_max_soft_tokens_has_no_graph() -> None:
    """The capture axis stops at the model-level max_soft_tokens (280), but
    a request may ask for 560 (mm_processor_kwargs, validated against the
    supported values): its image selects the key 560, which was never
    captured, and the manager's assertion stops the engine."""
    host = hosts.gemma4_host(max_soft_tokens=280)
    assert host.get_encoder_cudagraph_config().capture_axes == ((70, 140, 280),)
    manager = _runtime_manager(host, [560], 1)
    manager.capture()
    pixels, positions = hosts.gemma4_frames([(60, 60)], 560)
    batch = {"pixel_values": list(pixels), "pixel_position_ids": list(positions)}
    spec = host.get_encoder_cudagraph_item_specs(batch)[0]
    # 560 tokens: within the budget, so the manager replays a graph.
    assert spec.output_tokens == 560
    selected = host.select_encoder_cudagraph_items(batch, [0])
    assert selected["encoder_cudagraph_axis_keys"] == (560,)
    with pytest.raises(AssertionError, match="no encoder CUDA graph"):
        manager.execute(batch)


def test_gemma4_video_frames_shift_by_their_empty_pool_slots() -> None:
    """A 640² video frame is 24 x 24 patches: 64 soft tokens in the prompt
    (vLLM's own count), padded to 70 pooled slots. The replay's gather takes
    all 70 slots of every frame, so the video's rows are 140 where the
    prompt holds 128 placeholders, and the language model, which reads the
    first 128, gives frame 1's placeholders frame 0's 6 empty slots first."""
    host = hosts.gemma4_host()
    info = hosts._Obj(
        get_hf_config=lambda: hosts._Obj(
            vision_config=hosts._Obj(
                patch_size=16, pooling_kernel_size=3, default_output_length=280
            )
        )
    )
    count = hosts.gemma4_processing_count(info, 640, 640, 70)
    assert count == 64
    pixels, positions = hosts.gemma4_frames([(24, 24), (24, 24)], 70)
    batch = {
        "pixel_values_videos": pixels,
        "pixel_position_ids_videos": positions,
        "video_frame_counts": torch.tensor([2]),
    }
    (spec,) = host.get_encoder_cudagraph_item_specs(batch)
    assert spec.output_tokens == 140 != 2 * count
    gather = host.prepare_encoder_cudagraph_replay_buffers(batch, 1, 32).values[
        "gather_indices"
    ]
    # Rows 64..69 are frame 0's padding slots, row 70 is frame 1's first.
    assert gather[64:71].tolist() == list(range(64, 71))
    valid = (positions != -1).all(-1).reshape(2, 70, 9).any(-1).reshape(-1)
    assert not valid[gather[64:70]].any() and valid[gather[70]]


def test_minicpmv_slices_beyond_the_config_clamp_fail_at_replay() -> None:
    """The capture holds min(budget // query_num, max_batch_size *
    (max_slice_num + 1)) slices, with max_slice_num from the HF config (9),
    while the processor honours a request's max_slice_nums. With a user-set
    max_vision_items_per_batch of 1, a 16-slice image and its thumbnail (17
    slices, 1088 tokens) fit the budget-2048 graph, which holds 10 slices."""
    host = hosts.minicpmv_host()
    manager = _runtime_manager(host, [2048], 1)
    manager.capture()
    batch = hosts.minicpmv_image([(32, 32)] * 17)
    (spec,) = host.get_encoder_cudagraph_item_specs(batch)
    assert spec.output_tokens == 17 * 64 <= 2048
    for _, graph in manager.budget_graphs["default"].items():
        assert graph.input_buffers["minicpmv_pixel_values"].shape[0] == 10
    # Ten slices replay; seventeen do not fit the captured buffer.
    (ten,) = manager.execute(hosts.minicpmv_image([(32, 32)] * 10))
    assert ten.shape[0] == 10 * 64
    with pytest.raises(RuntimeError, match="must match the size"):
        manager.execute(batch)


def _minicpmv_graph_and_eager(resampler, tgt, embeddings, monkeypatch):
    """The resampler's rows as a graph captured on the key's grid computes
    them (``_adjust_pos_cache`` skipped while capturing: the table of the
    capture, clamped indices) and as the eager forward does (the slice's own
    patches, the table grown first)."""
    patches = int(tgt.prod(-1).max())
    rows = {}
    for capturing, width in ((True, embeddings.shape[1]), (False, patches)):
        # (The CPU build of torch has no stream to ask.)
        monkeypatch.setattr(
            torch.cuda, "is_current_stream_capturing", lambda c=capturing: c
        )
        rows[capturing] = resampler(embeddings[:, :width], tgt)
    return rows[True], rows[False]


@pytest.mark.parametrize(
    ("grid", "same"),
    [
        # At most 70 patches a side: the graph and the eager forward agree.
        ((14, 70), True),
        # A 5:1 image's thumbnail (994 x 196 px, 14 px patches): 71 columns.
        ((14, 71), False),
    ],
)
def test_minicpmv_slices_wider_than_the_position_table_replay_clamped(
    grid, same, monkeypatch
) -> None:
    """No key covers a slice with a side above 70 patches; selection then
    falls back to the (70, 70) grid, whose 4900 patches hold the slice, and
    the graph replays it. The resampler's position table is 70 x 70 at
    capture: the graph clamps every column (or row) past 69 to the last one,
    while the eager forward grows the table first and re-registers
    ``pos_embed``, a new tensor that the graphs captured before do not read."""
    host = hosts.minicpmv_host()
    selected = host.select_encoder_cudagraph_items(hosts.minicpmv_image([grid]), [0])
    assert selected[ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG] == ((70, 70),)
    tgt = host.prepare_encoder_cudagraph_replay_buffers(selected, 1, 1).values[
        "minicpmv_tgt_sizes"
    ]
    assert tgt.tolist() == [list(grid)]
    resampler = hosts.minicpmv_resampler()
    captured_table = resampler.pos_embed
    gen = torch.Generator().manual_seed(1)
    embeddings = torch.randn(1, 70 * 70, resampler.embed_dim, generator=gen)
    with torch.no_grad():
        graph, eager = _minicpmv_graph_and_eager(
            resampler, tgt, embeddings, monkeypatch
        )
    assert torch.allclose(graph, eager, atol=1e-5) == same
    # The eager call replaced the table the graph was captured with.
    assert (resampler.pos_embed is captured_table) == same
    assert resampler.pos_embed.shape[:2] == (70, max(70, grid[1]))


def test_gemma4_unified_inherits_a_mixin_its_tower_cannot_run() -> None:
    """Gemma4UnifiedForConditionalGeneration subclasses Gemma 4 (and so the
    protocol) but builds no vision tower (``self.vision_tower = None``):
    the config and budgets resolve, and the first capture, during the
    memory profiling at startup, reads ``self.vision_tower.config``."""
    host = hosts.gemma4_host()
    host.vision_tower = None  # what Gemma4Unified's __init__ sets
    manager = _runtime_manager(host, [280], 1)
    assert manager.get_num_graphs_to_capture() == 3
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute"):
        manager.capture()


def test_ernie45_vl_eager_batches_apply_the_resampler_twice() -> None:
    # A batch above every budget runs eagerly; the manager then calls the
    # mixin's post-processing on the eager rows, as on a graph's output.
    model = hosts.parity("ernie45_vl")
    vllm_host, _ = model.hosts()
    batch = model.make_batch(torch.Generator().manual_seed(0), "image", [(1, 4, 4)])
    rows = vllm_host.encoder_eager_forward(batch)
    # vLLM's eager forward already ran the resampler: 4 tokens of the LM width.
    assert rows.shape == (4, hosts.ErnieResampler.out_dim)
    with pytest.raises(RuntimeError, match="columns"):
        vllm_host.postprocess_encoder_output(
            {"default": rows}, [0], [4], {}, clone=True, batch_mm_kwargs=batch
        )
    # The second resampler call got the resampled rows.
    calls = vllm_host.resampler_model.calls
    assert [c["rows"] for c in calls] == [16, 4]


def test_deepseek_vl2_eager_batches_have_no_output() -> None:
    # A batch above every budget: the manager calls the eager forward, then
    # post-processes its output as it does a graph's.
    model = hosts.parity("deepseek_vl2")
    vllm_host, _ = model.hosts()
    batch = model.make_batch(torch.Generator().manual_seed(0), "image", [(3, 2)])
    output = vllm_host.encoder_eager_forward(batch)
    assert output is None
    with pytest.raises(AttributeError, match="shape"):
        vllm_host.postprocess_encoder_output(
            {"default": output}, [0], [1], {}, clone=True, batch_mm_kwargs=batch
        )


# -- Kimi-K2.5 ------------------------------------------------------------------

MANAGER = "vllm.v1.worker.encoder_cudagraph"


class _AllGather:
    """``tensor_model_parallel_all_gather`` on 2 ranks: records what each
    rank hands in (meta tensors: the shapes, no memory)."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        self.shapes.append(tuple(tensor.shape))
        return torch.cat([tensor, tensor], dim=dim)


def _dp_manager(host, all_gather: _AllGather, rank: int):
    """vLLM's manager as rank ``rank`` of 2 under ``--mm-encoder-tp-mode
    data``: its own ``_dp_shard`` and ``_dp_gather`` (and the item-spec and
    selection calls they make), on ``host``; its device is ``meta``."""
    import contextlib
    import logging

    from parity_testlib import WheelCode, protocol_stubs, vllm_wheel

    stubs = protocol_stubs()
    stubs.update(
        {
            "vllm.logger": {"init_logger": logging.getLogger},
            "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext},
            "vllm.distributed": {
                "get_tensor_model_parallel_rank": lambda: rank,
                "get_tensor_model_parallel_world_size": lambda: 2,
                "tensor_model_parallel_all_gather": all_gather,
            },
        }
    )
    code = WheelCode(vllm_wheel(), stubs)
    manager_class = code.klass(
        MANAGER,
        "EncoderCudaGraphManager",
        ["_dp_shard", "_dp_gather", "_get_per_item_out_tokens"],
    )
    manager = object.__new__(manager_class)
    manager.model = host
    manager.config = host.get_encoder_cudagraph_config()
    manager._capture_axes = ()
    manager.device, manager.dtype = torch.device("meta"), torch.bfloat16
    return manager


def test_kimi_k25_video_sentinel_sizes_the_data_parallel_gather() -> None:
    # One request with a 4-frame video chunk (8 x 8 patches: 16 tokens) and
    # an image (4 x 6: 6 tokens), on 2 ranks with the ViT data-parallel.
    batch = hosts.moon3d_batch(
        torch.Generator().manual_seed(0), "vision_chunk", [(4, 8, 8), (1, 4, 6)]
    )
    model = hosts.parity("kimi_k25")
    for host, chunk_tokens in zip(model.hosts(), (2**30, 16), strict=True):
        gather = _AllGather()
        manager = _dp_manager(host, gather, rank=1)
        tokens = manager._get_per_item_out_tokens(batch)
        local, assignment, per_rank, max_per_rank = manager._dp_shard(batch, tokens)
        assert tokens == [chunk_tokens, 6] and per_rank == [1, 1]
        # This rank's rows (its one item), then the gather.
        (item,) = assignment[1:]
        rows = [torch.empty(tokens[item], hosts.WIDTH, device="meta")]
        manager._dp_gather(rows, tokens, assignment, per_rank, max_per_rank)
        # Every rank pads its rows to the largest rank's output tokens.
        assert gather.shapes == [(max_per_rank, hosts.WIDTH)]
    # vLLM's sentinel: 2**30 rows of the text width on every rank, 15 TB of
    # bf16 at Kimi-K2.5's 7168 (an out-of-memory error, the engine dies);
    # the generated mixin's real count: 16 rows.
    assert max_per_rank == 16
    assert 2**30 * 7168 * 2 > 15 * 10**12


def test_kimi_k25_flashinfer_replay_reads_v_rows_at_wrong_offsets() -> None:
    # 8 items per batch: the capture pads cu_seqlens to 9 sequences, each
    # FlashInfer section to the bucket of 16; a replay of 3 images is
    # unpadded (bucket 8), and pad_cu_seqlens repeats the last V offset
    # after it: the wrapper's V section (the second half) is that one offset.
    model = hosts.parity("kimi_k25")
    vllm_host = model.hosts(hosts.HostSettings(backend="FLASHINFER"))[0]
    case = CaptureCase(256, 8, 8)
    batch = hosts.moon3d_batch(
        torch.Generator().manual_seed(3),
        "vision_chunk",
        [(1, 4, 4), (1, 2, 6), (1, 6, 2)],
    )
    assert _fits(vllm_host, batch, case)
    view = hosts.replay_view(vllm_host, case, [batch])[0]
    captured, replayed = view["captured"]["cu_seqlens"], view["replay"]["cu_seqlens"]
    assert captured.shape[0] == 2 * 17 and replayed.shape[0] == 2 * 9
    assert captured[17:].tolist() == [int(replayed[-1])] * 17
    eager = hosts.eager_view(vllm_host, batch)["items"]
    # Every image attends over V rows past the batch's: not its eager rows.
    for got, want in zip(view["items"], eager, strict=True):
        assert not torch.allclose(got, want)


def test_kimi_k25_selection_puts_the_grid_where_replay_must_read_it_back(
    vllm_code,
) -> None:
    vllm_host = hosts.kimi_k25_vllm_host()
    batch = hosts.moon3d_batch(
        torch.Generator().manual_seed(0), "vision_chunk", [(1, 4, 6), (1, 2, 2)]
    )
    # The pixel values on the accelerator (the meta device stands in for it),
    # the grid on the host, as the processor keeps it (keep_on_cpu).
    batch["pixel_values"] = batch["pixel_values"].to("meta")
    picked = vllm_host.select_encoder_cudagraph_items(batch, [1, 0])
    assert picked["grid_thws"].device.type == "meta"
    # The replay reads it back (.tolist()), outside gpu_sync_allowed.
    with pytest.raises(NotImplementedError):
        vllm_host.prepare_encoder_cudagraph_replay_buffers(picked, 2, 2)
    manager = vllm_code.definition(MANAGER, "EncoderCudaGraphManager")
    assert _inside_sync_allowed(
        manager, "prepare_encoder_cudagraph_replay_buffers"
    ) == [False]
    ours = hosts.parity("kimi_k25").hosts()[1]
    kept = ours.select_encoder_cudagraph_items(batch, [1, 0])
    assert kept["grid_thws"].device.type == "cpu"


def test_kimi_k25_eager_forward_shards_again_under_the_managers_data_parallel(
    vllm_code,
) -> None:
    # Under --mm-encoder-tp-mode data (TP > 1) the manager gives each rank
    # its items (_dp_shard) and runs them locally; a rank's video chunk goes
    # to the mixin's eager forward, which vLLM's vision_tower_forward spreads
    # over the ranks again (run_dp_sharded_mrope_vision_model: an all-gather)
    # while the other ranks replay their graphs and enter _dp_gather's.
    manager = vllm_code.definition(MANAGER, "EncoderCudaGraphManager.execute")
    dp_branch = next(n for n in ast.walk(manager) if isinstance(n, ast.If))
    assert ast.unparse(dp_branch.test) == "self.use_dp"
    body = ast.unparse(ast.Module(body=dp_branch.body, type_ignores=[]))
    assert "_dp_shard" in body and "_execute_local(local_mm_kwargs)" in body
    mode = vllm_code.definition(
        "vllm.model_executor.models.vision", "is_vit_use_data_parallel"
    )
    assert "mm_encoder_tp_mode == 'data'" in ast.unparse(mode)
    chunk = hosts.moon3d_batch(
        torch.Generator().manual_seed(0), "vision_chunk", [(4, 4, 4)]
    )
    vllm_host = hosts.kimi_k25_vllm_host(hosts.HostSettings(vit_data_parallel=True))
    with pytest.raises(hosts.ViTDataParallelCollective):
        vllm_host.encoder_eager_forward(chunk)


def _gemma4_video(frames: int) -> dict[str, torch.Tensor]:
    """One video of ``frames`` 24 x 24-patch frames (64 real soft tokens of
    70 pooled slots each), as vLLM's processor batches it."""
    pixels, positions = hosts.gemma4_frames([(24, 24)] * frames, 70)
    return {
        "pixel_values_videos": pixels,
        "pixel_position_ids_videos": positions,
        "video_frame_counts": torch.tensor([frames]),
    }


@pytest.mark.parametrize(
    ("budget", "max_frames", "frames", "held", "fails"),
    [
        (1120, 4, 8, 4, True),  # a user-set max_frames_per_batch
        (4480, None, 64, 32, True),  # a video sampled with 64 frames
        (1120, None, 8, 16, False),  # the control: automatic, 8 frames
    ],
)
def test_gemma4_video_frames_beyond_the_captured_rows_fail_at_replay(
    budget, max_frames, frames, held, fails
) -> None:
    """The capture holds min(max(max_batch_size, max_frames_per_batch),
    token_budget // 70) frame rows for the 70-wide key, but the manager
    packs videos by items and tokens, not frames: with a user-set
    max_frames_per_batch of 4, one 8-frame video (560 tokens) fits the
    budget-1120 graph, which holds 4 frames, and its replay copy fails; the
    automatic max_frames_per_batch (max_batch_size * 32) fails a video of
    more than 32 frames alike."""
    host = hosts.gemma4_host()
    manager = _runtime_manager(host, [budget], 1, max_frames=max_frames)
    manager.capture()
    graph = manager.budget_graphs["default"][(budget, (70,))]
    assert graph.input_buffers["pixel_values"].shape[0] == held
    batch = _gemma4_video(frames)
    (spec,) = host.get_encoder_cudagraph_item_specs(batch)
    assert spec.output_tokens == frames * 70 <= budget
    if fails:
        with pytest.raises(RuntimeError, match="must match the size"):
            manager.execute(batch)
    else:
        (rows_out,) = manager.execute(batch)
        assert rows_out.shape[0] == frames * 70
