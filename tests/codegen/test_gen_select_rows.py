"""The module-level row selection of every generated mixin that selects the
rows of a flat input (a module without one has no ``_select_rows``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

STANDALONE = Path(__file__).resolve().parents[2] / "generated" / "standalone"
STEMS = sorted(
    p.stem
    for p in STANDALONE.glob("*.py")
    if "\ndef _select_rows(" in p.read_text(encoding="utf-8")
)


def test_most_modules_select_rows():
    assert len(STEMS) >= 18


@pytest.mark.parametrize("stem", STEMS)
@pytest.mark.parametrize(
    "indices", [[0, 1, 2], [2, 0], [0, 0, 1], [1, 1, 1], [], [0, 2, 1], [0, 1]]
)
def test_select_rows_equals_concatenated_slices(stem, indices):
    try:
        module = importlib.import_module(f"generated.standalone.{stem}")
    except ImportError as exc:  # a tower module this environment lacks
        pytest.skip(str(exc))
    sizes = [2, 3, 1]
    flat = torch.arange(6 * 4).reshape(6, 4)
    offsets = [0, 2, 5, 6]
    expected = (
        torch.cat([flat[offsets[i] : offsets[i + 1]] for i in indices])
        if indices
        else flat[:0]
    )
    got = module._select_rows(flat, sizes, indices)
    assert torch.equal(got, expected)
