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
  patch, shrink until the span has at most ``max_n_token`` tokens).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BATCH_SIZES",
    "SOURCES",
    "ImageSource",
    "deepseek_v41_grid",
    "draw_image_batches",
    "merged_grid",
    "model_grid",
    "smart_resize",
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


def draw_image(rng: random.Random) -> tuple[int, int]:
    """One image's ``(height, width)`` in pixels."""
    source = _pick(rng, [(s, s.share) for s in SOURCES])
    if source.name == "web image":
        low, high = _pick(rng, [((lo, hi), w) for lo, hi, w in WEB_MEGAPIXELS])
        area = rng.uniform(low, high) * 1e6
        aspect = rng.choice(WEB_ASPECTS)
        width = round(math.sqrt(area * aspect))
        return max(1, round(area / width)), width
    long, short = _pick(rng, [((l, s), w) for l, s, w in source.sizes])
    return (long, short) if rng.random() < source.portrait else (short, long)


def draw_image_batches(
    seed: int, batches: int, sizes: Sequence[tuple[int, float]] = BATCH_SIZES
) -> list[list[tuple[int, int]]]:
    """Seeded batches of ``(height, width)`` pixel sizes."""
    rng = random.Random(seed)
    return [[draw_image(rng) for _ in range(_pick(rng, sizes))] for _ in range(batches)]


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


#: vLLM's ``DeepseekV41Config`` default of ``vision_config["min_pixels"]``
#: (544²): smaller images are upscaled to it.
DEEPSEEK_V41_MIN_PIXELS = 295936
#: The reference towers whose processors' resize rules are not written here
#: yet: they take no part in the real-traffic benchmark.
NO_RESIZE_RULE = frozenset({"kimi_vl", "internvl", "step3_vl"})
#: Qwen2-VL's (and Qwen2.5-VL's) processor minimum (56², HF default) and MiniMax M3's
#: ``smart_resize`` default (4 · 28²): the same 3136 pixels.
MERGED_MIN_PIXELS = 3136


def model_grid(stem: str, config: Any) -> Callable[[int, int], tuple[int, ...]]:
    """``(height, width) -> grid item`` of the model ``stem`` with its tower
    ``config`` (the reference towers' config classes)."""
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
    raise KeyError(f"no resize rule for {stem!r}")
