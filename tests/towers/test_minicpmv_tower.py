"""MiniCPM-V 2.6 reference tower (Idefics2 ViT + Resampler2_5): its pieces
against vLLM's own code from the wheel, the generated mixin on the host, and
what the graphs leave in the padded slots of their output."""

from __future__ import annotations

import contextlib
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tower_testlib import PlainMixin, manager_for
from towers_vllm_source import bind, runtime_namespace

from reference_towers.minicpmv import (
    RESAMPLER_MAX_SIZE,
    MiniCPMVConfig,
    sincos_table_2d,
    slice_pixels,
)
from reference_towers.registry import REFERENCE_TOWERS, generated_mixin

TOWER = REFERENCE_TOWERS["minicpmv"]
MODEL = "vllm/model_executor/models/minicpmv.py"
IDEFICS2 = "vllm/model_executor/models/idefics2_vision_model.py"
RESAMPLER = "vllm/model_executor/layers/resampler.py"


@pytest.fixture
def host(minicpmv_host):
    return minicpmv_host


@pytest.fixture(scope="module")
def mixed_host():
    return TOWER.build_host(
        generated_mixin("minicpmv"), "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(autouse=True)
def _no_capture_on_a_cpu_build(monkeypatch):
    """vLLM's resampler asks ``torch.cuda.is_current_stream_capturing()``,
    which a CPU build of torch cannot answer: nothing is being captured."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


def _namespace(source) -> dict:
    ns = runtime_namespace()
    ns["nn"] = torch.nn
    ns["gpu_sync_allowed"] = contextlib.nullcontext
    source.load(
        RESAMPLER,
        [
            "get_1d_sincos_pos_embed_from_grid",
            "get_2d_sincos_pos_embed_from_grid",
            "get_2d_sincos_pos_embed",
        ],
        ns,
    )
    return ns


def _vllm_resampler(source, ours):
    """A stand-in for vLLM's ``Resampler2_5`` holding ``ours``' weights and
    table, whose forward and table code are vLLM's (``kv_proj`` returns
    ``(out, bias)`` as vLLM's ``ReplicatedLinear``)."""
    ns = _namespace(source)
    methods = source.load(
        MODEL,
        ["_set_2d_pos_cache", "_adjust_pos_cache", "forward"],
        ns,
        cls="Resampler2_5",
    )
    methods |= source.load(RESAMPLER, ["_repeat"], ns, cls="BaseResampler")
    stand_in = SimpleNamespace(
        embed_dim=ours.embed_dim,
        max_size=ours.max_size,
        pos_embed=ours.pos_embed,
        query=ours.query,
        kv_proj=lambda x: (ours.kv_proj(x), None),
        ln_kv=ours.ln_kv,
        ln_q=ours.ln_q,
        ln_post=ours.ln_post,
        attn=ours.attn,
        proj=ours.proj,
    )
    stand_in.register_buffer = lambda name, t, persistent=True: setattr(
        stand_in, name, t
    )
    return bind(stand_in, methods)


@pytest.mark.parametrize(
    "width,size", [(128, (70, 70)), (3584, (4, 6)), (8, (3, 5)), (12, (71, 4))]
)
def test_sincos_table_matches_vllm(vllm_source, width, size):
    ns = _namespace(vllm_source)
    expected = ns["get_2d_sincos_pos_embed"](width, size, version=(2, 5))
    np.testing.assert_allclose(
        sincos_table_2d(width, size), expected, rtol=0, atol=1e-6
    )


CASES = [
    # (tgt_sizes, padded length): the eager layout (one row per slice).
    ([(3, 5), (1, 1), (7, 2)], 15),
    ([(4, 33), (33, 2)], 132),
    # a graph key's grid: rows beyond h·w are padding.
    ([(2, 3), (5, 5)], 32 * 32),
]


@pytest.mark.parametrize("sizes,length", CASES)
def test_position_ids_match_vllm(vllm_source, host, sizes, length):
    ns = _namespace(vllm_source)
    ours = host.vpm.embeddings
    get_ids = vllm_source.load(
        IDEFICS2, ["get_position_ids"], ns, cls="Idefics2VisionEmbeddings"
    )
    stand_in = bind(
        SimpleNamespace(
            num_patches_per_side=ours.num_patches_per_side,
            position_embedding=ours.position_embedding,
        ),
        get_ids,
    )
    tgt = torch.tensor(sizes, dtype=torch.int64)
    mask = torch.arange(length)[None, :] < tgt.prod(-1)[:, None]
    for m, t in ((mask.unsqueeze(1), tgt), (mask.unsqueeze(1), None)):
        torch.testing.assert_close(
            ours.get_position_ids(m, t), stand_in.get_position_ids(m, t)
        )
    # A 2-D mask (Idefics2's own layout, no tgt_sizes): the mask's width.
    grid = torch.zeros((1, 6, 7), dtype=torch.bool)
    grid[0, :4, :5] = True
    torch.testing.assert_close(
        ours.get_position_ids(grid, None), stand_in.get_position_ids(grid, None)
    )


@pytest.mark.parametrize("sizes,length", CASES)
def test_resampler_matches_vllm(vllm_source, host, sizes, length):
    ours = host.resampler
    vllm = _vllm_resampler(vllm_source, ours)
    tgt = torch.tensor(sizes, dtype=torch.int64)
    x = torch.randn(len(sizes), length, host.config.vision_config.hidden_size)
    torch.testing.assert_close(ours(x, tgt), vllm.forward(x, tgt), rtol=0, atol=0)


def test_a_slice_past_the_table_regrows_it_as_vllm_does(vllm_source):
    host = TOWER.build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )
    ours = host.resampler
    vllm = _vllm_resampler(vllm_source, ours)
    before = ours.pos_embed
    tgt = torch.tensor([[2, 75], [3, 3]], dtype=torch.int64)
    x = torch.randn(2, 150, host.config.vision_config.hidden_size)
    expected = vllm.forward(x, tgt)
    got = ours(x, tgt)
    assert ours.max_size == vllm.max_size == (70, 75)
    assert ours.pos_embed is not before and ours.pos_embed.shape == (70, 75, 128)
    torch.testing.assert_close(ours.pos_embed, vllm.pos_embed, rtol=0, atol=0)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # Positions inside the old table keep their values.
    torch.testing.assert_close(ours.pos_embed[:70, :70], before, rtol=0, atol=0)


def test_vision_hidden_states_match_vllm(vllm_source, host):
    ns = _namespace(vllm_source)
    methods = vllm_source.load(
        MODEL, ["get_vision_hidden_states"], ns, cls="MiniCPMV2_6"
    )
    stand_in = bind(SimpleNamespace(vpm=host.vpm, resampler=host.resampler), methods)
    items = [((3, 5),), ((4, 6), (2, 9), (2, 9), (2, 9))]
    mm_kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=2)
    slices = [s for item in mm_kwargs["pixel_values"] for s in item]
    data = {"pixel_values": slices, "tgt_sizes": torch.cat(mm_kwargs["tgt_sizes"])}
    expected = stand_in.get_vision_hidden_states(data)
    torch.testing.assert_close(host.get_vision_hidden_states(data), expected)
    assert expected.shape == (5, 64, 128)
    # One image at a time (the reference) gives the batch's rows.
    refs = TOWER.reference_outputs(host, mm_kwargs)
    torch.testing.assert_close(torch.cat(refs), expected.reshape(-1, 128))


def test_slices_are_laid_out_as_vllms_repacking_reads_them(vllm_source):
    """vLLM's ``_mcpmv_pack_flat_pixels`` folds a ``(3, p, h·w·p)`` slice
    back onto its ``h x w`` grid: the image the slice was cut from."""
    ns = _namespace(vllm_source)
    pack = vllm_source.load(MODEL, ["_mcpmv_pack_flat_pixels"], ns)[
        "_mcpmv_pack_flat_pixels"
    ]
    p, h, w = 2, 3, 5
    image = torch.randn(3, h * p, w * p)
    flat = pack(
        [slice_pixels(image, p)],
        pixel_height=h * p,
        pixel_width=w * p,
        max_num_slices=1,
        device=torch.device("cpu"),
        dtype=torch.float32,
        patch_size=p,
        tgt_sizes=torch.tensor([[h, w]]),
    )
    torch.testing.assert_close(flat.reshape(3, h * p, w * p), image, rtol=0, atol=0)


def test_config_sizes():
    full, tiny = MiniCPMVConfig.full(), MiniCPMVConfig.tiny()
    assert full.max_side == 70 and tiny.max_side == 34
    vision = full.vision_config
    assert (vision.num_hidden_layers, vision.hidden_size) == (27, 1152)
    assert (vision.num_attention_heads, vision.intermediate_size) == (16, 4304)
    assert (full.query_num, full.hidden_size) == (64, 3584)
    assert RESAMPLER_MAX_SIZE == (70, 70)


def test_legal_items():
    rng = random.Random(0)
    for tokens in (64, 192, 640):
        item = TOWER.legal_grid(rng, "tiny", output_tokens=tokens)
        assert TOWER.is_legal(item, "tiny") and TOWER.output_tokens(item) == tokens
        assert len(set(item[1:])) <= 1
    for bad in [
        (),
        ((1, 1), (2, 2)),
        ((35, 1),),
        ((10, 10),),
        ((1, 1), (2, 2), (2, 3)),
    ]:
        assert not TOWER.is_legal(bad, "tiny"), bad
    with pytest.raises(ValueError):
        TOWER.legal_grid(rng, "tiny", output_tokens=128)  # a grid of one slice


def test_generated_mixin_replays_what_the_host_computes(mixed_host):
    """Items of every covering key, through the manager and the generated
    mixin: each image's rows are the host's own eager ones."""
    items = [((3, 5),), ((2, 33), (1, 4), (1, 4)), ((33, 2),), ((1, 1),)]
    manager = manager_for(mixed_host, 512, token_budgets=[256], max_items_per_batch=4)
    mm_kwargs = TOWER.make_mm_kwargs(mixed_host, items, "cpu", seed=5)
    outputs = manager.execute(mm_kwargs)
    for out, ref in zip(outputs, TOWER.reference_outputs(mixed_host, mm_kwargs)):
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)
    assert manager.get_cumulative_stats()["graph_hits"] == len(items)


def test_the_graph_output_has_no_nan_in_padded_slots(mixed_host):
    # Finding 25: an empty slot's tgt_sizes (0, 0) would mask every key of
    # Resampler2_5; the spec gives the resampler the sizes clamped to 1.
    manager = manager_for(mixed_host, 512, token_budgets=[128], max_items_per_batch=1)
    mm_kwargs = TOWER.make_mm_kwargs(mixed_host, [((3, 5),)], "cpu", seed=1)
    (out,) = manager.execute(mm_kwargs)
    assert torch.isfinite(out).all()
    # The (32, 32) key's graph (the one a 3 x 5 slice replays): 2 slots of
    # 64 rows, the item's, then the padded slot's.
    graph = manager.budget_graphs["default"][(128, ((32, 32),))]
    assert graph.output_buffer.shape == (128, 128)
    assert torch.isfinite(graph.output_buffer[:64]).all()
    assert torch.isfinite(graph.output_buffer[64:]).all()
