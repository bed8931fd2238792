"""``get_input_modality``: by the batch's keys (video keys), or the one
modality a spec names when that is not the protocol default ``"image"``."""

from __future__ import annotations

from typing import Any

from generator.emitters.method_body import signature
from generator.spec.enums import Modality
from generator.spec.mixin import MixinSpec


def context(spec: MixinSpec, target: str) -> dict[str, Any] | None:
    if not spec.has_video_keys:
        (first, *others) = spec.modalities
        if others or first is Modality.IMAGE:
            return None
        return {
            "signature": signature(spec, "get_input_modality"),
            "fixed": repr(first.value),
        }
    keys = [(i.key, i.video_key) for i in spec.inputs]
    return {
        "signature": signature(spec, "get_input_modality"),
        "image": [(repr(k), repr(k)) for k, _ in keys],
        "video": [(repr(k), repr(v)) for k, v in keys],
        "probe": repr(spec.item_inputs[0].key),
        "fixed": None,
    }
