"""Render ``bench/bench_encoders.py`` results: a markdown report (for the
README or a GPU-run summary) and a PNG plot of speedup (eager / graph) and
efficiency (ideal / graph) against images per batch, one line per model,
resolution and ladder; and ``bench/bench_traffic.py`` results (real-traffic
workload: per-ladder and per-policy totals, every batch, the tuner's
prediction), with a plot of every batch's speedup against its eager time.

    python bench/render_results.py bench.json                  # markdown to stdout
    python bench/render_results.py bench.json --markdown bench.md --plot bench.png

The markdown needs nothing but the standard library; the plot needs
matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

LADDERS = ("default", "fine")


def _gated(result: dict[str, Any]) -> list[str]:
    info = {
        m
        for t in result.get("targets", [])
        for m in t.get("info_models", {}).get("models", [])
    }
    return [stem for stem in result.get("models", {}) if stem not in info]


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _ms(stats: dict[str, Any]) -> str:
    """``median ± IQR/2`` in ms."""
    median, iqr = stats.get("median"), stats.get("iqr")
    if median is None:
        return "–"
    digits = 3 if median < 1 else 2 if median < 100 else 1
    return f"{median:.{digits}f} ± {iqr / 2:.{digits}f}"


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:.0f}"


def _params(n: int) -> str:
    return f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.2f}M"


def _pair(a: str, b: str) -> str:
    return f"{a} / {b}"


def render_markdown(result: dict[str, Any]) -> str:
    if result.get("benchmark") == "encoder_traffic":
        return render_traffic_markdown(result)
    env = result["environment"]
    params = result["params"]
    out: list[str] = []
    out.append("## Encoder CUDA graph benchmark")
    out.append("")
    out.append(
        f"{env.get('device')} ({env.get('graph_backend')} backend), torch "
        f"{env.get('torch')}, CUDA {env.get('cuda')}, Python {env.get('python')}, "
        f"flash-attn {env.get('flash_attn') or 'not installed'} (varlen kernel: "
        f"`{env.get('flash_varlen_kernel')}`); size `{params['size']}`, "
        f"{params['dtype']}, max_num_batched_tokens {params['max_num_batched_tokens']}"
        f"{', quick' if params.get('quick') else ''}; "
        f"{result.get('elapsed_s', 0):.0f} s in all"
        + (f"; commit `{env['git_commit'][:10]}`" if env.get("git_commit") else "")
        + "."
    )
    out.append("")
    fine = params["fine_ladder"]
    out.append(
        "Ladders: **default** = the manager's own (spec minimum doubled to the "
        "maximum); **fine** = "
        + (
            f"budgets `min · 2^k · s` for s in {fine['steps']}"
            if "steps" in fine
            else f"budgets `round_up(min · {fine['ratio']}^i, 16)`"
        )
        + f" with {fine['max_items']} items per batch."
        " Latencies are median ± IQR/2 in ms; speedup = eager / graph, efficiency = ideal / graph (medians); "
        "waste = rows replayed / rows used − 1; overhead = the manager's own "
        "host time per execute (median, µs). Cells with two values are "
        "default / fine."
    )
    out.append("")

    if result.get("sources"):
        runs = ", ".join(f"{stem}: `{src}`" for stem, src in result["sources"].items())
        out.append(f"Merged from several runs ({runs}).")
        out.append("")
    if result.get("note"):
        out.append(result["note"])
        out.append("")

    # Targets.
    out.append("### Targets")
    out.append("")
    out.append("| target | result | default ladder | fine ladder |")
    out.append("|---|---|---|---|")
    for target in result.get("targets", []):
        status = {True: "**pass**", False: "**FAIL**", None: "n/a"}[target["passed"]]
        cells = []
        for ladder in LADDERS:
            r = target["per_ladder"].get(ladder, {})
            worst = r.get("worst")
            if not worst:
                cells.append("–")
                continue
            where = " ".join(
                str(v) + ("²" if k == "resolution" else " img" if k == "images" else "")
                for k, v in worst.items()
                if k != "value"
            )
            gate = "" if ladder in target["gating_ladders"] else " (info)"
            verdict = "pass" if r.get("passed") else "fail"
            cells.append(f"{verdict}{gate}: worst {worst['value']:.3g} ({where})")
        out.append(f"| {target['description']} | {status} | {cells[0]} | {cells[1]} |")
    info = [t for t in result.get("targets", []) if t.get("info_models")]
    if info:
        models = ", ".join(info[0]["info_models"]["models"])
        out.append("")
        out.append(
            f"The targets gate on {', '.join(_gated(result))}; the same checks on "
            f"{models} (informational):"
        )
        out.append("")
        out.append("| target | result | worst (fine ladder) |")
        out.append("|---|---|---|")
        for target in info:
            r = target["info_models"]
            status = {True: "pass", False: "fail", None: "n/a"}[r["passed"]]
            worst = r["per_ladder"].get("fine", {}).get("worst")
            cell = "–"
            if worst:
                where = " ".join(
                    str(v)
                    + ("²" if k == "resolution" else " img" if k == "images" else "")
                    for k, v in worst.items()
                    if k != "value"
                )
                cell = f"{worst['value']:.3g} ({where})"
            out.append(f"| {target['description']} | {status} | {cell} |")
    out.append("")
    for stem in result.get("errors", {}):
        out.append(f"**{stem} failed**: see the run's log (`errors` in the JSON).")
        out.append("")

    for stem, model in result["models"].items():
        out.append(f"### {stem}")
        out.append("")
        grids = ", ".join(
            f"{res}² → {'x'.join(str(v) for v in grid)}"
            for res, grid in model["grids"].items()
        )
        out.append(
            f"`{model['mixin']}` on `{model['host']}`, {_params(model['params'])} "
            f"parameters; grids: {grids}."
        )
        out.append("")
        out.append("| ladder | graphs | budgets | max items | capture s | pool MiB |")
        out.append("|---|---|---|---|---|---|")
        for ladder in LADDERS:
            lad = model["ladders"][ladder]
            cap = lad["capture"]
            budgets = lad["budgets"]
            shown = (
                ", ".join(map(str, budgets))
                if len(budgets) <= 10
                else ", ".join(map(str, budgets[:4]))
                + f", … ({len(budgets)} budgets) …, "
                + ", ".join(map(str, budgets[-2:]))
            )
            out.append(
                f"| {ladder} | {cap['num_graphs']} | {shown} | "
                f"{lad['max_batch_size']} | {_f(cap['seconds'], 1)} | "
                f"{_mib(cap['pool_bytes'])} |"
            )
        out.append("")
        out.append(
            "| workload | images | eager ms | ideal ms | graph ms (default) | "
            "graph ms (fine) | speedup | efficiency | waste | input waste | "
            "overhead µs |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for row in model["uniform"]:
            g = row["graph"]
            out.append(
                f"| {row['resolution']}² | {row['images']} | {_ms(row['eager_ms'])} | "
                f"{_ms(row['ideal_ms'])} | {_ms(g['default']['graph_ms'])} | "
                f"{_ms(g['fine']['graph_ms'])} | "
                + _pair(_f(g["default"]["speedup"]), _f(g["fine"]["speedup"]))
                + " | "
                + _pair(_f(g["default"]["efficiency"]), _f(g["fine"]["efficiency"]))
                + " | "
                + _pair(
                    _pct(g["default"]["padding"]["padding_waste"]),
                    _pct(g["fine"]["padding"]["padding_waste"]),
                )
                + " | "
                + _pair(
                    _pct(g["default"]["padding"]["input_padding_waste"]),
                    _pct(g["fine"]["padding"]["input_padding_waste"]),
                )
                + " | "
                + _pair(
                    _f(g["default"]["host_overhead_us"]["median"], 0),
                    _f(g["fine"]["host_overhead_us"]["median"], 0),
                )
                + " |"
            )
        mixed = model["mixed"]["summary"]
        d, f = mixed["default"], mixed["fine"]
        out.append(
            f"| mixed ({d['batches']} batches) | {d['images']} | "
            f"{_f(d['eager_ms_total'])} (sum) | {_f(d['ideal_ms_total'])} (sum) | "
            f"{_f(d['graph_ms_total'])} (sum) | {_f(f['graph_ms_total'])} (sum) | "
            + _pair(_f(d["speedup"]), _f(f["speedup"]))
            + " | "
            + _pair(_f(d["efficiency"]), _f(f["efficiency"]))
            + " | "
            + _pair(_pct(d["padding_waste"]), _pct(f["padding_waste"]))
            + " | "
            + _pair(_pct(d["input_padding_waste"]), _pct(f["input_padding_waste"]))
            + " | "
            + _pair(
                _f(d["host_overhead_us"]["median"], 0),
                _f(f["host_overhead_us"]["median"], 0),
            )
            + " |"
        )
        out.append("")
    return "\n".join(out) + "\n"


def render_plot(result: dict[str, Any], path: Path) -> None:
    """Speedup and efficiency against images per batch (raises ImportError
    without matplotlib)."""
    if result.get("benchmark") == "encoder_traffic":
        render_traffic_plot(result, path)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_speed, ax_eff) = plt.subplots(1, 2, figsize=(14, 7))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    linestyles = {"default": "--", "fine": "-"}
    markers = ["o", "s", "^", "D", "v"]
    resolutions = sorted(
        {r["resolution"] for m in result["models"].values() for r in m["uniform"]}
    )
    for mi, (stem, model) in enumerate(result["models"].items()):
        color = colors[mi % len(colors)]
        for ri, res in enumerate(resolutions):
            rows = sorted(
                (r for r in model["uniform"] if r["resolution"] == res),
                key=lambda r: r["images"],
            )
            if not rows:
                continue
            xs = [r["images"] for r in rows]
            for ladder in LADDERS:
                label = f"{stem} {res}² {ladder}"
                style = {
                    "color": color,
                    "linestyle": linestyles[ladder],
                    "marker": markers[ri % len(markers)],
                    "alpha": 0.9 if ladder == "fine" else 0.6,
                }
                ax_speed.plot(
                    xs,
                    [r["graph"][ladder]["speedup"] for r in rows],
                    label=label,
                    **style,
                )
                ax_eff.plot(
                    xs,
                    [r["graph"][ladder]["efficiency"] for r in rows],
                    label=label,
                    **style,
                )
    counts = sorted(
        {r["images"] for m in result["models"].values() for r in m["uniform"]}
    )
    for ax, title, target in (
        (ax_speed, "speedup = eager / graph", 2.0),
        (ax_eff, "efficiency = ideal / graph", 0.85),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.minorticks_off()
        ax.set_xlabel("images per batch")
        ax.set_title(title)
        ax.axhline(target, color="grey", linewidth=1, linestyle=":")
        ax.text(counts[0], target, f" target {target:g}", va="bottom", fontsize=8)
        ax.grid(True, alpha=0.3)
    ax_speed.set_ylim(bottom=0)
    ax_eff.set_ylim(bottom=0)
    handles, labels = ax_speed.get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        fontsize=7,
        ncol=max(1, min(6, len(labels) // 3)),
        loc="lower center",
    )
    env = result["environment"]
    fig.suptitle(
        f"Encoder CUDA graphs, {env.get('device')} ({result['params']['size']}); "
        "dashed: default ladder, solid: fine ladder"
    )
    rows = -(-len(labels) // max(1, min(6, len(labels) // 3)))
    fig.tight_layout(rect=(0, 0.03 * rows + 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------
# Real-traffic results (bench/bench_traffic.py)
# ---------------------------------------------------------------------------

TRAFFIC_LADDERS = ("default", "fine", "tuned")
POLICIES = ("vllm", "cost")


def _missing(
    model: dict[str, Any], ladder: str, policy: str | None = None
) -> str | None:
    """A table cell for a ``ladder`` (and ``policy``) not measured on
    ``model`` (a model of several encoder paths: ``n/a (multi-path)``, the
    reasons in full under the model's tables), or ``None``."""
    reasons = model.get("not_applicable", {})
    missing = ladder if ladder not in model["summary"] else None
    if (
        missing is None
        and policy is not None
        and policy not in model["summary"][ladder]
    ):
        missing = policy
    if missing is None:
        return None
    return reasons.get(missing, "n/a").split(":")[0]


def _header(result: dict[str, Any], title: str) -> list[str]:
    env, params = result["environment"], result["params"]
    return [
        f"## {title}",
        "",
        f"{env.get('device')} ({env.get('graph_backend')} backend), torch "
        f"{env.get('torch')}, CUDA {env.get('cuda')}; size `{params['size']}`, "
        f"{params['dtype']}, max_num_batched_tokens {params['max_num_batched_tokens']}"
        f"{', quick' if params.get('quick') else ''}; "
        f"{result.get('elapsed_s', 0):.0f} s in all"
        + (f"; commit `{env['git_commit'][:10]}`" if env.get("git_commit") else "")
        + ".",
        "",
    ]


def _traffic_targets(result: dict[str, Any]) -> list[str]:
    out = ["### Targets", "", "| target | result | worst |", "|---|---|---|"]
    for target in result.get("targets", []):
        status = {True: "**pass**", False: "**FAIL**", None: "n/a"}[target["passed"]]
        worst = target.get("worst")
        cell = "–"
        if worst and worst.get("value") is not None:
            where = ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in worst.items()
                if k not in ("value", "ok") and v is not None
            )
            cell = f"{worst['value']:.3g} ({where})"
        for check in target.get("info", []):
            if check["value"] is not None:
                status += (
                    f"; {check['model']} {check['ladder']} (info): {check['value']:.3g}"
                )
        gaps: dict[str, str] = {}
        for c in target.get("not_applicable", []):
            gaps.setdefault(c["model"], c["reason"].split(":")[0])
        for stem, reason in gaps.items():
            status += f"; {stem}: {reason}"
        out.append(f"| {target['description']} | {status} | {cell} |")
    return out + [""]


def _budget_list(budgets: list[int]) -> str:
    if len(budgets) <= 12:
        return ", ".join(map(str, budgets))
    return ", ".join(map(str, budgets[:6])) + f", … ({len(budgets)})"


def _traffic_summary(model: dict[str, Any]) -> list[str]:
    out = [
        "| ladder | policy | Σ eager ms | Σ exact graph ms (replay / e2e) | Σ best ms | "
        "Σ graph ms | speedup | worst batch | worst paired | vs best | "
        "efficiency (replay / e2e) | waste | plans |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ladder in TRAFFIC_LADDERS:
        for policy in POLICIES:
            reason = _missing(model, ladder, policy)
            if reason is not None:
                out.append(f"| {ladder} | {policy} | {reason} |" + " |" * 10)
                continue
            s = model["summary"][ladder][policy]
            plans = ", ".join(f"{k} {v}" for k, v in sorted(s["plans"].items())) or "–"
            # Same-round eager / call (absent before run C's JSON).
            paired = s.get("paired_speedup_per_batch", {}).get("min")
            paired_cell = "–" if paired is None else f"{paired:.2f}x"
            out.append(
                f"| {ladder} | {policy} | {_f(s['eager_ms_total'], 1)} | "
                f"{_f(s['ideal_ms_total'], 1)} / {_f(s['ideal_e2e_ms_total'], 1)} | "
                f"{_f(s['best_ms_total'], 1)} | {_f(s['graph_ms_total'], 1)} | "
                f"{_f(s['speedup'])}x | {_f(s['speedup_per_batch']['min'])}x "
                f"(#{s['worst_batch']}) | {paired_cell} | {_f(s['vs_best'], 3)} | "
                f"{_f(s['efficiency'], 3)} / {_f(s['efficiency_e2e'], 3)} | "
                f"{_pct(s['padding_waste'])} | {plans} |"
            )
    return out + [""]


def _path_waste(model: dict[str, Any]) -> list[str]:
    """Per-path padding of vLLM's packing (a model of several paths): in
    budget rows, and in the rows of each path's first input buffer (views
    for encoders of fixed-size views)."""
    out = [
        "Padding per encoder path (vLLM's packing):",
        "",
        "| ladder | path | budgets | replays | budget rows replayed / used | waste | "
        "input rows replayed / used | input waste |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ladder, per_policy in model["summary"].items():
        for path, w in per_policy["vllm"].get("paths", {}).items():
            budgets = model["ladders"][ladder].get("path_budgets", {}).get(path, [])
            out.append(
                f"| {ladder} | {path} | {', '.join(map(str, budgets))} | "
                f"{w['replays']} | {w['rows_replayed']} / {w['rows_used']} | "
                f"{_pct(w['padding_waste'])} | {w['input_rows_replayed']} / "
                f"{w['input_rows_used']} | {_pct(w['input_padding_waste'])} |"
            )
    return out + [""]


def _budget_tokens_cell(row: dict[str, Any]) -> str:
    """A batch's budget tokens, per path where it has several."""
    if "path_rows" not in row:
        return str(row["budget_tokens"])
    return ", ".join(f"{p} {sum(r)}" for p, r in row["path_rows"].items())


def _plan_cell(entry: dict[str, Any]) -> str:
    """``source/kind predicted→measured ms`` of a cost-aware entry."""
    plan = entry["plan"]
    if not isinstance(plan, dict) or plan.get("kind") is None:
        return ""  # the vllm policy, or schema 1 (a list of units)
    return (
        f" ({plan['source']}/{plan['kind']} {_f(entry['predicted_ms'], 1)}"
        f"→{_f(entry['graph_ms']['median'], 1)})"
    )


def _traffic_batches(model: dict[str, Any]) -> list[str]:
    out = [
        "| # | images | budget tokens | eager ms | exact graph e2e ms | "
        + " | ".join(
            f"{ladder} vllm / cost (plan predicted→measured ms)"
            for ladder in TRAFFIC_LADDERS
        )
        + " |",
        "|---|---|---|---|---|" + "---|" * len(TRAFFIC_LADDERS),
    ]

    def cell(row: dict[str, Any], ladder: str) -> str:
        if _missing(model, ladder) is not None:
            return "n/a"
        graph = row["graph"][ladder]
        if "cost" not in graph:
            return f"{_f(graph['vllm']['speedup'])}x / n/a"
        return (
            f"{_f(graph['vllm']['speedup'])}x / {_f(graph['cost']['speedup'])}x"
            + _plan_cell(graph["cost"])
        )

    for row in model["batches"]:
        cells = [cell(row, ladder) for ladder in TRAFFIC_LADDERS]
        out.append(
            f"| {row['index']} | {row['images']} | {_budget_tokens_cell(row)} | "
            f"{_ms(row['eager_ms'])} | {_ms(row['ideal_e2e_ms'])} | "
            + " | ".join(cells)
            + " |"
        )
    return out + [""]


def _old_workloads(model: dict[str, Any]) -> list[str]:
    out = [
        "| workload | eager ms | exact graph ms (replay / e2e) | graph ms vllm / cost | "
        "speedup vllm / cost | efficiency vllm / cost | overhead µs vllm / cost |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in model["old_workloads"]:
        v, c = row["graph"]["vllm"], row["graph"]["cost"]
        out.append(
            f"| {row['resolution']}² x {row['images']} | {_ms(row['eager_ms'])} | "
            f"{_ms(row['ideal_ms'])} / {_ms(row['ideal_e2e_ms'])} | "
            f"{_ms(v['graph_ms'])} / {_ms(c['graph_ms'])} | "
            f"{_f(v['speedup'])} / {_f(c['speedup'])} | "
            f"{_f(v['efficiency'])} / {_f(c['efficiency'])} | "
            f"{_f(v['host_overhead_us']['median'], 0)} / {_f(c['host_overhead_us']['median'], 0)} |"
        )
    return out + [""]


def render_traffic_markdown(result: dict[str, Any]) -> str:
    params = result["params"]
    out = _header(result, "Real-traffic encoder benchmark")
    shares = ", ".join(
        f"{s['name']} {100 * s['share']:.0f}%" for s in params["sources"]
    )
    out.append(
        f"At least {params['batches']} batches per model (seed {params['seed']}) of real-world image "
        f"sizes ({shares}; workload {params.get('workload', 'default')}, 1-16 images per batch), resized by each model's "
        "processor rules (`docs/real-traffic.md`). Ladders: **default** (vLLM's doubling), "
        "**fine** (`min · 2^k · {1, 1.25, 1.5, 1.75}`, 64 items), **tuned** "
        f"(`gen-mixin plan --traffic` on {params['train_batches']} other batches). Policies: "
        "**vllm** (the manager's packing) and **cost** (cost-aware execution, calibrated on "
        "warm-up batches spanning the training sizes). Speedup = eager / graph; best = "
        "min(eager, exact-shape graph end to end) per batch; vs best = Σ best / Σ graph; "
        "medians in ms of interleaved rounds; plans as source/kind."
    )
    out.append("")
    out += _traffic_targets(result)
    for stem in result.get("errors", {}):
        out += [f"**{stem} failed**: see the run's log (`errors` in the JSON).", ""]
    for stem, reason in result.get("skipped", {}).items():
        out += [f"**{stem} not measured**: {reason}.", ""]
    for stem, model in result["models"].items():
        out += [f"### {stem}", ""]
        out += [
            "| ladder | graphs | max items | capture s | calibration s | pool MiB | budgets |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in TRAFFIC_LADDERS:
            if name not in model["ladders"]:
                out.append(f"| {name} | {_missing(model, name)} |" + " |" * 5)
                continue
            lad = model["ladders"][name]
            cap = lad["capture"]
            if "not_applicable" in model:
                # What each path captures (not the global list).
                shown = "; ".join(
                    f"{path}: {_budget_list(b)}"
                    for path, b in lad["path_budgets"].items()
                )
            else:
                shown = _budget_list(lad["budgets"])
            out.append(
                f"| {name} | {cap['num_graphs']} | {lad['max_batch_size']} | "
                f"{_f(cap['seconds'], 1)} | "
                f"{'n/a' if lad['calibration_s'] is None else _f(lad['calibration_s'], 1)} | "
                f"{_mib(cap['pool_bytes'])} | {shown} |"
            )
        out.append("")
        out += _traffic_summary(model)
        multi = "not_applicable" in model
        if multi:
            out += [
                f"Encoder paths {', '.join(model['paths'])}: each call times the whole "
                "batch (every path's replays or eager calls, and the merge); the "
                "exact-shape graph is one graph per path. Not measured: "
                + "; ".join(
                    f"**{what}**, {reason}"
                    for what, reason in model["not_applicable"].items()
                )
                + ".",
                "",
            ]
            out += _path_waste(model)
        else:
            t = model["tuned_waste"]
            out += [
                f"Tuned ladder: predicted waste {_pct(t['predicted_train'])} on the "
                f"training sample and {_pct(t['predicted_measured'])} on these batches; "
                f"measured {_pct(t['measured'])}.",
                "",
            ]
        rows = model["batches"]
        patches = sum(r["input_rows"] for r in rows)
        tokens = sum(r["output_tokens"] for r in rows)
        split = sum(1 for r in rows if _replays_per_path(r) > 1)
        out += [
            f"Budget tokens {sum(r['budget_tokens'] for r in rows)}, output tokens {tokens}, "
            f"encoder input rows {patches} over {len(rows)} batches; {split} batches need "
            f"more than one replay{' on a path' if multi else ''} on the default ladder.",
            "",
        ]
        out += _traffic_batches(model)
        if multi:
            out += [
                f"Issue #6 workloads: {model['not_applicable']['old_workloads']}.",
                "",
            ]
        else:
            out += ["Issue #6 workloads (fine ladder):", ""]
            out += _old_workloads(model)
    return "\n".join(out) + "\n"


def _replays_per_path(row: dict[str, Any]) -> int:
    """The most replays one path of the batch took on the default ladder."""
    padding = row["graph"]["default"]["vllm"]["padding"]
    if "paths" in padding:
        return max(p["replays"] for p in padding["paths"].values())
    return padding["replays"]


def render_traffic_plot(result: dict[str, Any], path: Path) -> None:
    """Every batch's speedup (eager / graph) against its eager time, per
    model, ladder and policy (raises ImportError without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(result["models"].items())
    fig, axes = plt.subplots(
        1, max(1, len(models)), figsize=(7 * max(1, len(models)), 6)
    )
    axes = list(axes) if len(models) > 1 else [axes]
    colors = {"default": "tab:red", "fine": "tab:blue", "tuned": "tab:green"}
    for ax, (stem, model) in zip(axes, models):
        rows = sorted(model["batches"], key=lambda r: r["eager_ms"]["median"])
        xs = [r["eager_ms"]["median"] for r in rows]
        for ladder in TRAFFIC_LADDERS:
            for policy, style in (("vllm", ":"), ("cost", "-")):
                if _missing(model, ladder, policy) is not None:
                    continue  # a model of several paths (see the report)
                ys = [r["graph"][ladder][policy]["speedup"] for r in rows]
                ax.plot(
                    xs,
                    ys,
                    linestyle=style,
                    marker="o" if policy == "cost" else ".",
                    color=colors[ladder],
                    label=f"{ladder} / {policy}",
                )
        ax.plot(
            xs,
            [r["best_ms"] and r["eager_ms"]["median"] / r["best_ms"] for r in rows],
            color="black",
            linewidth=1,
            label="best (eager or exact graph)",
        )
        ax.axhline(0.97, color="grey", linewidth=1, linestyle="--")
        ax.text(xs[0] if xs else 1, 0.97, " 0.97x eager", va="bottom", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("eager ms (batches sorted by it)")
        ax.set_ylabel("speedup = eager / graph")
        gaps = [
            name
            for name in (*TRAFFIC_LADDERS, *POLICIES)
            if name in model.get("not_applicable", {})
        ]
        ax.set_title(stem + (f" ({', '.join(gaps)}: n/a, multi-path)" if gaps else ""))
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    env = result["environment"]
    fig.suptitle(
        f"Real-traffic batches, {env.get('device')} ({result['params']['size']}); "
        "dotted: vLLM packing, solid: cost-aware"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="bench_encoders.py JSON")
    parser.add_argument("--markdown", type=Path, help="write markdown here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    args = parser.parse_args(argv)
    result = json.loads(args.results.read_text())
    markdown = render_markdown(result)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown)
    else:
        sys.stdout.write(markdown)
    if args.plot:
        render_plot(result, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
