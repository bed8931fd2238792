"""The rules for names a spec declares, and for their collisions.

A declared name is an identifier that starts with no ``_``, shadows no Python
built-in, takes none of the names every generated method shares
(:data:`generator.scopes.RESERVED`), and binds nothing a generated method binds
for itself where both live (:func:`generator.scopes.collisions`).
"""

from __future__ import annotations

from generator.diagnostics import Location
from generator.scopes import PYTHON_BUILTINS, RESERVED, NameKind, collisions
from generator.spec.reader import ReadContext
from generator.spec.values import is_name


def check_name(
    ctx: ReadContext, where: Location, field: str, name: str, what: str
) -> bool:
    """Report a name a spec may not declare; True if it is fine."""
    if not is_name(name):
        ctx.error(where, field, f"{name!r} is not a valid identifier")
    elif name in RESERVED:
        ctx.error(
            where, field, f"{what} {name!r} uses a name the generated code reserves"
        )
    elif name in PYTHON_BUILTINS:
        ctx.error(where, field, f"{what} {name!r} would shadow the Python built-in")
    elif name.startswith("_"):
        ctx.error(where, field, f"{what} {name!r} must not start with '_'")
    else:
        return True
    ctx.bad_names.add(name)
    return False


def report_collisions(
    ctx: ReadContext, fields: dict[tuple[NameKind, str], str]
) -> None:
    """Spec names a generated method binds for itself, each reported where it
    is declared (``fields``: the field path of each declared name)."""
    names = {kind: list(ctx.names[kind]) for kind in NameKind}
    for c in collisions(names):
        if c.name in ctx.bad_names:
            continue
        where = ctx.names[c.kind][c.name]
        field = fields.get((c.kind, c.name), "")
        ctx.error(
            where,
            field,
            f"{c.kind.value} {c.name!r} collides with {c.what} {c.name!r} that "
            f"{c.method} binds for itself: choose another name",
        )
