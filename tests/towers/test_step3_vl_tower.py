"""Step3-VL reference tower: configs, vLLM's token arithmetic and position
table, an independent dense re-derivation, batched views == per view, vLLM's
own mixin run on the host (and its aliasing bug), the registry entry, CUDA
graph capture."""

from __future__ import annotations

import dataclasses
import math
import random

import equivalence_driver as drv
import pytest
import torch
import torch.nn.functional as F
from tower_testlib import PlainMixin, host_for_config, manager_for
from towers_vllm_source import runtime_namespace, vllm_mixin

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from reference_towers.registry import REFERENCE_TOWERS
from reference_towers.step3_vl import (
    CLIP_MEAN,
    CLIP_STD,
    Step3VisionEncoderConfig,
    Step3VLConfig,
    Step3VLVisionHost,
    resized_position_table,
    spatial_tokens,
)

TOWER = REFERENCE_TOWERS["step3_vl"]
MODEL_FILE = "vllm/model_executor/models/step3_vl.py"
VLLM_MIXIN_METHODS = (
    "get_encoder_cudagraph_config",
    "get_encoder_cudagraph_budget_range",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
    "postprocess_encoder_output",
)

# Cheap geometry for runs that capture: 28² patches, 224² global views (an
# 8×8 grid, 4 rows); crops stay 504² as vLLM hard-codes them (18×18, 25 rows).
SMALL = Step3VLConfig(
    vision_config=Step3VisionEncoderConfig(
        hidden_size=16,
        intermediate_size=32,
        output_hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=224,
        patch_size=28,
    ),
    hidden_size=48,
    max_patches_per_image=4,
    max_model_len=4096,
)
GLOBAL_ROWS, CROP_ROWS = SMALL.img_output_tokens, SMALL.patch_output_tokens


@pytest.fixture(scope="module")
def small_host() -> Step3VLVisionHost:
    return host_for_config(TOWER, SMALL)


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-5)


# -- configuration and attribute paths ------------------------------------------


def test_full_config_values():
    config = Step3VLConfig.full()
    vision = config.vision_config
    assert (vision.hidden_size, vision.num_hidden_layers) == (1792, 63)
    assert (vision.num_attention_heads, vision.head_dim) == (16, 112)
    assert (vision.intermediate_size, vision.output_hidden_size) == (3072, 4096)
    assert (vision.image_size, vision.patch_size, vision.num_channels) == (728, 14, 3)
    assert (vision.hidden_act, vision.layer_norm_eps) == ("quick_gelu", 1e-5)
    assert config.hidden_size == 7168
    assert (config.understand_projector_stride, config.projector_bias) == (2, True)
    # What vLLM's processor hard-codes (num_image_feature_size and
    # num_patch_feature_size): only stride 2 gives them.
    assert (config.img_output_tokens, config.patch_output_tokens) == (169, 81)
    assert (config.global_view_patches, config.crop_patches) == (2704, 1296)
    assert (config.max_patches_per_image, config.max_model_len) == (36, 65536)


def test_tiny_config_keeps_the_view_geometry():
    tiny, full = Step3VLConfig.tiny(), Step3VLConfig.full()
    assert (tiny.img_output_tokens, tiny.patch_output_tokens) == (169, 81)
    assert tiny.global_view_patches == full.global_view_patches
    vision = tiny.vision_config
    assert (
        vision.hidden_size,
        vision.num_attention_heads,
        vision.num_hidden_layers,
    ) == (32, 2, 2)
    assert (vision.output_hidden_size, tiny.hidden_size) == (24, 96)
    assert tiny.max_patches_per_image == 6


@pytest.mark.parametrize(
    ("vision_change", "change", "message"),
    [
        ({"hidden_size": 100, "num_attention_heads": 3}, {}, "multiple of"),
        ({"image_size": 730}, {}, "image_size 730 is not a multiple"),
        ({"patch_size": 10, "image_size": 720}, {}, "the crop size"),
        ({"hidden_act": "relu6"}, {}, "unknown activation"),
        ({"num_hidden_layers": 0}, {}, "must be positive"),
        ({"patch_size": 504, "image_size": 1008}, {}, "no tokens"),
        ({}, {"max_patches_per_image": 0}, "must be positive"),
    ],
)
def test_invalid_configs_are_rejected(vision_change, change, message):
    with pytest.raises(ValueError, match=message):
        vision = dataclasses.replace(Step3VisionEncoderConfig(), **vision_change)
        dataclasses.replace(Step3VLConfig.full(), vision_config=vision, **change)


def test_full_host_shapes_and_vllm_names_on_meta_device():
    # Two of the 63 layers are enough for the shapes (and much quicker).
    full = Step3VLConfig.full()
    vision = dataclasses.replace(full.vision_config, num_hidden_layers=2)
    with torch.device("meta"):
        host = Step3VLVisionHost(dataclasses.replace(full, vision_config=vision))
    embeddings = host.vision_model.embeddings
    assert embeddings.class_embedding.shape == (1, 1792)
    assert embeddings.patch_embedding.weight.shape == (1792, 3, 14, 14)
    assert embeddings.patch_embedding.bias.shape == (1792,)
    assert embeddings.position_embedding.weight.shape == (2705, 1792)
    layers = host.vision_model.transformer.layers
    assert layers[0].self_attn.qkv_proj.weight.shape == (3 * 1792, 1792)
    assert layers[0].mlp.fc1.weight.shape == (3072, 1792)
    assert layers[0].layer_norm1.eps == 1e-5
    assert host.vit_downsampler.weight.shape == (4096, 1792, 2, 2)
    assert host.vit_downsampler.stride == (2, 2)
    assert host.vit_downsampler2.weight.shape == (8192, 4096, 3, 3)
    assert (host.vit_downsampler2.stride, host.vit_downsampler2.padding) == (
        (2, 2),
        (1, 1),
    )
    assert host.vit_large_projector.weight.shape == (7168, 8192)
    assert host.vit_large_projector.bias is not None
    names = {name for name, _ in host.named_parameters()}
    assert {
        "vision_model.embeddings.class_embedding",
        "vision_model.embeddings.patch_embedding.weight",
        "vision_model.embeddings.position_embedding.weight",
        "vision_model.transformer.layers.0.self_attn.qkv_proj.bias",
        "vision_model.transformer.layers.0.self_attn.out_proj.weight",
        "vision_model.transformer.layers.0.layer_norm1.weight",
        "vision_model.transformer.layers.1.mlp.fc2.bias",
        "vit_downsampler.weight",
        "vit_downsampler2.bias",
        "vit_large_projector.weight",
    } <= names
    # Counted from the architecture (63 layers; the host was built with 2).
    d, i, o, t, p = 1792, 3072, 4096, 7168, 14
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * i + i) + (i * d + d) + 4 * d
    embeddings = 3 * p * p * d + d + d + 2705 * d
    convs = (d * o * 4 + o) + (o * 2 * o * 9 + 2 * o) + (2 * o * t + t)
    assert sum(p.numel() for p in layers[0].parameters()) == per_layer
    total = sum(p.numel() for p in host.parameters()) + 61 * per_layer
    assert total == embeddings + 63 * per_layer + convs


def test_mixin_attribute_paths():
    mm = MultiModalConfig(limit_per_prompt={"image": 3})
    host = TOWER.build_host(
        PlainMixin,
        "tiny",
        device="cpu",
        dtype=torch.bfloat16,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
        multimodal_config=mm,
    )
    assert host.multimodal_config is mm
    assert host.model_config.max_model_len == 4096
    assert host.model_config.multimodal_config is mm
    assert (host.device, host.dtype) == (torch.device("cpu"), torch.bfloat16)
    assert host.config.hidden_size == 96
    vision = host.config.vision_config
    assert (vision.image_size, vision.patch_size) == (728, 14)
    assert host.config.understand_projector_stride == 2
    assert (host.img_output_tokens, host.patch_output_tokens) == (169, 81)
    assert host._compute_spatial_tokens(504, 14, 2) == 81
    assert all(
        layer.self_attn.attn.attn_backend is AttentionBackendEnum.TORCH_SDPA
        for layer in host.vision_model.transformer.layers
    )


# -- vLLM's arithmetic and position table -----------------------------------------


def test_spatial_tokens_are_vllms(vllm_source):
    vllm_tokens = vllm_source.load(
        MODEL_FILE,
        ["_compute_spatial_tokens"],
        runtime_namespace(),
        cls="Step3VLForConditionalGeneration",
    )["_compute_spatial_tokens"]
    for size in (224, 504, 588, 728, 1008):
        for patch in (14, 28):
            for stride in (1, 2, 3):
                assert spatial_tokens(size, patch, stride) == vllm_tokens(
                    size, patch, stride
                )


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_spatial_tokens_are_what_the_convs_give(stride):
    config = dataclasses.replace(SMALL, understand_projector_stride=stride)
    host = host_for_config(TOWER, config)
    for grid in (8, 18, 36):
        features = torch.randn(2, grid * grid, 16)
        rows = host._process_image_features(features)
        assert rows.shape == (2, spatial_tokens(grid, 1, stride), 48)


@pytest.mark.parametrize(("src", "tgt"), [(52, 36), (16, 36), (36, 36)])
def test_position_table_is_vllms_get_abs_pos(vllm_source, src, tgt):
    get_abs_pos = vllm_source.load(
        MODEL_FILE, ["get_abs_pos"], {"math": math, "torch": torch, "F": F}
    )["get_abs_pos"]
    table = torch.randn(1, src * src + 1, 8)
    ours, theirs = resized_position_table(table, tgt * tgt), get_abs_pos(
        table, tgt * tgt
    )
    assert ours.shape == theirs.shape == (1, tgt * tgt + 1, 8)
    assert torch.equal(ours, theirs)
    assert (ours is table) == (src == tgt)


def test_embeddings_put_four_class_rows_before_the_patches(small_host):
    embeddings = small_host.vision_model.embeddings
    table = embeddings.position_embedding.weight
    for side, grid in ((224, 8), (504, 18)):
        rows = embeddings(torch.randn(2, 3, side, side))
        assert rows.shape == (2, 4 + grid * grid, 16)
        first = embeddings.class_embedding[0] + table[0]
        for r in range(4):
            _close(rows[:, r], first.expand(2, -1))


# -- the forward -----------------------------------------------------------------


def _layer_norm(x, sd, prefix, eps):
    return F.layer_norm(
        x, x.shape[-1:], sd[f"{prefix}.weight"], sd[f"{prefix}.bias"], eps
    )


def _independent_rows(host: Step3VLVisionHost, views: torch.Tensor) -> torch.Tensor:
    """Step3-VL's vision half written out from the state dict: patches cut
    with ``unfold``, the position table resized by ``F.interpolate``,
    attention as explicit softmax per head, the convs by ``F.conv2d``."""
    config, vision = host.config, host.config.vision_config
    sd = {k: v.float() for k, v in host.state_dict().items()}
    n, p, d = views.shape[0], vision.patch_size, vision.hidden_size
    g, src = views.shape[-1] // p, vision.image_size // p
    heads, hd = vision.num_attention_heads, vision.head_dim
    patches = views.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5)
    weight = sd["vision_model.embeddings.patch_embedding.weight"].reshape(d, -1)
    x = (
        patches.reshape(n, g * g, -1) @ weight.T
        + sd["vision_model.embeddings.patch_embedding.bias"]
    )
    table = sd["vision_model.embeddings.position_embedding.weight"]
    grid_table = table[1:].T.reshape(1, d, src, src)
    if g != src:
        grid_table = F.interpolate(
            grid_table, size=(g, g), mode="bicubic", antialias=True
        )
    x = x + grid_table.reshape(d, g * g).T
    cls = sd["vision_model.embeddings.class_embedding"] + table[0]
    x = torch.cat([cls.expand(n, 4, d), x], dim=1)
    for i in range(vision.num_hidden_layers):
        pre = f"vision_model.transformer.layers.{i}"
        qkv = (
            x @ sd[f"{pre}.self_attn.qkv_proj.weight"].T
            + sd[f"{pre}.self_attn.qkv_proj.bias"]
        )
        q, k, v = (
            qkv[..., j * d : (j + 1) * d].reshape(n, -1, heads, hd) for j in range(3)
        )
        scores = torch.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(hd)
        attn = torch.einsum("nhqk,nkhd->nqhd", scores.softmax(-1), v).reshape(n, -1, d)
        attn = (
            attn @ sd[f"{pre}.self_attn.out_proj.weight"].T
            + sd[f"{pre}.self_attn.out_proj.bias"]
        )
        x = x + _layer_norm(attn, sd, f"{pre}.layer_norm1", vision.layer_norm_eps)
        h = x @ sd[f"{pre}.mlp.fc1.weight"].T + sd[f"{pre}.mlp.fc1.bias"]
        h = h * torch.sigmoid(1.702 * h)
        h = h @ sd[f"{pre}.mlp.fc2.weight"].T + sd[f"{pre}.mlp.fc2.bias"]
        x = x + _layer_norm(h, sd, f"{pre}.layer_norm2", vision.layer_norm_eps)
    image = x[:, 4:].transpose(1, 2).reshape(n, d, g, g)
    stride = config.understand_projector_stride
    image = F.conv2d(
        image, sd["vit_downsampler.weight"], sd["vit_downsampler.bias"], stride=stride
    )
    image = F.conv2d(
        image,
        sd["vit_downsampler2.weight"],
        sd["vit_downsampler2.bias"],
        stride=2,
        padding=1,
    )
    rows = image.flatten(2).transpose(1, 2)
    rows = rows @ sd["vit_large_projector.weight"].T + sd["vit_large_projector.bias"]
    return rows.reshape(-1, config.hidden_size)


def test_global_and_crop_views_match_an_independent_derivation(small_host):
    generator = torch.Generator().manual_seed(4)
    for side in (224, 504):  # a crop's position table is resized 8 → 18
        views = torch.randn(2, 3, side, side, generator=generator)
        out = small_host._batched_encoder_forward(views)
        rows = spatial_tokens(side, 28, 2)
        assert out.shape == (2 * rows, 48)
        _close(out, _independent_rows(small_host, views), atol=1e-4)


def test_tiny_crops_downsample_the_position_table_as_derived():
    """The released geometry: a 52×52 table shrunk (with antialiasing) to a
    crop's 36×36 grid."""
    host = TOWER.build_host(PlainMixin, "tiny", device="cpu", dtype=torch.float32)
    crop = torch.randn(1, 3, 504, 504, generator=torch.Generator().manual_seed(5))
    out = host._batched_encoder_forward(crop)
    assert out.shape == (81, 96)
    _close(out, _independent_rows(host, crop), atol=1e-4)


def test_batched_views_equal_per_view_and_ignore_padding_views(small_host):
    """What a replay does: a view shares a batch with other items' views and
    with zero or stale padding views, and must not notice."""
    for side in (224, 504):
        views = torch.randn(2, 3, side, side)
        padding = torch.cat(
            [torch.zeros(1, 3, side, side), torch.randn(1, 3, side, side) * 50]
        )
        batched = small_host._batched_encoder_forward(torch.cat([views, padding]))
        assert torch.isfinite(batched).all()
        rows = spatial_tokens(side, 28, 2)
        for i in range(2):
            alone = small_host._batched_encoder_forward(views[i : i + 1])
            _close(batched[i * rows : (i + 1) * rows], alone)


# -- vLLM's own mixin, read from the wheel, on this host --------------------------


@pytest.fixture(scope="module")
def vllm_step3_mixin(vllm_source) -> type:
    return vllm_mixin(
        vllm_source, MODEL_FILE, "Step3VLForConditionalGeneration", VLLM_MIXIN_METHODS
    )


def test_vllm_mixin_reads_the_hosts_facts(vllm_step3_mixin):
    host = TOWER.build_host(vllm_step3_mixin, "tiny", device="cpu", dtype=torch.float32)
    config = host.get_encoder_cudagraph_config()
    assert config.modalities == ["image"]
    assert config.buffer_keys == ["pixel_values", "patch_pixel_values"]
    assert config.out_hidden_size == 96
    assert list(config.paths) == list(TOWER.paths)
    assert config.paths["global"].min_token_budget == 169
    assert not config.paths["global"].allow_zero_tokens
    assert config.paths["local"].min_token_budget == 81
    assert config.paths["local"].allow_zero_tokens
    items = [(0,), (3,), (2,), (6,)]
    kwargs = TOWER.make_mm_kwargs(host, items, "cpu")
    specs = host.get_encoder_cudagraph_item_specs(kwargs)
    # vLLM iterates the count tensor: its specs hold 0-dim tensors.
    assert [(int(s.input_size), int(s.output_tokens)) for s in specs] == [
        (TOWER.input_size(i), TOWER.output_tokens(i)) for i in items
    ]
    assert [
        {path: int(s.get_path_output_tokens(path)) for path in TOWER.paths}
        for s in specs
    ] == [TOWER.path_tokens(i) for i in items]
    capture_global = host.prepare_encoder_cudagraph_capture_inputs(
        500, 4, 4, torch.device("cpu"), torch.bfloat16, "global"
    ).values
    assert set(capture_global) == {"pixel_values"}
    assert capture_global["pixel_values"].shape == (2, 3, 728, 728)
    assert capture_global["pixel_values"].dtype == torch.bfloat16
    capture_local = host.prepare_encoder_cudagraph_capture_inputs(
        500, 4, 4, torch.device("cpu"), torch.bfloat16, "local"
    ).values
    assert capture_local["patch_pixel_values"].shape == (6, 3, 504, 504)


def test_vllm_select_keeps_order_and_cuts_crops(vllm_step3_mixin):
    host = TOWER.build_host(vllm_step3_mixin, "tiny", device="cpu", dtype=torch.float32)
    kwargs = TOWER.make_mm_kwargs(host, [(2,), (0,), (3,)], "cpu", seed=5)
    picked = host.select_encoder_cudagraph_items(kwargs, [2, 0])
    assert picked["num_patches"].tolist() == [3, 2]
    assert torch.equal(picked["pixel_values"], kwargs["pixel_values"][[2, 0]])
    crops = kwargs["patch_pixel_values"]
    assert torch.equal(
        picked["patch_pixel_values"], torch.cat([crops[2:5], crops[0:2]])
    )
    empty = host.select_encoder_cudagraph_items(kwargs, [])
    assert empty["pixel_values"].shape == (0, 3, 728, 728)
    assert empty["patch_pixel_values"].shape == (0, 3, 504, 504)


def test_vllm_mixin_through_the_manager_equals_the_reference(vllm_step3_mixin):
    host = host_for_config(TOWER, SMALL, vllm_step3_mixin)
    manager = manager_for(host, 64)
    assert manager.path_token_budgets == {
        "global": [4, 8, 16, 32, 64],
        "local": [0, 25, 50, 64],
    }
    # The three small items replay both paths' graphs in one batch; the
    # 4-crop item's 100 local rows exceed every local budget, so its crops
    # run eagerly and its global view replays a graph on its own.
    items = [(2,), (0,), (4,), (0,)]
    kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=1)
    out = manager.execute(kwargs)
    expected = TOWER.reference_outputs(host, kwargs)
    assert [o.shape for o in out] == [
        (GLOBAL_ROWS + CROP_ROWS * n, 48) for (n,) in items
    ]
    for actual, reference in zip(out, expected, strict=True):
        _close(actual, reference)
    assert manager.get_cumulative_stats()["graph_hits"] > 0
    assert manager.get_padding_stats()["paths"]["local"]["eager_rows"] == 4 * CROP_ROWS


def test_vllm_postprocess_returns_views_of_the_graph_output(vllm_step3_mixin):
    """A vLLM 0.33.0 bug: for an image without crops, Step3-VL's
    ``postprocess_encoder_output`` stores a view of the global graph's output
    buffer (it ignores ``clone``), so the next replay of that graph in the
    same ``execute`` overwrites the result: with one image per batch, the
    first crop-less image comes back with the second one's rows."""
    host = host_for_config(TOWER, SMALL, vllm_step3_mixin)
    manager = manager_for(host, 64, token_budgets=[4, 64], max_items_per_batch=1)
    kwargs = TOWER.make_mm_kwargs(host, [(0,), (0,)], "cpu", seed=2)
    first, second = manager.execute(kwargs)
    expected = TOWER.reference_outputs(host, kwargs)
    _close(second, expected[1])
    assert first.data_ptr() == second.data_ptr()
    assert torch.equal(first, second)
    assert not torch.allclose(first, expected[0], atol=1e-3)


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_gpu_plans_cover_every_budget_of_both_paths(vllm_step3_mixin, size):
    """The GPU suite's plan for Step3-VL, per path: each path's budgets that
    a legal batch can reach are replayed (the local path's 81 is not: no
    image has a single crop), executes split, items fall back to eager.
    The budgets come from the mixin's config, vLLM's here."""
    host = drv.build_meta_host("step3_vl", size, mixin=vllm_step3_mixin)
    assert drv.gpu_plan_problems("step3_vl", size, host) == []
    (default, *_) = drv.plan_phases(
        "step3_vl", size, host, **drv.gpu_run("step3_vl", size)
    )
    assert 81 in default.path_budgets["local"]
    assert 81 not in default.coverage["local"]


def test_vllm_mixin_fails_the_path_driver_by_aliasing_only(vllm_step3_mixin):
    """vLLM's own mixin through the equivalence driver (both paths captured
    and replayed by the manager): the items with crops are right, the
    crop-less ones are not: a later replay of the same global graph, in the
    same execute or the next, overwrites them (the finding above, caught by
    the driver's comparison and its aliasing check)."""
    summary = drv.run_equivalence(
        "step3_vl",
        "tiny",
        device="cpu",
        dtype=torch.float32,
        graph_backend=EagerReplayGraphBackend(),
        num_batches=6,
        tolerance=1e-4,
        mixin=vllm_step3_mixin,
    )
    wrong = [f for f in summary["failures"] if "aliases a graph buffer" not in f]
    assert summary["aliasing"] > 0 and wrong
    assert all(" (0,) " in f and "max abs err" in f for f in wrong), wrong
    assert summary["nonfinite"] == 0 and summary["graph_hits"] > 0
    replayed = summary["default_path_budgets_replayed"]
    assert replayed["global"] and replayed["local"]


# -- registry entry ---------------------------------------------------------------


def test_registry_entry():
    assert TOWER.name == "step3_vl"
    assert (TOWER.modality, TOWER.modalities) == ("image", ("image",))
    assert TOWER.paths == ("global", "local")
    assert TOWER.host_cls is Step3VLVisionHost
    assert (TOWER.fixed_tokens, TOWER.view_tokens) == (169, 81)


@pytest.mark.parametrize(
    ("item", "size", "legal"),
    [
        ((0,), "tiny", True),
        ((1,), "tiny", False),  # the processor never cuts a single crop
        ((2,), "tiny", True),
        ((6,), "tiny", True),
        ((7,), "tiny", False),
        ((36,), "full", True),
        ((37,), "full", False),
        ((-1,), "tiny", False),
        ((0, 0), "tiny", False),
    ],
)
def test_legal_items(item, size, legal):
    assert TOWER.is_legal(item, size) is legal


def test_item_tokens_paths_and_exact_draws():
    assert TOWER.input_size((3,)) == 2704 + 3 * 1296
    assert TOWER.output_tokens((3,)) == 169 + 3 * 81
    assert TOWER.path_tokens((3,)) == {"global": 169, "local": 243}
    assert TOWER.path_tokens((0,)) == {"global": 169, "local": 0}
    assert TOWER.budget_tokens((3,)) == TOWER.output_tokens((3,))
    assert TOWER.max_output_tokens("tiny") == 169 + 6 * 81
    assert TOWER.max_output_tokens("full") == 169 + 36 * 81
    assert TOWER.smallest_item("tiny") == (0,)
    rng = random.Random(0)
    assert TOWER.legal_grid(rng, "tiny", output_tokens=169 + 4 * 81) == (4,)
    for tokens in (168, 169 + 81, 170, 169 + 7 * 81):
        with pytest.raises(ValueError, match="no legal"):
            TOWER.legal_grid(rng, "tiny", output_tokens=tokens)
    draws = {TOWER.sample_item(rng, "full", max_output_tokens=500) for _ in range(100)}
    assert draws == {(0,), (2,), (3,), (4,)}
    with pytest.raises(ValueError, match="video"):
        TOWER.sample_item(rng, "tiny", modality="video")


def test_mm_kwargs_layout():
    host = TOWER.build_host(PlainMixin, "tiny", device="cpu", dtype=torch.bfloat16)
    kwargs = TOWER.make_mm_kwargs(host, [(2,), (0,)], "cpu", seed=7)
    assert set(kwargs) == {"pixel_values", "patch_pixel_values", "num_patches"}
    views, crops = kwargs["pixel_values"], kwargs["patch_pixel_values"]
    assert views.shape == (2, 3, 728, 728) and crops.shape == (2, 3, 504, 504)
    assert views.dtype == crops.dtype == torch.bfloat16  # the model dtype
    counts = kwargs["num_patches"]
    assert counts.tolist() == [2, 0] and counts.dtype == torch.int64
    assert counts.device.type == "cpu"
    # CLIP-normalised uniform pixels: each image's global view, then its crops.
    generator = torch.Generator().manual_seed(7)
    mean = torch.tensor(CLIP_MEAN)[:, None, None]
    std = torch.tensor(CLIP_STD)[:, None, None]
    first = (torch.rand((1, 3, 728, 728), generator=generator) - mean) / std
    first_crops = (torch.rand((2, 3, 504, 504), generator=generator) - mean) / std
    second = (torch.rand((1, 3, 728, 728), generator=generator) - mean) / std
    assert torch.equal(views, torch.cat([first, second]).bfloat16())
    assert torch.equal(crops, first_crops.bfloat16())
    no_crops = TOWER.make_mm_kwargs(host, [(0,)], "meta")
    assert no_crops["patch_pixel_values"].shape == (0, 3, 504, 504)
    assert no_crops["pixel_values"].device.type == "meta"
    assert no_crops["patch_pixel_values"].device.type == "meta"
    assert no_crops["num_patches"].device.type == "cpu"
    empty = TOWER.make_mm_kwargs(host, [], "cpu")
    assert empty["pixel_values"].shape == (0, 3, 728, 728)
    assert empty["num_patches"].shape == (0,)


def test_reference_outputs_put_crops_before_the_global_view(small_host):
    kwargs = TOWER.make_mm_kwargs(small_host, [(2,), (0,)], "cpu", seed=3)
    outputs = TOWER.reference_outputs(small_host, kwargs)
    assert [o.shape for o in outputs] == [
        (2 * CROP_ROWS + GLOBAL_ROWS, 48),
        (GLOBAL_ROWS, 48),
    ]
    crops = small_host._batched_encoder_forward(kwargs["patch_pixel_values"])
    views = small_host._batched_encoder_forward(kwargs["pixel_values"])
    _close(outputs[0], torch.cat([crops, views[:GLOBAL_ROWS]]))
    _close(outputs[1], views[GLOBAL_ROWS:])
    kwargs["num_patches"] = torch.tensor([3, 0])
    with pytest.raises(ValueError, match="do not match"):
        TOWER.reference_outputs(small_host, kwargs)


# -- CUDA graph capture ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("side", [728, 504])
def test_views_capture_in_a_cuda_graph(side):
    host = TOWER.build_host(PlainMixin, "tiny", device="cuda", dtype=torch.bfloat16)
    static = torch.zeros(2, 3, side, side, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.inference_mode():
        host._batched_encoder_forward(static)  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = host._batched_encoder_forward(static)
    torch.cuda.synchronize()
    views = torch.randn(2, 3, side, side, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        static.copy_(views)
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.cat(
            [host._batched_encoder_forward(views[i : i + 1]) for i in range(2)]
        )
    assert torch.isfinite(out).all()
    error = (out.float() - expected.float()).abs().max()
    assert error <= 2e-2 * max(1.0, expected.float().abs().max().item())
