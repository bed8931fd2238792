"""The oracle check of every spec beyond vLLM's catalog (``beyond_testlib``),
one row per case of each model's table (``beyond_cases.CASES``): in each of
the oracle's forms, the generated mixin through each manager matches vLLM's
eager path item by item; each backend the spec guards is refused before any
capture; and each wrong spec, and each wrong module no spec can ask for,
fails the check in every form that shows it."""

from __future__ import annotations

import pytest

from beyond_cases import CASES
from beyond_hosts import ORACLES
from beyond_testlib import (
    Mutation,
    OracleCases,
    OracleModel,
    backend_refusal,
    edited_module_source,
    mutated_source,
    oracle_problems,
)


def _cases(stem: str) -> OracleCases:
    """``stem``'s table (a model without one: the plain check, no mutations;
    test_every_oracle_has_its_table_of_cases fails)."""
    return CASES.get(stem, OracleCases())


def _oracle(stem: str, form: str) -> OracleModel:
    return ORACLES[stem](**_cases(stem).forms[form])


def _name(stem: str, form: str) -> str:
    return f"{stem} ({form})" if form else stem


MATCHES = [
    pytest.param(stem, form, manager, id=f"{_name(stem, form)}-{manager}")
    for stem in ORACLES
    for form in _cases(stem).forms
    for manager in _cases(stem).managers
]

REFUSALS = [
    pytest.param(stem, backend, id=f"{stem}-{backend}")
    for stem in ORACLES
    for backend in _cases(stem).refused
]


def _wrong(table: str) -> list:
    """(stem, form, mutation) of every mutation of ``table`` (an
    :class:`OracleCases` field) in each form that shows it."""
    return [
        pytest.param(stem, form, mutation, id=f"{_name(stem, form)}-{mutation.why}")
        for stem in ORACLES
        for mutation in getattr(_cases(stem), table)
        for form in _cases(stem).forms
        if not mutation.forms or form in mutation.forms
    ]


def test_every_oracle_has_its_table_of_cases() -> None:
    assert sorted(CASES) == sorted(ORACLES)
    for stem, cases in CASES.items():
        assert cases.spec_mutations, f"{stem}: no wrong spec to catch"
        named = {
            form for m in cases.spec_mutations + cases.module_edits for form in m.forms
        }
        assert named <= set(cases.forms), f"{stem}: forms {named - set(cases.forms)}"


@pytest.mark.parametrize(("stem", "form", "manager"), MATCHES)
def test_graphs_and_eager_forward_match_vllms_eager_path(stem, form, manager) -> None:
    assert oracle_problems(_oracle(stem, form), manager=manager) == []


@pytest.mark.parametrize(("stem", "backend"), REFUSALS)
def test_a_guarded_backend_is_refused_before_any_capture(stem, backend) -> None:
    model = _oracle(stem, next(iter(_cases(stem).forms)))
    message = backend_refusal(model, backend)
    assert message is not None and "--mm-encoder-attn-backend FLASH_ATTN" in message
    assert backend_refusal(model, "FLASH_ATTN") is None


@pytest.mark.parametrize(("stem", "form", "mutation"), _wrong("spec_mutations"))
def test_a_wrong_spec_fails_the_check(stem, form, mutation: Mutation, tmp_path) -> None:
    source = mutated_source(stem, mutation.old, mutation.new, tmp_path)
    assert oracle_problems(_oracle(stem, form), source), mutation.why


@pytest.mark.parametrize(("stem", "form", "mutation"), _wrong("module_edits"))
def test_a_wrong_module_fails_the_check(stem, form, mutation: Mutation) -> None:
    source = edited_module_source(stem, mutation.old, mutation.new)
    assert oracle_problems(_oracle(stem, form), source), mutation.why
