"""Variable-length (packed) attention for the reference vision towers.

The contract is FlashAttention's varlen one: ``q``, ``k``, ``v`` are
``(total_rows, heads, head_dim)``; sequence ``i`` owns rows
``cu_seqlens[i]:cu_seqlens[i + 1]`` and attends only to itself
(bidirectional); ``max_seqlen`` bounds every sequence length and is read on
the host, so under CUDA graph capture its capture-time value is baked into
the kernel launch.

Backends, chosen with :class:`AttentionBackendEnum` as in vLLM:

* ``FLASH_ATTN`` (and ``ROCM_AITER_FA``): ``flash_attn.flash_attn_varlen_func``
  when flash-attn is importable, otherwise PyTorch's own FlashAttention varlen
  kernel (``torch.nn.attention.varlen.varlen_attn`` or
  ``aten._flash_attention_forward``). Both are capturable: they read
  ``cu_seqlens`` on the device only.
* ``TORCH_SDPA``: one ``scaled_dot_product_attention`` per sequence, reading
  ``cu_seqlens`` on the host (``.tolist()``), which is a device sync and cannot
  be captured. vLLM behaves the same, which is why the mixins' guards exist.

Inputs on the CPU, or in fp32 (FlashAttention needs fp16/bf16), always take
the per-sequence SDPA path.

While a CUDA graph is being captured the FlashAttention output rows past
``cu_seqlens[-1]`` are zeroed inside the graph, as vLLM 0.33.0's wrapper does
by allocating its output with ``torch.zeros`` during capture: rows that no
sequence covers would otherwise hold whatever an earlier graph left in the
shared memory pool (the NaN of vLLM PR #57136).

Query-chunked launches
----------------------
FlashAttention-2 launches ``ceil(max_seqlen / 128) x num_seqs x heads``
thread blocks. A graph captured for a token budget holds ``max_seqlen`` at
its capture value (the budget's whole row count, since one padding sequence
may span it) and ``cu_seqlens`` at ``max_batch_size + 2`` offsets, so a
replay launches tens of thousands of blocks of which a few hundred have rows
to work on; the rest start, read two offsets and leave, and on an H200 that
costs tens of microseconds per layer. (vLLM on Hopper runs FlashAttention-3,
whose varlen scheduler walks the real tiles only.)

When that grid is more than twice the real work,
:class:`VarlenAttentionMetadata` cuts every sequence into chunks of
:data:`QUERY_CHUNK_ROWS` query rows, each attending to all keys of its
sequence: ``cu_seqlens_q`` walks the chunks and ``cu_seqlens_k`` +
``seqused_k`` give each chunk its sequence's key range. The grid becomes
``ceil(rows / 128) + num_seqs`` blocks per head, the arithmetic per query
row is unchanged (same key order, same blocks), and the chunk table is
computed on the device from ``cu_seqlens`` once per forward, so it is
captured with the graph. ``GEN_MIXIN_QUERY_CHUNKS=0`` turns it off. It
runs on PyTorch's kernel only (``aten._flash_attention_forward`` takes
``seqused_k``); with the flash-attn package the plain launch is kept.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum

_FLASH_BACKENDS = (AttentionBackendEnum.FLASH_ATTN, AttentionBackendEnum.ROCM_AITER_FA)


def _max_seqlen_as_int(max_seqlen: int | torch.Tensor) -> int:
    if isinstance(max_seqlen, torch.Tensor):
        if max_seqlen.device.type != "cpu":
            raise ValueError(
                "max_seqlen must live on the host (a 0-dim CPU tensor or an "
                "int): FlashAttention reads it when the kernel is launched"
            )
        return int(max_seqlen.item())
    return int(max_seqlen)


@functools.cache
def _flash_varlen_impl() -> tuple[str, Callable[..., torch.Tensor]]:
    """The best available FlashAttention varlen kernel, resolved once."""
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]

        def run_flash_attn(q, k, v, cu, max_len, scale):
            return flash_attn_varlen_func(
                q, k, v, cu, cu, max_len, max_len, softmax_scale=scale
            )

        return "flash_attn", run_flash_attn
    except ImportError:
        pass
    try:
        from torch.nn.attention.varlen import varlen_attn

        def run_torch_varlen(q, k, v, cu, max_len, scale):
            # Positional form: the keyword set differs between torch releases,
            # and the default scale is head_dim ** -0.5 in all of them.
            if scale is None or scale == q.shape[-1] ** -0.5:
                return varlen_attn(q, k, v, cu, cu, max_len, max_len)
            return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale)

        return "torch.nn.attention.varlen", run_torch_varlen
    except ImportError:
        pass

    def run_aten_flash(q, k, v, cu, max_len, scale):
        out = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, False, False, scale=scale
        )
        return out[0]

    return "aten._flash_attention_forward", run_aten_flash


def flash_varlen_kernel_name() -> str:
    """Which FlashAttention varlen implementation FLASH_ATTN runs on."""
    return _flash_varlen_impl()[0]


def _sdpa_per_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None,
) -> torch.Tensor:
    # Host read of the offsets: a device sync, not capturable (as in vLLM).
    offsets = cu_seqlens.tolist()
    out = torch.zeros_like(q)
    for start, end in zip(offsets[:-1], offsets[1:]):
        if end <= start:
            continue
        # (rows, heads, dim) -> (1, heads, rows, dim) for SDPA.
        qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)
        out[start:end] = o.squeeze(0).transpose(0, 1)
    return out


#: Query rows per chunk of a query-chunked launch: FlashAttention-2's row
#: block for the head sizes of the reference towers, so a chunk is one block.
QUERY_CHUNK_ROWS = 128


def _query_chunking_enabled() -> bool:
    return os.environ.get("GEN_MIXIN_QUERY_CHUNKS", "1") != "0"


class _QueryChunks:
    """Device tables of a query-chunked launch (see the module docstring)."""

    __slots__ = ("cu_k", "cu_q", "used_k")

    def __init__(self, cu_seqlens: torch.Tensor, rows: int, chunk: int) -> None:
        cu = cu_seqlens
        num_seqs = cu.numel() - 1
        # Every sequence ends in at most one partial chunk.
        capacity = -(-rows // chunk) + num_seqs
        lengths = (cu[1:] - cu[:-1]).clamp(min=0)
        per_seq = (lengths + (chunk - 1)) // chunk
        ends = torch.cumsum(per_seq, 0)
        entry = torch.arange(capacity, device=cu.device, dtype=ends.dtype)
        seq = torch.searchsorted(ends, entry, right=True)
        valid = seq < num_seqs
        seq = seq.clamp(max=num_seqs - 1)
        first = ends[seq] - per_seq[seq]
        start = cu[seq] + (entry - first) * chunk
        # Chunks tile the covered rows in order; the spare entries are empty
        # and sit at the end of the covered rows.
        last = cu[-1:]
        q_start = torch.where(valid, start, last)
        self.cu_q = torch.cat([q_start, last]).to(torch.int32)
        zero = torch.zeros(1, dtype=cu.dtype, device=cu.device)
        k_start = torch.where(valid, cu[seq], zero)
        # cu_seqlens_k only gives each chunk's key offset (seqused_k gives the
        # length), so overlapping key ranges are fine; its last slot is unread.
        self.cu_k = torch.cat([k_start, zero]).to(torch.int32)
        self.used_k = torch.where(valid, lengths[seq], zero).to(torch.int32)


class VarlenAttentionMetadata:
    """``cu_seqlens`` and ``max_seqlen`` prepared once for every attention
    layer of one forward, as vLLM's attention metadata is.

    The query-chunk table (see the module docstring) and, under capture, the
    mask of rows no sequence covers are computed on the first layer that
    needs them and reused by the others; when built inside a capture, that
    first computation is captured too, so replays recompute them from the
    new ``cu_seqlens``. Build one per forward: the cached tables belong to
    the ``cu_seqlens`` values of that forward.
    """

    __slots__ = ("_chunks", "_covered", "cu_seqlens", "max_seqlen")

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: int | torch.Tensor):
        self.cu_seqlens = (
            cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.int()
        )
        self.max_seqlen = _max_seqlen_as_int(max_seqlen)
        self._chunks: dict[int, _QueryChunks | None] = {}
        self._covered: dict[int, torch.Tensor] = {}

    def query_chunks(self, rows: int) -> _QueryChunks | None:
        """The chunk table for ``rows`` query rows, or ``None`` when the
        plain launch is at most twice the real work (or chunking is off)."""
        if rows not in self._chunks:
            num_seqs = self.cu_seqlens.numel() - 1
            plain = -(-self.max_seqlen // QUERY_CHUNK_ROWS) * num_seqs
            chunked = -(-rows // QUERY_CHUNK_ROWS) + num_seqs
            use = (
                _query_chunking_enabled()
                and num_seqs > 0
                and plain > 2 * chunked
                and flash_varlen_kernel_name() != "flash_attn"
            )
            self._chunks[rows] = (
                _QueryChunks(self.cu_seqlens, rows, QUERY_CHUNK_ROWS) if use else None
            )
        return self._chunks[rows]

    def covered_rows(self, rows: int) -> torch.Tensor:
        """``(rows, 1, 1)`` bool: row ``i`` lies below ``cu_seqlens[-1]``."""
        if rows not in self._covered:
            index = torch.arange(rows, device=self.cu_seqlens.device)
            self._covered[rows] = (index < self.cu_seqlens[-1]).view(-1, 1, 1)
        return self._covered[rows]


def _run_query_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunks: _QueryChunks,
    max_seqlen: int,
    scale: float | None,
) -> torch.Tensor:
    out = torch.ops.aten._flash_attention_forward(
        q,
        k,
        v,
        chunks.cu_q,
        chunks.cu_k,
        QUERY_CHUNK_ROWS,
        max_seqlen,
        0.0,
        False,
        False,
        scale=scale,
        seqused_k=chunks.used_k,
    )
    return out[0]


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | VarlenAttentionMetadata,
    max_seqlen: int | torch.Tensor | None = None,
    *,
    backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    scale: float | None = None,
) -> torch.Tensor:
    """Bidirectional attention within each packed sequence.

    Args:
        q, k, v: ``(total_rows, heads, head_dim)``, same dtype and device.
        cu_seqlens: ``(num_seqs + 1,)`` int32 offsets on ``q``'s device,
            starting at 0 and non-decreasing; or the
            :class:`VarlenAttentionMetadata` of this forward (then
            ``max_seqlen`` is ``None``).
        max_seqlen: upper bound of ``cu_seqlens[i + 1] - cu_seqlens[i]``; a
            host int or 0-dim CPU tensor.
        backend: see the module docstring.
        scale: softmax scale, ``head_dim ** -0.5`` when ``None``.

    Returns:
        ``(total_rows, heads, head_dim)``. Rows past ``cu_seqlens[-1]`` are
        zero on the SDPA path and under capture on the FlashAttention path.
    """
    if isinstance(cu_seqlens, VarlenAttentionMetadata):
        if max_seqlen is not None:
            raise ValueError("max_seqlen comes from the metadata; pass None")
        metadata = cu_seqlens
    else:
        if max_seqlen is None:
            raise ValueError("cu_seqlens without max_seqlen")
        metadata = VarlenAttentionMetadata(cu_seqlens, max_seqlen)
    if backend == AttentionBackendEnum.TORCH_SDPA:
        return _sdpa_per_sequence(q, k, v, metadata.cu_seqlens, scale)
    if backend not in _FLASH_BACKENDS:
        raise ValueError(
            f"the reference runtime has no {backend.name} varlen attention; "
            "use FLASH_ATTN or TORCH_SDPA"
        )
    flash_ok = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    if not flash_ok:
        return _sdpa_per_sequence(q, k, v, metadata.cu_seqlens, scale)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    rows = q.shape[0]
    chunks = metadata.query_chunks(rows)
    if chunks is not None:
        out = _run_query_chunked(q, k, v, chunks, metadata.max_seqlen, scale)
    else:
        _, run = _flash_varlen_impl()
        out = run(q, k, v, metadata.cu_seqlens, metadata.max_seqlen, scale)
    if torch.cuda.is_current_stream_capturing():
        # Zero what no sequence covers, inside the graph (see module docstring).
        out = torch.where(
            metadata.covered_rows(rows),
            out,
            torch.zeros((), dtype=out.dtype, device=out.device),
        )
    return out
