"""Free text from the spec as comments, docstrings and string literals.

Spec text reaches generated code only through here: wrapped into comment
lines, docstring lines (the model refuses ``\"\"\"`` and backslashes), or
``repr()`` string literals.
"""

from __future__ import annotations

import textwrap

COMMENT_WIDTH = 72
STRING_WIDTH = 64


def comment_lines(text: str | None, width: int = COMMENT_WIDTH) -> list[str]:
    """Free text wrapped into comment lines (without the ``# `` prefix)."""
    if not text:
        return []
    out: list[str] = []
    for paragraph in text.split("\n\n"):
        words = " ".join(paragraph.split())
        if out:
            out.append("")
        out.extend(
            textwrap.wrap(words, width, break_long_words=False, break_on_hyphens=False)
        )
    return out


def docstring_lines(text: str, width: int = COMMENT_WIDTH) -> list[str]:
    """Paragraphs re-wrapped; lines starting with '-' or indented kept as lists."""
    out: list[str] = []
    for paragraph in text.strip().split("\n\n"):
        if out:
            out.append("")
        lines = paragraph.split("\n")
        if any(line.lstrip().startswith(("-", "*")) for line in lines):
            out.extend(line.rstrip() for line in lines)
        else:
            out.extend(
                textwrap.wrap(
                    " ".join(paragraph.split()), width, break_long_words=False
                )
            )
    return out


def message_literal(
    parts: list[tuple[str, bool]], width: int = STRING_WIDTH
) -> list[str]:
    """A message as implicitly concatenated string literals.

    ``parts`` are ``(text, is_placeholder)``: literal text comes from the spec
    and is escaped by ``repr`` (and brace-doubled inside f-strings);
    placeholders are trusted expressions written by the generator.
    """
    tokens: list[tuple[str, bool]] = []
    for text, placeholder in parts:
        if placeholder:
            tokens.append((text, True))
        else:
            for word in text.split(" "):
                tokens.append((word, False))
    chunks: list[list[tuple[str, bool]]] = [[]]
    length = 0
    for token in tokens:
        # A placeholder is printed in braces.
        size = len(token[0]) + (3 if token[1] else 1)
        if chunks[-1] and length + size > width:
            chunks.append([])
            length = 0
        chunks[-1].append(token)
        length += size
    literals = []
    for i, chunk in enumerate(chunks):
        has_placeholder = any(p for _, p in chunk)
        pieces = []
        for text, placeholder in chunk:
            if placeholder:
                pieces.append("{" + text + "}")
            else:
                pieces.append(
                    text.replace("{", "{{").replace("}", "}}")
                    if has_placeholder
                    else text
                )
        body = " ".join(pieces)
        if i < len(chunks) - 1:
            body += " "
        literal = repr(body)
        literals.append(f"f{literal}" if has_placeholder else literal)
    return literals


def plain_message(text: str) -> list[str]:
    """A message without placeholders, as string literals."""
    return message_literal([(text, False)])
