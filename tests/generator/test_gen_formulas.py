"""The formula parser and printer (``generator.formulas``).

* Round trip: ``to_spec_text(parse(s))`` is a fixed point, and printing keeps
  the value: random formula trees are evaluated by ``evaluate``, by Python on
  the generated code (``to_python``) and by an independent oracle, on random
  integers.
* Precedence and associativity cases, ``ceil_div``, ``min``/``max``.
* Everything outside the allow-list is rejected with a FormulaError (never
  another exception), with its column where it has one.
"""

from __future__ import annotations

import contextlib
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from generator import formulas as fx
from generator.formulas import (
    BinOp,
    Call,
    EvaluationError,
    FormulaError,
    Func,
    HostPath,
    Literal,
    Neg,
    Num,
    Ref,
    Scope,
    ValueOutOfRange,
    evaluate,
    parse_assignment,
    parse_expression,
    to_python,
    to_spec_text,
)
from generator.limits import MAX_INTEGER

NAMES = ("a", "b", "c", "t", "h", "w")
ARITH = Scope(frozenset(NAMES))
CALLS = Scope(
    frozenset(NAMES),
    host_roots=frozenset({"vision", "config"}),
    callables=frozenset({"helper"}),
    allow_calls=True,
    allow_literals=True,
)

# -- an independent evaluator ----------------------------------------------------------


class OutOfRange(Exception):
    """The oracle's value left int64 where ``evaluate`` checks it."""


def _checked(value: int, bounded: bool) -> int:
    if bounded and abs(value) > MAX_INTEGER:
        raise OutOfRange
    return value


def oracle(expr: fx.Expr, env: dict[str, int], bounded: bool = False) -> int:
    """Integer semantics of a formula tree, written out separately.

    ``bounded``: as ``evaluate`` computes it, within int64: a product, a
    power's base and result, and (see :func:`bounded_oracle`) the result are
    checked; a sum and a negation are not (they add at most a bit a term).
    """
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Ref):
        return env[expr.name]
    if isinstance(expr, Neg):
        return -oracle(expr.operand, env, bounded)
    if isinstance(expr, Func):
        vals = [oracle(a, env, bounded) for a in expr.args]
        if expr.name == "ceil_div":
            if vals[1] == 0:
                raise ZeroDivisionError
            q, r = divmod(vals[0], vals[1])
            return q + (r != 0)  # ceiling = floor + 1 unless exact
        return min(vals) if expr.name == "min" else max(vals)
    assert isinstance(expr, BinOp)
    left = oracle(expr.left, env, bounded)
    if expr.op == "**":
        left = _checked(left, bounded)
    right = oracle(expr.right, env, bounded)
    ops = {
        "+": lambda: left + right,
        "-": lambda: left - right,
        "*": lambda: _checked(left * right, bounded),
        "//": lambda: left // right,
        "%": lambda: left % right,
        "**": lambda: _checked(left**right, bounded),
    }
    return ops[expr.op]()


def bounded_oracle(expr: fx.Expr, env: dict[str, int]) -> int:
    return _checked(oracle(expr, env, bounded=True), True)


# -- random trees --------------------------------------------------------------------------

_leaves = st.one_of(
    st.integers(min_value=-50, max_value=50).map(Num),
    st.sampled_from(NAMES).map(Ref),
)


def _grow(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*", "//", "%"]), children, children).map(
            lambda t: BinOp(*t)
        ),
        st.tuples(children, st.integers(min_value=0, max_value=3)).map(
            lambda t: BinOp("**", t[0], Num(t[1]))
        ),
        children.map(Neg),
        st.tuples(children, children).map(lambda t: Func("ceil_div", t)),
        st.tuples(
            st.sampled_from(["min", "max"]), st.lists(children, min_size=2, max_size=3)
        ).map(lambda t: Func(t[0], tuple(t[1]))),
    )


trees = st.recursive(_leaves, _grow, max_leaves=12)
envs = st.fixed_dictionaries(
    {n: st.integers(min_value=-(10**6), max_value=10**6) for n in NAMES}
)


def _value(fn):
    try:
        return ("ok", fn())
    except (OutOfRange, ValueOutOfRange):
        return ("out of range", None)
    except (ZeroDivisionError, EvaluationError):
        return ("div0", None)


@settings(max_examples=300, deadline=None)
@given(tree=trees, env=envs)
def test_printing_preserves_value(tree, env) -> None:
    """``evaluate`` keeps every value within int64; the printed code is
    Python's arithmetic, unbounded."""
    want = _value(lambda: bounded_oracle(tree, env))
    assert _value(lambda: evaluate(tree, env)) == want
    code = to_python(tree)
    assert _value(
        lambda: eval(code, {"__builtins__": {"min": min, "max": max}}, dict(env))
    ) == _value(lambda: oracle(tree, env))
    reparsed = parse_expression(to_spec_text(tree), ARITH)
    assert _value(lambda: evaluate(reparsed, env)) == want


#: (formula, env, value or None when beyond int64): where evaluate checks.
INT64_CASES = [
    ("a * b", {"a": 2**62, "b": 2}, None),
    ("a ** 8 // b", {"a": 255, "b": 10}, None),  # the power itself leaves int64
    ("a ** 3", {"a": 2**21 - 1}, (2**21 - 1) ** 3),
    ("(a + a) // 2", {"a": MAX_INTEGER}, MAX_INTEGER),  # a sum: at the end only
    ("-a - 1", {"a": MAX_INTEGER}, None),
    ("a", {"a": MAX_INTEGER + 1}, None),
]


@pytest.mark.parametrize(("text", "env", "value"), INT64_CASES)
def test_evaluate_stays_within_int64(text: str, env: dict, value) -> None:
    expr = parse_expression(text, ARITH)
    if value is None:
        with pytest.raises(ValueOutOfRange):
            evaluate(expr, env)
    else:
        assert evaluate(expr, env) == value


@settings(max_examples=300, deadline=None)
@given(tree=trees)
def test_spec_text_is_a_fixed_point(tree) -> None:
    text = to_spec_text(tree)
    once = parse_expression(text, ARITH)
    assert to_spec_text(once) == to_spec_text(
        parse_expression(to_spec_text(once), ARITH)
    )
    # Parsing the canonical text gives the canonical tree back.
    assert parse_expression(to_spec_text(once), ARITH) == once


@settings(max_examples=200, deadline=None)
@given(tree=trees)
def test_python_spelling_parses_as_python(tree) -> None:
    import ast

    node = ast.parse(to_python(tree), mode="eval")
    assert not any(isinstance(n, ast.Div) for n in ast.walk(node))


# -- fixed cases -------------------------------------------------------------------------------

ENV = {"a": 7, "b": -3, "c": 2, "t": 2, "h": 5, "w": 11}


@pytest.mark.parametrize(
    ("text", "canonical", "value"),
    [
        ("a + b * c", "a + b * c", 7 + -3 * 2),
        ("(a + b) * c", "(a + b) * c", (7 - 3) * 2),
        ("a - (b - c)", "a - (b - c)", 7 - (-3 - 2)),
        ("a - b - c", "a - b - c", 7 + 3 - 2),
        ("a // (b // c)", "a // (b // c)", 7 // (-3 // 2)),
        ("a // b // c", "a // b // c", (7 // -3) // 2),
        ("a % c * h", "a % c * h", (7 % 2) * 5),
        ("a * (c % h)", "a * (c % h)", 7 * (2 % 5)),
        ("-a ** 2", "-a ** 2", -49),
        ("(-a) ** 2", "(-a) ** 2", 49),
        ("-2 ** 2", "-2 ** 2", -4),
        ("(-2) ** 2", "(-2) ** 2", 4),
        ("(a ** 2) ** 3", "(a ** 2) ** 3", 7**6),
        ("c ** 3 * a", "c ** 3 * a", 56),
        ("+a", "a", 7),
        ("--a", "--a", 7),
        ("a - -3", "a - -3", 10),
        ("a * -b", "a * -b", 21),
        ("((t)) * (h * w)", "t * (h * w)", 110),
        ("t * h * w // (c * c)", "t * h * w // (c * c)", 27),
        ("ceil_div(h, c)", "ceil_div(h, c)", 3),
        ("ceil_div(-h, c)", "ceil_div(-h, c)", -2),
        ("ceil_div(h, c) * ceil_div(w, c)", "ceil_div(h, c) * ceil_div(w, c)", 18),
        ("ceil_div(a + b, c) ** 2", "(ceil_div(a + b, c)) ** 2", 4),
        ("min(a, b, c) + max(h, w)", "min(a, b, c) + max(h, w)", 8),
        ("h * (w + 1) + 2", "h * (w + 1) + 2", 62),
    ],
)
def test_precedence_cases(text, canonical, value) -> None:
    expr = parse_expression(text, ARITH)
    assert to_spec_text(expr) == canonical
    assert evaluate(expr, ENV) == value
    assert (
        eval(to_python(expr), {"__builtins__": {"min": min, "max": max}}, dict(ENV))
        == value
    )


@pytest.mark.parametrize(
    ("num", "den"),
    [
        (n, d)
        for n in (-7, -6, -1, 0, 1, 5, 6, 7, 2**62 + 1)
        for d in (-3, -1, 1, 2, 3, 7)
    ],
)
def test_ceil_div(num, den) -> None:
    expr = parse_expression("ceil_div(a, b)", ARITH)
    want = math.ceil(Fraction(num, den))
    assert evaluate(expr, {"a": num, "b": den}) == want
    code = to_python(expr)
    assert "ceil_div" not in code and "/" not in code.replace("//", "")
    assert eval(code, {"__builtins__": {}}, {"a": num, "b": den}) == want


@pytest.mark.parametrize(
    "n",
    [
        1,
        2,
        3,
        4,
        5,
        8,
        9,
        10,
        15,
        16,
        17,
        65535,
        65536,
        65537,
        (2**31 + 1) ** 2,
        2**62 + 1,
    ],
)
def test_ceil_sqrt(n) -> None:
    """The ceiling of the square root in integers (Kimi-K3's near-square
    dummy: vLLM's ``math.ceil(math.sqrt(k))``, exact at every size)."""
    expr = parse_expression("2 * ceil_sqrt(a + 1 - 1)", ARITH)
    # The least r with r * r >= n, found from below independently.
    root = math.isqrt(n)
    want = 2 * (root if root * root == n else root + 1)
    assert evaluate(expr, {"a": n}) == want
    assert to_spec_text(expr) == "2 * ceil_sqrt(a + 1 - 1)"
    code = to_python(expr)
    assert "sqrt(" not in code.replace("isqrt(", "")
    assert eval(code, {"__builtins__": {}, "math": math}, {"a": n}) == want
    if n < 2**52:
        assert evaluate(expr, {"a": n}) == 2 * math.ceil(math.sqrt(n))


def test_ceil_sqrt_below_one_is_an_evaluation_error() -> None:
    with pytest.raises(EvaluationError, match="n >= 1"):
        evaluate(parse_expression("ceil_sqrt(a - a)", ARITH), ENV)


def test_ceil_div_by_zero_is_an_evaluation_error() -> None:
    with pytest.raises(EvaluationError):
        evaluate(parse_expression("ceil_div(a, b - b)", ARITH), ENV)
    with pytest.raises(EvaluationError):
        evaluate(parse_expression("a % (b - b)", ARITH), ENV)


def test_names_are_renamed_and_host_paths_printed_under_self() -> None:
    expr = parse_expression(
        "vision.forward(a, config.blocks[0].dim, flag=True, other=None)", CALLS
    )
    assert isinstance(expr, Call)
    assert expr.callee == HostPath(("vision", "forward"))
    assert to_python(expr, {"a": 'inputs["a"]'}) == (
        'self.vision.forward(inputs["a"], self.config.blocks[0].dim, flag=True, other=None)'
    )
    assert (
        to_spec_text(expr)
        == "vision.forward(a, config.blocks[0].dim, flag=True, other=None)"
    )
    assert (
        to_python(parse_expression("helper(a, k=b)", CALLS), self_name="host")
        == "helper(a, k=b)"
    )
    assert fx.names_in(expr) == {"a"}
    assert Literal(True) in set(fx.walk(expr))


def test_assignments() -> None:
    assert parse_assignment("x = a + b", ARITH) == ("x", BinOp("+", Ref("a"), Ref("b")))
    assert parse_assignment("a + b", ARITH) == (None, BinOp("+", Ref("a"), Ref("b")))
    for bad in ("_x = a", "for = a", "x == a", "x = ", "x = y = a"):
        with pytest.raises(FormulaError):
            parse_assignment(bad, ARITH)


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("x = a + zz", 8),
        ("  x =   a + zz", 12),
        ("a + zz", 4),
        (" a + zz", 5),
        ("x = a / b", 4),
        ("_x = a", 0),
        ("  _x = a", 2),
    ],
)
def test_assignment_columns_count_from_the_step_text(text, column) -> None:
    """The column of an error in a step is its place in the step's text
    (the resolver adds it to where the step is written)."""
    with pytest.raises(FormulaError) as info:
        parse_assignment(text, ARITH)
    assert info.value.column == column


def test_assignment_around_whitespace() -> None:
    """A step written as a block scalar ends with a line break."""
    expected = ("x", BinOp("+", Ref("a"), Ref("b")))
    assert parse_assignment("x = a + b\n", ARITH) == expected
    assert parse_assignment("\n  x = a + b \n", ARITH) == expected
    assert parse_assignment("a + b\n", ARITH) == (None, expected[1])


def test_assignment_target_of_an_invalid_step() -> None:
    assert fx.assignment_target("x = undefined(") == "x"
    assert fx.assignment_target("  out =a") == "out"
    assert fx.assignment_target("a == b") is None
    assert fx.assignment_target("f(x=1)") is None
    assert fx.assignment_target(3) is None


def test_did_you_mean_offers_valid_names_only() -> None:
    scope = Scope(frozenset({"pixel-values", "pixel_value"}))
    with pytest.raises(FormulaError) as info:
        parse_expression("pixel_values", scope)
    assert "did you mean 'pixel_value'?" in str(info.value)
    with pytest.raises(FormulaError) as info:
        parse_expression("pixel_values", Scope(frozenset({"pixel-values"})))
    assert "did you mean" not in str(info.value)


# -- the allow-list ------------------------------------------------------------------------------

REJECTED = [
    ("a / b", "'/' is not allowed (use // or ceil_div)"),
    ("a / 2", "'/' is not allowed (use // or ceil_div)"),
    ("lambda: a", "lambdas are not allowed"),
    ("(lambda: a)()", ""),
    ("a if b else c", "conditional expressions"),
    ("a < b", "comparisons are not allowed"),
    ("a == b", "comparisons are not allowed"),
    ("a and b", "'and' and 'or' are not allowed"),
    ("not a", "operator 'not' is not allowed"),
    ("~a", "operator '~' is not allowed"),
    ("a & b", "operator '&' is not allowed"),
    ("a | b", "operator '|' is not allowed"),
    ("a ^ b", "operator '^' is not allowed"),
    ("a << 2", "operator '<<' is not allowed"),
    ("a >> 2", "operator '>>' is not allowed"),
    ("a @ b", "operator '@' is not allowed"),
    ("[a, b]", "lists are not allowed"),
    ("(a, b)", "tuples are not allowed"),
    ("{a: b}", "dicts are not allowed"),
    ("{a}", "sets are not allowed"),
    ("[x for x in a]", "comprehensions are not allowed"),
    ("(a := 1)", "assignment expressions"),
    ("'text'", "literal"),
    ('f"{a}"', "f-strings are not allowed"),
    ("b'x'", ""),
    ("1.5", "literal"),
    ("1e3", "literal"),
    ("2j", "literal"),
    ("True", "not allowed"),
    ("None", "not allowed"),
    ("...", ""),
    ("__import__('os')", ""),
    ("__import__", "bad identifier"),
    ("x.b", "'x' is not a declared host attribute"),
    ("a[0]", "'a' is not a host attribute; subscripts are only allowed"),
    ("a.b.c", "'a' is not a host attribute; attributes are only allowed"),
    ("a ** b", "literal"),
    ("a ** 9", "literal"),
    ("a ** -1", "literal"),
    ("ceil_sqrt(a, b)", "exactly 1"),
    ("ceil_sqrt()", "exactly 1"),
    ("ceil_div(a)", "exactly 2"),
    ("ceil_div(a, b, c)", "exactly 2"),
    ("ceil_div(a, b=c)", "keyword"),
    ("min(a)", "at least 2"),
    ("max()", "at least 2"),
    ("len(a)", "calls are not allowed"),
    ("abs(a)", "calls are not allowed"),
    ("eval('1')", "calls are not allowed"),
    ("unknown + 1", "unknown name 'unknown'"),
    ("hh * w", "did you mean 'h'"),
    ("a +", "syntax error"),
    ("a b", "syntax error"),
    ("a; b", "syntax error"),
    ("a\nimport os", ""),
    ("", "empty"),
    ("   ", "empty"),
    ("a × b", "ASCII"),
    ("a\tb", "ASCII"),
    ("a" * 401, "longer than"),
    ("-" * 200 + "a", "nested too deeply"),
    ("-(" * 60 + "a" + ")" * 60, "nested too deeply"),
]


@pytest.mark.parametrize(("text", "fragment"), REJECTED)
def test_outside_the_allow_list_is_rejected(text, fragment) -> None:
    with pytest.raises(FormulaError) as info:
        parse_expression(text, ARITH)
    assert fragment in str(info.value)
    assert 0 <= info.value.column <= len(text)


@pytest.mark.parametrize(
    "text",
    ["(" * 100 + "a" + ")" * 100, "+".join(["a"] * 150), "(" * 250 + "a" + ")" * 250],
)
def test_large_legal_looking_input_fails_cleanly_or_parses(text) -> None:
    """Parentheses add no depth; long sums do (a left-deep tree). Either way
    the answer is a tree or a FormulaError, never RecursionError or another
    exception."""
    with contextlib.suppress(FormulaError):
        expr = parse_expression(text, ARITH)
        assert evaluate(expr, ENV) == 7 * text.count("a")


@pytest.mark.parametrize(
    "text",
    [
        "vision._private",
        "vision.__class__",
        "vision.blocks[-1]",
        "vision.blocks[a]",
        "vision.blocks[0:2]",
        "vision.blocks[True]",
        "helper(*a)",
        "helper(**a)",
        "helper(a)(b)",
        "helper(a).x",
        "(a + b).real",
        "a.forward()",
        "unknown_fn(a)",
        "vision.f(x='s')",
        "vision.f(1.5)",
        "vision.f(lambda: 1)",
        "getattr(vision, 'x')",
    ],
)
def test_calls_and_paths_outside_the_allow_list(text) -> None:
    with pytest.raises(FormulaError):
        parse_expression(text, CALLS)


@pytest.mark.parametrize(
    ("text", "column"), [("a + b / c", 4), ("a + 'x'", 4), ("h + hh", 4)]
)
def test_error_columns(text, column) -> None:
    with pytest.raises(FormulaError) as info:
        parse_expression(text, ARITH)
    assert info.value.column == column


def test_not_a_string() -> None:
    for value in (1, None, ["a"], b"a"):
        with pytest.raises(FormulaError):
            parse_expression(value, ARITH)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=60))
def test_arbitrary_text_never_crashes(text) -> None:
    for scope in (ARITH, CALLS):
        try:
            expr = parse_expression(text, scope)
        except FormulaError:
            continue
        # Whatever is accepted prints to code that parses and re-reads the same.
        assert parse_expression(to_spec_text(expr), scope) == expr
