"""Generator speed: `gen-mixin --check specs/*.yaml` wall time (interpreter
start included) and the import time of the generator package.

Targets (issue #2): --check under 1.5 s, `import generator.cli` under 200 ms,
on the CI machine (2 cores). Each figure is the median of fresh processes.

    python3 bench/bench_generator.py --out bench/results/generator.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK_TARGET_S = 1.5
IMPORT_TARGET_S = 0.2


def _wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    specs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "specs").glob("*.yaml"))
    check_cmd = [sys.executable, "-m", "generator.cli", "--check", *specs]
    # Import time inside a fresh interpreter, minus an empty interpreter.
    import_cmd = [
        sys.executable,
        "-c",
        "import time; t = time.perf_counter(); import generator.cli; "
        "print(time.perf_counter() - t)",
    ]
    _wall(check_cmd)  # warm the file cache
    check = [_wall(check_cmd) for _ in range(args.runs)]
    imports = []
    for _ in range(args.runs):
        out = subprocess.run(
            import_cmd, cwd=ROOT, check=True, capture_output=True, text=True
        )
        imports.append(float(out.stdout.strip()))
    result = {
        "benchmark": "generator",
        "machine": platform.machine(),
        "cpus": __import__("os").cpu_count(),
        "python": platform.python_version(),
        "specs": specs,
        "runs": args.runs,
        "check_wall_s": {"median": statistics.median(check), "max": max(check)},
        "import_s": {"median": statistics.median(imports), "max": max(imports)},
        "targets": {"check_wall_s": CHECK_TARGET_S, "import_s": IMPORT_TARGET_S},
    }
    result["meets_targets"] = (
        result["check_wall_s"]["median"] < CHECK_TARGET_S
        and result["import_s"]["median"] < IMPORT_TARGET_S
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"--check {result['check_wall_s']['median']:.3f} s (target {CHECK_TARGET_S}), "
        f"import {result['import_s']['median'] * 1000:.1f} ms (target "
        f"{IMPORT_TARGET_S * 1000:.0f} ms): {'met' if result['meets_targets'] else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
