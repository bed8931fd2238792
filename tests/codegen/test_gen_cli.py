"""The command's surface: what importing it costs, ``gen-mixin schema``, and
the schema against the format's documentation."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from genmixin_testlib import REPO, run_main, spec_paths

HEAVY = ("torch", "jinja2", "black")

_PROBE = """
import json, sys
{body}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {heavy!r})))
"""


def _heavy_modules_after(body: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body, heavy=set(HEAVY))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_heavy_module() -> None:
    assert _heavy_modules_after("import generator, generator.cli") == []


def test_validating_specs_loads_no_heavy_module() -> None:
    body = (
        "from generator.resolve import load_spec\n"
        + "".join(f"load_spec({str(p)!r})\n" for p in spec_paths())
        + "from generator import cli\n"
        + "import io, contextlib\n"
        + "with contextlib.redirect_stdout(io.StringIO()):\n"
        + "    assert cli.main(['schema']) == 0\n"
    )
    assert _heavy_modules_after(body) == []


def test_rendering_never_imports_torch() -> None:
    body = (
        "from pathlib import Path\nfrom generator.emit import render_spec\n"
        + "".join(
            f"[r.source for r in render_spec(Path({str(p)!r}), "
            "None, Path('generated'))]\n"
            for p in spec_paths()
        )
    )
    assert _heavy_modules_after(body) == ["black", "jinja2"]


def test_check_of_sealed_modules_never_imports_black() -> None:
    """``--check`` renders without formatting; the seals vouch for the files."""
    body = (
        "from generator.cli import main\nmain(['--check', "
        + "".join(f"{str(p.relative_to(REPO))!r}, " for p in spec_paths())
        + "])\n"
    )
    assert _heavy_modules_after(body) == ["jinja2"]


def _schema_text() -> str:
    exe = shutil.which("gen-mixin")
    cmd = [exe, "schema"] if exe else [sys.executable, "-m", "generator.cli", "schema"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(_schema_text())


def test_schema_is_the_validators_schema(schema) -> None:
    from generator.spec_schema import SPEC_SCHEMA

    assert schema == json.loads(json.dumps(SPEC_SCHEMA))
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])


def test_schema_accepts_the_projects_specs(schema) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    for spec in spec_paths():
        jsonschema.validate(yaml.safe_load(spec.read_text(encoding="utf-8")), schema)


def test_schema_subcommand_in_process_matches() -> None:
    rc, stdout, stderr = run_main(["schema"])
    assert rc == 0 and stderr == ""
    assert json.loads(stdout) == json.loads(_schema_text())


def test_bad_command_lines_exit_2_without_traceback(tmp_path) -> None:
    for argv in ([], ["--target", "nope", "specs/x.yaml"], ["schema", "--bogus"]):
        rc, _, stderr = run_main(argv)
        assert rc == 2, argv
        assert "usage:" in stderr and "Traceback" not in stderr
    rc, _, stderr = run_main(
        [str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o")]
    )
    assert rc == 2
    assert stderr.startswith(f"{tmp_path / 'missing.yaml'}:1:1: cannot read spec")
    assert not (tmp_path / "o").exists()


def test_two_specs_with_one_stem_are_refused(tmp_path) -> None:
    spec = spec_paths()[0]
    other = tmp_path / "other" / spec.name
    other.parent.mkdir()
    shutil.copy(spec, other)
    rc, _, stderr = run_main([str(spec), str(other), "--out", str(tmp_path / "o")])
    assert rc == 2
    assert f"two specs named {spec.stem!r}" in stderr
    assert not (tmp_path / "o").exists()


def test_stdout_mode_prints_and_writes_nothing(tmp_path, monkeypatch) -> None:
    from genmixin_testlib import render_all

    monkeypatch.chdir(REPO)
    spec = spec_paths()[0]
    rc, stdout, stderr = run_main(
        [
            "--stdout",
            "--target",
            "vllm",
            str(spec.relative_to(REPO)),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 0, stderr
    assert stdout == render_all()[("vllm", spec.stem)]
    assert not (tmp_path / "o").exists()
