"""``get_input_modality`` and the batch's keys by modality (video keys only)."""

from __future__ import annotations

from typing import Any

from generator.emitters.method_body import signature
from generator.spec.mixin import MixinSpec


def context(spec: MixinSpec, target: str) -> dict[str, Any] | None:
    if not spec.has_video_keys:
        return None
    keys = [(i.key, i.video_key) for i in spec.inputs]
    return {
        "signature": signature(spec, "get_input_modality"),
        "image": [(repr(k), repr(k)) for k, _ in keys],
        "video": [(repr(k), repr(v)) for k, v in keys],
        "probe": repr(spec.item_inputs[0].key),
    }
