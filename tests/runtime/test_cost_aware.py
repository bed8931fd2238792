"""The cost-aware planner and its fits, on synthetic costs (no torch)."""

from __future__ import annotations

import dataclasses
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
    calibrated_cost_model,
    crossover_rows,
    fit_eager_cost,
    fit_graph_cost,
    fit_nonnegative,
    held_out_graph_errors,
    plan_execution,
    relative_errors,
    replay_cost_rows,
)

BUDGETS = [64, 128, 256, 512, 1024, 2048, 4096]


def linear_graphs(
    launch_ms: float, per_row_ms: float, budgets: list[int] = BUDGETS
) -> dict[int, float]:
    return {b: launch_ms + per_row_ms * b for b in budgets}


def exact(cost: CostModel) -> CostModel:
    """``cost`` without measured errors: the cheapest plan always wins."""
    return dataclasses.replace(cost, graph_error=0.0, eager_error=0.0)


# A launch-bound eager call (30 ms of host launches) and graphs whose replay
# costs what their rows cost: large items lose their padding.
LAUNCH_BOUND = exact(
    CostModel(
        GraphCost(linear_graphs(0.5, 0.01), 64, per_replay_ms=0.2),
        EagerCost(fixed_ms=30.0, per_item_ms=1.0, per_row_ms=0.012),
    )
)
# Eager with little fixed cost: compute-bound items gain nothing from graphs.
COMPUTE_BOUND = exact(
    CostModel(
        GraphCost(linear_graphs(0.5, 0.01), 64, per_replay_ms=0.2),
        EagerCost(fixed_ms=1.0, per_item_ms=1.0, per_row_ms=0.012),
    )
)


def units_of(plan: ExecutionPlan) -> list[tuple[int | None, tuple[int, ...]]]:
    return [(u.budget, u.positions) for u in plan.units]


@pytest.mark.parametrize(
    ("rows", "cost", "kind", "source", "units"),
    [
        # One small item: the graph saves the eager launches.
        ([64], LAUNCH_BOUND, "graphs", "vllm", [(64, (0,))]),
        # Exact fits merge into one replay, as vLLM packs them.
        ([256, 256, 512], LAUNCH_BOUND, "graphs", "vllm", [(1024, (0, 1, 2))]),
        # 540 rows pad to 1024: with cheap eager launches vLLM's packing is
        # predicted slower than eager.
        ([540], COMPUTE_BOUND, "eager", "cheapest", [(None, (0,))]),
        # Small exact items on graphs, the badly padded large one eager.
        (
            [64, 2100, 128],
            COMPUTE_BOUND,
            "mixed",
            "cheapest",
            [(256, (0, 2)), (None, (1,))],
        ),
        # Larger than every budget: eager whatever the costs (vLLM too).
        ([5000], LAUNCH_BOUND, "eager", "vllm", [(None, (0,))]),
        ([64, 5000], LAUNCH_BOUND, "mixed", "vllm", [(64, (0,)), (None, (1,))]),
        ([], LAUNCH_BOUND, "eager", "vllm", []),
    ],
)
def test_plans(rows, cost, kind, source, units) -> None:  # type: ignore[no-untyped-def]
    plan = plan_execution(rows, BUDGETS, 64, cost)
    assert (plan.kind, plan.source) == (kind, source)
    assert units_of(plan) == units


# vLLM packs 300 + 500 rows into one 1024 replay (10.21 ms with their
# attention); two 512 replays cost 9.47 ms, 7.2 % less.
SPLIT = CostModel(
    GraphCost({512: 4.6, 1024: 10.0}, 8, per_row_sq_ms=1e-6), EagerCost(fixed_ms=50.0)
)


@pytest.mark.parametrize(
    ("graph_error", "source"),
    [(0.0, "cheapest"), (0.06, "cheapest"), (0.08, "vllm"), (0.25, "vllm")],
)
def test_vllm_packing_kept_within_the_measured_error(graph_error, source) -> None:  # type: ignore[no-untyped-def]
    cost = dataclasses.replace(SPLIT, graph_error=graph_error, eager_error=0.0)
    rows = [300, 500]
    plan = plan_execution(rows, [512, 1024], 8, cost)
    assert plan.vllm_ms == pytest.approx(10.0 + 1e-6 * (300**2 + 500**2 - 1024**2 / 8))
    assert plan.source == source
    expected = [(512, (0,)), (512, (1,))] if source == "cheapest" else [(1024, (0, 1))]
    assert units_of(plan) == expected


def test_never_planned_slower_than_all_eager() -> None:
    """vLLM's packing predicted 1 % slower than eager moves off it, however
    large the errors."""
    cost = CostModel(GraphCost({64: 10.1}, 64), EagerCost(fixed_ms=10.0), 0.25, 0.25)
    plan = plan_execution([64], [64], 64, cost)
    assert (plan.source, plan.kind, plan.predicted_ms) == ("cheapest", "eager", 10.0)


@pytest.mark.parametrize(("scale", "kind"), [(1.0, "graphs"), (1.06, "eager")])
def test_a_budget_s_factor_prices_its_graph_against_eager(scale, kind) -> None:  # type: ignore[no-untyped-def]
    """Run F3's MiniMax M3 photo: 540 rows at the 640 budget, 17.1 ms by the
    shared fit, eager 17.3 ms; the budget measured 6 % over the fit, so the
    graph would lose to eager and the plan runs eagerly."""
    graph = GraphCost({640: 17.1}, 64, budget_scale={640: scale})
    cost = CostModel(graph, EagerCost(fixed_ms=17.3), 0.04, 0.02)
    plan = plan_execution([540], [640], 64, cost)
    assert plan.kind == kind


def test_eager_share_widens_the_margin() -> None:
    """vLLM replays [64, 64] at 128 and 4000 at 4096 (51.8 ms); 4000 rows
    eager instead: 46.8 ms (all eager: 56.3 ms). Taken with a small graph
    error; kept off by a large eager error, since the plan is mostly eager."""
    budgets = [64, 128, 4096]
    cost = CostModel(
        GraphCost({64: 1.0, 128: 1.8, 4096: 50.0}, 8),
        EagerCost(per_item_ms=5.0, per_row_ms=0.01),
    )
    rows = [64, 4000, 64]
    base = plan_execution(rows, budgets, 8, exact(cost))
    assert (base.vllm_ms, base.predicted_ms) == pytest.approx((51.8, 46.8))
    assert units_of(base) == [(128, (0, 2)), (None, (1,))]
    small = dataclasses.replace(cost, graph_error=0.02, eager_error=0.0)
    large = dataclasses.replace(cost, graph_error=0.02, eager_error=0.2)
    assert plan_execution(rows, budgets, 8, small).source == "cheapest"
    assert plan_execution(rows, budgets, 8, large).source == "vllm"


def test_max_batch_size_bounds_a_unit() -> None:
    plan = plan_execution([64] * 5, [512], 2, LAUNCH_BOUND)
    assert sorted(len(u.positions) for u in plan.units) == [1, 2, 2]
    assert all(u.budget == 512 for u in plan.units)


def test_sort_keys_set_vllms_order() -> None:
    """vLLM visits items in ascending output tokens: with keys that reverse
    the rows, 60 opens the batch and 40 + 60 merge into the 128 graph."""
    rows = [40, 60]
    by_rows = plan_execution(rows, [64, 128], 8, LAUNCH_BOUND)
    by_keys = plan_execution(rows, [64, 128], 8, LAUNCH_BOUND, sort_keys=[9, 1])
    assert [u.positions for u in by_rows.units] == [(0, 1)]
    assert [u.positions for u in by_keys.units] == [(1, 0)]


def family_cost(
    sizes: list[int], labels: tuple[int, ...], cost: CostModel, budgets: list[int]
) -> float | None:
    """Cost of sorted ``sizes`` where label 0 = eager (a suffix only) and
    equal positive labels in a run form one graph unit (``None``: not in the
    planner's family, or a unit that does not fit)."""
    eager = [s for s, lab in zip(sizes, labels) if lab == 0]
    if any(lab != 0 for lab in labels[len(sizes) - len(eager) :]):
        return None
    total = cost.eager.predict(eager)
    for lab, group in itertools.groupby(zip(sizes, labels), key=lambda x: x[1]):
        if lab == 0:
            continue
        part = [s for s, _ in group]
        i = bisect_left(budgets, sum(part))
        if i == len(budgets) or len(part) > 64:
            return None
        total += cost.graph.predict(budgets[i], sum(part), sum(r * r for r in part))
    return total


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 1500), min_size=1, max_size=5),
    st.floats(0.0, 40.0),
    st.floats(0.0, 2e-5),
)
def test_cheapest_over_the_whole_family(
    rows: list[int], host: float, pad_sq: float
) -> None:
    """Without errors the plan costs the minimum of vLLM's packing and of
    every plan of the family (graph runs of the sorted items, then an eager
    suffix), under an eager cost with a host floor."""
    budgets = [64, 256, 1024, 2048]
    cost = exact(
        CostModel(
            GraphCost(linear_graphs(0.5, 0.01, budgets), 64, 0.2, 1e-6, pad_sq),
            EagerCost(0.0, 0.1, 0.012, 2e-6, host_fixed_ms=host, host_per_item_ms=1.0),
        )
    )
    sizes = sorted(rows)
    family = min(
        c
        for labels in itertools.product(range(len(sizes) + 1), repeat=len(sizes))
        if (c := family_cost(sizes, labels, cost, budgets)) is not None
    )
    plan = plan_execution(rows, budgets, 64, cost)
    assert plan.predicted_ms == pytest.approx(min(family, plan.vllm_ms), abs=1e-9)
    assert sorted(p for u in plan.units for p in u.positions) == list(range(len(rows)))
    assert plan.predicted_ms == pytest.approx(sum(u.predicted_ms for u in plan.units))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 3000), min_size=1, max_size=12),
    st.floats(0.0, 0.25),
    st.floats(0.0, 0.25),
)
def test_never_predicted_slower_than_eager(
    rows: list[int], graph_error: float, eager_error: float
) -> None:
    cost = dataclasses.replace(
        COMPUTE_BOUND, graph_error=graph_error, eager_error=eager_error
    )
    plan = plan_execution(rows, BUDGETS, 64, cost)
    assert plan.predicted_ms <= plan.eager_ms + 1e-9
    if graph_error == eager_error == 0.0:
        assert plan.predicted_ms <= plan.vllm_ms + 1e-9


# Eager with a host floor: 20 ms of launches plus 2 per item, against a
# device that needs 1 ms per item, 0.01 per row and 1e-6 per squared row.
HOST_FLOOR = EagerCost(1.0, 1.0, 0.01, 1e-6, host_fixed_ms=20.0, host_per_item_ms=2.0)
EAGER_BATCHES = [
    (64,),
    (540,),
    (2304,),
    (6000,),
    (64, 64, 64),
    (64,) * 8,
    (540, 2304),
    (2304, 2304, 6000),
    (100, 200, 300, 400),
]
# The same sizes, each batch of one size only.
EQUAL_ITEM_BATCHES = [(64,), (540,), (2304,), (6000,), (64,) * 8, (2304,) * 3]


# A tower that encodes item by item, its host waiting for the device within
# each item (DeepSeek-V4.1's): 22 ms of launches per item, 6 ms + 6.5e-7 per
# squared patch on the device, 2 ms per call.
SERIAL = EagerCost(2.0, 6.0, 0.0, 6.5e-7, host_per_item_ms=22.0, serial=True)


class TestFits:
    @pytest.mark.parametrize(
        "truth",
        [
            HOST_FLOOR,
            EagerCost(12.0, 0.3, 0.004, 1e-6),  # no host floor
            EagerCost(host_fixed_ms=30.0),  # host-bound everywhere
            SERIAL,
        ],
    )
    def test_eager_recovers_its_predictions(self, truth: EagerCost) -> None:
        # Device-bound sizes enough to tell the device terms apart.
        batches = EAGER_BATCHES + [(3000,), (4500,), (8748,), (8748, 540)]
        samples = [EagerSample(b, truth.predict(b)) for b in batches]
        fitted = fit_eager_cost(samples)
        for batch in [(80,), (1000, 1000), (64,) * 16, (3000, 5000)]:
            assert fitted.predict(batch) == pytest.approx(
                truth.predict(batch), rel=1e-6
            )

    @pytest.mark.parametrize(("truth", "serial"), [(SERIAL, True), (HOST_FLOOR, False)])
    def test_eager_form_follows_the_samples(
        self, truth: EagerCost, serial: bool
    ) -> None:
        """The form is the one the samples of several items show."""
        samples = [EagerSample(b, truth.predict(b)) for b in EAGER_BATCHES]
        assert fit_eager_cost(samples).serial is serial

    @pytest.mark.parametrize(
        ("truth", "batches", "declared_serial", "serial"),
        [
            # Samples of items of different sizes show the form: a tower
            # declared item by item whose host hides a small item's
            # launches behind a large item's device time (run J's H100)
            # gets the batched form, and the other way round.
            (HOST_FLOOR, EAGER_BATCHES, True, False),
            (SERIAL, EAGER_BATCHES, False, True),
            # Single and equal items cannot tell: the declaration decides.
            (HOST_FLOOR, EQUAL_ITEM_BATCHES, True, True),
            (SERIAL, EQUAL_ITEM_BATCHES, False, False),
        ],
        ids=["shown-batched", "shown-serial", "declared-serial", "undeclared"],
    )
    def test_the_declared_form_decides_only_where_the_samples_cannot(
        self,
        truth: EagerCost,
        batches: list[tuple[int, ...]],
        declared_serial: bool,
        serial: bool,
    ) -> None:
        samples = [EagerSample(b, truth.predict(b)) for b in batches]
        fitted = fit_eager_cost(samples, declared_serial=declared_serial)
        assert fitted.serial is serial
        if serial is truth.serial:  # the samples' own form: priced right
            mixed = (2304, 540, 64)
            assert fitted.predict(mixed) == pytest.approx(
                truth.predict(mixed), rel=0.02
            )

    def test_serial_form_prices_a_small_item_beside_a_large_one(self) -> None:
        """Per item, a small image after a large one costs its launches
        (22 ms), where one batched forward's sums would add its device
        milliseconds only."""
        large, small = SERIAL.predict((8748,)), SERIAL.predict((540,))
        assert SERIAL.predict((8748, 540)) == pytest.approx(large + small - 2.0)
        assert small == pytest.approx(24.0)
        batched = dataclasses.replace(SERIAL, serial=False)
        assert batched.predict((8748, 540)) < large + 7.0

    def test_suffix_costs_are_the_suffixes_predictions(self) -> None:
        sizes = [64, 540, 540, 2304, 6000]
        for cost in (SERIAL, HOST_FLOOR):
            assert cost.suffix_ms(sizes) == pytest.approx(
                [cost.predict(sizes[i:]) for i in range(len(sizes) + 1)]
            )

    def test_eager_sum_misprices_small_items(self) -> None:
        """The reason for the host term: fitted as one sum, the samples'
        small items come out far below their launch-bound time."""
        samples = [EagerSample(b, HOST_FLOOR.predict(b)) for b in EAGER_BATCHES]
        features = [[1.0, len(b), sum(b), sum(r * r for r in b)] for b in EAGER_BATCHES]
        c = fit_nonnegative(features, [s.ms for s in samples])
        as_sum = EagerCost(*c)
        assert HOST_FLOOR.predict((64,)) == pytest.approx(22.0)
        assert abs(as_sum.predict((64,)) / 22.0 - 1) > 0.1
        assert fit_eager_cost(samples).predict((64,)) == pytest.approx(22.0)

    @pytest.mark.parametrize("replay_alone", [True, False])
    def test_graph_recovers_its_coefficients(self, replay_alone: bool) -> None:
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
        samples = []
        for b, r in units:
            rows, rows_sq = sum(r), sum(x * x for x in r)
            ms = truth.predict(b, rows, rows_sq)
            alone = replay[b] + truth.attention_ms(b, rows, rows_sq)
            samples.append(GraphSample(b, r, ms, alone if replay_alone else None))
        fitted = fit_graph_cost(replay, 16, samples)
        assert fitted.per_replay_ms == pytest.approx(0.25, rel=1e-6)
        assert fitted.per_row_sq_ms == pytest.approx(3e-6, rel=1e-6)
        assert fitted.per_pad_sq_ms == pytest.approx(1e-6, rel=1e-6)

    @pytest.mark.parametrize(
        ("slow_512", "bound"),
        [
            (1.05, None),  # the budget runs 5 % over the shared fit: learnt
            (0.95, None),
            (2.0, 1.2),  # an outlier: the factor stops at BUDGET_SCALE_RANGE
            (0.5, 0.85),
        ],
    )
    def test_graph_learns_each_budgets_own_factor(
        self, slow_512: float, bound: float | None
    ) -> None:
        """One budget off the shared coefficients (as a kernel's tiling
        makes it): its units are priced by its own measurements, and a
        budget no unit ran keeps factor 1."""
        replay = linear_graphs(0.5, 0.01)
        truth = GraphCost(replay, 16, 0.25, 3e-6, 0.0)
        units = [(128, (100,)), (256, (200,)), (512, (400,)), (512, (400,))]
        units += [(1024, (900,)), (2048, (1800,))]
        samples = []
        for b, r in units:
            ms = truth.predict(b, sum(r), sum(x * x for x in r))
            samples.append(GraphSample(b, r, ms * (slow_512 if b == 512 else 1.0)))
        fitted = fit_graph_cost(replay, 16, samples)
        assert 64 not in fitted.budget_scale
        assert fitted.predict(64, 40, 1600) == fitted.unscaled_ms(64, 40, 1600)
        if bound is None:
            for s in samples:
                rows, rows_sq = sum(s.rows), sum(x * x for x in s.rows)
                assert fitted.predict(s.budget, rows, rows_sq) == pytest.approx(
                    s.ms, rel=1e-6
                )
        else:
            assert fitted.budget_scale[512] == bound

    def test_held_out_errors_do_not_echo_the_fit(self) -> None:
        """A unit alone at its budget is predicted without the correction its
        own time made: its error is the shared fit's. Two units at a budget
        each take the other's correction."""
        replay = {64: 10.0, 128: 20.0}
        samples = [
            GraphSample(64, (8,) * 8, 12.0),  # 20 % over the replay timed at capture
            GraphSample(128, (16,) * 8, 22.0),
            GraphSample(128, (16,) * 8, 24.0),
        ]
        fitted = fit_graph_cost(replay, 8, samples)
        assert fitted.predict(64, 64, 8 * 64) == pytest.approx(12.0)
        plain = [
            abs(
                fitted.unscaled_ms(s.budget, sum(s.rows), sum(r * r for r in s.rows))
                / s.ms
                - 1
            )
            for s in samples
        ]
        errors = held_out_graph_errors(fitted, samples)
        # In sample the correction makes it exact; held out it is the shared fit's.
        assert errors[0] == pytest.approx(plain[0]) and errors[0] > 0.01
        assert errors[1] == pytest.approx(24.0 / 22.0 - 1)
        assert errors[2] == pytest.approx(1 - 22.0 / 24.0)

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


class TestErrors:
    GRAPH = GraphCost({64: 10.0}, 8)
    EAGER = EagerCost(fixed_ms=20.0)

    def test_relative_errors_are_a_high_quantile(self) -> None:
        cost = CostModel(self.GRAPH, self.EAGER)
        graph = [GraphSample(64, (64,), ms) for ms in (10.0, 10.0, 12.5, 8.0)]
        eager = [EagerSample((64,), ms) for ms in (20.0, 25.0)]
        # Graph errors 0, 0, 0.2 (10 / 12.5), 0.25 (10 / 8); eager 0, 0.2.
        assert relative_errors(cost, eager, graph, quantile=0.75) == pytest.approx(
            (0.2, 0.2)
        )
        assert relative_errors(cost, eager, graph) == pytest.approx((0.25, 0.2))
        assert relative_errors(cost, [], []) == (0.0, 0.0)

    @pytest.mark.parametrize(
        ("graph_ms", "expected"),
        [
            (10.0, 0.02),  # exact: the floor
            (10.0 / 1.05, 0.05),  # 5 % off: the measured error
            (5.0, 0.25),  # far off: the cap
        ],
    )
    def test_calibrated_errors_are_bounded(self, graph_ms, expected) -> None:  # type: ignore[no-untyped-def]
        # Eight items of 8 rows fill the 64 budget like its dummies: only
        # the per-replay term is left to fit, and it cannot be negative.
        replay = {64: 10.0}
        graph = [GraphSample(64, (8,) * 8, graph_ms)]
        eager = [EagerSample((64,), 20.0)]
        model = calibrated_cost_model(replay, 8, eager, graph, error_floor=0.02)
        assert model.graph_error == pytest.approx(expected, rel=1e-6)
        assert model.eager_error == 0.02  # one sample: fitted exactly

    def test_reused_eager_keeps_its_error(self) -> None:
        reused = CostModel(self.GRAPH, self.EAGER, 0.1, 0.2)
        graph = [GraphSample(64, (8,) * 8, 10.0)]
        model = calibrated_cost_model({64: 10.0}, 8, [], graph, reuse_eager=reused)
        assert (model.eager, model.eager_error) == (self.EAGER, 0.2)
        assert model.graph_error == 0.02


def test_fits_without_samples() -> None:
    with pytest.raises(ValueError, match="no eager samples"):
        fit_eager_cost([])
    graph = fit_graph_cost({64: 1.0}, 8, [])
    assert (graph.per_replay_ms, graph.per_row_sq_ms, graph.per_pad_sq_ms) == (0, 0, 0)


# A graph replay of 3 ms plus rows 2% slower than eager's; eager pays 3 ms
# per call and per_item_ms per item: the graph loses once its rows' extra
# (0.0002 ms a row) reaches the launches it saves (per_item_ms per item).
CROSSOVER_GRAPH = GraphCost(
    {b: 3.0 + 0.0102 * b for b in (256, 512, 1024, 2048, 4096)}, 64
)
CROSSOVER_EAGER = EagerCost(fixed_ms=3.0, per_item_ms=1.0, per_row_ms=0.01)


@pytest.mark.parametrize(
    ("eager", "expected"),
    [
        # 0.0002 b >= n: from b = 5000 n (none captured: graphs pay).
        (CROSSOVER_EAGER, {1: None, 2: None}),
        # Eager without per-item launches: the graph loses at every budget.
        (dataclasses.replace(CROSSOVER_EAGER, per_item_ms=0.0), {1: 256, 2: 256}),
        # Half a ms per item: b >= 2500 n (n = 1: from 4096).
        (dataclasses.replace(CROSSOVER_EAGER, per_item_ms=0.5), {1: 4096, 2: None}),
    ],
)
def test_crossover_rows_where_graphs_stop_paying(
    eager: EagerCost, expected: dict[int, int | None]
) -> None:
    cost = CostModel(CROSSOVER_GRAPH, eager)
    assert crossover_rows(cost, splits=(1, 2)) == expected


@pytest.mark.parametrize(
    ("replay_ms", "host_ms", "row_sq", "expected"),
    [
        # 26 ms per 8192 rows between the two largest graphs; the smallest
        # replays in 4 ms: about 1260 rows, 1575 with 1 ms of host work.
        ({64: 4.0, 8192: 30.0, 16384: 56.0}, 0.0, 0.0, 1260),
        ({64: 4.0, 8192: 30.0, 16384: 56.0}, 1.0, 0.0, 1575),
        # 8 of the 26 ms are the 8 capture dummies' attention growing
        # ((16384² - 8192²) / 8 = 25,165,824 squared rows between the
        # graphs): a padded row costs 18 ms per 8192, a replay 1820 rows.
        ({64: 4.0, 8192: 30.0, 16384: 56.0}, 0.0, 8 / 25_165_824, 1820),
        # No growth to measure: the smallest budget.
        ({64: 4.0, 128: 4.0}, 0.0, 0.0, 64),
        ({64: 4.0}, 0.0, 0.0, 64),
        # Attention is the whole growth: no row cost left to measure.
        ({64: 4.0, 128: 5.0}, 0.0, 1.0, 64),
    ],
)
def test_replay_cost_rows(replay_ms, host_ms, row_sq, expected) -> None:  # type: ignore[no-untyped-def]
    graph = GraphCost(replay_ms, 8, per_replay_ms=host_ms, per_row_sq_ms=row_sq)
    assert replay_cost_rows(graph) == expected
