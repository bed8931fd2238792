"""Data-parallel sharding: load balance, shard plan, gather ordering and the
manager's DP mode over a simulated world and over real gloo processes."""

from __future__ import annotations

import heapq
import os
import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_fakes import (
    FakeEncoder,
    expected_item_output,
    make_items,
    make_kwargs,
    make_manager,
)

from encoder_cudagraph_runtime import distributed
from encoder_cudagraph_runtime.dp_sharding import (
    pad_local_output,
    plan_dp_shard,
    unshard_gathered,
)
from encoder_cudagraph_runtime.load_balance import get_load_balance_assignment


def reference_assignment(
    sizes: list[int], num_gpus: int
) -> tuple[list[int], list[int], list[int]]:
    """Independent LPT: a heap keyed (load, rank) picks the least-loaded,
    lowest rank; items are taken by (-size, index)."""
    heap = [(0, rank) for rank in range(num_gpus)]
    per_rank: list[list[int]] = [[] for _ in range(num_gpus)]
    loads = [0] * num_gpus
    for _, idx in sorted((-size, idx) for idx, size in enumerate(sizes)):
        load, rank = heapq.heappop(heap)
        per_rank[rank].append(idx)
        loads[rank] = load + sizes[idx]
        heapq.heappush(heap, (loads[rank], rank))
    return [i for r in per_rank for i in r], [len(r) for r in per_rank], loads


class TestLoadBalance:
    def test_docstring_example(self) -> None:
        # 1000 -> rank 0; 200, 100, 50 -> rank 1 (load 350 stays below 1000).
        assert get_load_balance_assignment([1000, 100, 200, 50], 2) == (
            [0, 2, 1, 3],
            [1, 3],
            [1000, 350],
        )

    def test_ties(self) -> None:
        # 0 -> r0, 1 -> r1, 2 -> r0 (loads 5, 5: lowest rank wins).
        assert get_load_balance_assignment([5, 5, 5], 2) == ([0, 2, 1], [2, 1], [10, 5])

    def test_empty(self) -> None:
        assert get_load_balance_assignment([], 3) == ([], [0, 0, 0], [0, 0, 0])

    def test_more_ranks_than_items(self) -> None:
        assert get_load_balance_assignment([7], 3) == ([0], [1, 0, 0], [7, 0, 0])

    def test_default_two_gpus(self) -> None:
        assert get_load_balance_assignment([3, 4]) == ([1, 0], [1, 1], [4, 3])

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.integers(0, 100), max_size=30), st.integers(1, 6))
    def test_matches_reference(self, sizes: list[int], num_gpus: int) -> None:
        expected = reference_assignment(sizes, num_gpus)
        if not sizes:
            expected = ([], [0] * num_gpus, [0] * num_gpus)
        assert get_load_balance_assignment(sizes, num_gpus) == expected


class TestShardPlan:
    def test_plan_example(self) -> None:
        # input sizes 40, 200, 80, 160, 120 (rows * 4): LPT order 1, 3, 4, 2, 0
        # r0: 1 (200); r1: 3 (160); r1: 4 (280); r0: 2 (280); tie -> r0: 0.
        plan = plan_dp_shard([40, 200, 80, 160, 120], [10, 50, 20, 40, 30], 2)
        assert plan.assignment == [1, 2, 0, 3, 4]
        assert plan.items_per_rank == [3, 2]
        assert plan.offsets == [0, 3, 5]
        assert plan.rank_items(0) == [1, 2, 0]
        assert plan.rank_items(1) == [3, 4]
        assert plan.tokens_per_rank == [80, 70]
        assert plan.max_output_tokens_per_rank == 80

    def test_plan_no_items(self) -> None:
        plan = plan_dp_shard([], [], 3)
        assert plan.max_output_tokens_per_rank == 0
        assert plan.rank_items(2) == []

    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(st.tuples(st.integers(1, 50), st.integers(0, 6)), max_size=12),
        st.integers(1, 5),
    )
    def test_simulated_gather_restores_order(
        self, items: list[tuple[int, int]], world: int
    ) -> None:
        input_sizes = [size for size, _ in items]
        tokens = [t for _, t in items]
        hidden = 3
        # Item i's rows are all equal to i, so misplaced rows are visible.
        originals = [torch.full((t, hidden), float(i)) for i, t in enumerate(tokens)]
        plan = plan_dp_shard(input_sizes, tokens, world)
        blocks = []
        for rank in range(world):
            local = [originals[i] for i in plan.rank_items(rank)]
            padded = pad_local_output(
                local, plan.max_output_tokens_per_rank, hidden, "cpu", torch.float32
            )
            assert padded.shape == (plan.max_output_tokens_per_rank, hidden)
            real = sum(t.shape[0] for t in local)
            padded[real:] = float("nan")  # padding content must never be used
            blocks.append(padded)
        gathered = torch.cat(blocks, dim=0)
        result = unshard_gathered(gathered, plan, tokens)
        assert len(result) == len(items)
        for got, want in zip(result, originals):
            torch.testing.assert_close(got, want)


class SimulatedWorld:
    """In-process TP group: one thread per rank, all-gather via a barrier."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.local = threading.local()
        self.barrier = threading.Barrier(size)
        self.slots: list[torch.Tensor | None] = [None] * size

    def rank(self) -> int:
        return self.local.rank

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        assert dim == 0
        self.slots[self.rank()] = tensor
        self.barrier.wait()
        shapes = {tuple(t.shape) for t in self.slots if t is not None}
        assert len(shapes) == 1, f"ranks sent different shapes: {shapes}"
        out = torch.cat([t for t in self.slots if t is not None], dim=0)
        self.barrier.wait()
        return out

    def run(self, fn: Any) -> list[Any]:
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        if errors:
            raise errors[0]
        return results


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def make(size: int) -> SimulatedWorld:
        sim = SimulatedWorld(size)
        monkeypatch.setattr(
            distributed, "get_tensor_model_parallel_world_size", lambda: sim.size
        )
        monkeypatch.setattr(distributed, "get_tensor_model_parallel_rank", sim.rank)
        monkeypatch.setattr(
            distributed, "tensor_model_parallel_all_gather", sim.all_gather
        )
        return sim

    return make


class TestManagerDP:
    def test_two_ranks(self, world) -> None:  # type: ignore[no-untyped-def]
        sim = world(2)
        rows = [10, 50, 20, 40, 30]
        items = make_items(rows, input_sizes=[4 * r for r in rows])
        models = [FakeEncoder(budget_range=(8, 64)) for _ in range(2)]

        def rank_fn(rank: int) -> list[torch.Tensor]:
            manager = make_manager(models[rank], tp_size=2, tp_mode="data")
            assert manager.use_dp
            manager.capture()
            return manager.execute(make_kwargs(items))

        results = sim.run(rank_fn)
        for outputs in results:
            assert len(outputs) == len(items)
            for out, item in zip(outputs, items):
                torch.testing.assert_close(
                    out, expected_item_output(item, ["default"], 0.5)
                )
        # Shard selection (see TestShardPlan.test_plan_example).
        assert models[0].calls_named("select")[0] == [1, 2, 0]
        assert models[1].calls_named("select")[0] == [3, 4]

    def test_idle_ranks_join(self, world) -> None:  # type: ignore[no-untyped-def]
        sim = world(3)
        items = make_items([12])
        models = [FakeEncoder(budget_range=(8, 64)) for _ in range(3)]

        def rank_fn(rank: int) -> list[torch.Tensor]:
            manager = make_manager(models[rank], tp_size=3, tp_mode="data")
            manager.capture()
            return manager.execute(make_kwargs(items))

        results = sim.run(rank_fn)
        for outputs in results:
            assert len(outputs) == 1
            torch.testing.assert_close(
                outputs[0], expected_item_output(items[0], ["default"], 0.5)
            )
        assert models[0].calls_named("select")[0] == [0]
        assert models[1].calls_named("select") == [[]]
        assert models[2].calls_named("select") == [[]]

    def test_single_process_dp_mode(self) -> None:
        # tp_size > 1 in the config but no process group: world of one.
        manager = make_manager(
            FakeEncoder(budget_range=(8, 64)), tp_size=2, tp_mode="data"
        )
        manager.capture()
        items = make_items([5, 70, 9])
        outputs = manager.execute(make_kwargs(items))
        for out, item in zip(outputs, items):
            torch.testing.assert_close(
                out, expected_item_output(item, ["default"], 0.5)
            )


class TestDistributedHelpers:
    def test_uninitialised(self) -> None:
        assert not dist.is_initialized()
        assert distributed.get_tensor_model_parallel_world_size() == 1
        assert distributed.get_tensor_model_parallel_rank() == 0
        t = torch.ones(2, 3)
        assert distributed.tensor_model_parallel_all_gather(t, dim=0) is t


def _gloo_worker(rank: int, world_size: int, init_file: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        assert distributed.get_tensor_model_parallel_world_size() == world_size
        assert distributed.get_tensor_model_parallel_rank() == rank
        local = torch.full((2, 3), float(rank))
        gathered = distributed.tensor_model_parallel_all_gather(local, dim=0)
        expected = torch.cat([torch.full((2, 3), float(r)) for r in range(world_size)])
        torch.testing.assert_close(gathered, expected)
        gathered_last = distributed.tensor_model_parallel_all_gather(local)
        expected_last = torch.cat(
            [torch.full((2, 3), float(r)) for r in range(world_size)], dim=1
        )
        torch.testing.assert_close(gathered_last, expected_last)

        rows = [10, 50, 20, 40, 30, 7]
        items = make_items(rows, input_sizes=[4 * r for r in rows], seed=11)
        manager = make_manager(
            FakeEncoder(budget_range=(8, 64)), tp_size=world_size, tp_mode="data"
        )
        manager.capture()
        outputs = manager.execute(make_kwargs(items))
        for out, item in zip(outputs, items):
            torch.testing.assert_close(
                out, expected_item_output(item, ["default"], 0.5)
            )
    finally:
        dist.destroy_process_group()


def test_gloo_processes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    init_file = os.path.join(tmp_path, "dist_init")
    mp.spawn(_gloo_worker, args=(2, init_file), nprocs=2, join=True)
