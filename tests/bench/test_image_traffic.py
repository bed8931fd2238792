"""The real-traffic image sizes and the models' resize rules.

The resize rules are checked against vLLM 0.33.0's own functions, read from
the wheel with ``zipfile`` + ``ast`` and run on plain numbers (their modules
import torch, PIL and transformers, which these tests do not need): MiniMax
M3's vendored ``smart_resize`` (the Qwen-VL rule; Qwen2-VL's differs only in
its parameters), the size arithmetic of DeepSeek-V4.1's ``load_image``,
InternVL's tiling helpers, Step3-VL's ``ImagePatcher.get_num_patches`` and
Kimi-VL's ``get_num_image_tokens``. Tables of hand-worked cases check the
rules' edges (tiny images, extreme aspect ratios, the caps) on their own.
The wheel: ``$GEN_MIXIN_VLLM_WHEEL``, else ``~/.cache/gen-mixin/vllm-0.33.0-*.whl``;
without it the oracle tests skip.
"""

from __future__ import annotations

import ast
import math
import os
import random
import zipfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bench_modules import load_bench_module

traffic = load_bench_module("image_traffic")

MINIMAX_PROCESSOR = "vllm/transformers_utils/processors/minimax_m3.py"
DEEPSEEK_PREPROCESS = "vllm/models/deepseek_v41/common/mm_preprocess.py"
INTERNVL_PROCESSOR = "vllm/transformers_utils/processors/internvl.py"
STEP3_PROCESSOR = "vllm/transformers_utils/processors/step3_vl.py"
KIMI_VL_MODEL = "vllm/model_executor/models/kimi_vl.py"
KIMI_K25_PROCESSOR = "vllm/transformers_utils/processors/kimi_k25_vision_fused.py"
MISTRAL3_MODEL = "vllm/model_executor/models/mistral3.py"
#: Pixtral's processor is mistral_common's ``ImageEncoder`` (vLLM 0.33.0's
#: ``MistralCommonImageProcessor`` wraps it), not part of vLLM's wheel: read
#: from the real-vLLM test venv's copy (1.13.1) when there is one.
MISTRAL_COMMON_IMAGE = "mistral_common/tokens/tokenizers/image.py"


def wheel_path() -> Path | None:
    env = os.environ.get("GEN_MIXIN_VLLM_WHEEL")
    if env:
        return Path(env)
    found = sorted((Path.home() / ".cache" / "gen-mixin").glob("vllm-0.33.0-*.whl"))
    return found[0] if found else None


def vllm_module(member: str) -> ast.Module:
    path = wheel_path()
    if path is None or not path.is_file():
        pytest.skip("the vLLM 0.33.0 wheel is not available")
    with zipfile.ZipFile(path) as zf:
        return ast.parse(zf.read(member), filename=member)


def vllm_functions(member: str, names: set[str]) -> dict[str, ast.FunctionDef]:
    found = {
        node.name: node
        for node in vllm_module(member).body
        if isinstance(node, ast.FunctionDef) and node.name in names
    }
    assert set(found) == names, f"{member} lacks {names - set(found)}"
    return found


def vllm_methods(member: str, cls: str, names: set[str]) -> list[ast.FunctionDef]:
    """Methods of the class ``cls`` of ``member``, as plain functions."""
    (node,) = [
        n
        for n in vllm_module(member).body
        if isinstance(n, ast.ClassDef) and n.name == cls
    ]
    found = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name in names]
    assert {f.name for f in found} == names, f"{cls} lacks some of {names}"
    return found


def compile_functions(
    nodes: list[ast.FunctionDef], extra: dict[str, Any]
) -> dict[str, Any]:
    """Run function definitions (annotations dropped) with ``math`` in scope."""
    module = ast.Module(body=[], type_ignores=[])
    for node in nodes:
        node = ast.parse(ast.unparse(node)).body[0]
        assert isinstance(node, ast.FunctionDef)
        node.returns = None
        for arg in node.args.args + node.args.kwonlyargs:
            arg.annotation = None
        node.decorator_list = []
        module.body.append(node)
    namespace: dict[str, Any] = {"math": math, **extra}
    code = compile(ast.fix_missing_locations(module), "<vllm>", "exec")
    exec(code, namespace)  # noqa: S102 - vLLM's own source, from its wheel
    return namespace


@pytest.fixture(scope="module")
def vllm_smart_resize() -> Any:
    names = {"round_by_factor", "ceil_by_factor", "floor_by_factor", "smart_resize"}
    nodes = vllm_functions(MINIMAX_PROCESSOR, names | {"_smart_resize_by_long_side"})
    return compile_functions(
        list(nodes.values()), {"MAX_RATIO": 200, "MIN_SHORT_SIDE_PIXEL": 112}
    )["smart_resize"]


def load_image_sizes(load_image: ast.FunctionDef) -> ast.FunctionDef:
    """``load_image``'s size arithmetic as a function of the pixel size:
    its statements up to the ViT grid, with the two that read the PIL image
    replaced by parameters (checked, so a change of vLLM's code fails here)."""
    body = [
        s
        for s in load_image.body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    head = [ast.unparse(s) for s in body[:3]]
    assert head == [
        "p = patch_size",
        "image = image.convert('RGB')",
        "width, height = image.size",
    ]
    end = next(
        i
        for i, s in enumerate(body)
        if ast.unparse(s) == "n_vit_h, n_vit_w = (best_height // p, best_width // p)"
    )
    lines = [
        line
        for s in [body[0], *body[3 : end + 1]]
        for line in ast.unparse(s).splitlines()
    ]
    source = (
        "def sizes(width, height, patch_size, downsample_ratio, max_n_token, "
        "min_pixels, max_wh_ratio):\n"
        + "".join(f"    {line}\n" for line in lines)
        + "    return n_vit_h, n_vit_w\n"
    )
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


@pytest.fixture(scope="module")
def vllm_deepseek_sizes() -> Any:
    names = {
        "llm_grid",
        "num_image_tokens",
        "solve_resize_ratio",
        "safe_resize",
        "load_image",
    }
    nodes = vllm_functions(DEEPSEEK_PREPROCESS, names)
    helpers = [nodes[n] for n in sorted(names - {"load_image"})]
    return compile_functions([*helpers, load_image_sizes(nodes["load_image"])], {})[
        "sizes"
    ]


def every_size() -> list[tuple[int, int]]:
    """Every listed size in both orientations, web-image draws, and random
    sizes from 1 px to 8000 px (aspect ratio up to 50)."""
    sizes = set()
    for source in traffic.SOURCES:
        for long, short, _ in source.sizes:
            sizes |= {(long, short), (short, long)}
    rng = random.Random(0)
    for batch in traffic.draw_image_batches(1, 300):
        sizes.update(batch)
    while len(sizes) < 1500:
        h, w = rng.randint(1, 8000), rng.randint(1, 8000)
        if max(h, w) <= 50 * min(h, w):
            sizes.add((h, w))
    return sorted(sizes)


@pytest.mark.parametrize(
    ("min_pixels", "max_pixels"), [(3136, 451584), (3136, 12845056), (3136, 50176)]
)
def test_smart_resize_is_vllms(
    vllm_smart_resize: Any, min_pixels: int, max_pixels: int
) -> None:
    for h, w in every_size():
        got = traffic.smart_resize(h, w, 28, min_pixels, max_pixels)
        assert got == vllm_smart_resize(h, w, 28, min_pixels, max_pixels), (h, w)


@pytest.mark.parametrize("max_n_token", [1024, 64])
def test_deepseek_resize_is_vllms(vllm_deepseek_sizes: Any, max_n_token: int) -> None:
    for h, w in every_size():
        got = traffic.deepseek_v41_grid(
            h, w, patch=14, ratio=3, max_n_token=max_n_token, min_pixels=295936
        )
        assert got == vllm_deepseek_sizes(w, h, 14, 3, max_n_token, 295936, None), (
            h,
            w,
        )


@pytest.fixture(scope="module")
def vllm_internvl_tiles() -> Any:
    names = {
        "find_closest_aspect_ratio",
        "resolve_internvl_min_max_num",
        "get_internvl_target_ratios",
        "calculate_internvl_targets",
    }
    ns = compile_functions(list(vllm_functions(INTERNVL_PROCESSOR, names).values()), {})

    def tiles(h: int, w: int, max_patch: int) -> int:
        # As the image processor calls them: the thumbnail is left out of
        # the range and added to the grid's blocks.
        low, high = ns["resolve_internvl_min_max_num"](
            min_dynamic_patch=1,
            max_dynamic_patch=max_patch,
            dynamic_image_size=True,
            use_thumbnail=False,
        )
        blocks, _, _ = ns["calculate_internvl_targets"](
            orig_width=w,
            orig_height=h,
            target_ratios=ns["get_internvl_target_ratios"](low, high),
            image_size=448,
            use_thumbnail=True,
        )
        return blocks

    return tiles


@pytest.fixture(scope="module")
def vllm_step3_crops() -> Any:
    import itertools

    import numpy as np

    names = {
        "determine_window_size",
        "slide_window",
        "get_image_size_for_padding",
        "get_image_size_for_preprocess",
        "get_image_size_for_crop",
        "get_num_patches",
    }
    ns = compile_functions(
        vllm_methods(STEP3_PROCESSOR, "ImagePatcher", names),
        {"np": np, "product": itertools.product, "ceil": math.ceil},
    )
    assert vllm_constant(STEP3_PROCESSOR, "MAX_IMAGE_SIZE") == traffic.STEP3_MAX_SIDE
    ns["MAX_IMAGE_SIZE"] = traffic.STEP3_MAX_SIDE
    patcher = type("ImagePatcher", (), {n: ns[n] for n in names})()
    patcher.enable_patch = True
    return lambda h, w: patcher.get_num_patches(w, h)[0]


def vllm_constant(member: str, name: str) -> Any:
    for node in vllm_module(member).body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == name:
            return ast.literal_eval(node.value)
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{member} lacks {name}")


@pytest.fixture(scope="module")
def vllm_kimi_grid() -> Any:
    """``get_num_image_tokens`` returning its token grid (its last
    statement, the product, replaced), times the kernel: the patch grid."""
    (method,) = vllm_methods(
        KIMI_VL_MODEL, "KimiVLProcessingInfo", {"get_num_image_tokens"}
    )
    assert ast.unparse(method.body[-1]) == "return int(token_height * token_width)"
    method.body[-1] = ast.parse("return (token_height, token_width)").body[0]
    fn = compile_functions([method], {})["get_num_image_tokens"]

    def grid(h: int, w: int, limit: int) -> tuple[int, int]:
        image_processor = type(
            "P",
            (),
            {"patch_size": 14, "merge_kernel_size": (2, 2), "in_token_limit": limit},
        )
        hf = type("HF", (), {"image_processor": image_processor})
        info = type("Info", (), {"get_hf_processor": lambda self: hf})()
        th, tw = fn(info, image_width=w, image_height=h)
        return 2 * th, 2 * tw

    return grid


@pytest.fixture(scope="module")
def vllm_kimi_k25_resize() -> Any:
    """vLLM's ``navit_resize_image`` (Kimi-K2.5's processor), from the wheel."""
    nodes = vllm_functions(KIMI_K25_PROCESSOR, {"navit_resize_image"})
    return compile_functions(list(nodes.values()), {})["navit_resize_image"]


@pytest.mark.parametrize(
    ("in_patch_limit", "side_limit"), [(16384, 512), (256, 512), (4096, 64)]
)
def test_kimi_k25_grid_is_vllms(
    vllm_kimi_k25_resize: Any, in_patch_limit: int, side_limit: int
) -> None:
    thin = [(14, 7000), (14, 9000), (3, 5000), (1, 14), (20000, 30)]
    for h, w in every_size() + thin:
        out = vllm_kimi_k25_resize(
            width=w,
            height=h,
            patch_size=14,
            merge_kernel_size=2,
            in_patch_limit=in_patch_limit,
            patch_limit_on_one_side=side_limit,
            fixed_output_tokens=None,
        )
        expected = (
            1,
            (out["new_height"] + out["pad_height"]) // 14,
            (out["new_width"] + out["pad_width"]) // 14,
        )
        got = traffic.kimi_k25_grid(
            h,
            w,
            patch=14,
            kernel=2,
            in_patch_limit=in_patch_limit,
            patch_limit_on_one_side=side_limit,
        )
        assert got == expected, (h, w)
        assert out["num_tokens"] == got[1] * got[2] // 4, (h, w)


@pytest.mark.parametrize("max_patch", [12, 4, 6])
def test_internvl_tiling_is_vllms(vllm_internvl_tiles: Any, max_patch: int) -> None:
    for h, w in every_size():
        got = traffic.internvl_tiles(
            h, w, image_size=448, min_tiles=1, max_tiles=max_patch, use_thumbnail=True
        )
        assert got == (vllm_internvl_tiles(h, w, max_patch),), (h, w)


def test_step3_crops_are_vllms(vllm_step3_crops: Any) -> None:
    thin = [(h, w) for h in (1, 20, 31, 32, 80, 200) for w in (150, 900, 3024, 7000)]
    for h, w in every_size() + thin + [(w, h) for h, w in thin]:
        assert traffic.step3_vl_crops(h, w) == vllm_step3_crops(h, w), (h, w)


@pytest.mark.parametrize("limit", [4096, 256])
def test_kimi_grid_is_vllms(vllm_kimi_grid: Any, limit: int) -> None:
    """Where the rule refuses, the Hugging Face processor raises too (a side
    of 512 patches or more) or the image has no rows left."""
    thin = [(14, 7000), (14, 7200), (3, 5000), (1, 14)]
    for h, w in every_size() + thin:
        expected = vllm_kimi_grid(h, w, limit)
        try:
            got = traffic.kimi_vl_grid(
                h,
                w,
                patch=14,
                kernel=(2, 2),
                in_token_limit=limit,
                max_patches_per_side=511,
            )
        except ValueError:
            assert max(expected) >= 512 or min(expected) == 0, (h, w, expected)
            continue
        assert got == expected, (h, w)


INTERNVL_FULL = {
    "image_size": 448,
    "min_tiles": 1,
    "max_tiles": 12,
    "use_thumbnail": True,
}


@pytest.mark.parametrize(
    ("pixels", "options", "tiles"),
    [
        # A thumbnail: 1 x 1, and too small (< half of 2 x 2 tiles' pixels)
        # for the same ratio in 2 x 2: one tile, no thumbnail.
        ((150, 150), {}, 1),
        ((448, 448), {}, 1),
        # 700² px is more than half of 2 x 2 tiles, less than half of 3 x 3.
        ((700, 700), {}, 4 + 1),
        # A 4:3 photo: the 4 x 3 grid exactly, plus the thumbnail.
        ((3024, 4032), {}, 12 + 1),
        ((4032, 3024), {}, 12 + 1),
        # A square crop grows to the largest square grid, 3 x 3.
        ((3024, 3024), {}, 9 + 1),
        # 16:9: 2:1 is closest (4 x 2 beats 2 x 1 at the same ratio).
        ((1080, 1920), {}, 8 + 1),
        # A 320 x 180 thumbnail: 2:1, too small for 4 x 2.
        ((180, 320), {}, 2 + 1),
        # Extreme aspect: the widest grid, 12 x 1.
        ((100, 5000), {}, 12 + 1),
        # The tiny tower's cap of 4 tiles: 4:3 goes to 2 x 2 (the tie with
        # 1 x 1 goes to the larger grid).
        ((3024, 4032), {"max_tiles": 4}, 4 + 1),
        # Tiling off (dynamic_image_size false): one tile whatever the size.
        ((3024, 4032), {"max_tiles": 1}, 1),
    ],
)
def test_internvl_examples(
    pixels: tuple[int, int], options: dict[str, Any], tiles: int
) -> None:
    assert traffic.internvl_tiles(*pixels, **{**INTERNVL_FULL, **options}) == (tiles,)


@pytest.mark.parametrize(
    ("pixels", "crops"),
    [
        # Long side under 728 px: no crops unless the aspect exceeds 1.5.
        ((150, 150), 0),
        ((600, 700), 0),
        # 320 x 180: crops of the short side, 320/180 = 1.78 -> 2 x 1.
        ((180, 320), 2),
        ((700, 400), 2),
        # 728² px: 504² crops, 1.44 per side -> rounded up (> 0.2 left).
        ((728, 728), 2 * 2),
        # The 0.2 rule: 1108 / 504 = 2.198 -> 2 a side, 1109 -> 2.2004 -> 3.
        ((1108, 1108), 2 * 2),
        ((1109, 1109), 3 * 3),
        # 1920 x 1080: 3.81 -> 4 across, 2.14 -> 2 down.
        ((1080, 1920), 4 * 2),
        # A 4:3 photo is first scaled to 3024 x 2268: 6 x 4.5 -> 6 x 5.
        ((3024, 4032), 6 * 5),
        ((4284, 5712), 6 * 5),
        # The cap: a square photo gives the most crops of a normal image.
        ((3024, 3024), 6 * 6),
        # Aspect above 4: crops of the short side, 3000 / 100 = 30.
        ((100, 3000), 30),
        # A strip under 32 px is padded to a square first.
        ((20, 3000), 6 * 6),
        # 3024 / 80 = 37.8 -> 38 crops: more than the reference tower's 36.
        ((80, 3024), 38),
    ],
)
def test_step3_examples(pixels: tuple[int, int], crops: int) -> None:
    assert traffic.step3_vl_crops(*pixels) == crops


def test_step3_rule_caps_at_the_towers_crops() -> None:
    from reference_towers.registry import REFERENCE_TOWERS

    tower = REFERENCE_TOWERS["step3_vl"]
    full, tiny = tower.config("full"), tower.config("tiny")
    # The released tower's cap is vLLM's 3024 px; the tiny one's (6 crops
    # at most) is 2 x 504 px.
    assert traffic.step3_vl_max_side(full) == traffic.STEP3_MAX_SIDE
    assert traffic.step3_vl_max_side(tiny) == 1008
    assert traffic.model_grid("step3_vl", full)(3024, 4032) == (30,)
    assert traffic.model_grid("step3_vl", tiny)(3024, 4032) == (2 * 2,)
    with pytest.raises(ValueError, match="38 Step3-VL crops, more than the tower's 36"):
        traffic.model_grid("step3_vl", full)(80, 3024)


KIMI_FULL = {
    "patch": 14,
    "kernel": (2, 2),
    "in_token_limit": 4096,
    "max_patches_per_side": 511,
}


@pytest.mark.parametrize(
    ("pixels", "options", "grid"),
    [
        # Small images are padded up to the 28 px kernel, never upscaled.
        ((10, 10), {}, (2, 2)),
        ((150, 150), {}, (12, 12)),
        # 896² px: exactly 64 x 64 = 4096 whole patches, not scaled.
        ((896, 896), {}, (64, 64)),
        # 897 px: still 64 whole patches a side; padded to 33 kernels.
        ((897, 896), {}, (66, 64)),
        # 910 px: 65 x 64 > 4096, scaled by 0.9923 to 902 x 889 px.
        ((910, 896), {}, (66, 64)),
        # A 4:3 photo: scaled by 0.2566 to 775 x 1034 px: 28 x 37 kernels.
        ((3024, 4032), {}, (56, 74)),
        # The tiny tower's 256-patch limit: 193 x 258 px, 7 x 10 kernels.
        ((3024, 4032), {"in_token_limit": 256}, (14, 20)),
        # A 14 px strip: 250 kernels across, under the 512-patch cap.
        ((14, 7000), {}, (2, 500)),
    ],
)
def test_kimi_examples(
    pixels: tuple[int, int], options: dict[str, Any], grid: tuple[int, int]
) -> None:
    assert traffic.kimi_vl_grid(*pixels, **{**KIMI_FULL, **options}) == grid


def test_kimi_refuses_what_its_processor_refuses() -> None:
    # 7200 px is 258 kernels, 516 patches: the processor raises at 512.
    with pytest.raises(ValueError, match="2x516 patches"):
        traffic.kimi_vl_grid(14, 7200, **KIMI_FULL)


@pytest.mark.parametrize(
    ("pixels", "grid"),
    [
        # A 12 MP 4:3 photo: MiniMax M3 shrinks it under 672² (20 x 27 blocks).
        ((3024, 4032), (1, 40, 54)),
        # A 1080p screenshot: 504 x 896 px, 18 x 32 blocks (576 tokens).
        ((1080, 1920), (1, 36, 64)),
        # A thumbnail is upscaled to at least 56² pixels, then rounded.
        ((150, 150), (1, 10, 10)),
    ],
)
def test_minimax_examples(pixels: tuple[int, int], grid: tuple[int, int, int]) -> None:
    rule = traffic.model_grid(
        "minimax_m3",
        type(
            "C", (), {"max_pixels": 451584, "patch_size": 14, "spatial_merge_size": 2}
        ),
    )
    assert rule(*pixels) == grid


def mistral_common_image_module() -> ast.Module:
    found = sorted(
        (Path.home() / ".cache" / "gen-mixin" / "vllm-venv").glob(
            f"lib/python3*/site-packages/{MISTRAL_COMMON_IMAGE}"
        )
    )
    if not found:
        pytest.skip("mistral_common (the real-vLLM test venv's) is not available")
    return ast.parse(found[0].read_text(encoding="utf-8"), filename=str(found[0]))


@pytest.fixture(scope="module")
def mistral_common_sizes() -> Any:
    """``ImageEncoder._image_to_num_tokens`` from mistral_common's source,
    and the resized size its ``__call__`` derives from the token grid."""
    (encoder,) = [
        n
        for n in mistral_common_image_module().body
        if isinstance(n, ast.ClassDef) and n.name == "ImageEncoder"
    ]
    (method,) = [
        f
        for f in encoder.body
        if isinstance(f, ast.FunctionDef) and f.name == "_image_to_num_tokens"
    ]
    num_tokens = compile_functions([method], {})["_image_to_num_tokens"]

    def sizes(height: int, width: int, max_image_size: int, patch: int, merge: int):
        config = SimpleNamespace(
            max_image_size=max_image_size,
            image_patch_size=patch,
            spatial_merge_size=merge,
        )
        image = SimpleNamespace(size=(width, height))
        w_tokens, h_tokens = num_tokens(SimpleNamespace(image_config=config), image)
        return h_tokens * patch * merge, w_tokens * patch * merge

    return sizes


@pytest.mark.parametrize(
    ("max_image_size", "patch", "merge"),
    [(1540, 14, 2), (1024, 16, 1), (224, 14, 2)],
)
def test_pixtral_resize_is_mistral_commons(
    mistral_common_sizes: Any, max_image_size: int, patch: int, merge: int
) -> None:
    options = {"max_image_size": max_image_size, "patch": patch, "merge": merge}
    for h, w in every_size():
        assert traffic.pixtral_image_size(h, w, **options) == mistral_common_sizes(
            h, w, **options
        ), (h, w)


#: Mistral-Small-3.1's Mistral-format processor (cells of 2 x 14 px).
PIXTRAL_FULL = {"max_image_size": 1540, "patch": 14, "merge": 2}


@pytest.mark.parametrize(
    ("pixels", "options", "size"),
    [
        # A 12 MP 4:3 photo: long side to 1540, 1155 px up to 42 cells.
        ((3024, 4032), {}, (1176, 1540)),
        # A 1080p screenshot: 866 px (866.25 rounded) up to 31 cells.
        ((1080, 1920), {}, (868, 1540)),
        # A thumbnail is not scaled, only resized up to whole cells.
        ((150, 150), {}, (168, 168)),
        # 280.5 px rounds half to even (280: 10 cells; 281 would be 11).
        ((561, 3080), {}, (280, 1540)),
        # 280.8 px rounds to 281: 11 cells (Mistral3's floor gives 10).
        ((702, 3850), {}, (308, 1540)),
        # A 1-px strip keeps one pixel, one cell.
        ((1, 8000), {}, (28, 1540)),
        # Pixtral-12B: 16-px patches, no merge, longest side 1024.
        ((1080, 1920), {"max_image_size": 1024, "patch": 16, "merge": 1}, (576, 1024)),
    ],
)
def test_pixtral_examples(
    pixels: tuple[int, int], options: dict[str, Any], size: tuple[int, int]
) -> None:
    assert traffic.pixtral_image_size(*pixels, **{**PIXTRAL_FULL, **options}) == size


def test_pixtral_rule_is_the_registrys() -> None:
    from reference_towers.registry import REFERENCE_TOWERS

    tower = REFERENCE_TOWERS["pixtral"]
    for size in ("tiny", "full"):
        rule = traffic.model_grid("pixtral", tower.config(size))
        largest = rule(8000, 8000)
        assert tower.output_tokens(largest) == tower.max_output_tokens(size)
        assert rule(1, 1) == tower.smallest_item(size)
    with pytest.raises(ValueError, match="not an image"):
        traffic.pixtral_image_size(0, 5, **PIXTRAL_FULL)


@pytest.fixture(scope="module")
def vllm_mistral3_sizes() -> Any:
    """vLLM's ``Mistral3HFEncoderInfo.get_patch_grid_size`` as the resized
    pixel size."""
    (method,) = vllm_methods(
        MISTRAL3_MODEL, "Mistral3HFEncoderInfo", {"get_patch_grid_size"}
    )

    class Mistral3Config(SimpleNamespace):
        pass

    grid_size = compile_functions([method], {"Mistral3Config": Mistral3Config})[
        "get_patch_grid_size"
    ]

    def sizes(height: int, width: int, max_image_size: int, patch: int, merge: int):
        info = SimpleNamespace(
            get_image_size=lambda: max_image_size,
            vision_config=SimpleNamespace(patch_size=patch),
            hf_config=Mistral3Config(spatial_merge_size=merge),
        )
        ncols, nrows = grid_size(info, image_width=width, image_height=height)
        return nrows * patch * merge, ncols * patch * merge

    return sizes


@pytest.mark.parametrize(
    ("max_image_size", "patch", "merge"), [(1540, 14, 2), (1024, 16, 1), (224, 14, 2)]
)
def test_mistral3_resize_is_vllms(
    vllm_mistral3_sizes: Any, max_image_size: int, patch: int, merge: int
) -> None:
    options = {"max_image_size": max_image_size, "patch": patch, "merge": merge}
    for h, w in every_size():
        expected = vllm_mistral3_sizes(h, w, **options)
        if min(expected) < 1:
            # vLLM counts no token for a strip floored to 0 px: refused here.
            with pytest.raises(ValueError, match="no pixel"):
                traffic.mistral3_image_size(h, w, **options)
            continue
        assert traffic.mistral3_image_size(h, w, **options) == expected, (h, w)


@pytest.mark.parametrize(
    ("pixels", "size"),
    [
        # A 1080p screenshot: 866.25 px floored to 866, 31 cells (as rounded).
        ((1080, 1920), (868, 1540)),
        # 280.5 px floors to 280 either way: 10 cells.
        ((561, 3080), (280, 1540)),
        # 280.8 px floors to 280 (10 cells), where mistral_common's rounding
        # gives 281 px, 11 cells (test_pixtral_examples).
        ((702, 3850), (280, 1540)),
    ],
)
def test_mistral3_examples(pixels: tuple[int, int], size: tuple[int, int]) -> None:
    assert traffic.mistral3_image_size(*pixels, **PIXTRAL_FULL) == size


def test_draws_follow_the_mixture() -> None:
    batches = traffic.draw_image_batches(7, 4000)
    assert batches == traffic.draw_image_batches(7, 4000)  # seeded
    counts = Counter(len(b) for b in batches)
    assert sum(counts[n] for n in (1, 2, 3, 4)) / len(batches) == pytest.approx(
        0.82, abs=0.03
    )
    assert max(counts) <= 16
    photos = sum(
        1 for b in batches for h, w in b if max(h, w) >= 3024 and min(h, w) >= 2268
    )
    images = sum(counts[n] * n for n in counts)
    # Camera photos are 35 % of images (scanned pages at 300 dpi add ~3.5 %).
    assert photos / images == pytest.approx(0.35 + 0.1 * 0.6, abs=0.03)


def test_every_draw_is_legal_for_every_tower() -> None:
    from reference_towers.registry import REFERENCE_TOWERS

    batches = traffic.draw_image_batches(3, 200)
    for stem, tower in REFERENCE_TOWERS.items():
        if stem in traffic.NO_RESIZE_RULE:
            # Left out on purpose; a guessed rule would check nothing.
            with pytest.raises(KeyError, match="no resize rule"):
                traffic.model_grid(stem, tower.config("tiny"))
            continue
        for size in ("tiny", "full"):
            rule = traffic.model_grid(stem, tower.config(size))
            for h, w in (p for b in batches for p in b):
                item = rule(h, w)
                if (stem, size, item) in REGISTRY_GAPS:
                    continue
                assert tower.is_legal(item, size), (stem, size, h, w)


#: Grids the processors emit that the registry's legality refuses: Kimi-VL's
#: bound ``(h - kh)·(w - kw) <= in_token_limit`` (Kimi-K2.5's with its
#: ``in_patch_limit``) holds for images the processor does not shrink; a
#: shrunk image keeps up to about 3 % more (a 320 x 180 thumbnail for the
#: tiny towers' 256-patch limit).
REGISTRY_GAPS = {("kimi_vl", "tiny", (14, 24)), ("kimi_k25", "tiny", (1, 14, 24))}


@pytest.mark.parametrize(
    ("size", "pixels", "grid"),
    [("tiny", (180, 320), (14, 24)), ("full", (2049, 1250), (84, 52))],
)
def test_kimi_registry_refuses_some_shrunk_grids(
    size: str, pixels: tuple[int, int], grid: tuple[int, int]
) -> None:
    """A finding for the registry: these grids come out of vLLM's
    arithmetic (``test_kimi_grid_is_vllms``) but are not legal items there
    ((14 - 2)·(24 - 2) = 264 > 256; 82·50 = 4100 > 4096)."""
    from reference_towers.registry import REFERENCE_TOWERS

    tower = REFERENCE_TOWERS["kimi_vl"]
    assert traffic.model_grid("kimi_vl", tower.config(size))(*pixels) == grid
    assert not tower.is_legal(grid, size)
    assert tower.output_tokens(grid) <= tower.max_output_tokens(size)
