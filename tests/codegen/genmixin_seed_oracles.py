"""The seed mixins' behaviour, transcribed as plain functions (test oracles).

``/work/shared/seeds/000_*.txt`` (DeepSeek-V4.1), ``001_*.txt`` (its vision
helpers) and ``002_*.txt`` (MiniMax M3) are the hand-written vLLM code the
generated mixins reproduce. Each function below follows one seed method line
by line, with ``self`` as an explicit ``host`` argument, so the generated
methods can be compared with it on the same fake hosts.

Also here: fakes of the vision-side helpers the mixins call
(``build_packed_vit_metadata`` / ``build_packed_merge_metadata`` from seed
001, and MiniMax's ``prepare_encoder_metadata`` as vLLM 0.33.0 implements it
for FLASH_ATTN), which record their calls.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import torch
from host_modules import FakeModule

# -- seed 001: DeepSeek-V4 vision helpers ------------------------------------------


def fake_vision_cos_sin(
    n_h: int, n_w: int, rope_dim: int, rope_theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in for the ViT's 2-D RoPE tables: (n_h * n_w, 1, rope_dim),
    different for every grid, position and channel."""
    hi = torch.arange(n_h, dtype=torch.float64).repeat_interleave(n_w)
    wi = torch.arange(n_w, dtype=torch.float64).repeat(n_h)
    half = rope_dim // 2
    freq = 1.0 / (
        rope_theta ** (torch.arange(half, dtype=torch.float64) / max(half, 1))
    )
    ang = torch.cat([hi[:, None] * freq, wi[:, None] * freq], dim=1)[:, :rope_dim]
    ang = ang + 0.001 * (n_h * 31 + n_w)
    return torch.cos(ang).float()[:, None, :], torch.sin(ang).float()[:, None, :]


class DeepseekBuilders:
    """``build_packed_vit_metadata`` and ``build_packed_merge_metadata`` of
    seed 001, recording each call as ``(name, args, kwargs)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def build_packed_merge_metadata(
        self, grids, downsample_ratio, *, device, dtype
    ) -> dict[str, torch.Tensor]:
        self.calls.append(
            (
                "merge",
                ([list(g) for g in grids], downsample_ratio),
                {"device": device, "dtype": dtype},
            )
        )
        r = downsample_ratio
        idx_list: list[torch.Tensor] = []
        mask_list: list[torch.Tensor] = []
        offset = 0
        for n_h, n_w in grids:
            rows = -(-n_h // r)
            cols = -(-n_w // r)
            bi = torch.arange(rows).repeat_interleave(cols)
            bj = torch.arange(cols).repeat(rows)
            di = torch.arange(r).repeat_interleave(r)
            dj = torch.arange(r).repeat(r)
            hi = bi[:, None] * r + di[None, :]
            wj = bj[:, None] * r + dj[None, :]
            valid = (hi < n_h) & (wj < n_w)
            idx = offset + hi.clamp(max=n_h - 1) * n_w + wj.clamp(max=n_w - 1)
            idx_list.append(idx)
            mask_list.append(valid)
            offset += n_h * n_w
        if idx_list:
            merge_idx = torch.cat(idx_list).to(device)
            merge_mask = (
                torch.cat(mask_list).unsqueeze(-1).to(device=device, dtype=dtype)
            )
        else:
            merge_idx = torch.zeros((0, r * r), dtype=torch.int64, device=device)
            merge_mask = torch.zeros((0, r * r, 1), dtype=dtype, device=device)
        return {"merge_idx": merge_idx, "merge_mask": merge_mask}

    def build_packed_vit_metadata(
        self,
        grids,
        *,
        rope_dim,
        rope_theta,
        device,
        max_seqlen_override=None,
        cached=True,
    ) -> dict[str, torch.Tensor]:
        self.calls.append(
            (
                "vit",
                ([list(g) for g in grids],),
                {
                    "rope_dim": rope_dim,
                    "rope_theta": rope_theta,
                    "device": device,
                    "max_seqlen_override": max_seqlen_override,
                    "cached": cached,
                },
            )
        )
        cos_list: list[torch.Tensor] = []
        sin_list: list[torch.Tensor] = []
        cu_seqlens = [0]
        max_seqlen = 0
        for n_h, n_w in grids:
            cos, sin = fake_vision_cos_sin(n_h, n_w, rope_dim, rope_theta)
            cos_list.append(cos)
            sin_list.append(sin)
            n = n_h * n_w
            cu_seqlens.append(cu_seqlens[-1] + n)
            max_seqlen = max(max_seqlen, n)
        if cos_list:
            cos = torch.cat(cos_list).to(device)
            sin = torch.cat(sin_list).to(device)
        else:
            cos = torch.zeros((0, 1, rope_dim), dtype=torch.float32, device=device)
            sin = torch.zeros((0, 1, rope_dim), dtype=torch.float32, device=device)
        if max_seqlen_override is not None:
            max_seqlen = max_seqlen_override
        return {
            "vit_cos": cos,
            "vit_sin": sin,
            "cu_seqlens": torch.tensor(cu_seqlens, dtype=torch.int32, device=device),
            "max_seqlen": torch.tensor(max_seqlen, dtype=torch.int32),
        }


# -- seed 000: DeepSeek-V4.1 mixin -----------------------------------------------------


def ds_grid_list(mm_kwargs: dict[str, Any], key: str) -> list[list[int]]:
    grid = mm_kwargs[key]
    if isinstance(grid, torch.Tensor):
        grid = grid.tolist()
    return [[int(v) for v in row] for row in grid]


def ds_item_specs(mm_kwargs: dict[str, Any]) -> list[tuple[int, int]]:
    vit_grid = ds_grid_list(mm_kwargs, "vit_grid")
    llm_grid = ds_grid_list(mm_kwargs, "llm_grid")
    return [
        (h * w, lh * (lw + 1) + 2)
        for (h, w), (lh, lw) in zip(vit_grid, llm_grid, strict=True)
    ]


def ds_select(mm_kwargs: dict[str, Any], indices: list[int]) -> dict[str, Any]:
    vit_grid = ds_grid_list(mm_kwargs, "vit_grid")
    llm_grid = ds_grid_list(mm_kwargs, "llm_grid")
    patches = mm_kwargs["patches"]
    types = mm_kwargs["types"]
    if len(indices) == 0:
        return {
            "patches": patches[:0],
            "vit_grid": torch.zeros((0, 2), dtype=torch.int64),
            "llm_grid": torch.zeros((0, 2), dtype=torch.int64),
            "types": types[:0],
        }
    cum_patches = [0]
    for h, w in vit_grid:
        cum_patches.append(cum_patches[-1] + h * w)
    cum_spans = [0]
    for lh, lw in llm_grid:
        cum_spans.append(cum_spans[-1] + lh * (lw + 1) + 2)
    return {
        "patches": torch.cat(
            [patches[cum_patches[i] : cum_patches[i + 1]] for i in indices]
        ),
        "vit_grid": torch.tensor([vit_grid[i] for i in indices], dtype=torch.int64),
        "llm_grid": torch.tensor([llm_grid[i] for i in indices], dtype=torch.int64),
        "types": torch.cat([types[cum_spans[i] : cum_spans[i + 1]] for i in indices]),
    }


def ds_capture(
    host, builders: DeepseekBuilders, token_budget, max_batch_size, device, dtype
) -> tuple[dict[str, torch.Tensor], int]:
    """(values, registered total) of the seed's capture."""
    if (
        host.multimodal_config is not None
        and host.multimodal_config.get_limit_per_prompt("image") == 0
    ):
        raise RuntimeError("image limit is 0")
    config = host.config
    r = config.vision_downsample_ratio
    per_item_out = -(-token_budget // max_batch_size)
    grids = [[r, r * per_item_out]] * max_batch_size
    total_patches = r * r * per_item_out * max_batch_size
    p = config.vision_patch_size
    patches = torch.zeros(total_patches, 3, p, p, device=device, dtype=dtype)
    metadata = builders.build_packed_vit_metadata(
        grids,
        rope_dim=host.vision.rope_dim,
        rope_theta=host.vision.rope_theta,
        device=device,
        max_seqlen_override=total_patches,
        cached=False,
    )
    real_cu = metadata.pop("cu_seqlens")
    cu_seqlens = torch.full(
        (max_batch_size + 2,), total_patches, dtype=torch.int32, device=device
    )
    cu_seqlens[: real_cu.numel()] = real_cu
    merge = builders.build_packed_merge_metadata(grids, r, device=device, dtype=dtype)
    values = {"patches": patches, **metadata, "cu_seqlens": cu_seqlens, **merge}
    return values, total_patches


def ds_pad_cu_seqlens(dst: torch.Tensor, src: torch.Tensor, total: int) -> None:
    n = min(src.shape[0], dst.shape[0])
    dst[:n].copy_(src[:n])
    dst[n:] = total


def ds_replay(host, builders: DeepseekBuilders, mm_kwargs) -> dict[str, torch.Tensor]:
    vit_grid = ds_grid_list(mm_kwargs, "vit_grid")
    patches = mm_kwargs["patches"]
    dtype = host.aligner.w1.weight.dtype
    if patches.dtype != dtype:
        patches = patches.to(dtype)
    metadata = builders.build_packed_vit_metadata(
        vit_grid,
        rope_dim=host.vision.rope_dim,
        rope_theta=host.vision.rope_theta,
        device=patches.device,
    )
    merge = builders.build_packed_merge_metadata(
        vit_grid,
        host.config.vision_downsample_ratio,
        device=patches.device,
        dtype=dtype,
    )
    return {"patches": patches, **metadata, **merge}


def ds_graph_forward(host, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    vit_out = host.vision.forward_packed(
        inputs["patches"],
        inputs["vit_cos"],
        inputs["vit_sin"],
        inputs["cu_seqlens"],
        inputs["max_seqlen"],
    )
    return host.aligner.forward_packed(
        vit_out, inputs["merge_idx"], inputs["merge_mask"]
    )


def ds_eager(host, mm_kwargs) -> torch.Tensor:
    patches = mm_kwargs["patches"].to(host.aligner.w1.weight.dtype)
    vit_grid = ds_grid_list(mm_kwargs, "vit_grid")
    outs: list[torch.Tensor] = []
    offset = 0
    for n_vit_h, n_vit_w in vit_grid:
        n_vit = n_vit_h * n_vit_w
        item = patches[offset : offset + n_vit]
        outs.append(host.aligner(host.vision(item, n_vit_h, n_vit_w), n_vit_h, n_vit_w))
        offset += n_vit
    if not outs:
        return patches.new_zeros((0, host.config.hidden_size))
    return torch.cat(outs, dim=0)


def ds_build_image_span(
    host, image_embeds: torch.Tensor, types: torch.Tensor, consts: SimpleNamespace
) -> torch.Tensor:
    """The seed's per-item span (eager multimodal path): an independent
    statement of what each item's output must be."""
    types = types.to(image_embeds.device)
    span = image_embeds.new_empty(types.numel(), image_embeds.shape[-1])
    dtype = image_embeds.dtype
    span[types == consts.IMAGE_START] = host.image_start.to(dtype)
    span[types == consts.IMAGE_END] = host.image_end.to(dtype)
    span[types == consts.IMAGE_NEW_LINE] = host.image_newline.to(dtype)
    span[types == consts.IMAGE] = image_embeds
    return span


def ds_postprocess(
    host, outputs, indices, dest, batch_mm_kwargs, consts: SimpleNamespace
) -> None:
    """The seed's batched span assembly (one gather for the batch)."""
    if not indices:
        return
    assert batch_mm_kwargs is not None
    aligner_out = outputs["default"]
    r = host.config.vision_downsample_ratio
    vit_grid = ds_grid_list(batch_mm_kwargs, "vit_grid")
    llm_grid = ds_grid_list(batch_mm_kwargs, "llm_grid")
    types = batch_mm_kwargs["types"]
    n_rows = sum(-(-h // r) * (-(-w // r)) for h, w in vit_grid)
    span_lens = [lh * (lw + 1) + 2 for lh, lw in llm_grid]
    is_image = types == consts.IMAGE
    src_idx = torch.where(
        is_image,
        is_image.cumsum(0) - 1,
        n_rows
        + (types == consts.IMAGE_NEW_LINE).long()
        + 2 * (types == consts.IMAGE_END).long(),
    )
    delims = torch.stack([host.image_start, host.image_newline, host.image_end])
    src = torch.cat([aligner_out[:n_rows], delims.to(aligner_out.dtype)])
    span = src[src_idx.to(aligner_out.device)]
    offset = 0
    for idx, span_len in zip(indices, span_lens):  # noqa: B905 (as the seed)
        dest[idx] = span[offset : offset + span_len]
        offset += span_len


def ds_span_types(lh: int, lw: int, consts: SimpleNamespace) -> list[int]:
    """``[IMAGE_START] + ([IMAGE] * lw + [IMAGE_NEW_LINE]) * lh + [IMAGE_END]``."""
    row = [consts.IMAGE] * lw + [consts.IMAGE_NEW_LINE]
    return [consts.IMAGE_START, *row * lh, consts.IMAGE_END]


# -- vLLM 0.33.0 MiniMax-VL vision model: prepare_encoder_metadata (FLASH_ATTN) -----------


class FakeMiniMaxVisionModel(FakeModule):
    """``vision_tower.vision_model`` of a MiniMax M3 host: the attributes the
    mixin reads and ``prepare_encoder_metadata`` as vLLM 0.33.0 computes it
    for FLASH_ATTN (cu_seqlens optionally padded to ``max_batch_size``
    segments with zero-length ones; max_seqlen a 0-dim CPU int32), with
    rotary planes ``(3, N, half_rot_dim)`` that depend on every position."""

    def __init__(self, attn_backend, *, channels=3, frames=2, patch=2, half_rot_dim=3):
        self.attn_backend = attn_backend
        self.embeddings = SimpleNamespace(
            num_channels=channels, temporal_patch_size=frames, patch_size=patch
        )
        self.half_rot_dim = half_rot_dim
        self.calls: list[dict[str, Any]] = []

    def prepare_encoder_metadata(
        self, grid_thw, *, device, max_batch_size=None, max_seqlen_override=None
    ) -> dict[str, torch.Tensor | None]:
        self.calls.append(
            {
                "grid_thw": [list(g) for g in grid_thw],
                "device": device,
                "max_batch_size": max_batch_size,
                "max_seqlen_override": max_seqlen_override,
            }
        )
        lens = [t * h * w for t, h, w in grid_thw]
        cu = [0, *itertools.accumulate(lens)]
        if max_batch_size is not None and len(lens) < max_batch_size:
            cu += [cu[-1]] * (max_batch_size - len(lens))
        max_seqlen = torch.tensor(
            (
                max_seqlen_override
                if max_seqlen_override is not None
                else max(lens, default=0)
            ),
            dtype=torch.int32,
        )
        planes = []
        for t, h, w in grid_thw:
            ti = torch.arange(t).repeat_interleave(h * w)
            hi = torch.arange(h).repeat_interleave(w).repeat(t)
            wi = torch.arange(w).repeat(t * h)
            pos = torch.stack([ti, hi, wi]).double()  # (3, n)
            ch = torch.arange(1, self.half_rot_dim + 1, dtype=torch.float64)
            planes.append(pos[:, :, None] * ch / (self.half_rot_dim + 1) + 0.01 * h)
        if planes:
            ang = torch.cat(planes, dim=1)
        else:
            ang = torch.zeros((3, 0, self.half_rot_dim), dtype=torch.float64)
        return {
            "rotary_cos": torch.cos(ang).float().to(device),
            "rotary_sin": torch.sin(ang).float().to(device),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32, device=device),
            "max_seqlen": max_seqlen,
            "sequence_lengths": None,
        }


# -- seed 002: MiniMax M3 mixin ---------------------------------------------------------


def mm_grid_list(mm_kwargs: dict[str, Any]) -> list[list[int]]:
    grid_thw = mm_kwargs["image_grid_thw"]
    if isinstance(grid_thw, torch.Tensor):
        return [[int(x) for x in row] for row in grid_thw.tolist()]
    return [[int(x) for x in row] for row in grid_thw]


def mm_pixel_values(mm_kwargs: dict[str, Any]) -> torch.Tensor:
    pixel_values = mm_kwargs["pixel_values"]
    if isinstance(pixel_values, list):
        pixel_values = torch.cat(pixel_values)
    return pixel_values


def mm_item_specs(host, mm_kwargs) -> list[tuple[int, int]]:
    merge = host.vision_tower.spatial_merge_size
    return [
        (t * h * w, t * h * w // (merge * merge)) for t, h, w in mm_grid_list(mm_kwargs)
    ]


def mm_select(mm_kwargs, indices) -> dict[str, Any]:
    grid_thw_list = mm_grid_list(mm_kwargs)
    pixel_values = mm_pixel_values(mm_kwargs)
    source_grid = mm_kwargs["image_grid_thw"]
    if len(indices) == 0:
        empty_grid = (
            source_grid[:0]
            if isinstance(source_grid, torch.Tensor)
            else pixel_values.new_zeros((0, 3), dtype=torch.long)
        )
        return {"pixel_values": pixel_values[:0], "image_grid_thw": empty_grid}
    patch_counts = [t * h * w for t, h, w in grid_thw_list]
    cum = [0]
    for pc in patch_counts:
        cum.append(cum[-1] + pc)
    selected_pv = torch.cat([pixel_values[cum[i] : cum[i + 1]] for i in indices], dim=0)
    grid_device = source_grid.device if isinstance(source_grid, torch.Tensor) else None
    selected_grid = torch.tensor(
        [grid_thw_list[i] for i in indices], dtype=torch.long, device=grid_device
    )
    return {"pixel_values": selected_pv, "image_grid_thw": selected_grid}


def mm_capture(
    host, token_budget, max_batch_size, device, dtype
) -> tuple[dict[str, torch.Tensor], int]:
    merge = host.vision_tower.spatial_merge_size
    per_item_out = (token_budget + max_batch_size - 1) // max_batch_size
    grid_thw_list = [[1, merge, per_item_out * merge] for _ in range(max_batch_size)]
    embeddings = host.vision_tower.vision_model.embeddings
    patch_dim = (
        embeddings.num_channels
        * embeddings.temporal_patch_size
        * embeddings.patch_size**2
    )
    total_patches = sum(t * h * w for t, h, w in grid_thw_list)
    dummy_pixel_values = torch.zeros(
        total_patches, patch_dim, device=device, dtype=host.vision_tower.dtype
    )
    metadata = host.vision_tower.vision_model.prepare_encoder_metadata(
        grid_thw_list,
        device=device,
        max_batch_size=max_batch_size + 1,
        max_seqlen_override=total_patches,
    )
    values: dict[str, torch.Tensor] = {"pixel_values": dummy_pixel_values}
    values.update({k: v for k, v in metadata.items() if v is not None})
    return values, total_patches


def mm_pad_cu_seqlens(dst: torch.Tensor, src: torch.Tensor, total: int) -> None:
    n = src.shape[0]
    dst[:n].copy_(src[:n])
    dst[n:] = total


def mm_pad_rope_planes(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.zero_()
    dst[:, : src.shape[1]].copy_(src)


def mm_replay(host, mm_kwargs) -> dict[str, torch.Tensor | None]:
    pixel_values = mm_pixel_values(mm_kwargs)
    metadata = host.vision_tower.vision_model.prepare_encoder_metadata(
        mm_grid_list(mm_kwargs), device=pixel_values.device
    )
    metadata.pop("max_seqlen")
    values: dict[str, torch.Tensor | None] = {"pixel_values": pixel_values}
    values.update(metadata)
    return values


def mm_eager(host, mm_kwargs) -> Any:
    return host.vision_tower(
        pixel_values=mm_pixel_values(mm_kwargs).type(host.vision_tower.dtype),
        grid_thw=mm_grid_list(mm_kwargs),
    )


def budget_range(vllm_config) -> tuple[int, int]:
    """Both seeds: (64, min(max_num_batched_tokens, max_model_len))."""
    return (
        64,
        min(
            vllm_config.scheduler_config.max_num_batched_tokens,
            vllm_config.model_config.max_model_len,
        ),
    )
