"""Arithmetic of the manager's data-parallel mode, as pure functions.

In DP mode every tensor-parallel rank sees the whole batch, runs only its
share of the items and then all ranks exchange outputs:

1. :func:`plan_dp_shard` balances items over ranks by ``input_size``
   (:func:`~encoder_cudagraph_runtime.load_balance.get_load_balance_assignment`)
   and computes how many output rows each rank produces. The all-gather
   needs equal shapes, so every rank pads to the largest rank's rows.
2. :func:`pad_local_output` concatenates a rank's outputs and appends
   uninitialised padding rows (their content is never read).
3. After the all-gather, :func:`unshard_gathered` cuts each rank's real rows
   out of its block and puts every item back at its original position.

Keeping these free of communication lets tests simulate any number of
ranks in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from encoder_cudagraph_runtime.load_balance import get_load_balance_assignment
from encoder_cudagraph_runtime.output_scatter import scatter_output_slices

__all__ = ["DPShardPlan", "pad_local_output", "plan_dp_shard", "unshard_gathered"]


@dataclass(frozen=True)
class DPShardPlan:
    """Which items each rank runs and how the gathered rows are laid out."""

    assignment: list[int]
    """Item indices rank by rank (rank 0's items first)."""
    items_per_rank: list[int]
    """Number of items of each rank."""
    offsets: list[int]
    """Prefix sums of ``items_per_rank``: rank ``r`` owns
    ``assignment[offsets[r]:offsets[r + 1]]``."""
    tokens_per_rank: list[int]
    """Output rows each rank produces (sum of its items' ``output_tokens``)."""
    max_output_tokens_per_rank: int
    """Rows every rank contributes to the all-gather (0 for no items)."""

    @property
    def world_size(self) -> int:
        return len(self.items_per_rank)

    def rank_items(self, rank: int) -> list[int]:
        """The item indices rank ``rank`` runs, in its local order."""
        return self.assignment[self.offsets[rank] : self.offsets[rank + 1]]


def plan_dp_shard(
    input_sizes: Sequence[int],
    per_item_out_tokens: Sequence[int],
    world_size: int,
) -> DPShardPlan:
    """Balance items over ``world_size`` ranks by input size."""
    assignment, items_per_rank, _ = get_load_balance_assignment(
        list(input_sizes), world_size
    )
    offsets = [0]
    for count in items_per_rank:
        offsets.append(offsets[-1] + count)
    tokens_per_rank = [
        sum(per_item_out_tokens[i] for i in assignment[offsets[r] : offsets[r + 1]])
        for r in range(world_size)
    ]
    max_tokens = max(tokens_per_rank) if per_item_out_tokens else 0
    return DPShardPlan(
        assignment=assignment,
        items_per_rank=items_per_rank,
        offsets=offsets,
        tokens_per_rank=tokens_per_rank,
        max_output_tokens_per_rank=max_tokens,
    )


def pad_local_output(
    local_outputs: Sequence[torch.Tensor],
    rows: int,
    hidden_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """This rank's contribution to the all-gather: its outputs back to back,
    then uninitialised rows up to ``rows`` (an idle rank sends only those).

    The result is always ``(rows, hidden_size)`` in ``dtype`` on ``device``:
    an all-gather moves bytes, so every rank must send the same shape and
    dtype or the exchange hangs or mixes data. Outputs of another dtype are
    cast (vLLM concatenates them with its manager-dtype padding, so a rank's
    dtype would depend on whether it pads); outputs that are not 2-D rows of
    ``hidden_size``, or more than ``rows`` of them, raise ``ValueError``
    before the collective.
    """
    for i, out in enumerate(local_outputs):
        if out.dim() != 2 or out.shape[1] != hidden_size:
            raise ValueError(
                f"data-parallel gather needs 2-D (rows, {hidden_size}) outputs "
                f"(out_hidden_size); local output {i} has shape "
                f"{tuple(out.shape)}"
            )
    if local_outputs:
        local = torch.cat(list(local_outputs), dim=0)
        local = local.to(device=device, dtype=dtype)
    else:
        local = torch.empty((0, hidden_size), device=device, dtype=dtype)
    missing = rows - local.shape[0]
    if missing < 0:
        raise ValueError(
            f"this rank's outputs have {local.shape[0]} rows, more than the "
            f"{rows} every rank sends (the largest rank's sum of output_tokens)"
        )
    if missing == 0:
        return local
    padding = torch.empty((missing, hidden_size), device=device, dtype=dtype)
    return torch.cat([local, padding], dim=0)


def unshard_gathered(
    gathered: torch.Tensor,
    plan: DPShardPlan,
    per_item_out_tokens: Sequence[int],
) -> list[torch.Tensor]:
    """Per-item outputs in original order from the gathered rank blocks.

    Rank ``r``'s block starts at ``r * plan.max_output_tokens_per_rank``; its
    first ``plan.tokens_per_rank[r]`` rows are its items in local order. The
    results are views of ``gathered``.
    """
    block = plan.max_output_tokens_per_rank
    tokens = list(per_item_out_tokens)
    result: list[torch.Tensor | None] = [None] * len(tokens)
    for rank in range(plan.world_size):
        items = plan.rank_items(rank)
        if not items:
            continue
        start = rank * block
        rank_rows = gathered[start : start + plan.tokens_per_rank[rank]]
        scatter_output_slices(rank_rows, items, tokens, result)
    return [t for t in result if t is not None]
