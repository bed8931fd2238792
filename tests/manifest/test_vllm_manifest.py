"""The offline manifest of vLLM 0.33.0's modules and names, and its use.

``generator/data/vllm_manifest.txt`` is what ``tools/make_vllm_manifest.py``
makes from the vLLM wheel (checked when the wheel is there: CI downloads it
into ``~/.cache/gen-mixin``); the generator reads it to refuse a spec's
``vllm:`` import of a module or name vLLM 0.33.0 does not have.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from generator import cli, vllm_manifest
from generator.vllm_manifest import vllm_import_problem, vllm_module_names

REPO = Path(__file__).resolve().parents[2]
MAKER_PATH = REPO / "tools" / "make_vllm_manifest.py"
MINIMAX_SPEC = REPO / "specs" / "minimax_m3.yaml"
TOWER_MODULE = "vllm.models.minimax_m3.common.vision_tower"


def _maker() -> ModuleType:
    """``tools/make_vllm_manifest.py``, loaded from its path (it is a script,
    not a package module)."""
    spec = importlib.util.spec_from_file_location("make_vllm_manifest", MAKER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("module", "name", "problem"),
    [
        ("vllm.config", "VllmConfig", None),  # re-exported by an import
        ("vllm.config", "multimodal", None),  # a submodule of the package
        ("vllm.utils.torch_utils", "async_tensor_h2d", None),  # a def
        ("vllm", "LLM", None),  # lazy: __getattr__ and __all__
        ("vllm.v1.attention.backends.registry", "AttentionBackendEnum", None),
        ("vllm.config", "NoSuchConfig", "module 'vllm.config' defines no name"),
        ("vllm.no_such_module", "x", "has no module 'vllm.no_such_module'"),
        ("vllm.models.no_such_model.common", "x", "has no module"),
        ("vllm.entrypoints.llm", "LLM", "outside the vLLM 0.33.0 packages"),
    ],
)
def test_import_verdicts(module: str, name: str, problem: str | None) -> None:
    found = vllm_import_problem(module, name)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_private_names_are_left_out() -> None:
    # A spec cannot import a name starting with "_"; the manifest stays smaller.
    names = vllm_module_names("vllm.model_executor.models.qwen2_vl")
    assert names is not None and "Qwen2VisionTransformer" in names
    assert not [n for n in names if n.startswith("_")]


def test_every_generated_vllm_import_is_in_the_manifest() -> None:
    problems = []
    for path in sorted((REPO / "generated" / "vllm").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "vllm"
            ):
                for alias in node.names:
                    problem = vllm_import_problem(node.module, alias.name)
                    if problem:
                        problems.append(f"{path.name}:{node.lineno}: {problem}")
    assert not problems, "\n".join(problems)


def test_pyproject_ships_the_manifest() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = config["tool"]["setuptools"]["package-data"]["generator"]
    package_dir = REPO / "generator"
    matched = {p for pattern in shipped for p in package_dir.glob(pattern)}
    assert package_dir.joinpath(*vllm_manifest.MANIFEST_RESOURCE) in matched


def test_maker_records_its_covered_packages() -> None:
    assert vllm_manifest.covered_packages() == _maker().COVERED_PACKAGES


def test_manifest_is_what_the_maker_makes_from_the_wheel() -> None:
    maker = _maker()
    wheel = vllm_manifest.find_vllm_wheel()
    if wheel is None:
        pytest.skip(
            "vLLM 0.33.0 wheel not found: set GEN_MIXIN_VLLM_WHEEL or run "
            "`pip download vllm==0.33.0 --no-deps -d ~/.cache/gen-mixin`"
        )
    committed = maker.MANIFEST_PATH.read_text(encoding="utf-8")
    assert maker.make_manifest(wheel) == committed, (
        "generator/data/vllm_manifest.txt is stale: run "
        "`python3 tools/make_vllm_manifest.py`"
    )


def _value_location(text: str, value: str) -> tuple[int, int]:
    """1-based (line, column) of the only occurrence of ``value``."""
    assert text.count(value) == 1
    before = text[: text.index(value)]
    return before.count("\n") + 1, len(before) - before.rfind("\n")


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("vllm.no_such_module", "vLLM 0.33.0 has no module 'vllm.no_such_module'"),
        (
            "vllm.config",
            "vLLM 0.33.0's module 'vllm.config' defines no name "
            "'MiniMaxVLVisionModel'",
        ),
    ],
)
def test_spec_importing_what_vllm_lacks_exits_2_at_its_location(
    tmp_path: Path, module: str, message: str
) -> None:
    text = MINIMAX_SPEC.read_text(encoding="utf-8").replace(TOWER_MODULE, module)
    spec = tmp_path / "minimax_m3.yaml"
    spec.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli.main(["--out", str(out), str(spec)])
    line, col = _value_location(text, f"vllm: {module}\n")
    col += len("vllm: ")
    assert rc == 2
    assert f"{spec}:{line}:{col}: imports.MiniMaxVLVisionModel.vllm: {message}" in (
        err.getvalue().splitlines()
    )
    assert not out.exists()
