"""``tools/spec_sizes.py``: how lines are counted, and that
``docs/spec-sizes.md`` is current (when the vLLM wheel is there: CI
downloads it)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import textwrap
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from generator.scopes import PROTOCOL_METHODS
from generator.vllm_manifest import find_vllm_wheel

REPO = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    """The script, loaded from its path (it is not a package module)."""
    path = REPO / "tools" / "spec_sizes.py"
    spec = importlib.util.spec_from_file_location("spec_sizes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up while the class is made.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


TOOL = _tool()

YAML_CASES = [
    ("plain keys", "a: 1\nb: 2\n", 2),
    ("blank and comment lines", "# head\n\na: 1\n  # inner\nb: 2\n", 2),
    ("docstring block skipped", "name: x\ndocstring: |\n  one\n\n  two\nc: 3\n", 2),
    ("one-line docstring skipped", "docstring: short\nc: 3\n", 1),
    ("nested keys count", "inputs:\n  a: {kind: flat}\n  b: 1\n", 3),
]


@pytest.mark.parametrize(
    "text, expected", [c[1:] for c in YAML_CASES], ids=[c[0] for c in YAML_CASES]
)
def test_yaml_code_lines(text: str, expected: int) -> None:
    assert TOOL.yaml_code_lines(text) == expected


PY_CASES = [
    ("body lines", "def f():\n    a = 1\n    return a\n", 3),
    (
        "docstring and comments skipped",
        'def f():\n    """Doc.\n\n    more\n    """\n    # why\n    return 1\n',
        2,
    ),
    ("decorator counts", "@staticmethod\ndef f():\n    return 1\n", 3),
    ("continuation lines count", "def f():\n    return g(\n        1,\n    )\n", 4),
]


@pytest.mark.parametrize(
    "source, expected", [c[1:] for c in PY_CASES], ids=[c[0] for c in PY_CASES]
)
def test_python_code_lines(source: str, expected: int) -> None:
    tree = ast.parse(source)
    assert TOOL.python_code_lines(source, tree.body, tree) == expected


CLASS_SOURCE = textwrap.dedent(
    """
    class Model:
        def forward(self):
            return self._process_image_input()

        def _process_image_input(self):
            return 1

        def encoder_eager_forward(self):
            return self._process_image_input()

        def get_encoder_cudagraph_config(self):
            return self._only_mixin()

        def _only_mixin(self):
            return self._deeper()

        def _deeper(self):
            return 2
    """
)


def test_helpers_counted_only_when_only_protocol_methods_call_them() -> None:
    klass = ast.parse(CLASS_SOURCE).body[0]
    counted = TOOL._counted(TOOL._own_methods(klass))
    assert counted == [
        "get_encoder_cudagraph_config",
        "encoder_eager_forward",
        "_only_mixin",
        "_deeper",
    ]


def test_helpers_the_spec_calls_itself_are_not_counted() -> None:
    """A spec's ``host_methods`` stay in the model (the generated mixin
    calls them), and so do the helpers only they call."""
    klass = ast.parse(CLASS_SOURCE).body[0]
    counted = TOOL._counted(TOOL._own_methods(klass), frozenset({"_only_mixin"}))
    assert counted == ["get_encoder_cudagraph_config", "encoder_eager_forward"]


def test_a_spec_s_host_methods_are_read_from_it() -> None:
    specs = REPO / "specs"
    assert TOOL._kept(specs / "step3_vl.yaml") == {"_batched_encoder_forward"}
    assert TOOL._kept(specs / "deepseek_v41.yaml") == frozenset()


def test_table_is_current() -> None:
    path = find_vllm_wheel()
    if path is None:
        pytest.skip("vLLM 0.33.0 wheel not found")
    with zipfile.ZipFile(path) as wheel:
        text = TOOL.render(TOOL.measure(wheel))
    assert (
        REPO / "docs" / "spec-sizes.md"
    ).read_text() == text, (
        "docs/spec-sizes.md is stale: run python3 tools/spec_sizes.py"
    )


def test_every_spec_has_a_vllm_source() -> None:
    stems = {p.stem for p in (REPO / "specs").glob("*.yaml")}
    assert stems <= set(TOOL.VLLM_SOURCES) | set(TOOL.ESTIMATED_BY)
    assert set(TOOL.ESTIMATED_BY.values()) <= set(TOOL.VLLM_SOURCES)


# -- docs/side-by-side.md --------------------------------------------------------------

PROSE_CASES = [
    ("code only", "def f():\n    return 1\n", set()),
    ("a comment line", "def f():\n    # why\n    return 1  # trailing\n", {2}),
    (
        "a docstring",
        'def f():\n    """One.\n\n    Two.\n    """\n    return 1\n',
        {2, 3, 4, 5},
    ),
    ("a string statement that is no docstring", 'x = 1\n"""text"""\n', set()),
]


@pytest.mark.parametrize(
    "source, expected", [c[1:] for c in PROSE_CASES], ids=[c[0] for c in PROSE_CASES]
)
def test_prose_lines(source: str, expected: set[int]) -> None:
    assert TOOL.prose_lines(source, ast.parse(source)) == expected


def test_side_by_side_rows_are_protocol_methods_then_each_side_s_helpers() -> None:
    lines = TOOL.Lines
    vllm = {
        "encoder_eager_forward": lines(3, 0),
        "_grid": lines(4, 1),
        "get_encoder_cudagraph_config": lines(5, 0),
    }
    generated = {
        "get_encoder_cudagraph_config": lines(6, 2),
        "_checked": lines(7, 3),
        "encoder_eager_forward": lines(2, 1),
    }
    rows = TOOL.side_by_side_table(vllm, generated).splitlines()[2:]
    assert rows == [
        "| `get_encoder_cudagraph_config` | 5 | 0 | 6 | 2 |",
        "| `encoder_eager_forward` | 3 | 0 | 2 | 1 |",
        "| `_grid` | 4 | 1 | – | – |",
        "| `_checked` | – | – | 7 | 3 |",
        "| **total** | 12 | 1 | 15 | 6 |",
    ]


def test_side_by_side_page_is_current() -> None:
    path = find_vllm_wheel()
    if path is None:
        pytest.skip("vLLM 0.33.0 wheel not found")
    page = (REPO / "docs" / "side-by-side.md").read_text()
    with zipfile.ZipFile(path) as wheel:
        assert (
            TOOL.side_by_side_page(wheel, page) == page
        ), "docs/side-by-side.md is stale: run python3 tools/spec_sizes.py"


def _protocol_table_methods() -> list[str]:
    """The methods of docs/protocol.md's methods table, in its order."""
    text = (REPO / "docs" / "protocol.md").read_text()
    table = text.split("| method | called | contract |", 1)[1].split("\n\n", 1)[0]
    return [
        name
        for line in table.splitlines()
        for name in re.findall(r"`(\w+)\(", line.split("|")[1] if "|" in line else "")
    ]


def test_the_protocol_table_lists_the_methods_in_the_generated_order() -> None:
    listed = [m for m in _protocol_table_methods() if m in PROTOCOL_METHODS]
    assert listed == list(PROTOCOL_METHODS)


GENERATED = sorted(
    p for p in (REPO / "generated").glob("*/*.py") if p.name != "__init__.py"
)


@pytest.mark.parametrize(
    "path", GENERATED, ids=[f"{p.parent.name}/{p.name}" for p in GENERATED]
)
def test_generated_methods_follow_the_protocol_order(path: Path) -> None:
    """The protocol's methods in protocol order, then the helpers."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    names = [n.name for n in klass.body if isinstance(n, ast.FunctionDef)]
    protocol = [n for n in names if n in PROTOCOL_METHODS]
    assert protocol == sorted(protocol, key=PROTOCOL_METHODS.index)
    assert names[: len(protocol)] == protocol
