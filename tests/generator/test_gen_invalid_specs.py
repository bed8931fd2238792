"""The invalid-spec corpus: every problem is reported, located, and nothing
is written.

Each ``data/invalid/<name>.yaml`` is a small mutation of one of the project's
specs; ``<name>.expected`` holds the exact standard error of
``gen-mixin <spec> --out <tmp>`` run from the repository root (the spec named
by its path relative to the root). ``GEN_MIXIN_UPDATE_GOLDEN=1`` rewrites the
``.expected`` files; review every change by eye. The cases are written by
``data/make_invalid_corpus.py`` (each: a spec of ``specs/`` with one small
mutation); rerun it when the specs have moved on.

Cases in ``KNOWN_ISSUES`` show a problem of the generator (a crash, a message
that misleads, a broken location or format). Their ``.expected`` holds the
output proposed instead, never the current one, and the update switch leaves
them alone; their test is ``xfail(strict=True)`` and checks a property the
fixed output must have, so it starts passing (and fails as XPASS) as soon as
the issue is fixed, whatever the wording chosen. Then move the case out of
``KNOWN_ISSUES`` and regenerate its ``.expected``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
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


def _line_of(path: str, needle: str) -> int:
    """1-based line of the first occurrence of ``needle`` in a corpus file."""
    lines = (REPO / path).read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


@dataclass(frozen=True)
class KnownIssue:
    reason: str
    fixed: Callable[[str, int, str], bool]  # (case path, exit code, stderr)


def _one_problem(path: str, rc: int, err: str) -> bool:
    return rc == 2 and len(_diags(err)) == 1


KNOWN_ISSUES: dict[str, KnownIssue] = {
    "yaml_bool_tag_bad_value": KnownIssue(
        "yaml_loader._Converter.convert catches (YAMLError, ValueError) but "
        "SafeConstructor.construct_yaml_bool raises KeyError for '!!bool maybe': "
        "traceback, exit 1",
        lambda p, rc, err: rc == 2
        and re.match(rf"{re.escape(p)}:{_line_of(p, 'format:')}:\d+: format: ", err),
    ),
    "docstring_empty": KnownIssue(
        "an empty (or blank) docstring passes validation and crashes the "
        "renderer: exit 3, 'internal error ... template error: list object has "
        "no element 0'. (If empty docstrings are to be accepted instead, move "
        "this case out of the invalid corpus.)",
        lambda p, rc, err: rc == 2
        and _well_formed(err)
        and f"{p}:{_line_of(p, 'docstring:')}:" in err,
    ),
    "yaml_deep_nesting": KnownIssue(
        "deeply nested YAML (3000 levels) raises RecursionError from PyYAML's "
        "composer (not a YAMLError): traceback, exit 1",
        lambda p, rc, err: rc == 2 and _well_formed(err),
    ),
    "yaml_control_character": KnownIssue(
        "a control character gives a yaml.reader.ReaderError (not Marked): the "
        "diagnostic is located at 1:1 instead of the character's line, and its "
        "message spans two lines ('in \"<unicode string>\", position N')",
        lambda p, rc, err: rc == 2
        and _well_formed(err)
        and err.startswith(f"{p}:{_line_of(p, chr(7))}:"),
    ),
    "key_with_newline": KnownIssue(
        "a mapping key holding a newline is printed raw in the field path, which "
        "breaks the one-line 'file:line:col: field: message' format",
        lambda p, rc, err: rc == 2 and _well_formed(err),
    ),
    "yaml_anchor_alias": KnownIssue(
        "anchors and aliases are accepted: yaml_loader checks node.anchor, but "
        "composed yaml nodes have no anchor attribute (aliases resolve to the "
        "same node), so 'anchors and aliases are not allowed' is never reported",
        lambda p, rc, err: rc == 2 and "anchors and aliases are not allowed" in err,
    ),
    "yaml_alias_into_valid_spec": KnownIssue(
        "same as yaml_anchor_alias: a spec using &anchor / *alias is accepted and "
        "generated (exit 0)",
        lambda p, rc, err: rc == 2 and "anchors and aliases are not allowed" in err,
    ),
    "formula_true_division": KnownIssue(
        "'/' reports 'operator Div is not allowed (...)': the BinOp branch of "
        "formulas._Converter.convert answers first, so the dedicated message "
        "\"'/' is not allowed (use // or ceil_div)\" (the one docs/spec-format.md "
        "promises) is dead code",
        lambda p, rc, err: rc == 2 and "'/'" in err and "Div" not in err,
    ),
    "formula_comparison": KnownIssue(
        "a conditional expression reports the AST class name: 'IfExp is not "
        "allowed in a spec expression'",
        lambda p, rc, err: rc == 2 and "IfExp" not in err,
    ),
    "formula_power_not_literal": KnownIssue(
        "cascade: a capture tensor whose shape has an error is dropped, and its "
        "buffer then reports 'no source: add a capture tensor for it', though "
        "the spec has one",
        _one_problem,
    ),
    "formula_power_too_large": KnownIssue(
        "cascade: as formula_power_not_literal ('no source' for a buffer whose "
        "capture tensor exists)",
        _one_problem,
    ),
    "formula_unknown_callable": KnownIssue(
        "cascade: a builder whose call has an error is dropped, and the buffers it "
        "provides report 'no source: ... list it in a builder's provides', though "
        "they are listed",
        _one_problem,
    ),
    "formula_ceil_div_arity": KnownIssue(
        "cascade: an items.graph_rows with an error also reports 'span assembly "
        "needs items.graph_rows', though it is given",
        _one_problem,
    ),
    "wrong_type_float_formula": KnownIssue(
        "one problem reported twice at the same place: 'expected a formula' "
        "(resolver) and 'expected a string or an integer, got number' (schema)",
        _one_problem,
    ),
    "host_unknown_type": KnownIssue(
        "cascade: one misspelt type annotation drops the host attribute, and "
        "every mention of it reports an error (22 problems for one typo)",
        lambda p, rc, err: rc == 2 and len(_diags(err)) <= 2,
    ),
    "host_type_private_attribute": KnownIssue(
        "cascade: a bad annotation drops the host attribute, and the span "
        "assembly then reports it as not a host attribute",
        _one_problem,
    ),
    "capture_tensor_not_a_buffer": KnownIssue(
        "cascade: a graph_forward step that failed leaves its target undefined, "
        "and the next step reports \"unknown name 'vit_out'; did you mean "
        "'vit_cos'?\" (wrong advice)",
        lambda p, rc, err: rc == 2 and "'vit_out'" not in err,
    ),
    "empty_width_without_per_item": KnownIssue(
        "cascade: eager_forward.steps[0] fails (grid dims are not in scope without "
        "per_item), so steps[1] reports \"unknown name 'vit_out'\" for the name "
        "steps[0] assigns",
        lambda p, rc, err: rc == 2 and "'vit_out'" not in err,
    ),
    "step_target_reserved_inputs": KnownIssue(
        "a graph_forward step may assign a name the generated method uses itself "
        "('inputs'): exit 0, and the generated encoder_cudagraph_forward rebinds "
        'inputs to the ViT output, then reads inputs["merge_idx"] from that '
        "tensor. Step targets are checked against earlier names and host "
        "attributes only (resolve.py resolve_graph_forward / resolve_eager), not "
        "against RESERVED or the Python built-ins as other spec names are",
        lambda p, rc, err: rc == 2 and "'inputs'" in err,
    ),
    "step_target_reserved_outputs": KnownIssue(
        "as step_target_reserved_inputs, in eager_forward: a step named 'outputs' "
        "replaces the generated per-item list, and outputs.append(...) then runs "
        "on a tensor (exit 0)",
        lambda p, rc, err: rc == 2 and "'outputs'" in err,
    ),
    "step_target_builtin": KnownIssue(
        "as step_target_reserved_inputs: a step may shadow a Python built-in "
        "('open'), which check_name refuses for every other spec name (exit 0)",
        lambda p, rc, err: rc == 2 and "'open'" in err,
    ),
    "bad_identifier_input_key": KnownIssue(
        "'did you mean' suggests a name that is itself invalid ('pixel-values')",
        lambda p, rc, err: rc == 2 and "did you mean 'pixel-values'" not in err,
    ),
}


def test_corpus_is_complete() -> None:
    assert len(CASES) >= 40
    expected = {p.stem for p in INVALID_DIR.glob("*.expected")}
    if not UPDATE:
        assert expected == set(CASES), update_hint(
            f"unpaired files: {sorted(expected ^ set(CASES))}"
        )
    assert set(KNOWN_ISSUES) <= set(CASES)
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


@pytest.mark.parametrize("name", [n for n in CASES if n not in KNOWN_ISSUES])
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


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_ISSUES[n].reason)
        )
        for n in sorted(KNOWN_ISSUES)
    ],
)
def test_known_issue(name: str, tmp_path: Path, monkeypatch) -> None:
    rc, stdout, stderr, out = _run_case(name, tmp_path, monkeypatch)
    _check_invariants(rc, stdout, stderr, out)
    assert KNOWN_ISSUES[name].fixed(_rel(name), rc, stderr), stderr


def test_cli_subprocess_reports_the_whole_corpus(tmp_path: Path) -> None:
    """The real command on every pinned case at once: exit 2, the cases'
    diagnostics in order, nothing written, no traceback."""
    names = [n for n in CASES if n not in KNOWN_ISSUES]
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
    name = next(n for n in CASES if n not in KNOWN_ISSUES)
    out = tmp_path / "out"
    rc, _, stderr = run_main(["specs/minimax_m3.yaml", _rel(name), "--out", str(out)])
    assert rc == 2, stderr
    assert not out.exists()
