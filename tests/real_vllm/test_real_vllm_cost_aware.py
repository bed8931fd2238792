"""The plugin's cost-aware option in vLLM 0.33.0: GEN_MIXIN_COST_AWARE=1
makes vLLM build the cost-aware subclass of its manager, which makes vLLM's
decisions exactly until a cost model says otherwise, and then follows the
planner; every item still equals the eager output."""

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


def _decisions(manager_class, config, model, cost_model=None):
    """``(outputs, decisions, plans, manager)``: per execute, its items, the
    units it ran (``("graph", budget)`` or ``("eager", rows)``, in order) and
    the plan the manager made for it (``None`` without one)."""
    decisions: list[tuple[str, int]] = []
    eager = model.encoder_eager_forward

    def eager_forward(mm_kwargs, path="default"):
        out = eager(mm_kwargs, path=path)
        decisions.append(("eager", out.shape[0]))
        return out

    with flash_attention_on_cpu():
        manager = manager_class(config, torch.device("cpu"), torch.float32, model)
        run_graph = manager._run_budget_graph

        def run_budget_graph(mm_kwargs, token_budget, *args, **kwargs):
            decisions.append(("graph", token_budget))
            return run_graph(mm_kwargs, token_budget, *args, **kwargs)

        manager._run_budget_graph = run_budget_graph
        model.encoder_eager_forward = eager_forward
        try:
            if cost_model is not None:
                manager.set_cost_model(cost_model)
            with fake_cuda_graphs(manager):
                manager.capture(graph_pool=None)
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
    for plan, ran, vllm_ran in zip(plans, decisions, vllm_decisions):
        if plan is None or plan.source == "vllm":
            assert ran == vllm_ran  # vLLM's own decisions
        else:
            assert ran == [
                ("eager", u.rows) if u.budget is None else ("graph", u.budget)
                for u in plan.units
            ]
    if sources == {"cheapest"}:
        assert manager.graph_hits == 0
    for got, want in zip(out, vllm_out):
        for x, y in zip(got, want):
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
