"""gen-mixin's vLLM plugin (docs/using-in-vllm.md).

vLLM calls :func:`register` in each of its processes through the
``vllm.general_plugins`` entry point. This package imports neither torch nor
vLLM until a setting asks for them.
"""

from __future__ import annotations

from gen_mixin_vllm.plugin import register
from gen_mixin_vllm.settings import PluginConfigError

__all__ = ["PluginConfigError", "register"]
