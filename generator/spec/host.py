"""What the host model provides and what the generated module imports:
host attributes, host methods, imports, constants and sizes."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, ClassVar

from generator import formulas as fx
from generator.diagnostics import Location
from generator.formulas import FormulaError, HostPath
from generator.naming import TARGETS
from generator.scopes import METHODS, NameKind
from generator.spec.names import check_name
from generator.spec.reader import Key, Keys, ReadContext, Reader
from generator.spec.step_language import (
    MODULE_API,
    dotted_method_problem,
    model_classes,
)
from generator.spec.values import (
    INVALID,
    Boolean,
    DottedName,
    HostPathValue,
    Identifier,
    Integer,
    ValueType,
    is_name,
)
from generator.yaml_loader import Node

#: Names a host annotation may use besides the spec's imports (``Any``, for
#: a config whose class has no module in one of the targets, is imported by
#: every generated module).
TYPE_NAMES = frozenset(
    {"torch", "int", "float", "str", "bool", "list", "dict", "tuple", "Any"}
)
#: Spellings a host annotation must write another way, and how (one name per
#: idea: ``Any`` is the attribute of no class the targets share).
RESPELLED_TYPES = {"object": "Any"}
#: vLLM's config types, imported for type checking only.
VLLM_TYPE_NAMES = frozenset({"MultiModalConfig", "VllmConfig"})
#: torch types an annotation may name unquoted (they exist in every torch).
TORCH_TYPES = frozenset(
    {
        "torch.Tensor",
        "torch.dtype",
        "torch.device",
        "torch.Size",
        "torch.nn.Module",
        "torch.nn.ModuleList",
        "torch.nn.ModuleDict",
        "torch.nn.Parameter",
    }
)
#: ``Any``: a host attribute whose class this project has no stand-in for (a
#: model's config), read only through the spec's paths.
_PLAIN_TYPES = frozenset({"int", "float", "str", "bool", "Any"})
_GENERICS = frozenset({"list", "dict", "tuple"})


@dataclass(frozen=True)
class HostAttr:
    """``self.<name>``, provided by the host model."""

    name: str
    annotation: str  # validated Python type expression, printed by us
    names: frozenset[str]  # the names it mentions (imports, builtins, torch)
    #: Printed as a string: it mentions a TYPE_CHECKING import, or something
    #: that evaluating at class creation could fail on.
    quoted: bool
    location: Location


def _runs_at_import(tree: ast.expr) -> bool:
    """True if the annotation evaluates without error when the class body
    runs: builtin types, known torch types, ``None``, ``|`` unions of them and
    subscripted ``list``/``dict``/``tuple``. Anything else is printed quoted."""
    if isinstance(tree, ast.Name):
        return tree.id in _PLAIN_TYPES
    if isinstance(tree, ast.Constant):
        return tree.value is None
    if isinstance(tree, ast.Attribute):
        return ast.unparse(tree) in TORCH_TYPES
    if isinstance(tree, ast.BinOp):
        both_none = all(isinstance(s, ast.Constant) for s in (tree.left, tree.right))
        return (
            not both_none and _runs_at_import(tree.left) and _runs_at_import(tree.right)
        )
    if isinstance(tree, ast.Subscript):
        args = tree.slice.elts if isinstance(tree.slice, ast.Tuple) else [tree.slice]
        return (
            isinstance(tree.value, ast.Name)
            and tree.value.id in _GENERICS
            and all(_runs_at_import(a) for a in args)
        )
    return False


def parse_annotation(text: object, known: frozenset[str]) -> tuple[str, set[str], bool]:
    """Validate a type annotation: (canonical text, root names, evaluates at
    import). Raises FormulaError."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaError("expected a type annotation string")
    if len(text) > 200 or any(not (c.isascii() and c.isprintable()) for c in text):
        raise FormulaError("annotations are short printable ASCII")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise FormulaError(f"syntax error in annotation: {exc.msg}") from None
    roots: set[str] = set()

    def emit(node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            if node.id in RESPELLED_TYPES and node.id not in known:
                raise FormulaError(
                    f"write {RESPELLED_TYPES[node.id]!r} instead of {node.id!r} "
                    "(an attribute of no class both targets can import)"
                )
            if node.id not in known:
                raise FormulaError(
                    f"unknown type {node.id!r} (declare it under imports; "
                    f"known: {', '.join(sorted(known))})"
                )
            roots.add(node.id)
            return node.id
        if isinstance(node, ast.Attribute):
            if not fx.is_identifier(node.attr) or node.attr.startswith("_"):
                raise FormulaError(f"bad attribute {node.attr!r} in annotation")
            return f"{emit(node.value)}.{node.attr}"
        if isinstance(node, ast.Constant) and node.value is None:
            return "None"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return f"{emit(node.left)} | {emit(node.right)}"
        if isinstance(node, ast.Subscript):
            inner = node.slice
            if isinstance(inner, ast.Tuple):
                args = ", ".join(emit(e) for e in inner.elts)
            else:
                args = emit(inner)
            return f"{emit(node.value)}[{args}]"
        raise FormulaError(f"{type(node).__name__} is not allowed in an annotation")

    return emit(tree), roots, _runs_at_import(tree)


class Annotation(ValueType):
    words = "type annotation"

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        name, loc = kw["key"], kw["key_location"]
        if check_name(ctx, loc, field, name, "host attribute") and name in MODULE_API:
            # ``host: {apply: Any}`` would make ``apply(...)`` a host call.
            ctx.error(
                loc,
                field,
                f"host attribute {name!r} is torch.nn.Module's own API, not an "
                "attribute of the model",
            )
            ctx.bad_names.add(name)
        ctx.declare(NameKind.HOST, name, loc, field)
        imports = ctx.names[NameKind.IMPORT]
        known = frozenset(imports) | TYPE_NAMES | VLLM_TYPE_NAMES
        try:
            text, roots, runs = parse_annotation(node.value, known)
        except FormulaError as exc:
            ctx.error(node, field, str(exc))
            return INVALID
        return HostAttr(name, text, frozenset(roots), not runs, loc)


@dataclass(frozen=True)
class Import:
    """A name the generated module imports, from one module per target; a
    vLLM-only import (no ``standalone`` module) keeps its spec to the vllm
    target (:meth:`MixinSpec.target_problems`)."""

    name: str
    modules: tuple[tuple[str, str | None], ...]  # (target, module or None)
    type_only: bool
    location: Location

    KEYS: ClassVar = Keys(
        Key(
            "vllm",
            DottedName(),
            "Module in vLLM 0.33.0 that defines the name.",
            required=True,
            example="vllm.model_executor.models.qwen2_vl",
        ),
        Key(
            "standalone",
            DottedName(),
            "Module of this project that defines the name, or a stand-in for it "
            "(`reference_towers.*`, `encoder_cudagraph_runtime.*`). Without it the "
            "import is vLLM-only: the spec generates its vllm module only, and "
            "`--target standalone` refuses it.",
            example="reference_towers.qwen2_vl",
        ),
        Key(
            "type_only",
            Boolean(),
            "Imported under `TYPE_CHECKING` only; annotations that use it are quoted.",
            default=False,
        ),
    )
    DOC_TITLE = "imports"

    def module(self, target: str) -> str | None:
        """The module the name comes from in ``target``'s module (None: the
        import has none there)."""
        return dict(self.modules)[target]

    @classmethod
    def from_yaml(cls, r: Reader, key: str, key_location: Location, **_: Any):
        from generator.import_rules import import_problem

        if check_name(r.ctx, key_location, r.field, key, "import"):
            if key in VLLM_TYPE_NAMES or key in TYPE_NAMES:
                r.ctx.error(
                    key_location,
                    r.field,
                    f"{key!r} is imported by the generator itself",
                )
        r.ctx.declare(NameKind.IMPORT, key, key_location, r.field)
        modules = []
        for target in TARGETS:
            module = r.take(target)
            if module is not None and r.ok(target):
                problem = import_problem(target, module, key)
                if problem is not None:
                    r.error(target, problem)
            modules.append((target, module))
        type_only = r.take("type_only")
        if not r.ok(*TARGETS):
            return None
        return cls(key, tuple(modules), type_only, key_location)


class ConstantSource(HostPathValue):
    """A host attribute path, or a call of a declared host method without
    arguments (Llama 4's ``get_image_patches_per_chunk()``)."""

    words = "host path, host method call or imported name"

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        methods = ctx.names[NameKind.HOST_METHOD]
        text = node.value.strip() if isinstance(node.value, str) else ""
        if text.endswith("()") and text[:-2] in methods and "." not in text:
            return fx.Call(HostPath((text[:-2],)), (), ())
        if text in ctx.names[NameKind.IMPORT]:
            return _imported_constant(node, field, ctx, text)
        if text.endswith(")") and "(" in text:
            ctx.error(
                node,
                field,
                "expected a host path or a call of a declared host method without "
                f"arguments (host methods: {', '.join(sorted(methods)) or 'none'})",
            )
            return INVALID
        return super().value(node, field, ctx, **kw)


def _imported_constant(node: Node, field: str, ctx: ReadContext, name: str) -> Any:
    """A module-level integer of an imported module (DeepSeek-OCR's
    ``BASE_SIZE``): a value, so not a type-only import."""
    imp = next((i for i in ctx.partial.get("imports", ()) if i.name == name), None)
    if imp is not None and imp.type_only:
        ctx.error(
            node,
            field,
            f"{name!r} is a type-only import: a constant reads the name at run time",
        )
        return INVALID
    return fx.Ref(name)


@dataclass(frozen=True)
class Constant:
    """A name bound to a host attribute path (or the result of a host
    method, or a module-level value of an imported module), read first thing
    by each method that uses it."""

    name: str
    path: HostPath | fx.Call | fx.Ref
    default: int | None
    location: Location
    #: ``processor_kwarg``: the ``mm_processor_kwargs`` key read first.
    processor_kwarg: str | None = None
    #: ``fallback``: the value when the attribute is missing or falsy.
    fallback: int | None = None
    #: ``at_least``: ``max(at_least, int(value))``.
    at_least: int | None = None

    @property
    def method(self) -> str | None:
        """The host method whose result the constant is, if it is one."""
        if isinstance(self.path, fx.Call):
            return self.path.callee.parts[0]  # type: ignore[union-attr]
        return None

    @property
    def imported(self) -> str | None:
        """The imported name whose value the constant is, if it is one."""
        return self.path.name if isinstance(self.path, fx.Ref) else None

    @property
    def host_path(self) -> HostPath | None:
        """The host attribute path the constant reads, if it reads one."""
        return self.path if isinstance(self.path, HostPath) else None

    KEYS: ClassVar = Keys(
        Key(
            "from",
            ConstantSource(),
            "The host attribute path the constant reads, a host method it "
            "calls (declared under `host_methods`, no arguments), or a name "
            "under `imports` whose module-level value it is (DeepSeek-OCR's "
            "`BASE_SIZE`; then `default` is required).",
            required=True,
            example="vision_tower.spatial_merge_size",
        ),
        Key(
            "default",
            Integer(),
            "The released model's value: the static checks and `gen-mixin plan` "
            "use it. For an imported name, the module's value (the generator "
            "never imports the module).",
            example="2",
        ),
        Key(
            "fallback",
            Integer(),
            "The value when the attribute is missing or falsy (`None`, 0): "
            "`getattr(<path>, None) or <fallback>`; a host path only.",
            example="64",
        ),
        Key(
            "processor_kwarg",
            Identifier(),
            "A key of `multimodal_config.mm_processor_kwargs` that overrides the "
            "attribute when a user passes it (needs `multimodal_config` under "
            "`host`): LFM2-VL's `min_image_tokens`.",
            example="min_image_tokens",
        ),
        Key(
            "at_least",
            Integer(),
            "Convert the value with `int()` (a `TypeError` or `ValueError` for "
            "what is no integer) and raise it to at least this.",
            example="1",
        ),
    )
    DOC_TITLE = "constants"

    @classmethod
    def from_yaml(cls, r: Reader, key: str, key_location: Location, **_: Any):
        declare_constant(r.ctx, key, key_location, r.field)
        path = r.take("from")
        default = r.take("default")
        fallback = r.take("fallback")
        kwarg = r.take("processor_kwarg")
        at_least = r.take("at_least")
        if r.has("fallback") and (
            isinstance(path, (fx.Call, fx.Ref))
            or (isinstance(path, HostPath) and not isinstance(path.parts[-1], str))
        ):
            r.error(
                r.key_location("fallback"),
                "a host path ending in an attribute only (a method's result or an "
                "item is never missing)",
                r.path("fallback"),
            )
        if (
            r.has("processor_kwarg")
            and "multimodal_config" not in r.ctx.names[NameKind.HOST]
        ):
            r.error(
                r.key_location("processor_kwarg"),
                "needs multimodal_config under host (it holds mm_processor_kwargs)",
                r.path("processor_kwarg"),
            )
        if isinstance(path, fx.Ref) and default is None:
            r.error(
                r.node,
                f"{path.name!r} is imported: give its module's value as default "
                "(the static checks need it; the generator never imports the module)",
                r.path("default"),
            )
            return None
        if path is None:
            return None
        return cls(key, path, default, key_location, kwarg, fallback, at_least)

    def value_python(self) -> str:
        """The Python expression the generated methods bind the constant to."""
        value = fx.to_python(self.path)
        if self.fallback is not None and isinstance(self.path, HostPath):
            *head, last = self.path.parts
            owner = fx.to_python(HostPath(tuple(head))) if head else "self"
            value = f"getattr({owner}, {last!r}, None) or {self.fallback}"
        if self.processor_kwarg is not None:
            value = (
                "(self.multimodal_config.mm_processor_kwargs or {}).get("
                f"{self.processor_kwarg!r}, {value})"
            )
        if self.at_least is not None:
            value = f"max({self.at_least}, int({value}))"
        return value


def declare_constant(ctx: ReadContext, name: str, loc: Location, field: str) -> None:
    check_name(ctx, loc, field, name, "constant")
    if name in ctx.names[NameKind.HOST]:
        ctx.error(loc, field, f"{name!r} is also a host attribute")
    ctx.declare(NameKind.CONSTANT, name, loc, field)


class ConstantPath(ConstantSource):
    """The short form ``name: host.path``."""

    words = "host path or host method call"

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        declare_constant(ctx, kw["key"], kw["key_location"], field)
        path = super().value(node, field, ctx)
        if path is INVALID:
            return INVALID
        if isinstance(path, fx.Ref):
            ctx.error(
                node,
                field,
                f"{path.name!r} is imported: write {{from: {path.name}, default: "
                "<its value>} (the static checks need the value)",
            )
            return INVALID
        return Constant(kw["key"], path, None, kw["key_location"])


@dataclass(frozen=True)
class Size:
    """A released model size the generated code never reads (buffer shapes
    in ``gen-mixin plan``)."""

    name: str
    value: int
    location: Location


class SizeValue(Integer):
    def __init__(self) -> None:
        super().__init__(minimum=0)

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        name, loc = kw["key"], kw["key_location"]
        check_name(ctx, loc, field, name, "size")
        if ctx.kind_of(name) is not None:
            ctx.error(loc, field, f"{name!r} is already declared elsewhere")
        ctx.declare(NameKind.SIZE, name, loc, field)
        value = super().value(node, field, ctx)
        return INVALID if value is INVALID else Size(name, value, loc)


class HostMethodName(ValueType):
    """A method of the host model (``get_max_frames_per_video``, a private
    helper ``_process_image_input``), or a dotted path under a ``host:``
    attribute that steps and builders call (``vision.encode``: a method or a
    submodule of the model); never ``torch.nn.Module``'s own API."""

    words = "identifier or dotted host path"

    def schema(self) -> dict[str, Any]:
        from generator.spec.values import DOTTED

        return {"type": "string", "pattern": DOTTED}

    def value(self, node: Node, field: str, ctx: ReadContext, **_: Any) -> Any:
        name = node.value
        if isinstance(name, str) and "." in name:
            return _dotted_host_method(node, field, ctx, name)
        if is_name(name) and name in MODULE_API:
            ctx.error(
                node,
                field,
                f"{name!r} is torch.nn.Module's own API, not a method of the model",
            )
            ctx.bad_names.add(name)
        elif is_name(name) and name.startswith("_") and not name.startswith("__"):
            # vLLM's mixins call private helpers of their host
            # (``self._process_image_input``): declared ones may be called.
            if name in METHODS:
                ctx.error(
                    node, field, f"host method {name!r} is a method the mixin defines"
                )
                ctx.bad_names.add(name)
        elif is_name(name) and name.startswith("__"):
            ctx.error(
                node,
                field,
                f"host method {name!r} must not start with '__' (a private "
                "helper starts with one '_')",
            )
            ctx.bad_names.add(name)
        else:
            check_name(ctx, node.location, field, name, "host method")
        if ctx.kind_of(name) in (NameKind.HOST, NameKind.HOST_METHOD, NameKind.IMPORT):
            ctx.error(node, field, f"{name!r} is declared twice")
        ctx.declare(NameKind.HOST_METHOD, name, node.location, field)
        return name


def _dotted_host_method(node: Node, field: str, ctx: ReadContext, name: str) -> Any:
    """``vision.encode``: public names under a declared host attribute."""
    root, *rest = name.split(".")
    problem = None
    if not all(is_name(p) for p in (root, *rest)):
        problem = f"{name!r} is not a dotted host path"
    elif root not in ctx.names[NameKind.HOST]:
        problem = f"{root!r} is not a host attribute"
    elif any(p.startswith("_") for p in rest):
        problem = f"{name!r} names a private attribute"
    elif any(p in MODULE_API for p in rest):
        api = next(p for p in rest if p in MODULE_API)
        problem = f"{name!r} names {api!r}, torch.nn.Module's own API, not the model's"
    elif name in ctx.names[NameKind.HOST_METHOD]:
        problem = f"{name!r} is declared twice"
    else:
        annotations = {h.name: h.annotation for h in ctx.partial.get("host", ())}
        classes = model_classes(ctx.partial.get("imports", ()))
        if root in annotations:
            problem = dotted_method_problem(root, rest, annotations[root], classes)
    if problem is not None:
        ctx.error(node, field, problem)
        return INVALID
    ctx.declare(NameKind.HOST_METHOD, name, node.location, field)
    return name
