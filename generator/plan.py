"""``gen-mixin plan``: what a spec will capture, before any GPU is touched.

The budget ladder and batch size are resolved exactly as vLLM 0.33.0's
``EncoderCudaGraphManager.__init__`` resolves them (the tests compare this
pure-Python copy with the runtime's manager); every buffer's shape comes
from the spec's formulas evaluated with the constants' defaults, which
``--set name=value`` overrides. No torch, no eval.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoder_cudagraph_runtime.budget_ladder import path_budgets, resolve_budget_ladder
from generator.command_line import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_STALE,
    ArgumentParser,
    bounded_int,
    echo,
    print_error,
    print_spec_error,
)
from generator.diagnostics import SpecError, printable
from generator.formulas import (
    EvaluationError,
    Ref,
    ValueOutOfRange,
    evaluate,
    names_in,
    to_spec_text,
)
from generator.limits import MAX_INTEGER
from generator.spec.capture import Buffer, CaptureTensor, DtypeFallback, set_by_expr
from generator.spec.enums import Dtype, Modality
from generator.spec.mixin import MixinSpec
from generator.static_checks import (
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    Arithmetic,
    FormulaRefused,
    axis_combos,
    axis_problems,
    capture_problems,
    capture_names,
    capture_scope,
    constant_env,
    dummy_item,
    flat_rows,
    item_values,
    refusal,
    unit_scope,
)

ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "uint8": 1,
}
#: Buffers may hold more dtypes than the manager runs in.
BUFFER_ITEMSIZE = {**ITEMSIZE, "complex64": 8}


class PlanError(ValueError):
    """A configuration the manager would refuse (with the manager's message)."""


def resolve_budgets(
    budget_range: tuple[int, int],
    user_budgets: list[int] | None = None,
    user_max_items: int = 0,
) -> tuple[list[int], int]:
    """(token budgets, max_batch_size) as the manager resolves them: its own
    function, which needs no torch."""
    try:
        return resolve_budget_ladder(
            list(user_budgets or []), user_max_items, lambda: budget_range
        )
    except ValueError as exc:
        raise PlanError(str(exc)) from None


@dataclass
class BufferPlan:
    key: str
    shape: list[int] | None
    dtype: str
    nbytes: int | None
    note: str = ""


@dataclass
class BudgetPlan:
    budget: int
    k: int | None  # None for a unit capture (no dummy items)
    rows: int | None
    dummy: dict[str, list[int]]
    buffers: list[BufferPlan] = field(default_factory=list)
    axis_keys: tuple = ()  # the capture axes' keys of this graph

    def with_axis_keys(self, keys: tuple) -> BudgetPlan:
        self.axis_keys = keys
        return self

    units: int | None = None  # a unit capture's views
    #: A capture of padded inputs: its buffers hold items (dim 0) of the
    #: dummy item's sizes (dim 1), not the dummy batch's rows.
    padded: bool = False

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes or 0 for b in self.buffers)


@dataclass
class PathPlan:
    """One encoder path: its budgets (0: a batch that leaves the path out,
    never captured) and what each captured budget holds."""

    name: str
    budgets: list[int]
    per_budget: list[BudgetPlan]


def _budget_json(p: BudgetPlan) -> dict[str, Any]:
    return {
        "budget": p.budget,
        "k": p.k,
        "rows": p.rows,
        "units": p.units,
        "dummy": p.dummy,
        "axis_keys": list(p.axis_keys),
        "buffers": [b.__dict__ for b in p.buffers],
        "total_bytes": p.total_bytes,
    }


@dataclass
class Plan:
    spec: str
    budget_range: tuple[int, int]
    budgets: list[int]
    max_batch_size: int
    max_frames_per_batch: int
    paths: list[PathPlan]
    problems: list[str]
    unknown: list[str]
    budget_unit: str = "output tokens"

    @property
    def per_budget(self) -> list[BudgetPlan]:
        """The first path's budgets (a spec without paths has one)."""
        return self.paths[0].per_budget

    @property
    def num_graphs(self) -> int:
        return sum(len(p.per_budget) for p in self.paths)

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "budget_range": list(self.budget_range),
            "budgets": self.budgets,
            "max_batch_size": self.max_batch_size,
            "max_frames_per_batch": self.max_frames_per_batch,
            "num_graphs": self.num_graphs,
            "largest_item_output_tokens": self.budgets[-1],
            "per_budget": [_budget_json(p) for p in self.per_budget],
            "paths": [
                {
                    "name": p.name,
                    "budgets": p.budgets,
                    "per_budget": [_budget_json(b) for b in p.per_budget],
                }
                for p in self.paths
            ],
            "problems": self.problems,
            "unknown": self.unknown,
        }


def make_plan(
    spec: MixinSpec,
    *,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    budgets: list[int] | None = None,
    max_items: int = 0,
    max_frames: int | None = None,
    overrides: dict[str, int] | None = None,
    dtype: str = "bfloat16",
) -> Plan:
    env = constant_env(spec, overrides)
    env.update({s.name: s.value for s in spec.sizes})
    env.update(overrides or {})
    missing = sorted(
        c.name
        for c in spec.constants
        if c.name not in env and c.name in _needed_names(spec)
    )
    if missing:
        raise PlanError(
            f"no value for {', '.join(missing)}: give it with --set NAME=VALUE "
            "(or a default in the spec)"
        )
    try:
        lo = evaluate(spec.budget.min, env)
    except EvaluationError as exc:
        raise PlanError(f"budget.min: {exc}") from exc
    hi = largest_budget(spec, env, max_num_batched_tokens, max_model_len)
    ladder, mbs = resolve_budgets((lo, hi), budgets, max_items)
    video = Modality.VIDEO in spec.modalities
    mfpv = 1
    if spec.max_frames_per_video is not None:
        try:
            mfpv = evaluate(spec.max_frames_per_video, env)
        except EvaluationError:
            # A host method (vLLM derives it from the processor and the
            # model length): take the spec's size or --set.
            if "max_frames_per_video" not in env:
                raise PlanError(
                    "max_frames_per_video comes from the host "
                    f"({to_spec_text(spec.max_frames_per_video)}): give it with "
                    "--set max_frames_per_video=N or under sizes"
                ) from None
            mfpv = env["max_frames_per_video"]
    mfpb = max_frames if max_frames is not None else (mbs * mfpv if video else mbs)
    unknown: set[str] = set()
    paths = []
    problems = []
    for path in spec.paths:
        try:
            smallest = (
                evaluate(path.min_token_budget, env)
                if path.min_token_budget is not None
                else None
            )
            budgets = path_budgets(path.name, ladder, smallest, path.allow_zero_tokens)
        except (EvaluationError, ValueError) as exc:
            raise PlanError(f"{path.field}min_token_budget: {exc}") from None
        captured = [b for b in budgets if b != 0]
        combos = axis_combos(spec.capture_axes, env)
        plans = []
        for b in captured:
            for keys, dims in combos:
                axis_env = {**env, **dims}
                refused = _refusal(spec, path, axis_env, b, (mbs, mfpb))
                if refused is not None:
                    problems.append(f"{path.field}{refused}")
                    continue
                plans.append(
                    _budget_plan(
                        spec, path, axis_env, b, (mbs, mfpb), dtype, unknown
                    ).with_axis_keys(keys)
                )
        paths.append(PathPlan(path.name, budgets, plans))
        # Checked at every budget this plan captures and its batch size,
        # besides the samples and the released ladder.
        checked = capture_problems(
            Arithmetic.of(spec, path), env, tuple(captured), (mbs,)
        )
        problems += [f"{path.field}{f}: {m}" for f, m in checked]
    problems += [
        f"{f}: {m}" for f, m in axis_problems(spec.capture_axes, spec.constants, env)
    ]
    return Plan(
        str(spec.spec_path),
        (lo, hi),
        ladder,
        mbs,
        mfpb,
        paths,
        problems,
        sorted(unknown),
        (
            "output tokens"
            if spec.items.budget_tokens is None and not spec.has_paths
            else "budget tokens"
        ),
    )


def largest_budget(
    spec: MixinSpec,
    env: dict[str, int],
    max_num_batched_tokens: int,
    max_model_len: int,
) -> int:
    """The largest budget of the mixin's range, as its generated
    ``get_encoder_cudagraph_budget_range`` returns it: ``budget.max`` (in
    the budgets' unit, e.g. DeepSeek-V4.1's ``r*r*min(...)`` patches) or
    vLLM's ``min(max_num_batched_tokens, max_model_len)``."""
    step = {
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
    }
    if spec.budget.max is None:
        return min(step.values())
    try:
        return evaluate(spec.budget.max, {**env, **step})
    except EvaluationError as exc:
        raise PlanError(f"budget.max: {exc}") from exc


def _refusal(spec, path, env, budget, limits) -> str | None:
    """Why ``path``'s capture refuses ``budget`` (a ``capture.assert`` that
    does not hold), or None."""
    if path.capture.of_units:
        return None
    mbs, mfpb = limits
    arithmetic = Arithmetic.of(spec, path)
    check = refusal(arithmetic, capture_names(arithmetic, env, budget, mbs, mfpb))
    if check is None:
        return None
    return (
        f"capture.assert: budget {budget} (max_batch_size {mbs}) is refused: "
        f"{check.message} ({check.check.spec_text()} does not hold)"
    )


def _budget_plan(spec, path, env, budget, limits, dtype, unknown) -> BudgetPlan:
    """What ``path``'s graph of ``budget`` captures (``env``: with the dims of
    its capture-axis keys; ``limits``: max_batch_size, max_frames_per_batch)."""
    if path.capture.of_units:
        return _unit_budget_plan(path, env, budget, limits, dtype, unknown)
    mbs, mfpb = limits
    arithmetic = Arithmetic.of(spec, path)
    dims = dummy_item(arithmetic, env, budget, mbs, mfpb)
    values = item_values(arithmetic, env, dims)
    rows = mbs * values["input_size"]
    scope = capture_scope(arithmetic, env, budget, mbs, mfpb, rows)
    plan = BudgetPlan(
        budget,
        scope["k"],
        rows,
        {item.key: [dims[d] for d in item.dims] for item, _ in path.capture.dummy},
        padded=any(getattr(t.flat, "is_padded", False) for t in path.capture.tensors),
    )
    for buf in path.buffers:
        own = scope
        if isinstance(buf.source, CaptureTensor) and buf.source.flat.own_rows:
            # In its capture shape, rows is the input's own rows.
            rows_own = mbs * flat_rows(buf.source.flat, env, dims)
            own = capture_scope(arithmetic, env, budget, mbs, mfpb, rows_own)
        plan.buffers.append(_buffer_plan(buf, own, dtype, unknown))
    return plan


def _unit_budget_plan(path, env, budget, limits, dtype, unknown) -> BudgetPlan:
    """A unit capture's buffers for one budget: every shape over ``units``."""
    mbs, mfpb = limits
    scope = unit_scope(env, budget, mbs, mfpb)
    units = evaluate(path.capture.units, scope)
    scope["units"] = units
    plan = BudgetPlan(budget, None, None, {}, units=units)
    for buf in path.buffers:
        plan.buffers.append(_buffer_plan(buf, scope, dtype, unknown))
    return plan


def _needed_names(spec: MixinSpec) -> set[str]:
    needed: set[str] = (
        set(names_in(spec.budget.min))
        | names_in(spec.items.input_size)
        | names_in(spec.items.output_tokens)
    )
    for path in spec.paths:
        capture = path.capture
        for _, exprs in capture.dummy:
            for e in exprs:
                needed |= names_in(e)
        for let in capture.lets:
            needed |= names_in(let.expr)
        for check in capture.asserts:
            needed |= check.check.names()
        if capture.units is not None:
            needed |= names_in(capture.units)
        if path.min_token_budget is not None:
            needed |= names_in(path.min_token_budget)
    return needed


def _dtype_text(dtype) -> str:
    """A capture tensor's dtype as the spec writes it."""
    if isinstance(dtype, DtypeFallback):
        return " or ".join([*(to_spec_text(p) for p in dtype.options), "dtype"])
    return to_spec_text(dtype)


def _buffer_plan(
    buf: Buffer, scope: dict[str, int], dtype: str, unknown: set[str]
) -> BufferPlan:
    tensor = buf.source if isinstance(buf.source, CaptureTensor) else None
    if buf.host_scalar:
        value = None
        expr = set_by_expr(buf)
        if expr is not None:
            try:
                value = evaluate(expr, scope)
            except EvaluationError:
                value = None
        note = f"host int32 = {value}" if value is not None else "host int32"
        return BufferPlan(buf.key, [], "int32 (cpu)", 0, note)
    if buf.pad is not None and buf.slots is not None:
        slots = evaluate(buf.slots, scope)
        return BufferPlan(buf.key, [slots], "int32", slots * 4, buf.pad.value)
    if tensor is not None:
        shape_exprs = tensor.shape
        if isinstance(tensor.dtype, Dtype):
            type_name = tensor.dtype.value
        elif isinstance(tensor.dtype, Ref):
            type_name = dtype
        else:
            type_name = f"{dtype} ({_dtype_text(tensor.dtype)})"
        item = ITEMSIZE[type_name.split(" ")[0]]
    elif buf.shape is not None:
        shape_exprs = buf.shape
        declared = buf.dtype.value if buf.dtype is not None else "dtype"
        type_name = dtype if declared == "dtype" else declared
        item = BUFFER_ITEMSIZE[dtype if declared == "dtype" else declared]
    else:
        unknown.add(buf.key)
        return BufferPlan(
            buf.key,
            None,
            buf.dtype.value if buf.dtype is not None else "?",
            None,
            "shape not declared in the spec",
        )
    shape = []
    for e in shape_exprs:
        try:
            shape.append(evaluate(e, scope))
        except EvaluationError as exc:
            unknown.add(buf.key)
            note = (
                "shape out of range (beyond int64)"
                if isinstance(exc, ValueOutOfRange)
                else "shape needs a host value (--set)"
            )
            return BufferPlan(buf.key, None, type_name, None, note)
    nbytes = item
    for s in shape:
        nbytes *= s
    return BufferPlan(buf.key, shape, type_name, nbytes)


def _human(n: int) -> str:
    """``n`` bytes in B, KiB, MiB or GiB with one decimal, rounded half to
    even as ``format`` rounds; in integers, as a plan's byte counts can
    exceed what a float holds."""
    if n < 1024:
        return f"{n} B"
    shift, unit = next(
        ((s, u) for s, u in ((10, "KiB"), (20, "MiB")) if n < 1 << (s + 10)),
        (30, "GiB"),
    )
    tenths, rest = divmod(n * 10, 1 << shift)
    if 2 * rest > 1 << shift or (2 * rest == 1 << shift and tenths % 2):
        tenths += 1
    return f"{tenths // 10}.{tenths % 10} {unit}"


def format_plan(plan: Plan) -> str:
    lines = [
        f"spec: {plan.spec}",
        f"budget range (min, max): {plan.budget_range}",
        f"token budgets: {plan.budgets}",
        f"max_batch_size: {plan.max_batch_size}   max_frames_per_batch: {plan.max_frames_per_batch}",
        f"graphs: {plan.num_graphs}",
        f"largest item a graph takes: {plan.budgets[-1]} {plan.budget_unit} "
        "(larger items, and batches above every budget, run eagerly)",
    ]
    grand = 0
    several = len(plan.paths) > 1 or plan.paths[0].name != "default"
    budgets = [(path, p) for path in plan.paths for p in path.per_budget]
    for path, p in budgets:
        if several and p is path.per_budget[0]:
            lines.append("")
            lines.append(f"path {path.name}: budgets {path.budgets}")
        dummy = ", ".join(f"{k}={v}" for k, v in p.dummy.items())
        keys = f", axis keys {p.axis_keys}" if p.axis_keys else ""
        lines.append("")
        if p.units is not None:
            lines.append(f"budget {p.budget}{keys}: units={p.units}")
        elif p.padded:
            lines.append(f"budget {p.budget}{keys}: rows of the dummy item {dummy}")
        else:
            lines.append(
                f"budget {p.budget}{keys}: k={p.k}, rows={p.rows}, dummy item {dummy} x {plan.max_batch_size}"
            )
        width = max([16, *(len(b.key) for b in p.buffers)])
        for b in p.buffers:
            shape = (
                "?"
                if b.shape is None
                else "(" + ", ".join(str(s) for s in b.shape) + ")"
            )
            size = "?" if b.nbytes is None else _human(b.nbytes)
            note = f"  [{b.note}]" if b.note else ""
            lines.append(
                f"  {b.key:<{width}} {shape:<22} {b.dtype:<28} {size:>10}{note}"
            )
        total = _human(p.total_bytes)
        lines.append(f"  {'total':<{width}} {'':<22} {'':<28} {total:>10}")
        grand += p.total_bytes
    lines.append("")
    lines.append(f"all graphs' input buffers: {_human(grand)}")
    if plan.unknown:
        lines.append(f"not counted (shape unknown): {', '.join(plan.unknown)}")
    if plan.problems:
        lines.append("")
        lines.extend(f"problem: {p}" for p in plan.problems)
    return "\n".join(lines)


def settable_names(spec: MixinSpec) -> list[str]:
    """What ``--set`` may override: the constants, the sizes, and the
    maximum frames per video where the spec takes it from the host."""
    names = [c.name for c in spec.constants] + [s.name for s in spec.sizes]
    if spec.max_frames_per_video is not None:
        names.append("max_frames_per_video")
    return sorted(set(names))


def _parse_set(values: list[str], known: list[str]) -> dict[str, int]:
    parse_value = bounded_int(-MAX_INTEGER)
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise PlanError(f"--set takes NAME=INTEGER, got {echo(item)}")
        if name not in known:
            shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
            raise PlanError(
                f"--set {echo(name)}: the spec has no constant or size of that "
                f"name (known: {shown or 'none'})"
            )
        try:
            out[name] = parse_value(value)
        except argparse.ArgumentTypeError as exc:
            raise PlanError(f"--set {name}: {exc}") from None
    return out


def _traffic(spec: MixinSpec, plan: Plan, args, overrides: dict[str, int]) -> int:
    """``--traffic``: the ladder tuned to a sample of traffic."""
    from generator.ladder_tuner import traffic_main

    if len(spec.paths) > 1:
        # The tuner packs every item's budget tokens on one ladder; a path
        # with min_token_budget captures vLLM's doubling from it whatever
        # the budgets, so a tuned ladder would not be what gets captured.
        raise PlanError(
            "--traffic: the ladder tuner handles one encoder path; this spec "
            f"has {len(spec.paths)} ({', '.join(p.name for p in spec.paths)})"
        )

    def sized_plan(budgets: list[int], max_items: int) -> Plan:
        return make_plan(
            spec,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            budgets=budgets,
            max_items=max_items,
            overrides=overrides,
            dtype=args.dtype,
        )

    return traffic_main(spec, plan, args, overrides, sized_plan)


def plan_main(argv: list[str]) -> int:
    from generator.resolve import load_spec

    p = ArgumentParser(
        prog="gen-mixin plan", description="Show what a spec will capture."
    )
    p.add_argument("spec", type=Path)
    p.add_argument(
        "--max-num-batched-tokens",
        type=bounded_int(1),
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
    )
    p.add_argument(
        "--max-model-len", type=bounded_int(1), default=DEFAULT_MAX_MODEL_LEN
    )
    p.add_argument(
        "--budgets",
        type=bounded_int(1),
        nargs="+",
        help="encoder_cudagraph_token_budgets",
    )
    p.add_argument(
        "--max-items",
        type=bounded_int(0),
        default=0,
        help="encoder_cudagraph_max_vision_items_per_batch",
    )
    p.add_argument(
        "--max-frames",
        type=bounded_int(1),
        default=None,
        help="encoder_cudagraph_max_frames_per_batch",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a constant or size (repeatable)",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(ITEMSIZE),
        default="bfloat16",
        help="the manager's dtype (default bfloat16)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--traffic",
        type=Path,
        metavar="FILE",
        help="recommend budgets for this traffic (docs/real-traffic.md)",
    )
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec, display_path=printable(str(args.spec)))
    except SpecError as err:
        print_spec_error(err)
        return EXIT_INVALID
    try:
        overrides = _parse_set(args.set, settable_names(spec))
        plan = make_plan(
            spec,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            budgets=args.budgets,
            max_items=args.max_items,
            max_frames=args.max_frames,
            overrides=overrides,
            dtype=args.dtype,
        )
        if args.traffic is not None:
            return _traffic(spec, plan, args, overrides)
    except (PlanError, EvaluationError, FormulaRefused) as exc:
        print_error(f"{args.spec}: {exc}")
        return EXIT_INVALID
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print(format_plan(plan))
    return EXIT_STALE if plan.problems else EXIT_OK
