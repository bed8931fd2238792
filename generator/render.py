"""IR -> template context -> Python source (black-formatted, parsed back).

All decisions are made here, in Python: which names each method binds,
how expressions print, which imports are needed, how prose is wrapped into
comments and string literals. The templates only loop and print.
"""

from __future__ import annotations

import ast
import hashlib
import re
import shlex
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from generator import __version__
from generator import formulas as fx
from generator.diagnostics import Diagnostics, Location, SpecError, printable
from generator.formulas import Call, Expr, Ref
from generator.ir import MixinIR, Step
from generator.limits import MAX_GENERATED_BYTES
from generator.naming import FIRST_PARTY_ROOTS, PROTOCOL_MODULES, builder_result_name

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
MAIN_TEMPLATE = "mixin.py.j2"
COMMENT_WIDTH = 72
STRING_WIDTH = 64


class RenderError(RuntimeError):
    """The templates or the formatter failed: a bug in gen-mixin, not the spec."""


# -- prose ----------------------------------------------------------------------


def comment_lines(text: str | None, width: int = COMMENT_WIDTH) -> list[str]:
    """Free text wrapped into comment lines (without the ``# `` prefix)."""
    if not text:
        return []
    out: list[str] = []
    for paragraph in text.split("\n\n"):
        words = " ".join(paragraph.split())
        if out:
            out.append("")
        out.extend(
            textwrap.wrap(words, width, break_long_words=False, break_on_hyphens=False)
        )
    return out


def docstring_lines(text: str, width: int = COMMENT_WIDTH) -> list[str]:
    """Paragraphs re-wrapped; lines starting with '-' or indented kept as lists."""
    out: list[str] = []
    for paragraph in text.strip().split("\n\n"):
        if out:
            out.append("")
        lines = paragraph.split("\n")
        if any(line.lstrip().startswith(("-", "*")) for line in lines):
            out.extend(line.rstrip() for line in lines)
        else:
            out.extend(
                textwrap.wrap(
                    " ".join(paragraph.split()), width, break_long_words=False
                )
            )
    return out


def message_literal(
    parts: list[tuple[str, bool]], width: int = STRING_WIDTH
) -> list[str]:
    """A message as implicitly concatenated string literals.

    ``parts`` are ``(text, is_placeholder)``: literal text comes from the spec
    and is escaped by ``repr`` (and brace-doubled inside f-strings);
    placeholders are trusted expressions written by the generator.
    """
    tokens: list[tuple[str, bool]] = []
    for text, placeholder in parts:
        if placeholder:
            tokens.append((text, True))
        else:
            for word in text.split(" "):
                tokens.append((word, False))
    chunks: list[list[tuple[str, bool]]] = [[]]
    length = 0
    for token in tokens:
        size = len(token[0]) + 1
        if chunks[-1] and length + size > width:
            chunks.append([])
            length = 0
        chunks[-1].append(token)
        length += size
    literals = []
    for i, chunk in enumerate(chunks):
        has_placeholder = any(p for _, p in chunk)
        pieces = []
        for text, placeholder in chunk:
            if placeholder:
                pieces.append("{" + text + "}")
            else:
                pieces.append(
                    text.replace("{", "{{").replace("}", "}}")
                    if has_placeholder
                    else text
                )
        body = " ".join(pieces)
        if i < len(chunks) - 1:
            body += " "
        literal = repr(body)
        literals.append(f"f{literal}" if has_placeholder else literal)
    return literals


# -- expressions ----------------------------------------------------------------


@dataclass
class MethodScope:
    """Tracks the constants an emitted method needs to bind first."""

    ir: MixinIR
    used_constants: set[str]

    def expr(self, expr: Expr, name_map: dict[str, str] | None = None) -> str:
        for name in fx.names_in(expr):
            if self.ir.constant(name) is not None:
                self.used_constants.add(name)
        return fx.to_python(expr, name_map)

    def bindings(self) -> list[dict[str, str]]:
        return [
            {"name": c.name, "value": fx.to_python(c.path)}
            for c in self.ir.constants
            if c.name in self.used_constants
        ]


def _scope(ir: MixinIR) -> MethodScope:
    return MethodScope(ir, set())


def _grid_loop(ir: MixinIR, dims_needed: set[str]) -> tuple[str, str, list[str]]:
    """``for <target> in <iterable>`` over the grids whose dims are needed."""
    grids = [g for g in ir.grid_inputs if dims_needed & set(g.dims)] or [
        ir.grid_inputs[0]
    ]
    if len(grids) == 1:
        return ", ".join(grids[0].dims), grids[0].key, [grids[0].key]
    target = ", ".join(f"({', '.join(g.dims)})" for g in grids)
    iterable = f"zip({', '.join(g.key for g in grids)}, strict=True)"
    return target, iterable, [g.key for g in grids]


def _dims_of(expr: Expr, ir: MixinIR) -> set[str]:
    dims = {d for g in ir.grid_inputs for d in g.dims}
    return fx.names_in(expr) & dims


def _comprehension(
    ir: MixinIR, scope: MethodScope, expr: Expr
) -> tuple[str, list[str]]:
    target, iterable, grids = _grid_loop(ir, _dims_of(expr, ir))
    return f"[{scope.expr(expr)} for {target} in {iterable}]", grids


# -- context --------------------------------------------------------------------


def _used_import_names(ir: MixinIR) -> set[str]:
    """Imported names the generated code mentions."""
    exprs: list[Expr] = [m.call for m in ir.metadata]
    exprs += [v for m in ir.metadata for _, v in m.capture_kwargs + m.replay_kwargs]
    exprs += [s.expr for s in ir.graph_forward + ir.eager_steps]
    used = set().union(*(fx.names_in(e) for e in exprs)) if exprs else set()
    for attr in ir.host:
        used.update(
            attr.annotation.replace("|", " ")
            .replace("[", " ")
            .replace("]", " ")
            .replace(",", " ")
            .split()
        )
    if ir.span_assembly is not None:
        used.add(ir.span_assembly.content)
        # The first delimiter is the index's fallback (offset 0): not named.
        used.update(const for const, _ in ir.span_assembly.delimiters[1:])
    return used


def _import_sort_key(name: str) -> tuple[int, list[int | str]]:
    """isort's order-by-type (CONSTANTS, Classes, functions), each in natural
    order (``V4`` before ``V41``), case-insensitive, as ruff sorts them."""
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    parts = re.split(r"(\d+)", name.lower())
    return (kind, [int(p) if p.isdigit() else p for p in parts])


def _import_lines(groups: dict[str, set[str]]) -> list[str]:
    lines = []
    for module in sorted(groups):
        # isort's order-by-type: CONSTANTS, then Classes, then functions.
        names = sorted(groups[module], key=_import_sort_key)
        lines.append(f"from {module} import {', '.join(names)}")
    return lines


def build_context(ir: MixinIR, target: str, header: list[str]) -> dict[str, Any]:
    mods = PROTOCOL_MODULES[target]
    defs_names = [
        "EncoderCudaGraphCaptureInputs",
        "EncoderCudaGraphConfig",
        "EncoderCudaGraphReplayBuffers",
        "EncoderItemSpec",
    ]

    def q(name: str) -> str:
        return f'"{name}"' if ir.local_defs_import else name

    stdlib: dict[str, set[str]] = {
        "collections.abc": {"Hashable"},
        "typing": {"TYPE_CHECKING", "Any"},
    }
    plain_stdlib: set[str] = set()
    first_party: dict[str, set[str]] = {}
    type_checking: dict[str, set[str]] = {mods["VllmConfig"]: {"VllmConfig"}}

    if ir.protocol_base:
        first_party.setdefault(mods["interfaces"], set()).add(
            "SupportsEncoderCudaGraph"
        )
    if ir.local_defs_import:
        type_checking.setdefault(mods["defs"], set()).update(defs_names)
    else:
        first_party.setdefault(mods["defs"], set()).update(defs_names)
    for attr in ir.host:
        if "MultiModalConfig" in attr.annotation:
            type_checking.setdefault(mods["MultiModalConfig"], set()).add(
                "MultiModalConfig"
            )
    module_of = {
        i.name: (i.vllm_module if target == "vllm" else i.standalone_module)
        for i in ir.imports
    }
    used = _used_import_names(ir)
    for imp in ir.imports:
        if imp.name not in used:
            continue  # declared for the spec's sake, never printed: no unused import
        if imp.type_only:
            type_checking.setdefault(module_of[imp.name], set()).add(imp.name)
        else:
            first_party.setdefault(module_of[imp.name], set()).add(imp.name)

    trailing = next((b for b in ir.buffers if b.pad == "trailing_sequence"), None)
    repeat_last = [b for b in ir.buffers if b.pad == "repeat_last"]
    rows_dims = sorted({b.rows_dim for b in ir.buffers if b.rows_dim})
    if trailing is not None:
        plain_stdlib.add("weakref")
    plain_stdlib.add("itertools")  # _select_rows
    if ir.span_assembly is not None:
        first_party.setdefault(mods["async_tensor_h2d"], set()).add("async_tensor_h2d")
    default_post = ir.span_assembly is None and not ir.protocol_base
    if default_post:
        first_party.setdefault(mods["scatter_output_slices"], set()).add(
            "scatter_output_slices"
        )

    # Names shared by several methods. With video keys, each method first
    # looks up the batch's keys (`keys = self._modality_keys(mm_kwargs)`).
    alt = ir.has_video_keys

    def key_expr(key: str) -> str:
        return f'keys["{key}"]' if alt else f'"{key}"'

    flat_loads = {}
    for flat in ir.flat_inputs:
        read = f"mm_kwargs[{key_expr(flat.key)}]"
        flat_loads[flat.key] = f"_concat_rows({read})" if flat.accepts_list else read

    def grid_load(key: str, source: str = "mm_kwargs") -> dict[str, str]:
        return {"name": key, "value": f"self._grid_rows({source}, {key_expr(key)})"}

    ctx: dict[str, Any] = {
        "header": header,
        "module_docstring": (
            docstring_lines(ir.module_docstring) if ir.module_docstring else None
        ),
        "class_name": ir.class_name,
        "bases": "SupportsEncoderCudaGraph" if ir.protocol_base else "",
        "docstring": docstring_lines(ir.docstring),
        "host": [
            {
                "name": a.name,
                "annotation": f'"{a.annotation}"' if a.quoted else a.annotation,
            }
            for a in ir.host
        ],
        "display_name": ir.display_name,
        "defs_local": ir.local_defs_import,
        "defs_module": mods["defs"],
        "backends_module": mods["backends"],
        "q": q,
        "concat_rows": any(f.accepts_list for f in ir.flat_inputs),
        "modality_keys": _modality_keys_context(ir) if alt else None,
        "trailing": None,
        "repeat_last": bool(repeat_last),
        "rows_dims": rows_dims,
        "default_post": default_post,
    }

    # -- get_encoder_cudagraph_config ------------------------------------------------
    sc = _scope(ir)
    config: dict[str, Any] = {}
    if ir.image_limit_zero == "config":
        config["image_limit"] = message_literal(
            [
                (
                    f"cudagraph_mm_encoder requires the {ir.display_name} vision tower, "
                    "but the image limit is 0. Disable cudagraph_mm_encoder.",
                    False,
                )
            ]
        )
    if ir.fp8_static_scales:
        config["fp8"] = message_literal(
            [
                (
                    "cudagraph_mm_encoder requires static FP8 scales for the "
                    f"{ir.display_name} vision encoder (dynamic scaling keeps its amax "
                    "history on the host, which a graph cannot capture). Set "
                    "--mm-encoder-fp8-scale-path or disable cudagraph_mm_encoder.",
                    False,
                )
            ]
        )
    guard = ir.backend_guard
    if guard is not None:
        members = guard.allow or guard.deny
        hint = (guard.hint or "Choose a capturable backend").rstrip(". ")
        config["backend"] = {
            "path": sc.expr(guard.path),
            "op": "not in" if guard.allow else "in",
            "members": [f"AttentionBackendEnum.{m}" for m in members],
            "why": comment_lines(guard.why)
            or comment_lines(
                "FlashInfer reads max_seqlen on the host and TORCH_SDPA calls .tolist() "
                "on the CUDA cu_seqlens: neither can be captured."
            ),
            "message": message_literal(
                [
                    ("cudagraph_mm_encoder is not supported with the", False),
                    ("backend.name", True),
                    (
                        f"ViT attention backend for {ir.display_name}. {hint}, "
                        "or disable cudagraph_mm_encoder.",
                        False,
                    ),
                ]
            ),
        }
    padding = []
    for buf in ir.buffers:
        if buf.pad == "trailing_sequence":
            padding.append({"key": buf.key, "fn": "self._pad_with_trailing_sequence"})
        elif buf.pad == "repeat_last":
            padding.append({"key": buf.key, "fn": "_pad_with_empty_sequences"})
        elif buf.rows_dim:
            padding.append({"key": buf.key, "fn": f"_copy_rows_on_dim{buf.rows_dim}"})
    config.update(
        modalities=[repr(m) for m in ir.modalities],
        buffer_keys=[repr(b.key) for b in ir.buffers],
        out_hidden_size=sc.expr(ir.out_hidden_size),
        max_frames_per_video=(
            sc.expr(ir.max_frames_per_video) if ir.max_frames_per_video else None
        ),
        padding=padding,
    )
    config["constants"] = sc.bindings()
    ctx["config"] = config

    # -- budget range ----------------------------------------------------------------------
    sc = _scope(ir)
    ctx["budget"] = {
        "min": sc.expr(ir.budget_min),
        "why": comment_lines(ir.budget_why),
    }
    ctx["budget"]["constants"] = sc.bindings()

    # -- item specs ----------------------------------------------------------------------------
    sc = _scope(ir)
    both = fx.BinOp("+", ir.input_size, ir.output_tokens)  # only to collect dims
    if ir.budget_tokens is not None:
        both = fx.BinOp("+", both, ir.budget_tokens)
    target_, iterable, grids = _grid_loop(ir, _dims_of(both, ir))
    ctx["items"] = {
        "keys": alt,
        "grids": [grid_load(g) for g in grids],
        "input_size": sc.expr(ir.input_size),
        "output_tokens": sc.expr(ir.output_tokens),
        "budget_tokens": (
            sc.expr(ir.budget_tokens) if ir.budget_tokens is not None else None
        ),
        "target": target_,
        "iterable": iterable,
    }
    ctx["items"]["constants"] = sc.bindings()

    # -- selection ---------------------------------------------------------------------------
    sc = _scope(ir)
    selected = []
    needed_grids: list[str] = []
    for key in ir.input_order:
        flat = ir.flat(key)
        if flat is not None:
            sizes, grids = _comprehension(ir, sc, flat.rows)
            needed_grids += [g for g in grids if g not in needed_grids]
            selected.append(
                {
                    "key": key_expr(key),
                    "value": f"_select_rows({flat_loads[key]}, {sizes}, indices)",
                }
            )
        else:
            grid = ir.grid(key)
            assert grid is not None  # noqa: S101
            if key not in needed_grids:
                needed_grids.append(key)
            selected.append(
                {
                    "key": key_expr(key),
                    "value": f"_select_grid({key}, indices, {len(grid.dims)})",
                }
            )
    ctx["select"] = {
        "keys": alt,
        "grids": [grid_load(g.key) for g in ir.grid_inputs if g.key in needed_grids],
        "entries": selected,
    }
    ctx["select"]["constants"] = sc.bindings()

    # -- capture ---------------------------------------------------------------------------------
    ctx["capture"] = _capture_context(ir)
    if trailing is not None:
        ctx["trailing"] = {"key": trailing.key}

    # -- replay ------------------------------------------------------------------------------------
    ctx["replay"] = _replay_context(ir, flat_loads, grid_load)
    ctx["replay"]["keys"] = alt

    # -- forwards --------------------------------------------------------------------------------
    ctx["graph_forward"] = _graph_forward_context(ir)
    ctx["eager"] = _eager_context(ir, flat_loads, grid_load)
    ctx["eager"]["keys"] = alt
    ctx["span"] = _span_context(ir, grid_load) if ir.span_assembly else None

    stdlib_lines = [f"import {m}" for m in sorted(plain_stdlib)] + _import_lines(stdlib)
    ctx["imports"] = {
        "stdlib": stdlib_lines,
        "first_party": _import_lines(first_party),
        "type_checking": _import_lines(type_checking),
    }
    roots = FIRST_PARTY_ROOTS[target]
    for line in ctx["imports"]["first_party"] + ctx["imports"]["type_checking"]:
        module = line.split()[1]
        if not module.startswith(roots) and not module.startswith("vllm"):
            raise RenderError(
                f"unexpected import module {module!r} for target {target}"
            )
    return ctx


def _modality_keys_context(ir: MixinIR) -> dict[str, Any]:
    keys = [(f.key, f.video_key) for f in ir.flat_inputs] + [
        (g.key, g.video_key) for g in ir.grid_inputs
    ]
    order = {k: i for i, k in enumerate(ir.input_order)}
    keys.sort(key=lambda kv: order[kv[0]])
    return {
        "image": [(repr(k), repr(k)) for k, _ in keys],
        "video": [(repr(k), repr(v)) for k, v in keys],
        "probe": repr(ir.grid_inputs[0].key),
    }


def _capture_context(ir: MixinIR) -> dict[str, Any]:
    sc = _scope(ir)
    trailing = next(
        (b for b in ir.buffers if b.pad is not None and b.slots is not None), None
    )
    builder_grids = {
        name
        for m in ir.metadata
        for name in fx.names_in(m.call)
        | set().union(*(fx.names_in(v) for _, v in m.capture_kwargs))
        if ir.grid(name) is not None
    }
    rows_dims = _dims_of(ir.input_size, ir)
    dummies = []
    for key, exprs in ir.dummy_dims:
        grid = ir.grid(key)
        assert grid is not None  # noqa: S101
        if key not in builder_grids and not (set(grid.dims) & rows_dims):
            continue
        dummies.append(
            {
                "key": key,
                "targets": ", ".join(grid.dims),
                "dim_values": ", ".join(sc.expr(e) for e in exprs),
                "list": key in builder_grids,
            }
        )
    tensors = []
    for t in ir.capture_tensors:
        dtype = "dtype" if isinstance(t.dtype, Ref) else sc.expr(t.dtype)
        tensors.append(
            {
                "key": t.key,
                "fill": t.fill,
                "shape": ", ".join(sc.expr(s) for s in t.shape),
                "dtype": dtype,
                "why": comment_lines(t.why),
            }
        )
    builders, results = _builders(ir, sc, "capture")
    allocated = []
    for buf in ir.buffers:
        if not buf.allocate:
            continue
        assert buf.shape is not None and buf.dtype is not None  # noqa: S101
        allocated.append(
            {
                "key": buf.key,
                "shape": ", ".join(sc.expr(e) for e in buf.shape)
                + ("," if len(buf.shape) == 1 else ""),
                "dtype": "dtype" if buf.dtype == "dtype" else f"torch.{buf.dtype}",
                "source": f'{results[buf.key]}["{buf.key}"]',
            }
        )
    values = []
    for buf in ir.buffers:
        if (trailing is not None and buf.key == trailing.key) or buf.allocate:
            values.append({"key": buf.key, "value": buf.key})
        elif any(t.key == buf.key for t in ir.capture_tensors):
            values.append({"key": buf.key, "value": buf.key})
        else:
            values.append({"key": buf.key, "value": f'{results[buf.key]}["{buf.key}"]'})
    ctx = {
        "image_limit": ir.image_limit_zero == "capture",
        "image_limit_message": message_literal(
            [
                (
                    f"cudagraph_mm_encoder requires the {ir.display_name} vision tower, "
                    "but it was stubbed out because the image limit is 0. Disable "
                    "cudagraph_mm_encoder.",
                    False,
                )
            ]
        ),
        "dummies": dummies,
        "frames_per_item": any(
            "frames_per_item" in fx.names_in(e)
            for _, exprs in ir.dummy_dims
            for e in exprs
        ),
        "input_size": sc.expr(ir.input_size),
        "tensors": tensors,
        "builders": builders,
        "entries": values,
        "why": comment_lines(ir.capture_why),
        "trailing": None,
        "allocated": allocated,
        "graph_rows": (
            sc.expr(ir.capture_graph_rows)
            if ir.capture_graph_rows is not None
            else None
        ),
    }
    if trailing is not None:
        assert trailing.slots is not None  # noqa: S101
        ctx["trailing"] = {
            "key": trailing.key,
            "slots": sc.expr(trailing.slots),
            "source": f'{results[trailing.key]}["{trailing.key}"]',
            "register": trailing.pad == "trailing_sequence",
        }
    ctx["constants"] = sc.bindings()
    return ctx


def _builders(
    ir: MixinIR, sc: MethodScope, phase: str, name_map: dict[str, str] | None = None
):
    builders = []
    results: dict[str, str] = {}
    taken = (
        {c.name for c in ir.constants}
        | {b.key for b in ir.buffers}
        | {f.key for f in ir.flat_inputs}
        | {g.key for g in ir.grid_inputs}
    )
    single = len(ir.metadata) == 1
    for m in ir.metadata:
        callee = m.call.callee
        last = callee.name if isinstance(callee, Ref) else str(callee.parts[-1])
        name = "metadata" if single else builder_result_name(last, taken)
        taken.add(name)
        extra = m.capture_kwargs if phase == "capture" else m.replay_kwargs
        call = Call(m.call.callee, m.call.args, m.call.kwargs + extra)
        builders.append(
            {"name": name, "call": sc.expr(call, name_map), "why": comment_lines(m.why)}
        )
        for key in m.provides:
            results[key] = name
    return builders, results


def _replay_context(
    ir: MixinIR, flat_loads: dict[str, str], grid_load
) -> dict[str, Any]:
    sc = _scope(ir)
    buffer_keys = {b.key for b in ir.buffers}
    device_flat = next(f for f in ir.flat_inputs if f.key in buffer_keys)
    used_names = (
        set().union(
            *(
                fx.names_in(m.call)
                | set().union(*(fx.names_in(v) for _, v in m.replay_kwargs))
                for m in ir.metadata
            )
        )
        if ir.metadata
        else set()
    )
    loads = []
    for flat in ir.flat_inputs:
        if flat.key not in buffer_keys and flat.key not in used_names:
            continue
        value = flat_loads[flat.key]
        if flat.replay_dtype is not None:
            value = f"{value}.to({sc.expr(flat.replay_dtype)})"
        loads.append({"name": flat.key, "value": value})
    grids = [grid_load(g.key) for g in ir.grid_inputs if g.key in used_names]
    name_map = {
        "device": f"{device_flat.key}.device",
        "dtype": f"{device_flat.key}.dtype",
    }
    builders, results = _builders(ir, sc, "replay", name_map)
    values = []
    notes = []
    for buf in ir.buffers:
        if buf.host_scalar and buf.replay == "drop":
            notes.append(
                f"{buf.key} is left out: its capture value is baked into the kernel "
                "launch, and a value copied into the host tensor would never be read."
            )
            continue
        if buf.key in results:
            values.append({"key": buf.key, "value": f'{results[buf.key]}["{buf.key}"]'})
        else:
            values.append({"key": buf.key, "value": buf.key})
    for buf in ir.buffers:
        if buf.host_scalar and buf.replay == "copy":
            notes.append(
                f"{buf.key} is sent as computed; the graph keeps its capture value, "
                "which bounds every sequence."
            )
        if buf.pad == "trailing_sequence":
            notes.append(
                f"{buf.key} goes unpadded: its padding logic closes the batch with one "
                "padding sequence up to the captured rows."
            )
        if buf.pad == "repeat_last":
            notes.append(
                f"{buf.key} goes unpadded: its padding logic repeats the last offset "
                "(zero-length sequences)."
            )
    ctx = {
        "loads": loads,
        "grids": grids,
        "builders": builders,
        "entries": values,
        "notes": [comment_lines(n) for n in notes],
    }
    ctx["constants"] = sc.bindings()
    return ctx


def _graph_forward_context(ir: MixinIR) -> dict[str, Any]:
    sc = _scope(ir)
    uses_rest = any(Ref("rest") in fx.walk(s.expr) for s in ir.graph_forward)
    buffer_keys = [b.key for b in ir.buffers]
    popped: list[str] = []
    name_map: dict[str, str] = {}
    if uses_rest:
        named = set().union(*(fx.names_in(s.expr) for s in ir.graph_forward))
        popped = [k for k in buffer_keys if k in named]
        name_map["rest"] = "inputs"
    else:
        for key in buffer_keys:
            name_map[key] = f'inputs["{key}"]'
    steps = _steps(ir.graph_forward, sc, name_map)
    return {
        "popped": popped,
        "uses_rest": uses_rest,
        "steps": steps,
        "constants": sc.bindings(),
    }


def _steps(
    steps: tuple[Step, ...], sc: MethodScope, name_map: dict[str, str]
) -> list[dict[str, str]]:
    out = []
    for step in steps:
        out.append({"target": step.target, "expr": sc.expr(step.expr, name_map)})
    return out


def _eager_context(
    ir: MixinIR, flat_loads: dict[str, str], grid_load
) -> dict[str, Any]:
    sc = _scope(ir)
    used = set().union(*(fx.names_in(s.expr) for s in ir.eager_steps))
    flats = [f for f in ir.flat_inputs if f.key in used]
    loads = []
    for flat in flats:
        value = flat_loads[flat.key]
        if flat.eager_dtype is not None:
            value = f"{value}.to({sc.expr(flat.eager_dtype)})"
        loads.append({"name": flat.key, "value": value})
    if not ir.eager_per_item:
        grids = [grid_load(g.key) for g in ir.grid_inputs if g.key in used]
        return {
            "per_item": False,
            "loads": loads,
            "grids": grids,
            "steps": _steps(ir.eager_steps, sc, {}),
            "constants": sc.bindings(),
        }
    dims_needed = {d for g in ir.grid_inputs for d in g.dims if d in used}
    for flat in flats:
        dims_needed |= _dims_of(flat.rows, ir)
    target, iterable, grids = _grid_loop(ir, dims_needed)
    slices = []
    name_map = {}
    for flat in flats:
        slices.append(
            {
                "flat": flat.key,
                "item": f"item_{flat.key}",
                "offset": f"{flat.key}_offset",
                "rows": sc.expr(flat.rows),
            }
        )
        name_map[flat.key] = f"item_{flat.key}"
    assert ir.eager_empty_width is not None  # noqa: S101
    return {
        "per_item": True,
        "loads": loads,
        "grids": [grid_load(g) for g in grids],
        "target": target,
        "iterable": iterable,
        "slices": slices,
        "steps": _steps(ir.eager_steps, sc, name_map),
        "empty_like": flats[0].key if flats else None,
        "empty_width": sc.expr(ir.eager_empty_width),
        "constants": sc.bindings(),
    }


def _span_context(ir: MixinIR, grid_load) -> dict[str, Any]:
    span = ir.span_assembly
    assert span is not None and ir.graph_rows is not None  # noqa: S101
    sc = _scope(ir)
    rows_target, rows_iter, rows_grids = _grid_loop(ir, _dims_of(ir.graph_rows, ir))
    len_target, len_iter, len_grids = _grid_loop(ir, _dims_of(ir.output_tokens, ir))
    grids = list(dict.fromkeys(rows_grids + len_grids))
    first, *others = span.delimiters
    offsets = [
        f"{i} * (types == {const}).long()" if i > 1 else f"(types == {const}).long()"
        for i, (const, _) in enumerate(others, start=1)
    ]
    return {
        "grids": [grid_load(g, "batch_mm_kwargs") for g in grids],
        "types_key": span.types_key,
        "content": span.content,
        "rows": f"sum({sc.expr(ir.graph_rows)} for {rows_target} in {rows_iter})",
        "lengths": f"[{sc.expr(ir.output_tokens)} for {len_target} in {len_iter}]",
        "delimiter_names": [c for c, _ in span.delimiters],
        "delimiter_params": [f"self.{p}" for _, p in span.delimiters],
        "first_delimiter": first[0],
        "delimiter_offsets": " + ".join(offsets) if offsets else "0",
        "why": comment_lines(span.why),
        "constants": sc.bindings(),
    }


# -- rendering --------------------------------------------------------------------------


@cache
def template_files() -> tuple[tuple[str, bytes], ...]:
    return tuple((p.name, p.read_bytes()) for p in sorted(TEMPLATE_DIR.glob("*.j2")))


def templates_digest() -> str:
    h = hashlib.sha256()
    for name, data in template_files():
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


@cache
def _environment():
    import jinja2

    if not TEMPLATE_DIR.is_dir():
        raise RenderError(
            f"templates not found at {TEMPLATE_DIR} (install gen-mixin editable: pip install -e .)"
        )
    return jinja2.Environment(
        loader=jinja2.DictLoader(
            {name: data.decode("utf-8") for name, data in template_files()}
        ),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


BLACK_LINE_LENGTH = 88


def format_source(source: str) -> str:
    import black

    mode = black.Mode(
        target_versions={black.TargetVersion.PY310},
        line_length=BLACK_LINE_LENGTH,
        string_normalization=True,
        is_pyi=False,
        magic_trailing_comma=True,
    )
    try:
        return black.format_str(source, mode=mode)
    except Exception as exc:  # black raises several types; all are our bugs
        raise RenderError(f"black could not format the generated code: {exc}") from exc


def provenance_header(spec_display: str, target: str, spec_bytes: bytes) -> list[str]:
    """The module's first comment lines (without ``# ``): where it comes from.

    The spec's path is escaped (a path can hold line breaks, which would end
    the comment) and quoted for the shell in the command to rerun. Lines 1
    and 2 hold nothing of it: Python reads an encoding declaration
    (``coding: utf-7``) in either, and a folder can be named like one.
    """
    shown = printable(spec_display)
    return [
        "SPDX-License-Identifier: Apache-2.0",
        f"Generated by gen-mixin {__version__} (target: {target}); do not edit.",
        f"From {shown}: change the spec or the templates and run",
        f"`gen-mixin {shlex.quote(shown)}`.",
        f"spec-sha256: {hashlib.sha256(spec_bytes).hexdigest()}",
        f"templates-sha256: {templates_digest()}",
    ]


def refuse_oversized(raw: str, spec_path: str) -> None:
    """SpecError when a module's unformatted source exceeds
    :data:`~generator.limits.MAX_GENERATED_BYTES` (formatting it would take
    seconds)."""
    size = len(raw.encode("utf-8"))
    if size > MAX_GENERATED_BYTES:
        diags = Diagnostics()
        diags.error(
            Location(spec_path, 1, 1),
            "",
            f"the generated module would have {size // 1024} KiB before "
            f"formatting (at most {MAX_GENERATED_BYTES // 1024} KiB): the spec "
            "declares too much",
        )
        raise SpecError(diags.sorted())


def render(ir: MixinIR, target: str, spec_text: bytes, spec_display: str) -> str:
    """The formatted, parsed-back source of one generated module."""
    header = provenance_header(spec_display, target, spec_text)
    ctx = build_context(ir, target, header)
    try:
        raw = _environment().get_template(MAIN_TEMPLATE).render(**ctx)
    except Exception as exc:
        raise RenderError(f"template error: {exc}") from exc
    refuse_oversized(raw, ir.spec_path)
    formatted = format_source(raw)
    try:
        ast.parse(formatted)
    except SyntaxError as exc:
        raise RenderError(f"generated code does not parse: {exc}") from exc
    return formatted
