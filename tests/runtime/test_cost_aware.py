"""The cost-aware planner and its fits, on synthetic costs (no torch)."""

from __future__ import annotations

import itertools
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from encoder_cudagraph_runtime.cost_aware import (
    CostModel,
    EagerCost,
    EagerSample,
    ExecutionPlan,
    GraphCost,
    GraphSample,
    fit_eager_cost,
    fit_graph_cost,
    fit_nonnegative,
    plan_execution,
)
from encoder_cudagraph_runtime.packing import pack_items

BUDGETS = [64, 128, 256, 512, 1024, 2048, 4096]


def linear_graphs(
    launch_ms: float, per_row_ms: float, budgets: list[int] = BUDGETS
) -> dict[int, float]:
    return {b: launch_ms + per_row_ms * b for b in budgets}


# A launch-bound eager call (30 ms of host launches) and graphs whose replay
# costs what their rows cost: large items lose their padding.
LAUNCH_BOUND = CostModel(
    GraphCost(linear_graphs(0.5, 0.01), 64, per_replay_ms=0.2),
    EagerCost(fixed_ms=30.0, per_item_ms=1.0, per_row_ms=0.012),
    margin=0.0,
)
# Eager with little fixed cost: compute-bound items gain nothing from graphs.
COMPUTE_BOUND = CostModel(
    GraphCost(linear_graphs(0.5, 0.01), 64, per_replay_ms=0.2),
    EagerCost(fixed_ms=1.0, per_item_ms=1.0, per_row_ms=0.012),
    margin=0.0,
)


def units_of(plan: ExecutionPlan) -> list[tuple[int | None, tuple[int, ...]]]:
    return [(u.budget, u.positions) for u in plan.units]


@pytest.mark.parametrize(
    ("rows", "cost", "kind", "units"),
    [
        # One small item: the graph saves the eager launches.
        ([64], LAUNCH_BOUND, "graphs", [(64, (0,))]),
        # Exact fits merge into one replay.
        ([256, 256, 512], LAUNCH_BOUND, "graphs", [(1024, (0, 1, 2))]),
        # 540 rows pad to 1024: with cheap eager launches that loses.
        ([540], COMPUTE_BOUND, "eager", [(None, (0,))]),
        # Small exact items on graphs, the badly padded large one eager.
        ([64, 2100, 128], COMPUTE_BOUND, "mixed", [(256, (0, 2)), (None, (1,))]),
        # Larger than every budget: eager whatever the costs.
        ([5000], LAUNCH_BOUND, "eager", [(None, (0,))]),
        ([64, 5000], LAUNCH_BOUND, "mixed", [(64, (0,)), (None, (1,))]),
        ([], LAUNCH_BOUND, "eager", []),
    ],
)
def test_plans(rows, cost, kind, units) -> None:  # type: ignore[no-untyped-def]
    plan = plan_execution(rows, BUDGETS, 64, cost)
    assert plan.kind == kind
    assert units_of(plan) == units


def test_margin_keeps_eager_when_graphs_win_too_little() -> None:
    cost = CostModel(GraphCost({64: 9.7}, 64), EagerCost(fixed_ms=10.0), margin=0.0)
    assert plan_execution([64], [64], 64, cost).kind == "graphs"
    cautious = CostModel(cost.graph, cost.eager, margin=0.05)
    plan = plan_execution([64], [64], 64, cautious)
    assert plan.kind == "eager" and plan.predicted_ms == 10.0


def test_max_batch_size_bounds_a_unit() -> None:
    plan = plan_execution([64] * 5, [512], 2, LAUNCH_BOUND)
    assert [len(u.positions) for u in plan.units] == [1, 2, 2]
    assert all(u.budget == 512 for u in plan.units)


def plan_cost(
    sizes: list[int], labels: tuple[int, ...], cost: CostModel, budgets: list[int]
) -> float | None:
    """Cost of sorted ``sizes`` where label 0 = eager and equal positive
    labels in a run form one graph unit (``None``: a unit does not fit)."""
    eager = [s for s, lab in zip(sizes, labels) if lab == 0]
    total = cost.eager.predict(eager)
    for lab, group in itertools.groupby(zip(sizes, labels), key=lambda x: x[1]):
        if lab == 0:
            continue
        part = [s for s, _ in group]
        i = bisect_left(budgets, sum(part))
        if i == len(budgets):
            return None
        total += cost.graph.predict(budgets[i], sum(part), sum(r * r for r in part))
    return total


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 1500), min_size=1, max_size=5),
    st.floats(0.0, 40.0),
    st.floats(0.0, 2e-5),
)
def test_optimal_over_every_split(rows: list[int], fixed: float, pad_sq: float) -> None:
    """The plan's predicted cost is the minimum over every assignment of the
    sorted items to eager or to runs of graph units."""
    budgets = [64, 256, 1024, 2048]
    cost = CostModel(
        GraphCost(linear_graphs(0.5, 0.01, budgets), 64, 0.2, 1e-6, pad_sq),
        EagerCost(fixed, 0.1, 0.012, 2e-6),
        margin=0.0,
    )
    sizes = sorted(rows)
    best = min(
        c
        for labels in itertools.product(range(len(sizes) + 1), repeat=len(sizes))
        if (c := plan_cost(sizes, labels, cost, budgets)) is not None
    )
    plan = plan_execution(rows, budgets, 64, cost)
    assert plan.predicted_ms == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert sorted(p for u in plan.units for p in u.positions) == list(range(len(rows)))
    assert plan.predicted_ms == pytest.approx(sum(u.predicted_ms for u in plan.units))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=12))
def test_never_predicted_worse_than_vllm_packing(rows: list[int]) -> None:
    batches = pack_items([rows], rows, [BUDGETS], 64)
    vllm = 0.0
    eager_rows = []
    for batch in batches:
        part = [rows[i] for i in batch.indices]
        if batch.path_budgets[0] is None:
            vllm += COMPUTE_BOUND.eager.predict(part)
            eager_rows += part
            continue
        vllm += COMPUTE_BOUND.graph.predict(
            batch.path_budgets[0], sum(part), sum(r * r for r in part)
        )
    plan = plan_execution(rows, BUDGETS, 64, COMPUTE_BOUND)
    assert plan.predicted_ms <= vllm + 1e-9


class TestFits:
    def test_eager_recovers_its_coefficients(self) -> None:
        truth = EagerCost(12.0, 0.3, 0.004, 1e-6)
        batches = [
            (64,),
            (540,),
            (2304,),
            (64, 64, 64),
            (540, 2304),
            (100, 200, 300, 400),
        ]
        fitted = fit_eager_cost([EagerSample(b, truth.predict(b)) for b in batches])
        for name in ("fixed_ms", "per_item_ms", "per_row_ms", "per_row_sq_ms"):
            assert getattr(fitted, name) == pytest.approx(
                getattr(truth, name), rel=1e-6
            )

    def test_graph_recovers_its_coefficients(self) -> None:
        replay = linear_graphs(0.5, 0.01)
        truth = GraphCost(replay, 16, 0.25, 3e-6, 1e-6)
        units = [
            (64, (40,)),
            (128, (40,)),
            (256, (200,)),
            (512, (200,)),
            (1024, (500, 500)),
            (2048, (1500,)),
            (4096, (3000, 100)),
        ]
        samples = [
            GraphSample(b, r, truth.predict(b, sum(r), sum(x * x for x in r)))
            for b, r in units
        ]
        fitted = fit_graph_cost(replay, 16, samples)
        assert fitted.per_replay_ms == pytest.approx(0.25, rel=1e-6)
        assert fitted.per_row_sq_ms == pytest.approx(3e-6, rel=1e-6)
        assert fitted.per_pad_sq_ms == pytest.approx(1e-6, rel=1e-6)

    @pytest.mark.parametrize(
        ("features", "targets", "expected"),
        [
            ([[1, 1], [1, 2], [1, 3]], [3, 5, 7], [1, 2]),
            # The unconstrained slope is -2: clamped to 0, the mean remains.
            ([[1, 1], [1, 2], [1, 3]], [7, 5, 3], [5, 0]),
            # Nothing fits better than zero.
            ([[1.0]], [-4.0], [0.0]),
        ],
    )
    def test_nonnegative_least_squares(self, features, targets, expected) -> None:  # type: ignore[no-untyped-def]
        assert fit_nonnegative(features, targets) == pytest.approx(expected)


def test_fits_without_samples() -> None:
    with pytest.raises(ValueError, match="no eager samples"):
        fit_eager_cost([])
    graph = fit_graph_cost({64: 1.0}, 8, [])
    assert (graph.per_replay_ms, graph.per_row_sq_ms, graph.per_pad_sq_ms) == (0, 0, 0)
