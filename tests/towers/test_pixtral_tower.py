"""Pixtral reference tower (Mistral format): configuration, vLLM's own code
from the wheel run on the tower's modules and weights (RoPE table and
rotation, RMSNorm, gated MLP, attention, block, vision transformer, patch
merger, the host's ``_process_image_input``), packed == per image, the
registry entry."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from tower_testlib import host_for_config, manager_for
from towers_vllm_source import bind, runtime_namespace

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from reference_towers.pixtral import (
    PATCH_MERGE,
    PixtralConfig,
    PixtralVisionHost,
    VisionEncoderArgs,
    apply_rotary_emb_vit,
    packed_sequence_metadata,
    precompute_freqs_cis_2d,
)
from reference_towers.registry import REFERENCE_TOWERS, generated_mixin

TOWER = REFERENCE_TOWERS["pixtral"]
PIXTRAL = "vllm/model_executor/models/pixtral.py"
ACTIVATION = "vllm/model_executor/layers/activation.py"
RMS_NORM = "vllm/ir/ops/layernorm.py"
MM_ATTENTION = "vllm/model_executor/layers/attention/mm_encoder_attention.py"
# (H, W) pixels of whole 28-px cells: one cell, strips, the largest, odd sides.
SIZES = [(28, 28), (224, 224), (56, 196), (196, 28), (84, 140)]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def _images(host, sizes, seed=0) -> list[torch.Tensor]:
    images = TOWER.make_mm_kwargs(host, sizes, "cpu", seed=seed)["images"]
    return list(images)


def _no_merger_config() -> PixtralConfig:
    """The tiny tower shaped as Pixtral-12B: no norm, no merger."""
    tiny = PixtralConfig.tiny()
    return dataclasses.replace(
        tiny,
        vision_config=dataclasses.replace(
            tiny.vision_config,
            spatial_merge_size=1,
            add_pre_mm_projector_layer_norm=False,
            mm_projector_id="",
        ),
        max_image_size=224,
    )


@pytest.fixture(scope="module")
def no_merger_host() -> PixtralVisionHost:
    return host_for_config(TOWER, _no_merger_config())


# -- vLLM's code from the wheel ------------------------------------------------


@pytest.fixture(scope="module")
def vllm(vllm_source) -> SimpleNamespace:
    """vLLM's Pixtral functions and methods, compiled from the wheel into one
    namespace (torch, and stand-ins for the distributed helpers: one rank)."""
    ns = runtime_namespace()
    ns.update(
        is_vit_use_data_parallel=lambda: False,
        get_tensor_model_parallel_world_size=lambda: 1,
        maybe_fused_act_quant=lambda act_fn, x, linear: act_fn(x),
        maybe_get_oot_by_class=lambda cls: cls,
    )
    ns["MMEncoderAttention"] = vllm_source.make_class(
        "MMEncoderAttention",
        MM_ATTENTION,
        "MMEncoderAttention",
        ["compute_max_seqlen", "maybe_compute_seq_lens", "maybe_recompute_cu_seqlens"],
        ns,
    )
    functions = vllm_source.load(
        PIXTRAL,
        [
            "precompute_freqs_cis_2d",
            "_apply_rotary_emb_vit_complex",
            "_apply_rotary_emb_vit_real",
            "apply_rotary_emb_vit",
            "position_meshgrid",
            "get_sub_grids",
            "_make_packed_sequence_metadata",
        ],
        ns,
    )
    (rms_norm,) = vllm_source.load(RMS_NORM, ["rms_norm"], ns).values()
    silu_and_mul = vllm_source.make_class(
        "SiluAndMul", ACTIVATION, "SiluAndMul", ["forward_native"], ns
    )

    def methods(cls: str, names: list[str]) -> dict:
        return vllm_source.load(PIXTRAL, names, ns, cls=cls)

    return SimpleNamespace(
        **functions,
        rms_norm=rms_norm,
        silu_and_mul=silu_and_mul.forward_native,
        feed_forward=methods("FeedForward", ["forward"]),
        attention=methods("Attention", ["forward"]),
        block=methods("TransformerBlock", ["forward"]),
        transformer=methods("Transformer", ["forward"]),
        vision_transformer=methods("VisionTransformer", ["forward"]),
        merger=methods("PatchMerger", ["forward", "permute"]),
        adapter=methods("VisionLanguageAdapter", ["forward"]),
        host=methods("PixtralForConditionalGeneration", ["_process_image_input"]),
        ns=ns,
    )


def _vllm_norm(vllm, norm):
    return lambda x: vllm.rms_norm(x, norm.weight, norm.variance_epsilon)


def _vllm_block(vllm, block):
    """``block``'s weights under vLLM's block, attention and MLP code."""
    ff = block.feed_forward
    feed_forward = bind(
        SimpleNamespace(
            gate_up_proj=ff.gate_up_proj,
            down_proj=ff.down_proj,
            act_fn=vllm.silu_and_mul,
        ),
        vllm.feed_forward,
    )
    att = block.attention
    attention = bind(
        SimpleNamespace(
            qkv_proj=att.qkv_proj,
            o_proj=att.o_proj,
            attn=att.attn,
            n_heads=att.n_heads,
            head_dim=att.head_dim,
        ),
        vllm.attention,
    )
    stand_in = bind(
        SimpleNamespace(
            attention=attention,
            feed_forward=feed_forward,
            attention_norm=_vllm_norm(vllm, block.attention_norm),
            ffn_norm=_vllm_norm(vllm, block.ffn_norm),
        ),
        vllm.block,
    )
    return stand_in.forward


def _packed_inputs(host, sizes, seed=0):
    """``(x, freqs_cis, cu_seqlens, max_seqlen)`` of the tower's blocks for
    images of ``sizes``, built by the tower."""
    encoder = host.vision_encoder
    p = encoder.args.patch_size
    grids = [(h // p, w // p) for h, w in sizes]
    x = torch.randn((1, sum(h * w for h, w in grids), encoder.args.hidden_size))
    positions = torch.cat(
        [torch.cartesian_prod(torch.arange(h), torch.arange(w)) for h, w in grids]
    )
    freqs = encoder.freqs_cis[positions[:, 0], positions[:, 1]]
    cu, longest, _ = packed_sequence_metadata(
        [h * w for h, w in grids], AttentionBackendEnum.FLASH_ATTN, "cpu"
    )
    return x, freqs, cu, longest


def test_rope_table_is_vllms(vllm):
    for dim, side, theta in ((32, 16, 10000.0), (64, 110, 10000.0), (8, 3, 100.0)):
        ours = precompute_freqs_cis_2d(dim, side, side, theta)
        theirs = vllm.precompute_freqs_cis_2d(dim, side, side, theta)
        assert ours.dtype == theirs.dtype == torch.complex64
        _close(torch.view_as_real(ours), torch.view_as_real(theirs))


def test_rope_rotation_is_vllms(vllm):
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn((2, 1, 30, 2, 32), generator=generator)
    table = torch.view_as_real(precompute_freqs_cis_2d(32, 6, 5, 1e4)).reshape(
        30, 16, 2
    )
    for ours, theirs in zip(
        apply_rotary_emb_vit(q, k, table),
        vllm.apply_rotary_emb_vit(q, k, table),
        strict=True,
    ):
        _close(ours, theirs)
    # The real form vLLM runs under torch.compile agrees too.
    _close(
        apply_rotary_emb_vit(q, k, table)[0],
        vllm._apply_rotary_emb_vit_real(q, k, table)[0],
    )
    with pytest.raises(TypeError, match="float32"):
        apply_rotary_emb_vit(q, k, table.double())


@pytest.mark.parametrize(
    "backend",
    [AttentionBackendEnum.FLASH_ATTN, AttentionBackendEnum.TORCH_SDPA],
)
def test_sequence_metadata_is_vllms(vllm, backend):
    lengths = [4, 64, 1, 30]
    ours = packed_sequence_metadata(lengths, backend, "cpu")
    theirs = vllm._make_packed_sequence_metadata(lengths, backend, 64, 1, "cpu")
    assert ours[0].dtype == theirs[0].dtype == torch.int32
    assert ours[0].tolist() == theirs[0].tolist() == [0, 4, 68, 69, 99]
    assert ours[1].dtype == theirs[1].dtype == torch.int32
    assert ours[1].device.type == "cpu"
    assert int(ours[1]) == int(theirs[1]) == (64 if backend.name == "FLASH_ATTN" else 0)
    assert ours[2] is None and theirs[2] is None
    with pytest.raises(ValueError, match="FLASHINFER"):
        packed_sequence_metadata(lengths, AttentionBackendEnum.FLASHINFER, "cpu")


def test_block_is_vllms(vllm, pixtral_host):
    x, freqs, cu, longest = _packed_inputs(pixtral_host, SIZES)
    for block in pixtral_host.vision_encoder.transformer.layers:
        kwargs = {
            "freqs_cis": freqs,
            "cu_seqlens": cu,
            "max_seqlen": longest,
            "sequence_lengths": None,
        }
        _close(block(x, **kwargs), _vllm_block(vllm, block)(x, **kwargs))


class _Layer:
    """A block under vLLM's code, where vLLM's forward looks for the
    attention backend (``layers[0].attention.attn``)."""

    def __init__(self, vllm, block) -> None:
        self.attention = block.attention
        self._forward = _vllm_block(vllm, block)

    def __call__(self, x, **kwargs):
        return self._forward(x, **kwargs)


def test_vision_transformer_is_vllms(vllm, pixtral_host):
    encoder = pixtral_host.vision_encoder
    layers = [_Layer(vllm, b) for b in encoder.transformer.layers]
    loop = type("Transformer", (), {"__call__": vllm.transformer["forward"]})()
    loop.layers = layers
    stand_in = bind(
        SimpleNamespace(
            args=encoder.args,
            patch_conv=encoder.patch_conv,
            ln_pre=_vllm_norm(vllm, encoder.ln_pre),
            transformer=loop,
            freqs_cis=encoder.freqs_cis,
            dtype=encoder.dtype,
        ),
        vllm.vision_transformer,
    )
    images = _images(pixtral_host, SIZES)
    ours, theirs = encoder(images), stand_in.forward(images)
    assert len(ours) == len(theirs) == len(SIZES)
    for a, b in zip(ours, theirs, strict=True):
        _close(a, b)


def test_patch_merger_is_vllms(vllm, pixtral_host):
    merger = pixtral_host.patch_merger
    stand_in = bind(
        SimpleNamespace(
            spatial_merge_size=merger.spatial_merge_size,
            merging_layer=merger.merging_layer,
        ),
        vllm.merger,
    )
    grids = [(1 * 2, 1 * 2), (16, 16), (4, 14), (14, 2), (6, 10)]
    x = torch.randn((sum(h * w for h, w in grids), 64))
    _close(merger(x, image_sizes=grids), stand_in.forward(x, image_sizes=grids))
    # Windows are channel-major: entry d·m² + i·m + j is channel d of patch
    # (i, j) of the window.
    permuted = merger.permute(x[:4], [(2, 2)])
    assert torch.equal(permuted[0].view(64, 4), x[:4].t())


@pytest.mark.parametrize("host_name", ["pixtral_host", "no_merger_host"])
def test_process_image_input_is_vllms(vllm, host_name, request):
    """vLLM's ``_process_image_input`` on the host's modules (with vLLM's
    merger and adapter code) gives the host's own result, for a list of
    images of several sizes and for a stacked tensor."""
    host = request.getfixturevalue(host_name)
    stand_in = bind(
        SimpleNamespace(
            vision_args=host.vision_args,
            vision_encoder=host.vision_encoder,
            pre_mm_projector_norm=(
                None
                if host.pre_mm_projector_norm is None
                else _vllm_norm(vllm, host.pre_mm_projector_norm)
            ),
            patch_merger=(
                None
                if host.patch_merger is None
                else bind(
                    SimpleNamespace(
                        spatial_merge_size=host.patch_merger.spatial_merge_size,
                        merging_layer=host.patch_merger.merging_layer,
                    ),
                    vllm.merger,
                ).forward
            ),
            vision_language_adapter=bind(
                SimpleNamespace(
                    w_in=host.vision_language_adapter.w_in,
                    gelu=host.vision_language_adapter.gelu,
                    w_out=host.vision_language_adapter.w_out,
                ),
                vllm.adapter,
            ).forward,
        ),
        vllm.host,
    )
    for images in (
        _images(host, SIZES, seed=4),
        TOWER.make_mm_kwargs(host, [(84, 140)] * 3, "cpu", seed=5)["images"],
    ):
        ours = host._process_image_input({"images": images})
        theirs = stand_in._process_image_input({"images": images})
        assert [o.shape for o in ours] == [t.shape for t in theirs]
        for a, b in zip(ours, theirs, strict=True):
            _close(a, b)


# -- configuration ----------------------------------------------------------------


def test_full_config_values():
    config = PixtralConfig.full()
    v = config.vision_config
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads) == (1024, 24, 16)
    assert (v.intermediate_size, v.patch_size, v.image_size) == (4096, 14, 1540)
    assert (v.spatial_merge_size, v.mm_projector_id) == (2, PATCH_MERGE)
    assert v.add_pre_mm_projector_layer_norm and not v.adapter_bias
    assert (v.rope_theta, v.image_token_id) == (10000.0, 10)
    assert (config.max_image_size, config.max_tokens_per_side) == (1540, 55)
    assert config.text_config.hidden_size == 5120
    assert config.max_model_len == 131072
    pixtral = PixtralConfig.pixtral_12b()
    p = pixtral.vision_config
    assert (p.patch_size, p.image_size, p.spatial_merge_size) == (16, 1024, 1)
    assert p.adapter_bias and not p.add_pre_mm_projector_layer_norm
    assert p.mm_projector_id == "" and pixtral.max_tokens_per_side == 64


def test_tiny_config_keeps_the_released_cell():
    tiny, full = PixtralConfig.tiny(), PixtralConfig.full()
    assert tiny.cell == full.cell == 28 and tiny.patch_size == full.patch_size
    assert tiny.max_tokens_per_side**2 == 64
    assert tiny.text_config.hidden_size not in (64, 4 * 64)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 36, "num_attention_heads": 2}, "multiple of 4"),
        ({"hidden_size": 30, "num_attention_heads": 4}, "multiple of num_attention"),
        ({"spatial_merge_size": 2}, "needs the patch merger"),
        ({"mm_projector_id": "mlp"}, "unknown mm_projector_id"),
        ({"image_size": 1000}, "multiple of patch_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be positive"),
    ],
)
def test_vision_args_refuse_what_the_tower_cannot_run(change, message):
    with pytest.raises(ValueError, match=message):
        VisionEncoderArgs(**change)


def test_config_refuses_an_image_size_off_the_cells():
    with pytest.raises(ValueError, match="not a multiple"):
        dataclasses.replace(PixtralConfig.full(), max_image_size=1530)
    with pytest.raises(ValueError, match="RoPE table"):
        dataclasses.replace(PixtralConfig.pixtral_12b(), max_image_size=1040)


def test_full_host_has_vllms_parameter_names_and_shapes():
    with torch.device("meta"):
        host = PixtralVisionHost(PixtralConfig.full())
    shapes = {name: tuple(p.shape) for name, p in host.named_parameters()}
    assert shapes == {
        "vision_encoder.patch_conv.weight": (1024, 3, 14, 14),
        "vision_encoder.ln_pre.weight": (1024,),
        **{
            f"vision_encoder.transformer.layers.{i}.{name}": shape
            for i in range(24)
            for name, shape in (
                ("attention.qkv_proj.weight", (3072, 1024)),
                ("attention.o_proj.weight", (1024, 1024)),
                ("feed_forward.gate_up_proj.weight", (8192, 1024)),
                ("feed_forward.down_proj.weight", (1024, 4096)),
                ("attention_norm.weight", (1024,)),
                ("ffn_norm.weight", (1024,)),
            )
        },
        "pre_mm_projector_norm.weight": (1024,),
        "patch_merger.merging_layer.weight": (1024, 4096),
        "vision_language_adapter.w_in.weight": (5120, 1024),
        "vision_language_adapter.w_out.weight": (5120, 5120),
    }
    assert host.vision_language_adapter.w_out.output_size == 5120
    assert host.vision_encoder.max_patches_per_side == 110
    with torch.device("meta"):
        pixtral = PixtralVisionHost(PixtralConfig.pixtral_12b())
    assert pixtral.patch_merger is None and pixtral.pre_mm_projector_norm is None
    assert pixtral.vision_language_adapter.w_in.bias is not None


def test_attention_backend_is_the_blocks(pixtral_host):
    attn = pixtral_host.vision_encoder.transformer.layers[0].attention.attn
    assert attn.attn_backend is AttentionBackendEnum.FLASH_ATTN
    assert pixtral_host.vision_encoder.attn_backend is attn.attn_backend


# -- packing and the registry ----------------------------------------------------


def test_packed_forward_equals_per_image(pixtral_host):
    """One forward over every image (vLLM's) gives each image what it gets
    alone: attention never crosses images, the merger works per image."""
    images = _images(pixtral_host, SIZES, seed=6)
    packed = pixtral_host._process_image_input({"images": images})
    alone = TOWER.reference_outputs(pixtral_host, {"images": images})
    for a, b in zip(packed, alone, strict=True):
        _close(a, b)
    # ... and a wrong sequence split changes them.
    encoder = pixtral_host.vision_encoder
    merged = encoder.transformer(
        *_packed_inputs(pixtral_host, SIZES[:2])[:2],
        cu_seqlens=torch.tensor([0, 4 + 256], dtype=torch.int32),
        max_seqlen=torch.tensor(260, dtype=torch.int32),
        sequence_lengths=None,
    )
    split = encoder.transformer(
        *_packed_inputs(pixtral_host, SIZES[:2])[:4], sequence_lengths=None
    )
    assert not torch.allclose(merged, split)


def test_mm_kwargs_layout(pixtral_host):
    mixed = TOWER.make_mm_kwargs(pixtral_host, SIZES, "cpu", seed=1)["images"]
    assert isinstance(mixed, list)
    assert [tuple(i.shape) for i in mixed] == [(3, h, w) for h, w in SIZES]
    assert all(i.dtype == torch.float32 for i in mixed)
    # CLIP-normalised pixels of [0, 1].
    low = (0 - 0.48145466) / 0.26862954
    assert all(float(i.min()) >= low - 1e-5 for i in mixed)
    same = TOWER.make_mm_kwargs(pixtral_host, [(56, 84)] * 2, "cpu")["images"]
    assert isinstance(same, torch.Tensor) and same.shape == (2, 3, 56, 84)
    assert TOWER.make_mm_kwargs(pixtral_host, [], "cpu") == {"images": []}
    with pytest.raises(ValueError, match="whole 28-px cells"):
        TOWER.make_mm_kwargs(pixtral_host, [(28, 30)], "cpu")


def test_item_arithmetic():
    assert TOWER.input_size((56, 196)) == 4 * 14
    assert TOWER.output_tokens((56, 196)) == 2 * 7
    assert TOWER.smallest_item("tiny") == (28, 28)
    assert TOWER.max_output_tokens("tiny") == 64
    assert TOWER.max_output_tokens("full") == 55 * 55
    assert TOWER.is_legal((224, 28), "tiny") and TOWER.is_legal((1540, 28), "full")
    for bad in ((252, 28), (28, 42), (0, 28), (28,), (28.0, 28)):
        assert not TOWER.is_legal(bad, "tiny")
    rng = random.Random(0)
    with pytest.raises(ValueError, match="no legal"):
        TOWER.legal_grid(rng, "tiny", output_tokens=11)  # 11 cells: no 8 x 8 fit
    item = TOWER.legal_grid(rng, "tiny", output_tokens=12)
    assert TOWER.output_tokens(item) == 12 and TOWER.is_legal(item, "tiny")


def test_generated_mixin_on_the_pixtral_12b_form():
    """The generated mixin on the tower without merger and norm (Pixtral-12B's
    form, 14-px cells here): replays and eager fallbacks equal the host's own
    per-image forward (the registry's sizes have the merger; this is the
    spec's other branch)."""
    mixin = generated_mixin("pixtral")
    host = host_for_config(TOWER, _no_merger_config(), mixin)
    manager = manager_for(host, 512, token_budgets=[64, 128], max_items_per_batch=4)
    generator = torch.Generator().manual_seed(0)
    batches = [
        [(28, 28), (224, 42)],  # 4 and 48 tokens
        [(112, 70)] * 3,  # 40 tokens each: two replays
        [(14, 14), (224, 224)],  # one token; 256 tokens run eagerly
    ]
    for sizes in batches:
        images = [torch.randn((3, h, w), generator=generator) for h, w in sizes]
        outputs = manager.execute({"images": images})
        expected = TOWER.reference_outputs(host, {"images": images})
        assert [o.shape[0] for o in outputs] == [
            (h // 14) * (w // 14) for h, w in sizes
        ]
        for out, ref in zip(outputs, expected, strict=True):
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert manager.graph_hits > 0 and manager.graph_misses > 0
