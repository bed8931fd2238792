"""Where the manager's graph operations happen.

vLLM's manager talks to ``torch.cuda`` directly. Here those few operations
(make a pool, capture one forward into it, replay, report memory, free
cached memory) sit behind :class:`GraphBackend`, so the exact same manager
code runs

* on a GPU with :class:`CudaGraphBackend` (the default): real CUDA graphs in
  one shared private memory pool, as in vLLM;
* anywhere with :class:`EagerReplayGraphBackend`: "capture" remembers the
  forward and the captured input dict, "replay" runs the forward again on
  those very buffers and copies the result into the output buffer. A replay
  therefore sees exactly what a real graph would read (the captured buffers
  after the manager's replay copy), which is what CPU tests need to check
  packing, padding and copy semantics.

A backend never decides anything about budgets or batching; it only turns
"run this forward on these buffers into this output buffer" into a
replayable object.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "CudaGraphBackend",
    "EagerReplayGraph",
    "EagerReplayGraphBackend",
    "EagerReplayPool",
    "GraphBackend",
    "MemoryCounters",
    "ReplayableGraph",
]

EncoderForward = Callable[[dict[str, torch.Tensor]], torch.Tensor]
"""``model.encoder_cudagraph_forward`` with the path already bound."""


@runtime_checkable
class ReplayableGraph(Protocol):
    """A captured graph: ``replay()`` recomputes ``output_buffer`` from the
    current contents of the captured input buffers."""

    def replay(self) -> None: ...


@dataclass(frozen=True)
class MemoryCounters:
    """Device memory of the caching allocator, in bytes."""

    reserved: int
    allocated: int


class GraphBackend(Protocol):
    """The graph operations the manager needs."""

    name: str

    def graph_pool_handle(self) -> Any:
        """A new memory pool token that several captures can share."""
        ...

    def capture_scope(self) -> contextlib.AbstractContextManager[None]:
        """Context for the warm-up run: puts it on the stream the capture
        will use, so lazily created per-stream state (cuBLAS workspaces,
        kernel caches) exists before capture instead of being created, and
        pinned, inside the graph pool."""
        ...

    def capture(
        self,
        forward: EncoderForward,
        inputs: dict[str, torch.Tensor],
        output_buffer: torch.Tensor,
        pool: Any,
    ) -> ReplayableGraph:
        """Record ``output_buffer.copy_(forward({**inputs}))`` into ``pool``.

        ``forward`` gets a fresh shallow copy of ``inputs`` (the model may pop
        from it); the tensors themselves are the captured buffers. Runs in
        inference mode.
        """
        ...

    def synchronize(self) -> None:
        """Wait until queued device work is done."""
        ...

    def memory_counters(self) -> MemoryCounters | None:
        """Allocator counters, or ``None`` where the backend has none."""
        ...

    def pool_bytes(self, pool: Any) -> int | None:
        """Bytes the allocator holds in ``pool``'s segments, if known."""
        ...

    def release_cached_memory(self) -> None:
        """Return unused cached device memory (after graphs were dropped)."""
        ...


# One side stream per device for captures requested on the legacy default
# stream (on which capture is illegal); shared so that every capture, and its
# warm-up, uses the same stream and per-stream state is created once.
_SIDE_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


class CudaGraphBackend:
    """Real CUDA graphs (``torch.cuda.CUDAGraph``) in a shared private pool.

    Warm-up and capture run on the caller's current stream when that is not
    the legacy default stream (vLLM captures on its own dedicated stream the
    same way). Capture on the default stream is illegal, so in that case both
    run on a side stream, ordered after the caller's prior work and before
    its later work. Every capture uses the same stream, which also keeps
    memory sharing inside the pool effective. Replay runs on whatever
    stream is current then.
    """

    name = "cuda"

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        self.device = None if device is None else torch.device(device)

    def graph_pool_handle(self) -> Any:
        return torch.cuda.graph_pool_handle()

    def _side_stream(self) -> torch.cuda.Stream | None:
        """The side stream to use, or ``None`` to stay on the current one."""
        current = torch.cuda.current_stream(self.device)
        if current != torch.cuda.default_stream(self.device):
            return None
        index = current.device_index
        stream = _SIDE_CAPTURE_STREAMS.get(index)
        if stream is None:
            stream = _SIDE_CAPTURE_STREAMS[index] = torch.cuda.Stream(device=index)
        return stream

    @contextlib.contextmanager
    def capture_scope(self) -> Iterator[None]:
        side = self._side_stream()
        if side is None:
            yield
            return
        current = torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        try:
            with torch.cuda.stream(side):
                yield
        finally:
            current.wait_stream(side)

    def capture(
        self,
        forward: EncoderForward,
        inputs: dict[str, torch.Tensor],
        output_buffer: torch.Tensor,
        pool: Any,
    ) -> ReplayableGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.device):
            side = self._side_stream()
            stream = side if side is not None else torch.cuda.current_stream()
            with (
                torch.inference_mode(),
                torch.cuda.graph(graph, pool=pool, stream=stream),
            ):
                output_buffer.copy_(forward({**inputs}))
        return graph

    def synchronize(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.device)

    def memory_counters(self) -> MemoryCounters | None:
        if not torch.cuda.is_available():
            return None
        return MemoryCounters(
            reserved=torch.cuda.memory_reserved(self.device),
            allocated=torch.cuda.memory_allocated(self.device),
        )

    def pool_bytes(self, pool: Any) -> int | None:
        if pool is None or not torch.cuda.is_available():
            return None
        try:
            segments = torch.cuda.memory_snapshot()
        except (RuntimeError, AttributeError):  # allocator without snapshots
            return None
        pool_id = tuple(pool)
        return sum(
            int(segment["total_size"])
            for segment in segments
            if tuple(segment.get("segment_pool_id", ())) == pool_id
        )

    def release_cached_memory(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()


class EagerReplayPool:
    """The eager backend's pool token; counts the graphs captured into it
    (without keeping them alive)."""

    def __init__(self) -> None:
        self.num_graphs = 0


class EagerReplayGraph:
    """A "graph" that re-runs its forward on the captured buffers."""

    def __init__(
        self,
        forward: EncoderForward,
        inputs: dict[str, torch.Tensor],
        output_buffer: torch.Tensor,
        pool: Any,
    ) -> None:
        self.forward = forward
        self.inputs = inputs
        self.output_buffer = output_buffer
        self.pool = pool
        self.num_replays = 0

    def replay(self) -> None:
        with torch.inference_mode():
            # A fresh dict per run, as at capture: the model may pop keys.
            self.output_buffer.copy_(self.forward({**self.inputs}))
        self.num_replays += 1


class EagerReplayGraphBackend:
    """Capture by remembering, replay by recomputing (CPU tests, debugging).

    Capture runs the forward once, like a real capture does, so a model sees
    the same number of forward calls (warm-up + capture) under both backends.
    """

    name = "eager-replay"

    def graph_pool_handle(self) -> EagerReplayPool:
        return EagerReplayPool()

    def capture_scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capture(
        self,
        forward: EncoderForward,
        inputs: dict[str, torch.Tensor],
        output_buffer: torch.Tensor,
        pool: Any,
    ) -> EagerReplayGraph:
        graph = EagerReplayGraph(forward, inputs, output_buffer, pool)
        with torch.inference_mode():
            output_buffer.copy_(forward({**inputs}))
        if isinstance(pool, EagerReplayPool):
            pool.num_graphs += 1
        return graph

    def synchronize(self) -> None:
        return None

    def memory_counters(self) -> MemoryCounters | None:
        return None

    def pool_bytes(self, pool: Any) -> int | None:
        return None

    def release_cached_memory(self) -> None:
        gc.collect()
