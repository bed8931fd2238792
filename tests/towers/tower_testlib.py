"""Shared helpers of the reference-tower tests.

* :class:`PlainMixin`, the stand-in for a generated mixin.
* Reference hosts built from any config (:func:`host_for_config`) and a
  runtime manager over them (:func:`manager_for`), for runs cheaper than the
  registry's ``tiny`` size.

vLLM's own code, read from the wheel, comes from ``towers_vllm_source``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from reference_towers.registry import ReferenceTower


class PlainMixin:
    """Stands in for a generated mixin: adds nothing."""


def host_for_config(
    tower: ReferenceTower[Any],
    config: Any,
    mixin: type = PlainMixin,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Any:
    """A CPU host of ``tower`` for ``config`` with ``mixin`` mixed in, built as
    ``ReferenceTower.build_host`` builds one for a size."""
    with torch.device("meta"):
        host = tower.host_class(mixin)(config)
    host.to_empty(device="cpu")
    host.reference_init_weights(seed)
    host.reference_cast_tower(dtype)
    host.eval()
    host.requires_grad_(False)
    return host


def manager_for(
    host: Any,
    max_tokens: int,
    *,
    token_budgets: Sequence[int] = (),
    max_items_per_batch: int = 0,
    max_frames_per_batch: int | None = None,
) -> EncoderCudaGraphManager:
    """A captured CPU manager (eager-replay graphs) over ``host``, with
    ``max_num_batched_tokens = max_model_len = max_tokens``."""
    vllm_config = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=max_tokens),
        model_config=ModelConfig(max_model_len=max_tokens),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=list(token_budgets),
            encoder_cudagraph_max_vision_items_per_batch=max_items_per_batch,
            encoder_cudagraph_max_frames_per_batch=max_frames_per_batch,
        ),
    )
    manager = EncoderCudaGraphManager(
        vllm_config,
        torch.device("cpu"),
        torch.float32,
        host,
        graph_backend=EagerReplayGraphBackend(),
    )
    manager.capture()
    return manager
