"""Shared helpers of the tile and crop tower tests (InternVL, Step3-VL).

* Reference hosts built from any config (:func:`host_for_config`) and a
  runtime manager over them (:func:`manager_for`), for runs cheaper than the
  registry's ``tiny`` size.
* vLLM 0.33.0's own code, read from the wheel: its hand-written protocol
  methods as a mixin class (:func:`vllm_mixin`) and pure-Python helpers
  (:func:`class_methods`, :func:`module_functions`).

The wheel is opened with ``zipfile`` and the model file parsed with ``ast``
(never installed or imported). The named functions are compiled unchanged,
except that their imports of ``vllm.v1.worker.encoder_cudagraph_defs``
resolve to the project's mirror (``encoder_cudagraph_runtime.defs``, the same
classes field for field); any other vLLM import is refused, so a method that
needs more of vLLM fails to load rather than run against a stand-in. The
mixin class derives from the project's ``SupportsEncoderCudaGraph``, as
vLLM's model class does, so methods vLLM leaves out fall back to the
protocol's bodies.

A reference host with such a mixin mixed in runs vLLM's mixin code against
the reference tower: every attribute the mixin reads must exist there with
vLLM's meaning, or the run fails.

The wheel: ``$GEN_MIXIN_VLLM_WHEEL``, else ``~/.cache/gen-mixin/vllm-0.33.0-*.whl``;
without it the tests that need it skip.
"""

from __future__ import annotations

import __future__
import ast
import math
import os
import zipfile
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from encoder_cudagraph_runtime.interfaces import SupportsEncoderCudaGraph
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from reference_towers.registry import ReferenceTower

DEFS_MODULE = "vllm.v1.worker.encoder_cudagraph_defs"
MIRROR_MODULE = "encoder_cudagraph_runtime.defs"


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


def vllm_wheel_path() -> Path | None:
    env = os.environ.get("GEN_MIXIN_VLLM_WHEEL")
    if env:
        return Path(env)
    found = sorted((Path.home() / ".cache" / "gen-mixin").glob("vllm-0.33.0-*.whl"))
    return found[0] if found else None


def open_vllm_wheel() -> zipfile.ZipFile:
    """The wheel, or a skip when it is absent."""
    path = vllm_wheel_path()
    if path is None:
        pytest.skip(
            "vLLM 0.33.0 wheel not found: set GEN_MIXIN_VLLM_WHEEL or run "
            "`pip download vllm==0.33.0 --no-deps -d ~/.cache/gen-mixin`"
        )
    if not path.is_file():
        pytest.fail(f"GEN_MIXIN_VLLM_WHEEL={path} does not exist")
    return zipfile.ZipFile(path)


class _DefsImportsToMirror(ast.NodeTransformer):
    """Point ``from vllm.v1.worker.encoder_cudagraph_defs import ...`` at the
    mirror; refuse every other ``vllm`` import."""

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.ImportFrom:
        module = node.module or ""
        if module == DEFS_MODULE:
            return ast.copy_location(
                ast.ImportFrom(module=MIRROR_MODULE, names=node.names, level=0), node
            )
        if node.level or module.split(".")[0] == "vllm":
            raise LookupError(f"line {node.lineno}: no stand-in for {module!r}")
        return node

    def visit_Import(self, node: ast.Import) -> ast.Import:
        for alias in node.names:
            if alias.name.split(".")[0] == "vllm":
                raise LookupError(f"line {node.lineno}: no stand-in for {alias.name!r}")
        return node


def _definitions(
    body: Sequence[ast.stmt], names: Sequence[str], where: str
) -> list[ast.FunctionDef]:
    defs = {node.name: node for node in body if isinstance(node, ast.FunctionDef)}
    missing = [name for name in names if name not in defs]
    if missing:
        raise LookupError(f"{where} has no {', '.join(missing)}")
    return [defs[name] for name in names]


def _parse(wheel: zipfile.ZipFile, module_file: str) -> ast.Module:
    return ast.parse(wheel.read(module_file), filename=module_file)


def _compile(
    nodes: list[ast.FunctionDef], module_file: str, namespace: dict[str, Any]
) -> dict[str, Any]:
    """The functions ``nodes`` compiled into ``namespace`` (vLLM's own
    module globals stand-ins: ``torch``, ``math``, ...)."""
    module = ast.Module(body=nodes, type_ignores=[])
    module = ast.fix_missing_locations(_DefsImportsToMirror().visit(module))
    # Annotations stay unevaluated, as some name vLLM-only types.
    code = compile(
        module, f"<wheel>/{module_file}", "exec", __future__.annotations.compiler_flag
    )
    exec(code, namespace)
    return {node.name: namespace[node.name] for node in nodes}


def module_functions(
    wheel: zipfile.ZipFile,
    module_file: str,
    names: Sequence[str],
    namespace: dict[str, Any],
) -> dict[str, Any]:
    """vLLM's module-level functions ``names`` of ``module_file``, compiled
    with ``namespace`` as their globals."""
    nodes = _definitions(_parse(wheel, module_file).body, names, module_file)
    return _compile(nodes, module_file, dict(namespace))


def class_methods(
    wheel: zipfile.ZipFile, module_file: str, class_name: str, names: Sequence[str]
) -> dict[str, Any]:
    """The methods ``names`` of ``class_name`` in ``module_file``, as plain
    functions (decorators such as ``staticmethod`` applied)."""
    classes = [
        node
        for node in _parse(wheel, module_file).body
        if isinstance(node, ast.ClassDef) and node.name == class_name
    ]
    if len(classes) != 1:
        raise LookupError(f"{module_file} defines {len(classes)} {class_name} classes")
    nodes = _definitions(classes[0].body, names, class_name)
    # What the model files import at their top and the methods use.
    namespace: dict[str, Any] = {
        "math": math,
        "torch": torch,
        "Any": Any,
        "Hashable": Hashable,
    }
    return _compile(nodes, module_file, namespace)


def vllm_mixin(
    wheel: zipfile.ZipFile, module_file: str, class_name: str, names: Sequence[str]
) -> type:
    """A ``SupportsEncoderCudaGraph`` subclass whose methods ``names`` are
    vLLM's, compiled from ``module_file`` (a path inside the wheel)."""
    methods = class_methods(wheel, module_file, class_name, names)
    return type(f"Vllm{class_name}Mixin", (SupportsEncoderCudaGraph,), methods)
