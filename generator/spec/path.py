"""One encoder path: its capture, builders, buffers and forwards.

vLLM's protocol captures each path of an encoder separately, with its own
budgets (``EncoderCudaGraphPathConfig``), buffers and graphs, and calls every
method that builds or runs a graph with the path's name. A spec without
``paths:`` has one path, ``default``, whose keys sit at the spec's top level;
``paths:`` names several, each with its per-item rows (``output_tokens``:
``EncoderItemSpec.path_output_tokens``), its smallest budget and whether a
batch may leave it out. Each path's buffers, steps and builder results are
its own: a path's formulas see only its own buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from generator import formulas as fx
from generator.formulas import Expr
from generator.naming import builder_result_name
from generator.scopes import METHODS, NameKind
from generator.spec.capture import (
    ITEM_BOUND,
    Buffer,
    Capture,
    CaptureTensor,
    MetadataBuilder,
)
from generator.spec.enums import PadRule
from generator.spec.forwards import (
    GRAPH_STEPS,
    EagerForward,
    Step,
    check_graph_forward,
)
from generator.spec.inputs import FlatInput
from generator.spec.reader import Key, Keys, ReadContext, Reader
from generator.spec.values import (
    INVALID,
    Boolean,
    CallValue,
    Formula,
    ListOf,
    MapOf,
    Section,
    Text,
)


@dataclass(frozen=True)
class EncoderPath:
    name: str
    capture: Capture
    metadata: tuple[MetadataBuilder, ...]
    buffers: tuple[Buffer, ...]
    graph_forward: tuple[Step, ...]
    eager_forward: EagerForward
    #: Rows of each item on this path (``path_output_tokens[name]``); None
    #: for the implicit ``default`` path of a spec without ``paths:``.
    output_tokens: Expr | None = None
    min_token_budget: Expr | None = None
    allow_zero_tokens: bool = False
    why: str | None = None
    #: ``graph_forward_context``: the context manager the captured steps run in.
    graph_forward_context: Expr | None = None

    KEYS: ClassVar = Keys(
        Key(
            "output_tokens",
            Formula("items"),
            "Rows of each item on this path: `EncoderItemSpec.path_output_tokens"
            "[<path>]`, what the path's budgets count, its dummy batch must cover "
            "and its graph emits per item.",
            required=True,
            example="num_patches * 81",
        ),
        Key(
            "min_token_budget",
            Formula("constants"),
            "`EncoderCudaGraphPathConfig.min_token_budget`: the path's smallest "
            "budget; its budgets double from it up to the largest global budget. "
            "Absent: the global budgets.",
            example="81",
        ),
        Key(
            "allow_zero_tokens",
            Boolean(),
            "`EncoderCudaGraphPathConfig.allow_zero_tokens`: a batch may have no "
            "rows on this path (it then skips the path: no replay, no eager call, "
            "no entry in the outputs). Required when `output_tokens` can be 0.",
            default=False,
        ),
        Key("why", Text(), "Comment on the path (its forwards' branch)."),
        Key(
            "capture",
            Section(Capture),
            "The dummy batch each budget is captured with.",
            required=True,
        ),
        Key(
            "metadata",
            ListOf(Section(MetadataBuilder)),
            "Builders of the buffers that are not capture tensors, run at capture "
            "on the dummy grids and at replay on the real ones.",
        ),
        Key(
            "buffers",
            MapOf(Section(Buffer), min_items=1),
            "The captured buffers in order (this order is `buffer_keys`), each "
            "with one source (a capture tensor or a builder's `provides` or "
            "`returns`) and its "
            "replay rule; `{}` is the manager's default (zero, then copy the rows "
            "on dim 0).",
            required=True,
        ),
        Key(
            "graph_forward",
            GRAPH_STEPS,
            "The captured computation: statements (`name = expr`, `a, _ = expr`) "
            "over the buffers, the last one a bare expression, the output; `rest` "
            "passes the buffers no step names, as a dict. Every buffer must be "
            "read; nothing may copy to the host (`.item()`, `.tolist()`, `.cpu()`, "
            "`.numpy()`, `torch.tensor`).",
            required=True,
            example="[vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)]",
        ),
        Key(
            "graph_forward_context",
            CallValue("forward_context"),
            "A context manager the captured steps run in (`with <call>:`), a call "
            "of an imported helper or host method: LFM2-VL's encoder runs under "
            "`set_forward_context(None, vllm_config)`, which its compiled layers "
            "read. The whole forward runs in it (vLLM's hand-written mixins "
            "enter it around the encoder only).",
            example="set_forward_context(None, vllm_config)",
        ),
        Key(
            "eager_forward",
            Section(EagerForward),
            "The computation for batches above every budget.",
            required=True,
        ),
    )

    def buffer(self, key: str) -> Buffer | None:
        return next((b for b in self.buffers if b.key == key), None)

    @property
    def pad_buffers(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.pad is not None)

    @property
    def trailing(self) -> Buffer | None:
        return next(
            (b for b in self.buffers if b.pad is PadRule.TRAILING_SEQUENCE), None
        )

    DOC_TITLE = "paths"

    @property
    def named(self) -> bool:
        """Declared under ``paths:`` (else the implicit default path)."""
        return self.output_tokens is not None

    @property
    def field(self) -> str:
        """The field path prefix of this path's keys (``paths.local.``)."""
        return f"paths.{self.name}." if self.named else ""

    @classmethod
    def from_yaml(
        cls,
        r: Reader,
        item_inputs,
        flats,
        key: str | None = None,
        **_: Any,
    ) -> EncoderPath | None:
        """The implicit default path (``key`` None: the keys are the spec's
        top-level ones), or the path ``key`` of ``paths:``, whose buffers,
        steps and builder results are declared for it alone."""
        if key is None:
            return cls._read(r, "default", item_inputs, flats)
        with r.ctx.path_names():
            return cls._read(r, key, item_inputs, flats)

    @classmethod
    def _read(cls, r: Reader, name: str, item_inputs, flats) -> EncoderPath | None:
        ctx = r.ctx
        named = r.keys is cls.KEYS
        partial = ctx.partial.setdefault("paths", {}).setdefault(name, {})
        if named:
            output_tokens = r.take("output_tokens")
            partial["output_tokens"] = output_tokens
            min_budget = r.take("min_token_budget")
            partial["min_token_budget"] = min_budget
            allow_zero = r.take("allow_zero_tokens")
            partial["allow_zero_tokens"] = allow_zero
            why = r.take("why")
        known = _declare_buffers(r)
        capture = r.take("capture", items_inputs=item_inputs, flats=flats)
        partial["capture"] = capture
        if capture is None:
            # Which buffers its tensors were meant to fill is unknown.
            ctx.failed_sources.update(flats)
        builders = _builders(r, item_inputs)
        tensors = capture.tensors if capture is not None else ()
        sources = _sources(r, tensors, builders)
        entries = r.take("buffers", sources=sources) or {}
        buffers = tuple(b for b in entries.values() if b is not INVALID)
        partial["buffers"] = buffers
        partial["metadata"] = builders
        _check_buffers(r, buffers, tensors, builders, capture)
        if capture is not None and capture.of_units:
            _check_unit_capture(r, buffers, builders, capture)
        if not known:
            # Without buffers, every name of the forward would be unknown.
            r.take_node("graph_forward")
            graph_forward = None
        else:
            graph_forward = r.take("graph_forward")
        if graph_forward is not None:
            check_graph_forward(
                ctx,
                r.raw("graph_forward"),
                graph_forward,
                list(entries),
                r.path("graph_forward"),
            )
        context = r.take("graph_forward_context")
        eager = r.take("eager_forward")
        if None in (capture, graph_forward, eager) or INVALID in entries.values():
            return None
        if not r.ok("graph_forward_context"):
            return None
        if not named:
            return cls(
                "default",
                capture,
                builders,
                buffers,
                graph_forward,
                eager,
                graph_forward_context=context,
            )
        if output_tokens is None or not r.ok("min_token_budget"):
            return None
        return cls(
            name,
            capture,
            builders,
            buffers,
            graph_forward,
            eager,
            output_tokens,
            min_budget,
            allow_zero,
            why,
            context,
        )


def _declare_buffers(r: Reader) -> bool:
    """Declare the buffer names before the builders and forwards that use
    them; False when there are none to declare (reported elsewhere)."""
    from generator.spec.names import check_name

    node = r.raw("buffers")
    if node is None or node.kind != "mapping":
        r.ctx.buffers_unknown = True
        return False
    for key in node.value:
        loc = (node.key_locations or {}).get(key, node.location)
        field = f"{r.path('buffers')}.{key}"
        check_name(r.ctx, loc, field, key, "buffer")
        r.ctx.declare(NameKind.BUFFER, key, loc, field)
    return True


def _builders(r: Reader, item_inputs) -> tuple[MetadataBuilder, ...]:
    provided: dict[str, str] = {}
    # A per-item builder's steps read a tensors input as the item's tensor.
    tensors = tuple(k for k, i in (item_inputs or {}).items() if i.is_tensors)
    results = r.take("metadata", provided=provided, tensors=tensors) or ()
    _check_item_locals(r, results)
    built = [b for b in results if b is not INVALID]
    taken = set().union(*(set(names) for names in r.ctx.names.values()))
    taken |= _method_names()
    out = []
    for b in built:
        if b.call is None:
            # Steps bind their own names (the buffers among them).
            out.append(b)
            continue
        callee = b.call.callee
        last = callee.name if hasattr(callee, "name") else str(callee.parts[-1])
        own = b.provides[0] if b.returns_tensor else None
        others = {k for k, names in r.ctx.names.items() if own in names} - {
            NameKind.BUFFER
        }
        if own is not None and not others and own not in _method_names():
            # The call returns the buffer itself: the local is the buffer's name.
            name = own
        elif len(built) == 1 and "metadata" not in taken:
            name = "metadata"
        else:
            name = builder_result_name(last, taken)
        taken.add(name)
        r.ctx.declare(NameKind.BUILDER_RESULT, name, b.location)
        out.append(replace(b, result_name=name))
    return tuple(out)


def _check_item_locals(r: Reader, results) -> None:
    """After a per-item builder only the names it provides hold the batch's
    value (the items' results joined); its other step names held one item's,
    so no later builder reads them."""
    node = r.raw("metadata")
    inner: dict[str, int] = {}
    for i, b in enumerate(results):
        if not isinstance(b, MetadataBuilder):
            continue  # refused, already reported
        read = set().union(*(fx.names_in(s.expr) for s in b.steps))
        for name in sorted(read & set(inner)):
            r.ctx.error(
                node.value[i],
                f"{r.path('metadata')}[{i}].steps",
                f"{name!r} is a step of the per_item builder metadata"
                f"[{inner[name]}], one item's value: only its provides are the "
                "batch's (list it there)",
            )
        if b.per_item:
            # (A step that rebinds an input is reported where it is.)
            inputs = set(r.ctx.names[NameKind.GRID]) | set(r.ctx.names[NameKind.FLAT])
            inner.update(dict.fromkeys(b.step_names - set(b.provides) - inputs, i))


def _method_names() -> set[str]:
    """What the methods that call builders bind for themselves."""
    names: set[str] = set()
    for method in (
        "prepare_encoder_cudagraph_capture_inputs",
        "prepare_encoder_cudagraph_replay_buffers",
    ):
        m = METHODS[method]
        names |= {p.name for p in m.params} | set(m.locals)
    return names


def _sources(
    r: Reader, tensors, builders
) -> dict[str, CaptureTensor | MetadataBuilder]:
    sources: dict[str, CaptureTensor | MetadataBuilder] = {t.key: t for t in tensors}
    buffers = r.ctx.names[NameKind.BUFFER]
    both = set()
    for b in builders:
        for key in b.provides:
            if isinstance(sources.get(key), CaptureTensor):
                both.add(key)
            else:
                sources.setdefault(key, b)
    for key in sorted(both):
        if key in buffers:
            r.ctx.error(
                buffers[key],
                f"{r.path('buffers')}.{key}",
                "provided both by a capture tensor and a builder",
            )
        del sources[key]
        r.ctx.failed_sources.add(key)
    capture = r.raw("capture")
    tensors_node = (
        capture.value.get("tensors") if capture and capture.kind == "mapping" else None
    )
    read = set().union(*(fx.names_in(e) for b in builders for e in b.exprs))
    for t in tensors:
        if t.key not in buffers and t.key not in read and not r.ctx.buffers_unknown:
            r.ctx.error(
                (tensors_node.key_locations or {}).get(t.key, t.location),
                f"{r.path('capture')}.tensors.{t.key}",
                f"{t.key!r} is not a declared buffer",
            )
    return sources


def _check_buffers(r: Reader, buffers, tensors, builders, capture) -> None:
    ctx = r.ctx
    if sum(1 for b in buffers if b.pad is PadRule.TRAILING_SEQUENCE) > 1:
        ctx.error(
            r.raw("buffers"),
            r.path("buffers"),
            "at most one buffer can use trailing_sequence",
        )
    for b in buffers:
        if isinstance(b.source, CaptureTensor) and (
            b.shape is not None or b.dtype is not None
        ):
            ctx.error(
                b.location,
                f"{r.path('buffers')}.{b.key}",
                "shape and dtype of a capture tensor's buffer come from capture.tensors",
            )
        _check_set_by(r, b, buffers)
        _check_allocated(ctx, b, r.path("buffers"))
        if b.host_scalar and getattr(b.source, "per_item", False):
            ctx.error(
                b.location,
                f"{r.path('buffers')}.{b.key}.host_scalar",
                "a per_item builder joins one result per item, no single value: "
                "compute the host scalar in a builder after it (from its results)",
            )
        if b.optional and isinstance(b.source, CaptureTensor):
            ctx.error(
                b.location,
                f"{r.path('buffers')}.{b.key}.optional",
                "a capture tensor is never None: only builder buffers may be optional",
            )
    _check_bounds(r, buffers)
    if (
        capture is not None
        and capture.graph_rows is not None
        and not any(
            _buffer_node(r, key, "allocate") is not None
            for key in ctx.names[NameKind.BUFFER]
        )
    ):
        ctx.error(
            r.raw("capture").key_locations["graph_rows"],
            f"{r.path('capture')}.graph_rows",
            "no buffer has 'allocate': the graph rows beyond the dummy's need "
            "buffers that hold them",
        )


def _buffer_node(r: Reader, key: str, name: str):
    buffers = r.raw("buffers")
    entry = buffers.value.get(key) if buffers is not None else None
    if entry is None or entry.kind != "mapping":
        return None
    return entry.value.get(name)


def _check_set_by(r: Reader, buf: Buffer, buffers) -> None:
    if buf.bounds == ITEM_BOUND:
        where = _buffer_node(r, buf.key, "bounds") or buf.location
        field = f"{r.path('buffers')}.{buf.key}.bounds"
        if buf.set_by is None and buf.capture_value is None:
            r.ctx.error(where, field, "bounds only goes with set_by")
        elif any(b.pad is PadRule.TRAILING_SEQUENCE for b in buffers):
            r.ctx.error(
                where,
                field,
                "a trailing padding sequence may hold every row of the dummy "
                "batch: with trailing_sequence, a host scalar bounds rows",
            )
    if buf.set_by is None:
        return
    field = f"{r.path('buffers')}.{buf.key}.set_by"
    where = _buffer_node(r, buf.key, "set_by") or buf.location
    if not buf.host_scalar:
        r.ctx.error(where, field, "set_by only goes with host_scalar")
        return
    if not isinstance(buf.source, MetadataBuilder):
        r.ctx.error(where, field, "no builder provides this buffer")
        return
    if buf.set_by not in dict(buf.source.kwargs("capture")):
        r.ctx.error(where, field, f"its builder passes no {buf.set_by!r} at capture")


def _check_bounds(r: Reader, buffers: tuple[Buffer, ...]) -> None:
    """A host scalar's ``bounds`` names a pad buffer; with several pad
    buffers, a host scalar set at capture must say which."""
    pads = [b.key for b in buffers if b.pad is not None]
    for b in buffers:
        field = f"{r.path('buffers')}.{b.key}.bounds"
        where = _buffer_node(r, b.key, "bounds") or b.location
        if b.key == ITEM_BOUND:
            r.ctx.error(
                b.location,
                f"{r.path('buffers')}.{b.key}",
                f"{ITEM_BOUND!r} is reserved: a host scalar's 'bounds: item' means "
                "the longest item within the budget; rename the buffer",
            )
        if b.bounds == ITEM_BOUND:
            continue
        if b.bounds is not None and b.bounds not in pads:
            listed = ", ".join(pads) or "none"
            r.ctx.error(
                where,
                field,
                f"{b.bounds!r} is not a pad buffer (pad buffers: {listed})",
            )
        elif (
            b.bounds is None
            and b.host_scalar
            and (b.set_by or b.capture_value is not None)
            and len(pads) > 1
        ):
            r.ctx.error(
                b.location,
                field,
                f"several pad buffers ({', '.join(pads)}): say whose sequences "
                f"{b.key} bounds",
            )


def _check_allocated(ctx: ReadContext, b: Buffer, buffers_field: str) -> None:
    """``allocate`` buffers: builder buffers with a declared shape and dtype,
    rows on dim 0, plain copies."""
    if not b.allocate:
        return
    field = f"{buffers_field}.{b.key}.allocate"
    if isinstance(b.source, CaptureTensor):
        ctx.error(b.location, field, "a capture tensor is allocated already")
    elif b.shape is None or b.dtype is None:
        ctx.error(b.location, field, "needs the buffer's shape and dtype")
    elif not b.shape:
        ctx.error(b.location, field, "needs at least one dimension (rows)")
    if b.pad or b.host_scalar or b.rows_dim:
        ctx.error(
            b.location,
            field,
            "only for plain row buffers (rows on dim 0, no pad, not a host scalar)",
        )


def _check_unit_capture(r: Reader, buffers, builders, capture) -> None:
    """What a unit capture can say: builders see only the grids of
    ``capture.unit_dummy``, and padded offsets and host scalars set at
    capture need those dummy units (their sequences), ``repeat_last`` only."""
    ctx = r.ctx
    grids = set(ctx.names[NameKind.GRID]) - {i.key for i, _ in capture.unit_dummy}
    # A list input's capture tensor is its dummy units.
    grids -= {t.key for t in capture.tensors if not isinstance(t.flat, FlatInput)}
    node = r.raw("metadata")
    for i, b in enumerate(builders):
        if b.per_item:
            ctx.error(
                node.value[i] if node is not None else b.location,
                f"{r.path('metadata')}[{i}].per_item",
                "a unit capture has no dummy items to run a per_item builder on: "
                "build the metadata over the units at once",
            )
            continue
        exprs = (
            b.exprs if b.call is None else (b.call, *(v for _, v in b.capture_kwargs))
        )
        read = set().union(*(fx.names_in(e) for e in exprs))
        for name in sorted(read & grids):
            where = node.value[i] if node is not None else b.location
            ctx.error(
                where,
                f"{r.path('metadata')}[{i}].{'call' if b.call else 'steps'}",
                f"reads the grid {name!r} at capture, but a unit capture has no "
                "dummy items: give its dummy units (capture.unit_dummy) or pass "
                "flat inputs (the capture tensors) instead",
            )
    for b in buffers:
        what = (
            "pad"
            if b.pad is not None
            else (
                "set_by"
                if b.set_by is not None
                else "capture_value" if b.capture_value is not None else None
            )
        )
        if what is None:
            continue
        if not capture.unit_dummy:
            ctx.error(
                b.location,
                f"{r.path('buffers')}.{b.key}.{what}",
                f"{what} in a unit capture needs its dummy units "
                "(capture.unit_dummy): the static checks bound sequences by units",
            )
        elif what == "pad" and (b.pad is not PadRule.REPEAT_LAST or b.pad_by_backend):
            ctx.error(
                b.location,
                f"{r.path('buffers')}.{b.key}.pad",
                "a unit capture pads offsets with zero-length sequences only "
                "(repeat_last, no pad_by_backend): it has no padding rows",
            )
