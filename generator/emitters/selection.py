"""``select_encoder_cudagraph_items``: the sub-batch of some items, in order."""

from __future__ import annotations

from typing import Any

from generator.emitters.item_specs import checked
from generator.emitters.method_body import (
    Body,
    Loads,
    per_item_list,
    signature,
    unit_sum,
    units_of_items,
)
from generator.formulas import Num
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
            sizes, keys = _flat_sizes(spec, body, item)
            needed += [k for k in keys if k not in needed]
            value = f"_select_rows({loads.flat(item.key)}, {sizes}, indices)"
        elif item.is_padded:
            # The chosen items in the form they came in (a list or a tensor).
            value = f"_select_padded(mm_kwargs[{loads.key(item.key)}], indices)"
        else:
            keys = [item.key] + ([item.unit_of] if item.unit_of else [])
            needed += [k for k in keys if k not in needed]
            if item.unit_of:
                # The chosen items' units, in order.
                units = f"_unit_indices({item.unit_of}, indices)"
                value = f"_select_grid({item.key}, {units}, {len(item.dims)})"
            elif item.is_list:
                # Each chosen item's unit tensors, as they came.
                value = f"_select_items(mm_kwargs[{loads.key(item.key)}], indices)"
            elif item.is_count:
                value = f"_select_counts({item.key}, indices)"
            else:
                value = f"_select_grid({item.key}, indices, {len(item.dims)})"
        entries.append({"key": loads.key(item.key), "value": value})
    # Grids before the counts that split them, as the inputs list them.
    needed = [k for k in (i.key for i in spec.inputs) if k in needed]
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


def _flat_sizes(spec: MixinSpec, body: Body, flat: FlatInput) -> tuple[str, list[str]]:
    """Each item's rows of a flat input, and the keys that gives them."""
    if flat.unit_of is None:
        return per_item_list(spec, body, flat.rows)
    if flat.rows == Num(1):
        return flat.unit_of, [flat.unit_of]  # one row per unit
    _, iterable, keys = units_of_items(spec)
    return f"[{unit_sum(spec, body, flat.rows)} for units in {iterable}]", keys
