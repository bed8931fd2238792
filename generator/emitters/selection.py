"""``select_encoder_cudagraph_items``: the sub-batch of some items, in order."""

from __future__ import annotations

from typing import Any

from generator.emitters.item_specs import checked
from generator.emitters.method_body import Body, Loads, per_item_list, signature
from generator.naming import PROTOCOL_MODULES
from generator.spec.inputs import FlatInput
from generator.spec.mixin import MixinSpec


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    body = Body(spec)
    loads = Loads(spec)
    entries = []
    needed: list[str] = []
    for item in spec.inputs:
        if isinstance(item, FlatInput):
            sizes, keys = per_item_list(spec, body, item.rows)
            needed += [k for k in keys if k not in needed]
            value = f"_select_rows({loads.flat(item.key)}, {sizes}, indices)"
        else:
            if item.key not in needed:
                needed.append(item.key)
            if item.is_count:
                value = f"_select_counts({item.key}, indices)"
            else:
                value = f"_select_grid({item.key}, indices, {len(item.dims)})"
        entries.append({"key": loads.key(item.key), "value": value})
    ctx = {
        "signature": signature(spec, "select_encoder_cudagraph_items"),
        "keys": loads.by_modality,
        "grids": [checked(g.key) for g in spec.item_inputs if g.key in needed],
        "checked": "self._checked_grids(mm_kwargs, indices)",
        "entries": entries,
        "axes": bool(spec.capture_axes),
        "axes_import": (
            PROTOCOL_MODULES[target]["defs"]
            if spec.capture_axes and spec.local_defs_import
            else None
        ),
    }
    ctx["constants"] = body.bindings()
    return ctx
