"""``_checked_grids``: the batch's grids and counts as Python ints, after
checking on the host that every input agrees with them.

Inconsistent ``mm_kwargs`` (pixel rows that do not match the grid, a float
grid, a derived grid that does not match its source, span types of the wrong
length or kind) run without an error on the graph and the eager path and give
wrong rows. Item specs and selection read their grids through this helper, so
each execute checks its batch once before anything runs, and each selection
its input and indices. Only shapes and host values are read: no device value.
"""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.method_body import (
    Body,
    Loads,
    item_loop,
    of_list,
    signature,
    unit_grids,
)
from generator.spec.enums import Dtype
from generator.spec.inputs import FlatInput, ItemInput
from generator.spec.mixin import MixinSpec


def _reads(spec: MixinSpec, loads: Loads, body: Body) -> list[dict[str, str]]:
    out = []
    for item in spec.item_inputs:
        key = loads.key(item.key)
        if item.is_tensors:
            shape = _tensors_shape(body, item)
            value = f"_tensor_values(mm_kwargs, {key}, {shape}, {item.dims!r})"
        elif item.is_padded:
            shape = _padded_item_shape(spec, body, item)
            value = f"_padded_values(mm_kwargs, {key}, {shape})"
        elif item.is_list:
            value = f"_list_lengths(mm_kwargs, {key}{_least(spec, item)})"
        elif of_list(spec, item):
            value = f"_unit_grid_values(mm_kwargs, {key}, {len(item.dims)})"
        elif item.is_count:
            value = f"_count_values(mm_kwargs, {key}{_least(spec, item)})"
        else:
            value = f"_grid_values(mm_kwargs, {key}, {len(item.dims)})"
        out.append({"name": item.key, "value": value})
    return out


def _least(spec: MixinSpec, item: ItemInput) -> str:
    return ", least=1" if least_units(spec, item) else ""


def least_units(spec: MixinSpec, item: ItemInput) -> int:
    """1 for a count or list input whose zero (an item of no units) leaves
    the item without output tokens where no path allows that (the manager
    would return nothing for it: a ``KeyError`` in postprocess): the units of
    items made of units, or a count that the item formula multiplies
    (evaluated at 0, the other dims at 1, the constants' defaults); else 0.
    """
    if any(path.allow_zero_tokens for path in spec.paths):
        return 0
    units_of = {g.unit_of for g in spec.item_inputs}
    if spec.items.per_unit and (item.is_list or item.key in units_of):
        return 1
    env = {c.name: c.default for c in spec.constants if c.default is not None}
    env |= {d: 1 for i in spec.item_inputs for d in i.dims}
    if spec.items.output_tokens is None:
        return 0
    try:
        tokens = fx.evaluate(spec.items.output_tokens, {**env, item.dims[0]: 0})
    except (ArithmeticError, KeyError):  # a name without a default
        return 0
    return 1 if tokens < 1 else 0


def _padded_item_shape(spec: MixinSpec, body: Body, item: ItemInput) -> str:
    """The shape past the size dim every item of a padded input must have:
    its capture buffers' (``shape[2:]``) when constants fix it, else None
    (the replay copy would broadcast a narrower one silently)."""
    constants = {c.name for c in spec.constants}
    shapes = set()
    for path in spec.paths:
        for tensor in path.capture.tensors:
            if tensor.key != item.key or path.buffer(item.key) is None:
                continue
            trailing = tensor.shape[2:]
            if any(fx.names_in(e) - constants for e in trailing):
                return "None"
            shapes.add(tuple(body.expr(e) for e in trailing))
    if len(shapes) != 1:
        return "None"
    (dims,) = shapes
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _tensors_shape(body: Body, item: ItemInput) -> str:
    """A tensors input's item shape for ``_tensor_values``: each dim by name,
    every other entry its constant formula."""
    parts = [
        repr(e.name) if isinstance(e, fx.Ref) and e.name in item.dims else body.expr(e)
        for e in item.item_shape
    ]
    return "(" + ", ".join(parts) + ")"


def _padded_groups(spec: MixinSpec, loads: Loads) -> list[str]:
    """``{key: sizes, ...}`` of the padded inputs that share a size dim, for
    ``_check_same_sizes`` (an image's pixels and positions are one item)."""
    groups: dict[str, list[ItemInput]] = {}
    for item in spec.item_inputs:
        if item.is_padded and not item.is_tensors:
            groups.setdefault(item.dims[0], []).append(item)
    return [
        "{" + ", ".join(f"{loads.key(i.key)}: {i.key}" for i in group) + "}"
        for group in groups.values()
        if len(group) > 1
    ]


def _relation(spec: MixinSpec, body: Body, loads: Loads, item: ItemInput) -> dict:
    """One loop over the items comparing ``item``'s derived dims with their
    formulas (``inputs.<key>.equals``); the message names both inputs."""
    needed = set(item.dims)
    for _, expr in item.equals:
        needed |= fx.names_in(expr)
    target, iterable, keys = item_loop(spec, needed)
    printed = [(dim, body.expr(expr)) for dim, expr in item.equals]
    sources = [spec.item_input(k) for k in keys if k != item.key]
    rules = ", ".join(
        f"({repr(f'{dim} = {fx.to_spec_text(expr)}')}, {value})"
        for (dim, expr), (_, value) in zip(item.equals, printed, strict=True)
    )
    used = sorted(
        {n for _, e in item.equals for n in fx.names_in(e)}
        & {c.name for c in spec.constants}
    )
    return {
        "comment": (
            f"{item.key} is derived from {', '.join(s.key for s in sources)}."
            if sources
            else f"{item.key}'s dims are derived from each other."
        ),
        "target": f"index, ({target})" if "," in target else f"index, {target}",
        "iterable": f"enumerate({iterable})",
        "condition": " or ".join(f"{dim} != {value}" for dim, value in printed),
        "derived": f"({loads.key(item.key)}, {_row(item)})",
        "sources": "{"
        + ", ".join(f"{loads.key(s.key)}: {_row(s)}" for s in sources)
        + "}",
        "rules": f"[{rules}]",
        "constants": "{" + ", ".join(f"{n!r}: {n}" for n in used) + "}",
    }


def _row(item: ItemInput) -> str:
    return item.dims[0] if item.is_count else f"[{', '.join(item.dims)}]"


def _row_shape(spec: MixinSpec, body: Body, flat: FlatInput) -> str | None:
    """The captured buffers' row shape as a tuple expression, when every path
    that captures ``flat`` gives it one fixed by constants and host paths
    (then every real row must have it: the replay copy would broadcast a
    narrower one silently)."""
    constants = {c.name for c in spec.constants}
    shapes = set()
    for path in spec.paths:
        for tensor in path.capture.tensors:
            if tensor.key != flat.key or path.buffer(flat.key) is None:
                # A capture tensor that is no buffer only feeds the builders
                # at capture: no replay copies rows into it.
                continue
            trailing = tensor.shape[1:]
            if not trailing or any(fx.names_in(e) - constants for e in trailing):
                return None
            shapes.add(tuple(body.expr(e) for e in trailing))
    if len(shapes) != 1:
        return None
    (dims,) = shapes
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _unit_rows_total(spec: MixinSpec, body: Body, flat: FlatInput) -> tuple[str, str]:
    """A flat input of units: its rows in all (one per unit, or its formula
    summed over every unit's grid row) and the keys that give them."""
    if flat.rows == fx.Num(1):
        return f"sum({flat.unit_of})", flat.unit_of
    grids = unit_grids(spec)
    if len(grids) == 1:
        target, rows = ", ".join(grids[0].dims), grids[0].key
    else:
        target = ", ".join(f"({', '.join(g.dims)})" for g in grids)
        rows = f"zip({', '.join(g.key for g in grids)}, strict=True)"
    keys = ", ".join(g.key for g in grids)
    return f"sum({body.expr(flat.rows)} for {target} in {rows})", keys


def _unit_width(spec: MixinSpec, body: Body, flat: FlatInput) -> str | None:
    """The widest unit's ``input_size``, when each row of ``flat`` pads one
    unit along dim 1 (``pads_units``): the width must hold every unit's
    patches, or a grid scaled past the pixels (even past int64) would pass
    the row count and fail deep in the tower."""
    if not flat.pads_units:
        return None
    grids = unit_grids(spec)
    size = body.expr(spec.items.input_size)
    if len(grids) == 1:
        target, rows = ", ".join(grids[0].dims), grids[0].key
    else:
        target = ", ".join(f"({', '.join(g.dims)})" for g in grids)
        rows = f"zip({', '.join(g.key for g in grids)}, strict=True)"
    return f"max(({size} for {target} in {rows}), default=0)"


def _takes_bool(spec: MixinSpec, flat: FlatInput) -> bool:
    """A capture declares ``flat`` as bool (Idefics3's pixel mask): its bool
    rows are real; any other flat input's bool rows are refused."""
    return any(
        t.key == flat.key and t.dtype == Dtype.BOOL
        for path in spec.paths
        for t in path.capture.tensors
    )


def _rows_check(spec: MixinSpec, body: Body, loads: Loads, flat: FlatInput) -> dict:
    if flat.unit_of is not None:
        total, keys = _unit_rows_total(spec, body, flat)
        return {
            "takes_bool": _takes_bool(spec, flat),
            "unit_width": _unit_width(spec, body, flat),
            "key": loads.key(flat.key),
            "total": total,
            "per_item": repr(f"{fx.to_spec_text(flat.rows)} per unit from {keys}"),
            "row_shape": _row_shape(spec, body, flat),
            "accepts_list": flat.accepts_list,
            "fold_ranks": repr(flat.fold_ranks) if flat.fold_ranks else None,
        }
    target, iterable, keys = item_loop(spec, fx.names_in(flat.rows))
    rows = body.expr(flat.rows)
    if rows == target and iterable in keys:
        # One row per count: the counts themselves.
        total = f"sum({iterable})"
    elif fx.names_in(flat.rows) & {d for g in spec.item_inputs for d in g.dims}:
        total = f"sum({rows} for {target} in {iterable})"
    else:
        total = (
            f"num_items * ({rows})"
            if isinstance(flat.rows, fx.BinOp)
            else f"num_items * {rows}"
        )
    per_item = f"{fx.to_spec_text(flat.rows)} from {', '.join(keys)}"
    return {
        "takes_bool": _takes_bool(spec, flat),
        "unit_width": None,
        "key": loads.key(flat.key),
        "total": total,
        "per_item": repr(per_item),
        "row_shape": _row_shape(spec, body, flat),
        "accepts_list": flat.accepts_list,
        "fold_ranks": repr(flat.fold_ranks) if flat.fold_ranks else None,
    }


def _unit_shapes(spec: MixinSpec, body: Body, loads: Loads, item: ItemInput) -> dict:
    """Each unit's expected shape of the list input ``item``, from its unit
    grids' rows (or the constants alone), item after item."""
    shape = ", ".join(body.expr(e) for e in item.unit_shape)
    shape = f"({shape},)" if len(item.unit_shape) == 1 else f"({shape})"
    grids = [g for g in spec.item_inputs if g.unit_of == item.key]
    if not grids:
        shapes = f"[{shape}] * sum({item.key})"
    elif len(grids) == 1:
        shapes = f"[{shape} for {', '.join(grids[0].dims)} in {grids[0].key}]"
    else:
        target = ", ".join(f"({', '.join(g.dims)})" for g in grids)
        rows = f"zip({', '.join(g.key for g in grids)}, strict=True)"
        shapes = f"[{shape} for {target} in {rows}]"
    return {"key": loads.key(item.key), "shapes": shapes}


def _span(spec: MixinSpec, body: Body, loads: Loads) -> dict[str, Any] | None:
    span = spec.span_assembly
    if span is None:
        return None
    items = spec.items
    graph_rows = items.graph_rows or items.output_tokens
    rows_target, rows_iter, _ = item_loop(spec, fx.names_in(graph_rows))
    len_target, len_iter, _ = item_loop(spec, fx.names_in(items.output_tokens))
    kinds = [span.content.name] + [imp.name for imp, _ in span.delimiters]
    return {
        "key": loads.key(span.types.key),
        "kinds": "{" + ", ".join(f"{n!r}: {n}" for n in kinds) + "}",
        "content": repr(span.content.name),
        "content_rows": f"[{body.expr(graph_rows)} for {rows_target} in {rows_iter}]",
        "lengths": f"[{body.expr(items.output_tokens)} for {len_target} in {len_iter}]",
    }


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    body = Body(spec)
    loads = Loads(spec)
    # The constants a padded input's item shape reads are bound before the
    # inputs are read (the others after the selection's early return).
    early = Body(spec)
    reads = _reads(spec, loads, early)
    body.used |= early.used
    relations = [_relation(spec, body, loads, i) for i in spec.item_inputs if i.equals]
    ctx = {
        "signature": signature(spec, "_checked_grids"),
        "keys": loads.by_modality,
        "early_constants": early.bindings(),
        "reads": reads,
        "same_sizes": _padded_groups(spec, loads),
        # Unit grids have a row per unit, not per item: their count input
        # must give as many units as they hold.
        "counted": "{"
        + ", ".join(
            f"{loads.key(i.key)}: {i.key}"
            for i in spec.item_inputs
            if i.unit_of is None
        )
        + "}",
        "units": [
            {
                "grid": loads.key(g.key),
                "rows": g.key,
                "count": loads.key(g.unit_of),
                "counts": g.unit_of,
            }
            for g in unit_grids(spec)
        ],
        "relations": relations,
        "multiples": [
            {
                "key": loads.key(i.key),
                "rows": i.key,
                "rules": "("
                + "".join(
                    f"({i.dims.index(dim)}, {dim!r}, {body.expr(expr)}), "
                    for dim, expr in i.multiple_of
                )
                + ")",
            }
            for i in spec.item_inputs
            if i.multiple_of
        ],
        "rows": [_rows_check(spec, body, loads, f) for f in spec.flat_inputs],
        "unit_shapes": [
            _unit_shapes(spec, body, loads, i) for i in spec.item_inputs if i.is_list
        ],
        "span": _span(spec, body, loads),
        "returns": [i.key for i in spec.item_inputs],
    }
    ctx["constants"] = [c for c in body.bindings() if c not in ctx["early_constants"]]
    return ctx


def helpers(spec: MixinSpec) -> dict[str, bool]:
    """Which module-level check functions the module needs."""
    return {
        "grids": any(not i.is_count and not i.is_padded for i in spec.item_inputs),
        "counts": any(i.is_count and not i.is_list for i in spec.item_inputs),
        "rows": bool(spec.flat_inputs),
        "padded": any(i.is_padded and not i.is_tensors for i in spec.item_inputs),
        "same_sizes": bool(_padded_groups(spec, Loads(spec))),
        "tensors": any(i.is_tensors for i in spec.item_inputs),
        "lists": any(i.is_list for i in spec.item_inputs),
        "span": spec.span_assembly is not None,
        "relations": any(i.equals for i in spec.item_inputs),
        "multiples": any(i.multiple_of for i in spec.item_inputs),
        "units": bool(unit_grids(spec)),
        "unit_widths": any(f.pads_units for f in spec.flat_inputs),
        "modalities": spec.has_video_keys,
    }
