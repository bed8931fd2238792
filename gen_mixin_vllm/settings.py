"""The plugin's settings, read from the environment of every vLLM process.

``GEN_MIXIN_MODELS``: which models get the generated mixin, as a comma
separated list of spec stems (``qwen2_vl,minimax_m3``) or ``all``; unset or
empty, none (the plugin is off). ``GEN_MIXIN_COST_AWARE``: ``1`` replaces
vLLM's encoder CUDA graph manager by the cost-aware one, ``0`` or unset keeps
vLLM's. ``GEN_MIXIN_COST_MODEL``: a cost model saved as JSON
(``CostModel.as_dict``) for the cost-aware manager to plan with.

Any other value is a :class:`PluginConfigError` naming the valid ones: a typo
must stop vLLM at start, not leave it running without the mixin.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from gen_mixin_vllm.catalog import CATALOG, UNSERVED

MODELS_VAR = "GEN_MIXIN_MODELS"
COST_AWARE_VAR = "GEN_MIXIN_COST_AWARE"
COST_MODEL_VAR = "GEN_MIXIN_COST_MODEL"
ALL = "all"
_SWITCH = {"": False, "0": False, "1": True}


class PluginConfigError(ValueError):
    """A setting of the gen-mixin plugin has a value it does not know."""


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...]
    """Enabled stems, in catalog order."""
    cost_aware: bool
    cost_model_path: str | None


def read_settings(environ: Mapping[str, str]) -> Settings:
    """The settings in ``environ``; every problem in one error."""
    problems: list[str] = []
    models = _read_models(environ.get(MODELS_VAR, ""), problems)
    switch = environ.get(COST_AWARE_VAR, "").strip()
    if switch not in _SWITCH:
        problems.append(f"{COST_AWARE_VAR}={switch!r}: expected 1 (on) or 0 (off)")
    cost_model = environ.get(COST_MODEL_VAR, "").strip() or None
    if cost_model and not _SWITCH.get(switch):
        problems.append(
            f"{COST_MODEL_VAR} is set but {COST_AWARE_VAR} is not 1: "
            "the cost model is only used by the cost-aware manager"
        )
    if problems:
        raise PluginConfigError("gen-mixin vLLM plugin: " + "; ".join(problems))
    return Settings(models, bool(_SWITCH[switch]), cost_model)


def _read_models(value: str, problems: list[str]) -> tuple[str, ...]:
    names = [name.strip() for name in value.split(",")]
    if names == [""]:
        return ()
    if ALL in names:
        if names != [ALL]:
            problems.append(f"{MODELS_VAR}={value!r}: '{ALL}' cannot be combined")
        return tuple(CATALOG)
    chosen = set()
    for name in names:
        if name in CATALOG:
            chosen.add(name)
        else:
            problems.append(f"{MODELS_VAR}: {_unknown(name)}")
    return tuple(stem for stem in CATALOG if stem in chosen)


def _unknown(name: str) -> str:
    if not name:
        return "empty name in the list"
    if name in UNSERVED:
        return f"{name!r} cannot be served by the plugin: {UNSERVED[name]}"
    close = difflib.get_close_matches(name, list(CATALOG), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"unknown model {name!r}{hint}; valid values: '{ALL}' or a comma separated "
        f"list of {', '.join(CATALOG)}"
    )
