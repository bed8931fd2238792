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
"""

from __future__ import annotations

import functools
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


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | torch.Tensor,
    *,
    backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    scale: float | None = None,
) -> torch.Tensor:
    """Bidirectional attention within each packed sequence.

    Args:
        q, k, v: ``(total_rows, heads, head_dim)``, same dtype and device.
        cu_seqlens: ``(num_seqs + 1,)`` int32 offsets on ``q``'s device,
            starting at 0 and non-decreasing.
        max_seqlen: upper bound of ``cu_seqlens[i + 1] - cu_seqlens[i]``; a
            host int or 0-dim CPU tensor.
        backend: see the module docstring.
        scale: softmax scale, ``head_dim ** -0.5`` when ``None``.

    Returns:
        ``(total_rows, heads, head_dim)``. Rows past ``cu_seqlens[-1]`` are
        zero on the SDPA path and under capture on the FlashAttention path.
    """
    if backend == AttentionBackendEnum.TORCH_SDPA:
        return _sdpa_per_sequence(q, k, v, cu_seqlens, scale)
    if backend not in _FLASH_BACKENDS:
        raise ValueError(
            f"the reference runtime has no {backend.name} varlen attention; "
            "use FLASH_ATTN or TORCH_SDPA"
        )
    flash_ok = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    if not flash_ok:
        return _sdpa_per_sequence(q, k, v, cu_seqlens, scale)
    max_len = _max_seqlen_as_int(max_seqlen)
    _, run = _flash_varlen_impl()
    cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.int()
    out = run(q.contiguous(), k.contiguous(), v.contiguous(), cu, max_len, scale)
    if torch.cuda.is_current_stream_capturing():
        # Zero what no sequence covers, inside the graph (see module docstring).
        rows = torch.arange(out.shape[0], device=out.device, dtype=cu.dtype)
        covered = (rows < cu[-1]).view(-1, 1, 1)
        out = torch.where(
            covered, out, torch.zeros((), dtype=out.dtype, device=out.device)
        )
    return out
