"""The registry: host construction, legal items, mm_kwargs, ground truth."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pytest
import torch

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers.deepseek_v4 import DeepseekV41VisionHost, build_image_span_types
from reference_towers.minimax_vl import MiniMaxM3VisionHost, token_positions
from reference_towers.registry import (
    REFERENCE_TOWERS,
    ReferenceTower,
    generated_mixin,
    stems_with_generated_mixin,
)

TOWERS = sorted(REFERENCE_TOWERS)
WITH_GENERATED_MIXIN = stems_with_generated_mixin()


@dataclass(frozen=True)
class TinyItems:
    """What each tower's ``tiny`` items look like."""

    smallest_tokens: int
    reachable: Callable[[int], bool]
    """Whether some legal item has exactly this many output tokens (between
    the smallest and the cap)."""
    layout_items: int = 4
    """Items of the final-layout check (the tile and crop towers' fixed
    448² and 728² views are slow on a CPU)."""
    text_width: int = 96
    """Width of the output rows (MiniCPM-V's resampler needs a multiple of
    128: ``width // 128`` heads)."""


def _every_count(tokens: int) -> bool:
    return True


def _views(fixed: int, per_view: int, counts: tuple[int, ...]) -> Callable[[int], bool]:
    def reachable(tokens: int) -> bool:
        views, rest = divmod(tokens - fixed, per_view)
        return rest == 0 and views in counts

    return reachable


def _cells_of_at_most_8(tokens: int) -> bool:
    return any(tokens % a == 0 and tokens // a <= 8 for a in range(1, 9))


TINY_ITEMS = {
    "deepseek_v41": TinyItems(4, _every_count),
    "internvl": TinyItems(256, _views(0, 256, (1, 3, 4, 5)), layout_items=2),
    "kimi_k25": TinyItems(1, _every_count),
    "kimi_vl": TinyItems(1, _every_count),
    "minicpmv": TinyItems(
        64, _views(0, 64, (1, 3, 4, 5, 6, 7, 8, 9, 10)), text_width=128
    ),
    "minimax_m3": TinyItems(1, _every_count),
    # Mistral3 and Pixtral: an image of a x b cells of at most 8 a side.
    "mistral3": TinyItems(1, _cells_of_at_most_8),
    "pixtral": TinyItems(1, _cells_of_at_most_8),
    "qwen2_5_vl": TinyItems(1, _every_count),
    "qwen2_vl": TinyItems(1, _every_count),
    "step3_vl": TinyItems(169, _views(169, 81, (0, 2, 3, 4, 5, 6)), layout_items=2),
}


class RecordingMixin:
    """A mixin whose method shadows a host attribute, to check the MRO."""

    marker = "mixin"

    def eager_reference_outputs(self, mm_kwargs):  # pragma: no cover - shadowed
        raise AssertionError("the registry must not call a mixin override")

    def who_am_i(self) -> str:
        return type(self).__name__


class _ProtocolBase(Protocol):
    def get_encoder_cudagraph_config(self) -> object: ...


class ProtocolMixin(_ProtocolBase):
    """Mixins may derive from a typing.Protocol (the MiniMax seed does)."""

    def get_encoder_cudagraph_config(self) -> object:
        return "config"


def test_registry_keys_are_spec_names():
    assert TOWERS == [
        "deepseek_v41",
        "internvl",
        "kimi_k25",
        "kimi_vl",
        "minicpmv",
        "minimax_m3",
        "mistral3",
        "pixtral",
        "qwen2_5_vl",
        "qwen2_vl",
        "step3_vl",
    ]
    assert sorted(TINY_ITEMS) == TOWERS
    for name, tower in REFERENCE_TOWERS.items():
        assert isinstance(tower, ReferenceTower)
        assert tower.name == name
        assert tower.modality == "image"
        assert tower.modality in tower.modalities
        assert tower.sizes == ("tiny", "full")
        assert tower.paths == (
            ("global", "local") if name == "step3_vl" else ("default",)
        )


@pytest.mark.parametrize("name", TOWERS)
def test_build_host_mixes_the_mixin_in_after_the_host(name):
    tower = REFERENCE_TOWERS[name]
    host = tower.build_host(RecordingMixin, "tiny", device="cpu", dtype=torch.float32)
    cls = type(host)
    # The host's own methods win over the mixin's (and its protocol's stubs),
    # as a real model class's body does.
    assert cls.__bases__ == (tower.host_cls, RecordingMixin)
    mro = cls.__mro__
    assert mro.index(tower.host_cls) < mro.index(RecordingMixin)
    assert cls.__name__ == f"RecordingMixinOn{tower.host_cls.__name__}"
    assert tower.host_class(RecordingMixin) is cls  # cached
    assert isinstance(host, RecordingMixin) and isinstance(host, tower.host_cls)
    assert host.who_am_i() == cls.__name__
    assert not host.training
    assert not any(p.requires_grad for p in host.parameters())
    assert host.multimodal_config is None


@pytest.mark.parametrize("name", TOWERS)
def test_protocol_mixins_combine(name):
    host = REFERENCE_TOWERS[name].build_host(
        ProtocolMixin, "tiny", device="cpu", dtype=torch.float32
    )
    assert host.get_encoder_cudagraph_config() == "config"


def test_real_protocol_mixins_combine():
    interfaces = pytest.importorskip("encoder_cudagraph_runtime.interfaces")

    class Mixin(interfaces.SupportsEncoderCudaGraph):
        pass

    for tower in REFERENCE_TOWERS.values():
        host = tower.build_host(Mixin, "tiny", device="cpu", dtype=torch.float32)
        assert isinstance(host, interfaces.SupportsEncoderCudaGraph)


def test_deepseek_host_attribute_paths_and_placement():
    mm = MultiModalConfig(limit_per_prompt={"image": 0})
    host = REFERENCE_TOWERS["deepseek_v41"].build_host(
        RecordingMixin,
        "tiny",
        device="cpu",
        dtype=torch.bfloat16,
        attn_backend=AttentionBackendEnum.TORCH_SDPA,
        multimodal_config=mm,
    )
    assert isinstance(host, DeepseekV41VisionHost)
    assert host.multimodal_config is mm
    assert (
        host.vision.blocks[0].attn.attn.attn_backend is AttentionBackendEnum.TORCH_SDPA
    )
    assert all(
        b.attn.attn.attn_backend is AttentionBackendEnum.TORCH_SDPA
        for b in host.vision.blocks
    )
    assert (host.vision.rope_dim, host.vision.rope_theta) == (16, 10000.0)
    assert host.aligner.w1.weight.dtype == torch.bfloat16
    assert host.aligner.downsample_ratio == host.config.vision_downsample_ratio == 3
    assert host.aligner.out_dim == host.config.hidden_size == 96
    assert host.config.vision_patch_size == 14
    for name in ("image_start", "image_newline", "image_end"):
        param = getattr(host, name)
        assert isinstance(param, torch.nn.Parameter)
        assert param.dtype == torch.float32
        assert param.shape == (96,)


def test_minimax_host_attribute_paths_and_placement():
    host = REFERENCE_TOWERS["minimax_m3"].build_host(
        RecordingMixin, "tiny", device="cpu", dtype=torch.bfloat16
    )
    assert isinstance(host, MiniMaxM3VisionHost)
    tower = host.vision_tower
    assert tower.spatial_merge_size == 2
    assert tower.out_hidden_size == 96
    assert tower.dtype == torch.bfloat16
    assert tower.vision_model.attn_backend is AttentionBackendEnum.FLASH_ATTN
    embeddings = tower.vision_model.embeddings
    assert (embeddings.num_channels, embeddings.temporal_patch_size) == (3, 2)
    assert embeddings.patch_size == 14


@pytest.mark.parametrize("name", TOWERS)
def test_seeds_are_deterministic_and_distinct(name):
    tower = REFERENCE_TOWERS[name]

    def state(seed: int) -> dict[str, torch.Tensor]:
        host = tower.build_host(
            RecordingMixin, "tiny", device="cpu", dtype=torch.float32, seed=seed
        )
        return host.state_dict()

    a, b, c = state(0), state(0), state(1)
    assert a.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(not torch.equal(a[k], c[k]) for k in a)


# -- items ------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOWERS)
def test_smallest_item_and_random_items_are_legal(name):
    tower = REFERENCE_TOWERS[name]
    smallest = tower.smallest_item("tiny")
    assert tower.is_legal(smallest, "tiny")
    assert tower.output_tokens(smallest) == TINY_ITEMS[name].smallest_tokens
    cap = max(40, tower.output_tokens(tower.smallest_item("full")))
    rng = random.Random(0)
    for _ in range(200):
        item = tower.sample_item(rng, "tiny")
        assert tower.is_legal(item, "tiny")
        assert tower.output_tokens(item) <= tower.max_output_tokens("tiny")
        capped = tower.sample_item(rng, "full", max_output_tokens=cap)
        assert tower.is_legal(capped, "full") and tower.output_tokens(capped) <= cap


@pytest.mark.parametrize("name", TOWERS)
def test_exact_output_token_counts(name):
    tower = REFERENCE_TOWERS[name]
    rng = random.Random(1)
    low = tower.output_tokens(tower.smallest_item("tiny"))
    cap = tower.max_output_tokens("tiny")
    reachable = TINY_ITEMS[name].reachable
    assert reachable(low) and reachable(cap)
    for tokens in range(low, cap + 1):
        if not reachable(tokens):
            with pytest.raises(ValueError, match="no legal"):
                tower.legal_grid(rng, "tiny", output_tokens=tokens)
            continue
        item = tower.legal_grid(rng, "tiny", output_tokens=tokens)
        assert tower.output_tokens(item) == tokens
        assert tower.is_legal(item, "tiny")
    for impossible in (low - 1, cap + 1):
        with pytest.raises(ValueError, match="no legal"):
            tower.legal_grid(rng, "tiny", output_tokens=impossible)
    full = tower.legal_grid(rng, "full", output_tokens=tower.max_output_tokens("full"))
    assert tower.is_legal(full, "full")


def test_generated_towers_are_the_seed_specs():
    assert {"deepseek_v41", "minimax_m3", "qwen2_vl"} <= set(WITH_GENERATED_MIXIN)


@pytest.mark.parametrize("name", WITH_GENERATED_MIXIN)
def test_budget_tokens_are_the_generated_mixins(name):
    """The registry's per-path tokens are what the generated mixin's item
    specs report as path_output_tokens (one path: the budget unit,
    DeepSeek-V4.1 patches, others output tokens), and budget_item finds
    items by the budget unit."""
    tower = REFERENCE_TOWERS[name]
    host = tower.build_host(
        generated_mixin(name), "tiny", device="cpu", dtype=torch.float32
    )
    rng = random.Random(2)
    items = [tower.sample_item(rng, "tiny") for _ in range(12)]
    specs = host.get_encoder_cudagraph_item_specs(
        tower.make_mm_kwargs(host, items, "cpu")
    )
    assert [
        {path: s.get_path_output_tokens(path) for path in tower.paths} for s in specs
    ] == [tower.path_tokens(i) for i in items]
    cap = tower.max_budget_tokens("tiny")
    assert max(tower.budget_tokens(i) for i in items) <= cap
    for tokens in (1, 2, 7, 36, cap):
        try:
            item = tower.budget_item(rng, "tiny", budget_tokens=tokens)
        except ValueError:
            continue  # not every count is reachable
        assert tower.budget_tokens(item) == tokens and tower.is_legal(item, "tiny")
    with pytest.raises(ValueError, match="no legal"):
        tower.budget_item(rng, "tiny", budget_tokens=cap + 1)
    low = max(40, tower.budget_tokens(tower.smallest_item("tiny")))
    small = tower.budget_item(rng, "tiny", max_budget_tokens=low)
    assert tower.budget_tokens(small) <= low


def test_deepseek_budget_cap_is_the_largest_legal_grid():
    tower = REFERENCE_TOWERS["deepseek_v41"]
    cap = tower.max_budget_tokens("tiny")
    assert tower.is_legal(
        tower.budget_item(random.Random(0), "tiny", budget_tokens=cap), "tiny"
    )
    # No legal grid has more patches (spans of at most 64 tokens, r = 3).
    assert not any(
        tower.is_legal((h, w), "tiny")
        for h in range(1, 200)
        for w in range(1, 200)
        if h * w > cap
    )


def test_item_specs_match_the_models_formulas():
    deepseek = REFERENCE_TOWERS["deepseek_v41"]
    assert deepseek.input_size((4, 7)) == 28
    assert deepseek.output_tokens((4, 7)) == 2 * (3 + 1) + 2
    assert deepseek.output_tokens((1, 1)) == 4
    assert not deepseek.is_legal((0, 3), "tiny")
    assert not deepseek.is_legal((30, 30), "tiny")  # 10·11+2 > 64
    minimax = REFERENCE_TOWERS["minimax_m3"]
    assert minimax.input_size((1, 4, 6)) == 24
    assert minimax.output_tokens((1, 4, 6)) == 6
    assert not minimax.is_legal((1, 3, 4), "tiny")  # not a multiple of m
    assert not minimax.is_legal((2, 2, 2), "tiny")  # videos stay eager
    assert minimax.max_output_tokens("full") == 576


# -- mm_kwargs ----------------------------------------------------------------------


def test_deepseek_mm_kwargs_layout(deepseek_host):
    tower = REFERENCE_TOWERS["deepseek_v41"]
    items = [(4, 7), (1, 1), (3, 5)]
    kwargs = tower.make_mm_kwargs(deepseek_host, items, "cpu", seed=5)
    assert set(kwargs) == {"patches", "vit_grid", "llm_grid", "types"}
    assert kwargs["patches"].shape == (28 + 1 + 15, 3, 14, 14)
    assert kwargs["patches"].dtype == torch.bfloat16
    assert kwargs["vit_grid"].tolist() == [[4, 7], [1, 1], [3, 5]]
    assert kwargs["llm_grid"].tolist() == [[2, 3], [1, 1], [1, 2]]
    for key in ("vit_grid", "llm_grid", "types"):
        assert kwargs[key].device.type == "cpu"
        assert kwargs[key].dtype == torch.int64
    expected_types = torch.cat(
        [build_image_span_types(*g) for g in [(2, 3), (1, 1), (1, 2)]]
    )
    assert torch.equal(kwargs["types"], expected_types)
    # Patches are row-major cuts of the image the seed draws.
    generator = torch.Generator().manual_seed(5)
    offset = 0
    for h, w in items:
        image = (
            torch.rand((3, h * 14, w * 14), generator=generator) * 2 - 1
        ).bfloat16()
        for i in range(h):
            for j in range(w):
                block = image[:, i * 14 : (i + 1) * 14, j * 14 : (j + 1) * 14]
                assert torch.equal(kwargs["patches"][offset + i * w + j], block)
        offset += h * w
    empty = tower.make_mm_kwargs(deepseek_host, [], "cpu")
    assert empty["patches"].shape == (0, 3, 14, 14)
    assert empty["vit_grid"].shape == (0, 2)


def test_minimax_mm_kwargs_layout(minimax_host):
    tower = REFERENCE_TOWERS["minimax_m3"]
    items = [(1, 4, 6), (1, 2, 2)]
    kwargs = tower.make_mm_kwargs(minimax_host, items, "cpu", seed=6)
    assert set(kwargs) == {"pixel_values", "image_grid_thw"}
    pixels = kwargs["pixel_values"]
    assert pixels.shape == (24 + 4, 1176) and pixels.dtype == torch.float32
    assert kwargs["image_grid_thw"].tolist() == [[1, 4, 6], [1, 2, 2]]
    assert kwargs["image_grid_thw"].dtype == torch.int64
    # Rows against the position formula, features (C, T, p, p), T repeats.
    mean = torch.tensor(tower._MEAN)[:, None, None]
    std = torch.tensor(tower._STD)[:, None, None]
    generator = torch.Generator().manual_seed(6)
    offset = 0
    for t, h, w in items:
        image = (torch.rand((3, h * 14, w * 14), generator=generator) - mean) / std
        _, hpos, wpos = token_positions(t, h, w, 2)
        for row, (y, x) in enumerate(zip(hpos.tolist(), wpos.tolist(), strict=True)):
            block = image[:, y * 14 : (y + 1) * 14, x * 14 : (x + 1) * 14]
            features = pixels[offset + row].reshape(3, 2, 14, 14)
            assert torch.equal(features[:, 0], block)
            assert torch.equal(features[:, 1], block)
        offset += t * h * w


@pytest.mark.parametrize("name", TOWERS)
def test_reference_outputs_have_the_final_layout(name, request):
    tower = REFERENCE_TOWERS[name]
    fixture = {"deepseek_v41": "deepseek_host", "minimax_m3": "minimax_host"}.get(
        name, f"{name}_host"
    )
    host = request.getfixturevalue(fixture)
    rng = random.Random(2)
    items = [
        tower.sample_item(rng, "tiny") for _ in range(TINY_ITEMS[name].layout_items)
    ]
    outputs = tower.reference_outputs(host, tower.make_mm_kwargs(host, items, "cpu"))
    width = TINY_ITEMS[name].text_width
    assert [o.shape for o in outputs] == [
        (tower.output_tokens(i), width) for i in items
    ]
    assert all(o.dtype == torch.float32 and torch.isfinite(o).all() for o in outputs)
