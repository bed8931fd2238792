"""Spec expressions: parsed with ``ast`` against an allow-list, printed by us.

A spec is untrusted input. Its formulas (``t * h * w // (merge * merge)``)
and steps (``feats = vision(pixel_values).view(-1, hidden)``) are parsed with
``ast.parse(..., mode="eval")``, every node is checked against an allow-list,
and the result is converted into the small frozen tree below. Generated code
is printed from that tree by :func:`to_python`, never copied from the spec
text, and nothing is ever evaluated with ``eval``: :func:`evaluate` walks the
tree with plain integer arithmetic.

Allowed everywhere:

* integer literals within int64; ``True``/``False``/``None`` where a call
  argument is expected;
* names the context declares (grid dims, constants, buffers, built-ins);
* host attribute paths rooted at a declared host attribute
  (``vision.blocks[0].attn``), with integer subscripts and no private
  (``_``-prefixed) attributes; a declared host method may be private;
* ``+ - * // %``, ``**`` with a literal exponent of at most 8, unary minus,
  parentheses;
* comparisons ``== != < <= > >=`` (one operator each), ``not``, ``and``,
  ``or``, and conditional expressions ``a if cond else b``: integers in
  the arithmetic fields (a comparison is 1 or 0, ``and``/``or`` return an
  operand, as in Python);
* ``ceil_div(a, b)``, ``min(a, ...)``, ``max(a, ...)``, ``ceil_sqrt(n)``
  (``math.isqrt(n - 1) + 1``: the ceiling of the square root of ``n >= 1``,
  in integers);
* calls of host methods or imported helpers where the context allows calls,
  with positional and keyword arguments (no ``*args``/``**kwargs``);
* at most :data:`MAX_EXPRESSION_LENGTH` characters and :data:`MAX_NODES`
  operators and operands.

In forward steps (a scope with ``tensor_ops``) also: attributes, method
calls and subscripts (slices, ``...``, ``None``) on any value, with plain
attribute and method names; ``torch.<name>`` for :data:`TORCH_FUNCTIONS`
and :data:`TORCH_DTYPES`; the built-ins of :data:`BUILTIN_FUNCTIONS`
(``next``), in post-processing steps also ``int``
(:data:`HOST_INT_FUNCTIONS`); list and tuple displays; string and float
literals; ``/`` and unary ``~``. Which attributes, methods and host paths a
parsed expression may then reach is :mod:`generator.spec.step_language`'s
allow-lists.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from generator.diagnostics import closest_name
from generator.limits import MAX_INTEGER

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_EXPRESSION_LENGTH = 400
MAX_DEPTH = 24
#: Operators and operands of one expression (the project's largest formula
#: has 9): the static checks evaluate each formula at many sample values, so
#: this bounds their work.
MAX_NODES = 64
MAX_POWER = 8
ARITHMETIC_FUNCTIONS = ("ceil_div", "min", "max", "ceil_sqrt")
#: ``torch.<name>`` functions a forward step may call.
TORCH_FUNCTIONS = frozenset(
    {
        "arange",
        "as_tensor",
        "cat",
        "empty",
        "full",
        "ones",
        "ones_like",
        "repeat_interleave",
        "split",
        "stack",
        "tensor",
        "where",
        "zeros",
        "zeros_like",
    }
)
#: Python built-in functions a forward step may call (unless a spec name
#: shadows them): ``next`` reads a module's first parameter, as vLLM's
#: mixins find a projector's dtype (``next(proj.parameters()).dtype``).
BUILTIN_FUNCTIONS = frozenset({"next"})
#: Built-ins a scope must allow by name (:attr:`Scope.host_ints`): ``int``
#: copies a one-element tensor to the host, which only post-processing does
#: (it runs after the graph, on the host's schedule).
HOST_INT_FUNCTIONS = frozenset({"int"})
#: ``torch.<name>`` dtypes a forward step may name.
TORCH_DTYPES = frozenset(
    {
        "bfloat16",
        "bool",
        "complex64",
        "complex128",
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
    }
)


class FormulaError(ValueError):
    """A problem in one expression; ``column`` is 0-based within its text."""

    def __init__(self, message: str, column: int = 0) -> None:
        super().__init__(message)
        self.column = column


def is_identifier(name: str) -> bool:
    return bool(IDENTIFIER.match(name)) and not keyword.iskeyword(name)


# -- the expression tree ------------------------------------------------------


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class Literal:
    """``True``, ``False`` or ``None`` (call arguments only); in forward
    steps also a string or a finite float. Printed with ``repr``."""

    value: bool | None | str | float


@dataclass(frozen=True)
class Ref:
    """A declared name: a grid dim, constant, buffer, input or built-in."""

    name: str


@dataclass(frozen=True)
class HostPath:
    """``self.<parts>``: attribute names and integer subscripts."""

    parts: tuple[str | int, ...]

    @property
    def dotted(self) -> str:
        out = ""
        for part in self.parts:
            out += (
                f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
            )
        return out


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * // % ** (and / in forward steps)
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg:
    operand: Expr


@dataclass(frozen=True)
class Func:
    """``ceil_div``, ``min``, ``max`` or ``ceil_sqrt``."""

    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Compare:
    op: str  # one of == != < <= > >=
    left: Expr
    right: Expr


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" or "or"
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class IfExp:
    """``body if test else orelse``."""

    test: Expr
    body: Expr
    orelse: Expr


@dataclass(frozen=True)
class Invert:
    """``~operand`` (forward steps: a boolean mask's complement)."""

    operand: Expr


@dataclass(frozen=True)
class Torch:
    """``torch.<name>``: a function of :data:`TORCH_FUNCTIONS` (called) or a
    dtype of :data:`TORCH_DTYPES`."""

    name: str


@dataclass(frozen=True)
class Builtin:
    """A Python built-in function of :data:`BUILTIN_FUNCTIONS` or
    :data:`HOST_INT_FUNCTIONS` (called)."""

    name: str


@dataclass(frozen=True)
class Attr:
    """``value.name`` on a value that is not a host path (a step's result,
    a buffer, an input): ``out.last_hidden_state``, ``x.view``."""

    value: Expr
    name: str


@dataclass(frozen=True)
class Slice:
    """``lower:upper:step`` inside a subscript (``None``: left out)."""

    lower: Expr | None
    upper: Expr | None
    step: Expr | None


@dataclass(frozen=True)
class Dots:
    """``...`` inside a subscript."""


@dataclass(frozen=True)
class Display:
    """A list (``[a, b]``) or tuple (``(a, b)``) display; a subscript of
    several dimensions (``x[:, 4:]``) has a tuple as its index."""

    kind: str  # "list" or "tuple"
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Subscript:
    """``value[index]`` on a value that is not a host path."""

    value: Expr
    index: Expr


@dataclass(frozen=True)
class Call:
    """A call of a host method/module (``HostPath``), an imported helper
    (``Ref``), a torch function (``Torch``) or a method of a value (``Attr``)."""

    callee: HostPath | Ref | Torch | Builtin | Attr
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]


Expr = (
    Num
    | Literal
    | Ref
    | HostPath
    | BinOp
    | Neg
    | Func
    | Compare
    | BoolOp
    | Not
    | IfExp
    | Invert
    | Torch
    | Builtin
    | Attr
    | Slice
    | Dots
    | Display
    | Subscript
    | Call
)
_NODES = Expr.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Scope:
    """What an expression may mention.

    ``names``: declared names. ``host_roots``: host attributes a path may
    start at. ``callables``: imported helper names that may be called.
    ``allow_calls``: whether calls (of host paths or helpers) are allowed.
    ``allow_literals``: whether ``True``/``False``/``None`` are allowed.
    ``tensor_ops``: a forward step's expression (attributes, methods and
    subscripts of values, ``torch.*``, displays, strings, floats, ``/``, ``~``).
    ``host_ints``: a post-processing step, which may also call ``int(x)``.
    """

    names: frozenset[str]
    host_roots: frozenset[str] = frozenset()
    callables: frozenset[str] = frozenset()
    allow_calls: bool = False
    allow_literals: bool = False
    tensor_ops: bool = False
    #: ``int(x)`` (:data:`HOST_INT_FUNCTIONS`): post-processing steps only.
    host_ints: bool = False


_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_COMPARISONS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
}


#: Plain words for the syntax a spec expression may not use, by AST class.
_OPERATOR_SYMBOLS = {
    ast.Div: "/",
    ast.MatMult: "@",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.Not: "not",
    ast.Invert: "~",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
}
_NOT_ALLOWED = {
    ast.Lambda: "lambdas",
    ast.NamedExpr: "assignment expressions (:=)",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Set: "sets",
    ast.Dict: "dicts",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "generator expressions",
    ast.JoinedStr: "f-strings",
    ast.FormattedValue: "f-strings",
    ast.Starred: "starred expressions",
    ast.Slice: "slices",
    ast.Await: "'await' expressions",
    ast.Yield: "'yield' expressions",
    ast.YieldFrom: "'yield' expressions",
}
#: Only a forward step's expression (``Scope.tensor_ops``) may use these.
_STEPS_ONLY = "only allowed in forward steps"


@lru_cache(maxsize=64)
def _spellable(names: frozenset[str]) -> frozenset[str]:
    """The names a formula can spell (an invalid input key is reported where
    it is declared; suggesting it would be wrong advice)."""
    return frozenset(n for n in names if is_identifier(n))


def _suggest(name: str, choices: frozenset[str] | set[str]) -> str:
    close = closest_name(name, _spellable(frozenset(choices)))
    return f"; did you mean {close!r}?" if close else ""


def _is_path_index(node: ast.AST) -> bool:
    """A host path's subscript: a non-negative integer literal."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
        and node.value >= 0
    )


def _is_torch(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "torch"


class _Converter:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def fail(self, node: ast.AST, message: str) -> FormulaError:
        return FormulaError(message, getattr(node, "col_offset", 0))

    def convert(self, node: ast.AST, depth: int = 0) -> Expr:
        if depth > MAX_DEPTH:
            raise self.fail(node, "expression is nested too deeply")
        handler = _HANDLERS.get(type(node))
        if handler is not None:
            return handler(self, node, depth)
        what = _NOT_ALLOWED.get(type(node))
        if what is not None:
            where = _STEPS_ONLY if type(node) in (ast.List, ast.Tuple) else ""
            if where and not self.scope.tensor_ops:
                raise self.fail(node, f"{what} are {where}")
            raise self.fail(node, f"{what} are not allowed in a spec expression")
        raise self.fail(
            node, f"{type(node).__name__} is not allowed in a spec expression"
        )

    def steps_only(self, node: ast.AST, what: str) -> None:
        if not self.scope.tensor_ops:
            raise self.fail(node, f"{what} {_STEPS_ONLY}")

    # -- leaves ---------------------------------------------------------------

    def constant(self, node: ast.Constant, depth: int) -> Expr:
        value = node.value
        if isinstance(value, bool) or value is None:
            if not self.scope.allow_literals:
                raise self.fail(node, f"{value!r} is not allowed in a formula")
            return Literal(value)
        if isinstance(value, int):
            if value > MAX_INTEGER:
                raise self.fail(
                    node, f"integer literal out of range (at most {MAX_INTEGER})"
                )
            return Num(value)
        if self.scope.tensor_ops:
            if isinstance(value, str) or (
                isinstance(value, float) and math.isfinite(value)
            ):
                return Literal(value)
            raise self.fail(
                node,
                f"literal {value!r} is not allowed (integers, strings, finite "
                "floats)",
            )
        if value is Ellipsis:
            raise self.fail(node, "'...' is only allowed in a forward step's subscript")
        raise self.fail(node, f"literal {value!r} is not allowed (only integers)")

    def name(self, node: ast.Name, depth: int = 0) -> Expr:
        name = node.id
        if not is_identifier(name) or name.startswith("__"):
            raise self.fail(node, f"bad identifier {name!r}")
        if name in self.scope.names:
            return Ref(name)
        if name in self.scope.host_roots:
            return HostPath((name,))
        if name == "torch":
            raise self.fail(
                node,
                "torch is only allowed as torch.<function or dtype> in forward steps",
            )
        known = set(self.scope.names) | set(self.scope.host_roots)
        raise self.fail(node, f"unknown name {name!r}{_suggest(name, known)}")

    def torch(self, node: ast.Attribute, called: bool) -> Torch:
        self.steps_only(node, "torch functions and dtypes are")
        name = node.attr
        allowed = TORCH_FUNCTIONS if called else TORCH_DTYPES
        if name in allowed:
            return Torch(name)
        if name in TORCH_FUNCTIONS:
            raise self.fail(node, f"torch.{name} must be called")
        if name in TORCH_DTYPES:
            raise self.fail(node, f"torch.{name} is a dtype, not a function")
        everything = TORCH_FUNCTIONS | TORCH_DTYPES
        raise self.fail(
            node,
            f"torch.{name} is not allowed{_suggest(name, everything)} (functions: "
            f"{', '.join(sorted(TORCH_FUNCTIONS))}; dtypes: "
            f"{', '.join(sorted(TORCH_DTYPES))})",
        )

    # -- host paths, attributes, subscripts -------------------------------------

    def is_host_path(self, node: ast.AST) -> bool:
        """Whether ``node`` is attributes and integer subscripts down to a
        declared host attribute."""
        cur = node
        while isinstance(cur, (ast.Attribute, ast.Subscript)):
            if isinstance(cur, ast.Subscript) and not _is_path_index(cur.slice):
                return False
            cur = cur.value
        return isinstance(cur, ast.Name) and cur.id in self.scope.host_roots

    def check_attribute(self, node: ast.Attribute) -> None:
        if not is_identifier(node.attr) or node.attr.startswith("_"):
            # Point at the name after the dot (the node starts at its value).
            end = getattr(node, "end_col_offset", None)
            column = node.col_offset
            if end is not None and node.end_lineno == node.lineno:
                column = end - len(node.attr)
            raise FormulaError(
                f"attribute {node.attr!r} is not allowed (private or bad name)",
                column,
            )

    def attribute(self, node: ast.Attribute, depth: int) -> Expr:
        self.check_attribute(node)
        if _is_torch(node.value):
            return self.torch(node, called=False)
        if self.scope.tensor_ops and not self.is_host_path(node):
            return Attr(self.convert(node.value, depth + 1), node.attr)
        return self.host_path(node)

    def subscript(self, node: ast.Subscript, depth: int) -> Expr:
        if self.scope.tensor_ops and not self.is_host_path(node):
            value = self.convert(node.value, depth + 1)
            return Subscript(value, self.index(node.slice, depth + 1, top=True))
        return self.host_path(node)

    def index(self, node: ast.AST, depth: int, top: bool = False) -> Expr:
        """A subscript's index: an expression, a slice, ``...``, ``None``, or
        (at the top) a tuple of those."""
        if isinstance(node, ast.Slice):
            parts = (node.lower, node.upper, node.step)
            return Slice(
                *(None if p is None else self.convert(p, depth + 1) for p in parts)
            )
        if isinstance(node, ast.Constant) and node.value is Ellipsis:
            return Dots()
        if isinstance(node, ast.Constant) and node.value is None:
            return Literal(None)
        if top and isinstance(node, ast.Tuple):
            return Display("tuple", tuple(self.index(e, depth + 1) for e in node.elts))
        return self.convert(node, depth)

    def host_path(self, node: ast.AST) -> HostPath:
        parts: list[str | int] = []
        cur = node
        outer: ast.AST = node  # the attribute or subscript applied to ``cur``
        while True:
            if isinstance(cur, (ast.Attribute, ast.Subscript)):
                outer = cur
            if isinstance(cur, ast.Attribute):
                self.check_attribute(cur)
                parts.append(cur.attr)
                cur = cur.value
            elif isinstance(cur, ast.Subscript):
                if not _is_path_index(cur.slice):
                    raise self.fail(
                        cur, "only non-negative integer subscripts are allowed"
                    )
                parts.append(cur.slice.value)  # type: ignore[attr-defined]
                cur = cur.value
            elif isinstance(cur, ast.Name):
                self.path_root(cur, outer)
                parts.append(cur.id)
                break
            else:
                raise self.fail(cur, "attribute paths must start at a host attribute")
        return HostPath(tuple(reversed(parts)))

    def path_root(self, root: ast.Name, outer: ast.AST) -> None:
        name = root.id
        if name in self.scope.host_roots:
            return
        if name in self.scope.names:
            what = "subscripts" if isinstance(outer, ast.Subscript) else "attributes"
            raise self.fail(
                root,
                f"{name!r} is not a host attribute; {what} are only "
                "allowed on host attribute paths (e.g. vision.blocks[0])",
            )
        raise self.fail(
            root,
            f"{name!r} is not a declared host attribute"
            f"{_suggest(name, self.scope.host_roots)}",
        )

    # -- operators --------------------------------------------------------------

    def binop(self, node: ast.BinOp, depth: int) -> Expr:
        op = _BINOPS.get(type(node.op))
        if isinstance(node.op, ast.Div):
            if not self.scope.tensor_ops:
                raise self.fail(node, "'/' is not allowed (use // or ceil_div)")
            op = "/"
        if op is None:
            raise self.fail(
                node,
                f"operator {self.operator(node.op)!r} is not allowed "
                "(expected one of + - * // % **)",
            )
        left = self.convert(node.left, depth + 1)
        right = self.convert(node.right, depth + 1)
        if op in ("//", "%"):
            self.check_divisor(node.right, right, f"'{op}'")
        if op == "**" and not (
            isinstance(right, Num) and 0 <= right.value <= MAX_POWER
        ):
            raise self.fail(
                node, f"the exponent of ** must be a literal 0..{MAX_POWER}"
            )
        return BinOp(op, left, right)

    def check_divisor(self, node: ast.AST, divisor: Expr, what: str) -> None:
        """Refuse a divisor that is 0 whatever the names' values (``0``,
        ``1 - 1``, ``2 * 0``, ``min(0, 5)``): it always raises. A divisor that
        is 0 only for some values is the static checks' (every checked
        budget)."""
        if constant_value(divisor) != 0:
            return
        spelled = (
            "the literal 0"
            if divisor == Num(0)
            else f"{to_spec_text(divisor)!r}, which is 0,"
        )
        raise self.fail(node, f"division by zero: {what} by {spelled} always raises")

    def unaryop(self, node: ast.UnaryOp, depth: int) -> Expr:
        if isinstance(node.op, ast.Invert):
            if not self.scope.tensor_ops:
                raise self.fail(node, f"operator '~' is {_STEPS_ONLY}")
            return Invert(self.convert(node.operand, depth + 1))
        if isinstance(node.op, ast.Not):
            return Not(self.convert(node.operand, depth + 1))
        operand = self.convert(node.operand, depth + 1)
        if isinstance(node.op, ast.UAdd):
            return operand
        if isinstance(operand, Num):
            return Num(-operand.value)
        return Neg(operand)

    def compare(self, node: ast.Compare, depth: int) -> Expr:
        if len(node.ops) != 1:
            raise self.fail(
                node, "chained comparisons are not allowed (write a < b and b < c)"
            )
        op = _COMPARISONS.get(type(node.ops[0]))
        if op is None:
            raise self.fail(
                node,
                f"comparison {self.operator(node.ops[0])!r} is not allowed "
                "(expected one of == != < <= > >=)",
            )
        left = self.convert(node.left, depth + 1)
        return Compare(op, left, self.convert(node.comparators[0], depth + 1))

    def boolop(self, node: ast.BoolOp, depth: int) -> Expr:
        op = "and" if isinstance(node.op, ast.And) else "or"
        return BoolOp(op, tuple(self.convert(v, depth + 1) for v in node.values))

    def ifexp(self, node: ast.IfExp, depth: int) -> Expr:
        test = self.convert(node.test, depth + 1)
        body = self.convert(node.body, depth + 1)
        return IfExp(test, body, self.convert(node.orelse, depth + 1))

    def display(self, node: ast.List | ast.Tuple, depth: int) -> Expr:
        kind = "list" if isinstance(node, ast.List) else "tuple"
        self.steps_only(node, f"{kind}s are")
        return Display(kind, tuple(self.convert(e, depth + 1) for e in node.elts))

    @staticmethod
    def operator(op: ast.AST) -> str:
        return _OPERATOR_SYMBOLS.get(type(op), type(op).__name__)

    # -- calls ------------------------------------------------------------------

    def call(self, node: ast.Call, depth: int) -> Expr:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ARITHMETIC_FUNCTIONS:
            return self.arithmetic_function(node, func.id, depth)
        if not self.scope.allow_calls:
            raise self.fail(
                node, "calls are not allowed here (only ceil_div, min, max)"
            )
        callee = self.callee(func, depth)
        args: list[Expr] = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise self.fail(arg, "*args is not allowed")
            args.append(self.convert(arg, depth + 1))
        kwargs: list[tuple[str, Expr]] = []
        for kw in node.keywords:
            if kw.arg is None:
                raise self.fail(kw, "**kwargs is not allowed")
            if not is_identifier(kw.arg):
                raise self.fail(kw.value, f"bad keyword {kw.arg!r}")
            kwargs.append((kw.arg, self.convert(kw.value, depth + 1)))
        return Call(callee, tuple(args), tuple(kwargs))

    def arithmetic_function(self, node: ast.Call, name: str, depth: int) -> Func:
        if node.keywords:
            raise self.fail(node, f"{name}() takes no keyword arguments")
        args = tuple(self.convert(a, depth + 1) for a in node.args)
        if any(isinstance(a, (Literal, Call, Display, Torch)) for a in args):
            raise self.fail(node, f"{name}() takes integer formulas")
        if name == "ceil_div" and len(args) != 2:
            raise self.fail(node, "ceil_div() takes exactly 2 arguments")
        if name == "ceil_sqrt" and len(args) != 1:
            raise self.fail(node, "ceil_sqrt() takes exactly 1 argument")
        if name in ("min", "max") and len(args) < 2:
            raise self.fail(node, f"{name}() takes at least 2 arguments")
        if name == "ceil_div":
            self.check_divisor(node.args[1], args[1], "ceil_div")
        return Func(name, args)

    def callee(
        self, func: ast.AST, depth: int
    ) -> HostPath | Ref | Torch | Builtin | Attr:
        if isinstance(func, ast.Name):
            if func.id in self.scope.callables:
                return Ref(func.id)
            if func.id in self.scope.host_roots:
                return HostPath((func.id,))
            if (
                self.scope.tensor_ops
                and func.id in BUILTIN_FUNCTIONS
                and func.id not in self.scope.names
            ):
                return Builtin(func.id)
            if (
                self.scope.tensor_ops
                and func.id in HOST_INT_FUNCTIONS
                and func.id not in self.scope.names
            ):
                if self.scope.host_ints:
                    return Builtin(func.id)
                raise self.fail(
                    func,
                    f"{func.id}() is only allowed in postprocess steps: it copies "
                    "a tensor to the host, which a graph cannot and post-processing "
                    "(after the graph, on the host) may",
                )
            known = set(self.scope.callables) | set(self.scope.host_roots)
            private = (
                "; a private host method must be declared under host_methods"
                if func.id.startswith("_") and not func.id.startswith("__")
                else ""
            )
            raise self.fail(
                func,
                f"cannot call {func.id!r}: not an imported helper or host "
                f"attribute{_suggest(func.id, known)}{private}",
            )
        if isinstance(func, ast.Attribute) and _is_torch(func.value):
            self.check_attribute(func)
            return self.torch(func, called=True)
        if isinstance(func, ast.Attribute) and self.scope.tensor_ops:
            if not self.is_host_path(func):
                self.check_attribute(func)
                return Attr(self.convert(func.value, depth + 1), func.attr)
        host = not self.scope.tensor_ops or self.is_host_path(func)
        if isinstance(func, (ast.Attribute, ast.Subscript)) and host:
            return self.host_path(func)
        raise self.fail(
            func,
            "only host methods, imported helpers"
            + (
                ", torch functions and methods of values"
                if self.scope.tensor_ops
                else ""
            )
            + " can be called",
        )


_HANDLERS: dict[type, Callable[[_Converter, Any, int], Expr]] = {
    ast.Constant: _Converter.constant,
    ast.Name: _Converter.name,
    ast.Attribute: _Converter.attribute,
    ast.Subscript: _Converter.subscript,
    ast.BinOp: _Converter.binop,
    ast.UnaryOp: _Converter.unaryop,
    ast.Compare: _Converter.compare,
    ast.BoolOp: _Converter.boolop,
    ast.IfExp: _Converter.ifexp,
    ast.Call: _Converter.call,
}


def _tensor_handlers() -> None:
    """Lists and tuples reach :meth:`_Converter.display` (which refuses them
    outside forward steps)."""
    _HANDLERS[ast.List] = _Converter.display
    _HANDLERS[ast.Tuple] = _Converter.display


_tensor_handlers()


def parse_expression(text: str, scope: Scope) -> Expr:
    """Parse one spec expression; raises :class:`FormulaError` (its column
    counts from the start of ``text``)."""
    if not isinstance(text, str):
        raise FormulaError("expected an expression string")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise FormulaError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    if not text.strip():
        raise FormulaError("empty expression")
    if any(not (c.isprintable() and c.isascii()) for c in text):
        raise FormulaError("expressions are printable ASCII only")
    lead = len(text) - len(text.lstrip())
    try:
        with warnings.catch_warnings():  # "invalid decimal literal" and the like
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise FormulaError(
            f"syntax error: {exc.msg}", lead + max((exc.offset or 1) - 1, 0)
        ) from None
    except (RecursionError, MemoryError, ValueError):
        raise FormulaError("expression is too complex") from None
    try:
        expr = _Converter(scope).convert(tree.body)
    except RecursionError:
        raise FormulaError("expression is nested too deeply") from None
    except FormulaError as exc:
        if not lead:
            raise
        raise FormulaError(str(exc), lead + exc.column) from None
    if sum(1 for _ in walk(expr)) > MAX_NODES:
        raise FormulaError(
            f"expression has more than {MAX_NODES} operators and operands", lead
        )
    return expr


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
#: ``name =`` or ``a, b =`` at the start of a step (not ``==``).
_ASSIGNMENT = re.compile(rf"\s*({_NAME}(?:\s*,\s*{_NAME})*)\s*=(?!=)\s*")
#: A tuple target that discards its value.
DISCARD = "_"


def assignment_targets(text: object) -> tuple[str, ...]:
    """The names ``a, b = <expr>`` assigns, whether or not the rest is valid
    (empty for a bare expression)."""
    match = _ASSIGNMENT.match(text) if isinstance(text, str) else None
    if not match:
        return ()
    return tuple(name.strip() for name in match.group(1).split(","))


def assignment_target(text: object) -> str | None:
    """The name ``name = <expr>`` assigns (``None`` for a bare expression or
    a tuple target)."""
    targets = assignment_targets(text)
    return targets[0] if len(targets) == 1 else None


def _check_targets(match: re.Match, start: int) -> tuple[str, ...]:
    found = list(re.finditer(_NAME, match.group(1)))
    names = tuple(m.group(0) for m in found)
    seen: set[str] = set()
    for m in found:
        name, column = m.group(0), start + match.start(1) + m.start()
        discard = name == DISCARD and len(names) > 1
        if not discard and (not is_identifier(name) or name.startswith("_")):
            raise FormulaError(f"bad assignment target {name!r}", column)
        if name in seen and not discard:
            raise FormulaError(f"{name!r} is assigned twice", column)
        seen.add(name)
    if all(n == DISCARD for n in names):
        raise FormulaError("a tuple target needs at least one name", start)
    return names


def parse_statement(text: str, scope: Scope) -> tuple[tuple[str, ...], Expr]:
    """A step of a forward: ``name = <expr>``, ``a, b = <expr>`` (``_``
    discards) or a bare ``<expr>`` (no targets). The column of a
    :class:`FormulaError` counts from the start of ``text``."""
    if not isinstance(text, str):
        return (), parse_expression(text, scope)
    targets: tuple[str, ...] = ()
    # The step's text without surrounding whitespace (a block scalar ends
    # with a line break); ``start``: where ``body`` begins in ``text``.
    body = text.strip()
    start = len(text) - len(text.lstrip())
    match = _ASSIGNMENT.match(body)
    if match:
        targets = _check_targets(match, start)
        body, start = body[match.end() :], start + match.end()
    try:
        return targets, parse_expression(body, scope)
    except FormulaError as exc:
        if not start:
            raise
        raise FormulaError(str(exc), start + exc.column) from None


def parse_assignment(text: str, scope: Scope) -> tuple[str | None, Expr]:
    """``name = <expr>`` or a bare ``<expr>``: :func:`parse_statement`
    without tuple targets."""
    targets, expr = parse_statement(text, scope)
    if len(targets) > 1:
        raise FormulaError("a tuple target is not allowed here")
    return (targets[0] if targets else None), expr


# -- walking, printing, evaluating --------------------------------------------


def children(expr: Expr) -> Iterator[Expr]:
    """The sub-expressions directly under ``expr``."""
    for value in vars(expr).values():
        if isinstance(value, _NODES):
            yield value
        elif isinstance(value, tuple):
            for item in value:
                if isinstance(item, _NODES):
                    yield item
                elif isinstance(item, tuple):  # a keyword argument
                    yield item[1]


def walk(expr: Expr) -> Iterator[Expr]:
    yield expr
    for child in children(expr):
        yield from walk(child)


def names_in(expr: Expr) -> set[str]:
    return {e.name for e in walk(expr) if isinstance(e, Ref)}


#: The nodes of a formula whose value needs no name: folded by
#: :func:`constant_value`.
_CONSTANT_NODES = (Num, Neg, BinOp, Func, Compare, BoolOp, Not, IfExp)


def constant_value(expr: Expr) -> int | None:
    """The value of a formula that reads no name (``1 - 1``), else None
    (also when it cannot be evaluated: a division by zero inside, a value
    beyond int64)."""
    if not all(isinstance(e, _CONSTANT_NODES) for e in walk(expr)):
        return None
    try:
        return evaluate(expr, {})
    except EvaluationError:
        return None


def host_paths_in(expr: Expr) -> set[HostPath]:
    return {e for e in walk(expr) if isinstance(e, HostPath)}


def substitute(expr: Expr, mapping: Mapping[str, Expr]) -> Expr:
    """``expr`` with each name of ``mapping`` replaced by its expression."""
    if isinstance(expr, Ref):
        return mapping.get(expr.name, expr)

    def sub(value: Any) -> Any:
        if isinstance(value, _NODES):
            return substitute(value, mapping)
        if isinstance(value, tuple):
            return tuple(sub(v) for v in value)
        return value

    return type(expr)(**{k: sub(v) for k, v in vars(expr).items()})


_PRECEDENCE = {
    "+": 11,
    "-": 11,
    "*": 12,
    "/": 12,
    "//": 12,
    "%": 12,
    "**": 14,
}
_IFEXP = 1
_BOOLOPS = {"or": 2, "and": 3}
_NOT = 4
_COMPARE = 5
_UNARY = 13
_PRIMARY = 15  # attribute, subscript, call
_ATOM = 16


def _precedence(expr: Expr) -> int:
    if isinstance(expr, BinOp):
        return _PRECEDENCE[expr.op]
    if isinstance(expr, (Neg, Invert)) or (isinstance(expr, Num) and expr.value < 0):
        return _UNARY
    if isinstance(expr, Func) and expr.name == "ceil_div":
        return _UNARY
    if isinstance(expr, Func) and expr.name == "ceil_sqrt":
        return _PRECEDENCE["+"]
    if isinstance(expr, (Attr, Subscript, Call)):
        return _PRIMARY
    if isinstance(expr, IfExp):
        return _IFEXP
    if isinstance(expr, BoolOp):
        return _BOOLOPS[expr.op]
    if isinstance(expr, Not):
        return _NOT
    if isinstance(expr, Compare):
        return _COMPARE
    return _ATOM


class _Printer:
    """Python (or the spec's own) spelling of an expression tree."""

    def __init__(self, rename: Callable[[str], str], self_name: str, spec: bool):
        self.rename = rename
        self.self_name = self_name
        self.spec = spec

    def wrap(self, sub: Expr, min_prec: int) -> str:
        text = self.emit(sub)
        if self.spec and isinstance(sub, Func) and sub.name == "ceil_sqrt":
            return text  # a call in the spec's spelling
        return f"({text})" if _precedence(sub) < min_prec else text

    def emit(self, e: Expr) -> str:
        method = getattr(self, f"emit_{type(e).__name__.lower()}", None)
        if method is None:
            raise TypeError(f"not an expression: {e!r}")
        return method(e)

    def emit_num(self, e: Num) -> str:
        return str(e.value)

    def emit_literal(self, e: Literal) -> str:
        return repr(e.value)

    def emit_ref(self, e: Ref) -> str:
        return self.rename(e.name)

    def emit_hostpath(self, e: HostPath) -> str:
        if self.spec:
            return e.dotted
        out = self.self_name
        for part in e.parts:
            out += f"[{part}]" if isinstance(part, int) else f".{part}"
        return out

    def emit_binop(self, e: BinOp) -> str:
        prec = _PRECEDENCE[e.op]
        if e.op == "**":
            # Right-associative and tighter than unary minus on its left.
            return f"{self.wrap(e.left, _PRIMARY)} ** {self.wrap(e.right, prec)}"
        return f"{self.wrap(e.left, prec)} {e.op} {self.wrap(e.right, prec + 1)}"

    def emit_neg(self, e: Neg) -> str:
        return f"-{self.wrap(e.operand, _UNARY)}"

    def emit_invert(self, e: Invert) -> str:
        return f"~{self.wrap(e.operand, _UNARY)}"

    def emit_func(self, e: Func) -> str:
        if e.name == "ceil_div" and not self.spec:
            num, den = e.args
            # Ceiling division on Python ints without floats: -(-a // b).
            return f"-(-{self.wrap(num, _UNARY)} // {self.wrap(den, _PRECEDENCE['//'] + 1)})"
        if e.name == "ceil_sqrt" and not self.spec:
            # Integers only (no float sqrt): isqrt(n - 1) + 1 for n >= 1.
            return f"math.isqrt({self.wrap(e.args[0], _PRECEDENCE['-'])} - 1) + 1"
        return f"{e.name}({', '.join(self.emit(a) for a in e.args)})"

    def emit_compare(self, e: Compare) -> str:
        return f"{self.wrap(e.left, _COMPARE + 1)} {e.op} {self.wrap(e.right, _COMPARE + 1)}"

    def emit_boolop(self, e: BoolOp) -> str:
        prec = _BOOLOPS[e.op]
        return f" {e.op} ".join(self.wrap(v, prec + 1) for v in e.values)

    def emit_not(self, e: Not) -> str:
        return f"not {self.wrap(e.operand, _NOT)}"

    def emit_ifexp(self, e: IfExp) -> str:
        body = self.wrap(e.body, _IFEXP + 1)
        return f"{body} if {self.wrap(e.test, _IFEXP + 1)} else {self.wrap(e.orelse, _IFEXP)}"

    def emit_torch(self, e: Torch) -> str:
        return f"torch.{e.name}"

    def emit_builtin(self, e: Builtin) -> str:
        return e.name

    def emit_attr(self, e: Attr) -> str:
        value = self.emit(e.value)
        if _precedence(e.value) < _PRIMARY or isinstance(e.value, (Num, Literal)):
            value = f"({value})"
        return f"{value}.{e.name}"

    def emit_subscript(self, e: Subscript) -> str:
        index = e.index
        if isinstance(index, Display) and index.kind == "tuple" and index.items:
            text = ", ".join(self.emit(i) for i in index.items)
            text += "," if len(index.items) == 1 else ""
        else:
            text = self.emit(index)
        return f"{self.wrap(e.value, _PRIMARY)}[{text}]"

    def emit_slice(self, e: Slice) -> str:
        parts = [
            "" if p is None else self.wrap(p, _IFEXP + 1)
            for p in (e.lower, e.upper, e.step)
        ]
        return ":".join(parts if e.step is not None else parts[:2])

    def emit_dots(self, e: Dots) -> str:
        return "..."

    def emit_display(self, e: Display) -> str:
        items = ", ".join(self.emit(i) for i in e.items)
        if e.kind == "list":
            return f"[{items}]"
        return f"({items},)" if len(e.items) == 1 else f"({items})"

    def emit_call(self, e: Call) -> str:
        parts = [self.emit(a) for a in e.args]
        parts += [f"{k}={self.emit(v)}" for k, v in e.kwargs]
        return f"{self.wrap(e.callee, _PRIMARY)}({', '.join(parts)})"


def to_python(
    expr: Expr,
    name_map: Mapping[str, str] | Callable[[str], str] | None = None,
    self_name: str = "self",
    spec_spelling: bool = False,
) -> str:
    """Python source for ``expr``.

    ``name_map`` renames declared names (e.g. a buffer to ``inputs["x"]``);
    host paths are printed under ``self_name``. ``spec_spelling`` prints the
    spec's own form instead (host paths bare, ``ceil_div`` as a call).

    A comparison, ``not``, ``and``/``or`` or conditional expression at the
    top is parenthesised, so that generated code may place the text next to
    any operator (``offset + (a if t else b)``).
    """

    def rename(name: str) -> str:
        if name_map is None:
            return name
        if callable(name_map):
            return name_map(name)
        return name_map.get(name, name)

    printer = _Printer(rename, self_name, spec_spelling)
    if spec_spelling:
        return printer.emit(expr)
    return printer.wrap(expr, _COMPARE + 1)


def to_spec_text(expr: Expr) -> str:
    """The canonical spec spelling (used in messages and round-trip tests)."""
    return to_python(expr, spec_spelling=True)


class EvaluationError(ArithmeticError):
    pass


class ValueOutOfRange(EvaluationError):
    """A value beyond :data:`~generator.limits.MAX_INTEGER` in magnitude:
    no tensor size or count, and refused before it costs time (a tower of
    ``**`` would otherwise take minutes and gigabytes)."""


class DivisionByZero(EvaluationError):
    """A divisor that is 0 at the values given: the generated code would
    raise ``ZeroDivisionError`` there (the parser refuses one that is 0
    for every value)."""


def _in_range(value: int) -> int:
    if -MAX_INTEGER <= value <= MAX_INTEGER:
        return value
    raise ValueOutOfRange(f"a value exceeds {MAX_INTEGER} in magnitude")


def _power(base: int, exponent: int) -> int:
    if exponent < 0:
        raise EvaluationError("negative exponent")
    # |base| >= 2 multiplies the magnitude by at least 2**(bits - 1) per
    # step: stop before computing a number that cannot be in range.
    if abs(base) >= 2 and (abs(base).bit_length() - 1) * exponent > 63:
        raise ValueOutOfRange(f"a value exceeds {MAX_INTEGER} in magnitude")
    return _in_range(base**exponent)  # at most 64 bits per bit of base here


def evaluate(expr: Expr, env: Mapping[str, int]) -> int:
    """Integer value of an arithmetic formula; host paths are looked up by
    their dotted spelling in ``env``.

    Every value, given or computed, stays within
    :data:`~generator.limits.MAX_INTEGER` in magnitude (else
    :class:`ValueOutOfRange`), so each step costs constant time: products
    and powers are checked as they are computed, the result at the end (a
    sum adds one bit per term). The formula is compiled once into closures:
    the static checks evaluate one formula thousands of times.
    """
    return _in_range(_compiled(expr)(env))


Evaluator = Callable[[Mapping[str, int]], int]
_COMPILED: dict[int, tuple[Expr, Evaluator]] = {}
_COMPILED_LIMIT = 4096


def _compiled(expr: Expr) -> Evaluator:
    """The closure of ``expr``, cached by identity (a formula's tree is
    shared by every evaluation; hashing it would cost as much as walking it)."""
    hit = _COMPILED.get(id(expr))
    if hit is not None and hit[0] is expr:
        return hit[1]
    function = _compile(expr)
    if len(_COMPILED) >= _COMPILED_LIMIT:
        _COMPILED.clear()
    _COMPILED[id(expr)] = (expr, function)
    return function


def _lookup(key: str) -> Evaluator:
    def value(env: Mapping[str, int]) -> int:
        try:
            found = env[key]
        except KeyError:
            raise EvaluationError(f"no value for {key!r}") from None
        return _in_range(int(found))

    return value


def _compile(expr: Expr) -> Evaluator:
    if isinstance(expr, Num):
        number = _in_range(expr.value)
        return lambda env: number
    if isinstance(expr, Ref):
        return _lookup(expr.name)
    if isinstance(expr, HostPath):
        return _lookup(expr.dotted)
    if isinstance(expr, Neg):
        operand = _compile(expr.operand)
        return lambda env: -operand(env)
    if isinstance(expr, BinOp):
        return _compile_binop(expr.op, _compile(expr.left), _compile(expr.right))
    if isinstance(expr, Func):
        args = tuple(_compile(a) for a in expr.args)
        if expr.name == "ceil_div":
            num, den = args
            return lambda env: -_floor_div(-num(env), den(env))
        if expr.name == "ceil_sqrt":
            (operand,) = args
            return lambda env: _ceil_sqrt(operand(env))
        pick = min if expr.name == "min" else max
        return lambda env: pick([a(env) for a in args])
    logic = _compile_logic(expr)
    if logic is not None:
        return logic
    raise EvaluationError(f"{type(expr).__name__} has no integer value")


_COMPARE_OPS: dict[str, Callable[[int, int], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _compile_logic(expr: Expr) -> Evaluator | None:
    """Comparisons (1 or 0), ``not``, ``and``/``or`` (an operand, as in
    Python) and conditional expressions (only the branch taken runs)."""
    if isinstance(expr, Compare):
        test, left, right = (
            _COMPARE_OPS[expr.op],
            _compile(expr.left),
            _compile(expr.right),
        )
        return lambda env: int(test(left(env), right(env)))
    if isinstance(expr, Not):
        operand = _compile(expr.operand)
        return lambda env: int(not operand(env))
    if isinstance(expr, BoolOp):
        values = tuple(_compile(v) for v in expr.values)
        if expr.op == "and":
            return lambda env: _first(values, env, stop_when=False)
        return lambda env: _first(values, env, stop_when=True)
    if isinstance(expr, IfExp):
        test, body, orelse = (_compile(e) for e in (expr.test, expr.body, expr.orelse))
        return lambda env: body(env) if test(env) else orelse(env)
    return None


def _first(
    values: tuple[Evaluator, ...], env: Mapping[str, int], stop_when: bool
) -> int:
    """``and`` (stop at the first false value) / ``or`` (the first true)."""
    value = 0
    for evaluator in values:
        value = evaluator(env)
        if bool(value) is stop_when:
            return value
    return value


def _compile_binop(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    if op == "+":
        return lambda env: left(env) + right(env)
    if op == "-":
        return lambda env: left(env) - right(env)
    if op == "*":
        return lambda env: _in_range(left(env) * right(env))
    if op == "//":
        return lambda env: _floor_div(left(env), right(env))
    if op == "%":
        return lambda env: _modulo(left(env), right(env))
    if op == "**":
        return lambda env: _power(_in_range(left(env)), right(env))
    raise EvaluationError(f"'{op}' has no integer value")


def _ceil_sqrt(n: int) -> int:
    if n < 1:
        raise EvaluationError(f"ceil_sqrt of {n} (needs n >= 1)")
    return math.isqrt(n - 1) + 1


def _floor_div(num: int, den: int) -> int:
    if den == 0:
        raise DivisionByZero("division by zero")
    return num // den


def _modulo(num: int, den: int) -> int:
    if den == 0:
        raise DivisionByZero("division by zero")
    return num % den
