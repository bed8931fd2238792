"""Splitting a packed encoder output per item
(``vllm.model_executor.models.utils.scatter_output_slices``)."""

from __future__ import annotations

import torch

__all__ = ["scatter_output_slices"]


def scatter_output_slices(
    output: torch.Tensor,
    indices: list[int],
    per_item_out_tokens: list[int],
    dest: dict[int, torch.Tensor] | list[torch.Tensor | None],
    clone: bool = False,
) -> None:
    """Cut ``output`` into consecutive row slices, one per item, and store
    them as ``dest[idx]``.

    Items are laid out in ``indices`` order; item ``idx`` owns
    ``per_item_out_tokens[idx]`` rows. Rows after the last item (a graph's
    padding) are ignored. With ``clone`` each slice is copied, which callers
    need when ``output`` is a graph's output buffer that the next replay
    overwrites; otherwise the slices are views.
    """
    offset = 0
    for idx in indices:
        end = offset + per_item_out_tokens[idx]
        piece = output[offset:end]
        dest[idx] = piece.clone() if clone else piece
        offset = end
