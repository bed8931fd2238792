"""``set_forward_context`` of ``vllm/forward_context.py``, for mixins whose
captured forward runs in a forward context (LFM2-VL's compiled encoder
layers read it in vLLM). This runtime's towers read none: the context only
records what it was entered with, for tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: (attn_metadata, vllm_config) of every context entered, in order.
ENTERED: list[tuple[Any, Any]] = []


@contextmanager
def set_forward_context(
    attn_metadata: Any, vllm_config: Any, **_: Any
) -> Iterator[None]:
    """Enter a forward context (nothing to set up here)."""
    ENTERED.append((attn_metadata, vllm_config))
    yield
