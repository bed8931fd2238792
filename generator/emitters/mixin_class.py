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
        # The standalone runtime's cost-aware eager units order their items
        # for a tower that encodes item by item (one path: the only kind it
        # plans); vLLM has no such reader.
        "eager_per_item": target == "standalone"
        and len(spec.paths) == 1
        and spec.paths[0].eager_forward.per_item,
    }
