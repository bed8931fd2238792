"""vLLM 0.33.0's ``EncoderCudaGraphManager``, read from the wheel, against
the runtime's, on vLLM's own multi-path mixin (Step3-VL) and capture-axis
mixins (Gemma 4, MiniCPM-V): the same budgets per path, the same graphs
(per path, budget and axis keys), the same calls into the model for the same
batches, and the same results.

vLLM's manager runs on CPU as ``parity_testlib.vllm_cpu_manager_class``
builds it: only its CUDA graph capture is replaced.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import parity_hosts as hosts
from encoder_cudagraph_runtime.config import CompilationConfig, VllmConfig
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from parity_hosts import CPU
from parity_testlib import vllm_cpu_manager_class


@pytest.fixture(scope="module")
def vllm_manager_class() -> type:
    return vllm_cpu_manager_class()


class _Log:
    """The model calls a manager makes, in order (item specs left out: the
    runtime's replay passes the item count it knows instead of asking)."""

    def __init__(self, host) -> None:
        self.calls: list[tuple] = []
        for name in (
            "select_encoder_cudagraph_items",
            "prepare_encoder_cudagraph_capture_inputs",
            "prepare_encoder_cudagraph_replay_buffers",
            "encoder_eager_forward",
            "postprocess_encoder_output",
        ):
            setattr(host, name, self._wrap(name, getattr(host, name)))

    def _wrap(self, name, method):
        def call(*args, **kwargs):
            self.calls.append((name, _shown(args), _shown(kwargs)))
            return method(*args, **kwargs)

        return call


def _shown(value: Any) -> Any:
    """Call arguments as comparable values: tensors by shape, dicts by
    their keys, the ``dest`` mapping left out."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape))
    if isinstance(value, dict):
        if all(isinstance(k, int) for k in value):
            return "dest"
        return tuple(sorted((k, _shown(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_shown(v) for v in value)
    if isinstance(value, torch.device):
        return str(value)
    return value


def _config(budgets: list[int], items: int) -> VllmConfig:
    base = hosts.HostSettings().vllm_config()
    return VllmConfig(
        scheduler_config=base.scheduler_config,
        model_config=base.model_config,
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=budgets,
            encoder_cudagraph_max_vision_items_per_batch=items,
        ),
    )


def _both(vllm_manager_class, make_host, budgets, items):
    hosts_ = make_host(), make_host()
    logs = _Log(hosts_[0]), _Log(hosts_[1])
    config = _config(budgets, items)
    ours = EncoderCudaGraphManager(
        config, CPU, torch.float32, hosts_[1], graph_backend=EagerReplayGraphBackend()
    )
    theirs = vllm_manager_class(config, CPU, torch.float32, hosts_[0])
    return (theirs, ours), logs


def _graphs(manager) -> dict[str, dict]:
    """Per path: each graph's key and its input buffers' shapes."""
    return {
        path: {
            key: {k: tuple(v.shape) for k, v in meta.input_buffers.items()}
            for key, meta in graphs.items()
        }
        for path, graphs in manager.budget_graphs.items()
    }


def _step3_batches():
    gen = torch.Generator().manual_seed(3)
    mixes = [[(0,), (2,), (0,)], [(1,), (0,), (2,)], [(0,)], [(3,)]]
    return [hosts.step3_vl_batch(gen, "image", m) for m in mixes]


def _gemma4_batches():
    out = []
    for soft in (70, 140, 280):
        pixels, positions = hosts.gemma4_frames([(6, 6), (9, 9)], soft)
        out.append(
            {"pixel_values": list(pixels), "pixel_position_ids": list(positions)}
        )
    small, pos_small = hosts.gemma4_frames([(6, 6)], 70)
    wide, pos_wide = hosts.gemma4_frames([(12, 12)], 280)
    out.append(
        {
            "pixel_values": [small[0], wide[0], small[0]],
            "pixel_position_ids": [pos_small[0], pos_wide[0], pos_small[0]],
        }
    )
    return out


def _minicpmv_batches():
    one = hosts.minicpmv_image([(16, 16), (32, 20)])
    wide = hosts.minicpmv_image([(30, 60)])
    both = {
        "pixel_values": one["pixel_values"] + wide["pixel_values"],
        "tgt_sizes": one["tgt_sizes"] + wide["tgt_sizes"],
    }
    return [one, wide, both]


SCENARIOS = {
    "step3_vl": (
        hosts.step3_vl_host,
        _step3_batches,
        [([400], 2), ([300], 0), ([90], 1)],
    ),
    "gemma4": (hosts.gemma4_host, _gemma4_batches, [([700], 2), ([600], 1)]),
    "minicpmv": (hosts.minicpmv_host, _minicpmv_batches, [([512], 2), ([2048], 1)]),
}
CASES = [
    (name, budgets, items)
    for name, (_, _, ladders) in SCENARIOS.items()
    for budgets, items in ladders
]


@pytest.mark.parametrize(
    ("name", "budgets", "items"), CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES]
)
def test_the_runtime_manager_is_vllms(vllm_manager_class, name, budgets, items):
    make_host, make_batches, _ = SCENARIOS[name]
    (theirs, ours), (their_log, our_log) = _both(
        vllm_manager_class, make_host, budgets, items
    )
    assert ours.path_token_budgets == theirs.path_token_budgets
    assert (ours.token_budgets, ours.max_batch_size, ours.max_frames_per_batch) == (
        theirs.token_budgets,
        theirs.max_batch_size,
        theirs.max_frames_per_batch,
    )
    assert ours.get_num_graphs_to_capture() == theirs.get_num_graphs_to_capture()
    theirs.capture(None)
    ours.capture()
    assert _graphs(ours) == _graphs(theirs)
    assert our_log.calls == their_log.calls
    for batch in make_batches():
        their_log.calls.clear()
        our_log.calls.clear()
        expected = theirs.execute(batch)
        got = ours.execute(batch)
        assert our_log.calls == their_log.calls
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)
    assert (ours.graph_hits, ours.graph_misses) == (
        theirs.graph_hits,
        theirs.graph_misses,
    )


def test_a_selection_of_every_item_is_the_batch_itself(vllm_manager_class) -> None:
    """The generated selection of every item in order returns the batch's own
    tensors (vLLM's a copy of them). vLLM's manager only reads a selection:
    it asks for exactly that selection when one graph holds a batch whose
    items come in ascending size (it packs them smallest first), and the
    batch comes back unchanged with the same rows as vLLM's mixin gives."""
    model = hosts.parity("minimax_m3")
    grids = [(1, 2, 2), (1, 2, 6), (1, 4, 4)]
    batch = model.make_batch(torch.Generator().manual_seed(1), "image", grids)
    pixels = batch["pixel_values"].clone()
    results, aliased = [], []
    for host in model.hosts():
        select = host.select_encoder_cudagraph_items

        def logged(mm_kwargs, indices, select=select):
            picked = select(mm_kwargs, indices)
            aliased.append((indices, hosts.aliased_inputs(picked, mm_kwargs)))
            return picked

        host.select_encoder_cudagraph_items = logged
        manager = vllm_manager_class(_config([64], 4), CPU, torch.float32, host)
        manager.capture(None)
        results.append(manager.execute(batch))
        assert torch.equal(batch["pixel_values"], pixels)
    assert aliased == [([0, 1, 2], []), ([0, 1, 2], ["pixel_values"])]
    for theirs, ours in zip(*results, strict=True):
        assert torch.equal(theirs, ours)
