"""No import cycle in ``generator/``.

A cycle works only while every module in it is imported in a lucky order (or
hidden behind an import inside a function), and breaks the day a new entry
point imports another of its modules first. The graph is read with ``ast``:
every ``import`` and ``from ... import`` of a module, those inside functions
included (they run when the function does), except those under ``if
TYPE_CHECKING:`` (never run). ``from package import name`` is an edge to the
submodule ``package.name`` when there is one, else to the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from genmixin_testlib import REPO


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root``
    (``root``'s own name is the top package)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _run_time_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                todo.extend(child.orelse)
            else:
                todo.append(child)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports at run time."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _run_time_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    out.add(sub)
                elif base in modules:
                    out.add(base)
    return out - {name}


def import_cycles(root: Path) -> list[list[str]]:
    """Cycles of the import graph under ``root``, each as one path ``a -> b
    -> ... -> a``: the shortest through each module not yet on a reported
    cycle, so that none is reported twice and none is missed."""
    modules = module_files(root)
    graph = {n: sorted(imported_modules(n, p, modules)) for n, p in modules.items()}
    cycles, done = [], set()
    for start in sorted(graph):
        if start in done:
            continue
        path = _path_back(graph, start)
        if path is not None:
            cycles.append(path)
            done |= set(path)
    return cycles


def _path_back(graph: dict[str, list[str]], start: str) -> list[str] | None:
    """The shortest import path from ``start`` back to itself, if any."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for target in graph[node]:
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in parents:
                    parents[target] = node
                    nxt.append(target)
        frontier = nxt
    return None


def test_the_generator_has_no_import_cycle() -> None:
    cycles = import_cycles(REPO / "generator")
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


# (case, files of a package ``pkg``, the cycles found)
CASES = [
    ("no imports", {"__init__.py": "", "a.py": "x = 1\n"}, []),
    (
        "a line",
        {"__init__.py": "", "a.py": "from pkg import b\n", "b.py": "import os\n"},
        [],
    ),
    (
        "two modules",
        {"__init__.py": "", "a.py": "import pkg.b\n", "b.py": "from pkg.a import f\n"},
        [["pkg.a", "pkg.b", "pkg.a"]],
    ),
    (
        "through the package and a function-level import",
        {
            "__init__.py": "from pkg import a\n",
            "a.py": "def f():\n    from pkg.b import g\n",
            "b.py": "from pkg import Error\n",
        },
        [["pkg", "pkg.a", "pkg.b", "pkg"]],
    ),
    (
        "relative imports",
        {"__init__.py": "", "a.py": "from .b import x\n", "b.py": "from . import a\n"},
        [["pkg.a", "pkg.b", "pkg.a"]],
    ),
    (
        "type checking only",
        {
            "__init__.py": "",
            "a.py": "import pkg.b\n",
            "b.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg.a import A\n",
        },
        [],
    ),
]


@pytest.mark.parametrize(("case", "files", "cycles"), CASES, ids=[c[0] for c in CASES])
def test_a_cycle_is_found(tmp_path: Path, case, files, cycles) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(text, encoding="utf-8")
    assert import_cycles(package) == cycles
