"""Render specs in memory, compare with what is on disk, write atomically.

A generation run first renders every requested module in memory; only when
all of them succeeded is anything written, each file through a temporary
file in the same directory and ``os.replace``, so an interrupted or failed run
leaves every old file as it was.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from generator.naming import TARGETS, output_path, spec_display_path
from generator.render import render
from generator.resolve import load_spec


@dataclass(frozen=True)
class Rendered:
    spec: Path
    target: str
    path: Path
    source: str


def render_spec(spec: Path, targets: tuple[str, ...], out_dir: Path) -> list[Rendered]:
    """Validate and render one spec for each target (raises SpecError)."""
    display = spec_display_path(spec)
    ir = load_spec(spec, display_path=str(spec))
    data = spec.read_bytes()
    return [
        Rendered(
            spec,
            target,
            output_path(out_dir, target, ir.stem),
            render(ir, target, data, display),
        )
        for target in targets
    ]


def write_atomically(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds it; True if written."""
    data = text.encode("utf-8")
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return True


def unified_diff(path: Path, expected: str) -> str:
    try:
        current = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = ""
    return "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            expected.splitlines(keepends=True),
            fromfile=f"{path} (on disk)",
            tofile=f"{path} (from spec)",
        )
    )


@dataclass(frozen=True)
class CheckResult:
    stale: list[tuple[Path, str]]  # (path, diff)
    orphaned: list[Path]


def check(
    rendered: list[Rendered], out_dir: Path, targets: tuple[str, ...], all_specs: bool
) -> CheckResult:
    """Stale files (content differs or missing) and, when every spec of the
    project was given, orphaned files (generated modules without a spec)."""
    stale = []
    for item in rendered:
        try:
            same = item.path.read_text(encoding="utf-8") == item.source
        except FileNotFoundError:
            same = False
        if not same:
            stale.append((item.path, unified_diff(item.path, item.source)))
    orphaned: list[Path] = []
    if all_specs:
        expected = {item.path.resolve() for item in rendered}
        for target in targets:
            folder = out_dir / target
            if not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.py")):
                if path.name == "__init__.py":
                    continue
                if path.resolve() not in expected:
                    orphaned.append(path)
    return CheckResult(stale, orphaned)


__all__ = [
    "TARGETS",
    "Rendered",
    "check",
    "render_spec",
    "unified_diff",
    "write_atomically",
]
