"""The MiniCPM-V names a generated standalone mixin imports: the image input
its host's eager path reads (``MiniCPMVImagePixelInputs`` of
``vllm/model_executor/models/minicpmv.py``, a ``TensorSchema`` read by key).
There is no MiniCPM-V reference tower yet."""

from __future__ import annotations

from typing import Any


class MiniCPMVImagePixelInputs(dict):
    """The image input of MiniCPM-V's ``get_vision_hidden_states``: ``type``,
    ``pixel_values`` (every slice, ``(3, p, h * w * p)``) and ``tgt_sizes``
    ``(slices, 2)``, read by key. ``validate`` is the schema's switch (this
    one checks nothing)."""

    def __init__(self, *, validate: bool = True, **fields: Any) -> None:
        super().__init__(**fields)
