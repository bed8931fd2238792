"""Capture axes: the keys in the config, the key a batch replays (selection)
and the key a capture builds (``axis_keys``)."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.method_body import Body, Loads, dims_of, item_loop, signature
from generator.emitters.prose import comment_lines, plain_message
from generator.spec import conditions
from generator.spec.axes import CaptureAxis
from generator.spec.mixin import MixinSpec


def _key_text(body: Body, axis: CaptureAxis, key: tuple[fx.Expr, ...]) -> str:
    parts = [body.expr(p) for p in key]
    return parts[0] if axis.scalar else f"({', '.join(parts)})"


def _keys_value(body: Body, axis: CaptureAxis) -> str:
    """The axis' keys as a tuple; keys that read constants may coincide for
    some values: each is captured once (``dict.fromkeys`` keeps the order)."""
    keys = [_key_text(body, axis, key) for key in axis.keys]
    literal = "(" + ", ".join(keys) + ("," if len(keys) == 1 else "") + ")"
    reads = any(fx.names_in(p) for key in axis.keys for p in key)
    return f"tuple(dict.fromkeys({literal}))" if reads else literal


def _need(spec: MixinSpec, body: Body, axis: CaptureAxis) -> tuple[str, list[str]]:
    """The largest need of the batch's items for each dim of ``axis`` (a
    tuple), and the grid keys it reads."""
    parts = []
    keys: list[str] = []
    eager = spec.items.eager_when
    for cover in axis.covers:
        read = cover if eager is None else fx.BinOp("+", cover, eager.left)
        if eager is not None:
            read = fx.BinOp("+", read, eager.right)
        target, iterable, used = item_loop(spec, dims_of(spec, read))
        keys += [k for k in used if k not in keys]
        # Items (or units) that run eagerly need no key: a batch of such an
        # item (packed alone) is selected, but replays no graph.
        skip = (
            "" if eager is None else f" if not {conditions.to_python(eager, body.expr)}"
        )
        parts.append(
            f"max(({body.expr(cover)} for {target} in {iterable}{skip}), default=0)"
        )
    trailing = "," if len(parts) == 1 else ""
    return f"({', '.join(parts)}{trailing})", keys


def helpers_context(spec: MixinSpec) -> dict[str, Any] | None:
    """``_capture_axes`` (the keys) and ``_capture_axis_keys`` (the keys a
    batch replays)."""
    if not spec.capture_axes:
        return None
    keys_body = Body(spec)
    axes = [
        {"value": _keys_value(keys_body, a), "why": comment_lines(a.why)}
        for a in spec.capture_axes
    ]
    need_body = Body(spec)
    loads = Loads(spec)
    needs = []
    grids: list[str] = []
    for axis in spec.capture_axes:
        value, used = _need(spec, need_body, axis)
        grids += [k for k in used if k not in grids]
        needs.append(value)
    return {
        "axes_signature": signature(spec, "_capture_axes"),
        "axes": axes,
        "axes_constants": keys_body.bindings(),
        "keys_signature": signature(spec, "_capture_axis_keys"),
        "by_modality": loads.by_modality,
        "grids": [loads.item(k) for k in grids],
        "needs": needs,
        "needs_constants": need_body.bindings(),
        "beyond": any(a.eager_beyond for a in spec.capture_axes),
        "picks": [
            "_key_or_need" if a.eager_beyond else "_covering_key"
            for a in spec.capture_axes
        ],
    }


def beyond_condition(spec: MixinSpec, render) -> str | None:
    """Python source, inside the item specs' loop: the item's need on some
    ``beyond_keys: eager`` axis is covered by no key (``capture_keys`` holds
    the axes' keys)."""
    parts = []
    for i, axis in enumerate(spec.capture_axes):
        if not axis.eager_beyond:
            continue
        need = ", ".join(render(c) for c in axis.covers)
        trailing = "," if len(axis.covers) == 1 else ""
        parts.append(f"_beyond_keys(capture_keys[{i}], ({need}{trailing}))")
    return " or ".join(parts) or None


def bind_axis_dims(spec: MixinSpec, source: str) -> list[dict[str, str]]:
    """``<dims> = <source>[i]`` for each axis: the dims of its key."""
    return [
        {"name": ", ".join(a.dims), "value": f"{source}[{i}]"}
        for i, a in enumerate(spec.capture_axes)
    ]


def capture_context(spec: MixinSpec) -> dict[str, Any] | None:
    """The capture's ``axis_keys``: required with axes, unpacked into the
    axes' dims."""
    if not spec.capture_axes:
        return None
    return {
        "missing": plain_message(
            f"{spec.display_name} captures one graph per budget and capture-axis "
            "key: axis_keys must hold one key per axis"
        ),
        "dims": bind_axis_dims(spec, "axis_keys"),
    }
