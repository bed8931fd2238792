"""`gen-mixin plan` against the runtime manager, and its static checks."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from generator.plan import PlanError, format_plan, make_plan, resolve_budgets
from generator.resolve import load_spec, resolve_text
from generator.diagnostics import SpecError
from generator.spec import PadRule

torch = pytest.importorskip("torch")

from encoder_cudagraph_runtime.attention_backends import (
    AttentionBackendEnum,
)  # noqa: E402
from encoder_cudagraph_runtime.config import (  # noqa: E402
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.graph_backends import (
    EagerReplayGraphBackend,
)  # noqa: E402
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from generated.standalone.minimax_m3 import MiniMaxM3EncoderCudaGraphMixin  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))


class _Host(MiniMaxM3EncoderCudaGraphMixin):
    """Just enough of a MiniMax host for the manager's constructor."""

    def __init__(self) -> None:
        self.multimodal_config = MultiModalConfig()
        self.vision_tower = SimpleNamespace(
            out_hidden_size=8,
            vision_model=SimpleNamespace(attn_backend=AttentionBackendEnum.FLASH_ATTN),
        )


def _manager(
    mnbt: int, mml: int, budgets: list[int], items: int
) -> EncoderCudaGraphManager:
    config = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=mnbt),
        model_config=ModelConfig(
            max_model_len=mml, multimodal_config=MultiModalConfig()
        ),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=budgets,
            encoder_cudagraph_max_vision_items_per_batch=items,
        ),
    )
    return EncoderCudaGraphManager(
        config,
        torch.device("cpu"),
        torch.float32,
        _Host(),
        graph_backend=EagerReplayGraphBackend(),
    )


LIMITS = [
    (8192, 8192),
    (5000, 100000),
    (100000, 2048),
    (64, 64),
    (100, 4096),
    (16384, 32768),
]
USER_BUDGETS = [[], [256], [1024, 128, 4096], [64, 65]]
USER_ITEMS = [0, 1, 7, 64, 200]


@pytest.mark.parametrize(
    "limits,budgets,items", list(itertools.product(LIMITS, USER_BUDGETS, USER_ITEMS))
)
def test_ladder_and_batch_size_match_the_manager(limits, budgets, items):
    mnbt, mml = limits
    ir = load_spec(ROOT / "specs" / "minimax_m3.yaml")
    try:
        manager = _manager(mnbt, mml, budgets, items)
    except ValueError as exc:
        with pytest.raises(PlanError) as err:
            make_plan(
                ir,
                max_num_batched_tokens=mnbt,
                max_model_len=mml,
                budgets=budgets,
                max_items=items,
            )

        # Same refusal, same leading sentence (the rest explains it in each
        # implementation's words).
        def lead(text: str) -> str:
            return re.split(r"[.:]", text)[0]

        assert lead(str(err.value)) == lead(str(exc))
        return
    plan = make_plan(
        ir,
        max_num_batched_tokens=mnbt,
        max_model_len=mml,
        budgets=budgets,
        max_items=items,
    )
    assert plan.budgets == manager.token_budgets
    assert plan.max_batch_size == manager.max_batch_size
    assert plan.max_frames_per_batch == manager.max_frames_per_batch
    assert plan.num_graphs == manager.get_num_graphs_to_capture()


def test_generate_budgets_examples():
    assert resolve_budgets((64, 5000))[0] == [64, 128, 256, 512, 1024, 2048, 4096, 5000]
    assert resolve_budgets((100, 100))[0] == [100]
    with pytest.raises(PlanError, match="min_budget=100 > max_budget=50"):
        resolve_budgets((100, 50))


def _captures_units(spec: Path) -> bool:
    """A unit capture (tiles, crops, chunks): no dummy items, no offsets."""
    return re.search(r"^ +units:", spec.read_text(encoding="utf-8"), re.M) is not None


def _captures_padded(spec: Path) -> bool:
    """A capture of padded inputs (rows of items, not a dummy batch's rows)."""
    text = spec.read_text(encoding="utf-8")
    return re.search(r"kind: (padded|tensors)", text) is not None


ITEM_SPECS = [s for s in SPECS if not _captures_units(s) and not _captures_padded(s)]
UNIT_SPECS = [s for s in SPECS if _captures_units(s)]
PADDED_SPECS = [s for s in SPECS if _captures_padded(s)]


@pytest.mark.parametrize("spec", UNIT_SPECS, ids=[s.stem for s in UNIT_SPECS])
def test_plan_shapes_follow_the_captured_units(spec):
    ir = load_spec(spec)
    # Budgets above every unit spec's smallest (one view of up to 256 tokens;
    # Step3-VL's default path plans its own budgets, one global view each).
    plan = make_plan(ir, budgets=[1024, 4096], max_items=4)
    for budget_plan in plan.per_budget:
        assert budget_plan.k is None and budget_plan.units >= 1
        by_key = {b.key: b for b in budget_plan.buffers}
        # Every flat capture buffer holds one view per captured unit.
        # (per_budget is the first path's: a spec's paths in order.)
        # (A capture tensor that only feeds builder steps is no buffer:
        # LFM2-VL's pixels, which its steps pack.)
        for tensor in ir.paths[0].capture.tensors:
            if tensor.key in by_key:
                assert by_key[tensor.key].shape[0] == budget_plan.units
    assert plan.problems == []


@pytest.mark.parametrize("spec", PADDED_SPECS, ids=[s.stem for s in PADDED_SPECS])
def test_plan_shapes_of_padded_inputs_are_rows_of_the_dummy_item(spec):
    ir = load_spec(spec)
    plan = make_plan(ir, max_items=4)
    text = format_plan(plan)
    padded = {i.key for i in ir.item_inputs if i.is_padded}
    for budget_plan in plan.per_budget:
        assert budget_plan.padded and not re.search(r"\bk=", text)
        by_key = {b.key: b for b in budget_plan.buffers}
        for item_input in ir.item_inputs:
            if item_input.key not in padded or item_input.key not in by_key:
                continue
            rows, *sizes = by_key[item_input.key].shape
            # At most max_batch_size rows, each as wide as the dummy item
            # (a tensors input's: its item tensor, room for the dummy's dims).
            assert 1 <= rows <= 4
            dummy = budget_plan.dummy[item_input.key]
            if item_input.is_tensors:
                assert len(sizes) == len(item_input.item_shape)
                positions = item_input.dim_positions
                assert all(sizes[p] >= d for p, d in zip(positions, dummy, strict=True))
            else:
                assert [sizes[0]] == dummy
    assert plan.problems == []


@pytest.mark.parametrize("spec", ITEM_SPECS, ids=[s.stem for s in ITEM_SPECS])
def test_plan_shapes_follow_the_dummy_batch(spec):
    ir = load_spec(spec)
    plan = make_plan(ir, budgets=[128, 512], max_items=4)
    for budget_plan in plan.per_budget:
        k = -(-budget_plan.budget // 4)
        assert budget_plan.k == k
        by_key = {b.key: b for b in budget_plan.buffers}
        flat = ir.path.capture.tensors[0].key
        # Every flat capture buffer holds exactly the dummy batch's input rows.
        assert by_key[flat].shape[0] == budget_plan.rows
        # No pad buffer: the tower pads its offsets itself (ERNIE-4.5-VL).
        cu = ir.path.pad_buffers[0] if ir.path.pad_buffers else None
        if cu is None:
            pass
        elif cu.pad is PadRule.TRAILING_SEQUENCE:
            # Every offset of a full batch, plus the spare slot.
            assert by_key[cu.key].shape == [4 + 2]
        else:
            # One offset per sequence: every item, and every frame a batch
            # within the budget can bring (a frame has at least one token).
            frames = min(budget_plan.budget, plan.max_frames_per_batch)
            assert by_key[cu.key].shape[0] >= max(frames, 4) + 1
        assert budget_plan.total_bytes == sum(
            b.nbytes or 0 for b in budget_plan.buffers
        )
    assert plan.problems == []


def test_plan_cli_text_and_json():
    spec = ROOT / "specs" / "deepseek_v41.yaml"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "generator.cli",
            "plan",
            str(spec),
            "--json",
            "--budgets",
            "64",
            "256",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    data = json.loads(out)
    assert data["budgets"] == [64, 256]
    assert data["max_batch_size"] == 64
    text = subprocess.run(
        [sys.executable, "-m", "generator.cli", "plan", str(spec), "--set", "r=2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    # r=2: a dummy item is [1, k] patches, ceil(k / 2) aligner cells.
    assert "vit_grid=[1, 4], llm_grid=[1, 2]" in text
    # DeepSeek-V4.1's budgets count patches, not output tokens: its range
    # ends at budget.max = r*r*min(8192, 8192), as the mixin computes it.
    assert "budget range (min, max): (64, 32768)" in text
    assert "largest item a graph takes: 32768 budget tokens" in text


def test_plan_rejects_bad_set():
    spec = ROOT / "specs" / "deepseek_v41.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "generator.cli", "plan", str(spec), "--set", "r=two"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert "'two' is not an integer" in proc.stderr


def _mutated(old: str, new: str) -> str:
    text = (ROOT / "specs" / "minimax_m3.yaml").read_text()
    assert old in text
    return text.replace(old, new)


# Each static check, tripped by a spec; the message names the field.
TRIPS = {
    "dummy cannot cover its budget": (
        ("image_grid_thw: [1, merge, k * merge]", "image_grid_thw: [1, merge, k]"),
        r"capture\.dummy: the dummy batch cannot cover its budget",
    ),
    "input rows outside the buffer": (
        ("shape: [rows, channels", "shape: [rows // 2, channels"),
        r"capture\.tensors\.pixel_values\.shape: holds \d+ rows but the dummy batch has",
    ),
    "no spare cu_seqlens slot": (
        ("slots: max_batch_size + 2", "slots: max_batch_size + 1"),
        r"buffers\.cu_seqlens\.slots: \d+ slots for max_batch_size \d+",
    ),
    "max_seqlen below the longest sequence": (
        (
            "capture_kwargs: {max_seqlen_override: rows}",
            "capture_kwargs: {max_seqlen_override: k}",
        ),
        r"buffers\.max_seqlen\.set_by: max_seqlen is captured as \d+",
    ),
    "dummy dims not positive": (
        (
            "image_grid_thw: [1, merge, k * merge]",
            "image_grid_thw: [1, merge - 2, k * merge]",
        ),
        r"capture\.dummy: dummy dims h are not positive",
    ),
}


@pytest.mark.parametrize("name", list(TRIPS))
def test_each_static_check_has_a_spec_that_trips_it(name):
    (old, new), pattern = TRIPS[name]
    with pytest.raises(SpecError) as err:
        resolve_text(_mutated(old, new), "specs/trip.yaml")
    messages = [str(d) for d in err.value.diagnostics]
    assert any(re.search(pattern, m) for m in messages), messages
    assert all(m.startswith("specs/trip.yaml:") for m in messages)


# Wrong at one budget only: (mutation, budget, what the problem says). 256 is
# on vLLM's default ladder (refused when the spec is read), 320 on no ladder
# (checked once plan is given it): never exit 0 with "host int32 = 1".
ONE_BUDGET = {
    "dummy short at 256": (
        ("[1, merge, k * merge]", '[1, merge, "k * merge - (token_budget == 256)"]'),
        256,
        r"capture\.dummy: the dummy batch cannot cover its budget.* budget 256",
    ),
    "max_seqlen_override short at 256": (
        (
            "max_seqlen_override: rows}",
            'max_seqlen_override: "1 if token_budget == 256 else rows"}',
        ),
        256,
        r"buffers\.max_seqlen\.set_by: max_seqlen is captured as 1 .* budget 256",
    ),
    "dummy short at 320": (
        ("[1, merge, k * merge]", '[1, merge, "k * merge - (token_budget == 320)"]'),
        320,
        r"capture\.dummy: the dummy batch cannot cover its budget.* budget 320",
    ),
    "max_seqlen_override short at 320": (
        (
            "max_seqlen_override: rows}",
            'max_seqlen_override: "1 if token_budget == 320 else rows"}',
        ),
        320,
        r"buffers\.max_seqlen\.set_by: max_seqlen is captured as 1 .* budget 320",
    ),
}


@pytest.mark.parametrize("name", list(ONE_BUDGET))
def test_plan_checks_every_budget_it_is_given(name, tmp_path):
    """``plan --budgets 64 128 <budget>`` exits 2 (the spec is refused) or 1
    (a problem at the budget it plans), never 0 with the wrong value."""
    (old, new), budget, pattern = ONE_BUDGET[name]
    spec = tmp_path / "one_budget.yaml"
    spec.write_text(_mutated(old, new))
    proc = subprocess.run(
        [sys.executable, "-m", "generator.cli", "plan", str(spec), "--budgets"]
        + ["64", "128", str(budget)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    on_ladder = budget in resolve_budgets((64, 8192))[0]
    assert proc.returncode == (2 if on_ladder else 1), proc.stderr
    assert re.search(pattern, proc.stderr if on_ladder else proc.stdout)


def test_max_batch_size_above_smallest_budget_is_refused_like_the_manager():
    ir = load_spec(ROOT / "specs" / "minimax_m3.yaml")
    with pytest.raises(PlanError, match=r"must be <= smallest token budget \(64\)"):
        make_plan(ir, budgets=[64, 128], max_items=65)


def test_plan_shares_the_managers_ladder_without_importing_torch():
    """gen-mixin plan resolves budgets with the manager's own function
    (encoder_cudagraph_runtime.budget_ladder), which must stay torch-free."""
    code = (
        "import sys, generator.cli, generator.plan\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
        "from encoder_cudagraph_runtime.budget_ladder import resolve_budget_ladder\n"
        "assert generator.plan.resolve_budget_ladder is resolve_budget_ladder\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_plan_sizes_a_flat_input_by_its_own_rows():
    """A flat input with its own rows is captured (and planned) at its own
    rows of the dummy batch, not at the items' input_size."""
    spec = load_spec(
        ROOT / "tests" / "codegen" / "data" / "valid" / "flat_own_rows.yaml"
    )
    plan = make_plan(spec, budgets=[64], max_items=2)
    (budget,) = plan.per_budget
    shapes = {b.key: b.shape for b in budget.buffers}
    tiles = budget.dummy["num_tiles"][0]
    assert shapes["tiles"] == [2 * tiles, 6]
    assert shapes["patches"] == [2 * tiles * 4, 6]


def test_plan_lists_the_budgets_a_capture_check_refuses():
    """capture.assert: a budget whose dummy exceeds the RoPE table is
    reported (the manager's capture would raise), the others are planned,
    complex64 buffers at 8 bytes an entry."""
    spec = load_spec(ROOT / "tests" / "codegen" / "data" / "valid" / "rope_grid.yaml")
    # One item per batch: k = budget; the dummy is ceil(k / 8) rows of 8
    # tokens, 2 patches a token a side, in a 24-patch-high table.
    plan = make_plan(spec, budgets=[64, 96, 97, 128], max_items=1)
    assert [p.budget for p in plan.per_budget] == [64, 96]
    assert [re.search(r"budget (\d+)", p).group(1) for p in plan.problems] == [
        "97",
        "128",
    ]
    assert all("ho * m <= rope_h does not hold" in p for p in plan.problems)
    rope = next(b for b in plan.per_budget[0].buffers if b.key == "rope_freqs_cis")
    assert rope.dtype == "complex64" and rope.nbytes == 8 * 4 * rope.shape[0]


@pytest.mark.parametrize(
    ("budget", "max_items", "units"), [(16, 1, 1), (1024, 1, 64), (1000, 8, 62)]
)
def test_plan_sizes_a_unit_capture_from_the_budget(budget, max_items, units):
    """A unit capture holds token_budget // tokens_per_tile tiles, whatever
    max_batch_size: plan shows the units and the shapes over them."""
    spec = load_spec(
        ROOT / "tests" / "codegen" / "data" / "valid" / "unit_capture.yaml"
    )
    plan = make_plan(spec, budgets=[budget], max_items=max_items)
    (planned,) = plan.per_budget
    assert (planned.units, planned.k, planned.rows) == (units, None, None)
    assert {b.key: b.shape for b in planned.buffers} == {
        "pixel_values": [units, 3, 4, 4]
    }
    assert f"budget {budget}: units={units}" in format_plan(plan)
    assert plan.to_json()["per_budget"][0]["units"] == units


def test_plan_checks_a_unit_capture_with_overridden_constants():
    """The coverage check runs again with --set values: a capture sized by a
    constant other than the items' tokens per tile fails when they differ."""
    text = (ROOT / "tests/codegen/data/valid/unit_capture.yaml").read_text()
    text = text.replace(
        "units: max(token_budget // tokens_per_tile, 1)",
        "units: max(token_budget // view_tokens, 1)",
    ).replace(
        "  side: {from: vision_model.tile_size, default: 4}\n",
        "  side: {from: vision_model.tile_size, default: 4}\n"
        "  view_tokens: {from: vision_model.view_tokens, default: 16}\n",
    )
    spec = resolve_text(text, "views.yaml")
    assert make_plan(spec, budgets=[64], max_items=1).problems == []
    plan = make_plan(spec, budgets=[64], max_items=1, overrides={"view_tokens": 32})
    assert any(p.startswith("capture.units: pixel_values holds") for p in plan.problems)
