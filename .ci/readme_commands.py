"""Print the README's two Quick start commands, one per line: the rule by which
CI finds what a new user runs.

The rule: in the section headed ``## Quick start``, the list item labelled
``**Main job**`` and the one labelled ``**Tests**`` are each followed by a
fenced code block of exactly one command line; the commands are printed in
that order (Main job, then Tests), without their indentation. Anything else
(a label missing or repeated, a block missing, empty or of several lines)
is an error: each problem as ``README.md:LINE: message`` on stderr, exit 2,
nothing on stdout.

Usage: ``python3 .ci/readme_commands.py README.md`` (standard library only:
it runs before anything is installed).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

LABELS = ("Main job", "Tests")

_SECTION = re.compile(r"^##\s+Quick start\s*$")
_NEXT_SECTION = re.compile(r"^#{1,2}\s")
_LABEL = re.compile(r"^\s*[-*]\s+\*\*(?P<label>[^*]+)\*\*")
_FENCE = re.compile(r"^\s*```")


def _quick_start(lines: list[str]) -> tuple[int, int] | None:
    """The range of line indices of the Quick start section's body."""
    start = next((i for i, line in enumerate(lines) if _SECTION.match(line)), None)
    if start is None:
        return None
    end = next(
        (i for i in range(start + 1, len(lines)) if _NEXT_SECTION.match(lines[i])),
        len(lines),
    )
    return start + 1, end


def _block_after(lines: list[str], label_at: int, end: int) -> tuple[int, list[str]]:
    """``(line index of the opening fence, the block's non-blank lines)`` of
    the first fenced block after ``label_at``, before the next label or
    ``end``; ``(-1, [])`` when there is none."""
    for i in range(label_at + 1, end):
        if _LABEL.match(lines[i]):
            break
        if _FENCE.match(lines[i]):
            close = next((j for j in range(i + 1, end) if _FENCE.match(lines[j])), end)
            return i, [line.strip() for line in lines[i + 1 : close] if line.strip()]
    return -1, []


def extract(path: Path) -> tuple[list[str], list[str]]:
    """``(commands, problems)`` of the README at ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    section = _quick_start(lines)
    if section is None:
        return [], [f"{path}:1: no '## Quick start' section"]
    start, end = section
    commands: list[str] = []
    problems: list[str] = []
    for label in LABELS:
        found = [
            i
            for i in range(start, end)
            if (match := _LABEL.match(lines[i])) and match["label"].strip() == label
        ]
        if len(found) != 1:
            problems.append(
                f"{path}:{start}: Quick start: {len(found)} items labelled "
                f"**{label}** (expected exactly one)"
            )
            continue
        fence, block = _block_after(lines, found[0], end)
        if len(block) != 1:
            where = fence + 1 if fence >= 0 else found[0] + 1
            problems.append(
                f"{path}:{where}: Quick start: **{label}**: expected a fenced block "
                f"of one command line, found {len(block)} lines"
            )
            continue
        commands.append(block[0])
    return commands, problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: readme_commands.py README.md", file=sys.stderr)
        return 2
    commands, problems = extract(Path(argv[0]))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    print("\n".join(commands))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
