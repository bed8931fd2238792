"""Names a spec declares against the names the generated code binds.

Each case mutates one of the project's specs so that a spec name would be
bound by a generated method for its own use. Before the scope table, each of
the first three generated and exited 0 with wrong code (issue #16 item 2):
the constant ``backend`` became the attention-backend enum member in
``out_hidden_size``, ``vllm_config`` replaced the budget range's parameter,
and an eager step target overwrote the per-item row offsets.
"""

from __future__ import annotations

import re

import pytest

from genmixin_testlib import mutated_spec, spec_problems

#: name -> (stem, (old, new) replacements, pattern one diagnostic matches)
COLLISIONS = {
    "constant named like the backend local": (
        "minimax_m3",
        (
            (
                "  merge: {from:",
                "  backend: {from: vision_tower.out_hidden_size}\n  merge: {from:",
            ),
            (
                "out_hidden_size: vision_tower.out_hidden_size",
                "out_hidden_size: backend",
            ),
        ),
        r"constants\.backend: constant 'backend' collides with the local 'backend' "
        r"that get_encoder_cudagraph_config binds",
    ),
    "constant named like a method parameter": (
        "minimax_m3",
        (
            (
                "  merge: {from:",
                "  vllm_config: {from: vision_tower.out_hidden_size, default: 64}\n  merge: {from:",
            ),
            ("budget:\n  min: 64", "budget:\n  min: vllm_config"),
        ),
        r"constant 'vllm_config' collides with the parameter 'vllm_config' that "
        r"get_encoder_cudagraph_budget_range binds",
    ),
    "eager step target named like a row offset": (
        "deepseek_v41",
        (
            (
                "    - vit_out = vision(patches, h, w)\n    - aligner(vit_out, h, w)",
                "    - patches_offset = vision(patches, h, w)\n    - aligner(patches_offset, h, w)",
            ),
        ),
        r"eager_forward\.steps\[0\]: eager_forward step 'patches_offset' collides "
        r"with the local 'patches_offset' that encoder_eager_forward binds",
    ),
    "dim named like a capture local": (
        "minimax_m3",
        (
            ("dims: [t, h, w]", "dims: [t, h, offsets]"),
            ("t * h * w\n", "t * h * offsets\n"),
            ("t * h * w //", "t * h * offsets //"),
        ),
        r"dim 'offsets' collides with the local 'offsets' that "
        r"prepare_encoder_cudagraph_capture_inputs binds",
    ),
    "grid key named like a postprocess local": (
        "deepseek_v41",
        (
            ("  llm_grid: {kind: grid", "  table: {kind: grid"),
            ("    llm_grid: [1,", "    table: [1,"),
        ),
        r"grid input 'table' collides with the local 'table' that "
        r"postprocess_encoder_output binds",
    ),
    "import named like a replay local": (
        "deepseek_v41",
        (
            (
                "  build_packed_merge_metadata: {",
                "  keys: {vllm: vllm.config, standalone: reference_towers.deepseek_v4}\n  build_packed_merge_metadata: {",
            ),
        ),
        r"import 'keys' collides with the local 'keys'",
    ),
}


@pytest.mark.parametrize("name", list(COLLISIONS))
def test_a_collision_is_refused_naming_both(name: str) -> None:
    stem, pairs, pattern = COLLISIONS[name]
    problems = spec_problems(mutated_spec(stem, *pairs))
    assert any(re.search(pattern, p) for p in problems), problems


#: Names that live in different methods do not collide.
ALLOWED = {
    "dim named n (only helpers bind n)": (
        "minimax_m3",
        (
            ("dims: [t, h, w]", "dims: [t, h, n]"),
            ("t * h * w\n", "t * h * n\n"),
            ("t * h * w //", "t * h * n //"),
        ),
    ),
    "flat input named types (postprocess reads it by key)": ("deepseek_v41", ()),
    "constant named sizes (only _select_rows binds sizes)": (
        "minimax_m3",
        (
            (
                "  merge: {from:",
                "  sizes: vision_tower.out_hidden_size\n  merge: {from:",
            ),
        ),
    ),
}


@pytest.mark.parametrize("name", list(ALLOWED))
def test_names_in_other_methods_are_allowed(name: str) -> None:
    stem, pairs = ALLOWED[name]
    assert spec_problems(mutated_spec(stem, *pairs)) == []
