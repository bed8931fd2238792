"""Draft specs of models the format cannot express yet (``drafts/``): each
is what a user would write from the docs, and each is refused today with
exit 2 and the messages in ``drafts/<stem>.expected``, which
docs/beyond-catalog.md and docs/adding-a-model.md quote. When a format
feature lands, its draft's refusal changes: this test then says which draft
to turn into a spec.

``GEN_MIXIN_UPDATE_GOLDEN=1`` rewrites the ``.expected`` files."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

from generator import cli

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DRAFTS = sorted((HERE / "drafts").glob("*.yaml"))
CATALOG = REPO / "docs" / "beyond-catalog.md"
#: The walkthrough's section "What the format cannot express yet" quotes
#: every refusal too.
ADDING = REPO / "docs" / "adding-a-model.md"
UPDATE = os.environ.get("GEN_MIXIN_UPDATE_GOLDEN") == "1"


def _refusal(draft: Path, tmp_path: Path) -> tuple[int, str]:
    err = io.StringIO()
    argv = ["--out", str(tmp_path), str(draft.relative_to(REPO))]
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, err.getvalue()


@pytest.mark.parametrize("draft", DRAFTS, ids=[d.stem for d in DRAFTS])
def test_the_draft_is_refused_as_recorded(draft, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    rc, messages = _refusal(draft, tmp_path)
    assert rc == 2
    assert not any(tmp_path.iterdir()), "a refused spec wrote a file"
    expected = draft.with_suffix(".expected")
    if UPDATE:
        expected.write_text(messages, encoding="utf-8")
    assert messages == expected.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", [CATALOG, ADDING], ids=["catalog", "adding"])
@pytest.mark.parametrize("draft", DRAFTS, ids=[d.stem for d in DRAFTS])
def test_the_docs_quote_the_refusal(draft, page) -> None:
    text = page.read_text(encoding="utf-8")
    for line in draft.with_suffix(".expected").read_text().splitlines():
        assert line in text, f"docs/{page.name} does not quote: {line}"


def test_no_draft_is_left_for_a_model_that_has_a_spec() -> None:
    # A draft that became a spec (specs/<stem>.yaml) is removed with it; its
    # refusal would no longer be what a user sees.
    specs = {spec.stem for spec in (REPO / "specs").glob("*.yaml")}
    assert [d.name for d in DRAFTS if d.stem in specs] == []
