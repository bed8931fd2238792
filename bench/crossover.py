"""Where encoder CUDA graphs stop paying, per model, from calibrated cost
models (issue #27).

A graph replay pays for its launches once; eager forwards pay them per call
(and, for a tower that encodes item by item, per item). On large,
compute-bound batches both run the same kernels and the graph's padding
and capture-shaped attention cost more: past some rows per batch the
exact-shape graph is no faster than eager. This prints, for every model and
ladder of a recorded ``bench/bench_traffic.py`` result, the crossover
(:func:`~encoder_cudagraph_runtime.cost_aware.crossover_rows`) per number
of equal items a batch is split into, and the value for
``gen-mixin plan --traffic``'s ``tuning.crossover_rows`` (the largest: from
there on every split loses; none where some split still pays at the
largest budget)::

    PYTHONPATH=. python bench/crossover.py bench/results/run14/h4/traffic.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_traffic import cost_model_of  # noqa: E402

from encoder_cudagraph_runtime.cost_aware import (  # noqa: E402
    CostModel,
    crossover_rows,
)


def tuning_crossover(cost: CostModel) -> int | None:
    """``tuning.crossover_rows`` from a cost model: the rows from which
    every split of a batch loses, ``None`` when some split still pays."""
    values = crossover_rows(cost).values()
    return None if None in values else max(v for v in values if v is not None)


def crossovers(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for stem, model in result.get("models", {}).items():
        for ladder, entry in (model.get("ladders") or {}).items():
            recorded = entry.get("cost_model")
            if not recorded:
                continue
            cost = cost_model_of(recorded)
            rows.append(
                {
                    "spec": stem,
                    "ladder": ladder,
                    "per_items": crossover_rows(cost),
                    "crossover_rows": tuning_crossover(cost),
                }
            )
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | ladder | crossover by items per batch (rows) | tuning.crossover_rows |",
        "|---|---|---|---|",
    ]
    for row in rows:
        per = ", ".join(f"{n}: {v if v else '-'}" for n, v in row["per_items"].items())
        lines.append(
            f"| {row['spec']} | {row['ladder']} | {per} | {row['crossover_rows'] or '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="traffic.json files")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [
        {"file": str(path), **row}
        for path in args.results
        for row in crossovers(json.loads(path.read_text()))
    ]
    print(json.dumps(rows, indent=1) if args.json else format_rows(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
