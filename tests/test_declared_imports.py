"""Every import of the project is declared in pyproject.toml, in the section
its folder may use (declared_imports.SECTIONS), and the check that says so
catches what it should on small synthetic trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from declared_imports import SECTIONS, find_problems

ROOT = Path(__file__).resolve().parents[1]

SYNTHETIC_PYPROJECT = """\
[project]
name = "demo_project"
dependencies = ["PyYAML==6.0.3"]

[project.optional-dependencies]
runtime = ["torch>=2.4", "numpy"]
gpu = ["demo-project[runtime]", "flash_attn>=2"]
bench = ["Demo.Project[runtime]", "matplotlib"]
test = ["demo-project[runtime,bench]", "pytest>=8 ; python_version >= '3.11'"]

[tool.setuptools.packages.find]
include = ["generator*", "encoder_cudagraph_runtime*"]
"""

# A tree that uses each declared distribution once, where it may.
CLEAN_TREE = {
    "generator/cli.py": (
        "import json\nimport yaml\nfrom generator import ir\nfrom . import naming\n"
    ),
    "encoder_cudagraph_runtime/attn.py": (
        "import numpy as np\nimport torch.nn\n"
        "try:\n    import flash_attn\nexcept ImportError:\n    flash_attn = None\n"
    ),
    "bench/plots.py": "import matplotlib.pyplot as plt\nimport helpers\n",
    "tests/helpers.py": "",
    "tests/test_towers.py": 'import pytest\nnp = pytest.importorskip("numpy")\n',
    "generated/vllm/model.py": "import torch\nfrom vllm.config import VllmConfig\n",
}

# (case, files added to or replacing CLEAN_TREE's, expected problems as
# "path:line: start of the message").
CASES = [
    ("clean", {}, []),
    (
        "a new import anywhere",
        {"bench/new.py": "import scipy\n"},
        ["bench/new.py:1: scipy: distribution 'scipy' is not declared"],
    ),
    (
        "the generator may use only dependencies",
        {"generator/render.py": '"""doc"""\n\nimport torch\nimport pytest\n'},
        [
            "generator/render.py:3: torch: distribution 'torch' is not declared",
            "generator/render.py:4: pytest: distribution 'pytest' is not declared",
        ],
    ),
    (
        "an import inside a function",
        {"reference_towers/tower.py": "def f():\n    from scipy.linalg import eigh\n"},
        ["reference_towers/tower.py:2: scipy:"],
    ),
    (
        "an optional import the tests skip without",
        {"tests/test_schema.py": 'import pytest\npytest.importorskip("jsonschema")\n'},
        ["tests/test_schema.py:2: jsonschema: distribution 'jsonschema'"],
    ),
    (
        "string imports: import_module with an f-string, find_spec, __import__",
        {
            "tests/probe.py": (
                "import importlib, importlib.util\n"
                'importlib.import_module(f"scipy.{name}")\n'
                'importlib.util.find_spec("sklearn.svm")\n'
                '__import__("os")\n'
            )
        },
        ["tests/probe.py:2: scipy:", "tests/probe.py:3: sklearn:"],
    ),
    (
        "vllm only in the drop-ins",
        {"encoder_cudagraph_runtime/defs.py": "import vllm\n"},
        ["encoder_cudagraph_runtime/defs.py:1: vllm: distribution 'vllm'"],
    ),
    (
        "an import name that is not its distribution's",
        {"encoder_cudagraph_runtime/image.py": "import PIL.Image\n"},
        ["encoder_cudagraph_runtime/image.py:1: PIL: distribution 'pil'"],
    ),
    (
        "CI's scripts run before any install",
        {".ci/extract.py": "import re\nimport yaml\n"},
        [".ci/extract.py:2: yaml: distribution 'pyyaml' is not declared"],
    ),
    (
        "a file outside every section",
        {"tools/report.py": "import yaml\n", "tools/stdlib_only.py": "import os\n"},
        ["tools/report.py:1: yaml: the file is in no section"],
    ),
    (
        "declared but never imported",
        {"bench/plots.py": "import json\n"},
        ["pyproject.toml:0: 'matplotlib' is declared but no file imports it"],
    ),
    (
        "a file that does not parse",
        {"tests/broken.py": "x = 1\ndef (:\n"},
        ["tests/broken.py:2: does not parse"],
    ),
    (
        "hidden folders, caches, virtual environments and builds are skipped",
        {
            ".venv/lib/site.py": "import scipy\n",
            "v/pyvenv.cfg": "home = /usr/bin\n",
            "v/lib/site.py": "import scipy\n",
            "build/lib/x.py": "import scipy\n",
            "demo.egg-info/x.py": "import scipy\n",
            "tests/__pycache__/x.py": "import scipy\n",
        },
        [],
    ),
]


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    ("files", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_synthetic_tree(tmp_path: Path, files: dict[str, str], expected: list[str]):
    _write_tree(
        tmp_path, {"pyproject.toml": SYNTHETIC_PYPROJECT, **CLEAN_TREE, **files}
    )
    problems = [str(problem) for problem in find_problems(tmp_path)]
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problems


def test_the_project_declares_every_import():
    problems = find_problems(ROOT)
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.parametrize("folder", [section.folder for section in SECTIONS])
def test_an_undeclared_import_fails_in_every_section(tmp_path: Path, folder: str):
    added = f"{folder}added_by_someone.py"
    _write_tree(
        tmp_path,
        {
            "pyproject.toml": (ROOT / "pyproject.toml").read_text(encoding="utf-8"),
            added: "import scipy\n",
        },
    )
    problems = [str(p) for p in find_problems(tmp_path) if p.path == added]
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"{added}:1: scipy: distribution 'scipy' is not declared in pyproject.toml"
        f" for {folder} (it may use "
    ), problems
