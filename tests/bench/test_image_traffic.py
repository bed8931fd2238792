"""The real-traffic image sizes and the models' resize rules.

The resize rules are checked against vLLM 0.33.0's own functions, read from
the wheel with ``zipfile`` + ``ast`` and run on plain numbers (their modules
import torch, PIL and transformers, which these tests do not need): MiniMax
M3's vendored ``smart_resize`` (the Qwen-VL rule; Qwen2-VL's differs only in
its parameters), and the size arithmetic of DeepSeek-V4.1's ``load_image``.
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
from typing import Any

import pytest
from bench_modules import load_bench_module

traffic = load_bench_module("image_traffic")

MINIMAX_PROCESSOR = "vllm/transformers_utils/processors/minimax_m3.py"
DEEPSEEK_PREPROCESS = "vllm/models/deepseek_v41/common/mm_preprocess.py"


def wheel_path() -> Path | None:
    env = os.environ.get("GEN_MIXIN_VLLM_WHEEL")
    if env:
        return Path(env)
    found = sorted((Path.home() / ".cache" / "gen-mixin").glob("vllm-0.33.0-*.whl"))
    return found[0] if found else None


def vllm_functions(member: str, names: set[str]) -> dict[str, ast.FunctionDef]:
    path = wheel_path()
    if path is None or not path.is_file():
        pytest.skip("the vLLM 0.33.0 wheel is not available")
    with zipfile.ZipFile(path) as zf:
        tree = ast.parse(zf.read(member), filename=member)
    found = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in names
    }
    assert set(found) == names, f"{member} lacks {names - set(found)}"
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
            with pytest.raises(KeyError, match="no resize rule"):
                traffic.model_grid(stem, tower.config("tiny"))
            continue
        for size in ("tiny", "full"):
            rule = traffic.model_grid(stem, tower.config(size))
            for h, w in (p for b in batches for p in b):
                assert tower.is_legal(rule(h, w), size), (stem, size, h, w)
