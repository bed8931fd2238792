"""Cost-aware execution: per execute, vLLM's packing, a cheaper plan, or eager.

vLLM's manager replays every batch that fits a budget. On large,
compute-bound images that can be slower than no graph at all: a batch of
540 tokens replays the 1024 budget, and the padding rows cost as much as
real ones (their attention too, when they form one trailing sequence). This
module decides, from measured costs, how to run one execute's items.

Three plans are priced by the :class:`CostModel`:

* **vLLM's packing** (:func:`~encoder_cudagraph_runtime.packing.pack_items`),
  what the manager does without this option;
* **all eager**: every item in one unpadded ``encoder_eager_forward`` call;
* **the cheapest plan** of a family that holds both: the items sorted by
  rows, a prefix cut into *graph units* (consecutive items replayed at
  their smallest fitting budget, at most ``max_batch_size`` each) and the
  rest, the largest items, in one eager call. Dynamic programming finds it.

:func:`plan_execution` keeps vLLM's packing unless the cheapest plan is
predicted faster by more than the model's own measured error
(``graph_error``, plus ``eager_error`` for the eager share of the plan), or
vLLM's packing is predicted slower than all-eager: no batch is planned
slower than no graphs, and a model error smaller than its measured size
does not move a batch off vLLM's behaviour.

The cost model is calibrated by the manager
(:meth:`~encoder_cudagraph_runtime.manager.EncoderCudaGraphManager.calibrate_cost_model`):
each captured graph's replay is timed at capture with its capture dummies
(:attr:`GraphCost.replay_ms`, exact per graph); timed graph units of
warm-up batches, each also replayed alone with the batch in its buffers,
fit the host work around a replay, the attention the real sequences
have beyond the dummies' and each sampled budget's own factor
(:func:`fit_graph_cost`); timed eager calls fit
:class:`EagerCost`, the larger of a host launch time and a device time
(:func:`fit_eager_cost`). Everything here is pure Python on numbers (no
torch), so it is tested with synthetic costs.

Rows are counted in the budget's unit (``EncoderItemSpec`` path tokens). The
squared terms model attention within each sequence; for encoders whose
budget unit is a fixed multiple of the attention rows (MiniMax M3, Qwen2-VL:
four input rows per output token) the factor folds into the fitted
coefficients.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from encoder_cudagraph_runtime.packing import pack_items

__all__ = [
    "CalibrationEstimate",
    "CostModel",
    "EagerCost",
    "EagerSample",
    "ExecutionPlan",
    "ExecutionStats",
    "GraphCost",
    "GraphSample",
    "PlannedUnit",
    "calibrated_cost_model",
    "crossover_rows",
    "fit_eager_cost",
    "fit_graph_cost",
    "fit_nonnegative",
    "held_out_graph_errors",
    "plan_execution",
    "relative_errors",
    "replay_cost_rows",
]


@dataclass(frozen=True)
class EagerCost:
    """Milliseconds of one ``encoder_eager_forward`` call (with its item
    selection and postprocess) on ``n`` items of ``rows_i`` rows.

    An eager forward launches hundreds of small kernels: for small items the
    host's launches are the bottleneck and the time hardly depends on rows;
    for large ones the device is. A sum of both terms would price small
    items at the device's few milliseconds instead of the launches' tens.
    Two forms take the larger of the two:

    * **batched** (``serial`` false), one forward over every item: the
      larger of the two sums, ``max(host_fixed + host_per_item·n, fixed +
      per_item·n + per_row·Σ rows_i + per_row_sq·Σ rows_i²)``;
    * **serial**, a forward per item whose host waits for the device within
      each item (DeepSeek-V4.1's tower): each item is bound on its own,
      ``fixed + Σ_i max(host_per_item, per_item + per_row·rows_i +
      per_row_sq·rows_i²)`` (``host_fixed`` unused). A small item after a
      large one then costs its launches, not the few device milliseconds
      the batched form would add: measured on the H200, a 1,566-patch image
      beside an 8,748-patch one added 20-30 ms, the batched fit 8.
    """

    fixed_ms: float = 0.0
    per_item_ms: float = 0.0
    per_row_ms: float = 0.0
    per_row_sq_ms: float = 0.0
    host_fixed_ms: float = 0.0
    host_per_item_ms: float = 0.0
    serial: bool = False

    def device_ms(self, items: int, rows: int, rows_sq: int) -> float:
        return (
            self.fixed_ms
            + self.per_item_ms * items
            + self.per_row_ms * rows
            + self.per_row_sq_ms * rows_sq
        )

    def host_ms(self, items: int) -> float:
        return self.host_fixed_ms + self.host_per_item_ms * items

    def item_ms(self, rows: int) -> float:
        """One item's share of a serial call (without the call's ``fixed``)."""
        device = (
            self.per_item_ms + self.per_row_ms * rows + self.per_row_sq_ms * rows * rows
        )
        return max(self.host_per_item_ms, device)

    def suffix_ms(self, sizes: Sequence[int]) -> list[float]:
        """``[predict(sizes[start:]) for start in 0 .. n]``, in one pass."""
        out = [0.0] * (len(sizes) + 1)
        items = rows = rows_sq = 0
        serial = 0.0
        for start in range(len(sizes) - 1, -1, -1):
            size = sizes[start]
            if self.serial:
                serial += self.item_ms(size)
                out[start] = self.fixed_ms + serial
                continue
            items, rows, rows_sq = items + 1, rows + size, rows_sq + size * size
            out[start] = max(self.host_ms(items), self.device_ms(items, rows, rows_sq))
        return out

    def predict(self, rows: Sequence[int]) -> float:
        """One call on items of ``rows`` (0 for no items)."""
        return self.suffix_ms(rows)[0]


@dataclass(frozen=True)
class GraphCost:
    """Milliseconds of one graph unit: the replay of ``budget`` with a batch
    of ``rows_i`` rows, plus the host work around it (replay buffers,
    copies, postprocess).

    ``budget_scale[budget] · (replay_ms[budget] + per_replay +
    per_row_sq·(Σ rows_i² − budget² / max_batch_size) +
    per_pad_sq·(budget − Σ rows_i)²)``: the replay was
    timed with ``max_batch_size`` capture dummies sharing the budget, so the
    real batch's attention is added and the dummies' taken off; the padding
    rows' own term is for mixins that make them one trailing sequence.
    """

    replay_ms: Mapping[int, float]
    max_batch_size: int
    per_replay_ms: float = 0.0
    per_row_sq_ms: float = 0.0
    per_pad_sq_ms: float = 0.0
    budget_scale: Mapping[int, float] = field(default_factory=dict)
    """Per budget, measured / predicted of the calibration's units at that
    budget (1 where none ran): what one attention coefficient for every
    budget misses (on the H200, MiniMax M3's 640 budget ran a 552-token
    image 4% slower than the fit, its 448 budget a 432-token one 6%
    faster)."""

    def predict(self, budget: int, rows: int, rows_sq: int) -> float:
        return self.budget_scale.get(budget, 1.0) * self.unscaled_ms(
            budget, rows, rows_sq
        )

    def unscaled_ms(self, budget: int, rows: int, rows_sq: int) -> float:
        """:meth:`predict` without :attr:`budget_scale`."""
        return (
            self.replay_ms[budget]
            + self.per_replay_ms
            + self.attention_ms(budget, rows, rows_sq)
        )

    def attention_ms(self, budget: int, rows: int, rows_sq: int) -> float:
        """What the batch's sequences (and its padding sequence) add to the
        replay timed with the capture dummies."""
        dummies_sq = budget * budget / self.max_batch_size
        pad = budget - rows
        return self.per_row_sq_ms * (rows_sq - dummies_sq) + self.per_pad_sq_ms * (
            pad * pad
        )


@dataclass(frozen=True)
class CostModel:
    graph: GraphCost
    eager: EagerCost
    graph_error: float = 0.03
    """Relative error of graph-unit predictions, as measured on the
    calibration samples (:func:`relative_errors`)."""
    eager_error: float = 0.05
    """Relative error of eager predictions, measured the same way."""

    def as_dict(self) -> dict[str, object]:
        graph = asdict(self.graph)
        graph["replay_ms"] = {str(b): ms for b, ms in self.graph.replay_ms.items()}
        graph["budget_scale"] = {
            str(b): scale for b, scale in self.graph.budget_scale.items()
        }
        return {
            "graph": graph,
            "eager": asdict(self.eager),
            "graph_error": self.graph_error,
            "eager_error": self.eager_error,
        }


@dataclass(frozen=True)
class PlannedUnit:
    """Items run together: a graph replay at ``budget``, or (``None``) one
    eager call."""

    positions: tuple[int, ...]
    """Positions in the rows given to :func:`plan_execution`."""
    budget: int | None
    rows: int
    predicted_ms: float


@dataclass(frozen=True)
class ExecutionPlan:
    units: tuple[PlannedUnit, ...]
    predicted_ms: float
    source: str
    """``"vllm"`` (vLLM's packing) or ``"cheapest"`` (the dynamic
    program's plan)."""
    vllm_ms: float
    """Predicted time of vLLM's packing."""
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
    sort_keys: Sequence[int] | None = None,
) -> ExecutionPlan:
    """The plan for items of ``rows`` (see the module docstring).

    ``budgets`` are the captured budgets, ascending; ``sort_keys`` the
    items' ``output_tokens``, vLLM's packing order (default: ``rows``).
    Items larger than every budget can only run eagerly.
    """
    vllm_units = _vllm_units(rows, sort_keys or rows, budgets, max_batch_size, cost)
    vllm_ms = sum(u.predicted_ms for u in vllm_units)
    cheapest_units = _cheapest_units(rows, budgets, max_batch_size, cost)
    cheapest_ms = sum(u.predicted_ms for u in cheapest_units)
    eager_ms = cost.eager.predict(rows)
    eager_share = (
        sum(u.predicted_ms for u in cheapest_units if u.budget is None) / cheapest_ms
        if cheapest_ms > 0
        else 0.0
    )
    margin = cost.graph_error + cost.eager_error * eager_share
    if vllm_ms > eager_ms or cheapest_ms < vllm_ms * (1.0 - margin):
        return ExecutionPlan(cheapest_units, cheapest_ms, "cheapest", vllm_ms, eager_ms)
    return ExecutionPlan(vllm_units, vllm_ms, "vllm", vllm_ms, eager_ms)


def replay_cost_rows(graph: GraphCost) -> int:
    """What one replay costs in padded rows: ``gen-mixin plan``'s
    ``tuning.replay_cost_rows``, measured. The smallest graph's replay plus
    the host work around one (``per_replay_ms``), over the time of one
    padded row between the two largest graphs.

    A padded row is a zero-length sequence's: it runs the tower's per-row
    layers, not attention. The capture dummies' attention
    (``max_batch_size`` sequences sharing each budget, ``per_row_sq_ms``
    per squared row) grows with the budget too, so it is taken off that
    growth first. Issue #27: left in, it priced DeepSeek-V4.1's padded row
    at 4.5 us instead of 3.1 on an H100 and a replay at 836 rows instead of
    about 1,230; the tuner then split an 8-image batch into seven replays
    (350 ms) to save rows that one replay of 57,344 pads (328 ms). With one
    graph (or no growth left to measure): the smallest budget."""
    budgets = sorted(graph.replay_ms)
    if len(budgets) < 2:
        return budgets[0]
    low, half, high = budgets[0], budgets[-2], budgets[-1]
    dummies = graph.per_row_sq_ms * (high * high - half * half) / graph.max_batch_size
    growth = graph.replay_ms[high] - graph.replay_ms[half] - dummies
    if growth <= 0:
        return low
    per_row = growth / (high - half)
    return round((graph.replay_ms[low] + graph.per_replay_ms) / per_row)


#: Items a batch at the crossover is split into: equal items of
#: ``budget / n`` rows each (a photo, a pair, a page of screenshots, ...).
CROSSOVER_SPLITS = (1, 2, 4, 8, 16)


def crossover_rows(
    cost: CostModel, splits: Sequence[int] = CROSSOVER_SPLITS
) -> dict[int, int | None]:
    """Per number of items ``n`` in ``splits``, the rows per batch from
    which a graph stops paying: the smallest captured budget ``b`` such
    that at ``b`` and every larger budget, ``n`` equal items filling ``b``
    (no padding: the exact-shape graph) are predicted no faster replayed
    than in one eager call. ``None`` where the graph still pays at the
    largest budget. ``max`` of the values (when none is ``None``) is where
    every split loses: budgets above it can only lose."""
    budgets = sorted(cost.graph.replay_ms)
    out: dict[int, int | None] = {}
    for n in splits:
        start: int | None = None
        for budget in budgets:
            part = [budget // n] * n
            part[0] += budget - sum(part)
            graph = cost.graph.predict(budget, budget, sum(r * r for r in part))
            loses = graph >= cost.eager.predict(part)
            start = (start or budget) if loses else None
        out[n] = start
    return out


def _graph_unit(
    positions: tuple[int, ...], budget: int, part: Sequence[int], cost: CostModel
) -> PlannedUnit:
    rows = sum(part)
    ms = cost.graph.predict(budget, rows, sum(r * r for r in part))
    return PlannedUnit(positions, budget, rows, ms)


def _eager_unit(
    positions: tuple[int, ...], part: Sequence[int], cost: CostModel
) -> PlannedUnit:
    return PlannedUnit(positions, None, sum(part), cost.eager.predict(part))


def _vllm_units(
    rows: Sequence[int],
    sort_keys: Sequence[int],
    budgets: Sequence[int],
    max_batch_size: int,
    cost: CostModel,
) -> tuple[PlannedUnit, ...]:
    """vLLM's packing as units: oversized batches are eager calls."""
    if not rows:
        return ()
    units = []
    for batch in pack_items([rows], sort_keys, [budgets], max_batch_size):
        positions = tuple(batch.indices)
        part = [rows[i] for i in positions]
        budget = batch.path_budgets[0]
        if budget is None:
            units.append(_eager_unit(positions, part, cost))
        else:
            units.append(_graph_unit(positions, budget, part, cost))
    return tuple(units)


def _cheapest_units(
    rows: Sequence[int],
    budgets: Sequence[int],
    max_batch_size: int,
    cost: CostModel,
) -> tuple[PlannedUnit, ...]:
    """The cheapest graph prefix + eager suffix of the items sorted by rows.

    ``best[i]``: the cheapest graph units for the first ``i`` sorted items
    (a unit is consecutive items at their smallest fitting budget); each
    suffix runs in one eager call, priced from suffix sums. This runs on
    every execute, so it is written with plain lists.
    """
    n = len(rows)
    order = sorted(range(n), key=rows.__getitem__)
    sizes = [rows[i] for i in order]
    largest = budgets[-1] if budgets else 0
    graph = cost.graph
    inf = math.inf
    best = [inf] * (n + 1)
    back = [(0, 0)] * (n + 1)
    best[0] = 0.0
    for end in range(1, n + 1):
        total = total_sq = 0
        for start in range(end - 1, max(-1, end - 1 - max_batch_size), -1):
            total += sizes[start]
            total_sq += sizes[start] * sizes[start]
            if total > largest:
                break
            if best[start] == inf:
                continue
            budget = budgets[bisect_left(budgets, total)]
            ms = best[start] + graph.predict(budget, total, total_sq)
            if ms < best[end]:
                best[end], back[end] = ms, (start, budget)
    split, split_ms = 0, inf
    tails = cost.eager.suffix_ms(sizes)
    for start in range(n, -1, -1):  # on a tie, more items in graphs
        ms = best[start] + tails[start]
        if ms < split_ms:
            split, split_ms = start, ms
    units = []
    end = split
    while end > 0:
        start, budget = back[end]
        part = sizes[start:end]
        units.append(_graph_unit(tuple(order[start:end]), budget, part, cost))
        end = start
    units.reverse()
    if split < n:
        units.append(_eager_unit(tuple(order[split:]), sizes[split:], cost))
    return tuple(units)


@dataclass
class ExecutionStats:
    """What cost-aware executes decided (the manager's
    ``get_execution_stats``)."""

    executes: int = 0
    plans: dict[str, int] = field(
        default_factory=lambda: {"graphs": 0, "mixed": 0, "eager": 0}
    )
    sources: dict[str, int] = field(default_factory=lambda: {"vllm": 0, "cheapest": 0})
    graph_units: int = 0
    eager_units: int = 0
    graph_items: int = 0
    eager_items: int = 0
    predicted_ms: float = 0.0
    predicted_vllm_ms: float = 0.0
    """What vLLM's packing of every execute was predicted to take."""
    predicted_eager_ms: float = 0.0
    """What running every execute eagerly was predicted to take."""
    last_plan: dict[str, object] = field(default_factory=dict)

    def record(self, plan: ExecutionPlan) -> None:
        self.executes += 1
        self.plans[plan.kind] += 1
        self.sources[plan.source] += 1
        for unit in plan.units:
            if unit.budget is None:
                self.eager_units += 1
                self.eager_items += len(unit.positions)
            else:
                self.graph_units += 1
                self.graph_items += len(unit.positions)
        self.predicted_ms += plan.predicted_ms
        self.predicted_vllm_ms += plan.vllm_ms
        self.predicted_eager_ms += plan.eager_ms
        self.last_plan = {
            "source": plan.source,
            "kind": plan.kind,
            "predicted_ms": plan.predicted_ms,
            "vllm_ms": plan.vllm_ms,
            "eager_ms": plan.eager_ms,
            "units": [
                {
                    "budget": u.budget,
                    "items": len(u.positions),
                    "rows": u.rows,
                    "predicted_ms": u.predicted_ms,
                }
                for u in plan.units
            ],
        }

    def as_dict(self) -> dict[str, object]:
        return {
            "executes": self.executes,
            "plans": dict(self.plans),
            "sources": dict(self.sources),
            "graph_units": self.graph_units,
            "eager_units": self.eager_units,
            "graph_items": self.graph_items,
            "eager_items": self.eager_items,
            "predicted_ms": self.predicted_ms,
            "predicted_vllm_ms": self.predicted_vllm_ms,
            "predicted_eager_ms": self.predicted_eager_ms,
            "last_plan": dict(self.last_plan),
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
    """One timed graph unit: items of ``rows`` replayed at ``budget``,
    ``ms`` for the whole unit and ``replay_ms`` for the replay alone with
    the batch in the graph's buffers (``None`` when not timed)."""

    budget: int
    rows: tuple[int, ...]
    ms: float
    replay_ms: float | None = None


_DEVICE_FEATURES = 4  # 1, n, Σr, Σr²
_HOST_FEATURES = 2  # 1, n


def _eager_features(rows: Sequence[int]) -> list[float]:
    return [1.0, float(len(rows)), float(sum(rows)), float(sum(r * r for r in rows))]


def fit_eager_cost(
    samples: Sequence[EagerSample],
    slow_trim: float | None = 0.15,
    serial: bool | None = None,
    declared_serial: bool = False,
) -> EagerCost:
    """:class:`EagerCost` fitted to ``samples`` (at least one), minimising
    the summed squared *relative* error, then refitted without the samples
    more than ``slow_trim`` slower than the fit (``None``: keep all).

    ``serial``: force that form. Else (``None``) both forms are fitted and
    the one with the smaller error on the samples both kept wins. Which one
    a tower follows shows only in samples of several items of different
    sizes (:func:`_samples_tell_forms_apart`); without any, or on a tie,
    ``declared_serial`` decides: whether the tower declares it encodes
    item by item (issue #27: DeepSeek-V4.1's calibration, cut by its time
    limit, had none; the batched form won the tie and priced a photo with
    a thumbnail 12-21% under its serial time on the H200). The
    declaration says how the tower runs, not how its host overlaps the
    device: on run J's H100 the same tower's launches of a small item hid
    behind a large item's device time (a 1,680-patch image added 7 ms
    beside an 8,748-patch one, 17 ms alone), which the batched form
    prices and the serial one does not; forced serial, the fit priced
    batches of large images 3-7% low and the planner ran two of them
    eagerly, slower than vLLM's packing.

    Batched form: the samples, in ascending rows, are split into a
    host-bound head and a device-bound tail at every point; each part gets
    its non-negative least squares, each sample then goes to the term that
    predicts it higher and both are refitted until that settles. Serial
    form: every item size splits the items into host-bound (smaller) and
    device-bound ones. The split with the smallest error wins. Relative
    errors, because the decisions compare plans of the same batch, and a
    20 ms batch matters as much as a 600 ms one.

    The trimming is for hosts whose launch speed comes in modes (on a
    shared or virtualised host the same eager call can take 20 ms for a
    while, then 35): the fit follows the fast mode, which eager reaches
    whenever the host is quick, so that graphs are planned only where they
    beat it. At least half the samples are kept.
    """
    if not samples:
        raise ValueError("no eager samples to fit")
    if serial is not None:
        form = _fit_serial_splits if serial else _fit_eager_splits
        return _trimmed_fit(samples, form, slow_trim)[0]
    fits = [
        _trimmed_fit(samples, fit, slow_trim)
        for fit in (_fit_eager_splits, _fit_serial_splits)
    ]
    batched, serial_fit = fits[0][0], fits[1][0]
    if not _samples_tell_forms_apart(samples):
        return serial_fit if declared_serial else batched
    both = [s for s in fits[0][1] if s in fits[1][1]] or list(samples)
    batched_error, serial_error = (
        _relative_sse([cost.predict(s.rows) for s in both], both) for cost, _ in fits
    )
    if serial_error < batched_error * (1 - 1e-9):
        return serial_fit
    if batched_error < serial_error * (1 - 1e-9):
        return batched
    return serial_fit if declared_serial else batched


def _samples_tell_forms_apart(samples: Sequence[EagerSample]) -> bool:
    """Whether some sample has items of different sizes: on single items
    and on equal items both forms can fit the same times."""
    return any(len(set(s.rows)) > 1 for s in samples)


def _trimmed_fit(
    samples: Sequence[EagerSample],
    fit: Callable[[Sequence[EagerSample]], EagerCost],
    slow_trim: float | None,
) -> tuple[EagerCost, list[EagerSample]]:
    """``fit`` refitted without the slow samples (see
    :func:`fit_eager_cost`), with the samples it kept."""
    kept = list(samples)
    cost = fit(kept)
    while slow_trim is not None:
        fast = [s for s in kept if s.ms <= cost.predict(s.rows) * (1 + slow_trim)]
        if len(fast) == len(kept) or 2 * len(fast) < len(samples):
            break
        kept = fast
        cost = fit(kept)
    return cost, kept


def _fit_serial_splits(samples: Sequence[EagerSample]) -> EagerCost:
    """The best host/device split of the serial form: items smaller than a
    threshold are host-bound (``host_per_item`` each), the others pay the
    device terms; every item size (and none) is tried."""
    best: EagerCost | None = None
    best_error = math.inf
    for threshold in sorted({r for s in samples for r in s.rows}) + [math.inf]:
        features = []
        for s in samples:
            device = [r for r in s.rows if r >= threshold]
            features.append(
                [1.0, float(len(s.rows) - len(device))] + _eager_features(device)[1:]
            )
        c = _fit_relative(features, samples)
        cost = EagerCost(c[0], c[2], c[3], c[4], 0.0, c[1], serial=True)
        error = _relative_sse([cost.predict(s.rows) for s in samples], samples)
        if error < best_error * (1 - 1e-9):
            best, best_error = cost, error
    assert best is not None
    return best


def _fit_eager_splits(samples: Sequence[EagerSample]) -> EagerCost:
    """The best host/device split of :func:`fit_eager_cost`."""
    ordered = sorted(samples, key=lambda s: (sum(s.rows), len(s.rows)))
    best: EagerCost | None = None
    best_error = math.inf
    for split in range(len(ordered) + 1):
        host_part = set(range(split))
        for _ in range(8):
            cost = _fit_eager_parts(ordered, host_part)
            moved = {
                i
                for i, s in enumerate(ordered)
                if cost.host_ms(len(s.rows))
                > cost.device_ms(len(s.rows), sum(s.rows), sum(r * r for r in s.rows))
            }
            if moved == host_part:
                break
            host_part = moved
        error = _relative_sse([cost.predict(s.rows) for s in ordered], ordered)
        if error < best_error * (1 - 1e-9):
            best, best_error = cost, error
    assert best is not None
    return best


def _fit_eager_parts(samples: Sequence[EagerSample], host_part: set[int]) -> EagerCost:
    device = [s for i, s in enumerate(samples) if i not in host_part]
    host = [s for i, s in enumerate(samples) if i in host_part]
    d = [0.0] * _DEVICE_FEATURES
    h = [0.0] * _HOST_FEATURES
    if device:
        d = _fit_relative([_eager_features(s.rows) for s in device], device)
    if host:
        h = _fit_relative([[1.0, float(len(s.rows))] for s in host], host)
    return EagerCost(d[0], d[1], d[2], d[3], h[0], h[1])


def _fit_relative(
    features: Sequence[Sequence[float]], samples: Sequence[EagerSample]
) -> list[float]:
    """Non-negative least squares of ``features · c ≈ ms`` in relative
    error (each row divided by its ``ms``)."""
    scaled = [[f / s.ms for f in row] for row, s in zip(features, samples)]
    return fit_nonnegative(scaled, [1.0] * len(samples))


def _relative_sse(predicted: Sequence[float], samples: Sequence[EagerSample]) -> float:
    return sum(((p - s.ms) / s.ms) ** 2 for p, s in zip(predicted, samples))


def fit_graph_cost(
    replay_ms: Mapping[int, float],
    max_batch_size: int,
    samples: Sequence[GraphSample],
) -> GraphCost:
    """:class:`GraphCost` with the capture-time ``replay_ms`` and the other
    terms fitted to ``samples`` (zero without samples).

    Non-negative least squares in relative error over two kinds of rows:
    each unit's time beyond its budget's capture-time replay is
    ``per_replay + attention``, and each replay alone with the batch in the
    buffers (where timed) is ``attention`` only, which pins the attention
    coefficients apart from the host work. Then each budget with units
    gets :attr:`GraphCost.budget_scale` from them (:func:`_budget_scale`).
    """
    if not samples:
        return GraphCost(dict(replay_ms), max_batch_size)
    features, targets = [], []
    for s in samples:
        rows = sum(s.rows)
        attention = [
            sum(r * r for r in s.rows) - s.budget * s.budget / max_batch_size,
            float((s.budget - rows) ** 2),
        ]
        base = replay_ms[s.budget]
        timed = [(1.0, s.ms)] + ([(0.0, s.replay_ms)] if s.replay_ms else [])
        for host, ms in timed:
            features.append([host / ms] + [a / ms for a in attention])
            targets.append((ms - base) / ms)
    per_replay, per_row_sq, per_pad_sq = fit_nonnegative(features, targets)
    fitted = GraphCost(
        dict(replay_ms), max_batch_size, per_replay, per_row_sq, per_pad_sq
    )
    scales = {b: _budget_scale(fitted, samples, b) for b in {s.budget for s in samples}}
    return dataclasses.replace(fitted, budget_scale=scales)


#: Bounds of a budget's correction: a few samples set it, the fastest of a
#: couple of timings each, so one outlier must not price a budget off.
BUDGET_SCALE_RANGE = (0.85, 1.2)


def _budget_scale(
    cost: GraphCost, samples: Sequence[GraphSample], budget: int, skip: int = -1
) -> float:
    """Median measured / :meth:`GraphCost.unscaled_ms` of the units at
    ``budget`` (without ``samples[skip]``), within
    :data:`BUDGET_SCALE_RANGE`; 1 without such units."""
    ratios = [
        s.ms / cost.unscaled_ms(s.budget, sum(s.rows), sum(r * r for r in s.rows))
        for i, s in enumerate(samples)
        if s.budget == budget and i != skip
    ]
    if not ratios:
        return 1.0
    low, high = BUDGET_SCALE_RANGE
    return min(high, max(low, statistics.median(ratios)))


def held_out_graph_errors(
    cost: GraphCost, samples: Sequence[GraphSample]
) -> list[float]:
    """``|predicted / measured − 1|`` of each unit of ``samples`` (those
    ``cost`` was fitted on), its budget's correction taken from the other
    units at that budget: a unit alone at its budget is predicted
    uncorrected, so the error is not the fit's own echo."""
    errors = []
    for i, s in enumerate(samples):
        rows, rows_sq = sum(s.rows), sum(r * r for r in s.rows)
        scale = _budget_scale(cost, samples, s.budget, skip=i)
        errors.append(abs(scale * cost.unscaled_ms(s.budget, rows, rows_sq) / s.ms - 1))
    return errors


#: The quantile of a model's relative errors that prices it
#: (:attr:`CostModel.graph_error` and ``eager_error``): a high one, since a
#: plan pays for its worst misses.
ERROR_QUANTILE = 0.9


def relative_errors(
    cost: CostModel,
    eager: Sequence[EagerSample],
    graph: Sequence[GraphSample],
    quantile: float = ERROR_QUANTILE,
) -> tuple[float, float]:
    """``(graph, eager)``: the ``quantile`` of ``|predicted / measured − 1|``
    over the graph units and the eager calls of the samples (0 for none)."""

    graph_errors = [
        abs(
            cost.graph.predict(s.budget, sum(s.rows), sum(r * r for r in s.rows)) / s.ms
            - 1
        )
        for s in graph
    ]
    eager_errors = [abs(cost.eager.predict(s.rows) / s.ms - 1) for s in eager]
    return _quantile(graph_errors, quantile), _quantile(eager_errors, quantile)


def _quantile(values: Sequence[float], quantile: float) -> float:
    """The ``quantile`` of ``values`` (0 for none), an element of them."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)]


def calibrated_cost_model(
    replay_ms: Mapping[int, float],
    max_batch_size: int,
    eager: Sequence[EagerSample],
    graph: Sequence[GraphSample],
    *,
    reuse_eager: CostModel | None = None,
    declared_serial: bool = False,
    error_floor: float = 0.02,
    error_cap: float = 0.25,
) -> CostModel:
    """Fit both costs (the eager one taken from ``reuse_eager`` when given,
    with its error; else of the form the samples show, the serial one
    where they cannot tell and ``declared_serial``, see
    :func:`fit_eager_cost`) and measure their errors on
    the same samples, each error kept within ``[error_floor, error_cap]``:
    a floor, because the samples are few and the fit saw them; a cap, so
    that one noisy sample does not pin every batch to vLLM's packing."""
    eager_cost = (
        fit_eager_cost(eager, declared_serial=declared_serial)
        if reuse_eager is None
        else reuse_eager.eager
    )
    model = CostModel(fit_graph_cost(replay_ms, max_batch_size, graph), eager_cost)
    if reuse_eager is None:
        _, eager_error = relative_errors(model, eager, [])
    else:
        eager_error = reuse_eager.eager_error
    graph_error = _quantile(held_out_graph_errors(model.graph, graph), ERROR_QUANTILE)

    def bounded(error: float) -> float:
        return min(error_cap, max(error_floor, error))

    return CostModel(
        model.graph, eager_cost, bounded(graph_error), bounded(eager_error)
    )


@dataclass(frozen=True)
class CalibrationEstimate:
    """What calibration's next timed calls will take, from the calls timed
    so far (before any, the capture's replay times), so that calibration
    stops before a call would pass its time limit.

    Issue #27: the capture's replay times alone priced Qwen2-VL's one
    10,738-token image at its 16384 budget's replay with the capture
    dummies, 294 ms; it ran 1,365 ms (one long sequence's attention), and
    its eager call 1,277 ms: calibration took 17-19 s against a 10 s
    limit. Here a graph unit is priced by the graph cost fitted to the
    units timed so far (its attention term included, never below the
    budget's replay) and an eager call by the larger of the same device
    time and the fastest host time per item measured so far.
    """

    graph: GraphCost
    host_per_item_ms: float = 0.0

    @classmethod
    def of(
        cls,
        replay_ms: Mapping[int, float],
        max_batch_size: int,
        eager: Sequence[EagerSample],
        graph: Sequence[GraphSample],
    ) -> CalibrationEstimate:
        fitted = fit_graph_cost(replay_ms, max_batch_size, graph)
        per_item = min((s.ms / len(s.rows) for s in eager if s.rows), default=0.0)
        return cls(fitted, per_item)

    def graph_unit_ms(self, budget: int, rows: Sequence[int]) -> float:
        """A graph unit of items of ``rows`` replayed at ``budget``."""
        rows_sq = sum(r * r for r in rows)
        fitted = self.graph.unscaled_ms(budget, sum(rows), rows_sq)
        return max(self.graph.replay_ms[budget], fitted)

    def eager_ms(self, rows: Sequence[int]) -> float:
        """One eager call on items of ``rows``: the replay of the smallest
        budget that holds them (the largest, scaled by rows, above it) plus
        the attention their sequences add, or the host's launches."""
        budgets = sorted(self.graph.replay_ms)
        total = sum(rows)
        budget = budgets[min(bisect_left(budgets, total), len(budgets) - 1)]
        dummies_sq = budget * budget / self.graph.max_batch_size
        attention = self.graph.per_row_sq_ms * (sum(r * r for r in rows) - dummies_sq)
        device = self.graph.replay_ms[budget] * max(1.0, total / budget)
        return max(device + max(0.0, attention), self.host_per_item_ms * len(rows))


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
