"""The generated MiniMax M3 mixin (standalone target) against the seed.

Pure Python on CPU: a fake host holds a fake ``vision_tower`` whose
``vision_model.prepare_encoder_metadata`` computes what vLLM 0.33.0's does for
FLASH_ATTN and records its calls (``genmixin_seed_oracles``). Each method is
compared with the seed-002 method transcribed as an oracle.

Deliberate differences from the seed, checked as such: the capture builds
its own ``cu_seqlens`` with ``max_batch_size + 2`` slots instead of asking
the tower for ``max_batch_size + 1`` segments (same values); an empty
selection's grid is always int64 (and on the host, which CPU tests cannot
tell from the seed's "source grid's device"); the ``cu_seqlens`` registry is per
instance, drops freed buffers and checks buffer identity. These are the
tests of the ``trailing_sequence`` padding (DeepSeek-V4.1's ``cu_seqlens``
repeats the last offset now).
"""

from __future__ import annotations

import gc
import random

import pytest

torch = pytest.importorskip("torch")

import genmixin_seed_oracles as seed
from genmixin_testlib import load_standalone_mixin
from host_modules import FakeModule

MERGE = 2
CHANNELS, FRAMES, PATCH = 3, 2, 2
PATCH_DIM = CHANNELS * FRAMES * PATCH**2
OUT_HIDDEN = 7
SEED_BUFFER_KEYS = [
    "pixel_values",
    "rotary_cos",
    "rotary_sin",
    "cu_seqlens",
    "max_seqlen",
]


@pytest.fixture(scope="module")
def module():
    return load_standalone_mixin("minimax_m3")


@pytest.fixture(scope="module")
def backends():
    from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum

    return AttentionBackendEnum


class FakeVisionTower(FakeModule):
    def __init__(self, backend, dtype) -> None:
        self.spatial_merge_size = MERGE
        self.dtype = dtype
        self.out_hidden_size = OUT_HIDDEN
        self.vision_model = seed.FakeMiniMaxVisionModel(
            backend, channels=CHANNELS, frames=FRAMES, patch=PATCH
        )
        self.calls: list[tuple] = []

    def __call__(self, pixel_values, grid_thw=None, encoder_metadata=None):
        self.calls.append((pixel_values, grid_thw, encoder_metadata))
        rows = pixel_values.shape[0] // (MERGE * MERGE)
        out = pixel_values.float().reshape(rows, -1).sum(1, keepdim=True)
        return out.expand(rows, OUT_HIDDEN) + torch.arange(OUT_HIDDEN)


def make_host(
    module, backends, *, backend="FLASH_ATTN", mm_config="default", dtype=None
):
    from encoder_cudagraph_runtime.config import MultiModalConfig

    cls = type("FakeMiniMaxHost", (module.MiniMaxM3EncoderCudaGraphMixin,), {})
    host = cls()
    host.vision_tower = FakeVisionTower(
        getattr(backends, backend), dtype or torch.bfloat16
    )
    host.multimodal_config = MultiModalConfig() if mm_config == "default" else mm_config
    return host


def make_batch(rng: random.Random, n: int, *, list_pixels=False, list_grid=False):
    grid = []
    for _ in range(n):
        grid.append(
            [rng.randint(1, 2), MERGE * rng.randint(1, 3), MERGE * rng.randint(1, 3)]
        )
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    items = [torch.randn(t * h * w, PATCH_DIM, generator=g) for t, h, w in grid]
    pixels = (
        items
        if list_pixels
        else torch.cat(items) if items else torch.zeros(0, PATCH_DIM)
    )
    return {
        "pixel_values": pixels,
        "image_grid_thw": grid if list_grid else torch.tensor(grid, dtype=torch.int64),
    }


def assert_same_tensor(a, b, what: str) -> None:
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), what
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.device == b.device, f"{what}: device {a.device} != {b.device}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(a, b), what


# -- item specs and selection ----------------------------------------------------------


@pytest.mark.parametrize("list_grid", [False, True], ids=["tensor-grid", "list-grid"])
@pytest.mark.parametrize("rng_seed", range(3))
def test_item_specs_match_seed(module, backends, list_grid, rng_seed) -> None:
    host = make_host(module, backends)
    batch = make_batch(random.Random(rng_seed), 5, list_grid=list_grid)
    specs = host.get_encoder_cudagraph_item_specs(batch)
    assert [(s.input_size, s.output_tokens) for s in specs] == seed.mm_item_specs(
        host, batch
    )


@pytest.mark.parametrize(
    "list_pixels", [False, True], ids=["tensor-pixels", "list-pixels"]
)
@pytest.mark.parametrize("list_grid", [False, True], ids=["tensor-grid", "list-grid"])
@pytest.mark.parametrize("indices", [[0], [3], [2, 0], [1, 3, 0, 2], [3, 2, 1, 0]])
def test_select_matches_seed(module, backends, list_pixels, list_grid, indices) -> None:
    host = make_host(module, backends)
    batch = make_batch(
        random.Random(4), 4, list_pixels=list_pixels, list_grid=list_grid
    )
    got = host.select_encoder_cudagraph_items(batch, list(indices))
    want = seed.mm_select(batch, list(indices))
    assert list(got) == ["pixel_values", "image_grid_thw"]
    for key in want:
        assert_same_tensor(got[key], want[key], key)


@pytest.mark.parametrize(
    "list_pixels", [False, True], ids=["tensor-pixels", "list-pixels"]
)
@pytest.mark.parametrize("list_grid", [False, True], ids=["tensor-grid", "list-grid"])
def test_select_empty(module, backends, list_pixels, list_grid) -> None:
    host = make_host(module, backends)
    batch = make_batch(
        random.Random(2), 3, list_pixels=list_pixels, list_grid=list_grid
    )
    got = host.select_encoder_cudagraph_items(batch, [])
    want = seed.mm_select(batch, [])
    for key in want:
        assert_same_tensor(got[key], want[key], key)
    assert got["pixel_values"].shape == (0, PATCH_DIM)
    assert got["image_grid_thw"].shape == (0, 3)
    assert host.get_encoder_cudagraph_item_specs(got) == []


def test_select_empty_grid_is_int64(module, backends) -> None:
    """Unlike the seed (which returns ``source_grid[:0]``), the empty grid
    has the dtype of every non-empty selection: int64."""
    host = make_host(module, backends)
    batch = make_batch(random.Random(2), 3)
    batch["image_grid_thw"] = batch["image_grid_thw"].to(torch.int32)
    assert (
        host.select_encoder_cudagraph_items(batch, [])["image_grid_thw"].dtype
        == torch.int64
    )
    assert (
        host.select_encoder_cudagraph_items(batch, [1])["image_grid_thw"].dtype
        == torch.int64
    )


def test_selection_of_a_selection(module, backends) -> None:
    host = make_host(module, backends)
    batch = make_batch(random.Random(9), 6, list_pixels=True)
    first, sub = [4, 1, 5, 0], [2, 3, 0]
    twice = host.select_encoder_cudagraph_items(
        host.select_encoder_cudagraph_items(batch, first), sub
    )
    once = host.select_encoder_cudagraph_items(batch, [first[i] for i in sub])
    for key in once:
        assert_same_tensor(twice[key], once[key], key)


# -- budget range, config and guards -----------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "model_len"), [(8192, 8192), (2048, 32768), (16384, 4000)]
)
def test_budget_range(module, backends, tokens, model_len) -> None:
    from encoder_cudagraph_runtime.config import (
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    cfg = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(max_model_len=model_len),
    )
    assert make_host(module, backends).get_encoder_cudagraph_budget_range(
        cfg
    ) == seed.budget_range(cfg)


def test_config_matches_seed(module, backends) -> None:
    from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph

    host = make_host(module, backends)
    assert isinstance(host, SupportsEncoderCudaGraph)
    cfg = host.get_encoder_cudagraph_config()
    assert cfg.modalities == ["image"]
    assert cfg.buffer_keys == SEED_BUFFER_KEYS
    assert cfg.out_hidden_size == OUT_HIDDEN
    assert set(cfg.padding_logics) == {"rotary_cos", "rotary_sin", "cu_seqlens"}
    assert "max_seqlen" not in cfg.padding_logics  # 0-dim: the manager copies it


@pytest.mark.parametrize("backend", ["FLASH_ATTN", "ROCM_AITER_FA"])
def test_allowed_backends(module, backends, backend) -> None:
    make_host(module, backends, backend=backend).get_encoder_cudagraph_config()


@pytest.mark.parametrize(
    "backend", ["TORCH_SDPA", "FLASHINFER", "TRITON_ATTN", "ROCM_ATTN"]
)
def test_other_backends_are_refused_by_name(module, backends, backend) -> None:
    host = make_host(module, backends, backend=backend)
    with pytest.raises(ValueError) as info:
        host.get_encoder_cudagraph_config()
    message = str(info.value)
    assert f"with the {backend} ViT attention backend" in message
    assert "MiniMax M3" in message
    assert "FLASH_ATTN or ROCM_AITER_FA" in message


def test_image_limit_zero_refused_in_config(module, backends) -> None:
    from encoder_cudagraph_runtime.config import MultiModalConfig

    for cfg in (
        MultiModalConfig(limit_per_prompt={"image": 0}),
        MultiModalConfig(language_model_only=True),
    ):
        host = make_host(module, backends, mm_config=cfg)
        with pytest.raises(ValueError, match="image limit is 0"):
            host.get_encoder_cudagraph_config()
    for cfg in (None, MultiModalConfig(limit_per_prompt={"image": 1, "video": 0})):
        make_host(module, backends, mm_config=cfg).get_encoder_cudagraph_config()


def test_fp8_needs_static_scales(module, backends) -> None:
    from encoder_cudagraph_runtime.config import MultiModalConfig

    dynamic = MultiModalConfig(mm_encoder_attn_dtype="fp8")
    with pytest.raises(ValueError, match="--mm-encoder-fp8-scale-path"):
        make_host(module, backends, mm_config=dynamic).get_encoder_cudagraph_config()
    static = MultiModalConfig(
        mm_encoder_attn_dtype="fp8", mm_encoder_fp8_scale_path="s"
    )
    make_host(module, backends, mm_config=static).get_encoder_cudagraph_config()


# -- capture -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "mbs"), [(64, 1), (64, 64), (100, 7), (257, 8), (1000, 3)]
)
def test_capture_inputs_match_seed(module, backends, budget, mbs) -> None:
    host = make_host(module, backends, dtype=torch.bfloat16)
    device = torch.device("cpu")
    got = host.prepare_encoder_cudagraph_capture_inputs(
        budget, mbs, 0, device, torch.float16
    ).values
    gen_call = host.vision_tower.vision_model.calls[-1]
    want, total = seed.mm_capture(host, budget, mbs, device, torch.float16)
    assert set(got) == set(want) == set(SEED_BUFFER_KEYS)
    for key in want:
        assert_same_tensor(got[key], want[key], key)

    k = -(-budget // mbs)
    rows = mbs * MERGE * MERGE * k
    assert total == rows
    assert gen_call["grid_thw"] == [[1, MERGE, k * MERGE]] * mbs
    assert gen_call["max_seqlen_override"] == rows
    assert gen_call["device"] == device
    # The tower's own dtype, not the manager's.
    assert got["pixel_values"].dtype == torch.bfloat16
    assert got["pixel_values"].shape == (rows, PATCH_DIM)
    assert got["rotary_cos"].shape[:2] == (3, rows)
    assert got["cu_seqlens"].tolist() == [
        i * MERGE * MERGE * k for i in range(mbs + 1)
    ] + [rows]
    assert got["max_seqlen"].dim() == 0 and int(got["max_seqlen"]) == rows
    assert mbs * k >= budget  # the dummy batch covers its budget


# -- replay copies (padding logics) -------------------------------------------------------------


def _capture(host, budget=100, mbs=4):
    values = host.prepare_encoder_cudagraph_capture_inputs(
        budget, mbs, 0, torch.device("cpu"), torch.float32
    ).values
    return values, host.get_encoder_cudagraph_config().padding_logics


@pytest.mark.parametrize("n_rows", [1, 2, 17, 50])
def test_rotary_planes_copy_on_dim1(module, backends, n_rows) -> None:
    host = make_host(module, backends)
    values, logics = _capture(host, budget=64, mbs=2)
    for key in ("rotary_cos", "rotary_sin"):
        dst = values[key]
        dst.fill_(3.0)  # stale rows of an earlier replay
        expected = dst.clone()
        g = torch.Generator().manual_seed(n_rows)
        src = torch.randn(3, n_rows, dst.shape[2], generator=g)
        seed.mm_pad_rope_planes(expected, src)
        logics[key](dst, src)
        assert torch.equal(dst, expected)
        assert torch.equal(dst[:, :n_rows], src) and not dst[:, n_rows:].any()


def test_one_row_batch_does_not_broadcast(module, backends) -> None:
    """A one-row batch lands in row 0 of each plane only (a dim-0 copy
    would broadcast it, or fail on the shape)."""
    host = make_host(module, backends)
    values, logics = _capture(host, budget=64, mbs=2)
    dst, src = values["rotary_cos"].clone(), torch.ones(
        3, 1, values["rotary_cos"].shape[2]
    )
    logics["rotary_cos"](dst, src)
    assert dst[:, 1:].abs().sum() == 0


@pytest.mark.parametrize("n_items", [0, 1, 3, 4])
def test_trailing_sequence_matches_seed(module, backends, n_items) -> None:
    host = make_host(module, backends)
    values, logics = _capture(host, budget=100, mbs=4)
    rows = int(values["max_seqlen"])
    src = torch.tensor([0, 4, 12, 20, 28][: n_items + 1], dtype=torch.int32)
    dst = values["cu_seqlens"]
    dst.fill_(-1)
    expected = dst.clone()
    seed.mm_pad_cu_seqlens(expected, src, rows)
    logics["cu_seqlens"](dst, src)
    assert dst.tolist() == expected.tolist()


def test_trailing_sequence_uses_each_buffers_own_rows(module, backends) -> None:
    """Two captures of one instance: each buffer's padding sequence runs to
    the rows its own graph captured."""
    host = make_host(module, backends)
    small, logics = _capture(host, budget=64, mbs=2)
    large, _ = _capture(host, budget=1000, mbs=2)
    src = torch.tensor([0, 4], dtype=torch.int32)
    logics["cu_seqlens"](small["cu_seqlens"], src)
    logics["cu_seqlens"](large["cu_seqlens"], src)
    small_rows, large_rows = int(small["max_seqlen"]), int(large["max_seqlen"])
    assert small_rows != large_rows
    assert small["cu_seqlens"].tolist() == [0, 4, small_rows, small_rows]
    assert large["cu_seqlens"].tolist() == [0, 4, large_rows, large_rows]


def test_trailing_sequence_refuses_unregistered_buffers(module, backends) -> None:
    host = make_host(module, backends)
    values, logics = _capture(host)
    pad = logics["cu_seqlens"]
    src = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="not registered"):
        pad(values["cu_seqlens"].clone(), src)
    # Same address, another tensor object: still not the captured buffer.
    alias = values["cu_seqlens"].view(-1)
    assert alias.data_ptr() == values["cu_seqlens"].data_ptr()
    with pytest.raises(RuntimeError, match="not registered"):
        pad(alias, src)
    # Another instance's buffers are not this instance's.
    other_values, _ = _capture(make_host(module, backends))
    with pytest.raises(RuntimeError, match="not registered"):
        pad(other_values["cu_seqlens"], src)


def test_freed_buffer_is_forgotten(module, backends) -> None:
    """A buffer registered, freed (the manager's clear()), and a new tensor
    allocated, possibly at the same address: the new one is not taken for
    the captured buffer, and the registry does not grow."""
    host = make_host(module, backends)
    values, logics = _capture(host, budget=64, mbs=2)
    pad = logics["cu_seqlens"]
    shape = values["cu_seqlens"].shape
    del values
    gc.collect()
    reused = [torch.zeros(shape, dtype=torch.int32) for _ in range(4)]
    src = torch.tensor([0, 4], dtype=torch.int32)
    for tensor in reused:
        with pytest.raises(RuntimeError, match="not registered"):
            pad(tensor, src)
    for _ in range(5):
        values, _ = _capture(host, budget=64, mbs=2)
        del values
        gc.collect()
    values, _ = _capture(host, budget=64, mbs=2)
    pad(values["cu_seqlens"], src)  # the live buffer still works
    assert len(host.__dict__["_encoder_cg_pad_totals"]) == 1


def test_trailing_sequence_needs_a_spare_slot(module, backends) -> None:
    host = make_host(module, backends)
    values, logics = _capture(host, budget=100, mbs=4)  # 6 slots
    with pytest.raises(RuntimeError, match="spare slot"):
        logics["cu_seqlens"](values["cu_seqlens"], torch.arange(6, dtype=torch.int32))


# -- replay, forward, eager --------------------------------------------------------------------


@pytest.mark.parametrize(
    "list_pixels", [False, True], ids=["tensor-pixels", "list-pixels"]
)
def test_replay_buffers_match_seed(module, backends, list_pixels) -> None:
    host = make_host(module, backends)
    batch = make_batch(random.Random(6), 3, list_pixels=list_pixels)
    got = host.prepare_encoder_cudagraph_replay_buffers(batch, 8, 0).values
    gen_call = host.vision_tower.vision_model.calls[-1]
    want = seed.mm_replay(host, batch)
    assert "max_seqlen" not in got  # dropped: its capture value is baked in
    assert set(got) == {k for k, v in want.items() if v is not None}
    for key in got:
        assert_same_tensor(got[key], want[key], key)
    assert gen_call == host.vision_tower.vision_model.calls[-1]
    assert (
        gen_call["max_seqlen_override"] is None and gen_call["max_batch_size"] is None
    )
    assert got["pixel_values"].dtype == torch.float32  # no cast at replay (seed)


def test_graph_forward_matches_seed(module, backends) -> None:
    host = make_host(module, backends)
    values, _ = _capture(host, budget=64, mbs=2)
    inputs = {**values}
    got = host.encoder_cudagraph_forward(inputs)
    pixel_values, grid_thw, metadata = host.vision_tower.calls[-1]
    assert pixel_values is values["pixel_values"]
    assert grid_thw is None
    assert set(metadata) == set(SEED_BUFFER_KEYS) - {"pixel_values"}
    assert all(metadata[k] is values[k] for k in metadata)
    expected_pixels = {**values}.pop("pixel_values")
    want = host.vision_tower(expected_pixels, grid_thw=None, encoder_metadata={})
    assert_same_tensor(got, want, "graph output")


@pytest.mark.parametrize(
    "list_pixels", [False, True], ids=["tensor-pixels", "list-pixels"]
)
def test_eager_forward_matches_seed(module, backends, list_pixels) -> None:
    host = make_host(module, backends, dtype=torch.float16)
    batch = make_batch(random.Random(8), 3, list_pixels=list_pixels)
    got = host.encoder_eager_forward(batch)
    gen_call = host.vision_tower.calls[-1]
    want = seed.mm_eager(host, batch)
    seed_call = host.vision_tower.calls[-1]
    assert_same_tensor(got, want, "eager output")
    assert gen_call[0].dtype == torch.float16
    assert_same_tensor(gen_call[0], seed_call[0], "pixel_values")
    assert gen_call[1] == seed_call[1] and isinstance(gen_call[1], list)


def test_postprocess_is_the_protocol_scatter(module, backends) -> None:
    host = make_host(module, backends)
    out = torch.arange(12.0).reshape(6, 2)
    dest: list = [None] * 3
    host.postprocess_encoder_output(
        {"default": out}, [2, 0], [1, 0, 3], dest, clone=True
    )
    assert torch.equal(dest[2], out[0:3]) and torch.equal(dest[0], out[3:4])
    assert dest[1] is None
    out.fill_(-1)
    assert dest[2][0, 0] == 0  # cloned, not a view of the output buffer
