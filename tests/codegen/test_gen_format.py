"""The part-by-part formatter (``generator/formatting.py``) against black on
the whole module, for every spec and target: the same bytes."""

from __future__ import annotations

import pytest

from generator.emitters import build_context
from generator.formatting import CHUNK, black_format, format_module, unmarked
from generator.render import MAIN_TEMPLATE, _environment
from generator.resolve import load_spec
from genmixin_testlib import spec_paths, target_cases, valid_corpus_paths

CASES = target_cases(spec_paths() + valid_corpus_paths())
IDS = [f"{t}-{p.parent.name}/{p.stem}" for t, p in CASES]


def _raw(target: str, path) -> str:
    ctx = build_context(load_spec(path), target, ["header"])
    return _environment().get_template(MAIN_TEMPLATE).render(**ctx, part=CHUNK)


@pytest.mark.parametrize(("target", "path"), CASES, ids=IDS)
def test_parts_format_as_the_whole_module(target: str, path) -> None:
    raw = _raw(target, path)
    assert raw.count("\x00") >= 4  # the parts are marked
    formatted = format_module(raw)
    assert "\x00" not in formatted
    assert formatted == black_format(unmarked(raw))


def test_a_local_import_that_would_wrap_is_formatted_in_place() -> None:
    long_module = "a" * 80
    raw = (
        f"{CHUNK['module']}class C:\n    x: int\n"
        f"{CHUNK['class']}    def f(self):\n"
        f"        from {long_module} import Name\n        return Name\n"
    )
    assert format_module(raw) == black_format(unmarked(raw))
