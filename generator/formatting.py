"""Black, with a pinned mode, one part of a module at a time.

Black formats each logical line on its own; what a module's parts share is
only the blank lines between them, which black fixes (two around top-level
definitions, one between methods). So the module is formatted part by part
(the templates mark where parts start, see :data:`CHUNK`) and each part's
result is kept: the helpers are the same in every module, and most methods
are the same in both targets of a spec, so a run with many specs formats
each of them once. ``tests/codegen/test_gen_format.py`` checks that the
result is what black makes of the whole module.
"""

from __future__ import annotations

import re
from functools import cache

BLACK_LINE_LENGTH = 88

#: Where a part starts, as the templates print it: a NUL (which no spec text
#: can hold: the model refuses non-printable text) and the part's kind.
#: ``module``: top-level code; ``class``: code of the class body (indented).
CHUNK = {"module": "\x00module\n", "class": "\x00class\n"}
_SPLIT = re.compile("\x00(module|class)\n")
#: A local import line, ``from <module> import <Name>``, whose module is the
#: only text by which a method differs between targets.
_LOCAL_IMPORT = re.compile(r"^( +from )([\w.]+)( import \w+)$", re.M)
_PLACEHOLDER = "_"


class FormatError(RuntimeError):
    """Black refused the generated code (a bug in gen-mixin)."""


@cache
def _mode():
    import black

    return black.Mode(
        target_versions={black.TargetVersion.PY310},
        line_length=BLACK_LINE_LENGTH,
        string_normalization=True,
        is_pyi=False,
        magic_trailing_comma=True,
    )


def black_format(source: str) -> str:
    import black

    try:
        return black.format_str(source, mode=_mode())
    except Exception as exc:  # black raises several types; all are our bugs
        raise FormatError(f"black could not format the generated code: {exc}") from exc


@cache
def _format_part(kind: str, text: str) -> str:
    if kind == "module":
        return black_format(text)
    out = black_format(f"class _:\n{text}")
    return out.split("\n", 1)[1]


def _format_class_part(text: str) -> str:
    """A class-body part; its local imports' modules are set aside first, so
    that both targets share one formatting (an import that fits on its line
    is left as it is)."""
    modules = [m.group(2) for m in _LOCAL_IMPORT.finditer(text)]
    fits = all(
        len(m.group(0)) <= BLACK_LINE_LENGTH for m in _LOCAL_IMPORT.finditer(text)
    )
    if not modules or not fits:
        return _format_part("class", text)
    generic = _LOCAL_IMPORT.sub(rf"\g<1>{_PLACEHOLDER}\g<3>", text)
    formatted = _format_part("class", generic)
    names = iter(modules)
    return re.sub(
        rf"^( +from ){_PLACEHOLDER}( import \w+)$",
        lambda m: f"{m.group(1)}{next(names)}{m.group(2)}",
        formatted,
        flags=re.M,
    )


def format_module(raw: str) -> str:
    """The module black makes of ``raw`` (whose parts are marked)."""
    pieces = _SPLIT.split(raw)
    head, parts = pieces[0], list(zip(pieces[1::2], pieces[2::2], strict=True))
    if head.strip():
        parts.insert(0, ("module", head))
    out: list[str] = []
    for kind, text in parts:
        if not text.strip():
            continue
        if kind == "module":
            formatted = _format_part("module", text)
        else:
            formatted = _format_class_part(text)
        formatted = formatted.strip("\n")
        if out:
            # One blank line before a method, two around top-level code.
            out.append("\n\n" if kind == "class" else "\n\n\n")
        out.append(formatted)
    return "".join(out) + "\n"


def unmarked(raw: str) -> str:
    """``raw`` without its part marks (what black alone would be given)."""
    return _SPLIT.sub("", raw)
