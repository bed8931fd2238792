"""vLLM-only imports (an ``imports:`` entry with a ``vllm`` module and no
``standalone`` one): the spec generates its vllm module only, every command
of the toolchain agrees, and ``--target standalone`` refuses it at the
import, writing nothing.

The spec is ``data/valid/vllm_only_import.yaml`` (vLLM's ``unpad_image`` in
its post-processing); the invalid corpus holds the entries that stay refused
(no vllm module, modules outside the allow-lists, names the module lacks).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from genmixin_testlib import DATA_DIR, DIAG_RE, files_under, run_main, spec_targets

SPEC = DATA_DIR / "valid" / "vllm_only_import.yaml"
# The vLLM-only import's key in the spec (line and column of the diagnostic).
IMPORT_LINE = "  unpad_image: {vllm: vllm.model_executor.models.llava_next}"


def _import_location() -> str:
    lines = SPEC.read_text(encoding="utf-8").splitlines()
    return f"{lines.index(IMPORT_LINE) + 1}:3"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder holding only the spec (so ``--check`` looks for orphans)."""
    (tmp_path / "specs").mkdir()
    shutil.copy(SPEC, tmp_path / "specs" / SPEC.name)
    return tmp_path


def _written(out: Path) -> list[str]:
    return [str(p.relative_to(out)) for p in files_under(out)]


def test_the_spec_has_the_vllm_target_only() -> None:
    assert spec_targets(SPEC) == ("vllm",)


# (argv after the spec and --out, exit code, files written)
GENERATE = [
    ([], 0, ["vllm/vllm_only_import.py"]),
    (["--target", "all"], 0, ["vllm/vllm_only_import.py"]),
    (["--target", "vllm"], 0, ["vllm/vllm_only_import.py"]),
    (["--target", "standalone"], 2, []),
]


@pytest.mark.parametrize(("argv", "rc", "files"), GENERATE)
def test_generation_writes_the_vllm_module_only(project, argv, rc, files) -> None:
    out = project / "out"
    got, _, stderr = run_main(
        [str(project / "specs" / SPEC.name), "--out", str(out), *argv]
    )
    assert got == rc, stderr
    assert _written(out) == files if files else not out.exists()


def test_standalone_refusal_is_located_at_the_import(project) -> None:
    spec = project / "specs" / SPEC.name
    rc, stdout, stderr = run_main(
        [str(spec), "--target", "standalone", "--out", str(project / "out")]
    )
    lines = stderr.splitlines()
    assert rc == 2 and stdout == "" and len(lines) == 2, stderr
    assert DIAG_RE.match(lines[0]), lines[0]
    assert lines[0].startswith(
        f"{spec}:{_import_location()}: imports.unpad_image: no standalone module "
        "(a vLLM-only import)"
    )
    assert "--target vllm" in lines[0] and "reference_towers" in lines[0]
    assert lines[1] == "gen-mixin: 1 problem found"
    assert not (project / "out").exists()


def test_standalone_refusal_writes_no_other_spec(project) -> None:
    """All or nothing: a refused spec stops the other specs' modules too."""
    other = DATA_DIR / "valid" / "postprocess_per_item.yaml"
    shutil.copy(other, project / "specs" / other.name)
    specs = sorted(str(p) for p in (project / "specs").glob("*.yaml"))
    rc, _, _ = run_main([*specs, "--target", "standalone", "--out", str(project)])
    assert rc == 2 and not (project / "standalone").exists()


def test_stdout_prints_the_vllm_module() -> None:
    rc, stdout, stderr = run_main([str(SPEC), "--stdout"])
    assert rc == 0, stderr
    assert stdout.count("class UnpaddedLinesEncoderCudaGraphMixin") == 1
    assert "from vllm.model_executor.models.llava_next import unpad_image" in stdout
    assert "encoder_cudagraph_runtime" not in stdout


# (what sits in the output folder besides the generated vllm module, exit code
# of --check, what it says)
CHECK = [
    ({}, 0, "1 file(s) up to date"),
    ({"standalone/vllm_only_import.py": "# old\n"}, 1, "orphaned: "),
    ({"vllm/vllm_only_import.py": "# stale\n"}, 1, "stale: "),
]


@pytest.mark.parametrize(("extra", "rc", "says"), CHECK)
def test_check_expects_no_standalone_module(project, extra, rc, says) -> None:
    spec, out = str(project / "specs" / SPEC.name), project / "generated"
    assert run_main([spec, "--out", str(out)])[0] == 0
    for rel, text in extra.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text, encoding="utf-8")
    got, stdout, stderr = run_main([spec, "--check", "--out", str(out)])
    assert got == rc, stderr
    assert says in stdout + stderr
