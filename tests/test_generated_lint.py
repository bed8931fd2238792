"""The generated modules pass the linters a vLLM reviewer would run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = sorted((ROOT / "generated").glob("*/*.py"))
GENERATED = [p for p in GENERATED if p.name != "__init__.py"]

# pyflakes (undefined names, unused imports/variables), pycodestyle errors,
# bugbear, isort order with vLLM's first-party packages, pyupgrade, simplify.
RUFF_ARGS = [
    "check",
    "--no-cache",
    "--output-format",
    "concise",
    "--line-length",
    "88",
    "--select",
    "F,E,W,B,I,UP,SIM",
    "--config",
    "lint.isort.known-first-party=['vllm','encoder_cudagraph_runtime','reference_towers']",
]


def _ruff() -> list[str]:
    exe = shutil.which("ruff")
    if exe:
        return [exe]
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return [sys.executable, "-m", "ruff"]


def test_there_is_generated_code():
    assert len(GENERATED) >= 4


@pytest.mark.parametrize(
    "path", GENERATED, ids=[f"{p.parent.name}/{p.name}" for p in GENERATED]
)
def test_generated_module_is_lint_clean(path):
    proc = subprocess.run(
        [*_ruff(), *RUFF_ARGS, str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
