"""`gen-mixin plan SPEC --traffic FILE`: the predicted waste is the manager's,
the tuned ladder beats the default within its limits, and bad traffic files
get located problems."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from generator.diagnostics import SpecError
from generator.ladder_tuner import (
    TrafficBatch,
    crossover_ladder,
    ladder_waste,
    load_traffic,
    tune_ladder,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
OUT_OF_RANGE = "number out of range (expected at most 9223372036854775807 in magnitude)"


def random_batches(seed: int, n: int, sizes: list[int]) -> list[TrafficBatch]:
    rng = random.Random(seed)
    return [
        TrafficBatch(
            tuple(rng.choice(sizes) for _ in range(rng.choice([1, 1, 2, 3, 8])))
        )
        for _ in range(n)
    ]


def test_waste_counts_replayed_budgets_against_their_rows() -> None:
    # 540 -> 1024; 540 + 540 merge into one 2048 replay (deferring would
    # need 1024 + 1024 < 2048); 20000 is larger than any budget.
    batches = [
        TrafficBatch((540,), count=2),
        TrafficBatch((540, 540)),
        TrafficBatch((20000,)),
    ]
    waste = ladder_waste(batches, DEFAULT, 64)
    assert (waste.replayed, waste.used, waste.replays, waste.eager_rows) == (
        2 * 1024 + 2048,
        2 * 540 + 1080,
        3,
        20000,
    )
    assert waste.waste == pytest.approx(4096 / 2160 - 1)


class LinearBytes(dict):
    """Buffer bytes of any budget: 1000 per budget row."""

    def __missing__(self, budget: int) -> int:
        return 1000 * budget


linear_bytes = LinearBytes()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tuned_ladder_beats_the_default_within_its_limits(seed: int) -> None:
    batches = random_batches(seed, 200, [16, 180, 540, 576, 1196, 2304, 3136])
    cap = 3 * linear_bytes[16384]
    tuned = tune_ladder(
        batches,
        start=DEFAULT,
        max_batch_size=8,
        budget_bytes=linear_bytes,
        cap_bytes=cap,
        max_graphs=16,
    )
    assert set(DEFAULT) <= set(tuned) and len(tuned) <= 16
    assert sum(linear_bytes[b] for b in tuned) <= cap
    assert all(b % 8 == 0 and b >= 8 for b in tuned)
    default = ladder_waste(batches, DEFAULT, 8)
    waste = ladder_waste(batches, tuned, 8)
    # Few distinct sizes: the recombined stress batches refuse much.
    assert waste.waste < 0.8 * default.waste
    assert waste.worse_than(default) == 0


@pytest.mark.parametrize(
    ("batches", "cap", "expected"),
    [
        # One image size gets its own budget; the default's budgets stay.
        ([TrafficBatch((540,), count=10)], 1e12, sorted([*DEFAULT, 540])),
        # 3000 saves more rows but does not fit under the cap; 540 does.
        (
            [TrafficBatch((540,), count=10), TrafficBatch((3000,), count=10)],
            sum(linear_bytes[b] for b in DEFAULT) + linear_bytes[1000],
            sorted([*DEFAULT, 540]),
        ),
    ],
)
def test_budgets_added_to_the_default(
    batches: list[TrafficBatch], cap: float, expected: list[int]
) -> None:
    tuned = tune_ladder(
        batches,
        start=DEFAULT,
        max_batch_size=4,
        budget_bytes=linear_bytes,
        cap_bytes=cap,
        max_graphs=16,
    )
    assert tuned == expected


def test_a_budget_that_splits_a_small_item_off_is_refused() -> None:
    """vLLM's packing is not monotone in the ladder. On the default ladder
    [25, 49, 299, 540] (MiniMax M3 tokens) is one 1024 replay; with a 320
    budget the 74 rows of the two thumbnails defer (128 + 320 < 512) and
    the rest still needs 1024: 1152 rows. The sample's batch of one 299
    would gain 192 rows from 320; the stress batches (the same items
    recombined) include the split and refuse it."""
    split = TrafficBatch((25, 49, 299, 540))
    assert ladder_waste([split], [*DEFAULT[:3], 320, *DEFAULT[3:]], 64).per_batch == (
        128 + 1024,
    )
    batches = [TrafficBatch((299,), count=10), split]
    tuned = tune_ladder(
        batches,
        start=DEFAULT,
        max_batch_size=64,
        budget_bytes=linear_bytes,
        cap_bytes=1e12,
        max_graphs=16,
    )
    assert 320 not in tuned
    assert (
        ladder_waste(batches, tuned, 64).worse_than(ladder_waste(batches, DEFAULT, 64))
        == 0
    )


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "traffic.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1))
    return path


def tokens(item: dict[str, int]) -> int:
    return item["t"] * item["h"] * item["w"] // 4


def test_load_both_batch_forms(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "format": "gen-mixin-traffic/1",
            "batches": [
                {"count": 3, "items": [{"t": 1, "h": 40, "w": 54}]},
                [{"t": 1, "h": 16, "w": 16}, {"t": 1, "h": 4, "w": 4}],
            ],
            "tuning": {"capture_memory_mib": 512, "max_graphs": 8},
        },
    )
    traffic = load_traffic(path, ["t", "h", "w"], tokens)
    # Items of a batch are kept sorted (packing sorts them anyway).
    assert traffic.batches == (TrafficBatch((540,), 3), TrafficBatch((4, 64), 1))
    assert (traffic.tuning.capture_memory_mib, traffic.tuning.max_graphs) == (512, 8)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[1]", ["traffic.json:1:1: a traffic file is a JSON object with 'batches'"]),
        ('{"batches": [', ["traffic.json:1:14: not JSON: Expecting value"]),
        (
            '{"batches": [{"count": 0, "items": [{"t": 1, "h": 4, "x": 4}]}]}',
            [
                "traffic.json:1:24: batches[0].count: a positive integer",
                "traffic.json:1:37: batches[0].items[0]: missing grid dim 'w'",
                "traffic.json:1:54: batches[0].items[0].x: not a grid dim of the spec (h, t, w)",
            ],
        ),
        (
            '{"batches": [[{"t": true, "h": 4, "w": 4}]], "tuning": {"max_graph": 2}}',
            [
                "traffic.json:1:21: batches[0][0].t: a positive integer",
                (
                    "traffic.json:1:57: tuning.max_graph: unknown key (expected: "
                    "capture_memory_mib, crossover_rows, max_budget, max_graphs, "
                    "output_row_bytes, replay_cost_rows)"
                ),
            ],
        ),
        (
            '{"batches": [[{"t": 1, "h": 4, "w": 4}]], "tuning": {"max_budget": 0}}',
            [
                "traffic.json:1:68: tuning.max_budget: a positive integer, at most 16777216"
            ],
        ),
        (
            # Blamed on the spec's items.input_size before.
            '{"batches": [[{"t": 1, "h": 4, "w": 4}]], "tuning": {"max_budget": %d}}'
            % 2**62,
            [
                "traffic.json:1:68: tuning.max_budget: a positive integer, at most 16777216"
            ],
        ),
        (
            # A cap of inf bytes, printed as JSON's invalid Infinity, before.
            '{"batches": [[{"t": 1, "h": 4, "w": 4}]], "tuning": {"capture_memory_mib": 1e300}}',
            [
                "traffic.json:1:76: tuning.capture_memory_mib: a positive number, at "
                "most 8796093022207 (int64 bytes)"
            ],
        ),
        (
            # An OverflowError traceback before.
            '{"batches": [{"count": %s, "items": [{"t": 1, "h": 4, "w": 4}]}]}'
            % ("9" * 4000),
            [f"traffic.json:1:24: batches[0].count: {OUT_OF_RANGE}"],
        ),
        (
            '{"batches": [[{"t": 1, "h": 4, "w": %d}]], "tuning": {"output_row_bytes": -%s}}'
            % (2**63, "9" * 4000),
            [
                f"traffic.json:1:37: batches[0][0].w: {OUT_OF_RANGE}",
                f"traffic.json:1:92: tuning.output_row_bytes: {OUT_OF_RANGE}",
            ],
        ),
        (
            # Accepted silently before (the last value kept).
            '{"batches": [[{"t": 1, "h": 4, "w": 4, "h": 8}]],\n "tuning": {}, "tuning": {}}',
            [
                "traffic.json:1:40: batches[0][0].h: duplicate key (first given at "
                "line 1, column 24)",
                "traffic.json:2:16: tuning: duplicate key (first given at line 2, "
                "column 2)",
            ],
        ),
        (
            '{"batches": []}',
            ["traffic.json:1:13: batches: a non-empty list of batches is required"],
        ),
        (
            '{"batches": [[{"t": 1, "h": 1, "w": 1}]]}',
            [
                "traffic.json:1:15: batches[0][0]: has 0 budget tokens; an item needs at least 1"
            ],
        ),
    ],
)
def test_bad_files_get_located_problems(
    tmp_path: Path, text: str, expected: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_traffic(path, ["t", "h", "w"], tokens)
    got = [str(d).replace(str(tmp_path) + "/", "") for d in info.value.diagnostics]
    assert got == expected


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "generator.cli", "plan", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


def test_cli_prints_a_ready_compilation_config(tmp_path: Path) -> None:
    batches = [{"count": 5, "items": [{"t": 1, "h": 40, "w": 54}] * 2}]
    path = write(tmp_path, {"batches": batches, "tuning": {"max_graphs": 10}})
    spec = str(ROOT / "specs" / "minimax_m3.yaml")
    limits = ["--max-num-batched-tokens", "16384", "--max-model-len", "16384"]
    proc = run_plan(spec, *limits, "--traffic", str(path))
    assert proc.returncode == 0, proc.stderr
    flag = next(
        l for l in proc.stdout.splitlines() if l.startswith("--compilation-config")
    )
    value = json.loads(flag.split("'")[1])
    report = json.loads(
        run_plan(spec, *limits, "--traffic", str(path), "--json").stdout
    )
    assert value == report["compilation_config"]
    # The default ladder's items per batch (64): vLLM's packing of a batch
    # of up to 64 items is then bounded by the default's.
    assert value["encoder_cudagraph_max_vision_items_per_batch"] == 64
    assert value["encoder_cudagraph_token_budgets"][-1] == 16384
    # Two 540-token photos: one 1088 replay (whole items of 64 rows per
    # capture dummy); the default ladder replays 2048.
    assert report["tuned"]["budgets"] == sorted([*DEFAULT, 1088])
    assert report["tuned"]["waste"] == pytest.approx(1088 / 1080 - 1)
    assert report["current"]["waste"] == pytest.approx(2048 / 1080 - 1)
    assert report["current"]["budgets"] == DEFAULT


@pytest.mark.parametrize(
    ("tuning", "line"),
    [
        ({}, "a replay priced at 64 padded rows: the spec's smallest budget, "),
        (
            {"replay_cost_rows": 270},
            "a replay priced at 270 padded rows (tuning.replay_cost_rows)",
        ),
    ],
)
def test_cli_says_what_a_replay_was_priced_at(
    tmp_path: Path, tuning: dict[str, int], line: str
) -> None:
    batches = [{"count": 5, "items": [{"t": 1, "h": 40, "w": 54}] * 2}]
    path = write(tmp_path, {"batches": batches, "tuning": tuning})
    spec = str(ROOT / "specs" / "minimax_m3.yaml")
    proc = run_plan(spec, "--traffic", str(path))
    assert proc.returncode == 0, proc.stderr
    assert [l for l in proc.stdout.splitlines() if l.startswith(line)], proc.stdout


def test_cli_bad_traffic_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, {"batches": [[{"t": 1, "h": 4}]]})
    proc = run_plan(str(ROOT / "specs" / "minimax_m3.yaml"), "--traffic", str(path))
    assert proc.returncode == 2
    assert "batches[0][0]: missing grid dim 'w'" in proc.stderr
    assert proc.stdout == ""


def test_deepseek_items_need_only_the_dims_its_budget_counts(tmp_path: Path) -> None:
    # Budgets count patches (h * w): the aligner grid may be left out.
    path = write(
        tmp_path,
        {"batches": [[{"h": 62, "w": 93}, {"h": 39, "w": 39, "lh": 13, "lw": 13}]]},
    )
    proc = run_plan(
        str(ROOT / "specs" / "deepseek_v41.yaml"), "--traffic", str(path), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["tuned"]["rows_used"] == 62 * 93 + 39 * 39


def test_packing_follows_output_tokens(tmp_path: Path) -> None:
    """vLLM packs in ascending output tokens. A 3 x 131 DeepSeek-V4.1 grid
    has more patches (393) than a 19 x 20 one (380) but fewer tokens (47
    against 58): it opens the batch at 400, and the 380 then merges into
    2048 (deferring needs b(380) >= b(393)). Given in patches only, the
    aligner grid is derived as the mixin's input checks demand
    (``llm_grid.equals``), and the order is the same."""
    wide, square = {"h": 3, "w": 131}, {"h": 19, "w": 20}
    spec = str(ROOT / "specs" / "deepseek_v41.yaml")
    ladder = ["--budgets", "384", "400", "2048", "--max-items", "2"]
    waste = {}
    for with_tokens in (True, False):
        items = [dict(wide), dict(square)]
        if with_tokens:
            items[0].update(lh=1, lw=44)
            items[1].update(lh=7, lw=7)
        path = write(tmp_path, {"batches": [items]})
        proc = run_plan(spec, *ladder, "--traffic", str(path), "--json")
        assert proc.returncode == 0, proc.stderr
        waste[with_tokens] = json.loads(proc.stdout)["current"]["waste"]
    assert waste[True] == waste[False] == pytest.approx(2048 / 773 - 1)


def test_max_budget_holds_batches_in_one_replay(tmp_path: Path) -> None:
    """Two 4032x3024 photos are 2 x 8748 DeepSeek-V4.1 patches. vLLM's range
    for this mixin ends at r*r*16384 = 147456 patches: the pair is one
    replay; a top budget of 16384 would replay each alone."""
    photo = {"h": 108, "w": 81}
    spec = str(ROOT / "specs" / "deepseek_v41.yaml")
    limits = ["--max-num-batched-tokens", "16384", "--max-model-len", "16384"]
    reports = {}
    for max_budget in (None, 16384):
        tuning = {"replay_cost_rows": 1100}
        if max_budget:
            tuning["max_budget"] = max_budget
        batches = [{"count": 5, "items": [photo, photo]}]
        path = write(tmp_path, {"batches": batches, "tuning": tuning})
        proc = run_plan(spec, *limits, "--traffic", str(path), "--json")
        assert proc.returncode == 0, proc.stderr
        reports[max_budget] = json.loads(proc.stdout)
    assert reports[16384]["tuned"]["replays"] == 10
    assert reports[16384]["max_budget"] == 16384
    wide = reports[None]
    assert wide["current"]["budgets"][-1] == wide["max_budget"] == 147456
    assert wide["tuned"]["replays"] == 5
    # 17496 rounded up to whole items (64) per capture dummy.
    assert 17536 in wide["tuned"]["budgets"]
    assert wide["tuned"]["waste"] == pytest.approx(17536 / 17496 - 1)


def test_several_encoder_paths_exit_2(tmp_path: Path) -> None:
    """Step3-VL's paths each double from their own minimum: a tuned global
    ladder would not be what they capture (it crashed on the sizes)."""
    path = write(tmp_path, {"batches": [[{"np": 30}, {"np": 6}], [{"np": 2}]]})
    proc = run_plan(str(ROOT / "specs" / "step3_vl.yaml"), "--traffic", str(path))
    assert proc.returncode == 2, proc.stderr
    assert (
        "--traffic: the ladder tuner handles one encoder path; this spec has 2 "
        "(global, local)" in proc.stderr
    )
    assert proc.stdout == ""


def test_max_budget_below_the_minimum_exits_2(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"batches": [[{"h": 8, "w": 8}]], "tuning": {"max_budget": 32}},
    )
    proc = run_plan(str(ROOT / "specs" / "deepseek_v41.yaml"), "--traffic", str(path))
    assert proc.returncode == 2
    assert "tuning.max_budget: 32 is below the spec's minimum budget 64" in proc.stderr


def test_equal_batches_are_counted_once(tmp_path: Path) -> None:
    item_a, item_b = {"t": 1, "h": 4, "w": 4}, {"t": 1, "h": 8, "w": 8}
    path = write(
        tmp_path,
        {"batches": [[item_a, item_b], {"count": 2, "items": [item_b, item_a]}]},
    )
    traffic = load_traffic(path, ["t", "h", "w"], tokens)
    assert traffic.batches == (TrafficBatch((4, 16), 3),)


def _dumps(value: object, rng: random.Random) -> str:
    """JSON of ``value`` (objects as lists of pairs, so that a key may
    repeat) with random whitespace around every token."""

    def space() -> str:
        return rng.choice(["", " ", "\n", "\n  ", "\t", "\r\n "])

    if isinstance(value, tuple):  # an object: ((key, value), ...)
        parts = [
            f"{json.dumps(k)}{space()}:{space()}{_dumps(v, rng)}" for k, v in value
        ]
        return "{" + space() + f"{space()},{space()}".join(parts) + space() + "}"
    if isinstance(value, list):
        parts = [_dumps(v, rng) for v in value]
        return "[" + space() + f"{space()},{space()}".join(parts) + space() + "]"
    return json.dumps(value)


def _at(text: str, diagnostic) -> str:
    lines = text.split("\n")
    return lines[diagnostic.location.line - 1][diagnostic.location.col - 1 :]


@pytest.mark.parametrize("seed", range(40))
def test_problems_are_located_at_their_text(tmp_path: Path, seed: int) -> None:
    """Wherever a problem sits and however the file is laid out, its line
    and column point at the key or value at fault (a repeated key: at its
    second place, the message at its first)."""
    rng = random.Random(seed)
    batches = [
        [
            (("t", 1), ("h", rng.randint(2, 9) * 2), ("w", 8))
            for _ in range(rng.randint(1, 4))
        ]
        for _ in range(rng.randint(1, 6))
    ]
    b = rng.randrange(len(batches))
    j = rng.randrange(len(batches[b]))
    kind = rng.choice(["unknown", "value", "repeated"])
    item = list(batches[b][j])
    where = rng.randint(0, len(item))
    pair = {"unknown": ("zz", 1), "value": ("w", -3), "repeated": ("h", 6)}[kind]
    if kind == "value":
        item = [p for p in item if p[0] != "w"]
        where = min(where, len(item))
    item.insert(where, pair)
    batches[b][j] = tuple(item)
    wrapped = [
        ((("count", 2), ("items", x))) if rng.random() < 0.5 else x for x in batches
    ]
    text = _dumps((("batches", wrapped),), rng)
    with pytest.raises(SpecError) as info:
        load_traffic(write(tmp_path, text), ["t", "h", "w"], tokens)
    (problem,) = info.value.diagnostics
    expected = {"unknown": '"zz"', "value": "-3", "repeated": '"h"'}[kind]
    assert _at(text, problem).startswith(expected), (text, str(problem))
    if kind == "repeated":
        line, col = map(
            int, problem.message.split("line ")[1].rstrip(")").split(", column ")
        )
        assert text.split("\n")[line - 1][col - 1 :].startswith('"h"')
        assert (line, col) < (problem.location.line, problem.location.col)


@pytest.mark.parametrize(
    ("crossover", "expected"),
    [(None, DEFAULT), (3000, DEFAULT[:7]), (4096, DEFAULT[:7]), (50, DEFAULT[:1])],
)
def test_crossover_drops_the_budgets_that_can_only_lose(
    crossover: int | None, expected: list[int]
) -> None:
    # Budgets up to the first that reaches the crossover stay: a batch
    # below the crossover may still need it.
    assert crossover_ladder(DEFAULT, crossover) == expected


def test_json_reports_both_packings(tmp_path: Path) -> None:
    """Two 540-token photos and one batch of eight: with a 2048-row
    crossover the tuned ladder ends at 2048 and vLLM's packing splits the
    eight (4320 rows) into three replays within it; on the current ladder
    they are one 8192 replay, which the cost-aware prediction runs
    eagerly."""
    photos = {"count": 5, "items": [{"t": 1, "h": 40, "w": 54}] * 2}
    eight = {"count": 1, "items": [{"t": 1, "h": 40, "w": 54}] * 8}
    path = write(
        tmp_path, {"batches": [photos, eight], "tuning": {"crossover_rows": 2048}}
    )
    spec = str(ROOT / "specs" / "minimax_m3.yaml")
    limits = ["--max-num-batched-tokens", "16384", "--max-model-len", "16384"]
    report = json.loads(
        run_plan(spec, *limits, "--traffic", str(path), "--json").stdout
    )
    assert report["prediction_packing"] == "vllm"
    assert report["tuned"]["budgets"][-1] == 2048
    vllm, aware = report["packings"]["vllm"], report["packings"]["cost_aware"]
    # Rows, not time: the eight's three tuned replays count more rows than
    # the current ladder's eager call under cost-aware execution.
    assert aware["tuned"]["batches_worse_than_current"] == 1
    assert {**vllm["tuned"], "batches_worse_than_current": 1} == aware["tuned"]
    assert (vllm["tuned"]["replays"], vllm["tuned"]["eager_rows"]) == (8, 0)
    assert (vllm["current"]["replays"], vllm["current"]["eager_rows"]) == (6, 0)
    assert (aware["current"]["replays"], aware["current"]["eager_rows"]) == (5, 4320)
    assert vllm["tuned"]["batches_worse_than_current"] == 0
    text = run_plan(spec, *limits, "--traffic", str(path)).stdout
    assert "# predicted for vLLM's packing" in text
    assert "cost-aware execution (units above the 2048-row crossover eager)" in text
