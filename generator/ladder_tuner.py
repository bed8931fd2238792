"""``gen-mixin plan SPEC --traffic FILE``: a budget ladder fitted to traffic.

vLLM's default ladder doubles from the model's minimum budget, so a batch
pads to up to twice its rows; on real images (a 4:3 photo is 540 MiniMax
tokens, replayed at 1024) that is most of the replayed rows. Given a sample
of the encoder batches a deployment sees, this module recommends
``encoder_cudagraph_token_budgets`` and
``encoder_cudagraph_max_vision_items_per_batch`` that minimise the expected
padded rows, within a cap on the memory of the captured buffers, and prints
them as a ready ``--compilation-config`` value together with the expected
waste of the current ladder (the one vLLM builds for the mixin's range) and
of the tuned one. The recommendation is judged under vLLM's packing, the
packing a vLLM user runs: it keeps the current ladder's budgets and items
per batch, and no batch of the sample (nor of stress batches recombined from
its items) costs more rows on it (:func:`tune_ladder`).

The waste of a ladder is exact for the sample: every batch is packed with
the manager's own packing (:func:`encoder_cudagraph_runtime.packing.packed_rows`)
and waste is ``Σ replayed budgets / Σ rows of the replayed batches − 1``, as
the manager's padding statistics count it. Items are given in the spec's
grid dims and turned into budget tokens and output tokens (the packing
order) with the spec's own formulas (:func:`spec_traffic`).

The traffic file (JSON; ``docs/real-traffic.md``)::

    {"format": "gen-mixin-traffic/1",
     "batches": [{"count": 3, "items": [{"t": 1, "h": 40, "w": 54}]},
                 [{"t": 1, "h": 16, "w": 16}, {"t": 1, "h": 28, "w": 20}]],
     "tuning": {"capture_memory_mib": 4096, "max_graphs": 32,
                "output_row_bytes": 12288}}

A batch is the items of one encoder call, as an object (``count``: how often
it occurs, default 1) or a bare list. ``tuning`` is optional.

Pure Python (no torch), like the rest of the generator.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from encoder_cudagraph_runtime.budget_ladder import generate_budgets
from encoder_cudagraph_runtime.packing import (
    pack_items,
    packed_rows,
    smallest_fitting_budget,
)
from generator.diagnostics import Diagnostic, Location, SpecError
from generator.formulas import EvaluationError, evaluate, names_in
from generator.limits import (
    MAX_DISTINCT_TRAFFIC_BATCHES,
    MAX_DISTINCT_TRAFFIC_ITEMS,
    MAX_INTEGER,
    MAX_TRAFFIC_BYTES,
    MAX_TRAFFIC_ITEMS,
    MAX_TRAFFIC_PROBLEMS,
    MAX_TUNED_BUDGET,
)

__all__ = [
    "LadderWaste",
    "Traffic",
    "TrafficBatch",
    "Tuning",
    "candidate_budgets",
    "crossover_ladder",
    "ladder_waste",
    "load_traffic",
    "spec_traffic",
    "traffic_main",
    "tune_ladder",
]

FORMAT = "gen-mixin-traffic/1"
#: Candidate budgets evaluated exactly per greedy step (the most promising;
#: many are refused as costing some batch more rows than the default).
_CANDIDATES_PER_STEP = 64
#: A budget must save at least this fraction of the used rows to be added.
_MIN_GAIN = 1e-3


@dataclass(frozen=True)
class TrafficBatch:
    rows: tuple[int, ...]
    """Budget tokens of each item of one encoder call."""
    count: int = 1
    tokens: tuple[int, ...] = ()
    """Output tokens of each item, which order vLLM's packing (empty: the
    items are taken in ascending ``rows``, the same order wherever the
    budget counts output tokens)."""

    def packing_order(self) -> tuple[list[int], list[int]]:
        """``(rows, sort keys)`` for :func:`pack_items`."""
        rows = list(self.rows)
        return rows, list(self.tokens) or rows

    def packing_key(self) -> tuple[tuple[int, int], ...]:
        """``(output tokens or 0, rows)`` per item in the order packing
        visits them: a stable sort by the sort key alone, so items of equal
        output tokens but other rows (DeepSeek-V4.1: the merged grid rounds
        ``h`` and ``w`` up to ``r``) keep their order in the batch, as in
        the manager. Batches of equal keys pack alike."""
        rows, keys = self.packing_order()
        tokens = self.tokens or (0,) * len(rows)
        order = sorted(range(len(rows)), key=keys.__getitem__)
        return tuple((tokens[i], rows[i]) for i in order)


@dataclass(frozen=True)
class Tuning:
    capture_memory_mib: float | None = None
    """Cap on the captured buffers of all graphs; default: twice the
    current ladder's."""
    max_graphs: int = 32
    output_row_bytes: int = 0
    """Bytes of one row of a graph's output buffer (``out_hidden_size`` ×
    dtype size), which plan cannot know; 0 leaves output buffers out."""
    replay_cost_rows: int | None = None
    """What one replay costs, in padded rows (its launches and host work):
    the tuner minimises padded rows plus this per replay, so that it does
    not split batches into many replays to save a few rows. Default: the
    spec's minimum budget (the smallest graph worth capturing). Measured:
    the smallest graph's replay time over the time of a padded row between
    the largest ones, the capture dummies' attention taken off (a padded
    row is a zero-length sequence's: no attention). About 1,230 patches for
    DeepSeek-V4.1 and 270 tokens for MiniMax M3 on an H100."""
    max_budget: int | None = None
    """The tuned ladder's largest budget; default: the current ladder's.
    vLLM takes budgets above its automatic range when both the budgets and
    the items per batch are given, and a batch above the largest budget
    splits into several replays, each paying its fixed cost. The graph pool
    grows with the largest budget (the captured buffers, which the cap
    counts, do too; the pool's activations are not sized here)."""
    crossover_rows: int | None = None
    """Rows per batch above which an exact-shape graph is no faster than
    eager (compute-bound batches; ``bench/crossover.py`` reads it off a
    calibrated cost model): budgets that only batches above it would
    replay are not captured, and the cost-aware prediction runs units
    above it eagerly. Default: none (every budget may pay)."""


@dataclass(frozen=True)
class Traffic:
    batches: tuple[TrafficBatch, ...]
    tuning: Tuning


@dataclass(frozen=True)
class LadderWaste:
    """Rows of a traffic sample packed on one ladder, weighted by counts."""

    replayed: int
    used: int
    """Rows of the replayed batches."""
    eager_rows: int
    """Rows of batches larger than every budget (run eagerly, unpadded)."""
    replays: int
    per_batch: tuple[int, ...] = ()
    """Per traffic batch (in order, one occurrence): the rows it costs, its
    replayed budgets plus its eagerly run rows."""

    @property
    def waste(self) -> float:
        """``replayed / used − 1`` (0 without replays)."""
        return self.replayed / self.used - 1.0 if self.used else 0.0

    def worse_than(self, other: LadderWaste) -> int:
        """How many batches cost more rows here than on ``other`` (the same
        batches packed on another ladder)."""
        return sum(a > b for a, b in zip(self.per_batch, other.per_batch, strict=True))


# ---------------------------------------------------------------------------
# Packing and tuning
# ---------------------------------------------------------------------------


def ladder_waste(
    batches: Sequence[TrafficBatch],
    budgets: Sequence[int],
    max_batch_size: int,
    eager_above: int | None = None,
) -> LadderWaste:
    """Pack every batch with the manager's packing on ``budgets``
    (:func:`~encoder_cudagraph_runtime.packing.packed_rows`, which the
    manager's own padding statistics are counted from). ``eager_above``: a
    unit replaying a larger budget runs eagerly instead (cost-aware
    execution, where graphs above the crossover only lose)."""
    budgets = sorted(budgets)
    replayed = used = eager = replays = 0
    per_batch = []
    for batch in batches:
        rows, keys = batch.packing_order()
        cost = 0
        for budget, tokens in packed_rows(rows, keys, budgets, max_batch_size):
            if budget is None or (eager_above is not None and budget > eager_above):
                eager += tokens * batch.count
                cost += tokens
                continue
            replayed += budget * batch.count
            used += tokens * batch.count
            replays += batch.count
            cost += budget
        per_batch.append(cost)
    return LadderWaste(replayed, used, eager, replays, tuple(per_batch))


def _round_up(value: int, granularity: int) -> int:
    return max(granularity, -(-value // granularity) * granularity)


def candidate_budgets(
    batches: Sequence[TrafficBatch], granularity: int, largest: int
) -> list[int]:
    """Every budget the tuner may add: the rows of every run of consecutive
    items of a batch in packing order (the only sizes a packed batch can
    have), rounded up to ``granularity``, below ``largest``."""
    out: set[int] = set()
    for batch in batches:
        unordered, keys = batch.packing_order()
        order = sorted(range(len(unordered)), key=keys.__getitem__)
        rows = [unordered[i] for i in order]
        for start in range(len(rows)):
            total = 0
            for size in rows[start:]:
                total += size
                budget = _round_up(total, granularity)
                if budget >= largest:
                    break
                out.add(budget)
    return sorted(out)


def _cost(waste: LadderWaste, replay_cost_rows: int) -> int:
    """The tuner's objective: padded rows, each replay counted as
    ``replay_cost_rows`` more."""
    return waste.replayed - waste.used + replay_cost_rows * waste.replays


def _candidates(
    batches: Sequence[TrafficBatch],
    budgets: list[int],
    max_batch_size: int,
    granularity: int,
    replay_cost_rows: int,
) -> list[int]:
    """Budgets worth evaluating, most promising first: the sizes where the
    current ladder pads (each packed unit, each item) and where two adjacent
    units could merge into one replay, scored by what they would save."""
    score: Counter[int] = Counter()

    def offer(size: int, current: int | None, count: int, replays_saved: int) -> None:
        if current is None:
            return
        candidate = _round_up(size, granularity)
        saved = current - candidate + replay_cost_rows * replays_saved
        if candidate < budgets[-1] and candidate not in budgets and saved > 0:
            score[candidate] += saved * count

    for batch in batches:
        rows, keys = batch.packing_order()
        units = pack_items([rows], keys, [budgets], max_batch_size)
        sizes = [u.path_tokens[0] for u in units]
        for size in sizes + rows:
            offer(size, smallest_fitting_budget(budgets, size), batch.count, 0)
        for a, b in zip(units, units[1:]):
            if len(a.indices) + len(b.indices) <= max_batch_size:
                pair = (a.path_budgets[0] or 0) + (b.path_budgets[0] or 0)
                total = a.path_tokens[0] + b.path_tokens[0]
                offer(total, pair or None, batch.count, 1)
    return [c for c, _ in score.most_common(_CANDIDATES_PER_STEP)]


#: Stress batches drawn per distinct batch of the sample, and the most items
#: they hold together (each admissibility check packs them all).
_STRESS_PER_BATCH = 16
_MAX_STRESS_ITEMS = 20_000


def stress_batches(
    batches: Sequence[TrafficBatch], max_batch_size: int, seed: int = 0
) -> list[TrafficBatch]:
    """Batches of the sample's items drawn anew (seeded): as many items as
    a batch of the sample has, each item drawn by its count. vLLM's packing
    is not monotone in the ladder (a finer budget can split a small item
    off a batch whose rest still needs the same large budget), so a ladder
    that serves the sample may cost an unsampled batch of the same
    distribution more rows than the default; these stand for those."""
    import random

    rng = random.Random(seed)
    pool = [(r, t) for b in batches for r, t in zip(b.rows, b.tokens or b.rows)]
    weights = [b.count for b in batches for _ in b.rows]
    sizes = [len(b.rows) for b in batches]
    counts = [b.count for b in batches]
    out: list[TrafficBatch] = []
    drawn = 0
    for size in rng.choices(sizes, weights=counts, k=_STRESS_PER_BATCH * len(batches)):
        items = rng.choices(pool, weights=weights, k=min(size, 4 * max_batch_size))
        drawn += len(items)
        if drawn > _MAX_STRESS_ITEMS:
            break
        rows, tokens = zip(*items)
        out.append(TrafficBatch(rows, 1, tokens))
    return out


def crossover_ladder(start: Sequence[int], crossover_rows: int | None) -> list[int]:
    """``start`` without the budgets that can only lose to eager: those
    above the first budget that reaches ``crossover_rows`` (every batch they
    would replay is larger than the crossover)."""
    ladder = sorted(start)
    if crossover_rows is None:
        return ladder
    reach = smallest_fitting_budget(ladder, crossover_rows)
    return ladder if reach is None else [b for b in ladder if b <= reach]


@dataclass(frozen=True)
class _Search:
    """What every step of :func:`tune_ladder` checks a trial ladder with."""

    batches: Sequence[TrafficBatch]
    mbs: int
    budget_bytes: Mapping[int, int]
    cap_bytes: float
    max_graphs: int
    replay_rows: int
    floor: float
    keep: frozenset[int]
    limits: LadderWaste
    """The start ladder's packing: no batch may cost more rows than here."""
    stress: Sequence[TrafficBatch]
    """Batches of the sample's items recombined (:func:`stress_batches`),
    held to the same rule."""
    stress_limits: LadderWaste

    def over(self, ladder: list[int]) -> bool:
        return (
            len(ladder) > self.max_graphs
            or sum(self.budget_bytes[b] for b in ladder) > self.cap_bytes
        )

    def admissible(self, trial: LadderWaste, ladder: list[int]) -> bool:
        """No batch of the sample, nor of the stress batches, costs more
        rows on ``ladder`` (whose packing of the sample is ``trial``) than
        on the start ladder."""
        if trial.worse_than(self.limits):
            return False
        stressed = ladder_waste(self.stress, ladder, self.mbs)
        return stressed.worse_than(self.stress_limits) == 0

    def waste(self, ladder: list[int]) -> LadderWaste:
        return ladder_waste(self.batches, ladder, self.mbs)

    def cost(self, waste: LadderWaste) -> int:
        return _cost(waste, self.replay_rows)


def tune_ladder(
    batches: Sequence[TrafficBatch],
    *,
    start: Sequence[int],
    max_batch_size: int,
    budget_bytes: Mapping[int, int],
    cap_bytes: float,
    max_graphs: int,
    replay_cost_rows: int = 0,
) -> list[int]:
    """Local search from the ladder ``start`` (vLLM's default ladder for
    the spec's range, budgets rounded up to multiples of ``max_batch_size``
    so the capture dummies hold exactly the budget). The objective is padded
    rows plus ``replay_cost_rows`` per replay, under vLLM's packing; the
    constraints keep the answer safe for a vLLM user:

    * every budget of ``start`` stays (unless the memory cap or
      ``max_graphs`` force one out): a batch of the traffic that was not
      sampled still finds the budget vLLM's default ladder gives it, or a
      smaller one the tuner added; a ladder of one giant budget cannot
      come out;
    * no batch of the sample costs more rows (replayed budgets plus eager
      rows) than on ``start``.

    Rounds of: add the candidate that lowers the objective most while the
    buffers (``budget_bytes``) fit ``cap_bytes`` and the graphs
    ``max_graphs``; then drop added budgets whose loss stays under
    ``_MIN_GAIN`` of the used rows (or that the limits force out)."""
    ladder = sorted({_round_up(b, max_batch_size) for b in start})
    current = ladder_waste(batches, ladder, max_batch_size)
    stress = stress_batches(batches, max_batch_size)
    search = _Search(
        batches,
        max_batch_size,
        budget_bytes,
        cap_bytes,
        max_graphs,
        replay_cost_rows,
        _MIN_GAIN * max(current.used, 1),
        frozenset(ladder),
        current,
        stress,
        ladder_waste(stress, ladder, max_batch_size),
    )
    for _ in range(8):
        ladder, current, added = _add_budgets(search, ladder, current)
        ladder, current, dropped = _drop_budgets(search, ladder, current)
        if not added and not dropped:
            break
    return ladder


def _add_budgets(
    search: _Search, ladder: list[int], current: LadderWaste
) -> tuple[list[int], LadderWaste, bool]:
    """Add the best admissible candidate while one saves more than the
    search's floor."""
    added = False
    while len(ladder) < search.max_graphs:
        best: tuple[int, int, LadderWaste] | None = None
        mbs = search.mbs
        for candidate in _candidates(
            search.batches, ladder, mbs, mbs, search.replay_rows
        ):
            trial_ladder = sorted([*ladder, candidate])
            if search.over(trial_ladder):
                continue
            trial = search.waste(trial_ladder)
            gain = search.cost(current) - search.cost(trial)
            if (best is not None and gain <= best[0]) or gain <= search.floor:
                continue
            if not search.admissible(trial, trial_ladder):
                continue
            if best is None or gain > best[0]:
                best = (gain, candidate, trial)
        if best is None or best[0] <= search.floor:
            break
        ladder = sorted([*ladder, best[1]])
        current = best[2]
        added = True
    return ladder, current, added


def _drop_budgets(
    search: _Search, ladder: list[int], current: LadderWaste
) -> tuple[list[int], LadderWaste, bool]:
    """Drop the added budget whose loss is least while it is under the
    floor and the sample stays admissible; while the ladder is over its
    limits, drop the least loss of any budget (never the largest)."""
    dropped = False
    while len(ladder) > 1:
        over = search.over(ladder)
        best: tuple[int, int, LadderWaste] | None = None
        for budget in ladder[:-1]:
            if budget in search.keep and not over:
                continue
            trial_ladder = [b for b in ladder if b != budget]
            trial = search.waste(trial_ladder)
            if not over and not search.admissible(trial, trial_ladder):
                continue
            loss = search.cost(trial) - search.cost(current)
            if best is None or loss < best[0]:
                best = (loss, budget, trial)
        if best is None or (best[0] > search.floor and not over):
            break
        ladder = [b for b in ladder if b != best[1]]
        current = best[2]
        dropped = True
    return ladder, current, dropped


# ---------------------------------------------------------------------------
# The traffic file
# ---------------------------------------------------------------------------

_TOP_KEYS = {"format", "batches", "tuning", "spec", "source", "note"}
_TUNING_KEYS = {
    "capture_memory_mib",
    "crossover_rows",
    "max_budget",
    "max_graphs",
    "output_row_bytes",
    "replay_cost_rows",
}


class _TooManyProblems(Exception):
    """:data:`~generator.limits.MAX_TRAFFIC_PROBLEMS` problems found: the
    check stops there."""


class _Problems:
    """Problems found on the plain JSON data, located afterwards."""

    def __init__(self) -> None:
        self.items: list[tuple[tuple[str | int, ...], str, str, bool]] = []

    def add(
        self, path: tuple[str | int, ...], message: str, *, at_key: bool = False
    ) -> None:
        """A problem with the value at ``path`` (``at_key``: with its key);
        raises :class:`_TooManyProblems` once the cap is reached."""
        self.items.append((path, _field(path), message, at_key))
        if len(self.items) >= MAX_TRAFFIC_PROBLEMS:
            raise _TooManyProblems


def _field(path: tuple[str | int, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


class _OutOfRange:
    """A JSON integer beyond int64, kept as its text (never converted: a
    4,000-digit count overflowed the tuner's floats)."""

    def __init__(self, text: str) -> None:
        self.text = text


_OUT_OF_RANGE = f"number out of range (expected at most {MAX_INTEGER} in magnitude)"


def _json_int(text: str) -> int | _OutOfRange:
    if len(text) > 20:  # beyond int64 whatever the digits
        return _OutOfRange(text)
    value = int(text)
    return value if abs(value) <= MAX_INTEGER else _OutOfRange(text)


class _Object(dict):
    """A JSON object; ``repeated``: the keys it gives more than once (a dict
    keeps the last silently)."""

    repeated: tuple[str, ...] = ()


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.repeated = tuple(k for k, _ in pairs if k in seen or seen.add(k))
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_problem(value: Any, low: int, what: str, high: int = MAX_INTEGER) -> str:
    """Why ``value`` is not an integer in ``low..high`` ("" when it is)."""
    if isinstance(value, _OutOfRange):
        return _OUT_OF_RANGE
    if not _is_int(value) or not low <= value <= high:
        return what
    return ""


def _check_keys(
    obj: dict[str, Any],
    where: tuple[str | int, ...],
    known: set[str] | frozenset[str],
    expected: str,
    problems: _Problems,
) -> None:
    """Unknown and repeated keys of one JSON object, in file order (the
    check stops at the problem cap, however many keys there are)."""
    for key in dict.fromkeys(getattr(obj, "repeated", ())):
        problems.add((*where, key), _REPEATED, at_key=True)
    for key in obj:
        if key not in known:
            problems.add((*where, key), expected, at_key=True)


def load_traffic(
    path: Path,
    dims: Sequence[str],
    budget_tokens: Callable[[dict[str, int]], int],
    required: Sequence[str] | None = None,
    output_tokens: Callable[[dict[str, int]], int | None] | None = None,
) -> Traffic:
    """Read and check a traffic file whose items give ``dims`` (all of
    ``required``, default every dim); ``budget_tokens`` turns one item into
    budget tokens (it may raise :class:`EvaluationError`), ``output_tokens``
    into output tokens, vLLM's packing order (``None`` when the item lacks
    what it needs: the batch is then ordered by budget tokens). Raises
    :class:`SpecError` with every problem located (at most
    :data:`~generator.limits.MAX_TRAFFIC_PROBLEMS`)."""
    name = str(path)
    text = _read_traffic(path, name)
    try:
        data = json.loads(text, parse_int=_json_int, object_pairs_hook=_json_object)
    except json.JSONDecodeError as exc:
        where = Location(name, exc.lineno, exc.colno)
        raise SpecError([Diagnostic(where, "", f"not JSON: {exc.msg}")]) from None
    except RecursionError:
        raise _file_problem(name, "nested too deeply") from None
    problems = _Problems()
    needed = set(dims if required is None else required)
    try:
        traffic = _check(
            data, (set(dims) | needed, needed), (budget_tokens, output_tokens), problems
        )
    except _TooManyProblems:
        traffic = None
    if problems.items:
        raise SpecError(_locate(text, name, data, problems))
    assert traffic is not None
    return traffic


_Counters = tuple[
    Callable[[dict[str, int]], int], Callable[[dict[str, int]], int | None] | None
]


def _file_problem(name: str, message: str, field: str = "") -> SpecError:
    return SpecError([Diagnostic(Location(name, 1, 1), field, message)])


def _read_traffic(path: Path, name: str) -> str:
    """The file's text, read up to :data:`~generator.limits.MAX_TRAFFIC_BYTES`
    (a device such as ``/dev/zero`` is refused, not read to the end)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TRAFFIC_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise _file_problem(name, f"cannot read: {exc}") from None
    if len(raw) > MAX_TRAFFIC_BYTES:
        raise _file_problem(
            name, f"larger than {MAX_TRAFFIC_BYTES // 2**20} MiB (a sample needs less)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _file_problem(name, f"cannot read: {exc}") from None


def _check(
    data: Any,
    dims: tuple[set[str], set[str]],
    counters: _Counters,
    problems: _Problems,
) -> Traffic | None:
    if not isinstance(data, dict):
        problems.add((), "a traffic file is a JSON object with 'batches'")
        return None
    _check_keys(
        data,
        (),
        _TOP_KEYS,
        f"unknown key (expected: {', '.join(sorted(_TOP_KEYS))})",
        problems,
    )
    if data.get("format", FORMAT) != FORMAT:
        problems.add(("format",), f"expected {FORMAT!r}")
    raw = data.get("batches")
    if not isinstance(raw, list) or not raw:
        problems.add(("batches",), "a non-empty list of batches is required")
        raw = []
    elif (too_many := _too_many(raw)) is not None:
        problems.add(("batches",), too_many)
        raw = []
    batches = [
        b
        for i, entry in enumerate(raw)
        if (b := _check_batch(entry, ("batches", i), dims, counters, problems))
    ]
    tuning = _check_tuning(data.get("tuning", {}), problems)
    # Packing depends on a batch's sizes only: equal batches are one entry.
    counts: Counter[tuple[tuple[int, int], ...]] = Counter()
    for batch in batches:
        tokens = batch.tokens or (0,) * len(batch.rows)
        counts[batch.packing_key()] += batch.count
    merged = []
    for items, n in counts.items():
        tokens, rows = zip(*items)
        merged.append(TrafficBatch(rows, n, tokens if any(tokens) else ()))
    if (too_varied := _too_varied(merged)) is not None:
        problems.add(("batches",), too_varied)
    return Traffic(tuple(merged), tuning)


def _too_many(batches: list[Any]) -> str | None:
    """Why the file has too many items to check (counted before any item
    is), or None."""
    items = 0
    for entry in batches:
        listed = entry.get("items") if isinstance(entry, dict) else entry
        items += len(listed) if isinstance(listed, list) else 0
    if items > MAX_TRAFFIC_ITEMS:
        return (
            f"{items} items (at most {MAX_TRAFFIC_ITEMS}; give a repeated batch "
            "once with its count)"
        )
    return None


def _too_varied(merged: list[TrafficBatch]) -> str | None:
    """Why the distinct batches are too many to tune on, or None."""
    items = sum(len(b.rows) for b in merged)
    if len(merged) > MAX_DISTINCT_TRAFFIC_BATCHES or items > MAX_DISTINCT_TRAFFIC_ITEMS:
        return (
            f"{len(merged)} distinct batches of {items} items (at most "
            f"{MAX_DISTINCT_TRAFFIC_BATCHES} and {MAX_DISTINCT_TRAFFIC_ITEMS}): "
            "tuning packs each on every candidate ladder; a smaller sample"
        )
    return None


def _check_batch(
    entry: Any,
    where: tuple[str | int, ...],
    dims: tuple[set[str], set[str]],
    counters: _Counters,
    problems: _Problems,
) -> TrafficBatch | None:
    budget_tokens, output_tokens = counters
    count = 1
    items = entry
    if isinstance(entry, dict):
        _check_keys(
            entry,
            where,
            _BATCH_KEYS,
            "unknown key (expected: count, items)",
            problems,
        )
        count = entry.get("count", 1)
        if problem := _int_problem(count, 1, "a positive integer"):
            problems.add((*where, "count"), problem)
            count = 1
        items = entry.get("items")
        where = (*where, "items")
    if not isinstance(items, list) or not items:
        problems.add(where, "a non-empty list of items")
        return None
    rows = []
    for j, item in enumerate(items):
        tokens = _check_item(item, (*where, j), dims, budget_tokens, problems)
        if tokens is not None:
            rows.append(tokens)
    if len(rows) != len(items):
        return None
    keys = [output_tokens(item) for item in items] if output_tokens else []
    order = tuple(k for k in keys if k is not None)
    return TrafficBatch(tuple(rows), count, order if len(order) == len(rows) else ())


_BATCH_KEYS = frozenset({"count", "items"})


def _check_item(
    item: Any,
    where: tuple[str | int, ...],
    dims: tuple[set[str], set[str]],
    budget_tokens: Callable[[dict[str, int]], int],
    problems: _Problems,
) -> int | None:
    allowed, required = dims
    expected = ", ".join(sorted(allowed))
    if not isinstance(item, dict):
        problems.add(where, f"an item is an object of grid dims ({expected})")
        return None
    before = len(problems.items)
    _check_keys(
        item, where, allowed, f"not a grid dim of the spec ({expected})", problems
    )
    for key in sorted(allowed & set(item)):
        if problem := _int_problem(item[key], 1, "a positive integer"):
            problems.add((*where, key), problem)
    for key in sorted(required - set(item)):
        problems.add(where, f"missing grid dim {key!r}")
    if len(problems.items) > before:
        return None
    try:
        tokens = budget_tokens(item)
    except EvaluationError as exc:
        problems.add(where, f"budget tokens: {exc}")
        return None
    if tokens < 1:
        problems.add(where, f"has {tokens} budget tokens; an item needs at least 1")
        return None
    return tokens


#: The largest ``tuning.capture_memory_mib``: int64 bytes.
_MAX_MIB = MAX_INTEGER // 2**20


def _check_tuning(raw: Any, problems: _Problems) -> Tuning:
    if not isinstance(raw, dict):
        problems.add(("tuning",), "an object")
        return Tuning()
    _check_keys(
        raw,
        ("tuning",),
        _TUNING_KEYS,
        f"unknown key (expected: {', '.join(sorted(_TUNING_KEYS))})",
        problems,
    )
    cap = raw.get("capture_memory_mib")
    if isinstance(cap, _OutOfRange):
        problems.add(("tuning", "capture_memory_mib"), _OUT_OF_RANGE)
        cap = None
    elif cap is not None and (
        not isinstance(cap, (int, float))
        or isinstance(cap, bool)
        or not 0 < cap <= _MAX_MIB
    ):
        problems.add(
            ("tuning", "capture_memory_mib"),
            f"a positive number, at most {_MAX_MIB} (int64 bytes)",
        )
        cap = None
    graphs = raw.get("max_graphs", Tuning.max_graphs)
    if problem := _int_problem(graphs, 1, "an integer in 1..1024", 1024):
        problems.add(("tuning", "max_graphs"), problem)
        graphs = Tuning.max_graphs
    row_bytes = raw.get("output_row_bytes", 0)
    if problem := _int_problem(row_bytes, 0, "a non-negative integer"):
        problems.add(("tuning", "output_row_bytes"), problem)
        row_bytes = 0
    replay_rows = raw.get("replay_cost_rows")
    if replay_rows is not None and (
        problem := _int_problem(replay_rows, 0, "a non-negative integer")
    ):
        problems.add(("tuning", "replay_cost_rows"), problem)
        replay_rows = None
    max_budget = raw.get("max_budget")
    if max_budget is not None and (
        problem := _int_problem(
            max_budget,
            1,
            f"a positive integer, at most {MAX_TUNED_BUDGET}",
            MAX_TUNED_BUDGET,
        )
    ):
        problems.add(("tuning", "max_budget"), problem)
        max_budget = None
    crossover = raw.get("crossover_rows")
    if crossover is not None and (
        problem := _int_problem(crossover, 1, "a positive integer")
    ):
        problems.add(("tuning", "crossover_rows"), problem)
        crossover = None
    return Tuning(cap, graphs, row_bytes, replay_rows, max_budget, crossover)


def _locate(text: str, name: str, data: Any, problems: _Problems) -> list[Diagnostic]:
    """Diagnostics at the position of each problem: the value's, the key's
    for an unknown or repeated key (a repeated one at its second place,
    naming the first), the nearest enclosing value's for a missing one."""
    targets = [(path, _existing(data, path), *rest) for path, *rest in problems.items]
    wanted: dict[tuple[str | int, ...], int] = {}
    for _, target, _, message, _ in targets:
        wanted[target] = max(wanted.get(target, 1), 2 if message == _REPEATED else 1)
    found = _json_positions(text, wanted)
    out = []
    for path, target, field, message, at_key in targets:
        places = found.get(target) or [(0, 0)]
        key_at, value_at = places[0]
        at = key_at if at_key and target == path else value_at
        if message == _REPEATED and len(places) > 1:
            first = _location(text, name, key_at)
            message = (
                f"{_REPEATED} (first given at line {first.line}, column {first.col})"
            )
            at = places[1][0]
        out.append(Diagnostic(_location(text, name, at), field, message))
    return sorted(out)


_REPEATED = "duplicate key"


def _existing(data: Any, path: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """The longest beginning of ``path`` that names a value of ``data``."""
    node, out = data, ()
    for part in path:
        if isinstance(part, str) and isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(part, int) and isinstance(node, list) and part < len(node):
            node = node[part]
        else:
            break
        out = (*out, part)
    return out


def _location(text: str, name: str, offset: int) -> Location:
    line_start = text.rfind("\n", 0, offset) + 1
    return Location(name, text.count("\n", 0, offset) + 1, offset - line_start + 1)


_SPACE = re.compile(r"[ \t\n\r]*")


class _Found(Exception):
    """Every wanted position is found: the walk stops."""


def _json_positions(
    text: str, wanted: dict[tuple[str | int, ...], int]
) -> dict[tuple[str | int, ...], list[tuple[int, int]]]:
    """``path -> [(key offset, value offset), ...]`` for the first ``wanted
    [path]`` places of each path (a key repeated has several). One walk of
    the text, which descends only towards the wanted paths (a value off
    them is skipped by the JSON module's C scanner) and stops once every one
    is found: far cheaper than a second parse keeping positions."""
    decoder = json.JSONDecoder(parse_int=_json_int)
    prefixes = {path[:depth] for path in wanted for depth in range(len(path) + 1)}
    found: dict[tuple[str | int, ...], list[tuple[int, int]]] = {}
    missing = set(wanted)

    def space(i: int) -> int:
        return _SPACE.match(text, i).end()  # type: ignore[union-attr]

    def seen(path: tuple[str | int, ...], key_at: int, value_at: int) -> None:
        if path in wanted:
            found.setdefault(path, []).append((key_at, value_at))
            if len(found[path]) >= wanted[path]:
                missing.discard(path)
                if not missing:
                    raise _Found

    def walk(i: int, path: tuple[str | int, ...]) -> int:
        """The offset past the value at ``i``."""
        if path not in prefixes or text[i] not in "{[":
            return decoder.raw_decode(text, i)[1]
        closing = "}" if text[i] == "{" else "]"
        i, index = space(i + 1), 0
        while text[i] != closing:
            key_at = i
            if closing == "}":
                key, i = decoder.raw_decode(text, i)
                child: tuple[str | int, ...] = (*path, key)
                i = space(space(i) + 1)  # past the colon
            else:
                child, index = (*path, index), index + 1
            seen(child, key_at, i)
            i = space(walk(i, child))
            if text[i] == ",":
                i = space(i + 1)
        return i + 1

    start = space(0)
    try:
        seen((), start, start)
        walk(start, ())
    except _Found:
        pass
    return found


# ---------------------------------------------------------------------------
# gen-mixin plan --traffic
# ---------------------------------------------------------------------------


def spec_traffic(spec: Any, overrides: Mapping[str, int], path: Path) -> Traffic:
    """The traffic file ``path`` read for ``spec`` (with the ``--set``
    values ``overrides``): each item's rows by the spec's budget formula
    (``items.budget_tokens``, else ``items.output_tokens``), its sort key by
    ``items.output_tokens``, as the generated mixin's item specs count them.
    Raises :class:`SpecError`."""
    from generator.static_checks import constant_env

    sizes = {size.name: size.value for size in spec.sizes}
    env = {**constant_env(spec, overrides), **sizes, **overrides}
    per_item = spec.items
    formula = (
        per_item.budget_tokens
        if per_item.budget_tokens is not None
        else per_item.output_tokens
    )
    required = sorted(names_in(formula) - set(env))
    grid_dims = sorted({d for i in spec.item_inputs for d in i.dims} | set(required))
    derived = [(dim, f) for i in spec.item_inputs for dim, f in i.equals]

    def output_tokens(item: dict[str, int]) -> int | None:
        """The item's output tokens, vLLM's packing order, by the spec's
        formula; dims an ``equals`` derives (DeepSeek-V4.1's merged grid)
        are derived when the item leaves them out, as the mixin's inputs
        hold them."""
        values = {**env, **item}
        try:
            for dim, f in derived:
                if dim not in values and names_in(f) <= set(values):
                    values[dim] = evaluate(f, values)
            if not names_in(per_item.output_tokens) <= set(values):
                return None
            return evaluate(per_item.output_tokens, values)
        except EvaluationError:
            return None

    return load_traffic(
        path,
        grid_dims,
        lambda item: evaluate(formula, {**env, **item}),
        required,
        output_tokens,
    )


def traffic_main(
    spec: Any,
    plan: Any,
    args: Any,
    overrides: Mapping[str, int],
    sized_plan: Callable[[list[int], int], Any],
) -> int:
    """Tune the ladder of ``plan`` (``gen-mixin plan``'s result for ``spec``
    and its arguments, with the ``--set`` values ``overrides``) to
    ``args.traffic`` and print the recommendation. ``sized_plan(budgets,
    max_items)``: the plan of the same spec and arguments for another ladder
    (it raises ``PlanError``, which ``plan`` reports)."""
    from generator.command_line import EXIT_INVALID, EXIT_OK, print_spec_error

    try:
        traffic = spec_traffic(spec, overrides, args.traffic)
    except SpecError as err:
        print_spec_error(err)
        return EXIT_INVALID

    largest = traffic.tuning.max_budget or plan.budgets[-1]
    if largest < plan.budget_range[0]:
        print_spec_error(
            _file_problem(
                str(args.traffic),
                f"{largest} is below the spec's minimum budget "
                f"{plan.budget_range[0]}",
                "tuning.max_budget",
            )
        )
        return EXIT_INVALID
    # The default ladder's items per batch: vLLM's packing then closes
    # batches where it does on the default ladder (tune_ladder).
    items = min(plan.max_batch_size, largest)
    replay_rows = (
        traffic.tuning.replay_cost_rows
        if traffic.tuning.replay_cost_rows is not None
        else plan.budget_range[0]
    )
    row_bytes = traffic.tuning.output_row_bytes

    def plan_bytes(budgets: list[int], max_items: int) -> dict[int, int]:
        """Captured buffer bytes per budget, as plan sizes them (one plan
        for every budget: its static checks run once)."""
        sized = sized_plan(budgets, max_items)
        return {
            p.budget: p.total_bytes + row_bytes * p.budget for p in sized.per_budget
        }

    current_bytes = sum(plan_bytes(plan.budgets, plan.max_batch_size).values())
    start = crossover_ladder(
        generate_budgets(max(plan.budget_range[0], items), largest),
        traffic.tuning.crossover_rows,
    )
    universe = candidate_budgets(traffic.batches, items, start[-1])
    rounded = {_round_up(b, items) for b in start}
    budget_bytes = plan_bytes(sorted(set(universe) | rounded), items)
    cap = (
        traffic.tuning.capture_memory_mib * 2**20
        if traffic.tuning.capture_memory_mib is not None
        else 2 * current_bytes
    )
    tuned = tune_ladder(
        traffic.batches,
        start=start,
        max_batch_size=items,
        budget_bytes=budget_bytes,
        cap_bytes=cap,
        max_graphs=traffic.tuning.max_graphs,
        replay_cost_rows=replay_rows,
    )
    report = _report(
        plan,
        traffic,
        tuned,
        items,
        (current_bytes, sum(budget_bytes[b] for b in tuned)),
        cap,
        replay_rows,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return EXIT_OK


def _summary(
    w: LadderWaste, budgets: list[int], mbs: int, nbytes: int
) -> dict[str, Any]:
    return {
        "budgets": list(budgets),
        "max_vision_items_per_batch": mbs,
        "graphs": len(budgets),
        "buffer_bytes": nbytes,
        "rows_replayed": w.replayed,
        "rows_used": w.used,
        "eager_rows": w.eager_rows,
        "replays": w.replays,
        "waste": w.waste,
    }


def _packing(w: LadderWaste, current: LadderWaste) -> dict[str, Any]:
    """One packing's prediction for a ladder, against the current ladder
    under the same packing."""
    return {
        "waste": w.waste,
        "replays": w.replays,
        "rows_replayed": w.replayed,
        "rows_used": w.used,
        "eager_rows": w.eager_rows,
        "rows_total": sum(w.per_batch),
        "batches_worse_than_current": w.worse_than(current),
    }


def _report(
    plan: Any,
    traffic: Traffic,
    tuned: list[int],
    items: int,
    nbytes: tuple[int, int],
    cap: float,
    replay_rows: int,
) -> dict[str, Any]:
    batches = traffic.batches
    crossover = traffic.tuning.crossover_rows
    ladders = {
        "current": (plan.budgets, plan.max_batch_size),
        "tuned": (tuned, items),
    }
    vllm = {k: ladder_waste(batches, b, m) for k, (b, m) in ladders.items()}
    cost_aware = {
        k: ladder_waste(batches, b, m, eager_above=crossover)
        for k, (b, m) in ladders.items()
    }
    value = {
        "cudagraph_mm_encoder": True,
        "encoder_cudagraph_token_budgets": tuned,
        "encoder_cudagraph_max_vision_items_per_batch": items,
    }
    return {
        "spec": plan.spec,
        "budget_unit": plan.budget_unit,
        "budget_range": list(plan.budget_range),
        "traffic": {
            "batches": sum(b.count for b in batches),
            "items": sum(len(b.rows) * b.count for b in batches),
            "distinct_batches": len(batches),
        },
        "capture_memory_cap_bytes": cap,
        "replay_cost_rows": replay_rows,
        "replay_cost_rows_given": traffic.tuning.replay_cost_rows is not None,
        "crossover_rows": crossover,
        "max_budget": tuned[-1],
        "prediction_packing": "vllm",
        "current": _summary(
            vllm["current"], plan.budgets, plan.max_batch_size, nbytes[0]
        ),
        "tuned": _summary(vllm["tuned"], tuned, items, nbytes[1]),
        "packings": {
            "vllm": {k: _packing(w, vllm["current"]) for k, w in vllm.items()},
            "cost_aware": {
                k: _packing(w, cost_aware["current"]) for k, w in cost_aware.items()
            },
        },
        "compilation_config": value,
    }


def _replay_price_line(report: dict[str, Any]) -> str:
    """What the objective charged per replay, and where that came from: a
    price left at its default splits batches into more replays than pay."""
    price = f"a replay priced at {report['replay_cost_rows']} padded rows"
    if report["replay_cost_rows_given"]:
        return f"{price} (tuning.replay_cost_rows)"
    return (
        f"{price}: the spec's smallest budget, tuning.replay_cost_rows not given; "
        "a replay usually costs far more (DeepSeek-V4.1 on an H100: 1,236 "
        "patches). vLLM prints the measured price when the gen-mixin plugin "
        'calibrates (docs/using-in-vllm.md, "The tuner\'s flag")'
    )


def format_report(report: dict[str, Any]) -> str:
    unit = report["budget_unit"]
    lines = [
        f"spec: {report['spec']}",
        (
            f"traffic: {report['traffic']['batches']} batches, "
            f"{report['traffic']['items']} items (budgets count {unit})"
        ),
    ]
    for name in ("current", "tuned"):
        s = report[name]
        lines.append(
            f"{name} ladder: {s['graphs']} graphs, max items {s['max_vision_items_per_batch']}, "
            f"buffers {s['buffer_bytes'] / 2**20:.1f} MiB, expected padding waste "
            f"{100 * s['waste']:.1f}% ({s['rows_replayed']} rows replayed for "
            f"{s['rows_used']} used, {s['replays']} replays"
            + (f", {s['eager_rows']} rows eager" if s["eager_rows"] else "")
            + ")"
        )
        lines.append(f"  budgets: {s['budgets']}")
    lines.append(_replay_price_line(report))
    lines.append(
        f"capture memory cap: {report['capture_memory_cap_bytes'] / 2**20:.1f} MiB "
        "(captured input buffers, plus output rows when tuning.output_row_bytes is set)"
    )
    vllm = report["packings"]["vllm"]["tuned"]
    lines.append(
        f"batches costing more rows than on the current ladder: "
        f"{vllm['batches_worse_than_current']} (vLLM's packing)"
    )
    if report["crossover_rows"] is not None:
        aware = report["packings"]["cost_aware"]["tuned"]
        lines.append(
            f"cost-aware execution (units above the {report['crossover_rows']}-row "
            f"crossover eager): waste {100 * aware['waste']:.1f}%, "
            f"{aware['replays']} replays, {aware['eager_rows']} rows eager"
        )
    lines.append("")
    lines.append(
        "# predicted for vLLM's packing (what `vllm serve` runs with this flag):"
    )
    lines.append(
        "--compilation-config '" + json.dumps(report["compilation_config"]) + "'"
    )
    return "\n".join(lines)
