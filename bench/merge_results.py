"""Merge ``bench/bench_encoders.py`` results of several runs, model by model.

A later file's model replaces an earlier one's (a rerun of one model after a
change that touched only it); the targets are evaluated again on the merged
models, and every model records the run it came from (``source``).

    python bench/merge_results.py full_run.json deepseek_rerun.json --out merged.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_encoders import evaluate_targets  # noqa: E402


def merge(
    results: list[tuple[str, dict[str, Any]]], note: str | None = None
) -> dict[str, Any]:
    """``results``: (label, result) in order; the first gives everything but
    the models, which later results override one by one. The merged result
    spans runs, so it keeps no single ``git_commit``: ``note`` says what ran
    where."""
    if not results:
        raise ValueError("nothing to merge")
    label, first = results[0]
    merged = {k: v for k, v in first.items() if k != "models"}
    merged["environment"] = {
        k: v for k, v in first.get("environment", {}).items() if k != "git_commit"
    }
    if note:
        merged["note"] = note
    models: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for label, result in results:
        for stem, model in result["models"].items():
            models[stem] = model
            sources[stem] = label
    merged["models"] = models
    merged["sources"] = sources
    merged["targets"] = evaluate_targets(models)
    gating = [t["passed"] for t in merged["targets"] if t["passed"] is not None]
    merged["all_targets_passed"] = bool(gating) and all(gating)
    merged["complete"] = all(r.get("complete", True) for _, r in results)
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", help="what ran where (kept in the result)")
    args = parser.parse_args(argv)
    loaded = [
        (str(path), json.loads(path.read_text(encoding="utf-8")))
        for path in args.results
    ]
    merged = merge(loaded, args.note)
    args.out.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    for stem, source in merged["sources"].items():
        print(f"{stem}: {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
