"""InternVL reference tower: configs, vLLM's tiling and pixel shuffle, an
independent dense re-derivation, batched tiles == per item, vLLM's own mixin
run on the host, the registry entry, CUDA graph capture."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
import torch.nn.functional as F
from tower_testlib import PlainMixin, host_for_config, manager_for
from towers_vllm_source import runtime_namespace, vllm_mixin

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers.internvl import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    InternVisionConfig,
    InternVLConfig,
    InternVLTextConfig,
    InternVLVisionHost,
    image_tile_counts,
    pixel_shuffle,
)
from reference_towers.registry import REFERENCE_TOWERS

TOWER = REFERENCE_TOWERS["internvl"]
MODEL_FILE = "vllm/model_executor/models/internvl.py"
PROCESSOR_FILE = "vllm/transformers_utils/processors/internvl.py"
VLLM_MIXIN_METHODS = (
    "get_encoder_cudagraph_config",
    "get_input_modality",
    "get_encoder_cudagraph_budget_range",
    "_get_internvl_patches_list",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
)

# Cheap geometry for runs that capture: 224² tiles (16×16 patches, 64 rows).
SMALL = InternVLConfig(
    vision_config=InternVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=224,
    ),
    text_config=InternVLTextConfig(hidden_size=48),
    force_image_size=224,
    max_dynamic_patch=4,
    max_frames_per_video=4,
)

# Variants the released InternVL3 ViT does not exercise: the 6B ViTs' RMSNorm
# and qk normalisation, the original pixel-shuffle order, an earlier layer.
VARIANTS = {
    "tiny": InternVLConfig.tiny(),
    "rms_qk_norm": dataclasses.replace(
        SMALL,
        vision_config=dataclasses.replace(
            SMALL.vision_config, norm_type="rms_norm", qk_normalization=True
        ),
    ),
    "ps_v1": dataclasses.replace(SMALL, ps_version="v1"),
    "select_layer": dataclasses.replace(
        SMALL,
        vision_config=dataclasses.replace(SMALL.vision_config, num_hidden_layers=3),
        select_layer=-2,
    ),
}


@pytest.fixture(scope="module")
def host() -> InternVLVisionHost:
    return TOWER.build_host(PlainMixin, "tiny", device="cpu", dtype=torch.float32)


def _close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-5)


# -- configuration and attribute paths ------------------------------------------


def test_full_config_values():
    config = InternVLConfig.full()
    vision = config.vision_config
    assert (vision.hidden_size, vision.num_hidden_layers) == (1024, 24)
    assert (vision.num_attention_heads, vision.head_dim) == (16, 64)
    assert (vision.intermediate_size, vision.hidden_act) == (4096, "gelu")
    assert (vision.norm_type, vision.layer_norm_eps) == ("layer_norm", 1e-6)
    assert vision.qkv_bias and not vision.qk_normalization
    assert (vision.image_size, vision.patch_size, vision.num_patches) == (448, 14, 1024)
    assert config.text_config.hidden_size == 1536
    assert (config.downsample_ratio, config.force_image_size) == (0.5, 448)
    assert (config.select_layer, config.vit_layers, config.ps_version) == (-1, 24, "v2")
    assert (config.min_dynamic_patch, config.max_dynamic_patch) == (1, 12)
    assert config.dynamic_image_size and config.use_thumbnail
    assert (config.patch_tokens, config.num_image_token) == (1024, 256)
    assert image_tile_counts(config) == (1, *range(3, 14))


def test_tiny_config_keeps_the_tile_geometry():
    tiny, full = InternVLConfig.tiny(), InternVLConfig.full()
    assert tiny.num_image_token == full.num_image_token == 256
    assert tiny.vision_config.image_size == 448
    assert (tiny.vision_config.hidden_size, tiny.vision_config.head_dim) == (32, 16)
    assert (tiny.vit_layers, tiny.text_config.hidden_size) == (2, 96)
    assert image_tile_counts(tiny) == (1, 3, 4, 5)
    assert tiny.max_frames_per_video == 4


@pytest.mark.parametrize(
    ("vision_change", "chat_change", "message"),
    [
        ({"hidden_size": 100, "num_attention_heads": 3}, {}, "multiple of"),
        ({"image_size": 450}, {}, "multiple of patch_size"),
        ({"norm_type": "batch_norm"}, {}, "norm_type"),
        ({"hidden_act": "relu6"}, {}, "unknown activation"),
        ({"num_hidden_layers": 0}, {}, "must be positive"),
        ({}, {"force_image_size": 224}, "force_image_size"),
        ({}, {"downsample_ratio": 0.3}, "1 / an integer"),
        ({}, {"select_layer": -25}, "select_layer"),
        ({}, {"select_layer": 24}, "select_layer"),
        ({}, {"ps_version": "v3"}, "ps_version"),
        ({}, {"min_dynamic_patch": 5, "max_dynamic_patch": 4}, "min_dynamic_patch"),
        ({}, {"max_dynamic_patch": 0}, "must be positive"),
    ],
)
def test_invalid_configs_are_rejected(vision_change, chat_change, message):
    with pytest.raises(ValueError, match=message):
        vision = dataclasses.replace(InternVisionConfig(), **vision_change)
        dataclasses.replace(InternVLConfig.full(), vision_config=vision, **chat_change)


def test_select_layer_builds_only_the_used_layers():
    for select, layers in ((-1, 4), (-2, 3), (0, 1), (2, 3)):
        config = dataclasses.replace(
            SMALL,
            vision_config=dataclasses.replace(SMALL.vision_config, num_hidden_layers=4),
            select_layer=select,
        )
        with torch.device("meta"):
            host = InternVLVisionHost(config)
        assert len(host.vision_model.encoder.layers) == config.vit_layers == layers


def test_full_host_shapes_and_vllm_names_on_meta_device():
    with torch.device("meta"):
        host = InternVLVisionHost(InternVLConfig.full())
    embeddings = host.vision_model.embeddings
    assert embeddings.patch_embedding.weight.shape == (1024, 3, 14, 14)
    assert embeddings.patch_embedding.bias.shape == (1024,)
    assert embeddings.class_embedding.shape == (1, 1, 1024)
    assert embeddings.position_embedding.shape == (1, 1025, 1024)
    layers = host.vision_model.encoder.layers
    assert len(layers) == 24
    assert layers[0].attn.qkv.weight.shape == (3072, 1024)
    assert layers[0].attn.qkv.bias.shape == (3072,)
    assert layers[0].mlp.fc1.weight.shape == (4096, 1024)
    assert layers[0].norm1.eps == 1e-6
    assert [type(m).__name__ for m in host.mlp1] == [
        "LayerNorm",
        "Linear",
        "GELU",
        "Linear",
    ]
    assert host.mlp1[0].normalized_shape == (4096,) and host.mlp1[0].eps == 1e-5
    assert host.mlp1[1].weight.shape == (1536, 4096)
    assert host.mlp1[3].weight.shape == (1536, 1536)
    names = {name for name, _ in host.named_parameters()}
    assert {
        "vision_model.embeddings.class_embedding",
        "vision_model.embeddings.position_embedding",
        "vision_model.embeddings.patch_embedding.weight",
        "vision_model.encoder.layers.0.attn.qkv.weight",
        "vision_model.encoder.layers.0.attn.proj.bias",
        "vision_model.encoder.layers.0.mlp.fc2.weight",
        "vision_model.encoder.layers.0.norm1.weight",
        "vision_model.encoder.layers.0.ls1",
        "vision_model.encoder.layers.23.ls2",
        "mlp1.0.weight",
        "mlp1.1.weight",
        "mlp1.3.bias",
    } <= names
    # InternViT-300M plus the projector, counted from the architecture.
    d, i, t, p = 1024, 4096, 1536, 14
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * i + i) + (i * d + d) + 6 * d
    embeddings = 3 * p * p * d + d + d + 1025 * d
    projector = 2 * 4 * d + (4 * d * t + t) + (t * t + t)
    expected = embeddings + 24 * per_layer + projector
    assert sum(p.numel() for p in host.parameters()) == expected


def test_mixin_attribute_paths():
    mm = MultiModalConfig(limit_per_prompt={"video": 0})
    host = TOWER.build_host(
        PlainMixin,
        "tiny",
        device="cpu",
        dtype=torch.bfloat16,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
        multimodal_config=mm,
    )
    assert host.multimodal_config is mm
    assert host.config.text_config.hidden_size == 96
    assert host.config.vision_config.image_size == 448
    assert (host.num_image_token, host.patch_tokens, host.patch_size) == (256, 1024, 14)
    assert (host.downsample_ratio, host.ps_version) == (0.5, "v2")
    assert all(
        layer.attn.attn.attn_backend is AttentionBackendEnum.TORCH_SDPA
        for layer in host.vision_model.encoder.layers
    )
    assert all(p.dtype == torch.bfloat16 for p in host.parameters())
    tiles = torch.randn(2, 3, 448, 448)  # fp32: the embeddings cast
    out = host.extract_feature(tiles)
    assert out.shape == (2, 256, 96) and out.dtype == torch.bfloat16


# -- the processor's tiling, pixel shuffle --------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        InternVLConfig.full(),
        InternVLConfig.tiny(),
        dataclasses.replace(InternVLConfig.full(), use_thumbnail=False),
        dataclasses.replace(InternVLConfig.full(), dynamic_image_size=False),
        dataclasses.replace(
            InternVLConfig.full(), min_dynamic_patch=4, max_dynamic_patch=6
        ),
    ],
    ids=["full", "tiny", "no_thumbnail", "not_dynamic", "min4_max6"],
)
def test_tile_counts_are_what_vllms_processor_emits(vllm_source, config):
    """Every grid vLLM's processor can choose, through its own functions:
    an image of exactly a target ratio's shape gets that ratio's grid."""
    fns = vllm_source.load(
        PROCESSOR_FILE,
        (
            "find_closest_aspect_ratio",
            "resolve_internvl_min_max_num",
            "get_internvl_target_ratios",
            "calculate_internvl_targets",
        ),
        {},
    )
    # As InternVLChatImageProcessor does: ratios without the thumbnail,
    # the thumbnail added per image.
    low, high = fns["resolve_internvl_min_max_num"](
        min_dynamic_patch=config.min_dynamic_patch,
        max_dynamic_patch=config.max_dynamic_patch,
        dynamic_image_size=config.dynamic_image_size,
        use_thumbnail=False,
    )
    ratios = fns["get_internvl_target_ratios"](low, high)
    size = config.vision_config.image_size
    emitted = set()
    for i, j in ratios:
        tiles, _, _ = fns["calculate_internvl_targets"](
            orig_width=i * size,
            orig_height=j * size,
            target_ratios=ratios,
            image_size=size,
            use_thumbnail=config.use_thumbnail,
        )
        emitted.add(tiles)
    assert tuple(sorted(emitted)) == image_tile_counts(config)


def _shuffled_by_slicing(x: torch.Tensor, ps_version: str) -> torch.Tensor:
    """Each output cell (r, q) holds patches (2r + b, 2q + a), channels in
    (b, a) order; v1 keeps the grid transposed."""
    blocks = [x[:, b::2, a::2, :] for b in (0, 1) for a in (0, 1)]
    out = torch.cat(blocks, dim=-1)
    return out.transpose(1, 2) if ps_version == "v1" else out


@pytest.mark.parametrize("ps_version", ["v1", "v2"])
def test_pixel_shuffle_merges_2x2_neighbours(ps_version):
    x = torch.randn(2, 6, 6, 5)
    assert torch.equal(
        pixel_shuffle(x, 0.5, ps_version), _shuffled_by_slicing(x, ps_version)
    )


@pytest.mark.parametrize("ps_version", ["v1", "v2"])
def test_pixel_shuffle_is_vllms(vllm_source, ps_version):
    vllm_shuffle = vllm_source.load(
        MODEL_FILE, ["pixel_shuffle"], runtime_namespace(), cls="InternVLChatModel"
    )["pixel_shuffle"]

    class Owner:
        pass

    owner = Owner()
    owner.ps_version = ps_version
    x = torch.randn(3, 8, 8, 4)
    assert torch.equal(pixel_shuffle(x, 0.5, ps_version), vllm_shuffle(owner, x))


# -- the forward -----------------------------------------------------------------


def _norm(x, sd, prefix, config):
    if config.norm_type == "rms_norm":
        return (
            x
            * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.layer_norm_eps)
            * sd[f"{prefix}.weight"]
        )
    return F.layer_norm(
        x,
        x.shape[-1:],
        sd[f"{prefix}.weight"],
        sd[f"{prefix}.bias"],
        config.layer_norm_eps,
    )


def _independent_features(
    host: InternVLVisionHost, tiles: torch.Tensor
) -> torch.Tensor:
    """InternVL's vision half written out from the state dict: patches cut
    with ``unfold``, attention as explicit softmax per head, pixel shuffle by
    slicing."""
    config, vision = host.config, host.config.vision_config
    sd = {k: v.float() for k, v in host.state_dict().items()}
    n, p, g, d = tiles.shape[0], vision.patch_size, vision.grid, vision.hidden_size
    heads, hd = vision.num_attention_heads, vision.head_dim
    patches = tiles.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5)
    patches = patches.reshape(n, g * g, 3 * p * p)
    prefix = "vision_model.embeddings"
    weight = sd[f"{prefix}.patch_embedding.weight"].reshape(d, -1)
    x = patches @ weight.T + sd[f"{prefix}.patch_embedding.bias"]
    x = torch.cat([sd[f"{prefix}.class_embedding"].expand(n, 1, d), x], dim=1)
    x = x + sd[f"{prefix}.position_embedding"]
    for i in range(config.vit_layers):
        pre = f"vision_model.encoder.layers.{i}"
        h = _norm(x, sd, f"{pre}.norm1", vision)
        qkv = h @ sd[f"{pre}.attn.qkv.weight"].T
        if vision.qkv_bias:
            qkv = qkv + sd[f"{pre}.attn.qkv.bias"]
        q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
        if vision.qk_normalization:
            q = _norm(q, sd, f"{pre}.attn.q_norm", vision)
            k = _norm(k, sd, f"{pre}.attn.k_norm", vision)
        q, k, v = (t.reshape(n, -1, heads, hd) for t in (q, k, v))
        scores = torch.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(hd)
        attn = torch.einsum("nhqk,nkhd->nqhd", scores.softmax(-1), v).reshape(n, -1, d)
        attn = attn @ sd[f"{pre}.attn.proj.weight"].T + sd[f"{pre}.attn.proj.bias"]
        x = x + attn * sd[f"{pre}.ls1"]
        h = _norm(x, sd, f"{pre}.norm2", vision)
        h = F.gelu(h @ sd[f"{pre}.mlp.fc1.weight"].T + sd[f"{pre}.mlp.fc1.bias"])
        h = h @ sd[f"{pre}.mlp.fc2.weight"].T + sd[f"{pre}.mlp.fc2.bias"]
        x = x + h * sd[f"{pre}.ls2"]
    grid = x[:, 1:, :].reshape(n, g, g, d)
    rows = _shuffled_by_slicing(grid, config.ps_version).reshape(n, -1, 4 * d)
    rows = F.layer_norm(rows, rows.shape[-1:], sd["mlp1.0.weight"], sd["mlp1.0.bias"])
    rows = F.gelu(rows @ sd["mlp1.1.weight"].T + sd["mlp1.1.bias"])
    return rows @ sd["mlp1.3.weight"].T + sd["mlp1.3.bias"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_extract_feature_matches_an_independent_derivation(variant):
    config = VARIANTS[variant]
    host = host_for_config(TOWER, config, seed=3)
    size = config.vision_config.image_size
    count = 1 if size == 448 else 2  # 448² tiles are slow to derive by hand
    generator = torch.Generator().manual_seed(4)
    tiles = torch.randn(count, 3, size, size, generator=generator)
    out = host.extract_feature(tiles)
    assert out.shape == (count, config.num_image_token, config.text_config.hidden_size)
    _close(out, _independent_features(host, tiles), atol=1e-4)


def test_batched_tiles_equal_per_item_and_ignore_padding_tiles():
    """What a replay does: an item's tiles share a batch with other items'
    and with zero or stale padding tiles, and must not notice."""
    host = host_for_config(TOWER, SMALL, seed=1)
    items = [(1,), (3,), (1,)]
    kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=2)
    tiles = kwargs["pixel_values_flat"]
    padding = torch.cat([torch.zeros(1, 3, 224, 224), torch.randn(1, 3, 224, 224) * 50])
    batched = host.extract_feature(torch.cat([tiles, padding]))
    assert torch.isfinite(batched).all()
    expected = torch.cat(TOWER.reference_outputs(host, kwargs))
    _close(batched[: tiles.shape[0]].reshape(-1, 48), expected)


def test_position_table_is_resized_only_for_another_grid(host):
    embeddings = host.vision_model.embeddings
    assert embeddings.position_table(32, 32) is embeddings.position_embedding
    resized = embeddings.position_table(16, 16)
    assert resized.shape == (1, 257, 32)
    assert torch.equal(resized[:, :1], embeddings.position_embedding[:, :1])
    out = host.vision_model(pixel_values=torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 257, 32)
    with pytest.raises(ValueError, match="wrong pixel_values size"):
        host.vision_model(pixel_values=torch.randn(3, 448, 448))


# -- vLLM's own mixin, read from the wheel, on this host --------------------------


@pytest.fixture(scope="module")
def vllm_internvl_mixin(vllm_source) -> type:
    return vllm_mixin(vllm_source, MODEL_FILE, "InternVLChatModel", VLLM_MIXIN_METHODS)


def test_vllm_mixin_reads_the_hosts_facts(vllm_internvl_mixin):
    host = TOWER.build_host(
        vllm_internvl_mixin, "tiny", device="cpu", dtype=torch.float32
    )
    config = host.get_encoder_cudagraph_config()
    assert (config.modalities, config.buffer_keys) == (
        ["image", "video"],
        ["pixel_values_flat"],
    )
    assert config.out_hidden_size == 96
    for modality, items in (("image", [(3,), (1,), (5,)]), ("video", [(2,), (4,)])):
        kwargs = TOWER.make_mm_kwargs(host, items, "cpu", modality=modality)
        assert host.get_input_modality(kwargs) == modality
        specs = host.get_encoder_cudagraph_item_specs(kwargs)
        assert [(s.input_size, s.output_tokens) for s in specs] == [
            (TOWER.input_size(i), TOWER.output_tokens(i)) for i in items
        ]
        assert [s.get_path_output_tokens("default") for s in specs] == [
            TOWER.path_tokens(i)["default"] for i in items
        ]
    capture = host.prepare_encoder_cudagraph_capture_inputs(
        1000, 4, 4, torch.device("cpu"), torch.bfloat16
    ).values
    assert capture["pixel_values_flat"].shape == (3, 3, 448, 448)
    assert capture["pixel_values_flat"].dtype == torch.bfloat16


def test_vllm_mixin_through_the_manager_equals_the_reference(vllm_internvl_mixin):
    host = host_for_config(TOWER, SMALL, vllm_internvl_mixin)
    manager = manager_for(host, 4 * SMALL.num_image_token)
    assert manager.token_budgets == [64, 128, 256] and manager.max_batch_size == 4
    batches = [
        ("image", [(1,), (3,), (5,), (1,), (4,)]),
        ("video", [(2,), (1,), (4,), (3,)]),
    ]
    for modality, items in batches:
        kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=1, modality=modality)
        out = manager.execute(kwargs)
        expected = TOWER.reference_outputs(host, kwargs)
        assert [o.shape for o in out] == [e.shape for e in expected]
        for actual, reference in zip(out, expected, strict=True):
            _close(actual, reference)
    stats = manager.get_cumulative_stats()
    assert stats["graph_hits"] > 0 and stats["graph_misses"] > 0  # 5 tiles: eager


def test_vllm_select_keeps_order_and_reads_the_counts(vllm_internvl_mixin):
    host = TOWER.build_host(
        vllm_internvl_mixin, "tiny", device="cpu", dtype=torch.float32
    )
    items = [(3,), (1,), (4,)]
    kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=5)
    picked = host.select_encoder_cudagraph_items(kwargs, [2, 0])
    assert picked["image_num_patches"] == [4, 3]
    tiles = kwargs["pixel_values_flat"]
    assert torch.equal(picked["pixel_values_flat"], torch.cat([tiles[4:8], tiles[0:3]]))
    empty = host.select_encoder_cudagraph_items(kwargs, [])
    assert empty["pixel_values_flat"].shape == (0, 3, 448, 448)


# -- registry entry ---------------------------------------------------------------


def test_registry_entry():
    assert TOWER.name == "internvl"
    assert (TOWER.modality, TOWER.modalities, TOWER.paths) == (
        "image",
        ("image", "video"),
        ("default",),
    )
    assert TOWER.host_cls is InternVLVisionHost
    assert TOWER.view_tokens == 256


@pytest.mark.parametrize(
    ("item", "modality", "size", "legal"),
    [
        ((1,), "image", "tiny", True),
        ((2,), "image", "tiny", False),  # a 2-tile grid always gets a thumbnail
        ((5,), "image", "tiny", True),
        ((6,), "image", "tiny", False),
        ((13,), "image", "full", True),
        ((14,), "image", "full", False),
        ((2,), "video", "tiny", True),
        ((4,), "video", "tiny", True),
        ((5,), "video", "tiny", False),
        ((16,), "video", "full", True),
        ((0,), "image", "tiny", False),
        ((1, 1), "image", "tiny", False),
    ],
)
def test_legal_items(item, modality, size, legal):
    assert TOWER.is_legal(item, size, modality=modality) is legal


def test_item_tokens_and_exact_draws():
    assert (TOWER.input_size((5,)), TOWER.output_tokens((5,))) == (5, 1280)
    assert TOWER.path_tokens((3,)) == {"default": 768}
    assert TOWER.max_output_tokens("tiny") == 1280
    assert TOWER.max_output_tokens("full") == 13 * 256
    assert TOWER.max_output_tokens("tiny", modality="video") == 1024
    rng = random.Random(0)
    assert TOWER.legal_grid(rng, "tiny", output_tokens=768) == (3,)
    assert TOWER.legal_grid(rng, "tiny", output_tokens=512, modality="video") == (2,)
    for tokens in (512, 700, 1536):
        with pytest.raises(ValueError, match="no legal"):
            TOWER.legal_grid(rng, "tiny", output_tokens=tokens)
    draws = {TOWER.sample_item(rng, "full", max_output_tokens=1024) for _ in range(100)}
    assert draws == {(1,), (3,), (4,)}
    videos = {TOWER.budget_item(rng, "tiny", modality="video") for _ in range(100)}
    assert videos == {(1,), (2,), (3,), (4,)}


def test_mm_kwargs_layout(host):
    images = TOWER.make_mm_kwargs(host, [(3,), (1,)], "cpu", seed=7)
    assert set(images) == {"pixel_values_flat", "image_num_patches"}
    tiles = images["pixel_values_flat"]
    assert tiles.shape == (4, 3, 448, 448) and tiles.dtype == torch.float32
    counts = images["image_num_patches"]
    assert counts.tolist() == [3, 1] and counts.dtype == torch.int64
    assert counts.device.type == "cpu"
    # ImageNet-normalised uniform pixels, from the seed.
    raw = torch.rand((4, 3, 448, 448), generator=torch.Generator().manual_seed(7))
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    assert torch.equal(tiles, (raw - mean) / std)
    videos = TOWER.make_mm_kwargs(host, [(2,)], "cpu", modality="video")
    assert set(videos) == {"pixel_values_flat_video", "video_num_patches"}
    assert videos["pixel_values_flat_video"].shape == (2, 3, 448, 448)
    empty = TOWER.make_mm_kwargs(host, [], "cpu")
    assert empty["pixel_values_flat"].shape == (0, 3, 448, 448)
    assert empty["image_num_patches"].shape == (0,)
    with pytest.raises(ValueError, match="count"):
        TOWER.make_mm_kwargs(host, [(1, 2)], "cpu")


def test_mm_kwargs_take_the_tower_dtype_and_keep_counts_on_the_cpu():
    host = TOWER.build_host(PlainMixin, "tiny", device="cpu", dtype=torch.bfloat16)
    kwargs = TOWER.make_mm_kwargs(host, [(1,)], "meta")
    assert kwargs["pixel_values_flat"].dtype == torch.bfloat16
    assert kwargs["pixel_values_flat"].device.type == "meta"
    assert kwargs["image_num_patches"].device.type == "cpu"


def test_reference_outputs_per_modality(host):
    for modality, items in (("image", [(1,), (3,)]), ("video", [(2,)])):
        kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=3, modality=modality)
        outputs = TOWER.reference_outputs(host, kwargs)
        assert [o.shape for o in outputs] == [
            (TOWER.output_tokens(i), 96) for i in items
        ]
    kwargs = TOWER.make_mm_kwargs(host, [(3,)], "cpu")
    kwargs["image_num_patches"] = torch.tensor([4])
    with pytest.raises(ValueError, match="need 4"):
        TOWER.reference_outputs(host, kwargs)


# -- CUDA graph capture ------------------------------------------------------------


@pytest.mark.gpu
def test_extract_feature_captures_in_a_cuda_graph():
    host = TOWER.build_host(PlainMixin, "tiny", device="cuda", dtype=torch.bfloat16)
    static = torch.zeros(3, 3, 448, 448, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.inference_mode():
        host.extract_feature(static)  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = host.extract_feature(static)
    torch.cuda.synchronize()
    kwargs = TOWER.make_mm_kwargs(host, [(3,)], "cuda", seed=11)
    with torch.inference_mode():
        static.copy_(kwargs["pixel_values_flat"])
        graph.replay()
        torch.cuda.synchronize()
        expected = TOWER.reference_outputs(host, kwargs)[0]
    assert torch.isfinite(out).all()
    error = (out.reshape(-1, 96).float() - expected.float()).abs().max()
    assert error <= 2e-2 * max(1.0, expected.float().abs().max().item())
