"""The plugin as vLLM 0.33.0 loads it: its entry point under
``vllm.general_plugins``, vLLM's plugin loader, and ``ModelRegistry``
resolving each enabled architecture to a class whose protocol methods are the
generated ones."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed (see tests/real_vllm)")

from tiny_models import TINY  # noqa: E402

from gen_mixin_vllm import PluginConfigError  # noqa: E402
from gen_mixin_vllm.catalog import (
    ADDS_PROTOCOL,
    CATALOG,
    mixin_class_name,
)  # noqa: E402
from gen_mixin_vllm.models import load_mixin_module, vllm_class  # noqa: E402


def _load_plugins(monkeypatch: pytest.MonkeyPatch, models: str) -> None:
    """vLLM's own loader, as each of its processes runs it at start."""
    import vllm.plugins

    monkeypatch.setenv("GEN_MIXIN_MODELS", models)
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()


def test_the_entry_point_is_installed():
    from importlib.metadata import entry_points

    (entry,) = [
        e for e in entry_points(group="vllm.general_plugins") if e.name == "gen_mixin"
    ]
    assert entry.value == "gen_mixin_vllm:register"


# The models whose vLLM class imports on a CPU build (the replay tests build
# them); the others are checked without importing vLLM's class.
@pytest.mark.parametrize("stem", sorted(TINY))
def test_the_registry_resolves_to_the_generated_methods(
    monkeypatch: pytest.MonkeyPatch, stem: str
):
    from vllm import ModelRegistry
    from vllm.model_executor.models.interfaces import (
        SupportsEncoderCudaGraph,
        supports_encoder_cudagraph,
    )

    _load_plugins(monkeypatch, stem)
    # vLLM's own class graphs its encoder, or the generated mixin adds it.
    assert supports_encoder_cudagraph(vllm_class(stem)) == (stem not in ADDS_PROTOCOL)
    mixin = getattr(load_mixin_module(stem), mixin_class_name(stem))
    # The protocol's methods that the mixin generates (host methods such as
    # get_max_frames_per_video stay the host's).
    generated = [
        name
        for name in vars(SupportsEncoderCudaGraph)
        if not name.startswith("_") and name in vars(mixin)
    ]
    assert "encoder_cudagraph_forward" in generated and len(generated) >= 8
    for architecture in CATALOG[stem].architectures:
        model_class = ModelRegistry._try_load_model_cls(architecture)
        assert model_class.__module__ == "gen_mixin_vllm.models"
        # The mixin, then vLLM's class (the protocol between them where
        # vLLM's class has none).
        mro = [c for c in model_class.__mro__[1:] if c is not SupportsEncoderCudaGraph]
        assert mro[:2] == [mixin, vllm_class(stem)]
        assert supports_encoder_cudagraph(model_class)
        for name in generated:
            assert inspect.getattr_static(model_class, name) is mixin.__dict__[name]
        # What vLLM reads of the class before it builds one is vLLM's own.
        info = ModelRegistry._try_inspect_model_cls(architecture)
        assert info is not None and info.supports_multimodal


def test_every_catalog_architecture_is_registered(monkeypatch: pytest.MonkeyPatch):
    from vllm import ModelRegistry

    _load_plugins(monkeypatch, "all")
    for stem, host in CATALOG.items():
        for architecture in host.architectures:
            registered = ModelRegistry.models[architecture]
            assert (registered.module_name, registered.class_name) == (
                "gen_mixin_vllm.models",
                architecture,
            ), stem


def test_a_bad_value_stops_vllm_at_start(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(PluginConfigError, match="did you mean 'qwen2_vl'"):
        _load_plugins(monkeypatch, "qwen2-vl")
