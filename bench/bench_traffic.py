"""Real-traffic encoder benchmark (issue #17).

Batches of real-world image sizes (``bench/image_traffic.py``: camera
photos, phone and desktop screenshots, scanned pages, web images and
thumbnails, 1-16 per batch, mostly 1-4), each image resized by the model's
own processor rules, run through the generated mixin on its reference host:

``eager_ms``, ``ideal_ms``
    As in ``bench/bench_encoders.py``: vLLM without graphs (item specs,
    ``encoder_eager_forward``, postprocess), and the replay alone of a graph
    captured at the batch's exact shape.
``ideal_e2e_ms``
    That exact-shape graph run the way an execute runs it: item specs,
    ``prepare_encoder_cudagraph_replay_buffers``, one multi-tensor copy into
    the graph's buffers, replay, postprocess with clones. What a manager
    with a graph for every shape would take; ``best_ms`` = min(eager,
    ideal_e2e) is the per-batch bound the targets compare with.
``graph``
    ``manager.execute`` per ladder and policy. Ladders: ``default`` (vLLM's
    doubling), ``fine`` (``min · 2^k · {1, 1.25, 1.5, 1.75}``, 64 items),
    ``tuned`` (``gen-mixin plan --traffic`` on a separate training sample of
    the same distribution). Policies: ``vllm`` (the manager's default
    packing) and ``cost`` (cost-aware execution, calibrated on warm-up
    batches built from the training sample to span its sizes: single items
    from the smallest to the largest, and batches of 2-8). Speedup = eager
    / graph, efficiency = ideal / graph, ``vs_best`` = best / graph; padding
    waste = rows replayed / rows used − 1 (budget tokens). Per entry the
    cost model's predictions are recorded next to the measurement: the
    plan cost-aware execution chose (its source, units and predicted ms),
    and the predicted ms of vLLM's packing and of all-eager.

``eager_again_ms``, ``aa_ratio``
    The eager call a second time in the same rounds, an A/A control:
    ``aa_ratio`` = eager / eager again (medians) is how far the same code
    moves from itself. Eager forwards launch 1,000-2,500 kernels; their host
    time is half of a large image's device time and all of a small one's, so
    a busy or slow host makes them bimodal while a graph replay does not
    move (run E, ``bench/profile_eager_host.py``). The target's worst batch
    is reported with the model's A/A floor (the lowest ``min(r, 1/r)`` of
    its batches): a cost-aware eager plan runs the eager call's own code.

Every call of a batch (eager twice, the exact-shape graph end to end, and
the six ladder / policy executes) is timed in interleaved rounds, one call
of each per round: the host's speed drifts over seconds on the machines these runs
get, and a ratio of two calls timed seconds apart measures that drift.
``--quiet-host`` also times a call again while the host runs slow
(:class:`HostGauge`; off by default, run H).
Batches are measured in order until the model's share of ``--soft-limit-s``
is spent, at least ``--batches`` of them (the first ones of the same seeded
draw, so runs compare batch by batch), none after ``--hard-limit-s``.
``tuned_waste``
    The tuner's predicted waste of its ladder (on the training sample and on
    the measured batches) against the waste the manager measured.
``old_workloads``
    Issue #6's uniform workloads that its targets gate (a subset), fine
    ladder, both policies: cost-aware execution must keep those targets.

Several encoder paths (Step3-VL's ``global`` views and ``local`` crops)
    Every call times the whole batch: eager runs each path the batch has
    rows on, the exact-shape graph is one graph per such path, the manager
    replays each path's budget. Measured: the default and fine ladders with
    vLLM's packing, and the padding per path (``padding.paths``, in budget
    rows and in the rows of the path's first input buffer: views). Recorded
    as not applicable (``not_applicable``, :data:`MULTI_PATH_NOT_APPLICABLE`),
    not measured: the tuned ladder, the cost-aware policy, issue #6's
    workloads; no target is evaluated on such a model.

Targets (issue #17, seed models, cost-aware policy): no batch slower than
0.97x eager (every ladder), and the same over the batches whose plan
replays a graph (an all-eager plan runs the eager forward itself: its ratio
is the host's noise on that call plus what the manager adds around it; the
first target reports that part as ``eager_plan_bound``, :func:`eager_plan_bound`,
at least 0.99 in run H); Σ best / Σ graph >= 0.95 (tuned ladder; the
others reported); the tuned ladder's measured waste within 3 points of the
prediction; issue #6's speedup and efficiency targets on the old workloads.

    PYTHONPATH=. python bench/bench_traffic.py --out traffic.json \\
        [--markdown traffic.md] [--plot traffic.png]
    PYTHONPATH=. python bench/bench_traffic.py --device cpu --size tiny --quick \\
        --out /tmp/traffic.json          # CPU smoke (eager-replay backend)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import image_traffic  # noqa: E402
from bench_encoders import (  # noqa: E402
    FINE_MAX_ITEMS,
    REPO_ROOT,
    SPECS_DIR,
    TARGET_MODELS,
    IdealGraph,
    Schedule,
    build_vllm_config,
    capture_ideal,
    eager_call,
    environment,
    fine_ladder,
    images_only_host,
    max_rel_diff,
    measure,
    padding_summary,
    pixels_to_item,
    ratio,
    summarize,
    unusable_reason,
    write_json,
)
from crossover import tuning_crossover  # noqa: E402
from image_traffic import spec_dims, traffic_document  # noqa: E402,F401
from profile_launch import host_probe_us  # noqa: E402

from encoder_cudagraph_runtime.cost_aware import (  # noqa: E402
    crossover_rows,
    plan_execution,
    replay_cost_rows,
)
from encoder_cudagraph_runtime.graph_backends import (  # noqa: E402
    CudaGraphBackend,
    EagerReplayGraphBackend,
    GraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from generator.formulas import HostPath  # noqa: E402
from generator.resolve import load_spec  # noqa: E402
from reference_towers.registry import REFERENCE_TOWERS  # noqa: E402

SCHEMA_VERSION = 2
#: The models of ``run_gpu.sh traffic-new``: the reference towers beyond the
#: seed models whose processors' resize rules ``image_traffic`` has.
#: Qwen2.5-VL last: its batches are the slowest (a 12 MP photo is 62,208
#: patches at its checkpoint's ``max_pixels``), so the time limits cut its
#: batches, not the others'.
NEW_MODELS = ("internvl", "kimi_vl", "step3_vl", "qwen2_5_vl")
#: The models of ``run_gpu.sh traffic-beyond``: the reference towers of models
#: vLLM 0.33.0 runs eagerly (issue #26), checked against vLLM's eager code.
BEYOND_MODELS = ("pixtral", "mistral3")
#: ``--models`` aliases.
MODEL_GROUPS = {"new": NEW_MODELS, "beyond": BEYOND_MODELS}
LADDERS = ("default", "fine", "tuned")
POLICIES = ("vllm", "cost")
DEFAULT_MAX_TOKENS = {"full": 16384, "tiny": 512}
BATCHES = {"full": 24, "quick": 2}
MAX_BATCHES = {"full": 64, "quick": 2}
TRAIN_BATCHES = 400
#: What the benchmark cannot measure on a model of several encoder paths
#: (Step3-VL's ``global`` and ``local``), and why: recorded in the JSON and
#: the report instead of a figure.
MULTI_PATH_NOT_APPLICABLE = {
    "tuned": "n/a (multi-path): `gen-mixin plan --traffic` tunes one ladder of "
    "the items' output tokens, while each path that sets min_token_budget "
    "gets vLLM's doubling from its minimum whatever the budgets (only the "
    "largest budget and the items per batch carry over)",
    "cost": "n/a (multi-path): cost-aware execution plans one 'default' path "
    "(the manager refuses several paths)",
    "old_workloads": "n/a (multi-path): issue #6's workloads compare the two "
    "policies on single-path seed models",
}
# Rows quantiles of the training items timed alone at calibration, and the
# warm-up batches of several items (quantile, count).
CALIBRATION_SINGLES = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
# A large item with a small one tells an encoder that runs item by item
# (each item bound on its own) from one batched forward; twelve large ones
# reach the totals of the largest batches.
CALIBRATION_GROUPS = (
    ((0.1, 4),),
    ((0.0, 8),),
    ((0.5, 1), (0.9, 1)),
    ((0.7, 3),),
    ((1.0, 1), (0.1, 1)),
    ((0.9, 12),),
)
QUICK_CALIBRATION_SINGLES = (0.0, 1.0)
QUICK_CALIBRATION_GROUPS = (((0.5, 2),),)
# Consecutive singles further apart than this factor in rows get the
# training item nearest their geometric mean timed alone too
# (:func:`gap_singles`).
CALIBRATION_GAP = 2.0
# A batch whose round of calls takes longer is timed in 2 rounds.
SLOW_ROUND_S = 1.5
# The tuned ladder's cap on captured buffers (the H200 has 141 GiB; the
# tuner's default, twice the default ladder's, cannot hold a top budget 4x
# the default's).
TUNED_CAPTURE_MIB = 8192
# Issue #6's uniform workloads its targets gate: <= 4 images of <= 448²
# (speedup), and efficiency everywhere; 896² x 8 for the overhead.
OLD_WORKLOADS = ((224, 1), (224, 4), (448, 4), (448, 8), (896, 1), (896, 8))
QUICK_OLD_WORKLOADS = ((224, 4),)

TARGETS: tuple[dict[str, Any], ...] = (
    {
        "name": "no_batch_slower_than_eager",
        "description": "every real-traffic batch >= 0.97x eager (cost-aware)",
        "threshold": 0.97,
        "gating_ladders": ["default", "fine", "tuned"],
    },
    {
        # The same check on the batches whose plan replays a graph, where
        # the planner's choice is what is measured: an all-eager plan runs
        # the eager forward itself (the first target still reports it).
        "name": "no_graph_plan_slower_than_eager",
        "description": "every batch whose cost-aware plan replays a graph "
        ">= 0.97x eager",
        "threshold": 0.97,
        "gating_ladders": ["default", "fine", "tuned"],
    },
    {
        "name": "aggregate_vs_best",
        "description": "Σ best(eager, exact-shape graph) / Σ graph >= 0.95 "
        "(cost-aware, tuned ladder)",
        "threshold": 0.95,
        # A plan cannot pad less than its ladder: on the default and fine
        # ladders this is reported, not gated.
        "gating_ladders": ["tuned"],
        "info_ladders": ["default", "fine"],
    },
    {
        "name": "tuned_waste_prediction",
        "description": "tuned ladder: measured padding waste within 3 points "
        "of the tuner's prediction",
        "threshold": 0.03,
        "gating_ladders": ["tuned"],
    },
    {
        "name": "issue6_speedup_small_batches",
        "description": "issue #6: speedup >= 2x, <= 4 images of <= 448² "
        "(cost-aware, fine ladder)",
        "threshold": 2.0,
        "gating_ladders": ["fine"],
    },
    {
        "name": "issue6_efficiency_uniform",
        "description": "issue #6: efficiency >= 0.85 on its uniform "
        "workloads (cost-aware, fine ladder)",
        "threshold": 0.85,
        "gating_ladders": ["fine"],
    },
)


# ---------------------------------------------------------------------------
# Items, traffic files and the tuner
# ---------------------------------------------------------------------------


def startup_seconds(ladders: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per ladder, what a deployment waits for before serving: capture and
    calibration seconds (issue #27: calibration at most 15 s a ladder),
    with the graphs captured and the calibration's timed-call seconds."""
    out = {}
    for name, ladder in ladders.items():
        report = ladder.get("calibration_report") or {}
        device_ms = report.get("device_ms")
        out[name] = {
            "graphs": ladder["capture"]["num_graphs"],
            "capture_s": ladder["capture"]["seconds"],
            "calibration_s": ladder["calibration_s"],
            "calibration_calls_s": None if device_ms is None else device_ms / 1e3,
        }
    return out


def host_constants(stem: str, host: Any) -> dict[str, int]:
    """The spec's constants whose value on ``host`` differs from the spec's
    default: those read from a plain attribute path (their ``fallback`` when
    missing or falsy). ``gen-mixin plan`` evaluates the spec's formulas with
    the defaults; a user planning for another checkpoint passes these with
    ``--set`` (Pixtral's spec defaults are Pixtral-12B's 16-px patches
    without a merger; the reference tower is Mistral-Small-3.1's 14-px
    patches merged 2 x 2)."""
    out = {}
    for constant in load_spec(SPECS_DIR / f"{stem}.yaml").constants:
        path = constant.path
        if not isinstance(path, HostPath) or constant.processor_kwarg:
            continue
        value = host
        for part in path.parts:
            value = getattr(value, part, None) if isinstance(part, str) else None
        if not value and constant.fallback is not None:
            value = constant.fallback
        if type(value) is int and value != constant.default:
            out[constant.name] = value
    return out


def run_tuner(
    stem: str,
    document: dict[str, Any],
    max_tokens: int,
    *extra: str,
    constants: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``gen-mixin plan specs/<stem>.yaml --traffic FILE --json [--set
    NAME=VALUE ...] [extra]``, as a user runs it (the spec's formulas count
    the budget tokens, with the host's ``constants``)."""
    sets = [
        arg
        for name, value in sorted((constants or {}).items())
        for arg in ("--set", f"{name}={value}")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traffic.json"
        path.write_text(json.dumps(document))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "generator.cli",
                "plan",
                str(REPO_ROOT / "specs" / f"{stem}.yaml"),
                "--max-num-batched-tokens",
                str(max_tokens),
                "--max-model-len",
                str(max_tokens),
                "--traffic",
                str(path),
                "--json",
                *sets,
                *extra,
            ],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            check=False,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"gen-mixin plan --traffic failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def predicted_waste(
    stem: str,
    document: dict[str, Any],
    ladder: dict[str, Any],
    max_tokens: int,
    constants: dict[str, int] | None = None,
) -> float:
    """The tuner's expected waste of ``ladder`` on the batches of
    ``document``: its report on them with that ladder as the current one."""
    report = run_tuner(
        stem,
        document,
        max_tokens,
        "--budgets",
        *map(str, ladder["budgets"]),
        "--max-items",
        str(ladder["max_batch_size"]),
        constants=constants,
    )
    return report["current"]["waste"]


# ---------------------------------------------------------------------------
# The exact-shape graph, end to end
# ---------------------------------------------------------------------------


def ideal_e2e_call(
    host: Any, ideals: dict[str, IdealGraph], mm_kwargs: dict[str, Any]
) -> list[Any]:
    """An execute with a graph of this exact shape per path (see
    ``ideal_e2e_ms``; ``ideals``: the paths the batch has rows on)."""
    specs = host.get_encoder_cudagraph_item_specs(mm_kwargs)
    per_item = [spec.output_tokens for spec in specs]
    dst, src = [], []
    for path, ideal in ideals.items():
        values = host.prepare_encoder_cudagraph_replay_buffers(
            mm_kwargs, len(specs), 0, path
        ).values
        for key, buf in ideal.inputs.items():
            value = values.get(key)
            # Host scalars (max_seqlen) stay as captured.
            if (
                isinstance(buf, torch.Tensor)
                and isinstance(value, torch.Tensor)
                and value.ndim
            ):
                dst.append(buf)
                src.append(value)
    if dst:
        torch._foreach_copy_(dst, src)
    for ideal in ideals.values():
        ideal.graph.replay()
    dest: list[Any] = [None] * len(specs)
    host.postprocess_encoder_output(
        {path: ideal.output for path, ideal in ideals.items()},
        list(range(len(specs))),
        per_item,
        dest,
        clone=True,
        batch_mm_kwargs=mm_kwargs,
    )
    return dest


def replay_all(ideals: dict[str, IdealGraph]) -> None:
    """The exact-shape graphs' replays alone (``ideal_ms``)."""
    for ideal in ideals.values():
        ideal.graph.replay()


def path_input_rows(host: Any, mm_kwargs: dict[str, Any], path: str) -> int:
    """Rows of the batch's first row buffer on ``path`` (as
    ``graph_input_rows`` counts a graph's: patches, or views for encoders
    of fixed-size views), 0 when the batch leaves the path out."""
    specs = host.get_encoder_cudagraph_item_specs(mm_kwargs)
    if not any(spec.get_path_output_tokens(path) for spec in specs):
        return 0
    values = host.prepare_encoder_cudagraph_replay_buffers(
        mm_kwargs, len(specs), 0, path
    ).values
    for key in host.get_encoder_cudagraph_config().buffer_keys:
        value = values.get(key)
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
    return 0


# ---------------------------------------------------------------------------
# One model
# ---------------------------------------------------------------------------


def calibration_batches(
    train: list[list[tuple[int, ...]]], quick: bool
) -> list[list[tuple[int, ...]]]:
    """Warm-up batches spanning the training items' sizes (grid products,
    which order the seed models' rows): each quantile of
    :data:`CALIBRATION_SINGLES` alone, the items that close the gaps between
    them (:func:`gap_singles`), then :data:`CALIBRATION_GROUPS`. The
    manager times each batch whole and each of its items alone."""
    items = sorted({item for batch in train for item in batch}, key=math.prod)

    def at(q: float) -> tuple[int, ...]:
        return items[round(q * (len(items) - 1))]

    if quick:
        singles = [at(q) for q in QUICK_CALIBRATION_SINGLES]
        groups = QUICK_CALIBRATION_GROUPS
    else:
        singles = gap_singles(items, [at(q) for q in CALIBRATION_SINGLES])
        groups = CALIBRATION_GROUPS
    batches = [[item] for item in singles]
    batches += [[at(q) for q, n in group for _ in range(n)] for group in groups]
    return batches


def gap_singles(
    items: list[tuple[int, ...]], singles: list[tuple[int, ...]]
) -> list[tuple[int, ...]]:
    """``singles`` (ascending) and, between each two of them more than
    :data:`CALIBRATION_GAP` apart in rows, the item of ``items`` nearest
    their geometric mean (one per gap: each costs calibration time).

    Quantiles of a traffic with two modes leave its middle untimed: run J's
    DeepSeek-V4.1 training sample timed 1,521-3,337 and 8,400-8,748 patches
    alone, nothing between, so the eager fit's device terms came from one
    size and priced a 3,825-patch photo beside an 8,580-patch scan 4-7%
    under its fastest time."""
    out = list(singles)
    for low, high in itertools.pairwise(singles):
        low_rows, high_rows = math.prod(low), math.prod(high)
        inside = [i for i in items if low_rows < math.prod(i) < high_rows]
        if inside and high_rows > CALIBRATION_GAP * low_rows:
            middle = math.sqrt(low_rows * high_rows)
            out.append(min(inside, key=lambda i: abs(math.prod(i) - middle)))
    return sorted(out, key=math.prod)


# A call is timed again when the host probe right before or after it took
# more than this many times the host's quiet probe (at most MAX_RETAKES
# times; the last take is kept either way and counted as noisy).
QUIET_FACTOR = 1.3
MAX_RETAKES = 3
_GAUGE_WINDOW = 256  # the probes the quiet level is taken from


class HostGauge:
    """How fast the host's thread runs now, against its quiet speed.

    The GPU machine's host slows by 1.5-2x in episodes of a second or more
    (GPU run H, ``bench/diagnose_host_noise.py``: the pure-Python probe 480
    µs, then 850-1,050 µs for up to 15 calls in a row, alike with one intra-op
    thread and with the main thread pinned; nothing of the process's own
    causes it). A host-bound eager call slows with it (MiniMax M3, one
    540-token photo: 19 ms, then 28-36 ms); a graph replay does not. The
    quiet level is the lower quartile of the latest probes, so a run that
    starts in a slow episode still learns the quiet speed when it comes.
    """

    def __init__(self, probe: Callable[[], float], warmup: int = 16) -> None:
        self._probe = probe
        self.probes: list[float] = []
        for _ in range(warmup):
            self.probe()

    def probe(self) -> float:
        value = self._probe()
        self.probes.append(value)
        return value

    def quiet_us(self) -> float:
        recent = sorted(self.probes[-_GAUGE_WINDOW:])
        return recent[len(recent) // 4]

    def is_quiet(self, *probes: float) -> bool:
        limit = QUIET_FACTOR * self.quiet_us()
        return all(p <= limit for p in probes)


@dataclasses.dataclass(frozen=True)
class Rounds:
    """What :func:`measure_rounds` timed."""

    samples: dict[str, list[float]]
    """Milliseconds per call, in round order (with a gauge: the kept takes)."""
    host_probe_us: list[float]
    """The host's speed at the start of each round (``host_probe_us`` of
    ``bench/profile_launch.py``: a fixed pure-Python workload)."""
    first_takes: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """Per call and round, the first take: what a run without the gauge
    would have timed (empty without a gauge)."""
    retakes: dict[str, int] = dataclasses.field(default_factory=dict)
    """Per call, how many takes were timed again (slow host around them)."""
    noisy: dict[str, int] = dataclasses.field(default_factory=dict)
    """Per call, the kept takes whose host probe was still slow after
    :data:`MAX_RETAKES` retakes."""
    quiet_probe_us: float | None = None
    """The gauge's quiet level at the end of the rounds."""


def round_order(names: list[str], round_index: int) -> list[str]:
    """The calls of round ``round_index``: ``names`` in an order shuffled by
    the round (seeded, so runs repeat), so that no call keeps the same
    neighbour. The host of these runs comes in speed modes seconds long
    (GPU run B, 2026-12-01: the launch profile's probe 0.5 or 1.1 ms), and a
    call can inherit the state its predecessor left (a device-bound call
    takes the next call's host time into its own). A rotation was not
    enough: it moves every call by one place, so each call kept its
    predecessor in every round but one (GPU run D: the cost-aware eager
    plans, the very code of the eager baseline, measured 1-3 % slower, always
    right after a large replay of the same ladder)."""
    order = list(names)
    random.Random(round_index).shuffle(order)
    return order


def paired_ratio(numerators: list[float], denominators: list[float]) -> float | None:
    """Median over rounds of ``numerator / denominator`` of the same round
    (a speedup of calls timed side by side, in the same host mode)."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True) if d > 0]
    return statistics.median(ratios) if ratios else None


def measure_rounds(
    calls: dict[str, Callable[[], object]],
    sync: Callable[[], None],
    schedule: Schedule,
    before: dict[str, Callable[[], None]] | None = None,
    after: dict[str, Callable[[], None]] | None = None,
    gauge: HostGauge | None = None,
) -> Rounds:
    """Time each of ``calls`` in interleaved rounds (one call of each per
    round, in :func:`round_order`, device synchronised around each),
    ``schedule.min_iters`` to ``max_iters`` rounds, stopping once
    ``target_s`` is spent (after 2 rounds when a round takes more than
    :data:`SLOW_ROUND_S`: large batches vary little). ``before`` / ``after``
    hooks run outside the timing (``after`` once, after the kept take).

    With a ``gauge``, each call is bracketed by host probes and timed again
    while the host is slow (:class:`HostGauge`): the figures then compare
    the calls on a quiet host. Only host-bound calls (eager) slow with the
    host, so the retakes can make eager faster but no graph's ratio better.
    The collector is off meanwhile (its pauses are not the code's)."""
    before, after = before or {}, after or {}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    first_takes: dict[str, list[float]] = {name: [] for name in calls}
    retakes: dict[str, int] = {name: 0 for name in calls}
    noisy: dict[str, int] = {name: 0 for name in calls}
    probes: list[float] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        rounds = 0
        while rounds < schedule.max_iters:
            probes.append(gauge.probe() if gauge else host_probe_us(3))
            for name in round_order(list(calls), rounds):
                for take in range(MAX_RETAKES + 1 if gauge else 1):
                    ms, quiet = _timed_take(calls[name], sync, before.get(name), gauge)
                    if not take:
                        first_takes[name].append(ms)
                    if quiet or take == MAX_RETAKES:
                        break
                    retakes[name] += 1
                samples[name].append(ms)
                noisy[name] += not quiet
                if name in after:
                    after[name]()
            rounds += 1
            spent = time.perf_counter() - start
            needed = schedule.min_iters
            if spent / rounds > SLOW_ROUND_S:
                needed = min(2, needed)
            if rounds >= needed and spent >= schedule.target_s:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    if gauge is None:
        return Rounds(samples, probes)
    return Rounds(samples, probes, first_takes, retakes, noisy, gauge.quiet_us())


def _timed_take(
    call: Callable[[], object],
    sync: Callable[[], None],
    before: Callable[[], None] | None,
    gauge: HostGauge | None,
) -> tuple[float, bool]:
    """One timed call: (milliseconds, whether the host was quiet around it;
    true without a gauge)."""
    if before is not None:
        before()
    ahead = gauge.probe() if gauge else 0.0
    sync()
    t0 = time.perf_counter_ns()
    call()
    sync()
    ms = (time.perf_counter_ns() - t0) / 1e6
    return ms, gauge is None or gauge.is_quiet(ahead, gauge.probe())


class TrafficBench:
    """Every real-traffic measurement of one spec stem."""

    def __init__(self, stem: str, args: argparse.Namespace, ctx: dict[str, Any]):
        self.stem = stem
        self.args = args
        self.ctx = ctx
        self.device: torch.device = ctx["device"]
        self.dtype: torch.dtype = ctx["dtype"]
        self.sync: Callable[[], None] = ctx["sync"]
        self.log: Callable[[str], None] = ctx["log"]
        self.tower = REFERENCE_TOWERS[stem]
        self.config = self.tower.config(args.size)
        self.grid = image_traffic.model_grid(stem, self.config)
        self.paths: tuple[str, ...] = tuple(self.tower.paths)
        self.multi_path = self.paths != ("default",)
        # A model of several paths: vLLM's packing on the default and fine
        # ladders only (MULTI_PATH_NOT_APPLICABLE).
        self.ladders = ("default", "fine") if self.multi_path else LADDERS
        self.policies = ("vllm",) if self.multi_path else POLICIES

    def schedule(self) -> Schedule:
        late = time.perf_counter() - self.ctx["started"] > self.args.soft_limit_s
        return self.args.schedule_late if late else self.args.schedule

    def items(self, pixels: list[list[tuple[int, int]]]) -> list[list[tuple[int, ...]]]:
        return [[self.grid(h, w) for h, w in batch] for batch in pixels]

    def run(self, deadline: float) -> dict[str, Any]:
        """Everything for this stem; batches beyond ``--batches`` only
        until ``deadline`` (``time.perf_counter()``)."""
        args = self.args
        started = time.perf_counter()
        host = images_only_host(self.stem, args.size, self.device, self.dtype)
        managers: dict[str, EncoderCudaGraphManager] = {}
        result: dict[str, Any] = {"spec": self.stem, "size": args.size}
        try:
            with torch.inference_mode():
                self._run(host, managers, result, deadline)
        finally:
            gc.unfreeze()
            for manager in managers.values():
                manager.clear()
            del host
            gc.collect()
            self.ctx["make_backend"]().release_cached_memory()
        result["elapsed_s"] = time.perf_counter() - started
        return result

    def _run(
        self,
        host: Any,
        managers: dict[str, EncoderCudaGraphManager],
        result: dict,
        deadline: float,
    ) -> None:
        args = self.args
        sizes, shares = image_traffic.WORKLOADS[args.workload]
        measured_px = image_traffic.draw_image_batches(
            args.seed, args.max_batches, sizes, shares
        )
        train_px = image_traffic.draw_image_batches(
            args.seed + 1, TRAIN_BATCHES, sizes, shares
        )
        measured, train = self.items(measured_px), self.items(train_px)
        result["paths"] = list(self.paths)
        # The tower encodes item by item: its eager cost has the serial form.
        result["eager_per_item"] = (
            getattr(host, "encoder_eager_forward_per_item", False) is True
        )
        result["ladders_measured"] = list(self.ladders)
        result["policies_measured"] = list(self.policies)
        if self.multi_path:
            result["not_applicable"] = dict(MULTI_PATH_NOT_APPLICABLE)
        result["ladders"] = self._capture(host, managers, train, result)
        result["startup_s"] = startup_seconds(result["ladders"])
        self.log(
            f"[{self.stem}] startup, capture + calibration s per ladder: "
            + ", ".join(
                f"{name} {s['capture_s']:.1f} + "
                + ("n/a" if s["calibration_s"] is None else f"{s['calibration_s']:.1f}")
                for name, s in result["startup_s"].items()
            )
        )
        # Each path's capture inputs at its smallest budget: the dtype,
        # device and keys of its graphs' buffers.
        self.templates = {
            path: host.prepare_encoder_cudagraph_capture_inputs(
                min(b for b in managers["default"].path_token_budgets[path] if b),
                1,
                0,
                self.device,
                self.dtype,
                path,
                (),
            ).values
            for path in self.paths
        }
        # Serving state from here on: vLLM freezes the collector's heap after
        # its warm-up (gc_utils.freeze_gc_heap), so that its passes do not
        # walk the model's objects.
        gc.collect()
        gc.freeze()
        old = QUICK_OLD_WORKLOADS if args.quick else OLD_WORKLOADS
        result["old_workloads"] = [
            self._old_workload(host, managers["fine"], res, n)
            for res, n in (old if args.old_workloads and not self.multi_path else ())
        ]
        result["batches"] = []
        hard = self.ctx["started"] + args.hard_limit_s
        for i, (pixels, items) in enumerate(zip(measured_px, measured)):
            now = time.perf_counter()
            if (i >= args.batches and now > deadline) or (i >= 1 and now > hard):
                break
            result["batches"].append(self._batch(host, managers, i, pixels, items))
        result["summary"] = {
            ladder: {
                p: summarize_traffic(result["batches"], ladder, p)
                for p in self.policies
            }
            for ladder in self.ladders
        }
        used = [measured[r["index"]] for r in result["batches"]]
        result["tuned_waste"] = (
            None
            if self.multi_path
            else {
                "predicted_train": result["tuner"]["tuned"]["waste"],
                "predicted_measured": predicted_waste(
                    self.stem,
                    traffic_document(self.stem, used, self.config, f"seed {args.seed}"),
                    result["ladders"]["tuned"],
                    args.max_tokens,
                    result["tuner_constants"],
                ),
                "measured": result["summary"]["tuned"]["vllm"]["padding_waste"],
            }
        )
        for ladder, per_policy in result["summary"].items():
            for policy, s in per_policy.items():
                per_path = "".join(
                    f", {path} {100 * w['padding_waste']:.1f}%"
                    for path, w in s.get("paths", {}).items()
                    if w["padding_waste"] is not None
                )
                self.log(
                    f"[{self.stem}] {ladder}/{policy}: speedup {s['speedup']:.2f}x, "
                    f"worst batch {s['speedup_per_batch']['min']:.2f}x, vs best "
                    f"{s['vs_best']:.3f}, waste {100 * s['padding_waste']:.1f}%"
                    + per_path
                )

    def _capture(
        self,
        host: Any,
        managers: dict[str, EncoderCudaGraphManager],
        train: list[list[tuple[int, ...]]],
        result: dict[str, Any],
    ) -> dict[str, Any]:
        """Capture and calibrate the default and fine ladders, then tune a
        ladder with the default one's replay costs and capture it."""
        args = self.args
        default_cfg = build_vllm_config(args.max_tokens)
        lo, hi = host.get_encoder_cudagraph_budget_range(default_cfg)
        configs = {
            "default": default_cfg,
            "fine": build_vllm_config(
                args.max_tokens, fine_ladder(lo, hi), FINE_MAX_ITEMS
            ),
        }
        calibration_kwargs = (
            []
            if self.multi_path
            else [
                self.tower.make_mm_kwargs(host, b, self.device, seed=50 + i)
                for i, b in enumerate(calibration_batches(train, args.quick))
            ]
        )
        ladders: dict[str, Any] = {}
        for name, cfg in configs.items():
            ladders[name] = self._capture_one(
                name, cfg, host, managers, calibration_kwargs
            )
        if self.multi_path:
            result["tuner"] = None
            return ladders
        tuning = self._tuning(managers["default"])
        result["tuner_constants"] = host_constants(self.stem, host)
        tuner = run_tuner(
            self.stem,
            traffic_document(
                self.stem, train, self.config, f"seed {args.seed + 1}", tuning
            ),
            args.max_tokens,
            constants=result["tuner_constants"],
        )
        result["tuner"] = tuner
        result["crossover"] = self.crossover
        tuned = tuner["compilation_config"]
        cfg = build_vllm_config(
            args.max_tokens,
            tuned["encoder_cudagraph_token_budgets"],
            tuned["encoder_cudagraph_max_vision_items_per_batch"],
        )
        ladders["tuned"] = self._capture_one(
            "tuned", cfg, host, managers, calibration_kwargs
        )
        return ladders

    def _capture_one(
        self,
        name: str,
        cfg: Any,
        host: Any,
        managers: dict[str, EncoderCudaGraphManager],
        calibration_kwargs: list[dict[str, Any]],
    ) -> dict[str, Any]:
        manager = EncoderCudaGraphManager(
            cfg,
            self.device,
            self.dtype,
            host,
            graph_backend=self.ctx["make_backend"](),
            cost_aware=not self.multi_path,
        )
        manager.capture()
        managers[name] = manager
        report = manager.get_capture_report()
        assert report is not None
        ladder = {
            "budgets": list(manager.token_budgets),
            # What each path captures: a path with min_token_budget doubles
            # from it up to the largest budget (vLLM's rule).
            "path_budgets": {
                path: list(b) for path, b in manager.path_token_budgets.items()
            },
            "max_batch_size": manager.max_batch_size,
            "capture": dataclasses.asdict(report),
            "calibration_s": None,
            "cost_model": None,
            "calibration_samples": None,
        }
        captured = (
            f"[{self.stem}] ladder {name}: {report.num_graphs} graphs, "
            f"captured in {report.seconds:.1f}s"
        )
        if self.multi_path:
            manager.enable_timing()
            self.log(f"{captured}, {ladder['path_budgets']}; not calibrated")
            return ladder
        start = time.perf_counter()
        # Eager calls are timed (the fastest of three) on the first ladder
        # only: their cost does not depend on the ladder. Graph units the
        # fastest of two on the others: each budget's correction rests on
        # them (GraphCost.budget_scale).
        first = next((m for m in managers.values() if m is not manager), None)
        eager_from = first.cost_model if first is not None else None
        cost = manager.calibrate_cost_model(
            calibration_kwargs, repeats=2 if eager_from else 3, eager_from=eager_from
        )
        manager.enable_timing()
        ladder["calibration_s"] = time.perf_counter() - start
        ladder["cost_model"] = cost.as_dict()
        ladder["calibration_samples"] = manager.calibration_samples
        ladder["calibration_report"] = manager.calibration_report
        units = manager.calibration_report
        self.log(
            f"{captured}, calibrated in {ladder['calibration_s']:.1f}s (errors: "
            f"graph {cost.graph_error:.3f}, eager {cost.eager_error:.3f}; units "
            f"{units['units'] - units['skipped']}/{units['units']} timed, calls "
            f"left out: {units['skipped_eager_calls']} eager, "
            f"{units['skipped_graph_units']} graph; "
            f"{units['device_ms'] / 1e3:.1f}s of timed calls)"
        )
        return ladder

    def _tuning(self, default: EncoderCudaGraphManager) -> dict[str, Any]:
        """The tuner's ``tuning`` for this model, from the default ladder's
        capture: what a replay costs in rows, and the largest budget of
        vLLM's range for the spec (the default ladder's top, what `vllm
        serve` builds: DeepSeek-V4.1's ``budget.max`` covers a step's
        patches). Issue #27: a top doubled up to 4x to hold the largest
        training batch gave Qwen2-VL and Qwen2.5-VL 14 budgets of 26k-65k
        tokens (0.5-1.8 s a forward each on an H100, 48-57 s of capture)
        where their exact-shape graph is no faster than eager."""
        cost = default.cost_model
        assert cost is not None
        tuning = {
            "replay_cost_rows": replay_cost_rows(cost.graph),
            "max_budget": default.token_budgets[-1],
            "capture_memory_mib": TUNED_CAPTURE_MIB,
        }
        # Recorded, not passed: vLLM's packing cuts a batch above the top
        # budget into replays of it, so a ladder cut at a noisy crossover (the
        # CPU smoke's is 256 MiniMax M3 tokens) costs a vLLM user replays;
        # `gen-mixin plan` takes it as tuning.crossover_rows when given.
        self.crossover = {
            "per_items": crossover_rows(cost),
            "crossover_rows": tuning_crossover(cost),
        }
        self.log(
            f"[{self.stem}] graphs stop paying at (rows per batch, by items): "
            f"{self.crossover['per_items']}"
        )
        return tuning

    def _batch(
        self,
        host: Any,
        managers: dict[str, EncoderCudaGraphManager],
        index: int,
        pixels: list[tuple[int, int]],
        items: list[tuple[int, ...]],
    ) -> dict[str, Any]:
        tower = self.tower
        kw = tower.make_mm_kwargs(host, items, self.device, seed=1000 + index)
        specs = host.get_encoder_cudagraph_item_specs(kw)
        path_rows = {
            path: [s.get_path_output_tokens(path) for s in specs] for path in self.paths
        }
        row: dict[str, Any] = {
            "index": index,
            "images": len(items),
            "pixels": [list(p) for p in pixels],
            "items": [list(i) for i in items],
            "item_tokens": [s.output_tokens for s in specs],
            # Rows the manager packs (every path's, budget tokens).
            "budget_tokens": sum(sum(rows) for rows in path_rows.values()),
            "output_tokens": sum(s.output_tokens for s in specs),
            "input_rows": sum(s.input_size for s in specs),
        }
        if self.multi_path:
            row["path_rows"] = path_rows
            row["path_input_rows"] = {
                path: path_input_rows(host, kw, path) for path in self.paths
            }
        else:
            row["item_rows"] = path_rows["default"]
        _, ref_items = eager_call(host, kw, self.paths)
        ideals = self._capture_ideals(host, kw)
        row["check_ideal"] = max_rel_diff(ideal_e2e_call(host, ideals, kw), ref_items)
        cells = {
            (ladder, policy): managers[ladder]
            for ladder in self.ladders
            for policy in self.policies
        }
        self._measure(host, ideals, kw, row, ref_items, cells)
        del ideals
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        text = " | ".join(
            f"{ladder}: "
            + " / ".join(f"{g[p]['speedup']:.2f}x" for p in self.policies)
            + (
                ""
                if "cost" not in g
                else f" ({g['cost']['plan']['source'][0]}{g['cost']['plan']['kind'][0]})"
            )
            for ladder, g in row["graph"].items()
        )
        self.log(
            f"[{self.stem}] batch {index:>2} x{len(items):<2} eager "
            f"{row['eager_ms']['median']:.2f} ms, exact graph e2e "
            f"{row['ideal_e2e_ms']['median']:.2f} ms; "
            f"{' / '.join(self.policies)}: {text}"
            + (
                f"; {retakes} retaken"
                if (retakes := sum(row["rounds"]["retakes"].values()))
                else ""
            )
        )
        return row

    def _capture_ideals(self, host: Any, kw: dict[str, Any]) -> dict[str, IdealGraph]:
        """The exact-shape graph of every path the batch has rows on."""
        specs = host.get_encoder_cudagraph_item_specs(kw)
        return {
            path: capture_ideal(
                host, self.ctx["make_backend"](), kw, self.templates[path], path
            )
            for path in self.paths
            if path == "default" or any(s.get_path_output_tokens(path) for s in specs)
        }

    def _measure(
        self,
        host: Any,
        ideals: dict[str, IdealGraph],
        kw: dict[str, Any],
        row: dict[str, Any],
        ref_items: list[Any],
        cells: dict[tuple[str, str], EncoderCudaGraphManager],
    ) -> None:
        """Check every policy once, then time eager, the exact-shape graph
        and every policy in interleaved rounds; fill ``row``."""
        schedule = self.schedule()
        row["ideal_ms"] = summarize(
            measure(functools.partial(replay_all, ideals), self.sync, schedule)
        )
        checks = {
            cell: self._check(manager, cell[1], kw, row, ref_items)
            for cell, manager in cells.items()
        }
        calls: dict[str, Callable[[], object]] = {
            "eager": functools.partial(eager_call, host, kw, self.paths),
            "eager_again": functools.partial(eager_call, host, kw, self.paths),
            "ideal_e2e": functools.partial(ideal_e2e_call, host, ideals, kw),
        }
        before, after, overhead = {}, {}, {}
        for (ladder, policy), manager in cells.items():
            name = f"{ladder}/{policy}"
            calls[name] = functools.partial(manager.execute, kw)
            before[name] = functools.partial(
                setattr, manager, "cost_aware", policy == "cost"
            )
            overhead[name] = []
            after[name] = functools.partial(_record_overhead, manager, overhead[name])
        gauge = self.ctx.get("gauge")
        rounds = measure_rounds(calls, self.sync, schedule, before, after, gauge)
        samples = rounds.samples
        # Raw samples and the host probe: a median of 3-5 rounds hides which
        # host mode each call was timed in.
        row["rounds"] = dataclasses.asdict(rounds)
        row["eager_ms"] = summarize(samples["eager"])
        row["eager_again_ms"] = summarize(samples["eager_again"])
        row["aa_ratio"] = ratio(
            row["eager_ms"]["median"], row["eager_again_ms"]["median"]
        )
        row["ideal_e2e_ms"] = summarize(samples["ideal_e2e"])
        row["best_ms"] = min(row["eager_ms"]["median"], row["ideal_e2e_ms"]["median"])
        row["graph"] = {ladder: {} for ladder, _ in cells}
        for (ladder, policy), entry in checks.items():
            name = f"{ladder}/{policy}"
            entry["graph_ms"] = summarize(samples[name])
            entry["host_overhead_us"] = summarize(overhead[name])
            median = entry["graph_ms"]["median"]
            entry["speedup"] = ratio(row["eager_ms"]["median"], median)
            entry["paired_speedup"] = paired_ratio(samples["eager"], samples[name])
            if rounds.first_takes:
                # What the run would have said without the quiet-host retakes.
                entry["first_take_speedup"] = ratio(
                    statistics.median(rounds.first_takes["eager"]),
                    statistics.median(rounds.first_takes[name]),
                )
            entry["efficiency"] = ratio(row["ideal_ms"]["median"], median)
            entry["efficiency_e2e"] = ratio(row["ideal_e2e_ms"]["median"], median)
            entry["vs_best"] = ratio(row["best_ms"], median)
            row["graph"][ladder][policy] = entry

    def _check(
        self,
        manager: EncoderCudaGraphManager,
        policy: str,
        kw: dict[str, Any],
        row: dict[str, Any],
        ref_items: list[Any],
    ) -> dict[str, Any]:
        """One execute of ``policy``: its outputs against eager, its
        padding, its plan and the cost model's predictions (the first call
        of a batch, so also its warm-up)."""
        manager.cost_aware = policy == "cost"
        manager.reset_padding_stats()
        outputs = manager.execute(kw)
        self.sync()
        if self.multi_path:
            entry = {
                "padding": self._path_padding(manager, row),
                "check_vs_eager": max_rel_diff(outputs, ref_items),
                "plan": {"source": "vllm", "kind": None, "predicted_ms": None},
                "predicted_ms": None,
                "predicted_vllm_ms": None,
                "predicted_eager_ms": None,
            }
            del outputs
            return entry
        cost = manager.cost_model
        assert cost is not None
        predicted = plan_execution(
            row["item_rows"],
            manager.token_budgets,
            manager.max_batch_size,
            cost,
            sort_keys=row["item_tokens"],
        )
        plan = (
            manager.get_execution_stats()["last_plan"]
            if policy == "cost"
            else {"source": "vllm", "kind": None, "predicted_ms": predicted.vllm_ms}
        )
        entry: dict[str, Any] = {
            "padding": padding_summary(manager, row["input_rows"]),
            "check_vs_eager": max_rel_diff(outputs, ref_items),
            "plan": plan,
            "predicted_ms": plan["predicted_ms"],
            "predicted_vllm_ms": predicted.vllm_ms,
            "predicted_eager_ms": predicted.eager_ms,
        }
        del outputs
        return entry

    def _path_padding(
        self, manager: EncoderCudaGraphManager, row: dict[str, Any]
    ) -> dict[str, Any]:
        """The last execute's padding: totals over the paths in budget rows
        (in input rows n/a: each path's graphs take other inputs), and per
        path in budget rows and in its first input buffer's rows."""
        stats = manager.get_padding_stats()
        paths = {
            path: padding_summary(manager, row["path_input_rows"][path], path)
            for path in self.paths
        }
        used = stats["rows_used"]
        return {
            "replays": stats["replays"],
            "budgets_replayed": None,
            "rows_replayed": stats["rows_replayed"],
            "rows_used": used,
            "padding_waste": stats["rows_replayed"] / used - 1.0 if used else None,
            "waste_fraction": stats["waste_fraction"],
            "eager_batches": sum(p["eager_batches"] for p in paths.values()),
            "input_rows_replayed": None,
            "input_rows_used": None,
            "input_padding_waste": None,
            "paths": paths,
        }

    def _old_workload(
        self, host: Any, manager: EncoderCudaGraphManager, res: int, n: int
    ) -> dict[str, Any]:
        """One of issue #6's uniform workloads, both policies."""
        item = pixels_to_item(self.tower, self.args.size, res, res)
        kw = self.tower.make_mm_kwargs(host, [item] * n, self.device, seed=7 + n)
        specs = host.get_encoder_cudagraph_item_specs(kw)
        row: dict[str, Any] = {
            "resolution": res,
            "images": n,
            "item": list(item),
            "item_rows": [s.get_path_output_tokens("default") for s in specs],
            "item_tokens": [s.output_tokens for s in specs],
            "input_rows": n * self.tower.input_size(item),
        }
        _, ref_items = eager_call(host, kw)
        ideals = self._capture_ideals(host, kw)
        cells = {("fine", policy): manager for policy in POLICIES}
        self._measure(host, ideals, kw, row, ref_items, cells)
        del ideals
        row["graph"] = row["graph"]["fine"]
        return row


def _record_overhead(manager: EncoderCudaGraphManager, into: list[float]) -> None:
    assert manager.timing is not None
    into.append(manager.timing.last_overhead_ns / 1e3)


# ---------------------------------------------------------------------------
# Summaries and targets
# ---------------------------------------------------------------------------


def summarize_traffic(
    rows: list[dict[str, Any]], ladder: str, policy: str
) -> dict[str, Any]:
    """Totals over the batches of one ladder and policy (sums of medians)."""
    entries = [r["graph"][ladder][policy] for r in rows]
    eager = sum(r["eager_ms"]["median"] for r in rows)
    ideal = sum(r["ideal_ms"]["median"] for r in rows)
    ideal_e2e = sum(r["ideal_e2e_ms"]["median"] for r in rows)
    best = sum(r["best_ms"] for r in rows)
    graph = sum(e["graph_ms"]["median"] for e in entries)
    replayed = sum(e["padding"]["rows_replayed"] for e in entries)
    used = sum(e["padding"]["rows_used"] for e in entries)
    speedups = [e["speedup"] for e in entries]
    worst = min(range(len(rows)), key=lambda i: speedups[i]) if rows else None
    paired = [e["paired_speedup"] for e in entries if e.get("paired_speedup")]
    kinds: dict[str, int] = {}
    for e in entries:
        if e["plan"].get("kind") is not None:
            kind = f"{e['plan']['source']}/{e['plan']['kind']}"
            kinds[kind] = kinds.get(kind, 0) + 1
    out = {
        "batches": len(rows),
        "images": sum(r["images"] for r in rows),
        "eager_ms_total": eager,
        "ideal_ms_total": ideal,
        "ideal_e2e_ms_total": ideal_e2e,
        "best_ms_total": best,
        "graph_ms_total": graph,
        "speedup": ratio(eager, graph),
        "efficiency": ratio(ideal, graph),
        "efficiency_e2e": ratio(ideal_e2e, graph),
        "vs_best": ratio(best, graph),
        "speedup_per_batch": summarize(speedups),
        # Per batch, the median over rounds of eager / this call in the same
        # round (see paired_ratio): what the same host mode gives.
        "paired_speedup_per_batch": summarize(paired),
        "worst_batch": None if worst is None else rows[worst]["index"],
        "aa_floor": aa_floor(rows),
        "rows_replayed": replayed,
        "rows_used": used,
        "padding_waste": replayed / used - 1.0 if used else 0.0,
        "eager_batches": sum(e["padding"]["eager_batches"] for e in entries),
        "plans": kinds,
    }
    if entries and "paths" in entries[0]["padding"]:
        out["paths"] = {
            path: summarize_path_padding([e["padding"]["paths"][path] for e in entries])
            for path in entries[0]["padding"]["paths"]
        }
    return out


def aa_floor(rows: list[dict[str, Any]]) -> float | None:
    """The lowest ``min(r, 1/r)`` of the batches' A/A ratios (eager / eager
    again): how slow the eager call measured against itself (``None``
    before run E's JSON, which has no A/A call)."""
    ratios = [r["aa_ratio"] for r in rows if r.get("aa_ratio")]
    return min((min(r, 1.0 / r) for r in ratios), default=None)


def summarize_path_padding(paddings: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's padding over batches, in budget rows and in input rows
    (n/a where a graph's input rows are unknown or some rows ran eagerly)."""
    replayed = sum(p["rows_replayed"] for p in paddings)
    used = sum(p["rows_used"] for p in paddings)
    known = all(p["input_rows_replayed"] is not None for p in paddings)
    in_replayed = sum(p["input_rows_replayed"] or 0 for p in paddings)
    in_used = sum(p["input_rows_used"] for p in paddings)
    eager = sum(p["eager_batches"] for p in paddings)
    return {
        "replays": sum(p["replays"] for p in paddings),
        "rows_replayed": replayed,
        "rows_used": used,
        "padding_waste": replayed / used - 1.0 if used else None,
        "eager_batches": eager,
        "input_rows_replayed": in_replayed if known else None,
        "input_rows_used": in_used,
        "input_padding_waste": (
            in_replayed / in_used - 1.0 if known and in_used and not eager else None
        ),
    }


def not_applicable(name: str, model: dict[str, Any], ladder: str) -> str | None:
    """Why target ``name`` has no value for ``model`` on ``ladder`` (a
    model of several paths: no tuned ladder, no cost-aware policy), or
    ``None``."""
    reasons = model.get("not_applicable", {})
    if ladder not in model["summary"]:
        return reasons.get(ladder, f"n/a: no {ladder} ladder")
    if name == "tuned_waste_prediction" and model.get("tuned_waste") is None:
        return reasons.get("tuned", "n/a: no tuned ladder")
    if name.startswith("issue6") and not model["old_workloads"]:
        return reasons.get("old_workloads")
    if "cost" not in model["summary"][ladder]:
        return reasons.get("cost", "n/a: no cost-aware policy")
    return None


def eager_plan_bound(rows: list[dict[str, Any]], ladder: str) -> float | None:
    """The lowest eager / (eager + the manager's own host time) over the
    batches whose cost-aware plan on ``ladder`` ran wholly eagerly (``None``
    without such a batch).

    Such a plan runs the tower's eager forward on the batch as the eager
    baseline does (the same kernels for the same device time: GPU run E),
    so what it adds is the manager's host work around it (planning, the
    item specs' bookkeeping: ``host_overhead_us``, measured per execute);
    the rest of a measured ratio is the call's noise against itself."""
    bounds = [
        r["eager_ms"]["median"]
        / (r["eager_ms"]["median"] + entry["host_overhead_us"]["median"] / 1e3)
        for r in rows
        if (entry := r["graph"][ladder]["cost"])["plan"].get("kind") == "eager"
        and entry.get("host_overhead_us", {}).get("median") is not None
    ]
    return min(bounds) if bounds else None


def _target_values(
    name: str, model: dict[str, Any], ladder: str
) -> list[tuple[float | None, dict[str, Any]]]:
    if not_applicable(name, model, ladder) is not None:
        return []
    if name == "no_batch_slower_than_eager":
        s = model["summary"][ladder]["cost"]
        where = {
            "batch": s["worst_batch"],
            "aa_floor": s.get("aa_floor"),
            "eager_plan_bound": eager_plan_bound(model["batches"], ladder),
        }
        return [(s["speedup_per_batch"]["min"], where)]
    if name == "no_graph_plan_slower_than_eager":
        cells = [
            (r["graph"][ladder]["cost"]["speedup"], {"batch": r["index"]})
            for r in model["batches"]
            if r["graph"][ladder]["cost"]["plan"].get("kind") in ("graphs", "mixed")
        ]
        return [min(cells, key=lambda c: c[0])] if cells else []
    if name == "aggregate_vs_best":
        return [(model["summary"][ladder]["cost"]["vs_best"], {})]
    if name == "tuned_waste_prediction":
        t = model["tuned_waste"]
        return [(abs(t["measured"] - t["predicted_measured"]), {})]
    rows = model["old_workloads"]
    if name == "issue6_speedup_small_batches":
        rows = [r for r in rows if r["images"] <= 4 and r["resolution"] <= 448]
        return [
            (
                r["graph"]["cost"]["speedup"],
                {"resolution": r["resolution"], "images": r["images"]},
            )
            for r in rows
        ]
    return [
        (
            r["graph"]["cost"]["efficiency"],
            {"resolution": r["resolution"], "images": r["images"]},
        )
        for r in rows
    ]


def _not_applicable(
    target: dict[str, Any], models: dict[str, Any], ladders: list[str]
) -> list[dict[str, Any]]:
    """The (model, ladder) pairs the target cannot be checked on, and why
    (only the reasons a model records: an empty issue #6 list of a run
    without those workloads is no gap)."""
    out = []
    for ladder in ladders:
        for stem, model in models.items():
            reason = not_applicable(target["name"], model, ladder)
            if reason is not None and "not_applicable" in model:
                out.append({"model": stem, "ladder": ladder, "reason": reason})
    return out


def _checks(
    target: dict[str, Any], models: dict[str, Any], ladders: list[str]
) -> list[dict[str, Any]]:
    lower = target["name"] == "tuned_waste_prediction"
    checks = []
    for ladder in ladders:
        for stem, model in models.items():
            for value, where in _target_values(target["name"], model, ladder):
                threshold = target["threshold"]
                ok = value is not None and (
                    value <= threshold if lower else value >= threshold
                )
                checks.append(
                    {"value": value, "ok": ok, "model": stem, "ladder": ladder, **where}
                )
    return checks


def _worst(target: dict[str, Any], checks: list[dict[str, Any]]) -> Any:
    known = [c for c in checks if c["value"] is not None]
    if not known:
        return None
    pick = max if target["name"] == "tuned_waste_prediction" else min
    return pick(known, key=lambda c: c["value"])


def evaluate_targets(models: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target on its gating ladders over the seed models (all models
    when none was measured; ``passed`` is ``None`` when nothing was), and
    the same check on its ``info_ladders``, reported only."""
    gated = {k: v for k, v in models.items() if k in TARGET_MODELS} or models
    out = []
    for target in TARGETS:
        checks = _checks(target, gated, target["gating_ladders"])
        info = _checks(target, gated, target.get("info_ladders", []))
        out.append(
            {
                **target,
                "passed": all(c["ok"] for c in checks) if checks else None,
                "worst": _worst(target, checks),
                "failing": [c for c in checks if not c["ok"]],
                "info": info,
                "not_applicable": _not_applicable(
                    target,
                    gated,
                    target["gating_ladders"] + target.get("info_ladders", []),
                ),
            }
        )
    return out


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output path")
    parser.add_argument("--markdown", type=Path, help="also write a markdown report")
    parser.add_argument("--plot", type=Path, help="also write a PNG plot")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--quick", action="store_true", help="CPU smoke / CI")
    parser.add_argument(
        "--models",
        default=",".join(TARGET_MODELS),
        help="comma-separated spec stems, 'new' for NEW_MODELS, 'beyond' for "
        "BEYOND_MODELS (default: the seed models)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        help="batches per model measured whatever the time (more follow while "
        "the model's share of --soft-limit-s lasts, up to --max-batches)",
    )
    parser.add_argument(
        "--skip-unusable",
        action="store_true",
        help="record the --models that cannot be measured (no spec yet, no "
        "reference tower) under 'skipped' and measure the others, instead of exiting",
    )
    parser.add_argument(
        "--old-workloads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure issue #6's uniform workloads (default: yes)",
    )
    parser.add_argument(
        "--quiet-host",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="time a call again while the host probe says the host is slow "
        "(HostGauge; default: no: GPU run H)",
    )
    parser.add_argument("--max-batches", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--workload",
        choices=sorted(image_traffic.WORKLOADS),
        default="default",
        help="image_traffic's mix: default, or second (other source shares and "
        "batch sizes, issue #27); the tuner's training sample is drawn from it "
        "too (seed + 1)",
    )
    parser.add_argument(
        "--soft-limit-s",
        type=float,
        default=300.0,
        help="after this many seconds, measure with the short schedule",
    )
    parser.add_argument(
        "--hard-limit-s",
        type=float,
        help="after this many seconds, measure no more batches (one at least), "
        "even below --batches (default: the soft limit + 40 s)",
    )
    args = parser.parse_args(argv)
    if args.hard_limit_s is None:
        args.hard_limit_s = args.soft_limit_s + 40.0
    if args.max_tokens is None:
        args.max_tokens = DEFAULT_MAX_TOKENS[args.size]
    mode = "quick" if args.quick else "full"
    if args.batches is None:
        args.batches = BATCHES[mode]
    if args.max_batches is None:
        args.max_batches = max(args.batches, MAX_BATCHES[mode])
    if args.quick:
        args.schedule = Schedule(warmup=0, min_iters=1, max_iters=1, target_s=0.0)
    else:
        # Rounds of every call of a batch: 6-8 for small batches, 2 for those
        # whose round takes more than SLOW_ROUND_S. Four rounds could not
        # tell 3% on an eager call whose A/A ratio spans 0.8-1.2 (run E).
        args.schedule = Schedule(warmup=1, min_iters=6, max_iters=8, target_s=1.0)
    args.schedule_late = Schedule(warmup=0, min_iters=3, max_iters=3, target_s=0.0)
    return args


def run(
    args: argparse.Namespace, checkpoint: Callable[[dict], None] | None = None
) -> dict:
    started = time.perf_counter()
    use_cuda = args.device == "cuda" or (
        args.device == "auto" and torch.cuda.is_available()
    )
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if use_cuda
        else torch.device("cpu")
    )

    def make_backend() -> GraphBackend:
        return CudaGraphBackend(device) if use_cuda else EagerReplayGraphBackend()

    def log(line: str) -> None:
        print(
            f"[{time.perf_counter() - started:6.1f}s] {line}",
            file=sys.stderr,
            flush=True,
        )

    wanted = [s.strip() for s in args.models.split(",") if s.strip()]
    wanted = [m for s in wanted for m in MODEL_GROUPS.get(s, (s,))]
    skipped = {
        stem: reason
        for stem in wanted
        if (reason := unusable_reason(stem, args.size, multi_path=True)) is not None
    }
    if skipped and not args.skip_unusable:
        raise SystemExit(f"unknown or unusable spec stems: {skipped}")
    stems = [stem for stem in wanted if stem not in skipped]
    ctx = {
        "started": started,
        "device": device,
        "dtype": torch.bfloat16 if use_cuda else torch.float32,
        "sync": (
            (lambda: torch.cuda.synchronize(device)) if use_cuda else (lambda: None)
        ),
        "make_backend": make_backend,
        "log": log,
        "gauge": (
            HostGauge(functools.partial(host_probe_us, 3)) if args.quiet_host else None
        ),
    }
    sizes, chosen = image_traffic.WORKLOADS[args.workload]
    shares = dict(chosen or {s.name: s.share for s in image_traffic.SOURCES})
    result: dict[str, Any] = {
        "benchmark": "encoder_traffic",
        "schema_version": SCHEMA_VERSION,
        "created_unix": time.time(),
        "environment": environment(device, make_backend()),
        "params": {
            "size": args.size,
            "dtype": str(ctx["dtype"]),
            "quick": args.quick,
            "stems": stems,
            "old_workloads": args.old_workloads,
            "batches": args.batches,
            "max_batches": args.max_batches,
            "soft_limit_s": args.soft_limit_s,
            "hard_limit_s": args.hard_limit_s,
            "train_batches": TRAIN_BATCHES,
            "calibration": {
                "singles": list(
                    QUICK_CALIBRATION_SINGLES if args.quick else CALIBRATION_SINGLES
                ),
                "groups": [
                    [list(part) for part in group]
                    for group in (
                        QUICK_CALIBRATION_GROUPS if args.quick else CALIBRATION_GROUPS
                    )
                ],
            },
            "seed": args.seed,
            "max_num_batched_tokens": args.max_tokens,
            "schedule": dataclasses.asdict(args.schedule),
            "quiet_host": (
                {"factor": QUIET_FACTOR, "max_retakes": MAX_RETAKES}
                if args.quiet_host
                else None
            ),
            "workload": args.workload,
            "sources": [
                {"name": s.name, "share": shares.get(s.name, 0.0), "source": s.source}
                for s in image_traffic.SOURCES
            ],
            "batch_sizes": [list(b) for b in sizes],
        },
        "models": {},
        "skipped": skipped,
        "errors": {},
    }
    log(f"models {stems} on {result['environment']['device']}")
    for stem, reason in skipped.items():
        log(f"[{stem}] skipped: {reason}")
    for k, stem in enumerate(stems):
        # Each model's batches beyond --batches: until its share of the
        # soft limit is spent.
        deadline = started + args.soft_limit_s * (k + 1) / len(stems)
        try:
            result["models"][stem] = TrafficBench(stem, args, ctx).run(deadline)
        except Exception:  # noqa: BLE001 - keep the other models' numbers
            result["errors"][stem] = traceback.format_exc()
            log(f"[{stem}] FAILED:\n{result['errors'][stem]}")
        gc.collect()
        make_backend().release_cached_memory()
        if checkpoint is not None:
            checkpoint(result)
    result["targets"] = evaluate_targets(result["models"])
    gating = [t["passed"] for t in result["targets"] if t["passed"] is not None]
    result["all_targets_passed"] = bool(gating) and all(gating)
    result["elapsed_s"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args, checkpoint=lambda partial: write_json(args.out, partial))
    write_json(args.out, result)
    for target in result["targets"]:
        status = {True: "PASS", False: "FAIL", None: "n/a "}[target["passed"]]
        worst = target["worst"]
        value = (
            "n/a"
            if worst is None or worst["value"] is None
            else f"{worst['value']:.3g}"
        )
        print(f"  {status} {target['description']}: worst {value}", file=sys.stderr)
    if args.markdown or args.plot:
        import render_results

        if args.markdown:
            args.markdown.write_text(render_results.render_markdown(result))
        if args.plot:
            try:
                render_results.render_plot(result, args.plot)
            except ImportError as exc:
                print(f"no plot: {exc}", file=sys.stderr)
    return 2 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
