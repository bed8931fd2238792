#!/usr/bin/env python3
"""Make gen-mixin's offline manifest of vLLM's modules and top-level names.

The generator refuses a spec's ``vllm:`` import of a module or name that the
pinned vLLM does not have (``generator/vllm_manifest.py`` reads the result).
This script makes that manifest from the vLLM wheel, read with ``zipfile``
and ``ast`` (vLLM is never installed or imported). Re-make it whenever the
pinned vLLM changes:

    pip download vllm==0.33.0 --no-deps -d ~/.cache/gen-mixin
    python3 tools/make_vllm_manifest.py             # rewrite the manifest
    python3 tools/make_vllm_manifest.py --check     # exit 1 if it is stale

A module's names are what ``from <module> import <name>`` can bind: every
public name bound at the module's top level (def, class, assignment,
import, also inside a top-level ``if`` / ``try``) and, for a module with a
module-level ``__getattr__`` (lazy exports), the literal strings of its
``__all__``. Names starting with ``_`` are left out: a spec cannot import
them. Only the packages a mixin may plausibly import from are listed (see
``COVERED_PACKAGES``), which keeps the file under a megabyte.
"""

from __future__ import annotations

import argparse
import ast
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from generator.vllm_manifest import VLLM_VERSION, covers, find_vllm_wheel

REPO = Path(__file__).resolve().parents[1]
MANIFEST_PATH = REPO / "generator" / "data" / "vllm_manifest.txt"

#: Packages whose every module is listed, besides the modules that sit
#: directly in ``vllm/`` (``vllm.envs``, ``vllm.logger``, ...) and the
#: packages on the way to a listed module (``vllm.v1``). They are what
#: vLLM's own model code imports from, minus its kernels and engine.
COVERED_PACKAGES = (
    "vllm.config",
    "vllm.distributed",
    "vllm.model_executor.layers",
    "vllm.model_executor.models",
    "vllm.models",
    "vllm.multimodal",
    "vllm.platforms",
    "vllm.transformers_utils",
    "vllm.utils",
    "vllm.v1.attention",
    "vllm.v1.worker",
)


def module_name(path: str) -> str | None:
    """``vllm/a/b.py`` -> ``vllm.a.b``, ``vllm/a/__init__.py`` -> ``vllm.a``;
    ``None`` for anything that is not a vLLM source file."""
    if not (path.startswith("vllm/") and path.endswith(".py")):
        return None
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def top_level_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported, through
    top-level ``if`` and ``try`` blocks (not into functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from top_level_statements(node.body)
            yield from top_level_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody):
                yield from top_level_statements(part)
            for handler in node.handlers:
                yield from top_level_statements(handler.body)


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def bound_names(tree: ast.Module) -> set[str]:
    """Every name bound at the top level of ``tree``."""
    names: set[str] = set()
    for node in top_level_statements(tree.body):
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


def lazy_exports(tree: ast.Module) -> set[str]:
    """The literal ``__all__`` of a module that defines ``__getattr__``
    (its names resolve on first access, not by a top-level binding)."""
    statements = list(top_level_statements(tree.body))
    if not any(
        isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in statements
    ):
        return set()
    names: set[str] = set()
    for node in statements:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            names.update(
                e.value
                for e in node.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return names


def importable_names(tree: ast.Module) -> list[str]:
    """The names ``from <module> import <name>`` may ask for, sorted."""
    names = bound_names(tree) | lazy_exports(tree)
    return sorted(n for n in names if not n.startswith("_"))


def wheel_modules(wheel: zipfile.ZipFile) -> dict[str, list[str]]:
    """Covered module -> importable names, for every source file of the wheel."""
    modules: dict[str, list[str]] = {}
    for path in wheel.namelist():
        module = module_name(path)
        if module is None or not covers(module, COVERED_PACKAGES):
            continue
        tree = ast.parse(wheel.read(path), filename=path)
        modules[module] = importable_names(tree)
    return modules


def render(modules: dict[str, list[str]], wheel_name: str) -> str:
    header = [
        f"# vLLM {VLLM_VERSION} import manifest for gen-mixin: made by",
        f"# tools/make_vllm_manifest.py from {wheel_name}; do not edit, re-make it.",
        "# One line per module: the module, then the names it lets a spec import.",
        "# Covered: the modules directly in vllm/ and the packages "
        + ", ".join(COVERED_PACKAGES)
        + ".",
        f"# covered-packages: {' '.join(COVERED_PACKAGES)}",
    ]
    lines = [" ".join([module, *names]) for module, names in sorted(modules.items())]
    return "\n".join(header + lines) + "\n"


def make_manifest(wheel_path: Path) -> str:
    """The manifest's text, made from the wheel at ``wheel_path``."""
    with zipfile.ZipFile(wheel_path) as wheel:
        return render(wheel_modules(wheel), wheel_path.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, default=None, help="the vLLM wheel")
    parser.add_argument("--out", type=Path, default=MANIFEST_PATH)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the manifest is stale"
    )
    args = parser.parse_args(argv)
    wheel = args.wheel or find_vllm_wheel()
    if wheel is None or not wheel.is_file():
        print(
            f"no vLLM {VLLM_VERSION} wheel: pass --wheel, set GEN_MIXIN_VLLM_WHEEL "
            f"or run `pip download vllm=={VLLM_VERSION} --no-deps -d "
            "~/.cache/gen-mixin`",
            file=sys.stderr,
        )
        return 2
    text = make_manifest(wheel)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: re-run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({text.count(chr(10))} lines, {len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
