"""vLLM 0.33.0's own EncoderCudaGraphManager captures, at several budgets, the
class the plugin registers, and executes random batches through it (graphs
faked on the CPU, oversized items on its eager path): every item equals the
class's own eager output."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed (see tests/real_vllm)")

import torch  # noqa: E402
from real_vllm_testlib import (  # noqa: E402
    build_model,
    captured_manager,
    execute,
    registered_class,
    vllm_config,
    with_flash_attention,
)
from tiny_models import TINY  # noqa: E402

BATCHES = 6


@pytest.mark.parametrize("stem", sorted(TINY))
def test_manager_replays_equal_eager(stem: str):
    tiny = TINY[stem]
    config = vllm_config(tiny.hf_config(), tiny.save_processor, **tiny.compilation)
    model = with_flash_attention(
        build_model(registered_class(stem), config, prefix=f"replay_{stem}")
    )
    gen = torch.Generator().manual_seed(1)
    checked = {"graph": 0, "eager": 0}
    # Eager runs, counted where the manager makes them: vLLM counts a miss
    # only where every path of an item ran eagerly (Step3-VL's oversized
    # images replay their global path and run their crops eagerly).
    eager_forward = model.encoder_eager_forward

    def counted_eager_forward(*args, **kwargs):
        checked["eager"] += 1
        return eager_forward(*args, **kwargs)

    model.encoder_eager_forward = counted_eager_forward
    with captured_manager(config, model) as manager:
        budgets = manager.token_budgets
        assert len(budgets) >= 2
        for modality in tiny.modalities:
            for b in range(BATCHES):
                grids = tiny.grids(gen, modality, budgets[-1])
                if tiny.oversized is not None and b % 3 == 2:
                    # An item above every budget: eager.
                    grids.insert(1, tiny.oversized(budgets[-1]))
                mm_kwargs = tiny.draw(gen, modality, grids)
                hits = manager.graph_hits
                outputs = execute(manager, mm_kwargs)
                checked["graph"] += manager.graph_hits - hits
                assert len(outputs) == len(grids)
                for i, output in enumerate(outputs):
                    expected = tiny.eager(model, mm_kwargs, i)
                    if tiny.graph_rows_past_eager:
                        assert output.shape[0] >= expected.shape[0]
                        output = output[: expected.shape[0]]
                    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5)
    # Items that replayed a graph and eager runs, both checked (no eager run
    # where no item can be above every budget).
    least_eager = 2 if tiny.oversized is not None else 0
    assert checked["graph"] >= BATCHES and checked["eager"] >= least_eager, checked
