"""The LFM2-VL names a generated standalone mixin imports: the image input
its host's eager path reads (``LFM2VLImageInputs`` of
``vllm/model_executor/models/lfm2_vl.py``, a ``TensorSchema`` read by key).
There is no LFM2-VL reference tower yet."""

from __future__ import annotations

from typing import Any


class LFM2VLImageInputs(dict):
    """The image input of LFM2-VL's eager path: ``type``, ``pixel_values``
    ``(tiles, max patches, patch dim)``, ``spatial_shapes`` ``(tiles, 2)`` and
    ``num_patches`` (tiles per image), read by key."""

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
