"""The query-chunk table of ``varlen_attention`` (CPU).

FlashAttention itself needs a GPU (``tests/gpu`` runs the chunked launch
against the plain one there). Here the table is checked two ways: against
a plain Python construction of the chunks, and by running attention the way
FlashAttention reads the table (rows ``cu_q[e]:cu_q[e + 1]`` attend to keys
``cu_k[e]:cu_k[e] + used_k[e]``) and comparing with per-sequence attention.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.varlen_attention import (
    QUERY_CHUNK_ROWS,
    VarlenAttentionMetadata,
    _QueryChunks,
    varlen_attention,
)


def expected_chunks(offsets: list[int], chunk: int) -> list[tuple[int, int, int, int]]:
    """(q_start, q_end, k_start, k_len) of every chunk, in row order."""
    out = []
    for start, end in zip(offsets[:-1], offsets[1:]):
        for q in range(start, end, chunk):
            out.append((q, min(q + chunk, end), start, end - start))
    return out


def table_entries(chunks: _QueryChunks) -> list[tuple[int, int, int, int]]:
    cu_q, cu_k, used = (
        chunks.cu_q.tolist(),
        chunks.cu_k.tolist(),
        chunks.used_k.tolist(),
    )
    return [
        (cu_q[e], cu_q[e + 1], cu_k[e], used[e])
        for e in range(len(used))
        if cu_q[e + 1] > cu_q[e]
    ]


def random_offsets(rng: random.Random, rows: int) -> list[int]:
    """Offsets from 0 with empty, short, chunk-sized and long sequences,
    possibly ending below ``rows`` and possibly padded with repeats."""
    offsets = [0]
    while offsets[-1] < rows and rng.random() < 0.9:
        length = rng.choice([0, 1, 7, 127, 128, 129, 300, rng.randint(1, rows)])
        offsets.append(min(rows, offsets[-1] + length))
    offsets += [offsets[-1]] * rng.randint(0, 4)
    if len(offsets) == 1:
        offsets.append(0)
    return offsets


@pytest.mark.parametrize("seed", range(40))
def test_table_lists_every_chunk_in_row_order(seed: int) -> None:
    rng = random.Random(seed)
    rows = rng.choice([1, 127, 128, 129, 700, 2048])
    chunk = rng.choice([1, 16, 128])
    offsets = random_offsets(rng, rows)
    table = _QueryChunks(torch.tensor(offsets, dtype=torch.int32), rows, chunk)
    assert table_entries(table) == expected_chunks(offsets, chunk)
    cu_q = table.cu_q.tolist()
    # FlashAttention reads cu_seqlens_q as offsets: non-decreasing, from the
    # first covered row to the last.
    assert cu_q == sorted(cu_q)
    assert cu_q[0] == offsets[0] and cu_q[-1] == offsets[-1]
    # The capacity bound holds for any offsets within `rows`.
    assert len(cu_q) - 1 == -(-rows // chunk) + len(offsets) - 1
    assert table.cu_q.dtype == table.cu_k.dtype == table.used_k.dtype == torch.int32


def attention_by_table(q, k, v, chunks: _QueryChunks) -> torch.Tensor:
    out = torch.zeros_like(q)
    cu_q, cu_k, used = (
        chunks.cu_q.tolist(),
        chunks.cu_k.tolist(),
        chunks.used_k.tolist(),
    )
    for e in range(len(used)):
        qs, qe, ks = cu_q[e], cu_q[e + 1], cu_k[e]
        if qe <= qs:
            continue
        o = F.scaled_dot_product_attention(
            q[qs:qe].transpose(0, 1),
            k[ks : ks + used[e]].transpose(0, 1),
            v[ks : ks + used[e]].transpose(0, 1),
        )
        out[qs:qe] = o.transpose(0, 1)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_chunked_attention_equals_per_sequence_attention(seed: int) -> None:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    rows = rng.choice([200, 513, 1000])
    offsets = random_offsets(rng, rows)
    q, k, v = (
        torch.randn(rows, 2, 16, generator=gen, dtype=torch.float64) for _ in "qkv"
    )
    cu = torch.tensor(offsets, dtype=torch.int32)
    chunks = _QueryChunks(cu, rows, 64)
    ref = varlen_attention(
        q, k, v, cu, max(rows, 1), backend=AttentionBackendEnum.TORCH_SDPA
    )
    torch.testing.assert_close(attention_by_table(q, k, v, chunks), ref)


def test_metadata_chunks_only_where_the_plain_grid_is_mostly_empty() -> None:
    # A capture-shaped batch: 65 offsets, one real sequence, max_seqlen the
    # whole buffer: the plain grid is 65 x 32 blocks for 32 blocks of rows.
    rows = 4096
    padded = torch.tensor([0, 1024] + [rows] * 64, dtype=torch.int32)
    meta = VarlenAttentionMetadata(padded, rows)
    # The decision is host arithmetic; CPU offsets are enough to check it.
    chunks = meta.query_chunks(rows)
    assert chunks is not None
    assert meta.query_chunks(rows) is chunks  # built once per forward
    assert table_entries(chunks) == expected_chunks(padded.tolist(), QUERY_CHUNK_ROWS)
    # An exact batch of equal images: the plain grid is the real work.
    exact = torch.tensor([0, 256, 512, 768, 1024], dtype=torch.int32)
    assert VarlenAttentionMetadata(exact, 256).query_chunks(1024) is None


def test_metadata_respects_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEN_MIXIN_QUERY_CHUNKS", "0")
    padded = torch.tensor([0, 1024] + [4096] * 64, dtype=torch.int32)
    assert VarlenAttentionMetadata(padded, 4096).query_chunks(4096) is None


def test_metadata_and_max_seqlen_are_exclusive() -> None:
    q = torch.zeros(4, 1, 8)
    meta = VarlenAttentionMetadata(torch.tensor([0, 4], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="max_seqlen comes from the metadata"):
        varlen_attention(q, q, q, meta, 4)
    with pytest.raises(ValueError, match="without max_seqlen"):
        varlen_attention(q, q, q, torch.tensor([0, 4], dtype=torch.int32))
