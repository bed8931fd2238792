"""What a step may reach: the allow-lists of the step language.

The parser (:mod:`generator.formulas`) decides the shape of an expression;
this module decides what its names may touch, so that "nothing is
evaluated" holds for steps too. A step computes on tensors and calls the
model's own code; it never reaches files, storage, numpy, frames, code,
globals, builtins, generators or torch's module machinery:

* an attribute of a value (a buffer, input, step result or call result) is
  one of :data:`TENSOR_ATTRIBUTES` or :data:`OUTPUT_FIELDS`, a method one of
  :data:`TENSOR_METHODS`;
* a host path is called only where the spec declares it: a ``host:``
  attribute (a module call), a ``host_methods`` entry (``_process_image_input``
  or a dotted ``vision.encode``), a tensor method of a host tensor (an
  attribute annotated :data:`HOST_TENSOR_TYPES`), or a module's first
  parameter in the one form ``next(<host attribute>.parameters()).dtype`` (or
  ``.device``);
* no host path names :data:`MODULE_API` (``torch.nn.Module``'s own
  attributes and methods: hooks, ``apply``, ``_modules``, ``state_dict``...);
* a string literal is a call's argument or an operand of ``==`` / ``!=``,
  never a value whose attributes or items a step reads (``"{0...}".format``);
* ``int(x)`` takes one value and no keyword, in post-processing steps only
  (the parser refuses it elsewhere: it copies to the host).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from generator import formulas as fx
from generator.scopes import NameKind

#: Attributes a step may read on a value: facts about a tensor.
TENSOR_ATTRIBUTES = frozenset({"T", "device", "dtype", "mT", "ndim", "shape"})
#: Fields of a module's output object (``transformers``' ``ModelOutput``).
OUTPUT_FIELDS = frozenset({"last_hidden_state", "pooler_output"})
#: Methods a step may call on a value: pure tensor computations (shape and
#: view changes, conversions, arithmetic, reductions, indexing) and the host
#: copies ``tolist``/``item``/``cpu``, which a captured graph refuses. No
#: method changes a tensor in place: a value may be a view of the host
#: model's weights (``w = visual.patch.weight``), which a ``zero_()`` would
#: change for every later batch.
TENSOR_METHODS = frozenset(
    {
        # shapes and views
        "chunk",
        "contiguous",
        "expand",
        "expand_as",
        "flatten",
        "flip",
        "movedim",
        "narrow",
        "permute",
        "repeat",
        "repeat_interleave",
        "reshape",
        "reshape_as",
        "roll",
        "select",
        "split",
        "squeeze",
        "t",
        "tile",
        "transpose",
        "unbind",
        "unflatten",
        "unsqueeze",
        "view",
        "view_as",
        # sizes and new tensors like this one
        "dim",
        "new_empty",
        "new_full",
        "new_ones",
        "new_zeros",
        "numel",
        "size",
        # conversions and copies
        "bfloat16",
        "bool",
        "clone",
        "detach",
        "double",
        "float",
        "half",
        "int",
        "long",
        "to",
        "type_as",
        # arithmetic and elementwise functions
        "abs",
        "add",
        "ceil",
        "clamp",
        "clamp_max",
        "clamp_min",
        "div",
        "exp",
        "floor",
        "floor_divide",
        "log",
        "masked_fill",
        "matmul",
        "mul",
        "neg",
        "pow",
        "reciprocal",
        "remainder",
        "round",
        "rsqrt",
        "sigmoid",
        "softmax",
        "sqrt",
        "sub",
        "tanh",
        # comparisons
        "eq",
        "ge",
        "gt",
        "le",
        "logical_and",
        "logical_not",
        "logical_or",
        "lt",
        "ne",
        # reductions and scans
        "all",
        "amax",
        "amin",
        "any",
        "argmax",
        "argmin",
        "cumprod",
        "cumsum",
        "max",
        "mean",
        "min",
        "prod",
        "sum",
        # indexing
        "argsort",
        "diff",
        "gather",
        "index_add",
        "index_copy",
        "index_fill",
        "index_select",
        "masked_scatter",
        "masked_select",
        "nonzero",
        "scatter",
        "sort",
        "take_along_dim",
        "topk",
        "unique",
        "unique_consecutive",
        # host copies (eager steps only: a captured graph refuses them)
        "cpu",
        "item",
        "tolist",
    }
)
#: Keyword arguments a step may pass to a tensor method or a torch function:
#: the computation's own parameters, never ``out=`` (which writes into the
#: tensor it names: a host weight, a buffer).
STEP_KEYWORDS = frozenset(
    {
        "alpha",
        "append",
        "chunks",
        "condition",
        "copy",
        "data",
        "decimals",
        "descending",
        "destination",
        "device",
        "dim",
        "dim0",
        "dim1",
        "dims",
        "dtype",
        "end",
        "end_dim",
        "exponent",
        "fill_value",
        "index",
        "indices",
        "input",
        "k",
        "keepdim",
        "largest",
        "length",
        "mask",
        "max",
        "memory_format",
        "min",
        "n",
        "non_blocking",
        "other",
        "output_size",
        "prepend",
        "reduce",
        "repeats",
        "return_counts",
        "return_inverse",
        "rounding_mode",
        "shifts",
        "size",
        "sizes",
        "sorted",
        "source",
        "split_size",
        "split_size_or_sections",
        "src",
        "stable",
        "start",
        "start_dim",
        "step",
        "tensors",
        "value",
    }
)
#: Annotations of host attributes that are tensors: their tensor methods
#: may be called without a declaration (``image_newline.view(1, -1)``).
HOST_TENSOR_TYPES = frozenset({"torch.Tensor", "torch.nn.Parameter"})
#: Annotations of host attributes that are modules. A dotted host method
#: lives under one of these or under a class imported from vLLM's model code
#: (:data:`MODEL_PACKAGES`); under a host tensor it is one of
#: :data:`TENSOR_METHODS`; under anything else (``Any``, ``str``, a config)
#: it is refused, as the value is data a step reads, not code it calls
#: (``config.to_json_file``, ``name.format``, ``newline.numpy``).
MODULE_TYPES = frozenset(
    {"torch.nn.Module", "torch.nn.ModuleList", "torch.nn.ModuleDict"}
)
#: The vLLM packages whose classes are model code (a config class comes from
#: ``vllm.transformers_utils``).
MODEL_PACKAGES = ("vllm.model_executor.models", "vllm.models")
#: What ``next(<host attribute>.parameters())`` may be read for.
PARAMETER_FACTS = frozenset({"dtype", "device"})
#: ``torch.nn.Module``'s own attributes and methods (its class's names and
#: those its ``__init__`` sets), which are torch's machinery, not the model's:
#: a host path never names one (``next(m.parameters())`` aside) and
#: ``host_methods`` never declares one.
MODULE_API = frozenset(
    {
        "T_destination",
        "_apply",
        "_backward_hooks",
        "_backward_pre_hooks",
        "_buffers",
        "_call_impl",
        "_compiled_call_impl",
        "_forward_hooks",
        "_forward_hooks_always_called",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_get_backward_hooks",
        "_get_backward_pre_hooks",
        "_get_name",
        "_is_full_backward_hook",
        "_load_from_state_dict",
        "_load_state_dict_post_hooks",
        "_load_state_dict_pre_hooks",
        "_maybe_warn_non_full_backward_hook",
        "_modules",
        "_named_members",
        "_non_persistent_buffers_set",
        "_parameters",
        "_register_load_state_dict_pre_hook",
        "_register_state_dict_hook",
        "_replicate_for_data_parallel",
        "_save_to_state_dict",
        "_slow_forward",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_version",
        "_wrapped_call_impl",
        "add_module",
        "apply",
        "bfloat16",
        "buffers",
        "call_super_init",
        "children",
        "compile",
        "cpu",
        "cuda",
        "double",
        "dump_patches",
        "eval",
        "extra_repr",
        "float",
        "forward",
        "get_buffer",
        "get_extra_state",
        "get_parameter",
        "get_submodule",
        "half",
        "ipu",
        "load_state_dict",
        "modules",
        "mtia",
        "named_buffers",
        "named_children",
        "named_modules",
        "named_parameters",
        "parameters",
        "register_backward_hook",
        "register_buffer",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook",
        "register_load_state_dict_pre_hook",
        "register_module",
        "register_parameter",
        "register_state_dict_post_hook",
        "register_state_dict_pre_hook",
        "requires_grad_",
        "set_extra_state",
        "set_submodule",
        "share_memory",
        "state_dict",
        "to",
        "to_empty",
        "train",
        "training",
        "type",
        "xpu",
        "zero_grad",
    }
)


@dataclass(frozen=True)
class HostSurface:
    """What the spec declares of its host: each ``host:`` attribute's
    annotation, the ``host_methods`` entries (dotted or not), and the host
    attributes annotated as a module (:func:`is_module_annotation`): the
    only ones a step calls, loops over or reads parameters of."""

    attributes: Mapping[str, str]
    methods: frozenset[str]
    modules: frozenset[str] = frozenset()


# Roles of a sub-expression: what its parent does with it (a string may be
# an argument or compared; ``next(...)`` is read for a fact: dtype, device).
_VALUE, _CALLEE, _ARGUMENT, _EQUALITY, _FACT = (
    "value",
    "callee",
    "argument",
    "equality",
    "fact",
)


def reach_problem(expr: fx.Expr, host: HostSurface) -> str | None:
    """How ``expr`` reaches beyond the allow-lists, if it does: the first
    step out in evaluation order (``visual.parameters`` before the
    ``.gi_frame`` read on its result)."""
    return next(_problems(expr, _VALUE, host), None)


def _problems(e: fx.Expr, role: str, host: HostSurface) -> Iterator[str]:
    if isinstance(e, fx.Literal) and isinstance(e.value, str):
        if role not in (_ARGUMENT, _EQUALITY):
            yield (
                f"the string {e.value!r} may only be a call's argument or compared "
                "with == / !="
            )
        return
    if isinstance(e, fx.HostPath):
        yield from _host_path_problems(e, role == _CALLEE, host)
        return
    if isinstance(e, fx.Attr):
        facts = e.name in PARAMETER_FACTS and role != _CALLEE
        yield from _problems(e.value, _FACT if facts else _VALUE, host)
        yield from _attribute_problems(e, role)
        return
    if isinstance(e, fx.Call):
        yield from _call_problems(e, role, host)
        return
    inner = _VALUE
    if isinstance(e, fx.Compare) and e.op in ("==", "!="):
        inner = _EQUALITY
    for child in fx.children(e):
        yield from _problems(child, inner, host)


def _attribute_problems(e: fx.Attr, role: str) -> Iterator[str]:
    if role == _CALLEE:
        if e.name not in TENSOR_METHODS:
            yield (
                f"'.{e.name}()' is not a tensor method a step may call (see the "
                "tensor methods of docs/spec-format.md)"
            )
    elif e.name not in TENSOR_ATTRIBUTES | OUTPUT_FIELDS:
        yield (
            f"'.{e.name}' is not an attribute a step may read (tensor attributes: "
            f"{', '.join(sorted(TENSOR_ATTRIBUTES))}; output fields: "
            f"{', '.join(sorted(OUTPUT_FIELDS))})"
        )


def _call_problems(e: fx.Call, role: str, host: HostSurface) -> Iterator[str]:
    if isinstance(e.callee, fx.Builtin) and e.callee.name == "int":
        yield from _int_problems(e, host)
        return
    if isinstance(e.callee, fx.Builtin):
        yield from _next_problems(e, role, host)
        return
    yield from _problems(e.callee, _CALLEE, host)
    tensor_call = isinstance(e.callee, (fx.Torch, fx.Attr)) or (
        isinstance(e.callee, fx.HostPath) and _host_tensor_method(e.callee, host)
    )
    for name, _ in e.kwargs if tensor_call else ():
        if name not in STEP_KEYWORDS:
            yield (
                f"keyword {name}= is not one a tensor method or torch function "
                "may take in a step (see STEP_KEYWORDS in "
                "generator/spec/step_language.py)"
            )
    for arg in (*e.args, *(v for _, v in e.kwargs)):
        yield from _problems(arg, _ARGUMENT, host)


def _int_problems(e: fx.Call, host: HostSurface) -> Iterator[str]:
    """``int(x)``: one value (a one-element tensor, read on the host), no
    keywords (``int(x, base=2)`` parses strings)."""
    if len(e.args) != 1 or e.kwargs:
        yield "int() takes exactly one value: int(<tensor of one element>)"
        return
    yield from _problems(e.args[0], _VALUE, host)


def _next_problems(e: fx.Call, role: str, host: HostSurface) -> Iterator[str]:
    """``next`` reads a module's first parameter, for its dtype or device."""
    inner = e.args[0] if len(e.args) == 1 and not e.kwargs else None
    form = (
        role == _FACT
        and isinstance(inner, fx.Call)
        and isinstance(inner.callee, fx.HostPath)
        and len(inner.callee.parts) == 2
        and _module_or_refused(inner.callee.parts[0], host)
        and inner.callee.parts[-1] == "parameters"
        and not inner.args
        and not inner.kwargs
    )
    if not form:
        yield (
            "next() is only allowed as next(<host attribute>.parameters()).dtype "
            "or .device, on a host attribute that is a module"
        )
        return
    module = fx.HostPath(inner.callee.parts[:-1])  # type: ignore[union-attr]
    yield from _host_path_problems(module, False, host)


def _host_path_problems(
    path: fx.HostPath, called: bool, host: HostSurface
) -> Iterator[str]:
    root, dotted = path.parts[0], path.dotted
    if root not in host.attributes:  # a host method: only called, by name
        if len(path.parts) > 1 or not called:
            yield f"host method {root!r} may only be called: {root}(...)"
        return
    if called and _host_tensor_method(path, host):
        return
    for part in path.parts[1:]:
        if part in MODULE_API:
            yield (
                f"'{dotted}' names {part!r}, torch.nn.Module's own API, not the "
                "model's"
            )
            return
    if called and len(path.parts) == 1 and not _module_or_refused(root, host):
        yield (
            f"'{root}(...)' calls {root!r}, annotated {host.attributes[root]!r}, "
            "not a module: a host attribute is called only where it is annotated "
            "as one (torch.nn.Module or a class of vLLM's model code)"
        )
        return
    if not called or len(path.parts) == 1 or dotted in host.methods:
        return
    yield (
        f"'{dotted}(...)' is not declared: list {dotted} under host_methods (a "
        "host path is called only where the spec declares it)"
    )


def _module_or_refused(root: str, host: HostSurface) -> bool:
    """Whether a host attribute is a module, or its annotation was refused
    (reported once, where it is written)."""
    return root in host.modules or host.attributes.get(root) == ""


def _host_tensor_method(path: fx.HostPath, host: HostSurface) -> bool:
    """``image_newline.view(...)``: a tensor method of a host tensor."""
    return (
        len(path.parts) == 2
        and path.parts[1] in TENSOR_METHODS
        and host.attributes.get(path.parts[0]) in HOST_TENSOR_TYPES
    )


def dotted_method_problem(
    root: str, rest: list[str], annotation: str, model_classes: frozenset[str]
) -> str | None:
    """Why ``root.<rest>`` may not be declared a host method, from the root
    attribute's annotation (see :data:`MODULE_TYPES`)."""
    if is_module_annotation(annotation, model_classes):
        return None
    if annotation in HOST_TENSOR_TYPES:
        if len(rest) == 1 and rest[0] in TENSOR_METHODS:
            return None
        return (
            f"{root!r} is a host tensor ({annotation}): only its tensor methods "
            "may be called (see the tensor methods of docs/spec-format.md)"
        )
    return (
        f"{root!r} is annotated {annotation!r}, not a module: a dotted host "
        "method lives under a module (torch.nn.Module or a class of vLLM's "
        "model code); other host attributes are read, never called"
    )


def is_module_annotation(annotation: str, model_classes: frozenset[str]) -> bool:
    """Whether a host attribute so annotated is a module: one of
    :data:`MODULE_TYPES` or a class of vLLM's model code."""
    return annotation in MODULE_TYPES or annotation in model_classes


def model_classes(imports: tuple) -> frozenset[str]:
    """The imported names whose vLLM module is model code (``Import``s)."""
    return frozenset(
        i.name
        for i in imports
        if any(
            i.module("vllm") == p or i.module("vllm").startswith(p + ".")
            for p in MODEL_PACKAGES
        )
    )


def host_surface(names: Mapping, host_attrs: tuple, imports: tuple) -> HostSurface:
    """The surface of a spec being read: ``names`` by kind (a host attribute
    whose annotation failed has none), ``host_attrs`` the ``HostAttr``s read,
    ``imports`` the ``Import``s (whose model classes annotate modules)."""
    annotations = {h.name: h.annotation for h in host_attrs}
    attributes = {n: annotations.get(n, "") for n in names.get(NameKind.HOST, ())}
    classes = model_classes(imports)
    return HostSurface(
        attributes,
        frozenset(names.get(NameKind.HOST_METHOD, ())),
        frozenset(n for n, a in attributes.items() if is_module_annotation(a, classes)),
    )
