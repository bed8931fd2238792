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
    Attr,
    BinOp,
    BoolOp,
    Call,
    Compare,
    Display,
    Dots,
    EvaluationError,
    FormulaError,
    Func,
    HostPath,
    IfExp,
    Invert,
    Literal,
    Neg,
    Not,
    Num,
    Ref,
    Scope,
    Slice,
    Subscript,
    Torch,
    ValueOutOfRange,
    evaluate,
    parse_assignment,
    parse_expression,
    parse_statement,
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
STEPS = Scope(
    frozenset({"x", "y", "n", "mask", "hidden"}),
    host_roots=frozenset({"vision", "_encode"}),
    callables=frozenset({"helper"}),
    allow_calls=True,
    allow_literals=True,
    tensor_ops=True,
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
    if isinstance(expr, Compare):
        left, right = oracle(expr.left, env, bounded), oracle(expr.right, env, bounded)
        return int(COMPARISONS[expr.op](left, right))
    if isinstance(expr, Not):
        return int(not oracle(expr.operand, env, bounded))
    if isinstance(expr, IfExp):
        taken = expr.body if oracle(expr.test, env, bounded) else expr.orelse
        return oracle(taken, env, bounded)
    if isinstance(expr, BoolOp):
        for value in expr.values:
            result = oracle(value, env, bounded)
            if bool(result) == (expr.op == "or"):
                return result
        return result
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


COMPARISONS = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


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
        st.tuples(st.sampled_from(sorted(COMPARISONS)), children, children).map(
            lambda t: Compare(*t)
        ),
        st.tuples(
            st.sampled_from(["and", "or"]), st.lists(children, min_size=2, max_size=3)
        ).map(lambda t: BoolOp(t[0], tuple(t[1]))),
        children.map(Not),
        st.tuples(children, children, children).map(lambda t: IfExp(*t)),
    )


trees = st.recursive(_leaves, _grow, max_leaves=12)
envs = st.fixed_dictionaries(
    {n: st.integers(min_value=-(10**6), max_value=10**6) for n in NAMES}
)


def _divides_by_constant_zero(tree) -> bool:
    """The tree has a divisor that is 0 for every value of the names: its
    spec text is refused (test_constant_zero_divisors_are_refused)."""
    for sub in fx.walk(tree):
        divisor = None
        if isinstance(sub, BinOp) and sub.op in ("//", "%"):
            divisor = sub.right
        elif isinstance(sub, Func) and sub.name == "ceil_div":
            divisor = sub.args[1]
        if divisor is not None and fx.constant_value(divisor) == 0:
            return True
    return False


def _refused_as_zero_divisor(tree) -> bool:
    if not _divides_by_constant_zero(tree):
        return False
    with pytest.raises(FormulaError, match="division by zero"):
        parse_expression(to_spec_text(tree), ARITH)
    return True


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
    if _refused_as_zero_divisor(tree):
        return
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
    if _refused_as_zero_divisor(tree):
        return
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
        ("h * w if t > 1 else 0", "h * w if t > 1 else 0", 55),
        ("h * w if t > 2 else 0", "h * w if t > 2 else 0", 0),
        ("(a if c else b) * 2", "(a if c else b) * 2", 14),
        ("a if b else c if t else h", "a if b else c if t else h", 7),
        ("(a if b else c) if t else h", "(a if b else c) if t else h", 7),
        ("a < b + c", "a < b + c", 0),
        ("(a < b) + c", "(a < b) + c", 2),
        ("a == 7 and h > 4", "a == 7 and h > 4", 1),
        ("a and b or c", "a and b or c", -3),
        ("a and (b or c)", "a and (b or c)", -3),
        ("(a or b) and c", "(a or b) and c", 2),
        ("not a", "not a", 0),
        ("not a == b", "not a == b", 1),
        ("(not a) == b", "(not a) == b", 0),
        ("-a if not b else a", "-a if not b else a", 7),
        ("a if c else a // (b - b)", "a if c else a // (b - b)", 7),
        (
            "max(t, 1) if t != 2 else ceil_div(w, t)",
            "max(t, 1) if t != 2 else ceil_div(w, t)",
            6,
        ),
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


#: (formula, column of the divisor): a divisor that folds to 0 whatever the
#: names is refused where it is written; one that is 0 only for some values
#: of the names parses (the static checks refuse it at a checked budget).
CONSTANT_ZERO_DIVISORS = [
    ("h % (1-1)", 5),
    ("w // (2 * 0)", 6),
    ("a % (3 - 3) + 1", 5),
    ("ceil_div(a, 2-2)", 12),
    ("a // min(0, 5)", 5),
    ("a // (0 if 1 else 2)", 6),
    ("a // -0", 5),
]


@pytest.mark.parametrize(("text", "column"), CONSTANT_ZERO_DIVISORS)
def test_constant_zero_divisors_are_refused(text: str, column: int) -> None:
    with pytest.raises(FormulaError, match="division by zero") as info:
        parse_expression(text, ARITH)
    assert info.value.column == column
    assert "always raises" in str(info.value)


@pytest.mark.parametrize(
    "text", ["a // (b - b)", "a % (c - 2)", "a // (1 - 2)", "a // (0 if c else 1)"]
)
def test_divisors_zero_only_for_some_values_parse(text: str) -> None:
    assert isinstance(parse_expression(text, ARITH), BinOp)


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
    ("a < b < c", "chained comparisons are not allowed"),
    ("a is b", "comparison 'is' is not allowed"),
    ("a in b", "comparison 'in' is not allowed"),
    ("a if b", "syntax error"),
    ("~a", "operator '~' is only allowed in forward steps"),
    ("torch.int64", "only allowed in forward steps"),
    ("torch", "torch is only allowed as torch.<function or dtype>"),
    ("a.view(1)", "calls are not allowed here"),
    ("a & b", "operator '&' is not allowed"),
    ("a | b", "operator '|' is not allowed"),
    ("a ^ b", "operator '^' is not allowed"),
    ("a << 2", "operator '<<' is not allowed"),
    ("a >> 2", "operator '>>' is not allowed"),
    ("a @ b", "operator '@' is not allowed"),
    ("[a, b]", "lists are only allowed in forward steps"),
    ("(a, b)", "tuples are only allowed in forward steps"),
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


# -- forward steps (tensor expressions) -------------------------------------------------------

#: (step expression, printed Python): a buffer ``x`` renamed as the graph
#: forward does, host paths under ``self``.
STEP_CASES = [
    ("x.view(-1, hidden)", 'inputs["x"].view(-1, hidden)'),
    ("x.flatten(0, 1)", 'inputs["x"].flatten(0, 1)'),
    (
        "x.unsqueeze(1).to(torch.bfloat16)",
        'inputs["x"].unsqueeze(1).to(torch.bfloat16)',
    ),
    (
        "x.reshape(n, -1, hidden).permute(0, 2, 1).contiguous()",
        'inputs["x"].reshape(n, -1, hidden).permute(0, 2, 1).contiguous()',
    ),
    ("vision(x).last_hidden_state", 'self.vision(inputs["x"]).last_hidden_state'),
    ("vision.encoder(x)[0]", 'self.vision.encoder(inputs["x"])[0]'),
    ("vision.blocks[0].attn(x)", 'self.vision.blocks[0].attn(inputs["x"])'),
    ("_encode(x, flag=False)", 'self._encode(inputs["x"], flag=False)'),
    ("x[0]", 'inputs["x"][0]'),
    ("x[-1]", 'inputs["x"][-1]'),
    ("x[:, 4:]", 'inputs["x"][:, 4:]'),
    ("x[..., :n]", 'inputs["x"][..., :n]'),
    ("x[n:n + 2]", 'inputs["x"][n:n + 2]'),
    ("x[::2]", 'inputs["x"][::2]'),
    ("x[None]", 'inputs["x"][None]'),
    ("x[n,]", 'inputs["x"][n,]'),
    ("x[(n if n > 0 else 0):]", 'inputs["x"][(n if n > 0 else 0):]'),
    ("x.shape[-1]", 'inputs["x"].shape[-1]'),
    ("torch.cat([x, y], dim=0)", 'torch.cat([inputs["x"], y], dim=0)'),
    ("torch.stack((x, y))", 'torch.stack((inputs["x"], y))'),
    (
        "torch.zeros(n, hidden, dtype=torch.float32)",
        "torch.zeros(n, hidden, dtype=torch.float32)",
    ),
    ("torch.cat(helper(x), dim=0)", 'torch.cat(helper(inputs["x"]), dim=0)'),
    ("(x + y).unsqueeze(0)", '(inputs["x"] + y).unsqueeze(0)'),
    ("(x == -1).all(dim=-1)", '(inputs["x"] == -1).all(dim=-1)'),
    ("~mask", "~mask"),
    ("~(x == 0)", '~(inputs["x"] == 0)'),
    ("x / 2.5", 'inputs["x"] / 2.5'),
    ("x * -1", 'inputs["x"] * -1'),
    ("(-x).abs()", '(-inputs["x"]).abs()'),
    ("(3).bit_length()", "(3).bit_length()"),
    ("helper(x, 'nearest')", "helper(inputs[\"x\"], 'nearest')"),
    ("x if n > 0 else y", '(inputs["x"] if n > 0 else y)'),
    ("not mask", "(not mask)"),
    ("mask and n", "(mask and n)"),
    ("(x if mask else y).view(-1)", '(inputs["x"] if mask else y).view(-1)'),
]


@pytest.mark.parametrize(("text", "python"), STEP_CASES)
def test_step_expressions_print_as_python(text, python) -> None:
    import ast

    expr = parse_expression(text, STEPS)
    assert to_python(expr, {"x": 'inputs["x"]'}) == python
    ast.parse(python, mode="eval")
    assert parse_expression(to_spec_text(expr), STEPS) == expr


def test_step_expression_trees() -> None:
    expr = parse_expression("vision(x).out[:, n:].view(-1, hidden)", STEPS)
    sliced = Subscript(
        Attr(Call(HostPath(("vision",)), (Ref("x"),), ()), "out"),
        Display("tuple", (Slice(None, None, None), Slice(Ref("n"), None, None))),
    )
    assert expr == Call(Attr(sliced, "view"), (Num(-1), Ref("hidden")), ())
    assert fx.names_in(expr) == {"x", "n", "hidden"}
    assert fx.host_paths_in(expr) == {HostPath(("vision",))}
    assert parse_expression("x[..., 0]", STEPS).index == Display(
        "tuple", (Dots(), Num(0))
    )
    assert parse_expression("torch.int64", STEPS) == Torch("int64")
    assert parse_expression("~mask", STEPS) == Invert(Ref("mask"))


#: (step expression, message fragment, column)
STEP_ERRORS = [
    ("x._data", "attribute '_data' is not allowed", 2),
    ("x.__class__", "attribute '__class__' is not allowed", 2),
    ("x.view()._base", "attribute '_base' is not allowed", 9),
    ("vision._private(x)", "attribute '_private' is not allowed", 7),
    ("torch.nn.functional.gelu(x)", "torch.nn is not allowed", 0),
    ("torch.load(x)", "torch.load is not allowed", 0),
    ("torch.float32(x)", "torch.float32 is a dtype, not a function", 0),
    ("torch.cat", "torch.cat must be called", 0),
    ("torch.catt([x])", "did you mean 'cat'?", 0),
    ("torch", "torch is only allowed as torch.<function or dtype>", 0),
    ("eval(x)", "cannot call 'eval'", 0),
    ("x[0](y)", "only host methods, imported helpers, torch functions", 0),
    ("unknown.view(1)", "unknown name 'unknown'", 0),
    ("x.view(-1, hiden)", "did you mean 'hidden'?", 11),
    ("x.view(*y)", "*args is not allowed", 7),
    ("x.view(**y)", "**kwargs is not allowed", 7),
    ("[i for i in x]", "comprehensions are not allowed", 0),
    ("{x: y}", "dicts are not allowed", 0),
    ("f'{x}'", "f-strings are not allowed", 0),
    ("lambda: x", "lambdas are not allowed", 0),
    ("x is None", "comparison 'is' is not allowed", 0),
    ("0 < x < n", "chained comparisons", 0),
    ("b'x'", "is not allowed (integers, strings, finite floats)", 0),
    ("1e999", "is not allowed (integers, strings, finite floats)", 0),
    ("x ** n", "the exponent of ** must be a literal", 0),
    ("x @ y", "operator '@' is not allowed", 0),
    ("(y := x)", "assignment expressions", 1),
    ("...", "is not allowed", 0),
    ("x[1:2:3:4]", "syntax error", 7),
]


@pytest.mark.parametrize(("text", "fragment", "column"), STEP_ERRORS)
def test_step_expression_errors(text, fragment, column) -> None:
    with pytest.raises(FormulaError) as info:
        parse_expression(text, STEPS)
    assert fragment in str(info.value)
    assert info.value.column == column


@pytest.mark.parametrize(
    "text", ["x.view(1)", "x[0]", "torch.cat([x])", "[x]", "'s'", "1.5", "x / 2"]
)
def test_step_syntax_is_refused_outside_forward_steps(text) -> None:
    """The same text in a call field without ``tensor_ops`` (a builder call)."""
    scope = Scope(STEPS.names, STEPS.host_roots, STEPS.callables, True, True)
    with pytest.raises(FormulaError):
        parse_expression(text, scope)


#: (statement, targets)
STATEMENTS = [
    ("out = vision(x)", ("out",)),
    ("a, b = vision(x)", ("a", "b")),
    ("pooled, _ = vision(x)", ("pooled", "_")),
    ("  a ,b= vision(x)\n", ("a", "b")),
    ("vision(x)", ()),
    ("x == vision(y)", ()),
]


@pytest.mark.parametrize(("text", "targets"), STATEMENTS)
def test_statements(text, targets) -> None:
    got, _ = parse_statement(text, STEPS)
    assert got == targets
    assert fx.assignment_targets(text) == targets


#: (statement, message fragment, column)
BAD_STATEMENTS = [
    ("_, _ = vision(x)", "needs at least one name", 0),
    ("a, a = vision(x)", "'a' is assigned twice", 3),
    ("a, _b = vision(x)", "bad assignment target '_b'", 3),
    ("  a, _b = vision(x)", "bad assignment target '_b'", 5),
    ("_ = vision(x)", "bad assignment target '_'", 0),
    ("a, for = vision(x)", "bad assignment target 'for'", 3),
    ("a, = vision(x)", "syntax error", 3),
    ("a, b = c = vision(x)", "syntax error", 9),
    ("x[0] = y", "syntax error", 5),
]


@pytest.mark.parametrize(("text", "fragment", "column"), BAD_STATEMENTS)
def test_bad_statements(text, fragment, column) -> None:
    with pytest.raises(FormulaError) as info:
        parse_statement(text, STEPS)
    assert fragment in str(info.value)
    assert info.value.column == column


def test_tuple_targets_are_statements_only() -> None:
    with pytest.raises(FormulaError, match="tuple target"):
        parse_assignment("a, b = vision(x)", STEPS)


def test_step_expressions_have_no_integer_value() -> None:
    for text in ("x.view(1)", "x[0]", "torch.int64", "x / 2", "~x", "'s'"):
        with pytest.raises(EvaluationError):
            evaluate(parse_expression(text, STEPS), {"x": 1})


def test_substitute_reaches_every_node() -> None:
    expr = parse_expression("x[n:].view(n if mask else -n, helper(k=n))", STEPS)
    got = fx.substitute(expr, {"n": Num(4)})
    assert to_spec_text(got) == "x[4:].view(4 if mask else -4, helper(k=4))"


# -- random step trees: printing is exact -------------------------------------------------------

_step_leaves = st.one_of(
    st.integers(min_value=0, max_value=9).map(Num),
    st.sampled_from(["x", "y", "n"]).map(Ref),
    st.sampled_from(["s", 1.5]).map(Literal),
    st.just(Torch("int64")),
)


def _not_num(children: st.SearchStrategy) -> st.SearchStrategy:
    return children.filter(lambda c: not isinstance(c, Num))


def _index(children: st.SearchStrategy) -> st.SearchStrategy:
    part = st.one_of(st.none(), children)
    item = st.one_of(
        children, st.tuples(part, part, part).map(lambda t: Slice(*t)), st.just(Dots())
    )
    return st.one_of(
        item, st.lists(item, max_size=3).map(lambda i: Display("tuple", tuple(i)))
    )


def _grow_step(children: st.SearchStrategy) -> st.SearchStrategy:
    args = st.lists(children, max_size=2).map(tuple)
    return st.one_of(
        st.tuples(
            st.sampled_from(["+", "-", "*", "/", "//", "%"]), children, children
        ).map(lambda t: BinOp(*t)),
        st.tuples(children, st.integers(0, 3)).map(
            lambda t: BinOp("**", t[0], Num(t[1]))
        ),
        _not_num(children).map(Neg),
        children.map(Invert),
        children.map(Not),
        st.tuples(st.sampled_from(sorted(COMPARISONS)), children, children).map(
            lambda t: Compare(*t)
        ),
        st.tuples(st.sampled_from(["and", "or"]), children, children).map(
            lambda t: BoolOp(t[0], t[1:])
        ),
        st.tuples(children, children, children).map(lambda t: IfExp(*t)),
        children.map(lambda c: Attr(c, "view")),
        st.tuples(children, _index(children)).map(lambda t: Subscript(*t)),
        st.tuples(children, args).map(lambda t: Call(Attr(t[0], "view"), t[1], ())),
        st.tuples(st.sampled_from(["list", "tuple"]), args).map(lambda t: Display(*t)),
        args.map(
            lambda a: Call(Torch("cat"), (Display("list", a),), (("dim", Num(0)),))
        ),
    )


step_trees = st.recursive(_step_leaves, _grow_step, max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(tree=step_trees)
def test_step_printing_is_exact(tree) -> None:
    """Printing then parsing gives the same tree: every parenthesis the
    tree needs is printed, and the Python spelling has the same syntax tree."""
    import ast

    if _divides_by_constant_zero(tree):
        with pytest.raises(FormulaError, match="division by zero"):
            parse_expression(to_spec_text(tree), STEPS)
        return
    assert parse_expression(to_spec_text(tree), STEPS) == tree
    python = ast.dump(ast.parse(to_python(tree), mode="eval"))
    assert python == ast.dump(ast.parse(to_spec_text(tree), mode="eval"))


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="xyn()[]:.,=-+*/~ 0123456789torchviewif", max_size=40))
def test_arbitrary_step_text_never_crashes(text) -> None:
    try:
        targets, expr = parse_statement(text, STEPS)
    except FormulaError:
        return
    assert parse_expression(to_spec_text(expr), STEPS) == expr
