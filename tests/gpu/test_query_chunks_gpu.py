"""The query-chunked FlashAttention launch against the plain one, on a GPU.

Both run the same kernel (``aten._flash_attention_forward``; the chunked one
with ``seqused_k``), so every covered row must agree to bf16 rounding, in
eager mode and replayed from a CUDA graph captured for a larger, padded batch
(the shape that makes the plain launch mostly empty blocks). Rows no sequence
covers must be zero under capture and every value finite.
"""

from __future__ import annotations

import random

import pytest
import torch

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.varlen_attention import (
    VarlenAttentionMetadata,
    varlen_attention,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HEADS, HEAD_DIM = 4, 64
FLASH = AttentionBackendEnum.FLASH_ATTN


def padded_offsets(rng: random.Random, rows: int, slots: int) -> list[int]:
    """``slots + 1`` offsets: a few real sequences (some longer than a chunk,
    some empty), then repeats of the last one, as a replay pads them."""
    offsets = [0]
    for _ in range(rng.randint(1, slots)):
        length = rng.choice([0, 1, 64, 127, 128, 129, 256, 777])
        if offsets[-1] + length > rows:
            break
        offsets.append(offsets[-1] + length)
    return offsets + [offsets[-1]] * (slots + 1 - len(offsets))


def plain(q, k, v, offsets: torch.Tensor, max_seqlen: int, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setenv("GEN_MIXIN_QUERY_CHUNKS", "0")
        return varlen_attention(q, k, v, offsets, max_seqlen, backend=FLASH)


@pytest.mark.parametrize("seed", range(6))
def test_chunked_launch_matches_plain_launch_eager(seed: int, monkeypatch) -> None:
    rng = random.Random(seed)
    rows, slots = 4096, 64
    offsets = torch.tensor(padded_offsets(rng, rows, slots), dtype=torch.int32)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (
        torch.randn(
            rows, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen
        )
        for _ in "qkv"
    )
    cu = offsets.cuda()
    meta = VarlenAttentionMetadata(cu, rows)
    assert meta.query_chunks(rows) is not None  # this shape takes the chunked path
    out = varlen_attention(q, k, v, meta, backend=FLASH)
    ref = plain(q, k, v, cu, rows, monkeypatch)
    used = int(offsets[-1])
    assert torch.isfinite(out[:used]).all()
    torch.testing.assert_close(out[:used], ref[:used], atol=2e-2, rtol=2e-2)


def test_chunked_launch_in_a_cuda_graph(monkeypatch) -> None:
    """Capture at a padded shape, replay three different batches."""
    rows, slots = 2048, 32
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(
            rows, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen
        )
        for _ in "qkv"
    )
    cu = torch.tensor([0] + [rows] * slots, dtype=torch.int32, device="cuda")

    def forward() -> torch.Tensor:
        # A fresh metadata per forward, as the towers build it.
        meta = VarlenAttentionMetadata(cu, rows)
        return varlen_attention(q, k, v, meta, backend=FLASH)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward()
    rng = random.Random(1)
    for _ in range(3):
        offsets = padded_offsets(rng, rows - 100, slots)
        cu.copy_(torch.tensor(offsets, dtype=torch.int32))
        for t in (q, k, v):
            t.normal_(generator=gen)
        graph.replay()
        torch.cuda.synchronize()
        used = offsets[-1]
        ref = plain(q, k, v, cu, rows, monkeypatch)
        assert torch.isfinite(out).all()
        assert (out[used:] == 0).all()
        torch.testing.assert_close(out[:used], ref[:used], atol=2e-2, rtol=2e-2)
