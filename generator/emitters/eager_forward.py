"""``encoder_eager_forward``: the same rows without a graph."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.graph_forward import steps
from generator.emitters.method_body import (
    Body,
    Loads,
    dims_of,
    item_loop,
    path_dispatch,
)
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    ctx = path_dispatch(
        spec,
        "encoder_eager_forward",
        [_path_body(spec, p) for p in spec.paths],
    )
    ctx["keys"] = Loads(spec).by_modality
    return ctx


def _path_body(spec: MixinSpec, path: EncoderPath) -> dict[str, Any]:
    body = Body(spec)
    loads = Loads(spec)
    eager = path.eager_forward
    used = set().union(*(fx.names_in(s.expr) for s in eager.steps))
    flats = [f for f in spec.flat_inputs if f.key in used]
    flat_loads = []
    for flat in flats:
        value = loads.flat(flat.key)
        if flat.eager_dtype is not None:
            value = f"{value}.to({body.expr(flat.eager_dtype)})"
        flat_loads.append({"name": flat.key, "value": value})
    flat_loads += [
        loads.padded(g.key, stacked=False)
        for g in spec.item_inputs
        if g.is_padded and g.key in used
    ]
    ctx: dict[str, Any] = {
        "per_item": eager.per_item,
        "loads": flat_loads,
    }
    if eager.per_item:
        # As sent, under their own names: the loop zips them by item.
        ctx["loads"] = [
            (
                {"name": f"{d['name']}_items", "value": d["value"]}
                if spec.item_input(d["name"]) is not None
                else d
            )
            for d in flat_loads
        ]
    if not eager.per_item:
        ctx["grids"] = [
            loads.item(g.key)
            for g in spec.item_inputs
            if g.key in used and not g.is_padded
        ]
        ctx["steps"] = steps(body, eager.steps, {})
        ctx["constants"] = body.bindings()
        return ctx
    dims_needed = {d for g in spec.item_inputs for d in g.dims if d in used}
    for flat in flats:
        dims_needed |= dims_of(spec, flat.rows)
    # A padded or tensors input the steps read is the item's own tensor.
    tensors = [g for g in spec.item_inputs if g.is_padded and g.key in used]
    loop_target, iterable, keys = item_loop(spec, dims_needed)
    if tensors:
        if not dims_needed:
            keys = []  # the items' tensors alone
        loop_target, iterable = _with_item_tensors(spec, keys, tensors)
    slices = []
    name_map = {}
    for flat in flats:
        slices.append(
            {
                "flat": flat.key,
                "item": f"item_{flat.key}",
                "offset": f"{flat.key}_offset",
                "rows": body.expr(flat.rows),
            }
        )
        name_map[flat.key] = f"item_{flat.key}"
    name_map.update({g.key: f"{g.key}_item" for g in tensors})
    assert eager.empty_width is not None  # noqa: S101 (the model requires it)
    ctx.update(
        grids=[loads.item(k) for k in keys],
        target=loop_target,
        iterable=iterable,
        slices=slices,
        steps=steps(body, eager.steps, name_map),
        empty_like=flats[0].key if flats else None,
        empty_width=body.expr(eager.empty_width),
    )
    ctx["constants"] = body.bindings()
    return ctx


def _with_item_tensors(spec: MixinSpec, keys: list[str], tensors) -> tuple[str, str]:
    """The per-item loop's target and iterable with each item's own tensor of
    ``tensors`` (a list's entry, or a row of one stacked tensor) zipped in
    after the grids' dims."""
    inputs = [spec.item_input(k) for k in keys]
    parts = [g.dims[0] if g.is_count else f"({', '.join(g.dims)})" for g in inputs]
    target = ", ".join(parts + [f"{g.key}_item" for g in tensors])
    names = keys + [f"{g.key}_items" for g in tensors]
    if len(names) == 1:
        return target, names[0]
    return target, f"zip({', '.join(names)}, strict=True)"
