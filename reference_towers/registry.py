"""How a test suite finds the reference tower of a spec.

``REFERENCE_TOWERS`` maps a spec name (the stem of ``specs/<name>.yaml``) to a
:class:`ReferenceTower`, which knows how to build the host model with a
generated mixin mixed in, which items are legal, what the model's
``mm_kwargs`` look like, and what the right answer is. A GPU suite needs
nothing else::

    tower = REFERENCE_TOWERS["deepseek_v41"]
    host = tower.build_host(GeneratedMixin, "full", device="cuda",
                            dtype=torch.bfloat16)
    rng = random.Random(0)
    items = [tower.sample_item(rng, "full", max_output_tokens=512)
             for _ in range(4)]
    mm_kwargs = tower.make_mm_kwargs(host, items, "cuda", seed=1)
    expected = tower.reference_outputs(host, mm_kwargs)   # one tensor per item
    specs = host.get_encoder_cudagraph_item_specs(mm_kwargs)
    assert [s.output_tokens for s in specs] == [tower.output_tokens(i)
                                                for i in items]

Interface of a :class:`ReferenceTower`:

``name``, ``modality``, ``modalities``, ``host_cls``, ``sizes``
    Spec name, default item modality (``"image"``), every modality the tower
    takes (``("image",)``, or ``("image", "video")`` for InternVL, Qwen2-VL
    and Qwen2.5-VL), host class, the available sizes (``"tiny"``: CPU tests
    in fp32; ``"full"``: the released dimensions, for the GPU in bf16).
``config(size)``
    The tower configuration of a size.
``host_class(mixin_cls)``
    ``type(name, (host_cls, mixin_cls), {})``: the host first, as a real
    model's own body comes before its mixins; cached per mixin class.
``build_host(mixin_cls, size, *, device, dtype, attn_backend=FLASH_ATTN,
multimodal_config=None, seed=0)``
    An instance of ``host_class(mixin_cls)`` with seeded weights (drawn on the
    CPU in fp32, so a seed gives the same model on every device), the tower
    cast to ``dtype`` as the real host does, moved to ``device``, in eval
    mode and without gradients.
``Item``
    A tuple of ints: a grid ``(n_vit_h, n_vit_w)`` for DeepSeek-V4.1,
    ``(h, w)`` patches for Kimi-VL, ``(t, h, w)`` for MiniMax M3, Qwen2-VL
    and Qwen2.5-VL; a count for the models that batch fixed-size views:
    ``(tiles,)`` for InternVL (frames for videos), ``(num_patches,)`` (local
    crops besides the global view) for Step3-VL; for MiniCPM-V a tuple of
    ``(h, w)`` slices (the thumbnail, then the grid's slices).
``input_size(item)``, ``output_tokens(item)``
    What the mixin's ``EncoderItemSpec`` must say for the item.
``is_legal(item, size, *, modality="image")``, ``max_output_tokens(size, *,
modality="image")``, ``smallest_item(size, *, modality="image")``
    Legality is the tower's input contract (what the model's processor can
    emit and the tower must accept), capped by the per-item token limit of
    the size. The processors' *upscaling* of small images is ignored, so that
    the smallest grids stay reachable.
``legal_grid(rng, size, *, output_tokens=None, max_output_tokens=None,
modality="image")``
    A random legal item; with ``output_tokens`` exactly that many output
    tokens (``ValueError`` when no legal item has them), to hit budget
    boundaries exactly.
``sample_item(rng, size, *, max_output_tokens=None, modality="image")``
    A random legal item of at most ``max_output_tokens`` output tokens (the
    size's cap when ``None``), uniform over output-token counts first.
``paths``, ``path_tokens(item)``
    The encoder paths of the model's graph config, in order (``("default",)``
    unless the model runs several, as Step3-VL's ``("global", "local")``),
    and the graph rows the item puts on each: what
    ``EncoderItemSpec.get_path_output_tokens(path)`` must say for every path
    (for one path, the budget tokens below). Budgets and packing are per
    path; ``output_tokens`` stays the item's total in the final layout.
``budget_tokens(item)``, ``max_budget_tokens(size, *, modality="image")``,
``budget_item(rng, size, *, budget_tokens=None, max_budget_tokens=None,
modality="image")``
    The unit the spec's budgets count (output tokens unless the spec says
    otherwise: DeepSeek-V4.1 counts ViT patches), its per-item cap, and a
    random legal item by it. Multi-path towers count output tokens here;
    per-path figures come from ``path_tokens``.
``make_mm_kwargs(host, items, device, *, seed=0, modality="image")``
    The ``mm_kwargs`` vLLM would feed the model for these items (random
    pixels from ``seed``, laid out and typed as the model's processor does).
    One call makes one modality's ``mm_kwargs``, as vLLM batches them.
``reference_outputs(host, mm_kwargs)``
    The host's own eager result, one tensor per item in the final layout the
    mixin must produce (after ``postprocess_encoder_output``).

Every ``modality`` keyword defaults to ``"image"``, so callers may pass it to
any tower; a modality outside ``modalities`` raises ``ValueError``.

``rng`` is a :class:`random.Random`; everything is deterministic given it.

A host class (``host_cls``) takes ``(config, *, multimodal_config,
attn_backend)`` and provides ``reference_init_weights(seed)``,
``reference_cast_tower(dtype)`` and ``eager_reference_outputs(mm_kwargs)``;
the prefixes keep these out of the way of any mixin method.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import inspect
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, Literal, TypeVar

import torch
from torch import nn

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from reference_towers.deepseek_v4 import (
    DeepseekV41Config,
    DeepseekV41VisionHost,
    build_image_span_types,
    image_span_length,
    llm_grid,
)
from reference_towers.internvl import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    InternVLConfig,
    InternVLVisionHost,
    image_tile_counts,
)
from reference_towers.kimi_k25 import KimiK25Config, KimiK25VisionHost
from reference_towers.kimi_vl import KimiVLConfig, KimiVLVisionHost
from reference_towers.minicpmv import MiniCPMVConfig, MiniCPMVVisionHost, slice_pixels
from reference_towers.minimax_vl import MiniMaxM3VisionConfig, MiniMaxM3VisionHost
from reference_towers.mistral3 import Mistral3Config, Mistral3VisionHost
from reference_towers.pixtral import PixtralConfig, PixtralVisionHost
from reference_towers.qwen2_5_vl import Qwen2_5_VLVisionConfig, Qwen2_5_VLVisionHost
from reference_towers.qwen2_vl import Qwen2VisionConfig, Qwen2VLVisionHost
from reference_towers.step3_vl import (
    CLIP_MEAN,
    CLIP_STD,
    CROP_SIZE,
    Step3VLConfig,
    Step3VLVisionHost,
)

__all__ = [
    "REFERENCE_TOWERS",
    "DeepseekV41Reference",
    "InternVLReference",
    "Item",
    "KimiK25Reference",
    "KimiVLReference",
    "MiniCPMVReference",
    "MiniMaxM3Reference",
    "Mistral3Reference",
    "PixtralReference",
    "Qwen2VLReference",
    "Qwen2_5_VLReference",
    "ReferenceTower",
    "Size",
    "Step3VLReference",
]

Size = Literal["tiny", "full"]
Item = tuple[int, ...]
HostT = TypeVar("HostT", bound=nn.Module)


def _divisor_pairs(n: int) -> list[tuple[int, int]]:
    """``(a, b)`` with ``a·b == n``, ``a <= b`` first then swapped."""
    pairs = [(a, n // a) for a in range(1, int(n**0.5) + 1) if n % a == 0]
    return pairs + [(b, a) for a, b in pairs if a != b]


class ReferenceTower(abc.ABC, Generic[HostT]):
    """A spec's reference tower; see the module docstring for the interface."""

    name: ClassVar[str]
    modality: ClassVar[str] = "image"
    """The default modality (what the ``modality`` keywords default to)."""
    modalities: ClassVar[tuple[str, ...]] = ("image",)
    """Every modality the tower takes."""
    host_cls: ClassVar[type[nn.Module]]
    sizes: ClassVar[tuple[Size, ...]] = ("tiny", "full")
    paths: ClassVar[tuple[str, ...]] = ("default",)
    """The encoder paths of the model's graph config, in order."""

    def __init__(self) -> None:
        self._host_classes: dict[type, type[HostT]] = {}

    # -- configuration and host ------------------------------------------

    @abc.abstractmethod
    def config(self, size: Size) -> Any:
        """The tower configuration of ``size``."""

    def host_class(self, mixin_cls: type) -> type[HostT]:
        """The host model class with ``mixin_cls`` mixed in.

        The host comes first in the bases, as a real model class's own body
        comes before its mixins: a method the host defines (Qwen2-VL's
        ``get_max_frames_per_video``) must win over the protocol's default
        stub that a mixin subclassing ``SupportsEncoderCudaGraph`` inherits.
        Cached per mixin, so that hosts built from one mixin share a class
        (and whatever class-level state the mixin keeps).
        """
        cls = self._host_classes.get(mixin_cls)
        if cls is None:
            name = f"{mixin_cls.__name__}On{self.host_cls.__name__}"
            cls = type(name, (self.host_cls, mixin_cls), {"__module__": __name__})
            self._host_classes[mixin_cls] = cls
        return cls

    def build_host(
        self,
        mixin_cls: type,
        size: Size,
        *,
        device: torch.device | str,
        dtype: torch.dtype,
        attn_backend: AttentionBackendEnum = AttentionBackendEnum.FLASH_ATTN,
        multimodal_config: MultiModalConfig | None = None,
        seed: int = 0,
    ) -> HostT:
        """A ready host with ``mixin_cls`` mixed in (see the module docstring).

        The model is laid out on the meta device (skipping PyTorch's default
        initialisation, which would be thrown away), materialised on the CPU
        in fp32, initialised from ``seed``, cast, then moved, so its values
        do not depend on ``device``.
        """
        with torch.device("meta"):
            host = self.host_class(mixin_cls)(
                self.config(size),
                multimodal_config=multimodal_config,
                attn_backend=attn_backend,
            )
        host.to_empty(device="cpu")
        host.reference_init_weights(seed)
        host.reference_cast_tower(dtype)
        host.to(device)
        host.eval()
        host.requires_grad_(False)
        return host

    # -- items -------------------------------------------------------------

    def check_modality(self, modality: str) -> None:
        """``ValueError`` unless the tower takes ``modality``."""
        if modality not in self.modalities:
            raise ValueError(
                f"{self.name} takes no {modality!r} items (modalities: "
                f"{', '.join(self.modalities)})"
            )

    @abc.abstractmethod
    def input_size(self, item: Item) -> int:
        """Encoder input rows of ``item`` (``EncoderItemSpec.input_size``)."""

    @abc.abstractmethod
    def output_tokens(self, item: Item) -> int:
        """Output rows of ``item`` (``EncoderItemSpec.output_tokens``)."""

    @abc.abstractmethod
    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        """The per-item output-token cap of ``size``."""

    @abc.abstractmethod
    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        """Whether the model can be given ``item`` at ``size`` as ``modality``."""

    @abc.abstractmethod
    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        """The legal item with the fewest input rows."""

    @abc.abstractmethod
    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        """A random legal item with exactly ``output_tokens``, or ``None``."""

    # -- budget units ----------------------------------------------------------
    # What the spec's budgets count (``EncoderItemSpec.path_output_tokens``
    # of the default path): output tokens unless the spec sets
    # ``items.budget_tokens``. Test drivers aim batches at budgets in them.

    def budget_tokens(self, item: Item) -> int:
        """The budget tokens of ``item``."""
        return self.output_tokens(item)

    def path_tokens(self, item: Item) -> dict[str, int]:
        """Graph rows of ``item`` per path (what the mixin's
        ``EncoderItemSpec.get_path_output_tokens`` reports)."""
        return {"default": self.budget_tokens(item)}

    def max_budget_tokens(self, size: Size, *, modality: str = "image") -> int:
        """The largest budget-token count of a legal item."""
        return self.max_output_tokens(size, modality=modality)

    def _items_with_budget_tokens(
        self,
        rng: random.Random,
        size: Size,
        budget_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        """A random legal item with exactly ``budget_tokens``, or ``None``."""
        return self._items_with_output_tokens(
            rng, size, budget_tokens, modality=modality
        )

    def budget_item(
        self,
        rng: random.Random,
        size: Size,
        *,
        budget_tokens: int | None = None,
        max_budget_tokens: int | None = None,
        modality: str = "image",
    ) -> Item:
        """A random legal item: exactly ``budget_tokens`` budget tokens when
        given, else at most ``max_budget_tokens``."""
        return self._draw(
            rng,
            size,
            "budget",
            self.budget_tokens,
            self.max_budget_tokens,
            self._items_with_budget_tokens,
            exact=budget_tokens,
            cap=max_budget_tokens,
            modality=modality,
        )

    def legal_grid(
        self,
        rng: random.Random,
        size: Size,
        *,
        output_tokens: int | None = None,
        max_output_tokens: int | None = None,
        modality: str = "image",
    ) -> Item:
        """A random legal item (exactly ``output_tokens`` when given)."""
        if (
            output_tokens is not None
            and max_output_tokens is not None
            and output_tokens > max_output_tokens
        ):
            raise ValueError("output_tokens exceeds max_output_tokens")
        return self._draw(
            rng,
            size,
            "output",
            self.output_tokens,
            self.max_output_tokens,
            self._items_with_output_tokens,
            exact=output_tokens,
            cap=max_output_tokens,
            modality=modality,
        )

    def sample_item(
        self,
        rng: random.Random,
        size: Size,
        *,
        max_output_tokens: int | None = None,
        modality: str = "image",
    ) -> Item:
        """A random legal item of at most ``max_output_tokens`` output tokens."""
        return self.legal_grid(
            rng, size, max_output_tokens=max_output_tokens, modality=modality
        )

    def _draw(
        self,
        rng: random.Random,
        size: Size,
        unit: str,
        count: Callable[[Item], int],
        largest: Callable[..., int],
        items_with: Callable[..., Item | None],
        *,
        exact: int | None,
        cap: int | None,
        modality: str,
    ) -> Item:
        """A random legal item with exactly ``exact`` tokens of ``unit``
        (counted by ``count``), else with at most ``cap``."""
        self.check_modality(modality)
        if exact is not None:
            item = items_with(rng, size, exact, modality=modality)
            if item is None:
                raise ValueError(
                    f"no legal {self.name} {modality} item has {exact} {unit} "
                    f"tokens at size {size!r}"
                )
            return item
        top = largest(size, modality=modality)
        if cap is not None:
            top = min(top, cap)
        low = count(self.smallest_item(size, modality=modality))
        if top < low:
            raise ValueError(
                f"no legal {self.name} {modality} item has at most {top} {unit} "
                f"tokens (the smallest has {low})"
            )
        listed = self._listed_token_counts(size, modality=modality)
        if listed is not None:
            # Few counts are reachable (multiples of a view's tokens): pick
            # one of them rather than retrying random counts.
            choices = [tokens for tokens in listed if low <= tokens <= top]
            return items_with(rng, size, rng.choice(choices), modality=modality)
        # Not every count is reachable (DeepSeek spans skip some, Qwen2-VL's
        # aspect-ratio bound others); retry.
        for _ in range(1000):
            item = items_with(rng, size, rng.randint(low, top), modality=modality)
            if item is not None:
                return item
        raise RuntimeError(f"could not draw a {self.name} item under {top} tokens")

    def _listed_token_counts(
        self, size: Size, *, modality: str = "image"
    ) -> list[int] | None:
        """Every token count a legal item has, in both units (towers whose
        budget tokens are their output tokens), when there are few; ``None``
        (the default) when most counts are reachable."""
        return None

    # -- inputs and ground truth -------------------------------------------

    @abc.abstractmethod
    def make_mm_kwargs(
        self,
        host: HostT,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """The model's ``mm_kwargs`` for ``items``, as vLLM would pass them."""

    def reference_outputs(
        self, host: HostT, mm_kwargs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """The host's eager ground truth, one tensor per item."""
        return host.eager_reference_outputs(mm_kwargs)

    def _config_constant(self, field: str) -> int:
        """A config value every size shares (item arithmetic depends on it)."""
        values = {getattr(self.config(s), field) for s in self.sizes}
        if len(values) != 1:
            raise RuntimeError(f"sizes disagree on {field}: {sorted(values)}")
        return values.pop()


class DeepseekV41Reference(ReferenceTower[DeepseekV41VisionHost]):
    """DeepSeek-V4.1: items are ViT grids ``(n_vit_h, n_vit_w)``.

    Legal: ``h, w >= 1`` and a span of at most ``vision_max_n_token`` tokens
    (the processor shrinks larger images). Output tokens are the whole span
    ``lh·(lw+1)+2``; input rows ``h·w``.
    """

    name = "deepseek_v41"
    host_cls = DeepseekV41VisionHost

    def config(self, size: Size) -> DeepseekV41Config:
        return DeepseekV41Config.for_size(size)

    @property
    def downsample_ratio(self) -> int:
        return self._config_constant("vision_downsample_ratio")

    def input_size(self, item: Item) -> int:
        h, w = item
        return h * w

    def output_tokens(self, item: Item) -> int:
        return image_span_length(*llm_grid(*item, self.downsample_ratio))

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        self.check_modality(modality)
        return self.config(size).vision_max_n_token

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        self.check_modality(modality)
        return (
            len(item) == 2
            and min(item) >= 1
            and self.output_tokens(item) <= self.max_output_tokens(size)
        )

    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        self.check_modality(modality)
        return (1, 1)

    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        self.check_modality(modality)
        if not 4 <= output_tokens <= self.max_output_tokens(size):
            return None
        # lh·(lw + 1) = tokens − 2 with lw >= 1.
        shapes = [
            (lh, rows - 1)
            for lh, rows in _divisor_pairs(output_tokens - 2)
            if rows >= 2
        ]
        if not shapes:
            return None
        lh, lw = rng.choice(shapes)
        r = self.downsample_ratio
        # Any ViT side in ((l−1)·r, l·r] merges to l aligner cells.
        return (
            rng.randint((lh - 1) * r + 1, lh * r),
            rng.randint((lw - 1) * r + 1, lw * r),
        )

    # Budgets count ViT patches (the spec's items.budget_tokens: h * w).

    def budget_tokens(self, item: Item) -> int:
        return self.input_size(item)

    def max_budget_tokens(self, size: Size, *, modality: str = "image") -> int:
        self.check_modality(modality)
        r = self.downsample_ratio
        cap = self.max_output_tokens(size)
        # The largest grid of an lh x lw span is (r·lh) x (r·lw) patches; for
        # each lh the widest span that fits has lw = (cap - 2) // lh - 1.
        return max(
            (r * lh) * (r * ((cap - 2) // lh - 1))
            for lh in range(1, cap)
            if (cap - 2) // lh - 1 >= 1
        )

    def _items_with_budget_tokens(
        self,
        rng: random.Random,
        size: Size,
        budget_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        self.check_modality(modality)
        if budget_tokens < 1:
            return None
        shapes = [
            pair for pair in _divisor_pairs(budget_tokens) if self.is_legal(pair, size)
        ]
        return rng.choice(shapes) if shapes else None

    def make_mm_kwargs(
        self,
        host: DeepseekV41VisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """``patches`` (Σ h·w, 3, p, p) bf16 on ``device``; ``vit_grid``,
        ``llm_grid`` (n, 2) int64 and ``types`` (Σ span,) int64 on the CPU
        (vLLM keeps them there). Pixels are uniform in [−1, 1], as the
        processor scales them, and cut into patches in row-major order."""
        self.check_modality(modality)
        config = host.config
        p, r = config.vision_patch_size, config.vision_downsample_ratio
        generator = torch.Generator().manual_seed(seed)
        patches, llm, types = [], [], []
        for h, w in items:
            image = torch.rand((3, h * p, w * p), generator=generator) * 2 - 1
            patches.append(
                image.reshape(3, h, p, w, p)
                .permute(1, 3, 0, 2, 4)
                .reshape(h * w, 3, p, p)
            )
            lh, lw = llm_grid(h, w, r)
            llm.append((lh, lw))
            types.append(build_image_span_types(lh, lw))
        if items:
            all_patches = torch.cat(patches)
            all_types = torch.cat(types)
        else:
            all_patches = torch.zeros((0, 3, p, p))
            all_types = torch.zeros((0,), dtype=torch.int64)
        return {
            "patches": all_patches.to(torch.bfloat16).to(device),
            "vit_grid": torch.tensor(list(items), dtype=torch.int64).reshape(-1, 2),
            "llm_grid": torch.tensor(llm, dtype=torch.int64).reshape(-1, 2),
            "types": all_types,
        }


class _MergedGridReference(ReferenceTower[HostT]):
    """Towers whose items are ``(t, h, w)`` patch grids merged m×m into
    output tokens (MiniMax M3, Qwen2-VL): CLIP-normalised pixels cut into
    rows in the processor's order."""

    # CLIP normalisation of the image processors.
    _MEAN = (0.48145466, 0.4578275, 0.40821073)
    _STD = (0.26862954, 0.26130258, 0.27577711)

    @property
    def spatial_merge_size(self) -> int:
        return self._config_constant("spatial_merge_size")

    def input_size(self, item: Item) -> int:
        t, h, w = item
        return t * h * w

    def _clip_stats(self, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean, std)`` shaped ``(C, 1, 1)``."""
        if channels != len(self._MEAN):
            raise ValueError("the CLIP normalisation assumes 3 channels")
        mean = torch.tensor(self._MEAN)[:, None, None]
        std = torch.tensor(self._STD)[:, None, None]
        return mean, std

    @staticmethod
    def _processor_rows(
        video: torch.Tensor, t: int, h: int, w: int, p: int, m: int
    ) -> torch.Tensor:
        """``(t·T, C, h·p, w·p)`` frames → ``(t·h·w, C·T·p²)`` rows, in the
        processor's (t, block-row, block-col, mh, mw) order with features
        (C, T, p, p)."""
        frames, c = video.shape[0], video.shape[1]
        tp = frames // t
        blocks = video.reshape(t, tp, c, h // m, m, p, w // m, m, p)
        # -> (t, block-row, block-col, mh, mw, C, T, p, p)
        blocks = blocks.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return blocks.reshape(t * h * w, c * tp * p * p)


class MiniMaxM3Reference(_MergedGridReference[MiniMaxM3VisionHost]):
    """MiniMax M3: items are image grids ``(1, h, w)``.

    Legal: ``t == 1`` (videos stay on the eager path), ``h`` and ``w``
    positive multiples of m, at most ``max_pixels / p²`` patches. Output
    tokens ``t·h·w / m²``; input rows ``t·h·w``.
    """

    name = "minimax_m3"
    host_cls = MiniMaxM3VisionHost

    def config(self, size: Size) -> MiniMaxM3VisionConfig:
        return MiniMaxM3VisionConfig.for_size(size)

    def output_tokens(self, item: Item) -> int:
        return self.input_size(item) // self.spatial_merge_size**2

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        self.check_modality(modality)
        return self.config(size).max_patches_per_image // self.spatial_merge_size**2

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        self.check_modality(modality)
        m = self.spatial_merge_size
        if len(item) != 3:
            return False
        t, h, w = item
        return (
            t == 1
            and h >= m
            and w >= m
            and h % m == 0
            and w % m == 0
            and h * w <= self.config(size).max_patches_per_image
        )

    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        self.check_modality(modality)
        m = self.spatial_merge_size
        return (1, m, m)

    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        self.check_modality(modality)
        if not 1 <= output_tokens <= self.max_output_tokens(size):
            return None
        m = self.spatial_merge_size
        bh, bw = rng.choice(_divisor_pairs(output_tokens))
        return (1, bh * m, bw * m)

    def make_mm_kwargs(
        self,
        host: MiniMaxM3VisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """``pixel_values`` (Σ t·h·w, C·T·p²) in the tower dtype on
        ``device`` and ``image_grid_thw`` (n, 3) int64 on the CPU, as vLLM
        hands them to the model: its processing context casts the
        processor's fp32 output to the model dtype, and the grid is
        ``keep_on_cpu`` (a device grid would cost the mixin a
        synchronisation each time it reads it). Each image is random
        CLIP-normalised pixels repeated to T frames, cut into rows in the
        processor's (block-row, block-col, mh, mw) order with features
        (C, T, p, p)."""
        self.check_modality(modality)
        config = host.config
        p, m = config.patch_size, config.spatial_merge_size
        c, tp = config.num_channels, config.temporal_patch_size
        mean, std = self._clip_stats(c)
        generator = torch.Generator().manual_seed(seed)
        rows = []
        for t, h, w in items:
            frames = []
            for _ in range(t):
                image = (
                    torch.rand((c, h * p, w * p), generator=generator) - mean
                ) / std
                # An image is repeated to fill the temporal patch.
                frames.extend([image] * tp)
            video = torch.stack(frames)  # (t·T, C, H, W)
            rows.append(self._processor_rows(video, t, h, w, p, m))
        pixel_values = torch.cat(rows) if rows else torch.zeros((0, config.patch_dim))
        return {
            "pixel_values": pixel_values.to(
                device=device, dtype=host.vision_tower.dtype
            ),
            "image_grid_thw": torch.tensor(list(items), dtype=torch.int64).reshape(
                -1, 3
            ),
        }


class Qwen2VLReference(_MergedGridReference[Qwen2VLVisionHost]):
    """Qwen2-VL: items are grids ``(t, h, w)``, images or videos.

    Legal: ``h`` and ``w`` positive multiples of m with an aspect ratio of at
    most 200 (the processor's ``smart_resize`` rejects more) and at most
    ``max_pixels / p²`` patches per frame; ``t == 1`` for images,
    ``1 <= t <= max_frames_per_video`` temporal patches for videos; at most
    ``max_output_tokens`` tokens per item. Output tokens ``t·(h/m)·(w/m)``;
    input rows ``t·h·w``.
    """

    name = "qwen2_vl"
    modalities = ("image", "video")
    host_cls = Qwen2VLVisionHost

    # smart_resize raises for a longer/shorter side ratio above this.
    MAX_ASPECT_RATIO = 200

    def config(self, size: Size) -> Qwen2VisionConfig:
        return Qwen2VisionConfig.for_size(size)

    def max_frames(self, size: Size, *, modality: str = "image") -> int:
        """The largest ``t`` of a legal item: 1 for images."""
        self.check_modality(modality)
        if modality == "image":
            return 1
        return self.config(size).max_frames_per_video

    def output_tokens(self, item: Item) -> int:
        t, h, w = item
        m = self.spatial_merge_size
        return t * (h // m) * (w // m)

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        """One frame at the pixel bound, for images and (whole) videos."""
        self.check_modality(modality)
        return self.config(size).max_patches_per_frame // self.spatial_merge_size**2

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        self.check_modality(modality)
        m = self.spatial_merge_size
        if len(item) != 3 or not all(isinstance(v, int) for v in item):
            return False
        t, h, w = item
        return (
            1 <= t <= self.max_frames(size, modality=modality)
            and h >= m
            and w >= m
            and h % m == 0
            and w % m == 0
            and max(h, w) <= self.MAX_ASPECT_RATIO * min(h, w)
            and h * w <= self.config(size).max_patches_per_frame
            and self.output_tokens(item) <= self.max_output_tokens(size)
        )

    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        self.check_modality(modality)
        m = self.spatial_merge_size
        return (1, m, m)

    def _frame_shapes(self, blocks: int) -> list[tuple[int, int]]:
        """m×m-block shapes ``(bh, bw)`` of ``blocks`` blocks within the
        aspect-ratio bound."""
        return [
            (bh, bw)
            for bh, bw in _divisor_pairs(blocks)
            if max(bh, bw) <= self.MAX_ASPECT_RATIO * min(bh, bw)
        ]

    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        self.check_modality(modality)
        if not 1 <= output_tokens <= self.max_output_tokens(size):
            return None
        # Frame counts first (uniformly), then a frame shape.
        choices = []
        for t in range(1, self.max_frames(size, modality=modality) + 1):
            if output_tokens % t == 0:
                shapes = self._frame_shapes(output_tokens // t)
                if shapes:
                    choices.append((t, shapes))
        if not choices:
            return None
        t, shapes = rng.choice(choices)
        bh, bw = rng.choice(shapes)
        m = self.spatial_merge_size
        return (t, bh * m, bw * m)

    def make_mm_kwargs(
        self,
        host: Qwen2VLVisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """Images: ``pixel_values`` (Σ t·h·w, C·T·p²) in the tower dtype on
        ``device`` and ``image_grid_thw`` (n, 3) int64 on the CPU; videos:
        ``pixel_values_videos`` and ``video_grid_thw`` alike. As vLLM hands
        them to the model: its processing context casts the processor's fp32
        output to the model dtype, and the grids are ``keep_on_cpu``.

        Pixels are random and CLIP-normalised. An image is one frame repeated
        to the T frames of its temporal patch; a video item of ``t`` temporal
        patches has ``t·T`` distinct frames. Rows are cut in the processor's
        (t, block-row, block-col, mh, mw) order with features (C, T, p, p).
        """
        self.check_modality(modality)
        visual = host.visual
        embed = visual.patch_embed
        c = embed.proj.in_channels
        p, tp = embed.patch_size, embed.temporal_patch_size
        m = visual.spatial_merge_size
        mean, std = self._clip_stats(c)
        generator = torch.Generator().manual_seed(seed)
        rows = []
        for item in items:
            t, h, w = item
            if modality == "image" and t != 1:
                raise ValueError(f"an image has t == 1, got {item}")
            if min(item) < 1 or h % m or w % m:
                raise ValueError(f"{item} is not a grid of {m}×{m} blocks")
            # Images: one frame repeated T times; videos: t·T distinct frames.
            distinct = 1 if modality == "image" else t * tp
            frames = (
                torch.rand((distinct, c, h * p, w * p), generator=generator) - mean
            ) / std
            video = frames.expand(t * tp, -1, -1, -1)  # (t·T, C, H, W)
            rows.append(self._processor_rows(video, t, h, w, p, m))
        if rows:
            pixel_values = torch.cat(rows)
        else:
            pixel_values = torch.zeros((0, c * tp * p * p))
        grid = torch.tensor(list(items), dtype=torch.int64).reshape(-1, 3)
        pixel_key, grid_key = (
            ("pixel_values", "image_grid_thw")
            if modality == "image"
            else ("pixel_values_videos", "video_grid_thw")
        )
        return {
            pixel_key: pixel_values.to(device=device, dtype=visual.dtype),
            grid_key: grid,
        }


class Qwen2_5_VLReference(Qwen2VLReference):
    """Qwen2.5-VL: Qwen2-VL's items, legality and pixel rows (the same
    processor), with the inputs typed as vLLM hands them to the model.

    vLLM's processing context casts floating-point processor outputs to the
    model dtype and keeps the grids on the CPU (``keep_on_cpu``); videos also
    carry ``second_per_grid_ts`` (one ``T / fps`` per video, 1.0 at the
    default 2 fps), which the encoder never reads.
    """

    name = "qwen2_5_vl"
    host_cls = Qwen2_5_VLVisionHost

    # The video processor's default sampling rate.
    VIDEO_FPS = 2.0

    def config(self, size: Size) -> Qwen2_5_VLVisionConfig:
        return Qwen2_5_VLVisionConfig.for_size(size)

    def make_mm_kwargs(
        self,
        host: Qwen2_5_VLVisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """Images: ``pixel_values`` (Σ t·h·w, C·T·p²) in the tower dtype on
        ``device``, ``image_grid_thw`` (n, 3) int64 on the CPU; videos:
        ``pixel_values_videos`` and ``video_grid_thw`` alike plus
        ``second_per_grid_ts`` (n,) on the CPU. Pixels as
        :meth:`Qwen2VLReference.make_mm_kwargs` draws them."""
        kwargs = super().make_mm_kwargs(
            host, items, device, seed=seed, modality=modality
        )
        dtype = host.visual.dtype
        out: dict[str, Any] = {}
        for key, value in kwargs.items():
            if value.is_floating_point():
                out[key] = value.to(device=device, dtype=dtype)
            else:
                out[key] = value.cpu()
        if modality == "video":
            step = host.visual.patch_embed.temporal_patch_size / self.VIDEO_FPS
            out["second_per_grid_ts"] = torch.full((len(items),), step, dtype=dtype)
        return out


class _MoonViTReference(ReferenceTower[HostT]):
    """The towers on MoonViT (Kimi-VL, Kimi-K2.5): patches merged ``kh x kw``
    into tokens, the one kernel every size of the tower has; an image is
    one ``h x w`` patch grid, whose item form and limits each tower gives
    (:meth:`_item_of`, :meth:`_legal_frame`)."""

    @property
    def merge_kernel_size(self) -> tuple[int, int]:
        kernels = {
            tuple(self.config(s).vision_config.merge_kernel_size) for s in self.sizes
        }
        if len(kernels) != 1:
            raise RuntimeError(f"sizes disagree on merge_kernel_size: {kernels}")
        return kernels.pop()

    @abc.abstractmethod
    def _item_of(self, h: int, w: int) -> Item:
        """The item of one image of ``h x w`` patches."""

    @abc.abstractmethod
    def _legal_frame(self, h: int, w: int, size: Size) -> bool:
        """Whether the processor can emit an image of ``h x w`` patches."""

    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        self.check_modality(modality)
        return self._item_of(*self.merge_kernel_size)

    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        self.check_modality(modality)
        if output_tokens < 1:
            return None
        kh, kw = self.merge_kernel_size
        shapes = [
            self._item_of(bh * kh, bw * kw)
            for bh, bw in _divisor_pairs(output_tokens)
            if self._legal_frame(bh * kh, bw * kw, size)
        ]
        return rng.choice(shapes) if shapes else None


class KimiVLReference(_MoonViTReference[KimiVLVisionHost]):
    """Kimi-VL: items are patch grids ``(h, w)`` of images.

    Legal: ``h`` and ``w`` positive multiples of the merge kernel ``(kh,
    kw)`` (the processor pads images to them), at most 510 a side (its code
    refuses 512 patches or more; the RoPE grid holds 512), and ``(h - kh)·(w
    - kw) <= in_token_limit``: the grids the processor emits for images it
    does not downscale (the smallest image padding to ``h×w`` has ``h - kh``
    whole patches a side). Output tokens ``(h / kh)·(w / kw)``; input rows
    ``h·w`` patches.
    """

    name = "kimi_vl"
    host_cls = KimiVLVisionHost

    def config(self, size: Size) -> KimiVLConfig:
        return KimiVLConfig.for_size(size)

    def _max_side(self, size: Size, kernel: int) -> int:
        """The largest legal side: a multiple of ``kernel``."""
        return self.config(size).max_patches_per_side // kernel * kernel

    def input_size(self, item: Item) -> int:
        h, w = item
        return h * w

    def output_tokens(self, item: Item) -> int:
        h, w = item
        kh, kw = self.merge_kernel_size
        return (h // kh) * (w // kw)

    def _item_of(self, h: int, w: int) -> Item:
        return (h, w)

    def _legal_frame(self, h: int, w: int, size: Size) -> bool:
        kh, kw = self.merge_kernel_size
        return (
            kh <= h <= self._max_side(size, kh)
            and kw <= w <= self._max_side(size, kw)
            and h % kh == 0
            and w % kw == 0
            and (h - kh) * (w - kw) <= self.config(size).in_token_limit
        )

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        self.check_modality(modality)
        if len(item) != 2 or not all(isinstance(v, int) for v in item):
            return False
        return self._legal_frame(*item, size)

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        """The most tokens of a legal grid: for every block height the widest
        legal grid, at most."""
        self.check_modality(modality)
        kh, kw = self.merge_kernel_size
        limit = self.config(size).in_token_limit
        widest = self._max_side(size, kw) // kw
        best = 0
        for bh in range(1, self._max_side(size, kh) // kh + 1):
            spare_rows = (bh - 1) * kh
            bw = (
                widest
                if spare_rows == 0
                else min(widest, limit // (spare_rows * kw) + 1)
            )
            best = max(best, bh * bw)
        return best

    def make_mm_kwargs(
        self,
        host: KimiVLVisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """``pixel_values`` (Σ h·w, 3, p, p) in the tower dtype on ``device``
        (vLLM casts the processor's output to the model dtype) and
        ``image_grid_hws`` (n, 2) int64 on the CPU (``keep_on_cpu``). Pixels
        are uniform in [−1, 1] (mean = std = 0.5 normalisation), cut into
        patches in row-major order."""
        self.check_modality(modality)
        p = host.config.vision_config.patch_size
        generator = torch.Generator().manual_seed(seed)
        patches = []
        for h, w in items:
            image = torch.rand((3, h * p, w * p), generator=generator) * 2 - 1
            patches.append(
                image.reshape(3, h, p, w, p).permute(1, 3, 0, 2, 4).reshape(-1, 3, p, p)
            )
        pixels = torch.cat(patches) if patches else torch.zeros((0, 3, p, p))
        return {
            "pixel_values": pixels.to(device=device, dtype=host.vision_tower.dtype),
            "image_grid_hws": torch.tensor(list(items), dtype=torch.int64).reshape(
                -1, 2
            ),
        }


def _normalised_views(
    generator: torch.Generator,
    count: int,
    size: int,
    stats: tuple[tuple[float, ...], tuple[float, ...]],
) -> torch.Tensor:
    """``(count, 3, size, size)`` uniform random pixels normalised with the
    processor's per-channel ``(mean, std)``."""
    mean = torch.tensor(stats[0])[:, None, None]
    std = torch.tensor(stats[1])[:, None, None]
    return (torch.rand((count, 3, size, size), generator=generator) - mean) / std


def _counts(items: Sequence[Item]) -> list[int]:
    """The one count of each ``(n,)`` item."""
    counts = []
    for item in items:
        if len(item) != 1 or not isinstance(item[0], int) or item[0] < 0:
            raise ValueError(f"{item} is not a (count,) item")
        counts.append(item[0])
    return counts


class _ViewCountReference(ReferenceTower[HostT]):
    """Towers that batch fixed-size views (tiles, crops): an item is one
    count ``(n,)`` of views and has ``fixed_tokens + n · view_tokens``
    output tokens, for the counts :meth:`view_counts` lists."""

    @abc.abstractmethod
    def view_counts(self, size: Size, *, modality: str = "image") -> tuple[int, ...]:
        """Every legal ``n``, ascending."""

    @property
    def fixed_tokens(self) -> int:
        """Output tokens an item has besides its views."""
        return 0

    @property
    @abc.abstractmethod
    def view_tokens(self) -> int:
        """Output tokens of one view."""

    def output_tokens(self, item: Item) -> int:
        (views,) = item
        return self.fixed_tokens + views * self.view_tokens

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        return self.output_tokens((self.view_counts(size, modality=modality)[-1],))

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        counts = self.view_counts(size, modality=modality)
        return len(item) == 1 and isinstance(item[0], int) and item[0] in counts

    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        return (self.view_counts(size, modality=modality)[0],)

    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        views, rest = divmod(output_tokens - self.fixed_tokens, self.view_tokens)
        if rest or views not in self.view_counts(size, modality=modality):
            return None
        return (views,)

    def _listed_token_counts(
        self, size: Size, *, modality: str = "image"
    ) -> list[int] | None:
        return [
            self.output_tokens((n,)) for n in self.view_counts(size, modality=modality)
        ]


class InternVLReference(_ViewCountReference[InternVLVisionHost]):
    """InternVL: items are tile counts ``(n,)``, images or videos.

    Legal: images take the tile counts the processor's dynamic tiling emits
    (1, or a grid of 2..``max_dynamic_patch`` tiles plus the thumbnail: 3..13
    released); videos one tile per frame, 1..``max_frames_per_video``.
    Output tokens ``n · num_image_token``; input size ``n`` (vLLM's
    ``EncoderItemSpec``: tiles, not pixels).
    """

    name = "internvl"
    modalities = ("image", "video")
    host_cls = InternVLVisionHost

    def config(self, size: Size) -> InternVLConfig:
        return InternVLConfig.for_size(size)

    @property
    def view_tokens(self) -> int:
        return self._config_constant("num_image_token")

    def view_counts(self, size: Size, *, modality: str = "image") -> tuple[int, ...]:
        self.check_modality(modality)
        config = self.config(size)
        if modality == "image":
            return image_tile_counts(config)
        return tuple(range(1, config.max_frames_per_video + 1))

    def input_size(self, item: Item) -> int:
        (tiles,) = item
        return tiles

    def make_mm_kwargs(
        self,
        host: InternVLVisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """Images: ``pixel_values_flat`` ``(Σ n, 3, S, S)`` and
        ``image_num_patches`` ``(items,)``; videos: ``pixel_values_flat_video``
        and ``video_num_patches`` alike. Tiles are random ImageNet-normalised
        pixels in the tower dtype on ``device`` (vLLM casts the processor's
        floats to the model dtype); counts are int64 on the CPU (vLLM keeps
        them there)."""
        self.check_modality(modality)
        counts = _counts(items)
        side = host.config.vision_config.image_size
        dtype = host.vision_model.embeddings.patch_embedding.weight.dtype
        generator = torch.Generator().manual_seed(seed)
        tiles = _normalised_views(
            generator, sum(counts), side, (IMAGENET_MEAN, IMAGENET_STD)
        )
        pixel_key, count_key = (
            ("pixel_values_flat", "image_num_patches")
            if modality == "image"
            else ("pixel_values_flat_video", "video_num_patches")
        )
        return {
            pixel_key: tiles.to(device=device, dtype=dtype),
            count_key: torch.tensor(counts, dtype=torch.int64),
        }


class Step3VLReference(_ViewCountReference[Step3VLVisionHost]):
    """Step3-VL: items are crop counts ``(num_patches,)``; two paths.

    Every image has one global view (path ``"global"``, ``img_output_tokens``
    rows) and ``num_patches`` 504² crops (path ``"local"``,
    ``patch_output_tokens`` rows each). Legal: 0 crops, or 2 up to
    ``max_patches_per_image`` (the processor never emits exactly one).
    Output tokens ``img + num_patches · patch`` (the merged item); input size
    vLLM's ``g² + num_patches · l²`` (patches of the global view and of the
    crops).
    """

    name = "step3_vl"
    paths = ("global", "local")
    host_cls = Step3VLVisionHost

    def config(self, size: Size) -> Step3VLConfig:
        return Step3VLConfig.for_size(size)

    @property
    def fixed_tokens(self) -> int:
        return self._config_constant("img_output_tokens")

    @property
    def view_tokens(self) -> int:
        return self._config_constant("patch_output_tokens")

    def view_counts(self, size: Size, *, modality: str = "image") -> tuple[int, ...]:
        self.check_modality(modality)
        return (0, *range(2, self.config(size).max_patches_per_image + 1))

    def input_size(self, item: Item) -> int:
        (crops,) = item
        return self._config_constant(
            "global_view_patches"
        ) + crops * self._config_constant("crop_patches")

    def path_tokens(self, item: Item) -> dict[str, int]:
        (crops,) = item
        return {"global": self.fixed_tokens, "local": crops * self.view_tokens}

    def make_mm_kwargs(
        self,
        host: Step3VLVisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """``pixel_values`` ``(items, 3, S, S)``, ``patch_pixel_values``
        ``(Σ num_patches, 3, 504, 504)`` (``(0, 3, 504, 504)`` without crops):
        random CLIP-normalised pixels in the tower dtype on ``device`` (vLLM
        casts the processor's floats to the model dtype); ``num_patches``
        ``(items,)`` int64 on the CPU. Each image's global view is drawn
        before its crops."""
        self.check_modality(modality)
        counts = _counts(items)
        side = host.config.vision_config.image_size
        generator = torch.Generator().manual_seed(seed)
        views, crops = [], []
        for n in counts:
            views.append(_normalised_views(generator, 1, side, (CLIP_MEAN, CLIP_STD)))
            crops.append(
                _normalised_views(generator, n, CROP_SIZE, (CLIP_MEAN, CLIP_STD))
            )
        empty_views = torch.zeros((0, 3, side, side))
        return {
            "pixel_values": torch.cat(views or [empty_views]).to(
                device=device, dtype=host.dtype
            ),
            "patch_pixel_values": torch.cat(
                crops or [torch.zeros((0, 3, CROP_SIZE, CROP_SIZE))]
            ).to(device=device, dtype=host.dtype),
            "num_patches": torch.tensor(counts, dtype=torch.int64),
        }


class PixtralReference(ReferenceTower[PixtralVisionHost]):
    """Pixtral (Mistral format): items are image sizes ``(H, W)`` in pixels,
    as the processor emits them (:func:`reference_towers.pixtral.
    processor_image_size`): whole cells of ``c = patch · merge`` px a side,
    at most ``max_image_size`` a side (a larger image is scaled down to it).
    Every such size is legal, the smallest one cell. Output tokens ``(H /
    c)·(W / c)``; input rows ``(H / p)·(W / p)`` patches.
    """

    name = "pixtral"
    host_cls = PixtralVisionHost

    def config(self, size: Size) -> PixtralConfig:
        return PixtralConfig.for_size(size)

    @property
    def cell(self) -> int:
        """Pixels a side of one output token (``patch · merge``)."""
        return self._config_constant("cell")

    def input_size(self, item: Item) -> int:
        h, w = item
        p = self._config_constant("patch_size")
        return (h // p) * (w // p)

    def output_tokens(self, item: Item) -> int:
        h, w = item
        return (h // self.cell) * (w // self.cell)

    def _side(self, size: Size) -> int:
        """Output tokens a side of the largest image."""
        return self.config(size).max_tokens_per_side

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        self.check_modality(modality)
        return self._side(size) ** 2

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        self.check_modality(modality)
        if len(item) != 2 or not all(isinstance(v, int) for v in item):
            return False
        c, top = self.cell, self._side(size) * self.cell
        return all(c <= v <= top and v % c == 0 for v in item)

    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        self.check_modality(modality)
        return (self.cell, self.cell)

    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        self.check_modality(modality)
        side = self._side(size)
        shapes = [
            (a, b) for a, b in _divisor_pairs(output_tokens) if a <= side and b <= side
        ]
        if output_tokens < 1 or not shapes:
            return None
        a, b = rng.choice(shapes)
        return (a * self.cell, b * self.cell)

    def _listed_token_counts(
        self, size: Size, *, modality: str = "image"
    ) -> list[int] | None:
        # Products of two sides up to the largest: not every count.
        side = self._side(size)
        return sorted({a * b for a in range(1, side + 1) for b in range(1, side + 1)})

    def make_mm_kwargs(
        self,
        host: PixtralVisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """``images``: one ``(3, H, W)`` tensor per image of random
        CLIP-normalised pixels (mistral_common's normalisation) in the tower
        dtype on ``device`` (vLLM casts the processor's floats to the model
        dtype), as vLLM's batched field lays them out: stacked into one
        ``(N, 3, H, W)`` tensor when every image has the same size, else a
        list."""
        self.check_modality(modality)
        c = self.cell
        if any(len(i) != 2 or min(i) < c or i[0] % c or i[1] % c for i in items):
            raise ValueError(
                f"{list(items)} are not (H, W) sizes of whole {c}-px cells"
            )
        channels, dtype = self._channels_and_dtype(host)
        mean = torch.tensor(CLIP_MEAN)[:, None, None]
        std = torch.tensor(CLIP_STD)[:, None, None]
        generator = torch.Generator().manual_seed(seed)
        images = [
            ((torch.rand((channels, h, w), generator=generator) - mean) / std).to(
                device=device, dtype=dtype
            )
            for h, w in items
        ]
        if images and len({image.shape for image in images}) == 1:
            return {self.pixels_key: torch.stack(images)}
        return {self.pixels_key: images}

    pixels_key = "images"
    """The ``mm_kwargs`` key of the images."""

    def _channels_and_dtype(self, host: Any) -> tuple[int, torch.dtype]:
        return host.vision_args.num_channels, host.vision_encoder.dtype


class Mistral3Reference(PixtralReference):
    """Mistral3 (HF Pixtral tower, ``Mistral3ForConditionalGeneration``):
    Pixtral's items (``(H, W)`` pixels of whole ``patch · merge`` cells, at
    most ``image_size`` a side; the HF processor floors where
    mistral_common rounds, which changes no legal size), under
    ``mm_kwargs['pixel_values']``."""

    name = "mistral3"
    host_cls = Mistral3VisionHost  # type: ignore[assignment]
    pixels_key = "pixel_values"

    def config(self, size: Size) -> Mistral3Config:  # type: ignore[override]
        return Mistral3Config.for_size(size)

    def _channels_and_dtype(self, host: Any) -> tuple[int, torch.dtype]:
        return host.config.vision_config.num_channels, host.vision_tower.dtype


class KimiK25Reference(_MoonViTReference[KimiK25VisionHost]):
    """Kimi-K2.5: items are patch grids ``(t, h, w)`` of the ``vision_chunk``
    modality (images and video chunks, batched together by vLLM).

    The tower's items (``modality="image"``) are images, ``t == 1``: the ones
    the spec captures, and the only ones the driver can plan by budget
    tokens (a video chunk reports a budget above every budget, so it is
    packed alone and runs eagerly). Legal: ``h``, ``w`` positive multiples
    of the merge kernel (the processor pads to them) of at most
    ``patch_limit_on_one_side`` patches a side (rounded down to the kernel,
    within the 512-a-side RoPE grid) and ``max(1, h - kh)·max(1, w - kw) <=
    in_patch_limit`` (the smallest image padding to ``h×w`` has ``h - kh``
    whole patches a side): the grids the processor emits for images it does
    not downscale. Output tokens ``(h / kh)·(w / kw)``; input rows
    ``t·h·w``.

    Video chunks (``2 <= t <= frames_per_chunk`` frames of such a grid,
    :meth:`is_legal_chunk`) go through :meth:`make_mm_kwargs` and
    :meth:`reference_outputs` like images; their output tokens are the same
    (the merger pools the frames).
    """

    name = "kimi_k25"
    host_cls = KimiK25VisionHost

    def config(self, size: Size) -> KimiK25Config:
        return KimiK25Config.for_size(size)

    def _max_side(self, size: Size, kernel: int) -> int:
        """The largest legal side (patches): a multiple of ``kernel``."""
        limit = self.config(size).patch_limit_on_one_side
        # Unscaled widths are at most limit·p pixels: (side - k)·p + 1 of them.
        return min(limit + kernel - 1, 512) // kernel * kernel

    def input_size(self, item: Item) -> int:
        t, h, w = item
        return t * h * w

    def output_tokens(self, item: Item) -> int:
        _, h, w = item
        kh, kw = self.merge_kernel_size
        return (h // kh) * (w // kw)

    def _item_of(self, h: int, w: int) -> Item:
        return (1, h, w)

    def _legal_frame(self, h: int, w: int, size: Size) -> bool:
        kh, kw = self.merge_kernel_size
        return (
            kh <= h <= self._max_side(size, kh)
            and kw <= w <= self._max_side(size, kw)
            and h % kh == 0
            and w % kw == 0
            and max(1, h - kh) * max(1, w - kw) <= self.config(size).in_patch_limit
        )

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        self.check_modality(modality)
        if len(item) != 3 or not all(isinstance(v, int) for v in item):
            return False
        t, h, w = item
        return t == 1 and self._legal_frame(h, w, size)

    def is_legal_chunk(self, item: Item, size: Size) -> bool:
        """Whether ``item`` is a video chunk the processor can emit: 2 up to
        ``frames_per_chunk`` frames of a legal image grid (the per-frame
        patch limit taken as the image one, vLLM's default)."""
        if len(item) != 3 or not all(isinstance(v, int) for v in item):
            return False
        t, h, w = item
        frames = self.config(size).frames_per_chunk
        return 2 <= t <= frames and self._legal_frame(h, w, size)

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        """For every block height the widest legal grid, at most."""
        self.check_modality(modality)
        kh, kw = self.merge_kernel_size
        limit = self.config(size).in_patch_limit
        widest = self._max_side(size, kw) // kw
        best = 0
        for bh in range(1, self._max_side(size, kh) // kh + 1):
            spare_rows = max(1, (bh - 1) * kh)
            if spare_rows > limit:
                break
            # The widest bw with max(1, (bw - 1)·kw) · spare_rows <= limit.
            bw = min(widest, (limit // spare_rows) // kw + 1)
            best = max(best, bh * bw)
        return best

    def make_mm_kwargs(
        self,
        host: KimiK25VisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """``pixel_values`` ``(Σ t·h·w, 3, p, p)`` in the tower dtype on
        ``device`` (vLLM casts the processor's floats to the model dtype)
        and ``grid_thws`` ``(n, 3)`` int64 on the CPU (``keep_on_cpu``), as
        vLLM's processor lays out a ``vision_chunk`` batch: images (``t ==
        1``) and video chunks (``t`` distinct frames) alike. Pixels are
        uniform in [-1, 1] (mean = std = 0.5), cut into patches frame by
        frame, row-major."""
        self.check_modality(modality)
        p = host.config.vision_config.patch_size
        generator = torch.Generator().manual_seed(seed)
        patches = []
        for item in items:
            t, h, w = item
            if min(item) < 1:
                raise ValueError(f"{item} is not a (t, h, w) grid")
            frames = torch.rand((t, 3, h * p, w * p), generator=generator) * 2 - 1
            patches.append(
                frames.reshape(t, 3, h, p, w, p)
                .permute(0, 2, 4, 1, 3, 5)
                .reshape(-1, 3, p, p)
            )
        pixels = torch.cat(patches) if patches else torch.zeros((0, 3, p, p))
        return {
            "pixel_values": pixels.to(device=device, dtype=host.vision_tower.dtype),
            "grid_thws": torch.tensor(list(items), dtype=torch.int64).reshape(-1, 3),
        }


class MiniCPMVReference(ReferenceTower[MiniCPMVVisionHost]):
    """MiniCPM-V 2.6: items are images as their slices, a tuple of ``(h,
    w)`` patch grids: the thumbnail (the whole image resized) first, then the
    grid's slices, all of one size (the processor cuts the refined image
    into equal parts).

    Legal: the thumbnail alone, or it and 2 up to ``max_slice_num`` slices
    (``get_sliced_grid`` never makes a grid of one); every slice at most
    ``image_size // patch_size`` patches a side (a longer one runs eagerly,
    ``items.eager_when``: not drawn here, as its budget tokens exceed every
    budget) and at most ``slice_patch_limit`` patches. Output tokens
    ``slices · query_num``; input rows ``Σ h·w``. Only images: video frames
    are one slice each and go through the same code (left to a later tower).
    """

    name = "minicpmv"
    host_cls = MiniCPMVVisionHost

    LONG_SIDE_ODDS = 1 / 16
    """How often a drawn slice has a side beyond the 64-patch keys (it then
    replays the full-side key, the costliest graph)."""

    def config(self, size: Size) -> MiniCPMVConfig:
        return MiniCPMVConfig.for_size(size)

    @property
    def query_num(self) -> int:
        return self._config_constant("query_num")

    def slice_counts(self, size: Size) -> tuple[int, ...]:
        """Every legal number of slices (the thumbnail included)."""
        return (1, *range(3, self.config(size).max_slice_num + 2))

    def input_size(self, item: Item) -> int:
        return sum(h * w for h, w in item)

    def output_tokens(self, item: Item) -> int:
        return len(item) * self.query_num

    def max_output_tokens(self, size: Size, *, modality: str = "image") -> int:
        self.check_modality(modality)
        return self.slice_counts(size)[-1] * self.query_num

    def _legal_slice(self, grid: Any, size: Size) -> bool:
        config = self.config(size)
        return (
            isinstance(grid, tuple)
            and len(grid) == 2
            and all(isinstance(v, int) and 1 <= v <= config.max_side for v in grid)
            and grid[0] * grid[1] <= config.slice_patch_limit
        )

    def is_legal(self, item: Item, size: Size, *, modality: str = "image") -> bool:
        self.check_modality(modality)
        return (
            isinstance(item, tuple)
            and len(item) in self.slice_counts(size)
            and all(self._legal_slice(grid, size) for grid in item)
            and len(set(item[1:])) <= 1
        )

    def smallest_item(self, size: Size, *, modality: str = "image") -> Item:
        self.check_modality(modality)
        return ((1, 1),)

    def _slice_shape(self, rng: random.Random, size: Size) -> tuple[int, int]:
        """A random legal slice: now and then one with a side past 64."""
        config = self.config(size)
        limit, side = config.slice_patch_limit, config.max_side
        if side > 64 and limit > 64 and rng.random() < self.LONG_SIDE_ODDS:
            long = rng.randint(65, min(side, limit))
            short = rng.randint(1, limit // long)
            return (long, short) if rng.random() < 0.5 else (short, long)
        h = rng.randint(1, min(side, 64, limit))
        w = rng.randint(1, min(side, 64, limit // h))
        return h, w

    def _items_with_output_tokens(
        self,
        rng: random.Random,
        size: Size,
        output_tokens: int,
        *,
        modality: str = "image",
    ) -> Item | None:
        self.check_modality(modality)
        slices, rest = divmod(output_tokens, self.query_num)
        if rest or slices not in self.slice_counts(size):
            return None
        thumbnail = self._slice_shape(rng, size)
        if slices == 1:
            return (thumbnail,)
        return (thumbnail, *[self._slice_shape(rng, size)] * (slices - 1))

    def _listed_token_counts(
        self, size: Size, *, modality: str = "image"
    ) -> list[int] | None:
        return [n * self.query_num for n in self.slice_counts(size)]

    def make_mm_kwargs(
        self,
        host: MiniCPMVVisionHost,
        items: Sequence[Item],
        device: torch.device | str,
        *,
        seed: int = 0,
        modality: str = "image",
    ) -> dict[str, Any]:
        """As vLLM's processor lays them out (field config M:500-510):
        ``pixel_values`` a list per image of its slices, each ``(3, p,
        h·w·p)`` (the patches side by side, ``reshape_by_patch``) in the
        tower dtype on ``device``; ``tgt_sizes`` int64 on the host
        (``keep_on_cpu``): a list per image of ``(n, 2)`` tensors, stacked to
        ``(images, n, 2)`` when every image has ``n`` slices (the batched
        field stacks items of one shape). Pixels are uniform in [-1, 1]
        (mean = std = 0.5)."""
        self.check_modality(modality)
        p = host.vpm.embeddings.patch_size
        dtype = host.vpm.embeddings.patch_embedding.weight.dtype
        generator = torch.Generator().manual_seed(seed)
        pixel_values, tgt_sizes = [], []
        for item in items:
            if not item or any(len(g) != 2 or min(g) < 1 for g in item):
                raise ValueError(f"{item} is not a tuple of (h, w) slices")
            slices = []
            for h, w in item:
                image = torch.rand((3, h * p, w * p), generator=generator) * 2 - 1
                slices.append(slice_pixels(image, p).to(device=device, dtype=dtype))
            pixel_values.append(slices)
            tgt_sizes.append(torch.tensor(list(item), dtype=torch.int64))
        if tgt_sizes and len({t.shape for t in tgt_sizes}) == 1:
            # vLLM's batched field stacks items of one shape.
            return {"pixel_values": pixel_values, "tgt_sizes": torch.stack(tgt_sizes)}
        return {"pixel_values": pixel_values, "tgt_sizes": tgt_sizes}


REFERENCE_TOWERS: dict[str, ReferenceTower[Any]] = {
    tower.name: tower
    for tower in (
        DeepseekV41Reference(),
        InternVLReference(),
        KimiVLReference(),
        MiniMaxM3Reference(),
        Qwen2VLReference(),
        Qwen2_5_VLReference(),
        Step3VLReference(),
        KimiK25Reference(),
        MiniCPMVReference(),
        PixtralReference(),
        Mistral3Reference(),
    )
}


def stems_with_generated_mixin() -> list[str]:
    """The towers whose spec has been generated (``generated.standalone.<stem>``
    exists), sorted; the others are checked against vLLM's own mixin in their
    tower tests until then."""
    return sorted(
        stem
        for stem in REFERENCE_TOWERS
        if importlib.util.find_spec(f"generated.standalone.{stem}") is not None
    )


def generated_mixin(stem: str) -> type:
    """The mixin class of ``generated.standalone.<stem>``: the one class the
    module defines that implements ``encoder_cudagraph_forward``."""
    module = importlib.import_module(f"generated.standalone.{stem}")
    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if obj.__module__ == module.__name__
        and "encoder_cudagraph_forward" in vars(obj)
    ]
    if len(classes) != 1:
        raise LookupError(
            f"generated.standalone.{stem} defines {len(classes)} mixins "
            f"({[c.__name__ for c in classes]}); expected one"
        )
    return classes[0]
