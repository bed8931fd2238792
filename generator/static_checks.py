"""Arithmetic a spec implies, checked without a GPU.

The checks evaluate the spec's formulas (never ``eval``: see
:func:`generator.formulas.evaluate`) with the constants' ``default`` values,
the released model's, over a grid of budgets and batch sizes: sampled ones,
every budget of the ladder vLLM builds for the released config (the
spec's range at vLLM's default scheduler limits), and those ``gen-mixin
plan`` is given or computes. Checks whose
formulas mention a constant without a default are skipped here; ``gen-mixin
plan`` runs them with values given on the command line. A value beyond int64
is no skip: no tensor size or count holds it, so it is reported at the field
whose formula computed it (:class:`OutOfRange`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

from encoder_cudagraph_runtime.budget_ladder import generate_budgets
from generator.formulas import (
    BinOp,
    DivisionByZero,
    EvaluationError,
    Expr,
    Func,
    Ref,
    ValueOutOfRange,
    evaluate,
    names_in,
    walk,
)
from generator.limits import MAX_DUMMY_UNITS
from generator.padded_coverage import padded_problems, padded_tensors
from generator.spec.capture import (
    ITEM_BOUND,
    Buffer,
    Capture,
    CaptureAssert,
    bounded_buffer,
    capture_value_field,
    set_by_expr,
)
from generator.spec.enums import Modality, PadRule, Rounding
from generator.spec.host import Constant, Size
from generator.spec.inputs import FlatInput, ItemInput
from generator.spec.items import Items
from generator.unit_coverage import ItemPoint, envelope, most_rows

#: Budgets and batch sizes every spec is checked at (with its released
#: ladder's and plan's: :func:`with_checked_grid`).
SAMPLE_BUDGETS = (64, 100, 128, 257, 1000, 1024, 4096, 8192, 16384)
SAMPLE_BATCH_SIZES = (1, 2, 3, 5, 7, 8, 16, 64)


@dataclass(frozen=True)
class Arithmetic:
    """The parts of a spec its arithmetic depends on (a MixinSpec has them
    all; validation builds one from whatever resolved, so the checks run even
    when other parts of the spec have problems)."""

    constants: tuple[Constant, ...]
    item_inputs: tuple[ItemInput, ...]
    capture: Capture
    items: Items
    buffers: tuple[Buffer, ...]
    sizes: tuple[Size, ...] = ()
    # False when items.graph_rows or items.budget_tokens was given but did
    # not resolve: the coverage checks would run on the wrong defaults.
    items_resolved: bool = True
    #: The spec captures videos (max_frames_per_batch may exceed the items).
    video: bool = False
    axes: tuple = ()  # the spec's capture axes
    budget_min: Expr | None = None
    budget_max: Expr | None = None
    #: The path's own smallest budget (``paths.<name>.min_token_budget``).
    path_min: Expr | None = None
    #: The budgets and batch sizes the checks run at: the samples here;
    #: :func:`capture_problems` adds the released ladder and plan's.
    budgets: tuple[int, ...] = SAMPLE_BUDGETS
    batch_sizes: tuple[int, ...] = SAMPLE_BATCH_SIZES

    @classmethod
    def of(cls, spec, path=None) -> Arithmetic:
        """The arithmetic of one path of ``spec`` (its first by default)."""
        path = path if path is not None else spec.paths[0]
        return cls(
            spec.constants,
            spec.item_inputs,
            path.capture,
            spec.items.on_path(path.output_tokens),
            path.buffers,
            spec.sizes,
            video=Modality.VIDEO in spec.modalities,
            axes=spec.capture_axes,
            budget_min=spec.budget.min,
            budget_max=spec.budget.max,
            path_min=path.min_token_budget,
        )

    @property
    def size_env(self) -> dict[str, int]:
        return {s.name: s.value for s in self.sizes}


class FormulaRefused(Exception):
    """A formula that fails at checked values in a way no skip may hide,
    with the field it is written at. Not an :class:`EvaluationError`: the
    checks skip those (a value they do not know), and must not skip this."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class OutOfRange(FormulaRefused):
    """A formula's value beyond int64 at checked values."""

    def __init__(self, field: str, exc: ValueOutOfRange) -> None:
        super().__init__(
            field,
            f"evaluates beyond int64 at the sampled budgets, batch sizes and dims "
            f"({exc}): no tensor size or count holds it",
        )


class ZeroDivisor(FormulaRefused):
    """A formula that divides by zero at checked values: the generated code
    would raise ``ZeroDivisionError`` there (at capture, for a budget)."""

    def __init__(self, field: str, expr: Expr, scope: Mapping[str, int]) -> None:
        shown = [n for n in ("token_budget", "max_batch_size") if n in scope]
        shown += sorted(n for n in names_in(expr) if n in scope and n not in shown)
        values = ", ".join(f"{n}={scope[n]}" for n in shown)
        super().__init__(
            field,
            f"divides by zero at {values or 'the values checked'}: the generated "
            "code would raise ZeroDivisionError there",
        )


def value_at(field: str, expr: Expr, scope: Mapping[str, int]) -> int:
    """``evaluate(expr, scope)``; a value beyond int64 raises
    :class:`OutOfRange` at ``field``, a division by zero
    :class:`ZeroDivisor`."""
    try:
        return evaluate(expr, scope)
    except ValueOutOfRange as exc:
        raise OutOfRange(field, exc) from None
    except DivisionByZero:
        raise ZeroDivisor(field, expr, scope) from None


# vLLM's defaults for the two limits that bound the largest budget (the
# released config's); the standalone runtime's config uses the same.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_MODEL_LEN = 8192


def released_ladder(ir: Arithmetic, env: Mapping[str, int]) -> tuple[list[int], int]:
    """The budgets vLLM captures for the released config (the spec's range
    at the default scheduler limits, no user budgets), the path's own
    doubling from its smallest budget too, and the batch size it resolves;
    ``([], 0)`` when the range needs a value without a default or is one
    the manager refuses (``budget_range_problems`` reports it)."""
    if ir.budget_min is None:
        return [], 0
    limits = {
        "max_num_batched_tokens": DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "max_model_len": DEFAULT_MAX_MODEL_LEN,
    }
    try:
        lo = evaluate(ir.budget_min, env)
        hi = (
            min(limits.values())
            if ir.budget_max is None
            else evaluate(ir.budget_max, {**env, **limits})
        )
        smallest = evaluate(ir.path_min, env) if ir.path_min is not None else None
    except EvaluationError:
        return [], 0
    if not 0 < lo <= hi:
        return [], 0
    ladder = generate_budgets(lo, hi)
    if smallest is not None and 0 < smallest <= hi:
        ladder += generate_budgets(smallest, ladder[-1])
    return ladder, min(hi // lo, lo)


def with_checked_grid(
    ir: Arithmetic,
    env: Mapping[str, int],
    budgets: tuple[int, ...] = (),
    batch_sizes: tuple[int, ...] = (),
) -> Arithmetic:
    """``ir`` to be checked at the sampled budgets and batch sizes, every
    budget of the released ladder and its batch size (vLLM's default ladder
    doubles from the smallest budget: 256, 512 and 2048 are none of the
    samples), and ``budgets`` and ``batch_sizes`` (``plan``'s)."""
    ladder, mbs = released_ladder(ir, env)
    extra_sizes = (mbs,) if mbs > 0 else ()
    return replace(
        ir,
        budgets=tuple(sorted({*SAMPLE_BUDGETS, *ladder, *budgets})),
        batch_sizes=tuple(sorted({*SAMPLE_BATCH_SIZES, *extra_sizes, *batch_sizes})),
    )


def constant_env(
    ir: Arithmetic, overrides: Mapping[str, int] | None = None
) -> dict[str, int]:
    env: dict[str, int] = {}
    for const in ir.constants:
        if overrides and const.name in overrides:
            env[const.name] = int(overrides[const.name])
        elif const.default is not None:
            env[const.name] = const.default
    return env


def per_item_tokens(
    budget: int, max_batch_size: int, rounding: Rounding = Rounding.CEIL
) -> int:
    """k: the tokens of each dummy item, ``budget / max_batch_size`` rounded
    as the spec says (ceiling: the dummy batch covers the budget)."""
    if rounding is Rounding.FLOOR:
        return budget // max_batch_size
    return -(-budget // max_batch_size)


def capture_names(
    ir: Arithmetic, env: Mapping[str, int], budget: int, mbs: int, mfpb: int = 0
) -> dict[str, int]:
    """The names the capture binds before its dummy batch, for one budget:
    ``k``, the manager's arguments, ``frames_per_item`` and the
    ``capture.let`` intermediates, in order (raises EvaluationError,
    OutOfRange)."""
    scope = dict(env)
    scope.update(
        k=per_item_tokens(budget, mbs, ir.capture.rounding),
        max_batch_size=mbs,
        token_budget=budget,
        max_frames_per_batch=mfpb,
        frames_per_item=max(mfpb // mbs, 1),
    )
    for let in ir.capture.lets:
        scope[let.name] = value_at(f"capture.let.{let.name}", let.expr, scope)
    return scope


def capture_scope(
    ir: Arithmetic,
    env: Mapping[str, int],
    budget: int,
    mbs: int,
    mfpb: int,
    rows: int,
) -> dict[str, int]:
    """The names a capture-time formula may use, for one budget."""
    return {**capture_names(ir, env, budget, mbs, mfpb), "rows": rows}


def refusal(ir: Arithmetic, names: Mapping[str, int]) -> CaptureAssert | None:
    """The first ``capture.assert`` the capture of these names breaks."""
    for check in ir.capture.asserts:
        if not check.check.holds(names):
            return check
    return None


def dummy_item(
    ir: Arithmetic, env: Mapping[str, int], budget: int, mbs: int, mfpb: int = 0
) -> dict[str, int]:
    """The dims of one dummy item for ``budget`` (raises EvaluationError,
    OutOfRange)."""
    scope = capture_names(ir, env, budget, mbs, mfpb)
    dims: dict[str, int] = {}
    for item, exprs in ir.capture.dummy:
        for dim, expr in zip(item.dims, exprs):
            dims[dim] = value_at(f"capture.dummy.{item.key}", expr, scope)
    return dims


def item_values(
    ir: Arithmetic, env: Mapping[str, int], dims: Mapping[str, int]
) -> dict[str, int]:
    scope = {**env, **dims}
    items = ir.items
    out = {
        "input_size": value_at("items.input_size", items.input_size, scope),
        "output_tokens": value_at("items.output_tokens", items.output_tokens, scope),
    }
    for name in ("graph_rows", "budget_tokens"):
        expr = getattr(items, name)
        out[name] = (
            value_at(f"items.{name}", expr, scope)
            if expr is not None
            else out["output_tokens"]
        )
    return out


def flat_rows(flat: FlatInput, env: Mapping[str, int], dims: Mapping[str, int]) -> int:
    """Rows of one item of ``flat`` (its own ``rows`` or ``input_size``)."""
    field = f"inputs.{flat.key}.rows" if flat.own_rows else "items.input_size"
    return value_at(field, flat.rows, {**env, **dims})


#: Scheduler steps (``min(max_num_batched_tokens, max_model_len)``) the
#: largest budget is sampled at.
SAMPLE_STEPS = (64, 512, 2048, 8192, 16384, 131072)


def budget_range_problems(budget, constants) -> Iterator[tuple[str, str]]:
    """``budget.max``: at every sampled step (``max_num_batched_tokens =
    max_model_len``, and each twice the other), at least the smallest budget
    and not falling as the step grows; a range that breaks either captures
    no graph or fewer for a larger step."""
    if budget is None or budget.max is None:
        return
    env = {c.name: c.default for c in constants if c.default is not None}
    try:
        minimum = value_at("budget.min", budget.min, env)
        previous = None
        for step in SAMPLE_STEPS:
            for tokens, length in ((step, step), (step, 2 * step), (2 * step, step)):
                scope = {
                    **env,
                    "max_num_batched_tokens": tokens,
                    "max_model_len": length,
                }
                largest = value_at("budget.max", budget.max, scope)
                if min(tokens, length) >= minimum and largest < minimum:
                    yield "budget.max", (
                        f"is {largest} at max_num_batched_tokens={tokens}, "
                        f"max_model_len={length}: below the smallest budget "
                        f"({minimum}), so no graph would be captured"
                    )
                    return
            if previous is not None and largest < previous:
                yield "budget.max", (
                    f"falls from {previous} to {largest} as the step grows to "
                    f"{step} tokens: a larger step must not shrink the range"
                )
                return
            previous = largest
    except EvaluationError:
        return  # a constant without a default: nothing known to check
    except FormulaRefused as exc:
        yield exc.field, exc.message


def capture_problems(
    ir: Arithmetic,
    overrides: Mapping[str, int] | None = None,
    budgets: tuple[int, ...] = (),
    batch_sizes: tuple[int, ...] = (),
) -> Iterator[tuple[str, str]]:
    """(field, message) for each arithmetic problem found with known values
    (with capture axes: for every combination of their keys), at the
    budgets and batch sizes of :func:`with_checked_grid`."""
    env = constant_env(ir, overrides)
    ir = with_checked_grid(ir, env, budgets, batch_sizes)
    yield from smallest_budget_problems(ir, env)
    if any(g.unit_of for g in ir.item_inputs) and not ir.capture.of_units:
        return  # refused: units need a unit capture
    reported: set[str] = set()
    try:
        if ir.capture.of_units:
            # A unit capture's own coverage check replaces the dummy's.
            for axis_env in axis_envs(ir.axes, env):
                problems = itertools.chain(
                    unit_capture_problems(ir, axis_env),
                    unit_dummy_problems(ir, axis_env),
                )
                for field, message in problems:
                    if field not in reported:
                        reported.add(field)
                        yield field, message
            return
        for axis_env in axis_envs(ir.axes, env):
            yield from _budget_problems(ir, axis_env, reported)
            yield from padded_problems(
                ir,
                axis_env,
                lambda budget, mbs, e=axis_env: capture_scope(
                    ir, {**e, **ir.size_env}, budget, mbs, mbs, mbs
                ),
                ir.budgets,
                ir.batch_sizes,
                reported,
            )
        if (
            ir.capture.graph_rows is not None
            and ir.items.budget_tokens is not None
            and ir.items_resolved
        ):
            yield from item_bound_problems(ir, env)
    except FormulaRefused as exc:
        # The values after it would be meaningless: one problem, then on.
        yield exc.field, exc.message
    yield from slot_problems(
        ir.constants, ir.buffers, overrides, ir.video, (ir.budgets, ir.batch_sizes)
    )


def axis_combos(axes, env: Mapping[str, int]) -> list[tuple[tuple, dict[str, int]]]:
    """Every combination of the axes' keys (each distinct key once), with the
    dims it binds: ``[((), {})]`` without axes. Keys that need a constant
    without a value are left out."""
    per_axis = []
    for axis in axes:
        values: dict = {}
        for key in axis.keys:
            try:
                parts = tuple(evaluate(p, env) for p in key)
            except (EvaluationError, ArithmeticError):
                continue
            shown = parts[0] if axis.scalar else parts
            values.setdefault(shown, dict(zip(axis.dims, parts, strict=True)))
        per_axis.append(list(values.items()))
    return [
        (
            tuple(key for key, _ in combo),
            {d: v for _, dims in combo for d, v in dims.items()},
        )
        for combo in itertools.product(*per_axis)
    ]


def axis_envs(axes, env: Mapping[str, int]) -> list[dict[str, int]]:
    """``env`` with the dims of every combination of the axes' keys."""
    return [{**env, **dims} for _, dims in axis_combos(axes, env)]


def _budget_problems(
    ir: Arithmetic, env: Mapping[str, int], reported: set[str]
) -> Iterator[tuple[str, str]]:
    """The checks of every sampled budget and batch size (raises
    OutOfRange)."""
    longest = LongestItems(ir, env)
    padded = padded_tensors(ir)
    slope = graph_row_slope(ir, env) if ir.capture.graph_rows is not None else None
    for mbs in ir.batch_sizes:
        for budget in ir.budgets:
            if mbs > budget:
                continue
            try:
                if refusal(ir, capture_names(ir, env, budget, mbs, mbs)):
                    continue  # the capture refuses this budget (plan says so)
                dims = dummy_item(ir, env, budget, mbs)
                values = item_values(ir, env, dims)
            except (EvaluationError, ArithmeticError):
                continue  # a constant without default: plan checks it
            # A count may be 0 (an image without crops), a grid dim may not.
            counts = {g.dims[0] for g in ir.item_inputs if g.is_count}
            bad_dims = [d for d, v in dims.items() if v < (d not in counts)]
            if bad_dims and "capture.dummy" not in reported:
                reported.add("capture.dummy")
                yield (
                    "capture.dummy",
                    f"dummy dims {', '.join(bad_dims)} are not positive (counts: "
                    f"negative) for budget {budget} and max_batch_size {mbs}",
                )
            eager = ir.items.eager_when
            try:
                eager_dummy = eager is not None and eager.holds({**env, **dims})
            except EvaluationError:
                continue  # a constant without default: plan checks it
            if eager_dummy and "capture.dummy" not in reported:
                reported.add("capture.dummy")
                yield (
                    "capture.dummy",
                    f"the dummy item runs eagerly ({eager.spec_text()}, "
                    f"items.eager_when) for budget {budget} and max_batch_size "
                    f"{mbs}: the graph would be captured for items it never takes",
                )
            rows = mbs * values["input_size"]
            rounding = ir.capture.rounding
            env_sizes = {**env, **ir.size_env}
            scope = capture_scope(ir, env_sizes, budget, mbs, mbs, rows)
            for tensor in ir.capture.tensors:
                if tensor in padded:
                    continue  # padded_problems: a key's graph holds its items
                if not isinstance(tensor.flat, FlatInput):
                    continue  # a list input's units: a unit capture only
                field = f"capture.tensors.{tensor.key}.shape"
                try:
                    need = mbs * flat_rows(tensor.flat, env, dims)
                    own = capture_scope(ir, env_sizes, budget, mbs, mbs, need)
                    held = value_at(field, tensor.shape[0], own)
                except (EvaluationError, ArithmeticError):
                    continue
                if held < need and field not in reported:
                    reported.add(field)
                    yield (
                        field,
                        f"holds {held} rows but the dummy batch has {need} input rows "
                        f"(budget {budget}, max_batch_size {mbs}); size dim 0 with 'rows'",
                    )
            for field, message in host_scalar_problems(
                ir, env, scope, budget, mbs, dims, longest
            ):
                if field not in reported:
                    reported.add(field)
                    yield field, message
            if not ir.items_resolved:
                continue
            # Graph rows the captured batch has room for: the dummy's, or
            # the declared capacity (which must hold the dummy's too).
            graph_capacity = mbs * values["graph_rows"]
            if ir.capture.graph_rows is not None:
                graph_capacity = yield from _declared_capacity_problems(
                    ir, scope, budget, mbs, graph_capacity, slope, reported
                )
                if graph_capacity is None:
                    continue
            # The dummy batch must hold every batch whose budget tokens fit:
            # its graph rows and its budget tokens both reach the budget (or,
            # for items of a fixed token count, the most max_batch_size of
            # them can have).
            covered = min(graph_capacity, mbs * values["budget_tokens"])
            # Padded buffers are checked by what a key's graph takes
            # (padded_problems), not by the dummy batch's items.
            if (
                not padded
                and covered < min(budget, fixed_batch_tokens(ir, env, mbs))
                and "capture.dummy" not in reported
            ):
                reported.add("capture.dummy")
                need = per_item_tokens(budget, mbs)
                k = per_item_tokens(budget, mbs, rounding)
                what = f"k = {k}" if k == need else f"{need}, but k rounds down to {k}"
                yield (
                    "capture.dummy",
                    f"the dummy batch cannot cover its budget: {mbs} dummy item(s) hold "
                    f"{covered} graph rows or budget tokens for budget {budget} (each "
                    f"item needs at least {what}); a batch that fits the budget would "
                    "overflow the buffers",
                )


def _declared_capacity_problems(
    ir: Arithmetic,
    scope: Mapping[str, int],
    budget: int,
    mbs: int,
    dummy_rows: int,
    slope: Fraction | None,
    reported: set[str],
) -> Generator[tuple[str, str], None, int | None]:
    """A declared ``capture.graph_rows`` at one budget: it holds the dummy's
    graph rows and the most a batch within the budget can have
    (:func:`batch_graph_rows`, which may be fewer than the budget), and the
    ``allocate`` buffers hold it. Returns the graph rows it covers for the
    dummy's coverage check (the budget: every batch's rows fit), or
    ``None`` when it cannot be evaluated (the budget is skipped, as the
    other checks skip it)."""
    field = "capture.graph_rows"
    try:
        declared = value_at(field, ir.capture.graph_rows, scope)
    except (EvaluationError, ArithmeticError):
        return None
    if declared < dummy_rows and field not in reported:
        reported.add(field)
        yield (
            field,
            f"is {declared} but the dummy batch already emits {dummy_rows} graph "
            f"rows (budget {budget}, max_batch_size {mbs}): its builder values "
            "would not fit the buffers",
        )
    capacity = max(dummy_rows, declared)
    most = batch_graph_rows(slope, budget, mbs) if slope is not None else budget
    if capacity < most and field not in reported:
        reported.add(field)
        yield (
            field,
            f"is {declared} but a batch of {mbs} item(s) within budget {budget} can "
            f"have {most} graph rows (sampled items have up to "
            f"{float(1 if slope is None else slope):.3g} graph rows per budget "
            "token, plus one each): it would overflow the buffers",
        )
        # capture.dummy would report the same shortfall.
        reported.add("capture.dummy")
    for buf in ir.buffers:
        if not buf.allocate or not buf.shape:
            continue
        field = f"buffers.{buf.key}.shape"
        try:
            held = value_at(field, buf.shape[0], scope)
        except (EvaluationError, ArithmeticError):
            continue
        if held < capacity and field not in reported:
            reported.add(field)
            yield (
                field,
                f"holds {held} rows but the captured batch has room for {capacity} "
                f"graph rows (budget {budget}, max_batch_size {mbs}); size dim 0 "
                "with capture.graph_rows",
            )
    return max(capacity, budget)


def smallest_budget_problems(
    ir: Arithmetic, env: Mapping[str, int]
) -> Iterator[tuple[str, str]]:
    """A ``capture.assert`` that refuses the smallest budget even for one
    item per batch refuses every graph: the capture would always fail."""
    if ir.budget_min is None or not ir.capture.asserts:
        return
    try:
        smallest = evaluate(ir.budget_min, env)
        check = refusal(ir, capture_names(ir, env, smallest, 1, 1))
    except (EvaluationError, ArithmeticError):
        return
    except FormulaRefused as exc:
        yield exc.field, exc.message
        return
    if check is not None:
        index = ir.capture.asserts.index(check)
        yield (
            f"capture.assert[{index}].check",
            f"{check.check.spec_text()} fails for the smallest budget ({smallest}) "
            "with one item per batch: no graph could be captured",
        )


def host_scalar_problems(
    ir: Arithmetic,
    env: Mapping[str, int],
    scope: Mapping[str, int],
    budget: int,
    mbs: int,
    dims: Mapping[str, int],
    longest: LongestItems,
) -> Iterator[tuple[str, str]]:
    """A host scalar's capture value (``set_by``) is baked into the attention
    launch: it must hold the longest sequence of the pad buffer it bounds (or,
    with ``bounds: item``, the longest item within the budget)."""
    for buf in ir.buffers:
        expr = set_by_expr(buf)
        if expr is None:
            continue
        field = f"buffers.{buf.key}.{capture_value_field(buf)}"
        try:
            bound = value_at(field, expr, scope)
            found = longest_sequence(ir, env, buf, budget, mbs, dims, longest)
        except (EvaluationError, ArithmeticError):
            continue
        if found is None:
            continue  # which pad buffer it bounds is unknown (reported)
        need, why = found
        if bound < need:
            yield (
                field,
                f"{buf.key} is captured as {bound} but {why}; the attention launch "
                f"would truncate it (expected at least {need})",
            )


def longest_sequence(
    ir: Arithmetic,
    env: Mapping[str, int],
    scalar: Buffer,
    budget: int,
    mbs: int,
    dims: Mapping[str, int],
    longest: LongestItems,
) -> tuple[int, str] | None:
    """The input rows of the longest attention sequence a captured graph of
    ``budget`` can be given, and why (None when the pad buffer the scalar
    bounds is not known).

    ``bounds: item``: the builder makes one sequence per item and none for
    padding, and the dummy's sequences are replaced before any replay reads
    the value, so only real items count: the longest item within the budget.

    A trailing padding sequence (or no pad buffer) can hold every captured
    row. Zero-length padding adds no rows: a sequence then lies within one
    item, so one dummy item or one item that takes the whole budget (the
    dummy item of ``max_batch_size`` 1) is the longest; a windowed pad
    buffer's sequence is one window of ``window`` x ``window`` tokens."""
    if scalar.bounds == ITEM_BOUND:
        need = longest.rows(budget)
        return need, (
            f"an item within budget {budget} is one attention sequence of {need} "
            "input rows"
        )
    rows = mbs * item_values(ir, env, dims)["input_size"]
    padded = bounded_buffer(ir.buffers, scalar)
    pads = [b for b in ir.buffers if b.pad is not None]
    if padded is None and (scalar.bounds is not None or len(pads) > 1):
        return None
    if padded is None or padded.pad is PadRule.TRAILING_SEQUENCE:
        return rows, (
            f"one sequence can hold all {rows} input rows of budget {budget} (a "
            "single large item, or the trailing padding sequence)"
        )
    whole = item_values(ir, env, dummy_item(ir, env, budget, 1, 0))
    if padded.window is not None:
        side = evaluate(padded.window, env)
        per_token = -(-whole["input_size"] // max(whole["budget_tokens"], 1))
        need = side * side * per_token
        return need, (
            f"a window of {padded.key} holds up to {side} x {side} tokens, {need} "
            "input rows"
        )
    one = item_values(ir, env, dims)["input_size"]
    need = max(one, whole["input_size"])
    return need, (
        f"a sequence of {padded.key} can be one item of {need} input rows (one "
        f"dummy item, or one item that takes the whole budget {budget})"
    )


def fixed_batch_tokens(ir: Arithmetic, env: Mapping[str, int], mbs: int) -> float:
    """The budget tokens of the largest batch when every item has the same
    (its budget tokens read no dims: one global view per image), else
    unbounded."""
    budget_tokens = ir.items.budget_tokens or ir.items.output_tokens
    dims = {d for g in ir.item_inputs for d in g.dims}
    if names_in(budget_tokens) & dims:
        return float("inf")
    try:
        return mbs * evaluate(budget_tokens, env)
    except (EvaluationError, ArithmeticError):
        return float("inf")


#: Values tried for every grid dim when a per-item relation is checked.
SAMPLE_DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 64)
#: And for the graph rows per budget token (:func:`graph_row_slope`): long
#: sides, where a ratio like DeepSeek-V4.1's ``ceil(w / r) / w`` of a
#: ``1 x w`` strip nears its supremum (1/3 at r = 3: 0.328 at w = 64, 0.33329
#: at 16,385), so that no capacity below the true bound passes at the
#: sampled budgets.
SLOPE_SAMPLE_DIMS = SAMPLE_DIMS + (257, 1025, 4097, 16385)
MAX_DIM_SAMPLES = 4096


def _sampled_dims(
    names: list[str],
    scales: Mapping[str, int] | None = None,
    sample: tuple[int, ...] = SAMPLE_DIMS,
) -> Iterator[tuple[int, ...]]:
    """Every combination of ``sample`` values for ``names`` (each times its
    scale), or a seeded random subset when there are too many."""
    values = [[(scales or {}).get(n, 1) * v for v in sample] for n in names]
    if len(sample) ** len(names) <= MAX_DIM_SAMPLES:
        yield from itertools.product(*values)
        return
    rng = random.Random(0)
    for _ in range(MAX_DIM_SAMPLES):
        yield tuple(rng.choice(v) for v in values)


def dim_steps(ir: Arithmetic, env: Mapping[str, int]) -> dict[str, int]:
    """For each dim divided in an item formula, the least common multiple of
    its divisors: real items have dims that divide exactly (a processor pads
    to the merge kernel), so samples of real items are multiples of it."""
    items = ir.items
    exprs = [items.input_size, items.output_tokens, items.graph_rows]
    exprs.append(items.budget_tokens)
    steps: dict[str, int] = {}
    for expr in filter(None, exprs):
        for sub in walk(expr):
            if isinstance(sub, BinOp) and sub.op in ("//", "%"):
                numerator, divisor = sub.left, sub.right
            elif isinstance(sub, Func) and sub.name == "ceil_div":
                numerator, divisor = sub.args
            else:
                continue
            try:
                value = max(1, abs(evaluate(divisor, env)))
            except (EvaluationError, ArithmeticError):
                continue
            for dim in names_in(numerator):
                steps[dim] = math.lcm(steps.get(dim, 1), value)
    return steps


class LongestItems:
    """The most input rows of one item with at most some budget tokens, over
    sampled items whose dims are multiples of their :func:`dim_steps`, items
    that run eagerly left out (computed once, on first use)."""

    def __init__(self, ir: Arithmetic, env: Mapping[str, int]) -> None:
        self.ir = ir
        self.env = env
        self._tokens: list[int] | None = None
        self._rows: list[int] = []

    def _sample(self) -> None:
        items = self.ir.items
        budget_tokens = items.budget_tokens or items.output_tokens
        used = names_in(items.input_size) | names_in(budget_tokens)
        eager = items.eager_when
        if eager is not None:
            used |= eager.names()
        dims = [d for g in self.ir.item_inputs for d in g.dims if d in used]
        pairs = []
        steps = dim_steps(self.ir, self.env)
        for combo in _sampled_dims(dims, steps):
            scope = {**self.env, **dict(zip(dims, combo, strict=True))}
            try:
                if eager is not None and eager.holds(scope):
                    continue  # never replayed: it runs eagerly
                pairs.append(
                    (evaluate(budget_tokens, scope), evaluate(items.input_size, scope))
                )
            except (EvaluationError, ArithmeticError):
                continue
        pairs.sort()
        self._tokens = [t for t, _ in pairs]
        best = 0
        for _, rows in pairs:
            best = max(best, rows)
            self._rows.append(best)

    def rows(self, budget: int) -> int:
        if self._tokens is None:
            self._sample()
        assert self._tokens is not None  # noqa: S101
        i = bisect.bisect_right(self._tokens, budget)
        return self._rows[i - 1] if i else 0


def _sampled_item_rows(
    ir: Arithmetic, env: Mapping[str, int], sample: tuple[int, ...] = SAMPLE_DIMS
) -> Iterator[tuple[str, int, int]]:
    """``(item, graph rows, budget tokens)`` of sampled items (``item``
    names the dims). Every dim the two formulas read is sampled on its own,
    so write both formulas over the same dims where grids depend on each
    other (DeepSeek-V4.1: ``h``, ``w`` rather than the derived ``lh``,
    ``lw``)."""
    items = ir.items
    graph_rows = items.graph_rows or items.output_tokens
    budget_tokens = items.budget_tokens or items.output_tokens
    rows_field = f"items.{'graph_rows' if items.graph_rows else 'output_tokens'}"
    tokens_field = (
        f"items.{'budget_tokens' if items.budget_tokens else 'output_tokens'}"
    )
    # Only the dims the two formulas read vary their values.
    used = names_in(graph_rows) | names_in(budget_tokens)
    dims = [d for g in ir.item_inputs for d in g.dims if d in used]
    for combo in _sampled_dims(dims, sample=sample):
        scope = {**env, **dict(zip(dims, combo, strict=True))}
        try:
            rows = value_at(rows_field, graph_rows, scope)
            tokens = value_at(tokens_field, budget_tokens, scope)
        except (EvaluationError, ArithmeticError):
            continue
        yield ", ".join(
            f"{d}={v}" for d, v in zip(dims, combo, strict=True)
        ), rows, tokens


def graph_row_slope(ir: Arithmetic, env: Mapping[str, int]) -> Fraction | None:
    """The largest ``(graph rows - 1) / budget tokens`` of the sampled items
    (``None`` without items to sample): every item has at most ``slope ·
    tokens + 1`` graph rows, so a batch of ``n`` items within a budget ``B``
    has at most ``slope · B + n`` (:func:`batch_graph_rows`)."""
    if not ir.items_resolved or ir.items.budget_tokens is None:
        return None
    slopes = [
        Fraction(rows - 1, tokens)
        for _, rows, tokens in _sampled_item_rows(ir, env, SLOPE_SAMPLE_DIMS)
        if tokens > 0
    ]
    return max(slopes, default=None)


def batch_graph_rows(slope: Fraction, budget: int, mbs: int) -> int:
    """The most graph rows a batch of at most ``mbs`` items within ``budget``
    budget tokens has, given :func:`graph_row_slope` and no item with more
    graph rows than budget tokens (:func:`item_bound_problems`)."""
    return min(budget, math.floor(slope * budget) + mbs)


def item_bound_problems(
    ir: Arithmetic, env: Mapping[str, int]
) -> Iterator[tuple[str, str]]:
    """With a declared graph-row capacity, a batch whose budget tokens fit
    has no more graph rows than the budget only if no item has more graph
    rows than budget tokens: checked on sampled dims
    (:func:`_sampled_item_rows`)."""
    for item, rows, tokens in _sampled_item_rows(ir, env):
        if rows > tokens:
            yield (
                "capture.graph_rows",
                f"an item ({item}) has {rows} graph rows but {tokens} budget "
                "tokens: a declared capacity covers a batch only if no item has "
                "more graph rows than budget tokens",
            )
            return


def slot_problems(
    constants: tuple[Constant, ...],
    buffers: tuple[Buffer, ...],
    overrides: Mapping[str, int] | None = None,
    video: bool = False,
    grid: tuple[tuple[int, ...], tuple[int, ...]] = (
        SAMPLE_BUDGETS,
        SAMPLE_BATCH_SIZES,
    ),
) -> Iterator[tuple[str, str]]:
    """A full batch's offsets fit the slots; a trailing padding sequence
    needs a spare slot; a windowed buffer has a slot for every window
    (``grid``: the budgets and batch sizes checked)."""
    env = {c.name: c.default for c in constants if c.default is not None}
    env.update(overrides or {})
    for buf in buffers:
        if buf.pad is None or buf.slots is None:
            continue
        field = f"buffers.{buf.key}.slots"
        try:
            problem = _first_slot_problem(buf, env, video, grid)
        except FormulaRefused as exc:
            yield exc.field, exc.message
            continue
        if problem is not None:
            yield field, problem


def _first_slot_problem(
    buf: Buffer, env: dict[str, int], video: bool, grid
) -> str | None:
    budgets, batch_sizes = grid
    for mbs in batch_sizes:
        for budget in budgets:
            if budget < mbs:
                continue
            for mfpb in (mbs, 4 * mbs) if video else (mbs,):
                names = {
                    **env,
                    "max_batch_size": mbs,
                    "max_frames_per_batch": mfpb,
                    "token_budget": budget,
                }
                try:
                    slots = value_at(f"buffers.{buf.key}.slots", buf.slots, names)
                    side = (
                        value_at(f"buffers.{buf.key}.window", buf.window, env)
                        if buf.window
                        else None
                    )
                except (EvaluationError, ArithmeticError):
                    return None
                problem = _slot_problem(buf, slots, side, budget, mbs, mfpb)
                if problem is not None:
                    return problem
    return None


def _slot_problem(
    buf: Buffer, slots: int, side: int | None, budget: int, mbs: int, mfpb: int
) -> str | None:
    if buf.pad is PadRule.REPEAT_LAST and slots < mbs + 1:
        return (
            f"{slots} slots for max_batch_size {mbs}: a full batch has "
            f"{mbs + 1} offsets (expected at least max_batch_size + 1)"
        )
    if buf.pad is PadRule.TRAILING_SEQUENCE and slots < mbs + 2:
        return (
            f"{slots} slots for max_batch_size {mbs}: a full batch fills "
            f"{mbs + 1} offsets and the padding sequence needs one spare slot "
            f"(expected at least max_batch_size + 2)"
        )
    if side is not None and side > 0:
        # A frame of a x b tokens has ceil(a/s)·ceil(b/s) <= a·b/s + 1
        # windows, and every window holds a token: a batch of at most
        # max(max_batch_size, max_frames_per_batch) frames within the budget
        # has at most min(budget, frames + ceil(budget / s)) windows.
        frames = max(mbs, mfpb)
        windows = min(budget, frames + -(-budget // side))
        spare = 1 if buf.pad is PadRule.TRAILING_SEQUENCE else 0
        if slots < windows + 1 + spare:
            return (
                f"{slots} slots for budget {budget}, max_batch_size {mbs}, "
                f"max_frames_per_batch {mfpb}: a batch within the budget can have "
                f"{windows} windows of {side} x {side} tokens (min(token_budget, "
                f"frames + ceil_div(token_budget, window))), {windows + 1 + spare} "
                "offsets"
            )
    return None


# -- encoder paths ----------------------------------------------------------------


@dataclass(frozen=True)
class PathRows:
    """What the path checks read of one path of ``paths:``."""

    name: str
    output_tokens: Expr
    min_token_budget: Expr | None
    allow_zero_tokens: bool


def _item_samples(
    item_inputs: tuple[ItemInput, ...], used: set[str]
) -> Iterator[dict[str, int]]:
    """Sampled dims of one item: counts from 0 (an image without crops),
    grid dims from 1; only the dims in ``used`` vary."""
    dims = [(d, g.is_count) for g in item_inputs for d in g.dims if d in used]
    domains = [(0, *SAMPLE_DIMS) if count else SAMPLE_DIMS for _, count in dims]
    names = [d for d, _ in dims]
    if math.prod(len(d) for d in domains) <= MAX_DIM_SAMPLES:
        for combo in itertools.product(*domains):
            yield dict(zip(names, combo, strict=True))
        return
    rng = random.Random(0)
    for _ in range(MAX_DIM_SAMPLES):
        yield {n: rng.choice(d) for n, d in zip(names, domains, strict=True)}


def _shown(dims: Mapping[str, int]) -> str:
    return f" ({', '.join(f'{d}={v}' for d, v in dims.items())})" if dims else ""


def path_problems(
    paths: tuple[PathRows, ...],
    items: Items,
    constants: tuple[Constant, ...],
    item_inputs: tuple[ItemInput, ...],
    overrides: Mapping[str, int] | None = None,
    custom_rows: bool = False,
) -> Iterator[tuple[str, str]]:
    """Rows per item on each path: never negative, 0 only on a path a batch
    may leave out, some path that holds every item, and (each item's output
    being its rows of every path, concatenated) they add up to the item's
    output tokens. A path's smallest budget is positive. ``custom_rows``:
    post-processing steps make each item's output of its path rows (their
    count is checked when they run), so the rows need not add up."""
    env = {c.name: c.default for c in constants if c.default is not None}
    env.update(overrides or {})
    for path in paths:
        if path.min_token_budget is None:
            continue
        try:
            smallest = evaluate(path.min_token_budget, env)
        except (EvaluationError, ArithmeticError):
            continue
        if smallest <= 0:
            yield (
                f"paths.{path.name}.min_token_budget",
                f"is {smallest}: the manager refuses a path budget outside "
                "(0, largest budget]",
            )
    if all(p.allow_zero_tokens for p in paths):
        yield (
            "paths",
            "every path allows zero tokens: some path must hold every item "
            "(allow_zero_tokens: false), or an item could have no rows at all",
        )
    used = names_in(items.output_tokens).union(
        *(names_in(p.output_tokens) for p in paths)
    )
    reported: set[str] = set()
    for dims in _item_samples(item_inputs, used):
        scope = {**env, **dims}
        try:
            rows = {p.name: evaluate(p.output_tokens, scope) for p in paths}
            total = evaluate(items.output_tokens, scope)
        except (EvaluationError, ArithmeticError):
            continue
        for path in paths:
            field = f"paths.{path.name}.output_tokens"
            n = rows[path.name]
            bad = n < 0 or (n == 0 and not path.allow_zero_tokens)
            if bad and field not in reported:
                reported.add(field)
                fix = "" if n < 0 else "; set allow_zero_tokens: true"
                yield (
                    field,
                    f"is {n} for an item{_shown(dims)}: a batch of such items "
                    f"has no rows on path {path.name!r}{fix}",
                )
        field = "items.output_tokens"
        if custom_rows:
            continue
        if sum(rows.values()) != total and field not in reported:
            reported.add(field)
            parts = " + ".join(str(rows[p.name]) for p in paths)
            yield (
                field,
                f"is {total} for an item{_shown(dims)} but its rows on the paths "
                f"add up to {parts} = {sum(rows.values())}: an item's output is its "
                "rows of every path, concatenated",
            )


# -- capture axes -------------------------------------------------------------------


def axis_problems(
    axes, constants: tuple[Constant, ...], overrides: Mapping[str, int] | None = None
) -> Iterator[tuple[str, str]]:
    """Every key a batch can select is captured: some key covers the axis'
    bound (the largest need any item can have), or (``beyond_keys: eager``)
    an item no key covers runs eagerly and selects no graph. Keys differ."""
    env = {c.name: c.default for c in constants if c.default is not None}
    env.update(overrides or {})
    for i, axis in enumerate(axes):
        field = f"capture_axes[{i}]"
        try:
            keys = [tuple(evaluate(p, env) for p in key) for key in axis.keys]
            bound = tuple(evaluate(b, env) for b in axis.bound)
        except (EvaluationError, ArithmeticError):
            continue  # a constant without default: plan checks it
        for j, key in enumerate(keys):
            # Keys equal only for some constants (Gemma 4's min(560, m) for
            # m = 280) are captured once (the config drops repeats); the
            # same formula twice is a slip.
            if axis.keys[j] in axis.keys[:j]:
                yield (
                    f"{field}.keys",
                    f"keys[{j}] is {_key_text(key)} again: each key is one graph "
                    "per budget, captured once",
                )
        if axis.eager_beyond:
            continue  # such items run eagerly: their item specs say so
        if not any(all(k >= b for k, b in zip(key, bound)) for key in keys):
            yield (
                f"{field}.bound",
                f"no key covers the bound {_key_text(bound)} (keys: "
                f"{', '.join(_key_text(k) for k in keys)}): a batch with such an "
                "item would select a key that was never captured and the "
                "manager would fail on it; add a key that covers the bound",
            )


def _key_text(parts: tuple[int, ...]) -> str:
    return str(parts[0]) if len(parts) == 1 else str(parts)


# -- unit captures -------------------------------------------------------------------

#: Values of each dim (times the dims' common divisor) for a unit capture's
#: bound: small items, and items as large as the largest budgets.
UNIT_SAMPLE_DIMS = (1, 2, 3, 4, 5, 7, 8, 16, 17, 33, 64, 256, 1024, 4096)
#: Frame limits tried with each batch size: the manager never packs by
#: frames, so no value may matter.
SAMPLE_FRAME_FACTORS = (0, 1, 16)


def unit_scope(env: Mapping[str, int], budget: int, mbs: int, mfpb: int) -> dict:
    """The names ``capture.units`` may use, for one budget."""
    return {
        **env,
        "token_budget": budget,
        "max_batch_size": mbs,
        "max_frames_per_batch": mfpb,
    }


def unit_capture_problems(
    ir: Arithmetic, env: Mapping[str, int]
) -> Iterator[tuple[str, str]]:
    """A unit capture holds every batch within its budget: each flat
    capture tensor's dim 0 at least the rows of its input that at most
    ``max_batch_size`` items within the budget can bring
    (:func:`generator.unit_coverage.most_rows`, over sampled items)."""
    buffers = {b.key for b in ir.buffers}
    for tensor in ir.capture.tensors:
        if tensor.key not in buffers or not isinstance(tensor.flat, FlatInput):
            continue  # only the builders read it: a capture-time input
        hull = envelope(list(_item_points(ir, env, tensor.flat)))
        if not hull:
            continue
        problem = _first_overflow(ir, env, tensor, hull)
        if problem is not None:
            yield problem


# -- the dummy units of a unit capture (capture.unit_dummy) ------------------------

#: Batch sizes tried with the dummy units (``units`` seldom reads it).
UNIT_DUMMY_BATCH_SIZES = (1, 64)


@dataclass(frozen=True)
class UnitSample:
    """A sampled unit: its budget tokens and input rows (one sequence)."""

    tokens: int
    rows: int


def _unit_samples(ir: Arithmetic, env: Mapping[str, int]) -> list[UnitSample]:
    """Units over sampled dims, each a multiple of its divisors in the item
    formulas (as processors emit them)."""
    items = ir.items
    tokens_expr = items.budget_tokens or items.output_tokens
    dims = [d for g in ir.item_inputs if g.unit_of for d in g.dims]
    out = []
    for combo in _sampled_dims(dims, dim_steps(ir, env)):
        scope = {**env, **dict(zip(dims, combo, strict=True))}
        try:
            out.append(
                UnitSample(
                    evaluate(tokens_expr, scope), evaluate(items.input_size, scope)
                )
            )
        except (EvaluationError, ArithmeticError):
            continue
    return out


def unit_dummy_problems(
    ir: Arithmetic, env: Mapping[str, int]
) -> Iterator[tuple[str, str]]:
    """The dummy units of a unit capture: positive dims that cover the budget
    in budget tokens; ``pad`` offsets with a slot for every unit a batch
    within the budget can bring (each has at least the fewest budget tokens a
    unit can have); host scalars that hold the longest unit (a unit is one
    sequence)."""
    capture = ir.capture
    if not capture.unit_dummy:
        return
    if not ir.items.per_unit:
        yield (
            "capture.unit_dummy",
            "dummy units need items.per_unit: their dims are a unit's, and the "
            "checks count a unit's budget tokens",
        )
        return
    samples = _unit_samples(ir, env)
    fewest = min((u.tokens for u in samples), default=None)
    try:
        lo = evaluate(ir.budget_min, env) if ir.budget_min is not None else 1
    except (EvaluationError, ArithmeticError):
        return
    # Each budget builds its dummy units (up to 2**16 of them): a ladder's
    # budgets beyond the largest sample (a budget.max of millions) would cost
    # seconds each, so the dummy units are checked up to that sample only.
    for budget in (b for b in ir.budgets if lo <= b <= SAMPLE_BUDGETS[-1]):
        for mbs in UNIT_DUMMY_BATCH_SIZES:
            scope = unit_scope(env, budget, mbs, mbs)
            try:
                units = value_at("capture.units", capture.units, scope)
                if units > MAX_DUMMY_UNITS:
                    yield _too_many_units(units, budget)
                    return
                dummy = _dummy_units(ir, {**scope, "units": units}, units)
            except (EvaluationError, ArithmeticError):
                return
            except FormulaRefused as exc:
                yield exc.field, exc.message
                return
            problem = _dummy_unit_problem(ir, scope, dummy, budget, mbs, units)
            if problem is None:
                problem = _unit_pad_problem(ir, scope, units, fewest, budget)
            if problem is None:
                problem = _unit_scalar_problem(ir, scope, units, samples, dummy, budget)
            if problem is not None:
                yield problem
                return


def _too_many_units(units: int, budget: int) -> tuple[str, str]:
    return (
        "capture.units",
        f"{units} dummy units at budget {budget} (at most {MAX_DUMMY_UNITS}): "
        "each is checked at every sampled budget",
    )


def _dummy_units(ir: Arithmetic, scope: Mapping[str, int], units: int):
    """Each dummy unit's dims (every unit grid's); the caller caps
    ``units``."""
    out = []
    for index in range(units):
        dims: dict[str, int] = {}
        for item, exprs in ir.capture.unit_dummy:
            for dim, expr in zip(item.dims, exprs, strict=True):
                field = f"capture.unit_dummy.{item.key}"
                dims[dim] = value_at(field, expr, {**scope, "unit_index": index})
        out.append(dims)
    return out


def _dummy_unit_problem(ir, scope, dummy, budget: int, mbs: int, units: int):
    items = ir.items
    tokens_expr = items.budget_tokens or items.output_tokens
    total = 0
    for index, dims in enumerate(dummy):
        bad = sorted(d for d, v in dims.items() if v <= 0)
        if bad:
            return (
                "capture.unit_dummy",
                f"unit {index} of {units} at budget {budget} has "
                f"{', '.join(f'{d} = {dims[d]}' for d in bad)}: every dummy unit "
                "needs positive dims (fewer units, or dims that stay positive)",
            )
        total += evaluate(tokens_expr, {**scope, **dims})
    if total < budget:
        return (
            "capture.unit_dummy",
            f"the {units} dummy units bring {total} budget tokens at budget "
            f"{budget} (max_batch_size {mbs}): fewer than the budget, so the "
            "buffers built from them would not hold a batch that fills it",
        )
    return None


def _unit_pad_problem(ir, scope, units: int, fewest, budget: int):
    for buf in ir.buffers:
        if buf.pad is None or buf.slots is None:
            continue
        field = f"buffers.{buf.key}.slots"
        slots = value_at(field, buf.slots, scope)
        if fewest is None or fewest <= 0:
            return (
                field,
                "a unit can have no budget tokens, so a batch within the budget "
                "can bring any number of units: no slot count holds its offsets",
            )
        most = budget // fewest
        if slots < most + 1:
            return (
                field,
                f"{slots} slots at budget {budget}, but a batch within it can "
                f"bring {most} units of {fewest} budget token(s) each, one "
                f"sequence each: {most + 1} offsets (the dummy has {units} units; "
                "expected at least token_budget // (the fewest tokens of a unit) "
                "+ 1)",
            )
    return None


def _unit_scalar_problem(ir, scope, units: int, samples, dummy, budget: int):
    for buf in ir.buffers:
        expr = set_by_expr(buf)
        if expr is None:
            continue
        field = f"buffers.{buf.key}.{capture_value_field(buf)}"
        bound = value_at(field, expr, {**scope, "units": units})
        fits = [u.rows for u in samples if u.tokens <= budget]
        own = [evaluate(ir.items.input_size, {**scope, **d}) for d in dummy]
        need = max(fits + own, default=0)
        if bound < need:
            return (
                field,
                f"{buf.key} is captured as {bound} at budget {budget}, but one unit "
                f"(one sequence) within the budget or of the dummy has {need} input "
                "rows; the attention launch would truncate it",
            )
    return None


def _first_overflow(ir: Arithmetic, env, tensor, hull) -> tuple[str, str] | None:
    bounds: dict[tuple[int, int], tuple[int, object]] = {}  # the frames change none
    for mbs in ir.batch_sizes:
        for budget in (b for b in ir.budgets if b >= mbs):
            for factor in SAMPLE_FRAME_FACTORS:
                mfpb = max(1, factor * mbs)
                scope = unit_scope(env, budget, mbs, mfpb)
                try:
                    units = evaluate(ir.capture.units, scope)
                    held = evaluate(tensor.shape[0], {**scope, "units": units})
                except (EvaluationError, ArithmeticError):
                    return None  # a constant without default: plan checks it
                # Points of a per-unit spec are units, as many per item as
                # fit: max_batch_size limits nothing then.
                limit = budget if ir.items.per_unit else mbs
                if (budget, limit) not in bounds:
                    bounds[budget, limit] = most_rows(hull, budget, limit)
                need, batch = bounds[budget, limit]
                if held >= need:
                    continue
                noun = "unit" if ir.items.per_unit else "item"
                return _overflow_message(
                    tensor, held, need, batch, budget, mbs, mfpb, noun
                )
    return None


def _overflow_message(tensor, held, need, batch, budget, mbs, mfpb, noun):
    key = tensor.key
    # A first dim of exactly ``units`` makes the count the culprit.
    on_units = tensor.shape[0] == Ref("units")
    field = "capture.units" if on_units else f"capture.tensors.{key}.shape"
    example = ""
    if batch is not None and batch.rows > held:
        example = (
            f" (e.g. {batch.describe(noun)}: {batch.tokens} budget tokens, "
            f"{batch.rows} rows)"
        )
    return (
        field,
        f"{key} holds {_rows(held)} for budget {budget} (max_batch_size {mbs}, "
        f"max_frames_per_batch {mfpb}), but a batch within the budget brings up "
        f"to {need} rows of it{example}: the replay copy would not fit. "
        "max_batch_size bounds the items of a batch, not their rows: size the "
        "capture from token_budget",
    )


def _rows(n: int) -> str:
    return "1 row" if n == 1 else f"{n} rows"


def _item_points(ir: Arithmetic, env: Mapping[str, int], flat: FlatInput):
    """(budget tokens, rows of ``flat``) of items over sampled dims."""
    items = ir.items
    tokens_expr = items.budget_tokens or items.output_tokens
    rows_expr = _rows_per_point(ir, flat)
    used = names_in(tokens_expr) | names_in(rows_expr)
    dims = [d for g in ir.item_inputs for d in g.dims if d in used]
    step = dim_step((tokens_expr, rows_expr), env)
    values = [step * v for v in UNIT_SAMPLE_DIMS]
    combos: Iterator[tuple[int, ...]]
    if len(values) ** len(dims) <= MAX_DIM_SAMPLES:
        combos = itertools.product(values, repeat=len(dims))
    else:
        rng = random.Random(0)
        combos = (
            tuple(rng.choice(values) for _ in dims) for _ in range(MAX_DIM_SAMPLES)
        )
    for combo in combos:
        named = dict(zip(dims, combo, strict=True))
        scope = {**env, **named}
        try:
            yield ItemPoint(
                evaluate(tokens_expr, scope), evaluate(flat.rows, scope), named
            )
        except (EvaluationError, ArithmeticError):
            continue


def _rows_per_point(ir: Arithmetic, flat: FlatInput):
    """A flat input's rows per sampled point: per unit for a per-unit spec;
    for a per-item one, a unit input's rows per unit times the item's units."""
    if flat.unit_of is None or ir.items.per_unit:
        return flat.rows
    count = next(g for g in ir.item_inputs if g.key == flat.unit_of)
    return BinOp("*", Ref(count.dims[0]), flat.rows)


def dim_step(exprs, env: Mapping[str, int]) -> int:
    """The common multiple of every divisor in ``exprs``: dims drawn as its
    multiples divide exactly, as real inputs do (a tile side by its merge)."""
    step = 1
    for e in exprs:
        for sub in walk(e):
            if isinstance(sub, BinOp) and sub.op in ("//", "%"):
                try:
                    step = math.lcm(step, max(1, abs(evaluate(sub.right, env))))
                except (EvaluationError, ArithmeticError):
                    continue
    return step
