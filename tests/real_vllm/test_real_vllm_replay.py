"""vLLM 0.33.0's own EncoderCudaGraphManager captures, at several budgets, the
class the plugin registers, and executes random batches through it (graphs
faked on the CPU, oversized batches on its eager path): every item equals the
class's own eager output."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm", reason="vLLM 0.33.0 is not installed (tests/real_vllm/README)"
)

import torch  # noqa: E402
from real_vllm_testlib import (  # noqa: E402
    build_model,
    fake_cuda_graphs,
    flash_attention_on_cpu,
    vllm_config,
)
from tiny_models import TINY  # noqa: E402

from gen_mixin_vllm import register  # noqa: E402
from gen_mixin_vllm.catalog import CATALOG  # noqa: E402

BATCHES = 6


def _registered_class(stem: str) -> type:
    from vllm import ModelRegistry

    register(ModelRegistry, {"GEN_MIXIN_MODELS": stem})
    model_class = ModelRegistry._try_load_model_cls(CATALOG[stem].architectures[0])
    assert model_class is not None and model_class.gen_mixin_stem == stem
    return model_class


@pytest.mark.parametrize("stem", sorted(TINY))
def test_manager_replays_equal_eager(stem: str):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager

    tiny = TINY[stem]
    config = vllm_config(tiny.hf_config(), tiny.save_processor, **tiny.compilation)
    model = build_model(_registered_class(stem), config, prefix=f"replay_{stem}")
    for module in model.modules():
        if hasattr(module, "attn_backend"):
            module.attn_backend = AttentionBackendEnum.FLASH_ATTN
    gen = torch.Generator().manual_seed(1)
    with flash_attention_on_cpu():
        manager = EncoderCudaGraphManager(
            config, torch.device("cpu"), torch.float32, model
        )
        with fake_cuda_graphs(manager):
            manager.capture(graph_pool=None)
            budgets = manager.token_budgets
            assert len(budgets) >= 2
            checked = {"graph": 0, "eager": 0}
            for modality in tiny.modalities:
                for b in range(BATCHES):
                    grids = tiny.grids(gen, modality, budgets[-1])
                    if b % 3 == 2:  # an item above every budget: eager
                        grids.insert(1, tiny.oversized(budgets[-1]))
                    mm_kwargs = tiny.draw(gen, modality, grids)
                    hits, misses = manager.graph_hits, manager.graph_misses
                    with torch.inference_mode():  # as vLLM's model runner
                        outputs = manager.execute(mm_kwargs)
                    checked["graph"] += manager.graph_hits - hits
                    checked["eager"] += manager.graph_misses - misses
                    for i, output in enumerate(outputs):
                        expected = tiny.eager(model, mm_kwargs, i)
                        torch.testing.assert_close(
                            output, expected, rtol=1e-4, atol=1e-5
                        )
    # Items that replayed a graph and items that ran eagerly, both checked.
    assert checked["graph"] >= BATCHES and checked["eager"] >= 2, checked
