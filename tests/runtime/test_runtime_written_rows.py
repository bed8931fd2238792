"""The written-rows shortcut of the replay copy and the capture-time checks
that turn it off: shared buffer memory and forwards that write their inputs
must replay exactly as vLLM's plain copy (whole buffer zeroed) does."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_fakes import (
    FakeEncoder,
    InputWritingEncoder,
    SharedStorageEncoder,
    expected_item_output,
    make_items,
    make_kwargs,
    make_manager,
    make_vllm_config,
)

from encoder_cudagraph_runtime.buffer_aliasing import byte_span, overlapping_owners
from encoder_cudagraph_runtime.config import MultiModalConfig
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from reference_towers.registry import (
    REFERENCE_TOWERS,
    generated_mixin,
    stems_with_generated_mixin,
)


def vllm_buffer(src: torch.Tensor, rows: int) -> torch.Tensor:
    """What vLLM's ``dst.zero_(); dst[:n].copy_(src)`` leaves in a buffer."""
    out = torch.zeros((rows, *src.shape[1:]), dtype=src.dtype)
    out[: src.shape[0]] = src
    return out


class TestSharedStorage:
    # Each case: the rows of one single-item execute after another; budgets
    # 8 and 32 share the first 8 rows of one tensor.
    @pytest.mark.parametrize(
        "sizes", [[3, 20, 2], [5, 30, 1, 25, 4], [8, 32, 7, 6, 31, 3]]
    )
    def test_every_replay_sees_the_plain_copy(self, sizes: list[int]) -> None:
        model = SharedStorageEncoder(budget_range=(8, 32))
        manager = make_manager(model, budgets=[8, 32], max_items=2)
        manager.capture()
        report = manager.get_capture_report()
        assert report is not None and report.plain_copy_graphs == 2
        for i, n in enumerate(sizes):
            items = make_items([n], seed=i)
            outputs = manager.execute(make_kwargs(items))
            budget = 8 if n <= 8 else 32
            buf = manager.budget_graphs["default"][budget].input_buffers["x"]
            torch.testing.assert_close(
                buf, vllm_buffer(items[0].features["default"], budget)
            )
            torch.testing.assert_close(
                outputs[0], expected_item_output(items[0], ["default"], 0.5)
            )

    def test_separate_buffers_keep_the_shortcut(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 32)), budgets=[8, 32])
        manager.capture()
        report = manager.get_capture_report()
        assert report is not None and report.plain_copy_graphs == 0

    def test_aliases_inside_one_graph(self) -> None:
        class Aliasing(FakeEncoder):
            def prepare_encoder_cudagraph_capture_inputs(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                inputs = super().prepare_encoder_cudagraph_capture_inputs(
                    *args, **kwargs
                )
                # axis_value is a view into scale's storage.
                inputs.values["axis_value"] = inputs.values["scale"].view(())
                return inputs

        manager = make_manager(Aliasing(budget_range=(8, 16)), budgets=[8, 16])
        manager.capture()
        report = manager.get_capture_report()
        assert report is not None and report.plain_copy_graphs == 2


class TestForwardWritesInputs:
    @pytest.mark.parametrize("sizes", [[20, 6], [32, 1, 12, 12, 3], [5, 16, 2]])
    def test_every_replay_sees_the_plain_copy(self, sizes: list[int]) -> None:
        model = InputWritingEncoder(budget_range=(8, 32))
        manager = make_manager(model, budgets=[32], max_items=2)
        manager.capture()
        report = manager.get_capture_report()
        assert report is not None and report.plain_copy_graphs == 1
        for i, n in enumerate(sizes):
            items = make_items([n], seed=i)
            outputs = manager.execute(make_kwargs(items))
            # The x this replay read (recorded before the forward wrote it).
            torch.testing.assert_close(
                model.seen_x[-1], vllm_buffer(items[0].features["default"], 32)
            )
            torch.testing.assert_close(
                outputs[0], expected_item_output(items[0], ["default"], 0.5)
            )


class TestOverlappingOwners:
    def test_views_of_one_tensor(self) -> None:
        base = torch.zeros(10, 4)
        owners = overlapping_owners(
            {
                "a": {"x": base[:5], "s": 3},
                "b": {"x": base[5:]},  # adjacent, not overlapping
                "c": {"x": base[4:6]},
                "d": {"x": torch.zeros(3)},
                "e": {"x": base[:0]},  # empty: touches nothing
            }
        )
        assert owners == {"a", "b", "c"}

    def test_strided_view_spans_its_extent(self) -> None:
        base = torch.zeros(6, 4)
        column = base[:, 1]
        assert byte_span(column)[1:] == (
            base.data_ptr() + 4,
            base.data_ptr() + (5 * 4 + 1 + 1) * 4,
        )

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(st.integers(0, 40), st.integers(0, 12), st.integers(0, 3)),
            min_size=1,
            max_size=8,
        )
    )
    def test_matches_pairwise_check(self, spans: list[tuple[int, int, int]]) -> None:
        base = torch.zeros(64)
        buffers = {
            i: (
                {"x": base[start : start + length]}
                if dev == 0
                else {"x": torch.zeros(length)}
            )
            for i, (start, length, dev) in enumerate(spans)
        }

        def touches(a: int, b: int) -> bool:
            (sa, la, da), (sb, lb, db) = spans[a], spans[b]
            if da or db or not la or not lb:
                return False
            return sa < sb + lb and sb < sa + la

        expected = {a for a in buffers for b in buffers if a != b and touches(a, b)}
        assert overlapping_owners(buffers) == expected


@pytest.mark.parametrize("stem", stems_with_generated_mixin())
def test_generated_mixins_keep_the_shortcut(stem: str) -> None:
    """The project's own mixins own their buffers and never write them."""
    tower = REFERENCE_TOWERS[stem]
    mm_config = MultiModalConfig(limit_per_prompt={"video": 0})
    host = tower.build_host(
        generated_mixin(stem),
        "tiny",
        device="cpu",
        dtype=torch.float32,
        multimodal_config=mm_config,
    )
    # Two budgets every path accepts (Step3-VL's global view needs 169).
    low = max(64, host.get_encoder_cudagraph_budget_range(make_vllm_config())[0])
    config = make_vllm_config(budgets=[low, 2 * low], max_items=4, video_limit=0)
    manager = EncoderCudaGraphManager(
        config,
        torch.device("cpu"),
        torch.float32,
        host,
        graph_backend=EagerReplayGraphBackend(),
    )
    manager.capture()
    report = manager.get_capture_report()
    assert report is not None
    # Every graph captured (per path: its own ladder), none on plain copies.
    assert report.num_graphs >= 2 * len(tower.paths)
    assert report.plain_copy_graphs == 0


def test_capture_twice_checks_the_new_graphs() -> None:
    model = InputWritingEncoder(budget_range=(8, 32))
    manager = make_manager(model, budgets=[16, 32], max_items=2)
    manager.capture()
    manager.capture()  # replaces every graph without clear()
    report = manager.get_capture_report()
    assert report is not None and report.plain_copy_graphs == 2
