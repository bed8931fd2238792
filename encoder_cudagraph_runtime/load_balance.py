"""Balancing encoder items over data-parallel ranks
(``vllm.model_executor.models.vision.get_load_balance_assignment``)."""

from __future__ import annotations

__all__ = ["get_load_balance_assignment"]


def get_load_balance_assignment(
    sizes: list[int],
    num_gpus: int = 2,
) -> tuple[list[int], list[int], list[int]]:
    """Assign items to ranks so that every rank gets a similar total size.

    Greedy longest-processing-time: items are visited from the largest size
    down (equal sizes keep their original order) and each goes to the rank
    with the smallest total so far (the lowest rank on ties). The load is
    the summed size, not the number of items, because encoder cost scales
    with rows.

    Args:
        sizes: size of each item (the manager passes ``input_size``).
        num_gpus: number of ranks.

    Returns:
        ``(shuffle_indices, gpu_sample_counts, grouped_sizes_per_gpu)``:
        item indices concatenated rank by rank (each rank's items in the
        order they were assigned), the number of items per rank and the
        total size per rank. For no items: ``([], [0] * n, [0] * n)``.
    """
    if not sizes:
        return [], [0] * num_gpus, [0] * num_gpus

    per_rank: list[list[int]] = [[] for _ in range(num_gpus)]
    loads = [0] * num_gpus
    # sorted(reverse=True) is stable, so ties stay in index order.
    for idx in sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True):
        # min() returns the first minimum: ties go to the lowest rank.
        rank = min(range(num_gpus), key=loads.__getitem__)
        per_rank[rank].append(idx)
        loads[rank] += sizes[idx]

    order = [idx for items in per_rank for idx in items]
    counts = [len(items) for items in per_rank]
    return order, counts, loads
