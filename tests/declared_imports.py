"""Every third-party import of the project, against what pyproject.toml declares.

A user installs the project with ``pip install -e .`` (the generator) or with
one of its extras; an import that no requirement names works on a developer's
machine, where the module happens to be installed, and fails on a fresh one.
This module walks every ``.py`` file of a tree with ``ast``, takes the top-level
module of each import (``import x.y``, ``from x import y``, and the string
imports ``pytest.importorskip("x")``, ``importlib.import_module("x")``,
``importlib.util.find_spec("x")``, ``__import__("x")``), drops the standard
library and the project's own modules, maps the rest to distributions and
checks them against the requirements of the section the file's folder may use.

What a folder may use is :data:`SECTIONS`: the generator runs on
``dependencies`` alone; the runtime, the towers and the generated standalone
mixins on the ``runtime`` extra; ``tests/`` on ``test``; ``bench/`` on
``bench``; the vLLM plugin and its real-vLLM tests on ``vllm``. Imports built at run time from variables cannot be seen and are
not checked.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_VLLM_DROP_IN = (
    "vllm",
    "drop-in files for a vLLM 0.33.0 install: never imported by this project, "
    "so vLLM is not one of its requirements, by design",
)


# The real-vLLM tests build tiny models with vLLM's own requirements.
_VLLM_BRINGS = tuple(
    (name, "a requirement of vllm==0.33.0, which the vllm extra installs")
    for name in ("transformers", "tokenizers")
)


@dataclass(frozen=True)
class Section:
    """What the ``.py`` files under one folder may import.

    ``folder`` is a path relative to the root, ending in ``/``; a file belongs
    to the section with the longest folder that contains it. Besides the
    project's ``dependencies``, its files may use the requirements of
    ``extras`` (with the extras those name in turn) and the import names of
    ``provided``, each with the reason it needs no requirement. A section
    with ``stdlib_only`` runs before anything is installed: not even the
    ``dependencies``.
    """

    folder: str
    extras: tuple[str, ...]
    provided: tuple[tuple[str, str], ...] = ()
    stdlib_only: bool = False


SECTIONS: tuple[Section, ...] = (
    Section("generator/", ()),
    Section("encoder_cudagraph_runtime/", ("runtime", "gpu")),
    Section("reference_towers/", ("runtime",)),
    Section("generated/", ("runtime",)),
    Section("generated/vllm/", ("runtime",), (_VLLM_DROP_IN,)),
    Section("tests/", ("test",)),
    Section("tests/codegen/golden/vllm/", ("test",), (_VLLM_DROP_IN,)),
    Section("bench/", ("bench", "gpu")),
    Section("gen_mixin_vllm/", ("vllm",)),
    Section("tests/real_vllm/", ("test", "vllm"), _VLLM_BRINGS),
    Section(".ci/", (), stdlib_only=True),
)

# Import names whose distribution is called something else. Any other import
# name is its own distribution's name (compared after PEP 503 normalisation,
# so ``flash_attn`` is ``flash-attn``).
DISTRIBUTION_OF_IMPORT: Mapping[str, str] = {"yaml": "pyyaml"}

# Calls whose first argument, a string, names a module to import or probe.
_STRING_IMPORT_CALLS = frozenset(
    {"importorskip", "import_module", "find_spec", "__import__"}
)

_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


@dataclass(frozen=True, order=True)
class Problem:
    """One finding, printed as ``path:line: message``."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Requirements:
    """The distributions ``pyproject.toml`` declares, by section.

    ``extras`` maps each extra to its own requirements plus, resolved, those of
    the project's extras it names (``gen-mixin[runtime]``).
    """

    dependencies: frozenset[str]
    extras: Mapping[str, frozenset[str]]
    packages: frozenset[str]

    def allowed(self, section: Section) -> frozenset[str]:
        if section.stdlib_only:
            return frozenset()
        names = set(self.dependencies)
        for extra in section.extras:
            names |= self.extras.get(extra, frozenset())
        return frozenset(names)


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_of(import_name: str) -> str:
    return normalize(DISTRIBUTION_OF_IMPORT.get(import_name, import_name))


def read_requirements(pyproject: Path) -> Requirements:
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    project = data["project"]
    own_name = normalize(project["name"])
    raw_extras = project.get("optional-dependencies", {})

    def resolve(requirements: list[str], seen: frozenset[str]) -> frozenset[str]:
        names: set[str] = set()
        for requirement in requirements:
            match = _REQUIREMENT.match(requirement)
            if match is None:
                raise ValueError(
                    f"{pyproject}: cannot read requirement {requirement!r}"
                )
            name, extras = normalize(match.group(1)), match.group(2) or ""
            if name != own_name:
                names.add(name)
                continue
            for extra in filter(None, (e.strip() for e in extras.split(","))):
                if extra not in seen:
                    names |= resolve(raw_extras.get(extra, []), seen | {extra})
        return frozenset(names)

    include = data.get("tool", {}).get("setuptools", {}).get("packages", {})
    patterns = include.get("find", {}).get("include", [])
    return Requirements(
        dependencies=resolve(project.get("dependencies", []), frozenset()),
        extras={
            extra: resolve(reqs, frozenset({extra}))
            for extra, reqs in raw_extras.items()
        },
        packages=frozenset(p.split(".")[0].rstrip("*") for p in patterns),
    )


def section_of(relative: str) -> Section | None:
    """The section with the longest folder that contains ``relative``."""
    containing = [s for s in SECTIONS if relative.startswith(s.folder)]
    return max(containing, key=lambda s: len(s.folder), default=None)


def project_files(root: Path) -> Iterator[Path]:
    """The ``.py`` files of the tree, without hidden folders (except those
    :data:`SECTIONS` names, such as ``.ci/``), caches, virtual environments
    and build outputs."""
    named = {section.folder.split("/")[0] for section in SECTIONS}
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        subfolders[:] = sorted(
            name
            for name in subfolders
            if (not name.startswith(".") or (here == root and name in named))
            and name not in {"__pycache__", "build", "dist"}
            and not name.endswith(".egg-info")
            and not (here / name / "pyvenv.cfg").exists()
        )
        yield from (here / name for name in sorted(files) if name.endswith(".py"))


def _string_import(call: ast.Call) -> str | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in _STRING_IMPORT_CALLS or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    if isinstance(first, ast.JoinedStr) and first.values:
        head = first.values[0]  # f"package.{name}": the package is known
        if isinstance(head, ast.Constant) and "." in head.value:
            return head.value
    return None


def imported_modules(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """``(top-level module, line)`` of every absolute import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.lineno
        elif isinstance(node, ast.Call) and (module := _string_import(node)):
            yield module.split(".")[0], node.lineno


def _third_party_imports(
    tree: ast.AST, own: frozenset[str]
) -> Iterator[tuple[str, int]]:
    """The imports of ``tree`` that are neither standard library nor ``own``."""
    for module, line in imported_modules(tree):
        if module not in sys.stdlib_module_names and module not in own:
            yield module, line


def _check_import(
    relative: str, line: int, module: str, requirements: Requirements
) -> Problem | None:
    section = section_of(relative)
    if section is None:
        folders = ", ".join(s.folder for s in SECTIONS)
        return Problem(
            relative,
            line,
            f"{module}: the file is in no section of declared_imports.SECTIONS "
            f"({folders}); add its folder there",
        )
    if module in dict(section.provided):
        return None
    distribution = distribution_of(module)
    if distribution in requirements.allowed(section):
        return None
    where = (
        "only the standard library"
        if section.stdlib_only
        else ", ".join(("dependencies",) + tuple(f"[{e}]" for e in section.extras))
    )
    return Problem(
        relative,
        line,
        f"{module}: distribution {distribution!r} is not declared in pyproject.toml "
        f"for {section.folder} (it may use {where})",
    )


def find_problems(root: Path) -> list[Problem]:
    """Undeclared imports under ``root``, and declared requirements that no
    file imports, sorted."""
    requirements = read_requirements(root / "pyproject.toml")
    files = list(project_files(root))
    own = requirements.packages | {path.stem for path in files}
    problems: list[Problem] = []
    imported: set[str] = set()
    for path in files:
        relative = PurePosixPath(path.relative_to(root)).as_posix()
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
        except SyntaxError as error:
            problems.append(Problem(relative, error.lineno or 0, "does not parse"))
            continue
        for module, line in _third_party_imports(tree, own):
            imported.add(distribution_of(module))
            if problem := _check_import(relative, line, module, requirements):
                problems.append(problem)
    declared = requirements.dependencies.union(*requirements.extras.values())
    for name in sorted(declared - imported):
        problems.append(
            Problem("pyproject.toml", 0, f"{name!r} is declared but no file imports it")
        )
    return sorted(problems)
