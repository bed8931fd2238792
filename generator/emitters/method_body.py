"""What the emitters of several methods share: signatures from the scope
table, the constants a body binds, loops over the items' grids and counts,
and how inputs are read from ``mm_kwargs``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from generator import formulas as fx
from generator.emitters.prose import comment_lines, message_literal
from generator.formulas import Expr
from generator.scopes import METHODS
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath

#: The protocol's data classes, imported at module top or inside each method.
DEFS_NAMES = (
    "EncoderCudaGraphCaptureInputs",
    "EncoderCudaGraphConfig",
    "EncoderCudaGraphReplayBuffers",
    "EncoderItemSpec",
)


def quote_defs(spec: MixinSpec, text: str) -> str:
    """An annotation with its ``{DataClass}`` marks filled in: quoted when the
    data classes are imported inside the methods only."""
    names = {n: (f'"{n}"' if spec.local_defs_import else n) for n in DEFS_NAMES}
    return text.format(**names)


def signature(spec: MixinSpec, method: str) -> dict[str, Any]:
    """A method's ``def`` line parts, from :data:`generator.scopes.METHODS`."""
    m = METHODS[method]
    params = []
    for p in m.params:
        text = p.name
        if p.annotation:
            text += f": {quote_defs(spec, p.annotation)}"
        if p.default is not None:
            text += f" = {p.default}"
        params.append(text)
    return {
        "name": m.name,
        "params": params,
        "returns": quote_defs(spec, m.returns),
        "exploded": m.exploded,
    }


def path_dispatch(
    spec: MixinSpec, method: str, bodies: list[dict[str, Any]]
) -> dict[str, Any]:
    """A method that runs one path's body: each body under ``if path ==
    <name>:`` when the spec has paths (an unknown path raises), else the
    default path's body alone."""
    names = ", ".join(p.name for p in spec.paths)
    return {
        "signature": signature(spec, method),
        "dispatch": spec.has_paths,
        "paths": [
            {"name": repr(p.name), "why": comment_lines(p.why), "body": body}
            for p, body in zip(spec.paths, bodies, strict=True)
        ],
        "unknown_path": message_literal(
            [
                (f"{spec.display_name} has no encoder path", False),
                ("path!r", True),
                (f"(its paths: {names}).", False),
            ]
        ),
    }


@dataclass
class Body:
    """One method body: prints expressions and tracks the constants they use,
    which the body binds first thing."""

    spec: MixinSpec
    used: set[str] = field(default_factory=set)

    def expr(self, expr: Expr, name_map: dict[str, str] | None = None) -> str:
        for name in fx.names_in(expr):
            if self.spec.constant(name) is not None:
                self.used.add(name)
        return fx.to_python(expr, name_map)

    def bindings(self) -> list[dict[str, str]]:
        return [
            {"name": c.name, "value": c.value_python()}
            for c in self.spec.constants
            if c.name in self.used
        ]


def dims_of(spec: MixinSpec, expr: Expr) -> set[str]:
    dims = {d for g in spec.item_inputs for d in g.dims}
    return fx.names_in(expr) & dims


def item_loop(spec: MixinSpec, dims_needed: set[str]) -> tuple[str, str, list[str]]:
    """``for <target> in <iterable>`` over the grids and counts whose dims are
    needed (the first one when none is), and the keys it reads."""
    inputs = [g for g in spec.item_inputs if dims_needed & set(g.dims)] or [
        spec.item_inputs[0]
    ]
    # Padded inputs share their size dim: the first one gives it.
    inputs = [
        g
        for i, g in enumerate(inputs)
        if not g.is_padded or not any(set(g.dims) <= set(h.dims) for h in inputs[:i])
    ]
    if len(inputs) == 1:
        return ", ".join(inputs[0].dims), inputs[0].key, [inputs[0].key]
    target = ", ".join(
        g.dims[0] if len(g.dims) == 1 else f"({', '.join(g.dims)})" for g in inputs
    )
    iterable = f"zip({', '.join(g.key for g in inputs)}, strict=True)"
    return target, iterable, [g.key for g in inputs]


def per_item_list(spec: MixinSpec, body: Body, expr: Expr) -> tuple[str, list[str]]:
    """``[<expr> for <dims> in <grids>]`` (a count input itself when ``expr``
    is its dim; ``[<expr>] * len(<grid>)`` when ``expr`` reads no dim) and
    the keys it reads."""
    dims = dims_of(spec, expr)
    target, iterable, keys = item_loop(spec, dims)
    if not dims:
        return f"[{body.expr(expr)}] * len({iterable})", keys
    if expr == fx.Ref(target) and iterable in keys:
        return iterable, keys
    return f"[{body.expr(expr)} for {target} in {iterable}]", keys


def times(factor: str, body: Body, expr: Expr) -> str:
    """``factor * <expr>``, with parentheses only around an operation."""
    text = body.expr(expr)
    return (
        f"{factor} * ({text})" if isinstance(expr, fx.BinOp) else f"{factor} * {text}"
    )


class Loads:
    """How a method reads the batch's inputs (by modality key, when the spec
    has video keys: ``keys = self._modality_keys(mm_kwargs)`` comes first)."""

    def __init__(self, spec: MixinSpec) -> None:
        self.spec = spec
        self.by_modality = spec.has_video_keys

    def key(self, key: str) -> str:
        return f'keys["{key}"]' if self.by_modality else f'"{key}"'

    def flat(self, key: str, source: str = "mm_kwargs") -> str:
        read = f"{source}[{self.key(key)}]"
        flat = self.spec.flat(key)
        if flat and flat.accepts_list:
            read = f"_concat_rows({read})"
        if flat and flat.fold_ranks:
            read = f"_fold_leading({read}, {flat.fold_ranks!r})"
        return read

    def item(self, key: str, source: str = "mm_kwargs") -> dict[str, str]:
        item = self.spec.item_input(key)
        if item is not None and item.is_tensors:
            # A tensors input's dims (its grid), read off each item's shape.
            positions = repr(item.dim_positions)
            return {
                "name": key,
                "value": f"_tensor_dims({source}[{self.key(key)}], {positions})",
            }
        if item is not None and item.is_padded:
            # A padded input's sizes (its grid), read off the shapes.
            return {
                "name": key,
                "value": f"_padded_sizes({source}[{self.key(key)}])",
            }
        if item is not None and item.is_list:
            # The batch's unit tensors, item after item.
            return {
                "name": key,
                "value": f"self._list_units({source}, {self.key(key)})",
            }
        if item is not None and of_list(self.spec, item):
            width = len(item.dims)
            value = f"_unit_grid_values({source}, {self.key(key)}, {width})"
            return {"name": key, "value": value}
        reader = "_counts" if item is not None and item.is_count else "_grid_rows"
        return {"name": key, "value": f"self.{reader}({source}, {self.key(key)})"}

    def padded(self, key: str, stacked: bool) -> dict[str, str]:
        """A padded input as the tensor a forward or builder reads: as sent
        (a list or a tensor: the model's eager path takes both), or stacked
        into one ``(N, max P, ...)`` tensor (replay)."""
        read = f"mm_kwargs[{self.key(key)}]"
        if stacked:
            item = self.spec.item_input(key)
            read = f"_stack_padded({read}, {item.pad_value!r})"
        return {"name": key, "value": read}


def optional_note(path: EncoderPath) -> str | None:
    """Why some buffers of ``path`` may be None (a comment)."""
    keys = [b.key for b in path.buffers if b.optional]
    if not keys:
        return None
    verb = "is" if len(keys) == 1 else "are"
    return (
        f"{', '.join(keys)} {verb} None where the builder does not need "
        f"{'it' if len(keys) == 1 else 'them'} (other attention backends): the "
        "manager skips a None buffer."
    )


# -- items made of units (LFM2-VL's tiles) ------------------------------------------


def of_list(spec: MixinSpec, item) -> bool:
    """A grid of one row per unit of a list input (MiniCPM-V's ``tgt_sizes``)."""
    target = spec.item_input(item.unit_of) if item.unit_of else None
    return target is not None and target.is_list


def unit_grids(spec: MixinSpec) -> list:
    """The grids with one row per unit."""
    return [g for g in spec.item_inputs if g.unit_of is not None]


def units_of_items(spec: MixinSpec) -> tuple[str, str, list[str]]:
    """(``for`` target over one item's units, the list of each item's
    units, the keys it reads): ``h, w`` and ``_split_units(spatial_shapes,
    num_patches)``."""
    grids = unit_grids(spec)
    count = grids[0].unit_of
    if len(grids) == 1:
        target, rows = ", ".join(grids[0].dims), grids[0].key
    else:
        target = ", ".join(f"({', '.join(g.dims)})" for g in grids)
        rows = f"list(zip({', '.join(g.key for g in grids)}, strict=True))"
    keys = [g.key for g in grids] + [count]
    return target, f"_split_units({rows}, {count})", keys


def unit_any(spec: MixinSpec, condition: str) -> str:
    """``any(<condition> for <unit dims> in units)``: a per-unit condition
    that holds for an item when it holds for one of its units (bound as
    ``units``)."""
    target, _, _ = units_of_items(spec)
    return f"any({condition} for {target} in units)"


def unit_sum(spec: MixinSpec, body: Body, expr: Expr) -> str:
    """``sum(<expr> for <unit dims> in units)``: a per-unit formula summed
    over the units of one item (bound as ``units``); ``<expr> * len(units)``
    when the formula reads no unit dim."""
    target, _, _ = units_of_items(spec)
    if not fx.names_in(expr) & set(re.findall(r"\w+", target)):
        return times("len(units)", body, expr)
    return f"sum({body.expr(expr)} for {target} in units)"


class ItemCuts:
    """The inputs per-item steps read, each cut to the item: a flat input's
    rows (a running offset per input), a padded or tensors input's tensor
    (the item's entry of the list or of the stacked tensor), a grid's row
    (its dims, bound by the loop) and a count's value (its dim)."""

    def __init__(
        self,
        spec: MixinSpec,
        body: Body,
        used: set[str],
        source: str,
        flats: bool = True,
    ) -> None:
        """``source``: the batch's inputs (``batch_mm_kwargs``); ``flats``:
        cut the flat inputs too (the eager forward slices its own)."""
        loads = Loads(spec)
        #: Item dims the cuts read: the loop must bind them.
        self.dims: set[str] = set()
        self.name_map: dict[str, str] = {}
        self.loads: list[dict[str, str]] = []
        self.lines: list[str] = []
        self.position = False
        for flat in spec.flat_inputs if flats else ():
            if flat.key not in used:
                continue
            rows = body.expr(flat.rows)
            self.dims |= dims_of(spec, flat.rows)
            offset, item = f"{flat.key}_offset", f"item_{flat.key}"
            batch = f"batch_{flat.key}"
            self.loads.append({"name": batch, "value": loads.flat(flat.key, source)})
            self.loads.append({"name": offset, "value": "0"})
            self.lines += [
                f"{item} = {batch}[{offset} : {offset} + {rows}]",
                f"{offset} += {rows}",
            ]
            self.name_map[flat.key] = item
        for g in spec.item_inputs:
            if g.key not in used:
                continue
            if g.is_count:  # a list input is unbound here (the reader)
                self.dims.add(g.dims[0])
                self.name_map[g.key] = g.dims[0]
                continue
            item = f"item_{g.key}"
            self.name_map[g.key] = item
            if g.is_padded:
                self.position = True
                read = f"{source}[{loads.key(g.key)}]"
                self.lines.append(f"{item} = {read}[position]")
            else:
                self.dims |= set(g.dims)
                self.lines.append(f"{item} = [{', '.join(g.dims)}]")

    def context(self) -> dict[str, Any]:
        return {
            "name_map": self.name_map,
            "input_loads": self.loads,
            "cuts": self.lines,
            "position": self.position,
        }
