"""The oracle check's cases, one table per model beyond vLLM's catalog (its
oracle is ``beyond_hosts.ORACLES``'s row of the same stem): the oracle's
forms, the managers, the backends the spec guards, and the wrong specs and
wrong modules the check must catch. ``test_beyond_oracles.py`` runs them."""

from __future__ import annotations

from beyond_testlib import Mutation, OracleCases

#: What a spec of a varlen tower without ``max_seqlen`` under them refuses:
#: SDPA reads ``cu_seqlens`` on the host; FlashInfer needs metadata (scaled,
#: bucketed offsets and the sequence lengths) these towers never build.
NO_MAX_SEQLEN = ("TORCH_SDPA", "FLASHINFER")

#: Wrong specs that the varlen towers closing ``cu_seqlens`` from the item
#: lengths share word for word (dots.ocr, PaddleOCR-VL, Qwen3-Omni).
MERGED_FIRST_PAIR = Mutation(
    "the first two images merged into one sequence",
    "lengths.cumsum(0)]).to(\n            device=pixel_values.device",
    "lengths.cumsum(0)[1:]]).to(\n            device=pixel_values.device",
)
#: (dots.ocr, Qwen3-Omni) The static checks refuse a capture value below
#: token_budget * merge**2.
MAX_SEQLEN_ONE_TOKEN = Mutation(
    "max_seqlen captured for one merged token per row",
    "max(token_budget * merge**2, int(max_seqlen))",
    "token_budget",
)

# ---------------------------------------------------------------------------
# Cohere2-Vision: SigLIP tiles, the projector's pixel shuffle
# ---------------------------------------------------------------------------

COHERE2_VISION = OracleCases(
    spec_mutations=(
        Mutation(
            "tokens per tile off by the shuffle",
            "output_tokens: n * (side // patch // shuffle) ** 2",
            "output_tokens: n * (side // patch) ** 2 // shuffle",
        ),
        Mutation(
            "the projector skipped in the graph",
            "  - multi_modal_projector(features).flatten(0, -2)\n\neager_forward:",
            "  - features.flatten(0, 1)\n\neager_forward:",
        ),
        Mutation(
            "the tiles flattened into the wrong rows",
            "    - multi_modal_projector(features).flatten(0, -2)\n",
            "    - multi_modal_projector(features).transpose(1, 2).flatten(0, -2)\n",
        ),
    ),
)

# ---------------------------------------------------------------------------
# dots.ocr: a varlen tower with 2-D RoPE and a patch merger, its blocks in a
# loop (three fake blocks)
# ---------------------------------------------------------------------------

_DOTS_BLOCK_CALL = (
    "      - hidden = block(hidden, cu_seqlens=cu_seqlens, "
    "rotary_pos_emb=rotary_pos_emb, max_seqlen=max_seqlen)\n"
)

DOTS_OCR = OracleCases(
    refused=NO_MAX_SEQLEN,
    spec_mutations=(
        Mutation(
            "output tokens without the merge",
            "  output_tokens: t * (h // merge) * (w // merge)\n",
            "  output_tokens: t * h * w // merge\n",
        ),
        Mutation(
            "every block run twice",
            _DOTS_BLOCK_CALL,
            _DOTS_BLOCK_CALL + _DOTS_BLOCK_CALL,
        ),
        Mutation(
            "the post-trunk norm skipped",
            "  - vision_tower.merger(normed)[:, :config.hidden_size]\n",
            "  - vision_tower.merger(hidden + 0 * normed)[:, :config.hidden_size]\n",
        ),
        Mutation(
            "the graph reads the rows in reverse",
            "pixel_values.to(vision_tower.dtype), None)",
            "pixel_values.flip(0).to(vision_tower.dtype), None)",
        ),
    ),
    module_edits=(
        Mutation(
            "the last block left out",
            "for block in self.vision_tower.blocks:",
            "for block in self.vision_tower.blocks[:-1]:",
        ),
        Mutation(
            "the blocks skipped",
            "for block in self.vision_tower.blocks:",
            "for block in self.vision_tower.blocks[:0]:",
        ),
        MERGED_FIRST_PAIR,
        MAX_SEQLEN_ONE_TOKEN,
    ),
)

# ---------------------------------------------------------------------------
# Eagle2.5-VL: SigLIP tiles, InternVL's pixel shuffle; tiles of the vision
# config's side, or of the config's force_image_size (the vision config then
# says another)
# ---------------------------------------------------------------------------

_EAGLE_SIDES = '"forced if forced > 0 else image", "forced if forced > 0 else image"]'

EAGLE2_5_VL = OracleCases(
    forms={"vision config's side": {}, "force_image_size": {"forced": True}},
    spec_mutations=(
        Mutation(
            "a token too many per tile",
            "  output_tokens: n * tokens\n",
            "  output_tokens: n * (tokens + 1)\n",
        ),
        Mutation(
            "the tile side doubled",
            _EAGLE_SIDES,
            '"2 * (forced if forced > 0 else image)", '
            '"2 * (forced if forced > 0 else image)"]',
        ),
        Mutation(
            "the graph's rows in the wrong order",
            "  - extract_feature(pixel_values_flat).flatten(0, -2)\n\neager_forward:",
            "  - extract_feature(pixel_values_flat.flip(0)).flatten(0, -2)\n\n"
            "eager_forward:",
        ),
        Mutation(
            "the vision config's side alone",
            _EAGLE_SIDES,
            "image, image]",
            forms=("force_image_size",),
        ),
    ),
)

# ---------------------------------------------------------------------------
# LLaVA-NeXT: anyres CLIP tiles, each image merged after the graph (a
# vLLM-only spec: vLLM's manager only; its own tests in
# test_beyond_llava_next.py)
# ---------------------------------------------------------------------------

LLAVA_NEXT = OracleCases(
    managers=("vllm",),
    spec_mutations=(
        Mutation(
            "the count without the newline rows",
            "unpadded.shape[1] * (unpadded.shape[2] + 1)",
            "unpadded.shape[1] * unpadded.shape[2]",
        ),
        Mutation(
            "the count of the grid before the cut",
            "      - unpadded = unpad_image(grid, (ih, iw))\n",
            "      - unpadded = grid\n",
        ),
        Mutation(
            "the image's sides swapped in the search",
            "      - tile_rows, tile_cols = get_anyres_image_grid_shape((ih, iw), "
            "config.image_grid_pinpoints, side)\n      - grid",
            "      - tile_rows, tile_cols = get_anyres_image_grid_shape((iw, ih), "
            "config.image_grid_pinpoints, side)\n      - grid",
        ),
        Mutation(
            "the projector skipped in the graph",
            "  - multi_modal_projector(features).flatten(0, 1)[real_rows]",
            "  - features.flatten(0, 1)[real_rows]",
        ),
        Mutation(
            "the class row kept in the graph",
            "  - features = vision_tower(tiles, select_layers=select_layers, "
            "feature_select_strategy=config.vision_feature_select_strategy)\n"
            "  - multi_modal_projector",
            "  - features = vision_tower(tiles, select_layers=select_layers, "
            'feature_select_strategy="full")\n'
            "  - multi_modal_projector",
        ),
        Mutation(
            "the real rows gathered at four tiles per image",
            "real_rows = (image * 5 *",
            "real_rows = (image * 4 *",
        ),
        Mutation(
            "the bound below the count of a full grid",
            "    at_most: p * (side // patch) ** 2 + (p - 1) * (side // patch)\n",
            "    at_most: p * (side // patch) ** 2\n",
        ),
        Mutation(
            "the grid's lines read column-major",
            "    - padded = tiles.permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)\n",
            "    - padded = tiles.permute(4, 1, 3, 0, 2).flatten(1, 2).flatten(2, 3)\n",
        ),
        Mutation(
            "no newline after each line",
            "    - lines = torch.cat([unpadded, newline.to(unpadded.dtype)], dim=-1)"
            ".flatten(1, 2).transpose(0, 1)\n",
            "    - lines = torch.cat([unpadded, unpadded[:, :, :1]], dim=-1)"
            ".flatten(1, 2).transpose(0, 1)\n",
        ),
    ),
)

# ---------------------------------------------------------------------------
# Mistral3: the HF Pixtral tower over per-image tensors, the projector's
# patch merger; the rotary table of Transformers 5.17 on (axial ids) and
# before (flat ids)
# ---------------------------------------------------------------------------

MISTRAL3 = OracleCases(
    forms={"axial": {"axial": True}, "flat": {"axial": False}},
    refused=NO_MAX_SEQLEN,
    spec_mutations=(
        Mutation(
            "output tokens without the merge",
            "  output_tokens: (h // patch // merge) * (w // patch // merge)\n",
            "  output_tokens: (h // patch) * (w // patch) // merge\n",
        ),
        Mutation(
            "the merge group's patches in transposed order",
            "(kernel // merge)[None, :] * width[:, None] + (kernel % merge)[None, :]",
            "(kernel % merge)[None, :] * width[:, None] + (kernel // merge)[None, :]",
        ),
        Mutation(
            "the group's channels not interleaved as the unfold lays them out",
            "normed[merge_rows].transpose(1, 2).flatten(1)",
            "normed[merge_rows].flatten(1)",
        ),
        Mutation(
            "the rotary ids swapped (column, row)",
            "torch.stack([row, column], dim=-1)",
            "torch.stack([column, row], dim=-1)",
        ),
        Mutation(
            "the flat rotary ids over the batch's widest image",
            "positions[:, 0] * grid_side + positions[:, 1]",
            "positions[:, 0] * (positions[:, 1].max() + 1) + positions[:, 1]",
            forms=("flat",),
        ),
        Mutation(
            "the patches gathered from the wrong image slot",
            "  - patch_image = image.to(device)\n",
            "  - patch_image = image.flip(0).to(device)\n",
        ),
        Mutation(
            "a patch's pixels read column by column",
            "patch_column].flatten(1)",
            "patch_column].transpose(2, 3).flatten(1)",
        ),
        Mutation(
            "the input normalisation skipped",
            "  - embeds = normed_pixels.matmul(",
            "  - embeds = (pixels + 0 * normed_pixels).matmul(",
        ),
        Mutation(
            "ln_pre skipped",
            "  - hidden = vision_tower.ln_pre(embeds.unsqueeze(0))\n",
            "  - hidden = embeds.unsqueeze(0)"
            " + 0 * vision_tower.ln_pre(embeds.unsqueeze(0))\n",
        ),
        Mutation(
            "the projector's norm skipped",
            "  - normed = multi_modal_projector.norm(features[0])\n",
            "  - normed = features[0] + 0 * multi_modal_projector.norm(features[0])\n",
        ),
        Mutation(
            "the transformer bypassed",
            "  - features = vision_tower.transformer(",
            "  - features = hidden + 0 * vision_tower.transformer(",
        ),
        Mutation(
            "the activation skipped",
            "  - activated = multi_modal_projector.act(projected)\n",
            "  - activated = projected + 0 * multi_modal_projector.act(projected)\n",
        ),
    ),
    module_edits=(
        Mutation(
            "the first two images merged into one sequence",
            "torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(\n"
            "            device=pixel_values.device",
            "torch.cat([counts.new_zeros(1), counts.cumsum(0)[1:]]).to(\n"
            "            device=pixel_values.device",
        ),
        # The static checks refuse a capture value below the longest image.
        Mutation(
            "max_seqlen captured for one merged token per image",
            "max(token_budget * merge**2, int(max_seqlen))",
            "merge**2",
        ),
    ),
)

# ---------------------------------------------------------------------------
# PaddleOCR-VL: a SigLIP tower whose metadata is built image by image, the
# projector's 2 x 2 merge per image (three fake encoder layers)
# ---------------------------------------------------------------------------

_PADDLE_LAYER_CALL = (
    "      - hidden = layer(hidden, cu_seqlens=cu_seqlens, "
    "rotary_pos_emb=rotary_pos_emb, max_seqlen=max_seqlen)\n"
)

PADDLEOCR_VL = OracleCases(
    refused=NO_MAX_SEQLEN,
    spec_mutations=(
        Mutation(
            "RoPE ids numbered over the image, not frame by frame",
            "      - position = torch.arange(t * h * w, device=device) % (h * w)\n",
            "      - position = torch.arange(t * h * w, device=device)\n",
        ),
        Mutation(
            "the position table resized to w x h",
            ".position_embedding.weight, h, w, True)",
            ".position_embedding.weight, w, h, True)",
        ),
        Mutation(
            "the position table once per image, not once per frame",
            "[:h * w].repeat(t, 1)",
            "[:h * w].repeat(1, 1)",
        ),
        Mutation(
            "RoPE ids (column, row) instead of (row, column)",
            "torch.stack([position // w, position % w], dim=-1)",
            "torch.stack([position % w, position // w], dim=-1)",
        ),
        Mutation(
            "merge windows read as runs of four patches in a row",
            ".reshape(t, h // 2, 2, w // 2, 2).permute(0, 1, 3, 2, 4).flatten()",
            ".flatten()",
        ),
        Mutation(
            "every image's patches indexed from the batch's first",
            "  - merged = normed[merge_rows + merge_starts]",
            "  - merged = normed[merge_rows + 0 * merge_starts]",
        ),
        Mutation(
            "every layer run twice",
            _PADDLE_LAYER_CALL,
            _PADDLE_LAYER_CALL + _PADDLE_LAYER_CALL,
        ),
        Mutation(
            "the post-layernorm skipped",
            "mlp_AR.pre_norm(visual.vision_model.post_layernorm(hidden).squeeze(0))",
            "mlp_AR.pre_norm(hidden.squeeze(0))",
        ),
    ),
    module_edits=(
        Mutation(
            "the last layer left out",
            "for layer in self.visual.vision_model.encoder.layers:",
            "for layer in self.visual.vision_model.encoder.layers[:-1]:",
        ),
        Mutation(
            "the layers skipped",
            "for layer in self.visual.vision_model.encoder.layers:",
            "for layer in self.visual.vision_model.encoder.layers[:0]:",
        ),
        MERGED_FIRST_PAIR,
        # The static checks refuse a capture value below token_budget * 4.
        Mutation(
            "max_seqlen captured for one merged token per row",
            "max(token_budget * 4, int(max_seqlen))",
            "token_budget",
        ),
    ),
)

# ---------------------------------------------------------------------------
# PaliGemma: SigLIP over one fixed-size view per image, a linear projector
# ---------------------------------------------------------------------------

PALIGEMMA = OracleCases(
    spec_mutations=(
        Mutation(
            "a token too many per image",
            "  output_tokens: (side // patch) ** 2\n",
            "  output_tokens: (side // patch) ** 2 + 1\n",
        ),
        Mutation(
            "the graph reads the images in reverse",
            "_image_pixels_to_features(vision_tower, pixel_values)",
            "_image_pixels_to_features(vision_tower, pixel_values.flip(0))",
        ),
        Mutation(
            "the projector skipped in the graph",
            "  - multi_modal_projector(features).flatten(0, -2)\n",
            "  - (features + 0 * multi_modal_projector(features)).flatten(0, -2)\n",
        ),
        Mutation(
            "the tokens of an image flattened column by column",
            "  - multi_modal_projector(features).flatten(0, -2)\n",
            "  - multi_modal_projector(features).transpose(0, 1).flatten(0, -2)\n",
        ),
    ),
    module_edits=(
        # The static checks refuse a capture tensor with room for fewer
        # images than a budget holds.
        Mutation(
            "one image captured per budget",
            "(min(max_batch_size, token_budget // (side // patch) ** 2), 3, side, side)",
            "(1, 3, side, side)",
        ),
    ),
)

# ---------------------------------------------------------------------------
# Phi-3-Vision: CLIP crops, the HD transform with its 2 x 2 merge per image
# ---------------------------------------------------------------------------

PHI3V = OracleCases(
    spec_mutations=(
        Mutation(
            "crops gathered from the wrong slots",
            "      - crop_rows = (image * 17 + slot).to(device)\n",
            "      - crop_rows = (image * 16 + slot).to(device)\n",
        ),
        Mutation(
            "the 2 x 2 patches merged across rows",
            ".view(p, 12, 2, 12, 2, -1).permute(0, 1, 3, 2, 4, 5)",
            ".view(p, 2, 12, 2, 12, -1).permute(0, 2, 4, 1, 3, 5)",
        ),
        Mutation(
            "the sub-crops laid out column by column",
            ".reshape(gh, gw, 12, 12, -1).permute(0, 2, 1, 3, 4)",
            ".reshape(gw, gh, 12, 12, -1).permute(1, 2, 0, 3, 4)",
        ),
        Mutation(
            "the global view's lines without sub_GN",
            "    - glb = torch.cat([crops[0], line_end.expand(12, 1, -1)], dim=1)"
            ".flatten(0, 1)\n",
            "    - glb = torch.cat([crops[0], crops[0][:, :1]], dim=1).flatten(0, 1)\n",
        ),
        Mutation(
            "the global view taken from the last crop",
            "    - glb = torch.cat([crops[0],",
            "    - glb = torch.cat([crops[p - 1],",
        ),
    ),
)

# ---------------------------------------------------------------------------
# Phi-4-multimodal: SigLIP crops with patch masks, the HD transform per image
# (batches as lists and as padded tensors)
# ---------------------------------------------------------------------------

PHI4MM = OracleCases(
    spec_mutations=(
        Mutation(
            "the graph runs the crops without their masks",
            "get_img_features(pixels, masks.bool())",
            "get_img_features(pixels, torch.ones_like(masks).bool())",
        ),
        Mutation(
            "the masks gathered in another order than the crops",
            "  - masks = image_attention_mask.flatten(0, 1)[crop_rows]\n",
            "  - masks = image_attention_mask.flatten(0, 1)[crop_rows.flip(0)]\n",
        ),
        Mutation(
            "crops gathered from the wrong slots",
            "      - crop_rows = (image * 37 + slot).to(device)\n",
            "      - crop_rows = (image * 36 + slot).to(device)\n",
        ),
        Mutation(
            "the sub-crops laid out column by column",
            ".reshape(gh, gw, side, side, -1).permute(0, 2, 1, 3, 4)",
            ".reshape(gw, gh, side, side, -1).permute(1, 2, 0, 3, 4)",
        ),
        Mutation(
            "the useful height read along a row of the mask",
            "    - useful_h = int(grid_mask[:, 0].sum())\n",
            "    - useful_h = int(grid_mask[0, :].sum())\n",
        ),
        Mutation(
            "sub_GN where glb_GN goes",
            "torch.cat([sub, vision_encoder.glb_GN[0], glb])",
            "torch.cat([sub, vision_encoder.sub_GN[0, 0], glb])",
        ),
    ),
    module_edits=(
        Mutation(
            "the mask of the item at the selection's index, not its place",
            'batch_mm_kwargs["image_attention_mask"][\n                position\n',
            'batch_mm_kwargs["image_attention_mask"][\n                idx\n',
        ),
    ),
)

# ---------------------------------------------------------------------------
# Pixtral (Mistral format): per-image tensors, 2-D RoPE, packed varlen
# attention; Pixtral-12B's form and Mistral-Small-3.1's (a pre-projector norm
# and a 2 x 2 merger)
# ---------------------------------------------------------------------------

_MERGER = ("mistral-small-3.1",)

PIXTRAL = OracleCases(
    forms={"pixtral-12b": {"merger": False}, "mistral-small-3.1": {"merger": True}},
    refused=NO_MAX_SEQLEN,
    spec_mutations=(
        Mutation(
            "each image's patches gathered transposed",
            "pixels[patch_index[:, 0], :, patch_index[:, 1], :, patch_index[:, 2]]",
            "pixels[patch_index[:, 0], :, patch_index[:, 2], :, patch_index[:, 1]]",
        ),
        Mutation(
            "the RoPE rows of the transposed positions",
            "freqs_cis[patch_index[:, 1], patch_index[:, 2]]",
            "freqs_cis[patch_index[:, 2], patch_index[:, 1]]",
        ),
        Mutation(
            "the first two images merged into one sequence",
            "torch.cat([counts.new_zeros(1), counts.cumsum(0)])",
            "torch.cat([counts.new_zeros(1), counts.cumsum(0)[1:]])",
        ),
        Mutation(
            "each merge group's patches read column by column",
            "(kernel // merge)[None, :] * width[:, None] + (kernel % merge)[None, :]",
            "(kernel % merge)[None, :] * width[:, None] + (kernel // merge)[None, :]",
            forms=_MERGER,
        ),
        Mutation(
            "the merge groups laid out patch by patch, not channel by channel",
            "normed[merge_rows].transpose(1, 2).flatten(1)",
            "normed[merge_rows].flatten(1)",
            forms=_MERGER,
        ),
        Mutation(
            "the pre-projector norm skipped",
            "pre_mm_projector_norm(encoded) if",
            "encoded if",
            forms=_MERGER,
        ),
        Mutation(
            "output tokens without the merge",
            "  output_tokens: (h // (patch * merge)) * (w // (patch * merge))\n",
            "  output_tokens: (h // patch) * (w // patch) // merge\n",
            forms=_MERGER,
        ),
    ),
    module_edits=(
        # The static checks refuse a capture value below the longest image of
        # the budget, token_budget * merge**2.
        Mutation(
            "max_seqlen captured for one patch per token",
            "max(token_budget * merge**2, int(max_seqlen))",
            "token_budget",
            forms=_MERGER,
        ),
        Mutation(
            "the transformer's blocks skipped",
            "encoded = self.vision_encoder.transformer(\n            hidden,",
            "encoded = (lambda x, **_: x)(\n            hidden,",
        ),
    ),
)

# ---------------------------------------------------------------------------
# Qwen2.5-Omni's thinker: Qwen2.5-VL's windowed varlen tower, under
# FlashAttention and FlashInfer
# ---------------------------------------------------------------------------

QWEN2_5_OMNI = OracleCases(
    refused=("TORCH_SDPA",),
    spec_mutations=(
        Mutation(
            "output tokens without the merge",
            "  output_tokens: t * (h // merge) * (w // merge)\n",
            "  output_tokens: t * h * w // merge\n",
        ),
        Mutation(
            "the graph reads the rows in reverse",
            "  - visual(pixel_values, None, encoder_metadata=rest)\n",
            "  - visual(pixel_values.flip(0), None, encoder_metadata=rest)\n",
        ),
    ),
    module_edits=(
        Mutation(
            "max_seqlen captured for half the budget",
            "max_seqlen_override=token_budget * merge**2,",
            "max_seqlen_override=token_budget * merge**2 // 2,",
        ),
        Mutation(
            "cu_seqlens padded with zeros",
            "        dst[n:].copy_(src[n - 1 :].expand(dst.shape[0] - n))\n\n\n"
            "def _pad_flashinfer",
            "        dst[n:].zero_()\n\n\ndef _pad_flashinfer",
        ),
        Mutation(
            "the first two images merged into one sequence",
            '"cu_seqlens": metadata["cu_seqlens"],',
            '"cu_seqlens": torch.cat([metadata["cu_seqlens"][:1], '
            'metadata["cu_seqlens"][2:]]),',
        ),
    ),
)

# ---------------------------------------------------------------------------
# Qwen3-Omni's thinker: a varlen tower with learned position embeddings,
# 2-D RoPE and DeepStack mergers, its blocks in a loop (three fake blocks);
# a tower with the absolute position table and one without
# (apply_vit_abs_pos_embed off)
# ---------------------------------------------------------------------------

_QWEN3_BLOCK_CALL = (
    "      - hidden = block(hidden, cu_seqlens=cu_seqlens, "
    "rotary_pos_emb_cos=rotary_pos_emb_cos, rotary_pos_emb_sin=rotary_pos_emb_sin, "
    "max_seqlen=max_seqlen, sequence_lengths=None)\n"
)
_QWEN3_DEEPSTACK_MERGE = "merger(deepstack[level])"

QWEN3_OMNI = OracleCases(
    forms={"position table": {}, "no position table": {"positions": False}},
    refused=NO_MAX_SEQLEN,
    spec_mutations=(
        Mutation(
            "output tokens without the merge",
            "  output_tokens: t * (h // merge) * (w // merge)\n",
            "  output_tokens: t * h * w // merge\n",
        ),
        Mutation(
            "every block run twice",
            _QWEN3_BLOCK_CALL,
            _QWEN3_BLOCK_CALL + _QWEN3_BLOCK_CALL,
        ),
        Mutation(
            "the DeepStack mergers read the last hidden state",
            _QWEN3_DEEPSTACK_MERGE,
            "merger(hidden + 0 * deepstack[level])",
        ),
        Mutation(
            "the DeepStack levels in reverse",
            _QWEN3_DEEPSTACK_MERGE,
            "merger(deepstack[-1 - level])",
        ),
        Mutation(
            "the position embeddings in reverse",
            "dtype)) + pos_embeds)",
            "dtype)) + pos_embeds.flip(0))",
            forms=("position table",),
        ),
        Mutation(
            "the graph reads the rows in reverse",
            "visual.patch_embed(pixel_values.to(visual.dtype))",
            "visual.patch_embed(pixel_values.flip(0).to(visual.dtype))",
        ),
        Mutation(
            "the position table added whatever the flag",
            "if visual.apply_vit_abs_pos_embed else rotary_pos_emb_cos.new_zeros(",
            "if True else rotary_pos_emb_cos.new_zeros(",
            forms=("no position table",),
        ),
    ),
    module_edits=(
        Mutation(
            "the last block left out",
            "enumerate(self.visual.blocks)",
            "enumerate(self.visual.blocks[:-1])",
        ),
        Mutation(
            "each DeepStack tap one block late",
            "if layer in self.visual.deepstack_visual_indexes:",
            "if layer - 1 in self.visual.deepstack_visual_indexes:",
        ),
        MERGED_FIRST_PAIR,
        MAX_SEQLEN_ONE_TOKEN,
    ),
)

# ---------------------------------------------------------------------------
# Skywork-R1V: InternViT tiles (a CLS row first), InternVL's pixel shuffle
# ---------------------------------------------------------------------------

SKYWORKR1V = OracleCases(
    spec_mutations=(
        Mutation(
            "a token too many per tile",
            "  output_tokens: n * tokens\n",
            "  output_tokens: n * (tokens + 1)\n",
        ),
        Mutation(
            "the tile side doubled",
            "      shape: [units, 3, side, side]\n",
            "      shape: [units, 3, 2 * side, 2 * side]\n",
        ),
        Mutation(
            "the graph's rows in the wrong order",
            "  - extract_feature(pixel_values_flat).flatten(0, -2)\n\neager_forward:",
            "  - extract_feature(pixel_values_flat.flip(0)).flatten(0, -2)\n\n"
            "eager_forward:",
        ),
    ),
)

#: Every oracle's table, by the spec's stem (the stems of beyond_hosts.ORACLES).
CASES = {
    "cohere2_vision": COHERE2_VISION,
    "dots_ocr": DOTS_OCR,
    "eagle2_5_vl": EAGLE2_5_VL,
    "llava_next": LLAVA_NEXT,
    "mistral3": MISTRAL3,
    "paddleocr_vl": PADDLEOCR_VL,
    "paligemma": PALIGEMMA,
    "phi3v": PHI3V,
    "phi4mm": PHI4MM,
    "pixtral": PIXTRAL,
    "qwen2_5_omni": QWEN2_5_OMNI,
    "qwen3_omni": QWEN3_OMNI,
    "skyworkr1v": SKYWORKR1V,
}
