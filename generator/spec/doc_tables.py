"""The field tables of ``docs/spec-format.md``, generated from the model.

Each table lists a section's keys with their type, default, the names their
formulas may use (from :data:`generator.scopes.FIELD_SCOPES`), an example and
their meaning, all from the key declarations. The doc marks where each table
goes (``<!-- fields: <section> -->`` ... ``<!-- end fields -->``);
:func:`update_doc` rewrites those blocks and ``tests/codegen/test_gen_docs.py``
keeps the committed doc current.
"""

from __future__ import annotations

import re

from generator.scopes import FIELD_SCOPES
from generator.spec.axes import CaptureAxis
from generator.spec.capture import (
    Buffer,
    Capture,
    CaptureAssert,
    CaptureTensor,
    MetadataBuilder,
)
from generator.spec.forwards import EagerForward, Postprocess, SpanAssembly, Steps
from generator.spec.host import Constant, Import
from generator.spec.inputs import InputEntry
from generator.spec.items import (
    BackendGuard,
    Budget,
    CaptureOff,
    CountSteps,
    Guards,
    Items,
)
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath
from generator.spec.reader import Key, Keys
from generator.spec.values import (
    Formula,
    ListOf,
    MapOf,
    OneOf,
    Section,
    ValueType,
)

#: Section name in the doc -> the class whose keys it lists.
SECTIONS: dict[str, type] = {
    "top-level": MixinSpec,
    "imports": Import,
    "inputs": InputEntry,
    "constants": Constant,
    "items": Items,
    "items.output_tokens": CountSteps,
    "budget": Budget,
    "guards": Guards,
    "guards.attention_backend": BackendGuard,
    "capture_off": CaptureOff,
    "capture": Capture,
    "capture.tensors": CaptureTensor,
    "capture.assert": CaptureAssert,
    "metadata": MetadataBuilder,
    "buffers": Buffer,
    "eager_forward": EagerForward,
    "postprocess": Postprocess,
    "postprocess.span_assembly": SpanAssembly,
    "paths": EncoderPath,
    "capture_axes": CaptureAxis,
}

_BLOCK = re.compile(
    r"(<!-- fields: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end fields -->)",
    re.S,
)


def _scope_of(value: ValueType) -> str:
    while isinstance(value, (ListOf, MapOf)):
        value = value.item
    if isinstance(value, OneOf):
        return "; ".join(filter(None, (_scope_of(o) for o in value.options)))
    if isinstance(value, Formula):
        return FIELD_SCOPES[value.scope_id].describe()
    if isinstance(value, Steps):
        return FIELD_SCOPES[value.scope_id].describe()
    return ""


def _default(key: Key) -> str:
    if key.required:
        return "required"
    if key.default_doc is not None:
        return key.default_doc
    if key.default is None:
        return "—"
    value = getattr(key.default, "value", key.default)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(value: ValueType) -> Section | None:
    """The section a key's value holds (directly, in a list or mapping, or as
    one option), if any."""
    if isinstance(value, Section):
        return value
    if isinstance(value, (ListOf, MapOf)):
        return _section(value.item)
    if isinstance(value, OneOf):
        return next((s for o in value.options if (s := _section(o))), None)
    return None


def _type(value: ValueType) -> str:
    section = _section(value)
    if section is None:
        return value.describe()
    title = section.cls.DOC_TITLE
    what = value.describe().replace(f"mapping ({title})", "mapping")
    return f"{what} ([`{title}`](#{_anchor(title)}))"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9_ -]", "", f"{title}".lower()).replace(" ", "-")


def table(keys: Keys, applies: bool = False) -> str:
    """A markdown table of ``keys``."""
    head = ["field"] + (["applies to"] if applies else [])
    head += ["type", "default", "names in scope", "example", "meaning"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys.visible:
        cells = [f"`{key.name}`"] + ([key.applies or "all"] if applies else [])
        cells += [
            _type(key.type),
            _default(key),
            _scope_of(key.type) or "—",
            f"`{key.example}`" if key.example else "—",
            key.doc,
        ]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def section_table(name: str) -> str:
    cls = SECTIONS[name]
    return table(cls.KEYS, applies=cls is InputEntry)


def update_doc(text: str) -> str:
    """``text`` with every marked field table regenerated."""

    def replace(match: re.Match) -> str:
        return match.group(1) + section_table(match.group("name")) + match.group(4)

    return _BLOCK.sub(replace, text)


def marked_sections(text: str) -> list[str]:
    return [m.group("name") for m in _BLOCK.finditer(text)]
