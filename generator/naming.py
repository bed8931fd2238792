"""Every name the generator derives, in one place."""

from __future__ import annotations

import keyword
import re
from pathlib import Path, PurePosixPath

TARGETS = ("vllm", "standalone")

# Where each target imports the protocol's symbols from.
PROTOCOL_MODULES: dict[str, dict[str, str]] = {
    "vllm": {
        "defs": "vllm.v1.worker.encoder_cudagraph_defs",
        "interfaces": "vllm.model_executor.models.interfaces",
        "backends": "vllm.v1.attention.backends.registry",
        "async_tensor_h2d": "vllm.utils.torch_utils",
        "scatter_output_slices": "vllm.model_executor.models.utils",
        "VllmConfig": "vllm.config",
        "MultiModalConfig": "vllm.config.multimodal",
    },
    "standalone": {
        "defs": "encoder_cudagraph_runtime.defs",
        "interfaces": "encoder_cudagraph_runtime.interfaces",
        "backends": "encoder_cudagraph_runtime.attention_backends",
        "async_tensor_h2d": "encoder_cudagraph_runtime.host_transfer",
        "scatter_output_slices": "encoder_cudagraph_runtime.output_scatter",
        "VllmConfig": "encoder_cudagraph_runtime.config",
        "MultiModalConfig": "encoder_cudagraph_runtime.config",
    },
}

FIRST_PARTY_ROOTS = {
    "vllm": ("vllm",),
    "standalone": ("encoder_cudagraph_runtime", "reference_towers", "generated"),
}


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def module_name_problem(stem: str) -> str | None:
    """Why a spec's file name cannot name its generated module, or ``None``.

    The module is imported by its name (``generated.standalone.<stem>``, or
    as a vLLM model file), so the stem must be an ASCII identifier and no
    keyword (``import`` normalises other identifiers, so a non-ASCII name can
    differ from the file's); a dunder name is Python's own (``__init__`` is
    the package itself).
    """
    if not _MODULE_NAME.match(stem):
        return (
            f"the spec's file name {stem!r} cannot name the generated module "
            "(expected ASCII letters, digits and '_', not starting with a digit)"
        )
    if keyword.iskeyword(stem):
        return (
            f"the spec's file name {stem!r} cannot name the generated module "
            "(a Python keyword)"
        )
    if stem.startswith("__") and stem.endswith("__"):
        return (
            f"the spec's file name {stem!r} cannot name the generated module "
            "(dunder names are Python's own: __init__.py is the package)"
        )
    return None


def output_path(out_dir: Path, target: str, stem: str) -> Path:
    """``generated/<target>/<spec stem>.py``."""
    return out_dir / target / f"{stem}.py"


def spec_display_path(spec: Path) -> str:
    """The spec's path as the header shows it: ``<folder>/<file>``, the same
    whichever directory the generator runs from."""
    return str(PurePosixPath(spec.parent.name or ".", spec.name))


def builder_result_name(callee_last: str, taken: set[str]) -> str:
    """A local name for a metadata builder's result: ``build_packed_vit_metadata``
    gives ``packed_vit_metadata``."""
    base = callee_last
    for prefix in ("build_", "prepare_", "get_", "make_", "compute_"):
        if base.startswith(prefix):
            base = base[len(prefix) :]
            break
    if not base.endswith("metadata"):
        base = f"{base}_metadata"
    name = base
    i = 2
    while name in taken:
        name = f"{base}_{i}"
        i += 1
    return name
