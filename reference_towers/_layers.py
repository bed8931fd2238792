"""Building blocks shared by the reference towers.

* :class:`VarlenAttention`: the attention core of the packed (varlen)
  towers. It owns the ``attn_backend`` attribute that generated mixins read
  in their guards (vLLM keeps it on ``MMEncoderAttention``), and forwards to
  :func:`encoder_cudagraph_runtime.varlen_attention.varlen_attention`, so the
  packed path is capturable exactly when vLLM's is.
* :class:`DenseAttention`: the same for towers that batch fixed-size tiles
  or crops (InternVL, Step3-VL): one full attention per batch row.
* :func:`activation`: the few activations the vision configs name.
* :func:`grid_rows`: item grids (lists or host tensors) as checked ints.
* :class:`ReleasedSizes`: ``for_size`` over a config's ``tiny`` / ``full``.
* :func:`init_reference_weights_`: deterministic random weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, Self

import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.varlen_attention import (
    VarlenAttentionMetadata,
    varlen_attention,
)

__all__ = [
    "DenseAttention",
    "ReleasedSizes",
    "VarlenAttention",
    "VarlenAttentionMetadata",
    "activation",
    "grid_rows",
    "init_reference_weights_",
]


class ReleasedSizes:
    """Base of the tower configs: :meth:`for_size` picks the ``tiny`` or
    ``full`` classmethod a config defines."""

    @classmethod
    def tiny(cls) -> Self:
        raise NotImplementedError

    @classmethod
    def full(cls) -> Self:
        raise NotImplementedError

    @classmethod
    def for_size(cls, size: Literal["tiny", "full"]) -> Self:
        if size == "tiny":
            return cls.tiny()
        if size == "full":
            return cls.full()
        raise ValueError(f"unknown size {size!r} (expected 'tiny' or 'full')")


def grid_rows(
    grids: Sequence[Sequence[int]] | torch.Tensor, width: int
) -> list[tuple[int, ...]]:
    """``grids`` (a list, or an ``(n, width)`` tensor read on the host) as
    tuples of ``width`` positive ints."""
    rows = grids.tolist() if isinstance(grids, torch.Tensor) else grids
    out = [tuple(int(v) for v in row) for row in rows]
    for row in out:
        if len(row) != width or min(row) < 1:
            raise ValueError(f"bad grid row {row}: expected {width} positive ints")
    return out


class VarlenAttention(nn.Module):
    """Bidirectional attention inside each packed sequence.

    ``q``, ``k``, ``v`` are ``(rows, heads, head_dim)``; sequence ``i`` owns
    rows ``cu_seqlens[i]:cu_seqlens[i + 1]``. With ``cu_seqlens=None`` the
    whole input is one sequence (a tower's dense per-image call); that is how
    vLLM's FlashAttention wrapper treats a dense batch of one, so the dense
    and packed paths run the same kernel. Packed towers pass the
    :class:`VarlenAttentionMetadata` they build once per forward in place of
    ``cu_seqlens`` (and no ``max_seqlen``).
    """

    def __init__(
        self, num_heads: int, head_size: int, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = head_size**-0.5
        self.attn_backend = attn_backend

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor | VarlenAttentionMetadata | None = None,
        max_seqlen: int | torch.Tensor | None = None,
    ) -> torch.Tensor:
        if isinstance(cu_seqlens, VarlenAttentionMetadata):
            if max_seqlen is not None:
                raise ValueError("max_seqlen comes from the metadata; pass None")
        elif cu_seqlens is None:
            if max_seqlen is not None:
                raise ValueError("max_seqlen without cu_seqlens")
            rows = q.shape[0]
            # [0, rows] made on q's device, as vLLM's wrapper does (an arange):
            # a tensor built from a list would be a blocking host-to-device
            # copy in every layer of every dense call.
            cu_seqlens = torch.arange(2, dtype=torch.int32, device=q.device) * rows
            max_seqlen = rows
        elif max_seqlen is None:
            raise ValueError("cu_seqlens without max_seqlen")
        return varlen_attention(
            q,
            k,
            v,
            cu_seqlens,
            max_seqlen,
            backend=self.attn_backend,
            scale=self.scale,
        )

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_size={self.head_size}, "
            f"attn_backend={self.attn_backend.name}"
        )


class DenseAttention(nn.Module):
    """Bidirectional attention over every row of each batch entry.

    ``q``, ``k``, ``v`` are ``(batch, rows, heads · head_dim)``, as vLLM's
    ``MMEncoderAttention`` takes them from a tile tower; the output has the
    same shape. Each batch entry (one tile or crop) attends only to itself,
    so a batch padded with extra entries leaves the real ones unchanged.
    Every vLLM backend computes this same softmax attention; here it is
    PyTorch's ``scaled_dot_product_attention`` whatever ``attn_backend``
    says (kept so that guards reading it find it): fixed shapes, no host
    reads, so the forward captures in a CUDA graph.
    """

    def __init__(
        self, num_heads: int, head_size: int, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = head_size**-0.5
        self.attn_backend = attn_backend

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        batch, rows, width = q.shape
        if width != self.num_heads * self.head_size:
            raise ValueError(
                f"q has width {width}, expected {self.num_heads} heads of "
                f"{self.head_size}"
            )

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(batch, -1, self.num_heads, self.head_size).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(q), heads(k), heads(v), scale=self.scale
        )
        return out.transpose(1, 2).reshape(batch, rows, width)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_size={self.head_size}, "
            f"attn_backend={self.attn_backend.name}"
        )


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # vLLM's get_act_fn("gelu") is the exact (erf) GELU.
    "gelu": F.gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "quick_gelu": _quick_gelu,
    "silu": F.silu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation a config calls ``name``."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r} (expected one of: "
            f"{', '.join(sorted(_ACTIVATIONS))})"
        ) from None


def init_reference_weights_(
    module: nn.Module,
    generator: torch.Generator,
    *,
    residual_branch_outputs: Iterable[str],
    num_residual_branches: int,
    gains: Iterable[str] = (),
    embeddings: Iterable[str] = (),
) -> None:
    """Fill ``module``'s weights with seeded random values, in place.

    The scheme keeps activations O(1) through any depth in bf16, which a
    fixed ``std=0.02`` does not: with narrow tiny towers it makes attention
    almost uniform (so RoPE mistakes would hardly show), and with wide ones it
    lets the residual stream drift.

    * Linear and convolution weights: ``N(0, 1 / fan_in)``, so every
      projection maps O(1) inputs to O(1) outputs whatever its width; the
      output projections of residual branches (names ending in one of
      ``residual_branch_outputs``) are further scaled by
      ``1 / sqrt(num_residual_branches)`` so that the residual stream stays
      O(1) after all blocks.
    * Biases: ``N(0, 0.02²)``, small but non-zero so that a dropped bias shows.
    * Norm weights ``1 + N(0, 0.05²)``, norm biases ``N(0, 0.02²)``; so are
      the bare parameters named by ``gains`` (name suffixes: layer scales).
    * Learned tables, ``N(0, 1)`` like the patch embeddings they are added
      to: ``nn.Embedding`` weights and the bare parameters named by
      ``embeddings`` (class tokens, position tables).
    * Other ``weight`` tables of two or more dims (learned position grids):
      ``N(0, 0.5²)``, comparable to the patch embeddings they are added to.

    Every parameter is overwritten, so ``module`` may come from
    ``to_empty()``. Values are drawn in the order of
    ``module.named_parameters()`` with ``generator`` (a CPU generator for CPU
    parameters), so the same seed always gives the same weights.
    """
    suffixes = tuple(residual_branch_outputs)
    gain_names, table_names = tuple(gains), tuple(embeddings)
    branch_scale = 1.0 / math.sqrt(max(num_residual_branches, 1))
    with torch.no_grad():
        for name, param in module.named_parameters():
            owner_name, _, kind = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            if (
                isinstance(owner, (nn.Linear, nn.Conv2d, nn.Conv3d))
                and kind == "weight"
            ):
                std = math.prod(param.shape[1:]) ** -0.5
                if owner_name.endswith(suffixes):
                    std *= branch_scale
                param.normal_(0.0, std, generator=generator)
            elif (kind == "weight" and param.dim() == 1) or name.endswith(gain_names):
                # RMSNorm / LayerNorm gains, layer scales.
                param.normal_(1.0, 0.05, generator=generator)
            elif isinstance(owner, nn.Embedding) or name.endswith(table_names):
                param.normal_(0.0, 1.0, generator=generator)
            elif kind == "weight" and param.dim() >= 2:
                param.normal_(0.0, 0.5, generator=generator)
            elif kind == "bias":
                param.normal_(0.0, 0.02, generator=generator)
            else:
                raise TypeError(
                    f"no initialisation rule for parameter {name!r} of "
                    f"{type(owner).__name__}"
                )
