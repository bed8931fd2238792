"""``postprocess_encoder_output``: span assembly, or the protocol's default
spelt out for a mixin that does not subclass the protocol."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.graph_forward import steps
from generator.emitters.method_body import (
    Body,
    ItemCuts,
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
    return spec.postprocess is None and not spec.protocol_base


def scatters(spec: MixinSpec) -> bool:
    """Whether the method calls ``scatter_output_slices``."""
    if spec.has_paths:
        return False
    return writes_default(spec) or bool(
        spec.post_steps and not spec.postprocess.per_item
    )


def _steps(spec: MixinSpec) -> dict[str, Any]:
    """Custom post-processing: the spec's steps over ``path_output``, once for the
    batch (split by ``per_item_out_tokens``) or once per item."""
    post = spec.postprocess
    assert post is not None and post.steps  # noqa: S101 (the model)
    body = Body(spec)
    loads = Loads(spec)
    rows = spec.items.graph_rows or spec.items.output_tokens
    used = set().union(*(fx.names_in(s.expr) for s in post.steps))
    ctx: dict[str, Any] = {
        "per_item": post.per_item,
        "why": comment_lines(post.why),
        "no_kwargs": plain_message(
            f"{spec.display_name} post-processing needs batch_mm_kwargs"
        ),
    }
    if post.per_item:
        cuts = ItemCuts(spec, body, used, "batch_mm_kwargs")
        dims = {d for g in spec.item_inputs for d in g.dims} & used
        dims |= dims_of(spec, rows) | cuts.dims
        target, iterable, keys = item_loop(spec, dims)
        ctx.update(target=target, iterable=iterable, item_rows=body.expr(rows))
        ctx.update(cuts.context())
    else:
        keys = [g.key for g in spec.item_inputs if g.key in used]
        ctx["graph_rows"] = None
        if "graph_rows" in used:
            target, iterable, row_keys = item_loop(spec, dims_of(spec, rows))
            ctx["graph_rows"] = f"sum({body.expr(rows)} for {target} in {iterable})"
            keys += [k for k in row_keys if k not in keys]
    ctx["grids"] = [loads.item(k, "batch_mm_kwargs") for k in keys]
    ctx["steps"] = steps(body, post.steps, ctx.get("name_map", {}))
    ctx["constants"] = body.bindings()
    return ctx


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


def _path_steps(spec: MixinSpec) -> dict[str, Any]:
    """Per-item steps over each path's rows of the item (``<path>_rows``)."""
    post = spec.postprocess
    assert post is not None and post.steps and post.per_item  # noqa: S101
    body = Body(spec)
    loads = Loads(spec)
    used = set().union(*(fx.names_in(s.expr) for s in post.steps))
    cuts = ItemCuts(spec, body, used, "batch_mm_kwargs")
    dims = {d for g in spec.item_inputs for d in g.dims} & used
    target, iterable, keys = item_loop(spec, dims | cuts.dims)
    rows = []
    for path in spec.paths:
        assert path.output_tokens is not None  # noqa: S101 (a named path)
        value, read = per_item_list(spec, body, path.output_tokens)
        keys += [k for k in read if k not in keys]
        rows.append({"name": repr(path.name), "value": value})
    names = dict(post.path_rows)
    required = next(p for p in spec.paths if not p.allow_zero_tokens)
    ctx = {
        "names": ", ".join(f"``{names[p.name]}``" for p in spec.paths),
        "why": comment_lines(post.why),
        "no_kwargs": plain_message(
            f"{spec.display_name} post-processing needs batch_mm_kwargs"
        ),
        "rows": rows,
        "required": repr(required.name),
        "bind": [{"name": names[p.name], "path": repr(p.name)} for p in spec.paths],
        "target": target,
        "iterable": iterable,
        **cuts.context(),
    }
    ctx["grids"] = [loads.item(k, "batch_mm_kwargs") for k in keys]
    ctx["steps"] = steps(body, post.steps, cuts.name_map)
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
        custom = bool(spec.post_steps)
        return {
            "signature": signature(spec, "postprocess_encoder_output"),
            "span": None,
            "concat": None if custom else _concat(spec),
            "steps": None,
            "path_steps": _path_steps(spec) if custom else None,
        }
    if spec.post_steps:
        return {
            "signature": signature(spec, "postprocess_encoder_output"),
            "span": None,
            "concat": None,
            "steps": _steps(spec),
            "path_steps": None,
        }
    if spec.span_assembly is None and not writes_default(spec):
        return None
    return {
        "signature": signature(spec, "postprocess_encoder_output"),
        "span": _span(spec) if spec.span_assembly is not None else None,
        "concat": None,
        "steps": None,
        "path_steps": None,
    }
