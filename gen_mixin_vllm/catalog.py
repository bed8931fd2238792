"""Which vLLM model class each generated mixin goes in front of.

The one table of the plugin: for each spec stem, the vLLM 0.33.0 class that
hosts the model's vision encoder and the architecture names vLLM's
``ModelRegistry`` knows it by. The mixin's own class is not stated here: it is
the one class a generated module defines (``generated/vllm/<stem>.py``), read
with ``ast`` so that this module imports neither torch nor vLLM.

Stems whose generated module exists but that the plugin cannot serve are in
:data:`UNSERVED`, each with its reason; ``tests/plugin/test_plugin_catalog.py``
checks that every generated module is in exactly one of the two tables.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable


@dataclass(frozen=True)
class VllmHost:
    """The vLLM class a mixin is put in front of."""

    module: str
    class_name: str
    architectures: tuple[str, ...]
    """The names of ``architectures`` in a model's ``config.json`` that
    vLLM 0.33.0 resolves to this class (subclasses under other names keep
    vLLM's own mixin: their overrides were not checked against a generated
    one)."""


def _host(module: str, class_name: str, *architectures: str) -> VllmHost:
    if not module.startswith("vllm."):
        module = f"vllm.model_executor.models.{module}"
    return VllmHost(module, class_name, architectures or (class_name,))


CATALOG: dict[str, VllmHost] = {
    "cohere2_vision": _host("cohere2_vision", "Cohere2VisionForConditionalGeneration"),
    "cohere_compass": _host("cohere_compass", "CohereCompassForConditionalGeneration"),
    "deepseek_ocr": _host("deepseek_ocr", "DeepseekOCRForCausalLM"),
    "deepseek_v41": _host("vllm.models.deepseek_v41", "DeepseekV41ForCausalLM"),
    "deepseek_vl2": _host("deepseek_vl2", "DeepseekVLV2ForCausalLM"),
    "dots_ocr": _host("dots_ocr", "DotsOCRForCausalLM"),
    "eagle2_5_vl": _host("eagle2_5_vl", "Eagle2_5_VLForConditionalGeneration"),
    "ernie45_vl": _host("ernie45_vl", "Ernie4_5_VLMoeForConditionalGeneration"),
    "gemma3_mm": _host("gemma3_mm", "Gemma3ForConditionalGeneration"),
    "gemma4_mm": _host("gemma4_mm", "Gemma4ForConditionalGeneration"),
    "glm4_1v": _host("glm4_1v", "Glm4vForConditionalGeneration"),
    "glm5_next": _host("vllm.models.glm5next", "Glm5NextForConditionalGeneration"),
    "idefics3": _host("idefics3", "Idefics3ForConditionalGeneration"),
    "internvl": _host("internvl", "InternVLChatModel"),
    "kimi_k25": _host("kimi_k25", "KimiK25ForConditionalGeneration"),
    "kimi_k3": _host("vllm.models.kimi_k3", "KimiK3ForConditionalGeneration"),
    "kimi_vl": _host("kimi_vl", "KimiVLForConditionalGeneration"),
    "lfm2_vl": _host(
        "lfm2_vl", "Lfm2VLForConditionalGeneration", "Lfm2VlForConditionalGeneration"
    ),
    "llava_next": _host("llava_next", "LlavaNextForConditionalGeneration"),
    "minimax_m3": _host(
        "vllm.models.minimax_m3", "MiniMaxM3SparseForConditionalGeneration"
    ),
    "mistral3": _host("mistral3", "Mistral3ForConditionalGeneration"),
    "mllama4": _host("mllama4", "Llama4ForConditionalGeneration"),
    "pixtral": _host("pixtral", "PixtralForConditionalGeneration"),
    "paddleocr_vl": _host("paddleocr_vl", "PaddleOCRVLForConditionalGeneration"),
    "phi3v": _host("phi3v", "Phi3VForCausalLM"),
    "phi4mm": _host("phi4mm", "Phi4MMForCausalLM"),
    "paligemma": _host("paligemma", "PaliGemmaForConditionalGeneration"),
    "qwen2_5_omni": _host(
        "qwen2_5_omni_thinker",
        "Qwen2_5OmniThinkerForConditionalGeneration",
        "Qwen2_5OmniModel",
        "Qwen2_5OmniForConditionalGeneration",
    ),
    "qwen2_5_vl": _host("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "qwen3_omni": _host(
        "qwen3_omni_moe_thinker",
        "Qwen3OmniMoeThinkerForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
    ),
    "qwen2_vl": _host("qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "qwen3_vl": _host("qwen3_vl", "Qwen3VLForConditionalGeneration"),
    "skyworkr1v": _host("skyworkr1v", "SkyworkR1VChatModel"),
    "step3_vl": _host("step3_vl", "Step3VLForConditionalGeneration"),
}

ADDS_PROTOCOL: frozenset[str] = frozenset(
    {
        "cohere2_vision",
        "dots_ocr",
        "eagle2_5_vl",
        "llava_next",
        "mistral3",
        "paddleocr_vl",
        "paligemma",
        "phi3v",
        "phi4mm",
        "pixtral",
        "qwen2_5_omni",
        "qwen3_omni",
        "skyworkr1v",
    }
)
"""The models beyond vLLM's catalog: their vLLM class has no encoder CUDA
graph protocol of its own, and the generated mixin adds it
(docs/beyond-catalog.md). For the others the mixin replaces vLLM's."""

UNSERVED: dict[str, str] = {
    "minicpmv": (
        "vLLM registers the architecture 'MiniCPMV' to a dispatcher class whose "
        "__new__ returns an instance of one of three version classes "
        "(MiniCPMV2_5, MiniCPMV2_6, MiniCPMV4_0), so a subclass of it never "
        "reaches the model; drop the generated file into vLLM instead"
    ),
}


def generated_file(stem: str) -> Traversable:
    """``generated/vllm/<stem>.py`` as installed with the package."""
    return files("generated") / "vllm" / f"{stem}.py"


def generated_stems() -> list[str]:
    """The stems of every generated vLLM module shipped with the package."""
    folder = files("generated") / "vllm"
    return sorted(
        entry.name.removesuffix(".py")
        for entry in folder.iterdir()
        if entry.name.endswith(".py") and not entry.name.startswith("_")
    )


@cache
def mixin_class_name(stem: str) -> str:
    """The one class ``generated/vllm/<stem>.py`` defines: the mixin."""
    tree = ast.parse(generated_file(stem).read_text(encoding="utf-8"))
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    if len(classes) != 1:
        raise ValueError(
            f"generated/vllm/{stem}.py defines {len(classes)} classes "
            f"({', '.join(classes) or 'none'}); the plugin expects one, the mixin"
        )
    return classes[0]


def stem_of_architecture(architecture: str) -> str:
    """The catalog stem whose host vLLM knows by ``architecture``."""
    for stem, host in CATALOG.items():
        if architecture in host.architectures:
            return stem
    raise AttributeError(f"no gen-mixin model has the architecture {architecture!r}")
