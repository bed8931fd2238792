"""Capture, replay, fallback and statistics of the manager on the CPU, with
the eager-replay graph backend and the fake encoder of ``runtime_fakes``."""

from __future__ import annotations

import io

import pytest
import torch
from runtime_fakes import (
    HIDDEN,
    FakeEncoder,
    expected_item_output,
    make_items,
    make_kwargs,
    make_manager,
    make_vllm_config,
)

from encoder_cudagraph_runtime.defs import (
    BudgetGraphMetadata,
    EncoderCudaGraphPathConfig,
)
from encoder_cudagraph_runtime.graph_backends import (
    EagerReplayGraph,
    EagerReplayGraphBackend,
    EagerReplayPool,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager


def assert_outputs(
    outputs: list[torch.Tensor],
    items,  # type: ignore[no-untyped-def]
    paths: list[str],
    scale: float,
    axis_value: float = 0.0,
) -> None:
    assert len(outputs) == len(items)
    for out, item in zip(outputs, items):
        torch.testing.assert_close(
            out, expected_item_output(item, paths, scale, axis_value)
        )


def captured(manager: EncoderCudaGraphManager, path: str = "default"):  # type: ignore[no-untyped-def]
    return manager.budget_graphs[path]


class TestCapture:
    def test_order_descending_budgets(self) -> None:
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model)
        manager.capture()
        budgets = [c[0] for c in model.calls_named("capture_inputs")]
        assert budgets == [64, 32, 16, 8]
        # Positional contract: budget, max items, max frames, path, axis keys.
        assert model.calls_named("capture_inputs")[0] == (64, 8, 8, "default", ())

    def test_paths_in_config_order_and_zero_skipped(self) -> None:
        paths = {
            "thumb": EncoderCudaGraphPathConfig(
                min_token_budget=32, allow_zero_tokens=True
            ),
            "default": EncoderCudaGraphPathConfig(),
        }
        model = FakeEncoder(budget_range=(8, 64), paths=paths)
        manager = make_manager(model)
        manager.capture()
        seen = [(c[3], c[0]) for c in model.calls_named("capture_inputs")]
        assert seen == [
            ("thumb", 64),
            ("thumb", 32),
            ("default", 64),
            ("default", 32),
            ("default", 16),
            ("default", 8),
        ]
        assert set(captured(manager, "thumb")) == {32, 64}

    def test_axes_product_per_budget(self) -> None:
        model = FakeEncoder(budget_range=(8, 16), capture_axes=((1, 2), ("x", "y")))
        manager = make_manager(model)
        manager.capture()
        seen = [(c[0], c[4]) for c in model.calls_named("capture_inputs")]
        assert seen == [
            (16, (1, "x")),
            (16, (1, "y")),
            (16, (2, "x")),
            (16, (2, "y")),
            (8, (1, "x")),
            (8, (1, "y")),
            (8, (2, "x")),
            (8, (2, "y")),
        ]
        keys = set(captured(manager))
        assert keys == {(b, k) for b, k in seen}
        meta = captured(manager)[(8, (2, "y"))]
        assert meta.axis_keys == (2, "y")

    def test_warmup_then_capture_forward(self) -> None:
        model = FakeEncoder(budget_range=(8, 16))
        manager = make_manager(model)
        manager.capture()
        sequence = [
            (name, details)
            for name, details in model.calls
            if name in ("capture_inputs", "graph_forward")
        ]
        assert sequence == [
            ("capture_inputs", (16, 2, 2, "default", ())),
            ("graph_forward", (16, "default")),
            ("graph_forward", (16, "default")),
            ("capture_inputs", (8, 2, 2, "default", ())),
            ("graph_forward", (8, "default")),
            ("graph_forward", (8, "default")),
        ]

    def test_metadata_buffers_and_shared_pool(self) -> None:
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model)
        manager.capture()
        pool = manager.graph_pool
        assert isinstance(pool, EagerReplayPool)
        assert pool.num_graphs == 4
        assert manager.is_captured()
        for budget, meta in captured(manager).items():
            assert isinstance(meta, BudgetGraphMetadata)
            assert meta.token_budget == budget
            assert meta.max_batch_size == 8
            assert meta.max_frames_per_batch == 8
            assert meta.axis_keys == ()
            assert isinstance(meta.graph, EagerReplayGraph)
            assert meta.graph.pool is pool
            # The captured dict is kept whole (the forward's pop of "x"
            # acted on a copy) and the output buffer is an own allocation.
            assert set(meta.input_buffers) == {"x", "cu_seqlens", "scale", "axis_value"}
            assert meta.output_buffer.shape == (budget, HIDDEN)
            assert meta.output_buffer.dtype == torch.float32
            assert meta.output_buffer.data_ptr() != meta.input_buffers["x"].data_ptr()

    def test_explicit_pool_is_used(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 16)))
        pool = EagerReplayPool()
        manager.capture(pool)
        assert manager.graph_pool is pool
        assert pool.num_graphs == 2

    def test_progress_and_report(self) -> None:
        stream = io.StringIO()
        manager = EncoderCudaGraphManager(
            make_vllm_config(),
            torch.device("cpu"),
            torch.float32,
            FakeEncoder(budget_range=(8, 64)),
            graph_backend=EagerReplayGraphBackend(),
            progress=True,
            progress_stream=stream,
        )
        assert manager.get_capture_report() is None
        manager.capture()
        lines = stream.getvalue().splitlines()
        assert len(lines) == 4
        assert lines[0].startswith("encoder CUDA graphs [1/4] path=default budget=64")
        assert lines[-1].startswith("encoder CUDA graphs [4/4] path=default budget=8")
        report = manager.get_capture_report()
        assert report is not None
        assert report.num_graphs == 4
        assert report.seconds >= 0
        assert report.backend == "eager-replay"
        assert report.pool_bytes is None

    def test_clear_and_recapture(self) -> None:
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model)
        manager.capture()
        first_pool = manager.graph_pool
        old_meta = captured(manager)[8]
        manager.clear()
        assert not manager.is_captured()
        assert manager.get_cumulative_stats()["num_budgets"] == 0
        assert all(len(g) == 0 for g in manager.budget_graphs.values())
        manager.capture()
        assert manager.graph_pool is not first_pool
        assert captured(manager)[8] is not old_meta
        items = make_items([5, 7])
        assert_outputs(manager.execute(make_kwargs(items)), items, ["default"], 0.5)


class TestExecute:
    @pytest.mark.parametrize("seed", range(5))
    def test_random_batches_match_reference(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model)
        manager.capture()
        n = int(torch.randint(1, 20, (1,), generator=gen))
        rows = torch.randint(1, 90, (n,), generator=gen).tolist()
        items = make_items(rows, seed=seed)
        outputs = manager.execute(make_kwargs(items, scale=0.25 * seed))
        assert_outputs(outputs, items, ["default"], 0.25 * seed)

    def test_batches_budgets_and_hits(self) -> None:
        # budgets 8..64, max 8 items. rows 3, 40, 100:
        # sorted 3, 40, 100; cur 3 (b 8) + 40 (b 64) -> merged 43 (b 64):
        # 8 + 64 < 64 false -> merge; 100 does not fit -> eager singleton.
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model)
        manager.capture()
        items = make_items([40, 100, 3])
        outputs = manager.execute(make_kwargs(items))
        assert_outputs(outputs, items, ["default"], 0.5)
        assert model.calls_named("select") == [[2, 0], [1]]
        assert model.calls_named("eager_forward") == [(1, "default")]
        assert model.calls_named("replay_buffers") == [(2, "default")]
        assert captured(manager)[64].graph.num_replays == 1
        stats = manager.get_cumulative_stats()
        assert stats == {
            "graph_hits": 2,
            "graph_misses": 1,
            "hit_rate": 2 / 3,
            "num_budgets": 4,
            "token_budgets": [8, 16, 32, 64],
        }

    def test_postprocess_arguments(self) -> None:
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model)
        manager.capture()
        items = make_items([4, 2])
        manager.execute(make_kwargs(items))
        (indices, paths, clone, batch_kwargs) = model.calls_named("postprocess")[0]
        assert indices == [1, 0]
        assert paths == ["default"]
        assert clone is True
        assert [it.path_rows for it in batch_kwargs["items"]] == [
            {"default": 2},
            {"default": 4},
        ]

    def test_results_are_copies(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 64)))
        manager.capture()
        items = make_items([5])
        first = manager.execute(make_kwargs(items))[0]
        buffer = captured(manager)[8].output_buffer
        assert first.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
        snapshot = first.clone()
        manager.execute(make_kwargs(make_items([6], seed=3)))
        torch.testing.assert_close(first, snapshot)

    def test_empty_batch(self) -> None:
        model = FakeEncoder()
        manager = make_manager(model)
        manager.capture()
        assert manager.execute(make_kwargs([])) == []
        assert model.calls_named("select") == []

    def test_execute_without_capture_asserts(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 64)))
        with pytest.raises(AssertionError, match="no encoder CUDA graph"):
            manager.execute(make_kwargs(make_items([3, 4])))
        assert manager.graph_misses == 2

    def test_capture_in_inference_mode_execute_outside(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 64)))
        with torch.inference_mode():
            manager.capture()
        items = make_items([5, 9])
        assert_outputs(manager.execute(make_kwargs(items)), items, ["default"], 0.5)


class TestReplayCopy:
    def test_default_copy_zeroes_then_slices(self) -> None:
        manager = make_manager(FakeEncoder(), budgets=[32], max_items=4)
        manager.capture()
        big = make_items([20], seed=1)
        manager.execute(make_kwargs(big))
        small = make_items([6], seed=2)
        manager.execute(make_kwargs(small, scale=3.0))
        buffers = captured(manager)[32].input_buffers
        torch.testing.assert_close(buffers["x"][:6], small[0].features["default"])
        # Rows 6..19 held the previous batch; the default copy cleared them.
        assert torch.count_nonzero(buffers["x"][6:]) == 0

    @pytest.mark.parametrize(
        "sizes", [[20, 6, 6, 3, 12, 12, 32, 1], [32, 32, 5, 9, 2], [1, 2, 3, 31, 30]]
    )
    def test_default_copy_leaves_zero_padded_rows_after_any_sequence(
        self, sizes: list[int]
    ) -> None:
        """The tail is zeroed only where an earlier write left rows (not
        again on same-size batches), but every replay sees exactly the batch
        followed by zeros."""
        manager = make_manager(FakeEncoder(), budgets=[32], max_items=4)
        manager.capture()
        buf = captured(manager)[32].input_buffers["x"]
        zero_calls: list[int] = []
        real_zero = torch._foreach_zero_

        def counting_zero(tensors):
            zero_calls.append(sum(t.shape[0] for t in tensors))
            return real_zero(tensors)

        for i, n in enumerate(sizes):
            items = make_items([n], seed=i)
            torch._foreach_zero_ = counting_zero
            try:
                manager.execute(make_kwargs(items))
            finally:
                torch._foreach_zero_ = real_zero
            torch.testing.assert_close(buf[:n], items[0].features["default"])
            assert torch.count_nonzero(buf[n:]) == 0, (sizes, i)
        # Only the rows above the next batch that the last one wrote.
        stale = [32] + sizes[:-1]
        assert zero_calls == [p - n for p, n in zip(stale, sizes) if p > n]

    def test_zero_dim_copy_ignores_padding_logic(self) -> None:
        calls: list[str] = []

        def never(dst: torch.Tensor, src: torch.Tensor) -> None:
            calls.append("scale")

        manager = make_manager(
            FakeEncoder(padding_logics={"scale": never}), budgets=[32], max_items=4
        )
        manager.capture()
        items = make_items([6])
        outputs = manager.execute(make_kwargs(items, scale=1.75))
        assert calls == []
        assert float(captured(manager)[32].input_buffers["scale"]) == 1.75
        assert_outputs(outputs, items, ["default"], 1.75)

    def test_none_leaves_buffer_unchanged(self) -> None:
        model = FakeEncoder(budget_range=(8, 16), capture_axes=((3,),))
        manager = make_manager(model)
        manager.capture()
        items = make_items([4], axes=[3])
        outputs = manager.execute(make_kwargs(items))
        # axis_value was captured as 3.0 and the replay value is None.
        assert float(captured(manager)[(8, (3,))].input_buffers["axis_value"]) == 3.0
        assert_outputs(outputs, items, ["default"], 0.5, axis_value=3.0)

    def test_custom_padding_logic_gets_captured_buffer(self) -> None:
        seen: list[tuple[int, tuple[int, ...]]] = []

        def fill_minus_one(dst: torch.Tensor, src: torch.Tensor) -> None:
            seen.append((dst.data_ptr(), tuple(src.shape)))
            dst.fill_(-1.0)
            dst[: src.shape[0]].copy_(src)

        model = FakeEncoder(padding_logics={"x": fill_minus_one})
        manager = make_manager(model, budgets=[16], max_items=2)
        manager.capture()
        items = make_items([5])
        outputs = manager.execute(make_kwargs(items))
        buf = captured(manager)[16].input_buffers["x"]
        assert seen == [(buf.data_ptr(), (5, HIDDEN))]
        assert torch.all(buf[5:] == -1.0)
        # Padding rows form their own (trailing) sequence: real rows are exact.
        assert_outputs(outputs, items, ["default"], 0.5)

    def test_cu_seqlens_trailing_padding_sequence(self) -> None:
        model = FakeEncoder()
        manager = make_manager(model, budgets=[16], max_items=4)
        manager.capture()
        manager.execute(make_kwargs(make_items([3, 5])))
        cu = captured(manager)[16].input_buffers["cu_seqlens"]
        assert cu.tolist() == [0, 3, 8, 16, 16, 16]


class TestPaths:
    PATHS = {
        "default": EncoderCudaGraphPathConfig(),
        "thumb": EncoderCudaGraphPathConfig(
            min_token_budget=16, allow_zero_tokens=True
        ),
    }

    def test_per_path_eager_fallback(self) -> None:
        model = FakeEncoder(budget_range=(8, 64), paths=self.PATHS)
        manager = make_manager(model)
        manager.capture()
        # One batch (max 64 on thumb, default oversize is allowed alone):
        # default 70 rows > 64 -> eager on default only; thumb 10 -> 16.
        items = make_items([{"default": 70, "thumb": 10}])
        outputs = manager.execute(make_kwargs(items))
        assert_outputs(outputs, items, ["default", "thumb"], 0.5)
        assert model.calls_named("eager_forward") == [(1, "default")]
        assert model.calls_named("replay_buffers") == [(1, "thumb")]
        assert captured(manager, "thumb")[16].graph.num_replays == 1
        # A graph ran for the batch: its item is a hit.
        assert (manager.graph_hits, manager.graph_misses) == (1, 0)

    def test_zero_token_path_is_skipped(self) -> None:
        model = FakeEncoder(budget_range=(8, 64), paths=self.PATHS)
        manager = make_manager(model)
        manager.capture()
        items = make_items([{"default": 5, "thumb": 0}, {"default": 9, "thumb": 0}])
        outputs = manager.execute(make_kwargs(items))
        assert_outputs(outputs, items, ["default", "thumb"], 0.5)
        assert model.calls_named("replay_buffers") == [(2, "default")]
        assert model.calls_named("postprocess")[0][1] == ["default"]
        # Two items on one replay: two hits (counted once per path replay).
        assert manager.graph_hits == 2

    def test_hits_counted_per_replayed_path(self) -> None:
        model = FakeEncoder(budget_range=(8, 64), paths=self.PATHS)
        manager = make_manager(model)
        manager.capture()
        items = make_items([{"default": 5, "thumb": 3}, {"default": 9, "thumb": 2}])
        outputs = manager.execute(make_kwargs(items))
        assert_outputs(outputs, items, ["default", "thumb"], 0.5)
        # vLLM adds the batch's item count once per replayed path.
        assert manager.graph_hits == 4

    def test_all_eager_counts_misses(self) -> None:
        model = FakeEncoder(budget_range=(8, 64), paths=self.PATHS)
        manager = make_manager(model)
        manager.capture()
        items = make_items([{"default": 80, "thumb": 70}])
        outputs = manager.execute(make_kwargs(items))
        assert_outputs(outputs, items, ["default", "thumb"], 0.5)
        assert model.calls_named("eager_forward") == [(1, "default"), (1, "thumb")]
        assert (manager.graph_hits, manager.graph_misses) == (0, 1)


class TestAxes:
    def test_axis_keys_select_graph(self) -> None:
        model = FakeEncoder(budget_range=(8, 32), capture_axes=((1, 2),))
        manager = make_manager(model)
        manager.capture()
        items = make_items([4, 6], axes=[2, 1])
        outputs = manager.execute(make_kwargs(items))
        # The fake's batch key is the largest item axis: 2.
        assert_outputs(outputs, items, ["default"], 0.5, axis_value=2.0)
        assert captured(manager)[(16, (2,))].graph.num_replays == 1
        assert captured(manager)[(16, (1,))].graph.num_replays == 0
        # The reserved key never reaches the model's other methods.
        batch_kwargs = model.calls_named("postprocess")[0][3]
        assert "encoder_cudagraph_axis_keys" not in batch_kwargs

    def test_uncaptured_axis_key(self) -> None:
        model = FakeEncoder(budget_range=(8, 32), capture_axes=((1, 2),))
        manager = make_manager(model)
        manager.capture()
        with pytest.raises(AssertionError):
            manager.execute(make_kwargs(make_items([4], axes=[7])))
        assert manager.graph_misses == 1

    def test_wrong_number_of_axis_keys(self) -> None:
        class NoKeys(FakeEncoder):
            def select_encoder_cudagraph_items(self, mm_kwargs, indices):  # type: ignore[no-untyped-def]
                selected = super().select_encoder_cudagraph_items(mm_kwargs, indices)
                selected.pop("encoder_cudagraph_axis_keys")
                return selected

        manager = make_manager(NoKeys(budget_range=(8, 32), capture_axes=((1, 2),)))
        manager.capture()
        with pytest.raises(ValueError, match="one key per axis"):
            manager.execute(make_kwargs(make_items([4], axes=[1])))


class TestStatistics:
    def test_padding_waste(self) -> None:
        manager = make_manager(FakeEncoder(), budgets=[16, 64], max_items=4)
        manager.capture()
        manager.execute(make_kwargs(make_items([10])))  # 10 rows on 16
        # 20 and 30: b(20)=64, b(30)=64, b(50)=64: merged onto 64.
        manager.execute(make_kwargs(make_items([20, 30])))
        manager.execute(make_kwargs(make_items([70])))  # eager
        stats = manager.get_padding_stats()
        default = stats["paths"]["default"]
        assert default["budgets"] == {
            16: {
                "replays": 1,
                "rows_replayed": 16,
                "rows_used": 10,
                "rows_wasted": 6,
                "waste_fraction": 6 / 16,
            },
            64: {
                "replays": 1,
                "rows_replayed": 64,
                "rows_used": 50,
                "rows_wasted": 14,
                "waste_fraction": 14 / 64,
            },
        }
        assert (default["eager_batches"], default["eager_rows"]) == (1, 70)
        assert (stats["rows_replayed"], stats["rows_used"]) == (80, 60)
        assert stats["waste_fraction"] == 20 / 80
        manager.reset_padding_stats()
        assert manager.get_padding_stats()["rows_replayed"] == 0

    def test_hit_rate_without_requests(self) -> None:
        manager = make_manager()
        assert manager.get_cumulative_stats()["hit_rate"] == 0.0

    def test_timing(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 64)))
        assert manager.get_timing_stats() is None
        manager.capture()
        manager.enable_timing()
        manager.execute(make_kwargs(make_items([3, 9, 70])))
        timing = manager.timing
        assert timing is not None
        assert timing.executes == 1
        assert timing.items == 3 and timing.last_items == 3
        assert timing.model_ns > 0 and timing.replay_ns > 0
        assert timing.total_ns >= timing.model_ns + timing.replay_ns
        stats = manager.get_timing_stats()
        assert stats is not None
        assert (
            stats["overhead_ns"] == timing.total_ns - timing.model_ns - timing.replay_ns
        )
        manager.reset_timing()
        assert manager.timing is not None and manager.timing.executes == 0
        manager.enable_timing(False)
        manager.execute(make_kwargs(make_items([3])))
        assert manager.timing is None

    def test_timing_charges_padding_logics_to_the_model(self) -> None:
        import time

        def slow_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
            time.sleep(0.02)
            dst.zero_()
            dst[: src.shape[0]].copy_(src)

        manager = make_manager(
            FakeEncoder(budget_range=(8, 64), padding_logics={"x": slow_copy})
        )
        manager.capture()
        manager.enable_timing()
        manager.execute(make_kwargs(make_items([3, 9])))
        timing = manager.timing
        assert timing is not None
        assert timing.last_model_ns >= 20_000_000
        # The sleep is the model's, not the manager's.
        assert timing.last_overhead_ns < 20_000_000
