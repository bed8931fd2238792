"""Property-based fuzzing of the whole command, as a black box.

Three families of inputs, each given to ``generator.cli.main`` in this
process (captured streams, a fresh output folder):

* structural mutations of the project's specs: keys dropped, duplicated,
  renamed or retyped, values swapped between fields, deep nesting, huge
  numbers, odd Unicode, Python and template injection attempts, YAML
  features (anchors, tags, merge keys, several documents, block scalars);
* textual mutations of a spec's bytes: flipped bytes, truncation, inserted
  or doubled lines, a BOM, CRLF line ends;
* command lines: every option and subcommand with odd values, odd paths
  (folders, devices, missing files, names that cannot be modules);
* the step language: a grammar of attribute chains, calls, subscripts,
  ``next``, ``format`` and string literals over the names a step can reach
  (its buffers and inputs, the host, ``torch``), and extra ``host_methods``
  declarations. A module generated from one is read back: every attribute
  and call of the step's code is in the allow-lists of
  ``generator/spec/step_language.py`` or a declared host path.
* per-item post-processing steps: the valid corpus's
  ``postprocess_reads_inputs.yaml`` with its last step drawn from the same
  grammar (``int(...)`` included, which graph and eager steps refuse); a
  generated step reaches only the allow-lists and calls ``int`` on one value.
* loops over a host module list: the valid corpus's ``module_loop.yaml`` with
  its graph loop's variable, module list or carry redrawn, body steps added
  (other targets, the variable read or passed, chains), nested loops and
  odd keys. A generated loop runs over a path under ``self.visual`` that is
  no ``torch.nn.Module`` API, rebinds one name, calls its variable only, and
  its body reaches only the allow-lists.
* per-item builders: the valid corpus's ``per_item_builder.yaml`` with a step
  of its per-item builder drawn as for the step language (over the item's
  dims, its locals, the batch's inputs and buffers, the host), its flag
  redrawn, a later builder reading a drawn name. A generated per-item loop
  iterates names into names, binds the steps' names, appends each buffer to
  ``by_item``, and its steps reach only the allow-lists.

Whatever the input: nothing but ``SystemExit`` escapes; the exit code is 0,
2, or 1 where ``--check`` or ``plan`` report; the call takes less than
:data:`CPU_LIMIT_S` CPU seconds; on 2 nothing is written and standard error
holds only located diagnostics and one-line errors; on 0 every written
module is UTF-8 as Python reads it, parses, and holds at top level only
imports, definitions, assignments of literals, ``if TYPE_CHECKING`` blocks
and docstrings, with no call in anything evaluated on import and no
injected name.

The first three families know nothing of the spec format beyond the files
in ``specs/``, so they keep working while the resolver changes; the step
language family starts from the valid corpus's ``step_language.yaml``. CI runs them
derandomized: the same 2,300 examples every time (about 65 s of one core
of the development machine). ``GEN_MIXIN_FUZZ_EXAMPLES=N`` multiplies the examples
by ``N / 100`` and draws them at random, for a longer hunt.
"""

from __future__ import annotations

import ast
import copy
import io
import json
import os
import re
import tempfile
import time
import tokenize
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from genmixin_testlib import (
    DIAG_RE,
    SUMMARY_RE,
    run_main,
    spec_paths,
    valid_corpus_paths,
)
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from generator.import_rules import TARGET_ROOTS
from generator.formulas import TORCH_DTYPES, TORCH_FUNCTIONS
from generator.spec.step_language import (
    MODULE_API,
    OUTPUT_FIELDS,
    PARAMETER_FACTS,
    STEP_KEYWORDS,
    TENSOR_ATTRIBUTES,
    TENSOR_METHODS,
)

#: Valid-corpus specs the fuzz starts from too: constructs no spec of
#: ``specs/`` uses yet or uses in one form only (a tensors input; a vLLM-only
#: import; per-item builders).
CORPUS_STARTS = (
    "tensor_images",
    "vllm_only_import",
    "per_item_builder",
    "per_item_tensors",
    "count_steps",
)
SPECS = {p.stem: p.read_text(encoding="utf-8") for p in spec_paths()} | {
    p.stem: p.read_text(encoding="utf-8")
    for p in valid_corpus_paths()
    if p.stem in CORPUS_STARTS
}
TREES = {stem: yaml.safe_load(text) for stem, text in SPECS.items()}
_SCALE = int(os.environ.get("GEN_MIXIN_FUZZ_EXAMPLES", "100"))
CPU_LIMIT_S = 2.0


def _settings(examples: int):
    return settings(
        max_examples=examples * _SCALE // 100,
        deadline=None,
        database=None,
        derandomize="GEN_MIXIN_FUZZ_EXAMPLES" not in os.environ,
        suppress_health_check=list(HealthCheck),
    )


# -- what a run may do ---------------------------------------------------------

# Every payload carries PWNED, so it can be recognised in the output.
PAYLOADS = [
    "__import__('os').system('PWNED')",
    "exec('PWNED')",
    "PWNED",
    "PWNED()",
    "vision_tower.__class__.__bases__[0].__subclasses__()  # PWNED",
    "x; import PWNED",
    "1\nimport PWNED",
    "1 # PWNED",
    "lambda: PWNED",
    "(PWNED := 1)",
    "[PWNED for PWNED in ()]",
    "'PWNED'",
    'f"{PWNED}"',
    '"""PWNED"""',
    'PWNED"); import os; ("',
    "PWNED'''; import os; '''",
    "getattr(PWNED, 'x')",
    "t * h * w // PWNED",
    "PWNED if 1 else 2",
    "open('/etc/PWNED')",
    "ceil_div(PWNED, 2)",
    "\\PWNED",
    "PWNED\r\nimport os",
    "PWNED\u2028import os",
    "PWNED {{ 1 }} {% raw %}",
    "}}{{ PWNED }}{{",
    "\u0420WNED = 1",
    "+AAo-import PWNED+AAo-",  # a line break in UTF-7
    "vllmPWNED.models",
    "reference_towers.PWNED",
]
ODD_TEXT = [
    "",
    " ",
    "ünïcödé ✓ 名前 — «quoted»",
    "\u202eevil\u202c",  # right-to-left override
    "e\u0301",  # a combining accent
    "\u200b",  # zero width space
    "ﬁle",  # NFKC: file
    "\ufeff",
    "a {brace} and {{double}} and %s and $x and `tick`",
    "ends with a quote'",
    'ends with a quote"',
    "line one\nline two\n\n- a list item\n  indented",
    "tab\there",
    "x" * 500,
    "# coding: utf-7",
    "# fmt: off",
    "True",
    "None",
    "__init__",
    "t * h * w",
]
# Built-ins that reach generated code only through an injection.
DANGEROUS_NAMES = {
    "__import__",
    "__builtins__",
    "exec",
    "eval",
    "compile",
    "open",
    "getattr",
    "setattr",
    "delattr",
    "globals",
    "locals",
    "vars",
    "breakpoint",
    "input",
    "os",
    "sys",
    "subprocess",
}
#: The packages a generated module may import from.
IMPORT_ROOTS = {
    "__future__",
    "collections",
    "typing",
    "itertools",
    "math",  # ceil_sqrt prints as math.isqrt
    "weakref",
    "inspect",  # the callee check tells a static method of a module's class
    "torch",
    "vllm",
    "encoder_cudagraph_runtime",
    "reference_towers",
    "generated",
}
SAFE_DECORATORS = {"staticmethod", "classmethod", "property"}


def _import_time_expressions(tree: ast.Module) -> list[ast.expr]:
    """Every expression Python evaluates when it imports the module (class
    bodies, bases, decorators, defaults and annotations included)."""
    out: list[ast.expr] = []

    def definition(node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        out.extend(node.decorator_list)
        out.extend(d for d in args.defaults + args.kw_defaults if d is not None)
        every = args.posonlyargs + args.args + args.kwonlyargs
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        out.extend(a.annotation for a in every if a.annotation is not None)
        if node.returns is not None:
            out.append(node.returns)

    def statements(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                definition(node)
            elif isinstance(node, ast.ClassDef):
                out.extend(node.decorator_list + node.bases)
                out.extend(k.value for k in node.keywords)
                statements(node.body)
            elif isinstance(node, ast.Assign):
                out.append(node.value)
            elif isinstance(node, ast.AnnAssign):
                out.append(node.annotation)
                if node.value is not None:
                    out.append(node.value)
            elif isinstance(node, ast.Expr):
                out.append(node.value)
            elif isinstance(node, ast.If):
                out.append(node.test)
                statements(node.body + node.orelse)

    statements(tree.body)
    return out


def assert_inert_module(source: bytes, log: object = "") -> None:
    """What importing the module may do: import, define, bind literals."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    assert encoding == "utf-8", f"the module declares {encoding!r} ({log})"
    tree = ast.parse(source)
    for node in tree.body:
        ok = isinstance(
            node,
            (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign),
        )
        ok = ok or isinstance(node, ast.AnnAssign) and node.value is None
        ok = ok or isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if isinstance(node, ast.If):
            ok = ast.unparse(node.test) == "TYPE_CHECKING" and not node.orelse
            ok = ok and all(
                isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body
            )
        assert ok, f"top-level {ast.unparse(node)[:120]!r} ({log})"
        if isinstance(node, ast.Assign):
            ast.literal_eval(node.value)  # raises unless a literal
    for expr in _import_time_expressions(tree):
        for sub in ast.walk(expr):
            assert not isinstance(
                sub, (ast.Call, ast.NamedExpr, ast.Lambda)
            ), f"{ast.unparse(expr)[:120]!r} runs on import ({log})"
    # A constant's fallback reads a public attribute that may be missing:
    # getattr(x, "name", None) with a literal, public name is attribute access.
    plain_getattr = {
        id(node.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) == 3
        and not node.keywords
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and node.args[1].value.isidentifier()
        and not node.args[1].value.startswith("_")
        and "PWNED" not in node.args[1].value
        and isinstance(node.args[2], ast.Constant)
        and node.args[2].value is None
    }
    # The callee check walks a declared host path, part by part: its parts
    # are public names the spec reader checked, and what it reads it only
    # tests (isinstance), never calls.
    plain_getattr |= {
        id(node.func)
        for walk in tree.body
        if isinstance(walk, ast.FunctionDef)
        and walk.name in ("_host_modules", "_require_module_callee")
        for node in ast.walk(walk)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
    }
    for node in ast.walk(tree):
        bad = None
        if isinstance(node, ast.Name) and (
            "PWNED" in node.id or node.id in DANGEROUS_NAMES
        ):
            bad = None if id(node) in plain_getattr else node.id
        elif isinstance(node, ast.Attribute) and "PWNED" in node.attr:
            bad = node.attr
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            roots = {m.split(".")[0] for m in modules}
            if roots - IMPORT_ROOTS or any("PWNED" in m for m in modules):
                bad = ", ".join(modules)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for deco in node.decorator_list:
                if not (isinstance(deco, ast.Name) and deco.id in SAFE_DECORATORS):
                    bad = f"@{ast.unparse(deco)}"
        assert bad is None, f"{bad!r} at line {node.lineno} ({log})"


@contextmanager
def _workspace():
    """A fresh folder, also the working directory (a command line without
    ``--out`` writes ``generated/`` there, not into the repository)."""
    before = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(before)


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.exists():
            out[str(path)] = b"<link>"
        elif path.is_file() and not _is_special(path):
            out[str(path)] = path.read_bytes()
        else:
            out[str(path)] = None
    return out


def _is_special(path: Path) -> bool:
    import stat

    return not stat.S_ISREG(path.lstat().st_mode)


def _run(argv: list[str], log: object) -> tuple[int, str, str]:
    start = time.process_time()
    try:
        rc, stdout, stderr = run_main(argv)
    except BaseException as exc:  # anything but SystemExit is a bug
        raise AssertionError(f"{type(exc).__name__}: {exc} after {log}") from exc
    spent = time.process_time() - start
    assert spent < CPU_LIMIT_S, f"{spent:.1f} s CPU for {log}"
    assert "Traceback" not in stderr, f"{stderr[-2000:]} ({log})"
    if currently_in_test_context():
        event(f"exit {rc}")
    return rc, stdout, stderr


#: argparse's report of a bad command line: the usage (wrapped) and the error.
USAGE_RE = re.compile(r"(usage: gen-mixin| {2,}\S|gen-mixin( plan| schema)?: error: )")


def _vllm_module_or_reported(text: str, name: str, log: object) -> str | None:
    """The vLLM module ``text`` (a spec saved as ``specs/<name>``) generates,
    or None after checking that its exit 2 reports located diagnostics."""
    with _workspace() as folder:
        spec = folder / "specs" / name
        spec.parent.mkdir()
        spec.write_text(text, encoding="utf-8")
        rc, stdout, stderr = _run([str(spec), "--stdout", "--target", "vllm"], log)
    assert rc in (0, 2), f"exit {rc} after {log}\n{stderr[-2000:]}"
    if rc == 2:
        _assert_reported(stderr, log)
        return None
    return stdout


def _assert_reported(stderr: str, log: object) -> None:
    """Exit 2: located diagnostics with their count, one-line errors, or
    argparse's usage and error."""
    lines = stderr.rstrip("\n").split("\n")
    assert lines and lines[0], f"exit 2 without a message ({log})"
    for line in lines:
        assert (
            DIAG_RE.match(line)
            or SUMMARY_RE.match(line)
            or line.startswith("gen-mixin: error: ")
            or USAGE_RE.match(line)
        ), f"not a diagnostic: {line!r} ({log})"


def _assert_outcome(
    rc: int, stderr: str, before: dict, folder: Path, log: object, *, stale_ok: bool
) -> None:
    allowed = (0, 1, 2) if stale_ok else (0, 2)
    assert rc in allowed, f"exit {rc} after {log}\n{stderr[-2000:]}"
    after = _snapshot(folder)
    if rc != 0:
        assert after == before, f"exit {rc} changed {set(after) ^ set(before)} ({log})"
        if rc == 2:
            _assert_reported(stderr, log)
        return
    for name in sorted(set(after) - set(before)):
        if name.endswith(".py") and after[name] is not None:
            assert_inert_module(after[name], log)


# -- structural mutations --------------------------------------------------------

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=30,
)
_numbers = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30]),
    # Up to 4000 digits: more cannot be dumped (the text feature "big" has them).
    st.integers(min_value=1, max_value=4000).map(lambda n: 10**n - 1),
    st.floats(allow_nan=True, allow_infinity=True),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _numbers,
    _text,
    st.sampled_from(PAYLOADS),
    st.sampled_from(ODD_TEXT),
)
_values = st.one_of(
    _scalars,
    st.recursive(
        _scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.one_of(_text, st.sampled_from(PAYLOADS)), inner, max_size=4
            ),
        ),
        max_leaves=6,
    ),
)


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a mapping entry or list element of ``tree``."""
    out: list[tuple] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.append((*prefix, key))
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out.append((*prefix, i))
            out.extend(_paths(value, (*prefix, i)))
    return out


def _parent(tree: Any, path: tuple) -> Any:
    for part in path[:-1]:
        tree = tree[part]
    return tree


def _retyped(value: Any) -> Any:
    """The same content in another YAML type."""
    if isinstance(value, dict):
        return [[k, v] for k, v in value.items()]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, str):
        return [value]
    return str(value)


def _nested(value: Any, kinds: list[bool]) -> Any:
    for as_list in kinds:
        value = [value] if as_list else {"k": value}
    return value


OPERATIONS = [
    "delete",
    "rename",
    "replace",
    "retype",
    "swap",
    "inject",
    "nest",
    "number",
    "odd text",
    "prose",
]


@st.composite
def mutated_trees(draw) -> tuple[str, Any, list[str]]:
    stem = draw(st.sampled_from(sorted(TREES)))
    tree = copy.deepcopy(TREES[stem])
    log: list[str] = [stem]
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(tree)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, last = _parent(tree, path), path[-1]
        op = draw(st.sampled_from(OPERATIONS))
        log.append(f"{op} {path!r}")
        if op == "delete":
            del parent[last]
        elif op == "rename" and isinstance(parent, dict):
            keys = sorted({k for t in TREES.values() for k in t})
            new = draw(
                st.one_of(
                    st.sampled_from(keys),
                    st.sampled_from(PAYLOADS + ODD_TEXT),
                    st.just(str(last) + "s"),
                    _text,
                )
            )
            parent[new] = parent.pop(last)
        elif op == "retype":
            parent[last] = _retyped(parent[last])
        elif op == "swap":
            other = draw(st.sampled_from(paths))
            try:
                other_parent = _parent(tree, other)
                parent[last], other_parent[other[-1]] = (
                    copy.deepcopy(other_parent[other[-1]]),
                    copy.deepcopy(parent[last]),
                )
            except (KeyError, IndexError, TypeError):
                pass  # one path lies inside the other
        elif op == "inject":
            value, payload = parent[last], draw(st.sampled_from(PAYLOADS))
            if isinstance(value, str) and draw(st.booleans()):
                at = draw(st.integers(min_value=0, max_value=len(value)))
                parent[last] = value[:at] + payload + value[at:]
            else:
                parent[last] = payload
        elif op == "nest":
            depth = draw(st.integers(min_value=1, max_value=80))
            kinds = draw(st.lists(st.booleans(), min_size=depth, max_size=depth))
            parent[last] = _nested(parent[last], kinds)
        elif op == "number":
            parent[last] = draw(_numbers)
        elif op == "odd text":
            parent[last] = draw(st.sampled_from(ODD_TEXT))
        elif op == "prose":
            # Free text stays valid, so the payload reaches the renderer.
            prose = [p for p in paths if p[-1] in ("name", "docstring", "why", "hint")]
            if prose:
                where = draw(st.sampled_from(prose))
                text = draw(st.sampled_from(PAYLOADS + ODD_TEXT))
                _parent(tree, where)[where[-1]] = text
        else:
            parent[last] = draw(_values)
    return stem, tree, log


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: 7x faster


def _dump(tree: Any, unicode: bool) -> str:
    return yaml.dump(
        tree, Dumper=_DUMPER, allow_unicode=unicode, sort_keys=False, width=10**6
    )


#: YAML features spliced into a dumped spec: (where, text).
YAML_FEATURES = [
    ("end", "\n---\nname: second document\n"),
    ("end", "\nx: &a [1, 2]\ny: *a\n"),
    ("end", "\n<<: {name: merged}\n"),
    ("end", "\nboom: !!python/object/apply:os.system ['echo PWNED']\n"),
    ("end", "\ntagged: !custom PWNED\n"),
    ("end", "\n? complex key\n: value\n"),
    ("end", "\nblock: |2-\n    indented\n  less\n"),
    ("end", "\nlong: " + "1:" * 300 + "1\n"),
    ("end", "\nbig: " + "9" * 4400 + "\n"),
    ("end", "\nflow: " + "[" * 200 + "]" * 200 + "\n"),
    ("end", "\n%YAML 1.1\n"),
    ("start", "%YAML 1.2\n---\n"),
    ("start", "\ufeff"),
    ("start", "# coding: utf-7\n"),
    ("line", "name: duplicated\n"),
    ("line", "  \t mixed: indentation\n"),
]


# One target: a valid spec costs its rendering (about 0.1 s a target); the
# command-line family and test_gen_hostile_input.py generate both.
_targets = st.sampled_from(["vllm", "standalone"])


@_settings(700)
@given(
    case=mutated_trees(),
    unicode=st.booleans(),
    feature=st.one_of(st.none(), st.sampled_from(YAML_FEATURES)),
    at=st.integers(min_value=0, max_value=10**6),
    target=_targets,
)
def test_mutated_specs_are_reported_or_generated_safely(
    case, unicode: bool, feature, at: int, target: str
) -> None:
    stem, tree, log = case
    text = _dump(tree, unicode)
    if feature is not None:
        where, snippet = feature
        log.append(f"yaml {snippet[:30]!r}")
        if where == "start":
            text = snippet + text
        elif where == "end":
            text += snippet
        else:
            lines = text.splitlines(keepends=True)
            lines.insert(at % (len(lines) + 1), snippet)
            text = "".join(lines)
    _check_one_spec(text.encode("utf-8"), f"{stem}.yaml", target, log)


def _check_one_spec(data: bytes, name: str, target: str, log: object) -> None:
    with _workspace() as folder:
        spec = folder / "specs" / name
        spec.parent.mkdir()
        spec.write_bytes(data)
        before = _snapshot(folder)
        rc, _, stderr = _run([str(spec), "--out", "out", "--target", target], log)
        _assert_outcome(rc, stderr, before, folder, log, stale_ok=False)
        if rc == 2:
            for line in stderr.splitlines():
                m = DIAG_RE.match(line)
                assert m is None or m["file"] == str(spec), line


#: What a tensors input's dims and shape entries are drawn from: its dims,
#: other dims, constants, formulas over them, numbers and payloads.
TENSORS_ENTRIES = ["h", "w", "c", "channels", "patch", "2 * h", "h + 1", "side * patch"]


@st.composite
def tensors_inputs(draw) -> tuple[Any, list[str]]:
    """``tensor_images`` with its tensors input redrawn: dims, shape,
    divisors and pad value from names, formulas, numbers and payloads."""
    tree = copy.deepcopy(TREES["tensor_images"])
    entry = tree["inputs"]["pixel_values"]
    names = st.sampled_from(TENSORS_ENTRIES + PAYLOADS)
    # Permutations reach generation (channels last, dims in another order);
    # the free lists mostly the refusals.
    entry["dims"] = draw(
        st.one_of(st.permutations(["h", "w"]), st.lists(names, max_size=4))
    )
    entry["shape"] = draw(
        st.one_of(
            st.just(entry["shape"]),
            st.permutations(["channels", "h", "w"]),
            st.lists(st.one_of(names, _numbers), max_size=5),
        )
    )
    if draw(st.integers(min_value=0, max_value=2)) == 0:
        entry["multiple_of"] = draw(st.dictionaries(names, st.one_of(names, _numbers)))
    if draw(st.integers(min_value=0, max_value=2)) == 0:
        entry["pad_value"] = draw(st.one_of(_numbers, names))
    log = [f"dims {entry['dims']!r}", f"shape {entry['shape']!r}"]
    return tree, log


@_settings(60)
@given(case=tensors_inputs(), target=_targets)
def test_tensors_inputs_are_reported_or_generated_safely(case, target: str) -> None:
    tree, log = case
    _check_one_spec(_dump(tree, True).encode(), "tensor_images.yaml", target, log)


#: What an import's modules are drawn from: vLLM's module that binds the name,
#: one that does not, other packages, this project's modules, payloads.
IMPORT_MODULES = [
    "vllm.model_executor.models.llava_next",
    "vllm.model_executor.models.llava",
    "vllm",
    "transformers.models.llava_next.modeling_llava_next",
    "reference_towers.registry",
    "encoder_cudagraph_runtime.defs",
    "os",
    "generated.vllm.qwen2_vl",
]


@st.composite
def import_entries(draw) -> tuple[Any, list[str]]:
    """``vllm_only_import`` with its import's modules redrawn, each present
    or not (a vLLM-only import, a stand-in, neither)."""
    tree = copy.deepcopy(TREES["vllm_only_import"])
    modules = st.sampled_from(IMPORT_MODULES + PAYLOADS)
    entry = {
        key: draw(modules)
        for key in ("vllm", "standalone")
        if draw(st.integers(min_value=0, max_value=2))
    }
    tree["imports"]["unpad_image"] = entry
    return tree, [f"imports {entry!r}"]


@_settings(60)
@given(case=import_entries(), target=st.sampled_from(["vllm", "standalone", "all"]))
def test_import_entries_generate_only_allowed_targets(case, target: str) -> None:
    """An import refused or accepted as its modules' allow-lists say; a
    generation writes a module only for a target the import has a module in."""
    tree, log = case
    entry = tree["imports"]["unpad_image"]
    with _workspace() as folder:
        spec = folder / "specs" / "vllm_only_import.yaml"
        spec.parent.mkdir()
        spec.write_text(_dump(tree, True), encoding="utf-8")
        before = _snapshot(folder)
        rc, _, stderr = _run([str(spec), "--out", "out", "--target", target], log)
        _assert_outcome(rc, stderr, before, folder, log, stale_ok=False)
        written = sorted(p.parent.name for p in (folder / "out").rglob("*.py"))
    if rc == 0:
        assert written, log
        for name in written:
            assert entry.get(name, "").split(".")[0] in TARGET_ROOTS[name], log
    if "vllm" not in entry or (target == "standalone" and "standalone" not in entry):
        assert rc == 2, log


# -- textual mutations --------------------------------------------------------------

DUMPED = {stem: _dump(tree, True) for stem, tree in TREES.items()}
TEXT_OPERATIONS = ["flip", "truncate", "delete", "double", "insert", "byte"]


@st.composite
def mutated_bytes(draw) -> tuple[str, bytes, list[str]]:
    stem = draw(st.sampled_from(sorted(SPECS)))
    # The spec as written or dumped without its comments (where a flipped
    # byte changes nothing), alike in the form of its values.
    text = draw(st.sampled_from([SPECS[stem], DUMPED[stem], DUMPED[stem]]))
    data = bytearray(text.encode("utf-8"))
    log: list[str] = [stem]
    for _ in range(draw(st.integers(min_value=2, max_value=5))):
        op = draw(st.sampled_from(TEXT_OPERATIONS))
        at = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        log.append(f"{op} @{at}")
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif op == "truncate":
            del data[at:]
        elif op == "delete":
            del data[at : at + draw(st.integers(min_value=1, max_value=40))]
        elif op == "double":
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at) + 1 or len(data)
            data[start:start] = data[start:end]
        elif op == "insert":
            piece = draw(
                st.sampled_from(
                    PAYLOADS + ODD_TEXT + [": ", "- ", "{", "&a", "*a", "!!"]
                )
            )
            data[at:at] = piece.encode("utf-8")
        else:
            data[at:at] = bytes([draw(st.integers(min_value=0, max_value=255))])
    if draw(st.booleans()):
        log.append("crlf")
        data = bytearray(bytes(data).replace(b"\n", b"\r\n"))
    return stem, bytes(data), log


@_settings(400)
@given(case=mutated_bytes(), target=_targets)
def test_mutated_bytes_are_reported_or_generated_safely(case, target: str) -> None:
    stem, data, log = case
    _check_one_spec(data, f"{stem}.yaml", target, log)


# -- command lines --------------------------------------------------------------------

_spec_choices = st.sampled_from(
    [
        "spec",
        "missing.yaml",
        "folder",
        "/dev/null",
        "/dev/zero",
        "",
        "-",
        "__init__.yaml",
        "my-model.yaml",
        "class.yaml",
        "bad\nname.yaml",
        "odd\udcff.yaml",
        "nul\x00.yaml",
        "specs/../spec",
        "specs",
        "/",
        "a" * 300 + ".yaml",
        ".",
        "~",
    ]
)
_option_values = st.one_of(
    st.sampled_from(
        [
            "0",
            "-1",
            "1",
            "64",
            "9" * 30,
            "9" * 5000,
            "-" + "9" * 30,
            "1e3",
            "0x10",
            "",
            " ",
            "merge=2",
            "merge=" + "9" * 5000,
            "nosuch=1",
            "=",
            "merge",
            "r=2",
            "vllm",
            "all",
            "float32",
            "out",
            "spec",
            "folder",
            "/dev/null",
            "bad\nvalue",
        ]
    ),
    _text,
)
_options = st.sampled_from(
    [
        "--target",
        "--out",
        "--stdout",
        "--check",
        "--version",
        "-h",
        "--set",
        "--budgets",
        "--max-items",
        "--max-frames",
        "--max-num-batched-tokens",
        "--max-model-len",
        "--dtype",
        "--json",
        "--bogus",
        "--",
    ]
)


@st.composite
def command_lines(draw) -> list[str]:
    argv: list[str] = []
    command = draw(st.sampled_from(["", "", "plan", "schema"]))
    if command:
        argv.append(command)
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        kind = draw(st.integers(min_value=0, max_value=2))
        if kind == 0:
            argv.append(draw(_spec_choices))
        elif kind == 1:
            argv.append(draw(_options))
        else:
            argv.append(draw(_option_values))
    return argv


def _materialise(argv: list[str], folder: Path) -> list[str]:
    """Names in ``argv`` made real: ``spec`` a valid spec, ``folder`` a
    folder, ``out`` a file in the way, the odd names copies of a spec."""
    stem = "minimax_m3" if "minimax_m3" in SPECS else min(SPECS)  # the cheapest
    (folder / "specs").mkdir()
    (folder / "folder").mkdir()
    (folder / "out").write_text("a file where --out wants a folder")
    (folder / "spec").write_text(SPECS[stem])
    for name in ("__init__.yaml", "my-model.yaml", "class.yaml", "bad\nname.yaml"):
        (folder / name).write_text(SPECS[stem])
    return argv


@_settings(900)
@given(argv=command_lines())
def test_command_lines_are_answered_safely(argv: list[str]) -> None:
    with _workspace() as folder:
        _materialise(argv, folder)
        before = _snapshot(folder)
        rc, _, stderr = _run(argv, argv)
        _assert_outcome(rc, stderr, before, folder, argv, stale_ok=True)


# -- the checks themselves ---------------------------------------------------------------


def test_unmutated_specs_are_generated() -> None:
    """The fuzz's starting points are valid (else every example is exit 2)."""
    for stem, tree in TREES.items():
        _check_one_spec(_dump(tree, True).encode(), f"{stem}.yaml", "all", stem)


def test_inert_module_check_can_fail() -> None:
    """The check lets the generator's own constructs through and catches
    what would run on import."""
    assert_inert_module(
        b"from __future__ import annotations\nimport torch\n"
        b"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vllm\n"
        b'"""doc"""\nKEYS = {"a": 1}\nx: int\n'
        b"class PWNEDMixin(Base):\n    y: 'T'\n    @staticmethod\n"
        b"    def f(a: int = 1) -> torch.Tensor:\n        return self.exec(a)\n"
    )
    for bad in (
        b"x = PWNED\n",
        b"__import__('os')\n",
        b"import os\n",
        b"from vllmx.evil import Model\n",
        b"from vllm.PWNED import Model\n",
        b"y = f()\n",
        b"class A:\n    z = f()\n",
        b"def f(a=g()):\n    pass\n",
        b"@register\ndef f():\n    pass\n",
        b"class A(make()):\n    pass\n",
        b"if True:\n    x = 1\n",
        b"# coding: latin-1\nx = 1\n",
        b"for i in x:\n    pass\n",
        b"x: int = f()\n",
    ):
        try:
            assert_inert_module(bad)
        except (AssertionError, ValueError, SyntaxError):
            continue
        raise AssertionError(f"not caught: {bad!r}")


# -- the step language: attribute chains and calls (issue #28) ------------------------

#: The valid corpus's step-language spec: its last graph step and its last
#: eager step are replaced by a drawn expression, its host_methods extended.
STEPS_SPEC = (
    Path(__file__).parent / "data" / "valid" / "step_language.yaml"
).read_text(encoding="utf-8")
STEP_PLACES = {
    "graph": ("  - _merge_rows(joined, scale=0.5)\n", "  - {}\n"),
    "eager": ("    - _merge_rows(kept if n > 0 else feats, scale=0.5)\n", "    - {}\n"),
}
STEP_ATOMS = {
    "graph": ["feats", "left", "joined", "pixel_values", "rest"],
    "eager": ["feats", "kept", "n", "pixel_values", "image_grid_thw"],
}
HOST_ATOMS = ["visual", "_merge_rows", "visual.config", "torch", "1", "0.5", "'s'"]
HOST_METHODS_LINE = "host_methods: [_merge_rows, visual.prepare_metadata]"
#: Names a chain may try: what leads out of a sandbox, and what is allowed.
REACHING_NAMES = [
    "gi_frame", "gi_code", "f_globals", "f_builtins", "f_back", "f_locals",
    "co_code", "cr_frame", "ag_frame", "tb_frame", "__globals__", "__class__",
    "__subclasses__", "__builtins__", "__dict__", "__self__", "__func__",
    "tofile", "from_file", "numpy", "storage", "untyped_storage", "data_ptr",
    "format", "register_forward_hook", "register_hook", "apply", "apply_",
    "map_", "_modules", "_forward_hooks", "parameters", "named_parameters",
    "modules", "state_dict", "save_pretrained", "to_json_file", "config",
    "blocks", "get", "keys", "pop", "grad_fn", "next_functions", "system",
    "open", "read", "write", "forward", "prepare_metadata", "merger",
    "out_hidden_size",
]  # fmt: skip
STEP_NAMES = sorted(
    {*REACHING_NAMES, *TENSOR_METHODS, *TENSOR_ATTRIBUTES, *OUTPUT_FIELDS}
    | set(sorted(MODULE_API)[::7])
)
CHAIN_OPS = [
    "{e}.{name}",
    "{e}.{name}()",
    "{e}.{name}({arg})",
    "{e}({arg})",
    "{e}[0]",
    "{e}['{name}']",
    "next({e})",
    "next(iter({e}))",
    "next({e}.parameters()).dtype",
    "{e}.dtype",
    "_merge_rows({e})",
    "torch.cat([{e}, {arg}])",
    "'{{0.{name}}}'.format({e})",
    "({e} == '{name}')",
    "getattr({e}, '{name}')",
    "torch.cat([{e}], out={arg})",
    "{e}.sum(0, {name}={arg})",
    "{e} + {arg}",
    "int({e})",
    "int({e}, {arg})",
    "int({e}, base=2)",
]  # fmt: skip


@st.composite
def step_language_specs(draw) -> tuple[str, str, list[str]]:
    """The spec with one drawn step (an atom and up to 4 chain operations)
    and maybe extra ``host_methods`` entries."""
    place = draw(st.sampled_from(sorted(STEP_PLACES)))
    atoms = STEP_ATOMS[place] + HOST_ATOMS
    expr = draw(st.sampled_from(atoms))
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        op = draw(st.sampled_from(CHAIN_OPS))
        name = draw(st.sampled_from(STEP_NAMES))
        expr = op.format(e=expr, name=name, arg=draw(st.sampled_from(atoms)))
    old, new = STEP_PLACES[place]
    text = STEPS_SPEC.replace(old, new.format(json.dumps(expr)))
    declared = [
        f"visual.{name}" if dotted else name
        for name, dotted in draw(
            st.lists(st.tuples(st.sampled_from(STEP_NAMES), st.booleans()), max_size=2)
        )
    ]
    if declared:
        methods = HOST_METHODS_LINE[:-1] + ", " + ", ".join(declared) + "]"
        text = text.replace(HOST_METHODS_LINE, methods)
    return text, expr, declared


@_settings(300)
@given(case=step_language_specs())
def test_step_language_reaches_only_its_allow_lists(case) -> None:
    """Whatever chain of attributes and calls a step tries: exit 2 with
    located diagnostics, or a module whose step-derived code (each forward's
    ``return``) reaches only the allow-lists and the declared host paths."""
    text, expr, declared = case
    log = [expr, declared]
    stdout = _vllm_module_or_reported(text, "steps.yaml", log)
    if stdout is None:
        return
    methods = {"_merge_rows", "visual.prepare_metadata", *declared}
    module = ast.parse(stdout)
    checked = _checked_callees(module)
    for node in _step_returns(module):
        problem = _outside_allow_lists(node, methods)
        assert problem is None, f"{problem} in {ast.unparse(node)} ({log})"
        unchecked = _called_host_paths(node) - checked
        assert not unchecked, f"{unchecked} called, not checked at run time ({log})"


def _checked_callees(module: ast.Module) -> set[str]:
    """The paths the generated ``_check_host_callees`` walks at run time
    (``_require_module_callee(self, "<path>")``, ``_require_module_list``)."""
    return {
        node.args[1].value
        for node in ast.walk(module)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("_require_module_callee", "_require_module_list")
        and isinstance(node.args[1], ast.Constant)
    }


def _called_host_paths(expr: ast.expr) -> set[str]:
    """Each ``self.<a>.<b>...(...)`` a step calls under a host attribute
    (``next(self.<a>.parameters())`` aside: torch's own method)."""
    paths = set()
    for node in ast.walk(expr):
        if not isinstance(node, ast.Call):
            continue
        parts = _host_parts(node.func)
        if parts and len(parts) > 1 and parts[-1] != "parameters":
            paths.add(".".join(str(p) for p in parts))
    return paths


def _step_returns(module: ast.Module) -> list[ast.expr]:
    """What each forward returns: the spec's last step, as printed."""
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name in (
            "encoder_cudagraph_forward",
            "encoder_eager_forward",
        ):
            found += [r.value for r in ast.walk(node) if isinstance(r, ast.Return)]
    assert len(found) == 2, ast.dump(module)[:200]
    return found


def _outside_allow_lists(
    expr: ast.expr, methods: set[str], callables: frozenset[str] = frozenset()
) -> str | None:
    """What in ``expr`` (generated Python) lies outside the step language's
    allow-lists, read independently of the generator's own checker
    (``callables``: names a call may name, a loop's variable)."""
    parents = {c: p for p in ast.walk(expr) for c in ast.iter_child_nodes(p)}
    for node in ast.walk(expr):
        parent = parents.get(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            as_argument = isinstance(parent, (ast.Call, ast.keyword))
            compared = isinstance(parent, ast.Compare) and isinstance(
                parent.ops[0], (ast.Eq, ast.NotEq)
            )
            if not (as_argument or compared):
                return f"string {node.value!r} used as a value"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in callables:
                continue
            if not _next_of_parameters(node, parents):
                return f"call of {node.func.id}"
        elif isinstance(node, ast.keyword) and _tensor_call(parent):
            if node.arg not in STEP_KEYWORDS:
                return f"keyword {node.arg}= of a tensor computation"
        elif isinstance(node, ast.Attribute):
            problem = _attribute_outside(node, called, parents, methods)
            if problem is not None:
                return problem
    return None


def _tensor_call(call: ast.AST | None) -> bool:
    """A call of a torch function or of a method of a value (not the host's:
    a host method takes its own keywords)."""
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return False
    owner = call.func.value
    return (isinstance(owner, ast.Name) and owner.id == "torch") or _host_parts(
        owner
    ) is None


def _host_parts(node: ast.AST) -> list[str | int] | None:
    """``self.a.b[0].c`` as ``[a, b, 0, c]``; None if not rooted at self."""
    parts: list[str | int] = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        elif isinstance(node.slice, ast.Constant) and type(node.slice.value) is int:
            parts.append(node.slice.value)
        else:
            return None
        node = node.value
    if isinstance(node, ast.Name) and node.id == "self":
        return parts[::-1]
    return None


def _attribute_outside(node, called, parents, methods) -> str | None:
    if isinstance(node.value, ast.Name) and node.value.id == "torch":
        allowed = TORCH_FUNCTIONS if called else TORCH_DTYPES
        return None if node.attr in allowed else f"torch.{node.attr}"
    parts = _host_parts(node)
    if parts is None:
        allowed = TENSOR_METHODS if called else TENSOR_ATTRIBUTES | OUTPUT_FIELDS
        return None if node.attr in allowed else f".{node.attr} on a value"
    if isinstance(parents.get(node), ast.Attribute):
        return None  # a prefix of a longer path: judged as part of it
    return _host_path_outside(parts, node, called, parents, methods)


def _host_path_outside(parts, node, called, parents, methods) -> str | None:
    dotted = ".".join(str(p) for p in parts)
    root, rest = parts[0], parts[1:]
    # A declaration of torch.nn.Module's API must have been refused.
    sound = {m for m in methods if not set(m.split(".")) & MODULE_API}
    if root == "_merge_rows" or root in sound:
        return None if called and not rest else f"host method path {dotted}"
    if root != "visual":
        return f"host root {root}"
    if any(isinstance(p, str) and p.startswith("_") for p in rest):
        return f"private host path {dotted}"
    if (
        called
        and rest == ["parameters"]
        and _next_of_parameters(parents.get(parents.get(node)), parents)
    ):
        return None
    if set(rest) & MODULE_API:
        return f"torch.nn.Module's API in {dotted}"
    if called and rest and dotted not in sound:
        return f"undeclared host call {dotted}"  # visual is no host tensor
    return None


def _next_of_parameters(call, parents) -> bool:
    """``next(self.<path>.parameters()).dtype`` (or ``.device``)."""
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "next"
        and len(call.args) == 1
        and not call.keywords
    ):
        return False
    inner, parent = call.args[0], parents.get(call)
    return (
        isinstance(inner, ast.Call)
        and not inner.args
        and isinstance(inner.func, ast.Attribute)
        and inner.func.attr == "parameters"
        and _host_parts(inner.func) is not None
        and isinstance(parent, ast.Attribute)
        and parent.attr in PARAMETER_FACTS
    )


# -- per-item post-processing steps: the inputs cut to the item, int() ---------------

#: The valid corpus's spec whose per-item steps read every kind of input: its
#: last step is replaced by a drawn expression.
POST_SPEC = (
    Path(__file__).parent / "data" / "valid" / "postprocess_reads_inputs.yaml"
).read_text(encoding="utf-8")
POST_LAST = "    - torch.cat([item_output, marks])\n"
POST_ATOMS = [
    "item_output", "marks", "crop_masks", "pixel_values", "image_grid_hw",
    "extra_rows", "useful", "h", "e", "path_output", "visual", "torch", "1", "'s'",
]  # fmt: skip


@st.composite
def post_step_specs(draw) -> tuple[str, str]:
    """The spec with its last post-processing step drawn (an atom and up to
    4 chain operations, ``int(...)`` among them)."""
    expr = draw(st.sampled_from(POST_ATOMS))
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        op = draw(st.sampled_from(CHAIN_OPS))
        name = draw(st.sampled_from(STEP_NAMES))
        expr = op.format(e=expr, name=name, arg=draw(st.sampled_from(POST_ATOMS)))
    assert POST_SPEC.count(POST_LAST) == 1
    return POST_SPEC.replace(POST_LAST, f"    - {json.dumps(expr)}\n"), expr


@_settings(200)
@given(case=post_step_specs())
def test_post_steps_reach_only_their_allow_lists(case) -> None:
    """Whatever a per-item post-processing step tries: exit 2 with located
    diagnostics, or a module whose step reaches only the allow-lists, with
    ``int`` called on one value and no keyword."""
    text, expr = case
    stdout = _vllm_module_or_reported(text, "post.yaml", expr)
    if stdout is None:
        return
    (post,) = [
        n
        for n in ast.walk(ast.parse(stdout))
        if isinstance(n, ast.FunctionDef) and n.name == "postprocess_encoder_output"
    ]
    (last,) = [
        n.value
        for n in ast.walk(post)
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "post_rows"
    ]
    problem = _outside_allow_lists(last, set(), frozenset({"int"}))
    assert problem is None, f"{problem} in {ast.unparse(last)} ({expr})"
    for call in ast.walk(last):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "int":
            assert len(call.args) == 1 and not call.keywords, ast.unparse(call)


# -- loops over a host module list ---------------------------------------------------

#: The valid corpus's loop spec: its graph loop is replaced by a drawn one.
LOOP_SPEC = (Path(__file__).parent / "data" / "valid" / "module_loop.yaml").read_text(
    encoding="utf-8"
)
LOOP_STEP = """  - for: block
    in: visual.blocks
    carry: hidden
    steps:
      - hidden = block(hidden, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)
"""
LOOP_METHODS = {"visual.prepare_metadata", "visual.patch_embed", "visual.merger"}
#: What a loop's ``in`` may try: module lists, and every other kind of value.
LOOP_ITERABLES = [
    "visual.blocks", "visual.encoder.layers", "visual.towers[0].blocks",
    "visual.modules", "visual.children", "visual._modules", "visual.parameters",
    "visual.blocks.__class__", "visual.blocks[0]", "visual", "hidden",
    "cu_seqlens", "pixel_values", "torch", "torch.nn", "'blocks'", "[visual.blocks]",
    "visual.blocks()", "visual.merger(hidden)", "next(visual.parameters())", "1",
    "visual.blocks[::-1]", "visual.blocks[:-1]", "__import__('os')",
]  # fmt: skip
LOOP_NAMES = [
    "block", "layer", "hidden", "cu_seqlens", "visual", "self", "inputs", "next",
    "torch", "_block", "__class__", "for", "x y", "1", "rest", "max_seqlen",
]  # fmt: skip
LOOP_BODY_OPS = [
    "{v}({c})",
    "{v}({c}, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)",
    "{v}.{name}({c})",
    "{v}.{name}",
    "{c}.{name}({v})",
    "visual.merger({v})",
    "{v}({c}).{name}",
    "{v}({c})[0]",
    "{c} + {v}",
    "next({v}.parameters()).dtype",
    "{v}.__class__({c})",
]  # fmt: skip


#: What a loop's ``keep`` may try: a well-formed one, and malformed ones.
LOOP_KEEPS = [
    {"as": "kept", "at": "visual.deepstack"}, {"as": "kept", "at": "hidden"},
    {"as": "hidden", "at": "visual.deepstack"}, {"as": "kept"}, "kept",
    {"as": "kept", "at": "visual.modules"}, {"as": "kept", "at": "[0]", "why": 1},
    {"as": "block", "at": "visual.deepstack"}, {"as": None, "at": None},
]  # fmt: skip


@st.composite
def loop_specs(draw) -> tuple[str, list[Any]]:
    """The loop spec with its graph loop mutated up to 3 times: its variable,
    module list or carry redrawn, a body step drawn (an assignment or not),
    a nested loop, a key dropped or added (``index`` and ``keep`` among
    them)."""
    var, carry, iterable = "block", "hidden", "visual.blocks"
    body = ["{c} = {v}({c}, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)"]
    extra: dict[str, Any] = {}
    nested = False
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        what = draw(
            st.sampled_from(["for", "in", "in", "carry", "body", "body", "nest", "key"])
        )
        if what == "for":
            var = draw(st.sampled_from(LOOP_NAMES))
        elif what == "in":
            iterable = draw(st.sampled_from(LOOP_ITERABLES))
        elif what == "carry":
            carry = draw(st.sampled_from(LOOP_NAMES))
        elif what == "body":
            op = draw(st.sampled_from(LOOP_BODY_OPS))
            op = op.replace("{name}", draw(st.sampled_from(STEP_NAMES)))
            target = draw(st.sampled_from(["{c}", "{c}", "{c}", "other", "a, b", ""]))
            step = f"{target} = {op}" if target else op
            body.insert(draw(st.integers(min_value=0, max_value=len(body))), step)
        elif what == "nest":
            nested = True
        else:
            key = draw(
                st.sampled_from(
                    ["for", "in", "carry", "steps", "why", "if", "index", "keep"]
                )
            )
            values = LOOP_KEEPS if key == "keep" else LOOP_NAMES
            extra[key] = draw(st.sampled_from([*values, 1, None, ["x"], "DROP"]))
            if key == "keep" and draw(st.booleans()):
                extra["index"] = "place"
    steps: list[Any] = [b.format(v=var, c=carry) for b in body]
    loop: dict[str, Any] = {"for": var, "in": iterable, "carry": carry, "steps": steps}
    if nested:
        loop["steps"] = [*steps, dict(loop)]
    for key, value in extra.items():
        if value == "DROP":
            loop.pop(key, None)
        else:
            loop[key] = value
    text = LOOP_SPEC.replace(LOOP_STEP, "  - " + json.dumps(loop) + "\n")
    if "keep" in loop:
        # The step after the loop reads the kept list.
        text = text.replace(
            "  - visual.merger(hidden)\n", "  - visual.merger(hidden, kept)\n"
        )
    return text, [loop]


@_settings(200)
@given(case=loop_specs())
def test_loops_reach_only_module_lists_and_the_allow_lists(case) -> None:
    """Whatever a loop tries: exit 2 with located diagnostics, or a module
    whose graph loop runs over a path under ``self.visual`` that is no
    ``torch.nn.Module`` API, rebinds only the carry, and whose body reaches
    only the allow-lists and the declared host paths."""
    text, log = case
    stdout = _vllm_module_or_reported(text, "loop.yaml", log)
    if stdout is None:
        return
    module = ast.parse(stdout)
    loops = [n for n in ast.walk(module) if isinstance(n, ast.For)]
    forwards = [n for n in loops if _loop_problem(n) != "not a step loop"]
    assert len(forwards) == 2, f"{len(forwards)} step loops after {log}"
    for node in forwards:
        problem = _loop_problem(node)
        assert problem is None, f"{problem} in {ast.unparse(node)} ({log})"
        modules = _enumerated(node)[0]  # type: ignore[index]
        listed = "".join(
            f"[{p}]" if isinstance(p, int) else f".{p}"
            for p in _host_parts(modules) or []
        ).lstrip(".")
        assert listed in _checked_callees(module), f"{listed} unchecked ({log})"


class _BufferReads(ast.NodeTransformer):
    """``inputs["cu_seqlens"]`` (a captured buffer) read as ``cu_seqlens``."""

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if (
            isinstance(node.value, ast.Name)
            and node.value.id == "inputs"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            return ast.Name(node.slice.value, ast.Load())
        return self.generic_visit(node)


def _enumerated(node: ast.For) -> tuple[ast.expr, ast.expr, str | None] | None:
    """A loop's modules, its variable and its index name (``for <index>,
    <variable> in enumerate(<modules>)``, or ``for <variable> in
    <modules>``); None for another shape."""
    target, modules = node.target, node.iter
    if not isinstance(target, ast.Tuple):
        return modules, target, None
    call = node.iter
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "enumerate"
        and len(call.args) == 1
        and not call.keywords
        and len(target.elts) == 2
        and isinstance(target.elts[0], ast.Name)
    ):
        return None
    return call.args[0], target.elts[1], target.elts[0].id


def _kept(stmt: ast.stmt, index: str | None, carries: set[str]) -> bool:
    """``if <index> in self.visual...: <list>.append(<carry>)``: a loop's
    ``keep`` (checked after the body: the carry is its one rebound name)."""
    if not isinstance(stmt, ast.If) or index is None or stmt.orelse:
        return False
    test, body = stmt.test, stmt.body
    if not (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == index
        and isinstance(test.ops[0], ast.In)
        and len(test.comparators) == 1
        and _host_parts(test.comparators[0]) is not None
        and len(body) == 1
    ):
        return False
    call = body[0].value if isinstance(body[0], ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "append"
        and isinstance(call.func.value, ast.Name)
        and [ast.unparse(a) for a in call.args] == sorted(carries)
    )


def _loop_problem(node: ast.For) -> str | None:
    """What in a generated step loop (``for <name> in self.visual...``, or
    ``for <index>, <name> in enumerate(self.visual...)``) lies outside a
    loop's rules."""
    shape = _enumerated(node)
    if shape is None:
        return "not a step loop"
    iterated, target, index = shape
    parts = _host_parts(iterated)
    if parts is None or not isinstance(target, ast.Name):
        return "not a step loop"
    if parts[0] != "visual" or parts == ["visual"]:
        return f"loop over {ast.unparse(node.iter)}"
    if any(
        isinstance(p, str) and (p in MODULE_API or p.startswith("_")) for p in parts
    ):
        return f"loop over {ast.unparse(node.iter)}"
    var = target.id
    carries: set[str] = set()
    body = node.body
    rebound = {
        t.id
        for stmt in body[:-1]
        for t in getattr(stmt, "targets", [])
        if isinstance(t, ast.Name)
    }
    if body and _kept(body[-1], index, rebound):
        body = body[:-1]  # keep's append, after the steps
    for stmt in body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return f"body statement {ast.unparse(stmt)}"
        target = stmt.targets[0]
        if not isinstance(target, ast.Name):
            return f"body target {ast.unparse(target)}"
        carries.add(target.id)
        names = [n for n in ast.walk(stmt.value) if isinstance(n, ast.Name)]
        calls = {id(c.func) for c in ast.walk(stmt.value) if isinstance(c, ast.Call)}
        if any(n.id == var and id(n) not in calls for n in names):
            return f"loop variable {var} used as a value"
        value = _BufferReads().visit(copy.deepcopy(stmt.value))
        problem = _outside_allow_lists(value, LOOP_METHODS, frozenset({var}))
        if problem is not None:
            return problem
    return None if len(carries) == 1 else f"body rebinds {sorted(carries)}"


ORACLE_CASES = [
    ("next(self.visual.parameters()).dtype", None),
    ("self._merge_rows(x.view(1, -1), scale=0.5)", None),
    ("self.visual.prepare_metadata(x, torch.int64, 'a', k='b')", None),
    ("x[:, : self.visual.out_hidden_size] == 's'", None),
    ("self.visual.parameters().gi_frame", ".gi_frame on a value"),
    ("self.visual.parameters()", "torch.nn.Module's API"),
    ("next(self.visual.parameters())", "call of next"),
    ("next(iter(x)).dtype", "call of next"),
    ("x.numpy().tofile('f')", ".tofile on a value"),
    ("x.numpy()", ".numpy on a value"),
    ("x.untyped_storage()", ".untyped_storage on a value"),
    ("'{0.forward}'.format(x)", ".format on a value"),
    ("'{0.forward}'[0]", "string"),
    ("x['k']", "string"),
    ("self.visual.apply(x)", "torch.nn.Module's API"),
    ("self.visual.encode(x)", "undeclared host call"),
    ("self._merge_rows.gi_frame", "host method path"),
    ("self.visual._modules", "private host path"),
    ("torch.load(x)", "torch.load"),
    ("self.config.save(x)", "host root"),
]


@pytest.mark.parametrize(("python", "words"), ORACLE_CASES)
def test_the_step_oracle_can_fail(python: str, words: str | None) -> None:
    """The fuzz's reading of generated code lets the allowed through and
    catches each way out."""
    expr = ast.parse(python, mode="eval").body
    problem = _outside_allow_lists(expr, {"_merge_rows", "visual.prepare_metadata"})
    assert (problem is None) if words is None else (words in (problem or "")), problem


LOOP_ORACLE_CASES = [
    ("for b in self.visual.blocks:\n    h = b(h, cu_seqlens=inputs['c'])", None),
    ("for b in self.visual.towers[0].blocks:\n    h = b(h).contiguous()", None),
    ("for b in self.visual:\n    h = b(h)", "loop over"),
    ("for b in self.visual._modules:\n    h = b(h)", "loop over"),
    ("for b in self.visual.blocks.modules:\n    h = b(h)", "loop over"),
    ("for b in self.visual.blocks:\n    h = b.attn(h)", "b used as a value"),
    ("for b in self.visual.blocks:\n    h = b(h).numpy()", ".numpy on a value"),
    ("for b in self.visual.blocks:\n    h = self.visual.merger(b)", "as a value"),
    ("for b in self.visual.blocks:\n    g = b(h)\n    h = b(g)", "body rebinds"),
    ("for b in self.visual.blocks:\n    h, g = b(h)", "body target"),
    ("for b in self.visual.blocks:\n    h = b(open('f'))", "call of open"),
]


@pytest.mark.parametrize(("python", "words"), LOOP_ORACLE_CASES)
def test_the_loop_oracle_can_fail(python: str, words: str | None) -> None:
    """The fuzz's reading of a generated loop lets a sound one through and
    catches each way out."""
    node = ast.parse(python).body[0]
    assert isinstance(node, ast.For)
    problem = _loop_problem(node)
    assert (problem is None) if words is None else (words in (problem or "")), problem


# -- per-item builders ----------------------------------------------------------------

#: The valid corpus's per-item builder spec (its host ``visual``, the root
#: the step oracle knows): one step of its per-item builder is replaced by a
#: drawn one.
ITEM_SPEC = (
    (Path(__file__).parent / "data" / "valid" / "per_item_builder.yaml")
    .read_text(encoding="utf-8")
    .replace("vision", "visual")
)
ITEM_STEP = "      - positions = torch.arange(t * area, device=device) % area\n"
ITEM_FLAG = "  - per_item: true\n"
ITEM_LATER = (
    "      - lengths = (sizes[:, 1] * sizes[:, 2]).repeat_interleave(sizes[:, 0])\n"
)
#: What a per-item step may start from: the item's dims, its locals, the
#: batch's inputs and buffers (out of its scope), the host and literals.
ITEM_ATOMS = [
    "t", "h", "w", "area", "merge", "device", "dtype", "max_batch_size",
    "pixel_values", "image_grid_thw", "cu_seqlens", "frames", "by_item", "self",
    "visual", "torch", "1", "'s'", "torch.arange(t * area, device=device)",
]  # fmt: skip
ITEM_FLAGS = ["true", "false", "1", "yes", "null", "[true]", "{a: 1}", "'true'"]


@st.composite
def per_item_specs(draw) -> tuple[str, list[Any]]:
    """The spec with its per-item builder's ``positions`` step drawn (an
    atom and up to 3 chain operations), maybe its flag redrawn and maybe
    the builder after it reading a name of its own or of the loop."""
    expr = draw(st.sampled_from(ITEM_ATOMS))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        op = draw(st.sampled_from(CHAIN_OPS))
        name = draw(st.sampled_from(STEP_NAMES))
        expr = op.format(e=expr, name=name, arg=draw(st.sampled_from(ITEM_ATOMS)))
    text = ITEM_SPEC.replace(ITEM_STEP, f"      - positions = {json.dumps(expr)}\n")
    flag = "true"
    if draw(st.integers(min_value=0, max_value=3)) == 0:
        flag = draw(st.sampled_from(ITEM_FLAGS))
        text = text.replace(ITEM_FLAG, f"  - per_item: {flag}\n")
    later = None
    if draw(st.integers(min_value=0, max_value=3)) == 0:
        later = draw(st.sampled_from(ITEM_ATOMS))
        text = text.replace(
            ITEM_LATER, ITEM_LATER + f"      - extra = {json.dumps(later)}\n"
        )
    return text, [expr, flag, later]


@_settings(200)
@given(case=per_item_specs())
def test_per_item_builders_reach_only_the_allow_lists(case) -> None:
    """Whatever a per-item step tries: exit 2 with located diagnostics, or a
    module whose per-item loops (one at capture, one at replay) iterate the
    items' dims, bind only the steps' names and join them, and whose steps
    reach only the allow-lists and the declared host paths."""
    text, log = case
    stdout = _vllm_module_or_reported(text, "items.yaml", log)
    if stdout is None:
        return
    loops = [n for n in ast.walk(ast.parse(stdout)) if isinstance(n, ast.For)]
    item_loops = [n for n in loops if _item_loop_problem(n) != "not an item loop"]
    assert len(item_loops) == (2 if log[1] == "true" else 0), log
    for node in item_loops:
        problem = _item_loop_problem(node)
        assert problem is None, f"{problem} in {ast.unparse(node)} ({log})"


def _item_loop_problem(node: ast.For) -> str | None:
    """What in a generated per-item loop (one that appends to ``by_item``)
    lies outside its rules: it iterates a name (or a ``zip`` of names) into
    names, its statements bind names or append a name to ``by_item``."""
    appends = [
        s
        for s in node.body
        if isinstance(s, ast.Expr) and "by_item[" in ast.unparse(s.value)
    ]
    if not appends:
        return "not an item loop"
    targets = [n for n in ast.walk(node.target) if not isinstance(n, ast.expr_context)]
    if not all(isinstance(t, (ast.Name, ast.Tuple)) for t in targets):
        return f"loop target {ast.unparse(node.target)}"
    iters = node.iter.args if _is_call_of(node.iter, "zip") else [node.iter]
    if not all(isinstance(i, ast.Name) for i in iters):
        return f"loop over {ast.unparse(node.iter)}"
    for stmt in node.body:
        if stmt in appends:
            text = ast.unparse(stmt)
            if not re.fullmatch(r"by_item\['(\w+)'\]\.append\(\1\)", text):
                return f"statement {text}"
            continue
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return f"statement {ast.unparse(stmt)}"
        bound = stmt.targets[0]
        names = bound.elts if isinstance(bound, ast.Tuple) else [bound]
        if not all(isinstance(n, ast.Name) and n.id != "by_item" for n in names):
            return f"binds {ast.unparse(bound)}"
        problem = _outside_allow_lists(stmt.value, {"visual.encode"})
        if problem is not None:
            return problem
    return None


def _is_call_of(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == name
    )


ITEM_LOOP_ORACLE_CASES = [
    ("for t, h, w in g:\n    p = torch.arange(t)\n    by_item['p'].append(p)", None),
    ("for (n), (h, w) in zip(a, b, strict=True):\n    by_item['n'].append(n)", None),
    ("for t in self.visual.blocks:\n    by_item['t'].append(t)", "loop over"),
    ("for g[0] in g:\n    by_item['t'].append(t)", "loop target"),
    ("for t in g:\n    by_item['t'].append(open('f'))", "statement"),
    ("for t in g:\n    by_item = {}\n    by_item['t'].append(t)", "binds by_item"),
    ("for t in g:\n    p = t.numpy()\n    by_item['p'].append(p)", ".numpy on a value"),
    ("for t in g:\n    p = self.visual.apply(t)\n    by_item['p'].append(p)", "API"),
]


@pytest.mark.parametrize(("python", "words"), ITEM_LOOP_ORACLE_CASES)
def test_the_item_loop_oracle_can_fail(python: str, words: str | None) -> None:
    node = ast.parse(python).body[0]
    assert isinstance(node, ast.For)
    problem = _item_loop_problem(node)
    assert (problem is None) if words is None else (words in (problem or "")), problem


# -- an item's count from host steps (items.output_tokens.steps) ------------------------

#: The valid corpus's count spec: the first step of its item count is
#: replaced by a drawn one.
COUNT_SPEC = (Path(__file__).parent / "data" / "valid" / "count_steps.yaml").read_text(
    encoding="utf-8"
)
COUNT_STEP = '      - grid = torch.empty(1, t * h, w, device="meta")\n'
#: What a count step may start from: the item's dims, the constants, the
#: host and the imported helper; and what it may not: the batch's inputs,
#: the method's own names, the post-processing's.
COUNT_ATOMS = [
    "t", "h", "w", "ih", "iw", "patch_dim", "visual", "unpad_image", "torch",
    "1", "'s'", 'torch.empty(1, t * h, w, device="meta")', "pixel_values",
    "image_sizes", "mm_kwargs", "grids", "item_specs", "item_output", "self",
]  # fmt: skip


@st.composite
def count_specs(draw) -> tuple[str, str]:
    """The spec with its count's first step drawn (an atom and up to 3
    chain operations)."""
    expr = draw(st.sampled_from(COUNT_ATOMS))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        op = draw(st.sampled_from(CHAIN_OPS))
        name = draw(st.sampled_from(STEP_NAMES))
        expr = op.format(e=expr, name=name, arg=draw(st.sampled_from(COUNT_ATOMS)))
    return COUNT_SPEC.replace(COUNT_STEP, f"      - grid = {json.dumps(expr)}\n"), expr


@_settings(200)
@given(case=count_specs())
def test_item_counts_reach_only_the_allow_lists(case) -> None:
    """Whatever a count step tries: exit 2 with located diagnostics, or a
    module whose item loop in ``get_encoder_cudagraph_item_specs`` binds only
    the steps' names, reaches only the allow-lists, the declared host and the
    imported helper, and checks every count before it appends the item."""
    text, expr = case
    stdout = _vllm_module_or_reported(text, "count.yaml", expr)
    if stdout is None:
        return
    (method,) = [
        n
        for n in ast.walk(ast.parse(stdout))
        if isinstance(n, ast.FunctionDef)
        and n.name == "get_encoder_cudagraph_item_specs"
    ]
    (loop,) = [n for n in ast.walk(method) if isinstance(n, ast.For)]
    problem = _count_loop_problem(loop)
    assert problem is None, f"{problem} in {ast.unparse(loop)} ({expr})"


#: What the generated count loop binds for itself.
COUNT_LOOP_NAMES = {"item_tokens", "item_bound"}


def _count_loop_problem(node: ast.For) -> str | None:
    """What in a generated count loop lies outside its rules: assignments of
    names (never the method's own) from allow-listed expressions, then the
    bound check (an ``if`` that raises ``ValueError``), then one append."""
    *steps, check, append = node.body
    if not re.fullmatch(
        r"item_specs\.append\(EncoderItemSpec\(.*\)\)", ast.unparse(append)
    ):
        return f"statement {ast.unparse(append)}"
    raised = [n for n in ast.walk(check) if isinstance(n, ast.Raise)]
    if not isinstance(check, ast.If) or len(raised) != 1 or len(check.body) != 1:
        return f"check {ast.unparse(check)}"
    if "ValueError" not in ast.unparse(raised[0]) or check.orelse:
        return f"check {ast.unparse(check)}"
    if not steps or ast.unparse(steps[-1]) != "item_bound = t * h * w":
        return "no bound before the check"
    for stmt in steps:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return f"statement {ast.unparse(stmt)}"
        bound = stmt.targets[0]
        names = bound.elts if isinstance(bound, ast.Tuple) else [bound]
        if not all(isinstance(n, ast.Name) for n in names):
            return f"binds {ast.unparse(bound)}"
        own = {n.id for n in names} & {"item_specs", "grids", "self", "mm_kwargs"}
        if own:
            return f"binds {', '.join(sorted(own))}"
        problem = _outside_allow_lists(
            stmt.value, set(), callables=frozenset({"unpad_image"})
        )
        if problem is not None:
            return problem
    return None


COUNT_LOOP_ORACLE_CASES = [
    (
        "for t, h, w in g:\n    item_tokens = unpad_image(t).shape[0]\n"
        "    item_bound = t * h * w\n    if item_tokens > item_bound:\n"
        "        raise ValueError('x')\n    item_specs.append(EncoderItemSpec(1))",
        None,
    ),
    (
        "for t, h, w in g:\n    item_tokens = open('f')\n    item_bound = t * h * w\n"
        "    if item_tokens > item_bound:\n        raise ValueError('x')\n"
        "    item_specs.append(EncoderItemSpec(1))",
        "call of open",
    ),
    (
        "for t, h, w in g:\n    item_tokens = t\n    item_bound = t * h * w\n"
        "    item_specs.append(EncoderItemSpec(1))",
        "check",
    ),
    (
        "for t, h, w in g:\n    self.x = t\n    item_tokens = t\n"
        "    item_bound = t * h * w\n    if item_tokens > item_bound:\n"
        "        raise ValueError('x')\n    item_specs.append(EncoderItemSpec(1))",
        "binds self.x",
    ),
    (
        "for t, h, w in g:\n    item_tokens = t.numpy()\n    item_bound = t * h * w\n"
        "    if item_tokens > item_bound:\n        raise ValueError('x')\n"
        "    item_specs.append(EncoderItemSpec(1))",
        ".numpy on a value",
    ),
]


@pytest.mark.parametrize(("python", "words"), COUNT_LOOP_ORACLE_CASES)
def test_the_count_loop_oracle_can_fail(python: str, words: str | None) -> None:
    node = ast.parse(python).body[0]
    assert isinstance(node, ast.For)
    problem = _count_loop_problem(node)
    assert (problem is None) if words is None else (words in (problem or "")), problem
