"""One comparison of two formulas (``ho * kh <= rope_h``): the condition of a
capture-time check and of ``items.eager_when``.

Each side is an ordinary formula (:mod:`generator.formulas`), parsed in the
field's scope; the comparison itself is parsed here with ``ast``, one
operator, no chains, no ``and``/``or`` (write several checks). It is printed
and evaluated by us, like the formulas.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from generator import formulas as fx
from generator.formulas import Expr, FormulaError
from generator.spec.reader import ReadContext
from generator.spec.values import (
    INVALID,
    Formula,
    formula_error_message,
    formula_location,
    zero_divisor,
)
from generator.yaml_loader import Node

#: Python's comparison operators by AST class, and each one's negation.
_OPERATORS = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
}
_NEGATION = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_HOLDS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


@dataclass(frozen=True)
class Comparison:
    """``left <op> right`` over two formulas."""

    op: str
    left: Expr
    right: Expr

    @property
    def negated(self) -> Comparison:
        return Comparison(_NEGATION[self.op], self.left, self.right)

    def names(self) -> set[str]:
        return fx.names_in(self.left) | fx.names_in(self.right)

    def holds(self, env: Mapping[str, int]) -> bool:
        """Evaluated with plain integers (raises EvaluationError)."""
        return _HOLDS[self.op](
            fx.evaluate(self.left, env), fx.evaluate(self.right, env)
        )

    def spec_text(self) -> str:
        """The canonical spec spelling, for messages."""
        return f"{fx.to_spec_text(self.left)} {self.op} {fx.to_spec_text(self.right)}"


def parse_comparison(text: object, scope: fx.Scope) -> Comparison:
    """``<formula> <op> <formula>``; raises :class:`FormulaError` with the
    column (from the start of ``text``) of the problem."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaError("expected a comparison, e.g. ho * kh <= rope_h")
    lead = len(text) - len(text.lstrip())
    body = text.strip()
    if len(body) > fx.MAX_EXPRESSION_LENGTH or "\n" in body:
        raise FormulaError("a comparison is one line of at most 400 characters", lead)
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError as exc:
        raise FormulaError(
            f"syntax error: {exc.msg}", lead + max((exc.offset or 1) - 1, 0)
        ) from None
    except (RecursionError, MemoryError, ValueError):
        raise FormulaError("comparison is too complex", lead) from None
    if isinstance(tree, ast.BoolOp):
        raise FormulaError(
            "one comparison per condition ('and' / 'or' are not allowed: write "
            "several checks)",
            lead + tree.col_offset,
        )
    if not isinstance(tree, ast.Compare):
        raise FormulaError(
            "expected a comparison (one of < <= > >= == !=), e.g. ho * kh <= rope_h",
            lead,
        )
    if len(tree.ops) != 1:
        raise FormulaError("one comparison operator only (no chains)", lead)
    op = _OPERATORS.get(type(tree.ops[0]))
    if op is None:
        raise FormulaError(
            "only < <= > >= == != compare two formulas (not 'in' or 'is')", lead
        )
    sides = []
    for node in (tree.left, tree.comparators[0]):
        segment = ast.get_source_segment(body, node, padded=False) or ""
        try:
            sides.append(fx.parse_expression(segment, scope))
        except FormulaError as exc:
            raise FormulaError(str(exc), lead + node.col_offset + exc.column) from None
    return Comparison(op, sides[0], sides[1])


def to_python(
    comparison: Comparison, render: Callable[[Expr], str] = fx.to_python
) -> str:
    """Python source: both sides printed by ``render`` (arithmetic binds
    tighter than a comparison, so no parentheses are needed)."""
    return f"{render(comparison.left)} {comparison.op} {render(comparison.right)}"


class Condition(Formula):
    """A comparison of two formulas over the names of a scope."""

    kinds = ("string",)
    words = "comparison"

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        scope = ctx.scope(self.scope_id)
        try:
            comparison = parse_comparison(node.value, scope)
        except FormulaError as exc:
            ctx.error(
                formula_location(node, exc), field, formula_error_message(exc, scope)
            )
            return INVALID
        for side in (comparison.left, comparison.right):
            zero = zero_divisor(side)
            if zero is not None:
                ctx.error(node, field, f"division by zero: {zero} always raises")
                return INVALID
        return comparison
