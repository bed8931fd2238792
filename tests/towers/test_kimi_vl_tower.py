"""Kimi-VL reference tower (MoonViT + projector): configuration, metadata
and helpers against vLLM's own code, packed == per image, an independent
dense derivation, vLLM's mixin run on the host, registry entry."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tower_testlib import manager_for
from towers_vllm_source import bind, runtime_namespace, vllm_mixin

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import (
    MultiModalConfig,
)
from reference_towers.kimi_vl import (
    KimiVLConfig,
    KimiVLVisionHost,
    apply_rope,
    merge_gather_index,
    rope_2d_table,
)
from reference_towers.registry import REFERENCE_TOWERS

TOWER = REFERENCE_TOWERS["kimi_vl"]
MOONVIT = "vllm/model_executor/models/moonvit.py"
KIMI = "vllm/model_executor/models/kimi_vl.py"
MIXIN_METHODS = [
    "get_encoder_cudagraph_config",
    "get_encoder_cudagraph_budget_range",
    "_get_grid_hws",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
]
# (h, w) patches: the learned grid's own size, strips, odd block counts.
GRIDS = [(8, 8), (2, 2), (6, 10), (2, 40), (14, 4)]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def _patches(host, grids, seed=0) -> torch.Tensor:
    return TOWER.make_mm_kwargs(host, grids, "cpu", seed=seed)["pixel_values"]


# -- vLLM's code from the wheel ------------------------------------------------


def _vllm_moonvit(source, tower):
    """A stand-in for vLLM's ``MoonVitPretrainedModel`` holding ``tower``'s
    weights, whose metadata code (position embeddings, RoPE table, merge
    index) is vLLM's own; plus vLLM's module-level helpers."""
    ns = runtime_namespace()
    helpers = source.load(
        MOONVIT,
        [
            "_build_merge_gather_idx",
            "patch_merger",
            "_apply_rope_input_validation",
            "apply_rope",
        ],
        ns,
    )
    rope_cls = source.make_class(
        "Rope2DPosEmb",
        MOONVIT,
        "Rope2DPosEmb",
        ["precomputed_freqs_cis", "get_freqs_cis_by_seqlens_list"],
        ns,
    )
    rope = rope_cls()
    ours = tower.encoder.rope_2d
    rope.dim, rope.max_height, rope.max_width = (
        ours.dim,
        ours.max_height,
        ours.max_width,
    )
    rope.theta_base, rope.device = ours.theta_base, "cpu"
    pos_cls = source.make_class(
        "Learnable2DInterpPosEmb",
        MOONVIT,
        "Learnable2DInterpPosEmb",
        ["get_pos_embeds"],
        ns,
    )
    pos_emb = pos_cls()
    pos_emb.weight = tower.patch_embed.pos_emb.weight
    pos_emb.interpolation_mode = "bicubic"
    stand_in = SimpleNamespace(
        merge_kernel_size=tower.merge_kernel_size,
        patch_embed=SimpleNamespace(pos_emb=pos_emb),
        encoder=SimpleNamespace(get_rope_freqs_cis=rope.get_freqs_cis_by_seqlens_list),
        parameters=lambda: iter([pos_emb.weight]),
        rope=rope,
        **helpers,
    )
    return bind(
        stand_in,
        source.load(
            MOONVIT, ["prepare_encoder_metadata"], ns, cls="MoonVitPretrainedModel"
        ),
    )


# -- configuration and attribute paths ------------------------------------------


def test_full_config_values():
    config = KimiVLConfig.full()
    v = config.vision_config
    assert (v.patch_size, v.init_pos_emb_height, v.init_pos_emb_width) == (14, 64, 64)
    assert (v.num_hidden_layers, v.hidden_size, v.num_attention_heads) == (27, 1152, 16)
    assert (v.intermediate_size, v.merge_kernel_size, v.head_dim) == (4304, (2, 2), 72)
    assert config.text_config.hidden_size == 2048
    assert (config.in_token_limit, config.max_patches_per_side) == (4096, 511)
    assert config.max_model_len == 131072


def test_tiny_config_keeps_the_released_layout():
    tiny, full = KimiVLConfig.tiny(), KimiVLConfig.full()
    assert tiny.vision_config.patch_size == full.vision_config.patch_size
    assert tiny.vision_config.merge_kernel_size == full.vision_config.merge_kernel_size
    assert tiny.max_patches_per_side == full.max_patches_per_side
    assert tiny.text_config.hidden_size != tiny.vision_config.hidden_size * 4
    with pytest.raises(ValueError, match="multiple of 4"):
        KimiVLConfig(
            vision_config=type(full.vision_config)(
                hidden_size=36, num_attention_heads=2
            )
        )


def test_full_host_has_vllms_parameter_names_and_shapes():
    with torch.device("meta"):
        host = KimiVLVisionHost(KimiVLConfig.full())
    shapes = {name: tuple(p.shape) for name, p in host.named_parameters()}
    expected = {
        "vision_tower.patch_embed.proj.weight": (1152, 3, 14, 14),
        "vision_tower.patch_embed.proj.bias": (1152,),
        "vision_tower.patch_embed.pos_emb.weight": (64, 64, 1152),
        "vision_tower.encoder.blocks.0.norm0.weight": (1152,),
        "vision_tower.encoder.blocks.0.wqkv.weight": (3456, 1152),
        "vision_tower.encoder.blocks.0.wqkv.bias": (3456,),
        "vision_tower.encoder.blocks.0.wo.weight": (1152, 1152),
        "vision_tower.encoder.blocks.26.mlp.fc0.weight": (4304, 1152),
        "vision_tower.encoder.blocks.26.mlp.fc1.weight": (1152, 4304),
        "vision_tower.encoder.final_layernorm.bias": (1152,),
        "multi_modal_projector.pre_norm.weight": (1152,),
        "multi_modal_projector.linear_1.weight": (4608, 4608),
        "multi_modal_projector.linear_2.weight": (2048, 4608),
    }
    assert {k: shapes[k] for k in expected} == expected
    assert host.vision_tower.encoder.blocks[0].norm0.eps == 1e-5
    assert host.multi_modal_projector.pre_norm.eps == 1e-5


def test_mixin_attribute_paths():
    mm = MultiModalConfig()
    host = TOWER.build_host(
        object,
        "tiny",
        device="cpu",
        dtype=torch.bfloat16,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
        multimodal_config=mm,
    )
    assert host.multimodal_config is mm and host.model_config.max_model_len == 512
    assert host.hidden_size == host.config.text_config.hidden_size == 96
    vision = host.config.vision_config
    assert (vision.merge_kernel_size, vision.patch_size) == ((2, 2), 14)
    tower = host.vision_tower
    assert (tower.merge_kernel_size, tower.patch_size, tower.hidden_size) == (
        (2, 2),
        14,
        64,
    )
    rope = tower.encoder.rope_2d
    assert (rope.max_height, rope.max_width, rope.dim) == (512, 512, 32)
    assert {b.attn.attn_backend for b in tower.encoder.blocks} == {
        AttentionBackendEnum.TORCH_SDPA
    }
    assert tower.dtype == torch.bfloat16
    assert host.multi_modal_projector.linear_2.weight.dtype == torch.bfloat16


def test_seeded_weights_cover_the_tables_and_the_conv():
    tiny = TOWER.build_host(object, "tiny", device="cpu", dtype=torch.float32)
    table = tiny.vision_tower.patch_embed.pos_emb.weight
    conv = tiny.vision_tower.patch_embed.proj.weight
    assert 0.4 < table.std().item() < 0.6
    assert math.isclose(conv.std().item(), (3 * 14 * 14) ** -0.5, rel_tol=0.1)


# -- metadata and helpers against vLLM -----------------------------------------------


def test_merge_index_matches_vllm(vllm_source, kimi_vl_host):
    vllm = _vllm_moonvit(vllm_source, kimi_vl_host.vision_tower)
    index = merge_gather_index(GRIDS, (2, 2))
    assert index.dtype == vllm._build_merge_gather_idx(GRIDS, (2, 2)).dtype
    assert (index == vllm._build_merge_gather_idx(GRIDS, (2, 2))).all()
    # The gather is vLLM's per-image reshape merger.
    x = torch.randn(sum(h * w for h, w in GRIDS), 5)
    merged = torch.cat(vllm.patch_merger(x, torch.tensor(GRIDS), (2, 2)))
    assert torch.equal(x[torch.from_numpy(index)].view(-1, 4, 5), merged)


def test_rope_table_matches_vllm_and_its_formula(vllm_source, kimi_vl_host):
    tower = kimi_vl_host.vision_tower
    vllm = _vllm_moonvit(vllm_source, tower)
    ours = tower.encoder.rope_2d.precomputed_freqs_cis("cpu")
    assert ours.dtype == torch.complex64
    assert torch.equal(ours, vllm.rope.precomputed_freqs_cis)
    # Column 2i turns with the patch column, 2i + 1 with its row.
    r, c, i = 37, 5, 3
    freq = 1e4 ** (-4 * i / 32)
    assert torch.allclose(ours[r, c, 2 * i].angle(), torch.tensor(c * freq))
    expected = math.atan2(math.sin(r * freq), math.cos(r * freq))
    assert math.isclose(ours[r, c, 2 * i + 1].angle().item(), expected, abs_tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rope_matches_vllm(vllm_source, kimi_vl_host, dtype):
    vllm = _vllm_moonvit(vllm_source, kimi_vl_host.vision_tower)
    table = rope_2d_table(32, 512, 512, 1e4)[:6, :10].reshape(-1, 16)
    q, k = torch.randn(2, 60, 2, 32, dtype=dtype)
    ours, theirs = apply_rope(q, k, table), vllm.apply_rope(q, k, table)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert ours[0].dtype == dtype


@pytest.mark.parametrize(
    "grids, kwargs",
    [
        (GRIDS, {}),
        ([(6, 10), (2, 2)], {"max_batch_size": 5}),
        ([(2, 40)], {"max_batch_size": 3, "max_seqlen_override": 512}),
    ],
)
def test_metadata_matches_vllm(vllm_source, kimi_vl_host, grids, kwargs):
    tower = kimi_vl_host.vision_tower
    vllm = _vllm_moonvit(vllm_source, tower)
    ours = tower.prepare_encoder_metadata(grids, **kwargs)
    theirs = vllm.prepare_encoder_metadata(grids, **kwargs)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        mine = ours[key]
        assert (mine.dtype, mine.device, mine.shape) == (
            value.dtype,
            value.device,
            value.shape,
        ), key
        assert torch.equal(mine, value), key


def test_metadata_values(kimi_vl_host):
    meta = kimi_vl_host.vision_tower.prepare_encoder_metadata(
        [(6, 10), (2, 2)], max_batch_size=4
    )
    assert meta["cu_seqlens"].tolist() == [0, 60, 64, 64, 64]
    assert meta["max_seqlen"].item() == 60 and meta["max_seqlen"].device.type == "cpu"
    # Image (6, 10): block (0, 1) gathers rows (0, 2), (0, 3), (1, 2), (1, 3).
    assert meta["merge_gather_idx"][4:8].tolist() == [2, 3, 12, 13]
    weight = kimi_vl_host.vision_tower.patch_embed.pos_emb.weight
    exact = kimi_vl_host.vision_tower.prepare_encoder_metadata([(8, 8)])
    assert torch.equal(exact["pos_embeds"], weight.flatten(end_dim=1))


# -- forward ------------------------------------------------------------------------


def test_packed_forward_equals_per_image(kimi_vl_host):
    tower = kimi_vl_host.vision_tower
    patches = _patches(kimi_vl_host, GRIDS)
    per_image, offset = [], 0
    for h, w in GRIDS:
        (features,) = tower(patches[offset : offset + h * w], [(h, w)])
        per_image.append(features)
        offset += h * w
    meta = tower.prepare_encoder_metadata(
        GRIDS, max_batch_size=8, max_seqlen_override=4 * offset
    )
    packed = tower(patches, None, encoder_metadata=meta)
    assert packed.shape == (offset // 4, 4, 64)
    _close(packed, torch.cat(per_image))
    legacy = tower(patches, torch.tensor(GRIDS))
    assert [t.shape[0] for t in legacy] == [h * w // 4 for h, w in GRIDS]
    _close(torch.cat(legacy), torch.cat(per_image))


def _dense_derivation(host, patches, grid):
    """Tower and projector for one image from the module weights, with the
    RoPE as real 2×2 rotations and the merger as vLLM's reshape."""
    tower, (h, w) = host.vision_tower, grid
    heads, dim = 2, 64
    head_dim = dim // heads
    weight = tower.patch_embed.proj.weight
    x = (
        patches.reshape(h * w, -1) @ weight.reshape(dim, -1).T
        + tower.patch_embed.proj.bias
    )
    pos = tower.patch_embed.pos_emb.weight.permute(2, 0, 1)[None]
    x = x + F.interpolate(pos, size=(h, w), mode="bicubic")[0].permute(1, 2, 0).reshape(
        -1, dim
    )
    rows = torch.arange(h * w) // w
    cols = torch.arange(h * w) % w
    pair = torch.arange(head_dim // 2)
    freq = 1e4 ** (-4 * (pair // 2) / head_dim)
    angle = torch.where(pair % 2 == 0, cols[:, None] * freq, rows[:, None] * freq)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]

    def rotate(t):
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack(
            [even * cos - odd * sin, even * sin + odd * cos], -1
        ).flatten(-2)

    for block in tower.encoder.blocks:
        q, k, v = (
            block.wqkv(
                F.layer_norm(x, (dim,), block.norm0.weight, block.norm0.bias, 1e-5)
            )
            .reshape(h * w, 3, heads, head_dim)
            .unbind(1)
        )
        probs = (
            torch.einsum("qhd,khd->hqk", rotate(q), rotate(k)) * head_dim**-0.5
        ).softmax(-1)
        x = x + block.wo(torch.einsum("hqk,khd->qhd", probs, v).reshape(h * w, dim))
        hidden = F.layer_norm(x, (dim,), block.norm1.weight, block.norm1.bias, 1e-5)
        x = x + block.mlp.fc1(F.gelu(block.mlp.fc0(hidden), approximate="tanh"))
    final = tower.encoder.final_layernorm
    x = F.layer_norm(x, (dim,), final.weight, final.bias, 1e-5)
    blocks = (
        x.view(h // 2, 2, w // 2, 2, dim).permute(0, 2, 1, 3, 4).reshape(-1, 4, dim)
    )
    projector = host.multi_modal_projector
    y = F.layer_norm(
        blocks, (dim,), projector.pre_norm.weight, projector.pre_norm.bias, 1e-5
    )
    y = F.gelu(projector.linear_1(y.reshape(-1, 4 * dim)))
    return projector.linear_2(y)


@pytest.mark.parametrize("grid", [(6, 10), (2, 40), (8, 8)])
def test_host_matches_an_independent_dense_derivation(kimi_vl_host, grid):
    patches = _patches(kimi_vl_host, [grid])
    (out,) = kimi_vl_host.eager_reference_outputs(
        {"pixel_values": patches, "image_grid_hws": torch.tensor([grid])}
    )
    _close(out, _dense_derivation(kimi_vl_host, patches, grid))


# -- vLLM's own mixin on the host --------------------------------------------------


def test_vllms_mixin_runs_on_the_host(vllm_source):
    """vLLM's hand-written mixin, captured and replayed by the runtime
    manager, gives the registry's reference outputs."""
    host = TOWER.build_host(
        vllm_mixin(vllm_source, KIMI, "KimiVLForConditionalGeneration", MIXIN_METHODS),
        "tiny",
        device="cpu",
        dtype=torch.float32,
        multimodal_config=MultiModalConfig(),
    )
    manager = manager_for(host, 512, token_budgets=[64, 300], max_items_per_batch=1)
    # The budget-300 dummy (one item of 300 tokens) is wider than the 256
    # blocks a RoPE row holds, so it wraps into two block rows.
    dummy = manager.budget_graphs["default"][300].input_buffers
    assert dummy["merge_gather_idx"].numel() == 4 * 512
    for seed, items in enumerate([[(6, 10), (2, 2)], [(2, 510)], [(8, 8)] * 3]):
        kwargs = TOWER.make_mm_kwargs(host, items, "cpu", seed=seed)
        outputs = manager.execute(kwargs)
        expected = TOWER.reference_outputs(host, kwargs)
        assert len(outputs) == len(expected)
        for out, ref in zip(outputs, expected, strict=True):
            _close(out, ref)
    assert manager.graph_hits == 6


# -- registry entry -----------------------------------------------------------------


def _processor_grid(width: int, height: int, config: KimiVLConfig):
    """The patch grid Kimi-VL's processor emits for a ``width×height`` image
    it does not downscale (pad right and bottom to 28 pixels), or ``None``."""
    p, (kh, kw) = 14, config.vision_config.merge_kernel_size
    if (width // p) * (height // p) > config.in_token_limit:
        return None
    h, w = -(-height // (kh * p)) * kh, -(-width // (kw * p)) * kw
    return None if max(h, w) >= 512 else (h, w)


def test_legal_grids_are_what_the_processor_emits(vllm_source):
    info = vllm_source.load(
        KIMI, ["get_num_image_tokens"], {"math": math}, cls="KimiVLProcessingInfo"
    )
    rng = random.Random(0)
    for size in ("tiny", "full"):
        config = TOWER.config(size)
        processor = SimpleNamespace(
            image_processor=SimpleNamespace(
                patch_size=14,
                merge_kernel_size=[2, 2],
                in_token_limit=config.in_token_limit,
            )
        )
        stand_in = SimpleNamespace(get_hf_processor=lambda p=processor: p)
        count = info["get_num_image_tokens"]
        for _ in range(400):
            width, height = rng.randint(1, 7200), rng.randint(1, 7200)
            grid = _processor_grid(width, height, config)
            if grid is None:
                continue
            assert TOWER.is_legal(grid, size)
            tokens = count(stand_in, image_width=width, image_height=height)
            assert TOWER.output_tokens(grid) == tokens
        for _ in range(200):
            h, w = TOWER.sample_item(rng, size)
            # The smallest image that pads to this grid has h - 2 whole
            # patches a side; the processor keeps it as it is.
            assert _processor_grid(14 * (w - 2) + 1, 14 * (h - 2) + 1, config) == (h, w)
    assert not TOWER.is_legal((4, 512), "full")  # the processor refuses it
    assert not TOWER.is_legal((3, 4), "full") and not TOWER.is_legal((4, 4, 1), "full")
    assert not TOWER.is_legal((68, 68), "full")  # 66 · 66 patches > 4096


def test_mm_kwargs_layout(kimi_vl_host):
    grids = [(6, 10), (2, 2)]
    kwargs = TOWER.make_mm_kwargs(kimi_vl_host, grids, "cpu", seed=4)
    assert set(kwargs) == {"pixel_values", "image_grid_hws"}
    pixels, grid = kwargs["pixel_values"], kwargs["image_grid_hws"]
    assert pixels.shape == (64, 3, 14, 14) and pixels.dtype == torch.float32
    assert grid.tolist() == [[6, 10], [2, 2]]
    assert grid.dtype == torch.int64 and grid.device.type == "cpu"
    generator = torch.Generator().manual_seed(4)
    image = torch.rand((3, 6 * 14, 10 * 14), generator=generator) * 2 - 1
    assert torch.equal(pixels[13], image[:, 14:28, 42:56])  # row 1, column 3
    bf16 = TOWER.build_host(object, "tiny", device="cpu", dtype=torch.bfloat16)
    assert (
        TOWER.make_mm_kwargs(bf16, grids, "cpu")["pixel_values"].dtype == torch.bfloat16
    )
    outputs = TOWER.reference_outputs(kimi_vl_host, kwargs)
    assert [o.shape for o in outputs] == [(15, 96), (1, 96)]
