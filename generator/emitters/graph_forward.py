"""``encoder_cudagraph_forward``: the captured computation."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.method_body import Body, path_dispatch
from generator.formulas import Ref
from generator.spec.forwards import Loop, Step
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath


def steps(body: Body, steps: tuple[Step | Loop, ...], name_map: dict[str, str]):
    """What the ``steps`` macro prints: each statement, or a loop's header
    and its body's statements."""
    return [_step(body, s, name_map) for s in steps]


def _step(body: Body, step: Step | Loop, name_map: dict[str, str]):
    if not isinstance(step, Loop):
        return {"target": step.target, "expr": body.expr(step.expr, name_map)}
    keep_at = step.keep_at
    return {
        "loop": {
            "variable": step.variable,
            "index": step.index,
            "modules": body.expr(step.modules, name_map),
            "steps": steps(body, step.body, name_map),
            "keep_as": step.keep_as,
            "keep_at": None if keep_at is None else body.expr(keep_at, name_map),
            "carry": step.carry,
        }
    }


def _path_body(spec: MixinSpec, path: EncoderPath) -> dict[str, Any]:
    body = Body(spec)
    forward = path.graph_forward
    uses_rest = any(Ref("rest") in fx.walk(s.expr) for s in forward)
    keys = [b.key for b in path.buffers]
    popped: list[str] = []
    name_map: dict[str, str] = {}
    if uses_rest:
        named = set().union(*(fx.names_in(s.expr) for s in forward))
        popped = [k for k in keys if k in named]
        name_map["rest"] = "inputs"
    else:
        name_map.update({k: f'inputs["{k}"]' for k in keys})
    context = path.graph_forward_context
    ctx = {
        "popped": popped,
        "uses_rest": uses_rest,
        "steps": steps(body, forward, name_map),
        "context": body.expr(context) if context is not None else None,
    }
    ctx["constants"] = body.bindings()
    return ctx


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    return path_dispatch(
        spec,
        "encoder_cudagraph_forward",
        [_path_body(spec, p) for p in spec.paths],
    )
