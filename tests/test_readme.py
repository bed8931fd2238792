"""The README's set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(text: str) -> list[str]:
    return [line.strip() for line in re.findall(r"```\n(.*?)\n\s*```", text, re.S)]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(c for c in _commands(readme) if "pytest" in c)
    assert test_command in ci


def test_readme_main_job_generates_and_checks():
    readme = (ROOT / "README.md").read_text()
    main_job = next(c for c in _commands(readme) if "gen-mixin specs/*.yaml" in c)
    assert "pip install" in main_job and "--check" in main_job
