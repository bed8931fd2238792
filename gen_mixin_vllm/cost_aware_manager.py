"""vLLM's ``EncoderCudaGraphManager`` with the project's cost-aware planning.

:class:`CostAwareEncoderCudaGraphManager` subclasses vLLM 0.33.0's manager and
changes one decision: how the items of an execute are split into graph
replays and eager calls. Each execute is planned by
:func:`encoder_cudagraph_runtime.cost_aware.plan_execution` from a cost model
(``docs/runtime.md``): vLLM's own packing is kept unless another plan is
predicted faster by more than the model's measured error. Whenever vLLM's
packing is kept, and whenever there is no cost model, the execute is vLLM's
own ``_execute_local``, unchanged: the option cannot change what vLLM does
until a cost model says it should.

The cost model comes from a file (``GEN_MIXIN_COST_MODEL``, the JSON of
``CostModel.as_dict``) written by a calibration of the project's runtime
manager on the same GPU and model (``docs/using-in-vllm.md``); it must price
every budget the manager captures, or the manager refuses to start. Or
(``GEN_MIXIN_COST_MODEL=calibrate``) the manager calibrates it itself right
after vLLM's capture, within a bound (:mod:`gen_mixin_vllm.calibration`).

:func:`install` puts the class where vLLM's model runners look the manager up.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from vllm.v1.worker import encoder_cudagraph

from encoder_cudagraph_runtime.cost_aware import (
    CostModel,
    EagerCost,
    GraphCost,
    ExecutionPlan,
    plan_execution,
    replay_cost_rows,
)
from encoder_cudagraph_runtime.manager import CALIBRATION_LIMIT_MS
from gen_mixin_vllm.calibration import CalibrationReport, calibrate, dummy_batches

logger = logging.getLogger("vllm.gen_mixin")

_VllmManager = encoder_cudagraph.EncoderCudaGraphManager

# The modules of vLLM 0.33.0 that bind the manager's class: the v1 model
# runner imports it from encoder_cudagraph when it builds one, the v2 model
# state at import.
_BINDERS = (
    "vllm.v1.worker.encoder_cudagraph",
    "vllm.v1.worker.gpu.model_states.interface",
)


def load_cost_model(path: str | Path) -> CostModel:
    """The cost model saved at ``path`` (``CostModel.as_dict`` as JSON)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    graph = dict(data["graph"])
    graph["replay_ms"] = {int(b): float(ms) for b, ms in graph["replay_ms"].items()}
    graph["budget_scale"] = {
        int(b): float(s) for b, s in graph.get("budget_scale", {}).items()
    }
    return CostModel(
        graph=GraphCost(**graph),
        eager=EagerCost(**data["eager"]),
        graph_error=data["graph_error"],
        eager_error=data["eager_error"],
    )


class CostAwareEncoderCudaGraphManager(_VllmManager):
    """vLLM's manager; executes planned by cost when a cost model is set."""

    default_cost_model: CostModel | None = None
    """The cost model every new manager starts with (:func:`install`)."""
    calibrate_at_capture = False
    """Calibrate after each capture (:func:`install`), unless a manager of
    the same model, ladder and items per batch has already done so in this
    process (vLLM's memory profiling captures with a manager of its own
    before the one that serves)."""
    calibration_limit_ms = CALIBRATION_LIMIT_MS
    clock = staticmethod(time.perf_counter_ns)
    calibrated: dict[tuple[int, tuple[int, ...], int], CostModel] = {}
    """The cost models calibrated in this process, by model, ladder and
    items per batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cost_model: CostModel | None = None
        self.calibration_report: CalibrationReport | None = None
        self.plan_counts: Counter[str] = Counter()
        """Executes by the source of their plan: ``vllm``, ``cheapest``,
        ``uncalibrated`` (no cost model: vLLM's packing)."""
        self.unsupported = self._unsupported()
        if self.unsupported:
            logger.warning(
                "gen-mixin cost-aware manager: %s; vLLM's packing is kept",
                self.unsupported,
            )
        elif self.default_cost_model is not None:
            self.set_cost_model(self.default_cost_model)

    def _unsupported(self) -> str | None:
        paths = self.config.paths
        if list(paths) != ["default"] or paths["default"].allow_zero_tokens:
            return f"the model has encoder paths {list(paths)} (planning needs one)"
        if self._capture_axes:
            return "the model has capture axes"
        if self.use_dp:
            return "the encoder runs data parallel"
        return None

    def set_cost_model(self, cost_model: CostModel) -> None:
        """Plan with ``cost_model``, which must price every captured budget."""
        if self.unsupported:
            raise ValueError(f"cost-aware execution is off here: {self.unsupported}")
        budgets = self.path_token_budgets["default"]
        missing = sorted(set(budgets) - set(cost_model.graph.replay_ms))
        if missing or cost_model.graph.max_batch_size != self.max_batch_size:
            raise ValueError(
                f"the cost model does not fit this manager: no replay time for "
                f"budgets {missing}, or max_batch_size "
                f"{cost_model.graph.max_batch_size} != {self.max_batch_size} "
                "(calibrate it with the same budgets and items per batch)"
            )
        self.cost_model = cost_model

    def capture(self, graph_pool: Any) -> None:
        super().capture(graph_pool)
        if self.calibrate_at_capture and not self.unsupported:
            self.calibrate_after_capture()

    def calibrate_after_capture(self) -> CostModel:
        """Calibrate on vLLM's dummy images (or reuse this process's
        calibration of the same model and ladder) and plan with it."""
        budgets = tuple(sorted(self.path_token_budgets["default"]))
        key = (id(self.model), budgets, self.max_batch_size)
        if key not in self.calibrated:
            self.calibrated[key] = self.calibrate_cost_model(self._dummy_batches())
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # vLLM measures the capture's memory
        else:
            logger.info("gen-mixin cost-aware manager: calibrated earlier, reused")
        self.set_cost_model(self.calibrated[key])
        return self.calibrated[key]

    def _dummy_batches(self) -> list[dict[str, Any]]:
        try:
            return dummy_batches(self.vllm_config.model_config, self.device)
        except Exception as error:
            raise RuntimeError(
                "gen-mixin cost-aware manager: GEN_MIXIN_COST_MODEL=calibrate could "
                f"not make warm-up images with vLLM's dummy inputs ({error!r}); "
                "calibrate with the project's runtime and set GEN_MIXIN_COST_MODEL "
                "to the saved cost model instead"
            ) from error

    def calibrate_cost_model(self, batches: list[dict[str, Any]]) -> CostModel:
        """Time this captured manager on ``batches`` within
        :attr:`calibration_limit_ms`, plan with the fitted cost model and
        log what was timed."""
        cost_model, report = calibrate(
            self, batches, self.calibration_limit_ms, self.clock
        )
        self.calibration_report = report
        self.set_cost_model(cost_model)
        # The JSON is a GEN_MIXIN_COST_MODEL file for the next start on this
        # GPU, model and ladder; the replay price is what `gen-mixin plan
        # --traffic` needs to tune a ladder for it (tuning.replay_cost_rows).
        logger.info(
            "gen-mixin cost-aware manager calibrated: %s; tuning.replay_cost_rows "
            "for gen-mixin plan: %d; cost model (a GEN_MIXIN_COST_MODEL file): %s",
            report.summary(),
            replay_cost_rows(cost_model.graph),
            json.dumps(cost_model.as_dict(), sort_keys=True),
        )
        return cost_model

    def plan(self, mm_kwargs: dict[str, Any]) -> ExecutionPlan | None:
        """The plan of an execute (``None`` without a cost model)."""
        if self.cost_model is None:
            return None
        specs = self._get_item_specs(mm_kwargs)
        return plan_execution(
            [spec.get_path_output_tokens("default") for spec in specs],
            self.path_token_budgets["default"],
            self.max_batch_size,
            self.cost_model,
            sort_keys=[spec.output_tokens for spec in specs],
        )

    def _execute_local(self, mm_kwargs: dict[str, Any]) -> list[torch.Tensor]:
        plan = self.plan(mm_kwargs)
        if plan is None or plan.source == "vllm":
            self.plan_counts["uncalibrated" if plan is None else "vllm"] += 1
            return super()._execute_local(mm_kwargs)
        self.plan_counts[plan.source] += 1
        tokens = [s.output_tokens for s in self._get_item_specs(mm_kwargs)]
        results: dict[int, torch.Tensor] = {}
        for unit in plan.units:
            self._run_unit(
                mm_kwargs, list(unit.positions), unit.budget, tokens, results
            )
        return [results[i] for i in range(len(tokens))]

    def _run_unit(
        self,
        mm_kwargs: dict[str, Any],
        indices: list[int],
        budget: int | None,
        tokens: list[int],
        results: dict[int, torch.Tensor],
    ) -> None:
        """One unit of a plan: a replay of ``budget``, or (``None``) one
        eager call, whose output no later call overwrites (no clones)."""
        batch, axis_keys = self._select_items(mm_kwargs, indices)
        if budget is None:
            with torch.inference_mode():
                output = self.model.encoder_eager_forward(batch, path="default")
            self.graph_misses += len(indices)
        else:
            output = self._run_budget_graph(
                batch, budget, path="default", axis_keys=axis_keys
            )
            assert output is not None, f"no graph captured for budget {budget}"
        self.model.postprocess_encoder_output(
            {"default": output},
            indices,
            tokens,
            results,
            clone=budget is not None,
            batch_mm_kwargs=batch,
        )


def install(
    cost_model_path: str | None,
    calibrate_at_capture: bool = False,
    calibration_limit_ms: float | None = None,
) -> None:
    """Make vLLM build :class:`CostAwareEncoderCudaGraphManager` (with the
    cost model at ``cost_model_path``, if any, or calibrating its own after
    each capture within ``calibration_limit_ms``). Safe to call again."""
    manager = CostAwareEncoderCudaGraphManager
    manager.default_cost_model = (
        load_cost_model(cost_model_path) if cost_model_path else None
    )
    manager.calibrate_at_capture = calibrate_at_capture
    manager.calibration_limit_ms = calibration_limit_ms or CALIBRATION_LIMIT_MS
    for name in _BINDERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "EncoderCudaGraphManager", None) in (
            _VllmManager,
            CostAwareEncoderCudaGraphManager,
        ):
            module.EncoderCudaGraphManager = CostAwareEncoderCudaGraphManager
    logger.info(
        "gen-mixin plugin: cost-aware encoder CUDA graph manager installed (%s)",
        _source(cost_model_path, calibrate_at_capture, manager.calibration_limit_ms),
    )


def _source(path: str | None, calibrate_at_capture: bool, limit_ms: float) -> str:
    if path:
        return f"cost model {path}"
    if calibrate_at_capture:
        return f"cost model calibrated after capture, within {limit_ms:.0f} ms"
    return "no cost model: vLLM's packing until one is set"
