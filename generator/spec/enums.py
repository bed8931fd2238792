"""The closed sets a spec chooses from, one Enum each.

Every member's value is its spelling in YAML; the JSON Schema, the docs
and the error messages list the values in declaration order.
"""

from __future__ import annotations

from enum import Enum


class SpecEnum(Enum):
    """An Enum whose values are the YAML spellings."""

    @classmethod
    def values(cls) -> list[str]:
        return [m.value for m in cls]


class Base(SpecEnum):
    PROTOCOL = "protocol"  # subclass SupportsEncoderCudaGraph, inherit its defaults
    NONE = "none"  # a plain mixin that defines every method


class DefsImport(SpecEnum):
    MODULE = "module"  # the protocol data classes at module top
    LOCAL = "local"  # inside each method, TYPE_CHECKING for the annotations


class Modality(SpecEnum):
    IMAGE = "image"
    VIDEO = "video"
    #: Kimi-K2.5's one modality for images and video chunks alike.
    VISION_CHUNK = "vision_chunk"


class BeyondKeys(SpecEnum):
    REFUSE = "refuse"  # every need within the bound, which some key covers
    EAGER = "eager"  # items no key covers run eagerly


class InputKind(SpecEnum):
    FLAT = "flat"  # every item's rows back to back
    GRID = "grid"  # one row of named dims per item
    COUNT = "count"  # one integer per item (a 1-D tensor or list)
    #: One ``(N, P, ...)`` tensor or a list of ``(P_i, ...)`` tensors: each
    #: item's size is read off its shape, replay stacks to the widest.
    PADDED = "padded"
    LIST = "list"  # per item a list of unit tensors, its length the item's units
    #: One tensor per item (a list of them, or one stacked tensor whose dim 0
    #: is the items): several dims bound off each item's own shape, replay
    #: stacks to the widest on every dim.
    TENSORS = "tensors"


class Rounding(SpecEnum):
    CEIL = "ceil"
    FLOOR = "floor"


class Fill(SpecEnum):
    ZEROS = "zeros"
    RANDN = "randn"
    ONES = "ones"  # an all-true mask (bool), every position valid
    PAD = "pad"  # a padded input's pad_value: a dummy of padding only


class PadRule(SpecEnum):
    TRAILING_SEQUENCE = "trailing_sequence"
    REPEAT_LAST = "repeat_last"
    #: FlashInfer's two-section ``cu_seqlens`` (Q/K/O offsets, then V
    #: offsets), laid out and padded by the builder: only by backend.
    FLASHINFER_SECTIONS = "flashinfer_sections"


class ReplayRule(SpecEnum):
    COPY = "copy"
    DROP = "drop"


class ImageLimitGuard(SpecEnum):
    CONFIG = "config"  # ValueError in get_encoder_cudagraph_config
    CAPTURE = "capture"  # RuntimeError at capture
    OFF = "off"


class Dtype(SpecEnum):
    """Dtypes a builder buffer may declare (``dtype``: the manager's)."""

    MANAGER = "dtype"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"
    UINT8 = "uint8"
    #: MoonViT's RoPE table ``rope_freqs_cis``: one complex number per
    #: (row, frequency).
    COMPLEX64 = "complex64"


class Backend(SpecEnum):
    """``AttentionBackendEnum`` members of vLLM 0.33.0 a guard may name."""

    FLASH_ATTN = "FLASH_ATTN"
    FLASH_ATTN_DIFFKV = "FLASH_ATTN_DIFFKV"
    TRITON_ATTN = "TRITON_ATTN"
    TRITON_ATTN_DIFFKV = "TRITON_ATTN_DIFFKV"
    TRITON_FLASH_ATTN = "TRITON_FLASH_ATTN"
    ROCM_ATTN = "ROCM_ATTN"
    ROCM_SEGMENTED_ATTN = "ROCM_SEGMENTED_ATTN"
    ROCM_AITER_MLA = "ROCM_AITER_MLA"
    ROCM_AITER_TRITON_MLA = "ROCM_AITER_TRITON_MLA"
    ROCM_AITER_FA = "ROCM_AITER_FA"
    ROCM_AITER_MLA_SPARSE = "ROCM_AITER_MLA_SPARSE"
    XPU_MLA_SPARSE = "XPU_MLA_SPARSE"
    TORCH_SDPA = "TORCH_SDPA"
    FLASHINFER = "FLASHINFER"
    TRITON_FLASHINFER = "TRITON_FLASHINFER"


#: Backend names as the old schema exported them (the vLLM import test
#: checks each against vLLM's enum).
BACKENDS = Backend.values()
