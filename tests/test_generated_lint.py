"""The generated modules pass the linters a vLLM reviewer would run, and hold
nothing dead: no code their spec does not need, no comment about another model.

Ruff finds most dead constructs (unused names and imports, useless loops,
returns and expressions, constant conditions: :data:`DEAD_CODE_RULES`); a small
AST pass (:func:`dead_constructs`) finds the rest: loops over a literal of at
most one element, branches on a constant, statements after a ``return``,
``raise``, ``continue`` or ``break``, locals never read (tuple targets and
loop variables included, which ruff leaves alone), private helpers nothing
calls, and comments or docstrings that name the model of another spec.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GENERATED = sorted((ROOT / "generated").glob("*/*.py"))
GENERATED = [p for p in GENERATED if p.name != "__init__.py"]

#: Ruff's rules for dead code beyond pyflakes (F841 unused local, F401 unused
#: import, F811 redefinition), bugbear (B007 unused loop variable, B018
#: useless expression) and simplify (SIM108, SIM222/SIM223 ``or True``):
#: ``else`` on a loop without ``break``, assigning a name to itself, a
#: comparison of constants, a useless ``return``, ``pass`` where a statement
#: is, a class field defined twice, ``return None`` where ``return`` is the
#: default, a name assigned only to be returned, a comprehension that copies.
DEAD_CODE_RULES = (
    "PLW0120",
    "PLW0127",
    "PLW0128",
    "PLR0133",
    "PLR1711",
    "PIE790",
    "PIE794",
    "RET501",
    "RET504",
    "C416",
)

# pyflakes (undefined names, unused imports/variables), pycodestyle errors,
# bugbear, isort order with vLLM's first-party packages, pyupgrade, simplify.
RUFF_ARGS = [
    "check",
    "--no-cache",
    "--output-format",
    "concise",
    "--line-length",
    "88",
    "--select",
    "F,E,W,B,I,UP,SIM," + ",".join(DEAD_CODE_RULES),
    "--config",
    "lint.isort.known-first-party=['vllm','encoder_cudagraph_runtime','reference_towers']",
]


def _ruff() -> list[str]:
    exe = shutil.which("ruff")
    if exe:
        return [exe]
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    return [sys.executable, "-m", "ruff"]


def test_there_is_generated_code():
    assert len(GENERATED) >= 4


@pytest.mark.parametrize(
    "path", GENERATED, ids=[f"{p.parent.name}/{p.name}" for p in GENERATED]
)
def test_generated_module_is_lint_clean(path):
    proc = subprocess.run(
        [*_ruff(), *RUFF_ARGS, str(path)], capture_output=True, text=True
    )
    problems = [
        line
        for line in proc.stdout.splitlines()
        if re.match(r"^\S+:\d+:\d+: ", line) and not _unsplittable(path, line)
    ]
    assert proc.returncode in (0, 1) and not problems, proc.stdout + proc.stderr


#: A line black leaves long: an optional ``name = `` target, one dotted name
#: (a spec's host path, which has no place to break), an optional ``(``.
_ONE_DOTTED_NAME = re.compile(r"^(\w+ = )?[A-Za-z_][\w.]*\(?$")


def _unsplittable(path: Path, diagnostic: str) -> bool:
    """An E501 on a line that is one dotted name (as vLLM's own code has:
    long attribute paths, which no formatter can split)."""
    match = re.match(r"^\S+:(\d+):\d+: E501 ", diagnostic)
    if match is None:
        return False
    line = path.read_text(encoding="utf-8").splitlines()[int(match.group(1)) - 1]
    return bool(_ONE_DOTTED_NAME.match(line.strip()))


@pytest.mark.parametrize(
    ("line", "unsplittable"),
    [
        ("        resized = self.a_very_long.host_path.method_name(", True),
        ("        self.a_very_long.host_path.attribute", True),
        ("        x = f(a, b) + self.long_name.method(c, d)", False),
        ('        raise ValueError("a long message that black leaves alone")', False),
    ],
)
def test_only_a_dotted_name_may_stay_long(tmp_path, line, unsplittable):
    module = tmp_path / "m.py"
    module.write_text(line + "\n", encoding="utf-8")
    assert _unsplittable(module, f"{module}:1:89: E501 Line too long") is unsplittable


# -- dead constructs ruff does not see -----------------------------------------------


def _spec(stem: str) -> Path:
    return ROOT / "specs" / f"{stem}.yaml"


def spec_model_names() -> dict[str, str]:
    """Each spec's model name (its ``name:``), by the spec's file stem."""
    return {
        path.stem: yaml.safe_load(path.read_text(encoding="utf-8"))["name"]
        for path in sorted((ROOT / "specs").glob("*.yaml"))
    }


def _strings(value: object) -> list[str]:
    """Every string of a loaded YAML document (its comments are not loaded)."""
    if isinstance(value, str):
        return [" ".join(value.split())]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def dead_constructs(source: str, foreign_names: tuple[str, ...] = ()) -> list[str]:
    """``line: problem`` for each dead construct of ``source`` and each
    comment or docstring that names one of ``foreign_names``."""
    tree = ast.parse(source)
    problems = []
    for node in ast.walk(tree):
        problems += _literal_loop(node) + _constant_branch(node)
        problems += _unreachable(node) + _unread_locals(node)
        problems += _unread_comprehension_targets(node)
    problems += _uncalled_helpers(tree) + _foreign_names(source, tree, foreign_names)
    return sorted(problems, key=lambda p: int(p.split(":")[0]))


def _literal_loop(node: ast.AST) -> list[str]:
    """A loop over a literal of at most one element runs at most once."""
    loops = [node] if isinstance(node, ast.For) else []
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        loops = node.generators
    out = []
    for loop in loops:
        it = loop.iter
        sized = isinstance(it, (ast.Tuple, ast.List, ast.Set))
        if (sized and len(it.elts) <= 1) or (
            isinstance(it, ast.Dict) and len(it.keys) <= 1
        ):
            out.append(f"{it.lineno}: loop over a literal of {len(_elements(it))}")
        elif isinstance(it, ast.Constant) and len(str(it.value)) <= 1:
            out.append(f"{it.lineno}: loop over the constant {it.value!r}")
    return out


def _elements(node: ast.expr) -> list[ast.AST]:
    return node.keys if isinstance(node, ast.Dict) else node.elts


def _constant_branch(node: ast.AST) -> list[str]:
    """``if``, ``elif``, ``x if c else y`` and ``while`` on a constant (but
    ``while True``: a loop left by ``break``)."""
    if not isinstance(node, (ast.If, ast.IfExp, ast.While)):
        return []
    test = node.test
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if not isinstance(test, ast.Constant):
        return []
    if isinstance(node, ast.While) and node.test is test and test.value is True:
        return []
    return [f"{node.lineno}: a branch on the constant {test.value!r}"]


def _unreachable(node: ast.AST) -> list[str]:
    """A statement after one that always leaves its block."""
    out = []
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if not isinstance(block, list):
            continue
        for stmt, after in zip(block, block[1:], strict=False):
            if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                out.append(f"{after.lineno}: unreachable after line {stmt.lineno}")
                break
    return out


def _unread_locals(node: ast.AST) -> list[str]:
    """Names a function binds (assignments, tuple and loop targets, ``with
    ... as``) and never reads, nested functions included; ``_`` names are
    meant to be unread."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    stored: dict[str, int] = {}
    read: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            stored.setdefault(sub.id, sub.lineno)
        elif isinstance(sub, ast.Name):
            read.add(sub.id)
        elif isinstance(sub, (ast.Global, ast.Nonlocal)):
            read.update(sub.names)
    return [
        f"{line}: local {name!r} is never read"
        for name, line in stored.items()
        if name not in read and not name.startswith("_")
    ]


def _unread_comprehension_targets(node: ast.AST) -> list[str]:
    """A comprehension's loop names that the comprehension never reads (the
    function may read the same name elsewhere: ``[1 for n in counts]`` next
    to ``n * 2``)."""
    if not isinstance(
        node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    ):
        return []
    stored = {
        sub.id: sub.lineno
        for gen in node.generators
        for sub in ast.walk(gen.target)
        if isinstance(sub, ast.Name)
    }
    read = {
        sub.id
        for sub in ast.walk(node)
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)
    }
    return [
        f"{line}: loop name {name!r} is never read"
        for name, line in stored.items()
        if name not in read and not name.startswith("_")
    ]


def _uncalled_helpers(tree: ast.Module) -> list[str]:
    """Private functions, methods and constants (``_name``) that nothing in
    the module names: a helper no method calls."""
    defined: dict[str, int] = {}
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else []
        for item in [node, *members]:
            for name in _defined_names(item):
                if name.startswith("_") and not name.startswith("__"):
                    defined.setdefault(name, item.lineno)
    named = {
        sub.id if isinstance(sub, ast.Name) else sub.attr
        for sub in ast.walk(tree)
        if (isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load))
        or isinstance(sub, ast.Attribute)
    }
    return [
        f"{line}: helper {name!r} is never used"
        for name, line in defined.items()
        if name not in named
    ]


def _defined_names(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


def _foreign_names(source: str, tree: ast.AST, names: tuple[str, ...]) -> list[str]:
    """Comments and docstrings that name another spec's model."""
    if not names:
        return []
    pattern = re.compile(
        r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")(?![\w-]|\.\d)"
    )
    texts = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(tree):
        doc = _docstring(node)
        if doc is not None:
            texts.append((doc.lineno, doc.value))
    return [
        f"{line}: names another model, {match.group(1)!r}"
        for line, text in texts
        for match in pattern.finditer(" ".join(text.split()))
    ]


def _docstring(node: ast.AST) -> ast.Constant | None:
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    if not isinstance(node, documented) or not node.body:
        return None
    first = node.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return first.value
    return None


@pytest.mark.parametrize(
    "path", GENERATED, ids=[f"{p.parent.name}/{p.name}" for p in GENERATED]
)
def test_generated_module_has_no_dead_construct(path):
    """Another spec's model may be named where the module's own spec names it
    (GLM-5-Next's spec says it inherits GLM-4.1V's mixin): the spec's author
    wrote it about this model. The templates name none."""
    names = spec_model_names()
    assert path.stem in names
    spec_text = " ".join(_strings(yaml.safe_load(_spec(path.stem).read_text())))
    foreign = tuple(
        name
        for stem, name in names.items()
        if stem != path.stem and name not in spec_text
    )
    problems = dead_constructs(path.read_text(encoding="utf-8"), foreign)
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


# (case, a module, the problems the AST pass reports)
DEAD_CASES = [
    ("clean", "def f(x):\n    y = x + 1\n    return y\n", []),
    (
        "the keep-alive loop of issue 29",
        "def f(self):\n    kept = {}\n    for tensor in ():\n"
        "        kept[id(tensor)] = tensor\n",
        ["3: loop over a literal of 0"],
    ),
    (
        "a loop over one item",
        "for a in [1]:\n    print(a)\n",
        ["1: loop over a literal of 1"],
    ),
    ("a loop over two items", "for a in (1, 2):\n    print(a)\n", []),
    (
        "a comprehension over an empty dict",
        "x = [k for k in {}]\n",
        ["1: loop over a literal of 0"],
    ),
    (
        "a loop over an empty string",
        "for c in '':\n    print(c)\n",
        ["1: loop over the constant ''"],
    ),
    ("if True", "if True:\n    print(1)\n", ["1: a branch on the constant True"]),
    ("if 0", "if 0:\n    print(1)\n", ["1: a branch on the constant 0"]),
    (
        "if not None",
        "if not None:\n    print(1)\n",
        ["1: a branch on the constant None"],
    ),
    (
        "a conditional expression",
        "x = 1 if False else 2\n",
        ["1: a branch on the constant False"],
    ),
    ("while True is a loop", "while True:\n    break\n", []),
    ("while 0", "while 0:\n    pass\n", ["1: a branch on the constant 0"]),
    (
        "code after return",
        "def f():\n    return 1\n    print(2)\n",
        ["3: unreachable after line 2"],
    ),
    (
        "code after raise in a branch",
        "def f(x):\n    if x:\n        raise ValueError\n        x = 2\n    return x\n",
        ["4: unreachable after line 3"],
    ),
    (
        "an unread tuple target",
        "def f(g):\n    t, h, w = g\n    return t * h\n",
        ["2: local 'w' is never read"],
    ),
    ("an underscore target", "def f(g):\n    t, _, _w = g\n    return t\n", []),
    (
        "an unread loop variable in a comprehension",
        "def f(g):\n    return [1 for row in g]\n",
        ["2: local 'row' is never read", "2: loop name 'row' is never read"],
    ),
    (
        "a comprehension name read only outside it",
        "def f(g):\n    n = len(g)\n    return [1 for n in g], n\n",
        ["3: loop name 'n' is never read"],
    ),
    (
        "an uncalled helper",
        "def _used():\n    pass\n\n\ndef _unused():\n    pass\n\n\n"
        "class C:\n    def _m(self):\n        return _used()\n\n"
        "    def _n(self):\n        return self._m()\n",
        ["5: helper '_unused' is never used", "13: helper '_n' is never used"],
    ),
    (
        "read in a nested function",
        "def f(g):\n    y = g\n    def h():\n        return y\n    return h\n",
        [],
    ),
]


@pytest.mark.parametrize(
    ("case", "source", "problems"), DEAD_CASES, ids=[c[0] for c in DEAD_CASES]
)
def test_the_dead_code_pass_finds(case, source, problems):
    assert dead_constructs(source) == problems


# (case, a module, the problems with the foreign names "MiniCPM-V", "Gemma 3")
FOREIGN_CASES = [
    ("own model only", "# Qwen2-VL's grids\nx = 1\n", []),
    (
        "a comment naming another model",
        "x = 1  # as MiniCPM-V's resampler does\n",
        ["1: names another model, 'MiniCPM-V'"],
    ),
    (
        "a docstring naming one across a line break",
        'def f():\n    """Unlike Gemma\n    3, this."""\n',
        ["2: names another model, 'Gemma 3'"],
    ),
    ("a longer name is another name", "# Gemma 3n and MiniCPM-V2\n", []),
    ("an error message is not prose", "raise ValueError('MiniCPM-V')\n", []),
]


@pytest.mark.parametrize(
    ("case", "source", "problems"), FOREIGN_CASES, ids=[c[0] for c in FOREIGN_CASES]
)
def test_comments_naming_another_model_are_found(case, source, problems):
    assert dead_constructs(source, ("MiniCPM-V", "Gemma 3")) == problems


# (case, a module, the ruff rule that must report it)
RUFF_CASES = [
    ("an unused local", "def f():\n    x = 1\n", "F841"),
    ("an unused import", "import os\n", "F401"),
    ("an unused loop variable", "def f(g):\n    for x in g:\n        pass\n", "B007"),
    (
        "else on a loop without break",
        "def f(g):\n    for x in g:\n        print(x)\n    else:\n        print(0)\n",
        "PLW0120",
    ),
    ("a useless expression", "def f(x):\n    x.y\n", "B018"),
    ("a useless return", "def f(x):\n    print(x)\n    return None\n", "PLR1711"),
    ("a name only returned", "def f(x):\n    y = x + 1\n    return y\n", "RET504"),
]


@pytest.mark.parametrize(
    ("case", "source", "rule"), RUFF_CASES, ids=[c[0] for c in RUFF_CASES]
)
def test_ruff_reports_dead_code(tmp_path, case, source, rule):
    module = tmp_path / "m.py"
    module.write_text(source, encoding="utf-8")
    proc = subprocess.run(
        [*_ruff(), *RUFF_ARGS, str(module)], capture_output=True, text=True
    )
    assert f" {rule} " in proc.stdout, proc.stdout + proc.stderr
