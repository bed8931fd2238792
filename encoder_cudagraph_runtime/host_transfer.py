"""Asynchronous host-to-device copies (``vllm.utils.torch_utils.async_tensor_h2d``).

Replay buffers are usually small host-side metadata (offsets, sizes) that a
mixin ships to the GPU right before a replay. A ``non_blocking`` copy is only
truly asynchronous from page-locked memory, so the data is staged in a pinned
buffer when pinning is possible (a CUDA device is present); otherwise the
copy silently degrades to a synchronous one.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

__all__ = ["async_tensor_h2d", "is_pin_memory_available"]


@functools.cache
def is_pin_memory_available() -> bool:
    """Whether page-locked host memory can be allocated (needs CUDA)."""
    return torch.cuda.is_available()


def async_tensor_h2d(
    data: list[Any] | np.ndarray | torch.Tensor,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Copy ``data`` from the host to ``device`` (or into ``out``) without
    blocking the host.

    Args:
        data: a (nested) list, a NumPy array or a host tensor.
        device: destination device; required when ``out`` is ``None``.
        dtype: element type of the result; defaults to ``out``'s dtype when
            ``out`` is given, else to the dtype of ``data``.
        out: optional destination tensor, written in place and returned (the
            way to refresh a buffer recorded in a CUDA graph). Its dtype must
            equal ``dtype``.

    Returns:
        The device tensor (``out`` itself when given).
    """
    pin = is_pin_memory_available()
    if dtype is None and out is not None:
        dtype = out.dtype
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    if isinstance(data, torch.Tensor):
        staged = data
        if pin and not staged.is_pinned():
            # Contiguous pinned staging copy, so the transfer below is a
            # genuine asynchronous DMA instead of a pageable-memory copy.
            staged = torch.empty(
                staged.shape,
                dtype=dtype or staged.dtype,
                device="cpu",
                pin_memory=True,
            ).copy_(staged)
    else:
        staged = torch.tensor(data, dtype=dtype, device="cpu", pin_memory=pin)
    if not staged.is_cpu:
        raise ValueError("async_tensor_h2d copies from host memory only")

    if out is not None:
        if out.dtype != dtype:
            raise ValueError(
                f"out has dtype {out.dtype} but dtype {dtype} was requested"
            )
        return out.copy_(staged, non_blocking=True)
    if device is None:
        raise ValueError("async_tensor_h2d needs a destination: device or out")
    return staged.to(device=device, dtype=dtype, non_blocking=True)
