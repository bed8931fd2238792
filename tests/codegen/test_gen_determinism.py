"""The generator's output depends on the spec and the templates only.

Rendering runs in fresh interpreters with different hash seeds (set and dict
iteration orders of strings change with ``PYTHONHASHSEED``) and from another
working directory with the spec copied elsewhere; every run must produce the
same bytes as this process. The output must not mention where the files were
or when they were made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from genmixin_testlib import REPO, render_all, spec_paths, spec_targets, target_cases

HASH_SEEDS = ("0", "1", "12345")

# Renders each spec given on the command line for every target and prints
# {"<target>/<stem>": source} as JSON. Spec paths are used as given.
_RENDER_SCRIPT = """
import json, sys
from pathlib import Path
from generator.emit import render_spec
out = {}
for spec in sys.argv[1:]:
    for item in render_spec(Path(spec), None, Path("generated")):
        out[f"{item.target}/{Path(spec).stem}"] = item.source
print(json.dumps(out))
"""


def _expected() -> dict[str, str]:
    return {f"{t}/{stem}": src for (t, stem), src in render_all().items()}


def _launch(seed: str, cwd: Path, specs: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    return subprocess.Popen(
        [sys.executable, "-c", _RENDER_SCRIPT, *specs],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _collect(proc: subprocess.Popen) -> dict[str, str]:
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    return json.loads(stdout)


def test_same_bytes_across_hash_seeds_and_directories(tmp_path: Path) -> None:
    """Seeds 0, 1, 12345 from the repository (relative spec paths), and one
    more run from an unrelated directory on copies of the specs."""
    rel_specs = [str(p.relative_to(REPO)) for p in spec_paths()]
    copies = tmp_path / "elsewhere" / "specs"
    copies.mkdir(parents=True)
    for spec in spec_paths():
        shutil.copy(spec, copies / spec.name)
    procs = {f"seed {seed}": _launch(seed, REPO, rel_specs) for seed in HASH_SEEDS}
    procs["copied specs, other cwd"] = _launch(
        "777", tmp_path, [str(copies / p.name) for p in spec_paths()]
    )
    expected = _expected()
    for label, proc in procs.items():
        got = _collect(proc)
        assert got.keys() == expected.keys(), label
        for key, source in expected.items():
            assert got[key] == source, f"{key} differs when rendered with {label}"


def test_rendering_twice_in_one_process_is_identical() -> None:
    from generator.emit import render_spec

    for spec in spec_paths():
        first = [r.source for r in render_spec(spec, None, Path("generated"))]
        second = [r.source for r in render_spec(spec, None, Path("generated"))]
        assert first == second, spec.name
        assert first == [render_all()[(t, spec.stem)] for t in spec_targets(spec)]


_ABSOLUTE_PATH = re.compile(
    r"(?<![\w.])(/(?:home|root|tmp|usr|var|opt|work|Users|private|mnt)\b[^\s\"']*"
    r"|[A-Za-z]:\\\\[^\s\"']*)"
)
_TIMESTAMP = re.compile(
    r"\b(19|20)\d\d-[01]\d-[0-3]\d\b"  # 2026-11-29
    r"|\b[0-2]\d:[0-5]\d:[0-5]\d\b"  # 22:36:42
    r"|\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun), ?\d"  # Sun, 29 ...
    r"|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{1,2},? (19|20)\d\d\b"
)


@pytest.mark.parametrize(
    "key", [f"{t}/{s.stem}" for t, s in target_cases(spec_paths())]
)
def test_output_has_no_paths_or_timestamps(key: str) -> None:
    target, stem = key.split("/")
    source = render_all()[(target, stem)]
    for needle in {
        str(REPO),
        str(Path.home()),
        os.getcwd(),
        str(Path("/tmp").resolve()),
    }:
        assert needle not in source, f"{key} mentions {needle!r}"
    assert not _ABSOLUTE_PATH.search(source), _ABSOLUTE_PATH.search(source)
    assert not _TIMESTAMP.search(source), _TIMESTAMP.search(source)
    # The provenance header names the spec relative to its folder.
    assert f"(target: {target})" in source
    assert f"From specs/{stem}.yaml:" in source
