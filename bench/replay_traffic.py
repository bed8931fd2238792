"""Replay cost-aware decisions offline on a recorded real-traffic run.

``bench/bench_traffic.py`` measures, per batch, eager, the exact-shape graph
and ``manager.execute`` under each ladder and policy. This script reads such
a ``traffic.json`` and, without a GPU:

1. prices the recorded plans with the run's own cost models (the model's
   prediction errors: vLLM's packing, the cost-aware plan, eager);
2. **replays today's planner** (:func:`~encoder_cudagraph_runtime.cost_aware.plan_execution`)
   on the run's batches: a cost model is calibrated the way the manager
   calibrates it, from the run's own measurements, by two-fold cross
   validation (fitted on the even batches, deciding the odd ones, and the
   other way round: no batch is decided by a model that saw it), and each
   decision's time is the run's measurement of that plan where the run
   measured it (vLLM's packing, all-eager, the run's cost-aware plan), or
   else an estimate from a model fitted on every batch (counted apart);
3. replays today's planner once more with a cost model fitted, by today's
   code, to the samples the run's own manager timed at calibration
   (``calibration_samples``, before any batch): what the run would have
   decided with today's fit;
4. totals per model, ladder and policy: speedup, worst batch, Σ best / Σ
   time, against the same for the run's policies.

It is torch-free (the planner and the packing are pure Python).

    python bench/replay_traffic.py traffic.json [--json replay.json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from encoder_cudagraph_runtime.cost_aware import (  # noqa: E402
    CostModel,
    EagerCost,
    EagerSample,
    ExecutionPlan,
    GraphCost,
    GraphSample,
    calibrated_cost_model,
    plan_execution,
)
from encoder_cudagraph_runtime.packing import pack_items  # noqa: E402

LADDERS = ("default", "fine", "tuned")
# DeepSeek-V4.1's aligner merges r x r patches (vision_downsample_ratio of
# the full tower); the others' budgets count tokens of 2 x 2 patches.
DEEPSEEK_RATIO = 3


def item_rows_tokens(stem: str, batch: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Budget rows and output tokens of a recorded batch's items (stored
    since schema 2; derived from the grids for the seed models before; an
    issue #6 workload is ``images`` times one ``item``)."""
    if "item_rows" in batch:
        return list(batch["item_rows"]), list(batch["item_tokens"])
    items = batch["items"] if "items" in batch else [batch["item"]] * batch["images"]
    if stem == "deepseek_v41":
        rows = [h * w for h, w in items]
        r = DEEPSEEK_RATIO
        return rows, [-(-h // r) * (-(-w // r) + 1) + 2 for h, w in items]
    if stem == "minimax_m3":
        rows = [t * h * w // 4 for t, h, w in items]
        return rows, list(rows)
    raise SystemExit(f"{stem}: this traffic.json predates per-item rows")


def cost_model_of(recorded: dict[str, Any]) -> CostModel:
    """A recorded ``CostModel.as_dict()`` (schema 1 had ``margin``)."""
    graph = dict(recorded["graph"])
    graph["replay_ms"] = {int(b): ms for b, ms in graph["replay_ms"].items()}
    graph["budget_scale"] = {
        int(b): x for b, x in graph.get("budget_scale", {}).items()
    }
    return CostModel(
        GraphCost(**graph),
        EagerCost(**recorded["eager"]),
        recorded.get("graph_error", 0.0),
        recorded.get("eager_error", recorded.get("margin", 0.0)),
    )


def measured(entry: dict[str, Any]) -> float:
    return entry["graph_ms"]["median"]


def round1_units(plan: Any) -> list[dict[str, Any]]:
    """The recorded plan's units (schema 1 stored them as a list)."""
    return plan if isinstance(plan, list) else plan["units"]


def unit_signature(units: Sequence[Any]) -> tuple[tuple[Any, int, int], ...]:
    """Units by (budget, items, rows), order-free: what makes two plans run
    the same replays and eager calls."""
    if units and isinstance(units[0], dict):
        return tuple(sorted(((u["budget"] or 0), u["items"], u["rows"]) for u in units))
    return tuple(sorted(((u.budget or 0), len(u.positions), u.rows) for u in units))


def vllm_signature(
    rows: list[int], tokens: list[int], budgets: list[int], mbs: int
) -> tuple[tuple[Any, int, int], ...]:
    batches = pack_items([rows], tokens, [budgets], mbs)
    return tuple(
        sorted(
            ((b.path_budgets[0] or 0), len(b.indices), b.path_tokens[0])
            for b in batches
        )
    )


def samples_of(
    stem: str, batches: list[dict[str, Any]], ladder: str, budgets: list[int], mbs: int
) -> tuple[list[EagerSample], list[GraphSample]]:
    """Calibration samples from recorded batches: each batch's eager time
    (fastest run) and each measured plan that was one graph replay."""
    eager, graph = [], []
    for batch in batches:
        rows, tokens = item_rows_tokens(stem, batch)
        eager.append(EagerSample(tuple(sorted(rows)), batch["eager_ms"]["min"]))
        entries = batch["graph"][ladder]
        packed = pack_items([rows], tokens, [budgets], mbs)
        vllm_budget = packed[0].path_budgets[0] if len(packed) == 1 else None
        if vllm_budget is not None:
            graph.append(
                GraphSample(vllm_budget, tuple(sorted(rows)), measured(entries["vllm"]))
            )
        units = round1_units(entries["cost"]["plan"] or [])
        if len(units) == 1 and units[0]["budget"] not in (None, vllm_budget):
            graph.append(
                GraphSample(
                    units[0]["budget"], tuple(sorted(rows)), measured(entries["cost"])
                )
            )
    return eager, graph


def calibrate(
    stem: str,
    batches: list[dict[str, Any]],
    ladder: dict[str, Any],
    name: str,
) -> CostModel:
    replay = cost_model_of(ladder["cost_model"]).graph.replay_ms
    eager, graph = samples_of(
        stem, batches, name, ladder["budgets"], ladder["max_batch_size"]
    )
    return calibrated_cost_model(replay, ladder["max_batch_size"], eager, graph)


def outcome(
    plan: ExecutionPlan,
    batch: dict[str, Any],
    name: str,
    signatures: dict[str, Any],
    reference: CostModel,
    rows: list[int],
) -> tuple[float, str]:
    """The recorded time of ``plan`` on ``batch``, or an estimate."""
    entries = batch["graph"][name]
    signature = unit_signature(plan.units)
    if signature == signatures["vllm"]:
        return measured(entries["vllm"]), "vllm"
    if plan.kind == "eager" and len(plan.units) == 1:
        return batch["eager_ms"]["median"], "eager"
    if entries["cost"]["plan"] and signature == signatures["round1"]:
        return measured(entries["cost"]), "round-1 plan"
    estimate = sum(
        (
            reference.eager.predict([rows[i] for i in u.positions])
            if u.budget is None
            else reference.graph.predict(
                u.budget, u.rows, sum(rows[i] ** 2 for i in u.positions)
            )
        )
        for u in plan.units
    )
    return estimate, "estimated"


def replay_ladder(
    stem: str, model: dict[str, Any], name: str, reference: CostModel
) -> list[dict[str, Any]]:
    """Today's planner on every batch of one ladder (two-fold; ``reference``
    prices the plans the run did not time)."""
    ladder = model["ladders"][name]
    batches = model["batches"]
    folds = [batches[0::2], batches[1::2]]
    decisions = []
    for fold, test in enumerate(folds):
        cost = calibrate(stem, folds[1 - fold], ladder, name)
        decisions += [decide(stem, b, name, ladder, cost, reference) for b in test]
    return sorted(decisions, key=lambda d: d["index"])


def refitted_calibration(
    model: dict[str, Any], name: str, eager_from: CostModel | None
) -> CostModel | None:
    """The cost model today's code fits to the samples the run's manager
    timed for ``name`` (``calibration_samples``; a ladder calibrated with
    another's eager cost reuses ``eager_from``), or ``None`` where the run
    kept none."""
    ladder = model["ladders"][name]
    timed = ladder.get("calibration_samples")
    if not timed or (not timed["eager"] and eager_from is None):
        return None
    eager = [EagerSample(tuple(s["rows"]), s["ms"]) for s in timed["eager"]]
    graph = [
        GraphSample(s["budget"], tuple(s["rows"]), s["ms"], s.get("replay_ms"))
        for s in timed["graph"]
    ]
    replay_ms = cost_model_of(ladder["cost_model"]).graph.replay_ms
    return calibrated_cost_model(
        replay_ms,
        ladder["max_batch_size"],
        eager,
        graph,
        reuse_eager=None if eager else eager_from,
        # A tower recorded as encoding item by item (since issue #27).
        declared_serial=bool(model.get("eager_per_item")),
    )


def replay_calibrated(
    stem: str,
    model: dict[str, Any],
    name: str,
    cost: CostModel,
    reference: CostModel,
) -> list[dict[str, Any]]:
    """Today's planner on every batch of one ladder, with ``cost`` fitted
    to the run's own calibration samples (what the manager saw before the
    batches: no batch informs its own decision)."""
    ladder = model["ladders"][name]
    return [decide(stem, b, name, ladder, cost, reference) for b in model["batches"]]


def decide(
    stem: str,
    batch: dict[str, Any],
    name: str,
    ladder: dict[str, Any],
    cost: CostModel,
    reference: CostModel,
) -> dict[str, Any]:
    """``cost``'s plan for ``batch`` and its time (see :func:`outcome`)."""
    budgets, mbs = ladder["budgets"], ladder["max_batch_size"]
    rows, tokens = item_rows_tokens(stem, batch)
    plan = plan_execution(rows, budgets, mbs, cost, sort_keys=tokens)
    entries = batch["graph"][name]
    signatures = {
        "vllm": vllm_signature(rows, tokens, budgets, mbs),
        "round1": unit_signature(round1_units(entries["cost"]["plan"] or [])),
    }
    ms, how = outcome(plan, batch, name, signatures, reference, rows)
    return {
        "index": batch["index"],
        "images": batch["images"],
        "rows": sum(rows),
        "source": plan.source,
        "kind": plan.kind,
        "predicted_ms": plan.predicted_ms,
        "predicted_vllm_ms": plan.vllm_ms,
        "predicted_eager_ms": plan.eager_ms,
        "ms": ms,
        "from": how,
        "eager_ms": batch["eager_ms"]["median"],
        "best_ms": batch["best_ms"],
        "vllm_ms": measured(entries["vllm"]),
        "round1_ms": measured(entries["cost"]),
    }


def totals(decisions: list[dict[str, Any]], key: str) -> dict[str, Any]:
    time = sum(d[key] for d in decisions)
    speedups = [d["eager_ms"] / d[key] for d in decisions]
    return {
        "speedup": sum(d["eager_ms"] for d in decisions) / time,
        "worst_batch": min(speedups),
        "vs_best": sum(d["best_ms"] for d in decisions) / time,
        "vs_best_90": bootstrap_vs_best(decisions, key),
    }


def bootstrap_vs_best(
    decisions: list[dict[str, Any]], key: str, draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """5th and 95th percentiles of Σ best / Σ ``key`` over batches drawn
    with replacement: how far another sample of as many batches of the same
    traffic could land."""
    rng = random.Random(seed)
    n = len(decisions)
    ratios = []
    for _ in range(draws):
        pick = [decisions[rng.randrange(n)] for _ in range(n)]
        ratios.append(sum(d["best_ms"] for d in pick) / sum(d[key] for d in pick))
    ratios.sort()
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]


def prediction_errors(stem: str, model: dict[str, Any], name: str) -> dict[str, Any]:
    """The run's own cost model against what the run measured."""
    ladder = model["ladders"][name]
    cost = cost_model_of(ladder["cost_model"])
    budgets, mbs = ladder["budgets"], ladder["max_batch_size"]
    vllm, eager = [], []
    for batch in model["batches"]:
        rows, tokens = item_rows_tokens(stem, batch)
        plan = plan_execution(rows, budgets, mbs, cost, sort_keys=tokens)
        vllm.append(plan.vllm_ms / measured(batch["graph"][name]["vllm"]) - 1)
        eager.append(plan.eager_ms / batch["eager_ms"]["median"] - 1)

    def spread(errors: list[float]) -> dict[str, float]:
        errors = sorted(errors)
        return {"min": errors[0], "median": errors[len(errors) // 2], "max": errors[-1]}

    return {"vllm_packing": spread(vllm), "eager": spread(eager)}


def replay_old_workloads(stem: str, model: dict[str, Any]) -> list[dict[str, Any]]:
    """Today's planner on issue #6's uniform workloads (fine ladder),
    calibrated on every real-traffic batch (none of them is one of these)."""
    ladder = model["ladders"]["fine"]
    budgets, mbs = ladder["budgets"], ladder["max_batch_size"]
    cost = calibrate(stem, model["batches"], ladder, "fine")
    out = []
    for row in model["old_workloads"]:
        rows, tokens = item_rows_tokens(stem, row)
        plan = plan_execution(rows, budgets, mbs, cost, sort_keys=tokens)
        entries = {"fine": row["graph"]}
        signatures = {
            "vllm": vllm_signature(rows, tokens, budgets, mbs),
            "round1": unit_signature(round1_units(row["graph"]["cost"]["plan"] or [])),
        }
        ms, how = outcome(
            plan, {**row, "graph": entries}, "fine", signatures, cost, rows
        )
        out.append(
            {
                "workload": f"{row['resolution']}x{row['images']}",
                "source": plan.source,
                "kind": plan.kind,
                "ms": ms,
                "from": how,
                "speedup": row["eager_ms"]["median"] / ms,
                "efficiency": row["ideal_ms"]["median"] / ms,
            }
        )
    return out


def replay(result: dict[str, Any]) -> dict[str, Any]:
    """Every model's decisions replayed; a model measured without the
    cost-aware policy (several encoder paths) gets its reason instead."""
    out: dict[str, Any] = {}
    for stem, model in result["models"].items():
        if "cost" not in model.get("policies_measured", ["cost"]):
            out[stem] = {"not_applicable": model["not_applicable"]["cost"]}
            continue
        out[stem] = {"old_workloads": replay_old_workloads(stem, model)}
        eager_from = None
        for name in LADDERS:
            # Prices the plans the run did not time, in both replays.
            reference = calibrate(stem, model["batches"], model["ladders"][name], name)
            decisions = replay_ladder(stem, model, name, reference)
            out[stem][name] = {
                "decisions": decisions,
                "vllm": totals(decisions, "vllm_ms"),
                "run_cost_aware": totals(decisions, "round1_ms"),
                "replayed": totals(decisions, "ms"),
                "estimated_batches": sum(d["from"] == "estimated" for d in decisions),
                "run_model_errors": prediction_errors(stem, model, name),
            }
            cost = refitted_calibration(model, name, eager_from)
            if cost is None:
                continue
            if model["ladders"][name]["calibration_samples"]["eager"]:
                eager_from = cost
            refitted = replay_calibrated(stem, model, name, cost, reference)
            out[stem][name]["refitted"] = totals(refitted, "ms")
            out[stem][name]["refitted_estimated_batches"] = sum(
                d["from"] == "estimated" for d in refitted
            )
    return out


def render(replayed: dict[str, Any]) -> str:
    lines = [
        (
            "| model | ladder | vLLM packing | run's cost-aware | replayed planner "
            "| estimated | refitted calibration | estimated |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(t: dict[str, Any]) -> str:
        low, high = t["vs_best_90"]
        return (
            f"{t['speedup']:.2f}x ({t['worst_batch']:.2f}x), {t['vs_best']:.3f} "
            f"[{low:.3f}, {high:.3f}]"
        )

    measured = {k: v for k, v in replayed.items() if "not_applicable" not in v}
    for stem, ladders in measured.items():
        for name, r in ladders.items():
            if name == "old_workloads":
                continue
            refit = (
                f"{cell(r['refitted'])} | {r['refitted_estimated_batches']}"
                if "refitted" in r
                else "– | –"
            )
            lines.append(
                f"| {stem} | {name} | {cell(r['vllm'])} | {cell(r['run_cost_aware'])} "
                f"| {cell(r['replayed'])} | {r['estimated_batches']} | {refit} |"
            )
    lines += [
        "",
        (
            "Cells: aggregate speedup vs eager (worst batch), Σ best / Σ time "
            "[5th, 95th percentile of it over the batches drawn with replacement]. "
            "Replayed planner: fitted on half the batches' measurements, deciding "
            "the other half; refitted calibration: fitted on the samples the run's "
            "manager timed before the batches, deciding them all."
        ),
        "",
        "Issue #6 workloads, fine ladder: plan, speedup, efficiency (time from).",
        "",
    ]
    for stem, ladders in replayed.items():
        if "not_applicable" in ladders:
            lines.append(f"- {stem}: {ladders['not_applicable']}")
            continue
        cells = "; ".join(
            f"{w['workload']} {w['source']}/{w['kind']} {w['speedup']:.2f}x "
            f"{w['efficiency']:.3f} ({w['from']})"
            for w in ladders["old_workloads"]
        )
        lines.append(f"- {stem}: {cells}")
    lines.append("")
    for stem, ladders in measured.items():
        for name, r in ladders.items():
            if name == "old_workloads":
                continue
            lines += [
                f"### {stem}, {name} ladder",
                "",
                (
                    "| batch | images | rows | plan | predicted | vLLM pred. | "
                    "eager pred. | time (from) | eager | vLLM | run's plan |"
                ),
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for d in r["decisions"]:
                lines.append(
                    f"| {d['index']} | {d['images']} | {d['rows']} | "
                    f"{d['source']}/{d['kind']} | {d['predicted_ms']:.1f} | "
                    f"{d['predicted_vllm_ms']:.1f} | {d['predicted_eager_ms']:.1f} | "
                    f"{d['ms']:.1f} ({d['from']}) | {d['eager_ms']:.1f} | "
                    f"{d['vllm_ms']:.1f} | {d['round1_ms']:.1f} |"
                )
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traffic", type=Path)
    parser.add_argument("--json", type=Path, help="also write the replay as JSON")
    args = parser.parse_args(argv)
    replayed = replay(json.loads(args.traffic.read_text()))
    sys.stdout.write(render(replayed) + "\n")
    if args.json:
        args.json.write_text(json.dumps(replayed, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
