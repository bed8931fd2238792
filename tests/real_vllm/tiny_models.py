"""The table of the real-vLLM tests: for every model the plugin serves,
either a tiny random config its vLLM 0.33.0 class builds from on a CPU
(:data:`TINY`) or why it cannot be (:data:`NOT_ON_CPU`).

A :class:`TinyModel` states what a test needs to know of one model: the
transformers config and offline processor, the capture settings, and how to
draw a batch of images or videos as the model's ``mm_kwargs``.
:func:`models_table` prints the table that docs/using-in-vllm.md shows
(``test_real_vllm_table.py`` checks it, without vLLM).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class TinyModel:
    stem: str
    hf_config: Callable[[], Any]
    """A fresh transformers config (built lazily: it imports transformers)."""
    draw: Callable[[torch.Generator, str, list[tuple[int, int, int]]], dict]
    """``(generator, modality, grids) -> mm_kwargs`` of one batch."""
    eager: Callable[[Any, dict, int], torch.Tensor]
    """vLLM's own eager encoder output of item ``i`` of a batch."""
    grids: Callable[[torch.Generator, str, int], list[tuple[int, int, int]]]
    """``(generator, modality, tokens at most) -> item grids`` of a batch."""
    oversized: Callable[[int], tuple[int, int, int]] | None
    """The grid of an image of more output tokens than ``budget``; None where
    no image the class takes has more than the smallest budget (one view of
    fixed size per image: vLLM's eager path refuses any other)."""
    save_processor: Callable[[str], None]
    """Writes a tiny offline processor (tokenizer included) to a folder."""
    modalities: tuple[str, ...] = ("image",)
    compilation: dict[str, Any] = field(default_factory=dict)
    graph_rows_past_eager: bool = False
    """A replayed item may have rows past the eager output's (which it
    starts with): slots the model's prompt does not hold."""


SPECIAL_TOKENS = (
    "<unk>",
    "<|endoftext|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|image|>",
    "<|video|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|IMAGE_PAD|>",
    "<|VIDEO_PAD|>",
    "<|VISION_START|>",
    "<|VISION_END|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<image>",
    "<|START_OF_IMG|>",
    "<|END_OF_IMG|>",
    "<|IMG_LINE_BREAK|>",
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
    "<|img|>",
    "<|imgpad|>",
    "<|endofimg|>",
)

#: The language model of most tiny configs: one layer, two heads sharing one
#: key/value head, a small vocabulary (each config adds what its family
#: needs).
_TINY_TEXT = dict(
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=256,
    max_position_embeddings=2048,
)


def tiny_tokenizer(**named: str) -> Any:
    """A word-level tokenizer of the special tokens and a few words;
    ``named`` special tokens become attributes (``image_token=...``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [*SPECIAL_TOKENS, *(f"w{i}" for i in range(16))]
    backend = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[2:]),
        model_specific_special_tokens=named or None,
    )


def _token_ids() -> dict[str, int]:
    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return dict(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
    )


def _qwen2_text_config() -> dict:
    return dict(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=256,
        max_position_embeddings=2048,
        rope_scaling={"type": "mrope", "mrope_section": [4, 4, 4]},
    )


def _qwen2_vl_config() -> Any:
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        architectures=["Qwen2VLForConditionalGeneration"],
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=48,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        ),
        text_config=_qwen2_text_config(),
        vocab_size=256,
        **_token_ids(),
    )


def _qwen2_5_vl_config() -> Any:
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=48,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
            # Windows of 2 x 2 merged tokens; block 1 attends the whole item.
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        text_config=_qwen2_text_config(),
        vocab_size=256,
        **_token_ids(),
    )


def _qwen3_vl_config() -> Any:
    from transformers import Qwen3VLConfig

    text = _qwen2_text_config()
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": text.pop("rope_scaling")["mrope_section"],
        "mrope_interleaved": True,
    }
    text["head_dim"] = 24  # hidden_size / heads, as the mrope sections assume
    return Qwen3VLConfig(
        architectures=["Qwen3VLForConditionalGeneration"],
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=48,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        text_config=text,
        **_token_ids(),
    )


def _qwen3_vl_processor(folder: str) -> None:
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers import Qwen3VLVideoProcessor

    size = {"shortest_edge": 64 * 64, "longest_edge": 192 * 192}
    Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, patch_size=16),
        tokenizer=tiny_tokenizer(),
        video_processor=Qwen3VLVideoProcessor(size=size, patch_size=16),
    ).save_pretrained(folder)


def _glm4_1v_config() -> Any:
    from transformers import Glm4vConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return Glm4vConfig(
        architectures=["Glm4vForConditionalGeneration"],
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=48,
            patch_size=14,
            image_size=112,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
        ),
        text_config=dict(
            _TINY_TEXT,
            partial_rotary_factor=0.5,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 2, 2],
                "partial_rotary_factor": 0.5,
            },
        ),
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )


def _glm4_1v_processor(folder: str) -> None:
    from transformers import Glm4vImageProcessor, Glm4vProcessor
    from transformers import Glm4vVideoProcessor

    size = {"shortest_edge": 56 * 56, "longest_edge": 168 * 168}
    Glm4vProcessor(
        image_processor=Glm4vImageProcessor(size=size),
        tokenizer=tiny_tokenizer(),
        video_processor=Glm4vVideoProcessor(size=size),
    ).save_pretrained(folder)


def _cohere_compass_config() -> Any:
    from transformers import CohereCompassConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return CohereCompassConfig(
        architectures=["CohereCompassForConditionalGeneration"],
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=48,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_channels=3,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        ),
        text_config=dict(
            _TINY_TEXT,
            head_dim=24,
            layer_types=["full_attention"],
            tie_word_embeddings=True,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|endoftext|>"],
        ),
        image_token_id=ids["<|IMAGE_PAD|>"],
        video_token_id=ids["<|VIDEO_PAD|>"],
        vision_start_token_id=ids["<|VISION_START|>"],
        vision_end_token_id=ids["<|VISION_END|>"],
        tie_word_embeddings=True,  # vLLM's language model asserts it
    )


def _cohere_compass_processor(folder: str) -> None:
    from transformers import CohereCompassImageProcessor, CohereCompassProcessor
    from transformers import CohereCompassVideoProcessor

    size = {"shortest_edge": 56 * 56, "longest_edge": 168 * 168}
    CohereCompassProcessor(
        image_processor=CohereCompassImageProcessor(size=size),
        tokenizer=tiny_tokenizer(),
        video_processor=CohereCompassVideoProcessor(size=size),
    ).save_pretrained(folder)


#: The Omni thinkers' audio encoder: one small layer (built, never run).
_TINY_OMNI_AUDIO = dict(
    num_mel_bins=16,
    encoder_layers=1,
    encoder_attention_heads=2,
    encoder_ffn_dim=32,
    d_model=16,
    output_dim=48,
    max_source_positions=64,
    n_window=8,
)


def _omni_token_ids(ids: dict[str, int]) -> dict[str, int]:
    """The Omni thinkers' special token ids both families name alike (the
    media tokens' keys differ: ``*_token_index`` in Qwen2.5-Omni)."""
    return dict(
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
        user_token_id=0,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
    )


def _qwen2_5_omni_config() -> Any:
    from transformers import Qwen2_5OmniConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vision = _qwen2_5_vl_config().vision_config.to_dict()
    text = _qwen2_text_config()
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": text.pop("rope_scaling")["mrope_section"],
    }
    return Qwen2_5OmniConfig(
        architectures=["Qwen2_5OmniModel"],
        enable_audio_output=False,
        thinker_config=dict(
            vision_config=vision,
            text_config=text,
            audio_config=dict(_TINY_OMNI_AUDIO),
            image_token_index=ids["<|IMAGE|>"],
            video_token_index=ids["<|VIDEO|>"],
            audio_token_index=ids["<|AUDIO|>"],
            **_omni_token_ids(ids),
        ),
    )


def _qwen2_5_omni_processor(folder: str) -> None:
    from transformers import Qwen2_5OmniProcessor, Qwen2VLImageProcessor
    from transformers import Qwen2VLVideoProcessor, WhisperFeatureExtractor

    tokenizer = tiny_tokenizer(
        image_token="<|IMAGE|>",
        video_token="<|VIDEO|>",
        audio_token="<|AUDIO|>",
        vision_bos_token="<|vision_start|>",
        vision_eos_token="<|vision_end|>",
        audio_bos_token="<|audio_bos|>",
        audio_eos_token="<|audio_eos|>",
    )
    size = {"shortest_edge": 56 * 56, "longest_edge": 168 * 168}
    Qwen2_5OmniProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        video_processor=Qwen2VLVideoProcessor(size=size),
        feature_extractor=WhisperFeatureExtractor(feature_size=16),
        tokenizer=tokenizer,
    ).save_pretrained(folder)


def _qwen3_omni_config() -> Any:
    from transformers import Qwen3OmniMoeConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vision = _qwen3_vl_config().vision_config.to_dict()
    text = _qwen3_vl_config().text_config.to_dict()
    for key in ("model_type", "transformers_version", "architectures"):
        vision.pop(key, None)
        text.pop(key, None)
    # One dense layer: the language model is built, never run.
    text.update(num_experts=2, num_experts_per_tok=1, mlp_only_layers=[0])
    text["tie_word_embeddings"] = False  # read on the text config by vLLM
    # What vLLM reads of a checkpoint's vision config beyond transformers'
    # class: the side its position embeddings cover, and which kind they are.
    vision.update(image_size=128, apply_vit_abs_pos_embed=True)
    return Qwen3OmniMoeConfig(
        architectures=["Qwen3OmniMoeForConditionalGeneration"],
        enable_audio_output=False,
        thinker_config=dict(
            vision_config=vision,
            text_config=text,
            audio_config=dict(_TINY_OMNI_AUDIO, downsample_hidden_size=8),
            image_token_id=ids["<|IMAGE|>"],
            video_token_id=ids["<|VIDEO|>"],
            audio_token_id=ids["<|AUDIO|>"],
            **_omni_token_ids(ids),
        ),
    )


def _qwen2_vl_processor(folder: str) -> None:
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers import Qwen2VLVideoProcessor

    # Small largest images and frames: the most frames per video vLLM derives
    # from them and max_model_len is several, so video batches have several.
    size = {"shortest_edge": 56 * 56, "longest_edge": 168 * 168}
    Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        tokenizer=tiny_tokenizer(),
        video_processor=Qwen2VLVideoProcessor(size=size),
    ).save_pretrained(folder)


_QWEN2_VL_KEYS = {
    "image": ("pixel_values", "image_grid_thw"),
    "video": ("pixel_values_videos", "video_grid_thw"),
}


def _qwen2_vl_draw(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    patch: int = 14,
) -> dict:
    pixels_key, grid_key = _QWEN2_VL_KEYS[modality]
    rows = sum(t * h * w for t, h, w in grids)
    # Raw pixels: vLLM 0.33.0 normalises them on the device (its default
    # mm_device_do_normalize), and the captured buffer has their dtype.
    return {
        pixels_key: torch.randint(
            0, 256, (rows, 3 * 2 * patch * patch), generator=gen, dtype=torch.uint8
        ),
        grid_key: torch.tensor(grids, dtype=torch.int64),
    }


def _qwen2_vl_eager(model: Any, mm_kwargs: dict, i: int) -> torch.Tensor:
    (pixels, grid) = (mm_kwargs[k] for k in _QWEN2_VL_KEYS[_modality(mm_kwargs)])
    sizes = [int(t * h * w) for t, h, w in grid.tolist()]
    start = sum(sizes[:i])
    with torch.inference_mode():
        return model.visual(pixels[start : start + sizes[i]], grid[i : i + 1].tolist())


def _modality(mm_kwargs: dict) -> str:
    return "video" if "video_grid_thw" in mm_kwargs else "image"


def _qwen2_vl_grids(
    gen: torch.Generator, modality: str, tokens: int
) -> list[tuple[int, int, int]]:
    """Items of merged 2 x 2 patches until ``tokens`` output tokens."""
    grids: list[tuple[int, int, int]] = []
    left = tokens
    while left >= 1 and len(grids) < 6:
        t = 1 if modality == "image" else int(torch.randint(1, 4, (), generator=gen))
        h, w = (2 * int(torch.randint(1, 7, (), generator=gen)) for _ in range(2))
        if t * h * w // 4 > left:
            break
        grids.append((t, h, w))
        left -= t * h * w // 4
    return grids or [(1, 2, 2)]


def _qwen2_vl_oversized(budget: int) -> tuple[int, int, int]:
    side = math.isqrt(budget) + 1  # merged tokens per side
    return (1, 2 * side, 2 * side)


# Models of fixed-size tiles: an item is ``(tiles, 1, 1)``, its rows
# ``(tiles, 3, side, side)`` pixels, its count under ``count_key``.


def _tile_draw(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    side: int,
    keys: dict[str, tuple[str, str]],
) -> dict:
    """``keys``: modality -> (pixels key, tiles-per-item key)."""
    pixels_key, count_key = keys[modality]
    tiles = [t for t, _, _ in grids]
    return {
        pixels_key: torch.randn((sum(tiles), 3, side, side), generator=gen),
        count_key: torch.tensor(tiles, dtype=torch.int64),
    }


def _tile_grids(
    gen: torch.Generator, modality: str, tokens: int, per_tile: int
) -> list[tuple[int, int, int]]:
    """Items of 1 to 3 tiles until ``tokens`` output tokens."""
    grids: list[tuple[int, int, int]] = []
    left = tokens // per_tile
    while left >= 1 and len(grids) < 4:
        tiles = int(torch.randint(1, 4, (), generator=gen))
        if tiles > left:
            break
        grids.append((tiles, 1, 1))
        left -= tiles
    return grids or [(1, 1, 1)]


def _tile_family(side: int, per_tile: int, keys: dict, eager, processor):
    return dict(
        draw=functools.partial(_tile_draw, side=side, keys=keys),
        modalities=tuple(keys),
        eager=eager,
        grids=functools.partial(_tile_grids, per_tile=per_tile),
        oversized=lambda budget: (budget // per_tile + 1, 1, 1),
        save_processor=processor,
    )


def _cohere2_vision_config() -> Any:
    from transformers import Cohere2VisionConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return Cohere2VisionConfig(
        architectures=["Cohere2VisionForConditionalGeneration"],
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=56,
            patch_size=14,
        ),
        text_config=dict(
            _TINY_TEXT,
            model_type="cohere2",
            architectures=["Cohere2ForCausalLM"],
            layer_types=["full_attention"],
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|endoftext|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        downsample_factor=2,
        alignment_intermediate_size=64,
        image_token_id=ids["<image>"],
    )


def _cohere2_vision_processor(folder: str) -> None:
    from transformers import Cohere2VisionImageProcessor, Cohere2VisionProcessor

    Cohere2VisionProcessor(
        image_processor=Cohere2VisionImageProcessor(
            size={"height": 56, "width": 56}, patch_size=14, max_patches=4
        ),
        tokenizer=tiny_tokenizer(
            image_token="<image>",
            boi_token="<|START_OF_IMG|>",
            eoi_token="<|END_OF_IMG|>",
            img_line_break_token="<|IMG_LINE_BREAK|>",
        ),
    ).save_pretrained(folder)


def _cohere2_vision_eager(model: Any, mm_kwargs: dict, i: int) -> torch.Tensor:
    with torch.inference_mode():
        return model._process_image_input(dict(mm_kwargs))[i]


@functools.cache
def _remote_config_class(model_type: str, **sub_configs: str) -> type:
    """A stand-in for a checkpoint's remote-code config class, registered
    with transformers' ``AutoConfig`` under ``model_type``: its
    ``sub_configs`` (attribute -> model type) become configs of their own,
    every other argument an attribute."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    def __init__(self, **kwargs: Any) -> None:
        for name, sub_type in sub_configs.items():
            value = kwargs.pop(name, None) or {}
            if isinstance(value, dict):
                value = CONFIG_MAPPING[sub_type](**value)
            setattr(self, name, value)
        PretrainedConfig.__init__(self, **kwargs)

    cls = type(
        f"Tiny_{model_type}_Config",
        (PretrainedConfig,),
        {"model_type": model_type, "__init__": __init__, "sub_configs": {}},
    )
    AutoConfig.register(model_type, cls, exist_ok=True)
    return cls


def _tokenizer_only(folder: str) -> None:
    """For models whose processor vLLM builds itself from the config."""
    tiny_tokenizer().save_pretrained(folder)


def _eagle2_5_vl_config() -> Any:
    cls = _remote_config_class(
        "eagle_2_5_vl", vision_config="siglip_vision_model", text_config="qwen2"
    )
    return cls(
        architectures=["Eagle2_5_VLForConditionalGeneration"],
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=56,
            patch_size=14,
        ),
        text_config=dict(
            _TINY_TEXT,
            architectures=["Qwen2ForCausalLM"],
        ),
        force_image_size=None,
        downsample_ratio=0.5,
        select_layer=-1,
        min_dynamic_patch=1,
        max_dynamic_patch=4,
        dynamic_image_size=True,
        use_thumbnail=False,
    )


def _internvl_config() -> Any:
    _remote_config_class("intern_vit_6b")
    cls = _remote_config_class(
        "internvl_chat", vision_config="intern_vit_6b", text_config="qwen2"
    )
    return cls(
        architectures=["InternVLChatModel"],
        vision_config=dict(
            hidden_act="gelu",
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=2,
            num_hidden_layers=2,
            image_size=56,
            patch_size=14,
            initializer_factor=1.0,
            layer_norm_eps=1e-6,
            norm_type="layer_norm",
            qk_normalization=False,
            qkv_bias=True,
            drop_path_rate=0.0,
            dropout=0.0,
            attention_dropout=0.0,
        ),
        text_config=dict(
            _TINY_TEXT,
            architectures=["Qwen2ForCausalLM"],
        ),
        force_image_size=None,
        downsample_ratio=0.5,
        ps_version="v2",
        select_layer=-1,
        min_dynamic_patch=1,
        max_dynamic_patch=4,
        dynamic_image_size=True,
        use_thumbnail=False,
    )


_INTERNVL_KEYS = {
    "image": ("pixel_values_flat", "image_num_patches"),
    "video": ("pixel_values_flat_video", "video_num_patches"),
}


def _internvl_eager(model: Any, mm_kwargs: dict, i: int) -> torch.Tensor:
    modality = "video" if "video_num_patches" in mm_kwargs else "image"
    pixels, tiles = (mm_kwargs[k] for k in _INTERNVL_KEYS[modality])
    with torch.inference_mode():
        return model._process_vision_input(
            dict(type="pixel_values", pixel_values_flat=pixels, num_patches=tiles)
        )[i]


def _skyworkr1v_config() -> Any:
    """InternVL's tiny config under Skywork-R1V's remote config class."""
    cls = _remote_config_class(
        "skywork_chat", vision_config="intern_vit_6b", text_config="qwen2"
    )
    config = _internvl_config().to_dict()
    for key in ("model_type", "transformers_version", "vision_config", "text_config"):
        config.pop(key)
    internvl = _internvl_config()
    return cls(
        **{
            **config,
            "architectures": ["SkyworkR1VChatModel"],
            "vision_config": internvl.vision_config,
            "text_config": internvl.text_config,
        }
    )


def _skyworkr1v_eager(model: Any, mm_kwargs: dict, i: int) -> torch.Tensor:
    pixels, tiles = (mm_kwargs[k] for k in _INTERNVL_KEYS["image"])
    with torch.inference_mode():
        return model._process_image_input(
            dict(type="pixel_values", pixel_values_flat=pixels, num_patches=tiles)
        )[i]


def _kimi_vl_config() -> Any:
    from vllm.transformers_utils.configs.kimi_vl import KimiVLConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return KimiVLConfig(
        architectures=["KimiVLForConditionalGeneration"],
        vision_config=dict(
            patch_size=14,
            init_pos_emb_height=16,
            init_pos_emb_width=16,
            num_attention_heads=2,
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            merge_kernel_size=(2, 2),
        ),
        # DeepSeek-V2 with MLA, one dense layer (no experts built).
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            first_k_dense_replace=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
            max_position_embeddings=2048,
        ),
        media_placeholder_token_id=ids["<|image_pad|>"],
    )


def _ernie45_vl_config() -> Any:
    _remote_config_class("DFNRopeVisionTransformer")
    cls = _remote_config_class(
        "ernie4_5_moe_vl", vision_config="DFNRopeVisionTransformer"
    )
    return cls(
        architectures=["Ernie4_5_VLMoeForConditionalGeneration"],
        # Heads of 80 dims: the spec's rotary table is sized for them.
        vision_config=dict(
            depth=2,
            embed_dim=160,
            hidden_size=160,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            in_channels=3,
        ),
        pixel_hidden_size=160,
        spatial_conv_size=2,
        temporal_conv_size=2,
        use_temporal_conv=True,
        # One dense layer: the experts' layers start past the last one.
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=256,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        freq_allocation=4,
        hidden_act="silu",
        moe_num_experts=[4, 4],
        moe_layer_start_index=[1, 1],
        moe_layer_end_index=[1, 1],
        moe_k=2,
        moe_intermediate_size=[32, 32],
        moe_num_shared_experts=0,
        tie_word_embeddings=True,
        im_patch_id=SPECIAL_TOKENS.index("<|image_pad|>"),
    )


def _dots_ocr_config() -> Any:
    from transformers import AutoConfig
    from vllm.transformers_utils.configs.dotsocr import DotsOCRConfig

    # vLLM ships the config class; a checkpoint names it through remote code.
    AutoConfig.register("dots_ocr", DotsOCRConfig, exist_ok=True)
    text = _qwen2_text_config()
    del text["rope_scaling"]
    return DotsOCRConfig(
        architectures=["DotsOCRForCausalLM"],
        vision_config=dict(
            embed_dim=32,
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=1,
        ),
        image_token_id=SPECIAL_TOKENS.index("<|imgpad|>"),
        video_token_id=SPECIAL_TOKENS.index("<|video_pad|>"),
        **text,
    )


def _dots_ocr_processor(folder: str) -> None:
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers import Qwen2VLVideoProcessor

    size = {"shortest_edge": 56 * 56, "longest_edge": 168 * 168}
    patches = dict(temporal_patch_size=1, patch_size=14, merge_size=2)
    Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, **patches),
        tokenizer=tiny_tokenizer(),
        video_processor=Qwen2VLVideoProcessor(size=size, **patches),
    ).save_pretrained(folder)


# Gemma 4: an image is a row of ``width * 9`` patches of 16 x 16 pixels, as the
# HF image processor pads it: its valid ``h x w`` patches first (h and w
# multiples of 3), then padding at position -1. The pooler averages them 3 x 3
# into ``width`` slots, of which the first ``h * w / 9`` are the image's soft
# tokens (what the prompt holds). Its grid is ``(width, h, w)``.
_GEMMA4_WIDTH = 70  # the tiny config's default_output_length


def _gemma4_config() -> Any:
    from transformers import Gemma4Config

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return Gemma4Config(
        architectures=["Gemma4ForConditionalGeneration"],
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            pooling_kernel_size=3,
            patch_size=16,
            position_embedding_size=64,
            default_output_length=_GEMMA4_WIDTH,
        ),
        text_config=dict(
            _TINY_TEXT,
            head_dim=24,
            vocab_size_per_layer_input=256,
            hidden_size_per_layer_input=0,
            sliding_window=64,
            layer_types=["full_attention"],
        ),
        audio_config=None,
        boi_token_id=ids["<start_of_image>"],
        eoi_token_id=ids["<end_of_image>"],
        image_token_id=ids["<image_soft_token>"],
        video_token_id=ids["<|video_pad|>"],
    )


def _gemma4_grids(
    gen: torch.Generator, modality: str, tokens: int
) -> list[tuple[int, int, int]]:
    """Images of 3 x 3 to 24 x 24 patches in rows of the model's width, each
    counting a whole row, until ``tokens``."""
    grids: list[tuple[int, int, int]] = []
    while (len(grids) + 1) * _GEMMA4_WIDTH <= tokens and len(grids) < 4:
        h, w = (3 * int(torch.randint(1, 9, (), generator=gen)) for _ in range(2))
        while h * w > 9 * _GEMMA4_WIDTH:
            h -= 3
        grids.append((_GEMMA4_WIDTH, h, w))
    return grids or [(_GEMMA4_WIDTH, 3, 3)]


def _gemma4_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    """Each image's padded row of patches and ``(x, y)`` positions; one
    tensor when every row has the same width, else a list, as vLLM batches
    them."""
    pixels, positions = [], []
    for width, h, w in grids:
        pixel = torch.zeros((width * 9, 16 * 16 * 3))
        pixel[: h * w] = torch.randn((h * w, 16 * 16 * 3), generator=gen)
        position = torch.full((width * 9, 2), -1, dtype=torch.int64)
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        position[: h * w] = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
        pixels.append(pixel)
        positions.append(position)
    if len({p.shape[0] for p in pixels}) == 1:
        return {
            "pixel_values": torch.stack(pixels),
            "pixel_position_ids": torch.stack(positions),
        }
    return {"pixel_values": pixels, "pixel_position_ids": positions}


def _flat_patches_draw(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    patch: int,
) -> dict:
    """Patches as ``(rows, 3 * patch * patch)`` pixels, a ``(t, h, w)`` grid each."""
    rows = sum(t * h * w for t, h, w in grids)
    return {
        "pixel_values": torch.randn((rows, 3 * patch * patch), generator=gen),
        "image_grid_thw": torch.tensor(grids, dtype=torch.int64),
    }


def _kimi_k25_config() -> Any:
    from transformers import Kimi_K25Config

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return Kimi_K25Config(
        architectures=["KimiK25ForConditionalGeneration"],
        vision_config=dict(
            patch_size=14,
            pos_emb_height=16,
            pos_emb_width=16,
            pos_emb_time=4,
            num_attention_heads=2,
            num_hidden_layers=2,
            hidden_size=32,
            intermediate_size=64,
            merge_kernel_size=(2, 2),
        ),
        # DeepSeek-V3 with MLA, one dense layer (no experts built).
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=64,
            moe_intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            first_k_dense_replace=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
            max_position_embeddings=2048,
        ),
        projection_hidden_size=64,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def _kimi_k25_grids(
    gen: torch.Generator, modality: str, tokens: int
) -> list[tuple[int, int, int]]:
    """Single frames (the graphs' items) and one chunk of two frames, which
    the mixin sends to the eager path whatever its size."""
    return [*_qwen2_vl_grids(gen, "image", tokens - 4), (2, 4, 4)]


def _kimi_k25_processor(folder: str) -> None:
    """The tokenizer and the media settings vLLM's own Kimi-K2.5 image
    processor reads (``preprocessor_config.json``)."""
    import json
    from pathlib import Path

    tiny_tokenizer().save_pretrained(folder)
    media = dict(
        patch_size=14,
        merge_kernel_size=2,
        temporal_merge_kernel_size=4,
        in_patch_limit=256,
        in_patch_limit_each_frame=256,
        in_patch_limit_video=1024,
        patch_limit_on_one_side=32,
        fixed_output_tokens=None,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    (Path(folder) / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "KimiK25FusedVisionProcessor",
                "media_proc_cfg": media,
            }
        )
    )


def _lfm2_vl_config() -> Any:
    from transformers import Lfm2VlConfig

    return Lfm2VlConfig(
        architectures=["Lfm2VlForConditionalGeneration"],
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=16,
            num_patches=64,
        ),
        # A short-convolution layer and an attention layer; vLLM reads the
        # remote-code names conv_dim and block_dim.
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            layer_types=["conv", "full_attention"],
            max_position_embeddings=2048,
            block_auto_adjust_ff_dim=False,
            conv_dim=64,
            block_dim=64,
            block_multiple_of=32,
        ),
        downsample_factor=2,
        projector_hidden_size=64,
        image_token_id=SPECIAL_TOKENS.index("<image>"),
        min_image_tokens=4,
        max_image_tokens=16,
    )


_LFM2_PATCH_DIM = 3 * 16 * 16


def _lfm2_vl_grids(
    gen: torch.Generator, modality: str, tokens: int
) -> list[tuple[int, int, int]]:
    """Images of 1 or 2 tiles, each tile ``(tiles, h, w)`` patches with h and w
    even and at most 4 (1 to 4 tokens), until ``tokens`` output tokens."""
    grids: list[tuple[int, int, int]] = []
    left = tokens
    while len(grids) < 4:
        tiles = int(torch.randint(1, 3, (), generator=gen))
        h, w = (2 * int(torch.randint(1, 3, (), generator=gen)) for _ in range(2))
        if tiles * h * w // 4 > left:
            break
        grids.append((tiles, h, w))
        left -= tiles * h * w // 4
    return grids or [(1, 2, 2)]


def _lfm2_vl_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    """Tiles' patches padded with zeros to the longest tile, as the processor
    pads them; ``(tiles, h, w)`` items."""
    shapes = [(h, w) for tiles, h, w in grids for _ in range(tiles)]
    longest = max(h * w for h, w in shapes)
    pixels = torch.zeros((len(shapes), longest, _LFM2_PATCH_DIM))
    for i, (h, w) in enumerate(shapes):
        pixels[i, : h * w] = torch.randn((h * w, _LFM2_PATCH_DIM), generator=gen)
    return {
        "pixel_values": pixels,
        "spatial_shapes": torch.tensor(shapes, dtype=torch.int64),
        "num_patches": torch.tensor([t for t, _, _ in grids], dtype=torch.int64),
    }


def _step3_vl_config() -> Any:
    from vllm.transformers_utils.configs.step3_vl import Step3VLConfig

    return Step3VLConfig(
        architectures=["Step3VLForConditionalGeneration"],
        # 56-pixel global images: 4 tokens; crops are 504 pixels whatever the
        # config (vLLM's constant): 324 tokens.
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            output_hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=56,
            patch_size=14,
        ),
        # One dense layer: the experts' layers ("5") are past the last one.
        text_config=dict(
            architectures=["Step3TextForCausalLM"],
            hidden_size=64,
            intermediate_size=64,
            num_attention_heads=2,
            num_attention_groups=1,
            num_hidden_layers=1,
            vocab_size=256,
            moe_intermediate_size=32,
            moe_num_experts=4,
            moe_top_k=2,
            share_expert_dim=32,
            share_q_dim=32,
            head_dim=32,
            moe_layers_enum="5",
            max_position_embedding=2048,
            max_seq_len=2048,
        ),
        image_token_id=SPECIAL_TOKENS.index("<image>"),
    )


def _step3_vl_grids(
    gen: torch.Generator, modality: str, tokens: int
) -> list[tuple[int, int, int]]:
    """Images as ``(crops, 1, 1)``: up to four, one in three with a crop."""
    grids: list[tuple[int, int, int]] = []
    left = tokens
    while len(grids) < 4:
        crops = int(torch.randint(0, 3, (), generator=gen) == 0)
        if 4 + 324 * crops > left:
            break
        grids.append((crops, 1, 1))
        left -= 4 + 324 * crops
    return grids or [(0, 1, 1)]


def _step3_vl_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    crops = [c for c, _, _ in grids]
    return {
        "pixel_values": torch.randn((len(grids), 3, 56, 56), generator=gen),
        "patch_pixel_values": torch.randn((sum(crops), 3, 504, 504), generator=gen),
        "num_patches": torch.tensor(crops, dtype=torch.int64),
    }


def _mllama4_config() -> Any:
    from transformers import Llama4Config

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return Llama4Config(
        architectures=["Llama4ForConditionalGeneration"],
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            # The pixel-shuffle MLP reads 4 x hidden_size: intermediate_size.
            intermediate_size=128,
            vision_output_dim=64,
            image_size=56,
            patch_size=14,
            pixel_shuffle_ratio=0.5,
            projector_input_dim=64,
            projector_output_dim=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        # One dense layer (interleave_moe_layer_step 0: no experts built).
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=64,
            intermediate_size_mlp=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            moe_layers=[],
            interleave_moe_layer_step=0,
            num_local_experts=4,
            max_position_embeddings=2048,
            attention_chunk_size=None,
            no_rope_layers=[1],
        ),
        image_token_index=ids["<image>"],
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
    )


def _mllama4_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    """Tiles and each image's tile layout (``aspect_ratios``, which vLLM's
    input schema asks for): ``k`` tiles are a 1 x (k - 1) grid and a global
    tile, or one tile."""
    mm_kwargs = _tile_draw(
        gen, modality, grids, 56, {"image": ("pixel_values", "patches_per_image")}
    )
    mm_kwargs["aspect_ratios"] = torch.tensor(
        [(1, max(t - 1, 1)) for t, _, _ in grids], dtype=torch.int64
    )
    return mm_kwargs


def _patches_draw(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    patch: int,
    grid_key: str,
) -> dict:
    """Patches as ``(rows, 3, patch, patch)`` pixels, a grid each: ``(h, w)``
    under ``image_grid_hws``, else ``(t, h, w)``."""
    rows = sum(t * h * w for t, h, w in grids)
    if grid_key == "image_grid_hws":
        grids = [(h, w) for _, h, w in grids]
        pixels = torch.randn((rows, 3, patch, patch), generator=gen)
    else:
        # Raw pixels: Kimi-K2.5's tower normalises them on the device (its
        # input norm), and the captured buffer has their dtype.
        pixels = torch.randint(
            0, 256, (rows, 3, patch, patch), generator=gen, dtype=torch.uint8
        )
    return {
        "pixel_values": pixels,
        grid_key: torch.tensor(grids, dtype=torch.int64),
    }


def _idefics3_config() -> Any:
    from transformers import Idefics3Config

    return Idefics3Config(
        architectures=["Idefics3ForConditionalGeneration"],
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=56,
            patch_size=14,
        ),
        text_config=dict(
            _TINY_TEXT,
        ),
        scale_factor=2,
        image_token_id=SPECIAL_TOKENS.index("<image>"),
    )


def _idefics3_processor(folder: str) -> None:
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    Idefics3Processor(
        image_processor=Idefics3ImageProcessor(
            size={"longest_edge": 112}, max_image_size={"longest_edge": 56}
        ),
        tokenizer=tiny_tokenizer(),
        image_seq_len=4,
    ).save_pretrained(folder)


def _idefics3_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    """56-pixel tiles, every pixel valid."""
    mm_kwargs = _tile_draw(
        gen, modality, grids, 56, {"image": ("pixel_values", "num_patches")}
    )
    tiles = mm_kwargs["pixel_values"].shape[0]
    mm_kwargs["pixel_attention_mask"] = torch.ones((tiles, 56, 56), dtype=torch.bool)
    return mm_kwargs


def _gemma3_config() -> Any:
    from transformers import Gemma3Config

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return Gemma3Config(
        architectures=["Gemma3ForConditionalGeneration"],
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=56,
            patch_size=14,
            vision_use_head=False,
        ),
        text_config=dict(
            _TINY_TEXT,
            head_dim=24,
            sliding_window=64,
            layer_types=["full_attention"],
        ),
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )


def _gemma3_processor(folder: str) -> None:
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": 56, "width": 56}),
        tokenizer=tiny_tokenizer(
            boi_token="<start_of_image>",
            eoi_token="<end_of_image>",
            image_token="<image_soft_token>",
        ),
        image_seq_length=4,
    ).save_pretrained(folder)


# Models of one (3, H, W) tensor per image (Mistral3, Pixtral): an item's
# grid is ``(1, H, W)`` in pixels, whole merge x merge groups of patches; an
# image past the vision config's side runs eagerly.
_MISTRAL3_SIDE = 224
_MISTRAL3_GROUP = 28  # 14-pixel patches, merged 2 x 2


def _mistral3_config() -> Any:
    from transformers import Mistral3Config

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return Mistral3Config(
        architectures=["Mistral3ForConditionalGeneration"],
        vision_config=dict(
            model_type="pixtral",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            head_dim=16,
            image_size=_MISTRAL3_SIDE,
            patch_size=14,
        ),
        text_config=dict(
            _TINY_TEXT,
            model_type="mistral",
            architectures=["MistralForCausalLM"],
            head_dim=24,
        ),
        spatial_merge_size=2,
        image_token_index=ids["<image>"],
        vision_feature_layer=-1,
    )


def _pixel_grids(
    gen: torch.Generator, modality: str, tokens: int, side: int, group: int
) -> list[tuple[int, int, int]]:
    """Images of whole ``group``-pixel merge groups, at most ``side`` pixels
    a side, until ``tokens``."""
    most = side // group
    grids: list[tuple[int, int, int]] = []
    left = tokens
    while len(grids) < 4:
        h, w = (int(torch.randint(1, most + 1, (), generator=gen)) for _ in range(2))
        if h * w > left:
            break
        grids.append((1, h * group, w * group))
        left -= h * w
    return grids or [(1, group, group)]


def _pixel_draw(
    gen: torch.Generator,
    modality: str,
    grids: list[tuple[int, int, int]],
    key: str = "pixel_values",
) -> dict:
    """One raw ``(3, H, W)`` image a grid (normalised on the device)."""
    return {
        key: [
            torch.randint(0, 256, (3, h, w), generator=gen, dtype=torch.uint8)
            for _, h, w in grids
        ]
    }


def _pixel_family(
    side: int, group: int, key: str, oversized: tuple[int, int, int]
) -> dict:
    return dict(
        draw=functools.partial(_pixel_draw, key=key),
        eager=_embed_multimodal_eager,
        grids=functools.partial(_pixel_grids, side=side, group=group),
        oversized=lambda budget: oversized,
        save_processor=_tokenizer_only,
    )


class _MistralParams(dict):
    """A Mistral-format checkpoint's ``params.json`` (no ``config.json``):
    vLLM's own parser turns it into the config its class reads. vLLM takes a
    folder for Mistral-format when it also holds ``consolidated*.safetensors``
    files: one with no tensors is written beside it."""

    def save_pretrained(self, folder: str) -> None:
        import json
        from pathlib import Path

        (Path(folder) / "params.json").write_text(json.dumps(self), "utf-8")
        # The safetensors format: the header's length (8 bytes, little
        # endian), then the header, a JSON object of the tensors: none.
        header = b"{}"
        (Path(folder) / "consolidated.safetensors").write_bytes(
            len(header).to_bytes(8, "little") + header
        )


_PIXTRAL_SIDE = 512  # 16 x 16 merged tokens: an image over the ladder's top
_PIXTRAL_GROUP = 32  # 16-pixel patches, merged 2 x 2


def _pixtral_params() -> _MistralParams:
    """Mistral-Small-3.1's layout (the pre-projector norm and the patch
    merger), tiny."""
    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return _MistralParams(
        dim=48,
        n_layers=1,
        head_dim=24,
        hidden_dim=64,
        n_heads=2,
        n_kv_heads=1,
        rope_theta=10000.0,
        norm_eps=1e-5,
        vocab_size=256,
        max_position_embeddings=2048,
        vision_encoder=dict(
            hidden_size=32,
            num_channels=3,
            image_size=_PIXTRAL_SIDE,
            patch_size=16,
            rope_theta=10000.0,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_token_id=ids["<image>"],
            image_break_token_id=ids["<|IMG_LINE_BREAK|>"],
            image_end_token_id=ids["<|END_OF_IMG|>"],
            adapter_bias=False,
            spatial_merge_size=2,
            add_pre_mm_projector_layer_norm=True,
            mm_projector_id="patch_merge",
        ),
    )


def _paddleocr_vl_config() -> Any:
    from transformers import PaddleOCRVLConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return PaddleOCRVLConfig(
        architectures=["PaddleOCRVLForConditionalGeneration"],
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=112,
            patch_size=14,
        ),
        text_config=dict(
            _TINY_TEXT,
            head_dim=24,
        ),
        image_token_id=ids["<|IMAGE|>"],
        video_token_id=ids["<|VIDEO|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def _single_frame_patches_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    """Patches as ``(rows, 3, 14, 14)`` pixels (normalised by the
    processor), a ``(t, h, w)`` grid each."""
    rows = sum(t * h * w for t, h, w in grids)
    return {
        "pixel_values": torch.randn((rows, 3, 14, 14), generator=gen),
        "image_grid_thw": torch.tensor(grids, dtype=torch.int64),
    }


_PALIGEMMA_SIDE = 56  # 4 x 4 patches of 14 pixels: 16 tokens an image


def _paligemma_config() -> Any:
    from transformers import PaliGemmaConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return PaliGemmaConfig(
        architectures=["PaliGemmaForConditionalGeneration"],
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=_PALIGEMMA_SIDE,
            patch_size=14,
            projection_dim=48,
        ),
        text_config=dict(
            _TINY_TEXT,
            model_type="gemma",
            head_dim=24,
        ),
        projection_dim=48,
        image_token_index=ids["<image>"],
    )


def _view_grids(
    gen: torch.Generator, modality: str, tokens: int
) -> list[tuple[int, int, int]]:
    """1 to 4 views of the fixed side, at most ``tokens`` tokens."""
    most = max(1, min(4, tokens // (_PALIGEMMA_SIDE // 14) ** 2))
    count = int(torch.randint(1, most + 1, (), generator=gen))
    return [(1, _PALIGEMMA_SIDE, _PALIGEMMA_SIDE)] * count


def _views_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    """The batch as one ``(N, 3, S, S)`` tensor, as vLLM batches the views."""
    _, side, _ = grids[0]
    return {"pixel_values": torch.randn((len(grids), 3, side, side), generator=gen)}


# LLaVA-NeXT: an image is its base view and the tiles of the anyres grid its
# size picks from the pinpoints, all of the tower's side; a batch is a list
# of (tiles, 3, side, side) tensors or one tensor padded to its widest image.
_LLAVA_NEXT_SIDE = 56  # 4 x 4 patches of 14 pixels a tile: 16 tokens
# llava-v1.6's pinpoints (1 x 2 to 2 x 2, 3 x 1 and 1 x 3 tiles of 336
# pixels) scaled to the tiny side, and a 1 x 6 one: the wide images that
# pick it send seven tiles, past the five the spec captures.
_LLAVA_NEXT_PINPOINTS = [
    [56, 112],
    [112, 56],
    [112, 112],
    [168, 56],
    [56, 168],
    [56, 336],
]


def _llava_next_config() -> Any:
    from transformers import LlavaNextConfig

    ids = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    return LlavaNextConfig(
        architectures=["LlavaNextForConditionalGeneration"],
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=_LLAVA_NEXT_SIDE,
            patch_size=14,
            projection_dim=48,
        ),
        text_config=dict(
            _TINY_TEXT,
            model_type="llama",
            head_dim=24,
        ),
        image_grid_pinpoints=_LLAVA_NEXT_PINPOINTS,
        image_token_index=ids["<image>"],
    )


def _llava_next_image(height: int, width: int) -> tuple[int, int, int]:
    """``(tiles, height, width)`` of an image: its base view and its grid's
    tiles, the grid as vLLM's helper picks it."""
    from vllm.model_executor.models.llava_next import get_anyres_image_grid_shape

    rows, cols = get_anyres_image_grid_shape(
        (height, width), _LLAVA_NEXT_PINPOINTS, _LLAVA_NEXT_SIDE
    )
    return (1 + rows * cols, height, width)


def _llava_next_grids(
    gen: torch.Generator, modality: str, tokens: int
) -> list[tuple[int, int, int]]:
    """Up to four images of 20 to 180 pixels a side, until ``tokens`` tokens
    of tiles; none of the 1 x 6 grid (:data:`TINY`'s ``oversized`` draws
    those)."""
    per_tile = (_LLAVA_NEXT_SIDE // 14) ** 2
    grids: list[tuple[int, int, int]] = []
    left = tokens
    for _ in range(16):
        h, w = (int(torch.randint(20, 181, (), generator=gen)) for _ in range(2))
        image = _llava_next_image(h, w)
        if image[0] > 5:
            continue
        if image[0] * per_tile > left or len(grids) == 4:
            break
        grids.append(image)
        left -= image[0] * per_tile
    return grids or [_llava_next_image(56, 56)]


def _llava_next_draw(
    gen: torch.Generator, modality: str, grids: list[tuple[int, int, int]]
) -> dict:
    """A list of each image's tiles, or (a coin decides) one tensor of the
    images padded with zero tiles to the widest, as a processor pads."""
    side = _LLAVA_NEXT_SIDE
    tiles = [torch.randn((p, 3, side, side), generator=gen) for p, _, _ in grids]
    sizes = torch.tensor([[h, w] for _, h, w in grids], dtype=torch.int64)
    if int(torch.randint(0, 2, (), generator=gen)):
        widest = max(t.shape[0] for t in tiles)
        padded = torch.zeros((len(tiles), widest, 3, side, side))
        for i, t in enumerate(tiles):
            padded[i, : t.shape[0]] = t
        return {"pixel_values": padded, "image_sizes": sizes}
    return {"pixel_values": tiles, "image_sizes": sizes}


def _embed_multimodal_eager(model: Any, mm_kwargs: dict, i: int) -> torch.Tensor:
    """vLLM's own path from a batch to its items' embeddings."""
    with torch.inference_mode():
        return model.embed_multimodal(**mm_kwargs)[i]


def _ladder(*budgets: int) -> dict[str, Any]:
    """The capture settings of a tiny model: these budgets, four items a
    batch (frames per batch: vLLM's default, items x the processor's most
    frames per video; a lower setting is not enforced by vLLM's packing,
    which counts tokens and items only)."""
    return dict(
        encoder_cudagraph_token_budgets=list(budgets),
        encoder_cudagraph_max_vision_items_per_batch=4,
    )


_QWEN2_VL_FAMILY = dict(
    draw=_qwen2_vl_draw,
    eager=_qwen2_vl_eager,
    grids=_qwen2_vl_grids,
    oversized=_qwen2_vl_oversized,
    save_processor=_qwen2_vl_processor,
    modalities=("image", "video"),
)


TINY: dict[str, TinyModel] = {
    "llava_next": TinyModel(
        stem="llava_next",
        hf_config=_llava_next_config,
        draw=_llava_next_draw,
        eager=_embed_multimodal_eager,
        grids=_llava_next_grids,
        # A wide image of a 1 x 6 grid: seven tiles, past the five captured.
        oversized=lambda budget: _llava_next_image(48, 330),
        save_processor=_tokenizer_only,
        compilation=_ladder(32, 80, 320),
    ),
    "gemma4_mm": TinyModel(
        stem="gemma4_mm",
        hf_config=_gemma4_config,
        draw=_gemma4_draw,
        eager=_embed_multimodal_eager,
        grids=_gemma4_grids,
        # A request's row of 140 slots, past the widest captured one (70).
        oversized=lambda budget: (2 * _GEMMA4_WIDTH, 27, 27),
        # The replayed rows past an image's soft tokens are its row's empty
        # pooled slots, which the language model never reads (the prompt
        # holds the soft tokens); vLLM's eager path returns the soft tokens.
        graph_rows_past_eager=True,
        save_processor=_tokenizer_only,
        compilation=_ladder(70, 140, 280),
    ),
    "dots_ocr": TinyModel(
        stem="dots_ocr",
        hf_config=_dots_ocr_config,
        **{
            **_QWEN2_VL_FAMILY,
            # One frame per patch (temporal_patch_size 1): 3 x 14 x 14 values.
            "draw": functools.partial(_flat_patches_draw, patch=14),
            "eager": _embed_multimodal_eager,
            "save_processor": _dots_ocr_processor,
            "modalities": ("image",),
        },
        compilation=_ladder(64, 128),
    ),
    "mllama4": TinyModel(
        stem="mllama4",
        hf_config=_mllama4_config,
        # 56-pixel tiles of 14-pixel patches, shuffled by half: 4 tokens a tile.
        **{
            **_tile_family(
                56,
                4,
                {"image": ("pixel_values", "patches_per_image")},
                _embed_multimodal_eager,
                _tokenizer_only,
            ),
            "draw": _mllama4_draw,
        },
        compilation=_ladder(8, 16, 32),
    ),
    "step3_vl": TinyModel(
        stem="step3_vl",
        hf_config=_step3_vl_config,
        draw=_step3_vl_draw,
        eager=_embed_multimodal_eager,
        grids=_step3_vl_grids,
        # Two crops and the global image: 652 tokens.
        oversized=lambda budget: (budget // 324 + 1, 1, 1),
        save_processor=_tokenizer_only,
        compilation=_ladder(8, 332),
    ),
    "lfm2_vl": TinyModel(
        stem="lfm2_vl",
        hf_config=_lfm2_vl_config,
        draw=_lfm2_vl_draw,
        eager=_embed_multimodal_eager,
        grids=_lfm2_vl_grids,
        # Nine tiles of 4 x 4 patches: 36 tokens.
        oversized=lambda budget: (budget // 4 + 1, 4, 4),
        save_processor=_tokenizer_only,
        compilation=_ladder(8, 16, 32),
    ),
    "kimi_k25": TinyModel(
        stem="kimi_k25",
        hf_config=_kimi_k25_config,
        **{
            **_QWEN2_VL_FAMILY,
            "grids": _kimi_k25_grids,
            "draw": functools.partial(_patches_draw, patch=14, grid_key="grid_thws"),
            "eager": _embed_multimodal_eager,
            "save_processor": _kimi_k25_processor,
            "modalities": ("vision_chunk",),
        },
        compilation=_ladder(64, 128),
    ),
    "ernie45_vl": TinyModel(
        stem="ernie45_vl",
        hf_config=_ernie45_vl_config,
        **{
            **_QWEN2_VL_FAMILY,
            "draw": functools.partial(_flat_patches_draw, patch=14),
            "eager": _embed_multimodal_eager,
            "save_processor": _tokenizer_only,
            "modalities": ("image",),
        },
        compilation=_ladder(64, 128),
    ),
    "gemma3_mm": TinyModel(
        stem="gemma3_mm",
        hf_config=_gemma3_config,
        # 56-pixel crops of 14-pixel patches, pooled to 2 x 2: 4 tokens a crop.
        **_tile_family(
            56,
            4,
            {"image": ("pixel_values", "num_patches")},
            _embed_multimodal_eager,
            _gemma3_processor,
        ),
        compilation=_ladder(8, 16, 32),
    ),
    "idefics3": TinyModel(
        stem="idefics3",
        hf_config=_idefics3_config,
        # 56-pixel tiles of 14-pixel patches, shuffled by 2: 4 tokens a tile.
        **{
            **_tile_family(
                56,
                4,
                {"image": ("pixel_values", "num_patches")},
                _embed_multimodal_eager,
                _idefics3_processor,
            ),
            "draw": _idefics3_draw,
        },
        compilation=_ladder(8, 16, 32),
    ),
    "kimi_vl": TinyModel(
        stem="kimi_vl",
        hf_config=_kimi_vl_config,
        **{
            **_QWEN2_VL_FAMILY,
            "draw": functools.partial(
                _patches_draw, patch=14, grid_key="image_grid_hws"
            ),
            "eager": _embed_multimodal_eager,
            "save_processor": _tokenizer_only,
            "modalities": ("image",),
        },
        compilation=_ladder(64, 128),
    ),
    "internvl": TinyModel(
        stem="internvl",
        hf_config=_internvl_config,
        # 56-pixel tiles of 14-pixel patches, shuffled by half: 4 tokens a tile.
        **_tile_family(56, 4, _INTERNVL_KEYS, _internvl_eager, _tokenizer_only),
        compilation=_ladder(8, 16, 32),
    ),
    "skyworkr1v": TinyModel(
        stem="skyworkr1v",
        hf_config=_skyworkr1v_config,
        # InternVL's tiles: 56 pixels of 14-pixel patches, shuffled by half.
        **_tile_family(
            56,
            4,
            {"image": _INTERNVL_KEYS["image"]},
            _skyworkr1v_eager,
            _tokenizer_only,
        ),
        compilation=_ladder(8, 16, 32),
    ),
    "eagle2_5_vl": TinyModel(
        stem="eagle2_5_vl",
        hf_config=_eagle2_5_vl_config,
        # 56-pixel tiles of 14-pixel patches, shuffled by half: 4 tokens a tile.
        **_tile_family(
            56,
            4,
            {"image": ("pixel_values_flat", "image_num_patches")},
            _embed_multimodal_eager,
            _tokenizer_only,
        ),
        compilation=_ladder(8, 16, 32),
    ),
    "cohere2_vision": TinyModel(
        stem="cohere2_vision",
        hf_config=_cohere2_vision_config,
        # 56-pixel tiles of 14-pixel patches, 2 x 2 shuffled: 4 tokens a tile.
        **_tile_family(
            56,
            4,
            {"image": ("pixel_values", "num_patches")},
            _cohere2_vision_eager,
            _cohere2_vision_processor,
        ),
        compilation=_ladder(8, 16, 32),
    ),
    "qwen2_5_omni": TinyModel(
        stem="qwen2_5_omni",
        hf_config=_qwen2_5_omni_config,
        **{
            **_QWEN2_VL_FAMILY,
            "save_processor": _qwen2_5_omni_processor,
            "modalities": ("image",),
        },
        compilation=_ladder(16, 32, 64),
    ),
    "mistral3": TinyModel(
        stem="mistral3",
        hf_config=_mistral3_config,
        # A side past the vision config's image size: eager (vLLM's HF
        # Pixtral tower takes it).
        **_pixel_family(
            _MISTRAL3_SIDE,
            _MISTRAL3_GROUP,
            "pixel_values",
            oversized=(1, _MISTRAL3_SIDE + _MISTRAL3_GROUP, _MISTRAL3_GROUP),
        ),
        compilation=_ladder(64, 128),
    ),
    "pixtral": TinyModel(
        stem="pixtral",
        hf_config=_pixtral_params,
        # The largest image, 256 tokens, over the ladder: eager. (A side past
        # the image size is no item at all: vLLM's own tower indexes its RoPE
        # table out of range.)
        **_pixel_family(
            _PIXTRAL_SIDE,
            _PIXTRAL_GROUP,
            "images",
            oversized=(1, _PIXTRAL_SIDE, _PIXTRAL_SIDE),
        ),
        compilation=_ladder(64, 128),
    ),
    "paddleocr_vl": TinyModel(
        stem="paddleocr_vl",
        hf_config=_paddleocr_vl_config,
        **{
            **_QWEN2_VL_FAMILY,
            "draw": _single_frame_patches_draw,
            "eager": _embed_multimodal_eager,
            "save_processor": _tokenizer_only,
            "modalities": ("image",),
        },
        compilation=_ladder(64, 128),
    ),
    "paligemma": TinyModel(
        stem="paligemma",
        hf_config=_paligemma_config,
        draw=_views_draw,
        eager=_embed_multimodal_eager,
        grids=_view_grids,
        oversized=None,
        save_processor=_tokenizer_only,
        compilation=_ladder(16, 32, 64),
    ),
    "qwen3_omni": TinyModel(
        stem="qwen3_omni",
        hf_config=_qwen3_omni_config,
        **{
            **_QWEN2_VL_FAMILY,
            "draw": functools.partial(_qwen2_vl_draw, patch=16),
            "eager": _embed_multimodal_eager,
            "save_processor": _tokenizer_only,
            "modalities": ("image",),
        },
        compilation=_ladder(16, 32, 64),
    ),
    "cohere_compass": TinyModel(
        stem="cohere_compass",
        hf_config=_cohere_compass_config,
        **{
            **_QWEN2_VL_FAMILY,
            "save_processor": _cohere_compass_processor,
            "modalities": ("image",),
        },
        compilation=_ladder(16, 32, 64),
    ),
    "glm4_1v": TinyModel(
        stem="glm4_1v",
        hf_config=_glm4_1v_config,
        **{**_QWEN2_VL_FAMILY, "save_processor": _glm4_1v_processor},
        compilation=_ladder(16, 32, 64),
    ),
    "qwen3_vl": TinyModel(
        stem="qwen3_vl",
        hf_config=_qwen3_vl_config,
        **{
            **_QWEN2_VL_FAMILY,
            "draw": functools.partial(_qwen2_vl_draw, patch=16),
            "save_processor": _qwen3_vl_processor,
        },
        compilation=_ladder(16, 32, 64),
    ),
    "qwen2_5_vl": TinyModel(
        stem="qwen2_5_vl",
        hf_config=_qwen2_5_vl_config,
        **_QWEN2_VL_FAMILY,
        compilation=_ladder(16, 32, 64),
    ),
    "qwen2_vl": TinyModel(
        stem="qwen2_vl",
        hf_config=_qwen2_vl_config,
        **_QWEN2_VL_FAMILY,
        compilation=_ladder(16, 32, 64),
    ),
}


NOT_ON_CPU: dict[str, str] = {
    "minimax_m3": (
        "the class builds (with two dense layers of full attention: vLLM's CPU "
        "MoE experts lack the `swigluoai_uninterleave` activation its experts "
        "ask for, and its sparse attention has no CPU kernel), but its vision "
        "tower cannot run: `prepare_encoder_metadata` builds the rotary tables "
        "with a Triton kernel (`VitMropeSetup`, no CPU path; vLLM's CPU build "
        "has no Triton) and its attention applies them with `triton_mrope`"
    ),
    "glm5_next": (
        "no `VllmConfig` can be made: the model is hybrid (KDA layers) and uses "
        "MLA (its indexed attention is NoPE MLA, whatever the layer types); "
        "vLLM's CPU platform turns prefix caching off for MLA models without "
        "AMX, after its hybrid set-up has set a mamba block size, and the "
        "config's own check then fails ('--mamba-block-size can only be set "
        "with --enable-prefix-caching'), with prefix caching asked for or not"
    ),
    "kimi_k3": (
        "no `VllmConfig` can be made, as for GLM-5-Next: its language model "
        "(Kimi Linear) is hybrid and uses MLA, and a tiny config with MLA "
        "layers only still fails the same check ('--mamba-block-size can only "
        "be set with --enable-prefix-caching')"
    ),
    "deepseek_ocr": (
        "only at full size: vLLM builds its two towers at full size whatever "
        "the config says (`build_sam_vit_b()`, SAM ViT-B: 12 layers of 768 on "
        "1024-pixel views, and CLIP-L from a `CLIPVisionConfig` written in "
        "`__init__`: 24 layers of 1024), about 400M parameters and, estimated "
        "from those sizes (not timed), about a TFLOP per view: far from the "
        "seconds a CPU test of several batches may take"
    ),
    "deepseek_vl2": (
        "only at full size: vLLM builds its vision tower with "
        "`timm.create_model('vit_so400m_patch14_siglip_384.webli')` whatever "
        "the config says (SigLIP-so400m: 27 layers of 1152 on 384-pixel tiles, "
        "about 400M parameters), and `timm` is not among vLLM's requirements "
        "(the test environment would need it only for this model)"
    ),
    "deepseek_v41": (
        "read from vLLM's source, not run: its language model's attention is "
        "sparse MLA only (`DeepseekV4Attention`, whose forward is FlashMLA's or "
        "FlashInfer's sparse kernel; vLLM's CPU platform refuses sparse "
        "attention: 'Sparse Attention is not supported on CPU'), and the "
        "module it loads on a non-ROCm platform imports the NVIDIA model, "
        "whose hyper-connection kernels are TileLang and Triton (vLLM's CPU "
        "build has no Triton)"
    ),
    "phi4mm": (
        "only at full size: vLLM builds its vision tower from a SigLIP config "
        "written in `get_navit_vision_model` whatever the checkpoint's config "
        "says (448-pixel crops of 14-pixel patches, 1152 wide, 26 of its 27 "
        "layers: about 400M parameters), and the spec's smallest budget is one "
        "image of 37 crops (37 x 256 tokens), so each capture runs 37 crops of "
        "1,024 patches through it: estimated from those sizes (not timed), "
        "tens of TFLOP per capture, far from the seconds a CPU test may take"
    ),
    "phi3v": (
        "only at full size: vLLM builds its vision tower from "
        "`CLIP_VIT_LARGE_PATCH14_336_CONFIG` whatever the checkpoint's config "
        "says (CLIP-L/14 at 336 pixels, 23 of its 24 layers of 1024: about "
        "300M parameters), and the spec's smallest budget is one image of 17 "
        "crops (17 x 576 rows), so each capture runs 17 crops of 577 tokens "
        "through it: estimated from those sizes (not timed), several TFLOP per "
        "capture, far from the seconds a CPU test may take"
    ),
}
"""Served models whose vLLM class cannot be built, or cannot run its vision
tower, on a CPU, or only at full size: what fails, concretely."""


def models_table(
    names: dict[str, str], served: list[str], adds_protocol: frozenset[str]
) -> str:
    """The Markdown table of every served model (``names``: stem -> the
    spec's name) and what the real-vLLM tests do with it."""
    rows = ["| Model | Spec | On a CPU with real vLLM 0.33.0 |", "|---|---|---|"]
    for stem in served:
        if stem in TINY:
            checks = "(a) (b)" if stem in adds_protocol else "(a) (b) (c)"
            kinds = " and ".join(f"{m}s" for m in TINY[stem].modalities)
            status = f"built from a tiny config; {checks} pass, {kinds}"
            if TINY[stem].oversized is None:
                status += " (one fixed-size view an image: none is above a budget)"
        elif stem in NOT_ON_CPU:
            status = f"cannot be tested on a CPU: {NOT_ON_CPU[stem]}"
        else:
            status = "not attempted yet (registered and resolved by (a) only)"
        rows.append(f"| {names[stem]} | `{stem}` | {status} |")
    return "\n".join(rows) + "\n"
