"""``prepare_encoder_cudagraph_capture_inputs``: the dummy batch's buffers."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.capture_axes import capture_context
from generator.emitters.capture_checks import capture_checks, check_dims
from generator.emitters import host_callees
from generator.emitters.method_body import (
    Body,
    Loads,
    dims_of,
    item_loop,
    optional_note,
    path_dispatch,
    times,
)
from generator.emitters.prose import comment_lines, message_literal, plain_message
from generator.formulas import Ref
from generator.naming import PROTOCOL_MODULES
from generator.spec import conditions
from generator.spec.capture import (
    Buffer,
    Capture,
    CaptureAssert,
    CaptureTensor,
    DtypeFallback,
    MetadataBuilder,
)
from generator.spec.enums import Dtype, Fill, ImageLimitGuard, PadRule, Rounding
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath


def builder_calls(
    spec: MixinSpec,
    path: EncoderPath,
    body: Body,
    phase: str,
    name_map: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Each builder's call at ``phase`` (capture or replay) and its result name."""
    out = []
    for b in path.metadata:
        if b.call is None:
            # A per-item builder reads a tensors input as the item's tensor.
            items = {k: f"{k}_item" for k in item_tensors(spec, b)}
            steps_map = {**(name_map or {}), **items}
            out.append(
                {
                    "steps": [
                        {"target": s.target, "expr": body.expr(s.expr, steps_map)}
                        for s in b.steps
                    ],
                    "per_item": _per_item(spec, b, name_map or {}, phase),
                    "why": comment_lines(b.why),
                }
            )
            continue
        call = fx.Call(b.call.callee, b.call.args, b.kwargs(phase))
        out.append(
            {
                "name": b.result_name,
                "call": body.expr(call, name_map),
                "steps": None,
                "why": comment_lines(b.why),
            }
        )
    return out


def item_tensors(spec: MixinSpec, builder: MetadataBuilder) -> list[str]:
    """The tensors inputs a per-item builder's steps read (as the item's
    tensor)."""
    if not builder.per_item:
        return []
    read = set().union(*(fx.names_in(s.expr) for s in builder.steps))
    return [g.key for g in spec.item_inputs if g.is_tensors and g.key in read]


def item_loop_keys(spec: MixinSpec, builder: MetadataBuilder) -> tuple[str, list[str]]:
    """A per-item builder's ``for`` target (the item dims its steps read,
    and those of each tensors input they read) and the item inputs it
    iterates."""
    dims = set().union(*(dims_of(spec, s.expr) for s in builder.steps))
    for key in item_tensors(spec, builder):
        dims |= set(spec.item_input(key).dims)
    target, _, keys = item_loop(spec, dims)
    return target, keys


def _per_item(
    spec: MixinSpec, builder: MetadataBuilder, name_map: dict[str, str], phase: str
) -> dict[str, Any] | None:
    """A per-item builder's loop: its target, what it iterates (a padded or
    tensors input by its sizes, and the items' own tensors the steps read),
    and the buffers it joins."""
    if not builder.per_item:
        return None
    target, keys = item_loop_keys(spec, builder)
    names = [name_map.get(k, k) for k in keys]
    tensors = item_tensors(spec, builder)
    items = [
        {"name": f"{k}_items", "value": _items_of(spec, k, phase)} for k in tensors
    ]
    if items:
        inputs = [spec.item_input(k) for k in keys]
        parts = [
            g.dims[0] if len(g.dims) == 1 else f"({', '.join(g.dims)})" for g in inputs
        ]
        target = ", ".join(parts + [f"{k}_item" for k in tensors])
        names += [i["name"] for i in items]
    iterable = names[0] if len(names) == 1 else f"zip({', '.join(names)}, strict=True)"
    joined = ", ".join(f'"{name}": []' for name in builder.provides)
    return {
        "target": target,
        "iterable": iterable,
        "items": items,
        "lists": "{" + joined + "}",
        "provides": list(builder.provides),
    }


def _items_of(spec: MixinSpec, key: str, phase: str) -> str:
    """A tensors input's items, one tensor each: at replay the batch's (a
    list, or a stacked tensor whose rows are the items); at capture each
    dummy item cut out of the capture tensor to its sizes."""
    if phase == "replay":
        return f"mm_kwargs[{Loads(spec).key(key)}]"
    item = spec.item_input(key)
    crop = ", ".join(
        f":{e.name}" if isinstance(e, Ref) and e.name in item.dims else ":"
        for e in item.item_shape
    )
    dims = ", ".join(item.dims)
    pairs = f"zip({key}, {key}_sizes, strict=True)"
    return f"[tensor[{crop}] for tensor, ({dims}) in {pairs}]"


def builder_value(buf: Buffer) -> str:
    """The buffer's value in its builder's result (a builder's steps bind
    it under its own name)."""
    assert isinstance(buf.source, MetadataBuilder)  # noqa: S101
    if buf.source.call is None:
        return buf.key
    if buf.source.returns_tensor:
        return buf.source.result_name
    return f'{buf.source.result_name}["{buf.key}"]'


def _builder_grids(spec: MixinSpec, path: EncoderPath) -> set[str]:
    """Grid and count keys a builder reads at capture."""
    names: set[str] = set()
    for b in path.metadata:
        exprs = (
            b.exprs if b.call is None else (b.call, *(v for _, v in b.capture_kwargs))
        )
        for e in exprs:
            names |= fx.names_in(e)
        if b.per_item:
            names.update(item_loop_keys(spec, b)[1])
    return {n for n in names if spec.item_input(n) is not None}


def _own_rows(path: EncoderPath) -> list[CaptureTensor]:
    """Capture tensors of flat inputs with their own rows per item."""
    return [t for t in path.capture.tensors if t.flat.own_rows]


def _dummies(spec: MixinSpec, path: EncoderPath, body: Body) -> list[dict[str, Any]]:
    builder_grids = _builder_grids(spec, path)
    rows_dims = dims_of(spec, spec.items.input_size) | check_dims(spec, path)
    for t in _own_rows(path):
        rows_dims |= dims_of(spec, t.flat.rows)
    out = []
    bound: set[str] = set()
    for item, exprs in path.capture.dummy:
        if item.key not in builder_grids and not (set(item.dims) & rows_dims):
            continue
        if item.is_padded and set(item.dims) <= bound and item.key not in builder_grids:
            continue  # a size dim another padded input's dummy already binds
        bound |= set(item.dims)
        targets = ", ".join(item.dims)
        out.append(
            {
                "key": item.key,
                "targets": targets,
                "dim_values": ", ".join(body.expr(e) for e in exprs),
                # A builder reads a padded input's sizes (padded_sizes).
                "list": item.key in builder_grids and not item.is_padded,
                "padded": item.is_padded,
                "row": targets if item.is_count else f"[{targets}]",
            }
        )
    return out


def _assertion(spec: MixinSpec, body: Body, check: CaptureAssert) -> dict[str, Any]:
    """The refusal of a budget whose dummy breaks ``check``: the negated
    comparison and a message with the spec's text (escaped by the literal
    printer) and the values of both sides."""
    broken = check.check.negated
    # Placeholders end the message's clauses: the literal printer puts a space
    # between every part.
    message = message_literal(
        [
            (
                f"{spec.display_name}: {check.message.rstrip('.')}: needs "
                f"{check.check.spec_text()}, got",
                False,
            ),
            (body.expr(broken.left), True),
            (broken.op, False),
            (body.expr(broken.right), True),
            ("at token_budget", False),
            ("token_budget", True),
            ("with max_batch_size", False),
            ("max_batch_size", True),
        ]
    )
    return {
        "why": comment_lines(check.why),
        "condition": conditions.to_python(broken, body.expr),
        "message": message,
    }


def _capture_names(capture) -> set[str]:
    """The names the dummy, the intermediates and the checks read."""
    names = {n for _, exprs in capture.dummy for e in exprs for n in fx.names_in(e)}
    for let in capture.lets:
        names |= fx.names_in(let.expr)
    for check in capture.asserts:
        names |= check.check.names()
    return names


def _tensor(body: Body, t: CaptureTensor, of_units: bool) -> dict[str, Any]:
    # In its own shape, ``rows`` is the input's rows in the dummy batch (a
    # unit capture has no dummy batch: its shapes use ``units``).
    # (A list input's units have no rows of their own: ``own_rows`` is False.)
    own_rows = t.flat.own_rows and not of_units
    if getattr(t.flat, "is_padded", False):
        # One row per item: named only where the shape reads ``rows``.
        own_rows = own_rows and any("rows" in fx.names_in(s) for s in t.shape)
    names = {"rows": f"{t.key}_rows"} if own_rows else None
    return {
        "key": t.key,
        # A list input's dummy: one unit per row, as a list like the batch's.
        "units_list": getattr(t.flat, "is_list", False),
        "rows": (
            {
                "name": f"{t.key}_rows",
                "value": times("max_batch_size", body, t.flat.rows),
            }
            if own_rows
            else None
        ),
        "fill": t.fill.value,
        # fill: pad, a padded input's dummy of padding only.
        "fill_value": (repr(t.flat.pad_value) if t.fill is Fill.PAD else None),
        "shape": ", ".join(body.expr(s, names) for s in t.shape),
        "dtype": _dtype(body, t),
        "why": comment_lines(t.why),
    }


def _dtype(body: Body, t: CaptureTensor) -> str:
    """The capture tensor's dtype: the manager's, a named one, a host
    path's, or the first host path that is not None, the manager's after
    them."""
    if isinstance(t.dtype, Ref):
        return "dtype"
    if isinstance(t.dtype, Dtype):
        return f"torch.{t.dtype.value}"
    if isinstance(t.dtype, DtypeFallback):
        return " or ".join([*(body.expr(p) for p in t.dtype.options), "dtype"])
    return body.expr(t.dtype)


def _allocated(body: Body, buf: Buffer) -> dict[str, str]:
    assert buf.shape is not None and buf.dtype is not None  # noqa: S101
    dtype = buf.dtype.value
    return {
        "key": buf.key,
        "shape": ", ".join(body.expr(e) for e in buf.shape)
        + ("," if len(buf.shape) == 1 else ""),
        "dtype": "dtype" if dtype == "dtype" else f"torch.{dtype}",
        "source": builder_value(buf),
    }


def _padded(body: Body, buf: Buffer) -> dict[str, Any]:
    assert buf.slots is not None  # noqa: S101
    return {
        "key": buf.key,
        "slots": body.expr(buf.slots),
        "source": builder_value(buf),
        "register": buf.pad is PadRule.TRAILING_SEQUENCE,
        # Under FlashInfer the builder's two-section layout is kept as built.
        "sections": bool(buf.pad_by_backend),
    }


def _sections_backend(path: EncoderPath) -> str | None:
    """The backend under which some pad buffer of ``path`` keeps the
    builder's FlashInfer sections (the model allows FLASHINFER only)."""
    backends = {
        backend.value
        for buf in path.pad_buffers
        for backend, rule in buf.pad_by_backend
        if rule is PadRule.FLASHINFER_SECTIONS
    }
    return backends.pop() if backends else None


def _path_body(spec: MixinSpec, path: EncoderPath) -> dict[str, Any]:
    body = Body(spec)
    capture = path.capture
    padded = path.pad_buffers
    own = {b.key for b in padded} | {b.key for b in path.buffers if b.allocate}
    entries = []
    stepped_scalars: list[str] = []
    for buf in path.buffers:
        if buf.key in own or isinstance(buf.source, CaptureTensor):
            entries.append({"key": buf.key, "value": buf.key})
        elif buf.capture_value is not None:
            value = body.expr(buf.capture_value)
            if isinstance(buf.source, MetadataBuilder) and buf.source.call is None:
                # The steps computed the dummy batch's own value: at most the
                # capture value (checked statically), and kept as its floor.
                value = f"max({value}, int({buf.key}))"
                stepped_scalars.append(buf.key)
            entries.append(
                {"key": buf.key, "value": f"torch.tensor({value}, dtype=torch.int32)"}
            )
        else:
            entries.append({"key": buf.key, "value": builder_value(buf)})
    budget_tokens = path.named or spec.items.budget_tokens is not None
    sections = _sections_backend(path)
    guard = spec.guards.attention_backend
    read = _padded_capture_reads(path)
    ctx: dict[str, Any] = {
        "stepped_scalars": stepped_scalars,
        "sections": sections,
        "backend_path": (
            body.expr(guard.path) if sections and guard is not None else None
        ),
        "why": comment_lines(capture.why),
        "k_counts": "Budget tokens" if budget_tokens else "Output tokens",
        "floor": capture.rounding is Rounding.FLOOR,
        "units": body.expr(capture.units) if capture.of_units else None,
        "dummies": [
            d
            for d in _dummies(spec, path, body)
            if read.get(d["key"], True) or read.get("rows", True)
        ],
        "unit_dummies": [
            {
                "key": item.key,
                "row": "[" + ", ".join(body.expr(e) for e in exprs) + "]",
                # The dims may differ by unit, or be the same for every unit.
                "index": (
                    "unit_index"
                    if any("unit_index" in fx.names_in(e) for e in exprs)
                    else "_"
                ),
            }
            for item, exprs in capture.unit_dummy
        ],
        "frames_per_item": "frames_per_item" in _capture_names(capture),
        "keep_alive": _keep_alive(body, capture),
        "lets": [
            {"name": let.name, "value": body.expr(let.expr)} for let in capture.lets
        ],
        "asserts": [_assertion(spec, body, a) for a in capture.asserts],
        "rows": (
            None
            if capture.of_units or not read.get("rows", True)
            else times("max_batch_size", body, spec.items.input_size)
        ),
        "k": read.get("k", True),
        "claims": capture_checks(spec, path, body),
        "tensors": [_tensor(body, t, capture.of_units) for t in capture.tensors],
        "padded_sizes": _padded_sizes(spec, path, body),
        "builders": builder_calls(
            spec, path, body, "capture", padded_sizes_names(spec, path)
        ),
        "padded": [_padded(body, b) for b in padded],
        "allocated": [_allocated(body, b) for b in path.buffers if b.allocate],
        "graph_rows": (
            body.expr(capture.graph_rows) if capture.graph_rows is not None else None
        ),
        "graph_rows_why": comment_lines(capture.graph_rows_why),
        "entries": entries,
        "optional": comment_lines(optional_note(path)),
    }
    ctx["constants"] = body.bindings()
    return ctx


def _padded_capture_reads(path: EncoderPath) -> dict[str, bool]:
    """For a capture of padded inputs only (its tensors sized by the capture
    axes, not by a dummy batch of rows): whether ``k``, ``rows`` and each
    dummy grid are read by a formula, so that unread ones are not bound.
    Empty (all bound, as before) for every other capture."""
    capture = path.capture
    if capture.of_units or not capture.tensors:
        return {}
    if not all(getattr(t.flat, "is_padded", False) for t in capture.tensors):
        return {}
    exprs = [e for t in capture.tensors for e in t.shape]
    exprs += [let.expr for let in capture.lets]
    exprs += [e for b in path.buffers for e in (b.shape or ())]
    exprs += [b.slots for b in path.buffers if b.slots is not None]
    exprs += [b.capture_value for b in path.buffers if b.capture_value is not None]
    for b in path.metadata:
        exprs += (
            b.exprs if b.call is None else (b.call, *(v for _, v in b.capture_kwargs))
        )
    if capture.graph_rows is not None:
        exprs.append(capture.graph_rows)
    names = set().union(*(fx.names_in(e) for e in exprs)) if exprs else set()
    for check in capture.asserts:
        names |= check.check.names()
    out = {"k": "k" in names, "rows": "rows" in names}
    for item, _ in capture.dummy:
        # A builder reads a padded input's sizes from its dummy formula.
        out[item.key] = bool(set(item.dims) & names) or (
            item.key in names and not item.is_padded
        )
    return out


def padded_sizes_names(spec: MixinSpec, path: EncoderPath) -> dict[str, str] | None:
    """The builders' name for each padded input they read: its sizes, a list
    of one int per item (the padded input's grid), bound as ``<key>_sizes``
    beside the tensor of the same key."""
    read = _builder_grids(spec, path)
    names = {
        g.key: f"{g.key}_sizes"
        for g in spec.item_inputs
        if g.is_padded and g.key in read
    }
    return names or None


def _padded_sizes(spec: MixinSpec, path: EncoderPath, body: Body) -> list[dict]:
    """At capture, the sizes of the dummy items of each padded input a
    builder reads: one per item its capture tensor holds (dim 0), each the
    dummy's size (a tensors input: the dummy's dims, as a tuple)."""
    names = padded_sizes_names(spec, path) or {}
    out = []
    for item, exprs in path.capture.dummy:
        if item.key in names:
            size = ", ".join(body.expr(e) for e in exprs)
            size = f"({size})" if item.is_tensors else size
            value = f"[{size} for _ in range({item.key}.shape[0])]"
            out.append({"name": names[item.key], "value": value})
    return out


def _units_doc(spec: MixinSpec) -> str:
    """Whether ``all``, ``some`` or ``none`` of the paths capture views."""
    units = [p.capture.of_units for p in spec.paths]
    return "all" if all(units) else "some" if any(units) else "none"


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    ctx = path_dispatch(
        spec,
        "prepare_encoder_cudagraph_capture_inputs",
        [_path_body(spec, p) for p in spec.paths],
    )
    ctx.update(
        defs_local=spec.local_defs_import,
        defs_module=PROTOCOL_MODULES[target]["defs"],
        backends_module=PROTOCOL_MODULES[target]["backends"],
        sections=any(_sections_backend(p) for p in spec.paths),
        image_limit=(
            plain_message(
                f"cudagraph_mm_encoder requires the {spec.display_name} vision "
                "tower, but it was stubbed out because the image limit is 0. "
                "Disable cudagraph_mm_encoder."
            )
            if spec.guards.image_limit_zero is ImageLimitGuard.CAPTURE
            else None
        ),
        axes=capture_context(spec),
        units=_units_doc(spec),
        check_callees=bool(host_callees.callees(spec)),
    )
    return ctx


def _keep_alive(body: Body, capture: Capture) -> dict[str, Any] | None:
    """The host tensors the capture holds on to (``capture.keep_alive``), or
    None: a spec that keeps nothing alive gets no code and no comment."""
    if not capture.keep_alive:
        return None
    paths = [body.expr(p) for p in capture.keep_alive]
    named = " and ".join(paths) if len(paths) < 3 else ", ".join(paths)
    one = len(paths) == 1
    why = (
        f"The graphs read {named} by address, and the host may replace "
        f"{'it' if one else 'them'} after this capture: the graphs would go on "
        f"reading the old {'tensor' if one else 'tensors'}, freed and "
        "handed to other tensors. A reference held on the mixin keeps "
        f"{'it' if one else 'each'} alive, and every replay reads the values "
        "it was captured with."
    )
    return {"paths": paths, "why": comment_lines(why)}
