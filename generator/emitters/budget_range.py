"""``get_encoder_cudagraph_budget_range``: the smallest and largest budget."""

from __future__ import annotations

from typing import Any

from generator.emitters.method_body import Body, signature
from generator.emitters.prose import comment_lines
from generator.spec.mixin import MixinSpec


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    body = Body(spec)
    ctx = {
        "signature": signature(spec, "get_encoder_cudagraph_budget_range"),
        "min": body.expr(spec.budget.min),
        "why": comment_lines(spec.budget.why),
    }
    ctx["constants"] = body.bindings()
    return ctx
