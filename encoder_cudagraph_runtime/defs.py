"""Data classes of the encoder CUDA graph protocol (vLLM 0.33.0).

Mirrors ``vllm/v1/worker/encoder_cudagraph_defs.py`` field for field, so a
generated mixin can import these names from either place. The two
manager-internal types ``BudgetGraphMetadata`` and ``BudgetGraphMapKey``
(defined in vLLM's ``encoder_cudagraph.py``) live here too, so that the
standalone manager, the graph backends and the tests share one definition.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

import torch

if TYPE_CHECKING:
    from encoder_cudagraph_runtime.graph_backends import ReplayableGraph

EncoderCudaGraphPaddingLogic: TypeAlias = Callable[[torch.Tensor, torch.Tensor], None]
"""A replay copy override, called ``fn(dst, src)``.

``dst`` is the buffer recorded into the graph and must be written in place
(the graph only ever reads that storage); ``src`` is the value the model
computed for the current batch.
"""

ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG = "encoder_cudagraph_axis_keys"
"""Reserved key in the dict ``select_encoder_cudagraph_items`` returns.

Models with capture axes store the batch's resolved key per axis under it;
the manager removes it before the kwargs reach any other model method.
"""

CaptureAxisKeys: TypeAlias = tuple[Hashable, ...]
"""One key per capture axis, in ``capture_axes`` order (``()`` without axes)."""

BudgetGraphMapKey: TypeAlias = int | tuple[int, CaptureAxisKeys]
"""How a path's graphs are keyed: the bare budget without capture axes,
``(budget, axis_keys)`` with them."""


@dataclass
class EncoderItemSpec:
    """What the manager needs to know about one encoder item.

    An item is one image, one video or one crop group; the manager never
    looks at model inputs itself, only at these numbers.
    """

    input_size: int
    """Input rows (patches) of the item; used only to balance DP ranks."""

    output_tokens: int
    """Rows the item finally contributes to ``dest`` (after any merge).

    The manager sorts by it, hands it to postprocessing as
    ``per_item_out_tokens`` and sizes the DP gather with it.
    """

    path_output_tokens: dict[str, int] = field(default_factory=dict)
    """Graph rows per encoder path, for encoders with several paths.

    Left empty by single-path encoders, whose ``"default"`` path then uses
    ``output_tokens``. These counts drive packing and budget choice.
    """

    def get_path_output_tokens(self, path: str) -> int:
        """Rows this item occupies in ``path``'s graph (0: not on that path)."""
        if path == "default" and not self.path_output_tokens:
            return self.output_tokens
        return self.path_output_tokens.get(path, 0)


@dataclass(frozen=True)
class EncoderCudaGraphPathConfig:
    """How one independently replayable encoder path is captured."""

    min_token_budget: int | None = None
    """Smallest budget of this path; ``None`` reuses the global budgets.

    When set, the path's budgets are the doubling series from this value up
    to the largest global budget.
    """

    allow_zero_tokens: bool = False
    """Whether a batch may have no rows on this path (budget 0, never
    captured, path skipped)."""


def _default_paths() -> dict[str, EncoderCudaGraphPathConfig]:
    return {"default": EncoderCudaGraphPathConfig()}


@dataclass
class EncoderCudaGraphConfig:
    """Static description of a model's encoder graphs.

    Returned once by ``get_encoder_cudagraph_config()``; the manager treats
    it as fixed for its whole life.
    """

    modalities: list[str]
    """Modalities the manager handles (``[]`` turns graphs off)."""

    buffer_keys: list[str]
    """Names of the captured buffers. Informational: the 0.33.0 manager
    iterates the captured dict itself and never reads this list."""

    out_hidden_size: int
    """Width of the encoder output; sizes empty and padding rows of the DP
    gather."""

    padding_logics: dict[str, EncoderCudaGraphPaddingLogic] = field(
        default_factory=dict
    )
    """Per-buffer replay copy overrides. A key without one gets the default
    copy: zero the whole captured buffer, then write the value into its
    leading rows."""

    max_frames_per_video: int = 1
    """Frames per video; only matters when ``"video"`` is a modality. It
    scales the automatic ``max_frames_per_batch``."""

    paths: dict[str, EncoderCudaGraphPathConfig] = field(default_factory=_default_paths)
    """Encoder paths by the name passed as ``path=`` to the model."""

    capture_axes: tuple[tuple[Hashable, ...], ...] = ()
    """Extra dimensions of the graph grid besides the token budget.

    Each entry lists one axis' keys in order. One graph is captured per
    budget and per combination of keys, i.e. ``num_budgets * prod(len(axis))``
    graphs; ``()`` disables the feature.
    """


@dataclass
class EncoderCudaGraphCaptureInputs:
    """The buffers one capture records, from
    ``prepare_encoder_cudagraph_capture_inputs()``."""

    values: dict[str, torch.Tensor]
    """Every tensor the captured forward reads. The manager keeps these very
    objects and writes each replay's data into them: a graph only knows the
    addresses it was recorded with."""


@dataclass
class EncoderCudaGraphReplayBuffers:
    """Per-batch values for the captured buffers, from
    ``prepare_encoder_cudagraph_replay_buffers()``."""

    values: dict[str, torch.Tensor | None]
    """Real (unpadded, unless the model pads itself) data per buffer key;
    ``None`` or an absent key leaves that captured buffer untouched."""


@dataclass
class BudgetGraphMetadata:
    """One captured graph and the tensors it is bound to.

    Replay is: write the batch into ``input_buffers`` in place, replay
    ``graph``, read ``output_buffer`` (full budget size; rows past the batch
    are padding).
    """

    token_budget: int
    max_batch_size: int
    """Items per batch the capture inputs were sized for."""
    max_frames_per_batch: int
    """Video frames per batch the capture inputs were sized for."""
    graph: ReplayableGraph
    """A ``torch.cuda.CUDAGraph``, or whatever the manager's graph backend
    produces (anything with ``replay()``)."""
    input_buffers: dict[str, torch.Tensor]
    """The capture inputs' ``values`` dict, kept by identity."""
    output_buffer: torch.Tensor
    """Ordinary (non-pool) tensor the graph copies its output into."""
    axis_keys: CaptureAxisKeys = ()
    """The capture-axis combination of this graph (``()`` without axes)."""
