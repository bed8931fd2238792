"""The spec's JSON Schema, derived from the model's key declarations.

``gen-mixin schema`` prints it for editors; nothing validates against it
(the model's readers do, with located messages), so it cannot disagree with
what the generator accepts.
"""

from __future__ import annotations

from typing import Any

from generator.spec.mixin import MixinSpec
from generator.spec.reader import section_schema

SCHEMA_ID = "https://github.com/gen-mixin/gen-mixin/spec.schema.json"


def spec_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "gen-mixin encoder CUDA graph mixin spec",
        **section_schema(MixinSpec.KEYS),
    }
