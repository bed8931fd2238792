"""The plugin's cost-aware option in vLLM 0.33.0: GEN_MIXIN_COST_AWARE=1
makes vLLM build the cost-aware subclass of its manager, which makes vLLM's
decisions exactly until a cost model says otherwise, and then follows the
planner; every item still equals the eager output. With
GEN_MIXIN_COST_MODEL=calibrate the manager calibrates after its capture, on
vLLM's dummy images, within its bound (timed here by a fake clock that each
eager and graph forward advances by a set cost)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed (see tests/real_vllm)")

import torch  # noqa: E402
from real_vllm_testlib import (  # noqa: E402
    build_model,
    execute,
    fake_cuda_graphs,
    flash_attention_on_cpu,
    registered_class,
    vllm_config,
    with_flash_attention,
)
from tiny_models import TINY  # noqa: E402

from encoder_cudagraph_runtime.cost_aware import (  # noqa: E402
    CostModel,
    EagerCost,
    GraphCost,
    replay_cost_rows,
)

STEM = "qwen2_vl"


@pytest.fixture(scope="module")
def host():
    tiny = TINY[STEM]
    config = vllm_config(tiny.hf_config(), tiny.save_processor, **tiny.compilation)
    model = build_model(registered_class(STEM), config, prefix="cost_aware")
    return tiny, config, with_flash_attention(model)


def _batches(tiny, budget: int) -> list[dict]:
    gen = torch.Generator().manual_seed(3)
    batches = []
    for b in range(6):
        grids = tiny.grids(gen, "image", budget)
        if b % 3 == 2:
            grids.append(tiny.oversized(budget))
        batches.append(tiny.draw(gen, "image", grids))
    return batches


class FakeCosts:
    """A clock in nanoseconds that only the model advances: an eager call
    by ``eager_ms`` per output row, a replay by ``replay_ms`` per token of
    its budget."""

    def __init__(self, replay_ms: float, eager_ms: float) -> None:
        self.replay_ms, self.eager_ms, self.ns = replay_ms, eager_ms, 0

    def __call__(self) -> int:
        return self.ns

    def spend(self, rows: int, ms_per_row: float) -> None:
        self.ns += round(rows * ms_per_row * 1e6)


def _decisions(manager_class, config, model, cost_model=None, costs=None, **attrs):
    """``(outputs, decisions, plans, manager)``: per execute, its items, the
    units it ran (``("graph", budget)`` or ``("eager", rows)``, in order) and
    the plan the manager made for it (``None`` without one). With ``costs``
    (:class:`FakeCosts`), the manager calibrates at capture on that clock;
    ``attrs`` are set on the manager before its capture."""
    decisions: list[tuple[str, int]] = []
    eager = model.encoder_eager_forward

    def eager_forward(mm_kwargs, path="default"):
        out = eager(mm_kwargs, path=path)
        decisions.append(("eager", out.shape[0]))
        if costs is not None:
            costs.spend(out.shape[0], costs.eager_ms)
        return out

    def on_replay(budget: int) -> None:
        if costs is not None:
            costs.spend(budget, costs.replay_ms)

    with flash_attention_on_cpu():
        manager = manager_class(config, torch.device("cpu"), torch.float32, model)
        run_graph = manager._run_budget_graph

        def run_budget_graph(mm_kwargs, token_budget, *args, **kwargs):
            decisions.append(("graph", token_budget))
            return run_graph(mm_kwargs, token_budget, *args, **kwargs)

        manager._run_budget_graph = run_budget_graph
        model.encoder_eager_forward = eager_forward
        if costs is not None:
            manager.calibrate_at_capture, manager.clock = True, costs
        for name, value in attrs.items():
            setattr(manager, name, value)
        try:
            if cost_model is not None:
                manager.set_cost_model(cost_model)
            with fake_cuda_graphs(manager, on_replay):
                manager.capture(graph_pool=None)
                decisions.clear()  # the calibration's
                budget = manager.token_budgets[-1]
                outputs, per_batch, plans = [], [], []
                for mm_kwargs in _batches(TINY[STEM], budget):
                    plan = getattr(manager, "plan", lambda _: None)(mm_kwargs)
                    outputs.append(execute(manager, mm_kwargs))
                    per_batch.append(list(decisions))
                    plans.append(plan)
                    decisions.clear()
        finally:
            del model.encoder_eager_forward
    return outputs, per_batch, plans, manager


def _cost_model(budgets: list[int], replay_ms: float, eager_ms: float) -> CostModel:
    return CostModel(
        graph=GraphCost(replay_ms={b: replay_ms for b in budgets}, max_batch_size=4),
        eager=EagerCost(fixed_ms=eager_ms, per_row_ms=eager_ms / 1000),
    )


def test_the_option_replaces_vllms_manager(monkeypatch: pytest.MonkeyPatch):
    import vllm.plugins
    from vllm.v1.worker import encoder_cudagraph

    from gen_mixin_vllm.cost_aware_manager import CostAwareEncoderCudaGraphManager

    original = encoder_cudagraph.EncoderCudaGraphManager
    monkeypatch.setattr(encoder_cudagraph, "EncoderCudaGraphManager", original)
    monkeypatch.setenv("GEN_MIXIN_COST_AWARE", "1")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert encoder_cudagraph.EncoderCudaGraphManager is CostAwareEncoderCudaGraphManager
    assert issubclass(CostAwareEncoderCudaGraphManager, original)


# (case, replay ms, eager ms, expected plan sources).
COSTS = [
    ("no cost model: vLLM's packing", None, None, {"uncalibrated"}),
    ("graphs cheap: vLLM's packing or fewer replays", 0.1, 100.0, {"vllm", "cheapest"}),
    ("eager cheap: the planner's all-eager plans", 100.0, 0.1, {"cheapest"}),
]


@pytest.mark.parametrize(
    ("replay_ms", "eager_ms", "sources"),
    [c[1:] for c in COSTS],
    ids=[c[0] for c in COSTS],
)
def test_decisions(host, replay_ms, eager_ms, sources):
    from gen_mixin_vllm.cost_aware_manager import CostAwareEncoderCudaGraphManager

    tiny, config, model = host
    vllm_out, vllm_decisions, _, vllm_manager = _decisions(
        _vllm_manager_class(), config, model
    )
    budgets = vllm_manager.path_token_budgets["default"]
    cost = None if replay_ms is None else _cost_model(budgets, replay_ms, eager_ms)
    out, decisions, plans, manager = _decisions(
        CostAwareEncoderCudaGraphManager, config, model, cost
    )
    assert set(manager.plan_counts) == sources
    _assert_follows_the_plans(plans, decisions, vllm_decisions)
    if sources == {"cheapest"}:
        assert manager.graph_hits == 0
    _assert_equal_items(out, vllm_out)


def _assert_follows_the_plans(plans, decisions, vllm_decisions) -> None:
    for plan, ran, vllm_ran in zip(plans, decisions, vllm_decisions, strict=True):
        if plan is None or plan.source == "vllm":
            assert ran == vllm_ran  # vLLM's own decisions
        else:
            assert ran == [
                ("eager", u.rows) if u.budget is None else ("graph", u.budget)
                for u in plan.units
            ]


def _assert_equal_items(out, vllm_out) -> None:
    for got, want in zip(out, vllm_out, strict=True):
        for x, y in zip(got, want, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def _vllm_manager_class() -> type:
    from gen_mixin_vllm.cost_aware_manager import _VllmManager

    return _VllmManager


def test_a_cost_model_must_price_every_budget(host):
    from gen_mixin_vllm.cost_aware_manager import CostAwareEncoderCudaGraphManager

    _, config, model = host
    manager = CostAwareEncoderCudaGraphManager(
        config, torch.device("cpu"), torch.float32, model
    )
    with pytest.raises(ValueError, match=r"no replay time for budgets \[64\]"):
        manager.set_cost_model(_cost_model([16, 32], 1.0, 1.0))


def test_a_saved_cost_model_reads_back(tmp_path):
    import json

    from gen_mixin_vllm.cost_aware_manager import load_cost_model

    model = CostModel(
        graph=GraphCost(
            replay_ms={16: 1.5, 64: 4.0},
            max_batch_size=4,
            per_replay_ms=0.2,
            budget_scale={64: 1.1},
        ),
        eager=EagerCost(fixed_ms=3.0, per_row_ms=0.01, serial=True),
        graph_error=0.04,
        eager_error=0.06,
    )
    path = tmp_path / "cost_model.json"
    path.write_text(json.dumps(model.as_dict()), encoding="utf-8")
    assert load_cost_model(path) == model


def test_the_calibrate_setting_reaches_the_manager(monkeypatch: pytest.MonkeyPatch):
    import vllm.plugins
    from vllm.v1.worker import encoder_cudagraph

    from gen_mixin_vllm.cost_aware_manager import CostAwareEncoderCudaGraphManager

    monkeypatch.setattr(
        encoder_cudagraph, "EncoderCudaGraphManager", _vllm_manager_class()
    )
    for name, value in [
        ("GEN_MIXIN_COST_AWARE", "1"),
        ("GEN_MIXIN_COST_MODEL", "calibrate"),
        ("GEN_MIXIN_CALIBRATION_LIMIT_MS", "2500"),
    ]:
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    try:
        vllm.plugins.load_general_plugins()
        manager = CostAwareEncoderCudaGraphManager
        assert encoder_cudagraph.EncoderCudaGraphManager is manager
        assert (manager.calibrate_at_capture, manager.calibration_limit_ms) == (
            True,
            2500.0,
        )
        assert manager.default_cost_model is None
    finally:
        from gen_mixin_vllm.cost_aware_manager import install

        install(None)
    assert not CostAwareEncoderCudaGraphManager.calibrate_at_capture


def test_calibration_batches_are_vllms_dummy_images_scaled(host):
    from gen_mixin_vllm.calibration import GROUPS, SINGLE_SIDES, dummy_batches

    _, config, model = host
    manager = _vllm_manager_class()(config, torch.device("cpu"), torch.float32, model)
    batches = dummy_batches(config.model_config, torch.device("cpu"))
    rows = [
        [s.get_path_output_tokens("default") for s in manager._get_item_specs(b)]
        for b in batches
    ]
    counts = [1] * len(SINGLE_SIDES) + [sum(n for _, n in g) for g in GROUPS]
    assert [len(r) for r in rows] == counts
    singles = [r[0] for r in rows[: len(SINGLE_SIDES)]]
    assert singles == sorted(singles) and singles[0] < singles[-1]
    assert rows[len(SINGLE_SIDES) + 2] == [singles[2], singles[-1]]  # (0.5, 1.0)


def _calibrated_run(host, costs, **attrs):
    """vLLM's run and a cost-aware one calibrated at capture on ``costs``."""
    from gen_mixin_vllm.cost_aware_manager import CostAwareEncoderCudaGraphManager

    _, config, model = host
    CostAwareEncoderCudaGraphManager.calibrated.clear()
    vllm_run = _decisions(_vllm_manager_class(), config, model)
    run = _decisions(
        CostAwareEncoderCudaGraphManager, config, model, costs=costs, **attrs
    )
    return vllm_run, run


# (case, replay ms per budget row, eager ms per output row, plan sources).
CALIBRATED = [
    ("graphs cheap: vLLM's packing or fewer replays", 0.001, 1.0, {"vllm", "cheapest"}),
    ("eager cheap: the planner's all-eager plans", 1.0, 0.001, {"cheapest"}),
]


@pytest.mark.parametrize(
    ("replay_ms", "eager_ms", "sources"),
    [c[1:] for c in CALIBRATED],
    ids=[c[0] for c in CALIBRATED],
)
def test_calibrated_at_capture(host, replay_ms, eager_ms, sources):
    costs = FakeCosts(replay_ms, eager_ms)
    (vllm_out, vllm_decisions, _, _), run = _calibrated_run(host, costs)
    out, decisions, plans, manager = run
    report = manager.calibration_report
    budgets = manager.path_token_budgets["default"]
    # Every captured budget priced, at what the clock measured.
    assert report.replay_ms == pytest.approx({b: b * replay_ms for b in budgets})
    assert set(manager.cost_model.graph.replay_ms) == set(budgets)
    assert report.skipped == 0 and len(report.timed) == report.units >= 8
    assert set(manager.plan_counts) <= sources and manager.plan_counts["cheapest"]
    _assert_follows_the_plans(plans, decisions, vllm_decisions)
    if sources == {"cheapest"}:
        assert manager.graph_hits == 0
    _assert_equal_items(out, vllm_out)


def test_calibration_stays_within_its_bound(host):
    costs = FakeCosts(replay_ms=0.01, eager_ms=0.05)
    _, (_, _, _, unbounded) = _calibrated_run(host, costs)
    full = unbounded.calibration_report
    limit_ms = full.device_ms / 3
    _, (_, _, _, manager) = _calibrated_run(
        host, FakeCosts(0.01, 0.05), calibration_limit_ms=limit_ms
    )
    report = manager.calibration_report
    assert report.device_ms <= limit_ms < full.device_ms
    assert 0 < report.skipped < report.units == full.units
    assert report.replay_ms == full.replay_ms  # every budget still priced
    # The smallest units first.
    assert report.timed == full.timed[: len(report.timed)]
    assert set(manager.cost_model.graph.replay_ms) == set(report.replay_ms)


def test_a_calibration_serves_the_next_manager_of_the_same_ladder(host):
    from gen_mixin_vllm.cost_aware_manager import CostAwareEncoderCudaGraphManager

    _, (_, _, _, first) = _calibrated_run(host, FakeCosts(1.0, 0.001))
    # vLLM's memory profiling captures with a manager of its own first.
    _, config, model = host
    _, _, _, second = _decisions(
        CostAwareEncoderCudaGraphManager, config, model, costs=FakeCosts(0.001, 1.0)
    )
    assert second.calibration_report is None
    assert second.cost_model == first.cost_model


def test_the_calibration_log_saves_the_cost_model_and_the_tuners_price(
    host, tmp_path, caplog: pytest.LogCaptureFixture
):
    """The log line's JSON is a GEN_MIXIN_COST_MODEL file that reads back
    to the calibrated model; its replay price is the tuner's."""
    import logging
    import re

    from gen_mixin_vllm.cost_aware_manager import load_cost_model

    logger = logging.getLogger("vllm.gen_mixin")
    logger.addHandler(caplog.handler)  # vLLM's loggers do not propagate
    try:
        with caplog.at_level(logging.INFO, logger="vllm.gen_mixin"):
            _, (_, _, _, manager) = _calibrated_run(host, FakeCosts(0.001, 1.0))
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records]
    line = next(m for m in lines if "manager calibrated:" in m)
    price = re.search(r"tuning.replay_cost_rows for gen-mixin plan: (\d+);", line)
    assert price and int(price[1]) == replay_cost_rows(manager.cost_model.graph)
    path = tmp_path / "cost_model.json"
    path.write_text(line.split("(a GEN_MIXIN_COST_MODEL file): ", 1)[1])
    assert load_cost_model(path) == manager.cost_model


def test_no_warm_up_images_stops_the_start(host, monkeypatch: pytest.MonkeyPatch):
    from gen_mixin_vllm import cost_aware_manager

    def no_images(model_config, device):
        raise KeyError("image")

    monkeypatch.setattr(cost_aware_manager, "dummy_batches", no_images)
    with pytest.raises(RuntimeError, match="could not make warm-up images") as raised:
        _calibrated_run(host, FakeCosts(1.0, 1.0))
    assert "GEN_MIXIN_COST_MODEL" in str(raised.value)
    assert isinstance(raised.value.__cause__, KeyError)
