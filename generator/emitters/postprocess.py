"""``postprocess_encoder_output``: span assembly, or the protocol's default
spelt out for a mixin that does not subclass the protocol."""

from __future__ import annotations

from typing import Any

from generator.emitters.method_body import (
    Body,
    Loads,
    dims_of,
    item_loop,
    per_item_list,
    signature,
)
from generator.emitters.prose import comment_lines, plain_message
from generator.spec.mixin import MixinSpec


def writes_default(spec: MixinSpec) -> bool:
    """The protocol's default scatter, written out (base: none)."""
    return spec.span_assembly is None and not spec.protocol_base


def _concat(spec: MixinSpec) -> dict[str, Any]:
    """Each item's rows of every path, concatenated in path order."""
    body = Body(spec)
    loads = Loads(spec)
    rows = []
    keys: list[str] = []
    for path in spec.concatenation:
        assert path.output_tokens is not None  # noqa: S101 (a named path)
        value, used = per_item_list(spec, body, path.output_tokens)
        keys += [k for k in used if k not in keys]
        rows.append({"name": repr(path.name), "value": value})
    ctx = {
        "names": ", ".join(p.name for p in spec.concatenation),
        "grids": [loads.item(k, "batch_mm_kwargs") for k in keys],
        "rows": rows,
        "no_kwargs": plain_message(
            f"{spec.display_name} needs the batch's batch_mm_kwargs to split "
            "each path's output into items"
        ),
    }
    ctx["constants"] = body.bindings()
    return ctx


def _span(spec: MixinSpec) -> dict[str, Any]:
    span = spec.span_assembly
    graph_rows = spec.items.graph_rows
    assert span is not None and graph_rows is not None  # noqa: S101 (the model)
    body = Body(spec)
    loads = Loads(spec)
    rows_target, rows_iter, rows_keys = item_loop(spec, dims_of(spec, graph_rows))
    out_tokens = spec.items.output_tokens
    len_target, len_iter, len_keys = item_loop(spec, dims_of(spec, out_tokens))
    keys = list(dict.fromkeys(rows_keys + len_keys))
    (first, _), *others = span.delimiters
    offsets = [
        (
            f"{i} * (types == {imp.name}).long()"
            if i > 1
            else f"(types == {imp.name}).long()"
        )
        for i, (imp, _) in enumerate(others, start=1)
    ]
    ctx = {
        "grids": [loads.item(k, "batch_mm_kwargs") for k in keys],
        "types_key": span.types.key,
        "content": span.content.name,
        "rows": f"sum({body.expr(graph_rows)} for {rows_target} in {rows_iter})",
        "lengths": f"[{body.expr(out_tokens)} for {len_target} in {len_iter}]",
        "delimiter_names": [imp.name for imp, _ in span.delimiters],
        "delimiter_params": [f"self.{attr.name}" for _, attr in span.delimiters],
        "first_delimiter": first.name,
        "delimiter_offsets": " + ".join(offsets) if offsets else "0",
        "why": comment_lines(span.why),
    }
    ctx["constants"] = body.bindings()
    return ctx


def context(spec: MixinSpec, target: str) -> dict[str, Any] | None:
    if spec.has_paths:
        return {
            "signature": signature(spec, "postprocess_encoder_output"),
            "span": None,
            "concat": _concat(spec),
        }
    if spec.span_assembly is None and not writes_default(spec):
        return None
    return {
        "signature": signature(spec, "postprocess_encoder_output"),
        "span": _span(spec) if spec.span_assembly is not None else None,
        "concat": None,
    }
