"""Spec expressions: parsed with ``ast`` against an allow-list, printed by us.

A spec is untrusted input. Its formulas (``t * h * w // (merge * merge)``)
and calls (``vision.forward_packed(patches, vit_cos, ...)``) are parsed with
``ast.parse(..., mode="eval")``, every node is checked against an allow-list,
and the result is converted into the small frozen tree below. Generated code
is printed from that tree by :func:`to_python`, never copied from the spec
text, and nothing is ever evaluated with ``eval``: :func:`evaluate` walks the
tree with plain integer arithmetic.

Allowed:

* integer literals within int64; ``True``/``False``/``None`` where a call
  argument is expected;
* names the context declares (grid dims, constants, buffers, built-ins);
* host attribute paths rooted at a declared host attribute
  (``vision.blocks[0].attn``), with integer subscripts and no private
  (``_``-prefixed) attributes;
* ``+ - * // %``, ``**`` with a literal exponent of at most 8, unary minus,
  parentheses;
* ``ceil_div(a, b)``, ``min(a, ...)``, ``max(a, ...)``, ``ceil_sqrt(n)``
  (``math.isqrt(n - 1) + 1``: the ceiling of the square root of ``n >= 1``,
  in integers);
* calls of host methods or imported helpers where the context allows calls,
  with positional and keyword arguments (no ``*args``/``**kwargs``);
* at most :data:`MAX_EXPRESSION_LENGTH` characters and :data:`MAX_NODES`
  operators and operands.
"""

from __future__ import annotations

import ast
import keyword
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache

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
    """``True``, ``False`` or ``None`` (call arguments only)."""

    value: bool | None


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
    op: str  # one of + - * // % **
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg:
    operand: Expr


@dataclass(frozen=True)
class Func:
    """``ceil_div``, ``min`` or ``max``."""

    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Call:
    """A call of a host method/module (``HostPath``) or imported helper (``Ref``)."""

    callee: HostPath | Ref
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...]


Expr = Num | Literal | Ref | HostPath | BinOp | Neg | Func | Call


@dataclass(frozen=True)
class Scope:
    """What an expression may mention.

    ``names``: declared names. ``host_roots``: host attributes a path may
    start at. ``callables``: imported helper names that may be called.
    ``allow_calls``: whether calls (of host paths or helpers) are allowed.
    ``allow_literals``: whether ``True``/``False``/``None`` are allowed.
    """

    names: frozenset[str]
    host_roots: frozenset[str] = frozenset()
    callables: frozenset[str] = frozenset()
    allow_calls: bool = False
    allow_literals: bool = False


_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
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
}
_NOT_ALLOWED = {
    ast.IfExp: "conditional expressions (... if ... else ...)",
    ast.Compare: "comparisons",
    ast.BoolOp: "'and' and 'or'",
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


@lru_cache(maxsize=64)
def _spellable(names: frozenset[str]) -> frozenset[str]:
    """The names a formula can spell (an invalid input key is reported where
    it is declared; suggesting it would be wrong advice)."""
    return frozenset(n for n in names if is_identifier(n))


def _suggest(name: str, choices: frozenset[str] | set[str]) -> str:
    close = closest_name(name, _spellable(frozenset(choices)))
    return f"; did you mean {close!r}?" if close else ""


class _Converter:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def fail(self, node: ast.AST, message: str) -> FormulaError:
        return FormulaError(message, getattr(node, "col_offset", 0))

    def convert(self, node: ast.AST, depth: int = 0) -> Expr:
        if depth > MAX_DEPTH:
            raise self.fail(node, "expression is nested too deeply")
        if isinstance(node, ast.Constant):
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
            raise self.fail(node, f"literal {value!r} is not allowed (only integers)")
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            return self.host_path(node)
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if isinstance(node.op, ast.Div):
                raise self.fail(node, "'/' is not allowed (use // or ceil_div)")
            if op is None:
                raise self.fail(
                    node,
                    f"operator {self.operator(node.op)!r} is not allowed "
                    "(expected one of + - * // % **)",
                )
            left = self.convert(node.left, depth + 1)
            right = self.convert(node.right, depth + 1)
            if op == "**" and not (
                isinstance(right, Num) and 0 <= right.value <= MAX_POWER
            ):
                raise self.fail(
                    node, f"the exponent of ** must be a literal 0..{MAX_POWER}"
                )
            return BinOp(op, left, right)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                operand = self.convert(node.operand, depth + 1)
                if isinstance(operand, Num):
                    return Num(-operand.value)
                return Neg(operand)
            if isinstance(node.op, ast.UAdd):
                return self.convert(node.operand, depth + 1)
            raise self.fail(node, f"operator {self.operator(node.op)!r} is not allowed")
        if isinstance(node, ast.Call):
            return self.call(node, depth)
        what = _NOT_ALLOWED.get(type(node))
        if what is not None:
            raise self.fail(node, f"{what} are not allowed in a spec expression")
        raise self.fail(
            node, f"{type(node).__name__} is not allowed in a spec expression"
        )

    @staticmethod
    def operator(op: ast.AST) -> str:
        return _OPERATOR_SYMBOLS.get(type(op), type(op).__name__)

    def name(self, node: ast.Name) -> Expr:
        name = node.id
        if not is_identifier(name) or name.startswith("__"):
            raise self.fail(node, f"bad identifier {name!r}")
        if name in self.scope.names:
            return Ref(name)
        if name in self.scope.host_roots:
            return HostPath((name,))
        known = set(self.scope.names) | set(self.scope.host_roots)
        raise self.fail(node, f"unknown name {name!r}{_suggest(name, known)}")

    def host_path(self, node: ast.AST) -> HostPath:
        parts: list[str | int] = []
        cur = node
        outer: ast.AST = node  # the attribute or subscript applied to ``cur``
        while True:
            if isinstance(cur, (ast.Attribute, ast.Subscript)):
                outer = cur
            if isinstance(cur, ast.Attribute):
                if not is_identifier(cur.attr) or cur.attr.startswith("_"):
                    raise self.fail(
                        cur,
                        f"attribute {cur.attr!r} is not allowed (private or bad name)",
                    )
                parts.append(cur.attr)
                cur = cur.value
            elif isinstance(cur, ast.Subscript):
                index = cur.slice
                if not (
                    isinstance(index, ast.Constant)
                    and isinstance(index.value, int)
                    and not isinstance(index.value, bool)
                    and index.value >= 0
                ):
                    raise self.fail(
                        cur, "only non-negative integer subscripts are allowed"
                    )
                parts.append(index.value)
                cur = cur.value
            elif isinstance(cur, ast.Name):
                root = cur.id
                if root not in self.scope.host_roots and root in self.scope.names:
                    what = (
                        "subscripts"
                        if isinstance(outer, ast.Subscript)
                        else "attributes"
                    )
                    raise self.fail(
                        cur,
                        f"{root!r} is not a host attribute; {what} are only "
                        "allowed on host attribute paths (e.g. vision.blocks[0])",
                    )
                if root not in self.scope.host_roots:
                    raise self.fail(
                        cur,
                        f"{root!r} is not a declared host attribute"
                        f"{_suggest(root, self.scope.host_roots)}",
                    )
                parts.append(root)
                break
            else:
                raise self.fail(cur, "attribute paths must start at a host attribute")
        return HostPath(tuple(reversed(parts)))

    def call(self, node: ast.Call, depth: int) -> Expr:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ARITHMETIC_FUNCTIONS:
            if node.keywords:
                raise self.fail(node, f"{func.id}() takes no keyword arguments")
            args = tuple(self.convert(a, depth + 1) for a in node.args)
            if any(isinstance(a, (Literal, Call)) for a in args):
                raise self.fail(node, f"{func.id}() takes integer formulas")
            if func.id == "ceil_div" and len(args) != 2:
                raise self.fail(node, "ceil_div() takes exactly 2 arguments")
            if func.id == "ceil_sqrt" and len(args) != 1:
                raise self.fail(node, "ceil_sqrt() takes exactly 1 argument")
            if func.id in ("min", "max") and len(args) < 2:
                raise self.fail(node, f"{func.id}() takes at least 2 arguments")
            return Func(func.id, args)
        if not self.scope.allow_calls:
            raise self.fail(
                node, "calls are not allowed here (only ceil_div, min, max)"
            )
        if isinstance(func, ast.Name):
            if (
                func.id not in self.scope.callables
                and func.id not in self.scope.host_roots
            ):
                known = set(self.scope.callables) | set(self.scope.host_roots)
                raise self.fail(
                    func,
                    f"cannot call {func.id!r}: not an imported helper or host "
                    f"attribute{_suggest(func.id, known)}",
                )
            callee: HostPath | Ref = (
                Ref(func.id)
                if func.id in self.scope.callables
                else HostPath((func.id,))
            )
        elif isinstance(func, (ast.Attribute, ast.Subscript)):
            callee = self.host_path(func)
        else:
            raise self.fail(
                func, "only host methods and imported helpers can be called"
            )
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


_ASSIGNMENT = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)\s*")


def assignment_target(text: object) -> str | None:
    """The name ``name = <expr>`` assigns, whether or not the rest is valid
    (``None`` for a bare expression)."""
    match = _ASSIGNMENT.match(text) if isinstance(text, str) else None
    return match.group(1) if match else None


def parse_assignment(text: str, scope: Scope) -> tuple[str | None, Expr]:
    """``name = <expr>`` or a bare ``<expr>`` (a step of a forward); the
    column of a :class:`FormulaError` counts from the start of ``text``."""
    if not isinstance(text, str):
        return None, parse_expression(text, scope)
    target: str | None = None
    # The step's text without surrounding whitespace (a block scalar ends
    # with a line break); ``start``: where ``body`` begins in ``text``.
    body = text.strip()
    start = len(text) - len(text.lstrip())
    match = _ASSIGNMENT.match(body)
    if match:
        target = match.group(1)
        if not is_identifier(target) or target.startswith("_"):
            raise FormulaError(f"bad assignment target {target!r}", start)
        body, start = body[match.end() :], start + match.end()
    try:
        return target, parse_expression(body, scope)
    except FormulaError as exc:
        if not start:
            raise
        raise FormulaError(str(exc), start + exc.column) from None


# -- walking, printing, evaluating --------------------------------------------


def walk(expr: Expr) -> Iterator[Expr]:
    yield expr
    if isinstance(expr, BinOp):
        yield from walk(expr.left)
        yield from walk(expr.right)
    elif isinstance(expr, Neg):
        yield from walk(expr.operand)
    elif isinstance(expr, Func):
        for arg in expr.args:
            yield from walk(arg)
    elif isinstance(expr, Call):
        yield expr.callee
        for arg in expr.args:
            yield from walk(arg)
        for _, value in expr.kwargs:
            yield from walk(value)


def names_in(expr: Expr) -> set[str]:
    return {e.name for e in walk(expr) if isinstance(e, Ref)}


def host_paths_in(expr: Expr) -> set[HostPath]:
    return {e for e in walk(expr) if isinstance(e, HostPath)}


_PRECEDENCE = {"+": 11, "-": 11, "*": 12, "//": 12, "%": 12, "**": 14}
_UNARY = 13
_ATOM = 16


def _precedence(expr: Expr) -> int:
    if isinstance(expr, BinOp):
        return _PRECEDENCE[expr.op]
    if isinstance(expr, Neg) or (isinstance(expr, Num) and expr.value < 0):
        return _UNARY
    if isinstance(expr, Func) and expr.name == "ceil_div":
        return _UNARY
    if isinstance(expr, Func) and expr.name == "ceil_sqrt":
        return _PRECEDENCE["+"]
    return _ATOM


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
    """

    def rename(name: str) -> str:
        if name_map is None:
            return name
        if callable(name_map):
            return name_map(name)
        return name_map.get(name, name)

    def wrap(sub: Expr, min_prec: int) -> str:
        text = emit(sub)
        spelled_as_call = (
            spec_spelling and isinstance(sub, Func) and sub.name == "ceil_sqrt"
        )
        if spelled_as_call:
            return text
        return f"({text})" if _precedence(sub) < min_prec else text

    def emit(e: Expr) -> str:
        if isinstance(e, Num):
            return str(e.value)
        if isinstance(e, Literal):
            return repr(e.value)
        if isinstance(e, Ref):
            return rename(e.name)
        if isinstance(e, HostPath):
            if spec_spelling:
                return e.dotted
            out = self_name
            for part in e.parts:
                out += f"[{part}]" if isinstance(part, int) else f".{part}"
            return out
        if isinstance(e, BinOp):
            prec = _PRECEDENCE[e.op]
            if e.op == "**":
                # Right-associative and tighter than unary minus on its left.
                return f"{wrap(e.left, _ATOM)} ** {wrap(e.right, prec)}"
            return f"{wrap(e.left, prec)} {e.op} {wrap(e.right, prec + 1)}"
        if isinstance(e, Neg):
            return f"-{wrap(e.operand, _UNARY)}"
        if isinstance(e, Func):
            if e.name == "ceil_div" and not spec_spelling:
                num, den = e.args
                # Ceiling division on Python ints without floats: -(-a // b).
                return f"-(-{wrap(num, _UNARY)} // {wrap(den, _PRECEDENCE['//'] + 1)})"
            if e.name == "ceil_sqrt" and not spec_spelling:
                # Integers only (no float sqrt): isqrt(n - 1) + 1 for n >= 1.
                return f"math.isqrt({wrap(e.args[0], _PRECEDENCE['-'])} - 1) + 1"
            return f"{e.name}({', '.join(emit(a) for a in e.args)})"
        if isinstance(e, Call):
            parts = [emit(a) for a in e.args]
            parts += [f"{k}={emit(v)}" for k, v in e.kwargs]
            return f"{emit(e.callee)}({', '.join(parts)})"
        raise TypeError(f"not an expression: {e!r}")

    return emit(expr)


def to_spec_text(expr: Expr) -> str:
    """The canonical spec spelling (used in messages and round-trip tests)."""
    return to_python(expr, spec_spelling=True)


class EvaluationError(ArithmeticError):
    pass


class ValueOutOfRange(EvaluationError):
    """A value beyond :data:`~generator.limits.MAX_INTEGER` in magnitude:
    no tensor size or count, and refused before it costs time (a tower of
    ``**`` would otherwise take minutes and gigabytes)."""


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
    raise EvaluationError(f"{type(expr).__name__} has no integer value")


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
    return lambda env: _power(_in_range(left(env)), right(env))


def _ceil_sqrt(n: int) -> int:
    if n < 1:
        raise EvaluationError(f"ceil_sqrt of {n} (needs n >= 1)")
    return math.isqrt(n - 1) + 1


def _floor_div(num: int, den: int) -> int:
    if den == 0:
        raise EvaluationError("division by zero")
    return num // den


def _modulo(num: int, den: int) -> int:
    if den == 0:
        raise EvaluationError("division by zero")
    return num % den
