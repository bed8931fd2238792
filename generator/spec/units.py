"""Items made of units: inputs with one entry per unit (tile) rather than
per item (``inputs.<key>.unit_of``), a count input giving each item's units,
and item formulas per unit, summed over an item's units
(``items.per_unit``). LFM2-VL's images are such: ``spatial_shapes`` per tile,
``num_patches`` tiles per image."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from generator import formulas as fx
from generator.spec.inputs import FlatInput, Input, ItemInput
from generator.spec.items import Items
from generator.spec.reader import Reader


def unit_inputs(inputs: Iterable[Input]) -> Iterator[Input]:
    """The inputs with one entry per unit."""
    return (i for i in inputs if i.unit_of is not None)


def _dims(inputs: Iterable[Input]) -> set[str]:
    return {d for i in inputs if isinstance(i, ItemInput) for d in i.dims}


def check_units(r: Reader, inputs: list[Input], items: Items) -> None:
    """``unit_of`` names one count input; per-unit formulas read only unit
    dims, per-item ones none."""
    units = list(unit_inputs(inputs))
    by_key = {i.key: i for i in inputs}
    counts = {i.unit_of for i in units}
    for i in units:
        target = by_key.get(i.unit_of)
        if not (isinstance(target, ItemInput) and target.is_count):
            r.ctx.error(
                i.location,
                f"inputs.{i.key}.unit_of",
                f"{i.unit_of!r} is not a count input (it gives each item's units)",
            )
    if len(counts) > 1 and all(
        isinstance(by_key.get(c), ItemInput) and by_key[c].is_count for c in counts
    ):
        r.error("inputs", f"units of several counts ({', '.join(sorted(counts))})")
    unit_dims = _dims(units)
    item_dims = _dims(inputs) - unit_dims
    if items.per_unit and not unit_dims:
        r.error(
            "items",
            "per_unit needs a grid with unit_of (the dims of a unit)",
            "items.per_unit",
        )
    wrong, what = (
        (item_dims, "per-unit formulas read a unit's dims only")
        if items.per_unit
        else (unit_dims, "the dims of a unit need items.per_unit (summed per item)")
    )
    for key, expr in items.formulas.items():
        bad = sorted(fx.names_in(expr) & wrong)
        if bad:
            r.error("items", f"{what}: {', '.join(bad)}", f"items.{key}")
    if items.eager_when is not None:
        # Per unit, the condition is tested on each unit (any one sends the
        # item to the eager forward): it sees a unit's dims, as the formulas.
        bad = sorted(items.eager_when.names() & wrong)
        if bad:
            r.error("items", f"{what}: {', '.join(bad)}", "items.eager_when")
    for flat in (i for i in units if isinstance(i, FlatInput)):
        # Per-item formulas see an item's units only by their count: a
        # unit's rows are then the same for every unit.
        bad = sorted(fx.names_in(flat.rows) & (item_dims | wrong))
        if bad:
            r.ctx.error(
                flat.location,
                f"inputs.{flat.key}.rows",
                (
                    f"rows of a unit read a unit's dims only: {', '.join(bad)}"
                    if items.per_unit
                    else "without items.per_unit every unit has the same rows "
                    f"(constants only): {', '.join(bad)}"
                ),
            )
        if flat.pads_units and not (items.per_unit and flat.rows == fx.Num(1)):
            r.ctx.error(
                flat.location,
                f"inputs.{flat.key}.pads_units",
                "needs items.per_unit and one row per unit (a row holds one "
                "unit's input_size patches)",
            )


def check_unit_path(r: Reader, path) -> None:
    """Units need a unit capture, and no per-item eager forward."""
    if not path.capture.of_units:
        r.error(
            "capture",
            "inputs with unit_of need a unit capture (capture.units): a dummy "
            "item has no units",
        )
    if path.eager_forward.per_item:
        r.error(
            "eager_forward",
            "per_item does not go with unit_of inputs: run the batch at once",
            "eager_forward.per_item",
        )


def check_list_path(r: Reader, path, lists: list[str], unit_grids: bool) -> None:
    """A list input's units are the batch's units: they need a unit capture
    (said once, by :func:`check_unit_path`, when unit grids need it too),
    and its value (a list of tensors) is no buffer the manager could copy;
    builders make the buffers from it."""
    if not path.capture.of_units and not unit_grids:
        r.error(
            "capture",
            f"list inputs ({', '.join(lists)}) need a unit capture (capture.units): "
            "their units are what a budget holds",
        )
    for buf in path.buffers:
        if buf.key in lists:
            r.ctx.error(
                buf.location,
                f"{path.field}buffers.{buf.key}",
                "a list input is no buffer (the manager copies tensors): build "
                "the buffer from it in a builder's steps",
            )
