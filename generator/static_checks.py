"""Arithmetic a spec implies, checked without a GPU.

The checks evaluate the spec's formulas (never ``eval``: see
:func:`generator.formulas.evaluate`) with the constants' ``default`` values,
the released model's, over a grid of budgets and batch sizes. Checks whose
formulas mention a constant without a default are skipped here; ``gen-mixin
plan`` runs them with values given on the command line.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from generator.formulas import EvaluationError, Expr, evaluate
from generator.ir import Buffer, CaptureTensor, Constant, GridInput, MetadataBuilder


@dataclass(frozen=True)
class Arithmetic:
    """The parts of a spec its arithmetic depends on (a MixinIR has them all;
    validation builds one from whatever resolved, so the checks run even when
    other parts of the spec have problems)."""

    constants: tuple[Constant, ...]
    grid_inputs: tuple[GridInput, ...]
    dummy_dims: tuple[tuple[str, tuple[Expr, ...]], ...]
    input_size: Expr
    output_tokens: Expr
    graph_rows: Expr | None
    buffers: tuple[Buffer, ...]
    capture_tensors: tuple[CaptureTensor, ...] = ()
    metadata: tuple[MetadataBuilder, ...] = ()
    sizes: tuple[tuple[str, int], ...] = ()
    budget_tokens: Expr | None = None
    capture_graph_rows: Expr | None = None
    # False when items.graph_rows or items.budget_tokens was given but did
    # not resolve: the coverage checks would run on the wrong defaults.
    items_resolved: bool = True

    def grid(self, key: str) -> GridInput | None:
        return next((g for g in self.grid_inputs if g.key == key), None)


SAMPLE_BUDGETS = (64, 100, 128, 257, 1000, 1024, 4096, 8192, 16384)
SAMPLE_BATCH_SIZES = (1, 2, 3, 5, 7, 8, 16, 64)


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


def per_item_tokens(budget: int, max_batch_size: int) -> int:
    """k: the output tokens of each dummy item (ceiling: the batch covers the budget)."""
    return -(-budget // max_batch_size)


def capture_scope(
    env: Mapping[str, int], budget: int, mbs: int, mfpb: int, rows: int
) -> dict[str, int]:
    """The names a capture-time formula may use, for one budget."""
    return {
        **env,
        "k": per_item_tokens(budget, mbs),
        "rows": rows,
        "max_batch_size": mbs,
        "token_budget": budget,
        "max_frames_per_batch": mfpb,
    }


def set_by_expr(metadata: tuple[MetadataBuilder, ...], buf: Buffer) -> Expr | None:
    """The capture-time expression a host scalar's ``set_by`` names: the
    keyword its builder passes at capture (call or capture kwargs)."""
    if buf.set_by is None:
        return None
    builder = next((m for m in metadata if buf.key in m.provides), None)
    if builder is None:
        return None
    return dict(builder.call.kwargs + builder.capture_kwargs).get(buf.set_by)


def dummy_item(
    ir: Arithmetic, env: Mapping[str, int], budget: int, mbs: int, mfpb: int = 0
) -> dict[str, int]:
    """The dims of one dummy item for ``budget`` (raises EvaluationError)."""
    scope = dict(env)
    scope.update(
        k=per_item_tokens(budget, mbs),
        max_batch_size=mbs,
        token_budget=budget,
        max_frames_per_batch=mfpb,
        frames_per_item=max(mfpb // mbs, 1),
    )
    dims: dict[str, int] = {}
    for key, exprs in ir.dummy_dims:
        grid = ir.grid(key)
        assert grid is not None  # noqa: S101 (resolved)
        for dim, expr in zip(grid.dims, exprs):
            dims[dim] = evaluate(expr, scope)
    return dims


def item_values(
    ir: Arithmetic, env: Mapping[str, int], dims: Mapping[str, int]
) -> dict[str, int]:
    scope = {**env, **dims}
    out = {
        "input_size": evaluate(ir.input_size, scope),
        "output_tokens": evaluate(ir.output_tokens, scope),
    }
    out["graph_rows"] = (
        evaluate(ir.graph_rows, scope)
        if ir.graph_rows is not None
        else out["output_tokens"]
    )
    out["budget_tokens"] = (
        evaluate(ir.budget_tokens, scope)
        if ir.budget_tokens is not None
        else out["output_tokens"]
    )
    return out


def capture_problems(
    ir: Arithmetic, overrides: Mapping[str, int] | None = None
) -> Iterator[tuple[str, str]]:
    """(field, message) for each arithmetic problem found with known values."""
    env = constant_env(ir, overrides)
    reported: set[str] = set()
    for mbs in SAMPLE_BATCH_SIZES:
        for budget in SAMPLE_BUDGETS:
            if mbs > budget:
                continue
            try:
                dims = dummy_item(ir, env, budget, mbs)
                values = item_values(ir, env, dims)
            except (EvaluationError, ArithmeticError):
                continue  # a constant without default: plan checks it
            bad_dims = [d for d, v in dims.items() if v <= 0]
            if bad_dims and "capture.dummy" not in reported:
                reported.add("capture.dummy")
                yield (
                    "capture.dummy",
                    f"dummy dims {', '.join(bad_dims)} are not positive for budget "
                    f"{budget} and max_batch_size {mbs}",
                )
            rows = mbs * values["input_size"]
            scope = capture_scope({**env, **dict(ir.sizes)}, budget, mbs, mbs, rows)
            for tensor in ir.capture_tensors:
                field = f"capture.tensors.{tensor.key}.shape"
                try:
                    held = evaluate(tensor.shape[0], scope)
                except (EvaluationError, ArithmeticError):
                    continue
                if held < rows and field not in reported:
                    reported.add(field)
                    yield (
                        field,
                        f"holds {held} rows but the dummy batch has {rows} input rows "
                        f"(budget {budget}, max_batch_size {mbs}); size dim 0 with 'rows'",
                    )
            for buf in ir.buffers:
                expr = set_by_expr(ir.metadata, buf)
                field = f"buffers.{buf.key}.set_by"
                try:
                    bound = evaluate(expr, scope) if expr is not None else None
                except (EvaluationError, ArithmeticError):
                    continue
                if bound is not None and bound < rows and field not in reported:
                    reported.add(field)
                    yield (
                        field,
                        f"{buf.key} is captured as {bound} but one sequence can hold all "
                        f"{rows} input rows of budget {budget} (a single large item, or "
                        "the trailing padding sequence); the attention launch would "
                        "truncate it (expected at least rows)",
                    )
            if not ir.items_resolved:
                continue
            # Graph rows the captured batch has room for: the dummy's, or
            # the declared capacity (which must hold the dummy's too).
            graph_capacity = mbs * values["graph_rows"]
            if ir.capture_graph_rows is not None:
                try:
                    declared = evaluate(ir.capture_graph_rows, scope)
                except (EvaluationError, ArithmeticError):
                    continue
                field = "capture.graph_rows"
                if declared < graph_capacity and field not in reported:
                    reported.add(field)
                    yield (
                        field,
                        f"is {declared} but the dummy batch already emits "
                        f"{graph_capacity} graph rows (budget {budget}, max_batch_size "
                        f"{mbs}): its builder values would not fit the buffers",
                    )
                graph_capacity = max(graph_capacity, declared)
                for buf in ir.buffers:
                    if not buf.allocate or not buf.shape:
                        continue
                    field = f"buffers.{buf.key}.shape"
                    try:
                        held = evaluate(buf.shape[0], scope)
                    except (EvaluationError, ArithmeticError):
                        continue
                    if held < graph_capacity and field not in reported:
                        reported.add(field)
                        yield (
                            field,
                            f"holds {held} rows but the captured batch has room for "
                            f"{graph_capacity} graph rows (budget {budget}, "
                            f"max_batch_size {mbs}); size dim 0 with capture.graph_rows",
                        )
            # The dummy batch must hold every batch whose budget tokens fit:
            # its graph rows and its budget tokens both reach the budget.
            covered = min(graph_capacity, mbs * values["budget_tokens"])
            if covered < budget and "capture.dummy" not in reported:
                reported.add("capture.dummy")
                k = per_item_tokens(budget, mbs)
                yield (
                    "capture.dummy",
                    f"the dummy batch cannot cover its budget: {mbs} dummy item(s) hold "
                    f"{covered} graph rows or budget tokens for budget {budget} (each "
                    f"item needs at least k = {k}); a batch that fits the budget would "
                    "overflow the buffers",
                )
    if (
        ir.capture_graph_rows is not None
        and ir.budget_tokens is not None
        and ir.items_resolved
    ):
        yield from item_bound_problems(ir, env)
    yield from slot_problems(ir.constants, ir.buffers, overrides)


#: Values tried for every grid dim when a per-item relation is checked.
SAMPLE_DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 64)
MAX_DIM_SAMPLES = 4096


def item_bound_problems(
    ir: Arithmetic, env: Mapping[str, int]
) -> Iterator[tuple[str, str]]:
    """With a declared graph-row capacity of at least the budget, a batch
    whose budget tokens fit has no more graph rows than that only if no item
    has more graph rows than budget tokens: checked on sampled dims.

    Every grid dim is sampled on its own, so write both formulas over the
    same dims where grids depend on each other (DeepSeek-V4.1: ``h``, ``w``
    rather than the derived ``lh``, ``lw``)."""
    dims = [d for g in ir.grid_inputs for d in g.dims]
    combos: Iterator[tuple[int, ...]]
    if len(SAMPLE_DIMS) ** len(dims) <= MAX_DIM_SAMPLES:
        combos = itertools.product(SAMPLE_DIMS, repeat=len(dims))
    else:
        rng = random.Random(0)
        combos = (
            tuple(rng.choice(SAMPLE_DIMS) for _ in dims) for _ in range(MAX_DIM_SAMPLES)
        )
    for combo in combos:
        try:
            values = item_values(ir, env, dict(zip(dims, combo)))
        except (EvaluationError, ArithmeticError):
            continue
        if values["graph_rows"] > values["budget_tokens"]:
            item = ", ".join(f"{d}={v}" for d, v in zip(dims, combo))
            yield (
                "capture.graph_rows",
                f"an item ({item}) has {values['graph_rows']} graph rows but "
                f"{values['budget_tokens']} budget tokens: a declared capacity "
                "covers a batch only if no item has more graph rows than budget "
                "tokens",
            )
            return


def slot_problems(
    constants: tuple[Constant, ...],
    buffers: tuple[Buffer, ...],
    overrides: Mapping[str, int] | None = None,
) -> Iterator[tuple[str, str]]:
    """A trailing padding sequence needs a spare cu_seqlens slot."""
    env = {c.name: c.default for c in constants if c.default is not None}
    env.update(overrides or {})
    for buf in buffers:
        if buf.pad is None or buf.slots is None:
            continue
        spare = 1 if buf.pad == "trailing_sequence" else 0
        for mbs in SAMPLE_BATCH_SIZES:
            try:
                slots = evaluate(
                    buf.slots,
                    {**env, "max_batch_size": mbs, "max_frames_per_batch": mbs},
                )
            except (EvaluationError, ArithmeticError):
                break
            if buf.pad == "repeat_last" and slots < mbs + 1:
                yield (
                    f"buffers.{buf.key}.slots",
                    f"{slots} slots for max_batch_size {mbs}: a full batch has "
                    f"{mbs + 1} offsets (expected at least max_batch_size + 1)",
                )
                break
            if spare and slots < mbs + 2:
                yield (
                    f"buffers.{buf.key}.slots",
                    f"{slots} slots for max_batch_size {mbs}: a full batch fills "
                    f"{mbs + 1} offsets and the padding sequence needs one spare slot "
                    f"(expected at least max_batch_size + 2)",
                )
                break
