"""docs/spec-format.md's field tables are the typed model's.

Each table between ``<!-- fields: <section> -->`` and ``<!-- end fields -->``
is generated from the model's key declarations
(``generator/spec/doc_tables.py``); ``GEN_MIXIN_UPDATE_GOLDEN=1`` rewrites
them.
"""

from __future__ import annotations

import re

from generator.spec.doc_tables import SECTIONS, marked_sections, update_doc
from genmixin_testlib import REPO, UPDATE, update_hint

DOC = REPO / "docs" / "spec-format.md"


def test_the_field_tables_are_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    current = update_doc(text)
    if UPDATE and current != text:
        DOC.write_text(current, encoding="utf-8")
        return
    assert current == text, update_hint("docs/spec-format.md's field tables are stale")


def test_every_section_has_its_table() -> None:
    marked = marked_sections(DOC.read_text(encoding="utf-8"))
    assert sorted(marked) == sorted(SECTIONS)


def test_every_visible_key_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    for cls in SECTIONS.values():
        for key in cls.KEYS.visible:
            assert f"| `{key.name}` |" in text, key.name


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_limits_section_states_the_caps_in_force() -> None:
    """The hand-written ``## Limits`` section quotes the caps; each figure
    must be the one the code enforces."""
    from generator.formulas import MAX_DEPTH, MAX_EXPRESSION_LENGTH, MAX_NODES
    from generator.limits import MAX_GENERATED_BYTES, MAX_INTEGER, MAX_SPEC_BYTES

    limits = " ".join(_section(DOC.read_text(encoding="utf-8"), "Limits").split())
    for stated in (
        f"at most {MAX_SPEC_BYTES // 1024} KiB",
        f"at most {MAX_EXPRESSION_LENGTH} characters, {MAX_NODES} operators and operands",
        f"{MAX_DEPTH} levels of nesting",
        f"within int64, at most {MAX_INTEGER} in magnitude",
        f"at most {MAX_GENERATED_BYTES // 1024} KiB before formatting",
    ):
        assert stated in limits, stated


def test_the_step_table_lists_the_names_allowed() -> None:
    """The ``torch.<function>``, ``torch.<dtype>``, built-in function and
    value attribute and method rows of the forward steps table name exactly
    the allow-lists the parser and the step language enforce."""
    from generator.formulas import BUILTIN_FUNCTIONS, TORCH_DTYPES, TORCH_FUNCTIONS
    from generator.spec.step_language import (
        OUTPUT_FIELDS,
        TENSOR_ATTRIBUTES,
        TENSOR_METHODS,
    )

    text = DOC.read_text(encoding="utf-8")
    for start, allowed in (
        ("| `torch.<function>`", TORCH_FUNCTIONS),
        ("| `torch.<dtype>`", TORCH_DTYPES),
        ("| built-in functions", BUILTIN_FUNCTIONS),
        ("| attributes of a value", TENSOR_ATTRIBUTES),
        ("| fields of a module's output", OUTPUT_FIELDS),
        ("| methods of a value", TENSOR_METHODS),
    ):
        row = next(line for line in text.splitlines() if line.startswith(start))
        listed = row.split("|")[1].split(":", 1)[1].split("(")[0]
        assert set(re.findall(r"`(\w+)`", listed)) == allowed, start
