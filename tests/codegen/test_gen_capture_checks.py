"""The generated capture re-checks, for the budget it captures, what the
static checks prove: the dummy batch covers the budget, ``max_seqlen`` holds
the longest sequence, the offsets fit their slots.

Each case is MiniMax M3's spec wrong only at budget 320: no sampled budget
and no budget of vLLM's default ladder, so generation accepts it (a user's
``encoder_cudagraph_token_budgets`` may still name it). The module is
generated into a temporary folder and its capture run on CPU with a host
that holds only the constants: the checks come before anything is
allocated, so at budget 320 the capture raises a ``ValueError`` naming the
budget, and at 256 it gets past them to the tower's metadata builder.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from genmixin_testlib import load_generated_mixin, mutated_spec, run_main
from host_modules import ModuleOf

DUMMY = "[1, merge, k * merge]"
MAX_SEQLEN = "max_seqlen_override: rows}"
SLOTS = "slots: max_batch_size + 2}"

#: (case, mutation of specs/minimax_m3.yaml, what the message says at 320)
CASES = {
    "dummy short of the budget": (
        (DUMMY, '[1, merge, "k * merge - (token_budget == 320)"]'),
        "the dummy batch's count of budget tokens is 319 where at least 320",
    ),
    "max_seqlen below the longest sequence": (
        (MAX_SEQLEN, 'max_seqlen_override: "1 if token_budget == 320 else rows"}'),
        "max_seqlen is 1 where at least 1280",
    ),
    "no spare slot for the padding sequence": (
        (SLOTS, 'slots: "max_batch_size + 2 - (token_budget == 320)"}'),
        "the count of cu_seqlens's slots is 2 where at least 3",
    ),
}


class BuilderReached(Exception):
    """The capture got past its checks to the tower's metadata builder."""


def _host(module):
    def prepare_encoder_metadata(*args, **kwargs):
        raise BuilderReached

    embeddings = ModuleOf(num_channels=3, temporal_patch_size=2, patch_size=2)
    vision_model = ModuleOf(
        embeddings=embeddings,
        prepare_encoder_metadata=ModuleOf(prepare_encoder_metadata),
    )
    tower = ModuleOf(spatial_merge_size=2, vision_model=vision_model, dtype=None)
    host = module.MiniMaxM3EncoderCudaGraphMixin.__new__(
        module.MiniMaxM3EncoderCudaGraphMixin
    )
    host.vision_tower = tower
    host.multimodal_config = None
    return host


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Each case's modules, both targets: ``(folder, module name)``."""
    out = {}
    for case, (pair, _) in CASES.items():
        name = "minimax_" + re.sub(r"\W+", "_", case)
        folder = tmp_path_factory.mktemp(name)
        spec = folder / f"{name}.yaml"
        spec.write_text(mutated_spec("minimax_m3", pair), encoding="utf-8")
        rc, _, err = run_main([str(spec), "--out", str(folder)])
        assert rc == 0, err  # budget 320 is neither sampled nor on the ladder
        out[case] = folder, name
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_capture_refuses_a_budget_the_static_checks_did_not_see(generated, case):
    import torch

    _, said = CASES[case]
    out, name = generated[case]
    module = load_generated_mixin(out / "standalone" / f"{name}.py", f"_{name}")
    host = _host(module)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError) as info:
        host.prepare_encoder_cudagraph_capture_inputs(320, 1, 1, cpu, torch.float32)
    message = str(info.value)
    assert "MiniMax M3: at token_budget 320 with max_batch_size 1" in message
    assert said in message
    with pytest.raises(BuilderReached):
        host.prepare_encoder_cudagraph_capture_inputs(256, 1, 1, cpu, torch.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_both_targets_print_the_same_checks(generated, case):
    out, name = generated[case]

    def checks(target: str) -> list[str]:
        text = (out / target / f"{name}.py").read_text(encoding="utf-8")
        capture = text.split("def prepare_encoder_cudagraph_capture_inputs")[1]
        capture = capture.split("\n    def ")[0]
        return re.findall(r"\n        (?:held, needed =|if) .*", capture)

    assert checks("vllm") == checks("standalone")
    assert any("held, needed =" in c for c in checks("vllm"))


# -- a unit capture: LFM2-VL's tiles -----------------------------------------------

UNITS = "  units: ceil_div(token_budget, m)\n"
UNIT_DUMMY = '    spatial_shapes: [f, "min(token_budget - unit_index * m, m) * f"]'
CAPTURE_VALUE = "capture_value: token_budget * f**2}"

#: (case, mutation of specs/lfm2_vl.yaml, what the message says at 320)
UNIT_CASES = {
    "a unit short of the budget": (
        (UNITS, '  units: "ceil_div(token_budget, m) - (token_budget == 320)"\n'),
        "the dummy units' count of budget tokens is 256 where at least 320",
    ),
    "a dummy unit narrower than it should be": (
        (
            UNIT_DUMMY,
            '    spatial_shapes: [f, "min(token_budget - unit_index * m, m) * f'
            ' - f * (token_budget == 320) * (unit_index == 0)"]',
        ),
        "the dummy units' count of budget tokens is 319 where at least 320",
    ),
    "max_seqlen below the longest unit": (
        (
            CAPTURE_VALUE,
            'capture_value: "1 if token_budget == 320 else token_budget * f**2"}',
        ),
        "max_seqlen is 1 where at least 256",
    ),
}


class UnitsReached(Exception):
    """The capture got past its checks to allocating the tiles' pixels."""


class _Weight:
    shape = (1024, 768)

    @property
    def dtype(self):
        raise UnitsReached


def _lfm2_host(module):
    embeddings = ModuleOf(
        patch_embedding=ModuleOf(weight=_Weight()), position_embedding_size=16
    )
    tower = ModuleOf(vision_model=ModuleOf(embeddings=embeddings))
    cls = module.Lfm2VLEncoderCudaGraphMixin
    host = cls.__new__(cls)
    host.vision_tower = tower
    host.multi_modal_projector = ModuleOf(factor=2)
    host.config = SimpleNamespace(min_image_tokens=64)
    host.multimodal_config = SimpleNamespace(mm_processor_kwargs=None)
    return host


@pytest.mark.parametrize("case", list(UNIT_CASES))
def test_a_unit_capture_refuses_a_budget_the_static_checks_did_not_see(case, tmp_path):
    import torch

    pair, said = UNIT_CASES[case]
    name = "lfm2_" + re.sub(r"\W+", "_", case)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(mutated_spec("lfm2_vl", pair), encoding="utf-8")
    rc, _, err = run_main([str(spec), "--out", str(tmp_path)])
    assert rc == 0, err  # budget 320 is neither sampled nor on the ladder
    module = load_generated_mixin(tmp_path / "standalone" / f"{name}.py", f"_{name}")
    host = _lfm2_host(module)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError) as info:
        host.prepare_encoder_cudagraph_capture_inputs(320, 1, 1, cpu, torch.float32)
    assert "LFM2-VL: at token_budget 320 with max_batch_size 1" in str(info.value)
    assert said in str(info.value)
    with pytest.raises(UnitsReached):
        host.prepare_encoder_cudagraph_capture_inputs(256, 1, 1, cpu, torch.float32)
    vllm, standalone = (
        (tmp_path / t / f"{name}.py").read_text(encoding="utf-8")
        for t in ("vllm", "standalone")
    )
    assert re.findall(r"held, needed = .*", vllm) == re.findall(
        r"held, needed = .*", standalone
    )
