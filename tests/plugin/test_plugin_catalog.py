"""The plugin's table of vLLM classes (gen_mixin_vllm/catalog.py) against the
generated modules, the specs, and vLLM 0.33.0's registry read from its wheel."""

from __future__ import annotations

import ast
import re
import zipfile
from pathlib import Path

import pytest
import yaml

import gen_mixin_vllm.models as plugin_models
from gen_mixin_vllm.catalog import (
    CATALOG,
    UNSERVED,
    generated_stems,
    mixin_class_name,
    stem_of_architecture,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_generated_module_is_served_or_says_why_not():
    stems = generated_stems()
    assert stems == sorted(p.stem for p in (ROOT / "generated" / "vllm").glob("*.py"))
    assert sorted([*CATALOG, *UNSERVED]) == stems
    assert not set(CATALOG) & set(UNSERVED)


@pytest.mark.parametrize("stem", sorted(CATALOG))
def test_the_mixin_is_the_class_the_spec_names(stem: str):
    spec = yaml.safe_load((ROOT / "specs" / f"{stem}.yaml").read_text("utf-8"))
    assert mixin_class_name(stem) == spec["class_name"]


def test_architectures_are_unique_and_resolve_back():
    seen = [a for host in CATALOG.values() for a in host.architectures]
    assert len(seen) == len(set(seen))
    for stem, host in CATALOG.items():
        for architecture in host.architectures:
            assert stem_of_architecture(architecture) == stem


def test_the_models_module_knows_only_catalog_architectures():
    with pytest.raises(AttributeError, match="has no attribute 'NotAModel'"):
        plugin_models.NotAModel  # noqa: B018
    assert not hasattr(plugin_models, "__wrapped__")


def _wheel() -> Path:
    found = sorted((Path.home() / ".cache" / "gen-mixin").glob("vllm-0.33.0-*.whl"))
    if not found:
        pytest.skip("vLLM 0.33.0 wheel not in ~/.cache/gen-mixin (CI downloads it)")
    return found[0]


def _registry_entries(zf: zipfile.ZipFile) -> dict[str, tuple[str, str]]:
    """vLLM's architecture -> (module, class) tables, read with ast."""
    source = zf.read("vllm/model_executor/models/registry.py")
    entries: dict[str, tuple[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(value, ast.Tuple)
                    and len(value.elts) == 2
                    and all(isinstance(e, ast.Constant) for e in value.elts)
                ):
                    module, cls = (e.value for e in value.elts)
                    if not module.startswith("vllm."):
                        module = f"vllm.model_executor.models.{module}"
                    entries[key.value] = (module, cls)
    return entries


def _defines(zf: zipfile.ZipFile, module: str, name: str) -> bool:
    base = module.replace(".", "/")
    for path in (f"{base}.py", f"{base}/__init__.py"):
        if path in zf.namelist():
            text = zf.read(path).decode()
            return bool(re.search(rf"\b{re.escape(name)}\b", text))
    return False


@pytest.mark.parametrize("stem", sorted(CATALOG))
def test_vllm_resolves_each_architecture_to_the_catalog_class(stem: str):
    host = CATALOG[stem]
    with zipfile.ZipFile(_wheel()) as zf:
        entries = _registry_entries(zf)
        for architecture in host.architectures:
            assert entries[architecture] == (host.module, host.class_name)
        assert _defines(zf, host.module, host.class_name)
