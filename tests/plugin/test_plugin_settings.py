"""The plugin's settings and registration, with a fake registry (no vLLM):
what each value of GEN_MIXIN_MODELS / GEN_MIXIN_COST_AWARE registers, and
that every bad value stops the start with an error naming the valid ones."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from gen_mixin_vllm import PluginConfigError, register
from gen_mixin_vllm.catalog import CATALOG
from gen_mixin_vllm.settings import read_settings


class FakeRegistry:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def register_model(self, model_arch: str, model_cls: str) -> None:
        self.calls.append((model_arch, model_cls))


def _lazy(*architectures: str) -> list[tuple[str, str]]:
    return [(a, f"gen_mixin_vllm.models:{a}") for a in architectures]


# (case, environment, expected registry calls).
REGISTERS = [
    ("unset: off", {}, []),
    ("empty: off", {"GEN_MIXIN_MODELS": ""}, []),
    (
        "one model",
        {"GEN_MIXIN_MODELS": "qwen2_vl"},
        _lazy("Qwen2VLForConditionalGeneration"),
    ),
    (
        "two, spaces, catalog order, duplicates once",
        {"GEN_MIXIN_MODELS": " qwen2_vl , minimax_m3,qwen2_vl"},
        _lazy(
            "MiniMaxM3SparseForConditionalGeneration",
            "Qwen2VLForConditionalGeneration",
        ),
    ),
    (
        "an architecture name that is not the class name",
        {"GEN_MIXIN_MODELS": "lfm2_vl", "GEN_MIXIN_COST_AWARE": "0"},
        _lazy("Lfm2VlForConditionalGeneration"),
    ),
    (
        "all",
        {"GEN_MIXIN_MODELS": "all"},
        _lazy(*(a for host in CATALOG.values() for a in host.architectures)),
    ),
]


@pytest.mark.parametrize(
    ("environ", "calls"), [c[1:] for c in REGISTERS], ids=[c[0] for c in REGISTERS]
)
def test_registers(environ: dict[str, str], calls: list[tuple[str, str]]):
    registry = FakeRegistry()
    register(registry, environ)
    assert registry.calls == calls


# (case, environment, fragments the one error must hold).
ERRORS = [
    (
        "a typo",
        {"GEN_MIXIN_MODELS": "qwen2vl"},
        ["unknown model 'qwen2vl'", "did you mean 'qwen2_vl'?", "'all'", "minimax_m3"],
    ),
    (
        "an architecture name instead of a stem",
        {"GEN_MIXIN_MODELS": "Qwen2VLForConditionalGeneration"},
        ["unknown model 'Qwen2VLForConditionalGeneration'", "valid values"],
    ),
    ("an empty list entry", {"GEN_MIXIN_MODELS": "qwen2_vl,"}, ["empty name"]),
    ("all with others", {"GEN_MIXIN_MODELS": "all,qwen2_vl"}, ["cannot be combined"]),
    (
        "a model the plugin cannot serve",
        {"GEN_MIXIN_MODELS": "minicpmv"},
        ["'minicpmv' cannot be served", "dispatcher"],
    ),
    ("cost-aware: a word", {"GEN_MIXIN_COST_AWARE": "yes"}, ["expected 1 (on) or 0"]),
    (
        "a cost model without the option",
        {"GEN_MIXIN_COST_MODEL": "/tmp/model.json"},
        ["GEN_MIXIN_COST_AWARE is not 1"],
    ),
    (
        "a calibration bound that is not a number",
        {
            "GEN_MIXIN_COST_AWARE": "1",
            "GEN_MIXIN_COST_MODEL": "calibrate",
            "GEN_MIXIN_CALIBRATION_LIMIT_MS": "10s",
        },
        ["GEN_MIXIN_CALIBRATION_LIMIT_MS='10s': expected a positive number"],
    ),
    (
        "a calibration bound of zero",
        {
            "GEN_MIXIN_COST_AWARE": "1",
            "GEN_MIXIN_COST_MODEL": "calibrate",
            "GEN_MIXIN_CALIBRATION_LIMIT_MS": "0",
        },
        ["GEN_MIXIN_CALIBRATION_LIMIT_MS='0': expected a positive number"],
    ),
    (
        "an infinite calibration bound",
        {
            "GEN_MIXIN_COST_AWARE": "1",
            "GEN_MIXIN_COST_MODEL": "calibrate",
            "GEN_MIXIN_CALIBRATION_LIMIT_MS": "inf",
        },
        ["expected a positive number"],
    ),
    (
        "a calibration bound without calibrating",
        {
            "GEN_MIXIN_COST_AWARE": "1",
            "GEN_MIXIN_COST_MODEL": "m.json",
            "GEN_MIXIN_CALIBRATION_LIMIT_MS": "5000",
        },
        ["GEN_MIXIN_COST_MODEL is not 'calibrate'"],
    ),
    (
        "calibrate without the option",
        {"GEN_MIXIN_COST_MODEL": "calibrate"},
        ["GEN_MIXIN_COST_AWARE is not 1"],
    ),
    (
        "every problem at once",
        {"GEN_MIXIN_MODELS": "qwen2_vl,nope", "GEN_MIXIN_COST_AWARE": "2"},
        ["'nope'", "GEN_MIXIN_COST_AWARE='2'"],
    ),
]


@pytest.mark.parametrize(
    ("environ", "fragments"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS]
)
def test_bad_values_stop_the_start(environ: dict[str, str], fragments: list[str]):
    registry = FakeRegistry()
    with pytest.raises(PluginConfigError) as raised:
        register(registry, environ)
    for fragment in fragments:
        assert fragment in str(raised.value)
    assert registry.calls == []


def test_settings_read():
    settings = read_settings(
        {"GEN_MIXIN_COST_AWARE": "1", "GEN_MIXIN_COST_MODEL": " m.json "}
    )
    assert (settings.models, settings.cost_aware) == ((), True)
    assert settings.cost_model_path == "m.json"


# (case, environment, (cost model path, calibrate, calibration bound)).
COST_MODELS = [
    ("none", {"GEN_MIXIN_COST_AWARE": "1"}, (None, False, None)),
    (
        "a file",
        {"GEN_MIXIN_COST_AWARE": "1", "GEN_MIXIN_COST_MODEL": "m.json"},
        ("m.json", False, None),
    ),
    (
        "calibrate, the default bound",
        {"GEN_MIXIN_COST_AWARE": "1", "GEN_MIXIN_COST_MODEL": " calibrate "},
        (None, True, None),
    ),
    (
        "calibrate within 2.5 s",
        {
            "GEN_MIXIN_COST_AWARE": "1",
            "GEN_MIXIN_COST_MODEL": "calibrate",
            "GEN_MIXIN_CALIBRATION_LIMIT_MS": "2500",
        },
        (None, True, 2500.0),
    ),
]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [c[1:] for c in COST_MODELS],
    ids=[c[0] for c in COST_MODELS],
)
def test_cost_model_settings(environ: dict[str, str], expected: tuple):
    settings = read_settings(environ)
    got = (settings.cost_model_path, settings.calibrate, settings.calibration_limit_ms)
    assert got == expected


def test_the_log_line_says_what_was_registered(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="vllm.gen_mixin"):
        register(FakeRegistry(), {"GEN_MIXIN_MODELS": "qwen2_vl"})
        register(FakeRegistry(), {})
    first, second = (r.getMessage() for r in caplog.records)
    assert first == (
        "gen-mixin plugin: generated mixins registered for "
        "Qwen2VLForConditionalGeneration (qwen2_vl: Qwen2VLEncoderCudaGraphMixin)"
    )
    assert second == "gen-mixin plugin: off (GEN_MIXIN_MODELS is not set)"


def test_the_plugin_imports_neither_torch_nor_vllm():
    # vLLM loads the entry point in every process, the API server included.
    code = (
        "import sys, gen_mixin_vllm, gen_mixin_vllm.models\n"
        "gen_mixin_vllm.register(type('R', (), {'register_model': "
        "lambda self, a, c: None})(), {'GEN_MIXIN_MODELS': 'all'})\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
