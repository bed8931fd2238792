"""The generated mixin against vLLM's own, on the same host: vLLM 0.33.0's
class and the plugin's class built with the same weights, the same batches
through each one's methods and through vLLM's own manager. They agree except
where docs/vllm-differences.md says otherwise; the differences these batches
show (``<stem>.cu-seqlens-padding``: vLLM's own mixin replays offsets that go
down, FlashAttention's negative lengths; ``gemma3_mm.crops-by-budget``: vLLM's
replay copy fails; ``ernie45_vl.eager-rows``: vLLM's eager forward resamples;
``kimi_k25.multi-frame-eager``: vLLM's sentinel token count;
``lfm2_vl.cu-seqlens-slots``: vLLM's padding copy fails;
``gemma4_mm.images-only``: vLLM's config captures videos too;
``gemma4_mm.widest-key-budget``: ours counts every image at the widest
row; finding 6 of
vllm-findings.md: vLLM's Step3-VL returns views of a graph's output) are
asserted as differences where that page lists them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33.0 is not installed (see tests/real_vllm)")

import real_vllm_testlib  # noqa: E402
import torch  # noqa: E402
from real_vllm_testlib import (  # noqa: E402
    build_model,
    captured_manager,
    execute,
    flash_attention_on_cpu,
    registered_class,
    vllm_config,
    with_flash_attention,
)
from tiny_models import TINY  # noqa: E402

from gen_mixin_vllm.catalog import ADDS_PROTOCOL  # noqa: E402
from gen_mixin_vllm.models import vllm_class  # noqa: E402

# The models whose vLLM mixin replays cu_seqlens that go down on these
# batches (their ``<stem>.cu-seqlens-padding``; Cohere Compass's shows only
# with a user-set max_frames_per_batch above the items per batch).
DECREASING_IN_VLLM = {"glm4_1v", "qwen2_vl", "qwen3_vl"}

# The models whose vLLM manager fails a replay that ours runs, and the
# difference of docs/vllm-differences.md that says why: vLLM's Gemma 3 mixin
# captures at most max_batch_size crops, which counts images, so a batch of
# more crops than images fails its replay copy; vLLM's LFM2-VL mixin captures
# one cu_seqlens slot per min_image_tokens, so a batch of more, smaller tiles
# fails its padding copy.
REPLAY_FAILS_IN_VLLM = {
    "gemma3_mm": "gemma3_mm.crops-by-budget",
    "lfm2_vl": "lfm2_vl.cu-seqlens-slots",
}
# The models whose eager forward returns other rows than vLLM's, and the
# difference that says so: vLLM's ERNIE-4.5-VL mixin resamples in its eager
# forward and again in post-processing; ours returns the ViT rows, as the graph.
EAGER_DIFFERS = {"ernie45_vl": "ernie45_vl.eager-rows"}
# The models whose vLLM mixin marks an item for the eager path with a sentinel
# token count (kimi_k25.multi-frame-eager: a chunk of several frames); ours
# gives its real tokens and a default path's count above every budget.
EAGER_SENTINEL = {"kimi_k25": "kimi_k25.multi-frame-eager"}
SENTINEL_TOKENS = 2**30
# The fields of the encoder CUDA graph config that differ, and the difference
# that says why: vLLM's Gemma 4 mixin captures videos too (32 frames each);
# ours captures images only and leaves videos to vLLM's eager path.
CONFIG_DIFFERS = {
    "gemma4_mm": {
        "modalities": "gemma4_mm.images-only",
        "max_frames_per_video": "gemma4_mm.images-only",
    }
}
# The models whose budget tokens per item differ, the difference that says
# why, and what ours counts: every Gemma 4 image counts the widest captured
# row (the model's max_soft_tokens), vLLM's its own or its batch's widest.
PATH_TOKENS_DIFFER = {"gemma4_mm": ("gemma4_mm.widest-key-budget", 70)}
# The models whose vLLM mixin returns items that are views of a graph's
# output buffer (Step3-VL's crop-less images: finding 6 in vllm-findings.md).
VIEWS_IN_VLLM = {"step3_vl"}
DIFFERENCES = (
    Path(__file__).resolve().parents[2] / "docs" / "vllm-differences.md"
).read_text("utf-8")


def _same_item_spec(stem: str, mine, vllms, config) -> None:
    """The same item as the manager sees it: its input size and tokens, on
    each path too (an empty ``path_output_tokens`` means the item's own
    tokens on the default path)."""
    if stem in EAGER_SENTINEL and vllms.output_tokens == SENTINEL_TOKENS:
        assert f"`{EAGER_SENTINEL[stem]}`" in DIFFERENCES
        budgets = config.compilation_config.encoder_cudagraph_token_budgets
        assert mine.input_size == vllms.input_size
        assert mine.output_tokens < SENTINEL_TOKENS
        assert mine.get_path_output_tokens("default") > max(budgets)
        return
    assert (mine.input_size, mine.output_tokens) == (
        vllms.input_size,
        vllms.output_tokens,
    )
    if stem in PATH_TOKENS_DIFFER:
        difference, tokens = PATH_TOKENS_DIFFER[stem]
        assert f"`{difference}`" in DIFFERENCES
        assert _path_tokens(mine) == {"default": tokens}
        assert _path_tokens(vllms)["default"] <= tokens
        return
    assert _path_tokens(mine) == _path_tokens(vllms)


def _path_tokens(spec) -> dict[str, int]:
    return spec.path_output_tokens or {"default": spec.output_tokens}


def _execute_or_none(manager, mm_kwargs, views: list[int]):
    """Copies of the manager's items (a view of a graph's output buffer is
    overwritten by the next replay), or ``None`` where its replay copy fails;
    counts the views in ``views``."""
    try:
        items = execute(manager, mm_kwargs)
    except RuntimeError as error:
        assert "must match the size" in str(error), error
        return None
    buffers = {
        meta.output_buffer.untyped_storage().data_ptr()
        for graphs in manager.budget_graphs.values()
        for meta in graphs.values()
    }
    views[0] += sum(item.untyped_storage().data_ptr() in buffers for item in items)
    return [item.clone() for item in items]


def _selections(stem: str, mine: dict, vllms: dict) -> tuple[dict, dict]:
    """The two selections, less their capture-axis keys where those differ
    as documented (ours then the covering captured key)."""
    if stem not in PATH_TOKENS_DIFFER:
        return mine, vllms
    from vllm.v1.worker.encoder_cudagraph_defs import (
        ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG as KEYS,
    )

    difference, widest = PATH_TOKENS_DIFFER[stem]
    assert f"`{difference}`" in DIFFERENCES
    assert mine[KEYS] == (widest,)
    return (
        {k: v for k, v in mine.items() if k != KEYS},
        {k: v for k, v in vllms.items() if k != KEYS},
    )


def _pair(stem: str):
    tiny = TINY[stem]
    config = vllm_config(tiny.hf_config(), tiny.save_processor, **tiny.compilation)
    theirs = build_model(vllm_class(stem), config, prefix=f"vllm_{stem}")
    ours = build_model(registered_class(stem), config, prefix=f"ours_{stem}")
    ours.load_state_dict(theirs.state_dict())
    return tiny, config, with_flash_attention(theirs), with_flash_attention(ours)


def _same(a, b) -> None:
    """Equal values, whatever the container (a selection's grid is a list in
    vLLM's mixin and a tensor in ours: ``*.selected-grid``)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, list) and a and torch.is_tensor(a[0]):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif torch.is_tensor(a) or torch.is_tensor(b):
        torch.testing.assert_close(
            torch.as_tensor(a),
            torch.as_tensor(b),
            rtol=1e-4,
            atol=1e-5,
            check_dtype=False,
        )
    else:
        assert a == b


# The models whose vLLM class has a mixin of its own to agree with.
@pytest.mark.parametrize("stem", sorted(set(TINY) - ADDS_PROTOCOL))
def test_generated_methods_agree_with_vllms_own(stem: str):
    tiny, config, theirs, ours = _pair(stem)
    config_theirs = theirs.get_encoder_cudagraph_config()
    config_ours = ours.get_encoder_cudagraph_config()
    for field in ("modalities", "out_hidden_size", "max_frames_per_video"):
        differs = CONFIG_DIFFERS.get(stem, {}).get(field)
        if differs:
            assert f"`{differs}`" in DIFFERENCES
            assert getattr(config_ours, field) != getattr(config_theirs, field)
        else:
            assert getattr(config_ours, field) == getattr(config_theirs, field)
    assert ours.get_encoder_cudagraph_budget_range(
        config
    ) == theirs.get_encoder_cudagraph_budget_range(config)

    gen = torch.Generator().manual_seed(2)
    batches = [
        tiny.draw(gen, modality, tiny.grids(gen, modality, 64))
        for modality in tiny.modalities
        for _ in range(3)
    ]
    # And one smallest item a modality: one tile, or one 2 x 2 patch grid.
    batches += [tiny.draw(gen, m, tiny.grids(gen, m, 1)) for m in tiny.modalities]
    with flash_attention_on_cpu(), torch.inference_mode():
        for mm_kwargs in batches:
            specs = ours.get_encoder_cudagraph_item_specs(mm_kwargs)
            for mine, vllms in zip(
                specs, theirs.get_encoder_cudagraph_item_specs(mm_kwargs), strict=True
            ):
                _same_item_spec(stem, mine, vllms, config)
            picked = list(range(len(specs)))[::-2]
            _same(
                *_selections(
                    stem,
                    ours.select_encoder_cudagraph_items(mm_kwargs, picked),
                    theirs.select_encoder_cudagraph_items(mm_kwargs, picked),
                )
            )
            for path in config_ours.paths or ["default"]:
                if not sum(_path_tokens(spec).get(path, 0) for spec in specs):
                    continue  # the manager skips a path a batch has no rows on
                eager_ours = ours.encoder_eager_forward(mm_kwargs, path=path)
                eager_theirs = theirs.encoder_eager_forward(mm_kwargs, path=path)
                if stem in EAGER_DIFFERS:
                    assert f"`{EAGER_DIFFERS[stem]}`" in DIFFERENCES
                    assert eager_ours.shape != eager_theirs.shape
                else:
                    _same(eager_ours, eager_theirs)

    decreasing = {}
    outputs = {}
    views = {}
    for name, model in (("vllm", theirs), ("ours", ours)):
        del real_vllm_testlib.DECREASING_OFFSETS[:]
        views[name] = [0]
        with captured_manager(config, model) as manager:
            outputs[name] = [
                _execute_or_none(manager, kw, views[name]) for kw in batches
            ]
        decreasing[name] = list(real_vllm_testlib.DECREASING_OFFSETS)
    assert None not in outputs["ours"]
    # Finding 6 (vllm-findings.md): vLLM's Step3-VL returns a crop-less
    # image as a view of the global graph's output buffer; ours never does.
    assert views["ours"] == [0]
    if stem in VIEWS_IN_VLLM:
        assert views["vllm"][0] > 0, "the documented difference did not show"
    else:
        assert views["vllm"] == [0]
    failed = [i for i, out in enumerate(outputs["vllm"]) if out is None]
    if stem in REPLAY_FAILS_IN_VLLM:
        assert f"`{REPLAY_FAILS_IN_VLLM[stem]}`" in DIFFERENCES
        assert failed, "the documented difference did not show"
        assert len(failed) < len(batches), "no replay left to compare"
    else:
        assert failed == []
    for got, want in zip(outputs["ours"], outputs["vllm"]):
        if want is not None:
            _same(got, want)
    # <stem>.cu-seqlens-padding: vLLM's offsets fall back to 0 after the real
    # ones; ours never go down.
    assert decreasing["ours"] == []
    if stem in DECREASING_IN_VLLM:
        assert decreasing["vllm"], "the documented difference did not show"
