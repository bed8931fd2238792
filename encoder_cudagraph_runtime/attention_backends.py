"""Attention backend names, as vLLM 0.33.0 spells them.

Generated mixins compare ``tower.attn_backend`` against these members in
their guards, so the member *names* must match
``vllm.v1.attention.backends.registry.AttentionBackendEnum``. The values are
only labels here: the standalone runtime has no backend classes to import.
"""

from enum import Enum


class AttentionBackendEnum(Enum):
    """The subset of vLLM's attention backends a vision tower can select."""

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
