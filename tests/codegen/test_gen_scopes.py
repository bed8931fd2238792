"""The scope table (``generator/scopes.py``) against the generated code.

Every generated function is parsed with ``ast``: its parameters are the
table's, and every name it binds is a parameter or local the table declares
for it, or a name the spec declares. A template that starts binding a new
name without declaring it fails here, so the table the resolver checks spec
names against cannot drift from what the code binds.
"""

from __future__ import annotations

import ast

import pytest

from generator.resolve import load_spec
from generator.scopes import METHODS, MODULE_NAMES, NameKind
from genmixin_testlib import render_path, spec_paths, target_cases, valid_corpus_paths

CASES = target_cases(spec_paths() + valid_corpus_paths())
IDS = [f"{t}-{s.parent.name}/{s.stem}" for t, s in CASES]


def _functions(tree: ast.Module):
    """(function, in a class) for every def of the module."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node, False
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield item, True


def _entry(name: str):
    if name.startswith("_copy_rows_on_dim"):
        return METHODS["_copy_rows_on_dim"]
    return METHODS.get(name)


def bound_names(fn: ast.FunctionDef) -> set[str]:
    """Every name ``fn`` binds: parameters, assignment, loop and
    comprehension targets, imports, ``except ... as``."""
    args = fn.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


@pytest.mark.parametrize(("target", "path"), CASES, ids=IDS)
def test_every_bound_name_is_declared(target: str, path) -> None:
    spec = load_spec(path)
    declared = spec.declared_names()
    spec_names = set().union(*declared.values())
    tree = ast.parse(render_path(path, target))
    for fn, _ in _functions(tree):
        method = _entry(fn.name)
        assert method is not None, f"{fn.name} is not in scopes.METHODS"
        allowed = method.bound_names(declared) | spec_names
        undeclared = bound_names(fn) - allowed
        assert not undeclared, f"{fn.name} binds {sorted(undeclared)}"


@pytest.mark.parametrize(("target", "path"), CASES, ids=IDS)
def test_signatures_are_the_tables(target: str, path) -> None:
    tree = ast.parse(render_path(path, target))
    for fn, _ in _functions(tree):
        args = [a.arg for a in fn.args.args]
        assert args == [p.name for p in _entry(fn.name).params], fn.name


@pytest.mark.parametrize(("target", "path"), CASES, ids=IDS)
def test_module_names_are_the_tables(target: str, path) -> None:
    spec = load_spec(path)
    tree = ast.parse(render_path(path, target))
    helpers = {n for n in METHODS if n.startswith("_")}
    allowed = MODULE_NAMES | spec.declared_names()[NameKind.IMPORT] | {spec.class_name}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert _entry(node.name) is not None and node.name in helpers | {
                n for n in [node.name] if n.startswith("_copy_rows_on_dim")
            }, node.name
        elif isinstance(node, ast.ClassDef):
            assert node.name in allowed
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                assert (alias.asname or alias.name.split(".")[0]) in allowed
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                assert isinstance(t, ast.Name) and t.id in allowed, ast.dump(t)


def test_the_checker_sees_an_undeclared_local() -> None:
    fn = ast.parse("def f(a, *b, c, **d):\n    x = [y for y in a]\n    z += 1\n")
    assert bound_names(fn.body[0]) == {"a", "b", "c", "d", "x", "y", "z"}
