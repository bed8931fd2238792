"""The parity machinery itself: code taken from the wheel, the generated
modules' loading, the manager's copy and the fake attention's contract."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from encoder_cudagraph_runtime.defs import BudgetGraphMetadata
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager

import beyond_hosts
import parity_hosts as hosts
from parity_hosts import CPU, CaptureCase
from parity_testlib import (
    GENERATED_VLLM,
    WheelCode,
    WheelCodeError,
    copy_replay_into_captured,
    differences,
    load_generated_vllm_module,
    protocol_stubs,
    vllm_wheel,
    with_protocol,
)

STEMS = sorted(p.stem for p in GENERATED_VLLM.glob("*.py"))
MANAGER = "vllm.v1.worker.encoder_cudagraph"


def _loading_code(stem: str) -> WheelCode:
    """The wheel with the protocol's stubs and, for a model beyond the
    catalog, its oracle's (a vLLM-only import's module may import what this
    environment lacks: LLaVA-NeXT's helpers sit beside Transformers code)."""
    stubs = protocol_stubs()
    if stem in beyond_hosts.ORACLES:
        stubs = {**stubs, **beyond_hosts.ORACLES[stem]().stubs}
    return with_protocol(WheelCode(vllm_wheel(), stubs))


def test_nothing_of_vllm_reaches_sys_modules() -> None:
    before = set(sys.modules)
    for stem in STEMS:
        load_generated_vllm_module(stem, _loading_code(stem))
    code = with_protocol(WheelCode(vllm_wheel(), protocol_stubs()))
    code.klass(
        hosts.QWEN2_VL,
        "Qwen2VLForConditionalGeneration",
        ["prepare_encoder_cudagraph_capture_inputs"],
    )
    added = set(sys.modules) - before
    assert not [m for m in added if m.split(".")[0] == "vllm" or "parity" in m]


def test_every_generated_vllm_module_loads_on_the_wheel() -> None:
    for stem in STEMS:
        module = load_generated_vllm_module(stem, _loading_code(stem))
        mixins = [v for k, v in vars(module).items() if k.endswith("Mixin")]
        assert len(mixins) == 1, stem


def test_every_generated_vllm_module_has_a_parity_row_or_an_oracle() -> None:
    assert not set(hosts.MODELS) & set(beyond_hosts.ORACLES)
    assert sorted([*hosts.MODELS, *beyond_hosts.ORACLES]) == STEMS
    for stem in hosts.MODELS:
        assert hosts.parity(stem).name == stem
    for stem, oracle in beyond_hosts.ORACLES.items():
        assert oracle().stem == stem


def test_bindings_come_from_stubs_then_the_wheel() -> None:
    code = WheelCode(vllm_wheel(), {"vllm.utils.torch_utils": {"PIN_MEMORY": False}})
    # A constant assigned by tuple unpacking, through a relative import.
    assert code.get("vllm.models.deepseek_v41.common.vl_cudagraph", "IMAGE_END") == 3
    # A function whose module-level global is stubbed.
    h2d = code.function("vllm.utils.torch_utils", "async_tensor_h2d")
    assert h2d([1, 2], CPU, torch.int32).tolist() == [1, 2]
    with pytest.raises(WheelCodeError, match="binds no 'no_such_name'"):
        code.get("vllm.utils.torch_utils", "no_such_name")
    with pytest.raises(WheelCodeError, match="is a class"):
        code.get(hosts.QWEN2_VL, "Qwen2VisionTransformer")
    with pytest.raises(WheelCodeError, match="has no module"):
        code.get("vllm.no_such_module", "x")


def test_klass_takes_the_helpers_the_methods_reach() -> None:
    code = with_protocol(WheelCode(vllm_wheel(), protocol_stubs()))
    made = code.klass(
        hosts.QWEN2_VL, "Qwen2VLForConditionalGeneration", ["encoder_eager_forward"]
    )
    assert {n for n in vars(made) if not n.startswith("__")} == {
        "encoder_eager_forward",
        "_get_pixel_values_by_modality",
        "_get_grid_thw_by_modality",
        "get_input_modality",
    }
    trimmed = code.klass(
        hosts.QWEN2_VL,
        "Qwen2VLForConditionalGeneration",
        ["encoder_eager_forward"],
        exclude=["get_input_modality"],
    )
    assert "get_input_modality" not in vars(trimmed)
    with pytest.raises(WheelCodeError, match="defines no"):
        code.klass(hosts.QWEN2_VL, "Qwen2VLForConditionalGeneration", ["nope"])


@pytest.mark.parametrize(
    ("offsets", "rows", "max_seqlen", "kinds", "unwritten"),
    [
        ([0, 4, 8], 8, None, set(), 0),
        ([0, 4, 8], 10, None, set(), 2),  # rows past the last offset
        ([0, 4, 8, 8], 8, 4, set(), 0),  # a zero-length sequence
        ([0, 6], 6, 4, {"max_seqlen-too-small"}, 2),
        ([0, 4, 2], 8, None, {"cu_seqlens-decreasing"}, 4),
        ([0, 9], 8, None, {"offsets-past-rows"}, 8),
        ([1, 4], 4, None, {"cu_seqlens-start"}, 1),
    ],
)
def test_fake_attention_keeps_the_varlen_contract(
    offsets, rows, max_seqlen, kinds, unwritten
) -> None:
    violations: dict[str, list[str]] = {}
    x = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)
    out = hosts.varlen_attention(
        x, torch.tensor(offsets, dtype=torch.int32), max_seqlen, violations
    )
    assert set(violations) == kinds
    assert int(out.isnan().any(dim=1).sum()) == unwritten
    # A computed row is itself plus its own sequence's mean.
    if not kinds and offsets[1] > 0:
        end = offsets[1]
        assert torch.equal(out[0], x[0] + x[:end].mean(dim=0))


def test_runtime_default_copy_is_vllms() -> None:
    code = WheelCode(vllm_wheel(), {})
    vllm_copy = code.klass(
        MANAGER, "EncoderCudaGraphManager", ["_copy_padded_buffer"]
    )._copy_padded_buffer
    gen = torch.Generator().manual_seed(0)
    for rows, n in ((6, 6), (6, 2), (6, 0), (6, 1), (6, 8)):
        src = torch.randn(n, 3, generator=gen)
        outcomes = []
        for copy in (vllm_copy, EncoderCudaGraphManager._copy_padded_buffer):
            dst = torch.randn(rows, 3, generator=torch.Generator().manual_seed(1))
            try:
                copy(dst, src)
                outcomes.append(dst)
            except RuntimeError as exc:
                outcomes.append(type(exc))
        assert differences(outcomes[0], outcomes[1], "copy") == [], (rows, n)


class _ManagerState:
    """What vLLM's ``_run_budget_graph`` reads of its manager."""

    def __init__(self, model, case: CaptureCase, captured) -> None:
        self.model = model
        self.config = model.get_encoder_cudagraph_config()
        self.max_batch_size = case.max_batch_size
        self.max_frames_per_batch = case.max_frames_per_batch
        self.graph_hits = self.graph_misses = 0
        graph = type("_Graph", (), {"replay": lambda self: None})()
        self.budget_graphs = {
            "default": {
                case.budget: BudgetGraphMetadata(
                    case.budget,
                    case.max_batch_size,
                    case.max_frames_per_batch,
                    graph,
                    captured,
                    torch.zeros(0),
                )
            }
        }


@pytest.mark.parametrize("name", ["qwen2_vl", "minimax_m3", "deepseek_v41"])
def test_copy_into_captured_is_vllms_replay_copy(name: str) -> None:
    """The battery's copy gives the buffers vLLM's own ``_run_budget_graph``
    leaves, for both mixins of every model."""
    code = WheelCode(
        vllm_wheel(), {MANAGER: {"gpu_sync_allowed": contextlib.nullcontext}}
    )
    manager_class = code.klass(
        MANAGER,
        "EncoderCudaGraphManager",
        ["_run_budget_graph"],
        bases=(_ManagerState,),
    )
    model = hosts.parity(name)
    case = CaptureCase(32, 4, 8 if "video" in model.modalities else 0)
    gen = torch.Generator().manual_seed(7)
    for modality in model.modalities:
        batch = hosts.fitting_batch(
            model, gen, modality, case, 3, hosts.HostSettings(), {}
        )
        for host in model.hosts():
            # Two captures: padding logics know their buffers by address.
            ours, theirs = (
                host.prepare_encoder_cudagraph_capture_inputs(
                    case.budget, 4, case.max_frames_per_batch, CPU, torch.float32
                ).values
                for _ in range(2)
            )
            replay = host.prepare_encoder_cudagraph_replay_buffers(
                batch, 4, case.max_frames_per_batch
            ).values
            copy_replay_into_captured(host.get_encoder_cudagraph_config(), ours, replay)
            manager = manager_class(host, case, theirs)
            manager._run_budget_graph(batch, case.budget)
            assert manager.graph_hits == len(
                host.get_encoder_cudagraph_item_specs(batch)
            )
            assert differences(theirs, ours, name) == []
