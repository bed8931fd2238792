"""The project's own Python is black-formatted, as its generated modules are
(the pinned ``black`` of ``pyproject.toml``; ``black .`` fixes a failure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_sources_are_black_formatted() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "black", "--check", "--quiet", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr or result.stdout
