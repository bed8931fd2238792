"""Shared helpers of the generator's CPU tests (tests/codegen).

Imported by the test modules of this folder as a plain module (pytest puts
the folder on ``sys.path``); the name is unique across the repository's test
folders on purpose.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import io
import os
import re
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SPECS_DIR = REPO / "specs"
GENERATED_DIR = REPO / "generated"
GOLDEN_DIR = HERE / "golden"
DATA_DIR = HERE / "data"
INVALID_DIR = DATA_DIR / "invalid"

#: The single update switch: GEN_MIXIN_UPDATE_GOLDEN=1 rewrites the golden
#: modules and the ``.expected`` diagnostics instead of comparing with them.
UPDATE_ENV = "GEN_MIXIN_UPDATE_GOLDEN"
UPDATE = os.environ.get(UPDATE_ENV) == "1"

#: One diagnostic: ``file:line:col: field: message`` (the field is optional).
DIAG_RE = re.compile(
    r"^(?P<file>[^\n]+?):(?P<line>[1-9][0-9]*):(?P<col>[1-9][0-9]*): "
    r"(?P<rest>\S[^\n]*)$"
)
#: The closing line of a run that found problems.
SUMMARY_RE = re.compile(r"^gen-mixin: [1-9][0-9]* problems? found$")


def spec_paths() -> list[Path]:
    """Every spec of the project, found by globbing (new specs are picked up)."""
    return sorted(SPECS_DIR.glob("*.yaml"))


def valid_corpus_paths() -> list[Path]:
    """The valid-corpus specs (``data/valid/``): small specs that exercise
    what the project's specs do not (counts, several pad buffers, ...)."""
    return sorted((DATA_DIR / "valid").glob("*.yaml"))


@functools.cache
def render_path(path: Path, target: str) -> str:
    """One spec's module for one target, rendered in memory."""
    from generator.emit import render_spec

    return render_spec(path, (target,), GENERATED_DIR)[0].source


def targets() -> tuple[str, ...]:
    from generator.naming import TARGETS

    return TARGETS


@functools.cache
def spec_targets(path: Path) -> tuple[str, ...]:
    """The targets ``path`` has a module for (vllm alone with a vLLM-only
    import)."""
    from generator.resolve import load_spec

    return load_spec(path).targets


def target_cases(paths: list[Path]) -> list[tuple[str, Path]]:
    """(target, spec) for every module the specs generate."""
    return [(t, p) for p in paths for t in spec_targets(p)]


def standalone_paths(paths: list[Path]) -> list[Path]:
    """The specs with a standalone module (the CPU tests that run the
    generated code run that one)."""
    return [p for p in paths if "standalone" in spec_targets(p)]


def update_hint(what: str) -> str:
    return (
        f"{what}; if the change is intended, regenerate with "
        f"`{UPDATE_ENV}=1 python -m pytest tests/codegen` and review the diff"
    )


def short_diff(expected: str, actual: str, name: str, limit: int = 80) -> str:
    lines = list(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"{name} (expected)",
            tofile=f"{name} (actual)",
        )
    )
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more diff lines)\n"]
    return "".join(lines)


@functools.cache
def render_all() -> dict[tuple[str, str], str]:
    """(target, stem) -> source, rendered in memory from ``specs/``."""
    from generator.emit import render_spec

    out: dict[tuple[str, str], str] = {}
    for spec in spec_paths():
        for item in render_spec(spec, None, GENERATED_DIR):
            out[(item.target, spec.stem)] = item.source
    return out


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """Run ``generator.cli.main`` in this process; (exit code, stdout, stderr).

    Exceptions other than ``SystemExit`` propagate (a test then fails with the
    traceback, which is the point).
    """
    from generator import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
            rc = code if isinstance(code, int) else (0 if code is None else 1)
    return rc, out.getvalue(), err.getvalue()


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def load_module_copy(path: Path, name: str) -> types.ModuleType:
    """Execute ``path`` as a fresh module called ``name`` (not shared with
    other tests' imports, so its globals can be patched freely)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _stub_reference_towers(path: Path) -> dict[str, types.ModuleType]:
    """Modules standing in for the ``reference_towers.*`` names ``path``
    imports at run time (the tests patch every one they use)."""
    import ast

    def placeholder(name: str):
        def missing(*args, **kwargs):
            raise RuntimeError(f"{name} is a stub: patch it in the test")

        return missing

    stubs: dict[str, types.ModuleType] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "reference_towers"
        ):
            module = stubs.setdefault(node.module, types.ModuleType(node.module))
            for alias in node.names:
                setattr(module, alias.asname or alias.name, placeholder(alias.name))
    if stubs:
        stubs.setdefault("reference_towers", types.ModuleType("reference_towers"))
    return stubs


def load_standalone_mixin(stem: str) -> types.ModuleType:
    """A private copy of ``generated/standalone/<stem>.py``.

    The runtime package must be importable (the test skips otherwise). The
    reference towers are not needed: if ``reference_towers`` cannot be
    imported, the names the module takes from it are stubbed for the import
    (the tests replace them with their own fakes anyway).
    """
    path = GENERATED_DIR / "standalone" / f"{stem}.py"
    return load_generated_mixin(path, f"_genmixin_under_test_{stem}")


def load_generated_mixin(path: Path, name: str) -> types.ModuleType:
    """A standalone-target module at ``path`` (generated by a test), loaded
    as :func:`load_standalone_mixin` loads the committed ones."""
    import pytest

    pytest.importorskip("torch")
    runtime = ("defs", "interfaces", "host_transfer", "attention_backends", "config")
    for part in runtime:
        pytest.importorskip(f"encoder_cudagraph_runtime.{part}")
    try:
        return load_module_copy(path, name)
    except ImportError as exc:
        if not (exc.name or "").startswith("reference_towers"):
            raise
    stubs = _stub_reference_towers(path)
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        return load_module_copy(path, name)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


# -- spec texts ----------------------------------------------------------------


def spec_text(stem: str) -> str:
    """The text of ``specs/<stem>.yaml``."""
    return (SPECS_DIR / f"{stem}.yaml").read_text(encoding="utf-8")


def mutated_spec(stem: str, *pairs: tuple[str, str]) -> str:
    """``specs/<stem>.yaml`` with each ``old`` (occurring once) replaced."""
    text = spec_text(stem)
    for old, new in pairs:
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
        text = text.replace(old, new)
    return text


def spec_problems(text: str, name: str = "specs/case.yaml") -> list[str]:
    """The diagnostics of a spec given as text ([] when it is valid)."""
    from generator.diagnostics import SpecError
    from generator.resolve import resolve_text

    try:
        resolve_text(text, name)
    except SpecError as err:
        return [str(d) for d in err.diagnostics]
    return []


# -- hostile input (test_gen_hostile_input.py, test_gen_fuzz.py) -----------------


def tree_snapshot(folder: Path) -> dict[str, tuple[str, int, bytes | None]]:
    """Every entry under ``folder``: its kind, permission bits and (files)
    bytes, to show that a run left everything as it was."""
    import stat

    out: dict[str, tuple[str, int, bytes | None]] = {}
    if not folder.exists():
        return out
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
        data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        if stat.S_ISLNK(info.st_mode):
            kind, data = "link", os.readlink(path).encode()
        out[str(path.relative_to(folder))] = (kind, stat.S_IMODE(info.st_mode), data)
    return out


_MEASURE = """
import io, json, contextlib, resource, sys, time
from generator import cli
argv = json.loads(sys.argv[1])
err = io.StringIO()
start = time.process_time()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
    rc = cli.main(argv)
cpu = time.process_time() - start
# VmHWM: this interpreter's peak. ru_maxrss also counts the forking parent's
# (Linux keeps it across exec), which the test suite's size would dominate.
try:
    with open("/proc/self/status") as fh:
        hwm = next(line for line in fh if line.startswith("VmHWM:"))
    peak = int(hwm.split()[1]) / 1024
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"rc": rc, "cpu_s": cpu, "peak_mb": peak, "stderr": err.getvalue()}))
"""


def run_measured(argv: list[str]) -> dict:
    """``generator.cli.main(argv)`` in a fresh interpreter: its exit code,
    the CPU seconds of the call (not the interpreter's start), the process's
    peak memory in MB, and its standard error."""
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, json.dumps(argv)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def most_rows_within(gain: list[int], mbs: int) -> int:
    """The most rows of at most ``mbs`` items whose tokens sum to at most
    ``len(gain) - 1``: a knapsack, ``gain[p]`` the most rows of one item of
    exactly ``p`` tokens (0 where none has ``p``). Brute force for the tests
    of a graph-row capacity (torch, for speed at budgets of thousands)."""
    import torch

    budget = len(gain) - 1
    best_one = torch.cummax(torch.tensor(gain, dtype=torch.int64), 0).values
    best = torch.zeros(budget + 1, dtype=torch.int64)
    for _ in range(mbs):
        grown = best.clone()
        for q in range(1, budget + 1):
            grown[q:] = torch.maximum(grown[q:], best[: budget + 1 - q] + best_one[q])
        best = grown
    return int(best[budget])
