"""The spec's JSON Schema, derived from the model's key declarations.

``gen-mixin schema`` prints it for editors; nothing validates against it
(the model's readers do, with located messages), so it cannot disagree with
what the generator accepts.
"""

from __future__ import annotations

from typing import Any

from generator.spec.reader import Keys

SCHEMA_ID = "https://github.com/gen-mixin/gen-mixin/spec.schema.json"


def section_schema(keys: Keys, doc: str | None = None) -> dict[str, Any]:
    """A mapping with exactly ``keys``."""
    out: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if doc:
        out["description"] = doc
    required = [k.name for k in keys.visible if k.required]
    if required:
        out["required"] = required
    props = {}
    for key in keys.visible:
        prop = dict(key.type.schema())
        prop["description"] = key.doc
        if key.default is not None and not key.required:
            default = getattr(key.default, "value", key.default)
            prop["default"] = default
        props[key.name] = prop
    out["properties"] = props
    return out


def spec_schema() -> dict[str, Any]:
    from generator.spec.mixin import MixinSpec

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "gen-mixin encoder CUDA graph mixin spec",
        **section_schema(MixinSpec.KEYS),
    }
