"""Hostile input (issue #16): names that reach the generated module, the
cost of any input, OS errors and huge numbers, ``plan``'s arguments, file
modes.

Each table is one class of attack, with the inputs that broke before the
fix (a module that runs code, a traceback, minutes of work or gigabytes, a
file written) and neighbours that must keep working.

Cost, measured by :func:`run_measured` on the development machine (2 cores
shared with other work, so CPU seconds of the call vary by half; peak memory
of the whole interpreter): the worst input found, a 64 KiB spec of unknown
names against 190 declared constants, takes 0.8-1.2 s and 33 MB; formulas at
the operator cap, sampled by the static checks, 0.6-0.8 s and 42 MB (400
characters of them took 4 s before); 7,000 unknown keys 0.5 s and 38 MB;
9,000 unknown modalities 0.4 s; a spec of 134 buffers, whose module would
take black 4 s, is refused in 0.4 s; a tower of ``**`` 0.3-0.4 s (past an
8 s timeout before); ``/dev/zero`` and a file over the cap are refused in
0.1 s and 23 MB (a link to ``/dev/zero`` at an output path grew to 24 GB
before). The test allows 2 s and 300 MB.
"""

from __future__ import annotations

import ast
import os
import stat
import tokenize
from pathlib import Path

import pytest
from genmixin_testlib import (
    DIAG_RE,
    SUMMARY_RE,
    files_under,
    mutated_spec,
    run_main,
    run_measured,
    spec_text,
    tree_snapshot,
)

from generator.limits import MAX_INTEGER, MAX_SPEC_BYTES

BASE = "minimax_m3"


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _one_line_error(stderr: str) -> str:
    """The run's only stderr line (no traceback, no second line)."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _top_level_is_declarations(source: bytes) -> None:
    """The module, decoded as Python decodes it, holds only imports,
    definitions, assignments, ``if TYPE_CHECKING`` blocks and docstrings at
    top level: importing it runs no spec text."""
    import io

    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    assert encoding == "utf-8"
    allowed = (
        ast.Import,
        ast.ImportFrom,
        ast.FunctionDef,
        ast.ClassDef,
        ast.Assign,
        ast.AnnAssign,
    )
    for node in ast.parse(source).body:
        if isinstance(node, ast.If):
            assert ast.unparse(node.test) == "TYPE_CHECKING", ast.dump(node)
            continue
        if isinstance(node, ast.Expr):
            assert isinstance(node.value, ast.Constant), ast.dump(node)
            continue
        assert isinstance(node, allowed), ast.dump(node)


# -- 1. names that reach the generated module ---------------------------------

#: Folder names of a spec: each reaches the provenance header, which ended
#: its comment at a line break, or declared the file's encoding on line 2.
FOLDERS = [
    "evil\nimport os\n#",
    "evil\rimport os",
    "coding:utf-7",  # and a docstring that UTF-7 decodes into code
    "x # -*- coding: latin-1 -*-",
]
# UTF-7 decodes "+AAo-" into a line break.
_UTF7_DOCSTRING = (
    "Images only: video items stay on the eager path.",
    "Images only. +AAo-import os+AAo-os.system(+ACI-id+ACI-)+AAo-",
)


def _generated_trees(folder: Path, out: Path) -> dict[str, str]:
    """target -> the syntax tree (dumped) of the module generated from the
    spec in ``folder``, parsed from its bytes as Python imports it."""
    spec = _write(folder, f"{BASE}.yaml", mutated_spec(BASE, _UTF7_DOCSTRING))
    rc, _, stderr = run_main([str(spec), "--out", str(out)])
    assert rc == 0, stderr
    trees = {}
    for target in ("vllm", "standalone"):
        source = (out / target / f"{BASE}.py").read_bytes()
        _top_level_is_declarations(source)
        assert all(folder.name not in line for line in source.decode().splitlines()[:2])
        trees[target] = ast.dump(ast.parse(source))
    return trees


@pytest.mark.parametrize("folder", FOLDERS, ids=repr)
def test_spec_folder_cannot_inject_code(folder: str, tmp_path: Path) -> None:
    """The module is the same code whatever the folder's name."""
    plain = _generated_trees(tmp_path / "plain", tmp_path / "out_plain")
    assert _generated_trees(tmp_path / folder, tmp_path / "out") == plain


def test_the_rerun_command_is_quoted_for_the_shell(tmp_path: Path) -> None:
    import shlex

    folder = "$(touch pwned) `id`; rm -rf ~ 'q\""
    spec = _write(tmp_path / folder, f"{BASE}.yaml", spec_text(BASE))
    rc, _, stderr = run_main([str(spec), "--out", str(tmp_path / "out")])
    assert rc == 0, stderr
    header = (tmp_path / "out" / "vllm" / f"{BASE}.py").read_text().splitlines()
    command = next(line for line in header if line.startswith("# `gen-mixin "))
    assert shlex.split(command[len("# `") : -len("`.")]) == [
        "gen-mixin",
        f"{folder}/{BASE}.yaml",
    ]


#: (file name, why it cannot name a module)
STEMS = [
    ("__init__.yaml", "dunder"),
    ("__main__.yaml", "dunder"),
    ("class.yaml", "keyword"),
    ("None.yaml", "keyword"),
    ("my-model.yaml", "expected ASCII"),
    ("1abc.yaml", "expected ASCII"),
    ("x.y.yaml", "expected ASCII"),
    ("café.yaml", "expected ASCII"),
    ("ﬁle.yaml", "expected ASCII"),  # 'import ﬁle' imports file.py
    ("a b.yaml", "expected ASCII"),
    (".yaml", "expected ASCII"),
    ("new\nline.yaml", "expected ASCII"),
]


@pytest.mark.parametrize(("name", "why"), STEMS, ids=repr)
def test_spec_file_name_must_name_a_module(name: str, why: str, tmp_path: Path) -> None:
    spec = _write(tmp_path / "specs", name, spec_text(BASE))
    out = tmp_path / "out"
    (out / "standalone").mkdir(parents=True)
    (out / "standalone" / "__init__.py").write_text("")
    before = tree_snapshot(out)
    rc, _, stderr = run_main([str(spec), "--out", str(out)])
    assert rc == 2
    lines = stderr.splitlines()
    assert len(lines) == 2 and SUMMARY_RE.match(lines[1]), stderr
    assert DIAG_RE.match(lines[0]) and why in lines[0], lines[0]
    assert tree_snapshot(out) == before


def test_two_specs_differing_in_case_are_refused(tmp_path: Path) -> None:
    first = _write(tmp_path / "a", "Model.yaml", spec_text(BASE))
    second = _write(tmp_path / "b", "model.yaml", spec_text(BASE))
    rc, _, stderr = run_main([str(first), str(second), "--out", str(tmp_path / "o")])
    assert rc == 2 and "two specs named 'model'" in stderr, stderr
    assert not (tmp_path / "o").exists()


# -- 3. the cost of any input ---------------------------------------------------


def _filled(make, room: int) -> str:
    """``make(0) + make(1) + ...`` as long as it fits in ``room`` characters."""
    parts, size, i = [], 0, 0
    while size + len(make(i)) <= room:
        parts.append(make(i))
        size += len(parts[-1])
        i += 1
    return "".join(parts)


def _room(text: str) -> int:
    return MAX_SPEC_BYTES - len(text.encode()) - 64


def _unknown_keys() -> str:
    base = spec_text(BASE)
    return base + _filled(lambda i: f"k{i}: 1\n", _room(base))


def _modalities() -> str:
    base = spec_text(BASE)
    many = _filled(lambda i: f"m{i}, ", _room(base))
    return base.replace("modalities: [image]", f"modalities: [{many}image]")


def _unknown_names() -> str:
    consts = "".join(
        f"  c{i:03d}: {{from: vision_tower.c{i:03d}, default: 1}}\n" for i in range(190)
    )
    base = spec_text(BASE).replace("constants:\n", "constants:\n" + consts)
    names = _filled(lambda i: f"c{i:04d}, ", _room(base))
    old = "shape: [3, rows, half_rot_dim], dtype: float32}"
    return base.replace(old, f"shape: [3, rows, {names}half_rot_dim], dtype: float32}}")


def _exponent_tower() -> str:
    return mutated_spec(
        BASE,
        (
            "output_tokens: t * h * w // (merge * merge)",
            "output_tokens: ((((((((t*h*w)**8)**8)**8)**8)**8)**8)**8)**8 // (merge * merge)",
        ),
    )


def _many_buffers() -> str:
    """A valid spec whose buffers fill the cap: a module too large to format."""
    text = spec_text("deepseek_v41")
    term = "min(token_budget,r)*max(r,rows)+ceil_div(rows,r)"
    shape = "+".join([term] * 4)
    line = "  b{i}: {{shape: ['{s}', '{s}'], dtype: int64, allocate: true}}\n"
    count = _room(text) // (len(line.format(i=100, s=shape)) + 6)
    buffers = "".join(line.format(i=i, s=shape) for i in range(count))
    provided = ", ".join(f"b{i}" for i in range(count))
    text = text.replace("\nout_hidden_size:", buffers + "\nout_hidden_size:")
    text = text.replace(
        "provides: [merge_idx, merge_mask]",
        f"provides: [merge_idx, merge_mask, {provided}]",
    )
    return text.replace(
        "aligner.forward_packed(vit_out, merge_idx, merge_mask)",
        "aligner.forward_packed(vit_out, merge_idx, merge_mask, extra=rest)",
    )


def _long_formulas(terms: int):
    """Item formulas over 4 grid dims, which the static checks evaluate at
    thousands of sampled items: 10 terms is 400 characters (4 s before the
    cap on operators), 4 terms is just under the cap."""

    def make() -> str:
        term = "min(h,w)*max(lh,lw)+ceil_div(h,r)"
        pad = "+0*(" + "+".join([term] * terms) + ")"
        text = spec_text("deepseek_v41")
        for old in (
            "input_size: h * w",
            "budget_tokens: h * w",
            "graph_rows: ceil_div(h, r) * ceil_div(w, r)",
            "output_tokens: lh * (lw + 1) + 2",
        ):
            text = text.replace(f"  {old}\n", f"  {old}{pad}\n")
        return text

    return make


LADDER_TO_2_62 = f"  max: {2**62}  # a ladder of 57 budgets, each checked\n"

COSTLY = {
    "a ladder to 2**62 of dummy units": (
        lambda: mutated_spec("minicpmv", ("  min: q\n", "  min: q\n" + LADDER_TO_2_62)),
        0,
    ),
    "a ladder to 2**62 of dummy items": (
        lambda: mutated_spec(
            "deepseek_v41",
            (
                "  max: r * r * min(max_num_batched_tokens, max_model_len)\n",
                LADDER_TO_2_62,
            ),
        ),
        0,
    ),
    "unknown keys": (_unknown_keys, 2),
    "unknown modalities": (_modalities, 2),
    "unknown names against 190 constants": (_unknown_names, 2),
    "a tower of exponents": (_exponent_tower, 2),
    "134 buffers": (_many_buffers, 2),
    "400-character formulas sampled": (_long_formulas(10), 2),
    "formulas at the operator cap sampled": (_long_formulas(4), 0),
    "over the cap": (lambda: spec_text(BASE) + "#" * MAX_SPEC_BYTES, 2),
    "base-60 number": (lambda: spec_text(BASE) + "x: " + "1:" * 20000 + "1\n", 2),
}


@pytest.mark.parametrize("name", list(COSTLY))
def test_any_input_is_answered_quickly(name: str, tmp_path: Path) -> None:
    make, expected_rc = COSTLY[name]
    spec = _write(tmp_path / "specs", "hostile.yaml", make())
    result = run_measured([str(spec), "--out", str(tmp_path / "out")])
    assert result["rc"] == expected_rc, result["stderr"][-2000:]
    assert "Traceback" not in result["stderr"]
    assert result["cpu_s"] < 2.0, result
    assert result["peak_mb"] < 300, result
    if expected_rc == 2:
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["--stdout", "/dev/zero"], ["/dev/urandom"]])
def test_devices_are_read_up_to_the_cap(argv: list[str], tmp_path: Path) -> None:
    result = run_measured([*argv, "--out", str(tmp_path / "out")])
    assert result["rc"] == 2
    assert result["cpu_s"] < 2.0 and result["peak_mb"] < 300, result
    assert f"larger than {MAX_SPEC_BYTES // 1024} KiB" in result["stderr"]


# -- 4. OS errors and overflow: exit 2, one line, nothing written ------------------


def _spec(tmp_path: Path) -> Path:
    return _write(tmp_path / "specs", f"{BASE}.yaml", spec_text(BASE))


def _occupy_with_folder(out: Path) -> None:
    (out / "standalone" / f"{BASE}.py").mkdir(parents=True)


def _occupy_with_fifo(out: Path) -> None:
    (out / "vllm").mkdir(parents=True)
    os.mkfifo(out / "vllm" / f"{BASE}.py")


def _occupy_with_device_link(out: Path) -> None:
    (out / "standalone").mkdir(parents=True)
    (out / "standalone" / f"{BASE}.py").symlink_to("/dev/zero")


def _out_is_a_file(out: Path) -> None:
    out.write_text("not a folder")


def _target_folder_is_a_file(out: Path) -> None:
    out.mkdir()
    (out / "standalone").write_text("not a folder")


#: (what is in the way, the message's words)
OBSTACLES = [
    (_occupy_with_folder, "is a folder"),
    (_occupy_with_fifo, "not a regular file"),
    (_occupy_with_device_link, "not a regular file"),
    (_out_is_a_file, "is not a folder"),
    (_target_folder_is_a_file, "is not a folder"),
]


@pytest.mark.parametrize(("obstacle", "words"), OBSTACLES, ids=lambda o: str(o))
def test_an_unwritable_output_writes_nothing(obstacle, words, tmp_path: Path) -> None:
    spec, out = _spec(tmp_path), tmp_path / "out"
    obstacle(out)
    before = tree_snapshot(tmp_path)
    rc, stdout, stderr = run_main([str(spec), "--out", str(out)])
    assert rc == 2 and stdout == ""
    line = _one_line_error(stderr)
    assert line.startswith("gen-mixin: error: ") and words in line, line
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("first", ["file", "symbolic link"])
def test_a_failed_replace_restores_every_file(
    first: str, tmp_path: Path, monkeypatch
) -> None:
    """The second of two replacements fails: the first is undone, the old
    files keep their bytes and modes (a link stays a link), no temporary
    file is left."""
    from generator import emit

    spec, out = _spec(tmp_path), tmp_path / "out"
    for target in ("vllm", "standalone"):
        _write(out / target, f"{BASE}.py", f"old {target}\n")
    (out / "vllm" / f"{BASE}.py").chmod(0o640)
    if first == "symbolic link":
        (out / "vllm" / f"{BASE}.py").unlink()
        (out / "vllm" / f"{BASE}.py").symlink_to(_write(tmp_path, "elsewhere", "x\n"))
    before = tree_snapshot(tmp_path)
    real_replace, calls = os.replace, []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(emit.os, "replace", failing_replace)
    rc, _, stderr = run_main([str(spec), "--out", str(out)])
    assert rc == 2 and len(calls) >= 2
    assert "No space left on device" in _one_line_error(stderr)
    assert tree_snapshot(tmp_path) == before


def test_a_failed_temporary_write_removes_created_folders(
    tmp_path: Path, monkeypatch
) -> None:
    from generator import emit

    spec, out = _spec(tmp_path), tmp_path / "out" / "deep"
    real_open, calls = os.open, []

    def failing_open(path, flags, mode=0o777):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(13, "Permission denied")
        return real_open(path, flags, mode)

    monkeypatch.setattr(emit.os, "open", failing_open)
    rc, _, stderr = run_main([str(spec), "--out", str(out)])
    assert rc == 2 and "Permission denied" in _one_line_error(stderr)
    assert not (tmp_path / "out").exists()


def test_check_reads_what_is_there_without_crashing(tmp_path: Path) -> None:
    spec, out = _spec(tmp_path), tmp_path / "out"
    assert run_main([str(spec), "--out", str(out)])[0] == 0
    (out / "vllm" / f"{BASE}.py").write_bytes(b"\xff\xfe not UTF-8\n")
    rc, stdout, stderr = run_main([str(spec), "--out", str(out), "--check"])
    assert rc == 1 and "Traceback" not in stderr
    assert f"stale: {out / 'vllm' / f'{BASE}.py'}" in stderr
    assert "+# SPDX-License-Identifier" in stdout
    (out / "vllm" / f"{BASE}.py").unlink()
    (out / "vllm" / f"{BASE}.py").mkdir()
    rc, _, stderr = run_main([str(spec), "--out", str(out), "--check"])
    assert rc == 2 and "is a folder" in _one_line_error(stderr)


#: (where in the spec, the number as written)
HUGE_NUMBERS = [
    ("budget:\n  min: 64", "budget:\n  min: " + "9" * 5000),  # over Python's limit
    ("budget:\n  min: 64", "budget:\n  min: " + "9" * 3000),  # generated before
    ("budget:\n  min: 64", f"budget:\n  min: {MAX_INTEGER + 1}"),
    ("budget:\n  min: 64", f"budget:\n  min: -{MAX_INTEGER + 1}"),
    ("budget:\n  min: 64", "budget:\n  min: 0x1" + "0" * 16),
    ("budget:\n  min: 64", "budget:\n  min: 1.0e+400"),
    ("default: 2}", f"default: {MAX_INTEGER + 1}}}"),
    ("half_rot_dim: 39", "half_rot_dim: " + "1:" * 200 + "1"),
]


@pytest.mark.parametrize(("old", "new"), HUGE_NUMBERS, ids=lambda s: s[-24:])
def test_huge_numbers_in_a_spec_are_out_of_range(old, new, tmp_path: Path) -> None:
    text = spec_text(BASE).replace(old, new, 1)
    spec = _write(tmp_path / "specs", f"{BASE}.yaml", text)
    rc, _, stderr = run_main([str(spec), "--out", str(tmp_path / "out")])
    assert rc == 2, stderr
    assert "number out of range" in stderr and "set_int_max_str_digits" not in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "formula",
    [f"t * h * w // {MAX_INTEGER + 1}", "t * h * w // " + "9" * 300],
)
def test_huge_formula_literals_are_out_of_range(formula: str, tmp_path: Path) -> None:
    text = mutated_spec(BASE, ("t * h * w // (merge * merge)", formula))
    spec = _write(tmp_path / "specs", f"{BASE}.yaml", text)
    rc, _, stderr = run_main([str(spec), "--out", str(tmp_path / "out")])
    assert rc == 2 and "integer literal out of range" in stderr, stderr


BIG = 2**62  # a literal in range; a product of two such values is not
#: (field, where in the spec, what it becomes): formulas whose value at the
#: static checks' sampled budgets, batch sizes and dims is beyond int64.
VALUES_BEYOND_INT64 = [
    (
        "items.output_tokens",
        "output_tokens: t * h * w // (merge * merge)",
        "output_tokens: ((((((((t*h*w)**8)**8)**8)**8)**8)**8)**8)**8 // (merge * merge)",
    ),
    (
        "items.output_tokens",
        "output_tokens: t * h * w // (merge * merge)",
        f"output_tokens: t * h * w * {BIG} // (merge * merge)",
    ),
    ("items.input_size", "input_size: t * h * w", f"input_size: t * h * w * {BIG}"),
    (
        "capture.dummy.image_grid_thw",
        "image_grid_thw: [1, merge, k * merge]",
        f"image_grid_thw: [1, merge, k * merge * {BIG}]",
    ),
    (
        "capture.tensors.pixel_values.shape",
        "shape: [rows, channels * frames * patch**2]",
        f"shape: [rows * {BIG}, channels * frames * patch**2]",
    ),
    (
        "buffers.cu_seqlens.slots",
        "slots: max_batch_size + 2}",
        f"slots: max_batch_size * {BIG} + 2}}",
    ),
]


@pytest.mark.parametrize(
    ("field", "old", "new"),
    VALUES_BEYOND_INT64,
    ids=[f"{i}-{case[0]}" for i, case in enumerate(VALUES_BEYOND_INT64)],
)
def test_formula_values_beyond_int64_are_located_errors(
    field: str, old: str, new: str, tmp_path: Path
) -> None:
    """No tensor size or count holds such a value: refused where the formula
    is written (the static checks used to skip it, and the spec generated)."""
    text = mutated_spec(BASE, (old, new))
    spec = _write(tmp_path / "specs", f"{BASE}.yaml", text)
    rc, _, stderr = run_main([str(spec), "--out", str(tmp_path / "out")])
    assert rc == 2, stderr
    line = next(i for i, t in enumerate(text.splitlines(), 1) if new.strip() in t)
    diags = [m for m in map(DIAG_RE.match, stderr.splitlines()) if m]
    located = [(int(m["line"]), m["rest"].split(": ", 1)[0]) for m in diags]
    assert located == [(line, field)], stderr
    assert "beyond int64" in diags[0]["rest"]
    assert not (tmp_path / "out").exists()


# -- 5. plan's arguments -------------------------------------------------------------

HUGE = "9" * 5000
PLAN_ARGUMENTS = [
    (["--set", f"merge={HUGE}"], "out of range"),
    (["--set", f"merge={'9' * 1000}"], "out of range"),
    (["--set", f"merge=-{'9' * 1000}"], "out of range"),
    (["--budgets", HUGE], "out of range"),
    (["--budgets", "64", "9" * 1000], "out of range"),
    (["--max-frames", HUGE], "out of range"),
    (["--max-items", "9" * 1000], "out of range"),
    (["--max-num-batched-tokens", "0"], "out of range"),
    (["--set", f"merge={2**62}"], "items.input_size: a value exceeds"),
    (["--set", "nosuch=3"], "known: channels, frames, half_rot_dim, merge, patch"),
    (["--set", "merge"], "NAME=INTEGER"),
    (["--set", "merge=2\n3"], "not an integer"),
]


@pytest.mark.parametrize(("args", "words"), PLAN_ARGUMENTS, ids=lambda a: str(a)[:40])
def test_plan_refuses_bad_arguments_in_one_line(args, words) -> None:
    rc, stdout, stderr = run_main(["plan", f"specs/{BASE}.yaml", *args])
    assert rc == 2 and stdout == "", stdout
    assert "Traceback" not in stderr
    last = stderr.splitlines()[-1]
    assert words in last and len(last) < 300, last


@pytest.mark.parametrize(
    "args",
    [
        ["--max-items", str(2**62)],
        [
            "--max-num-batched-tokens",
            str(MAX_INTEGER),
            "--max-model-len",
            "1" + "0" * 18,
        ],
        ["--set", f"half_rot_dim={MAX_INTEGER}"],
    ],
    ids=str,
)
def test_plan_with_extreme_values_answers(args) -> None:
    rc, _, stderr = run_main(["plan", f"specs/{BASE}.yaml", *args])
    assert rc in (0, 2) and "Traceback" not in stderr


def _traffic_item(h: str) -> str:
    return '{"batches": [[{"t": 1, "h": %s, "w": 16}]]}' % h


#: name -> (the traffic file's text, or a device, and words of the one problem)
TRAFFIC_FILES = {
    "a device": ("/dev/zero", "larger than 4 MiB"),
    "over the cap": (_traffic_item("1" + " " * (4 * 2**20)), "larger than 4 MiB"),
    "5000 digits": (_traffic_item("9" * 5000), "number out of range"),
    "nested 100000 deep": ("[" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("name", list(TRAFFIC_FILES))
def test_plan_refuses_a_hostile_traffic_file(name: str, tmp_path: Path) -> None:
    """``plan --traffic FILE``: the file is read up to a cap (``/dev/zero``
    grew without bound before) and every JSON problem is one located line
    (a long number or deep nesting was a traceback)."""
    content, words = TRAFFIC_FILES[name]
    path = Path(content) if content.startswith("/dev/") else tmp_path / "t.json"
    if path.parent == tmp_path:
        path.write_text(content, encoding="utf-8")
    result = run_measured(["plan", f"specs/{BASE}.yaml", "--traffic", str(path)])
    assert result["rc"] == 2 and "Traceback" not in result["stderr"], result
    problem, summary = result["stderr"].splitlines()
    assert DIAG_RE.match(problem) and words in problem, problem
    assert SUMMARY_RE.match(summary), summary
    assert result["cpu_s"] < 2.0 and result["peak_mb"] < 300, result


# -- 5. file modes ---------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_new_files_respect_the_umask(umask: int, tmp_path: Path) -> None:
    spec, out = _spec(tmp_path), tmp_path / "out"
    old = os.umask(umask)
    try:
        assert run_main([str(spec), "--out", str(out)])[0] == 0
    finally:
        os.umask(old)
    for path in files_under(out):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


def test_a_rewritten_file_keeps_its_mode(tmp_path: Path) -> None:
    spec, out = _spec(tmp_path), tmp_path / "out"
    target = _write(out / "vllm", f"{BASE}.py", "old\n")
    target.chmod(0o640)
    assert run_main([str(spec), "--out", str(out), "--target", "vllm"])[0] == 0
    assert target.read_text() != "old\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


# -- the command's modules -------------------------------------------------------------


def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "generator"
        ):
            names.add(node.module)
            if node.module == "generator":
                names |= {f"generator.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("generator")}
    return names


def test_the_generator_package_has_no_import_cycle() -> None:
    """Every import counts, those inside functions too (``plan`` imported
    ``cli``, which dispatches to ``plan``)."""
    import generator

    folder = Path(generator.__file__).parent
    modules = {f"generator.{p.stem}": p for p in folder.glob("*.py")}
    graph = {m: _imports_of(p) & set(modules) - {m} for m, p in modules.items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())
