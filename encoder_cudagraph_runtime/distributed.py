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

# torch 2.13 deprecates all_gather_into_tensor (a FutureWarning per call
# site) in favour of all_gather_single, with the same contract; older
# releases only have the former.
_all_gather_into_tensor = getattr(dist, "all_gather_single", None) or getattr(
    dist, "all_gather_into_tensor", None
)


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
    # The rank blocks back to back along dim 0: the concatenated output form
    # that every backend's single-tensor all-gather accepts (gloo's rejects
    # the stacked (world, ...) form).
    gathered = torch.empty(
        (world_size * source.shape[0], *source.shape[1:]),
        dtype=source.dtype,
        device=source.device,
    )
    if dist.get_backend(_TP_GROUP) == dist.Backend.GLOO:
        # Older gloo builds have no single-tensor all-gather; gather into
        # views of the blocks (gloo copies into them).
        blocks = gathered.view(world_size, *source.shape).unbind(0)
        dist.all_gather(list(blocks), source, group=_TP_GROUP)
    else:
        # NCCL: one collective into the output, as vLLM does.
        _all_gather_into_tensor(gathered, source, group=_TP_GROUP)
    if dim == 0:
        return gathered
    # (world, ..., d, ...) -> (..., world * d, ...): rank r's block comes r-th.
    moved = gathered.view(world_size, *source.shape).movedim(0, dim)
    shape = list(source.shape)
    shape[dim] *= world_size
    return moved.reshape(shape)
