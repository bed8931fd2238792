"""The located YAML loader (``generator.yaml_loader``) and the one-line
diagnostic format, on inputs too small or too odd for the corpus.

* Anchors and aliases are reported where they are written, and an alias is
  never expanded (no "billion laughs", no recursion through a self alias).
* Nesting is bounded: deep input is one located problem, never a
  RecursionError.
* A character the YAML reader refuses is located at its own line and column,
  counting lines as YAML does.
* Bad scalars of the allowed tags are problems, never exceptions.
* Keys and messages never break the ``file:line:col: field: message`` line.
"""

from __future__ import annotations

import time

import pytest

from generator.diagnostics import Diagnostics, Location, SpecError
from generator.resolve import resolve_text
from generator.yaml_loader import MAX_NESTING, load_spec_tree
from genmixin_testlib import DIAG_RE


def _load(text: str) -> tuple[object, list[str]]:
    diags = Diagnostics()
    tree = load_spec_tree(text, "s.yaml", diags)
    return tree, [str(d) for d in diags.sorted()]


def test_anchor_and_alias_are_located() -> None:
    _, diags = _load("a: &x 1\nb: *x\n")
    assert diags == [
        "s.yaml:1:4: a: anchors and aliases are not allowed",
        "s.yaml:2:4: b: anchors and aliases are not allowed",
    ]


def test_aliases_in_keys() -> None:
    _, diags = _load("a: &k x\n*k : 1\n&j c: 2\n")
    assert diags == [
        "s.yaml:1:4: a: anchors and aliases are not allowed",
        "s.yaml:2:1: anchors and aliases are not allowed",
        "s.yaml:3:1: anchors and aliases are not allowed",
    ]


def test_aliases_are_not_expanded() -> None:
    rows = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 12):
        rows.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    start = time.monotonic()
    _, diags = _load("\n".join(rows) + "\n")
    assert time.monotonic() - start < 5
    assert len(diags) == 12 + 11 * 10


def test_self_alias() -> None:
    _, diags = _load("a: &x [1, *x]\n")
    assert diags == [
        "s.yaml:1:4: a: anchors and aliases are not allowed",
        "s.yaml:1:11: a[1]: anchors and aliases are not allowed",
    ]


def test_undefined_and_duplicate_anchors_stay_malformed_yaml() -> None:
    assert _load("a: *x\n")[1] == [
        "s.yaml:1:4: malformed YAML: found undefined alias 'x'"
    ]
    assert _load("a: &x 1\nb: &x 2\n")[1][0].startswith("s.yaml:2:4: malformed YAML")


@pytest.mark.parametrize("opener", ["[", "{k: "])
def test_nesting_limit(opener: str) -> None:
    closer = "]" if opener == "[" else "}"

    def nested(depth: int) -> str:
        return "a: " + opener * depth + "1" + closer * depth + "\n"

    tree, diags = _load(nested(MAX_NESTING - 1))
    assert tree is not None and not diags
    _, diags = _load(nested(MAX_NESTING))
    assert len(diags) == 1 and "nested too deeply" in diags[0], diags
    field = DIAG_RE.match(diags[0])["rest"].split(":")[0]
    assert field == ("a" if opener == "[" else "a" + ".k" * 7), diags


def test_deep_nesting_is_one_short_problem() -> None:
    _, diags = _load("a:\n  b: " + "{k: " * 5000 + "1" + "}" * 5000 + "\n")
    assert diags == [
        "s.yaml:2:30: a.b.k.k.k.k.k.k: nested too deeply (more than "
        f"{MAX_NESTING} levels of lists and mappings)"
    ]
    _, diags = _load("[" * 5000 + "]" * 5000 + "\n")
    assert len(diags) == 1 and "nested too deeply" in diags[0]


@pytest.mark.parametrize(
    ("text", "line", "col"),
    [
        ("a: \x07\n", 1, 4),
        ("a: 1\nb: x\x01\n", 2, 5),
        ("a: 1\r\nb: \x1b\n", 2, 4),
        ("a: 1\rb: \x1b\n", 2, 4),
        ('a: "\x85"\nb: \x1b\n', 3, 4),
        ('a: "x\u2028y"\nb: \x7f\n', 3, 4),
    ],
)
def test_refused_character_is_located(text: str, line: int, col: int) -> None:
    _, diags = _load(text)
    assert len(diags) == 1
    assert diags[0].startswith(f"s.yaml:{line}:{col}: "), diags
    assert "is not allowed (only printable characters" in diags[0]
    assert DIAG_RE.match(diags[0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: !!bool maybe\n", "a: bad scalar: 'maybe' is not a boolean"),
        ("a: !!bool ''\n", "a: bad scalar: '' is not a boolean"),
        ("a: !!int ''\n", "a: bad scalar: '' is not an integer"),
        ("a: !!float ''\n", "a: bad scalar: '' is not a number"),
        ("a: !!int one\n", "a: bad scalar: invalid literal for int()"),
    ],
)
def test_bad_scalars(text: str, message: str) -> None:
    _, diags = _load(text)
    assert len(diags) == 1 and diags[0].startswith(f"s.yaml:1:4: {message}")


@pytest.mark.parametrize("key", ["a\nb", "a\x85b", "a\u2028b", "a\tb", "a\x1bb"])
def test_non_printable_keys(key: str) -> None:
    import yaml

    _, diags = _load(yaml.safe_dump({"top": {key: 1}}))
    assert len(diags) == 1
    assert "mapping keys must be printable" in diags[0]
    assert f"top.{key!r}: " in diags[0]
    assert DIAG_RE.match(diags[0])


def test_diagnostics_escape_what_would_break_the_line() -> None:
    diags = Diagnostics()
    diags.error(Location("s.yaml", 1, 1), "a.b\nc", "bad\u2028thing\r")
    (line,) = [str(d) for d in diags.sorted()]
    assert line == "s.yaml:1:1: a.b\\nc: bad\\u2028thing\\r"


@pytest.mark.parametrize(
    ("value", "col"),
    [
        ("a * zz", 8),  # plain: the column of zz
        ('"a * zz"', 9),  # quoted: counted past the quote
        ("'a * zz'", 9),
        ('"a *\\x20zz"', 4),  # an escape: the value's start
        ("a *\n  zz", 4),  # on two lines: the value's start
    ],
)
def test_formula_columns(value: str, col: int) -> None:
    """Where a formula's error is reported: inside the value when the value
    reads as written, else at its start."""
    from generator.formulas import Scope
    from generator.spec.reader import ReadContext
    from generator.spec.values import parse_formula

    diags = Diagnostics()
    tree = load_spec_tree(f"x: {value}\n", "s.yaml", diags)
    assert not diags
    ctx = ReadContext("s.yaml", diags)
    parse_formula(tree.value["x"], "x", ctx, Scope(frozenset({"a"})))
    (line,) = [str(d) for d in diags.sorted()]
    assert line.startswith(f"s.yaml:1:{col}: x: unknown name 'zz'"), line


def test_resolve_text_never_raises_recursion_error() -> None:
    with pytest.raises(SpecError) as info:
        resolve_text("format: " + "[" * 3000 + "]" * 3000 + "\n", "s.yaml")
    (diag,) = info.value.diagnostics
    assert "nested too deeply" in str(diag)
