"""``encoder_eager_forward``: the same rows without a graph."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.graph_forward import steps
from generator.emitters.method_body import (
    Body,
    ItemCuts,
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
    if not eager.per_item:  # per item: each read cut to the item (ItemCuts)
        flat_loads += [
            loads.padded(g.key, stacked=False)
            for g in spec.item_inputs
            if g.is_padded and g.key in used
        ]
    ctx: dict[str, Any] = {
        "per_item": eager.per_item,
        "loads": flat_loads,
    }
    if not eager.per_item:
        ctx["grids"] = [
            loads.item(g.key)
            for g in spec.item_inputs
            if g.key in used and not g.is_padded
        ]
        ctx["steps"] = steps(body, eager.steps, {})
        ctx["constants"] = body.bindings()
        return ctx
    cuts = ItemCuts(spec, body, used, "mm_kwargs", flats=False)
    dims_needed = {d for g in spec.item_inputs for d in g.dims if d in used}
    dims_needed |= cuts.dims
    for flat in flats:
        dims_needed |= dims_of(spec, flat.rows)
    loop_target, iterable, keys = item_loop(spec, dims_needed)
    slices = []
    name_map = dict(cuts.name_map)
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
    assert eager.empty_width is not None  # noqa: S101 (the model requires it)
    if cuts.position and not dims_needed:
        # Only the item's place is needed (its inputs are cut by it).
        loop_target = None
    ctx.update(
        grids=[loads.item(k) for k in keys],
        target=loop_target,
        iterable=iterable,
        slices=slices,
        cuts=cuts.lines,
        position=cuts.position,
        steps=steps(body, eager.steps, name_map),
        empty_like=flats[0].key if flats else None,
        empty_width=body.expr(eager.empty_width),
    )
    ctx["constants"] = body.bindings()
    return ctx
