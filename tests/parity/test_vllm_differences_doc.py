"""docs/vllm-differences.md and docs/vllm-findings.md stay true: each row
names a test that exists, and the parity test of each model checks the
document's ids for that model (test_parity_<model>.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from parity_testlib import REPO, SHARED, listed_in_doc

HERE = Path(__file__).resolve().parent
FINDINGS_DOC = REPO / "docs" / "vllm-findings.md"


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    }


def test_every_listed_difference_names_an_existing_test() -> None:
    listed = listed_in_doc()
    assert listed, "docs/vllm-differences.md lists no difference"
    missing = []
    for difference, tests in listed.items():
        for test in tests:
            file, name = test.split("::")
            if not (HERE / file).is_file() or name not in _tests_in(HERE / file):
                missing.append(f"{difference}: {test}")
    assert not missing, missing


def test_every_model_with_listed_differences_has_a_parity_test() -> None:
    models = {difference.split(".")[0] for difference in listed_in_doc()} - {SHARED}
    assert {m for m in models if not (HERE / f"test_parity_{m}.py").is_file()} == set()


def _shared_differences() -> dict[str, str]:
    """id -> the name parity_hosts binds to each ``Difference("all.x", ...)``."""
    tree = ast.parse((HERE / "parity_hosts.py").read_text(encoding="utf-8"))
    bound = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "Difference"
            and isinstance(node.value.args[0], ast.Constant)
        ):
            bound[node.value.args[0].value] = ast.unparse(node.targets[0])
    return bound


def test_every_shared_row_is_listed_by_a_models_parity_test() -> None:
    """A shared row (``all.*``) is checked wherever a model's test lists it
    (``check_differences``): each one the document has must be defined in
    parity_hosts and listed by at least one model's test, and each one
    defined there must be on the page."""
    shared = {i for i in listed_in_doc() if i.split(".")[0] == SHARED}
    defined = _shared_differences()
    assert shared == set(defined)
    users = {
        id_: sorted(
            path.name
            for path in HERE.glob("test_parity_*.py")
            if f"hosts.{name}" in path.read_text(encoding="utf-8")
        )
        for id_, name in defined.items()
    }
    assert all(users.values()), users


def test_every_finding_names_an_existing_reproducer() -> None:
    text = FINDINGS_DOC.read_text(encoding="utf-8")
    named = re.findall(r"`(test_vllm_findings\.py::test_[a-z0-9_]+)`", text)
    assert named, "docs/vllm-findings.md names no reproducer"
    tests = _tests_in(HERE / "test_vllm_findings.py")
    assert {n.split("::")[1] for n in named} == tests


def test_every_difference_row_is_read() -> None:
    """A row the parser does not match would drop out of every check."""
    text = (REPO / "docs" / "vllm-differences.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9_]+\.[a-z0-9-]+)` \|", text, flags=re.M)
    assert sorted(rows) == sorted(listed_in_doc())
