"""vLLM 0.33.0's own code, read from the wheel, to check the reference towers.

The wheel is opened with ``zipfile`` (never installed or imported): a test
asks for named top-level functions and constants of a module, or for named
methods of one of its classes, and gets them compiled into a namespace the
test supplies (``torch``, the runtime's stand-ins for what vLLM imports).
Imports from ``vllm`` inside the extracted functions are dropped, so those
names must be in the namespace too. Decorators other than ``classmethod``,
``staticmethod`` and ``cached_property`` are dropped (``register_op``,
``CustomOp.register``).

Where the wheel is: ``$GEN_MIXIN_VLLM_WHEEL``, else
``~/.cache/gen-mixin/vllm-0.33.0-*.whl``; the ``vllm_source`` fixture of
``conftest.py`` skips without it.
"""

from __future__ import annotations

import ast
import functools
import os
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_KEPT_DECORATORS = {"classmethod", "staticmethod", "cached_property"}


def wheel_path() -> Path | None:
    """The vLLM 0.33.0 wheel, or ``None`` when there is none."""
    env = os.environ.get("GEN_MIXIN_VLLM_WHEEL")
    if env:
        return Path(env)
    found = sorted((Path.home() / ".cache" / "gen-mixin").glob("vllm-0.33.0-*.whl"))
    return found[0] if found else None


class _DropVllmImports(ast.NodeTransformer):
    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        if node.module and node.module.split(".")[0] == "vllm":
            return ast.Pass()
        return node


def _keep_decorator(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name in _KEPT_DECORATORS


class VllmSource:
    """Pieces of vLLM's source, compiled on demand."""

    def __init__(self, wheel: zipfile.ZipFile) -> None:
        self._wheel = wheel
        self._trees: dict[str, ast.Module] = {}

    def _tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self._wheel.read(path), filename=path)
        return self._trees[path]

    def _body(self, path: str, cls: str | None) -> list[ast.stmt]:
        body = self._tree(path).body
        if cls is None:
            return body
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                return node.body
        raise LookupError(f"{path} has no class {cls}")

    def load(
        self,
        path: str,
        names: Iterable[str],
        namespace: dict[str, Any],
        *,
        cls: str | None = None,
    ) -> dict[str, Any]:
        """Compile the named functions and assignments of ``path`` (or of its
        class ``cls``) into ``namespace``; returns them by name."""
        wanted = set(names)
        found: dict[str, Any] = {}
        for node in self._body(path, cls):
            if isinstance(node, ast.FunctionDef) and node.name in wanted:
                node = _DropVllmImports().visit(node)
                node.decorator_list = [
                    d for d in node.decorator_list if _keep_decorator(d)
                ]
                name = node.name
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in wanted
            ):
                name = node.targets[0].id
            else:
                continue
            module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
            # vLLM's own code from the pinned wheel, run in the test namespace.
            exec(compile(module, f"<wheel>/{path}", "exec"), namespace)  # noqa: S102
            found[name] = namespace[name]
        missing = wanted - found.keys()
        if missing:
            where = f"{path}::{cls}" if cls else path
            raise LookupError(f"{where} lacks {sorted(missing)}")
        return found

    def make_class(
        self,
        name: str,
        path: str,
        cls: str,
        methods: Iterable[str],
        namespace: dict[str, Any],
        bases: tuple[type, ...] = (),
    ) -> type:
        """A class holding vLLM's ``cls.methods`` of ``path``."""
        return type(name, bases, self.load(path, methods, namespace, cls=cls))


def bind(obj: Any, functions: dict[str, Callable[..., Any]]) -> Any:
    """Attach plain functions to ``obj`` as bound methods (for vLLM methods
    called on a stand-in of ``self``)."""
    for name, fn in functions.items():
        setattr(obj, name, fn.__get__(obj))
    return obj


class _LRUCache(dict):
    """Stands in for ``vllm.utils.cache.LRUCache`` (no eviction needed)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity


def runtime_namespace() -> dict[str, Any]:
    """Globals for vLLM code: torch, NumPy, and this project's runtime
    stand-ins under vLLM's names."""
    from collections.abc import Hashable, Mapping, Sequence

    import numpy as np
    import torch
    import torch.nn.functional as F

    from encoder_cudagraph_runtime import defs
    from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
    from encoder_cudagraph_runtime.config import VllmConfig
    from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d

    return {
        "torch": torch,
        "np": np,
        "F": F,
        "Any": Any,
        "Hashable": Hashable,
        "Mapping": Mapping,
        "Sequence": Sequence,
        "cached_property": functools.cached_property,
        "AttentionBackendEnum": AttentionBackendEnum,
        "VllmConfig": VllmConfig,
        "EncoderCudaGraphConfig": defs.EncoderCudaGraphConfig,
        "EncoderItemSpec": defs.EncoderItemSpec,
        "EncoderCudaGraphCaptureInputs": defs.EncoderCudaGraphCaptureInputs,
        "EncoderCudaGraphReplayBuffers": defs.EncoderCudaGraphReplayBuffers,
        "async_tensor_h2d": async_tensor_h2d,
        "LRUCache": _LRUCache,
        "PIN_MEMORY": False,
        "maybe_get_oot_by_class": lambda cls: cls,
    }


MM_ENCODER_ATTENTION = "vllm/model_executor/layers/attention/mm_encoder_attention.py"


def mm_encoder_attention(source: VllmSource, namespace: dict[str, Any]) -> type:
    """vLLM's ``MMEncoderAttention`` metadata class methods
    (``compute_max_seqlen``, ``maybe_compute_seq_lens``,
    ``maybe_recompute_cu_seqlens``) with the helpers they call, compiled
    into ``namespace`` (which also gets the class)."""
    source.load("vllm/utils/math_utils.py", ["round_up"], namespace)
    source.load(
        MM_ENCODER_ATTENTION,
        [
            "FLASHINFER_BATCH_BUCKETS",
            "FLASHINFER_MAX_SEQLEN_BUCKETS",
            "add_padding_to_seqlens",
            "bucket_flashinfer_max_seqlen",
        ],
        namespace,
    )
    cls = source.make_class(
        "MMEncoderAttention",
        MM_ENCODER_ATTENTION,
        "MMEncoderAttention",
        ["compute_max_seqlen", "maybe_compute_seq_lens", "maybe_recompute_cu_seqlens"],
        namespace,
    )
    namespace["MMEncoderAttention"] = cls
    return cls
