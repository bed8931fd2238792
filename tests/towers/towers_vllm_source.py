"""vLLM 0.33.0's own code, read from the wheel, to check the reference towers.

The wheel is opened with ``zipfile`` (never installed or imported): a test
asks for named top-level functions and constants of a module, or for named
methods of one of its classes, and gets them compiled into a namespace the
test supplies (``torch``, the runtime's stand-ins for what vLLM imports).

Imports inside the extracted functions:

* from ``vllm.v1.worker.encoder_cudagraph_defs``: resolve to the project's
  mirror, ``encoder_cudagraph_runtime.defs`` (the same classes field for
  field);
* from any other part of vLLM: dropped when the namespace supplies every
  name they bind, refused (``LookupError``) otherwise, so that a function
  needing more of vLLM fails to load rather than run without it.

Decorators other than ``classmethod``, ``staticmethod`` and
``cached_property`` are dropped (``register_op``, ``CustomOp.register``);
annotations stay unevaluated, as some name vLLM-only types.

:func:`vllm_mixin` gives vLLM's hand-written protocol methods of a model as
a mixin class; a reference host with it mixed in runs vLLM's mixin code
against the reference tower.

Where the wheel is: ``$GEN_MIXIN_VLLM_WHEEL``, else
``~/.cache/gen-mixin/vllm-0.33.0-*.whl``; the ``vllm_source`` fixture of
``conftest.py`` skips without it.
"""

from __future__ import annotations
import __future__

import ast
import copy
import functools
import os
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_KEPT_DECORATORS = {"classmethod", "staticmethod", "cached_property"}
DEFS_MODULE = "vllm.v1.worker.encoder_cudagraph_defs"
MIRROR_MODULE = "encoder_cudagraph_runtime.defs"


def wheel_path() -> Path | None:
    """The vLLM 0.33.0 wheel, or ``None`` when there is none."""
    env = os.environ.get("GEN_MIXIN_VLLM_WHEEL")
    if env:
        return Path(env)
    found = sorted((Path.home() / ".cache" / "gen-mixin").glob("vllm-0.33.0-*.whl"))
    return found[0] if found else None


class _ResolveVllmImports(ast.NodeTransformer):
    """vLLM's protocol types come from the mirror; any other vLLM import is
    dropped when ``namespace`` supplies what it binds, else refused."""

    def __init__(self, namespace: dict[str, Any], where: str) -> None:
        self._namespace = namespace
        self._where = where

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        module = node.module or ""
        if node.level == 0 and module == DEFS_MODULE:
            mirror = ast.ImportFrom(module=MIRROR_MODULE, names=node.names, level=0)
            return ast.copy_location(mirror, node)
        if node.level == 0 and module.split(".")[0] != "vllm":
            return node
        return self._supplied(node, [a.asname or a.name for a in node.names])

    def visit_Import(self, node: ast.Import) -> ast.AST:
        if all(a.name.split(".")[0] != "vllm" for a in node.names):
            return node
        return self._supplied(
            node, [a.asname or a.name.split(".")[0] for a in node.names]
        )

    def _supplied(self, node: ast.Import | ast.ImportFrom, bound: list[str]) -> ast.AST:
        missing = [name for name in bound if name not in self._namespace]
        if missing:
            raise LookupError(
                f"{self._where} line {node.lineno}: no stand-in for "
                f"{', '.join(missing)} ({ast.unparse(node)})"
            )
        return ast.copy_location(ast.Pass(), node)


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
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        if len(classes) != 1:
            raise LookupError(f"{path} defines {len(classes)} {cls} classes")
        return classes[0].body

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
        where = f"{path}::{cls}" if cls else path
        found: dict[str, Any] = {}
        for node in self._body(path, cls):
            if isinstance(node, ast.FunctionDef) and node.name in wanted:
                # A copy: the cached tree stays vLLM's for the next namespace.
                node = _ResolveVllmImports(namespace, where).visit(copy.deepcopy(node))
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
            flags = __future__.annotations.compiler_flag
            code = compile(module, f"<wheel>/{path}", "exec", flags)
            # vLLM's own code from the pinned wheel, run in the test namespace.
            exec(code, namespace)  # noqa: S102
            found[name] = namespace[name]
        missing = wanted - found.keys()
        if missing:
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


def vllm_mixin(
    source: VllmSource,
    path: str,
    cls: str,
    methods: Iterable[str],
    namespace: dict[str, Any] | None = None,
) -> type:
    """vLLM's hand-written protocol methods ``cls.methods`` of ``path`` as a
    ``SupportsEncoderCudaGraph`` subclass, as vLLM's model class derives from
    the protocol (methods vLLM leaves out fall back to the protocol's
    bodies); compiled into ``namespace`` (default :func:`runtime_namespace`)."""
    from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph

    if namespace is None:
        namespace = runtime_namespace()
    return source.make_class(
        f"Vllm{cls}Mixin", path, cls, methods, namespace, (SupportsEncoderCudaGraph,)
    )


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
    """Globals for vLLM code: torch, NumPy, ``math``, and this project's
    runtime stand-ins under vLLM's names."""
    import math
    from collections.abc import Hashable, Mapping, Sequence

    import numpy as np
    import torch
    import torch.nn.functional as F

    from encoder_cudagraph_runtime import defs
    from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
    from encoder_cudagraph_runtime.config import VllmConfig
    from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d

    return {
        "math": math,
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
