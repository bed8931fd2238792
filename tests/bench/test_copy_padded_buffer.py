"""The manager's default replay copy, optimised for the host-overhead work of
the encoder benchmark, leaves every buffer exactly as vLLM 0.33.0's
``dst.zero_(); dst[:n].copy_(src)`` does, and fails where it fails."""

from __future__ import annotations

import pytest
import torch

from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager

copy_padded = EncoderCudaGraphManager._copy_padded_buffer


def vllm_copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.zero_()
    dst[: src.shape[0]].copy_(src)


def _outcome(fn, dst: torch.Tensor, src: torch.Tensor):
    try:
        fn(dst, src)
    except Exception as exc:  # noqa: BLE001 - the error itself is compared
        return type(exc), str(exc)
    return None


CASES = [
    # (dst shape, src shape, src dtype)
    ((16, 8), (5, 8), torch.float32),
    ((16, 8), (16, 8), torch.float32),  # exact fit
    ((16, 8), (0, 8), torch.float32),  # empty batch
    ((16, 8), (1, 8), torch.float32),
    ((16, 8), (5, 1), torch.float32),  # broadcast along dim 1
    ((16, 8), (16, 1), torch.float32),  # exact fit, broadcast
    ((16, 8), (5, 8), torch.float64),  # dtype conversion
    ((16, 8), (5, 8), torch.int64),
    ((16,), (7,), torch.float32),  # 1-D (cu_seqlens-like)
    ((16,), (16,), torch.float32),
    ((16, 3, 2, 2), (9, 3, 2, 2), torch.float32),  # patches-like
    ((16, 1, 4), (3, 1, 4), torch.float32),  # RoPE tables
    ((8, 4), (1,), torch.float32),  # 1-D into 2-D: broadcast over rows
    ((16, 8), (17, 8), torch.float32),  # too many rows: error
    ((16, 8), (5, 7), torch.float32),  # shape mismatch: error
    ((16,), (), torch.float32),  # 0-d source: error
    ((), (3,), torch.float32),  # 0-d buffer: error
]


@pytest.mark.parametrize("dst_shape,src_shape,src_dtype", CASES)
@pytest.mark.parametrize("inference", [False, True])
def test_same_buffer_and_errors_as_vllm(
    dst_shape: tuple[int, ...],
    src_shape: tuple[int, ...],
    src_dtype: torch.dtype,
    inference: bool,
) -> None:
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode(inference):
        base = torch.randn(dst_shape, generator=gen) + 3.0  # stale, non-zero
        src = (torch.randn(src_shape, generator=gen) * 10).to(src_dtype)
        expected, got = base.clone(), base.clone()
        expected_outcome = _outcome(vllm_copy, expected, src)
        got_outcome = _outcome(copy_padded, got, src)
    assert got_outcome == expected_outcome
    if expected_outcome is None:
        assert torch.equal(got, expected)


def test_non_contiguous_buffer() -> None:
    """A buffer that is a strided view (rows not adjacent in memory)."""
    storage = torch.randn(8, 32)
    expected_storage, got_storage = storage.clone(), storage.clone()
    src = torch.randn(3, 8)
    vllm_copy(expected_storage[:, ::4], src)
    copy_padded(got_storage[:, ::4], src)
    assert torch.equal(got_storage, expected_storage)


def test_repeated_replays_clear_stale_rows() -> None:
    """A large batch, then a small one: rows of the large one are gone."""
    dst = torch.zeros(10, 2)
    copy_padded(dst, torch.ones(9, 2))
    copy_padded(dst, torch.full((2, 2), 5.0))
    expected = torch.zeros(10, 2)
    expected[:2] = 5.0
    assert torch.equal(dst, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_same_as_vllm() -> None:
    for dst_shape, src_shape, src_dtype in CASES[:13]:
        base = torch.randn(dst_shape, device="cuda") + 3.0
        src = (torch.randn(src_shape, device="cuda") * 10).to(src_dtype)
        expected, got = base.clone(), base.clone()
        vllm_copy(expected, src)
        copy_padded(got, src)
        assert torch.equal(got, expected), (dst_shape, src_shape, src_dtype)
