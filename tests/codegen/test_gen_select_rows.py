"""The module-level row selection every generated mixin carries."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

STEMS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "specs").glob("*.yaml")
)


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
