"""Device-side lookups for the packed metadata of the reference towers.

Every tower's RoPE angle is ``position * inv_freq`` per axis. Building the
per-row tables on the host for each batch (positions, outer product, cos and
sin, then a host-to-device copy) costs milliseconds of host time for a batch
of a few thousand rows, all of it spent before a graph replay can start. vLLM
keeps a cos/sin cache on the device and gathers rows by position; so do these
helpers:

* :class:`AngleTable`: ``cos``/``sin`` of ``p * inv_freq`` for every
  position ``p`` below a capacity, computed on the host in fp32 exactly as
  the per-grid builders compute them (so the values are theirs), optionally
  rearranged, cast, and kept on the device, grown by doubling.
* :class:`GridIndexCache`: an LRU of small per-grid tensors (row indices into
  an :class:`AngleTable`, gather indices), built on the host once per grid
  and kept on the device; a batch concatenates them with one kernel.

Nothing here reads a device tensor on the host, and every host-to-device
copy (a table's growth, a new grid) goes through
:func:`~encoder_cudagraph_runtime.host_transfer.async_tensor_h2d`: pinned
staging and ``non_blocking``, so a cache miss never waits for the device.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import torch

from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d

__all__ = ["AngleTable", "GridIndexCache", "concat_on_device"]

Arrange = Callable[[torch.Tensor], torch.Tensor]


class AngleTable:
    """``cos``/``sin`` of ``position * inv_freq`` for positions ``0..P-1``.

    Args:
        inv_freq: makes the ``(F,)`` fp32 inverse frequencies. Called on the
            first lookup, with the CPU as default device (towers are often
            built under ``torch.device("meta")``).
        arrange: maps the ``(P, F)`` fp32 host table to the layout the tower
            gathers from (identity by default); applied before the cast.
    """

    def __init__(
        self, inv_freq: Callable[[], torch.Tensor], arrange: Arrange | None = None
    ) -> None:
        self._inv_freq = inv_freq
        self._arrange = arrange
        # (device, dtype) -> (capacity in positions, cos, sin)
        self._tables: dict[
            tuple[torch.device, torch.dtype], tuple[int, torch.Tensor, torch.Tensor]
        ] = {}

    def cos_sin(
        self, positions: int, device: torch.device | str, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables covering at least positions ``0..positions-1`` on ``device``."""
        key = (torch.device(device), dtype)
        entry = self._tables.get(key)
        if entry is None or entry[0] < positions:
            capacity = max(64, 1 << max(positions - 1, 0).bit_length())
            with torch.device("cpu"):
                inv_freq = self._inv_freq().to(torch.float32)
                angles = (
                    torch.arange(capacity, dtype=torch.float32)[:, None]
                    * inv_freq[None, :]
                )
                cos, sin = angles.cos(), angles.sin()
                if self._arrange is not None:
                    cos, sin = self._arrange(cos), self._arrange(sin)
            entry = (
                capacity,
                async_tensor_h2d(cos, key[0], dtype=dtype),
                async_tensor_h2d(sin, key[0], dtype=dtype),
            )
            self._tables[key] = entry
        return entry[1], entry[2]


class GridIndexCache:
    """LRU of per-grid device tensors.

    ``build(key)`` makes the host tensor(s) of one grid; :meth:`get` returns
    them on the device, building and copying once per (grid, device). The
    tensors are shared between callers: never modify them.
    """

    def __init__(
        self,
        build: Callable[[Hashable], torch.Tensor | tuple[torch.Tensor, ...]],
        maxsize: int = 256,
    ) -> None:
        self._build = build
        self._maxsize = maxsize
        self._entries: OrderedDict[
            tuple[Hashable, torch.device], torch.Tensor | tuple[torch.Tensor, ...]
        ] = OrderedDict()

    def get(
        self, key: Hashable, device: torch.device | str, *, store: bool = True
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The grid's tensors on ``device``; ``store=False`` leaves the LRU
        untouched (one-off grids, such as capture dummies)."""
        full_key = (key, torch.device(device))
        value = self._entries.get(full_key)
        if value is not None:
            self._entries.move_to_end(full_key)
            return value
        built = self._build(key)
        # A new grid is a replay's host work: its copy must not wait for the
        # device (a pageable `.to(device)` would block until the queue drains).
        if isinstance(built, torch.Tensor):
            value = async_tensor_h2d(built, full_key[1])
        else:
            value = tuple(async_tensor_h2d(t, full_key[1]) for t in built)
        if store:
            self._entries[full_key] = value
            if len(self._entries) > self._maxsize:
                self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def concat_on_device(parts: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``torch.cat`` that returns a single part itself, uncopied: for
    intermediates only (a gather's index), never for a returned buffer,
    which a graph may own and overwrite."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat(list(parts), dim=dim)
