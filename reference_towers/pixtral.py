"""Pixtral (Mistral format) vision encoder, adapter and host, in plain PyTorch.

A faithful, unsharded re-implementation of vLLM 0.33.0's Mistral-format
Pixtral tower (``vllm/model_executor/models/pixtral.py``:
``VisionTransformer``, ``PatchMerger``, ``VisionLanguageAdapter``) and of the
vision half of ``PixtralForConditionalGeneration``. Each image is its own
``(3, H_i, W_i)`` tensor: a bias-free patch convolution per image → the
patches of all images in one sequence, ``ln_pre`` (RMSNorm) → pre-RMSNorm
blocks with a 2-D RoPE (complex, fp32) and per-image varlen attention,
SiLU-gated MLP → optional ``pre_mm_projector_norm`` (RMSNorm) → optional
``PatchMerger`` (each ``m×m`` window of an image's patch grid concatenated,
channel-major, one bias-free Linear back to the ViT width) →
``VisionLanguageAdapter`` (Linear → exact GELU → Linear to the text width)
→ split per image.

Host API (what a Pixtral mixin reads), with vLLM's names and meaning:

* host: ``config.{vision_config, text_config.hidden_size}``, ``vision_args``
  (vLLM's ``VisionEncoderArgs``: ``hidden_size``, ``num_channels``,
  ``image_size``, ``patch_size``, ``intermediate_size``,
  ``num_hidden_layers``, ``num_attention_heads``, ``rope_theta``,
  ``image_token_id``, ``adapter_bias``, ``spatial_merge_size``,
  ``add_pre_mm_projector_layer_norm``, ``mm_projector_id``),
  ``multimodal_config``, ``model_config.max_model_len``,
  ``vision_encoder``, ``pre_mm_projector_norm`` (``None`` unless the args
  ask for it), ``patch_merger`` (``None`` unless ``mm_projector_id`` is
  ``"patch_merge"``), ``vision_language_adapter``,
  ``_parse_and_validate_image_input(**kwargs)``,
  ``_process_image_input(image_input)`` (one tensor per image),
  ``embed_multimodal(**kwargs)``;
* ``vision_encoder``: ``args``, ``patch_conv`` (``(B, C, H, W)`` →
  ``(B, D, H / p, W / p)``), ``ln_pre``, ``transformer.layers[i]``
  (``layer(x, freqs_cis=, cu_seqlens=, max_seqlen=, sequence_lengths=)``
  on ``(1, N, D)``), ``transformer.layers[i].attention.attn.attn_backend``,
  ``freqs_cis`` (``(S, S, head_dim / 2, 2)`` fp32, the real view of the
  complex table, ``S = image_size / patch_size``), ``max_patches_per_side``,
  ``dtype``, ``device``, ``forward(images)`` → a tuple of ``(h·w, D)``;
* ``patch_merger``: ``spatial_merge_size``, ``merging_layer``,
  ``forward(x, image_sizes)`` (patch grids ``(h, w)``);
* ``vision_language_adapter``: ``w_in``, ``gelu``, ``w_out``
  (``w_out.output_size``: the text width).

The linear layers keep vLLM's calling conventions: the ``qkv_proj``,
``gate_up_proj``, ``down_proj`` and ``o_proj`` of the blocks return
``(output, bias)`` as vLLM's parallel linears do, the merger's and the
adapter's (``return_bias=False``) the output alone.

Two released shapes load through this class. ``full()`` is
Mistral-Small-3.1-24B's Mistral-format tower (``params.json``
``vision_encoder``), the one with every optional part: width 1024, 24
layers, 16 heads, MLP 4096, patch 14, ``image_size`` 1540, RoPE theta 1e4,
``spatial_merge_size`` 2, ``add_pre_mm_projector_layer_norm``,
``mm_projector_id`` ``"patch_merge"``, no adapter biases; text width 5120,
``max_model_len`` 131072 (128k context). ``pixtral_12b()`` is
Pixtral-12B-2409's: the same width, depth, heads and MLP, patch 16,
``image_size`` 1024, no merger, no norm, adapter biases (vLLM's default
``adapter_bias``), text width 5120 (Mistral NeMo). The processor is
mistral_common's ``ImageEncoder`` (``max_image_size``, the tower's
``image_size``; its resize rule is ``bench/image_traffic.py``'s
``pixtral_image_size``). The RMSNorm eps (1e-5),
exact GELU in the adapter and the SiLU-gated MLP are vLLM's code.

Deliberate differences from vLLM, none visible to a mixin:

* The RoPE table is computed on the CPU in fp32 and cached per device;
  vLLM computes it where ``arange`` puts it (the CPU) and moves it too.
* The patch convolution is PyTorch's ``Conv2d`` (vLLM's ``Conv2dLayer``
  runs the same convolution, or as a matmul on some platforms).
* Under FLASHINFER vLLM rewrites ``cu_seqlens`` for its kernel; the
  reference runtime has no FlashInfer, so the tower refuses that backend
  (as the runtime's varlen attention does).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import ModelConfig, MultiModalConfig
from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d
from reference_towers._layers import (
    ReleasedSizes,
    VarlenAttention,
    init_reference_weights_,
)

__all__ = [
    "PATCH_MERGE",
    "EncoderAttention",
    "PatchMerger",
    "PixtralConfig",
    "PixtralTextConfig",
    "PixtralVisionHost",
    "RMSNorm",
    "VisionEncoderArgs",
    "VisionLanguageAdapter",
    "VisionTransformer",
    "VllmLinear",
    "apply_rotary_emb_vit",
    "packed_sequence_metadata",
    "precompute_freqs_cis_2d",
    "window_rows",
]

#: ``mm_projector_id`` of a tower with a patch merger.
PATCH_MERGE = "patch_merge"

#: RMSNorm eps of ``ln_pre``, the blocks and ``pre_mm_projector_norm``.
RMS_NORM_EPS = 1e-5

#: Backends for which vLLM passes the longest sequence to the attention
#: (``MMEncoderAttention.compute_max_seqlen``); the others get 0.
_MAX_SEQLEN_BACKENDS = (
    AttentionBackendEnum.FLASH_ATTN,
    AttentionBackendEnum.ROCM_AITER_FA,
    AttentionBackendEnum.TRITON_ATTN,
)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionEncoderArgs:
    """vLLM's ``VisionEncoderArgs`` (the checkpoint's ``vision_encoder``)."""

    hidden_size: int = 1024
    num_channels: int = 3
    image_size: int = 1024
    patch_size: int = 16
    intermediate_size: int = 4096
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    rope_theta: float = 10000.0
    image_token_id: int = 10
    adapter_bias: bool = True
    spatial_merge_size: int = 1
    add_pre_mm_projector_layer_norm: bool = False
    mm_projector_id: str = ""

    def __post_init__(self) -> None:
        problems = [
            f"{f.name} must be positive, got {getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if f.type in ("int", "float") and getattr(self, f.name) <= 0
        ]
        if self.hidden_size % self.num_attention_heads:
            problems.append("hidden_size is not a multiple of num_attention_heads")
        elif self.head_dim % 4:
            # Half the frequencies rotate rows, half columns.
            problems.append("head dim must be a multiple of 4 (2-D RoPE)")
        if self.image_size % self.patch_size:
            problems.append("image_size is not a multiple of patch_size")
        if self.mm_projector_id not in ("", PATCH_MERGE):
            problems.append(f"unknown mm_projector_id {self.mm_projector_id!r}")
        if self.mm_projector_id != PATCH_MERGE and self.spatial_merge_size != 1:
            problems.append("spatial_merge_size > 1 needs the patch merger")
        if problems:
            raise ValueError("invalid VisionEncoderArgs: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class PixtralTextConfig:
    """The one text-config value the vision half reads."""

    hidden_size: int = 5120


@dataclass(frozen=True)
class PixtralConfig(ReleasedSizes):
    """The host's ``config`` (vLLM's: ``vision_config``, ``text_config``)
    plus the processor's ``max_image_size`` and the model length. Defaults
    are Pixtral-12B's (:meth:`pixtral_12b`, see the module docstring)."""

    vision_config: VisionEncoderArgs = field(default_factory=VisionEncoderArgs)
    text_config: PixtralTextConfig = field(default_factory=PixtralTextConfig)
    max_image_size: int = 1024
    """Processor: the longest side (pixels) an image is scaled down to."""
    max_model_len: int = 131072
    """``model_config.max_model_len`` of the host."""

    def __post_init__(self) -> None:
        vision = self.vision_config
        cell = vision.patch_size * vision.spatial_merge_size
        problems = []
        if self.max_image_size % cell:
            problems.append(
                f"max_image_size {self.max_image_size} is not a multiple of "
                f"patch_size x spatial_merge_size ({cell})"
            )
        if self.max_image_size > vision.image_size:
            problems.append("max_image_size exceeds the RoPE table's image_size")
        if min(self.text_config.hidden_size, self.max_model_len) <= 0:
            problems.append("text width and max_model_len must be positive")
        if problems:
            raise ValueError("invalid PixtralConfig: " + "; ".join(problems))

    @property
    def cell(self) -> int:
        """Pixels a side of one output token (``patch · merge``)."""
        return self.vision_config.patch_size * self.vision_config.spatial_merge_size

    @property
    def max_tokens_per_side(self) -> int:
        """Output tokens a side of the largest image the processor emits."""
        return self.max_image_size // self.cell

    @property
    def patch_size(self) -> int:
        return self.vision_config.patch_size

    @classmethod
    def tiny(cls) -> PixtralConfig:
        """A tower that runs in milliseconds on a CPU.

        Patch 14 and merge 2 stay at the released values (items are pixel
        sizes, and every size must agree on what an item costs); images up
        to 224 px a side: at most 8×8 output tokens (the driver's tiny cap
        of 64), 16×16 patches. Head dim 32 gives 8 RoPE frequencies per
        axis; a text width (96) distinct from the ViT width (64) and from
        4·64 catches swapped dimensions; the model length is the driver's
        tiny 512.
        """
        return cls(
            vision_config=VisionEncoderArgs(
                hidden_size=64,
                image_size=224,
                patch_size=14,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=2,
                adapter_bias=True,
                spatial_merge_size=2,
                add_pre_mm_projector_layer_norm=True,
                mm_projector_id=PATCH_MERGE,
            ),
            text_config=PixtralTextConfig(hidden_size=96),
            max_image_size=224,
            max_model_len=512,
        )

    @classmethod
    def full(cls) -> PixtralConfig:
        """Mistral-Small-3.1's Mistral-format tower (module docstring)."""
        return cls(
            vision_config=VisionEncoderArgs(
                image_size=1540,
                patch_size=14,
                adapter_bias=False,
                spatial_merge_size=2,
                add_pre_mm_projector_layer_norm=True,
                mm_projector_id=PATCH_MERGE,
            ),
            max_image_size=1540,
        )

    @classmethod
    def pixtral_12b(cls) -> PixtralConfig:
        """Pixtral-12B-2409's tower (module docstring): no merger, no norm."""
        return cls()


# ---------------------------------------------------------------------------
# RoPE and sequence metadata
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def precompute_freqs_cis_2d(
    dim: int, height: int, width: int, theta: float
) -> torch.Tensor:
    """vLLM's 2-D table, ``(height, width, dim / 2)`` complex64 on the CPU:
    with ``f_j = theta^(-2j / dim)``, entry ``(r, c)`` holds ``cis(r·f_j)``
    for the even ``j`` (first half), then ``cis(c·f_j)`` for the odd ``j``.
    Cached: never modify it."""
    with torch.device("cpu"):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
        rows = torch.outer(torch.arange(height), freqs[::2]).float()
        cols = torch.outer(torch.arange(width), freqs[1::2]).float()
        angles = torch.cat(
            [
                rows[:, None, :].expand(height, width, -1),
                cols[None, :, :].expand(height, width, -1),
            ],
            dim=-1,
        )
        return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb_vit(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's Pixtral RoPE on ``(batch, seq, heads, head_dim)``: adjacent
    dims ``(2i, 2i+1)`` form one complex number, multiplied in fp32 by
    ``freqs_cis`` (the real view ``(seq, head_dim / 2, 2)``, fp32), cast
    back to the input dtype."""
    if freqs_cis.dtype != torch.float32:
        raise TypeError(f"freqs_cis must be float32, got {freqs_cis.dtype}")
    if tuple(freqs_cis.shape) != (xq.shape[1], xq.shape[-1] // 2, 2):
        raise ValueError(
            f"rope table {tuple(freqs_cis.shape)} does not fit {tuple(xq.shape)}"
        )
    cis = torch.view_as_complex(freqs_cis)[None, :, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * cis).flatten(3).type_as(x)

    return rotate(xq), rotate(xk)


def packed_sequence_metadata(
    lengths: Sequence[int],
    attn_backend: AttentionBackendEnum,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor, None]:
    """``(cu_seqlens, max_seqlen, sequence_lengths)`` as vLLM's
    ``_make_packed_sequence_metadata`` builds them for one sequence per
    image: int32 offsets on ``device``; the longest sequence as a 0-dim
    int32 CPU tensor for the backends that read it, else 0; no
    ``sequence_lengths`` (FlashInfer's, refused here)."""
    if attn_backend == AttentionBackendEnum.FLASHINFER:
        raise ValueError("the reference runtime has no FLASHINFER attention")
    offsets = np.concatenate(
        [np.zeros(1, np.int32), np.asarray(lengths, np.int32).cumsum(dtype=np.int32)]
    )
    longest = 0
    if attn_backend in _MAX_SEQLEN_BACKENDS and len(offsets) >= 2:
        longest = int(np.diff(offsets).max())
    max_seqlen = torch.tensor(longest, dtype=torch.int32)
    return async_tensor_h2d(offsets, device), max_seqlen, None


# ---------------------------------------------------------------------------
# Layers with vLLM's calling conventions
# ---------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """vLLM's RMSNorm: normalised in fp32, cast to the weight dtype, scaled,
    cast back to the input dtype."""

    def __init__(self, hidden_size: int, eps: float = RMS_NORM_EPS) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.empty(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float()
        normed = normed * torch.rsqrt(
            normed.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon
        )
        return (normed.to(self.weight.dtype) * self.weight).to(x.dtype)


class VllmLinear(nn.Linear):
    """An ``nn.Linear`` called as vLLM's linear layers are: ``(output,
    bias)`` (``None``: the bias was added) unless ``return_bias=False``;
    ``input_size`` / ``output_size`` as vLLM names them."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool,
        return_bias: bool = True,
    ) -> None:
        super().__init__(input_size, output_size, bias=bias)
        self.input_size = input_size
        self.output_size = output_size
        self.return_bias = return_bias

    def forward(  # type: ignore[override]
        self, x: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, None]:
        out = super().forward(x)
        return (out, None) if self.return_bias else out


class FeedForward(nn.Module):
    """``down_proj(silu(gate) · up)`` with ``gate_up_proj`` one Linear to
    ``2 · intermediate`` (gate first), no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = VllmLinear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = VllmLinear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        out, _ = self.down_proj(F.silu(gate) * up)
        return out


class EncoderAttention(VarlenAttention):
    """vLLM's ``MMEncoderAttention`` as the Pixtral blocks call it: ``q``,
    ``k``, ``v`` ``(batch, seq, heads, head_dim)``, the batch's rows packed
    into the sequences of ``cu_seqlens``."""

    def forward(  # type: ignore[override]
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
        sequence_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if sequence_lengths is not None:
            raise ValueError("sequence_lengths is FlashInfer's; not supported")
        batch, seq = q.shape[:2]

        def rows(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(batch * seq, self.num_heads, self.head_size)

        out = super().forward(rows(q), rows(k), rows(v), cu_seqlens, max_seqlen)
        return out.reshape(batch, seq, self.num_heads, self.head_size)


class Attention(nn.Module):
    """Bias-free fused QKV → 2-D RoPE → varlen attention → bias-free out."""

    def __init__(
        self, args: VisionEncoderArgs, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.args = args
        self.head_dim = args.head_dim
        self.n_heads = args.num_attention_heads
        width = args.hidden_size
        self.qkv_proj = VllmLinear(width, 3 * width, bias=False)
        self.o_proj = VllmLinear(width, width, bias=False)
        self.attn = EncoderAttention(self.n_heads, self.head_dim, attn_backend)

    def forward(
        self,
        x: torch.Tensor,
        freqs_cis: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
        sequence_lengths: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, patches, _ = x.shape
        qkv, _ = self.qkv_proj(x)
        q, k, v = (
            t.reshape(batch, patches, self.n_heads, self.head_dim)
            for t in qkv.chunk(3, dim=-1)
        )
        q, k = apply_rotary_emb_vit(q, k, freqs_cis)
        out = self.attn(q, k, v, cu_seqlens, max_seqlen, sequence_lengths)
        out, _ = self.o_proj(out.reshape(batch, patches, -1))
        return out


class TransformerBlock(nn.Module):
    """``h = x + attention(attention_norm(x))``; ``h + feed_forward(ffn_norm(h))``."""

    def __init__(
        self, args: VisionEncoderArgs, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.attention = Attention(args, attn_backend)
        self.feed_forward = FeedForward(args.hidden_size, args.intermediate_size)
        self.attention_norm = RMSNorm(args.hidden_size)
        self.ffn_norm = RMSNorm(args.hidden_size)

    def forward(
        self,
        x: torch.Tensor,
        freqs_cis: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
        sequence_lengths: torch.Tensor | None,
    ) -> torch.Tensor:
        h = x + self.attention(
            self.attention_norm(x),
            freqs_cis=freqs_cis,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            sequence_lengths=sequence_lengths,
        )
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(
        self, args: VisionEncoderArgs, attn_backend: AttentionBackendEnum
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerBlock(args, attn_backend) for _ in range(args.num_hidden_layers)
        )

    def forward(
        self,
        x: torch.Tensor,
        freqs_cis: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: torch.Tensor,
        sequence_lengths: torch.Tensor | None,
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(
                x,
                freqs_cis=freqs_cis,
                cu_seqlens=cu_seqlens,
                max_seqlen=max_seqlen,
                sequence_lengths=sequence_lengths,
            )
        return x


def position_meshgrid(grids: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``(Σ h·w, 2)`` int64 ``(row, column)`` of every patch, row-major per
    image, images in order."""
    parts = [
        torch.stack(
            torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), dim=-1
        ).reshape(-1, 2)
        for h, w in grids
    ]
    return torch.cat(parts) if parts else torch.zeros((0, 2), dtype=torch.int64)


class VisionTransformer(nn.Module):
    """Patch convolution per image → one sequence of every image's patches
    → ``ln_pre`` → blocks (attention within each image) → one ``(h·w, D)``
    tensor per image."""

    def __init__(
        self,
        args: VisionEncoderArgs,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.args = args
        self.patch_conv = nn.Conv2d(
            args.num_channels,
            args.hidden_size,
            kernel_size=args.patch_size,
            stride=args.patch_size,
            bias=False,
        )
        self.ln_pre = RMSNorm(args.hidden_size)
        self.transformer = Transformer(args, attn_backend)
        self._freqs_cis: dict[torch.device, torch.Tensor] = {}

    @property
    def max_patches_per_side(self) -> int:
        return self.args.image_size // self.args.patch_size

    @property
    def device(self) -> torch.device:
        return self.patch_conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_conv.weight.dtype

    @property
    def freqs_cis(self) -> torch.Tensor:
        """``(S, S, head_dim / 2, 2)`` fp32 on the tower's device: the real
        view of :func:`precompute_freqs_cis_2d`, copied there once."""
        table = self._freqs_cis.get(self.device)
        if table is None:
            side = self.max_patches_per_side
            complex_table = precompute_freqs_cis_2d(
                self.args.head_dim, side, side, self.args.rope_theta
            )
            table = torch.view_as_real(complex_table).to(self.device)
            self._freqs_cis[self.device] = table
        return table

    @property
    def attn_backend(self) -> AttentionBackendEnum:
        return self.transformer.layers[0].attention.attn.attn_backend

    def forward(self, images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``images``: ``(C, H_i, W_i)`` tensors (a list, or a stacked
        tensor). Returns ``(H_i·W_i / p², D)`` per image."""
        embeds = [
            self.patch_conv(image.unsqueeze(0).to(self.dtype)) for image in images
        ]
        grids = [tuple(e.shape[-2:]) for e in embeds]
        sizes = [h * w for h, w in grids]
        x = self.ln_pre(torch.cat([e.flatten(2).transpose(1, 2) for e in embeds], 1))
        positions = position_meshgrid(grids).to(self.device)
        freqs_cis = self.freqs_cis[positions[:, 0], positions[:, 1]]
        cu_seqlens, max_seqlen, sequence_lengths = packed_sequence_metadata(
            sizes, self.attn_backend, self.device
        )
        out = self.transformer(
            x,
            freqs_cis=freqs_cis,
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            sequence_lengths=sequence_lengths,
        )
        return torch.split(out.squeeze(0), sizes)


class PatchMerger(nn.Module):
    """Each ``m×m`` window of an image's patch grid, its rows concatenated
    channel-major (``d·m² + i·m + j``, as ``F.unfold`` lays them out),
    windows row-major per image → bias-free Linear ``D·m² → D``."""

    def __init__(self, vision_encoder_dim: int, spatial_merge_size: int) -> None:
        super().__init__()
        self.spatial_merge_size = spatial_merge_size
        self.mlp_input_dim = vision_encoder_dim * spatial_merge_size**2
        self.merging_layer = VllmLinear(
            self.mlp_input_dim, vision_encoder_dim, bias=False, return_bias=False
        )

    def forward(
        self, x: torch.Tensor, image_sizes: Sequence[tuple[int, int]]
    ) -> torch.Tensor:
        """``x`` ``(Σ h·w, D)``; ``image_sizes`` the ``(h, w)`` patch grids."""
        if sum(h * w for h, w in image_sizes) != x.shape[0]:
            raise ValueError(f"image_sizes {list(image_sizes)} do not cover {x.shape}")
        return self.merging_layer(self.permute(x, image_sizes))

    def permute(
        self, x: torch.Tensor, image_sizes: Sequence[tuple[int, int]]
    ) -> torch.Tensor:
        return window_rows(x, image_sizes, self.spatial_merge_size)


def window_rows(
    x: torch.Tensor, grids: Sequence[tuple[int, int]], merge: int
) -> torch.Tensor:
    """``(Σ h·w, D)`` patches of images of ``grids`` → one row per ``m×m``
    window, its patches channel-major (``d·m² + i·m + j``, as ``F.unfold``
    lays them out), windows row-major per image: ``(Σ h·w / m², D·m²)``."""
    d = x.shape[-1]
    parts = []
    for tokens, (h, w) in zip(x.split([h * w for h, w in grids]), grids, strict=True):
        grid = tokens.view(h, w, d).permute(2, 0, 1).unsqueeze(0)
        parts.append(F.unfold(grid, kernel_size=merge, stride=merge)[0].t())
    if not parts:
        return x.new_zeros((0, d * merge**2))
    return torch.cat(parts)


class VisionLanguageAdapter(nn.Module):
    """``w_out(gelu(w_in(x)))``, exact GELU, biases per ``adapter_bias``."""

    def __init__(self, args: VisionEncoderArgs, dim: int) -> None:
        super().__init__()
        bias = args.adapter_bias
        self.w_in = VllmLinear(args.hidden_size, dim, bias=bias, return_bias=False)
        self.gelu = nn.GELU()
        self.w_out = VllmLinear(dim, dim, bias=bias, return_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(self.gelu(self.w_in(x)))


# ---------------------------------------------------------------------------
# Host
# ---------------------------------------------------------------------------


class PixtralVisionHost(nn.Module):
    """The vision half of vLLM's ``PixtralForConditionalGeneration``.

    A generated mixin is mixed in after this class (see
    :mod:`reference_towers.registry`), so host-only methods carry a
    ``reference_``/``eager_reference_`` prefix that no mixin uses.
    """

    def __init__(
        self,
        config: PixtralConfig,
        *,
        multimodal_config: MultiModalConfig | None = None,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
    ) -> None:
        super().__init__()
        self.config = config
        self.multimodal_config = multimodal_config
        self.model_config = ModelConfig(
            max_model_len=config.max_model_len, multimodal_config=multimodal_config
        )
        args = self.vision_args = config.vision_config
        self.vision_encoder = VisionTransformer(args, attn_backend)
        self.pre_mm_projector_norm = (
            RMSNorm(args.hidden_size) if args.add_pre_mm_projector_layer_norm else None
        )
        self.patch_merger = (
            PatchMerger(args.hidden_size, args.spatial_merge_size)
            if args.mm_projector_id == PATCH_MERGE
            else None
        )
        self.vision_language_adapter = VisionLanguageAdapter(
            args, config.text_config.hidden_size
        )

    def _tower_modules(self) -> list[nn.Module]:
        parts = [self.pre_mm_projector_norm, self.patch_merger]
        return [self.vision_encoder, *(p for p in parts if p is not None)] + [
            self.vision_language_adapter
        ]

    def reference_init_weights(self, seed: int) -> None:
        """Seeded random values for every parameter (see
        :func:`init_reference_weights_`): encoder, pre-projector norm,
        merger, adapter, in that order."""
        generator = torch.Generator().manual_seed(seed)
        init_reference_weights_(
            self.vision_encoder,
            generator,
            residual_branch_outputs=("o_proj", "down_proj"),
            num_residual_branches=2 * self.vision_args.num_hidden_layers,
        )
        for module in self._tower_modules()[1:]:
            init_reference_weights_(
                module, generator, residual_branch_outputs=(), num_residual_branches=1
            )

    def reference_cast_tower(self, dtype: torch.dtype) -> None:
        for module in self._tower_modules():
            module.to(dtype=dtype)

    # -- vLLM's entry points -------------------------------------------------

    def _parse_and_validate_image_input(self, **kwargs: object) -> dict | None:
        images = kwargs.pop("images", None)
        if images is None:
            return None
        return {"type": "pixel_values", "images": images}

    def _process_image_input(
        self, image_input: Mapping[str, Any]
    ) -> tuple[torch.Tensor, ...]:
        """vLLM's semantics: the tower over every image at once, then the
        optional norm and merger over all features, the adapter, and a split
        per image."""
        images = image_input["images"]
        features = self.vision_encoder(images)
        sizes = [f.shape[0] for f in features]
        x = torch.cat(features)
        if self.pre_mm_projector_norm is not None:
            x = self.pre_mm_projector_norm(x)
        if self.patch_merger is not None:
            p = self.vision_args.patch_size
            grids = [(img.shape[1] // p, img.shape[2] // p) for img in images]
            sizes = [n // self.vision_args.spatial_merge_size**2 for n in sizes]
            x = self.patch_merger(x, image_sizes=grids)
        return torch.split(self.vision_language_adapter(x), sizes)

    def embed_multimodal(self, **kwargs: object) -> tuple[torch.Tensor, ...]:
        image_input = self._parse_and_validate_image_input(**kwargs)
        if image_input is None:
            return ()
        return self._process_image_input(image_input)

    @torch.no_grad()
    def eager_reference_outputs(
        self, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Ground truth: each image's ``(h·w / m², text)`` embeddings in item
        order, one ``_process_image_input`` call per image."""
        return [
            self._process_image_input({"images": [image]})[0]
            for image in mm_kwargs["images"]
        ]
