"""Taking the keys of a located YAML mapping, one declared :class:`Key` at a time.

Every spec class declares its keys as a :class:`Keys` table (type, default,
meaning, example) and reads them in its ``from_yaml`` classmethod with
:meth:`Reader.take`, which checks the value's type and converts it, or returns
the default. :meth:`Reader.done` reports the keys left over (with "did you
mean") and fails loudly if the class forgot to take a key it declared, so the
table, from which the JSON Schema and the docs are derived, cannot drift from
what is read. Problems are recorded, never raised: every one is reported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from generator.diagnostics import (
    Diagnostics,
    Location,
    RenderError,
    closest_name,
    field_key,
)
from generator.formulas import Scope
from generator.scopes import FIELD_SCOPES, NameKind
from generator.yaml_loader import Node

if TYPE_CHECKING:
    from generator.spec.values import ValueType


class _Invalid:
    def __repr__(self) -> str:
        return "INVALID"

    def __bool__(self) -> bool:
        return False


#: What :meth:`ValueType.convert` returns after reporting a problem.
INVALID: Any = _Invalid()


@dataclass(frozen=True)
class Key:
    """One key of a spec mapping."""

    name: str
    type: ValueType
    doc: str
    required: bool = False
    default: Any = None  # what take() returns when the key is absent
    default_doc: str | None = None  # the default as the docs show it
    example: str | None = None
    applies: str | None = None  # docs: which entries it applies to ("flat")
    #: Refused with this message wherever it is written (a planned field).
    refused: str | None = None


class Keys(Mapping[str, Key]):
    """A class's keys, in declaration order."""

    def __init__(self, *keys: Key) -> None:
        self._keys = {k.name: k for k in keys}

    def __getitem__(self, name: str) -> Key:
        return self._keys[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def visible(self) -> list[Key]:
        return [k for k in self._keys.values() if k.refused is None]


#: The kinds of names each encoder path declares for itself.
PATH_KINDS = (
    NameKind.BUFFER,
    NameKind.GRAPH_STEP,
    NameKind.EAGER_STEP,
    NameKind.BUILDER_RESULT,
    NameKind.BUILDER_STEP,
)


class ReadContext:
    """What every reader of one spec shares: the file, the problems found, and
    the names the spec has declared so far (filled in section by section)."""

    def __init__(self, file: str, diags: Diagnostics) -> None:
        self.file = file
        self.diags = diags
        self.names: dict[NameKind, dict[str, Location]] = {k: {} for k in NameKind}
        #: Where each declared name was declared (its field path).
        self.fields: dict[tuple[NameKind, str], str] = {}
        #: Buffers whose capture tensor or builder is written but failed
        #: (already reported): no "no source" on top.
        self.failed_sources: set[str] = set()
        #: Declared names already reported as invalid (no more noise on them).
        self.bad_names: set[str] = set()
        #: Declared inputs whose entry failed: checks that need every input
        #: resolved are skipped.
        self.failed_inputs: set[str] = set()
        #: The buffers mapping is missing or malformed.
        self.buffers_unknown = False
        #: The parts that resolved, by name: the static checks run on them
        #: even when other parts of the spec have problems.
        self.partial: dict[str, Any] = {}
        #: Built-in names the path being read does not bind (a unit capture
        #: has no ``k``; a capture of items has no ``units``), with why.
        self.unbound: dict[str, str] = {}

    def error(self, where: Node | Location, field: str, message: str) -> None:
        loc = where if isinstance(where, Location) else where.location
        self.diags.error(loc, field, message)

    def declare(
        self, kind: NameKind, name: str, location: Location, field: str = ""
    ) -> None:
        self.names[kind].setdefault(name, location)
        self.fields.setdefault((kind, name), field)

    @contextmanager
    def path_names(self) -> Iterator[None]:
        """Read one of several encoder paths: its buffers, steps and builder
        results are declared for it alone (a path's formulas see only its
        own), then kept with the other paths' for the collision checks."""
        saved = {kind: self.names[kind] for kind in PATH_KINDS}
        saved_unknown = self.buffers_unknown
        for kind in PATH_KINDS:
            self.names[kind] = {}
        self.buffers_unknown = False
        try:
            yield
        finally:
            for kind in PATH_KINDS:
                own = self.names[kind]
                self.names[kind] = saved[kind]
                for name, loc in own.items():
                    self.names[kind].setdefault(name, loc)
            self.buffers_unknown = saved_unknown

    def declared(self, *kinds: NameKind) -> frozenset[str]:
        return frozenset(n for kind in kinds for n in self.names[kind])

    def kind_of(self, name: str) -> NameKind | None:
        return next((k for k in NameKind if name in self.names[k]), None)

    def scope(self, scope_id: str, extra: tuple[str, ...] | set[str] = ()) -> Scope:
        scope = FIELD_SCOPES[scope_id].scope(self.names, extra)
        if not self.unbound:
            return scope
        return replace(scope, names=scope.names - frozenset(self.unbound))


class Reader:
    """Takes the declared keys of one mapping node."""

    def __init__(self, node: Node, field: str, keys: Keys, ctx: ReadContext) -> None:
        self.node = node
        self.field = field
        self.keys = keys
        self.ctx = ctx
        self.mapping: dict[str, Node] = node.value if node.kind == "mapping" else {}
        self.taken: set[str] = set()
        self.failed: set[str] = set()

    # -- where things are ----------------------------------------------------------

    def path(self, key: str) -> str:
        shown = field_key(key)
        return f"{self.field}.{shown}" if self.field else shown

    def key_location(self, key: str) -> Location:
        return (self.node.key_locations or {}).get(key, self.node.location)

    def raw(self, key: str) -> Node | None:
        return self.mapping.get(key)

    def has(self, key: str) -> bool:
        return key in self.mapping

    def error(self, where: Node | Location | str, message: str, field=None) -> None:
        """Report at a node, a location, or (a key name) the key's value."""
        if isinstance(where, str):
            node = self.mapping.get(where)
            field = field or self.path(where)
            where = node if node is not None else self.node
        self.ctx.error(where, field if field is not None else self.field, message)

    # -- taking keys -------------------------------------------------------------------

    def take(self, name: str, **kwargs: Any) -> Any:
        """The key's converted value, its default when absent, or (after a
        reported problem) the default too; :meth:`ok` tells them apart."""
        key = self.keys[name]
        self.taken.add(name)
        node = self.mapping.get(name)
        if node is None:
            if key.required:
                self.ctx.error(self.node, self.path(name), "required key is missing")
                self.failed.add(name)
            return key.default
        value = key.type.convert(node, self.path(name), self.ctx, **kwargs)
        if value is INVALID:
            self.failed.add(name)
            return key.default
        return value

    def take_node(self, name: str) -> Node | None:
        """The key's node, for a class that reads it itself: its YAML kind is
        checked (a wrong kind is reported and gives None); None when absent
        (reported if required)."""
        key = self.keys[name]
        self.taken.add(name)
        node = self.mapping.get(name)
        if node is None:
            if key.required:
                self.ctx.error(self.node, self.path(name), "required key is missing")
                self.failed.add(name)
            return None
        if key.type.convert_kind(node, self.path(name), self.ctx) is INVALID:
            self.failed.add(name)
            return None
        return node

    def refuse(self, name: str, message: str) -> None:
        """Report a declared key that does not apply here, at its key."""
        self.taken.add(name)
        self.failed.add(name)
        self.ctx.error(self.key_location(name), self.path(name), message)

    def ok(self, *names: str) -> bool:
        """True if none of ``names`` was given with a problem."""
        return not self.failed.intersection(names)

    def done(self) -> None:
        """Report leftover and refused keys; check the class took every key."""
        allowed = [k.name for k in self.keys.visible]
        for key in self.mapping:
            declared = self.keys.get(key)
            if declared is not None and declared.refused is not None:
                self.ctx.error(self.key_location(key), self.path(key), declared.refused)
            elif declared is None:
                close = closest_name(key, allowed)
                hint = f"; did you mean {close!r}?" if close else ""
                self.ctx.error(
                    self.key_location(key),
                    self.path(key),
                    f"unknown key{hint} (allowed: {', '.join(allowed)})",
                )
            elif key not in self.taken:
                raise RenderError(f"{self.path(key)} is declared but never read")


def section_schema(keys: Keys, doc: str | None = None) -> dict[str, Any]:
    """A mapping with exactly ``keys``."""
    out: dict[str, Any] = {"type": "object", "additionalProperties": False}
    if doc:
        out["description"] = doc
    required = [k.name for k in keys.visible if k.required]
    if required:
        out["required"] = required
    props = {}
    for key in keys.visible:
        prop = dict(key.type.schema())
        prop["description"] = key.doc
        if key.default is not None and not key.required:
            default = getattr(key.default, "value", key.default)
            prop["default"] = default
        props[key.name] = prop
    out["properties"] = props
    return out
