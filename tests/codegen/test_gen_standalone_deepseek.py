"""The generated DeepSeek-V4.1 mixin (standalone target) against the seed.

Pure Python on CPU: a fake host carries fake ``vision`` / ``aligner`` towers
(the attributes the mixin reads, and calls recorded); the metadata builders
the module imports are replaced by the seed-001 transcriptions in
``genmixin_seed_oracles``, and the span type constants by unusual values so
that nothing can rely on IMAGE_START..IMAGE_END being 0..3. Each method is
compared with the seed method transcribed as an oracle.

Deliberate differences from the seed, checked as such: item specs carry
``path_output_tokens`` (the ViT patches budgets count), so the capture dummy
is ``max_batch_size`` grids of ``1 x k`` patches and the aligner buffers are
allocated for ``ceil(token_budget / r) + max_batch_size`` rows (the most
aligner rows a batch within the budget has: an image has at most
``ceil(h*w / r)``); ``max_seqlen`` is
left out of the replay values; ``cu_seqlens`` has ``max_batch_size + 1``
slots and a smaller batch is closed with zero-length sequences, as vLLM's
mixin closes it, not with the seed's padding sequence up to the captured
rows (that sequence cost attention time quadratic in the padding: see
``test_repeat_last_closes_a_batch_with_empty_sequences``); a missing
``batch_mm_kwargs`` raises ValueError.
"""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import genmixin_seed_oracles as seed
from genmixin_testlib import (
    GENERATED_DIR,
    SPECS_DIR,
    load_standalone_mixin,
    most_rows_within,
)
from host_modules import FakeModule

from generator.resolve import load_spec
from generator.static_checks import (
    Arithmetic,
    batch_graph_rows,
    constant_env,
    graph_row_slope,
)

R = 2  # vision_downsample_ratio
PATCH = 2  # vision_patch_size
HIDDEN = 5
CONSTS = SimpleNamespace(IMAGE_START=7, IMAGE=3, IMAGE_NEW_LINE=5, IMAGE_END=9)
SEED_BUFFER_KEYS = [
    "patches",
    "vit_cos",
    "vit_sin",
    "cu_seqlens",
    "max_seqlen",
    "merge_idx",
    "merge_mask",
]


@pytest.fixture(scope="module")
def module():
    return load_standalone_mixin("deepseek_v41")


@pytest.fixture(scope="module")
def backends():
    from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum

    return AttentionBackendEnum


class FakeViT(FakeModule):
    def __init__(self, backend) -> None:
        self.rope_dim = 4
        self.rope_theta = 100.0
        attn = SimpleNamespace(attn=SimpleNamespace(attn_backend=backend))
        self.blocks = [SimpleNamespace(attn=attn)]
        self.calls: list[tuple] = []

    def forward_packed(self, patches, cos, sin, cu_seqlens, max_seqlen):
        self.calls.append(("forward_packed", patches, cos, sin, cu_seqlens, max_seqlen))
        return patches.flatten(1).float().sum(1, keepdim=True) + cos.sum()

    def __call__(self, patches, h, w):
        self.calls.append(("call", patches, h, w))
        return patches.flatten(1).float().sum(1, keepdim=True) * (h + 10 * w)


class FakeAligner(FakeModule):
    def __init__(self, dtype) -> None:
        self.w1 = SimpleNamespace(weight=torch.zeros(1, dtype=dtype))
        self.calls: list[tuple] = []

    def forward_packed(self, vit_out, merge_idx, merge_mask):
        self.calls.append(("forward_packed", vit_out, merge_idx, merge_mask))
        merged = (vit_out[merge_idx] * merge_mask).sum(1)
        return merged.expand(-1, HIDDEN) + torch.arange(HIDDEN)

    def __call__(self, vit_out, h, w):
        self.calls.append(("call", vit_out, h, w))
        rows = -(-h // R) * -(-w // R)
        base = torch.arange(rows * HIDDEN, dtype=torch.float32).reshape(rows, HIDDEN)
        return (base + vit_out.float().sum()).to(self.w1.weight.dtype)


def make_host(
    module, backends, *, backend="FLASH_ATTN", mm_config="default", dtype=None
):
    from encoder_cudagraph_runtime.config import MultiModalConfig

    cls = type("FakeDeepseekHost", (module.DeepseekV4VLEncoderCudaGraphMixin,), {})
    host = cls()
    host.vision = FakeViT(getattr(backends, backend))
    host.aligner = FakeAligner(dtype or torch.bfloat16)
    host.config = SimpleNamespace(
        vision_downsample_ratio=R, vision_patch_size=PATCH, hidden_size=HIDDEN
    )
    host.multimodal_config = MultiModalConfig() if mm_config == "default" else mm_config
    g = torch.Generator().manual_seed(1)
    host.image_start = torch.nn.Parameter(torch.randn(HIDDEN, generator=g))
    host.image_newline = torch.nn.Parameter(torch.randn(HIDDEN, generator=g))
    host.image_end = torch.nn.Parameter(torch.randn(HIDDEN, generator=g))
    return host


@pytest.fixture
def env(module, backends, monkeypatch):
    """Patched module globals; returns the builders and the H2D recorder."""
    builders = seed.DeepseekBuilders()
    monkeypatch.setattr(
        module, "build_packed_vit_metadata", builders.build_packed_vit_metadata
    )
    monkeypatch.setattr(
        module, "build_packed_merge_metadata", builders.build_packed_merge_metadata
    )
    for name, value in vars(CONSTS).items():
        monkeypatch.setattr(module, name, value, raising=False)
    h2d_calls: list[tuple] = []
    real_h2d = module.async_tensor_h2d

    def recording_h2d(data, device=None, *args, **kwargs):
        h2d_calls.append((data, device))
        return real_h2d(data, device, *args, **kwargs)

    monkeypatch.setattr(module, "async_tensor_h2d", recording_h2d)
    return SimpleNamespace(builders=builders, h2d=h2d_calls)


def make_batch(rng: random.Random, n: int, *, list_grids=False, dtype=torch.float32):
    vit, llm, types = [], [], []
    for _ in range(n):
        h, w = rng.randint(1, 7), rng.randint(1, 7)
        lh, lw = -(-h // R), -(-w // R)
        vit.append([h, w])
        llm.append([lh, lw])
        types.extend(seed.ds_span_types(lh, lw, CONSTS))
    rows = sum(h * w for h, w in vit)
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    return {
        "patches": torch.randn(rows, 3, PATCH, PATCH, generator=g).to(dtype),
        "vit_grid": vit if list_grids else torch.tensor(vit, dtype=torch.int64),
        "llm_grid": llm if list_grids else torch.tensor(llm, dtype=torch.int64),
        "types": torch.tensor(types, dtype=torch.int64),
    }


def assert_same_tensor(a, b, what: str) -> None:
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), what
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.device == b.device, f"{what}: device {a.device} != {b.device}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(a, b), what


# -- item specs and selection ------------------------------------------------------


@pytest.mark.parametrize(
    "list_grids", [False, True], ids=["tensor-grids", "list-grids"]
)
@pytest.mark.parametrize("rng_seed", range(3))
def test_item_specs_match_seed(module, backends, env, list_grids, rng_seed) -> None:
    host = make_host(module, backends)
    batch = make_batch(random.Random(rng_seed), 5, list_grids=list_grids)
    specs = host.get_encoder_cudagraph_item_specs(batch)
    assert [(s.input_size, s.output_tokens) for s in specs] == seed.ds_item_specs(batch)
    assert all(
        type(s.input_size) is int and type(s.output_tokens) is int for s in specs
    )
    # Not in the seed: budgets count the ViT patches.
    patches = [h * w for h, w in seed.ds_grid_list(batch, "vit_grid")]
    assert [s.path_output_tokens for s in specs] == [{"default": n} for n in patches]


def test_item_specs_reject_mismatched_grids(module, backends) -> None:
    host = make_host(module, backends)
    with pytest.raises(ValueError):
        host.get_encoder_cudagraph_item_specs(
            {"vit_grid": [[2, 2], [3, 3]], "llm_grid": [[1, 1]]}
        )


@pytest.mark.parametrize(
    "list_grids", [False, True], ids=["tensor-grids", "list-grids"]
)
@pytest.mark.parametrize(
    "indices", [[0], [4], [3, 1], [4, 0, 2], [0, 1, 2, 3, 4], [2, 4, 1, 3, 0]]
)
def test_select_matches_seed(module, backends, env, list_grids, indices) -> None:
    host = make_host(module, backends)
    batch = make_batch(random.Random(7), 5, list_grids=list_grids)
    got = host.select_encoder_cudagraph_items(batch, list(indices))
    want = seed.ds_select(batch, list(indices))
    assert list(got) == ["patches", "vit_grid", "llm_grid", "types"]
    for key in want:
        assert_same_tensor(got[key], want[key], key)
    # types is cut by span lengths, in the order of indices.
    spans = [seed.ds_span_types(*row, CONSTS) for row in want["llm_grid"].tolist()]
    assert got["types"].tolist() == [t for span in spans for t in span]


@pytest.mark.parametrize(
    "list_grids", [False, True], ids=["tensor-grids", "list-grids"]
)
def test_select_empty(module, backends, env, list_grids) -> None:
    host = make_host(module, backends)
    batch = make_batch(random.Random(3), 4, list_grids=list_grids, dtype=torch.float16)
    got = host.select_encoder_cudagraph_items(batch, [])
    want = seed.ds_select(batch, [])
    for key in want:
        assert_same_tensor(got[key], want[key], key)
    assert got["patches"].shape == (0, 3, PATCH, PATCH)
    assert got["patches"].dtype == torch.float16
    assert got["vit_grid"].shape == got["llm_grid"].shape == (0, 2)
    assert got["types"].shape == (0,)
    # The empty selection is valid input to the other methods.
    assert host.get_encoder_cudagraph_item_specs(got) == []
    assert host.encoder_eager_forward(got).shape == (0, HIDDEN)


def test_selection_of_a_selection(module, backends, env) -> None:
    """DP re-selects from a selection: composing is selecting the composition."""
    host = make_host(module, backends)
    batch = make_batch(random.Random(11), 6)
    first = [5, 2, 0, 3]
    sub = [3, 0, 2]
    twice = host.select_encoder_cudagraph_items(
        host.select_encoder_cudagraph_items(batch, first), sub
    )
    once = host.select_encoder_cudagraph_items(batch, [first[i] for i in sub])
    for key in once:
        assert_same_tensor(twice[key], once[key], key)


# -- budget range and guards ---------------------------------------------------------


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
    host = make_host(module, backends)
    smallest, step = seed.budget_range(cfg)
    # Not in the seed: budgets count patches, up to R * R per output token
    # of a scheduler step (budget.max).
    assert host.get_encoder_cudagraph_budget_range(cfg) == (smallest, R * R * step)


def test_config_matches_seed(module, backends, env) -> None:
    host = make_host(module, backends)
    cfg = host.get_encoder_cudagraph_config()
    assert cfg.modalities == ["image"]
    assert cfg.buffer_keys == SEED_BUFFER_KEYS
    assert cfg.out_hidden_size == HIDDEN
    assert set(cfg.padding_logics) == {"cu_seqlens"}


@pytest.mark.parametrize("backend", ["FLASHINFER", "TORCH_SDPA"])
def test_denied_backends_are_refused_by_name(module, backends, backend) -> None:
    host = make_host(module, backends, backend=backend)
    with pytest.raises(ValueError) as info:
        host.get_encoder_cudagraph_config()
    message = str(info.value)
    assert f"with the {backend} ViT attention backend" in message
    assert "DeepSeek-V4.1" in message
    assert "--mm-encoder-attn-backend FLASH_ATTN" in message


@pytest.mark.parametrize("backend", ["FLASH_ATTN", "TRITON_ATTN", "ROCM_AITER_FA"])
def test_other_backends_are_accepted(module, backends, backend) -> None:
    make_host(module, backends, backend=backend).get_encoder_cudagraph_config()


def test_fp8_needs_static_scales(module, backends) -> None:
    from encoder_cudagraph_runtime.config import MultiModalConfig

    dynamic = MultiModalConfig(mm_encoder_attn_dtype="fp8")
    host = make_host(module, backends, mm_config=dynamic)
    with pytest.raises(ValueError, match="--mm-encoder-fp8-scale-path"):
        host.get_encoder_cudagraph_config()
    static = MultiModalConfig(
        mm_encoder_attn_dtype="fp8", mm_encoder_fp8_scale_path="s"
    )
    make_host(module, backends, mm_config=static).get_encoder_cudagraph_config()
    # The fp8 guard runs before the backend guard, as in the seed.
    host = make_host(module, backends, mm_config=dynamic, backend="TORCH_SDPA")
    with pytest.raises(ValueError, match="fp8|FP8"):
        host.get_encoder_cudagraph_config()


def test_image_limit_zero_refused_at_capture_not_config(module, backends, env) -> None:
    from encoder_cudagraph_runtime.config import MultiModalConfig

    stubbed = MultiModalConfig(limit_per_prompt={"image": 0})
    host = make_host(module, backends, mm_config=stubbed)
    host.get_encoder_cudagraph_config()  # no error here (seed: capture time)
    with pytest.raises(RuntimeError, match="image limit is 0"):
        host.prepare_encoder_cudagraph_capture_inputs(
            64, 4, 0, torch.device("cpu"), torch.float32
        )
    assert env.builders.calls == []  # refused before any work
    for ok in (None, MultiModalConfig(language_model_only=False)):
        host = make_host(module, backends, mm_config=ok)
        host.prepare_encoder_cudagraph_capture_inputs(
            64, 4, 0, torch.device("cpu"), torch.float32
        )


# -- capture ------------------------------------------------------------------------------

CAPTURE_CASES = [(64, 1), (64, 64), (100, 7), (257, 8), (1000, 3), (65, 64)]


@pytest.mark.parametrize(("budget", "mbs"), CAPTURE_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_capture_inputs(module, backends, env, budget, mbs, dtype) -> None:
    """Not the seed's dummy (r x r*k grids, budgets in aligner rows): budgets
    count patches, so the dummy is 1 x k patches per item and the aligner
    buffers hold ceil(token_budget / r) + max_batch_size rows, the builder's
    dummy rows first."""
    host = make_host(module, backends)
    device = torch.device("cpu")
    got = host.prepare_encoder_cudagraph_capture_inputs(
        budget, mbs, 0, device, dtype
    ).values
    calls = list(env.builders.calls)
    assert set(got) == set(SEED_BUFFER_KEYS)

    k = -(-budget // mbs)  # rounded up: the dummy batch covers the budget
    rows = mbs * k
    grids = [[1, k]] * mbs
    assert calls[0][1] == (grids,)
    assert calls[0][2]["cached"] is False  # dummy grids must not evict RoPE tables
    assert calls[0][2]["max_seqlen_override"] == rows
    vit = env.builders.build_packed_vit_metadata(
        grids, rope_dim=4, rope_theta=100.0, device=device
    )
    for key in ("vit_cos", "vit_sin"):
        assert_same_tensor(got[key], vit[key], key)
    assert got["patches"].shape == (rows, 3, PATCH, PATCH)
    assert got["patches"].dtype == dtype
    assert got["cu_seqlens"].dtype == torch.int32
    # max_batch_size + 1 slots, the dummy's offsets: none to spare.
    assert got["cu_seqlens"].tolist() == [i * k for i in range(mbs + 1)]
    assert got["max_seqlen"].dim() == 0 and got["max_seqlen"].device.type == "cpu"
    assert int(got["max_seqlen"]) == rows

    merge = env.builders.build_packed_merge_metadata(
        grids, R, device=device, dtype=dtype
    )
    dummy_rows = mbs * -(-k // R)
    assert merge["merge_idx"].shape[0] == dummy_rows
    capacity = -(-budget // R) + mbs
    assert got["merge_idx"].shape == (capacity, R * R)
    assert got["merge_mask"].shape == (capacity, R * R, 1)
    assert got["merge_idx"].dtype == torch.int64 and got["merge_mask"].dtype == dtype
    assert torch.equal(got["merge_idx"][:dummy_rows], merge["merge_idx"])
    assert torch.equal(got["merge_mask"][:dummy_rows], merge["merge_mask"])
    assert not got["merge_idx"][dummy_rows:].any()
    assert not got["merge_mask"][dummy_rows:].any()
    # Room for the worst batch within the budget, found by brute force (the
    # dummy, rounded up to whole items, may have more patches than it).
    assert capacity >= max(most_aligner_rows(budget, mbs), dummy_rows)


@pytest.mark.parametrize(("budget", "mbs"), [(64, 2), (257, 8), (1000, 3), (1024, 64)])
def test_the_static_check_bounds_every_batch(budget, mbs) -> None:
    """The generator's bound on a batch's aligner rows (from the sampled
    items' rows per patch, at the spec's r = 3) holds every batch that the
    brute force finds, and stays within a row per item of it."""
    ir = Arithmetic.of(load_spec(SPECS_DIR / "deepseek_v41.yaml"))
    env = constant_env(ir)
    slope = graph_row_slope(ir, env)
    assert slope is not None and 0.3332 < slope < 1 / 3
    most = most_aligner_rows(budget, mbs, r=env["r"])
    assert most <= batch_graph_rows(slope, budget, mbs) <= most + mbs


def most_aligner_rows(budget: int, mbs: int, r: int = R) -> int:
    """The most aligner rows of at most ``mbs`` images of ``h x w`` patches,
    ``h * w`` summed within ``budget``: a knapsack over every grid."""
    gain = [0] * (budget + 1)  # the most rows of an image of that many patches
    for h in range(1, budget + 1):
        for w in range(1, budget // h + 1):
            gain[h * w] = max(gain[h * w], -(-h // r) * -(-w // r))
    return most_rows_within(gain, mbs)


# -- replay copies (padding logics) -----------------------------------------------------------


def _capture(host, budget=100, mbs=4):
    values = host.prepare_encoder_cudagraph_capture_inputs(
        budget, mbs, 0, torch.device("cpu"), torch.float32
    ).values
    pad = host.get_encoder_cudagraph_config().padding_logics["cu_seqlens"]
    return values, pad


def _offsets(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)


@pytest.mark.parametrize("n_items", [0, 1, 2, 3, 4])
def test_repeat_last_closes_a_batch_with_empty_sequences(
    module, backends, env, n_items
) -> None:
    """vLLM's DeepSeek-V4.1 mixin closes a smaller batch with zero-length
    sequences: every slot past the real offsets repeats the last one. The
    seed closed it with one padding sequence up to the captured rows; the
    spec deliberately differs from the seed now (H100 run I,
    bench/measure_padding.py, half a budget: 84 vs 61 ms at 16384 patches,
    552 vs 233 ms at 65536, attention's cost quadratic in the padding
    sequence; both correct)."""
    host = make_host(module, backends)
    values, pad = _capture(host, budget=100, mbs=4)  # 5 slots
    rows = int(values["max_seqlen"])
    src = _offsets([3, 9, 4, 1][:n_items])
    dst = values["cu_seqlens"]
    assert dst.shape == (5,)
    dst.fill_(-1)  # stale slots of an earlier replay
    pad(dst, src)
    last = int(src[-1])
    assert dst.tolist() == src.tolist() + [last] * (5 - src.numel())
    assert torch.equal(src, _offsets([3, 9, 4, 1][:n_items]))  # left as it was
    if n_items < 4:
        seeds = dst.clone()
        seed.ds_pad_cu_seqlens(seeds, src, rows)
        assert seeds[-1] == rows != dst[-1]  # the seed's padding sequence


def test_a_full_batch_fills_every_slot(module, backends, env) -> None:
    """``max_batch_size + 1`` slots: a batch of ``max_batch_size`` items
    fills them all, no spare slot needed."""
    host = make_host(module, backends)
    values, pad = _capture(host, budget=100, mbs=4)
    src = _offsets([3, 9, 4, 1])
    pad(values["cu_seqlens"], src)
    assert values["cu_seqlens"].tolist() == src.tolist()


def test_repeat_last_needs_no_capture_registry(module, backends, env) -> None:
    """The padding reads only the offsets it is given: any buffer of the
    captured shape is padded alike, and the host keeps no registry of
    captured buffers (the trailing sequence's, tested on MiniMax M3)."""
    host = make_host(module, backends)
    values, pad = _capture(host, budget=64, mbs=2)
    other = make_host(module, backends)
    other_values, _ = _capture(other, budget=1000, mbs=2)
    src = _offsets([5])
    for dst in (
        values["cu_seqlens"],
        values["cu_seqlens"].clone(),
        other_values["cu_seqlens"],
        torch.full((3,), -1, dtype=torch.int32),
    ):
        pad(dst, src)
        assert dst.tolist() == [0, 5, 5]
    assert "_encoder_cg_pad_totals" not in host.__dict__
    assert "_encoder_cg_pad_totals" not in other.__dict__


# -- replay, forward, eager ------------------------------------------------------------------


@pytest.mark.parametrize("indices", [[0], [2, 0, 1], [3, 1]])
def test_replay_buffers_match_seed(module, backends, env, indices) -> None:
    host = make_host(module, backends, dtype=torch.bfloat16)
    batch = host.select_encoder_cudagraph_items(
        make_batch(random.Random(5), 4), indices
    )
    assert batch["patches"].dtype == torch.float32
    got = host.prepare_encoder_cudagraph_replay_buffers(batch, 8, 0).values
    gen_calls = list(env.builders.calls)
    env.builders.calls.clear()
    want = seed.ds_replay(host, env.builders, batch)
    assert env.builders.calls == gen_calls
    # max_seqlen is left out on purpose (its capture value is baked in).
    assert "max_seqlen" not in got
    assert set(got) == set(want) - {"max_seqlen"}
    for key in got:
        assert_same_tensor(got[key], want[key], key)
    assert got["patches"].dtype == torch.bfloat16  # cast to the aligner's dtype
    assert (
        gen_calls[0][2]["cached"] is True
        and gen_calls[0][2]["max_seqlen_override"] is None
    )
    assert got["cu_seqlens"].numel() == len(indices) + 1  # unpadded


def test_graph_forward_matches_seed(module, backends, env) -> None:
    host = make_host(module, backends)
    values, _ = _capture(host, budget=64, mbs=2)
    got = host.encoder_cudagraph_forward({**values})
    gen_vision, gen_aligner = list(host.vision.calls), list(host.aligner.calls)
    host.vision.calls.clear()
    host.aligner.calls.clear()
    want = seed.ds_graph_forward(host, {**values})
    assert_same_tensor(got, want, "graph output")
    names = ["patches", "vit_cos", "vit_sin", "cu_seqlens", "max_seqlen"]
    assert all(a is values[n] for a, n in zip(gen_vision[0][1:], names, strict=True))
    assert (
        gen_aligner[0][2] is values["merge_idx"]
        and gen_aligner[0][3] is values["merge_mask"]
    )
    assert len(gen_vision) == len(host.vision.calls) == 1


@pytest.mark.parametrize("n", [0, 1, 4])
def test_eager_forward_matches_seed(module, backends, env, n) -> None:
    host = make_host(module, backends, dtype=torch.bfloat16)
    batch = make_batch(random.Random(n), n)
    got = host.encoder_eager_forward(batch)
    gen_calls = [(c[0], c[2:]) for c in host.vision.calls]
    host.vision.calls.clear()
    want = seed.ds_eager(host, batch)
    assert_same_tensor(got, want, "eager output")
    assert gen_calls == [(c[0], c[2:]) for c in host.vision.calls]
    assert got.shape[1] == HIDDEN


# -- span assembly (postprocess_encoder_output) -------------------------------------------------


def _postprocess_case(rng: random.Random, module, backends, out_dtype):
    host = make_host(module, backends)
    n = rng.randint(1, 6)
    n_full = n + rng.randint(0, 3)
    full = make_batch(rng, n_full, list_grids=rng.random() < 0.5)
    chosen = rng.sample(range(n_full), n)
    batch = host.select_encoder_cudagraph_items(full, chosen)
    graph_rows = sum(-(-h // R) * -(-w // R) for h, w in batch["vit_grid"].tolist())
    padded = graph_rows + rng.randint(0, 5)
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    outputs = {"default": torch.randn(padded, HIDDEN, generator=g).to(out_dtype)}
    dest_size = n + rng.randint(0, 3)
    indices = rng.sample(range(dest_size), n)
    per_item = [0] * dest_size
    for idx, (lh, lw) in zip(indices, batch["llm_grid"].tolist(), strict=True):
        per_item[idx] = lh * (lw + 1) + 2
    return host, batch, outputs, indices, per_item, dest_size


@pytest.mark.parametrize("rng_seed", range(12))
def test_span_assembly_matches_seed(module, backends, env, rng_seed) -> None:
    rng = random.Random(rng_seed)
    out_dtype = [torch.float32, torch.bfloat16, torch.float16][rng_seed % 3]
    host, batch, outputs, indices, per_item, size = _postprocess_case(
        rng, module, backends, out_dtype
    )
    use_list = rng_seed % 2 == 0
    dest = [None] * size if use_list else {}
    host.postprocess_encoder_output(
        outputs, indices, per_item, dest, clone=True, batch_mm_kwargs=batch
    )
    seed_dest = [None] * size if use_list else {}
    seed.ds_postprocess(host, outputs, indices, seed_dest, batch, CONSTS)
    assert len(env.h2d) == 1  # one index transfer for the whole batch

    # The per-item seed span (eager multimodal path) is an independent oracle.
    offset = 0
    for idx, (lh, lw) in zip(indices, batch["llm_grid"].tolist(), strict=True):
        n_rows = lh * lw
        embeds = outputs["default"][offset : offset + n_rows]
        offset += n_rows
        types = torch.tensor(seed.ds_span_types(lh, lw, CONSTS))
        want = seed.ds_build_image_span(host, embeds, types, CONSTS)
        assert_same_tensor(dest[idx], want, f"span of item {idx}")
        assert_same_tensor(dest[idx], seed_dest[idx], f"span of item {idx} (batched)")
        assert dest[idx].shape[0] == per_item[idx]
    untouched = set(range(size)) - set(indices)
    if use_list:
        assert all(dest[i] is None for i in untouched)
    else:
        assert set(dest) == set(indices)


def test_span_assembly_results_are_fresh_tensors(module, backends, env) -> None:
    host, batch, outputs, indices, per_item, _ = _postprocess_case(
        random.Random(99), module, backends, torch.float32
    )
    dest: dict[int, torch.Tensor] = {}
    host.postprocess_encoder_output(
        outputs, indices, per_item, dest, clone=False, batch_mm_kwargs=batch
    )
    snapshot = {i: t.clone() for i, t in dest.items()}
    out_storage = outputs["default"].untyped_storage().data_ptr()
    for t in dest.values():
        assert t.untyped_storage().data_ptr() != out_storage
    outputs["default"].fill_(float("nan"))  # the next replay overwrites the buffer
    for i, t in dest.items():
        assert torch.equal(t, snapshot[i])


def test_span_assembly_edge_cases(module, backends, env) -> None:
    host, _, outputs, indices, per_item, _ = _postprocess_case(
        random.Random(5), module, backends, torch.float32
    )
    dest: dict[int, torch.Tensor] = {}
    host.postprocess_encoder_output(outputs, [], [], dest, batch_mm_kwargs=None)
    assert dest == {} and env.h2d == []
    with pytest.raises(ValueError, match="batch_mm_kwargs"):
        host.postprocess_encoder_output(
            outputs, indices, per_item, dest, batch_mm_kwargs=None
        )


def test_the_class_says_its_eager_forward_runs_item_by_item(module) -> None:
    """``eager_forward.per_item``: the runtime's cost-aware eager units run
    such a tower's items largest first (docs/runtime.md); the vllm module,
    which vLLM's manager reads, has no such attribute."""
    cls = module.DeepseekV4VLEncoderCudaGraphMixin
    assert cls.encoder_eager_forward_per_item is True
    vllm_text = (GENERATED_DIR / "vllm" / "deepseek_v41.py").read_text(encoding="utf-8")
    assert "encoder_eager_forward_per_item" not in vllm_text
    minimax = (GENERATED_DIR / "standalone" / "minimax_m3.py").read_text(
        encoding="utf-8"
    )
    assert "encoder_eager_forward_per_item" not in minimax
