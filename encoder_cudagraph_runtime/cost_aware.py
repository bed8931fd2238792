"""Cost-aware execution: per execute, graphs, split batches or eager.

vLLM's manager replays every batch that fits a budget. On large,
compute-bound images that can be slower than no graph at all: a batch of
540 tokens replays the 1024 budget, and the padding rows cost as much as
real ones (their attention too, when they form one trailing sequence). This
module decides, from measured costs, how to run one execute's items:

* **graph units**: consecutive items (in ascending rows) replayed at their
  smallest fitting budget, at most ``max_batch_size`` per unit;
* **one eager unit**: every other item, in one ``encoder_eager_forward``
  call, unpadded.

:func:`plan_execution` finds the cheapest such plan by dynamic programming
over the sorted items (vLLM's own packing is one of the plans it considers,
so under the cost model it never predicts worse), and keeps all-eager unless
the best plan is predicted at least ``margin`` faster.

The cost model (:class:`CostModel`) is calibrated by the manager: each
captured graph's replay is timed once at capture (:attr:`GraphCost.replay_ms`,
with the capture dummies in its buffers), and timed eager and graph runs of
warm-up batches fit the rest with :func:`fit_eager_cost` and
:func:`fit_graph_cost`. Everything here is pure Python on numbers (no torch),
so it is tested with synthetic costs.

Rows are counted in the budget's unit (``EncoderItemSpec`` path tokens). The
squared terms model attention within each sequence; for encoders whose
budget unit is a fixed multiple of the attention rows (MiniMax M3, Qwen2-VL:
four input rows per output token) the factor folds into the fitted
coefficients.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

__all__ = [
    "CostModel",
    "EagerCost",
    "EagerSample",
    "ExecutionPlan",
    "ExecutionStats",
    "GraphCost",
    "GraphSample",
    "PlannedUnit",
    "fit_eager_cost",
    "fit_graph_cost",
    "fit_nonnegative",
    "plan_execution",
]


@dataclass(frozen=True)
class EagerCost:
    """Milliseconds of one ``encoder_eager_forward`` call (with its item
    selection and postprocess) on ``n`` items of ``rows_i`` rows:
    ``fixed + per_item·n + per_row·Σ rows_i + per_row_sq·Σ rows_i²``."""

    fixed_ms: float = 0.0
    per_item_ms: float = 0.0
    per_row_ms: float = 0.0
    per_row_sq_ms: float = 0.0

    def item_ms(self, rows: int) -> float:
        """The part of a call one item of ``rows`` rows adds."""
        return self.per_item_ms + self.per_row_ms * rows + self.per_row_sq_ms * rows**2

    def predict(self, rows: Sequence[int]) -> float:
        """One call on items of ``rows`` (0 for no items)."""
        if not rows:
            return 0.0
        return self.fixed_ms + sum(self.item_ms(r) for r in rows)


@dataclass(frozen=True)
class GraphCost:
    """Milliseconds of one graph unit: the replay of ``budget`` with a batch
    of ``rows_i`` rows, plus the host work around it (replay buffers,
    copies, postprocess).

    ``replay_ms[budget] + per_replay + per_row_sq·(Σ rows_i² − budget² /
    max_batch_size) + per_pad_sq·(budget − Σ rows_i)²``: the replay was
    timed with ``max_batch_size`` capture dummies sharing the budget, so the
    real batch's attention is added and the dummies' taken off; the padding
    rows' own term is for mixins that make them one trailing sequence.
    """

    replay_ms: Mapping[int, float]
    max_batch_size: int
    per_replay_ms: float = 0.0
    per_row_sq_ms: float = 0.0
    per_pad_sq_ms: float = 0.0

    def predict(self, budget: int, rows: int, rows_sq: int) -> float:
        dummies_sq = budget * budget / self.max_batch_size
        pad = budget - rows
        return (
            self.replay_ms[budget]
            + self.per_replay_ms
            + self.per_row_sq_ms * (rows_sq - dummies_sq)
            + self.per_pad_sq_ms * pad * pad
        )


@dataclass(frozen=True)
class CostModel:
    graph: GraphCost
    eager: EagerCost
    margin: float = 0.05
    """A plan that replays graphs must be predicted at least this fraction
    faster than running everything eagerly, or everything runs eagerly (the
    model's error should not make graphs slower than no graphs)."""

    def as_dict(self) -> dict[str, object]:
        graph = asdict(self.graph)
        graph["replay_ms"] = {str(b): ms for b, ms in self.graph.replay_ms.items()}
        return {"graph": graph, "eager": asdict(self.eager), "margin": self.margin}


@dataclass(frozen=True)
class PlannedUnit:
    """Items run together: a graph replay at ``budget``, or (``None``) the
    eager call."""

    positions: tuple[int, ...]
    """Positions in the rows given to :func:`plan_execution`, ascending by
    rows."""
    budget: int | None
    rows: int
    predicted_ms: float


@dataclass(frozen=True)
class ExecutionPlan:
    units: tuple[PlannedUnit, ...]
    """Graph units in ascending rows, then the eager unit if any."""
    predicted_ms: float
    eager_ms: float
    """Predicted time of running every item in one eager call."""

    @property
    def kind(self) -> str:
        """``"graphs"``, ``"eager"`` or ``"mixed"``."""
        graphs = any(u.budget is not None for u in self.units)
        eager = any(u.budget is None for u in self.units)
        return "mixed" if eager and graphs else "graphs" if graphs else "eager"


def plan_execution(
    rows: Sequence[int],
    budgets: Sequence[int],
    max_batch_size: int,
    cost: CostModel,
) -> ExecutionPlan:
    """The cheapest plan for items of ``rows`` (see the module docstring).

    ``budgets`` are the captured budgets, ascending. Items larger than every
    budget can only run eagerly.
    """
    order = sorted(range(len(rows)), key=rows.__getitem__)
    sizes = [rows[i] for i in order]
    eager_ms = cost.eager.predict(sizes)
    predicted, steps = _cheapest_steps(sizes, budgets, max_batch_size, cost)
    graph_units = []
    eager_positions: list[int] = []
    for start, end, budget in steps:
        if budget is None:
            eager_positions.append(order[start])
            continue
        part = sizes[start:end]
        rows_sum = sum(part)
        ms = cost.graph.predict(budget, rows_sum, sum(r * r for r in part))
        graph_units.append(PlannedUnit(tuple(order[start:end]), budget, rows_sum, ms))
    if graph_units and predicted > eager_ms * (1.0 - cost.margin):
        graph_units, eager_positions, predicted = [], order, eager_ms
    units = graph_units
    if eager_positions:
        eager_rows = [rows[i] for i in eager_positions]
        units.append(
            PlannedUnit(
                tuple(eager_positions),
                None,
                sum(eager_rows),
                cost.eager.predict(eager_rows),
            )
        )
    return ExecutionPlan(tuple(units), predicted, eager_ms)


def _cheapest_steps(
    sizes: list[int],
    budgets: Sequence[int],
    max_batch_size: int,
    cost: CostModel,
) -> tuple[float, list[tuple[int, int, int | None]]]:
    """The dynamic program over sorted ``sizes``: its cost and its units as
    ``(start, end, budget)`` (``None``: one eager item), in order.

    State ``2·i + e``: the first ``i`` items are done and ``e`` says whether
    the eager call has items (its fixed cost is paid once). Each graph
    unit's cost is computed once per start and offered to both states; this
    runs on every execute, so it is written with plain lists.
    """
    n = len(sizes)
    largest = budgets[-1] if budgets else 0
    graph, eager = cost.graph, cost.eager
    replay, mbs = graph.replay_ms, graph.max_batch_size
    inf = float("inf")
    best = [inf] * (2 * n + 2)
    back: list[tuple[int, int | None]] = [(-1, None)] * (2 * n + 2)
    best[0] = 0.0
    for start in range(n):
        live = [s for s in (2 * start, 2 * start + 1) if best[s] < inf]
        if not live:
            continue
        segments = []
        rows = rows_sq = 0
        for end in range(start, min(n, start + max_batch_size)):
            rows += sizes[end]
            rows_sq += sizes[end] * sizes[end]
            if rows > largest:
                break
            budget = budgets[bisect_left(budgets, rows)]
            pad = budget - rows
            ms = (
                replay[budget]
                + graph.per_replay_ms
                + graph.per_row_sq_ms * (rows_sq - budget * budget / mbs)
                + graph.per_pad_sq_ms * pad * pad
            )
            segments.append((2 * (end + 1), budget, ms))
        item = eager.item_ms(sizes[start])
        for state in live:
            base = best[state]
            had_eager = state & 1
            ms = base + item + (0.0 if had_eager else eager.fixed_ms)
            if ms < best[2 * start + 3]:
                best[2 * start + 3], back[2 * start + 3] = ms, (state, None)
            for target, budget, unit_ms in segments:
                target += had_eager
                if base + unit_ms < best[target]:
                    best[target], back[target] = base + unit_ms, (state, budget)
    state = min(2 * n, 2 * n + 1, key=best.__getitem__)
    total = best[state]
    steps = []
    while state > 1:
        previous, budget = back[state]
        steps.append((previous // 2, state // 2, budget))
        state = previous
    return total, steps[::-1]


@dataclass
class ExecutionStats:
    """What cost-aware executes decided (the manager's
    ``get_execution_stats``)."""

    executes: int = 0
    plans: dict[str, int] = field(
        default_factory=lambda: {"graphs": 0, "mixed": 0, "eager": 0}
    )
    graph_units: int = 0
    eager_units: int = 0
    graph_items: int = 0
    eager_items: int = 0
    predicted_ms: float = 0.0
    predicted_eager_ms: float = 0.0
    """What running every execute eagerly was predicted to take."""
    last_plan: list[dict[str, object]] = field(default_factory=list)

    def record(self, plan: ExecutionPlan) -> None:
        self.executes += 1
        self.plans[plan.kind] += 1
        for unit in plan.units:
            if unit.budget is None:
                self.eager_units += 1
                self.eager_items += len(unit.positions)
            else:
                self.graph_units += 1
                self.graph_items += len(unit.positions)
        self.predicted_ms += plan.predicted_ms
        self.predicted_eager_ms += plan.eager_ms
        self.last_plan = [
            {
                "budget": u.budget,
                "items": len(u.positions),
                "rows": u.rows,
                "predicted_ms": u.predicted_ms,
            }
            for u in plan.units
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "executes": self.executes,
            "plans": dict(self.plans),
            "graph_units": self.graph_units,
            "eager_units": self.eager_units,
            "graph_items": self.graph_items,
            "eager_items": self.eager_items,
            "predicted_ms": self.predicted_ms,
            "predicted_eager_ms": self.predicted_eager_ms,
            "last_plan": list(self.last_plan),
        }


# ---------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EagerSample:
    """One timed eager call on items of ``rows``."""

    rows: tuple[int, ...]
    ms: float


@dataclass(frozen=True)
class GraphSample:
    """One timed graph unit: items of ``rows`` replayed at ``budget``."""

    budget: int
    rows: tuple[int, ...]
    ms: float


def fit_eager_cost(samples: Sequence[EagerSample]) -> EagerCost:
    """Non-negative least squares of :class:`EagerCost` on ``samples``
    (at least one)."""
    if not samples:
        raise ValueError("no eager samples to fit")
    features = [
        [1.0, len(s.rows), sum(s.rows), sum(r * r for r in s.rows)] for s in samples
    ]
    fixed, per_item, per_row, per_row_sq = fit_nonnegative(
        features, [s.ms for s in samples]
    )
    return EagerCost(fixed, per_item, per_row, per_row_sq)


def fit_graph_cost(
    replay_ms: Mapping[int, float],
    max_batch_size: int,
    samples: Sequence[GraphSample],
) -> GraphCost:
    """:class:`GraphCost` with the capture-time ``replay_ms`` and the other
    terms fitted (non-negative least squares) to what ``samples`` took
    beyond their budget's replay (zero without samples)."""
    if not samples:
        return GraphCost(dict(replay_ms), max_batch_size)
    features, targets = [], []
    for s in samples:
        rows = sum(s.rows)
        rows_sq = sum(r * r for r in s.rows)
        features.append(
            [
                1.0,
                rows_sq - s.budget * s.budget / max_batch_size,
                float((s.budget - rows) ** 2),
            ]
        )
        targets.append(s.ms - replay_ms[s.budget])
    per_replay, per_row_sq, per_pad_sq = fit_nonnegative(features, targets)
    return GraphCost(
        dict(replay_ms), max_batch_size, per_replay, per_row_sq, per_pad_sq
    )


def fit_nonnegative(
    features: Sequence[Sequence[float]], targets: Sequence[float]
) -> list[float]:
    """Least-squares coefficients ``>= 0`` of ``targets ~ features · c``.

    Exact for the few features used here: every subset of features is
    solved unconstrained (normal equations on scaled columns) and the best
    solution without negative coefficients wins (the all-zero one always
    qualifies). Singular subsets are skipped.
    """
    width = len(features[0]) if features else 0
    scale = [
        max((abs(f[j]) for f in features), default=0.0) or 1.0 for j in range(width)
    ]
    scaled = [[f[j] / scale[j] for j in range(width)] for f in features]
    best = [0.0] * width
    best_error = sum(t * t for t in targets)
    for size in range(1, width + 1):
        for subset in itertools.combinations(range(width), size):
            solution = _least_squares(scaled, targets, subset)
            if solution is None or min(solution) < 0:
                continue
            coef = [0.0] * width
            for j, value in zip(subset, solution):
                coef[j] = value
            error = sum(
                (t - sum(c * x for c, x in zip(coef, row))) ** 2
                for row, t in zip(scaled, targets)
            )
            if error < best_error * (1 - 1e-12):
                best, best_error = coef, error
    return [c / s for c, s in zip(best, scale)]


def _least_squares(
    rows: Sequence[Sequence[float]], targets: Sequence[float], subset: tuple[int, ...]
) -> list[float] | None:
    """Unconstrained least squares on the columns ``subset`` (``None`` when
    singular), by Gaussian elimination of the normal equations."""
    k = len(subset)
    a = [
        [sum(r[i] * r[j] for r in rows) for j in subset]
        + [sum(r[i] * t for r, t in zip(rows, targets))]
        for i in subset
    ]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12 * max(1.0, max(abs(v) for v in a[col])):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(k):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col])]
    return [a[i][k] / a[i][i] for i in range(k)]
