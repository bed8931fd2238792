#!/usr/bin/env python3
"""Measure each spec against the hand-written vLLM 0.33.0 code it replaces.

Issue #14's target: a spec averages at most half the lines of the
hand-written protocol methods it replaces. Both sides are counted as *code
lines*, lines that carry something a reader must check:

* Python (vLLM's mixin, read from the wheel with ``zipfile`` and ``ast``,
  never imported): the protocol methods the model's class defines, plus the
  private methods of the same class they call through ``self`` (transitively);
  blank lines, comment-only lines and docstrings are not counted.
* YAML (``specs/<stem>.yaml``): blank lines, comment-only lines and the
  ``docstring:`` block (the generated class's docstring) are not counted.

The table is written to ``docs/spec-sizes.md``; the method-by-method tables
of ``docs/side-by-side.md`` (three generated modules against vLLM's mixins,
code and prose lines per method) are rewritten between their markers:

    python3 tools/spec_sizes.py             # rewrite both pages
    python3 tools/spec_sizes.py --check     # exit 1 if either is stale
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from generator.scopes import PROTOCOL_METHODS
from generator.vllm_manifest import VLLM_VERSION, find_vllm_wheel

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"
TABLE_PATH = REPO / "docs" / "spec-sizes.md"

#: Where each spec's hand-written counterpart lives in the wheel: the class is
#: the one in the first file that defines a protocol method; a further file
#: holds the class it inherits the other protocol methods from (GLM-5-Next).
VLLM_SOURCES = {
    "cohere_compass": "vllm/model_executor/models/cohere_compass.py",
    "deepseek_ocr": "vllm/model_executor/models/deepseek_ocr.py",
    "deepseek_v41": "vllm/models/deepseek_v41/common/vl_cudagraph.py",
    "deepseek_vl2": "vllm/model_executor/models/deepseek_vl2.py",
    "ernie45_vl": "vllm/model_executor/models/ernie45_vl.py",
    "gemma3_mm": "vllm/model_executor/models/gemma3_mm.py",
    "gemma4_mm": "vllm/model_executor/models/gemma4_mm.py",
    "glm4_1v": "vllm/model_executor/models/glm4_1v.py",
    "glm5_next": (
        "vllm/models/glm5next/common/model.py",
        "vllm/model_executor/models/glm4_1v.py",
    ),
    "idefics3": "vllm/model_executor/models/idefics3.py",
    "internvl": "vllm/model_executor/models/internvl.py",
    "kimi_k25": "vllm/model_executor/models/kimi_k25.py",
    "kimi_k3": "vllm/models/kimi_k3/nvidia/model.py",
    "kimi_vl": "vllm/model_executor/models/kimi_vl.py",
    "lfm2_vl": "vllm/model_executor/models/lfm2_vl.py",
    "minicpmv": "vllm/model_executor/models/minicpmv.py",
    "minimax_m3": "vllm/models/minimax_m3/common/encoder_cudagraph.py",
    "mllama4": "vllm/model_executor/models/mllama4.py",
    "qwen2_5_vl": "vllm/model_executor/models/qwen2_5_vl.py",
    "qwen2_vl": "vllm/model_executor/models/qwen2_vl.py",
    "qwen3_vl": "vllm/model_executor/models/qwen3_vl.py",
    "step3_vl": "vllm/model_executor/models/step3_vl.py",
}

#: Specs of models vLLM 0.33.0 does not graph (docs/beyond-catalog.md): no
#: hand-written mixin exists, so each is measured against the one of the
#: catalog model with the same encoder shape, an estimate of what a
#: hand-written mixin for it would cost.
ESTIMATED_BY = {
    "cohere2_vision": "internvl",
    "qwen2_5_omni": "qwen2_5_vl",
    "pixtral": "qwen2_vl",
    "eagle2_5_vl": "internvl",
    "dots_ocr": "qwen2_vl",
    "paddleocr_vl": "qwen2_vl",
    "skyworkr1v": "internvl",
    "qwen3_omni": "qwen3_vl",
    "mistral3": "qwen2_vl",
    "phi3v": "deepseek_ocr",
    "phi4mm": "deepseek_ocr",
    "paligemma": "gemma3_mm",
    "llava_next": "internvl",
}


@dataclass(frozen=True)
class HandWritten:
    """The hand-written protocol code of one vLLM class."""

    path: str
    class_name: str
    methods: tuple[str, ...]
    code_lines: int
    #: The class the protocol methods not defined here come from, if any.
    inherits_from: str | None = None


@dataclass(frozen=True)
class Row:
    stem: str
    spec_lines: int
    vllm: HandWritten
    #: The catalog spec whose hand-written mixin stands in, for a spec of a
    #: model vLLM does not graph.
    estimated_by: str | None = None

    @property
    def ratio(self) -> float:
        return self.spec_lines / self.vllm.code_lines


# ---------------------------------------------------------------------------
# Counting
# ---------------------------------------------------------------------------


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of every docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)
        ):
            continue
        body = node.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _token_lines(source: str) -> set[int]:
    """Lines on which a token other than a comment or a newline starts or runs."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT}
    skip |= {tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def python_code_lines(source: str, nodes: Iterable[ast.AST], tree: ast.AST) -> int:
    """Code lines of ``nodes`` (decorators included) within ``source``."""
    code = _token_lines(source) - _docstring_lines(tree)
    spans: set[int] = set()
    for node in nodes:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        spans.update(range(first, node.end_lineno + 1))
    return len(spans & code)


def yaml_code_lines(text: str) -> int:
    """Lines of a spec that are neither blank, comments, nor the docstring."""
    count = 0
    in_docstring = False
    for line in text.splitlines():
        stripped = line.strip()
        if in_docstring:
            if not stripped or line.startswith((" ", "\t")):
                continue
            in_docstring = False
        if not stripped or stripped.startswith("#"):
            continue
        if line.startswith("docstring:"):
            in_docstring = stripped in {"docstring: |", "docstring: >"}
            continue
        count += 1
    return count


# ---------------------------------------------------------------------------
# vLLM's side
# ---------------------------------------------------------------------------


def _self_calls(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "self"
        ):
            yield sub.attr


def _protocol_class(tree: ast.Module, path: str) -> ast.ClassDef:
    """The class of ``tree`` that defines the most protocol methods."""
    best, count = None, 0
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            n = sum(
                isinstance(item, ast.FunctionDef) and item.name in PROTOCOL_METHODS
                for item in node.body
            )
            if n > count:
                best, count = node, n
    if best is None:
        raise LookupError(f"{path}: no class defines a protocol method")
    return best


def _own_methods(klass: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {
        item.name: item
        for item in klass.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _counted(
    defs: dict[str, ast.FunctionDef], kept: frozenset[str] = frozenset()
) -> list[str]:
    """Protocol methods, then the private helpers only they call.

    A helper that the model's other methods also call (its own eager
    ``_process_image_input``, say) predates the mixin and is not counted;
    nor is one the spec calls itself (``kept``, its ``host_methods``): the
    generated mixin leaves it in the model, so it replaces nothing.
    """
    counted = [name for name in PROTOCOL_METHODS if name in defs]
    callers: dict[str, set[str]] = {name: {"<the spec>"} for name in kept}
    for name, node in defs.items():
        for attr in _self_calls(node):
            if attr in defs and attr != name:
                callers.setdefault(attr, set()).add(name)
    changed = True
    while changed:
        changed = False
        for name in defs:
            if (
                name.startswith("_")
                and not name.startswith("__")
                and name not in counted
                and callers.get(name)
                and callers[name] <= set(counted)
            ):
                counted.append(name)
                changed = True
    return counted


def hand_written(
    wheel: zipfile.ZipFile,
    sources: str | tuple[str, ...],
    kept: frozenset[str] = frozenset(),
) -> HandWritten:
    """The counted methods of a model's class (``kept``: helpers the spec
    calls, see :func:`_counted`); later files supply what the first file's
    class inherits."""
    paths = (sources,) if isinstance(sources, str) else sources
    total, methods, classes = 0, [], []
    for path in paths:
        source = wheel.read(path).decode()
        tree = ast.parse(source)
        klass = _protocol_class(tree, path)
        defs = _own_methods(klass)
        names = [name for name in _counted(defs, kept) if name not in methods]
        methods += names
        classes.append(klass.name)
        total += python_code_lines(source, [defs[n] for n in names], tree)
    base = classes[1] if len(classes) > 1 else None
    return HandWritten(paths[0], classes[0], tuple(methods), total, base)


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


def measure(wheel: zipfile.ZipFile, specs: Path = SPECS) -> list[Row]:
    rows = []
    for spec in sorted(specs.glob("*.yaml")):
        estimated_by = ESTIMATED_BY.get(spec.stem)
        source = VLLM_SOURCES.get(estimated_by or spec.stem)
        if source is None:
            raise LookupError(
                f"{spec.name}: no vLLM source known; add it to VLLM_SOURCES"
            )
        text = spec.read_text()
        rows.append(
            Row(
                spec.stem,
                yaml_code_lines(text),
                hand_written(wheel, source, _kept(spec)),
                estimated_by,
            )
        )
    return rows


def _kept(spec: Path) -> frozenset[str]:
    """The host model's methods a spec calls (``host_methods``; a dotted
    entry is a method of a host attribute, not of the model)."""
    from generator.resolve import load_spec

    return frozenset(m for m in load_spec(spec).host_methods if "." not in m)


def _inherited(hand: HandWritten) -> str:
    if hand.inherits_from is None:
        return ""
    return f", most inherited from `{hand.inherits_from}`"


def render(rows: list[Row]) -> str:
    out = [
        "# Spec sizes against vLLM's hand-written mixins",
        "",
        "<!-- Written by `python3 tools/spec_sizes.py`; CI checks it is current. -->",
        "",
        f"Each spec in `specs/` against the hand-written code of vLLM {VLLM_VERSION} it",
        "replaces: the protocol methods the model's class defines and the private",
        "methods of that class they call (transitively). Both sides count *code",
        "lines*: no blank lines, no comment-only lines, no docstrings (for a spec:",
        "no `docstring:` block). vLLM's code is read from the wheel with `ast`.",
        "A private helper is counted when only counted methods call it (the",
        "model's own eager helpers predate the mixin and are left out), unless",
        "the spec calls it itself (`host_methods`: it stays in the model). A class",
        "that inherits protocol methods (GLM-5-Next from GLM-4.1V) is measured",
        "with them: its generated mixin is a complete drop-in, as its spec is.",
        "Method by method, for three models: [side-by-side.md](side-by-side.md).",
        "",
        "| spec | spec lines | vLLM class | vLLM lines | ratio |",
        "|---|---:|---|---:|---:|",
    ]
    catalog = [row for row in rows if row.estimated_by is None]
    out += [_table_row(row) for row in catalog]
    if catalog:
        mean = sum(row.ratio for row in catalog) / len(catalog)
        spec_total = sum(row.spec_lines for row in catalog)
        vllm_total = sum(row.vllm.code_lines for row in catalog)
        out += [
            "",
            f"{len(catalog)} specs: mean ratio **{mean:.2f}**; in total {spec_total} "
            f"spec lines against {vllm_total} hand-written lines "
            f"({spec_total / vllm_total:.2f}). Issue #14's target is a mean of at "
            "most 0.50.",
        ]
    beyond = [row for row in rows if row.estimated_by is not None]
    if beyond:
        out += [
            "",
            "## Models vLLM does not graph",
            "",
            "No hand-written mixin exists for these (docs/beyond-catalog.md): each",
            "spec is measured against the hand-written mixin of the catalog model",
            "with the same encoder shape, an estimate of what it replaces.",
            "",
            "| spec | spec lines | estimated by | vLLM class | vLLM lines | ratio |",
            "|---|---:|---|---|---:|---:|",
        ]
        out += [_table_row(row, f" `{row.estimated_by}` |") for row in beyond]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# Side by side: three generated modules against vLLM's mixins, method by method
# ---------------------------------------------------------------------------

SIDE_BY_SIDE_PATH = REPO / "docs" / "side-by-side.md"
GENERATED_VLLM = REPO / "generated" / "vllm"
#: The models compared method by method in ``docs/side-by-side.md``.
SIDE_BY_SIDE = ("minimax_m3", "qwen2_vl", "internvl")
_TABLE_START = "<!-- table: {} (written by tools/spec_sizes.py) -->"
_TABLE_END = "<!-- end of table -->"


@dataclass(frozen=True)
class Lines:
    """One method's (or helper's) lines: code, and prose (comment-only
    lines and docstrings)."""

    code: int
    prose: int


def prose_lines(source: str, tree: ast.AST) -> set[int]:
    """Lines that hold only a comment, and docstring lines."""
    comments = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    return (comments - _token_lines(source)) | _docstring_lines(tree)


def _span(node: ast.AST) -> set[int]:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return set(range(first, node.end_lineno + 1))


def method_lines(source: str, nodes: dict[str, ast.AST]) -> dict[str, Lines]:
    """Code and prose lines of each named node of ``source``."""
    tree = ast.parse(source)
    prose = prose_lines(source, tree)
    return {
        name: Lines(python_code_lines(source, [node], tree), len(_span(node) & prose))
        for name, node in nodes.items()
    }


def vllm_methods(wheel: zipfile.ZipFile, stem: str) -> dict[str, Lines]:
    """The counted methods of vLLM's class for ``stem`` (as in the sizes
    table), in the order :func:`_counted` gives."""
    path = VLLM_SOURCES[stem]
    source = wheel.read(path).decode()
    defs = _own_methods(_protocol_class(ast.parse(source), path))
    names = _counted(defs, _kept(SPECS / f"{stem}.yaml"))
    return method_lines(source, {name: defs[name] for name in names})


def generated_methods(source: str) -> dict[str, Lines]:
    """The generated module's class methods in their order, then its
    module-level helper functions (the hand-written mixins hold their
    helpers as methods; the generated module holds the stateless ones at
    module level)."""
    tree = ast.parse(source)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    nodes: dict[str, ast.AST] = dict(_own_methods(klass))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            nodes[node.name] = node
    return method_lines(source, nodes)


def side_by_side_table(vllm: dict[str, Lines], generated: dict[str, Lines]) -> str:
    """The protocol methods in protocol order, then each side's helpers."""
    protocol = [m for m in PROTOCOL_METHODS if m in vllm or m in generated]
    helpers = [m for m in vllm if m not in protocol]
    helpers += [m for m in generated if m not in protocol and m not in helpers]
    out = [
        "| method | vLLM code | vLLM prose | generated code | generated prose |",
        "|---|---:|---:|---:|---:|",
    ]

    def cells(side: dict[str, Lines], name: str) -> str:
        lines = side.get(name)
        return "– | –" if lines is None else f"{lines.code} | {lines.prose}"

    for name in protocol + helpers:
        out.append(f"| `{name}` | {cells(vllm, name)} | {cells(generated, name)} |")
    totals = [
        Lines(sum(v.code for v in side.values()), sum(v.prose for v in side.values()))
        for side in (vllm, generated)
    ]
    out.append(
        f"| **total** | {totals[0].code} | {totals[0].prose} | "
        f"{totals[1].code} | {totals[1].prose} |"
    )
    return "\n".join(out)


def side_by_side_page(wheel: zipfile.ZipFile, page: str) -> str:
    """``page`` with each model's table rewritten between its markers."""
    for stem in SIDE_BY_SIDE:
        start, end = _TABLE_START.format(stem), _TABLE_END
        head, found, rest = page.partition(start + "\n")
        if not found or end not in rest:
            raise LookupError(f"{SIDE_BY_SIDE_PATH.name}: no table markers for {stem}")
        generated = (GENERATED_VLLM / f"{stem}.py").read_text(encoding="utf-8")
        table = side_by_side_table(
            vllm_methods(wheel, stem), generated_methods(generated)
        )
        page = head + start + "\n" + table + "\n" + end + rest.split(end, 1)[1]
    return page


def _table_row(row: Row, estimate: str = "") -> str:
    return (
        f"| `{row.stem}` | {row.spec_lines} |{estimate} `{row.vllm.class_name}` "
        f"(`{row.vllm.path.rsplit('/', 1)[-1]}`, {len(row.vllm.methods)} "
        f"methods{_inherited(row.vllm)}) | {row.vllm.code_lines} | "
        f"{row.ratio:.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if stale")
    args = parser.parse_args(argv)
    path = find_vllm_wheel()
    if path is None:
        print("spec_sizes: the vLLM wheel was not found", file=sys.stderr)
        return 2
    wheel = zipfile.ZipFile(path)
    pages = {
        TABLE_PATH: render(measure(wheel)),
        SIDE_BY_SIDE_PATH: side_by_side_page(wheel, SIDE_BY_SIDE_PATH.read_text()),
    }
    stale = [p for p, text in pages.items() if p.read_text() != text]
    if args.check:
        for page in stale:
            print(f"{page.relative_to(REPO)} is stale: run tools/spec_sizes.py")
        return 1 if stale else 0
    for page, text in pages.items():
        page.write_text(text)
    print(pages[TABLE_PATH], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
