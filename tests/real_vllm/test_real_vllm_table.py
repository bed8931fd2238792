"""The table of the real-vLLM tests (tiny_models.py) against the plugin's
catalog and the page that shows it, docs/using-in-vllm.md. Needs no vLLM:
it runs in the project's own environment too.

``GEN_MIXIN_UPDATE_GOLDEN=1`` rewrites the page's table from tiny_models.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from tiny_models import NOT_ON_CPU, TINY, models_table

from gen_mixin_vllm.catalog import ADDS_PROTOCOL, CATALOG

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "using-in-vllm.md"
BEGIN = "<!-- real-vllm models: generated from tests/real_vllm/tiny_models.py -->"
END = "<!-- end of real-vllm models -->"


def _names() -> dict[str, str]:
    return {
        stem: yaml.safe_load((ROOT / "specs" / f"{stem}.yaml").read_text("utf-8"))[
            "name"
        ]
        for stem in CATALOG
    }


def test_every_entry_is_a_served_model_in_one_list():
    assert set(TINY) <= set(CATALOG)
    assert set(NOT_ON_CPU) <= set(CATALOG)
    assert not set(TINY) & set(NOT_ON_CPU)
    for stem, tiny in TINY.items():
        assert tiny.stem == stem


def test_the_page_shows_the_table():
    text = PAGE.read_text("utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "markers missing"
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    table = models_table(_names(), list(CATALOG), ADDS_PROTOCOL)
    want = f"{head}{BEGIN}\n{table}{END}{tail}"
    if os.environ.get("GEN_MIXIN_UPDATE_GOLDEN") == "1":
        PAGE.write_text(want, "utf-8")
    assert text == want, "run with GEN_MIXIN_UPDATE_GOLDEN=1 to rewrite the table"
