"""YAML loading that keeps the position of every value.

``yaml.safe_load`` forgets where a value came from and silently keeps the
last of two duplicate keys. Here the document is composed into nodes and
converted into :class:`Node` objects that carry a :class:`Location`; mappings
keep the location of each key, duplicate keys are reported, and anchors /
merge keys / custom tags are refused (a spec is plain data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from generator.diagnostics import Diagnostics, Location

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
    key was written.
    """

    value: Any
    location: Location
    key_locations: dict[str, Location] | None = None

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


class _Converter:
    def __init__(self, path: str, diags: Diagnostics) -> None:
        self.path = path
        self.diags = diags
        self.constructor = yaml.constructor.SafeConstructor()

    def convert(self, node: yaml.Node, field_path: str) -> Node:
        loc = _location(self.path, node.start_mark)
        if getattr(node, "anchor", None):
            self.diags.error(loc, field_path, "anchors and aliases are not allowed")
        if isinstance(node, yaml.ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                self.diags.error(loc, field_path, f"tag {node.tag!r} is not allowed")
                return Node(None, loc)
            try:
                value = self.constructor.construct_object(node, deep=True)
            except (yaml.YAMLError, ValueError) as exc:
                self.diags.error(loc, field_path, f"bad scalar: {exc}")
                return Node(None, loc)
            return Node(value, loc)
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
                    self.diags.error(key_loc, field_path, "merge keys ('<<') are not allowed")
                    continue
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != (
                    "tag:yaml.org,2002:str"
                ):
                    self.diags.error(
                        key_loc, field_path, "mapping keys must be plain strings"
                    )
                    continue
                key = key_node.value
                child_path = f"{field_path}.{key}" if field_path else key
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


def load_spec_tree(text: str, path: str, diags: Diagnostics) -> Node | None:
    """Parse ``text`` into a located tree; ``None`` if the YAML is malformed."""
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
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
    if not documents or documents[0] is None:
        diags.error(Location(path, 1, 1), "", "empty spec (expected a mapping)")
        return None
    if len(documents) > 1:
        loc = _location(path, documents[1].start_mark)
        diags.error(loc, "", "a spec holds exactly one YAML document")
    return _Converter(path, diags).convert(documents[0], "")
