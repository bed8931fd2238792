"""The output seal: ``--check`` confirms a sealed module without black, and
passes nothing that a formatting run would change.

A module's ``output-sha256`` header line digests the templates' output, the
formatter's identity and the module itself (``generator/render.py``). The
cases below alter one of the three and expect the seal to stop vouching; the
CLI cases check that ``--check`` then falls back to formatting and comparing.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from generator import formatting, render
from generator.emit import render_spec
from genmixin_testlib import GENERATED_DIR, REPO, run_main, spec_paths

SPEC = REPO / "specs" / "qwen2_vl.yaml"
SEAL = re.compile(r"^(# output-sha256: )([0-9a-f]{64})$", re.M)


def _item():
    (item,) = render_spec(SPEC, ("vllm",), GENERATED_DIR)
    return item


def _flip_seal(text: str) -> str:
    def flip(m: re.Match) -> str:
        digest = m.group(2)
        return m.group(1) + ("1" if digest[0] != "1" else "2") + digest[1:]

    return SEAL.sub(flip, text, count=1)


# (case, how the file on disk differs from what `finish` made, vouched for)
FILE_CASES = [
    ("as written", lambda text: text, True),
    ("a line appended", lambda text: text + "# edited\n", False),
    (
        "a body line changed",
        lambda text: text.replace("import torch", "import numpy"),
        False,
    ),
    ("the seal altered", _flip_seal, False),
    ("the seal line removed", lambda text: SEAL.sub("", text, count=1), False),
    ("the header edited", lambda text: text.replace("do not edit", "do edit"), False),
]


@pytest.mark.parametrize(
    ("case", "mutate", "vouched"), FILE_CASES, ids=[c[0] for c in FILE_CASES]
)
def test_the_seal_vouches_only_for_the_file_as_written(case, mutate, vouched) -> None:
    item = _item()
    on_disk = mutate(item.source).encode("utf-8")
    assert render.is_sealed_output(item.unformatted, on_disk) is vouched


def test_the_seal_does_not_vouch_for_another_rendering() -> None:
    item = _item()
    other = item.unformatted.replace("SupportsEncoderCudaGraph", "Supports", 1)
    assert other != item.unformatted
    assert not render.is_sealed_output(other, item.source.encode("utf-8"))


def test_the_seal_does_not_vouch_for_bytes_that_are_not_utf8() -> None:
    item = _item()
    assert not render.is_sealed_output(
        item.unformatted, item.source.encode("utf-8") + b"\xff"
    )


def test_the_seal_does_not_vouch_after_the_formatter_changes(monkeypatch) -> None:
    """Another black version (or formatting code) may format differently."""
    item = _item()
    data = item.source.encode("utf-8")
    monkeypatch.setattr(render, "_formatter_identity", lambda: b"black 99")
    assert not render.is_sealed_output(item.unformatted, data)


def test_every_generated_module_carries_one_seal_in_its_header() -> None:
    for path in sorted(GENERATED_DIR.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        text = path.read_text(encoding="utf-8")
        header = text[: text.index("\n\n")]
        assert len(SEAL.findall(header)) == 1, path
        assert len(SEAL.findall(text)) == 1, path


def _no_black(monkeypatch) -> list[str]:
    calls: list[str] = []

    def refuse(source: str) -> str:
        calls.append(source)
        raise AssertionError("black ran")

    monkeypatch.setattr(formatting, "black_format", refuse)
    formatting._format_part.cache_clear()
    return calls


def _specs() -> list[str]:
    return [str(p.relative_to(REPO)) for p in spec_paths()]


def test_check_of_the_repository_runs_no_black(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    calls = _no_black(monkeypatch)
    rc, stdout, stderr = run_main(["--check", *_specs()])
    assert (rc, stderr, calls) == (0, "", [])
    assert "up to date" in stdout


def test_check_formats_and_reports_an_edited_module(tmp_path, monkeypatch) -> None:
    """An edit below the header keeps the seal line: the seal no longer
    matches, black runs, and the diff shows the edit."""
    out = tmp_path / "generated"
    shutil.copytree(GENERATED_DIR, out)
    edited = out / "vllm" / "qwen2_vl.py"
    edited.write_text(
        edited.read_text(encoding="utf-8").replace(
            "import torch\n", "import torch  # x\n"
        ),
        encoding="utf-8",
    )
    monkeypatch.chdir(REPO)
    rc, stdout, stderr = run_main(["--check", "--out", str(out), *_specs()])
    assert rc == 1
    assert f"stale: {edited}" in stderr
    assert stderr.count("stale: ") == 1
    assert "-import torch  # x" in stdout


def test_a_module_sealed_by_another_formatter_is_stale_by_its_seal_alone(
    tmp_path, monkeypatch
) -> None:
    """A module formatted by another black version that happens to format
    alike: its seal does not match, and the formatted text decides."""
    out = tmp_path / "generated"
    shutil.copytree(GENERATED_DIR, out)
    resealed = out / "standalone" / "qwen2_vl.py"
    resealed.write_text(
        _flip_seal(resealed.read_text(encoding="utf-8")), encoding="utf-8"
    )
    monkeypatch.chdir(REPO)
    rc, stdout, stderr = run_main(["--check", "--out", str(out), *_specs()])
    # The seal is part of the text, so the file is stale, but only by its seal.
    assert rc == 1
    assert stderr.count("stale: ") == 1
    changed = [
        line
        for line in stdout.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert len(changed) == 2 and all("output-sha256" in line for line in changed)


def test_a_written_module_is_sealed_for_its_own_rendering(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(REPO)
    rc, _, stderr = run_main(["--out", str(tmp_path), "specs/qwen2_vl.yaml"])
    assert rc == 0, stderr
    item = _item()
    for target in ("vllm", "standalone"):
        written = (tmp_path / target / "qwen2_vl.py").read_bytes()
        (rendered,) = render_spec(SPEC, (target,), tmp_path)
        assert render.is_sealed_output(rendered.unformatted, written)
    assert not render.is_sealed_output(
        item.unformatted, (tmp_path / "standalone" / "qwen2_vl.py").read_bytes()
    )


FORMATTING_SOURCE = (REPO / "generator" / "formatting.py").read_text(encoding="utf-8")

# (case, an edit of generator/formatting.py, whether the seal must change)
FORMATTING_EDITS = [
    ("unchanged", lambda s: s, False),
    (
        "module docstring reworded",
        lambda s: s.replace('"""Black, with a pinned mode', '"""Black (pinned)', 1),
        False,
    ),
    (
        "a comment added",
        lambda s: s.replace("\nimport re\n", "\n# why\nimport re\n"),
        False,
    ),
    (
        "a function's docstring added",
        lambda s: s.replace(
            "def black_format(source: str) -> str:\n",
            'def black_format(source: str) -> str:\n    """Formats."""\n',
        ),
        False,
    ),
    ("a constant changed", lambda s: s.replace("= 88", "= 89", 1), True),
    (
        "a string changed",
        lambda s: s.replace('_PLACEHOLDER = "_"', '_PLACEHOLDER = "__"'),
        True,
    ),
    (
        "a docstring-like string that is code",
        lambda s: s.replace("\nimport re\n", '\nimport re\n\n"""not a docstring"""\n'),
        True,
    ),
    ("a statement added", lambda s: s + "\nBLACK_LINE_LENGTH = 100\n", True),
]


@pytest.mark.parametrize(
    ("case", "edit", "changes"), FORMATTING_EDITS, ids=[c[0] for c in FORMATTING_EDITS]
)
def test_the_seal_follows_the_formatting_code_not_its_prose(case, edit, changes):
    edited = edit(FORMATTING_SOURCE)
    assert (edited != FORMATTING_SOURCE) is (case != "unchanged")
    before = render.code_digest(FORMATTING_SOURCE)
    assert (render.code_digest(edited) != before) is changes


def test_the_formatter_identity_holds_the_formatting_code_digest() -> None:
    assert render.code_digest(FORMATTING_SOURCE) in render._formatter_identity()
