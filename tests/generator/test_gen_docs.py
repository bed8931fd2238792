"""docs/spec-format.md's field tables are the typed model's.

Each table between ``<!-- fields: <section> -->`` and ``<!-- end fields -->``
is generated from the model's key declarations
(``generator/spec/doc_tables.py``); ``GEN_MIXIN_UPDATE_GOLDEN=1`` rewrites
them.
"""

from __future__ import annotations

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
