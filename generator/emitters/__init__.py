"""One emitter per generated method (torchgen's ``dest/``).

Each emitter builds the small context its template partial prints
(``templates/methods/<method>.py.j2``, ``templates/module/*.py.j2``);
:func:`build_context` only composes them. Emitters decide, templates print.
"""

from __future__ import annotations

from typing import Any

from generator.emitters import (
    budget_range,
    capture_inputs,
    config,
    eager_forward,
    graph_forward,
    imports,
    input_checks,
    input_modality,
    item_specs,
    mixin_class,
    module_helpers,
    postprocess,
    replay_buffers,
    selection,
)
from generator.emitters.prose import docstring_lines
from generator.spec.mixin import MixinSpec

#: (partial, emitter) of each method, in the order the class defines them.
METHOD_EMITTERS = (
    ("methods/config.py.j2", config),
    ("methods/budget_range.py.j2", budget_range),
    ("methods/item_specs.py.j2", item_specs),
    ("methods/selection.py.j2", selection),
    ("methods/capture_inputs.py.j2", capture_inputs),
    ("methods/replay_buffers.py.j2", replay_buffers),
    ("methods/graph_forward.py.j2", graph_forward),
    ("methods/eager_forward.py.j2", eager_forward),
    ("methods/postprocess.py.j2", postprocess),
)


def build_context(spec: MixinSpec, target: str, header: list[str]) -> dict[str, Any]:
    """The whole module's context: each part's, composed."""
    methods = []
    for template, emitter in METHOD_EMITTERS:
        ctx = emitter.context(spec, target)
        if ctx is not None:
            methods.append({"template": template, "context": ctx})
    ctx = {
        "header": header,
        "module_docstring": (
            docstring_lines(spec.module_docstring) if spec.module_docstring else None
        ),
        "imports": imports.context(spec, target),
        "helpers": module_helpers.context(spec, target),
        "checks": input_checks.context(spec, target),
        "checks_used": input_checks.helpers(spec),
        "cls": mixin_class.context(spec, target),
        "methods": methods,
        "modality": input_modality.context(spec, target),
    }
    _drop_uncalled_readers(ctx)
    return ctx


#: The class's input readers, by their flag in the helpers' context: the
#: emitters print a call where a method reads such an input outside
#: ``_checked_grids``, which some specs' methods never do.
READERS = {"counts": "self._counts(", "grid_rows": "self._grid_rows("}


def _drop_uncalled_readers(ctx: dict[str, Any]) -> None:
    """Keep a reader helper only where the printed code calls it."""
    printed = "\n".join(_strings({k: v for k, v in ctx.items() if k != "helpers"}))
    printed += "\n".join(_strings(ctx["helpers"].get("axes")))
    for flag, call in READERS.items():
        ctx["helpers"][flag] = ctx["helpers"][flag] and call in printed


def _strings(value: Any) -> list[str]:
    """Every string in a context (nested dicts, lists and tuples)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []
