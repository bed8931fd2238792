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
    return {
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
