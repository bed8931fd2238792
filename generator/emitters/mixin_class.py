"""The class statement: its bases, docstring and host attribute annotations."""

from __future__ import annotations

from typing import Any

from generator.emitters.prose import docstring_lines
from generator.spec.mixin import MixinSpec


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    trailing = spec.trailing
    return {
        "class_name": spec.class_name,
        "bases": "SupportsEncoderCudaGraph" if spec.protocol_base else "",
        "docstring": docstring_lines(spec.docstring),
        "host": [
            {
                "name": a.name,
                "annotation": f'"{a.annotation}"' if a.quoted else a.annotation,
            }
            for a in spec.host
        ],
        "trailing": {"key": trailing.key} if trailing is not None else None,
    }
