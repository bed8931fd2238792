"""The callees under host modules that the generated module checks at run
time: each dotted ``host_methods`` entry under a module attribute and each
module list a loop runs over.

The spec says ``visual.prepare_encoder_metadata``; only the host says what
``visual`` and its attributes are. A path through data
(``visual.config.save_pretrained``) passes every static check, so the
methods that first run the host's code (the capture, the item specs every
batch starts with, the config where it calls one) check once per model that
each part is a ``torch.nn.Module`` and the callee its submodule or method.
"""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.spec.forwards import Loop
from generator.spec.mixin import MixinSpec
from generator.spec.step_language import HOST_TENSOR_TYPES, TENSOR_METHODS


def callees(spec: MixinSpec) -> list[dict[str, Any]]:
    """What ``_check_host_callees`` checks, in the spec's order (``path``: a
    Python literal, the spec's text reaching the module through ``repr``):
    each dotted host method under a module (``tensor_method``: its last part is a tensor
    method, which may be bound to a tensor of the module before it) and each
    loop's module list (``module_list``)."""
    annotations = {h.name: h.annotation for h in spec.host}
    checked: list[dict[str, Any]] = []
    for method in spec.host_methods:
        root, _, rest = method.partition(".")
        if rest and annotations.get(root) not in HOST_TENSOR_TYPES:
            last = method.rsplit(".", 1)[1]
            checked.append(
                {
                    "path": repr(method),
                    "module_list": False,
                    "tensor_method": last in TENSOR_METHODS,
                }
            )
    lists = dict.fromkeys(loop.modules.dotted for loop in _loops(spec))
    for path in lists:
        checked.append(
            {"path": repr(path), "module_list": True, "tensor_method": False}
        )
    return checked


def _loops(spec: MixinSpec) -> list[Loop]:
    return [
        step
        for path in spec.paths
        for steps in (path.graph_forward, path.eager_forward.steps)
        for step in steps
        if isinstance(step, Loop)
    ]


def calls_dotted_method(exprs: list[fx.Expr | None]) -> bool:
    """Whether one of ``exprs`` calls a dotted host method (the config's
    ``max_frames_per_video`` may: it then checks the callees first)."""
    return any(
        isinstance(e, fx.Call)
        and isinstance(e.callee, fx.HostPath)
        and len(e.callee.parts) > 1
        for expr in exprs
        if expr is not None
        for e in fx.walk(expr)
    )
