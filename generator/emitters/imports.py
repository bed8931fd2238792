"""The module's imports, per target: what the generated code names, sorted as
isort / ruff sort them, type-only names under ``TYPE_CHECKING``."""

from __future__ import annotations

import re
from typing import Any

from generator import formulas as fx
from generator.diagnostics import RenderError
from generator.emitters import host_callees, input_checks, module_helpers
from generator.emitters.method_body import DEFS_NAMES
from generator.emitters.postprocess import scatters
from generator.import_rules import TARGET_ROOTS
from generator.naming import PROTOCOL_MODULES
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath


def used_import_names(spec: MixinSpec) -> set[str]:
    """Imported names the generated code mentions."""
    exprs: list[fx.Expr] = []
    for path in spec.paths:
        exprs += [e for m in path.metadata for e in m.exprs]
        if path.graph_forward_context is not None:
            exprs.append(path.graph_forward_context)
        exprs += [s.expr for s in path.graph_forward + path.eager_forward.steps]
    exprs += [s.expr for s in spec.post_steps + spec.count_steps]
    used = set().union(*(fx.names_in(e) for e in exprs)) if exprs else set()
    for attr in spec.host:
        used |= attr.names
    # A constant's imported name, where a printed formula or step reads the
    # constant (each method binds the constants it uses).
    read = set().union(*(fx.names_in(e) for e in [*_printed_formulas(spec), *exprs]))
    used |= {c.imported for c in spec.constants if c.imported and c.name in read}
    span = spec.span_assembly
    if span is not None:
        used.add(span.content.name)
        # Every delimiter: the input checks name each span type.
        used.update(imp.name for imp, _ in span.delimiters)
    return used


def _printed_formulas(spec: MixinSpec) -> list[fx.Expr]:
    """Every formula the generated code may print."""
    items = spec.items
    exprs = [items.input_size, items.output_tokens, items.graph_rows]
    exprs += [items.budget_tokens, spec.budget.min, spec.out_hidden_size]
    if items.eager_when is not None:
        exprs += [items.eager_when.left, items.eager_when.right]
    exprs += [f.rows for f in spec.flat_inputs]
    for path in spec.paths:
        exprs += _path_formulas(path)
    return [e for e in exprs if e is not None]


def _path_formulas(path: EncoderPath) -> list[fx.Expr | None]:
    """The formulas of one encoder path."""
    capture = path.capture
    exprs = [path.output_tokens, path.min_token_budget, capture.units]
    exprs += [let.expr for let in capture.lets]
    exprs += [side for a in capture.asserts for side in (a.check.left, a.check.right)]
    exprs += [e for _, dims in capture.dummy for e in dims]
    exprs += [e for t in capture.tensors for e in t.shape]
    exprs += [capture.graph_rows, path.eager_forward.empty_width]
    exprs += [e for m in path.metadata for e in m.exprs]
    exprs += [b.capture_value for b in path.buffers]
    exprs.append(path.graph_forward_context)
    exprs += [b.slots for b in path.buffers]
    exprs += [e for b in path.buffers for e in b.shape or ()]
    exprs += [s.expr for s in path.graph_forward + path.eager_forward.steps]
    return exprs


def uses_ceil_sqrt(spec: MixinSpec) -> bool:
    """``ceil_sqrt`` prints as ``math.isqrt``: the module imports ``math``."""
    return any(
        isinstance(sub, fx.Func) and sub.name == "ceil_sqrt"
        for e in _printed_formulas(spec)
        for sub in fx.walk(e)
    )


def _sort_key(name: str) -> tuple[int, list[int | str]]:
    """isort's order-by-type (CONSTANTS, Classes, functions), each in natural
    order (``V4`` before ``V41``), case-insensitive, as ruff sorts them."""
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    parts = re.split(r"(\d+)", name.lower())
    return (kind, [int(p) if p.isdigit() else p for p in parts])


def _lines(groups: dict[str, set[str]]) -> list[str]:
    return [
        f"from {module} import {', '.join(sorted(groups[module], key=_sort_key))}"
        for module in sorted(groups)
    ]


def _uses_itertools(spec: MixinSpec, target: str) -> bool:
    """Whether a helper the module defines runs ``itertools.accumulate``
    (row selection, units per item, the span check)."""
    helpers = module_helpers.context(spec, target)
    return (
        helpers["select_rows"]
        or helpers["split_units"]
        or helpers["unit_indices"]
        or input_checks.helpers(spec)["span"]
    )


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    mods = PROTOCOL_MODULES[target]
    stdlib = {"collections.abc": {"Hashable"}, "typing": {"TYPE_CHECKING", "Any"}}
    plain = {"itertools"} if _uses_itertools(spec, target) else set()
    first_party: dict[str, set[str]] = {}
    type_checking: dict[str, set[str]] = {mods["VllmConfig"]: {"VllmConfig"}}

    def add(groups: dict[str, set[str]], module: str, *names: str) -> None:
        groups.setdefault(module, set()).update(names)

    if spec.protocol_base:
        add(first_party, mods["interfaces"], "SupportsEncoderCudaGraph")
    add(
        type_checking if spec.local_defs_import else first_party,
        mods["defs"],
        *DEFS_NAMES,
    )
    if spec.has_paths and not spec.local_defs_import:
        add(first_party, mods["defs"], "EncoderCudaGraphPathConfig")
    if spec.capture_axes and not spec.local_defs_import:
        add(first_party, mods["defs"], "ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG")
    if any("MultiModalConfig" in a.names for a in spec.host):
        add(type_checking, mods["MultiModalConfig"], "MultiModalConfig")
    used = used_import_names(spec)
    for imp in spec.imports:
        if imp.name in used:  # declared for the spec's sake, never printed: no import
            add(
                type_checking if imp.type_only else first_party,
                imp.module(target),
                imp.name,
            )
    if any(not c["module_list"] for c in host_callees.callees(spec)):
        plain.add("inspect")  # _require_module_callee: a static method's test
    if spec.trailing is not None:
        plain.add("weakref")
    if uses_ceil_sqrt(spec):
        plain.add("math")
    if spec.span_assembly is not None:
        add(first_party, mods["async_tensor_h2d"], "async_tensor_h2d")
    if scatters(spec):
        add(first_party, mods["scatter_output_slices"], "scatter_output_slices")
    _check_roots(target, first_party, type_checking)
    return {
        "stdlib": [f"import {m}" for m in sorted(plain)] + _lines(stdlib),
        "first_party": _lines(first_party),
        "type_checking": _lines(type_checking),
    }


def _check_roots(target: str, *groups: dict[str, set[str]]) -> None:
    """Every first-party import comes from the target's own packages."""
    roots = {
        *TARGET_ROOTS[target],
        *(m.split(".")[0] for m in PROTOCOL_MODULES[target].values()),
    }
    for group in groups:
        for module in group:
            if module.split(".")[0] not in roots:
                raise RenderError(
                    f"unexpected import module {module!r} for target {target}"
                )
