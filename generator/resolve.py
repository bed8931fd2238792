"""Spec file -> validated, frozen :class:`~generator.spec.MixinSpec`.

1. YAML with positions (:mod:`generator.yaml_loader`): malformed YAML,
   duplicate keys, tags and anchors.
2. The typed model (:mod:`generator.spec`): each section's keys, types and
   enumerations, names against the scope of each field, cross references
   (resolved to objects) and name collisions, all in one pass.
3. Arithmetic the spec implies, with the constants' defaults
   (:mod:`generator.static_checks`): the dummy batch covers its budget,
   ``cu_seqlens`` keeps a spare slot, ...

:func:`load_spec` raises :class:`~generator.diagnostics.SpecError` with every
problem found; it never raises anything else for a user's mistake.
"""

from __future__ import annotations

from pathlib import Path

from generator.diagnostics import Diagnostics, Location, SpecError
from generator.spec.mixin import MixinSpec
from generator.spec.reader import ReadContext, Reader
from generator.static_checks import (
    Arithmetic,
    PathRows,
    axis_problems,
    budget_range_problems,
    capture_problems,
    path_problems,
    slot_problems,
)
from generator.yaml_loader import Node, load_spec_tree, read_spec_file


def load_spec(path: str | Path, display_path: str | None = None) -> MixinSpec:
    """Read, validate and resolve one spec file."""
    shown = display_path or str(path)
    _, text = read_spec_file(path, shown)
    return resolve_text(text, shown)


def resolve_text(text: str, shown: str) -> MixinSpec:
    diags = Diagnostics()
    tree = load_spec_tree(text, shown, diags)
    if tree is None or diags:
        raise SpecError(diags.sorted())
    try:
        spec = _read(tree, shown, diags)
    except (RecursionError, MemoryError):
        # The loader refuses deep nesting; this is the last line of defence.
        diags.error(Location(shown, 1, 1), "", "spec is nested too deeply")
        raise SpecError(diags.sorted()) from None
    if spec is None or diags:
        raise SpecError(diags.sorted())
    return spec


def _read(tree: Node, shown: str, diags: Diagnostics) -> MixinSpec | None:
    if tree.kind != "mapping":
        diags.error(tree.location, "", f"expected a mapping, got {tree.kind}")
        return None
    ctx = ReadContext(shown, diags)
    reader = Reader(tree, "", MixinSpec.KEYS, ctx)
    spec = MixinSpec.from_yaml(reader, shown)
    reader.done()
    for field, message in _arithmetic_problems(ctx):
        diags.error(_node_at(tree, field).location, field, message)
    return spec


def _arithmetic_problems(ctx: ReadContext):
    """The static checks on whatever resolved, path by path (a path's fields
    under ``paths.<name>.``)."""
    parts = ctx.partial
    constants = parts.get("constants", ())
    items = parts.get("items")
    named = []
    for name, path in parts.get("paths", {}).items():
        tokens = path.get("output_tokens")
        prefix = f"paths.{name}." if "output_tokens" in path else ""
        if tokens is not None:
            named.append(
                PathRows(
                    name,
                    tokens,
                    path.get("min_token_budget"),
                    path.get("allow_zero_tokens", False),
                )
            )
        for field, message in _path_arithmetic(ctx, path, items, tokens):
            yield prefix + field, message
    axes = parts.get("capture_axes", ())
    yield from axis_problems(axes, constants)
    yield from budget_range_problems(parts.get("budget"), constants)
    if items is not None and named and len(named) == len(parts["paths"]):
        yield from path_problems(
            tuple(named),
            items,
            constants,
            parts.get("item_inputs", ()),
            custom_rows=parts.get("post_steps_with_paths", False),
        )


def _path_arithmetic(ctx: ReadContext, path: dict, items, tokens):
    """One path's capture checks; a path of ``paths:`` counts its budgets
    and graph rows in its own rows per item."""
    parts = ctx.partial
    constants = parts.get("constants", ())
    buffers = path.get("buffers", ())
    video = parts.get("video", False)
    if "output_tokens" in path and tokens is None:
        items = None  # its rows per item did not resolve
    if items is None or path.get("capture") is None:
        yield from slot_problems(constants, buffers, video=video)
        return
    budget = parts.get("budget")
    yield from capture_problems(
        Arithmetic(
            constants,
            parts.get("item_inputs", ()),
            path["capture"],
            items.on_path(tokens),
            buffers,
            parts.get("sizes", ()),
            parts.get("items_resolved", True),
            video=video,
            axes=parts.get("capture_axes", ()),
            budget_min=budget.min if budget is not None else None,
            budget_max=budget.max if budget is not None else None,
            path_min=path.get("min_token_budget"),
        )
    )


def _node_at(tree: Node, field: str) -> Node:
    """The node at a dotted field path (``buffers.cu_seqlens.slots``,
    ``capture.assert[0].check``), or the deepest one found on the way."""
    cur = tree
    for part in field.split(".") if field else ():
        key, _, index = part.partition("[")
        if cur.kind != "mapping" or key not in cur.value:
            break
        cur = cur.value[key]
        if index:
            i = int(index.rstrip("]")) if index.rstrip("]").isdigit() else -1
            if cur.kind != "sequence" or not 0 <= i < len(cur.value):
                break
            cur = cur.value[i]
    return cur
