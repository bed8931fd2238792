"""Tensor-parallel group helpers for the manager's data-parallel mode.

vLLM's manager shards encoder items over the tensor-parallel group
(``mm_encoder_tp_mode == "data"``) and gathers the outputs with
``tensor_model_parallel_all_gather``. Here the group is a plain
``torch.distributed`` process group: the default (world) group unless
:func:`set_tensor_model_parallel_group` chose another. Without an
initialised ``torch.distributed`` the group has one rank, so single-process
code (and CPU tests) run the DP code path unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "set_tensor_model_parallel_group",
    "tensor_model_parallel_all_gather",
]

_TP_GROUP: Any | None = None


def set_tensor_model_parallel_group(group: Any | None) -> None:
    """Use ``group`` as the tensor-parallel group (``None``: the world)."""
    global _TP_GROUP
    _TP_GROUP = group


def get_tensor_model_parallel_group() -> Any | None:
    """The process group in use, ``None`` meaning the default group."""
    return _TP_GROUP


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_tensor_model_parallel_world_size() -> int:
    """Ranks in the tensor-parallel group (1 without torch.distributed)."""
    if not _initialized():
        return 1
    return dist.get_world_size(group=_TP_GROUP)


def get_tensor_model_parallel_rank() -> int:
    """This process' rank in the tensor-parallel group (0 without
    torch.distributed)."""
    if not _initialized():
        return 0
    return dist.get_rank(group=_TP_GROUP)


def tensor_model_parallel_all_gather(
    input_: torch.Tensor, dim: int = -1
) -> torch.Tensor:
    """Concatenate every rank's ``input_`` along ``dim``, in rank order.

    All ranks must pass tensors of the same shape. With one rank the input
    is returned as is (no copy), like vLLM.
    """
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return input_
    if not -input_.dim() <= dim < input_.dim():
        raise ValueError(f"dim {dim} is out of range for shape {tuple(input_.shape)}")
    if dim < 0:
        dim += input_.dim()
    source = input_.contiguous()
    stacked = torch.empty(
        (world_size, *source.shape), dtype=source.dtype, device=source.device
    )
    if dist.get_backend(_TP_GROUP) == dist.Backend.GLOO:
        # Gloo has no all_gather_into_tensor; gather into views of `stacked`.
        dist.all_gather(list(stacked.unbind(0)), source, group=_TP_GROUP)
    else:
        dist.all_gather_into_tensor(stacked, source, group=_TP_GROUP)
    # (world, ..., d, ...) -> (..., world * d, ...): rank r's block comes r-th.
    moved = stacked.movedim(0, dim)
    shape = list(source.shape)
    shape[dim] *= world_size
    return moved.reshape(shape)
