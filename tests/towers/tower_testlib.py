"""Shared helpers of the reference-tower tests.

* :class:`PlainMixin`, the stand-in for a generated mixin.
* Reference hosts built from any config (:func:`host_for_config`) and a
  runtime manager over them (:func:`manager_for`), for runs cheaper than the
  registry's ``tiny`` size.
* :class:`HostSyncRecorder`, which watches a stretch of model code for what
  would make the host wait for the device (host reads of device tensors,
  host-to-device copies that do not go through ``async_tensor_h2d``), and
  :func:`shapes_only_attention`, the varlen kernels' stand-in on the meta
  device.

vLLM's own code, read from the wheel, comes from ``towers_vllm_source``.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from encoder_cudagraph_runtime import host_transfer
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
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    graph_backend: Any = None,
) -> EncoderCudaGraphManager:
    """A captured manager over ``host``, with ``max_num_batched_tokens =
    max_model_len = max_tokens``: on the CPU with eager-replay graphs unless
    told otherwise."""
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
        torch.device(device),
        dtype,
        host,
        graph_backend=graph_backend or EagerReplayGraphBackend(),
    )
    manager.capture()
    return manager


# -- host synchronisation --------------------------------------------------------

# The project's packages (their modules' async_tensor_h2d is wrapped).
_PROJECT_PACKAGES = ("reference_towers", "generated", "encoder_cudagraph_runtime")

# Ops that read device data on the host (``.item()`` and its kin; output
# shapes that depend on the data). Named so that the failure says where; on
# the meta device every such op fails anyway, having no data to read.
_HOST_READ_OPS = frozenset(
    {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}
)


@dataclass(frozen=True)
class HostTransfer:
    """One host-to-device copy seen by a :class:`HostSyncRecorder`."""

    op: str
    non_blocking: bool
    staged: bool
    """Made inside ``async_tensor_h2d`` (pinned staging on a GPU machine)."""
    where: str
    """The code that asked for it (``dir/file.py:line``)."""

    @property
    def blocks(self) -> bool:
        """Whether the host would wait for the device queue here."""
        return not (self.staged and self.non_blocking)


_TORCH_DIR = Path(torch.__file__).parent


def _caller() -> str:
    """``dir/file.py:line`` of the innermost frame outside torch, this module
    and ``host_transfer`` (the code that asked for the transfer)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename)
        if path.name == "host_transfer.py" or path == Path(__file__):
            continue
        if _TORCH_DIR in path.parents:
            continue
        return f"{'/'.join(path.parts[-2:])}:{frame.lineno}"
    return "?"


def _on_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type != "cpu"


def _copy_direction(func: Any, args: tuple, kwargs: dict) -> tuple[bool, bool, bool]:
    """``(host to device, device to host, non_blocking)`` of a copy op.

    ``.to()`` arrives as ``aten::_to_copy``, or as ``aten::to`` itself under
    inference mode; its target device may come from an ``other`` tensor.
    """
    names = [argument.name for argument in func._schema.arguments]
    bound = {**dict(zip(names, args)), **kwargs}
    non_blocking = bool(bound.get("non_blocking", False))
    if func._schema.name in ("aten::_to_copy", "aten::to"):
        src = bound["self"]
        other = bound.get("other")
        dst = torch.device(
            bound.get("device") or (other.device if other is not None else src.device)
        )
        pairs = [(torch.empty(0, device=dst), src)]
    elif func._schema.name in ("aten::copy_", "aten::_foreach_copy_"):
        dsts, srcs = tree_leaves(bound["self"]), tree_leaves(bound["src"])
        pairs = list(zip(dsts, srcs, strict=True))
    else:
        return False, False, False
    return (
        any(_on_device(d) and not _on_device(s) for d, s in pairs),
        any(_on_device(s) and not _on_device(d) for d, s in pairs),
        non_blocking,
    )


class HostSyncRecorder(TorchDispatchMode):
    """Inside ``with recorder:``, raises ``AssertionError`` on every host read
    of a device tensor (``.item()``, ``.tolist()``, ``.cpu()``, ops with
    data-dependent shapes) and records every host-to-device copy in
    :attr:`transfers`.

    On a CPU machine the meta device stands in for the GPU: it holds no data,
    so nothing can read it back. Tensors built from Python data on the device
    (``torch.tensor(..., device=...)``, a blocking copy) bypass the dispatcher
    and are caught by a wrapper; copies are ``staged`` when made inside
    ``async_tensor_h2d``, which is wrapped in every project module that
    imported it.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.transfers: list[HostTransfer] = []
        self._staging = 0
        self._active = False
        original = host_transfer.async_tensor_h2d
        staged = functools.wraps(original)(self._counting(original))
        for name, module in list(sys.modules.items()):
            ours = name.split(".")[0] in _PROJECT_PACKAGES
            if ours and vars(module).get("async_tensor_h2d") is original:
                monkeypatch.setattr(module, "async_tensor_h2d", staged)
        for factory in ("tensor", "as_tensor"):
            made = getattr(torch, factory)
            monkeypatch.setattr(torch, factory, self._watching(factory, made))

    @property
    def blocking(self) -> list[HostTransfer]:
        """The transfers that would make the host wait for the device."""
        return [t for t in self.transfers if t.blocks]

    def _counting(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def staged(*args: Any, **kwargs: Any) -> Any:
            self._staging += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._staging -= 1

        return staged

    def _watching(self, factory: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def made(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if self._active and _on_device(out):
                self._record(f"torch.{factory}", non_blocking=False)
            return out

        return made

    def _record(self, op: str, *, non_blocking: bool) -> None:
        self.transfers.append(
            HostTransfer(op, non_blocking, self._staging > 0, _caller())
        )

    def __enter__(self) -> Self:
        self._active = True
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._active = False
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        h2d, d2h, non_blocking = _copy_direction(func, args, kwargs)
        reads = d2h or (
            name in _HOST_READ_OPS
            and any(_on_device(t) for t in tree_leaves((args, kwargs)))
        )
        if reads:
            raise AssertionError(
                f"{name} reads a device tensor on the host at {_caller()}"
            )
        if h2d:
            self._record(name, non_blocking=non_blocking)
        return func(*args, **kwargs)


def shapes_only_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: Any,
    max_seqlen: Any = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Stands in for the runtime's varlen attention on the meta device (its
    kernels are checked on the GPU): the output's shape, no work."""
    return torch.zeros_like(q)
