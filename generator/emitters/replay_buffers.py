"""``prepare_encoder_cudagraph_replay_buffers``: the batch's real values."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.capture_axes import bind_axis_dims
from generator.emitters.capture_inputs import (
    builder_calls,
    builder_value,
    item_loop_keys,
    padded_sizes_names,
)
from generator.emitters.method_body import Body, Loads, optional_note, path_dispatch
from generator.emitters.prose import comment_lines
from generator.naming import PROTOCOL_MODULES
from generator.spec.capture import MetadataBuilder
from generator.spec.enums import PadRule, ReplayRule
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath


def _builder_names(spec: MixinSpec, path: EncoderPath) -> set[str]:
    names: set[str] = set()
    for b in path.metadata:
        if b.per_item:
            names.update(item_loop_keys(spec, b)[1])
        exprs = (
            b.exprs if b.call is None else (b.call, *(v for _, v in b.replay_kwargs))
        )
        for e in exprs:
            names |= fx.names_in(e)
        for _, kwargs in b.replay_by_modality:
            for _, value in kwargs:
                names |= fx.names_in(value)
    return names


def _by_modality(
    spec: MixinSpec, path: EncoderPath, body: Body, name_map: dict[str, str]
) -> list[list[dict[str, str]] | None]:
    """Per builder, its replay call by modality when the modalities differ
    (``[{modality, call}, ...]`` in the spec's order), else None."""
    out = []
    for b in path.metadata:
        if not b.replay_by_modality:
            out.append(None)
            continue
        calls = []
        for modality in spec.modalities:
            call = fx.Call(b.call.callee, b.call.args, b.kwargs("replay", modality))
            calls.append(
                {"modality": repr(modality.value), "call": body.expr(call, name_map)}
            )
        out.append(calls)
    return out


def _notes(path: EncoderPath) -> list[list[str]]:
    """Why some buffers are left out or go unpadded (comments)."""
    notes = []
    buffers = path.buffers
    for buf in buffers:
        if buf.host_scalar and buf.replay is ReplayRule.DROP:
            notes.append(
                f"{buf.key} is left out: its capture value is baked into the kernel "
                "launch, and a value copied into the host tensor would never be read."
            )
    for buf in buffers:
        if buf.host_scalar and buf.replay is ReplayRule.COPY:
            notes.append(
                f"{buf.key} is sent as computed; the graph keeps its capture value, "
                "which bounds every sequence."
            )
        if buf.pad is PadRule.TRAILING_SEQUENCE:
            notes.append(
                f"{buf.key} goes unpadded: its padding logic closes the batch with one "
                "padding sequence up to the captured rows."
            )
        if buf.pad is PadRule.REPEAT_LAST:
            sections = (
                ", in each of FlashInfer's two sections under FlashInfer"
                if buf.pad_by_backend
                else ""
            )
            notes.append(
                f"{buf.key} goes unpadded: its padding logic repeats the last offset "
                f"(zero-length sequences){sections}."
            )
    optional = optional_note(path)
    if optional:
        notes.append(optional)
    return [comment_lines(n) for n in notes]


def _path_body(spec: MixinSpec, path: EncoderPath) -> dict[str, Any]:
    body = Body(spec)
    loads = Loads(spec)
    buffer_keys = {b.key for b in path.buffers}
    used = _builder_names(spec, path)
    # The device and dtype of the first flat buffer, else of the first flat
    # input a builder reads (its buffers are built from it).
    row_inputs = (*spec.flat_inputs, *(g for g in spec.item_inputs if g.is_padded))
    device_flat = next(
        (f for f in row_inputs if f.key in buffer_keys),
        next(
            (f for f in row_inputs if f.key in used),
            row_inputs[0] if row_inputs else None,
        ),
    )
    flat_loads = []
    for flat in spec.flat_inputs:
        if flat.key not in buffer_keys and flat.key not in used:
            continue
        value = loads.flat(flat.key)
        if flat.replay_dtype is not None:
            value = f"{value}.to({body.expr(flat.replay_dtype)})"
        flat_loads.append({"name": flat.key, "value": value})
    # A padded input stacked to the batch's widest item (its pad_value past
    # each item's own size); the replay copy pads it on to the captured width.
    flat_loads += [
        loads.padded(g.key, stacked=True)
        for g in spec.item_inputs
        if g.is_padded and (g.key in buffer_keys or g is device_flat)
    ]
    # Without flat or padded inputs, the first unit of the first list input
    # (a replay has at least one item).
    source = (
        device_flat.key
        if device_flat is not None
        else f"{next(g.key for g in spec.item_inputs if g.is_list)}[0]"
    )
    name_map = {"device": f"{source}.device", "dtype": f"{source}.dtype"}
    sizes = padded_sizes_names(spec, path) or {}
    name_map.update(sizes)
    entries = []
    for buf in path.buffers:
        if buf.host_scalar and buf.replay is ReplayRule.DROP:
            continue
        value = (
            builder_value(buf) if isinstance(buf.source, MetadataBuilder) else buf.key
        )
        entries.append({"key": buf.key, "value": value})
    axis_dims = {d for a in spec.capture_axes for d in a.dims}
    ctx = {
        "axis_dims": (bind_axis_dims(spec, "axis_keys") if used & axis_dims else []),
        "loads": flat_loads,
        "grids": [
            loads.item(g.key)
            for g in spec.item_inputs
            if g.key in used and not g.is_padded
        ]
        + [{**loads.item(key), "name": name} for key, name in sizes.items()],
        "builders": [
            {**call, "branches": branches}
            for call, branches in zip(
                builder_calls(spec, path, body, "replay", name_map),
                _by_modality(spec, path, body, name_map),
                strict=True,
            )
        ],
        "entries": entries,
        "notes": _notes(path),
    }
    ctx["constants"] = body.bindings()
    return ctx


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    ctx = path_dispatch(
        spec,
        "prepare_encoder_cudagraph_replay_buffers",
        [_path_body(spec, p) for p in spec.paths],
    )
    ctx.update(
        defs_local=spec.local_defs_import,
        defs_module=PROTOCOL_MODULES[target]["defs"],
        keys=Loads(spec).by_modality,
    )
    return ctx
