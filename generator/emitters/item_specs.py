"""``get_encoder_cudagraph_item_specs``: one ``EncoderItemSpec`` per item."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.capture_axes import beyond_condition
from generator.emitters.graph_forward import steps
from generator.emitters import host_callees
from generator.emitters.method_body import (
    Body,
    dims_of,
    item_loop,
    signature,
    unit_any,
    unit_sum,
    units_of_items,
)
from generator.emitters.prose import comment_lines
from generator.naming import PROTOCOL_MODULES
from generator.spec import conditions
from generator.spec.mixin import MixinSpec


def checked(key: str) -> dict[str, str]:
    """A grid or count as ``_checked_grids`` returned it."""
    return {"name": key, "value": f'grids["{key}"]'}


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    body = Body(spec)
    items = spec.items
    # Only to collect the dims the formulas need.
    both = fx.BinOp("+", items.input_size, items.output_tokens)
    if items.budget_tokens is not None:
        both = fx.BinOp("+", both, items.budget_tokens)
    eager = items.eager_when
    if eager is not None:
        both = fx.BinOp("+", both, fx.BinOp("+", eager.left, eager.right))
    beyond_axes = [a for a in spec.capture_axes if a.eager_beyond]
    for axis in beyond_axes:
        for cover in axis.covers:
            both = fx.BinOp("+", both, cover)
    for path in spec.paths:
        if path.output_tokens is not None:
            both = fx.BinOp("+", both, path.output_tokens)
    for step in spec.count_steps:
        both = fx.BinOp("+", both, step.expr)
    if items.per_unit:
        # Each formula is per unit: an item's value is its units' sum.
        _, iterable, keys = units_of_items(spec)
        loop_target = "units"
        expr = lambda e: unit_sum(spec, body, e)  # noqa: E731
    else:
        loop_target, iterable, keys = item_loop(spec, dims_of(spec, both))
        expr = body.expr
    budget_tokens = items.budget_tokens
    if budget_tokens is None and (eager is not None or beyond_axes):
        budget_tokens = items.output_tokens
    conditions_ = []
    eager_condition = _eager_when(spec, body)
    if eager_condition is not None:
        conditions_.append(eager_condition)
    beyond = beyond_condition(spec, expr) if beyond_axes else None
    if beyond is not None:
        conditions_.append(beyond)
    ctx = {
        "signature": signature(spec, "get_encoder_cudagraph_item_specs"),
        "defs_local": spec.local_defs_import,
        "defs_module": PROTOCOL_MODULES[target]["defs"],
        "grids": [checked(k) for k in keys],
        "checked": "self._checked_grids(mm_kwargs)",
        "input_size": expr(items.input_size),
        "output_tokens": expr(items.output_tokens),
        "budget_tokens": (expr(budget_tokens) if budget_tokens is not None else None),
        "counts_other": items.budget_tokens is not None,
        "eager_when": " or ".join(conditions_) or None,
        "beyond_keys": beyond is not None,
        "path_tokens": (
            [{"name": repr(p.name), "value": expr(p.output_tokens)} for p in spec.paths]
            if spec.has_paths
            else None
        ),
        "target": loop_target,
        "iterable": iterable,
        "counted": _counted(spec, body),
        "check_callees": bool(host_callees.callees(spec)),
    }
    ctx["constants"] = body.bindings()
    return ctx


def _eager_when(spec: MixinSpec, body: Body) -> str | None:
    """The condition an item runs eagerly under; per unit (over a unit's
    dims), it holds for an item when it holds for any of its units: one
    unit no graph can take keeps the whole item from the graphs."""
    eager = spec.items.eager_when
    if eager is None:
        return None
    condition = conditions.to_python(eager, body.expr)
    return unit_any(spec, condition) if spec.items.per_unit else condition


def _counted(spec: MixinSpec, body: Body) -> dict[str, Any] | None:
    """An item's count from host steps, and the bound it is checked against."""
    counted = spec.items.count_steps
    if counted is None:
        return None
    return {
        "steps": steps(body, counted.steps, {}),
        "at_most": body.expr(counted.at_most),
        "why": comment_lines(counted.why),
    }
