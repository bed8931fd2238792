"""The generated modules pass the linters a vLLM reviewer would run."""

from __future__ import annotations

import re
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
    problems = [
        line
        for line in proc.stdout.splitlines()
        if re.match(r"^\S+:\d+:\d+: ", line) and not _unsplittable(path, line)
    ]
    assert proc.returncode in (0, 1) and not problems, proc.stdout + proc.stderr


#: A line black leaves long: an optional ``name = `` target, one dotted name
#: (a spec's host path, which has no place to break), an optional ``(``.
_ONE_DOTTED_NAME = re.compile(r"^(\w+ = )?[A-Za-z_][\w.]*\(?$")


def _unsplittable(path: Path, diagnostic: str) -> bool:
    """An E501 on a line that is one dotted name (as vLLM's own code has:
    long attribute paths, which no formatter can split)."""
    match = re.match(r"^\S+:(\d+):\d+: E501 ", diagnostic)
    if match is None:
        return False
    line = path.read_text(encoding="utf-8").splitlines()[int(match.group(1)) - 1]
    return bool(_ONE_DOTTED_NAME.match(line.strip()))


@pytest.mark.parametrize(
    ("line", "unsplittable"),
    [
        ("        resized = self.a_very_long.host_path.method_name(", True),
        ("        self.a_very_long.host_path.attribute", True),
        ("        x = f(a, b) + self.long_name.method(c, d)", False),
        ('        raise ValueError("a long message that black leaves alone")', False),
    ],
)
def test_only_a_dotted_name_may_stay_long(tmp_path, line, unsplittable):
    module = tmp_path / "m.py"
    module.write_text(line + "\n", encoding="utf-8")
    assert _unsplittable(module, f"{module}:1:89: E501 Line too long") is unsplittable
