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
before); 6,000 capture-axis keys are refused in 0.9 s as the spec is read
(39 s before), 16 keys with 130 buffers in 0.4 s, ``units: 65536`` in 0.2 s
(20 s); a 4 MiB traffic file of unknown or repeated keys 0.3-0.9 s and 90 MB
(96 s and 1 GB before). The test allows 2 s and 300 MB.
"""

from __future__ import annotations

import ast
import os
import stat
import tokenize
from pathlib import Path

import pytest
from genmixin_testlib import (
    DATA_DIR,
    DIAG_RE,
    SUMMARY_RE,
    files_under,
    mutated_spec,
    run_main,
    run_measured,
    spec_problems,
    spec_text,
    tree_snapshot,
)

from generator.limits import (
    MAX_CAPTURE_AXIS_KEYS,
    MAX_DISTINCT_TRAFFIC_BATCHES,
    MAX_DISTINCT_TRAFFIC_ITEMS,
    MAX_DUMMY_UNITS,
    MAX_INTEGER,
    MAX_SPEC_BYTES,
    MAX_TRAFFIC_BYTES,
    MAX_TRAFFIC_ITEMS,
    MAX_TRAFFIC_PROBLEMS,
)

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


def _axis_keys(count: int | None) -> str:
    """The valid corpus' capture axis with ``count`` distinct keys (``None``:
    as many as the spec cap holds, about 6,000), its bound far above."""
    base = (DATA_DIR / "valid" / "capture_axes.yaml").read_text(encoding="utf-8")
    base = base.replace("max_side, default: 12}", "max_side, default: 100000}")
    if count is None:
        keys = _filled(lambda i: f"[1, {i + 1}], ", _room(base))
    else:  # and the last key, [side, side]
        keys = "".join(f"[1, {i + 1}], " for i in range(count - 1))
    return base.replace("keys: [[4, 4], [4, 8], [8, 4], ", f"keys: [{keys}")


def _axis_keys_and_buffers() -> str:
    """The most axis keys with buffers to fill the cap: the static checks
    run once per key before the module's size is known (0.4 s)."""
    text = _axis_keys(MAX_CAPTURE_AXIS_KEYS)
    term = "min(token_budget,th)*max(tw,rows)+ceil_div(rows,th)"
    shape = "+".join([term] * 4)
    line = "  b{i}: {{shape: ['{s}', '{s}'], dtype: int64, allocate: true}}\n"
    count = _room(text) // (len(line.format(i=100, s=shape)) + 6)
    buffers = "".join(line.format(i=i, s=shape) for i in range(count))
    provided = ", ".join(f"b{i}" for i in range(count))
    text = text.replace("\nout_hidden_size:", buffers + "\nout_hidden_size:")
    text = text.replace("provides: [patch_mask]", f"provides: [patch_mask, {provided}]")
    return text.replace(
        "vision(patches, patch_mask)", "vision(patches, patch_mask, extra=rest)"
    )


def _dummy_units(units: int) -> str:
    """LFM2-VL's unit capture with ``units`` dummy units at every budget."""
    return mutated_spec(
        "lfm2_vl",
        (
            "units: ceil_div(token_budget, m)",
            f"units: max({units}, ceil_div(token_budget, m))",
        ),
        (
            '"min(token_budget - unit_index * m, m) * f"',
            '"max(1, min(token_budget - unit_index * m, m)) * f"',
        ),
    )


LADDER_TO_2_62 = f"  max: {2**62}  # a ladder of 57 budgets, each checked\n"

COSTLY = {
    # 39 s and 8 s (a 168 KB module generated) before the cap on keys.
    "6,000 capture-axis keys": (lambda: _axis_keys(None), 2),
    "2,000 capture-axis keys": (lambda: _axis_keys(2000), 2),
    f"{MAX_CAPTURE_AXIS_KEYS} capture-axis keys": (
        lambda: _axis_keys(MAX_CAPTURE_AXIS_KEYS),
        0,
    ),
    "the most axis keys and 130 buffers": (_axis_keys_and_buffers, 2),
    # 20 s before the cap on dummy units.
    "65,536 dummy units": (lambda: _dummy_units(65536), 2),
    f"{MAX_DUMMY_UNITS} dummy units": (lambda: _dummy_units(MAX_DUMMY_UNITS), 0),
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
    (["--set", f"merge={2**62}"], "items.input_size: evaluates beyond int64"),
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
    # An OverflowError traceback before:
    "4000-digit count": (
        '{"batches": [{"count": %s, "items": [{"t": 1, "h": 4, "w": 4}]}]}'
        % ("9" * 4000),
        "batches[0].count: number out of range",
    ),
    "4000-digit output_row_bytes": (
        _traffic_item("4")[:-1]
        + ', "tuning": {"output_row_bytes": %s}}' % ("9" * 4000),
        "tuning.output_row_bytes: number out of range",
    ),
    # Blamed on the spec's items.input_size before:
    "max_budget 2**62": (
        _traffic_item("4")[:-1] + ', "tuning": {"max_budget": %d}}' % 2**62,
        "tuning.max_budget: a positive integer, at most",
    ),
    # Accepted silently before:
    "duplicate key": (
        _traffic_item("4")[:-1] + ', "batches": [[{"t": 1, "h": 8, "w": 8}]]}',
        "batches: duplicate key (first given at line 1, column 2)",
    ),
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


def _traffic(batches: list, **top) -> str:
    import json

    return json.dumps({"batches": batches, **top})


def _unknown_traffic_keys(size: int) -> str:
    """``size`` bytes of unknown top-level keys (420,000 of them at the cap
    took 96 s and 1 GB)."""
    head = _traffic_item("16")[:-1]
    return head + _filled(lambda i: f', "k{i}": 1', size - len(head) - 1) + "}"


def _batches(distinct: int, items: int, repeats: int = 1) -> list:
    grid = [{"t": 1, "h": 2 * (i + 1), "w": 2} for i in range(distinct)]
    return [[grid[i]] * items for i in range(distinct)] * repeats


#: name -> (the traffic file's text, plan's exit code, words of its last
#: problem or None)
COSTLY_TRAFFIC = {
    "unknown keys at the cap": (
        lambda: _unknown_traffic_keys(MAX_TRAFFIC_BYTES),
        2,
        "unknown key",
    ),
    "a problem at the end of the cap's items": (
        lambda: _traffic(_batches(5, 1, MAX_TRAFFIC_ITEMS // 5 - 1) + [[{"t": 0}]]),
        2,
        f"batches[{MAX_TRAFFIC_ITEMS - 5}][0].t: a positive integer",
    ),
    "a key repeated to the cap, a problem after it": (
        lambda: "{"
        + _filled(lambda i: '"note": 1, ', MAX_TRAFFIC_BYTES - 20)
        + '"batches": []}',
        2,
        "batches: a non-empty list",
    ),
    "items over the cap": (
        lambda: _traffic(_batches(5, 1, MAX_TRAFFIC_ITEMS // 5 + 1)),
        2,
        f"items (at most {MAX_TRAFFIC_ITEMS}",
    ),
    "items at the cap": (
        lambda: _traffic(_batches(5, 1, MAX_TRAFFIC_ITEMS // 5)),
        0,
        None,
    ),
    "distinct items over the cap": (
        lambda: _traffic(_batches(400, MAX_DISTINCT_TRAFFIC_ITEMS // 400 + 1)),
        2,
        "distinct batches of",
    ),
    "distinct batches at the caps": (
        lambda: _traffic(
            _batches(
                MAX_DISTINCT_TRAFFIC_BATCHES,
                MAX_DISTINCT_TRAFFIC_ITEMS // MAX_DISTINCT_TRAFFIC_BATCHES,
            ),
            tuning={"max_budget": 2**24},
        ),
        0,
        None,
    ),
}


@pytest.mark.parametrize("name", list(COSTLY_TRAFFIC))
def test_plan_answers_a_costly_traffic_file_quickly(name: str, tmp_path: Path) -> None:
    """Counts are capped before the work they cost (checking each item,
    tuning on each distinct batch); at most MAX_TRAFFIC_PROBLEMS problems
    are reported, each located (the walk that finds them skips the rest)."""
    make, expected_rc, words = COSTLY_TRAFFIC[name]
    path = tmp_path / "t.json"
    path.write_text(make(), encoding="utf-8")
    assert path.stat().st_size <= MAX_TRAFFIC_BYTES
    result = run_measured(["plan", f"specs/{BASE}.yaml", "--traffic", str(path)])
    assert result["rc"] == expected_rc, result
    assert "Traceback" not in result["stderr"]
    if words is not None:
        *problems, summary = result["stderr"].splitlines()
        assert 1 <= len(problems) <= MAX_TRAFFIC_PROBLEMS and SUMMARY_RE.match(summary)
        assert all(DIAG_RE.match(p) for p in problems) and words in problems[-1]
        assert not any(":1:1: " in p for p in problems), problems  # located
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


# -- the step language reaches only its allow-lists (issue #28) -------------------

#: The valid corpus's step-language spec: its last graph step, its last eager
#: step, its host_methods and its builder call are replaced by each attack.
STEPS_SPEC = "step_language"
GRAPH_LAST = "  - _merge_rows(joined, scale=0.5)\n"
EAGER_LAST = "    - _merge_rows(kept if n > 0 else feats, scale=0.5)\n"
HOST_METHODS = "host_methods: [_merge_rows, visual.prepare_metadata]"
BUILDER_CALL = "call: visual.prepare_metadata(image_grid_thw, device=device)"

STEP_ATTACKS = [
    # From a module's parameters() generator to its frame's globals.
    (
        "graph",
        "visual.parameters().gi_frame.f_globals",
        "'visual.parameters' names 'parameters'",
    ),
    ("graph", "feats.gi_frame.f_globals", "'.gi_frame' is not an attribute"),
    ("graph", "feats.f_globals", "'.f_globals' is not an attribute"),
    ("graph", "next(visual(pixel_values)).gi_frame", "next() is only allowed as"),
    ("graph", "next(visual(pixel_values))", "next() is only allowed as"),
    ("graph", "next(visual.parameters())", "next() is only allowed as"),
    # A module's parameters, not a config's (a path under the module).
    ("graph", "next(visual.config.parameters()).dtype", "next() is only allowed as"),
    ("graph", "next(visual.parameters()).data_ptr()", "next() is only allowed"),
    ("graph", "feats.data_ptr()", "'.data_ptr()' is not"),
    (
        "graph",
        "next(visual.parameters()).dtype.to_complex()",
        "'.to_complex()' is not",
    ),
    # Files, storage, numpy.
    (
        "graph",
        "feats.untyped_storage().from_file('/etc/passwd', False, 8)",
        "'.untyped_storage()' is not a tensor method",
    ),
    ("graph", "feats.from_file('/etc/passwd', False, 8)", "'.from_file()' is not"),
    ("graph", "feats.untyped_storage()", "'.untyped_storage()' is not"),
    ("graph", "feats.storage()", "'.storage()' is not"),
    ("eager", "feats.numpy().tofile('/tmp/out')", "'.numpy()' is not"),
    ("eager", "feats.tofile('/tmp/out')", "'.tofile()' is not"),
    ("eager", "feats.numpy()", "'.numpy()' is not"),
    ("eager", "feats.to('cpu').numpy()", "'.numpy()' is not"),
    # Formatting objects, strings as values.
    (
        "eager",
        "'{0.forward.__globals__}'.format(feats)",
        "the string '{0.forward.__globals__}' may only be",
    ),
    ("graph", "rest['x']", "the string 'x' may only be"),
    ("graph", "rest.get('x')", "'.get()' is not a tensor method"),
    ("eager", "feats.format", "'.format' is not an attribute"),
    # Hooks and callables.
    (
        "graph",
        "visual.register_forward_hook(_merge_rows)",
        "'visual.register_forward_hook' names 'register_forward_hook'",
    ),
    ("graph", "visual.apply(_merge_rows)", "'visual.apply' names 'apply'"),
    ("graph", "feats.register_hook(_merge_rows)", "'.register_hook()' is not"),
    ("graph", "feats.apply_(_merge_rows)", "'.apply_()' is not"),
    ("graph", "feats.map_(feats, _merge_rows)", "'.map_()' is not"),
    ("graph", "feats.grad_fn", "'.grad_fn' is not an attribute"),
    # The host: only what the spec declares.
    ("graph", "visual.forward(feats)", "'visual.forward' names 'forward'"),
    ("graph", "visual.state_dict()", "'visual.state_dict' names 'state_dict'"),
    (
        "graph",
        "visual.config.save_pretrained('/tmp/x')",
        "'visual.config.save_pretrained(...)' is not declared",
    ),
    ("graph", "visual.blocks[0](feats)", "'visual.blocks[0](...)' is not declared"),
    ("graph", "_merge_rows.gi_frame", "host method '_merge_rows' may only be called"),
    ("graph", "visual(_merge_rows)", "host method '_merge_rows' may only be called"),
    # In place: a value may be a view of the host model's weights.
    ("graph", "feats.zero_()", "'.zero_()' is not a tensor method"),
    ("graph", "pixel_values.copy_(feats)", "'.copy_()' is not a tensor method"),
    ("eager", "feats.view(-1).fill_(0)", "'.fill_()' is not a tensor method"),
    ("graph", "feats.masked_fill_(feats > 0, 1)", "'.masked_fill_()' is not"),
    ("graph", "feats.index_copy_(0, feats, feats)", "'.index_copy_()' is not"),
    # out= writes into the tensor it names (a buffer, a host weight).
    ("graph", "torch.cat([feats], out=pixel_values)", "keyword out= is not"),
    ("graph", "torch.zeros(3, out=visual.patch.weight)", "keyword out= is not"),
    ("eager", "torch.where(feats > 0, feats, feats, out=feats)", "keyword out="),
    ("graph", "feats.sum(0, out=pixel_values)", "keyword out= is not"),
    # Refused by the parser before as now (private and dunder names).
    ("graph", "feats.__class__", "attribute '__class__' is not allowed"),
    ("graph", "visual._modules", "attribute '_modules' is not allowed"),
]


def _steps_spec(where: str, attack: str) -> str:
    text = (DATA_DIR / "valid" / f"{STEPS_SPEC}.yaml").read_text(encoding="utf-8")
    old, new = {
        "graph": (GRAPH_LAST, f'  - "{attack}"\n'),
        "eager": (EAGER_LAST, f'    - "{attack}"\n'),
        "host_methods": (HOST_METHODS, attack),
        "builder": (BUILDER_CALL, attack),
    }[where]
    assert text.count(old) == 1
    return text.replace(old, new)


def _refused_with(text: str, tmp_path: Path) -> str:
    """The one diagnostic of ``gen-mixin`` on ``text``: exit 2, nothing
    written, no traceback."""
    spec = _write(tmp_path / "specs", "hostile.yaml", text)
    out = tmp_path / "out"
    rc, stdout, stderr = run_main([str(spec), "--out", str(out)])
    assert rc == 2, stderr
    assert not out.exists()
    lines = stderr.splitlines()
    assert SUMMARY_RE.match(lines[-1]) and "Traceback" not in stderr, stderr
    assert all(DIAG_RE.match(line) for line in lines[:-1]), stderr
    return "\n".join(lines[:-1])


@pytest.mark.parametrize(("where", "attack", "words"), STEP_ATTACKS, ids=repr)
def test_a_step_reaches_only_the_allow_lists(where, attack, words, tmp_path) -> None:
    """Each attack exits 2 naming the step and the attribute it reaches."""
    found = _refused_with(_steps_spec(where, attack), tmp_path)
    field = "graph_forward[3]" if where == "graph" else "eager_forward.steps[3]"
    assert f": {field}: " in found and words in found, found


HOST_DECLARATIONS = [
    ("[_merge_rows, visual.prepare_metadata, _modules]", "'_modules' is torch.nn"),
    ("[_merge_rows, visual.prepare_metadata, _forward_hooks]", "'_forward_hooks'"),
    ("[_merge_rows, visual.prepare_metadata, _parameters]", "'_parameters'"),
    ("[_merge_rows, visual.prepare_metadata, parameters]", "'parameters' is torch"),
    ("[_merge_rows, visual.prepare_metadata, apply]", "'apply' is torch.nn"),
    ("[_merge_rows, visual.prepare_metadata, visual.parameters]", "'parameters'"),
    ("[_merge_rows, visual.prepare_metadata, visual.apply]", "names 'apply'"),
    ("[_merge_rows, visual.prepare_metadata, visual._modules]", "private attribute"),
    ("[_merge_rows, visual.prepare_metadata, visual.__call__]", "private attribute"),
    ("[_merge_rows, visual.prepare_metadata, config.save]", "not a host attribute"),
    ("[_merge_rows, visual.prepare_metadata, __import__]", "must not start with"),
]


@pytest.mark.parametrize(("methods", "words"), HOST_DECLARATIONS, ids=repr)
def test_host_methods_declare_only_the_models_own(methods, words, tmp_path) -> None:
    """``host_methods`` names methods of the model or dotted paths under a
    host attribute, never torch.nn.Module's machinery or a private path."""
    text = _steps_spec("host_methods", f"host_methods: {methods}")
    found = _refused_with(text, tmp_path)
    assert ": host_methods[2]: " in found and words in found, found


#: A dotted host method under a host attribute that is no module calls data:
#: a host tensor's numpy or storage, a string's format, a config's writers.
#: (host attribute, its annotation, the declared method, its call)
DOTTED_UNDER_DATA = [
    ("newline", "torch.Tensor", "newline.numpy", "newline.numpy()"),
    (
        "newline",
        "torch.nn.Parameter",
        "newline.untyped_storage",
        "newline.untyped_storage()",
    ),
    ("name", "str", "name.format", "name.format(feats)"),
    ("size", "int", "size.bit_length", "size.bit_length()"),
    ("kw", "dict", "kw.get", "kw.get(1)"),
    ("newline", "torch.Tensor", "newline.zero_", "newline.zero_()"),
    ("config", "Any", "config.to_json_file", "config.to_json_file(3)"),
    ("config", "Any", "config.save_pretrained", "config.save_pretrained('/tmp/x')"),
    (
        "vllm_config",
        "VllmConfig",
        "vllm_config.compile_debug_dump_path",
        "vllm_config.compile_debug_dump_path()",
    ),
]


@pytest.mark.parametrize(
    ("name", "annotation", "method", "call"), DOTTED_UNDER_DATA, ids=repr
)
def test_dotted_host_methods_live_under_modules(
    name, annotation, method, call, tmp_path
) -> None:
    text = (
        _steps_spec("graph", call)
        .replace(
            "  visual: torch.nn.Module\n",
            f"  visual: torch.nn.Module\n  {name}: {annotation}\n",
        )
        .replace(
            HOST_METHODS,
            f"host_methods: [_merge_rows, visual.prepare_metadata, {method}]",
        )
    )
    found = _refused_with(text, tmp_path)
    assert f": host_methods[2]: {name!r} is " in found, found
    assert "not a module" in found or "only its tensor methods" in found, found


def test_a_host_tensor_declares_its_tensor_methods(tmp_path) -> None:
    """The rule's other side: ``newline.reshape`` under a host tensor is fine."""
    text = (
        _steps_spec("graph", "_merge_rows(newline.reshape(1, -1), scale=0.5)")
        .replace(
            "  visual: torch.nn.Module\n",
            "  visual: torch.nn.Module\n  newline: torch.Tensor\n",
        )
        .replace(
            HOST_METHODS,
            "host_methods: [_merge_rows, visual.prepare_metadata, newline.reshape]",
        )
    )
    assert spec_problems(text) == []


#: A host attribute named after torch.nn.Module's own API would make its
#: machinery a plain host call (``apply(...)``, ``named_modules()``).
HOST_ATTRIBUTES = [
    ("apply", "apply(feats)"),
    ("named_modules", "named_modules()"),
    ("state_dict", "state_dict()"),
    ("register_forward_hook", "register_forward_hook(feats)"),
    ("load_state_dict", "load_state_dict(feats)"),
    ("training", "training"),
]


@pytest.mark.parametrize(("name", "step"), HOST_ATTRIBUTES, ids=repr)
def test_host_attributes_are_never_module_api(name, step, tmp_path) -> None:
    # Annotated a module: a call of it is otherwise refused on its own.
    text = _steps_spec("graph", step).replace(
        "  visual: torch.nn.Module\n",
        f"  visual: torch.nn.Module\n  {name}: torch.nn.Module\n",
    )
    found = _refused_with(text, tmp_path)
    assert f": host.{name}: host attribute {name!r} is torch.nn.Module's" in found
    assert "graph_forward" not in found, found


BUILDER_CALLS = [
    ("call: visual.state_dict(image_grid_thw)", "names 'state_dict'"),
    ("call: visual.config.save(image_grid_thw)", "'visual.config.save(...)' is not"),
    ("call: visual.forward(image_grid_thw)", "names 'forward'"),
]


@pytest.mark.parametrize(("call", "words"), BUILDER_CALLS, ids=repr)
def test_a_builder_call_reaches_only_declared_host_code(call, words, tmp_path) -> None:
    found = _refused_with(_steps_spec("builder", call), tmp_path)
    assert ": metadata[0].call: " in found and words in found, found


def test_module_api_is_torch_nn_module_s_own_names() -> None:
    """The names a host path may not use are every name ``torch.nn.Module``
    defines, on its class or in ``__init__`` (a torch upgrade that adds one
    fails here until the list has it)."""
    import torch

    from generator.spec.step_language import MODULE_API

    torch_names = set(dir(torch.nn.Module)) | set(vars(torch.nn.Module()))
    assert {n for n in torch_names if not n.startswith("__")} <= MODULE_API
