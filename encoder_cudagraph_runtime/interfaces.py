"""The ``SupportsEncoderCudaGraph`` protocol of vLLM 0.33.0.

A model opts into encoder CUDA graphs by implementing these methods (mixins
inherit from the protocol, so methods they leave out fall back to the bodies
below). The manager knows nothing about a model's inputs: everything
model-specific goes through these methods.

Defaults match vLLM: ``get_input_modality`` answers ``"image"``,
``postprocess_encoder_output`` scatters the ``"default"`` path's rows, and
every other method body is empty (it returns ``None``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from encoder_cudagraph_runtime.config import VllmConfig
    from encoder_cudagraph_runtime.defs import (
        EncoderCudaGraphCaptureInputs,
        EncoderCudaGraphConfig,
        EncoderCudaGraphReplayBuffers,
        EncoderItemSpec,
    )

__all__ = ["SupportsEncoderCudaGraph", "supports_encoder_cudagraph"]


@runtime_checkable
class SupportsEncoderCudaGraph(Protocol):
    """A model whose vision encoder can be captured and replayed in budgets.

    The manager calls these methods to size, fill and run graphs; the model
    keeps all knowledge of its input format, metadata and forward.
    """

    supports_encoder_cudagraph: ClassVar[Literal[True]] = True

    def get_encoder_cudagraph_config(self) -> EncoderCudaGraphConfig:
        """Static graph configuration; raise ``ValueError`` when the current
        setup cannot use graphs."""
        ...

    def get_input_modality(self, mm_kwargs: dict[str, Any]) -> str:
        """Modality of ``mm_kwargs``; image-only models need not override."""
        return "image"

    def get_max_frames_per_video(self) -> int:
        """Frames per video the model allows (a model helper; the manager
        reads ``EncoderCudaGraphConfig.max_frames_per_video`` instead)."""
        ...

    def get_encoder_cudagraph_budget_range(
        self, vllm_config: VllmConfig
    ) -> tuple[int, int]:
        """``(min_budget, max_budget)`` for automatic budgets.

        The minimum is roughly the smallest item's output rows, the maximum
        the largest batch worth a graph (typically bounded by
        ``max_num_batched_tokens``). Not called when the user set both the
        budgets and the items per batch.
        """
        ...

    def get_encoder_cudagraph_item_specs(
        self, mm_kwargs: dict[str, Any]
    ) -> list[EncoderItemSpec]:
        """One spec per item of ``mm_kwargs``, in item order."""
        ...

    def select_encoder_cudagraph_items(
        self, mm_kwargs: dict[str, Any], indices: list[int]
    ) -> dict[str, Any]:
        """The kwargs of the sub-batch made of ``indices`` (in that order).

        Must accept ``[]`` and return kwargs every other method accepts
        (DP re-selects from a selection). Models with capture axes also store
        the sub-batch's axis keys under ``ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG``.
        """
        ...

    def postprocess_encoder_output(
        self,
        outputs: dict[str, torch.Tensor],
        indices: list[int],
        per_item_out_tokens: list[int],
        dest: dict[int, torch.Tensor] | list[torch.Tensor | None],
        clone: bool = False,
        batch_mm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """Store each item's rows as ``dest[idx]``.

        ``outputs`` maps each path that had rows to its output (a padded
        graph buffer, or exact rows from the eager forward). The default
        slices the ``"default"`` output consecutively per item; models that
        merge or reshape features after the encoder override it.
        """
        from encoder_cudagraph_runtime.output_scatter import scatter_output_slices

        scatter_output_slices(
            outputs["default"], indices, per_item_out_tokens, dest, clone
        )

    def prepare_encoder_cudagraph_capture_inputs(
        self,
        token_budget: int,
        max_batch_size: int,
        max_frames_per_batch: int,
        device: torch.device,
        dtype: torch.dtype,
        path: str = "default",
        axis_keys: tuple[Hashable, ...] | None = None,
    ) -> EncoderCudaGraphCaptureInputs:
        """Allocate the buffers of one graph, big enough for any batch that
        fits ``token_budget`` rows and ``max_batch_size`` items.

        ``axis_keys`` holds the capture-axis combination (``()`` or ``None``
        without axes).
        """
        ...

    def prepare_encoder_cudagraph_replay_buffers(
        self,
        mm_kwargs: dict[str, Any],
        max_batch_size: int,
        max_frames_per_batch: int,
        path: str = "default",
    ) -> EncoderCudaGraphReplayBuffers:
        """The batch's real values for the captured buffers (no device to
        host reads: this runs on the replay hot path)."""
        ...

    def encoder_cudagraph_forward(
        self, inputs: dict[str, torch.Tensor], path: str = "default"
    ) -> torch.Tensor:
        """The forward that is captured: tensors in, one tensor out, no host
        decisions that depend on tensor values."""
        ...

    def encoder_eager_forward(
        self, mm_kwargs: dict[str, Any], path: str = "default"
    ) -> torch.Tensor:
        """Forward without graphs, for batches larger than every budget; its
        output has the graph layout but only the real rows."""
        ...


def supports_encoder_cudagraph(model: object) -> bool:
    """Whether ``model`` (an instance or a class) implements the protocol."""
    return isinstance(model, SupportsEncoderCudaGraph)
