"""Real-world image sizes, and what each model's processor makes of them.

The real-traffic workload of ``bench/bench_traffic.py`` (sources, weights
and their reasons: ``docs/real-traffic.md``). Torch-free: a draw is a list of
``(height, width)`` pixel sizes per batch, and the resize rules are the
processors' arithmetic, written after vLLM 0.33.0's code (and, for
Qwen2-VL, the HF processor vLLM calls), checked against it by
``tests/bench/test_image_traffic.py``:

* Qwen2-VL and MiniMax M3: ``smart_resize`` (sides rounded to multiples of
  ``patch * merge`` = 28, then scaled into ``[min_pixels, max_pixels]``);
  MiniMax M3's processor caps at 672² pixels (``max_pixels`` 451584),
  Qwen2-VL's checkpoint at 12845056;
* DeepSeek-V4.1: ``load_image`` of ``vllm/models/deepseek_v41/common/
  mm_preprocess.py`` (upscale below ``min_pixels``, sides rounded up to the
  patch, shrink until the span has at most ``max_n_token`` tokens);
* InternVL: the dynamic tiling of ``vllm/transformers_utils/processors/
  internvl.py`` (the ``i×j`` grid of 448² tiles whose aspect ratio is
  closest to the image's, larger grids of the same ratio for large images,
  plus a thumbnail when there is more than one tile);
* Step3-VL: ``ImagePatcher`` of ``vllm/transformers_utils/processors/
  step3_vl.py`` (the long side capped at 3024 px, then 504² crops, or
  crops of the short side for elongated images, none for small ones);
* Kimi-VL: ``KimiVLProcessingInfo.get_num_image_tokens`` of
  ``vllm/model_executor/models/kimi_vl.py`` (the Hugging Face processor's
  rule with ``pad_input``: shrink to at most ``in_token_limit`` whole
  patches, then pad to the 2×2 merge kernel);
* Pixtral: mistral_common's ``ImageEncoder`` (1.13.1, the processor of
  ``vllm/transformers_utils/processors/pixtral.py``: longest side scaled
  down to ``max_image_size``, sides resized up to whole ``patch · merge``
  cells);
* Mistral3: ``Mistral3HFEncoderInfo.get_patch_grid_size`` of
  ``vllm/model_executor/models/mistral3.py`` (the HF Pixtral processor's
  rule: the same, with the scaled sides floored).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generator.resolve import load_spec

SPECS_DIR = Path(__file__).resolve().parents[1] / "specs"

__all__ = [
    "BATCH_SIZES",
    "NO_RESIZE_RULE",
    "SOURCES",
    "WORKLOADS",
    "ImageSource",
    "deepseek_v41_grid",
    "draw_image_batches",
    "internvl_tiles",
    "kimi_vl_grid",
    "merged_grid",
    "mistral3_image_size",
    "model_grid",
    "pixtral_image_size",
    "smart_resize",
    "spec_dims",
    "step3_vl_crops",
    "traffic_document",
]


@dataclass(frozen=True)
class ImageSource:
    """One kind of image: its share of all images and its sizes."""

    name: str
    share: float
    sizes: tuple[tuple[int, int, float], ...]
    """``(long side, short side, weight)`` in pixels."""
    portrait: float
    """Probability that an image stands (height = long side)."""
    source: str


SOURCES: tuple[ImageSource, ...] = (
    ImageSource(
        "camera photo",
        0.35,
        (
            (4032, 3024, 0.35),  # 12 MP 4:3, iPhone default output through iPhone 14
            (5712, 4284, 0.15),  # 24 MP 4:3, iPhone 15 / 16 default output
            (4000, 3000, 0.20),  # 12 MP 4:3, Samsung Galaxy S23 / S24 default
            (4080, 3072, 0.10),  # 12.5 MP 4:3, Google Pixel 8 main camera
            (4032, 2268, 0.08),  # 16:9 crop of the 12 MP sensor
            (3024, 3024, 0.04),  # 1:1 crop
            (6000, 4000, 0.08),  # 24 MP 3:2 APS-C / full-frame camera
        ),
        0.5,
        "device specifications (Apple, Samsung, Google, 24 MP 3:2 sensors)",
    ),
    ImageSource(
        "phone screenshot",
        0.15,
        (
            (2556, 1179, 0.25),  # iPhone 14 Pro / 15 / 16
            (2532, 1170, 0.15),  # iPhone 12 / 13 / 14
            (2796, 1290, 0.10),  # iPhone 15 Pro Max / 16 Plus
            (2400, 1080, 0.20),  # Google Pixel 8, most FHD+ 20:9 Android phones
            (2340, 1080, 0.20),  # Samsung Galaxy S23 / S24
            (3120, 1440, 0.10),  # Samsung Galaxy S24 Ultra (QHD+)
        ),
        1.0,
        "device specifications (screen resolutions)",
    ),
    ImageSource(
        "desktop screenshot",
        0.10,
        (
            (1920, 1080, 60.0),  # Steam survey Feb 2024: just under 60 %
            (2560, 1440, 19.0),  # Steam survey Feb 2024: 18.99 %
            (3840, 2160, 4.0),  # Steam survey: 4K and ultrawide together ~4 %
            (2560, 1664, 10.0),  # MacBook Air 13" (Macs are few in Steam's sample)
        ),
        0.0,
        "Steam Hardware & Software Survey, February 2024 (TweakTown, 2024-03-04); "
        "Apple specifications",
    ),
    ImageSource(
        "scanned page",
        0.10,
        (
            (3508, 2480, 0.35),  # A4 at 300 dpi
            (2339, 1654, 0.25),  # A4 at 200 dpi
            (3300, 2550, 0.25),  # US Letter at 300 dpi
            (1754, 1240, 0.15),  # A4 at 150 dpi
        ),
        1.0,
        "ISO 216 / US Letter paper sizes at common scanner resolutions",
    ),
    ImageSource(
        "web image",
        0.20,
        (),  # drawn from WEB_MEGAPIXELS and WEB_ASPECTS
        0.0,
        "HTTP Archive 2024 (desktop JPEG + WebP counts per megapixel bucket, "
        "webmproject/codec-compare wiki 'Bits per pixel of Internet images')",
    ),
    ImageSource(
        "thumbnail",
        0.10,
        (
            (150, 150, 1.0),  # WordPress default thumbnail
            (320, 180, 1.0),  # YouTube mqdefault
            (480, 360, 1.0),  # YouTube hqdefault
            (200, 200, 1.0),  # Open Graph minimum image size
        ),
        0.0,
        "WordPress and YouTube thumbnail sizes, Open Graph minimum",
    ),
)

#: HTTP Archive 2024, desktop: JPEG + WebP images per megapixel bucket
#: (millions), buckets (0.1, 0.2] .. (0.7, 0.8]; the (0, 0.1] bucket (40.1 M,
#: mostly icons and thumbnails) is what ``thumbnail`` stands for.
WEB_MEGAPIXELS: tuple[tuple[float, float, float], ...] = (
    (0.1, 0.2, 10.72),
    (0.2, 0.3, 7.29),
    (0.3, 0.4, 4.38),
    (0.4, 0.5, 2.87),
    (0.5, 0.6, 1.97),
    (0.6, 0.7, 2.14),
    (0.7, 0.8, 1.40),
)
#: Aspect ratios of web images (width / height): 16:9, 4:3, 3:2, 1:1, and
#: 1.91:1, the Open Graph share-image ratio (1200 x 630).
WEB_ASPECTS = (16 / 9, 4 / 3, 3 / 2, 1.0, 1200 / 630)

#: Images per encoder batch and their weights: mostly 1-4 (82 %), up to 16.
BATCH_SIZES: tuple[tuple[int, float], ...] = (
    (1, 40.0),
    (2, 20.0),
    (3, 12.0),
    (4, 10.0),
    *((n, 3.0) for n in range(5, 9)),
    *((n, 0.75) for n in range(9, 17)),
)


def _pick(rng: random.Random, weighted: Sequence[tuple[Any, float]]) -> Any:
    values, weights = zip(*weighted)
    return rng.choices(values, weights=weights)[0]


#: A second workload (issue #27): the same sources in other shares (more
#: screenshots and scans, fewer photos and thumbnails) and larger batches
#: (1-16 images, flatter), for a ladder tuned on one mix and measured on
#: another seed of another mix.
SECOND_WORKLOAD_SHARES: dict[str, float] = {
    "camera photo": 0.15,
    "phone screenshot": 0.25,
    "desktop screenshot": 0.20,
    "scanned page": 0.20,
    "web image": 0.15,
    "thumbnail": 0.05,
}
SECOND_WORKLOAD_BATCH_SIZES: tuple[tuple[int, float], ...] = (
    *((n, 10.0) for n in range(1, 5)),
    *((n, 4.0) for n in range(5, 17)),
)
#: The workloads ``--workload`` of ``bench/bench_traffic.py`` names:
#: (batch sizes, source shares or None for :data:`SOURCES`' own).
WORKLOADS: dict[str, tuple[Sequence[tuple[int, float]], Mapping[str, float] | None]] = {
    "default": (BATCH_SIZES, None),
    "second": (SECOND_WORKLOAD_BATCH_SIZES, SECOND_WORKLOAD_SHARES),
}


def draw_image(
    rng: random.Random, shares: Mapping[str, float] | None = None
) -> tuple[int, int]:
    """One image's ``(height, width)`` in pixels (``shares``: each source's
    share by name, default the sources' own)."""
    weights = shares or {s.name: s.share for s in SOURCES}
    source = _pick(rng, [(s, weights.get(s.name, 0.0)) for s in SOURCES])
    if source.name == "web image":
        low, high = _pick(rng, [((lo, hi), w) for lo, hi, w in WEB_MEGAPIXELS])
        area = rng.uniform(low, high) * 1e6
        aspect = rng.choice(WEB_ASPECTS)
        width = round(math.sqrt(area * aspect))
        return max(1, round(area / width)), width
    long, short = _pick(rng, [((l, s), w) for l, s, w in source.sizes])
    return (long, short) if rng.random() < source.portrait else (short, long)


def draw_image_batches(
    seed: int,
    batches: int,
    sizes: Sequence[tuple[int, float]] = BATCH_SIZES,
    shares: Mapping[str, float] | None = None,
) -> list[list[tuple[int, int]]]:
    """Seeded batches of ``(height, width)`` pixel sizes."""
    rng = random.Random(seed)
    return [
        [draw_image(rng, shares) for _ in range(_pick(rng, sizes))]
        for _ in range(batches)
    ]


# ---------------------------------------------------------------------------
# Resize rules
# ---------------------------------------------------------------------------


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen-VL's ``smart_resize`` (MiniMax M3's processor without its opt-in
    long-side rule): sides rounded to multiples of ``factor``, then scaled,
    keeping the aspect ratio, into ``[min_pixels, max_pixels]``."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio above 200: {height}x{width}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def merged_grid(
    height: int, width: int, *, patch: int, merge: int, min_pixels: int, max_pixels: int
) -> tuple[int, int, int]:
    """``(t, h, w)`` patch grid of an image (t = 1) for Qwen2-VL / MiniMax M3."""
    h, w = smart_resize(height, width, patch * merge, min_pixels, max_pixels)
    return (1, h // patch, w // patch)


def _span_tokens(n_llm_h: int, n_llm_w: int) -> int:
    return n_llm_h * (n_llm_w + 1) + 2


def _llm_grid(best_h: int, best_w: int, patch: int, ratio: int) -> tuple[int, int]:
    return math.ceil((best_h // patch) / ratio), math.ceil((best_w // patch) / ratio)


def _fit_span(
    height: float, width: float, patch: int, ratio: int, max_n_token: int
) -> tuple[int, int]:
    """DeepSeek-V4.1's ``solve_resize_ratio``: the largest aspect-keeping
    pixel size whose span fits ``max_n_token``."""
    r = height / width
    max_w = math.sqrt((max_n_token - 2) / r + 0.25) - 0.5
    max_h = max_w * r
    cell = patch * ratio
    if max_w < 1.0:
        return (max_n_token - 2) // 2 * cell, cell
    if max_h < 1.0:
        return cell, (max_n_token - 3) * cell
    beta = min(math.floor(max_w) * cell / width, math.floor(max_h) * cell / height)
    return (
        math.floor(height * beta / patch) * patch,
        math.floor(width * beta / patch) * patch,
    )


def deepseek_v41_grid(
    height: int,
    width: int,
    *,
    patch: int,
    ratio: int,
    max_n_token: int,
    min_pixels: int,
    max_wh_ratio: float | None = None,
) -> tuple[int, int]:
    """``(n_vit_h, n_vit_w)`` of an image, as DeepSeek-V4.1's ``load_image``
    computes it."""
    h: float = height
    w: float = width
    if max_wh_ratio is not None and w > h * max_wh_ratio:
        w = h * max_wh_ratio
    if 0 < w * h < min_pixels:
        scale = (min_pixels / (w * h)) ** 0.5
        w, h = int(w * scale), int(h * scale)
    best_w = math.ceil(w / patch) * patch
    best_h = math.ceil(h / patch) * patch
    if _span_tokens(*_llm_grid(best_h, best_w, patch, ratio)) > max_n_token:
        best_h, best_w = _fit_span(h, w, patch, ratio, max_n_token)
    return best_h // patch, best_w // patch


def _tile_grids(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """InternVL's candidate ``(columns, rows)`` grids, fewest tiles first."""
    return sorted(
        (
            (cols, rows)
            for cols in range(1, max_tiles + 1)
            for rows in range(1, max_tiles // cols + 1)
            if cols * rows >= min_tiles
        ),
        key=lambda grid: (grid[0] * grid[1], grid[0]),
    )


def internvl_tiles(
    height: int,
    width: int,
    *,
    image_size: int,
    min_tiles: int,
    max_tiles: int,
    use_thumbnail: bool,
) -> tuple[int]:
    """``(tiles,)`` of an image under InternVL's dynamic tiling.

    The grid whose ``columns / rows`` is closest to ``width / height`` wins;
    on a tie (the same ratio again in a larger grid, or two ratios equally
    far) the later grid wins if the image has more than half its pixels
    (``0.5 · image_size² · tiles``), so large images get more tiles of the
    same shape. A thumbnail tile is added to any grid of more than one."""
    aspect = width / height
    best, best_diff = (1, 1), math.inf
    for cols, rows in _tile_grids(min_tiles, max_tiles):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and width * height > 0.5 * image_size**2 * cols * rows:
            best = (cols, rows)
    tiles = best[0] * best[1]
    return (tiles + 1 if use_thumbnail and tiles != 1 else tiles,)


#: Step3-VL's processor: the long side is scaled down to this (``MAX_IMAGE_SIZE``).
STEP3_MAX_SIDE = 3024
#: Step3-VL's processor: the side of a local crop (``patch_size``).
STEP3_CROP_SIZE = 504
#: Step3-VL's processor: images with a shorter long side get crops only
#: when elongated (a literal in ``determine_window_size``; also the global
#: view's side).
STEP3_SMALL_LONG_SIDE = 728


def _crops_along(side: int, window: int) -> int:
    """Crops of ``window`` px along one side: the side is resized to a
    multiple of the window, rounded down unless more than 0.2 of a window
    is left over (a side shorter than the window is one crop)."""
    if side < window:
        return 1
    whole = side // window
    return whole + 1 if side / window - whole > 0.2 else whole


def step3_vl_crops(
    height: int,
    width: int,
    *,
    crop: int = STEP3_CROP_SIZE,
    max_side: int = STEP3_MAX_SIDE,
) -> int:
    """Local crops (``num_patches``) Step3-VL's ``ImagePatcher`` cuts from an
    image, besides its global view.

    A thin strip (short side under 32 px, aspect above 4) is padded to a
    square first; the long side is then scaled down to ``max_side``. Images
    whose long side is under 728 px get crops of their short side only
    when their aspect exceeds 1.5; larger ones get ``crop``² crops, or crops
    of the short side when the aspect exceeds 4."""
    if min(height, width) < 32 and max(height, width) > 4 * min(height, width):
        height = width = max(height, width)
    if max(height, width) > max_side:
        scale = max_side / max(height, width)
        height, width = int(height * scale), int(width * scale)
    long, short = max(height, width), min(height, width)
    if long < STEP3_SMALL_LONG_SIDE:
        window = short if long / short > 1.5 else 0
    else:
        window = min(short, crop) if long / short > 4 else crop
    if window == 0:
        return 0
    return _crops_along(width, window) * _crops_along(height, window)


def kimi_vl_grid(
    height: int,
    width: int,
    *,
    patch: int,
    kernel: tuple[int, int],
    in_token_limit: int,
    max_patches_per_side: int,
) -> tuple[int, int]:
    """``(h, w)`` patches of an image for Kimi-VL's MoonViT: scaled (aspect
    kept, sides truncated to whole pixels) to at most ``in_token_limit``
    whole patches, then padded up to multiples of ``kernel`` patches."""
    whole = (width // patch) * (height // patch)
    if whole > in_token_limit:
        scale = math.sqrt(in_token_limit / whole)
        height, width = int(height * scale), int(width * scale)
    kh, kw = kernel
    grid = (
        math.ceil(height / (kh * patch)) * kh,
        math.ceil(width / (kw * patch)) * kw,
    )
    if min(grid) < 1 or max(grid) > max_patches_per_side:
        raise ValueError(
            f"Kimi-VL's processor cannot take a {height}x{width} px image "
            f"(grid {grid[0]}x{grid[1]} patches)"
        )
    return grid


def kimi_k25_grid(
    height: int,
    width: int,
    *,
    patch: int,
    kernel: int,
    in_patch_limit: int,
    patch_limit_on_one_side: int,
) -> tuple[int, int, int]:
    """``(1, h, w)`` patches of an image for Kimi-K2.5's MoonViT3d (vLLM's
    ``navit_resize_image``): scaled (aspect kept, sides truncated to whole
    pixels) to at most ``in_patch_limit`` whole patches and
    ``patch_limit_on_one_side`` patches a side, then padded up to multiples
    of the ``kernel`` x ``kernel`` merge."""
    whole = max(1.0, width // patch) * max(1.0, height // patch)
    side = patch_limit_on_one_side * patch
    scale = min(1.0, math.sqrt(in_patch_limit / whole), side / width, side / height)
    new_w = min(max(1, int(width * scale)), side)
    new_h = min(max(1, int(height * scale)), side)
    factor = kernel * patch
    return (1, math.ceil(new_h / factor) * kernel, math.ceil(new_w / factor) * kernel)


def pixtral_image_size(
    height: int, width: int, *, max_image_size: int, patch: int, merge: int
) -> tuple[int, int]:
    """``(H, W)`` pixels of an image after Pixtral's processor
    (mistral_common's ``ImageEncoder``): an image with a side over
    ``max_image_size`` is scaled, keeping its aspect, so that its longest
    side is ``max_image_size`` (sides rounded half to even, at least 1 px);
    then each side is resized up to whole ``patch · merge`` cells."""
    if min(height, width) < 1:
        raise ValueError(f"not an image: {height}x{width} px")
    ratio = max(height / max_image_size, width / max_image_size)
    if ratio > 1:
        height = max(round(height / ratio), 1)
        width = max(round(width / ratio), 1)
    cell = patch * merge
    return ((height - 1) // cell + 1) * cell, ((width - 1) // cell + 1) * cell


def mistral3_image_size(
    height: int, width: int, *, max_image_size: int, patch: int, merge: int
) -> tuple[int, int]:
    """``(H, W)`` pixels of an image after Mistral3's (HF Pixtral)
    processor: scaled down, keeping its aspect, so that its longest side is
    ``max_image_size`` (the processor's ``longest_edge``), sides floored;
    then each side resized up to whole ``patch · merge`` cells. A strip whose
    short side floors to 0 px has no cell (vLLM counts none): refused."""
    ratio = max(height / max_image_size, width / max_image_size)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    if min(height, width) < 1:
        raise ValueError(
            f"Mistral3's processor leaves no pixel of a side: {height}x{width}"
        )
    cell = patch * merge
    return ((height - 1) // cell + 1) * cell, ((width - 1) // cell + 1) * cell


#: vLLM's ``DeepseekV41Config`` default of ``vision_config["min_pixels"]``
#: (544²): smaller images are upscaled to it.
DEEPSEEK_V41_MIN_PIXELS = 295936
#: Qwen2-VL's (and Qwen2.5-VL's) processor minimum (56², HF default) and MiniMax M3's
#: ``smart_resize`` default (4 · 28²): the same 3136 pixels.
MERGED_MIN_PIXELS = 3136


#: Models with a tower but no resize rule here, and why: the benchmarks and
#: the traffic checks leave them out rather than guess a rule.
NO_RESIZE_RULE: dict[str, str] = {
    "minicpmv": (
        "MiniCPM-V's slicing (find_best_resize, get_sliced_grid, the refined "
        "image's grid) is the checkpoint's remote image processor, not in "
        "vLLM 0.33.0's source: no rule could be checked against it"
    ),
}


def model_grid(stem: str, config: Any) -> Callable[[int, int], tuple[int, ...]]:
    """``(height, width) -> grid item`` of the model ``stem`` with its tower
    ``config`` (the reference towers' config classes); ``KeyError`` for a
    model without a rule (:data:`NO_RESIZE_RULE` says why)."""
    if stem in NO_RESIZE_RULE:
        raise KeyError(f"no resize rule for {stem!r}: {NO_RESIZE_RULE[stem]}")
    if stem == "deepseek_v41":
        return lambda h, w: deepseek_v41_grid(
            h,
            w,
            patch=config.vision_patch_size,
            ratio=config.vision_downsample_ratio,
            max_n_token=config.vision_max_n_token,
            min_pixels=DEEPSEEK_V41_MIN_PIXELS,
        )
    if stem in ("minimax_m3", "qwen2_vl", "qwen2_5_vl"):
        max_pixels = config.max_pixels
        return lambda h, w: merged_grid(
            h,
            w,
            patch=config.patch_size,
            merge=config.spatial_merge_size,
            min_pixels=MERGED_MIN_PIXELS,
            max_pixels=max_pixels,
        )
    if stem == "internvl":
        return lambda h, w: internvl_tiles(
            h,
            w,
            image_size=config.image_size,
            min_tiles=config.min_dynamic_patch if config.dynamic_image_size else 1,
            max_tiles=config.max_dynamic_patch if config.dynamic_image_size else 1,
            use_thumbnail=config.use_thumbnail,
        )
    if stem == "step3_vl":
        return _step3_vl_rule(config)
    if stem == "kimi_vl":
        vision = config.vision_config
        return lambda h, w: kimi_vl_grid(
            h,
            w,
            patch=vision.patch_size,
            kernel=tuple(vision.merge_kernel_size),
            in_token_limit=config.in_token_limit,
            max_patches_per_side=config.max_patches_per_side,
        )
    if stem == "kimi_k25":
        vision = config.vision_config
        kh, kw = vision.merge_kernel_size
        assert kh == kw, "navit_resize_image takes one square merge kernel"
        return lambda h, w: kimi_k25_grid(
            h,
            w,
            patch=vision.patch_size,
            kernel=kh,
            in_patch_limit=config.in_patch_limit,
            patch_limit_on_one_side=config.patch_limit_on_one_side,
        )
    if stem == "pixtral":
        vision = config.vision_config
        return lambda h, w: pixtral_image_size(
            h,
            w,
            max_image_size=config.max_image_size,
            patch=vision.patch_size,
            merge=vision.spatial_merge_size,
        )
    if stem == "mistral3":
        vision = config.vision_config
        return lambda h, w: mistral3_image_size(
            h,
            w,
            max_image_size=vision.image_size,
            patch=vision.patch_size,
            merge=config.spatial_merge_size,
        )
    raise KeyError(f"no resize rule for {stem!r}")


def step3_vl_max_side(config: Any) -> int:
    """The long-side cap of the Step3-VL rule for a tower ``config``: the
    largest square of crops within ``max_patches_per_image`` (6 x 6 of 504
    px: vLLM's 3024 for the released tower; 2 x 2 for the tiny one, whose
    items hold at most 6 crops)."""
    return STEP3_CROP_SIZE * math.isqrt(config.max_patches_per_image)


def _step3_vl_rule(config: Any) -> Callable[[int, int], tuple[int]]:
    max_side = step3_vl_max_side(config)
    most = config.max_patches_per_image

    def rule(height: int, width: int) -> tuple[int]:
        crops = step3_vl_crops(height, width, crop=STEP3_CROP_SIZE, max_side=max_side)
        if crops > most:
            raise ValueError(
                f"a {height}x{width} px image makes {crops} Step3-VL crops, "
                f"more than the tower's {most}"
            )
        return (crops,)

    return rule


# ---------------------------------------------------------------------------
# Traffic files (gen-mixin plan --traffic)
# ---------------------------------------------------------------------------


@functools.cache
def spec_grid_dims(path: Path) -> tuple[tuple[str, ...], ...]:
    """The dims of every per-item input (grids, counts) of the spec ``path``."""
    return tuple(tuple(grid.dims) for grid in load_spec(path).item_inputs)


def spec_dims(stem: str, item: tuple[int, ...], config: Any) -> dict[str, int]:
    """A tower item in its spec's grid dims (the traffic file's items): the
    one grid of the spec with as many dims as the item has values, in order
    (DeepSeek-V4.1's second grid, the merged one, is derived)."""
    if stem == "deepseek_v41":
        h, w = item
        r = config.vision_downsample_ratio
        return {"h": h, "w": w, "lh": -(-h // r), "lw": -(-w // r)}
    every = spec_grid_dims(SPECS_DIR / f"{stem}.yaml")
    grids = {dims for dims in every if len(dims) == len(item)}
    if len(grids) != 1:
        raise ValueError(
            f"{stem}: cannot name the values of the item {item} after the spec's "
            f"grid dims {sorted(every)}"
        )
    return dict(zip(grids.pop(), item))


def traffic_document(
    stem: str,
    batches: list[list[tuple[int, ...]]],
    config: Any,
    source: str,
    tuning: dict[str, Any] | None = None,
) -> dict[str, Any]:
    document = {
        "format": "gen-mixin-traffic/1",
        "spec": stem,
        "source": source,
        "batches": [[spec_dims(stem, item, config) for item in b] for b in batches],
    }
    if tuning:
        document["tuning"] = tuning
    return document
