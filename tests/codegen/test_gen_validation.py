"""Resolver-side gaps of issue #16 item 5, each refused with exit 2 (or, for
annotations, generated so that the module imports).

Before: ``True`` / ``False`` / ``None`` as class names crashed the renderer
(exit 3); values that end in a line break passed ``$``-anchored patterns;
``// 0``, ``% 0`` and ``ceil_div(x, 0)`` generated code that always raises
(and the coverage checks skipped it); annotations such as ``int[str]``
generated a class that fails to build on import.
"""

from __future__ import annotations

import pytest

from genmixin_testlib import load_module_copy, mutated_spec, spec_problems

MM = "minimax_m3"

#: name -> (stem, (old, new) replacements, the text of one expected problem)
REFUSED = {
    "class named True": (
        MM,
        (("class_name: MiniMaxM3EncoderCudaGraphMixin", "class_name: 'True'"),),
        "class_name: 'True' is a Python keyword",
    ),
    "class named None": (
        MM,
        (("class_name: MiniMaxM3EncoderCudaGraphMixin", "class_name: None"),),
        "class_name: 'None' is a Python keyword",
    ),
    "module with a trailing line break": (
        MM,
        (
            (
                "vllm: vllm.models.minimax_m3.common.vision_tower",
                'vllm: "vllm.config\\n"',
            ),
        ),
        "imports.MiniMaxVLVisionModel.vllm: 'vllm.config\\n' is not a dotted module name",
    ),
    "buffer named with a trailing line break": (
        MM,
        (("provides: [rotary_cos,", 'provides: ["rotary_cos\\n",'),),
        "metadata[0].provides[0]: 'rotary_cos\\n' is not a valid identifier",
    ),
    "floor division by a literal zero": (
        MM,
        (("t * h * w // (merge * merge)", "t * h * w // 0"),),
        "items.output_tokens: division by zero: '//' by the literal 0 always raises",
    ),
    "modulo by a literal zero": (
        MM,
        (("budget:\n  min: 64", "budget:\n  min: 64 % 0"),),
        "budget.min: division by zero: '%' by the literal 0 always raises",
    ),
    "ceil_div by a literal zero": (
        MM,
        (("[1, merge, k * merge]", '[1, merge, "ceil_div(k, 0)"]'),),
        "capture.dummy.image_grid_thw[2]: division by zero: ceil_div by the "
        "literal 0 always raises",
    ),
    # A builder of steps whose provides is no list crashed (exit 3; found by
    # the fuzzer): null and a number are refused at the key.
    "steps' provides that is null": (
        "gemma4_mm",
        (("    provides: [gather_indices]", "    provides:"),),
        "metadata[0].provides: expected a list, got null",
    ),
    "steps' provides that is a number": (
        "gemma4_mm",
        (("    provides: [gather_indices]", "    provides: 3"),),
        "metadata[0].provides: expected a list, got integer",
    ),
    "class name that is not CamelCase": (
        MM,
        (("class_name: MiniMaxM3EncoderCudaGraphMixin", "class_name: minimax_mixin"),),
        "class_name: expected a CamelCase class name",
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused(name: str) -> None:
    stem, pairs, expected = REFUSED[name]
    problems = spec_problems(mutated_spec(stem, *pairs))
    assert expected in [p.split(": ", 1)[1] for p in problems], problems


def test_underscores_in_class_names_are_camel_case_enough() -> None:
    old = "class_name: MiniMaxM3EncoderCudaGraphMixin"
    text = mutated_spec(MM, (old, "class_name: Qwen2_5_VLEncoderCudaGraphMixin"))
    assert spec_problems(text) == []


#: Host annotations that evaluate with an error when the class body runs;
#: printed quoted, the module imports.
ANNOTATIONS = [
    "int[str]",
    "list[int][int]",
    "torch.nn.Parameter[int]",
    "None | None",
    "torch.Tensorx",
    "MiniMaxVLVisionModel | None",
]


@pytest.mark.parametrize("annotation", ANNOTATIONS)
def test_annotations_never_break_the_import(annotation: str, tmp_path) -> None:
    pytest.importorskip("torch")
    from generator.emit import render_spec

    host = "  multimodal_config: MultiModalConfig | None"
    text = mutated_spec(MM, (host, f"  extra: {annotation}\n{host}"))
    spec = tmp_path / "specs" / "annotated.yaml"
    spec.parent.mkdir()
    spec.write_text(text, encoding="utf-8")
    (rendered,) = render_spec(spec, ("standalone",), tmp_path / "out")
    module_path = tmp_path / "annotated.py"
    module_path.write_text(rendered.source, encoding="utf-8")
    module = load_module_copy(
        module_path, f"_genmixin_annotated_{abs(hash(annotation))}"
    )
    cls = module.MiniMaxM3EncoderCudaGraphMixin
    assert cls.__annotations__["extra"] == annotation
