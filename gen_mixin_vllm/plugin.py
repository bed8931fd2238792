"""What the plugin does when vLLM loads it (in every vLLM process)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol

from gen_mixin_vllm.catalog import CATALOG, mixin_class_name
from gen_mixin_vllm.settings import MODELS_VAR, Settings, read_settings

# A child of vLLM's logger, so that its lines appear with vLLM's own.
logger = logging.getLogger("vllm.gen_mixin")

MODELS_MODULE = "gen_mixin_vllm.models"


class Registry(Protocol):
    """The part of vLLM's ``ModelRegistry`` the plugin uses."""

    def register_model(self, model_arch: str, model_cls: Any) -> None: ...


def register(
    registry: Registry | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Register the enabled models with ``registry`` (vLLM's
    ``ModelRegistry``) and, when asked, the cost-aware manager. Safe to call
    more than once; raises ``PluginConfigError`` for a bad setting."""
    settings = read_settings(os.environ if environ is None else environ)
    if not settings.models and not settings.cost_aware:
        logger.info("gen-mixin plugin: off (%s is not set)", MODELS_VAR)
        return settings
    if settings.models and registry is None:
        from vllm import ModelRegistry

        registry = ModelRegistry
    registered = []
    for stem in settings.models:
        mixin = mixin_class_name(stem)  # a missing or odd module fails here
        for architecture in CATALOG[stem].architectures:
            registry.register_model(architecture, f"{MODELS_MODULE}:{architecture}")
            registered.append(f"{architecture} ({stem}: {mixin})")
    if registered:
        logger.info(
            "gen-mixin plugin: generated mixins registered for %s",
            ", ".join(registered),
        )
    if settings.cost_aware:
        from gen_mixin_vllm.cost_aware_manager import install

        install(
            settings.cost_model_path,
            settings.calibrate,
            settings.calibration_limit_ms,
        )
    return settings
