"""Whether captured buffers may be replay-copied with the written-rows
shortcut.

The manager's default replay copy zeroes only the rows an earlier replay of
the same graph wrote (see ``EncoderCudaGraphManager._run_budget_graph``).
That is only the same as vLLM's ``zero_()`` of the whole buffer when

1. no two captured buffers share memory (in one graph or across graphs: a
   replay into one would leave rows in the other that its record does not
   know about), and
2. the captured forward never writes its own inputs (a replay would leave
   rows that no copy wrote).

The protocol promises neither, so the manager checks both at capture with
the functions below and replays the graphs that fail either check with
vLLM's plain copy.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch

__all__ = ["byte_span", "changed_inputs", "overlapping_owners", "snapshot_inputs"]


def byte_span(tensor: torch.Tensor) -> tuple[str, int, int]:
    """``(device, first byte, one past the last byte)`` that ``tensor`` can
    touch, from its data pointer, sizes and strides (a strided view spans
    from its lowest to its highest element)."""
    start = tensor.data_ptr()
    itemsize = tensor.element_size()
    if tensor.numel() == 0:
        return str(tensor.device), start, start
    low = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()) if s < 0)
    high = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()) if s > 0)
    return str(tensor.device), start + low * itemsize, start + (high + 1) * itemsize


def overlapping_owners(
    buffers: Mapping[Hashable, Mapping[str, object]],
) -> set[Hashable]:
    """The owners (graphs) one of whose tensors shares a byte with another
    tensor, of the same owner or of another one.

    ``buffers`` maps an owner to its captured dict; non-tensor values are
    ignored. Empty tensors touch nothing.
    """
    spans = []
    for owner, values in buffers.items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.numel() > 0:
                device, start, end = byte_span(value)
                spans.append((device, start, end, owner, name))
    spans.sort(key=lambda s: (s[0], s[1]))
    flagged: set[Hashable] = set()
    # Sweep per device: a span overlaps an earlier one when it starts before
    # the furthest end seen so far.
    reach: tuple[str, int, Hashable] | None = None
    for device, start, end, owner, _ in spans:
        if reach is not None and reach[0] == device and start < reach[1]:
            flagged.update((owner, reach[2]))
        if reach is None or reach[0] != device or end > reach[1]:
            reach = (device, end, owner)
    return flagged


def snapshot_inputs(values: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """Copies of the tensors of a captured dict, to compare after a forward."""
    return {
        name: value.clone()
        for name, value in values.items()
        if isinstance(value, torch.Tensor)
    }


def changed_inputs(
    values: Mapping[str, object], snapshot: Mapping[str, torch.Tensor]
) -> list[str]:
    """Names whose tensor no longer equals its snapshot (a NaN counts as a
    change, which errs on the safe side)."""
    return [
        name
        for name, before in snapshot.items()
        if not torch.equal(values[name], before)  # type: ignore[arg-type]
    ]
