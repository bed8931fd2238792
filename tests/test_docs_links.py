"""The documentation a user reads in a clone resolves in that clone.

Every relative link of README.md and docs/**/*.md, markdown ``[text](path)``
(images too) and a path in backticks that starts with ``docs/`` (from the
repository root) or ``../`` (from the file's folder), names a file or folder
inside the repository; a ``#fragment`` names a heading of its target. Fenced
code blocks are commands, not links, and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_FENCED = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as
    hyphens (a repeated heading gets ``-1``, ``-2``...)."""
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCED.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(
            " ", "-"
        )
        count = seen.get(slug, 0)
        seen[slug] = count + 1
    return {f"{slug}-{i}" if i else slug for slug, n in seen.items() for i in range(n)}


def _targets(document: Path, root: Path) -> list[tuple[str, Path]]:
    """``(as written, base folder)`` of each relative reference in ``document``."""
    text = _FENCED.sub("", document.read_text(encoding="utf-8"))
    found: list[tuple[str, Path]] = []
    for span in _CODE_SPAN.findall(text):
        if span.startswith("docs/"):
            found.append((span, root))
        elif span.startswith("../"):
            found.append((span, document.parent))
    for target in _LINK.findall(_CODE_SPAN.sub("", text)):
        if not _SCHEME.match(target):
            found.append((target, document.parent))
    return found


def broken_links(root: Path) -> list[str]:
    """``document: target: problem`` for each reference that does not resolve."""
    root = root.resolve()
    problems = []
    for document in documents(root):
        name = document.relative_to(root).as_posix()
        for written, base in _targets(document, root):
            path_part, _, fragment = written.partition("#")
            target = (base / path_part).resolve() if path_part else document
            if not target.is_relative_to(root):
                problems.append(f"{name}: {written}: outside the repository")
            elif not target.exists():
                problems.append(f"{name}: {written}: does not exist")
            elif fragment and (
                target.suffix != ".md"
                or fragment not in anchors(target.read_text(encoding="utf-8"))
            ):
                problems.append(f"{name}: {written}: no heading #{fragment}")
    return problems


README = "# p\n\n## Part one\n\nSee [spec](docs/spec.md) and `docs/spec.md`.\n"
SPEC = (
    "# Spec\n\n## The `items` field\n\nBack to [the readme](../README.md#part-one).\n"
)

# (case, files added to a tree of README and docs/spec.md, expected problems).
CASES = [
    ("clean", {}, []),
    (
        "a link outside the repository",
        {"docs/a.md": "Read [it](../../shared/PROTOCOL.md).\n"},
        ["docs/a.md: ../../shared/PROTOCOL.md: outside the repository"],
    ),
    (
        "a path in backticks outside the repository",
        {"docs/a.md": "The protocol (`../shared/PROTOCOL.md`).\n"},
        ["docs/a.md: ../shared/PROTOCOL.md: does not exist"],
    ),
    (
        "a missing file, by link and by backticks",
        {"docs/a.md": "[x](gone.md), ![plot](img/p.png), `docs/gone.md`\n"},
        [
            "docs/a.md: docs/gone.md: does not exist",
            "docs/a.md: gone.md: does not exist",
            "docs/a.md: img/p.png: does not exist",
        ],
    ),
    (
        "anchors, in other files and in the same one",
        {
            "docs/a.md": (
                "# A\n\n[ok](spec.md#the-items-field), [ok](#a), "
                "[bad](spec.md#the-buffers-field), [bad](#b)\n"
            )
        },
        [
            "docs/a.md: spec.md#the-buffers-field: no heading #the-buffers-field",
            "docs/a.md: #b: no heading #b",
        ],
    ),
    (
        "URLs, code blocks and code spans are not links",
        {
            "docs/a.md": (
                "[site](https://example.org/x), `fn[key](a, b)`, `generated/x.py`\n\n"
                "```\ncd ../elsewhere && cat docs/none.md\n```\n"
            )
        },
        [],
    ),
]


@pytest.mark.parametrize(
    ("files", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_checker_on_a_synthetic_tree(tmp_path: Path, files, expected):
    tree = {"README.md": README, "docs/spec.md": SPEC, **files}
    for relative, text in tree.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text, encoding="utf-8")
    assert sorted(broken_links(tmp_path)) == sorted(expected)


def test_every_link_of_the_docs_resolves_in_the_repository():
    problems = broken_links(ROOT)
    assert not problems, "\n".join(problems)
