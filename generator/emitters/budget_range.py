"""``get_encoder_cudagraph_budget_range``: the smallest and largest budget."""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.method_body import Body, signature
from generator.emitters.prose import comment_lines
from generator.spec.mixin import MixinSpec


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    body = Body(spec)
    ctx = {
        "signature": signature(spec, "get_encoder_cudagraph_budget_range"),
        "min": body.expr(spec.budget.min),
        "why": comment_lines(spec.budget.why),
        "max": None if spec.budget.max is None else body.expr(spec.budget.max),
        "max_why": comment_lines(spec.budget.max_why),
        "unit": (
            None
            if spec.items.budget_tokens is None
            else fx.to_spec_text(spec.items.budget_tokens)
        ),
    }
    # Only the scheduler values the formula reads are bound.
    read = fx.names_in(spec.budget.max) if spec.budget.max is not None else set()
    ctx["reads_tokens"] = "max_num_batched_tokens" in read
    ctx["reads_len"] = "max_model_len" in read
    ctx["constants"] = body.bindings()
    return ctx
