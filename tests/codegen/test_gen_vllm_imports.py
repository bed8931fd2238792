"""Every vLLM name the ``vllm`` target imports exists in vLLM 0.33.0.

The wheel is read with ``zipfile`` and ``ast`` (never installed or
imported): for each ``from vllm.x.y import name`` of ``generated/vllm/*.py``
(module level, inside functions, under ``TYPE_CHECKING``), ``vllm/x/y.py`` or
``vllm/x/y/__init__.py`` must exist and bind ``name`` at its top level (an
assignment, tuple assignment, def, class or import, also inside a top-level
``if`` / ``try``). Attribute uses of ``AttentionBackendEnum`` must be members
of vLLM's enum.

The wheel: ``$GEN_MIXIN_VLLM_WHEEL``, else ``~/.cache/gen-mixin/vllm-0.33.0-*.whl``
(CI puts it there with ``pip download vllm==0.33.0 --no-deps -d
~/.cache/gen-mixin``); without it these tests skip.
"""

from __future__ import annotations

import ast
import os
import zipfile
from functools import cache
from pathlib import Path

import pytest

from genmixin_testlib import GENERATED_DIR

VLLM_FILES = sorted((GENERATED_DIR / "vllm").glob("*.py"))


def _wheel_path() -> Path | None:
    env = os.environ.get("GEN_MIXIN_VLLM_WHEEL")
    if env:
        return Path(env)
    found = sorted((Path.home() / ".cache" / "gen-mixin").glob("vllm-0.33.0-*.whl"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    path = _wheel_path()
    if path is None:
        pytest.skip(
            "vLLM 0.33.0 wheel not found: set GEN_MIXIN_VLLM_WHEEL or run "
            "`pip download vllm==0.33.0 --no-deps -d ~/.cache/gen-mixin`"
        )
    if not path.is_file():
        pytest.fail(f"GEN_MIXIN_VLLM_WHEEL={path} does not exist")
    with zipfile.ZipFile(path) as zf:
        yield zf


@cache
def _module_tree(zf: zipfile.ZipFile, module: str) -> tuple[str, ast.Module] | None:
    base = module.replace(".", "/")
    names = set(zf.namelist())
    for candidate in (f"{base}.py", f"{base}/__init__.py"):
        if candidate in names:
            return candidate, ast.parse(zf.read(candidate), filename=candidate)
    return None


def _top_level_statements(body: list[ast.stmt]):
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level_statements(node.body)
            yield from _top_level_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody):
                yield from _top_level_statements(part)
            for handler in node.handlers:
                yield from _top_level_statements(handler.body)


def _target_names(target: ast.expr):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in _top_level_statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(_target_names(target))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            names.update(_target_names(node.target))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
    return names


def vllm_imports(source: str) -> list[tuple[int, str, str]]:
    """(line, module, name) of every ``from vllm... import name``, anywhere."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] == "vllm"
        ):
            assert node.level == 0
            out.extend((node.lineno, node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] != "vllm", "plain `import vllm...`"
    return out


def test_there_are_vllm_modules() -> None:
    assert VLLM_FILES


@pytest.mark.parametrize("path", VLLM_FILES, ids=[p.stem for p in VLLM_FILES])
def test_every_vllm_import_exists_in_0_33_0(wheel, path: Path) -> None:
    imports = vllm_imports(path.read_text(encoding="utf-8"))
    assert imports, f"{path.name} imports nothing from vllm"
    problems = []
    for line, module, name in imports:
        found = _module_tree(wheel, module)
        if found is None:
            problems.append(f"{path.name}:{line}: no module {module} in the wheel")
        elif name not in top_level_names(found[1]):
            problems.append(f"{path.name}:{line}: {found[0]} does not define {name!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", VLLM_FILES, ids=[p.stem for p in VLLM_FILES])
def test_backend_members_exist(wheel, path: Path) -> None:
    registry = _module_tree(wheel, "vllm.v1.attention.backends.registry")
    assert registry is not None
    enum = next(
        n
        for n in registry[1].body
        if isinstance(n, ast.ClassDef) and n.name == "AttentionBackendEnum"
    )
    members = {
        t.id
        for n in enum.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    used = {
        n.attr
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "AttentionBackendEnum"
    }
    assert used <= members, sorted(used - members)


def test_schema_backends_exist(wheel) -> None:
    """The backend names a spec may list are vLLM 0.33.0's."""
    from generator.spec_schema import BACKENDS

    registry = _module_tree(wheel, "vllm.v1.attention.backends.registry")
    assert registry is not None
    text = ast.unparse(registry[1])
    for name in BACKENDS:
        assert f"{name} = " in text, name


def test_name_finder_handles_every_binding_form() -> None:
    tree = ast.parse(
        "import a.b\nfrom c import d as e\nX, (Y, *Z) = range(3)\nW: int = 1\n"
        "def f(): pass\nclass C: pass\nif T:\n    G = 1\nelse:\n    H = 2\n"
        "try:\n    from m import I\nexcept ImportError:\n    I = None\n"
        "def outer():\n    hidden = 1\n"
    )
    assert top_level_names(tree) == {
        "a",
        "e",
        "X",
        "Y",
        "Z",
        "W",
        "f",
        "C",
        "G",
        "H",
        "I",
        "outer",
    }


def test_checker_flags_missing_modules_and_names(wheel) -> None:
    source = (
        "from vllm.config import VllmConfig, NoSuchConfig\n"
        "def f():\n    from vllm.no_such_module import x\n"
    )
    verdicts = {}
    for _, module, name in vllm_imports(source):
        found = _module_tree(wheel, module)
        verdicts[name] = found is not None and name in top_level_names(found[1])
    assert verdicts == {"VllmConfig": True, "NoSuchConfig": False, "x": False}


@pytest.mark.parametrize("path", VLLM_FILES, ids=[p.stem for p in VLLM_FILES])
def test_offline_manifest_agrees_with_the_wheel(wheel, path: Path) -> None:
    """The generator's offline manifest (generator/vllm_manifest.py) gives the
    verdicts this test reads from the wheel, and the same public names for
    every module the generated code imports from."""
    from generator.vllm_manifest import vllm_import_problem, vllm_module_names

    imports = vllm_imports(path.read_text(encoding="utf-8")) + [
        (0, "vllm.config", "NoSuchConfig"),
        (0, "vllm.no_such_module", "x"),
    ]
    for _, module, name in imports:
        found = _module_tree(wheel, module)
        in_wheel = found is not None and name in top_level_names(found[1])
        assert (vllm_import_problem(module, name) is None) == in_wheel, (module, name)
        if found is not None:
            public = {n for n in top_level_names(found[1]) if not n.startswith("_")}
            assert vllm_module_names(module) == public, module
