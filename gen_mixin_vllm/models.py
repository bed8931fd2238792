"""The model classes the plugin registers with vLLM, built on first use.

vLLM's registry is given ``"gen_mixin_vllm.models:<architecture>"``: it
imports this module and reads the attribute only when a model of that
architecture is loaded or inspected, so enabling every model costs vLLM's
start no model imports. Reading ``<architecture>`` here builds

    class <vLLM's class name>(<generated mixin>, <vLLM's class>)

once per process: the generated mixin comes first in the method resolution
order, so its protocol methods replace those of vLLM's own mixin (catalog
models) or add the protocol to a class that had none; everything else is
vLLM's class, unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from gen_mixin_vllm.catalog import (
    CATALOG,
    generated_file,
    mixin_class_name,
    stem_of_architecture,
)

MIXIN_MODULE_PREFIX = "gen_mixin_vllm.mixins."
"""Where the generated modules are imported under (``generated/vllm/`` is a
folder of drop-in files, not an import package)."""

_classes: dict[str, type] = {}


def load_mixin_module(stem: str) -> ModuleType:
    """``generated/vllm/<stem>.py``, imported as ``gen_mixin_vllm.mixins.<stem>``."""
    name = MIXIN_MODULE_PREFIX + stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(str(generated_file(stem))))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def vllm_class(stem: str) -> type:
    """vLLM's own class for the model of ``stem``."""
    host = CATALOG[stem]
    return getattr(importlib.import_module(host.module), host.class_name)


def model_class(stem: str) -> type:
    """The generated mixin in front of vLLM's class (built once)."""
    if stem not in _classes:
        mixin = getattr(load_mixin_module(stem), mixin_class_name(stem))
        base = vllm_class(stem)
        _classes[stem] = type(
            base.__name__,
            (mixin, base),
            {
                "__module__": __name__,
                "__qualname__": base.__name__,
                "__doc__": f"{base.__doc__ or base.__name__}\n\nWith gen-mixin's "
                f"generated {mixin.__name__} (specs/{stem}.yaml).",
                "gen_mixin_stem": stem,
            },
        )
    return _classes[stem]


def __getattr__(name: str) -> type:
    # PEP 562: vLLM's registry reads "gen_mixin_vllm.models:<architecture>".
    try:
        stem = stem_of_architecture(name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return model_class(stem)
