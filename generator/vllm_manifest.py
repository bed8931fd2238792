"""What a ``vllm:`` import may name: the offline manifest of vLLM 0.33.0.

``generator/data/vllm_manifest.txt`` lists, one line per module, the modules
of the pinned vLLM that a mixin may plausibly import from and the names each
lets ``from <module> import <name>`` bind. It is made from the vLLM wheel by
``tools/make_vllm_manifest.py`` (never by importing vLLM) and re-made when
the pin changes; this module only reads it, without torch, on the
``gen-mixin --check`` path (the file is parsed once per process, lazily,
in a few milliseconds).
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path

VLLM_VERSION = "0.33.0"
MANIFEST_RESOURCE = ("data", "vllm_manifest.txt")
_COVERED_KEY = "# covered-packages:"


def find_vllm_wheel() -> Path | None:
    """Where the pinned vLLM's wheel is (the manifest's source; the parity
    tests read vLLM's mixins from it): ``$GEN_MIXIN_VLLM_WHEEL``, else the
    wheel CI downloads into ``~/.cache/gen-mixin``; ``None`` if neither."""
    env = os.environ.get("GEN_MIXIN_VLLM_WHEEL")
    if env:
        return Path(env)
    found = sorted(
        (Path.home() / ".cache" / "gen-mixin").glob(f"vllm-{VLLM_VERSION}-*.whl")
    )
    return found[0] if found else None


@functools.cache
def _manifest() -> tuple[dict[str, str], tuple[str, ...]]:
    """(module -> its names as one space-separated string, covered packages)."""
    text = (
        resources.files("generator")
        .joinpath(*MANIFEST_RESOURCE)
        .read_text(encoding="utf-8")
    )
    modules: dict[str, str] = {}
    covered: tuple[str, ...] = ()
    for line in text.splitlines():
        if line.startswith(_COVERED_KEY):
            covered = tuple(line[len(_COVERED_KEY) :].split())
        elif line and not line.startswith("#"):
            module, _, names = line.partition(" ")
            modules[module] = names
    return modules, covered


@functools.cache
def vllm_module_names(module: str) -> frozenset[str] | None:
    """The names ``from module import name`` can bind in vLLM 0.33.0, or
    ``None`` when the manifest has no such module."""
    names = _manifest()[0].get(module)
    return None if names is None else frozenset(names.split())


def covered_packages() -> tuple[str, ...]:
    """The packages the manifest lists in full (besides ``vllm.*`` modules
    directly in ``vllm/``)."""
    return _manifest()[1]


def covers(module: str, packages: tuple[str, ...]) -> bool:
    """Whether a manifest of ``packages`` lists ``module`` (if vLLM has it):
    the modules directly in ``vllm/``, those inside one of ``packages`` and
    the packages on the way to them."""
    parts = module.split(".")
    if parts[0] != "vllm":
        return False
    if len(parts) <= 2:
        return True
    return any(
        module == p or module.startswith(p + ".") or p.startswith(module + ".")
        for p in packages
    )


def is_covered(module: str) -> bool:
    """Whether this manifest would list ``module`` if vLLM had it."""
    return covers(module, covered_packages())


def vllm_import_problem(module: str, name: str) -> str | None:
    """Why ``from module import name`` fails on vLLM 0.33.0, or ``None`` if
    it works (a submodule of a package counts as a name of the package)."""
    names = vllm_module_names(module)
    if names is None:
        if not is_covered(module):
            return (
                f"module {module!r} is outside the vLLM 0.33.0 packages that "
                "gen-mixin's offline manifest covers ("
                + ", ".join(covered_packages())
                + "); add its package to tools/make_vllm_manifest.py"
            )
        return f"vLLM 0.33.0 has no module {module!r}"
    if name in names or vllm_module_names(f"{module}.{name}") is not None:
        return None
    return f"vLLM 0.33.0's module {module!r} defines no name {name!r}"
