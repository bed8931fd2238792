"""The dummy batch, its builders and the captured buffers of one encoder path."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, ClassVar

from generator.diagnostics import Location
from generator.formulas import Call, Expr, HostPath, Ref
from generator.scopes import ITEM_CAPTURE_NAMES, UNIT_CAPTURE_NAMES, NameKind
from generator.spec.conditions import Comparison, Condition
from generator.spec.forwards import BUILDER_STEPS, Step
from generator.spec.enums import (
    Backend,
    Dtype,
    Fill,
    Modality,
    PadRule,
    ReplayRule,
    Rounding,
)
from generator.spec.inputs import FlatInput, ItemInput
from generator.spec.names import check_name
from generator.spec.reader import Key, Keys, ReadContext, Reader
from generator.spec.values import (
    INVALID,
    Argument,
    Boolean,
    CallValue,
    Choice,
    DtypeValue,
    Formula,
    HostPathValue,
    Identifier,
    Integer,
    ListOf,
    MapOf,
    Section,
    Text,
    ValueType,
    is_name,
    parse_formula,
)
from generator.yaml_loader import Node


@dataclass(frozen=True)
class DtypeFallback:
    """``first_of: [host paths..., dtype]``: the first of the host paths that
    is not ``None`` at run time, else the manager's ``dtype`` (vLLM's
    ``visual.input_norm.input_dtype or dtype``: uint8 pixels when the input
    normalisation is fused into the tower, the manager's dtype otherwise)."""

    options: tuple[HostPath, ...]


class CaptureDtype(ValueType):
    """A capture tensor's dtype: ``dtype``, a host path, or ``{first_of:
    [host path, ..., dtype]}``."""

    kinds = ("string", "integer", "object")
    words = "`dtype`, a host path, or `{first_of: [host path, ..., dtype]}`"

    def __init__(self) -> None:
        self.single = DtypeValue()

    def schema(self) -> dict[str, Any]:
        options = {"type": "array", "items": {"type": "string"}, "minItems": 2}
        fallback = {
            "type": "object",
            "properties": {"first_of": options},
            "required": ["first_of"],
            "additionalProperties": False,
        }
        return {"anyOf": [self.single.schema(), fallback]}

    def value(self, node, field: str, ctx, **kw: Any) -> Any:
        if node.kind != "mapping":
            return self.single.value(node, field, ctx, **kw)
        return _dtype_fallback(node, field, ctx, self.single)


def _dtype_fallback(node, field: str, ctx, single: DtypeValue) -> Any:
    extra = [k for k in node.value if k != "first_of"]
    for key in extra:
        close = difflib.get_close_matches(str(key), ["first_of"], n=1)
        hint = "; did you mean 'first_of'?" if close else " (allowed: first_of)"
        ctx.error(
            (node.key_locations or {}).get(key, node.location),
            f"{field}.{key}",
            f"unknown key{hint}",
        )
    options = node.value.get("first_of")
    if options is None and extra:
        return INVALID
    if options is None or options.kind != "sequence":
        ctx.error(node, f"{field}.first_of", "expected a list: [host path, ..., dtype]")
        return INVALID
    path = f"{field}.first_of"
    exprs = [
        single.convert(n, f"{path}[{i}]", ctx) for i, n in enumerate(options.value)
    ]
    if INVALID in exprs or extra:
        return INVALID
    if len(exprs) < 2 or exprs[-1] != Ref("dtype"):
        ctx.error(
            options,
            path,
            "list host paths, then dtype last: the manager's dtype is the fallback "
            "when every host path is None",
        )
        return INVALID
    if Ref("dtype") in exprs[:-1]:
        ctx.error(
            options, path, "dtype is never None: only the last entry may be dtype"
        )
        return INVALID
    if any(isinstance(e, Dtype) for e in exprs):
        ctx.error(
            options,
            path,
            "a dtype by name is never None: list host paths, then dtype last "
            "(or give the dtype name alone)",
        )
        return INVALID
    return DtypeFallback(tuple(exprs[:-1]))


@dataclass(frozen=True)
class CaptureTensor:
    """The capture buffer of a flat input (zeros or random of a shape), or
    of a list input: then the list of its ``shape[0]`` units at capture."""

    flat: FlatInput | ItemInput
    location: Location
    shape: tuple[Expr, ...]
    #: Ref("dtype"): the manager's; a dtype by name; a HostPath; or the first
    #: non-None of several host paths, else the manager's.
    dtype: Ref | HostPath | Dtype | DtypeFallback
    fill: Fill
    why: str | None

    @property
    def key(self) -> str:
        return self.flat.key

    KEYS: ClassVar = Keys(
        Key(
            "shape",
            ListOf(Formula("tensor_shape"), min_items=1),
            "The buffer's shape; `rows` is this input's rows in the dummy batch "
            "(`units`, the views captured, in a unit capture).",
            required=True,
            example="[rows, channels * frames * patch**2]",
        ),
        Key(
            "dtype",
            CaptureDtype(),
            "`dtype` (the manager's), a dtype by name (`bool`, `int64`, "
            "`float32`, ...), a host path, or the first of several host paths "
            "that is not `None` at run time with the manager's dtype last "
            "(`{first_of: [visual.input_norm.input_dtype, dtype]}`: uint8 pixels "
            "when the host fuses the input normalisation into the tower).",
            required=True,
            example="vision_tower.dtype",
        ),
        Key(
            "fill",
            Choice(Fill),
            "What the dummy holds: zeros, random normal values (pixels), ones "
            "(an all-true `bool` mask: every position valid) or, for a padded "
            "input, its `pad_value` (`pad`: a dummy of padding only, as Gemma 4 "
            "captures position ids of -1).",
            default=Fill.ZEROS,
        ),
        Key("why", Text(), "Comment on the buffer."),
    )
    DOC_TITLE = "capture.tensors"

    @classmethod
    def from_yaml(cls, r: Reader, key: str, key_location: Location, flats, **_: Any):
        shape = r.take("shape")
        dtype = r.take("dtype")
        fill = r.take("fill")
        why = r.take("why")
        flat = flats.get(key) or _list_input(r, key)
        if flat is None:
            if key not in r.ctx.failed_inputs:
                r.ctx.error(
                    key_location,
                    r.field,
                    f"{key!r} is not a flat, padded or list input",
                )
            return None
        if shape is None or any(s is INVALID for s in shape) or dtype is None:
            return None
        padded = getattr(flat, "is_padded", False)
        if fill is Fill.PAD and not padded:
            r.refuse("fill", "`pad` fills a padded input's buffer with its pad_value")
            return None
        item_shape = getattr(flat, "item_shape", ())
        if item_shape and len(shape) != 1 + len(item_shape):
            r.error(
                "shape",
                f"a tensors input's buffer has items on dim 0, then the "
                f"{len(item_shape)} dims of its shape: give {1 + len(item_shape)} dims",
            )
            return None
        if padded and len(shape) < 2:
            r.error(
                "shape",
                "a padded input's buffer has items on dim 0 and "
                "their sizes on dim 1: give at least two dims",
            )
            return None
        return cls(flat, key_location, tuple(shape), dtype, fill, why)


def _list_input(r: Reader, key: str) -> ItemInput | None:
    """The list input ``key`` (its capture tensor holds one unit per row)."""
    items = r.ctx.partial.get("item_inputs", ())
    return next((i for i in items if i.key == key and i.is_list), None)


@dataclass(frozen=True)
class CaptureLet:
    """``name = formula``: an intermediate of the dummy's geometry, bound in
    the capture method after ``k``."""

    name: str
    expr: Expr
    location: Location


class LetFormula(Formula):
    """A ``capture.let`` entry: its formula may use the entries before it;
    the name is declared once the formula is read."""

    def __init__(self) -> None:
        super().__init__("capture_let")

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        name, where = kw["key"], kw["key_location"]
        expr = super().value(node, field, ctx)
        kind = ctx.kind_of(name)
        if check_name(ctx, where, field, name, "capture intermediate") and kind:
            ctx.error(where, field, f"{name!r} is already a {kind.value}")
        ctx.declare(NameKind.CAPTURE_LET, name, where, field)
        return INVALID if expr is INVALID else CaptureLet(name, expr, where)


@dataclass(frozen=True)
class CaptureAssert:
    """A condition the capture checks before it builds anything; a budget
    that breaks it is refused with ``ValueError``."""

    check: Comparison
    message: str
    why: str | None
    location: Location

    KEYS: ClassVar = Keys(
        Key(
            "check",
            Condition("capture_assert"),
            "What must hold for the dummy batch to be built: one comparison of two "
            "formulas.",
            required=True,
            example="ho * kh <= rope_h",
        ),
        Key(
            "message",
            Text(nonempty=True, one_line=True),
            "Says what is exceeded; the error adds the budget, the batch size and "
            "both sides' values.",
            required=True,
            example="exceeds the RoPE grid of the tower",
        ),
        Key("why", Text(), "Comment on the check."),
    )
    DOC_TITLE = "capture.assert"

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> CaptureAssert | None:
        check = r.take("check")
        message = r.take("message")
        why = r.take("why")
        if check is None or message is None:
            return None
        return cls(check, message, why, r.node.location)


@dataclass(frozen=True)
class Capture:
    """What each budget is captured with: a dummy batch of
    ``max_batch_size`` items (``dummy``), or ``units`` fixed-size views
    (tiles, crops, chunks) sized from the budget alone (``units``)."""

    rounding: Rounding
    dummy: tuple[tuple[ItemInput, tuple[Expr, ...]], ...]
    tensors: tuple[CaptureTensor, ...]
    graph_rows: Expr | None
    why: str | None
    #: A unit capture: the views captured (then ``dummy`` is empty).
    units: Expr | None = None
    #: ``capture.let`` and ``capture.assert``, in order.
    lets: tuple[CaptureLet, ...] = ()
    asserts: tuple[CaptureAssert, ...] = ()
    #: A unit capture's dummy units: unit grid -> the dims of unit
    #: ``unit_index``.
    unit_dummy: tuple[tuple[ItemInput, tuple[Expr, ...]], ...] = ()
    #: Host tensors the graphs read that the host may replace later; the
    #: capture holds a reference to each (``capture.keep_alive``).
    keep_alive: tuple[HostPath, ...] = ()
    #: ``capture.graph_rows_why``: why no batch has more graph rows.
    graph_rows_why: str | None = None

    KEYS: ClassVar = Keys(
        Key(
            "units",
            Formula("units"),
            "A capture of fixed-size views (tiles, crops, chunks) instead of "
            "items: how many the budget holds, e.g. `token_budget // T` for "
            "views of `T` tokens each. The capture tensors are then sized with "
            "`units` (not `rows`, `k` or a dummy item), whatever "
            "`max_batch_size`. The static checks refuse a count that cannot "
            "hold every batch within the budget: `max_batch_size` bounds the "
            "items of a batch, not their views.",
            example="max(token_budget // T, 1)",
        ),
        Key(
            "unit_dummy",
            MapOf(ListOf(Formula("unit_dummy"))),
            "A unit capture's dummy units: grid with `unit_of` → the dims of unit "
            "`unit_index` (`0 .. units - 1`), over the constants, `token_budget` "
            "and `units`. Builders then read that grid at capture (one row per "
            "unit), and the units' offsets may be padded (`pad: repeat_last`) "
            "and bounded by a host scalar. Needs `items.per_unit`. LFM2-VL cuts "
            "the budget into tiles of `m` tokens and a last, shorter one.",
            example="{spatial_shapes: [f, min(token_budget - unit_index * m, m) * f]}",
        ),
        Key(
            "per_item_tokens",
            Choice(Rounding),
            "How `k`, the tokens of each dummy item, rounds `token_budget / "
            "max_batch_size`: `ceil` covers the budget; `floor` (GLM-4.1V's "
            "rounding) leaves the dummy batch short of it when `max_batch_size` "
            "does not divide it, so the static checks then refuse a dummy that "
            "does not make up for it.",
            default=Rounding.CEIL,
            default_doc="`ceil`",
        ),
        Key(
            "let",
            MapOf(LetFormula()),
            "Named intermediates of the dummy geometry, bound in order after `k`; "
            "each may use the ones before it. The dummy, the capture tensors' "
            "shapes, `assert`, `graph_rows`, builders' `capture_kwargs` and buffer "
            "shapes may use them.",
            example="{wo: min(k, rope_w // kw), ho: ceil_div(k, wo)}",
        ),
        Key(
            "assert",
            ListOf(Section(CaptureAssert)),
            "Conditions checked first thing at capture (after `let`): a budget "
            "whose dummy breaks one raises `ValueError` with the message, the "
            "budget and the values (never a Python `assert`, which `-O` drops). "
            "The static checks skip the budgets a condition refuses; `gen-mixin "
            "plan` reports them.",
        ),
        Key(
            "dummy",
            MapOf(ListOf(Formula("dummy"))),
            "Grid or count input → the dims of one dummy item (a count has one). "
            "Every grid and count input needs one; the batch is `max_batch_size` "
            "such items. Required unless `units` is given (a unit capture has "
            "no dummy items).",
            example="{image_grid_thw: [1, merge, k * merge]}",
        ),
        Key(
            "tensors",
            MapOf(Section(CaptureTensor)),
            "Flat input → its capture buffer.",
            required=True,
        ),
        Key(
            "graph_rows",
            Formula("graph_rows"),
            "The graph rows the captured batch has room for, when more than the "
            "dummy batch emits. Needs `items.budget_tokens` and at least one "
            "`allocate` buffer. It must reach the most graph rows a batch "
            "within the budget has: at most `slope · token_budget + "
            "max_batch_size`, where `slope` is the largest `(graph rows − 1) / "
            "budget tokens` of the sampled items (each item also has no more "
            "graph rows than budget tokens). DeepSeek-V4.1, whose images have "
            "at most `ceil(h*w / r)` aligner rows: `ceil_div(token_budget, r) + "
            "max_batch_size`.",
            example="ceil_div(token_budget, r) + max_batch_size",
        ),
        Key(
            "graph_rows_why",
            Text(),
            "Comment on `graph_rows`: why no batch within the budget has more "
            "graph rows (the generator checks the bound on sampled items).",
        ),
        Key(
            "keep_alive",
            ListOf(HostPathValue(), min_items=1),
            "Host tensors the graphs read by address that the host may replace "
            "after capture: the mixin holds a reference to the one each capture "
            "read, so its memory is never freed while the graphs replay. "
            "MiniCPM-V's resampler re-registers its position table `pos_embed` "
            "when an eager call brings a wider slice; the table the graphs "
            "captured would otherwise be freed and its memory reused.",
            example="[resampler.pos_embed]",
        ),
        Key("why", Text(), "Comment on the dummy batch."),
    )
    DOC_TITLE = "capture"

    @property
    def of_units(self) -> bool:
        return self.units is not None

    @classmethod
    def from_yaml(cls, r: Reader, items_inputs, flats, **_: Any) -> Capture | None:
        units = r.take("units")
        if r.has("units"):
            for key in ("dummy", "per_item_tokens", "graph_rows", "graph_rows_why"):
                if r.has(key):
                    r.refuse(key, _NOT_WITH_UNITS[key])
        elif r.has("graph_rows_why") and not r.has("graph_rows"):
            r.refuse(
                "graph_rows_why", "comments capture.graph_rows, which is not given"
            )
        r.ctx.unbound = dict(
            UNIT_CAPTURE_UNBOUND if r.has("units") else ITEM_CAPTURE_UNBOUND
        )
        rounding = r.take("per_item_tokens")
        lets = tuple(v for v in (r.take("let") or {}).values() if v is not INVALID)
        asserts = tuple(a for a in r.take("assert") or () if a is not INVALID)
        unit_dummy: tuple | None = ()
        if r.has("unit_dummy"):
            if not r.has("units"):
                r.refuse("unit_dummy", "the dummy units of a unit capture: needs units")
            else:
                unit_dummy = _dummy(r, items_inputs, "unit_dummy")
        if r.has("units"):
            dummy: tuple | None = ()
        elif not r.has("dummy"):
            r.take_node("dummy")
            r.ctx.error(r.node, r.path("dummy"), "required key is missing")
            dummy = None
        else:
            dummy = _dummy(r, items_inputs)
        tensors = r.take("tensors", flats=flats)
        graph_rows = r.take("graph_rows")
        graph_rows_why = r.take("graph_rows_why")
        keep_alive = tuple(p for p in r.take("keep_alive") or () if p is not INVALID)
        why = r.take("why")
        if dummy is None or tensors is None or (r.has("units") and units is None):
            return None
        if unit_dummy is None:
            return None
        failed = {k for k, t in tensors.items() if t is INVALID}
        r.ctx.failed_sources.update(failed)
        if any(getattr(items_inputs.get(k), "is_padded", False) for k in failed):
            # The padded coverage check sizes nothing without the buffer: the
            # dummy batch's checks would report a budget it does not govern.
            return None
        good = tuple(t for t in tensors.values() if t is not INVALID)
        if not r.ok("let", "assert"):
            return None
        return cls(
            rounding,
            dummy,
            good,
            graph_rows,
            why,
            units,
            lets,
            asserts,
            unit_dummy,
            keep_alive,
            graph_rows_why,
        )


#: Why the keys of a capture of items do not go with ``units``.
_NOT_WITH_UNITS = {
    "dummy": "a unit capture has no dummy items: its tensors are sized with "
    "'units' (drop capture.dummy or capture.units)",
    "per_item_tokens": "rounds the tokens of a dummy item, which a unit capture "
    "does not have",
    "graph_rows": "a graph-row capacity beyond a dummy batch's; a unit capture "
    "has no dummy batch",
    "graph_rows_why": "comments a graph-row capacity, which a unit capture does "
    "not have",
}
#: Built-in names a path does not bind, by capture kind, and why.
UNIT_CAPTURE_UNBOUND = {
    n: f"{n!r} belongs to a dummy batch of items; a unit capture "
    "(capture.units) has none: size buffers with 'units'"
    for n in sorted(ITEM_CAPTURE_NAMES)
}
ITEM_CAPTURE_UNBOUND = {
    n: f"{n!r} is bound by capture.units, a capture of fixed-size views; "
    "this capture is a dummy batch of items (capture.dummy)"
    for n in sorted(UNIT_CAPTURE_NAMES)
}


def _dummy(r: Reader, item_inputs: dict[str, ItemInput], key_name: str = "dummy"):
    """``capture.dummy`` (every grid and count input) or ``capture.unit_dummy``
    (grids with ``unit_of``)."""
    units = key_name == "unit_dummy"
    node = r.take_node(key_name)
    if node is None:
        return None
    field = r.path(key_name)
    out = []
    for key, dims_node in node.value.items():
        path = f"{field}.{key}"
        where = (node.key_locations or {}).get(key, node.location)
        item = item_inputs.get(key)
        if item is None or (units and (item.is_count or item.unit_of is None)):
            if key not in r.ctx.failed_inputs:
                what = "a grid with unit_of" if units else "a grid or count input"
                r.ctx.error(where, path, f"{key!r} is not {what}")
            continue
        if dims_node.kind != "sequence":
            r.ctx.error(dims_node, path, f"expected a list, got {dims_node.kind}")
            continue
        if len(dims_node.value) != len(item.dims):
            quoted = any(
                isinstance(n.value, str) and n.value.count("(") != n.value.count(")")
                for n in dims_node.value
            )
            hint = " (a formula with a comma must be quoted)" if quoted else ""
            r.ctx.error(
                dims_node,
                path,
                f"expected {len(item.dims)} dims ({', '.join(item.dims)}), "
                f"got {len(dims_node.value)}{hint}",
            )
            continue
        scope = r.ctx.scope(key_name)
        exprs = []
        for i, n in enumerate(dims_node.value):
            if n.kind not in ("string", "integer"):
                r.ctx.error(
                    n, f"{path}[{i}]", f"expected a string or an integer, got {n.kind}"
                )
                exprs.append(INVALID)
                continue
            exprs.append(parse_formula(n, f"{path}[{i}]", r.ctx, scope))
        if all(e is not INVALID for e in exprs):
            out.append((item, tuple(exprs)))
    for key in item_inputs if not units else ():
        if key not in node.value:
            r.ctx.error(node, f"{field}.{key}", "every grid input needs a dummy item")
    return tuple(out)


@dataclass(frozen=True)
class MetadataBuilder:
    """A call run at capture on the dummy grids and at replay on the real
    ones, returning a dict that holds some of the buffers; or steps run in
    both phases, whose names listed in ``provides`` are the buffers."""

    call: Call | None
    capture_kwargs: tuple[tuple[str, Expr], ...]
    replay_kwargs: tuple[tuple[str, Expr], ...]
    provides: tuple[str, ...]
    why: str | None
    location: Location
    #: The local the generated code keeps the result in (chosen to collide
    #: with no spec name and no generated local).
    result_name: str = "metadata"
    #: The call returns its one buffer itself (``returns:``), not a dict.
    returns_tensor: bool = False
    #: Extra replay keyword arguments of one modality (after replay_kwargs).
    replay_by_modality: tuple[tuple[Modality, tuple[tuple[str, Expr], ...]], ...] = ()
    #: ``steps:`` instead of ``call:`` (then ``call`` is None).
    steps: tuple[Step, ...] = ()
    #: The steps run once per item on its dims; each buffer joins the items'
    #: results on dim 0, in item order.
    per_item: bool = False

    KEYS: ClassVar = Keys(
        Key(
            "call",
            CallValue("builder_call"),
            "The call both phases make: a host method or imported helper; "
            "arguments over grid keys (the grid rows as lists), flat inputs, "
            "constants, host paths, `device`, `dtype`, the manager's "
            "`max_batch_size` and `max_frames_per_batch` (both phases have them), "
            "literals. Required unless `steps` is given.",
            example="visual.prepare_encoder_metadata(image_grid_thw, device=device)",
        ),
        Key(
            "steps",
            BUILDER_STEPS,
            "Instead of `call`: statements, every one `name = expr`, run at "
            "capture on the capture tensors and dummy grids and at replay on the "
            "batch's inputs (flat inputs as tensors, grids as lists of rows), in "
            "the step language of the forwards (tensor methods, subscripts, "
            "`torch.*`, host calls); the names in `provides` are the buffers. "
            "For metadata a host model builds in private helpers that the "
            "generated mixin replaces (LFM2-VL's packed pixels, offsets and "
            "gather indices). A buffer built here need not be an input; a "
            "capture tensor that is no buffer feeds the steps at capture.",
            example="[lengths = torch.tensor(image_grid).prod(-1), cu_seqlens = "
            "torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])]",
        ),
        Key(
            "per_item",
            Boolean(),
            "With `steps`: run them once per item, the item's dims bound (a "
            "grid's row, a count's value, a padded or tensors input's sizes) "
            "instead of the batch's inputs, and make each name of `provides` "
            "the items' results joined on dim 0 in item order (`torch.cat`), as "
            "`eager_forward.per_item` joins outputs. The other step names stay "
            "inside the loop. For metadata a tower builds image by image "
            "(Keye-VL's `arange(t * h * w) % (h * w)` position ids).",
            default=False,
        ),
        Key(
            "capture_kwargs",
            MapOf(Argument("capture_kwargs")),
            "Extra keyword arguments at capture only.",
            example="{max_seqlen_override: rows}",
        ),
        Key(
            "replay_kwargs",
            MapOf(Argument("replay_kwargs")),
            "Extra keyword arguments at replay only.",
            example="{max_batch_size: max_batch_size}",
        ),
        Key(
            "replay_kwargs_by_modality",
            MapOf(MapOf(Argument("replay_kwargs"))),
            "Extra keyword arguments at replay for a batch of one modality "
            "(`image`, `video`), after `replay_kwargs` (vLLM's Qwen2.5-VL pads "
            "an image batch's offsets to `max_batch_size` sequences and a "
            "video batch's to `max_frames_per_batch`).",
            example="{image: {max_batch_size: max_batch_size}, video: "
            "{max_frames_per_batch: max_frames_per_batch}}",
        ),
        Key(
            "provides",
            ListOf(Identifier(), min_items=1),
            "The keys of the returned dict that are buffers (or `returns`); with "
            "`steps`, the step names that are buffers.",
            example="[rotary_cos, rotary_sin, cu_seqlens, max_seqlen]",
        ),
        Key(
            "returns",
            Identifier(),
            "The one buffer the call returns, when it returns a tensor rather "
            "than a dict (Idefics3's `model.get_position_ids(mask)`); instead of "
            "`provides`.",
            example="position_ids",
        ),
        Key("why", Text(), "Comment on the call."),
    )
    DOC_TITLE = "metadata"

    def kwargs(
        self, phase: str, modality: Modality | None = None
    ) -> tuple[tuple[str, Expr], ...]:
        """Every keyword argument of the call at ``capture`` or ``replay``
        (of a batch of ``modality``)."""
        extra = self.capture_kwargs if phase == "capture" else self.replay_kwargs
        if phase == "replay" and modality is not None:
            extra += dict(self.replay_by_modality).get(modality, ())
        return self.call.kwargs + extra

    @property
    def exprs(self) -> tuple[Expr, ...]:
        """Every expression the builder evaluates, in either phase."""
        if self.call is None:
            return tuple(s.expr for s in self.steps)
        kwargs = self.capture_kwargs + self.replay_kwargs
        kwargs += tuple(kv for _, kw in self.replay_by_modality for kv in kw)
        return (self.call, *(v for _, v in kwargs))

    @property
    def step_names(self) -> frozenset[str]:
        return frozenset(n for s in self.steps for n in s.names)

    @classmethod
    def from_yaml(
        cls, r: Reader, index: int, provided: dict, tensors: tuple = (), **_: Any
    ):
        if r.has("steps"):
            return cls._from_steps(r, provided, tensors)
        if r.take("per_item"):
            r.refuse(
                "per_item",
                "per_item runs steps once per item: give steps, not call (a "
                "call gets the whole batch)",
            )
        call = r.take("call")
        if call is None and r.ok("call"):
            r.error(r.node, "required key is missing (call, or steps)", r.path("call"))
        kwargs = {}
        for phase in ("capture_kwargs", "replay_kwargs"):
            values = r.take(phase) or {}
            node = r.raw(phase)
            items = []
            for kw, expr in values.items():
                if not is_name(kw):
                    r.ctx.error(
                        (node.key_locations or {}).get(kw, node.location),
                        f"{r.path(phase)}.{kw}",
                        f"bad keyword {kw!r}",
                    )
                    continue
                if call is not None and kw in dict(call.kwargs):
                    r.ctx.error(
                        (node.key_locations or {}).get(kw, node.location),
                        f"{r.path(phase)}.{kw}",
                        f"{kw!r} is already passed by the call itself",
                    )
                if expr is not INVALID:
                    items.append((kw, expr))
            kwargs[phase] = tuple(items)
        by_modality = _replay_by_modality(r, call, dict(kwargs["replay_kwargs"]))
        returns = r.has("returns")
        if returns == r.has("provides"):
            r.error(
                r.node,
                "give either provides (the buffers of a returned dict) or returns "
                "(the one buffer the call returns)",
                r.path("provides"),
            )
        provides = _provides(r, provided, "returns" if returns else "provides")
        r.taken.add("provides" if returns else "returns")
        why = r.take("why")
        # A ``returns`` that failed (reported) leaves no buffer to return.
        if call is None or (returns and not provides):
            r.ctx.failed_sources.update(provides)
            return None
        return cls(
            call,
            kwargs["capture_kwargs"],
            kwargs["replay_kwargs"],
            tuple(provides),
            why,
            r.node.location,
            returns_tensor=returns,
            replay_by_modality=by_modality,
        )

    @classmethod
    def _from_steps(cls, r: Reader, provided: dict, tensors: tuple):
        """``steps:``: the same statements at capture and replay; every name
        of ``provides`` one of their targets."""
        for key in ("call", "capture_kwargs", "replay_kwargs"):
            if r.has(key):
                r.refuse(key, _NOT_WITH_STEPS[key])
        for key in ("replay_kwargs_by_modality", "returns"):
            if r.has(key):
                r.refuse(key, _NOT_WITH_STEPS[key])
        per_item = bool(r.take("per_item"))
        # A per_item that is no boolean (reported) most likely meant true.
        loop = per_item or not r.ok("per_item")
        steps = (
            r.take("steps", scope="builder_steps_per_item", extra=tensors)
            if loop
            else r.take("steps", scope="builder_steps")
        )
        if not r.has("provides"):
            r.error(r.node, "steps need provides (the step names that are buffers)")
        provides = _provides(r, provided, "provides")
        why = r.take("why")
        if steps is None or not r.ok("per_item"):
            r.ctx.failed_sources.update(provides)
            return None
        targets = {n for s in steps for n in s.names}
        _check_step_targets(r, steps, set(provides), loop)
        node = r.raw("provides")
        listed = node.value if node is not None and isinstance(node.value, list) else ()
        for name, item in zip(provides, listed):
            if name not in targets:
                r.ctx.error(
                    item,
                    r.path("provides"),
                    f"{name!r} is no step's name (names: "
                    f"{', '.join(sorted(targets)) or 'none'})",
                )
        return cls(
            None,
            (),
            (),
            tuple(provides),
            why,
            r.node.location,
            steps=tuple(steps),
            per_item=per_item,
        )


def _check_step_targets(r: Reader, steps, provides: set[str], per_item: bool) -> None:
    """A builder's step binds a local of the capture and replay methods:
    not a dim or capture intermediate (bound there too), nor a buffer that
    it does not provide. (A per-item builder's steps read the dims: binding
    one is reported as binding a name in scope.)"""
    node = r.raw("steps")
    taken = {
        NameKind.CAPTURE_LET: "a capture intermediate",
        NameKind.BUFFER: "a buffer this builder does not provide",
    }
    if not per_item:
        taken[NameKind.DIM] = "a dim"
    for i, step in enumerate(steps):
        for name in step.names:
            for kind, what in taken.items():
                if name in r.ctx.names[kind] and not (
                    kind is NameKind.BUFFER and name in provides
                ):
                    r.ctx.error(
                        node.value[i] if node is not None else step.location,
                        f"{r.path('steps')}[{i}]",
                        f"{name!r} is {what}: a step name is a local of the "
                        "capture and replay methods, choose another",
                    )


#: Why a call's keys do not go with ``steps``.
_NOT_WITH_STEPS = {
    "call": "give either call or steps",
    "capture_kwargs": "steps run the same at capture and replay: a host scalar's "
    "capture value is buffers.<key>.capture_value",
    "replay_kwargs": "steps run the same at capture and replay",
    "replay_kwargs_by_modality": "steps run the same for every modality",
    "returns": "the buffers of steps are the names in provides",
}


def _replay_by_modality(r: Reader, call, common: dict):
    """``replay_kwargs_by_modality``: modality -> keyword arguments, none of
    them passed by the call or by ``replay_kwargs`` already."""
    values = r.take("replay_kwargs_by_modality") or {}
    node = r.raw("replay_kwargs_by_modality")
    field = r.path("replay_kwargs_by_modality")
    out = []
    for name, kwargs in values.items():
        where = (node.key_locations or {}).get(name, node.location)
        if name not in Modality.values():
            r.ctx.error(
                where,
                f"{field}.{name}",
                f"unknown modality {name!r} (expected one of: "
                f"{', '.join(Modality.values())})",
            )
            continue
        if kwargs is INVALID:
            continue
        sub = node.value[name]
        items = []
        for kw, expr in kwargs.items():
            at = (sub.key_locations or {}).get(kw, sub.location)
            if not is_name(kw):
                r.ctx.error(at, f"{field}.{name}.{kw}", f"bad keyword {kw!r}")
                continue
            if (call is not None and kw in dict(call.kwargs)) or kw in common:
                r.ctx.error(
                    at,
                    f"{field}.{name}.{kw}",
                    f"{kw!r} is already passed by the call or by replay_kwargs",
                )
                continue
            if expr is not INVALID:
                items.append((kw, expr))
        out.append((Modality(name), tuple(items)))
    return tuple(out)


def _provides(r: Reader, provided: dict[str, str], key: str) -> list[str]:
    """The buffers of ``provides`` (a list) or ``returns`` (one name)."""
    value = r.take(key)
    node = r.raw(key) if r.has(key) and r.ok(key) else None
    if key == "returns":
        names, nodes = ([value], [node]) if node is not None else ([], [])
    else:
        names, nodes = value or [], node.value if node is not None else []
    out = []
    for name, node in zip(names, nodes):
        if name is INVALID:
            continue
        field = r.path(key)
        if name in provided:
            r.ctx.error(
                node, field, f"{name!r} is already provided by {provided[name]}"
            )
        elif name not in r.ctx.names[NameKind.BUFFER] and not r.ctx.buffers_unknown:
            r.ctx.error(node, field, f"{name!r} is not a declared buffer")
        provided[name] = r.field
        out.append(name)
    return out


@dataclass(frozen=True)
class Buffer:
    """One captured buffer: where its value comes from and how a replay
    copies the real value into it."""

    key: str
    location: Location
    source: CaptureTensor | MetadataBuilder
    rows_dim: int
    pad: PadRule | None
    slots: Expr | None
    host_scalar: bool
    replay: ReplayRule
    shape: tuple[Expr, ...] | None  # declared (builder buffers)
    dtype: Dtype | None  # declared (builder buffers)
    set_by: str | None  # host scalar: the builder's capture kwarg that sets it
    allocate: bool  # capture: zeros of shape/dtype, the dummy's value copied in
    why: str | None
    #: Another rule under some attention backends (FlashInfer's sections).
    pad_by_backend: tuple[tuple[Backend, PadRule], ...] = ()
    #: Host scalars: the pad buffer whose sequences the value bounds, or
    #: ITEM_BOUND (the longest item within the budget).
    bounds: str | None = None
    #: Pad buffers: each sequence is a window of at most this many tokens a
    #: side (merged tokens), not a whole item or frame.
    window: Expr | None = None
    #: Builder buffers the builder may return as None (the manager skips them).
    optional: bool = False
    #: Host scalars: the capture value itself (instead of ``set_by``).
    capture_value: Expr | None = None

    def pad_under(self, backend: Backend | None) -> PadRule | None:
        """The pad rule under ``backend`` (``None``: the default one)."""
        return dict(self.pad_by_backend).get(backend, self.pad)

    KEYS: ClassVar = Keys(
        Key(
            "rows_dim",
            Integer(0, 3),
            "The axis that holds the rows (MiniMax's `(3, N, half_rot_dim)` rotary "
            "planes: 1): the replay zeroes the buffer's tail and copies `[:, :n]`.",
            default=0,
            example="1",
        ),
        Key(
            "pad",
            Choice(PadRule, exclude=(PadRule.FLASHINFER_SECTIONS,)),
            "`cu_seqlens` closed with one padding sequence up to the captured rows "
            "(`trailing_sequence`: `slots` at least `max_batch_size + 2`, the "
            "captured rows registered per instance under the buffer's address), "
            "or with zero-length sequences (`repeat_last`: the tail repeats the "
            "last offset, on the device; `slots` at least `max_batch_size + 1`, or "
            "`max(max_frames_per_batch, max_batch_size) + 1` with one sequence per "
            "frame). Every `pad` buffer gets its own capture buffer of `slots` "
            "entries (more if the dummy batch brings more sequences).",
            example="trailing_sequence",
        ),
        Key(
            "slots",
            Formula("slots"),
            "`pad` buffers: the entries captured.",
            example="max_batch_size + 2",
        ),
        Key(
            "host_scalar",
            Boolean(),
            "A 0-dim CPU `int32` (`max_seqlen`) whose capture value is baked into "
            "the kernel launch.",
            default=False,
        ),
        Key(
            "replay",
            Choice(ReplayRule),
            "Host scalars: send the real value at replay (`copy`, which the graph "
            "never reads) or leave it out (`drop`).",
            default=ReplayRule.COPY,
            default_doc="`copy`",
        ),
        Key(
            "shape",
            ListOf(Formula("buffer_shape")),
            "Builder buffers: the captured shape, for `gen-mixin plan` and the "
            "static checks.",
            example="[rows, head_dim // 2]",
        ),
        Key(
            "dtype",
            Choice(Dtype),
            "Builder buffers: the captured dtype (`dtype`: the manager's).",
            example="float32",
        ),
        Key(
            "set_by",
            Identifier(),
            "Host scalars: the builder's capture keyword argument that sets the "
            "capture value; checked to hold the longest sequence it bounds (see "
            "`bounds`).",
            example="max_seqlen_override",
        ),
        Key(
            "capture_value",
            Formula("capture_value"),
            "Host scalars: the value captured, instead of the builder's "
            "(`set_by` for a builder `call`; a builder's `steps` compute the "
            "replay value only): a 0-dim CPU `int32` of this formula. Checked "
            "like `set_by` to hold the longest sequence it bounds.",
            example="token_budget * f**2",
        ),
        Key(
            "allocate",
            Boolean(),
            "Builder buffers with `shape` and `dtype`, rows on dim 0: capture "
            "allocates the buffer at its shape (zeros) and copies the builder's "
            "dummy value into its leading rows, for buffers that hold the "
            "`capture.graph_rows` capacity.",
            default=False,
        ),
        Key(
            "pad_by_backend",
            MapOf(Choice(PadRule)),
            "`pad` buffers: another rule under some attention backends, read "
            "where `guards.attention_backend` reads the backend. "
            "`flashinfer_sections` (FLASHINFER only): the builder lays the "
            "offsets out as FlashInfer's two sections (Q/K/O, then V), each "
            "padded to a batch bucket; capture keeps the builder's value (its "
            "capture keyword arguments must pad it to `slots` sequences), and "
            "replay repeats the last offset of each section.",
            example="{FLASHINFER: flashinfer_sections}",
        ),
        Key(
            "window",
            Formula("constants"),
            "`pad` buffers of windowed attention: each sequence is a window of at "
            "most `window` x `window` tokens. The static checks then bound the "
            "window count of a batch (`slots`) and the longest window (its host "
            "scalar).",
            example="window_size // merge // patch",
        ),
        Key(
            "bounds",
            Identifier(),
            "Host scalars: the `pad` buffer whose sequences the value bounds "
            "(default: the only `pad` buffer). The static checks need the "
            "capture value to hold that buffer's longest sequence: every row "
            "with `trailing_sequence` (or no `pad` buffer), one window with "
            "`window`, else one item (of the dummy batch, or one that takes the "
            "whole budget). `item` (so no buffer may be named `item`): the "
            "builder makes one sequence per item and none for padding, so the "
            "value must cover the input rows of any item within the budget "
            "(checked on items whose dims are multiples of the item formulas' "
            "divisors, as processors emit them; the dummy's own sequences may "
            "be longer, their rows are replaced before a replay); needs `set_by`, "
            "not with `trailing_sequence`.",
            example="cu_window_seqlens",
        ),
        Key(
            "optional",
            Boolean(),
            "Builder buffers: the builder may return `None` (FlashInfer's "
            "`sequence_lengths` under other backends); the manager then skips "
            "the buffer at capture and replay.",
            default=False,
        ),
        Key("why", Text(), "Comment on the buffer."),
    )
    DOC_TITLE = "buffers"

    @classmethod
    def from_yaml(
        cls, r: Reader, key: str, key_location: Location, sources: dict, **_: Any
    ):
        rows_dim = r.take("rows_dim")
        pad = r.take("pad")
        slots = r.take("slots")
        host_scalar = r.take("host_scalar")
        replay = r.take("replay")
        shape = r.take("shape")
        dtype = r.take("dtype")
        set_by = r.take("set_by")
        capture_value = r.take("capture_value")
        allocate = r.take("allocate")
        pad_by_backend = _pad_by_backend(r, pad)
        window = r.take("window")
        bounds = r.take("bounds")
        optional = r.take("optional")
        why = r.take("why")
        _check_rules(r, pad, host_scalar, rows_dim)
        _check_extras(r, pad, host_scalar, allocate, optional)
        source = sources.get(key)
        if source is None:
            if key not in r.ctx.failed_sources:
                r.ctx.error(
                    key_location,
                    r.field,
                    "no source: add a capture tensor for it or list it in a "
                    "builder's provides (or returns)",
                )
            return None
        if shape is not None and any(s is INVALID for s in shape):
            shape = None
        return cls(
            key,
            key_location,
            source,
            rows_dim,
            pad,
            slots,
            host_scalar,
            replay,
            tuple(shape) if shape is not None else None,
            dtype,
            set_by,
            allocate,
            why,
            pad_by_backend,
            bounds,
            window,
            optional,
            capture_value,
        )


def _pad_by_backend(r: Reader, pad) -> tuple[tuple[Backend, PadRule], ...]:
    """``pad_by_backend``: backend names to rules; only FlashInfer's sections,
    and only on a ``pad`` buffer."""
    rules = r.take("pad_by_backend") or {}
    node = r.raw("pad_by_backend")
    out = []
    for name, rule in rules.items():
        where = (node.key_locations or {}).get(name, node.location)
        field = f"{r.path('pad_by_backend')}.{name}"
        if name not in Backend.values():
            r.ctx.error(
                where,
                field,
                f"unknown backend {name!r} (expected one of: "
                f"{', '.join(Backend.values())})",
            )
            continue
        if rule is INVALID:
            continue
        if (Backend(name), rule) != (Backend.FLASHINFER, PadRule.FLASHINFER_SECTIONS):
            r.ctx.error(
                node.value[name],
                field,
                "only FLASHINFER: flashinfer_sections differs by backend (FlashInfer "
                "lays the offsets out in two sections)",
            )
            continue
        out.append((Backend(name), rule))
    if rules and pad is None and r.ok("pad"):
        r.error(r.key_location("pad_by_backend"), "needs pad (the default rule)")
    return tuple(out)


def _check_extras(r: Reader, pad, host_scalar, allocate, optional) -> None:
    """Where window, bounds and optional apply."""
    if r.has("window") and pad is None and r.ok("pad"):
        r.error(r.key_location("window"), "window only goes with pad", r.path("window"))
    if r.has("capture_value") and not host_scalar:
        r.error(
            r.key_location("capture_value"),
            "capture_value only goes with host_scalar",
            r.path("capture_value"),
        )
    elif r.has("capture_value") and r.has("set_by"):
        r.error(
            r.key_location("capture_value"),
            "give either set_by (the builder's capture keyword) or capture_value",
            r.path("capture_value"),
        )
    if r.has("bounds") and not host_scalar:
        r.error(
            r.key_location("bounds"),
            "bounds only goes with host_scalar",
            r.path("bounds"),
        )
    if optional and (pad or host_scalar or allocate):
        r.error(
            r.key_location("optional"),
            "only plain builder buffers may be None (no pad, host_scalar or allocate)",
            r.path("optional"),
        )


def _check_rules(r: Reader, pad, host_scalar, rows_dim) -> None:
    """The replay rules a buffer may combine."""
    if pad is PadRule.TRAILING_SEQUENCE and not r.has("slots"):
        r.error(
            r.node,
            "trailing_sequence needs slots (at least max_batch_size + 2: one spare "
            "slot for the padding sequence)",
            r.path("slots"),
        )
    if pad is PadRule.REPEAT_LAST and not r.has("slots"):
        r.error(
            r.node,
            "repeat_last needs slots (at least max_batch_size + 1, or "
            "max_frames_per_batch + 1 with one sequence per frame)",
            r.path("slots"),
        )
    if r.has("slots") and pad is None and r.ok("pad"):
        r.error(r.key_location("slots"), "slots only goes with pad", r.path("slots"))
    if r.has("replay") and not host_scalar:
        r.error(
            r.key_location("replay"),
            "replay only goes with host_scalar",
            r.path("replay"),
        )
    if host_scalar and (pad or rows_dim):
        r.error(r.node, "a host scalar has no rows to pad")
    if pad and rows_dim:
        r.error(r.node, "pad rules apply to 1-D offsets; rows_dim must be 0")


def set_by_expr(buf: Buffer) -> Expr | None:
    """The capture-time expression of a host scalar: its ``capture_value``,
    or the one its ``set_by`` names."""
    if buf.capture_value is not None:
        return buf.capture_value
    if buf.set_by is None or not isinstance(buf.source, MetadataBuilder):
        return None
    return dict(buf.source.kwargs("capture")).get(buf.set_by)


#: ``bounds: item``: the value bounds the longest single item within the
#: budget, not a pad buffer's sequences.
ITEM_BOUND = "item"


def capture_value_field(buf: Buffer) -> str:
    """The key that sets a host scalar's capture value."""
    return "capture_value" if buf.capture_value is not None else "set_by"


def bounded_buffer(buffers: tuple[Buffer, ...], scalar: Buffer) -> Buffer | None:
    """The pad buffer whose sequences a host scalar bounds (its ``bounds``,
    or the only pad buffer), if any."""
    pads = [b for b in buffers if b.pad is not None]
    if scalar.bounds is not None:
        return next((b for b in pads if b.key == scalar.bounds), None)
    return pads[0] if len(pads) == 1 else None
