"""What each target may import: one function, :func:`import_problem`.

* ``vllm``: modules under ``vllm`` (compared by dotted components) that the
  offline manifest of vLLM 0.33.0 (:mod:`generator.vllm_manifest`) lists, and
  names they define.
* ``standalone``: modules of this project (``encoder_cudagraph_runtime``,
  ``reference_towers``), read with ``ast`` (never imported), and names bound
  at their top level.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from generator.vllm_manifest import vllm_import_problem

#: The packages each target's imports may come from.
TARGET_ROOTS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),
    "standalone": ("encoder_cudagraph_runtime", "reference_towers"),
}
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def import_problem(target: str, module: str, name: str) -> str | None:
    """Why ``from <module> import <name>`` is not allowed in ``target``'s
    module, or None."""
    roots = TARGET_ROOTS[target]
    if module.split(".")[0] not in roots:
        return (
            f"module {module!r} is not a module of the {target} target "
            f"(expected one under: {', '.join(roots)})"
        )
    if target == "vllm":
        return vllm_import_problem(module, name)
    names = _project_names(module)
    if names is None:
        return f"no module {module!r} in this project"
    if name not in names:
        return f"{module} defines no {name!r} (this project)"
    return None


def _project_names(module: str) -> frozenset[str] | None:
    base = PROJECT_ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return _top_level_names(path)
    return None


@cache
def _top_level_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_bytes(), filename=str(path))
    return frozenset(top_level_names(tree.body))


def top_level_names(body: list[ast.stmt]) -> set[str]:
    """Names a module body binds: defs, classes, assignments and imports,
    also inside top-level ``if`` / ``try``."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(_targets(target))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            names.update(_targets(node.target))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.If):
            names |= top_level_names(node.body) | top_level_names(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody):
                names |= top_level_names(part)
            for handler in node.handlers:
                names |= top_level_names(handler.body)
    return names


def _targets(target: ast.expr):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _targets(elt)
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value)
