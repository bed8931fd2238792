"""Equivalence of every generated mixin with its tower, on the CPU (CI).

Each spec with a reference tower (``specs/<stem>.yaml`` and
``REFERENCE_TOWERS[stem]``; a new pair is picked up without changes here) is
captured and replayed by :class:`EncoderCudaGraphManager` with the
:class:`EagerReplayGraphBackend`: "replay" re-runs the captured forward on the
captured buffers after the manager's replay copies, so the mixin's buffer
layout, padding logic, replay preparation and postprocess run end to end as
under a CUDA graph. The tower is ``tiny`` in fp32 with ``FLASH_ATTN`` (the
guards refuse ``TORCH_SDPA``; on the CPU varlen attention runs per sequence),
and every item must match the tower's own per-image eager forward within
``FP32_TOLERANCE * max(1, max|ref|)``.

The guard tests read the spec for what to expect: the attention backend
allow/deny list and its hint, FP8 without static scales, and where an image
limit of 0 is refused (config or capture). Replaying into a ``cu_seqlens``
buffer that capture did not register must raise a clear ``RuntimeError``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

import equivalence_driver as drv

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from reference_towers.registry import REFERENCE_TOWERS

FP32_TOLERANCE = 1e-4
"""Per item: ``max|out - ref| <= 1e-4 * max(1, max|ref|)`` (fp32; the packed
and per-image paths differ only in reduction order)."""

STEMS = drv.discover_spec_stems()
SPECS = {stem: drv.load_spec(stem) for stem in STEMS}


def _guards(stem: str) -> dict[str, Any]:
    return SPECS[stem].get("guards") or {}


def _host(stem: str, **kwargs: Any) -> Any:
    return drv.build_host(stem, "tiny", device="cpu", dtype=torch.float32, **kwargs)


def _manager(host: Any, mm_config: MultiModalConfig, **config: Any) -> Any:
    return drv.build_manager(
        host,
        drv.build_vllm_config("tiny", multimodal_config=mm_config, **config),
        device="cpu",
        dtype=torch.float32,
        graph_backend=EagerReplayGraphBackend(),
    )


@pytest.fixture(autouse=True)
def _threads():
    # Two cores in CI: more threads only add contention.
    before = torch.get_num_threads()
    torch.set_num_threads(min(before, 2))
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------


def test_every_spec_with_a_tower_is_discovered():
    specs = sorted(p.stem for p in drv.SPECS_DIR.glob("*.yaml"))
    assert STEMS, "no spec has a reference tower"
    assert STEMS == [s for s in specs if s in REFERENCE_TOWERS]


@pytest.mark.parametrize("stem", STEMS)
def test_the_mixin_is_the_class_the_spec_names(stem):
    mixin = drv.load_mixin(stem)
    assert mixin.__name__ == SPECS[stem]["class_name"]
    assert mixin.__module__ == f"generated.standalone.{stem}"


@pytest.mark.parametrize("stem", STEMS)
def test_no_protocol_stub_shadows_a_host_method(stem):
    """A mixin deriving from ``SupportsEncoderCudaGraph`` must not hide the
    host's own methods behind the protocol's ``None``-returning stubs."""
    tower = REFERENCE_TOWERS[stem]
    host_cls = tower.host_class(drv.load_mixin(stem))
    assert drv.protocol_shadowed_host_methods(stem, host_cls) == []


# ---------------------------------------------------------------------------
# Equivalence
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_equivalence_tiny_fp32(stem):
    summary = drv.run_equivalence(
        stem,
        "tiny",
        device="cpu",
        dtype=torch.float32,
        graph_backend=EagerReplayGraphBackend(),
        attn_backend=AttentionBackendEnum.FLASH_ATTN,
        tolerance=FP32_TOLERANCE,
        seed=0,
        **drv.cpu_run(stem),
    )
    drv.assert_equivalent(summary)
    assert summary["batches"] == drv.cpu_run(stem)["num_batches"]
    assert summary["eager_fallbacks"] > 0 and summary["eager_items"] > 0
    assert summary["nonfinite"] == 0 and summary["aliasing"] == 0
    kinds = {kind.split(":")[-1] for kind in summary["kinds"]}
    assert set(drv.BATCH_KINDS) <= kinds, sorted(set(drv.BATCH_KINDS) - kinds)
    modalities = {k.split(":")[0] if ":" in k else "image" for k in summary["kinds"]}
    assert modalities == set(drv.tower_modalities(REFERENCE_TOWERS[stem]))


@pytest.mark.parametrize("stem", ["qwen2_5_vl", "step3_vl"])
def test_items_over_the_bar_carry_the_eager_noise_floor(stem):
    """An item over the tolerance is rerun alone, eagerly: the summary puts
    the graph's error beside the distance between the two eager results.
    (A negative tolerance puts every item over the bar.)"""
    summary = drv.run_equivalence(
        stem,
        "tiny",
        device="cpu",
        dtype=torch.float32,
        graph_backend=EagerReplayGraphBackend(),
        tolerance=-1.0,
        seed=0,
        num_batches=4,
    )
    assert summary["num_failures"] >= len(summary["over_bar"]) > 0
    for entry in summary["over_bar"]:
        assert "error" not in entry, entry
        assert entry["where"] in "\n".join(summary["failures"])
        # fp32 on the CPU: graph, alone and batched agree to rounding.
        for key in (
            "graph_vs_batched_eager",
            "graph_vs_alone_eager",
            "alone_vs_batched_eager",
        ):
            assert 0.0 <= entry[key] <= FP32_TOLERANCE, (key, entry)
        # In fp32 there is no truer result to hold the graph to.
        assert "graph_vs_fp32" not in entry and not entry["within_bar_of_fp32"]


def test_below_fp32_an_item_over_the_bar_is_held_to_the_fp32_twin():
    """bf16 on the CPU, every item put over the bar (a negative tolerance):
    each is compared with the fp32 twin, and fails unless within the
    tolerance of it."""
    tol = -1.0
    summary = drv.run_equivalence(
        "qwen2_vl",
        "tiny",
        device="cpu",
        dtype=torch.bfloat16,
        graph_backend=EagerReplayGraphBackend(),
        tolerance=tol,
        seed=0,
        num_batches=3,
    )
    over = summary["over_bar"]
    assert over
    for entry in over:
        assert 0.0 < entry["graph_vs_fp32"] < 0.05, entry
        assert 0.0 < entry["eager_vs_fp32"] < 0.05, entry
        assert entry["within_bar_of_fp32"] == (entry["graph_vs_fp32"] <= tol)
    failed = [e for e in over if not e["within_bar_of_fp32"]]
    assert summary["num_failures"] >= len(failed) > 0


@pytest.mark.parametrize("stem", STEMS)
def test_recapture_after_clear_replays_right(stem):
    """capture -> clear -> capture: buffers are new (maybe at old addresses);
    the mixin's capture registry must follow."""
    tower = REFERENCE_TOWERS[stem]
    mm_config = MultiModalConfig()
    host = _host(stem, multimodal_config=mm_config)
    # One budget of at least 64 that every path accepts (Step3-VL's global
    # path starts at 169).
    budget = max(
        64, host.get_encoder_cudagraph_budget_range(drv.build_vllm_config("tiny"))[0]
    )
    manager = _manager(host, mm_config, token_budgets=[budget], max_items_per_batch=4)
    items = [tower.smallest_item("tiny"), tower.legal_grid(random.Random(7), "tiny")]
    mm_kwargs = tower.make_mm_kwargs(host, items, "cpu", seed=3)
    expected = tower.reference_outputs(host, mm_kwargs)
    for _ in range(2):
        manager.capture()
        outputs = manager.execute(mm_kwargs)
        for out, ref in zip(outputs, expected, strict=True):
            torch.testing.assert_close(out, ref, rtol=0, atol=FP32_TOLERANCE)
        manager.clear()


# ---------------------------------------------------------------------------
# Plans of the GPU suite (checked here, where they are cheap)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", sorted(drv.GPU_RUNS))
@pytest.mark.parametrize("stem", STEMS)
def test_gpu_plans_reach_every_budget_split_and_eager(stem, size):
    """The GPU runs' batches, packed by the manager's rules on a meta host:
    every default budget is replayed, some executes split, and the eager
    phase falls back to eager; the bounded sizes keep the references small."""
    assert drv.gpu_plan_problems(stem, size, drv.build_meta_host(stem, size)) == []


def test_plans_are_deterministic():
    stem = STEMS[0]
    tower = REFERENCE_TOWERS[stem]
    kwargs = {"budgets": [64, 128], "max_batch_size": 4, "num_batches": 12, "seed": 5}
    first = drv.plan_batches(tower, "tiny", **kwargs)
    assert first == drv.plan_batches(tower, "tiny", **kwargs)
    assert first != drv.plan_batches(tower, "tiny", **{**kwargs, "seed": 6})


# ---------------------------------------------------------------------------
# Guards
# ---------------------------------------------------------------------------


def _backend_cases() -> list[tuple[str, str, bool]]:
    """(stem, backend, accepted) from each spec's attention_backend guard."""
    cases = []
    for stem in STEMS:
        guard = _guards(stem).get("attention_backend")
        if not guard:
            continue
        if "deny" in guard:
            rejected = list(guard["deny"])
            accepted = [b for b in ("FLASH_ATTN", "ROCM_AITER_FA") if b not in rejected]
        else:
            accepted = list(guard["allow"])
            rejected = [
                b
                for b in ("TORCH_SDPA", "FLASHINFER", "TRITON_ATTN")
                if b not in accepted
            ]
        cases += [(stem, b, False) for b in rejected]
        cases += [(stem, b, True) for b in accepted]
    return cases


BACKEND_CASES = _backend_cases()


def test_every_attention_guard_rejects_torch_sdpa():
    guarded = {stem for stem, _, _ in BACKEND_CASES}
    assert guarded, "no spec guards its attention backend"
    rejected = {(stem, b) for stem, b, ok in BACKEND_CASES if not ok}
    assert all((stem, "TORCH_SDPA") in rejected for stem in guarded)


@pytest.mark.parametrize(
    "stem,backend,accepted",
    BACKEND_CASES,
    ids=[f"{s}-{b}-{'ok' if a else 'rejected'}" for s, b, a in BACKEND_CASES],
)
def test_attention_backend_guard(stem, backend, accepted):
    guard = _guards(stem)["attention_backend"]
    mm_config = MultiModalConfig()
    host = _host(
        stem,
        attn_backend=AttentionBackendEnum[backend],
        multimodal_config=mm_config,
    )
    if accepted:
        config = host.get_encoder_cudagraph_config()
        assert config.modalities
        return
    # The manager asks for the config first, as vLLM's runner does.
    with pytest.raises(ValueError) as excinfo:
        _manager(host, mm_config)
    message = str(excinfo.value)
    assert backend in message
    assert SPECS[stem]["name"] in message
    assert guard["hint"] in message
    assert "cudagraph_mm_encoder" in message


FP8_STEMS = [s for s in STEMS if _guards(s).get("fp8_static_scales")]


@pytest.mark.parametrize("stem", FP8_STEMS)
def test_fp8_without_static_scales_is_rejected(stem):
    mm_config = MultiModalConfig(mm_encoder_attn_dtype="fp8")
    host = _host(stem, multimodal_config=mm_config)
    with pytest.raises(ValueError, match="--mm-encoder-fp8-scale-path") as excinfo:
        _manager(host, mm_config)
    assert "static FP8 scales" in str(excinfo.value)
    assert SPECS[stem]["name"] in str(excinfo.value)


@pytest.mark.parametrize("stem", FP8_STEMS)
def test_fp8_with_static_scales_is_accepted(stem):
    mm_config = MultiModalConfig(
        mm_encoder_attn_dtype="fp8", mm_encoder_fp8_scale_path="/scales.json"
    )
    host = _host(stem, multimodal_config=mm_config)
    assert _manager(host, mm_config).token_budgets


LIMIT_CASES = [
    (stem, where, variant)
    for stem in STEMS
    if (where := _guards(stem).get("image_limit_zero"))
    for variant in ("limit_per_prompt", "language_model_only")
]


@pytest.mark.parametrize(
    "stem,where,variant",
    LIMIT_CASES,
    ids=[f"{s}-{w}-{v}" for s, w, v in LIMIT_CASES],
)
def test_image_limit_zero_is_rejected_where_the_spec_says(stem, where, variant):
    if variant == "limit_per_prompt":
        mm_config = MultiModalConfig(limit_per_prompt={"image": 0})
    else:
        mm_config = MultiModalConfig(language_model_only=True)
    host = _host(stem, multimodal_config=mm_config)
    if where == "config":
        with pytest.raises(ValueError, match="image limit is 0") as excinfo:
            _manager(host, mm_config)
    else:
        assert where == "capture", where
        manager = _manager(host, mm_config, token_budgets=[64], max_items_per_batch=2)
        with pytest.raises(RuntimeError, match="image limit is 0") as excinfo:
            manager.capture()
    assert SPECS[stem]["name"] in str(excinfo.value)


TRAILING_PAD_CASES = [
    (stem, key)
    for stem in STEMS
    for key, buf in (SPECS[stem].get("buffers") or {}).items()
    if isinstance(buf, dict) and buf.get("pad") == "trailing_sequence"
]


@pytest.mark.parametrize(
    "stem,key", TRAILING_PAD_CASES, ids=[f"{s}-{k}" for s, k in TRAILING_PAD_CASES]
)
def test_replay_into_an_unregistered_buffer_fails_clearly(stem, key):
    tower = REFERENCE_TOWERS[stem]
    mm_config = MultiModalConfig()
    host = _host(stem, multimodal_config=mm_config)
    manager = _manager(host, mm_config, token_budgets=[64], max_items_per_batch=2)
    manager.capture()
    items = [tower.smallest_item("tiny")]
    mm_kwargs = tower.make_mm_kwargs(host, items, "cpu", seed=1)
    # Into the captured buffer: fine.
    (out,) = manager.execute(mm_kwargs)
    torch.testing.assert_close(
        out, tower.reference_outputs(host, mm_kwargs)[0], rtol=0, atol=FP32_TOLERANCE
    )
    graphs = manager.budget_graphs["default"]
    assert list(graphs) == [64]
    captured = graphs[64].input_buffers[key]
    # The padding logic itself, handed a look-alike buffer.
    pad = manager.config.padding_logics[key]
    with pytest.raises(RuntimeError, match="not registered at capture"):
        pad(torch.zeros_like(captured), captured[:2].clone())
    # A manager that replays into a buffer capture did not return.
    graphs[64].input_buffers[key] = captured.clone()
    with pytest.raises(RuntimeError, match="not registered at capture"):
        manager.execute(mm_kwargs)


def test_gpu_runs_draw_at_least_300_batches_per_model():
    assert sum(run["num_batches"] for run in drv.GPU_RUNS.values()) >= 300
    assert set(drv.GPU_RUNS) == {"tiny", "full"}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([], "no row"),
        ([2], "rows 2-2, 1 of 6"),
        ([1, 4, 5], "rows 1-5, 3 of 6"),
    ],
)
def test_a_nonfinite_output_buffer_is_named_with_its_rows(rows, expected):
    buf = torch.zeros(6, 2, 3)
    for row in rows:
        buf[row, 1, 0] = float("nan")
    text = drv._nonfinite_rows(("default", 128), buf)
    assert text == f"path 'default', key 128, shape (6, 2, 3): {expected}"


def test_only_the_graphs_an_execute_replayed_have_their_buffers_checked():
    """MiniCPM-V captures a graph per patch-grid key at each budget: the
    finiteness check reads the buffers of the graphs that replayed, not of
    every graph at a replayed budget (an unreplayed one's buffer holds
    whatever memory capture got: NaN after GPU runs F4-G's DeepSeek-V4.1 run,
    which the GPU suite took for MiniCPM-V reading unwritten pool rows)."""
    stem = "minicpmv"
    tower = REFERENCE_TOWERS[stem]
    mm_config = MultiModalConfig()
    host = _host(stem, multimodal_config=mm_config)
    budget = host.get_encoder_cudagraph_budget_range(drv.build_vllm_config("tiny"))[0]
    manager = _manager(host, mm_config, token_budgets=[budget], max_items_per_batch=1)
    manager.capture()
    replayed = drv._count_replays(manager)
    graphs = manager.budget_graphs["default"]
    assert len(graphs) > 1  # one per capture-axis key at the one budget
    with torch.inference_mode():  # capture made the buffers there
        for meta in graphs.values():
            meta.output_buffer.fill_(float("nan"))
    manager.execute(
        tower.make_mm_kwargs(host, [tower.smallest_item("tiny")], "cpu", seed=3)
    )
    checked = drv._output_buffers(manager, replayed)
    assert [key for key, _ in checked] == list(replayed)  # one item, one graph
    assert len(checked) == 1
    ((_, buf),) = checked
    assert bool(torch.isfinite(buf).all())  # the replay wrote its buffer
    unreplayed = [
        m.output_buffer for k, m in graphs.items() if ("default", k) not in replayed
    ]
    assert unreplayed and all(torch.isnan(b).all() for b in unreplayed)
