"""Mistral3 reference tower (HF Pixtral tower + projector): configuration,
vLLM's own code from the wheel run on the tower's modules and weights
(``pixtral_patch_embed``, gated MLP, attention, block, transformer, vision
model forward, patch merger, projector, the host's
``_process_image_input``), Transformers' axial RoPE read from its source,
packed == per image, the registry entry."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from towers_vllm_source import bind, runtime_namespace

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from reference_towers.mistral3 import (
    Mistral3Config,
    Mistral3VisionHost,
    PixtralVisionConfig,
)
from reference_towers.pixtral import packed_sequence_metadata
from reference_towers.registry import REFERENCE_TOWERS

TOWER = REFERENCE_TOWERS["mistral3"]
PIXTRAL = "vllm/model_executor/models/pixtral.py"
MISTRAL3 = "vllm/model_executor/models/mistral3.py"
ACTIVATION = "vllm/model_executor/layers/activation.py"
RMS_NORM = "vllm/ir/ops/layernorm.py"
#: Transformers' Pixtral modelling (the RoPE vLLM imports), from the
#: real-vLLM test venv's copy (5.20.2) when there is one.
TRANSFORMERS_PIXTRAL = "transformers/models/pixtral/modeling_pixtral.py"
# (H, W) pixels of whole 28-px cells: one cell, strips, the largest, odd sides.
SIZES = [(28, 28), (224, 224), (56, 196), (196, 28), (84, 140)]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def _images(host, sizes, seed=0) -> list[torch.Tensor]:
    return list(TOWER.make_mm_kwargs(host, sizes, "cpu", seed=seed)["pixel_values"])


@pytest.fixture(scope="module")
def transformers_rope() -> SimpleNamespace:
    """Transformers' axial ``PixtralVisionRotaryEmbedding`` (its parameter
    computation, forward and recomposition) and ``apply_rotary_pos_emb``,
    compiled from its source."""
    found = sorted(
        (Path.home() / ".cache" / "gen-mixin" / "vllm-venv").glob(
            f"lib/python3*/site-packages/{TRANSFORMERS_PIXTRAL}"
        )
    )
    if not found:
        pytest.skip("Transformers (the real-vLLM test venv's) is not available")
    tree = ast.parse(found[0].read_text(encoding="utf-8"))
    wanted = {"rotate_half", "apply_rotary_pos_emb"}
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    (rope,) = [
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and n.name == "PixtralVisionRotaryEmbedding"
    ]
    methods = {"compute_axial_rope_parameters", "forward", "recomposition_frequencies"}
    rope.body = [
        m for m in rope.body if isinstance(m, ast.FunctionDef) and m.name in methods
    ]
    rope.bases, rope.decorator_list = [], []
    for node in [*body, rope]:
        for function in ast.walk(node):
            if isinstance(function, ast.FunctionDef):
                function.decorator_list = [
                    d
                    for d in function.decorator_list
                    if isinstance(d, ast.Name) and d.id == "staticmethod"
                ]
    namespace = {"torch": torch, "Callable": object, "PixtralVisionConfig": object}
    module = ast.fix_missing_locations(ast.Module(body=[*body, rope], type_ignores=[]))
    # Transformers' own source, from the pinned venv.
    exec(compile(module, TRANSFORMERS_PIXTRAL, "exec"), namespace)  # noqa: S102
    return SimpleNamespace(
        **{k: namespace[k] for k in wanted}, rope=namespace[rope.name]
    )


@pytest.fixture(scope="module")
def vllm(vllm_source) -> SimpleNamespace:
    """vLLM's HF Pixtral and Mistral3 code, compiled from the wheel (one
    rank; the axial RoPE of Transformers 5.17 and later)."""
    ns = runtime_namespace()
    ns.update(
        is_vit_use_data_parallel=lambda: False,
        get_tensor_model_parallel_world_size=lambda: 1,
        maybe_fused_act_quant=lambda act_fn, x, linear: act_fn(x),
        TRANSFORMERS_WITH_AXIAL_ROPE=True,
        resolve_visual_encoder_outputs=lambda out, norm, **kw: out,
    )
    ns["_make_packed_sequence_metadata"] = lambda lengths, backend, *_: (
        packed_sequence_metadata(lengths, backend, "cpu")
    )
    functions = vllm_source.load(
        PIXTRAL, ["position_ids_in_meshgrid", "pixtral_patch_embed"], ns
    )
    (rms_norm,) = vllm_source.load(RMS_NORM, ["rms_norm"], ns).values()
    silu_and_mul = vllm_source.make_class(
        "SiluAndMul", ACTIVATION, "SiluAndMul", ["forward_native"], ns
    )

    def methods(path: str, cls: str, names: list[str]) -> dict:
        return vllm_source.load(path, names, ns, cls=cls)

    return SimpleNamespace(
        **functions,
        rms_norm=rms_norm,
        silu_and_mul=silu_and_mul.forward_native,
        mlp=methods(PIXTRAL, "PixtralHFMLP", ["forward"]),
        attention=methods(PIXTRAL, "PixtralHFAttention", ["forward"]),
        block=methods(PIXTRAL, "PixtralHFTransformerBlock", ["forward"]),
        transformer=methods(PIXTRAL, "PixtralHFTransformer", ["forward"]),
        vision_model=methods(PIXTRAL, "PixtralHFVisionModel", ["forward"]),
        merger=methods(MISTRAL3, "Mistral3PatchMerger", ["forward"]),
        projector=methods(MISTRAL3, "Mistral3MultiModalProjector", ["forward"]),
        host=methods(
            MISTRAL3, "Mistral3ForConditionalGeneration", ["_process_image_input"]
        ),
        ns=ns,
    )


def _vllm_norm(vllm, norm):
    return lambda x: vllm.rms_norm(x, norm.weight, norm.variance_epsilon)


class _Layer:
    """A block under vLLM's block, attention and MLP code, where vLLM's
    forward looks for the attention (``layers[0].attention.attn``)."""

    def __init__(self, vllm, block, apply_rotary_pos_emb) -> None:
        vllm.ns["apply_rotary_pos_emb"] = apply_rotary_pos_emb
        self.attention = bind(
            SimpleNamespace(
                qkv_proj=block.attention.qkv_proj,
                o_proj=block.attention.o_proj,
                attn=block.attention.attn,
                n_heads=block.attention.n_heads,
                head_dim=block.attention.head_dim,
                tp_size=1,
            ),
            vllm.attention,
        )
        feed_forward = bind(
            SimpleNamespace(
                gate_up_proj=block.feed_forward.gate_up_proj,
                down_proj=block.feed_forward.down_proj,
                act_and_mul=vllm.silu_and_mul,
            ),
            vllm.mlp,
        )
        self._block = bind(
            SimpleNamespace(
                attention=self.attention,
                feed_forward=feed_forward,
                attention_norm=_vllm_norm(vllm, block.attention_norm),
                ffn_norm=_vllm_norm(vllm, block.ffn_norm),
            ),
            vllm.block,
        )

    def __call__(self, *args, **kwargs):
        return self._block.forward(*args, **kwargs)


def _vllm_tower(vllm, tower, transformers_rope):
    """``tower``'s modules under vLLM's ``PixtralHFVisionModel.forward``
    with vLLM's transformer, block, attention and MLP code, and
    Transformers' RoPE."""
    layers = [
        _Layer(vllm, b, transformers_rope.apply_rotary_pos_emb)
        for b in tower.transformer.layers
    ]
    loop = type("Transformer", (), {"__call__": vllm.transformer["forward"]})()
    loop.layers = layers
    rope = transformers_rope.rope.__new__(transformers_rope.rope)
    rope.config = SimpleNamespace(
        rope_parameters={"rope_theta": tower.config.rope_theta},
        hidden_size=tower.config.hidden_size,
        num_attention_heads=tower.config.num_attention_heads,
        head_dim=tower.config.head_dim,
    )
    rope.inv_freq, rope.attention_scaling = rope.compute_axial_rope_parameters(
        rope.config
    )
    return bind(
        SimpleNamespace(
            config=tower.config,
            input_norm=tower.input_norm,
            patch_conv=tower.patch_conv,
            ln_pre=_vllm_norm(vllm, tower.ln_pre),
            transformer=loop,
            patch_positional_embedding=lambda x, ids: rope.forward(x, ids),
            dtype=tower.dtype,
            device=tower.device,
        ),
        vllm.vision_model,
    )


def test_rope_is_transformers(transformers_rope, mistral3_host):
    ours = mistral3_host.vision_tower.patch_positional_embedding
    theirs = transformers_rope.rope.__new__(transformers_rope.rope)
    config = SimpleNamespace(
        rope_parameters={"rope_theta": 10000.0}, head_dim=32, hidden_size=64,
        num_attention_heads=2,
    )  # fmt: skip
    theirs.inv_freq, theirs.attention_scaling = theirs.compute_axial_rope_parameters(
        config
    )
    assert ours.inv_freq.dtype == torch.float32 and ours.inv_freq.ndim == 1
    _close(ours.inv_freq, theirs.inv_freq)
    ids = torch.cartesian_prod(torch.arange(16), torch.arange(9))
    x = torch.zeros((0,), dtype=torch.bfloat16)
    for a, b in zip(ours(x, ids), theirs.forward(x, ids), strict=True):
        assert a.dtype == b.dtype == torch.bfloat16
        assert torch.equal(a, b)


def test_patch_embed_is_vllms(vllm, mistral3_host):
    tower = mistral3_host.vision_tower
    images = _images(mistral3_host, SIZES)
    theirs, embeds = vllm.pixtral_patch_embed(
        images, tower.patch_conv.weight, tower.input_norm
    )
    ours = tower.patch_conv(images[1].unsqueeze(0)).flatten(2).transpose(1, 2)
    offset = 4  # the first image's patches
    _close(theirs[:, offset : offset + 256], ours)
    assert [tuple(e.shape[-2:]) for e in embeds] == [
        (h // 14, w // 14) for h, w in SIZES
    ]


def test_vision_model_is_vllms(vllm, mistral3_host, transformers_rope):
    tower = mistral3_host.vision_tower
    stand_in = _vllm_tower(vllm, tower, transformers_rope)
    images = _images(mistral3_host, SIZES, seed=2)
    ours, theirs = tower(images), stand_in.forward(images)
    assert len(ours) == len(theirs) == len(SIZES)
    for a, b in zip(ours, theirs, strict=True):
        _close(a, b)


def test_process_image_input_is_vllms(vllm, mistral3_host):
    """vLLM's ``_process_image_input`` with vLLM's projector and merger code
    on the host's modules gives the host's result, for a list of images of
    several sizes and for a stacked tensor."""
    host = mistral3_host
    projector = host.multi_modal_projector
    merger = bind(
        SimpleNamespace(
            spatial_merge_size=projector.patch_merger.spatial_merge_size,
            patch_size=projector.patch_merger.patch_size,
            merging_layer=projector.patch_merger.merging_layer,
        ),
        vllm.merger,
    )
    stand_in = bind(
        SimpleNamespace(
            config=host.config,
            vision_tower=host.vision_tower,
            multi_modal_projector=bind(
                SimpleNamespace(
                    norm=_vllm_norm(vllm, projector.norm),
                    patch_merger=merger.forward,
                    linear_1=projector.linear_1,
                    act=projector.act,
                    linear_2=projector.linear_2,
                ),
                vllm.projector,
            ).forward,
        ),
        vllm.host,
    )
    for images in (
        _images(host, SIZES, seed=4),
        TOWER.make_mm_kwargs(host, [(84, 140)] * 3, "cpu", seed=5)["pixel_values"],
        _images(host, [(56, 28)], seed=6),
    ):
        image_input = {"type": "pixel_values_pixtral", "pixel_values": images}
        ours = host._process_image_input(image_input)
        theirs = stand_in._process_image_input(image_input)
        assert [o.shape for o in ours] == [t.shape for t in theirs]
        for a, b in zip(ours, theirs, strict=True):
            _close(a, b)


def test_packed_forward_equals_per_image(mistral3_host):
    images = _images(mistral3_host, SIZES, seed=7)
    packed = mistral3_host.embed_multimodal(pixel_values=images)
    alone = TOWER.reference_outputs(mistral3_host, {"pixel_values": images})
    for a, b in zip(packed, alone, strict=True):
        _close(a, b)


def test_full_config_values():
    config = Mistral3Config.full()
    v = config.vision_config
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads) == (1024, 24, 16)
    assert (v.intermediate_size, v.patch_size, v.image_size) == (4096, 14, 1540)
    assert (v.hidden_act, v.rope_theta) == ("silu", 10000.0)
    assert (config.spatial_merge_size, config.projector_hidden_act) == (2, "gelu")
    assert not config.multimodal_projector_bias and config.vision_feature_layer == -1
    assert config.text_config.hidden_size == 5120 and config.max_model_len == 131072
    tiny = Mistral3Config.tiny()
    assert tiny.cell == config.cell == 28 and tiny.max_tokens_per_side**2 == 64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": 36, "num_attention_heads": 2}, "multiple of 4"),
        ({"hidden_act": "relu"}, "unknown hidden_act"),
    ],
)
def test_vision_config_refuses_what_the_tower_cannot_run(change, message):
    with pytest.raises(ValueError, match=message):
        PixtralVisionConfig(**change)


def test_full_host_has_vllms_parameter_names_and_shapes():
    with torch.device("meta"):
        host = Mistral3VisionHost(Mistral3Config.full())
    shapes = {name: tuple(p.shape) for name, p in host.named_parameters()}
    assert shapes == {
        "vision_tower.patch_conv.weight": (1024, 3, 14, 14),
        "vision_tower.ln_pre.weight": (1024,),
        **{
            f"vision_tower.transformer.layers.{i}.{name}": shape
            for i in range(24)
            for name, shape in (
                ("attention_norm.weight", (1024,)),
                ("attention.qkv_proj.weight", (3072, 1024)),
                ("attention.o_proj.weight", (1024, 1024)),
                ("feed_forward.gate_up_proj.weight", (8192, 1024)),
                ("feed_forward.down_proj.weight", (1024, 4096)),
                ("ffn_norm.weight", (1024,)),
            )
        },
        "multi_modal_projector.norm.weight": (1024,),
        "multi_modal_projector.patch_merger.merging_layer.weight": (1024, 4096),
        "multi_modal_projector.linear_1.weight": (5120, 1024),
        "multi_modal_projector.linear_2.weight": (5120, 5120),
    }
    attn = host.vision_tower.transformer.layers[0].attention.attn
    assert attn.attn_backend is AttentionBackendEnum.FLASH_ATTN


def test_mm_kwargs_layout(mistral3_host):
    mixed = TOWER.make_mm_kwargs(mistral3_host, SIZES, "cpu", seed=1)
    assert list(mixed) == ["pixel_values"]
    assert [tuple(i.shape) for i in mixed["pixel_values"]] == [
        (3, h, w) for h, w in SIZES
    ]
    same = TOWER.make_mm_kwargs(mistral3_host, [(56, 84)] * 2, "cpu")["pixel_values"]
    assert isinstance(same, torch.Tensor) and same.shape == (2, 3, 56, 84)
