"""vLLM 0.33.0's own code, read from its wheel, run on CPU next to the
generated vllm mixins: the machinery the parity tests share.

The wheel is opened with ``zipfile`` and never installed or imported. Code is
taken from it one top-level binding at a time (:class:`WheelCode`): asking
for ``vllm.x.y.name`` compiles just the statement that binds ``name`` in
``vllm/x/y.py``, after the names that statement needs, recursively, into a
namespace of that module. Classes are taken method by method
(:meth:`WheelCode.klass`): a mixin's protocol methods and the private helpers
they call, a tower's metadata builders. What cannot run on CPU (kernels,
learned layers, registries) is replaced by *stubs*, given per module name;
everything else is vLLM's own code.

Imports inside that code, and every import of a generated ``vllm`` module
(:func:`load_generated_vllm_module`), go through the namespace's own
``__import__``: ``vllm.*`` resolves through :class:`WheelCode`, other
packages are imported normally. ``sys.modules`` never sees a ``vllm`` module.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import contextlib
import dataclasses
import functools
import importlib
import logging
import re
import symtable
import types
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from encoder_cudagraph_runtime import attention_backends, defs, forward_context
from encoder_cudagraph_runtime.defs import BudgetGraphMetadata
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from generator.vllm_manifest import find_vllm_wheel
from reference_towers import lfm2_vl as lfm2_vl_inputs
from reference_towers import minicpmv as minicpmv_inputs

REPO = Path(__file__).resolve().parents[2]
GENERATED_VLLM = REPO / "generated" / "vllm"
_ANNOTATIONS = __future__.annotations.compiler_flag
_BUILTIN_NAMES = frozenset(dir(builtins))


class WheelCodeError(Exception):
    """vLLM code the parity host needs cannot be taken from the wheel as
    asked (a missing binding, or one that needs a stub)."""


# ---------------------------------------------------------------------------
# The wheel
# ---------------------------------------------------------------------------


@functools.cache
def _open_wheel(path: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(path)


def vllm_wheel() -> zipfile.ZipFile:
    """The vLLM 0.33.0 wheel, or skip the calling test with the reason."""
    path = find_vllm_wheel()
    if path is None:
        pytest.skip(
            "vLLM 0.33.0 wheel not found: set GEN_MIXIN_VLLM_WHEEL or run "
            "`pip download vllm==0.33.0 --no-deps -d ~/.cache/gen-mixin`"
        )
    if not path.is_file():
        pytest.fail(f"GEN_MIXIN_VLLM_WHEEL={path} does not exist")
    return _open_wheel(path)


def _module_file(wheel: zipfile.ZipFile, module: str) -> str | None:
    base = module.replace(".", "/")
    names = _wheel_names(wheel)
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if candidate in names:
            return candidate
    return None


@functools.cache
def _wheel_names(wheel: zipfile.ZipFile) -> frozenset[str]:
    return frozenset(wheel.namelist())


@functools.cache
def _module_tree(wheel: zipfile.ZipFile, path: str) -> ast.Module:
    return ast.parse(wheel.read(path), filename=path)


def _top_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level_statements(node.body)
            yield from _top_level_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody):
                yield from _top_level_statements(part)
            for handler in node.handlers:
                yield from _top_level_statements(handler.body)


def _bound_by(node: ast.stmt) -> set[str]:
    """The names a top-level statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = [node.target]
    return {
        n.id
        for t in targets
        for n in ast.walk(t)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def _free_globals(source: str) -> set[str]:
    """Global names that ``source`` (a statement or a definition) reads,
    in every nested scope; annotations are not evaluated."""
    table = symtable.symtable(
        "from __future__ import annotations\n" + source, "<parity>", "exec"
    )
    names: set[str] = set()
    top = table.get_symbols()
    assigned_at_top = {s.get_name() for s in top if s.is_assigned() or s.is_imported()}
    names.update(
        s.get_name()
        for s in top
        if s.is_referenced() and s.get_name() not in assigned_at_top
    )
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        if child.get_type() != "class":
            names.update(
                s.get_name()
                for s in child.get_symbols()
                if s.is_global() and not s.is_local()
            )
        else:
            names.update(
                s.get_name()
                for s in child.get_symbols()
                if s.is_referenced() and not (s.is_assigned() or s.is_local())
            )
        stack.extend(child.get_children())
    return {n for n in names if n not in _BUILTIN_NAMES and n != "annotations"}


# ---------------------------------------------------------------------------
# vLLM code, one binding at a time
# ---------------------------------------------------------------------------


class _WheelModule:
    """What ``import`` returns for a ``vllm`` module: attribute access takes
    the binding from the wheel (or its stub)."""

    def __init__(self, code: WheelCode, module: str) -> None:
        self._code = code
        self.__name__ = module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._code.get(self.__name__, name)


class WheelCode:
    """Namespaces of vLLM modules, filled from the wheel on demand.

    ``stubs`` maps a module name to the bindings that replace vLLM's there
    (``{"vllm.utils.torch_utils": {"PIN_MEMORY": False}}``); a stubbed
    module that the wheel does not have is allowed (its names come from the
    stub only).
    """

    def __init__(
        self,
        wheel: zipfile.ZipFile,
        stubs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.wheel = wheel
        self.stubs = {module: dict(names) for module, names in (stubs or {}).items()}
        self._namespaces: dict[str, dict[str, Any]] = {}
        self._resolving: set[tuple[str, str]] = set()

    # -- namespaces -------------------------------------------------------

    def namespace(self, module: str) -> dict[str, Any]:
        """The globals of code compiled for ``module``."""
        ns = self._namespaces.get(module)
        if ns is None:
            package = module if self._is_package(module) else module.rpartition(".")[0]
            ns = {
                "__name__": module,
                "__package__": package,
                "__builtins__": self.builtins_for(),
            }
            self._namespaces[module] = ns
        return ns

    def builtins_for(self) -> dict[str, Any]:
        """Builtins whose ``__import__`` resolves ``vllm.*`` through this
        object (never through ``sys.modules``)."""
        return {**builtins.__dict__, "__import__": self._import}

    def _is_package(self, module: str) -> bool:
        path = _module_file(self.wheel, module)
        return path is not None and path.endswith("__init__.py")

    def _import(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: Iterable[str] | None = (),
        level: int = 0,
    ) -> Any:
        if level:
            package = (globals or {}).get("__package__") or ""
            base = package.rsplit(".", level - 1)[0] if level > 1 else package
            name = f"{base}.{name}" if name else base
        if name.split(".")[0] != "vllm":
            return importlib.__import__(name, globals, locals, fromlist or (), 0)
        if not fromlist:
            raise WheelCodeError(f"`import {name}`: only `from vllm... import` works")
        return _WheelModule(self, name)

    # -- bindings ---------------------------------------------------------

    def get(self, module: str, name: str) -> Any:
        """``from module import name``, from the stubs or the wheel."""
        stub = self.stubs.get(module, {})
        if name in stub:
            return stub[name]
        ns = self.namespace(module)
        if name in ns:
            return ns[name]
        key = (module, name)
        if key in self._resolving:
            raise WheelCodeError(f"{module}.{name} needs itself")
        self._resolving.add(key)
        try:
            self._bind(module, name)
        finally:
            self._resolving.discard(key)
        return ns[name]

    def _bind(self, module: str, name: str) -> None:
        path = _module_file(self.wheel, module)
        if path is None:
            if self._is_module(f"{module}.{name}"):
                self.namespace(module)[name] = _WheelModule(self, f"{module}.{name}")
                return
            raise WheelCodeError(f"vLLM 0.33.0 has no module {module} (or stub it)")
        tree = _module_tree(self.wheel, path)
        found = [n for n in _top_level_statements(tree.body) if name in _bound_by(n)]
        if not found:
            if self._is_module(f"{module}.{name}"):
                self.namespace(module)[name] = _WheelModule(self, f"{module}.{name}")
                return
            raise WheelCodeError(f"{path} binds no {name!r}")
        if len(found) > 1 and not all(isinstance(n, ast.ImportFrom) for n in found):
            raise WheelCodeError(
                f"{path} binds {name!r} {len(found)} times: stub {module}.{name}"
            )
        self._run_statement(module, path, found[0], name)

    def _is_module(self, module: str) -> bool:
        return module in self.stubs or _module_file(self.wheel, module) is not None

    def _run_statement(self, module: str, path: str, node: ast.stmt, name: str) -> None:
        ns = self.namespace(module)
        if isinstance(node, ast.ImportFrom):
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            source = self._import(
                node.module or "", ns, None, (alias.name,), node.level
            )
            if isinstance(source, _WheelModule):
                ns[name] = self.get(source.__name__, alias.name)
            else:
                ns[name] = getattr(source, alias.name)
            return
        if isinstance(node, ast.Import):
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            if alias.name.split(".")[0] == "vllm":
                raise WheelCodeError(f"{path}: `import {alias.name}`: stub {name}")
            ns[name] = importlib.import_module(alias.name)
            return
        if isinstance(node, ast.ClassDef):
            raise WheelCodeError(
                f"{path}: {name} is a class: take its methods with klass() or stub it"
            )
        self.require(module, _free_globals(ast.unparse(node)))
        self._exec(ast.Module(body=[node], type_ignores=[]), path, ns)

    def require(self, module: str, names: Iterable[str]) -> None:
        """Bind ``names`` in ``module``'s namespace (what compiled code reads)."""
        for free in sorted(names):
            self.namespace(module)[free] = self.get(module, free)

    @staticmethod
    def _exec(tree: ast.Module, path: str, ns: dict[str, Any]) -> None:
        code = compile(tree, path, "exec", flags=_ANNOTATIONS, dont_inherit=True)
        exec(code, ns)

    def function(self, module: str, name: str) -> Callable[..., Any]:
        """vLLM's own top-level function ``module.name``."""
        value = self.get(module, name)
        if not callable(value):
            raise WheelCodeError(f"{module}.{name} is not callable")
        return value

    # -- classes, method by method -----------------------------------------

    def _class_def(self, module: str, class_name: str) -> tuple[str, ast.ClassDef]:
        path = _module_file(self.wheel, module)
        if path is None:
            raise WheelCodeError(f"vLLM 0.33.0 has no module {module}")
        for node in _module_tree(self.wheel, path).body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return path, node
        raise WheelCodeError(f"{path} defines no class {class_name}")

    def definition(self, module: str, qualname: str) -> ast.AST:
        """The AST of ``module.qualname`` (a function, class or method), to
        read vLLM's code where it cannot run on CPU."""
        path = _module_file(self.wheel, module)
        if path is None:
            raise WheelCodeError(f"vLLM 0.33.0 has no module {module}")
        node: ast.AST = _module_tree(self.wheel, path)
        for part in qualname.split("."):
            node = next(
                (
                    n
                    for n in getattr(node, "body", [])
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part
                ),
                None,
            )
            if node is None:
                raise WheelCodeError(f"{path} defines no {qualname}")
        return node

    def method_names(self, module: str, class_name: str) -> list[str]:
        """The methods ``module.class_name`` defines in its own body."""
        _, class_def = self._class_def(module, class_name)
        return [n.name for n in class_def.body if isinstance(n, ast.FunctionDef)]

    def klass(
        self,
        module: str,
        class_name: str,
        methods: Iterable[str],
        *,
        bases: tuple[type, ...] = (),
        exclude: Iterable[str] = (),
    ) -> type:
        """A class made of ``methods`` of vLLM's ``module.class_name``, the
        methods and class attributes they reach through ``self.`` / ``cls.``
        (transitively, except ``exclude``), on ``bases``."""
        path, class_def = self._class_def(module, class_name)
        body = _class_closure(class_def, list(methods), set(exclude))
        base_names = [f"_parity_base_{i}" for i in range(len(bases))]
        new_class = ast.ClassDef(
            name=class_name,
            bases=[ast.Name(id=b, ctx=ast.Load()) for b in base_names],
            keywords=[],
            body=body or [ast.Pass()],
            decorator_list=[],
        )
        tree = ast.fix_missing_locations(ast.Module(body=[new_class], type_ignores=[]))
        self.require(module, _free_globals(ast.unparse(new_class)) - set(base_names))
        # A scratch namespace on top of the module's globals: the class name
        # and the bases must not replace module bindings.
        ns = self.namespace(module)
        saved = {k: ns[k] for k in [class_name, *base_names] if k in ns}
        ns.update(zip(base_names, bases, strict=True))
        try:
            self._exec(tree, path, ns)
            made = ns[class_name]
        finally:
            for k in [class_name, *base_names]:
                ns.pop(k, None)
            ns.update(saved)
        made.__module__ = f"vllm(0.33.0).{module}"
        return made


def method_call_receivers(node: ast.AST, method: str) -> list[str]:
    """The source of every ``<receiver>.method(...)`` receiver in ``node``."""
    return [
        ast.unparse(n.func.value)
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == method
    ]


def _class_closure(
    class_def: ast.ClassDef, roots: list[str], exclude: set[str]
) -> list[ast.stmt]:
    """The statements of ``class_def`` that define ``roots`` and whatever
    they reach through ``self.x`` / ``cls.x``, in source order."""
    by_name: dict[str, ast.stmt] = {}
    for node in class_def.body:
        for name in _bound_by(node) or (
            {node.target.id}
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            else set()
        ):
            by_name.setdefault(name, node)
    missing = [r for r in roots if r not in by_name]
    if missing:
        raise WheelCodeError(f"class {class_def.name} defines no {missing}")
    wanted: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in wanted or name in exclude or name not in by_name:
            continue
        wanted.add(name)
        for node in ast.walk(by_name[name]):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                todo.append(node.attr)
    kept = {id(by_name[n]) for n in wanted}
    return [n for n in class_def.body if id(n) in kept]


# ---------------------------------------------------------------------------
# Stubs every model shares
# ---------------------------------------------------------------------------


def protocol_stubs() -> dict[str, dict[str, Any]]:
    """The protocol's data classes and enum, from the project's runtime (a
    field-for-field mirror of vLLM's), and what has no CPU meaning."""
    defs_names = {
        name: getattr(defs, name)
        for name in (
            "EncoderCudaGraphConfig",
            "EncoderCudaGraphPathConfig",
            "EncoderItemSpec",
            "EncoderCudaGraphCaptureInputs",
            "EncoderCudaGraphReplayBuffers",
            "ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG",
            "EncoderCudaGraphPaddingLogic",
        )
    }
    return {
        "vllm.v1.worker.encoder_cudagraph_defs": defs_names,
        "vllm.v1.attention.backends.registry": {
            "AttentionBackendEnum": attention_backends.AttentionBackendEnum
        },
        # No pinned host memory on a CPU-only machine.
        "vllm.utils.torch_utils": {"PIN_MEMORY": False},
        # No compiled layer reads a forward context on CPU.
        "vllm.forward_context": {
            "set_forward_context": forward_context.set_forward_context
        },
        # LFM2-VL's image input, a TensorSchema read by key (its shape checks
        # need the wheel's TensorSchema machinery).
        "vllm.model_executor.models.lfm2_vl": {
            "LFM2VLImageInputs": lfm2_vl_inputs.LFM2VLImageInputs
        },
        # MiniCPM-V's image input, the same (the generated eager forward
        # builds it; vLLM's input parsing builds it and its embedding twin).
        "vllm.model_executor.models.minicpmv": {
            "MiniCPMVImagePixelInputs": minicpmv_inputs.MiniCPMVImagePixelInputs,
            "MiniCPMVImageEmbeddingInputs": minicpmv_inputs.MiniCPMVImagePixelInputs,
        },
    }


def vllm_protocol(code: WheelCode) -> type:
    """vLLM's ``SupportsEncoderCudaGraph`` as a plain base class: its default
    method bodies (``get_input_modality``, ``postprocess_encoder_output``,
    the others empty) without ``Protocol``."""
    module = "vllm.model_executor.models.interfaces"
    methods = code.method_names(module, "SupportsEncoderCudaGraph")
    return code.klass(module, "SupportsEncoderCudaGraph", methods)


def with_protocol(code: WheelCode) -> WheelCode:
    """``code`` with vLLM's protocol class as the interfaces module's
    ``SupportsEncoderCudaGraph`` (what generated modules subclass)."""
    protocol = vllm_protocol(code)
    code.stubs.setdefault("vllm.model_executor.models.interfaces", {})[
        "SupportsEncoderCudaGraph"
    ] = protocol
    return code


# ---------------------------------------------------------------------------
# The generated module
# ---------------------------------------------------------------------------


def load_generated_vllm_module(stem: str, code: WheelCode) -> types.ModuleType:
    """``generated/vllm/<stem>.py`` as a private module whose ``vllm.*``
    imports resolve through ``code`` (vLLM's own helpers, the stubs)."""
    path = GENERATED_VLLM / f"{stem}.py"
    return vllm_module_from_source(
        f"_parity_generated_{stem}", path.read_text(encoding="utf-8"), path, code
    )


def vllm_module_from_source(
    name: str, source: str, path: Path, code: WheelCode
) -> types.ModuleType:
    """A generated ``vllm`` module's ``source`` (from ``path``, or rendered
    in memory) as a private module whose ``vllm.*`` imports resolve through
    ``code``."""
    module = types.ModuleType(name)
    module.__file__ = str(path)
    module.__dict__["__builtins__"] = code.builtins_for()
    exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)
    return module


# ---------------------------------------------------------------------------
# The manager's replay copy (vLLM 0.33.0's loop, the runtime's copy rule)
# ---------------------------------------------------------------------------


def copy_replay_into_captured(
    config: defs.EncoderCudaGraphConfig,
    captured: dict[str, torch.Tensor],
    replay: dict[str, torch.Tensor | None],
) -> None:
    """Write ``replay`` into the ``captured`` buffers as the manager does
    before a replay: only captured keys, ``None`` / absent skipped, 0-d
    values copied as they are, others through the model's padding logic or
    the default zero-then-copy."""
    for key, buf in captured.items():
        src = replay.get(key)
        if src is None:
            continue
        if src.ndim == 0:
            buf.copy_(src)
            continue
        logic = config.padding_logics.get(
            key, EncoderCudaGraphManager._copy_padded_buffer
        )
        logic(buf, src)


# ---------------------------------------------------------------------------
# vLLM's manager on CPU
# ---------------------------------------------------------------------------

VLLM_MANAGER = "vllm.v1.worker.encoder_cudagraph"


class _Replay:
    """A captured forward: replay recomputes it into the output buffer.
    ``frozen`` buffers keep their capture values at every replay."""

    def __init__(self, forward, values, output_buffer, frozen=None) -> None:
        self.forward, self.values, self.output_buffer = forward, values, output_buffer
        self.frozen = frozen or {}

    def replay(self) -> None:
        with torch.inference_mode():
            self.output_buffer.copy_(self.forward({**self.values, **self.frozen}))


class _CpuCapture:
    """vLLM's ``_capture_budget_graph`` without CUDA: the same model calls
    (capture inputs, warm-up forward, captured forward), the same map key."""

    #: Whether replays read the 0-d buffers' capture values.
    freeze_host_scalars = False

    def _capture_budget_graph(self, token_budget, path="default", axis_keys=()):
        graph_set = self._get_graph_set(path)
        values = self.model.prepare_encoder_cudagraph_capture_inputs(
            token_budget,
            self.max_batch_size,
            self.max_frames_per_batch,
            self.device,
            self.dtype,
            path,
            axis_keys,
        ).values
        forward = lambda v: self.model.encoder_cudagraph_forward(
            v, path=path
        )  # noqa: E731
        with torch.inference_mode():
            output_buffer = torch.empty_like(forward({**values}))
        frozen = {
            key: value.clone()
            for key, value in values.items()
            if self.freeze_host_scalars
            and isinstance(value, torch.Tensor)
            and value.ndim == 0
        }
        graph = _Replay(forward, values, output_buffer, frozen)
        graph.replay()
        key = token_budget if not axis_keys else (token_budget, axis_keys)
        graph_set[key] = BudgetGraphMetadata(
            token_budget=token_budget,
            max_batch_size=self.max_batch_size,
            max_frames_per_batch=self.max_frames_per_batch,
            graph=graph,
            input_buffers=values,
            output_buffer=output_buffer,
            axis_keys=axis_keys,
        )


class _CpuCaptureOfHostScalars(_CpuCapture):
    freeze_host_scalars = True


@functools.cache
def vllm_cpu_manager_class(freeze_host_scalars: bool = False) -> type:
    """vLLM 0.33.0's ``EncoderCudaGraphManager`` from the wheel, runnable on
    CPU: its ``_capture_budget_graph`` (``torch.cuda.CUDAGraph``) is
    :class:`_CpuCapture`'s, whose replay recomputes the captured forward into
    the same output buffer. Everything else (budget resolution, packing,
    selection with axis keys, the replay copy, post-processing) is vLLM's
    code.

    ``freeze_host_scalars``: replays read the 0-d buffers (``max_seqlen``)
    as captured, whatever the replay copy wrote into them, as a CUDA graph
    does with a host integer its kernel launch read at capture."""
    stubs = protocol_stubs()
    stubs.update(
        {
            "vllm.logger": {"init_logger": logging.getLogger},
            "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext},
            VLLM_MANAGER: {"BudgetGraphMetadata": BudgetGraphMetadata},
        }
    )
    code = WheelCode(vllm_wheel(), stubs)
    names = [
        n
        for n in code.method_names(VLLM_MANAGER, "EncoderCudaGraphManager")
        if n != "_capture_budget_graph"
    ]
    return code.klass(
        VLLM_MANAGER,
        "EncoderCudaGraphManager",
        names,
        bases=(_CpuCaptureOfHostScalars if freeze_host_scalars else _CpuCapture,),
        exclude=["_capture_budget_graph", "_dp_shard", "_dp_gather"],
    )


# ---------------------------------------------------------------------------
# Observations and their differences
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Raised:
    """An observation that is an exception: its type and its message (a
    reworded message is a difference the document lists too)."""

    type_name: str
    message: str


def observe(call: Callable[[], Any]) -> Any:
    """``call()``'s result, or :class:`Raised` with the exception's type and
    message."""
    try:
        return call()
    except Exception as exc:
        return Raised(type(exc).__name__, str(exc))


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``value`` as ``{path: leaf}``: dicts and lists open up, tensors become
    their dtype, shape and values (``.dtype``, ``.shape``, ``.values``)."""
    out: dict[str, Any] = {}
    if isinstance(value, torch.Tensor):
        out[f"{prefix}.dtype"] = str(value.dtype)
        out[f"{prefix}.shape"] = tuple(value.shape)
        out[f"{prefix}.values"] = value.detach().cpu()
    elif isinstance(value, Mapping):
        for key in value:
            out.update(flatten(value[key], f"{prefix}/{key}"))
        # The key set, not its order: the manager looks buffers up by key.
        out[f"{prefix}.keys"] = tuple(sorted(map(str, value)))
    elif isinstance(value, (list, tuple)):
        out[f"{prefix}.len"] = len(value)
        out[f"{prefix}.type"] = type(value).__name__
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        out[f"{prefix}.class"] = type(value).__name__
        for f in dataclasses.fields(value):
            out.update(flatten(getattr(value, f.name), f"{prefix}.{f.name}"))
    else:
        out[prefix] = value
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(torch.equal(a.nan_to_num(7e7), b.nan_to_num(7e7))) and bool(
            torch.equal(a.isnan(), b.isnan())
        )
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return type(a) is type(b) and a == b


def differences(vllm_side: Any, ours: Any, prefix: str) -> list[str]:
    """The paths where two observations differ (missing on one side counts)."""
    left, right = flatten(vllm_side, prefix), flatten(ours, prefix)
    return sorted(
        path
        for path in left.keys() | right.keys()
        if path not in left or path not in right or not _same(left[path], right[path])
    )


# ---------------------------------------------------------------------------
# Listed differences (docs/vllm-differences.md)
# ---------------------------------------------------------------------------

DIFFERENCES_DOC = REPO / "docs" / "vllm-differences.md"
_TEST_REF = r"`test_[a-z0-9_]+\.py::test_[a-z0-9_]+`"
_DOC_ROW = re.compile(
    r"^\| `(?P<id>(?P<model>[a-z0-9_]+)\.[a-z0-9-]+)` \|"
    rf".*\| (?P<tests>{_TEST_REF}(?:, {_TEST_REF})*) \|$"
)


@dataclasses.dataclass(frozen=True)
class Difference:
    """One listed difference from vLLM's mixin: its id in the differences
    document and the observation paths it explains (regular expressions)."""

    id: str
    paths: tuple[str, ...]

    def explains(self, path: str) -> bool:
        return any(re.search(p, path) for p in self.paths)


def listed_in_doc() -> dict[str, tuple[str, ...]]:
    """id -> the tests (``file.py::name``, one or more) of every difference
    the document lists."""
    rows = {}
    for line in DIFFERENCES_DOC.read_text(encoding="utf-8").splitlines():
        match = _DOC_ROW.match(line)
        if match:
            rows[match["id"]] = tuple(re.findall(r"`([^`]+)`", match["tests"]))
    return rows


#: The model part of the ids of rows that every model's test may list (a
#: difference of the generated template, not of one model).
SHARED = "all"


def check_differences(
    model: str, found: Iterable[str], listed: tuple[Difference, ...]
) -> None:
    """Fail unless ``found`` is explained by exactly the ``listed``
    differences, and those are exactly what the document lists for
    ``model`` (and the shared rows ``all.*`` the test lists, which the
    document must have): an unlisted difference fails, and so does a listed
    one that no longer occurs."""
    found = sorted(set(found))
    unexplained = [p for p in found if not any(d.explains(p) for d in listed)]
    unseen = [d.id for d in listed if not any(d.explains(p) for p in found)]
    in_doc = listed_in_doc()
    shared = {d.id for d in listed if d.id.split(".")[0] == SHARED}
    documented = {i for i in in_doc if i.split(".")[0] == model} | (
        shared & set(in_doc)
    )
    problems = []
    if unexplained:
        problems.append(
            f"{len(unexplained)} differences from vLLM 0.33.0 are not listed "
            "in docs/vllm-differences.md, e.g.:\n  " + "\n  ".join(unexplained[:20])
        )
    if unseen:
        problems.append(f"listed differences that no longer occur: {unseen}")
    if documented != {d.id for d in listed}:
        problems.append(
            f"docs/vllm-differences.md lists {sorted(documented)} for {model}, "
            f"the test {sorted(d.id for d in listed)}"
        )
    assert not problems, "\n".join(problems)
