"""The spec's JSON Schema (``gen-mixin schema``), derived from the typed model
(:mod:`generator.spec.schema`); kept under this name for the command line."""

from __future__ import annotations

from generator.spec.enums import BACKENDS
from generator.spec.schema import spec_schema

SPEC_SCHEMA = spec_schema()

__all__ = ["BACKENDS", "SPEC_SCHEMA"]
