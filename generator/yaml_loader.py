"""YAML loading that keeps the position of every value.

``yaml.safe_load`` forgets where a value came from and silently keeps the
last of two duplicate keys. Here the document is composed into nodes and
converted into :class:`Node` objects that carry a :class:`Location`; mappings
keep the location of each key, duplicate keys are reported, and anchors /
merge keys / custom tags are refused (a spec is plain data).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from generator.diagnostics import Diagnostics, Location, SpecError, field_key
from generator.limits import MAX_INTEGER, MAX_SPEC_BYTES

_SCALAR_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}


@dataclass(frozen=True)
class Node:
    """A YAML value with its position.

    ``value`` is a ``str``/``int``/``float``/``bool``/``None`` for scalars,
    a ``dict[str, Node]`` for mappings (insertion order kept) and a
    ``list[Node]`` for sequences. ``key_locations`` holds where each mapping
    key was written. ``text_col``: for a string written on one line exactly
    as its value reads (plain, or quoted without escapes), the column where
    its text starts, so that a position inside the value can be located.
    """

    value: Any
    location: Location
    key_locations: dict[str, Location] | None = None
    text_col: int | None = None

    @property
    def kind(self) -> str:
        if isinstance(self.value, dict):
            return "mapping"
        if isinstance(self.value, list):
            return "sequence"
        if self.value is None:
            return "null"
        if isinstance(self.value, bool):
            return "boolean"
        if isinstance(self.value, int):
            return "integer"
        if isinstance(self.value, float):
            return "number"
        return "string"

    def plain(self) -> Any:
        """The value without positions (for hashing and JSON)."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


def _location(path: str, mark: yaml.Mark) -> Location:
    return Location(path, mark.line + 1, mark.column + 1)


#: Lists and mappings deeper than this are refused (a spec needs about 6
#: levels). The limit keeps the recursive composer, converter and checks far
#: from Python's recursion limit.
MAX_NESTING = 64
#: A "nested too deeply" problem is reported at the innermost mapping value
#: at most this deep, so its field path stays short.
_REPORT_DEPTH = 8

_KINDS = {
    "tag:yaml.org,2002:str": "a string",
    "tag:yaml.org,2002:int": "an integer",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:bool": "a boolean",
    "tag:yaml.org,2002:null": "null",
}


_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
#: A number written with more characters than this is out of range (2**63
#: takes 19 decimal digits; separators and a base prefix leave room).
_MAX_NUMBER_TEXT = 100
_OUT_OF_RANGE = f"number out of range (expected at most {MAX_INTEGER} in magnitude)"


def _out_of_range(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) > MAX_INTEGER
    return isinstance(value, float) and abs(value) > MAX_INTEGER


class _AliasNode(yaml.Node):
    """Where an alias (``*name``) was written; never resolved to its anchor."""

    id = "alias"


class _TooDeep(Exception):
    """Nesting beyond :data:`MAX_NESTING`: ``mark`` and ``field`` say where
    to report it."""

    def __init__(self, mark: yaml.Mark, field: str) -> None:
        super().__init__(field)
        self.mark = mark
        self.field = field


class _SpecLoader(yaml.SafeLoader):
    """A safe loader whose composer keeps aliases apart from their anchors
    (so both can be reported where they were written, and no alias expands
    into a copy of its target) and stops at :data:`MAX_NESTING` levels.

    It stops instead of skipping the deep part: PyYAML scans deeply nested
    flow collections in quadratic time, and the spec is refused anyway.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        # One entry per collection being composed: its field path, and where
        # a too deep value inside it is reported (the innermost mapping value
        # at most _REPORT_DEPTH deep, so the field path stays short).
        self._open: list[tuple[str, tuple[yaml.Mark, str] | None]] = []

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor not in self.anchors:
                # PyYAML reports the undefined alias.
                return super().compose_node(parent, index)
            self.get_event()
            return _AliasNode("", None, event.start_mark, event.end_mark)
        event = self.peek_event()
        path, report = self._open[-1] if self._open else ("", None)
        if isinstance(parent, yaml.SequenceNode):
            path = f"{path}[{index}]"
        elif isinstance(index, yaml.ScalarNode) and isinstance(index.value, str):
            shown = field_key(index.value)
            path = f"{path}.{shown}" if path else shown
            if len(self._open) <= _REPORT_DEPTH:
                report = (event.start_mark, path)
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(self._open) >= MAX_NESTING:
                raise _TooDeep(*(report or (event.start_mark, path)))
        self._open.append((path, report))
        try:
            node = super().compose_node(parent, index)
        finally:
            self._open.pop()
        if event.anchor is not None:
            node.anchor = event.anchor
        return node


class _Converter:
    def __init__(self, path: str, diags: Diagnostics, text: str) -> None:
        self.path = path
        self.diags = diags
        self.text = text
        self.constructor = yaml.constructor.SafeConstructor()

    def convert(self, node: yaml.Node, field_path: str) -> Node:
        loc = _location(self.path, node.start_mark)
        if isinstance(node, _AliasNode) or getattr(node, "anchor", None):
            self.diags.error(loc, field_path, "anchors and aliases are not allowed")
            if isinstance(node, _AliasNode):
                return Node(None, loc)
        if isinstance(node, yaml.ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                self.diags.error(loc, field_path, f"tag {node.tag!r} is not allowed")
                return Node(None, loc)
            if node.tag in _NUMBER_TAGS and len(node.value) > _MAX_NUMBER_TEXT:
                # Not converted: PyYAML's base-60 numbers (1:2:3) cost
                # quadratic time in their length.
                self.diags.error(loc, field_path, _OUT_OF_RANGE)
                return Node(None, loc)
            try:
                value = self.constructor.construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError) as exc:
                self.diags.error(loc, field_path, f"bad scalar: {exc}")
                return Node(None, loc)
            except (LookupError, TypeError, ArithmeticError):
                # e.g. '!!bool maybe' (KeyError) or '!!int ""' (IndexError).
                self.diags.error(
                    loc,
                    field_path,
                    f"bad scalar: {node.value!r} is not {_KINDS[node.tag]}",
                )
                return Node(None, loc)
            if _out_of_range(value):
                self.diags.error(loc, field_path, _OUT_OF_RANGE)
                return Node(None, loc)
            return Node(value, loc, text_col=self.text_col(node, value))
        if isinstance(node, yaml.SequenceNode):
            if node.tag != "tag:yaml.org,2002:seq":
                self.diags.error(loc, field_path, f"tag {node.tag!r} is not allowed")
            items = [
                self.convert(child, f"{field_path}[{i}]")
                for i, child in enumerate(node.value)
            ]
            return Node(items, loc)
        if isinstance(node, yaml.MappingNode):
            if node.tag != "tag:yaml.org,2002:map":
                self.diags.error(loc, field_path, f"tag {node.tag!r} is not allowed")
            mapping: dict[str, Node] = {}
            key_locs: dict[str, Location] = {}
            for key_node, value_node in node.value:
                key_loc = _location(self.path, key_node.start_mark)
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self.diags.error(
                        key_loc, field_path, "merge keys ('<<') are not allowed"
                    )
                    continue
                if isinstance(key_node, _AliasNode) or getattr(
                    key_node, "anchor", None
                ):
                    self.diags.error(
                        key_loc, field_path, "anchors and aliases are not allowed"
                    )
                    continue
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != (
                    "tag:yaml.org,2002:str"
                ):
                    self.diags.error(
                        key_loc, field_path, "mapping keys must be plain strings"
                    )
                    continue
                key = key_node.value
                shown = field_key(key)
                child_path = f"{field_path}.{shown}" if field_path else shown
                if not key.isprintable():
                    self.diags.error(
                        key_loc,
                        child_path,
                        "mapping keys must be printable (no line breaks, tabs "
                        "or other control characters)",
                    )
                    continue
                if key in mapping:
                    first = key_locs[key]
                    self.diags.error(
                        key_loc,
                        child_path,
                        f"duplicate key (first given at line {first.line})",
                    )
                    continue
                mapping[key] = self.convert(value_node, child_path)
                key_locs[key] = key_loc
            return Node(mapping, loc, key_locs)
        self.diags.error(loc, field_path, "unsupported YAML node")
        return Node(None, loc)

    def text_col(self, node: yaml.ScalarNode, value: Any) -> int | None:
        start, end = node.start_mark, node.end_mark
        if not isinstance(value, str) or start.line != end.line:
            return None
        source = self.text[start.index : end.index]
        if node.style is None and source == value:
            return start.column + 1
        if node.style in ("'", '"') and source[1:-1] == value:
            return start.column + 2
        return None


def _text_location(path: str, text: str, position: int) -> Location:
    """The line and column of ``text[position]``, with YAML's line breaks."""
    line, col = 1, 1
    for i, ch in enumerate(text[:position]):
        if ch in "\n\x85\u2028\u2029" or (ch == "\r" and text[i + 1 : i + 2] != "\n"):
            line, col = line + 1, 1
        else:
            col += 1
    return Location(path, line, col)


def _reader_problem(exc: yaml.reader.ReaderError) -> str:
    code = exc.character
    if isinstance(code, bytes):  # undecodable input (never for a decoded spec)
        return f"malformed YAML: {exc.reason}"
    char = chr(code) if isinstance(code, int) else str(code)
    what = "control character" if unicodedata.category(char) == "Cc" else "character"
    return (
        f"{what} {repr(char)[1:-1]} is not allowed (only printable characters, "
        "tab and line breaks)"
    )


def load_spec_tree(text: str, path: str, diags: Diagnostics) -> Node | None:
    """Parse ``text`` into a located tree; ``None`` if the YAML is malformed."""
    try:
        documents = list(yaml.compose_all(text, Loader=_SpecLoader))
    except _TooDeep as exc:
        diags.error(
            _location(path, exc.mark),
            exc.field,
            f"nested too deeply (more than {MAX_NESTING} levels of lists and "
            "mappings)",
        )
        return None
    except yaml.reader.ReaderError as exc:
        diags.error(_text_location(path, text, exc.position), "", _reader_problem(exc))
        return None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = _location(path, mark) if mark else Location(path, 1, 1)
        problem = exc.problem or "malformed YAML"
        context = f" ({exc.context})" if exc.context else ""
        diags.error(loc, "", f"malformed YAML: {problem}{context}")
        return None
    except yaml.YAMLError as exc:
        diags.error(Location(path, 1, 1), "", f"malformed YAML: {exc}")
        return None
    except (RecursionError, MemoryError):
        diags.error(Location(path, 1, 1), "", "spec is nested too deeply")
        return None
    if not documents or documents[0] is None:
        diags.error(Location(path, 1, 1), "", "empty spec (expected a mapping)")
        return None
    if len(documents) > 1:
        loc = _location(path, documents[1].start_mark)
        diags.error(loc, "", "a spec holds exactly one YAML document")
    try:
        return _Converter(path, diags, text).convert(documents[0], "")
    except (RecursionError, MemoryError):
        diags.error(Location(path, 1, 1), "", "spec is nested too deeply")
        return None


def read_spec_file(path: str | Path, shown: str) -> tuple[bytes, str]:
    """A spec's bytes and text, read once and at most :data:`MAX_SPEC_BYTES`
    (``/dev/zero`` is refused, not read to the end); raises :class:`SpecError`."""
    diags = Diagnostics()
    where = Location(shown, 1, 1)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        diags.error(where, "", f"cannot read spec: {exc.strerror or exc}")
        raise SpecError(diags.sorted()) from None
    except ValueError:  # a NUL character in the path
        diags.error(where, "", "cannot read spec: the path holds a NUL character")
        raise SpecError(diags.sorted()) from None
    if len(raw) > MAX_SPEC_BYTES:
        diags.error(
            where,
            "",
            f"spec is larger than {MAX_SPEC_BYTES // 1024} KiB (a spec needs a few "
            "KiB; the cap bounds gen-mixin's time and memory)",
        )
        raise SpecError(diags.sorted())
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        diags.error(where, "", f"spec is not UTF-8 ({exc.reason} at byte {exc.start})")
        raise SpecError(diags.sorted()) from None
