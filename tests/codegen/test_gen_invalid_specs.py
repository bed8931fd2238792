"""The invalid-spec corpus: every problem is reported, located, and nothing
is written.

Each ``data/invalid/<name>.yaml`` is a small mutation of one of the project's
specs; ``<name>.expected`` holds the exact standard error of
``gen-mixin <spec> --out <tmp>`` run from the repository root (the spec named
by its path relative to the root). ``GEN_MIXIN_UPDATE_GOLDEN=1`` rewrites the
``.expected`` files; review every change by eye. The cases are written by
``data/make_invalid_corpus.py`` (each: a spec of ``specs/`` with one small
mutation); rerun it when the specs have moved on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from genmixin_testlib import (
    DIAG_RE,
    INVALID_DIR,
    REPO,
    SUMMARY_RE,
    UPDATE,
    run_main,
    short_diff,
    update_hint,
)

CASES = sorted(p.stem for p in INVALID_DIR.glob("*.yaml"))


def _rel(name: str) -> str:
    return str((INVALID_DIR / f"{name}.yaml").relative_to(REPO))


def _diags(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not SUMMARY_RE.match(line)]


def _well_formed(stderr: str) -> bool:
    lines = stderr.splitlines()
    return (
        bool(lines)
        and SUMMARY_RE.match(lines[-1]) is not None
        and all(DIAG_RE.match(line) for line in lines[:-1])
    )


def test_corpus_is_complete() -> None:
    assert len(CASES) >= 40
    expected = {p.stem for p in INVALID_DIR.glob("*.expected")}
    if not UPDATE:
        assert expected == set(CASES), update_hint(
            f"unpaired files: {sorted(expected ^ set(CASES))}"
        )
    others = {
        p.name for p in INVALID_DIR.iterdir() if p.suffix not in (".yaml", ".expected")
    }
    assert not others


def _run_case(name: str, tmp_path: Path, monkeypatch) -> tuple[int, str, str, Path]:
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    rc, stdout, stderr = run_main([_rel(name), "--out", str(out)])
    return rc, stdout, stderr, out


def _check_invariants(rc: int, stdout: str, stderr: str, out: Path) -> None:
    assert rc == 2, f"exit code {rc}\n{stderr}"
    assert not out.exists() or not any(out.rglob("*")), "files were written"
    assert "Traceback" not in stderr
    assert stdout == ""
    assert _well_formed(stderr), stderr


@pytest.mark.parametrize("name", CASES)
def test_invalid_spec(name: str, tmp_path: Path, monkeypatch) -> None:
    rc, stdout, stderr, out = _run_case(name, tmp_path, monkeypatch)
    expected_file = INVALID_DIR / f"{name}.expected"
    if UPDATE and rc == 2:
        expected_file.write_text(stderr, encoding="utf-8")
    _check_invariants(rc, stdout, stderr, out)
    expected = expected_file.read_text(encoding="utf-8")
    assert stderr == expected, update_hint(
        "diagnostics changed\n" + short_diff(expected, stderr, expected_file.name)
    )
    # Every diagnostic names this spec and a line inside it.
    n_lines = max(1, (INVALID_DIR / f"{name}.yaml").read_bytes().count(b"\n") + 1)
    for line in _diags(stderr):
        m = DIAG_RE.match(line)
        assert m is not None and m["file"] == _rel(name)
        assert int(m["line"]) <= n_lines


def test_cli_subprocess_reports_the_whole_corpus(tmp_path: Path) -> None:
    """The real command on every pinned case at once: exit 2, the cases'
    diagnostics in order, nothing written, no traceback."""
    names = CASES
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "generator.cli", *map(_rel, names), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert not out.exists()
    if not UPDATE:
        expected = "".join(
            (INVALID_DIR / f"{n}.expected").read_text(encoding="utf-8") for n in names
        )
        assert proc.stderr == expected


def test_one_invalid_spec_blocks_every_output(tmp_path: Path, monkeypatch) -> None:
    """A valid spec next to an invalid one is not written either."""
    monkeypatch.chdir(REPO)
    name = CASES[0]
    out = tmp_path / "out"
    rc, _, stderr = run_main(["specs/minimax_m3.yaml", _rel(name), "--out", str(out)])
    assert rc == 2, stderr
    assert not out.exists()
