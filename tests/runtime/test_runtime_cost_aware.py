"""Cost-aware execution in the manager: off by default, calibrated from
timed runs (a virtual clock makes them exact), plans run with the right
outputs in the right layout, also in data-parallel mode."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from runtime_fakes import (
    FakeEncoder,
    TimedFakeEncoder,
    VirtualClock,
    expected_item_output,
    make_items,
    make_kwargs,
    make_manager,
)

from encoder_cudagraph_runtime import distributed
from encoder_cudagraph_runtime.cost_aware import CostModel, EagerCost, GraphCost
from encoder_cudagraph_runtime.defs import EncoderCudaGraphPathConfig

BUDGETS = [8, 16, 32, 64]


def graph_ms(rows: int) -> float:
    """A replay: 0.5 ms of launches plus 0.1 ms per captured row."""
    return 0.5 + 0.1 * rows


def eager_ms(rows: list[int]) -> float:
    """An eager call: 2 ms of launches, 1 ms per item, 0.1 ms per row."""
    return 2.0 + 1.0 * len(rows) + 0.1 * sum(rows)


def timed_manager(attention_ms_per_sq=0.0, **kwargs):  # type: ignore[no-untyped-def]
    clock = VirtualClock()
    model = TimedFakeEncoder(
        clock,
        graph_ms,
        eager_ms,
        attention_ms_per_sq=attention_ms_per_sq,
        budget_range=(8, 64),
    )
    manager = make_manager(
        model, budgets=BUDGETS, max_items=8, cost_aware=True, clock=clock, **kwargs
    )
    manager.capture()
    return manager, model


def serial(manager: Any, form: bool) -> None:
    """The manager's cost model with its eager form set to ``form``."""
    cost = manager.cost_model
    assert cost is not None
    manager.set_cost_model(
        dataclasses.replace(cost, eager=dataclasses.replace(cost.eager, serial=form))
    )


def calibrated_manager(**kwargs):  # type: ignore[no-untyped-def]
    manager, model = timed_manager(**kwargs)
    warmup = [make_kwargs(make_items(rows, seed=9)) for rows in ([8, 20, 30], [5, 60])]
    # No error floor: exact virtual timings, the cheapest plan wins.
    manager.calibrate_cost_model(warmup, error_floor=0.0)
    return manager, model


def assert_outputs(outputs, items, scale=0.5):  # type: ignore[no-untyped-def]
    assert len(outputs) == len(items)
    for out, item in zip(outputs, items):
        torch.testing.assert_close(out, expected_item_output(item, ["default"], scale))


class TestDefaultOff:
    def test_capture_and_packing_are_vllms(self) -> None:
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model, budgets=BUDGETS, max_items=8)
        manager.capture()
        # Warm-up and capture only: no timed replays.
        assert len(model.calls_named("graph_forward")) == 2 * len(BUDGETS)
        items = make_items([30, 60])
        manager.execute(make_kwargs(items))
        assert model.calls_named("eager_forward") == []
        assert manager.get_execution_stats()["executes"] == 0

    def test_uncalibrated_cost_aware_packs_like_vllm(self) -> None:
        manager, model = timed_manager()
        assert manager.cost_aware and manager.cost_model is None
        # Capture: warm-up, capture, one untimed and one timed replay each.
        assert len(model.calls_named("graph_forward")) == 4 * len(BUDGETS)
        manager.execute(make_kwargs(make_items([30])))
        assert model.calls_named("eager_forward") == []
        assert manager.get_execution_stats()["calibrated"] is False


class TestCalibration:
    def test_replays_are_timed_at_capture(self) -> None:
        manager, _ = timed_manager()
        # Every captured budget, at its captured rows (the fake's x rows).
        assert manager._replay_ms == {b: pytest.approx(graph_ms(b)) for b in BUDGETS}

    def test_fits_the_synthetic_costs(self) -> None:
        manager, _ = calibrated_manager()
        cost = manager.cost_model
        assert cost is not None
        assert cost.eager.fixed_ms == pytest.approx(2.0, abs=1e-6)
        assert cost.eager.per_item_ms == pytest.approx(1.0, abs=1e-6)
        assert cost.eager.per_row_ms == pytest.approx(0.1, abs=1e-6)
        assert cost.eager.per_row_sq_ms == pytest.approx(0.0, abs=1e-9)
        # Replays cost their budget, whatever the batch: nothing to add.
        assert cost.graph.per_replay_ms == pytest.approx(0.0, abs=1e-6)

    def test_attention_fitted_from_replays_alone(self) -> None:
        """Units and replays alone with a per-sequence cost: the squared
        terms of the real and padding sequences are recovered exactly, and
        no host work is left over."""
        manager, _ = timed_manager(attention_ms_per_sq=1e-3)
        warmup = [
            make_kwargs(make_items(rows, seed=9)) for rows in ([8, 20, 30], [5, 60])
        ]
        cost = manager.calibrate_cost_model(warmup, error_floor=0.0)
        assert cost.graph.per_row_sq_ms == pytest.approx(1e-3, rel=1e-6)
        assert cost.graph.per_pad_sq_ms == pytest.approx(1e-3, rel=1e-6)
        assert cost.graph.per_replay_ms == pytest.approx(0.0, abs=1e-9)
        assert cost.graph_error == pytest.approx(0.0, abs=1e-9)

    def test_samples_are_recorded(self) -> None:
        manager, _ = calibrated_manager()
        samples = manager.calibration_samples
        # [8, 20, 30] whole and alone, [5, 60] whole and alone.
        assert sorted(tuple(s["rows"]) for s in samples["eager"]) == sorted(
            [(8, 20, 30), (8,), (20,), (30,), (5, 60), (5,), (60,)]
        )
        # Single items at two budgets (60 only fits 64), batches at one;
        # each unit also replayed alone.
        graph = {(tuple(s["rows"]), s["budget"]) for s in samples["graph"]}
        assert ((60,), 64) in graph and ((5, 60), 128) not in graph
        assert all(
            s["replay_ms"] == pytest.approx(graph_ms(s["budget"]))
            for s in samples["graph"]
        )

    def test_eager_cost_reused_across_ladders(self) -> None:
        first, _ = calibrated_manager()
        assert first.cost_model is not None
        second, model = timed_manager()
        model.calls.clear()
        cost = second.calibrate_cost_model(
            [make_kwargs(make_items([8, 20]))],
            eager_from=first.cost_model,
            error_floor=0.0,
        )
        assert model.calls_named("eager_forward") == []
        assert (cost.eager, cost.eager_error) == (
            first.cost_model.eager,
            first.cost_model.eager_error,
        )

    def test_statistics_are_left_alone(self) -> None:
        manager, _ = timed_manager()
        manager.execute(make_kwargs(make_items([12])))
        before = (
            manager.get_cumulative_stats(),
            manager.get_padding_stats(),
        )
        manager.calibrate_cost_model([make_kwargs(make_items([8, 20, 30]))])
        assert (manager.get_cumulative_stats(), manager.get_padding_stats()) == before

    def test_needs_capture(self) -> None:
        manager = make_manager(FakeEncoder(), budgets=BUDGETS, max_items=8)
        with pytest.raises(RuntimeError, match="capture"):
            manager.calibrate_cost_model([make_kwargs(make_items([8]))])

    def test_cost_aware_off_at_capture_times_replays_later(self) -> None:
        clock = VirtualClock()
        model = TimedFakeEncoder(clock, graph_ms, eager_ms, budget_range=(8, 64))
        manager = make_manager(model, budgets=BUDGETS, max_items=8, clock=clock)
        manager.capture()
        manager.calibrate_cost_model([make_kwargs(make_items([8, 20]))])
        assert set(manager._replay_ms) == set(BUDGETS)


class TestPlannedExecute:
    # (rows, expected units as (budget, items)): a replay costs 0.5 + 0.1 *
    # budget, eager 2 + 1 * items + 0.1 * rows.
    @pytest.mark.parametrize(
        ("rows", "units"),
        [
            ([8], [(8, 1)]),
            ([16, 16], [(32, 2)]),
            # 33 rows pad to 64: 6.9 ms replayed against 6.3 ms eager.
            ([33], [(None, 1)]),
            # The exact 8 replays; 33 and 40 share one eager call (11.3 ms)
            # instead of 6.9 + 7 ms apart.
            ([33, 40, 8], [(8, 1), (None, 2)]),
            # More than the largest budget: eager.
            ([70], [(None, 1)]),
        ],
    )
    def test_plans_run_with_exact_outputs(self, rows, units) -> None:  # type: ignore[no-untyped-def]
        manager, model = calibrated_manager()
        model.calls.clear()
        items = make_items(rows, seed=3)
        outputs = manager.execute(make_kwargs(items))
        assert_outputs(outputs, items)
        last = manager.get_execution_stats()["last_plan"]["units"]
        assert [(u["budget"], u["items"]) for u in last] == units
        eager_calls = model.calls_named("eager_forward")
        assert eager_calls == [(n, "default") for b, n in units if b is None]

    def test_all_eager_runs_the_batch_as_given(self) -> None:
        manager, model = calibrated_manager()
        model.calls.clear()
        items = make_items([40, 33])
        kwargs = make_kwargs(items)
        assert_outputs(manager.execute(kwargs), items)
        # No selection; postprocess sees the caller's kwargs, in item order.
        assert model.calls_named("select") == []
        ((indices, paths, clone, batch),) = model.calls_named("postprocess")
        assert (indices, paths, clone, batch) == ([0, 1], ["default"], False, kwargs)

    @pytest.mark.parametrize(
        ("rows", "selected", "postprocessed"),
        [
            # All eager, smaller first: selected largest first.
            ([33, 40], [1, 0], [1, 0]),
            # The eager unit of a mixed plan (33 and 40; 8 replays).
            ([33, 40, 8], [1, 0], [1, 0]),
        ],
    )
    def test_eager_units_run_their_items_largest_first(
        self, rows, selected, postprocessed
    ) -> None:  # type: ignore[no-untyped-def]
        """When the eager cost has the serial form (a tower that encodes
        item by item)."""
        manager, model = calibrated_manager()
        serial(manager, True)
        model.calls.clear()
        items = make_items(rows, seed=4)
        assert_outputs(manager.execute(make_kwargs(items)), items)
        assert selected in model.calls_named("select")
        eager_posts = [c[0] for c in model.calls_named("postprocess") if not c[2]]
        assert eager_posts == [postprocessed]

    def test_a_tower_declared_per_item_runs_largest_first(self) -> None:
        """``encoder_eager_forward_per_item`` (generated for DeepSeek-V4.1's
        standalone mixin) orders the items whatever the fitted form."""
        manager, model = calibrated_manager()
        serial(manager, False)
        model.encoder_eager_forward_per_item = True
        model.calls.clear()
        items = make_items([33, 40], seed=4)
        assert_outputs(manager.execute(make_kwargs(items)), items)
        assert model.calls_named("select") == [[1, 0]]

    @pytest.mark.parametrize(
        ("rows", "selected"),
        [
            # All eager: the caller's batch, unselected.
            ([33, 40], None),
            # The eager unit of a mixed plan, in item order.
            ([33, 40, 8], [0, 1]),
        ],
    )
    def test_a_batched_forward_keeps_the_order(self, rows, selected) -> None:  # type: ignore[no-untyped-def]
        manager, model = calibrated_manager()
        serial(manager, False)
        model.calls.clear()
        items = make_items(rows, seed=4)
        assert_outputs(manager.execute(make_kwargs(items)), items)
        selections = model.calls_named("select")
        assert (selected in selections) if selected else selections == []
        eager_posts = [c[0] for c in model.calls_named("postprocess") if not c[2]]
        assert eager_posts == [[0, 1]]

    def test_statistics(self) -> None:
        manager, _ = calibrated_manager()
        for rows in ([8], [33], [33, 40, 8]):
            manager.execute(make_kwargs(make_items(rows)))
        stats = manager.get_execution_stats()
        assert stats["plans"] == {"graphs": 1, "mixed": 1, "eager": 1}
        assert (stats["graph_units"], stats["graph_items"]) == (2, 2)
        assert (stats["eager_units"], stats["eager_items"]) == (2, 3)
        assert stats["predicted_ms"] < stats["predicted_eager_ms"]
        padding = manager.get_padding_stats()["paths"]["default"]
        assert (padding["eager_batches"], padding["eager_rows"]) == (2, 106)
        cumulative = manager.get_cumulative_stats()
        assert (cumulative["graph_hits"], cumulative["graph_misses"]) == (2, 3)

    def test_turning_it_off_restores_vllm_packing(self) -> None:
        manager, model = calibrated_manager()
        manager.cost_aware = False
        model.calls.clear()
        manager.execute(make_kwargs(make_items([33])))
        assert model.calls_named("eager_forward") == []

    def test_synthetic_cost_model(self) -> None:
        manager = make_manager(FakeEncoder(), budgets=BUDGETS, max_items=8)
        manager.capture()
        manager.cost_aware = True
        manager.set_cost_model(
            CostModel(GraphCost({b: 100.0 for b in BUDGETS}, 8), EagerCost(1.0))
        )
        items = make_items([5, 9, 60])
        assert_outputs(manager.execute(make_kwargs(items)), items)
        assert manager.get_execution_stats()["plans"]["eager"] == 1
        with pytest.raises(ValueError, match="no replay time"):
            manager.set_cost_model(CostModel(GraphCost({8: 1.0}, 8), EagerCost()))


class TestRefusals:
    def test_several_paths(self) -> None:
        paths = {
            "default": EncoderCudaGraphPathConfig(),
            "thumb": EncoderCudaGraphPathConfig(allow_zero_tokens=True),
        }
        with pytest.raises(NotImplementedError, match="one 'default' path"):
            make_manager(FakeEncoder(paths=paths), cost_aware=True)

    def test_capture_axes(self) -> None:
        model = FakeEncoder(capture_axes=((1, 2),))
        manager = make_manager(model)
        with pytest.raises(NotImplementedError, match="capture_axes"):
            manager.cost_aware = True


def test_data_parallel_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A world of one rank through the DP path (shard, local plan, gather)
    gives every item its output, eager and replayed alike."""
    gathered: list[torch.Tensor] = []

    def all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        gathered.append(tensor)
        return tensor

    monkeypatch.setattr(distributed, "get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr(distributed, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(distributed, "tensor_model_parallel_all_gather", all_gather)
    manager, _ = calibrated_manager(tp_size=2, tp_mode="data")
    assert manager.use_dp
    items = make_items([70, 8, 16], seed=5)
    assert_outputs(manager.execute(make_kwargs(items)), items)
    assert manager.get_execution_stats()["plans"]["mixed"] == 1
    assert len(gathered) == 1


def test_reused_eager_with_items_above_every_budget() -> None:
    """Nothing to time on the graphs: the reused eager cost is enough."""
    first, _ = calibrated_manager()
    second, _ = timed_manager()
    cost = second.calibrate_cost_model(
        [make_kwargs(make_items([70]))], eager_from=first.cost_model
    )
    assert second.calibration_samples == {"eager": [], "graph": []}
    assert cost.graph.per_replay_ms == 0.0


def test_calibration_needs_items() -> None:
    manager, _ = timed_manager()
    with pytest.raises(ValueError, match="at least one batch"):
        manager.calibrate_cost_model([])
    with pytest.raises(ValueError, match="no items"):
        manager.calibrate_cost_model([make_kwargs([])])
    assert manager.cost_model is None


def per_row_ms(rows: int) -> float:
    """A large-image replay: 0.01 ms per captured row (147k rows: 1.5 s)."""
    return 0.5 + 0.01 * rows


def per_row_eager_ms(rows: list[int]) -> float:
    return 2.0 + 0.01 * sum(rows)


DOUBLING_TO_147K = [64 * 2**k for k in range(12)] + [147456]
FINE_TO_147K = sorted({*DOUBLING_TO_147K, *range(4096, 147456, 4096)})


@pytest.mark.parametrize(
    "budgets", [[64, 128, 256, 512, 1024, 2048], DOUBLING_TO_147K, FINE_TO_147K]
)
def test_calibration_stays_within_its_device_time(budgets: list[int]) -> None:
    """Issue #27: calibrating the tuned DeepSeek-V4.1 ladder (budgets up to
    147k patches) took 252 s. Units are timed smallest first while the
    capture's replay times say the next one fits the limit: the device time
    stays under it whatever the ladder, and the small units are all timed."""
    clock = VirtualClock()
    model = TimedFakeEncoder(clock, per_row_ms, per_row_eager_ms, budget_range=(8, 64))
    manager = make_manager(
        model, budgets=budgets, max_items=8, cost_aware=True, clock=clock
    )
    manager.capture()
    manager.calibration_limit_ms = 2_000.0
    sizes = ([30, 200, 900], [1500, 1500], [9000] * 8, [20000, 40000], [60000, 70000])
    warmup = [make_kwargs(make_items(rows, seed=3)) for rows in sizes]
    before, calls = clock.ns, len(model.calls)
    manager.calibrate_cost_model(warmup, error_floor=0.0)
    report = manager.calibration_report
    assert (clock.ns - before) / 1e6 == pytest.approx(report["device_ms"])
    assert report["device_ms"] <= 2_000.0
    assert report["skipped"] > 0  # the 60000 + 70000 pair, at least
    timed = {sum(s["rows"]) for s in manager.calibration_samples["graph"]}
    assert {30, 200, 900, 1130, 1500} <= timed
    assert len(model.calls) - calls < 60 * report["units"]


def quadratic_eager_ms(rows: list[int]) -> float:
    """An eager call whose attention runs over each item's own sequence."""
    return 2.0 + 0.01 * sum(rows) + 1e-5 * sum(r * r for r in rows)


DOUBLING_TO_16K = [64 * 2**k for k in range(9)]


def long_sequence_manager(limit_ms: float):  # type: ignore[no-untyped-def]
    """Issue #27's Qwen2-VL: replays timed at capture with short dummy
    sequences (8 per budget), real items of one long sequence each, whose
    attention costs 10x the capture's replay at the top budget."""
    clock = VirtualClock()
    model = TimedFakeEncoder(
        clock,
        per_row_ms,
        quadratic_eager_ms,
        attention_ms_per_sq=1e-5,
        budget_range=(8, 64),
    )
    manager = make_manager(
        model, budgets=DOUBLING_TO_16K, max_items=8, cost_aware=True, clock=clock
    )
    manager.capture()
    manager.calibration_limit_ms = limit_ms
    return manager, model, clock


LONG_SEQUENCE_WARMUP = ([30, 200, 900], [3000], [12000], [9000, 6000])


@pytest.mark.parametrize("limit_ms", [500.0, 2_000.0, 5_000.0, 10_000.0, 20_000.0])
def test_calibration_limit_holds_with_long_sequences(limit_ms: float) -> None:
    """Issue #27: Qwen2-VL calibrated in 17-19 s against a 10 s limit, the
    last unit (one 10,738-token image) priced by its budget's replay with
    the capture's short dummies (294 ms) and run at 1,365 ms. Each call is
    now priced from the units timed so far: the device time stays within
    the limit, and the small units are all timed."""
    manager, _, clock = long_sequence_manager(limit_ms)
    warmup = [make_kwargs(make_items(rows, seed=3)) for rows in LONG_SEQUENCE_WARMUP]
    before = clock.ns
    manager.calibrate_cost_model(warmup, error_floor=0.0)
    report = manager.calibration_report
    assert (clock.ns - before) / 1e6 == pytest.approx(report["device_ms"])
    assert report["device_ms"] <= limit_ms
    timed = {sum(s["rows"]) for s in manager.calibration_samples["eager"]}
    assert {30, 200, 900} <= timed
    # Enough time: the long image is timed too, its calls once each.
    assert (12000 in timed) == (limit_ms >= 10_000.0)


def test_long_calls_are_timed_once() -> None:
    """A call of LONG_CALL_MS or more is timed by its first run; its replay
    alone is not timed beside the unit."""
    manager, model, _ = long_sequence_manager(1e9)
    model.calls.clear()
    manager.calibrate_cost_model([make_kwargs(make_items([12000], seed=3))])
    assert len(model.calls_named("eager_forward")) == 1
    samples = manager.calibration_samples["graph"]
    assert [(s["budget"], s["replay_ms"]) for s in samples] == [(16384, None)]
    assert len(model.calls_named("graph_forward")) == 1


def test_every_budget_is_priced_whatever_the_limit() -> None:
    """Budgets not timed at capture are timed before the units, even past
    the limit: the planner prices every captured budget."""
    clock = VirtualClock()
    model = TimedFakeEncoder(clock, per_row_ms, per_row_eager_ms, budget_range=(8, 64))
    manager = make_manager(
        model, budgets=DOUBLING_TO_16K, max_items=8, clock=clock, cost_aware=False
    )
    manager.capture()
    manager.calibration_limit_ms = 1.0
    warmup = [make_kwargs(make_items([30, 200], seed=3))]
    cost = manager.calibrate_cost_model(warmup, error_floor=0.0)
    assert sorted(cost.graph.replay_ms) == DOUBLING_TO_16K
    # The smallest unit's eager call, timed whatever the limit: the fit
    # needs one.
    assert manager.calibration_samples["eager"] == [{"rows": (30,), "ms": 2.3}]
    assert manager.calibration_report["skipped"] == 2
    manager.set_cost_model(cost)
    items = make_items([30, 200], seed=4)
    assert_outputs(manager.execute(make_kwargs(items)), items)


def serial_eager_ms(rows: list[int]) -> float:
    """A tower that encodes item by item: each item costs the larger of its
    launches (15 ms) and its device time."""
    return 1.0 + sum(max(15.0, 0.005 * r) for r in rows)


def overlapped_eager_ms(rows: list[int]) -> float:
    """A tower that encodes item by item on a host that issues the next
    item's launches (15 ms each) while the device runs: the larger of all
    launches and all device time, the batched form's shape."""
    return 1.0 + max(15.0 * len(rows), sum(0.005 * r for r in rows))


@pytest.mark.parametrize(
    "declared, serial", [(True, True), (False, False)], ids=["declared", "undeclared"]
)
def test_declared_per_item_tower_gets_the_serial_eager_form(
    declared: bool, serial: bool
) -> None:
    """Issue #27: DeepSeek-V4.1's calibration, cut by its limit, timed no
    eager call of a photo with a thumbnail; the batched form won the tie and
    priced such batches 12-21% under their time, so the planner ran them
    eagerly, slower than vLLM's packing. A tower that declares it encodes
    item by item gets the serial form where the samples cannot tell."""
    clock = VirtualClock()
    model = TimedFakeEncoder(clock, per_row_ms, serial_eager_ms, budget_range=(8, 64))
    if declared:
        model.encoder_eager_forward_per_item = True  # type: ignore[attr-defined]
    manager = make_manager(
        model, budgets=DOUBLING_TO_16K, max_items=8, cost_aware=True, clock=clock
    )
    manager.capture()
    # Single items and equal items only: the samples fit either form.
    sizes = ([200], [1000], [3000], [6000], [12000], [200] * 4)
    warmup = [make_kwargs(make_items(rows, seed=3)) for rows in sizes]
    cost = manager.calibrate_cost_model(warmup, error_floor=0.0)
    assert cost.eager.serial is serial
    mixed = [12000, 200]
    error = abs(cost.eager.predict(mixed) / serial_eager_ms(mixed) - 1)
    assert (error < 0.01) is declared


def test_samples_of_mixed_sizes_overrule_the_declared_eager_form() -> None:
    """Run J (H100): DeepSeek-V4.1 declares it encodes item by item, but its
    host hid a thumbnail's launches behind a photo's device time; forced
    serial, the fit priced batches of large images 3-7% under their time
    and the planner ran two of them eagerly, slower than vLLM's packing.
    Calibration units of items of different sizes show the form."""
    clock = VirtualClock()
    model = TimedFakeEncoder(
        clock, per_row_ms, overlapped_eager_ms, budget_range=(8, 64)
    )
    model.encoder_eager_forward_per_item = True  # type: ignore[attr-defined]
    manager = make_manager(
        model, budgets=DOUBLING_TO_16K, max_items=8, cost_aware=True, clock=clock
    )
    manager.capture()
    sizes = ([200], [1000], [3000], [6000], [12000], [200] * 4, [6000, 200])
    warmup = [make_kwargs(make_items(rows, seed=3)) for rows in sizes]
    cost = manager.calibrate_cost_model(warmup, error_floor=0.0)
    assert cost.eager.serial is False
    for rows in ([12000, 200], [6000, 3000, 200]):
        assert cost.eager.predict(rows) == pytest.approx(
            overlapped_eager_ms(rows), rel=0.02
        )


def test_eager_call_timed_when_its_graph_unit_does_not_fit() -> None:
    """A unit whose graph calls would pass the limit still has its eager
    call timed where that fits: the eager form shows in such units."""
    clock = VirtualClock()
    model = TimedFakeEncoder(clock, per_row_ms, per_row_eager_ms, budget_range=(8, 64))
    manager = make_manager(
        model, budgets=DOUBLING_TO_16K, max_items=8, cost_aware=True, clock=clock
    )
    manager.capture()
    manager.calibration_limit_ms = 800.0
    warmup = [make_kwargs(make_items([200, 6000], seed=3))]
    manager.calibrate_cost_model(warmup, error_floor=0.0)
    samples = manager.calibration_samples
    assert (200, 6000) in {tuple(s["rows"]) for s in samples["eager"]}
    assert (200, 6000) not in {tuple(s["rows"]) for s in samples["graph"]}
    report = manager.calibration_report
    assert report["skipped_graph_units"] > 0 and report["device_ms"] <= 800.0
