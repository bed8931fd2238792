"""The types a spec key's value may have.

Each type checks a located YAML value and converts it (:meth:`ValueType.convert`:
the typed value, or :data:`INVALID` after reporting why), states itself as
JSON Schema (:meth:`ValueType.schema`) and in words for the docs
(:meth:`ValueType.describe`). Formulas are parsed here, in the scope their key
declares (:data:`generator.scopes.FIELD_SCOPES`), so a formula's names are
checked where it is read.
"""

from __future__ import annotations

import functools
import keyword
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from generator import formulas as fx
from generator.diagnostics import Location
from generator.formulas import Expr, FormulaError
from generator.scopes import FIELD_SCOPES
from generator.spec.reader import (
    INVALID,
    Keys,
    ReadContext,
    Reader,
    section_schema,
)
from generator.spec.step_language import host_surface, reach_problem
from generator.yaml_loader import Node

if TYPE_CHECKING:
    from generator.spec.enums import SpecEnum


IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
DOTTED = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_CLASS_NAME_RE = re.compile(r"[A-Z][A-Za-z0-9_]*")
MAX_TEXT = 2000
#: At most this many names are listed after "unknown name".
MAX_LISTED_NAMES = 16

_JSON_KIND = {
    "mapping": "object",
    "sequence": "array",
    "string": "string",
    "integer": "integer",
    "boolean": "boolean",
    "null": "null",
    "number": "number",
}
_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "boolean": "true or false",
    "null": "null",
    "number": "a number",
}


def _json_type(kinds: tuple[str, ...]) -> str | list[str]:
    return kinds[0] if len(kinds) == 1 else list(kinds)


class ValueType:
    """A key's value: what YAML kinds it accepts and what it converts to."""

    kinds: tuple[str, ...] = ("string",)
    words: str = "a string"

    def schema(self) -> dict[str, Any]:
        return {"type": _json_type(self.kinds)}

    def describe(self) -> str:
        return self.words

    def accepts(self, node: Node) -> bool:
        return _JSON_KIND[node.kind] in self.kinds

    def convert(self, node: Node, field: str, ctx: ReadContext, **kwargs: Any) -> Any:
        if self.convert_kind(node, field, ctx) is INVALID:
            return INVALID
        return self.value(node, field, ctx, **kwargs)

    def convert_kind(self, node: Node, field: str, ctx: ReadContext) -> Any:
        """``node`` if its YAML kind is one this type accepts, else INVALID
        (reported)."""
        if not self.accepts(node):
            wanted = " or ".join(_WORDS[k] for k in self.kinds)
            ctx.error(node, field, f"expected {wanted}, got {node.kind}")
            return INVALID
        return node

    def value(self, node: Node, field: str, ctx: ReadContext, **kwargs: Any) -> Any:
        return node.value


# -- scalars --------------------------------------------------------------------------


class Text(ValueType):
    """Free text: a comment, docstring or message once generated."""

    def __init__(
        self, docstring: bool = False, nonempty: bool = False, one_line: bool = False
    ) -> None:
        self.docstring = docstring
        self.nonempty = nonempty
        self.one_line = one_line
        self.words = "text" if not one_line else "one line of text"

    def value(self, node: Node, field: str, ctx: ReadContext, **_: Any) -> Any:
        text = node.value.strip("\n")
        if self.nonempty and not text.strip():
            ctx.error(node, field, "must not be empty")
            return INVALID
        if any(c != "\n" and not c.isprintable() for c in text):
            ctx.error(node, field, "text must be printable (no control characters)")
            return INVALID
        if len(text) > MAX_TEXT:
            ctx.error(node, field, f"text longer than {MAX_TEXT} characters")
            return INVALID
        if self.docstring and ('"""' in text or "\\" in text):
            ctx.error(node, field, 'docstrings may not contain """ or backslashes')
            return INVALID
        if self.one_line and "\n" in text:
            ctx.error(node, field, "must be one line")
            return INVALID
        return text


def is_name(text: str) -> bool:
    """An identifier (``fullmatch``: no trailing newline) that is no keyword."""
    return bool(_IDENT_RE.fullmatch(text)) and not keyword.iskeyword(text)


class Identifier(ValueType):
    words = "identifier"

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": IDENT}

    def value(self, node: Node, field: str, ctx: ReadContext, **_: Any) -> Any:
        if not _IDENT_RE.fullmatch(node.value):
            ctx.error(node, field, f"{node.value!r} is not a valid identifier")
            return INVALID
        return node.value


class ClassName(Identifier):
    words = "class name (`CamelCase`, underscores allowed)"

    def value(self, node: Node, field: str, ctx: ReadContext, **_: Any) -> Any:
        name = super().value(node, field, ctx)
        if name is INVALID:
            ctx.error(node, field, "expected a CamelCase class name")
            return INVALID
        if keyword.iskeyword(name):
            ctx.error(node, field, f"{name!r} is a Python keyword")
            return INVALID
        if not _CLASS_NAME_RE.fullmatch(name):
            ctx.error(node, field, "expected a CamelCase class name")
            return INVALID
        return name


class DottedName(ValueType):
    words = "dotted module name"

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": DOTTED}

    def value(self, node: Node, field: str, ctx: ReadContext, **_: Any) -> Any:
        if not _DOTTED_RE.fullmatch(node.value) or any(
            keyword.iskeyword(part) for part in node.value.split(".")
        ):
            ctx.error(node, field, f"{node.value!r} is not a dotted module name")
            return INVALID
        return node.value


class Integer(ValueType):
    kinds = ("integer",)

    def __init__(
        self,
        minimum: int | None = None,
        maximum: int | None = None,
        choices: tuple[int, ...] | None = None,
    ) -> None:
        self.minimum, self.maximum, self.choices = minimum, maximum, choices

    def describe(self) -> str:
        if self.choices:
            return " / ".join(f"`{c}`" for c in self.choices)
        if self.minimum is not None and self.maximum is not None:
            return f"integer {self.minimum}..{self.maximum}"
        if self.minimum is not None:
            return f"integer >= {self.minimum}"
        return "integer"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer"}
        if self.choices:
            out["enum"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out

    def value(self, node: Node, field: str, ctx: ReadContext, **_: Any) -> Any:
        value = node.value
        bad = False
        if self.choices and value not in self.choices:
            choices = ", ".join(str(c) for c in self.choices)
            ctx.error(
                node, field, f"unknown value {value!r} (expected one of: {choices})"
            )
            bad = True
        if self.minimum is not None and value < self.minimum:
            ctx.error(node, field, f"must be >= {self.minimum}")
            bad = True
        if self.maximum is not None and value > self.maximum:
            ctx.error(node, field, f"must be <= {self.maximum}")
            bad = True
        return INVALID if bad else value


class Boolean(ValueType):
    kinds = ("boolean",)
    words = "`true` / `false`"


class Choice(ValueType):
    """One member of a closed set (an Enum whose values are the spellings)."""

    def __init__(
        self, enum: type[SpecEnum], exclude: tuple[SpecEnum, ...] = ()
    ) -> None:
        self.enum = enum
        self.exclude = exclude

    def values(self) -> list[str]:
        return [m.value for m in self.enum if m not in self.exclude]

    def describe(self) -> str:
        return " / ".join(f"`{v}`" for v in self.values())

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": self.values()}

    def value(self, node: Node, field: str, ctx: ReadContext, **_: Any) -> Any:
        try:
            member = self.enum(node.value)
            if member in self.exclude:
                raise ValueError(node.value)
            return member
        except ValueError:
            choices = ", ".join(self.values())
            ctx.error(
                node,
                field,
                f"unknown value {node.value!r} (expected one of: {choices})",
            )
            return INVALID


# -- formulas -------------------------------------------------------------------------


def formula_location(node: Node, exc: FormulaError) -> Location:
    """Where ``exc`` points: its column inside the value when the value is
    written on one line as it reads, else the value's start."""
    loc = node.location
    if node.text_col is None:
        return loc
    return Location(loc.file, loc.line, node.text_col + exc.column)


def _names_listed(scope: fx.Scope) -> str:
    return _listing(scope.names | scope.host_roots)


@functools.lru_cache(maxsize=64)
def _listing(in_scope: frozenset[str]) -> str:
    """The names in scope, as a message lists them (the same scope serves
    every formula of a field: a spec of many unknown names asks often)."""
    names = sorted(n for n in in_scope if fx.is_identifier(n))
    if not names:
        return " (no names are in scope here)"
    shown = names[:MAX_LISTED_NAMES]
    more = len(names) - len(shown)
    tail = f", and {more} more" if more else ""
    return f" (names here: {', '.join(shown)}{tail})"


def formula_error_message(
    exc: FormulaError, scope: fx.Scope, unbound: dict[str, str] | None = None
) -> str:
    """The message of a formula's problem, taught: an unknown name lists the
    names in scope there, or says why a built-in name is not bound here."""
    message = str(exc)
    if "never closed" in message or "unmatched" in message:
        message += " (a formula with a comma inside a [...] list must be quoted)"
    if message.startswith("unknown name"):
        why = next(
            (
                w
                for n, w in (unbound or {}).items()
                if message.split(";")[0] == f"unknown name {n!r}"
            ),
            None,
        )
        message += f" ({why})" if why else _names_listed(scope)
    return message


def parsed_or_reported(
    parse: Callable[[str, fx.Scope], Any],
    node: Node,
    field: str,
    ctx: ReadContext,
    scope: fx.Scope,
) -> Any:
    """``parse(node.value, scope)``, or None after reporting its problem at
    the place in the value it points to, taught (:func:`formula_error_message`
    with the names the context leaves unbound)."""
    try:
        return parse(node.value, scope)
    except FormulaError as exc:
        ctx.error(
            formula_location(node, exc),
            field,
            formula_error_message(exc, scope, ctx.unbound),
        )
        return None


def zero_divisor(expr: Expr) -> str | None:
    """How ``expr`` divides by a literal zero, if it does."""
    for sub in fx.walk(expr):
        if isinstance(sub, fx.BinOp) and sub.op in ("//", "%"):
            if sub.right == fx.Num(0):
                return f"'{sub.op}' by the literal 0"
        if isinstance(sub, fx.Func) and sub.name == "ceil_div":
            if sub.args[1] == fx.Num(0):
                return "ceil_div by the literal 0"
    return None


def parse_formula(
    node: Node, field: str, ctx: ReadContext, scope: fx.Scope, literals: bool = False
) -> Any:
    """A YAML scalar parsed as an expression in ``scope`` (or INVALID)."""
    value = node.value
    if isinstance(value, bool) or value is None:
        return fx.Literal(value) if literals else INVALID
    if isinstance(value, int):
        return fx.Num(value)
    expr = parsed_or_reported(fx.parse_expression, node, field, ctx, scope)
    if expr is None:
        return INVALID
    zero = zero_divisor(expr)
    if zero is not None:
        ctx.error(node, field, f"division by zero: {zero} always raises")
        return INVALID
    reach = reach_error(expr, ctx)
    if reach is not None:
        ctx.error(node, field, reach)
        return INVALID
    return expr


def reach_error(expr: Expr, ctx: ReadContext) -> str | None:
    """How ``expr`` reaches beyond what the spec declares of its host and
    the step language's allow-lists (:mod:`generator.spec.step_language`)."""
    surface = host_surface(
        ctx.names, ctx.partial.get("host", ()), ctx.partial.get("imports", ())
    )
    return reach_problem(expr, surface)


class Formula(ValueType):
    """An expression (:mod:`generator.formulas`) over the names of a scope."""

    kinds = ("string", "integer")
    words = "expression"

    def __init__(self, scope: str) -> None:
        self.scope_id = scope
        assert scope in FIELD_SCOPES  # noqa: S101 (a typo in a declaration)

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        scope = ctx.scope(self.scope_id, kw.get("extra", ()))
        return parse_formula(node, field, ctx, scope)


class HostPathValue(Formula):
    """A host attribute path (``vision.blocks[0].attn.attn_backend``)."""

    kinds = ("string",)
    words = "host path"

    def __init__(self) -> None:
        super().__init__("host_path")

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        expr = super().value(node, field, ctx, **kw)
        if expr is not INVALID and not isinstance(expr, fx.HostPath):
            ctx.error(
                node, field, "expected a host attribute path (e.g. vision.config.x)"
            )
            return INVALID
        return expr


class CallValue(Formula):
    """A call of a host method or imported helper, with its arguments."""

    kinds = ("string",)
    words = "call"

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        scope = ctx.scope(self.scope_id)
        expr = parse_formula(node, field, ctx, scope, literals=True)
        if expr is INVALID:
            return INVALID
        if not isinstance(expr, fx.Call):
            ctx.error(node, field, "expected a call, e.g. builder(grid, device=device)")
            return INVALID
        if any(isinstance(e, fx.Call) for e in fx.walk(expr) if e is not expr):
            ctx.error(node, field, "nested calls are not allowed in a builder call")
            return INVALID
        return expr


class Argument(Formula):
    """A keyword argument's value: an expression or ``true``/``false``/``null``."""

    kinds = ("string", "integer", "boolean", "null")
    words = "expression or literal"

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        return parse_formula(node, field, ctx, ctx.scope(self.scope_id), literals=True)


class DtypeValue(Formula):
    """``dtype`` (the manager's), a torch dtype by name (``bool``,
    ``int64``, ...: the :class:`~generator.spec.enums.Dtype` spellings) or a
    host path."""

    kinds = ("string", "integer")
    words = "`dtype`, a dtype name (`bool`, `int64`, ...) or host path"

    def __init__(self) -> None:
        super().__init__("tensor_dtype")

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        from generator.spec.enums import Dtype

        text = node.value
        if isinstance(text, str) and text in Dtype.values():
            return Dtype(text) if text != "dtype" else fx.Ref("dtype")
        scope = ctx.scope(self.scope_id)
        if isinstance(text, str) and is_name(text) and text not in scope.host_roots:
            names = ", ".join(v for v in Dtype.values() if v != "dtype")
            ctx.error(
                node,
                field,
                f"unknown dtype {text!r} (expected dtype, a dtype name: {names}; "
                "or a host path)",
            )
            return INVALID
        expr = super().value(node, field, ctx, **kw)
        if expr is not INVALID and not isinstance(expr, (fx.HostPath, fx.Ref)):
            ctx.error(node, field, "expected 'dtype', a dtype name or a host path")
            return INVALID
        return expr


# -- collections ----------------------------------------------------------------------


class ListOf(ValueType):
    kinds = ("array",)

    def __init__(
        self, item: ValueType, min_items: int = 0, max_items: int | None = None
    ) -> None:
        self.item = item
        self.min_items = min_items
        self.max_items = max_items

    def describe(self) -> str:
        return f"list of {self.item.describe()}"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": self.item.schema()}
        if self.min_items:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        if self.max_items is not None and len(node.value) > self.max_items:
            # Refused before any item is read: each may cost a parse and,
            # later, a round of the static checks.
            ctx.error(
                node,
                field,
                f"has {len(node.value)} items (at most {self.max_items})",
            )
            return INVALID
        short = len(node.value) < self.min_items
        if short:
            ctx.error(node, field, f"needs at least {self.min_items} item(s)")
        kw.pop("index", None)  # a list inside a list: each item's own index
        items = [
            self.item.convert(child, f"{field}[{i}]", ctx, index=i, **kw)
            for i, child in enumerate(node.value)
        ]
        return INVALID if short else items


class MapOf(ValueType):
    """A mapping from names the spec declares to values of one type; the
    result keeps the order and maps keys whose value failed to INVALID."""

    kinds = ("object",)

    def __init__(self, item: ValueType, min_items: int = 0) -> None:
        self.item = item
        self.min_items = min_items

    def describe(self) -> str:
        return f"mapping name → {self.item.describe()}"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "object",
            "propertyNames": {"pattern": IDENT},
            "additionalProperties": self.item.schema(),
        }
        if self.min_items:
            out["minProperties"] = self.min_items
        return out

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        if len(node.value) < self.min_items:
            ctx.error(node, field, "must not be empty")
        out = {}
        locations = node.key_locations or {}
        # A nested mapping's entries are keyed by their own names.
        kw = {k: v for k, v in kw.items() if k not in ("key", "key_location")}
        for key, child in node.value.items():
            from generator.diagnostics import field_key

            path = f"{field}.{field_key(key)}"
            loc = locations.get(key, child.location)
            if not _IDENT_RE.fullmatch(key):
                ctx.error(loc, path, f"{key!r} is not a valid identifier")
            out[key] = self.item.convert(
                child, path, ctx, key=key, key_location=loc, **kw
            )
        return out


class Section(ValueType):
    """A nested mapping read by ``cls.from_yaml(reader, **kwargs)``."""

    kinds = ("object",)

    def __init__(self, cls: type) -> None:
        self.cls = cls

    @property
    def keys(self) -> Keys:
        return self.cls.KEYS

    def describe(self) -> str:
        return f"mapping ({self.cls.DOC_TITLE})"

    def schema(self) -> dict[str, Any]:
        return section_schema(self.keys, getattr(self.cls, "DOC", None))

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        reader = Reader(node, field, self.keys, ctx)
        result = self.cls.from_yaml(reader, **kw)
        reader.done()
        return INVALID if result is None else result


class OneOf(ValueType):
    """The first of ``options`` that accepts the value's YAML kind."""

    def __init__(self, *options: ValueType) -> None:
        self.options = options
        self.kinds = tuple(k for o in options for k in o.kinds)

    def describe(self) -> str:
        return " or ".join(o.describe() for o in self.options)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [o.schema() for o in self.options]}

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        option = next(o for o in self.options if o.accepts(node))
        return option.value(node, field, ctx, **kw)
