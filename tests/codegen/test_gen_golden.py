"""Golden modules: what every spec renders to, per target, pinned.

``tests/codegen/golden/<target>/<stem>.py`` holds the expected module of
each ``specs/<stem>.yaml`` (found by globbing, so a new spec gets a golden
the first time the update switch runs). ``GEN_MIXIN_UPDATE_GOLDEN=1``
rewrites them (and removes goldens whose spec is gone).

Two comparisons are made: the in-memory render against the golden (a change
in the generator or templates shows up as a reviewable diff), and the
committed ``generated/`` tree against the render (``gen-mixin --check``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from genmixin_testlib import (
    GENERATED_DIR,
    GOLDEN_DIR,
    REPO,
    SPECS_DIR,
    UPDATE,
    files_under,
    render_all,
    run_main,
    short_diff,
    spec_paths,
    target_cases,
    update_hint,
)

CASES = [(t, s.stem) for t, s in target_cases(spec_paths())]
IDS = [f"{t}-{stem}" for t, stem in CASES]


def test_there_are_specs() -> None:
    assert CASES, f"no specs found under {SPECS_DIR}"


@pytest.mark.parametrize(("target", "stem"), CASES, ids=IDS)
def test_render_matches_golden(target: str, stem: str) -> None:
    source = render_all()[(target, stem)]
    golden = GOLDEN_DIR / target / f"{stem}.py"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        if not golden.exists() or golden.read_text(encoding="utf-8") != source:
            golden.write_text(source, encoding="utf-8")
        return
    assert golden.exists(), update_hint(f"no golden file {golden.relative_to(REPO)}")
    expected = golden.read_text(encoding="utf-8")
    assert source == expected, update_hint(
        f"rendering specs/{stem}.yaml ({target}) differs from its golden\n"
        + short_diff(expected, source, f"{target}/{stem}.py")
    )


def test_no_orphaned_goldens() -> None:
    expected = {GOLDEN_DIR / t / f"{stem}.py" for t, stem in CASES}
    present = set(files_under(GOLDEN_DIR)) if GOLDEN_DIR.exists() else set()
    orphans = sorted(present - expected)
    if UPDATE:
        for path in orphans:
            path.unlink()
        return
    assert not orphans, update_hint(f"goldens without a spec: {orphans}")


@pytest.mark.parametrize(("target", "stem"), CASES, ids=IDS)
def test_generated_tree_matches_render(target: str, stem: str) -> None:
    path = GENERATED_DIR / target / f"{stem}.py"
    assert path.exists(), f"{path} missing: run `gen-mixin specs/*.yaml`"
    on_disk = path.read_text(encoding="utf-8")
    source = render_all()[(target, stem)]
    assert on_disk == source, (
        f"{path.relative_to(REPO)} is stale: run `gen-mixin specs/*.yaml`\n"
        + short_diff(on_disk, source, f"generated/{target}/{stem}.py")
    )


def test_cli_check_passes_on_the_repository() -> None:
    """``gen-mixin --check specs/*.yaml`` exactly as CI runs it."""
    specs = [str(p.relative_to(REPO)) for p in spec_paths()]
    proc = subprocess.run(
        [sys.executable, "-m", "generator.cli", "--check", *specs],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(CASES)} file(s) up to date" in proc.stdout
    assert proc.stderr == ""


def test_cli_check_reports_stale_missing_and_orphaned(tmp_path, monkeypatch) -> None:
    """--check is able to fail: a changed file, a missing one and an orphan."""
    out = tmp_path / "generated"
    shutil.copytree(GENERATED_DIR, out)
    (t0, s0), (t1, s1) = CASES[0], CASES[-1]
    stale = out / t0 / f"{s0}.py"
    stale.write_text(stale.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    missing = out / t1 / f"{s1}.py"
    missing.unlink()
    orphan = out / t0 / "no_such_spec.py"
    orphan.write_text("", encoding="utf-8")
    before = {p: p.read_bytes() for p in files_under(out)}

    monkeypatch.chdir(REPO)
    specs = [str(p.relative_to(REPO)) for p in spec_paths()]
    rc, stdout, stderr = run_main(["--check", "--out", str(out), *specs])

    assert rc == 1, stderr
    assert f"stale: {stale}" in stderr
    assert f"stale: {missing}" in stderr
    assert (
        f"orphaned: {orphan} (no spec generates it: delete it, or restore its spec)"
        in stderr
    )
    assert "# edited" in stdout  # the unified diff
    assert {p: p.read_bytes() for p in files_under(out)} == before  # wrote nothing


def test_cli_writes_what_it_checks(tmp_path, monkeypatch) -> None:
    """A plain run writes the render; a second run changes nothing."""
    monkeypatch.chdir(REPO)
    specs = [str(p.relative_to(REPO)) for p in spec_paths()]
    rc, stdout, stderr = run_main(["--out", str(tmp_path), *specs])
    assert rc == 0, stderr
    written = {
        (p.parent.name, p.stem): p.read_text(encoding="utf-8")
        for p in files_under(tmp_path)
    }
    assert written == render_all()
    rc, stdout, _ = run_main(["--out", str(tmp_path), *specs])
    assert rc == 0
    assert "wrote" not in stdout
    assert stdout.count("unchanged ") == len(CASES)
