"""Calibration of the cost-aware manager inside vLLM
(``GEN_MIXIN_COST_MODEL=calibrate``).

Right after vLLM's capture, on the ladder it captured, the manager times:

1. each captured budget's replay, once (every budget must be priced);
2. then units of warm-up batches, smallest first, as the project's runtime
   manager does (``calibrate_cost_model``, ``docs/runtime.md``): each batch
   whole and each of its items alone as one eager call and, where it fits a
   budget, as a graph unit at its smallest fitting budget (and the next one,
   for a single item), each followed by that graph's replay alone.

A unit that would take the calibration past its bound
(``calibration_limit_ms``, the runtime's ``CALIBRATION_LIMIT_MS`` unless
set) is skipped, as in the runtime, and the fit extrapolates. What a unit
will take is estimated from the replay times, as the runtime does, and from
what the units before it took (:class:`_Estimate`): the bound holds as long
as a unit costs at most what it predicts, which a replay-bound or linear
cost does.

The warm-up batches are made by vLLM's own dummy-input builder, the one its
memory profiling uses: the largest image it profiles with, and that image
scaled down (:data:`SINGLE_SIDES`, :data:`GROUPS`), through the model's real
processor. No user data, no file.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from encoder_cudagraph_runtime.cost_aware import (
    CostModel,
    EagerSample,
    GraphSample,
    calibrated_cost_model,
)

#: Single-image batches: each side of vLLM's largest dummy image scaled by
#: these fractions (the rows scale by their squares).
SINGLE_SIDES = (0.125, 0.25, 0.5, 0.75, 1.0)
#: Batches of several images, ``(side fraction, count)`` each: small items
#: together, a large one with a small one (which tells a tower that encodes
#: item by item from a batched one) and a few large ones.
GROUPS = (
    ((0.25, 4),),
    ((0.125, 8),),
    ((0.5, 1), (1.0, 1)),
    ((0.75, 3),),
)
REPEATS = 2
"""Timed calls per unit (the fastest counts), after one untimed call."""


@dataclass
class CalibrationReport:
    """What one calibration timed, for the log and the tests."""

    replay_ms: dict[int, float]
    units: int = 0
    timed: list[tuple[int, ...]] = field(default_factory=list)
    """The rows of each timed unit, in the order timed."""
    skipped: int = 0
    device_ms: float = 0.0
    limit_ms: float = 0.0

    def summary(self) -> str:
        budgets = ", ".join(f"{b}: {ms:.3g} ms" for b, ms in self.replay_ms.items())
        return (
            f"replays of budgets {{{budgets}}}; {len(self.timed)} of {self.units} "
            f"units timed ({self.skipped} skipped to stay within "
            f"{self.limit_ms:.0f} ms); {self.device_ms:.0f} ms in all"
        )


@dataclass(frozen=True)
class _Unit:
    mm_kwargs: dict[str, Any]
    selection: list[int]
    rows: tuple[int, ...]


def dummy_batches(model_config: Any, device: torch.device) -> list[dict[str, Any]]:
    """Warm-up image batches made by vLLM's dummy-input builder for the
    model of ``model_config`` (:data:`SINGLE_SIDES`, :data:`GROUPS`)."""
    from vllm.config.multimodal import ImageDummyOptions
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.processing import TimingContext
    from vllm.multimodal.utils import group_and_batch_mm_kwargs

    processor = MULTIMODAL_REGISTRY.create_processor(model_config)
    seq_len = model_config.max_model_len
    largest = processor.dummy_inputs.get_dummy_mm_data(seq_len, {"image": 1}, {})
    width, height = largest["image"][0].size

    @functools.cache
    def item(side: float) -> Any:
        options = ImageDummyOptions(
            width=max(1, round(width * side)), height=max(1, round(height * side))
        )
        inputs = processor.get_dummy_inputs(seq_len, {"image": 1}, {"image": options})
        out = processor.apply(inputs, timing_ctx=TimingContext(enabled=False))
        return out["mm_kwargs"]["image"][0]

    groups = [((side, 1),) for side in SINGLE_SIDES] + list(GROUPS)
    batches = []
    for group in groups:
        items = [("image", item(side)) for side, count in group for _ in range(count)]
        batches += [
            batch for _, _, batch in group_and_batch_mm_kwargs(items, device=device)
        ]
    return batches


def calibrate(
    manager: Any,
    batches: Sequence[dict[str, Any]],
    limit_ms: float,
    clock: Callable[[], int],
) -> tuple[CostModel, CalibrationReport]:
    """The cost model of ``manager`` (a captured cost-aware manager) timed
    on ``batches`` within ``limit_ms`` of ``clock`` (nanoseconds)."""
    timer = _Timer(manager, clock)
    start = clock()
    report = CalibrationReport(replay_ms=timer.replays(), limit_ms=limit_ms)
    estimate = _Estimate(manager, report.replay_ms)
    eager: list[EagerSample] = []
    graph: list[GraphSample] = []
    units = _units(manager, batches)
    report.units = len(units)
    for unit in sorted(units, key=lambda u: sum(u.rows)):
        spent_ms = (clock() - start) / 1e6
        if spent_ms + estimate.unit_ms(unit) > limit_ms:
            report.skipped += 1
            continue
        eager.append(EagerSample(unit.rows, timer.eager(unit)))
        samples = timer.graph(unit)
        graph += samples
        estimate.learn(eager[-1], samples)
        report.timed.append(unit.rows)
    report.device_ms = (clock() - start) / 1e6
    model = calibrated_cost_model(
        report.replay_ms, manager.max_batch_size, eager, graph
    )
    return model, report


def _units(manager: Any, batches: Sequence[dict[str, Any]]) -> list[_Unit]:
    """Each batch whole and each of its items alone, once per distinct
    multiset of rows."""
    units = []
    seen: set[tuple[int, ...]] = set()
    for mm_kwargs in batches:
        specs = manager._get_item_specs(mm_kwargs)
        rows = [spec.get_path_output_tokens("default") for spec in specs]
        for selection in [list(range(len(specs)))] + [[i] for i in range(len(specs))]:
            key = tuple(sorted(rows[i] for i in selection))
            if selection and key not in seen:
                seen.add(key)
                units.append(_Unit(mm_kwargs, selection, key))
    return units


def _graph_budgets(manager: Any, unit: _Unit) -> list[int]:
    """The budgets ``unit`` is timed at as a graph unit (none when it fits
    no budget or has more items than a graph holds)."""
    budgets = sorted(manager.path_token_budgets["default"])
    first = bisect_left(budgets, sum(unit.rows))
    if len(unit.selection) > manager.max_batch_size:
        return []
    return budgets[first : first + (2 if len(unit.selection) == 1 else 1)]


class _Estimate:
    """What timing a unit will take: each call ``1 + REPEATS`` times, a
    graph unit as its replay times the largest ratio measured so far of a
    graph unit to its replay (host work and copies), followed by the replay
    alone; the eager call as the latest eager call per row (the units come
    smallest first), and at least as long as a replay of the unit's budget
    (above every budget: the largest's per row), the runtime's estimate."""

    def __init__(self, manager: Any, replay_ms: dict[int, float]) -> None:
        self.manager, self.replay_ms = manager, replay_ms
        self.graph_ratio = 1.0
        self.eager_ms_per_row = 0.0

    def unit_ms(self, unit: _Unit) -> float:
        calls = 1 + REPEATS
        graph_ms = sum(
            calls * (self.graph_ratio + 1) * self.replay_ms[b]
            for b in _graph_budgets(self.manager, unit)
        )
        rows = sum(unit.rows)
        budgets = sorted(self.replay_ms)
        budget = budgets[min(bisect_left(budgets, rows), len(budgets) - 1)]
        eager_ms = max(
            self.replay_ms[budget] * max(1.0, rows / budget),
            self.eager_ms_per_row * rows,
        )
        return graph_ms + calls * eager_ms

    def learn(self, eager: EagerSample, graph: list[GraphSample]) -> None:
        self.eager_ms_per_row = eager.ms / max(1, sum(eager.rows))
        for sample in graph:
            replay = self.replay_ms[sample.budget]
            if replay > 0:
                self.graph_ratio = max(self.graph_ratio, sample.ms / replay)


class _Timer:
    """Device-synchronised timings of a manager's units, its statistics
    left as they were."""

    def __init__(self, manager: Any, clock: Callable[[], int]) -> None:
        self.manager = manager
        self.clock = clock
        on_cuda = torch.device(manager.device).type == "cuda"
        self.sync = torch.cuda.synchronize if on_cuda else (lambda: None)

    def time_ms(self, fn: Callable[[], object], repeats: int = REPEATS) -> float:
        """Fastest of ``repeats`` calls of ``fn`` after one untimed call."""
        manager = self.manager
        hits, misses = manager.graph_hits, manager.graph_misses
        try:
            with torch.inference_mode():
                fn()
                best = math.inf
                for _ in range(repeats):
                    self.sync()
                    start = self.clock()
                    fn()
                    self.sync()
                    best = min(best, (self.clock() - start) / 1e6)
        finally:
            manager.graph_hits, manager.graph_misses = hits, misses
        return best

    def replays(self) -> dict[int, float]:
        graphs = self.manager._get_graph_set("default")
        return {
            budget: self.time_ms(graphs[budget].graph.replay, repeats=1)
            for budget in self.manager.path_token_budgets["default"]
        }

    def _run(self, unit: _Unit, budget: int | None) -> None:
        specs = self.manager._get_item_specs(unit.mm_kwargs)
        tokens = [spec.output_tokens for spec in specs]
        self.manager._run_unit(unit.mm_kwargs, unit.selection, budget, tokens, {})

    def eager(self, unit: _Unit) -> float:
        return self.time_ms(functools.partial(self._run, unit, None))

    def graph(self, unit: _Unit) -> list[GraphSample]:
        graphs = self.manager._get_graph_set("default")
        return [
            GraphSample(
                budget,
                unit.rows,
                self.time_ms(functools.partial(self._run, unit, budget)),
                self.time_ms(graphs[budget].graph.replay),
            )
            for budget in _graph_budgets(self.manager, unit)
        ]
