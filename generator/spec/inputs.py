"""The ``mm_kwargs`` keys a mixin reads: flat inputs (every item's rows back
to back), grids (one row of named dims per item), counts (one integer per
item), padded inputs (one ``(N, P, ...)`` tensor or a list of ``(P_i,
...)`` tensors, each item's ``P_i`` read off the shape) and tensor inputs
(one tensor per item, several dims read off its shape: Pixtral's ``(3, H_i,
W_i)`` images)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from generator import formulas as fx
from generator.diagnostics import Location
from generator.formulas import Expr, HostPath, Num, Ref
from generator.scopes import NameKind
from generator.spec.enums import InputKind
from generator.spec.names import check_name
from generator.spec.reader import Key, Keys, ReadContext, Reader
from generator.spec.values import (
    INVALID,
    Boolean,
    Choice,
    Formula,
    HostPathValue,
    Identifier,
    Integer,
    ListOf,
    MapOf,
)


@dataclass(frozen=True)
class FlatInput:
    """A tensor of every item's rows back to back (or a list of per-item
    tensors, with ``accepts_list``)."""

    key: str
    location: Location
    #: Rows per item, over dims and constants (``input_size`` and
    #: ``output_tokens`` already substituted).
    rows: Expr
    #: ``rows`` was written (else the item's ``input_size``).
    own_rows: bool
    accepts_list: bool
    #: Ranks at which the value arrives with a leading batch dim, folded
    #: into the rows on read.
    fold_ranks: tuple[int, ...]
    replay_dtype: HostPath | None
    eager_dtype: HostPath | None
    video_key: str | None
    #: The count input whose items this input's units (tiles) make up:
    #: ``rows`` is then per unit (default 1).
    unit_of: str | None = None
    #: Each row is one unit's patches padded along dim 1, which must hold
    #: every unit's ``input_size``.
    pads_units: bool = False

    kind: ClassVar = InputKind.FLAT


@dataclass(frozen=True)
class ItemInput:
    """An input with one entry per item: a grid row of ``dims``; for a count
    input, one integer named ``dims[0]``; for a padded input, the item's
    size ``dims[0]`` (dim 1 of one ``(N, P, ...)`` tensor, dim 0 of each
    tensor of a list)."""

    key: str
    location: Location
    kind: InputKind  # GRID, COUNT, PADDED, LIST or TENSORS
    dims: tuple[str, ...]
    video_key: str | None
    #: A grid of one row per unit (tile), the count input ``unit_of`` giving
    #: each item's units.
    unit_of: str | None = None
    #: ``(dim, formula)``: each item's ``dim`` equals the formula over
    #: constants and the free dims of other inputs (``inputs.<key>.equals``).
    equals: tuple[tuple[str, Expr], ...] = ()
    #: ``(dim, divisor)``: every row's ``dim`` is a multiple of the divisor
    #: (``inputs.<key>.multiple_of``), checked on the host.
    multiple_of: tuple[tuple[str, Expr], ...] = ()
    #: Padded inputs: the value the replay stacks a list's shorter items
    #: with, and the replay copy fills the captured buffer with.
    pad_value: int | None = None
    #: A list input: the shape of each unit tensor, over constants and the
    #: dims of the unit grids (``inputs.<key>.unit_shape``).
    unit_shape: tuple[Expr, ...] = ()
    #: A tensors input: the shape of each item's tensor, each entry one of
    #: ``dims`` (read off the item) or a formula over constants (checked).
    item_shape: tuple[Expr, ...] = ()

    @property
    def is_count(self) -> bool:
        """One integer per item: a count, or a list input's units per item
        (its length), which every formula and check reads as a count."""
        return self.kind in (InputKind.COUNT, InputKind.LIST)

    @property
    def is_list(self) -> bool:
        """Per item a list of unit tensors (``kind: list``)."""
        return self.kind is InputKind.LIST

    @property
    def is_padded(self) -> bool:
        """One tensor per item, its sizes read off its shape and replayed
        into a buffer padded past them (``padded`` and ``tensors``)."""
        return self.kind in (InputKind.PADDED, InputKind.TENSORS)

    @property
    def is_tensors(self) -> bool:
        """Several dims per item, read off each item's tensor."""
        return self.kind is InputKind.TENSORS

    @property
    def dim_positions(self) -> tuple[int, ...]:
        """Where each dim sits in an item's tensor (a tensors input)."""
        refs = [e.name if isinstance(e, Ref) else None for e in self.item_shape]
        return tuple(refs.index(dim) for dim in self.dims)

    # A padded input's dim 0 holds one entry per item: to a capture tensor
    # it is a flat input of one row per item (``rows`` in its shape: the
    # dummy batch's items).
    @property
    def rows(self) -> Expr:
        return Num(1)

    @property
    def own_rows(self) -> bool:
        return self.is_padded

    @property
    def derived_dims(self) -> tuple[str, ...]:
        return tuple(dim for dim, _ in self.equals)


Input = FlatInput | ItemInput

_ONLY = {
    InputKind.FLAT: "only for flat inputs",
    InputKind.GRID: "only for grid inputs",
    InputKind.COUNT: "only for count inputs",
    InputKind.PADDED: "only for padded inputs",
    (InputKind.COUNT, InputKind.PADDED): "only for count and padded inputs",
    InputKind.LIST: "only for list inputs",
    (InputKind.GRID, InputKind.TENSORS): "only for grid and tensors inputs",
    (InputKind.PADDED, InputKind.TENSORS): "only for padded and tensors inputs",
    InputKind.TENSORS: "only for tensors inputs",
}


class InputEntry:
    """One entry of ``inputs`` (the keys of every kind in one table)."""

    KEYS: ClassVar = Keys(
        Key(
            "kind",
            Choice(InputKind),
            "`flat`: a tensor holding every item's rows back to back; `grid`: one "
            "row of named dims per item (a tensor or a list of lists, read on the "
            "host); `count`: one integer per item (a 1-D tensor or a list, read on "
            "the host), e.g. the tiles of each image; `padded`: one `(N, P, ...)` "
            "tensor or a list of `(P_i, ...)` tensors, each item's size `P_i` "
            "read off the shape (an item dim named by `dim`; padded inputs may "
            "share it, the mixin checks they agree), replayed stacked to the "
            "widest item with `pad_value` and copied into `[:N, :P]` of a "
            "captured buffer filled with `pad_value` (Gemma 4's pixels and "
            "position ids); `list`: per item a list of unit tensors of their own "
            "shapes (MiniCPM-V's slices), the list's length the item's units; "
            "`tensors`: one tensor per item of `shape`, a list of them or one "
            "stacked tensor (dim 0 the items), its `dims` read off each item's "
            "shape, replayed stacked to the widest item on every dim with "
            "`pad_value` and copied into a captured buffer filled with it "
            "(Pixtral's `(3, H_i, W_i)` images).",
            required=True,
            example="grid",
        ),
        Key(
            "dims",
            ListOf(Identifier(), min_items=1),
            "The names of the dims of a grid row (tensors: the dims read off "
            "each item's shape); item formulas use them. A single per-item "
            "number is a `count` input.",
            applies="grid, tensors",
            example="[t, h, w]",
        ),
        Key(
            "dim",
            Identifier(),
            "The name item formulas use for the count (padded: for each item's "
            "size, `P_i`).",
            applies="count, padded",
            example="n",
        ),
        Key(
            "units_per_item",
            Identifier(),
            "The name item formulas use for an item's units (the length of its "
            "list), as a count input's `dim`; grids with `unit_of: <this input>` "
            "have one row per unit.",
            applies="list",
            example="n",
        ),
        Key(
            "unit_shape",
            ListOf(Formula("items"), min_items=1),
            "The shape of each unit tensor, over constants and the dims of the "
            "unit grids: the mixin checks every unit on the host (a `ValueError` "
            "names the input, item and unit), as the graph's buffers are built "
            "from them by shape. Builders and the eager forward see the input as "
            "the list of the batch's units, item after item; a capture tensor "
            "of `[units, ...]` is that list at capture.",
            applies="list",
            example="[3, p, h * w * p]",
        ),
        Key(
            "shape",
            ListOf(Formula("items"), min_items=2),
            "The shape of each item's tensor: every dim of `dims` once, as an "
            "entry of its own, the other entries formulas over constants. The "
            "mixin checks every item on the host (a `ValueError` names the "
            "input and the item); builders read the input as its dims, one "
            "row per item, the graph forward as the captured buffer of "
            "`[items, *shape]` at the widest sizes, the eager forward as sent.",
            applies="tensors",
            example="[3, h, w]",
        ),
        Key(
            "rows",
            Formula("flat_rows"),
            "Rows per item. Selection slices the input by it, and capture sizes "
            "the input's buffer by it (`rows` in its capture shape is this input's "
            "rows in the dummy batch).",
            default_doc="`input_size`",
            applies="flat",
            example="output_tokens",
        ),
        Key(
            "accepts_list",
            Boolean(),
            "The value may be a list of per-item tensors, concatenated on read.",
            default=False,
            applies="flat",
        ),
        Key(
            "fold_ranks",
            ListOf(Integer(2, 8), min_items=1),
            "A tensor of one of these ranks has a leading batch dim: its first two "
            "dims are merged into the rows on read (Kimi-K3's pixel values may "
            "arrive 3-D or 5-D around the usual 2-D / 4-D rows); after "
            "`accepts_list`'s concatenation.",
            applies="flat",
            example="[3, 5]",
        ),
        Key(
            "replay_dtype",
            HostPathValue(),
            "Cast to this dtype before replay.",
            applies="flat",
            example="aligner.w1.weight.dtype",
        ),
        Key(
            "eager_dtype",
            HostPathValue(),
            "Cast to this dtype in the eager forward.",
            applies="flat",
            example="vision_tower.dtype",
        ),
        Key(
            "unit_of",
            Identifier(),
            "Units (tiles) rather than items: one grid row, or `rows` flat rows "
            "(default 1), per unit, and the count input named here gives each "
            "item's units, which are consecutive (LFM2-VL: `spatial_shapes` per "
            "tile, `num_patches` tiles per image). Selection takes the units of "
            "the chosen items; with `items.per_unit`, item formulas sum over them.",
            applies="flat, grid",
            example="num_patches",
        ),
        Key(
            "pads_units",
            Boolean(),
            "Each row is one unit padded along dim 1 to the batch's widest "
            "(LFM2-VL's tiles): the mixin checks on the host that dim 1 holds "
            "every unit's `input_size` (a `ValueError` names the input), or a "
            "grid past the pixels would index past them. Needs `unit_of`, "
            "`items.per_unit` and one row per unit.",
            default=False,
            applies="flat",
        ),
        Key(
            "equals",
            MapOf(Formula("items")),
            "Dims this input derives from the others': dim → formula over "
            "constants and the dims of other inputs that have no formula "
            "themselves. The mixin checks every item on the host (a "
            "`ValueError` names both inputs), and the static checks draw the "
            "dims this way.",
            applies="grid, count",
            example="{lh: ceil_div(h, r), lw: ceil_div(w, r)}",
        ),
        Key(
            "multiple_of",
            MapOf(Formula("constants")),
            "Dims that are multiples of a constant formula in every row (item or "
            "unit), as the processor emits them: dim → divisor. The mixin "
            "checks every row on the host (a `ValueError` names the input, the "
            "row and the dim), as vLLM's LFM2-VL mixin refuses tiles whose grid "
            "the projector's factor does not divide: the item formulas' `//` "
            "would drop rows silently.",
            applies="grid, count, padded, tensors",
            example="{h: f, w: f}",
        ),
        Key(
            "pad_value",
            Integer(-(2**31), 2**31 - 1),
            "What pads an item past its own size: the replay stacks a list's "
            "shorter items with it, the replay copy fills the captured buffer "
            "with it before copying `[:N, :P]`, and `fill: pad` makes a capture "
            "dummy of it (Gemma 4's position ids: -1, a padding patch).",
            default=0,
            applies="padded, tensors",
            example="-1",
        ),
        Key(
            "video_key",
            Identifier(),
            "The key this input has in a video batch; all inputs or none have "
            "one, and only with the video modality. The spec's names are the "
            "image keys; a batch is a video batch when its first grid is absent "
            "under the image key. The mixin gains `get_input_modality`.",
            applies="all",
            example="pixel_values_videos",
        ),
    )
    DOC_TITLE = "inputs"
    APPLIES = {
        "dims": (InputKind.GRID, InputKind.TENSORS),
        "dim": (InputKind.COUNT, InputKind.PADDED),
        "pad_value": (InputKind.PADDED, InputKind.TENSORS),
        "shape": InputKind.TENSORS,
        "rows": InputKind.FLAT,
        "accepts_list": InputKind.FLAT,
        "pads_units": InputKind.FLAT,
        "fold_ranks": InputKind.FLAT,
        "replay_dtype": InputKind.FLAT,
        "eager_dtype": InputKind.FLAT,
        "units_per_item": InputKind.LIST,
        "unit_shape": InputKind.LIST,
    }

    @classmethod
    def from_yaml(cls, r: Reader, key: str, key_location: Location, **_: Any):
        kind = r.take("kind")
        if not r.ok("kind") or kind is None:
            r.ctx.failed_inputs.add(key)
            for name in cls.KEYS:
                r.taken.add(name)
            return None
        for name, applies in cls.APPLIES.items():
            kinds = applies if isinstance(applies, tuple) else (applies,)
            if kind not in kinds and r.has(name):
                r.refuse(name, _ONLY[applies])
        if kind is InputKind.FLAT and r.has("equals"):
            r.refuse("equals", "only for grid and count inputs")
        if kind is InputKind.FLAT and r.has("multiple_of"):
            r.refuse("multiple_of", "only for grid and count inputs")
        video_key = r.take("video_key")
        unit_of = r.take("unit_of")
        if kind in (InputKind.COUNT, InputKind.LIST) and r.has("unit_of"):
            r.refuse("unit_of", "only for flat and grid inputs (a count gives units)")
            unit_of = None
        if kind in (InputKind.PADDED, InputKind.TENSORS):
            return _padded(r, key, key_location, video_key, kind)
        if kind is InputKind.LIST:
            for name in ("equals", "multiple_of"):
                if r.has(name):
                    r.refuse(name, "only for grid and count inputs")
        if kind is InputKind.FLAT and r.has("pads_units") and not unit_of:
            r.refuse("pads_units", "needs unit_of (a row is one unit)")
        if kind is InputKind.FLAT:
            default_rows = Num(1) if unit_of else Ref("input_size")
            return FlatInput(
                key,
                key_location,
                r.take("rows", extra=()) or default_rows,
                r.has("rows") and r.ok("rows"),
                r.take("accepts_list"),
                _fold_ranks(r),
                r.take("replay_dtype"),
                r.take("eager_dtype"),
                video_key,
                unit_of,
                bool(r.take("pads_units")) and unit_of is not None,
            )
        dims = _item_dims(r, kind)
        if unit_of and r.has("equals"):
            # equals is checked per item; a unit input has one row per unit.
            r.refuse("equals", "not with unit_of (equals states an item's dims)")
        equals = _equals(r, dims) if r.ok("equals") else ()
        multiple_of = _multiple_of(r, dims) if r.ok("multiple_of") else ()
        unit_shape = _unit_shape(r, kind)
        if dims is None:
            r.ctx.failed_inputs.add(key)
            return None
        return ItemInput(
            key,
            key_location,
            kind,
            dims,
            video_key,
            unit_of=unit_of,
            equals=equals,
            multiple_of=multiple_of,
            unit_shape=unit_shape,
        )


def _padded(r: Reader, key: str, key_location: Location, video_key, kind):
    """A padded or tensors input: its dims, divisors and pad value (no
    ``equals``: the sizes are the tensor's, nothing to derive; no
    ``unit_of``: one tensor per item)."""
    for name, why in (
        ("equals", "only for grid and count inputs (a padded size is its shape)"),
        (
            "unit_of",
            "only for flat and grid inputs (a padded input has one " "entry per item)",
        ),
    ):
        if r.has(name):
            r.refuse(name, why)
    dims = _item_dims(r, kind)
    multiple_of = _multiple_of(r, dims) if r.ok("multiple_of") else ()
    pad_value = r.take("pad_value")
    item_shape = _item_shape(r, dims) if kind is InputKind.TENSORS else ()
    if dims is None or item_shape is None:
        r.ctx.failed_inputs.add(key)
        return None
    return ItemInput(
        key,
        key_location,
        kind,
        dims,
        video_key,
        multiple_of=multiple_of,
        pad_value=pad_value if r.ok("pad_value") else 0,
        item_shape=item_shape,
    )


def _item_shape(r: Reader, dims: tuple[str, ...] | None) -> tuple[Expr, ...] | None:
    """A tensors input's ``shape``: each of ``dims`` once, as an entry of its
    own (read off the item), every other entry over constants only (checked
    against the item); None when it failed (reported)."""
    shape = r.take("shape")
    if not r.has("shape"):
        r.error(r.node, "a tensors input needs shape", r.path("shape"))
        return None
    if not r.ok("shape") or INVALID in shape or dims is None:
        return None
    field = r.path("shape")
    nodes = r.raw("shape").value
    ok = True
    for i, (expr, node) in enumerate(zip(shape, nodes, strict=True)):
        read = fx.names_in(expr) & set(dims)
        if read and not isinstance(expr, Ref):
            r.ctx.error(
                node,
                f"{field}[{i}]",
                f"reads {', '.join(sorted(read))} inside a formula: a dim is an "
                "entry of its own (the item's size there), the others constants",
            )
            ok = False
    refs = [e.name for e in shape if isinstance(e, Ref) and e.name in dims]
    for dim in dims:
        if refs.count(dim) != 1:
            times = "twice or more" if refs.count(dim) else "nowhere"
            r.error("shape", f"dim {dim!r} is {times} in the shape: give it once")
            ok = False
    return tuple(shape) if ok else None


def _unit_shape(r: Reader, kind: InputKind) -> tuple[Expr, ...]:
    """A list input's ``unit_shape`` (required: the host checks every unit
    against it); ``()`` for the other kinds and when it failed (reported:
    the input itself stays declared, so nothing else fails with it)."""
    if kind is not InputKind.LIST:
        return ()
    shape = r.take("unit_shape")
    if not r.has("unit_shape"):
        r.error(r.node, "a list input needs unit_shape", r.path("unit_shape"))
        return ()
    if not r.ok("unit_shape") or INVALID in shape:
        return ()
    return tuple(shape)


def _multiple_of(r: Reader, dims: tuple[str, ...] | None):
    """``multiple_of`` as ``(dim, divisor)`` pairs, each a dim of this input
    (a literal divisor of 0 would always raise)."""
    formulas = r.take("multiple_of") or {}
    locations = getattr(r.raw("multiple_of"), "key_locations", None) or {}
    out = []
    for dim, expr in formulas.items():
        where = locations.get(dim, r.key_location("multiple_of"))
        field = f"{r.path('multiple_of')}.{dim}"
        if dims is not None and dim not in dims:
            r.ctx.error(where, field, f"{dim!r} is not a dim of this input")
        elif expr == Num(0):
            r.ctx.error(where, field, "no dim is a multiple of 0")
        elif expr is not INVALID:
            out.append((dim, expr))
    return tuple(out)


def _equals(r: Reader, dims: tuple[str, ...] | None) -> tuple[tuple[str, Expr], ...]:
    """``equals`` as ``(dim, formula)`` pairs: each key a dim of this input,
    no formula reading its own dim (a check that could not fail)."""
    formulas = r.take("equals") or {}
    locations = getattr(r.raw("equals"), "key_locations", None) or {}
    out = []
    for dim, expr in formulas.items():
        where = locations.get(dim, r.key_location("equals"))
        field = f"{r.path('equals')}.{dim}"
        if dims is not None and dim not in dims:
            r.ctx.error(where, field, f"{dim!r} is not a dim of this input")
        elif expr is not INVALID and dim in fx.names_in(expr):
            r.ctx.error(where, field, f"the formula of {dim!r} reads {dim!r} itself")
        elif expr is not INVALID:
            out.append((dim, expr))
    return tuple(out)


def _fold_ranks(r: Reader) -> tuple[int, ...]:
    ranks = tuple(v for v in r.take("fold_ranks") or () if v is not INVALID)
    if len(set(ranks)) != len(ranks):
        r.error("fold_ranks", "ranks must not repeat")
    return ranks


def _item_dims(r: Reader, kind: InputKind) -> tuple[str, ...] | None:
    name = _DIMS_KEY.get(kind, "dim")
    value = r.take(name)
    if not r.has(name):
        r.error(r.node, f"a {kind.value} input needs {name}", r.path(name))
        return None
    several = kind in (InputKind.GRID, InputKind.TENSORS)
    if not r.ok(name) or (several and INVALID in value):
        return None
    if kind is InputKind.GRID and len(value) == 1:
        r.error(
            "dims",
            "a grid row of one dim: write `kind: count` and `dim:` for one "
            "number per item (a 1-D tensor or a list)",
        )
        return None
    return tuple(value) if several else (value,)


#: The key that names an item input's dims, by kind (``dim`` for counts).
_DIMS_KEY = {
    InputKind.GRID: "dims",
    InputKind.TENSORS: "dims",
    InputKind.LIST: "units_per_item",
}


def prescan_dims(ctx: ReadContext, inputs_node) -> None:
    """Declare every grid and count dim before the inputs are read, so a flat
    input's ``rows`` may use the dims of grids declared after it."""
    if inputs_node is None or inputs_node.kind != "mapping":
        return
    seen: dict[str, str] = {}
    padded: set[str] = set()
    for key, entry in inputs_node.value.items():
        if entry.kind != "mapping":
            continue
        field = f"inputs.{key}"
        name = next((n for n in ("dims", "units_per_item") if n in entry.value), "dim")
        dims_node = entry.value.get(name)
        if dims_node is None:
            continue
        items = dims_node.value if dims_node.kind == "sequence" else [dims_node]
        for dim_node in items:
            dim = dim_node.value
            if not isinstance(dim, str):
                continue
            where = f"{field}.{name}"
            check_name(ctx, dim_node.location, where, dim, "dim")
            kind_node = entry.value.get("kind")
            is_padded = kind_node is not None and kind_node.value == "padded"
            if dim in seen and is_padded and seen[dim] in padded:
                # Padded inputs share their size dim (the mixin checks that
                # they agree per item).
                continue
            if is_padded:
                padded.add(key)
            if dim in seen:
                ctx.error(
                    dim_node, where, f"dim {dim!r} is already a dim of {seen[dim]!r}"
                )
            elif (
                ctx.kind_of(dim) in (NameKind.CONSTANT, NameKind.HOST)
                or dim in inputs_node.value
            ):
                ctx.error(dim_node, where, f"dim {dim!r} clashes with another name")
            seen.setdefault(dim, key)
            ctx.declare(NameKind.DIM, dim, dim_node.location, where)


def substitute(expr: Expr, mapping: dict[str, Expr | None]) -> Expr:
    """``expr`` with the names of ``mapping`` replaced by their formulas."""
    return fx.substitute(expr, {k: v for k, v in mapping.items() if v is not None})


def with_item_rows(flat: FlatInput, input_size: Expr, output_tokens: Expr) -> FlatInput:
    """The flat input with ``input_size`` / ``output_tokens`` inlined in its
    rows, so the formula stands alone."""
    rows = substitute(
        flat.rows, {"input_size": input_size, "output_tokens": output_tokens}
    )
    return replace(flat, rows=rows)
