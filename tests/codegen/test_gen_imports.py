"""What each target may import (``generator/import_rules.py``).

The standalone target imports only modules and names this project defines
(read with ``ast``); the vllm target only modules under ``vllm`` (by dotted
components) and, with the offline manifest of vLLM 0.33.0, only modules it
lists and names they define. Before, a standalone name that does not exist
and a module such as ``vllmx.evil`` generated (exit 0) and the module failed
on import.
"""

from __future__ import annotations

import pytest
from genmixin_testlib import mutated_spec, spec_problems

from generator.import_rules import import_problem

#: (target, module, name) -> the problem, or None when allowed.
RULES = {
    ("standalone", "reference_towers.deepseek_v4", "build_packed_vit_metadata"): None,
    ("standalone", "reference_towers.deepseek_v4", "IMAGE_END"): None,
    ("standalone", "encoder_cudagraph_runtime.defs", "EncoderItemSpec"): None,
    ("standalone", "reference_towers.deepseek_v4", "build_packed_vit_metadata2"): (
        "reference_towers.deepseek_v4 defines no 'build_packed_vit_metadata2' "
        "(this project)"
    ),
    ("standalone", "reference_towers.deepseek_v5", "X"): (
        "no module 'reference_towers.deepseek_v5' in this project"
    ),
    ("standalone", "vllm.config", "VllmConfig"): (
        "module 'vllm.config' is not a module of the standalone target "
        "(expected one under: encoder_cudagraph_runtime, reference_towers)"
    ),
    ("standalone", "reference_towersx.evil", "X"): (
        "module 'reference_towersx.evil' is not a module of the standalone target "
        "(expected one under: encoder_cudagraph_runtime, reference_towers)"
    ),
    ("vllm", "vllmx.evil", "X"): (
        "module 'vllmx.evil' is not a module of the vllm target "
        "(expected one under: vllm)"
    ),
}


@pytest.mark.parametrize("case", list(RULES), ids=[":".join(c) for c in RULES])
def test_import_rule(case) -> None:
    assert import_problem(*case) == RULES[case]


def test_vllm_imports_are_checked_against_the_manifest() -> None:
    """The vllm target's rule is the offline manifest's (its own tests check
    the manifest against the wheel)."""
    assert import_problem("vllm", "vllm.config", "VllmConfig") is None
    assert import_problem("vllm", "vllm.config", "Nope") == (
        "vLLM 0.33.0's module 'vllm.config' defines no name 'Nope'"
    )
    assert import_problem("vllm", "vllm.no_such", "X") == (
        "vLLM 0.33.0 has no module 'vllm.no_such'"
    )


def test_a_spec_importing_a_missing_name_is_refused() -> None:
    text = mutated_spec(
        "deepseek_v41",
        (
            "  build_packed_merge_metadata: {vllm: vllm.models.deepseek_v4.common.vision, standalone: reference_towers.deepseek_v4}",
            "  build_packed_merge_metadata: {vllm: vllm.models.deepseek_v4.common.vision, standalone: reference_towers.deepseek_v4s}",
        ),
    )
    (problem,) = spec_problems(text)
    assert problem.endswith(
        "imports.build_packed_merge_metadata.standalone: no module "
        "'reference_towers.deepseek_v4s' in this project"
    )
