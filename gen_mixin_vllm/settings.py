"""The plugin's settings, read from the environment of every vLLM process.

``GEN_MIXIN_MODELS``: which models get the generated mixin, as a comma
separated list of spec stems (``qwen2_vl,minimax_m3``) or ``all``; unset or
empty, none (the plugin is off). ``GEN_MIXIN_COST_AWARE``: ``1`` replaces
vLLM's encoder CUDA graph manager by the cost-aware one, ``0`` or unset keeps
vLLM's. ``GEN_MIXIN_COST_MODEL``: a cost model saved as JSON
(``CostModel.as_dict``) for the cost-aware manager to plan with, or
``calibrate``: the manager times the model itself after vLLM's capture,
within ``GEN_MIXIN_CALIBRATION_LIMIT_MS`` milliseconds (a positive number;
unset, the runtime's default bound).

Any other value is a :class:`PluginConfigError` naming the valid ones: a typo
must stop vLLM at start, not leave it running without the mixin.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass

from gen_mixin_vllm.catalog import CATALOG, UNSERVED

MODELS_VAR = "GEN_MIXIN_MODELS"
COST_AWARE_VAR = "GEN_MIXIN_COST_AWARE"
COST_MODEL_VAR = "GEN_MIXIN_COST_MODEL"
CALIBRATION_LIMIT_VAR = "GEN_MIXIN_CALIBRATION_LIMIT_MS"
CALIBRATE = "calibrate"
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
    """A saved cost model; ``None`` without one or when calibrating."""
    calibrate: bool = False
    """Calibrate the cost model in vLLM, after its capture."""
    calibration_limit_ms: float | None = None
    """The calibration's bound; ``None``: the runtime's default."""


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
    calibrate = cost_model == CALIBRATE
    limit = _read_limit(environ.get(CALIBRATION_LIMIT_VAR, "").strip(), problems)
    if limit is not None and not calibrate:
        problems.append(
            f"{CALIBRATION_LIMIT_VAR} is set but {COST_MODEL_VAR} is not "
            f"'{CALIBRATE}': the bound is only used by a calibration in vLLM"
        )
    if problems:
        raise PluginConfigError("gen-mixin vLLM plugin: " + "; ".join(problems))
    return Settings(
        models,
        bool(_SWITCH[switch]),
        None if calibrate else cost_model,
        calibrate,
        limit,
    )


def _read_limit(value: str, problems: list[str]) -> float | None:
    if not value:
        return None
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if not (0 < limit < math.inf):
        problems.append(
            f"{CALIBRATION_LIMIT_VAR}={value!r}: expected a positive number of "
            "milliseconds"
        )
        return None
    return limit


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
