"""CI runs the README's Quick start commands, as .ci/readme_commands.py finds
them in README.md; these tests pin that rule and that .ci/run follows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRACTOR = ROOT / ".ci" / "readme_commands.py"


def _extract(readme: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXTRACTOR), str(readme)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _quick_start(main_job: str, tests: str, before: str = "", after: str = "") -> str:
    return (
        f"# project\n\n{before}## Quick start\n\nIntro.\n\n"
        f"- **Main job** (install):\n\n{main_job}\n"
        f"- **Tests** (CPU):\n\n{tests}\n{after}"
    )


def _fenced(*lines: str) -> str:
    return "  ```\n" + "".join(f"  {line}\n" for line in lines) + "  ```\n"


# (case, README text, expected stdout lines, expected stderr fragment).
CASES = [
    (
        "two one-line blocks, indentation dropped",
        _quick_start(_fenced("make all"), _fenced("make test")),
        ["make all", "make test"],
        "",
    ),
    (
        "blocks outside the section do not count",
        _quick_start(
            _fenced("make all"),
            _fenced("make test"),
            before="## Intro\n\n- **Tests**\n\n" + _fenced("wrong") + "\n",
            after="\n## Later\n\n- **Main job**\n\n" + _fenced("wrong"),
        ),
        ["make all", "make test"],
        "",
    ),
    (
        "no Quick start section",
        "# project\n\n## Install\n\n" + _fenced("make"),
        [],
        "README.md:1: no '## Quick start' section",
    ),
    (
        "the Tests item missing",
        "# p\n\n## Quick start\n\n- **Main job**:\n\n" + _fenced("make all"),
        [],
        "0 items labelled **Tests**",
    ),
    (
        "a label repeated",
        _quick_start(
            _fenced("a"), _fenced("b"), after="- **Tests**\n\n" + _fenced("c")
        ),
        [],
        "2 items labelled **Tests**",
    ),
    (
        "a block of two lines",
        _quick_start(_fenced("make deps", "make all"), _fenced("make test")),
        [],
        "**Main job**: expected a fenced block of one command line, found 2 lines",
    ),
    (
        "a label without its block",
        _quick_start("Run make.\n", _fenced("make test")),
        [],
        "**Main job**: expected a fenced block of one command line, found 0 lines",
    ),
]


@pytest.mark.parametrize(
    ("text", "stdout", "stderr"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_extraction_rule(tmp_path: Path, text: str, stdout: list[str], stderr: str):
    readme = tmp_path / "README.md"
    readme.write_text(text, encoding="utf-8")
    proc = _extract(readme)
    assert proc.stdout.splitlines() == stdout, proc.stderr
    assert (proc.returncode == 0) == (not stderr)
    if stderr:
        assert proc.returncode == 2 and stderr in proc.stderr, proc.stderr


def test_the_readme_has_the_two_commands():
    proc = _extract(ROOT / "README.md")
    assert proc.returncode == 0, proc.stderr
    main_job, tests = proc.stdout.splitlines()
    assert main_job.startswith("python3 -m pip install -e . && ")
    assert main_job.endswith("gen-mixin --check specs/*.yaml")
    assert "-e '.[test]'" in tests and tests.endswith("python3 -m pytest -q")


def test_ci_runs_what_it_extracts():
    env = {**os.environ, "GEN_MIXIN_CI_DRY_RUN": "1"}
    ci = subprocess.run(
        ["bash", str(ROOT / ".ci" / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ci.returncode == 0, ci.stderr
    assert ci.stdout == _extract(ROOT / "README.md").stdout
    assert len(ci.stdout.splitlines()) == 2
