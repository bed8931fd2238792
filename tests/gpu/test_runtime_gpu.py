"""The manager on a real GPU: CUDA graph capture and replay of a toy varlen
encoder, compared with its eager forward.

Run with ``PYTHONPATH=. python -m pytest -m gpu tests/gpu``. The toy model
mirrors a generated mixin: packed rows, FlashAttention varlen attention,
``cu_seqlens`` padded at replay with one trailing sequence that covers the
padding rows (total rows registered at capture by ``data_ptr``), and a
host-side ``max_seqlen`` baked at capture as the captured total.
"""

from __future__ import annotations

import gc
from collections.abc import Hashable
from typing import Any

import pytest
import torch
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.defs import (
    EncoderCudaGraphCaptureInputs,
    EncoderCudaGraphConfig,
    EncoderCudaGraphReplayBuffers,
    EncoderItemSpec,
)
from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d
from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from encoder_cudagraph_runtime.varlen_attention import varlen_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

IN_DIM = 64
HEADS = 4
HEAD_DIM = 64
HIDDEN = HEADS * HEAD_DIM
OUT_DIM = 128
DTYPE = torch.bfloat16
MIN_BUDGET, MAX_BUDGET = 64, 4096


class ToyVarlenEncoder(nn.Module):
    """Linear -> packed self-attention per sequence -> residual -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Linear(IN_DIM, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj_out = nn.Linear(HIDDEN, OUT_DIM)

    def forward(
        self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: Any
    ) -> torch.Tensor:
        h = self.proj_in(x)
        q, k, v = self.qkv(h).view(-1, 3, HEADS, HEAD_DIM).unbind(1)
        attn = varlen_attention(
            q, k, v, cu_seqlens, max_seqlen, backend=AttentionBackendEnum.FLASH_ATTN
        )
        return self.proj_out(attn.reshape(-1, HIDDEN) + h)


class ToyVisionModel(SupportsEncoderCudaGraph):
    """A mixin-like host: ``mm_kwargs`` holds packed ``pixel_values`` and the
    host list ``seq_lens`` (rows per item)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.encoder = ToyVarlenEncoder().to(device=device, dtype=DTYPE).eval()
        self._total_rows: dict[int, int] = {}

    def _pad_cu_seqlens(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        total = self._total_rows.get(dst.data_ptr())
        if total is None:
            raise RuntimeError("cu_seqlens buffer was not registered at capture")
        dst.fill_(total)
        dst[: src.shape[0]].copy_(src)

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        return EncoderCudaGraphConfig(
            modalities=["image"],
            buffer_keys=["pixel_values", "cu_seqlens", "max_seqlen"],
            out_hidden_size=OUT_DIM,
            padding_logics={"cu_seqlens": self._pad_cu_seqlens},
        )

    def get_encoder_cudagraph_budget_range(self, vllm_config: Any) -> tuple[int, int]:
        return MIN_BUDGET, MAX_BUDGET

    def get_encoder_cudagraph_item_specs(
        self, mm_kwargs: dict[str, Any]
    ) -> list[EncoderItemSpec]:
        return [
            EncoderItemSpec(input_size=n, output_tokens=n)
            for n in mm_kwargs["seq_lens"]
        ]

    def select_encoder_cudagraph_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> dict[str, Any]:
        lens = mm_kwargs["seq_lens"]
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        pixels = mm_kwargs["pixel_values"]
        parts = [pixels[starts[i] : starts[i + 1]] for i in indices]
        return {
            "pixel_values": torch.cat(parts) if parts else pixels[:0],
            "seq_lens": [lens[i] for i in indices],
        }

    def prepare_encoder_cudagraph_capture_inputs(
        self,
        token_budget: int,
        max_batch_size: int,
        max_frames_per_batch: int,
        device: torch.device,
        dtype: torch.dtype,
        path: str = "default",
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        # max_batch_size real sequences + the trailing padding sequence.
        cu = torch.full(
            (max_batch_size + 2,), token_budget, dtype=torch.int32, device=device
        )
        cu[0] = 0
        self._total_rows[cu.data_ptr()] = token_budget
        return EncoderCudaGraphCaptureInputs(
            values={
                "pixel_values": torch.zeros(
                    token_budget, IN_DIM, dtype=dtype, device=device
                ),
                "cu_seqlens": cu,
                "max_seqlen": torch.tensor(token_budget, dtype=torch.int32),
            }
        )

    @staticmethod
    def _offsets(lens: list[int]) -> list[int]:
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + n)
        return offsets

    def prepare_encoder_cudagraph_replay_buffers(
        self,
        mm_kwargs: dict[str, Any],
        max_batch_size: int,
        max_frames_per_batch: int,
        path: str = "default",
    ) -> EncoderCudaGraphReplayBuffers:
        cu = async_tensor_h2d(
            self._offsets(mm_kwargs["seq_lens"]), device=self.device, dtype=torch.int32
        )
        return EncoderCudaGraphReplayBuffers(
            values={
                "pixel_values": mm_kwargs["pixel_values"],
                "cu_seqlens": cu,
                "max_seqlen": None,  # baked at capture as the captured total
            }
        )

    def encoder_cudagraph_forward(
        self, inputs: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        return self.encoder(
            inputs["pixel_values"], inputs["cu_seqlens"], inputs["max_seqlen"]
        )

    def encoder_eager_forward(
        self, mm_kwargs: dict[str, Any], path: str = "default"
    ) -> torch.Tensor:
        lens = mm_kwargs["seq_lens"]
        cu = torch.tensor(self._offsets(lens), dtype=torch.int32, device=self.device)
        return self.encoder(mm_kwargs["pixel_values"], cu, max(lens))


def make_config(budgets: list[int] | None = None, max_items: int = 0) -> VllmConfig:
    return VllmConfig(
        model_config=ModelConfig(multimodal_config=MultiModalConfig()),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=list(budgets or []),
            encoder_cudagraph_max_vision_items_per_batch=max_items,
        ),
    )


def make_batch(lens: list[int], seed: int, device: torch.device) -> dict[str, Any]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    pixels = torch.randn(sum(lens), IN_DIM, generator=gen).to(
        device=device, dtype=DTYPE
    )
    return {"pixel_values": pixels, "seq_lens": list(lens)}


def eager_reference(
    model: ToyVisionModel, kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    with torch.inference_mode():
        out = model.encoder_eager_forward(kwargs)
    offsets = ToyVisionModel._offsets(kwargs["seq_lens"])
    return [out[a:b].clone() for a, b in zip(offsets[:-1], offsets[1:])]


def assert_matches_eager(
    outputs: list[torch.Tensor], expected: list[torch.Tensor]
) -> None:
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.shape == want.shape
        assert torch.isfinite(got).all(), "non-finite values in graph output"
        torch.testing.assert_close(got.float(), want.float(), atol=5e-2, rtol=5e-2)
        assert (got.float() - want.float()).abs().mean().item() < 1e-2


def random_lens(gen: torch.Generator, max_items: int, max_len: int) -> list[int]:
    n = int(torch.randint(1, max_items + 1, (1,), generator=gen))
    return torch.randint(1, max_len + 1, (n,), generator=gen).tolist()


@pytest.fixture(scope="module")
def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="module")
def model(device: torch.device) -> ToyVisionModel:
    torch.manual_seed(0)
    return ToyVisionModel(device)


def test_capture_replay_matches_eager(
    model: ToyVisionModel, device: torch.device
) -> None:
    manager = EncoderCudaGraphManager(make_config(), device, DTYPE, model)
    assert manager.token_budgets == [64, 128, 256, 512, 1024, 2048, 4096]
    manager.capture()
    try:
        report = manager.get_capture_report()
        assert report is not None and report.num_graphs == 7
        assert report.pool_bytes is None or report.pool_bytes > 0
        gen = torch.Generator().manual_seed(1234)
        for seed in range(12):
            lens = random_lens(gen, max_items=10, max_len=700)
            if seed == 5:
                lens = lens + [MAX_BUDGET + 300]  # above every budget: eager
            kwargs = make_batch(lens, seed, device)
            outputs = manager.execute(kwargs)
            torch.cuda.synchronize()
            assert_matches_eager(outputs, eager_reference(model, kwargs))
        stats = manager.get_cumulative_stats()
        assert stats["graph_hits"] > 0 and stats["graph_misses"] >= 1
        assert manager.get_padding_stats()["rows_replayed"] > 0
    finally:
        manager.clear()


def test_capture_clear_cycles_do_not_grow_memory(
    model: ToyVisionModel, device: torch.device
) -> None:
    kwargs = make_batch([100, 300, 50], seed=7, device=device)
    expected = eager_reference(model, kwargs)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after_capture: list[tuple[int, int]] = []
    after_clear: list[tuple[int, int]] = []
    for _ in range(4):
        manager = EncoderCudaGraphManager(make_config(), device, DTYPE, model)
        manager.capture()
        torch.cuda.synchronize()
        after_capture.append(
            (torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
        )
        assert_matches_eager(manager.execute(kwargs), expected)
        manager.clear()
        del manager
        torch.cuda.synchronize()
        after_clear.append(
            (torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
        )

    slack = 2 << 20  # one small allocator segment, for tiny baselines

    def within(first: int, later: int) -> bool:
        return later <= first + max(0.05 * first, slack)

    for reserved, allocated in after_capture[1:]:
        assert within(after_capture[0][0], reserved), after_capture
        assert within(after_capture[0][1], allocated), after_capture
    for reserved, allocated in after_clear[1:]:
        assert within(after_clear[0][0], reserved), after_clear
        assert within(after_clear[0][1], allocated), after_clear
    # clear() really returned the pool: far below the captured footprint.
    assert after_clear[-1][0] < after_capture[-1][0]


def _poison_free_memory(device: torch.device, max_bytes: int = 8 << 30) -> None:
    """Fill memory the caching allocator will hand out next with NaN, in
    both its large-block and small-block (< 1 MiB) pools."""
    free, _ = torch.cuda.mem_get_info(device)
    budget = min(max_bytes, int(free * 0.5))
    blocks = []
    small = 512 << 10
    for _ in range(512):  # 256 MiB of small blocks
        blocks.append(torch.full((small // 4,), float("nan"), device=device))
    budget -= 256 << 20
    chunk = 256 << 20
    while budget >= chunk:
        blocks.append(torch.full((chunk // 4,), float("nan"), device=device))
        budget -= chunk
    torch.cuda.synchronize()
    del blocks  # cached, not released: the NaN stays in the free blocks


def test_poisoned_pool_small_batches_into_large_budgets(
    model: ToyVisionModel, device: torch.device
) -> None:
    manager = EncoderCudaGraphManager(
        make_config(budgets=[256, 1024, 4096], max_items=16), device, DTYPE, model
    )
    manager.capture()
    try:
        # Poison the shared graph pool: replay every graph on NaN input, so
        # each graph's intermediates (and output buffer) hold NaN.
        for meta in manager.budget_graphs["default"].values():
            meta.input_buffers["pixel_values"].fill_(float("nan"))
            meta.graph.replay()
        torch.cuda.synchronize()
        # And poison the allocator's free blocks for per-batch allocations.
        _poison_free_memory(device)

        # Hand-picked batches first (budgets [256, 1024, 4096]): 30 -> 256,
        # 82 -> 256, 220 -> 256, 740 -> 1024, 1200 -> 4096, 3 -> 256.
        batches = [[30], [5, 17, 60], [100, 120], [40, 700], [1200], [3]]
        gen = torch.Generator().manual_seed(99)
        batches += [random_lens(gen, max_items=4, max_len=400) for _ in range(6)]
        for seed, lens in enumerate(batches):
            kwargs = make_batch(lens, seed + 100, device)
            outputs = manager.execute(kwargs)
            torch.cuda.synchronize()
            assert_matches_eager(outputs, eager_reference(model, kwargs))
        used = manager.get_padding_stats()["paths"]["default"]["budgets"]
        # Small batches landed on big graphs (mostly padding rows).
        assert {256, 1024, 4096} <= set(used)
        # Every batch on 4096 has at most 1600 real rows (> 60 % padding).
        assert used[4096]["waste_fraction"] > 0.6
    finally:
        manager.clear()
        torch.cuda.empty_cache()
