"""Writes the invalid-spec corpus ``data/invalid/*.yaml`` (a maintenance tool).

Each case is one of the project's specs with one small mutation (a few for
the cases that need them), so every file differs from a valid spec only where
the problem is. Run it after a spec changes enough that the corpus should
follow, then regenerate the ``.expected`` files and review them::

    python tests/codegen/data/make_invalid_corpus.py
    GEN_MIXIN_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_gen_invalid_specs.py

A mutation whose text no longer occurs in its spec stops the script: adapt it.
Files of cases no longer listed here are removed (with their ``.expected``),
except the ``.expected`` of known issues, which are written by hand.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
OUT = HERE / "invalid"

cases: dict[str, str] = {}


def _spec(stem: str) -> str:
    return (REPO / "specs" / f"{stem}.yaml").read_text(encoding="utf-8")


def _header(stem: str, name: str) -> str:
    return (
        f"# Invalid-spec corpus case {name!r}: specs/{stem}.yaml with a mutation\n"
        "# (written by tests/codegen/data/make_invalid_corpus.py).\n"
    )


def case(name: str, stem: str, *pairs: tuple[str, str]) -> None:
    """``specs/<stem>.yaml`` with each ``old`` (occurring once) replaced."""
    text = _spec(stem)
    for old, new in pairs:
        if text.count(old) != 1:
            sys.exit(
                f"{name}: {old!r} occurs {text.count(old)} times in specs/{stem}.yaml"
            )
        text = text.replace(old, new)
    cases[name] = _header(stem, name) + text


def valid_case(name: str, stem: str, *pairs: tuple[str, str]) -> None:
    """``data/valid/<stem>.yaml`` with each ``old`` (occurring once) replaced."""
    text = (HERE / "valid" / f"{stem}.yaml").read_text(encoding="utf-8")
    for old, new in pairs:
        if text.count(old) != 1:
            sys.exit(f"{name}: {old!r} occurs {text.count(old)} times in {stem}")
        text = text.replace(old, new)
    cases[name] = (
        f"# Invalid-spec corpus case {name!r}: data/valid/{stem}.yaml with a mutation\n"
        "# (written by tests/codegen/data/make_invalid_corpus.py).\n" + text
    )


def regex(name: str, stem: str, pattern: str, replacement: str) -> None:
    text, n = re.subn(pattern, replacement, _spec(stem), count=1)
    if n != 1:
        sys.exit(f"{name}: {pattern!r} does not match specs/{stem}.yaml")
    cases[name] = _header(stem, name) + text


def raw(name: str, text: str) -> None:
    cases[name] = text


# -- YAML level ----------------------------------------------------------------
case("yaml_malformed_flow", "minimax_m3", ("modalities: [image]", "modalities: [image"))
case(
    "yaml_bad_indent",
    "minimax_m3",
    (
        "  multimodal_config: MultiModalConfig | None",
        "   multimodal_config: MultiModalConfig | None",
    ),
)
case(
    "yaml_duplicate_top_key",
    "minimax_m3",
    ("budget:\n  min: 64\n", "budget:\n  min: 64\nname: MiniMax M3 again\n"),
)
case(
    "yaml_duplicate_buffer",
    "deepseek_v41",
    ("  merge_mask: {", "  vit_cos: {}\n  merge_mask: {"),
)
case(
    "yaml_anchor_alias",
    "minimax_m3",
    ("  rotary_sin: {rows_dim: 1,", "  rotary_sin: &plane {rows_dim: 1,"),
    ("  cu_seqlens: {pad", "  rotary_tan: *plane\n  cu_seqlens: {pad"),
)
case(
    "yaml_merge_key",
    "minimax_m3",
    ("  rotary_sin: {rows_dim: 1,", "  rotary_sin: {<<: {rows_dim: 1},"),
)
case(
    "yaml_python_tag",
    "minimax_m3",
    (
        "out_hidden_size: vision_tower.out_hidden_size",
        "out_hidden_size: !!python/name:os.system",
    ),
)
case(
    "yaml_two_documents",
    "minimax_m3",
    ("budget:\n  min: 64\n", "budget:\n  min: 64\n---\nformat: 1\n"),
)
raw("yaml_not_a_mapping", "- format: 1\n- name: x\n")
raw("yaml_empty", "# nothing but a comment\n")
case("yaml_bool_tag_bad_value", "minimax_m3", ("format: 1", "format: !!bool maybe"))
case("yaml_int_tag_bad_value", "minimax_m3", ("format: 1", "format: !!int one"))

# -- structure -------------------------------------------------------------------
case("unknown_key_top_typo", "minimax_m3", ("\nbuffers:\n", "\nbufers:\n"))
case(
    "unknown_key_nested_typo",
    "minimax_m3",
    ("      dtype: vision_tower.dtype\n", "      dtpye: vision_tower.dtype\n"),
)
case(
    "unknown_key_no_close_match",
    "minimax_m3",
    ("budget:\n  min: 64\n", "budget:\n  min: 64\n  zzz_qqq: 1\n"),
)
case("wrong_type_format_string", "minimax_m3", ("format: 1", 'format: "1"'))
case(
    "wrong_type_modalities_scalar",
    "minimax_m3",
    ("modalities: [image]", "modalities: image"),
)
case(
    "wrong_type_accepts_list_int",
    "minimax_m3",
    ("accepts_list: true", "accepts_list: 1"),
)
case(
    "wrong_type_rows_dim_negative",
    "minimax_m3",
    ("rotary_sin: {rows_dim: 1,", "rotary_sin: {rows_dim: -1,"),
)
case(
    "wrong_type_graph_forward_mapping",
    "minimax_m3",
    (
        "graph_forward:\n  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "graph_forward:\n  out: vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
    ),
)
case(
    "wrong_type_float_formula",
    "minimax_m3",
    ("budget:\n  min: 64", "budget:\n  min: 64.5"),
)
case("bad_enum_pad", "minimax_m3", ("pad: trailing_sequence", "pad: zero"))
case(
    "bad_enum_backend",
    "minimax_m3",
    ("allow: [FLASH_ATTN, ROCM_AITER_FA]", "allow: [FLASH_ATTN, FLASH_ATTENTION]"),
)
case(
    "bad_enum_kind",
    "minimax_m3",
    (
        "image_grid_thw: {kind: grid, dims: [t, h, w]}",
        "image_grid_thw: {kind: grids, dims: [t, h, w]}",
    ),
)
case(
    "missing_required_capture",
    "minimax_m3",
    (
        "capture:\n  dummy:\n    image_grid_thw: [1, merge, k * merge]\n",
        "captures:\n  dummy:\n    image_grid_thw: [1, merge, k * merge]\n",
    ),
)
regex(
    "empty_buffers", "minimax_m3", r"\nbuffers:\n(  .*\n|    .*\n)+", "\nbuffers: {}\n"
)

# -- identifiers and names -----------------------------------------------------------
case(
    "bad_identifier_class_name",
    "minimax_m3",
    ("class_name: MiniMaxM3EncoderCudaGraphMixin", "class_name: 3DMixin"),
)
case(
    "bad_class_name_not_camel",
    "minimax_m3",
    ("class_name: MiniMaxM3EncoderCudaGraphMixin", "class_name: minimax_mixin"),
)
case(
    "bad_identifier_input_key",
    "minimax_m3",
    ("  pixel_values: {kind: flat", "  pixel-values: {kind: flat"),
)
case(
    "reserved_name_input",
    "minimax_m3",
    (
        "image_grid_thw: {kind: grid, dims: [t, h, w]}",
        "image_grid_thw: {kind: grid, dims: [t, rows, w]}",
    ),
)
case(
    "builtin_shadow_constant",
    "minimax_m3",
    (
        "  merge: {from: vision_tower.spatial_merge_size, default: 2}",
        "  merge: {from: vision_tower.spatial_merge_size, default: 2}\n  len: {from: vision_tower.spatial_merge_size, default: 2}",
    ),
)
case(
    "constant_clashes_host",
    "minimax_m3",
    (
        "  merge: {from: vision_tower.spatial_merge_size, default: 2}",
        "  merge: {from: vision_tower.spatial_merge_size, default: 2}\n  vision_tower: {from: vision_tower.spatial_merge_size, default: 2}",
    ),
)
case(
    "host_type_object",
    "kimi_k3",
    ("  config: Any\n", "  config: object\n"),
)
case(
    "host_unknown_type",
    "minimax_m3",
    ("  vision_tower: MiniMaxVLVisionModel", "  vision_tower: MiniMaxVLVisionModle"),
)
case(
    "docstring_triple_quote",
    "minimax_m3",
    ("  ``self.vision_tower``. Images only", '  ``self.vision_tower``. """Images only'),
)

# -- formulas -----------------------------------------------------------------------
case(
    "formula_unknown_name",
    "minimax_m3",
    (
        "output_tokens: t * h * w // (merge * merge)",
        "output_tokens: t * h * w // (merg * merge)",
    ),
)
case(
    "formula_true_division",
    "minimax_m3",
    (
        "output_tokens: t * h * w // (merge * merge)",
        "output_tokens: t * h * w / (merge * merge)",
    ),
)
case(
    "formula_lambda",
    "minimax_m3",
    ("  input_size: t * h * w", '  input_size: "lambda: t"'),
)
case(
    "formula_private_attribute",
    "minimax_m3",
    (
        "out_hidden_size: vision_tower.out_hidden_size",
        "out_hidden_size: vision_tower._out_hidden_size",
    ),
)
case(
    "formula_dunder_import_call",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - __import__('os').system('echo pwned')",
    ),
)
case(
    "formula_string_literal",
    "minimax_m3",
    (
        "prepare_encoder_metadata(image_grid_thw, device=device)",
        "prepare_encoder_metadata(image_grid_thw, device='cuda')",
    ),
)
# -- the step language ------------------------------------------------------------
case(
    "step_private_method",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)._rows()",
    ),
)
case(
    "step_torch_not_allowed",
    "minimax_m3",
    (
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
        "    - torch.load(vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw))",
    ),
)
case(
    "step_torch_dtype_called",
    "minimax_m3",
    (
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
        "    - torch.float32(vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw))",
    ),
)
case(
    "step_host_sync_in_graph",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - out = vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)\n"
        "  - out.cpu()",
    ),
)
case(
    "step_tensor_from_host_in_graph",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - vision_tower(pixel_values, grid_thw=torch.tensor([1, 2]), encoder_metadata=rest)",
    ),
)
case(
    "step_tuple_target_twice",
    "minimax_m3",
    (
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
        "    - out, out = vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)\n"
        "    - out",
    ),
)
case(
    "step_tuple_target_last",
    "minimax_m3",
    (
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
        "    - out, _ = vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
    ),
)
case(
    "step_only_discards",
    "minimax_m3",
    (
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
        "    - _, _ = vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)\n"
        "    - pixel_values",
    ),
)
case(
    "step_method_in_arithmetic",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t * h * w.bit_length()"),
)
case(
    "step_slice_in_arithmetic",
    "minimax_m3",
    ("  input_size: t * h * w", '  input_size: "t * h * w[1:]"'),
)
case(
    "step_chained_method_unknown_name",
    "minimax_m3",
    (
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw).view(-1, hiden)",
    ),
)
case(
    "host_method_private_undeclared",
    "minimax_m3",
    (
        "    - vision_tower(pixel_values=pixel_values, grid_thw=image_grid_thw)",
        "    - _process_image_input(pixel_values)",
    ),
)
case(
    "host_method_private_generated",
    "qwen2_vl",
    (
        "host_methods: [get_max_frames_per_video,",
        "host_methods: [get_max_frames_per_video, _counts,",
    ),
)
case(
    "host_method_dunder",
    "qwen2_vl",
    (
        "host_methods: [get_max_frames_per_video,",
        "host_methods: [get_max_frames_per_video, __init__,",
    ),
)
case(
    "formula_power_not_literal",
    "minimax_m3",
    (
        "shape: [rows, channels * frames * patch**2]",
        "shape: [rows, channels * frames * patch**merge]",
    ),
)
case(
    "formula_syntax_error",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t * h *"),
)
case(
    "formula_call_in_arithmetic",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: len(t) * h * w"),
)
case(
    "formula_min_one_argument",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: max(t) * h * w"),
)
case(
    "formula_dunder_import",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - __import__('os')",
    ),
)
case(
    "formula_dunder_attribute",
    "minimax_m3",
    (
        "out_hidden_size: vision_tower.out_hidden_size",
        "out_hidden_size: vision_tower.__class__",
    ),
)
case(
    "formula_negative_subscript",
    "deepseek_v41",
    (
        "from: vision.blocks[0].attn.attn.attn_backend",
        "from: vision.blocks[-1].attn.attn.attn_backend",
    ),
)
case(
    "formula_power_too_large",
    "minimax_m3",
    (
        "shape: [rows, channels * frames * patch**2]",
        "shape: [rows, channels * frames * patch**9]",
    ),
)
case(
    "formula_true_in_arithmetic",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t * h * w * True"),
)
case(
    "formula_chained_comparison",
    "minimax_m3",
    ("  input_size: t * h * w", '  input_size: "t * h * w if 1 < t < 4 else h"'),
)
case(
    "formula_subscript_not_host",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t[0] * h * w"),
)
case(
    "formula_kwargs_splat",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - vision_tower(pixel_values, **rest)",
    ),
)
case(
    "formula_unknown_host_root",
    "deepseek_v41",
    (
        "from: vision.blocks[0].attn.attn.attn_backend",
        "from: visoin.blocks[0].attn.attn.attn_backend",
    ),
)
case(
    "formula_unknown_callable",
    "deepseek_v41",
    (
        "  - call: build_packed_merge_metadata(vit_grid, r, device=device, dtype=dtype)",
        "  - call: build_packed_merge_metadata2(vit_grid, r, device=device, dtype=dtype)",
    ),
)
case(
    "formula_ceil_div_arity",
    "deepseek_v41",
    (
        "graph_rows: ceil_div(h, r) * ceil_div(w, r)",
        "graph_rows: ceil_div(h) * ceil_div(w, r)",
    ),
)
case(
    "formula_non_ascii",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t * h * w × 2"),
)

# -- cross-field ------------------------------------------------------------------------
case(
    "provides_undeclared_buffer",
    "minimax_m3",
    (
        "provides: [rotary_cos, rotary_sin, cu_seqlens, max_seqlen]",
        "provides: [rotary_cos, rotary_sin, rotary_tan, cu_seqlens, max_seqlen]",
    ),
)
case(
    "capture_tensor_not_a_buffer",
    "deepseek_v41",
    ("buffers:\n  patches: {}\n", "buffers:\n"),
)
case(
    "buffer_without_source",
    "minimax_m3",
    (
        "  max_seqlen: {host_scalar: true, replay: drop, set_by: max_seqlen_override}\n",
        "  max_seqlen: {host_scalar: true, replay: drop, set_by: max_seqlen_override}\n  seq_lens: {}\n",
    ),
)
case(
    "buffer_two_sources",
    "minimax_m3",
    (
        "provides: [rotary_cos, rotary_sin, cu_seqlens, max_seqlen]",
        "provides: [pixel_values, rotary_cos, rotary_sin, cu_seqlens, max_seqlen]",
    ),
)
case(
    "buffer_never_read",
    "deepseek_v41",
    (
        "  - aligner.forward_packed(vit_out, merge_idx, merge_mask)",
        "  - aligner.forward_packed(vit_out, merge_idx)",
    ),
)
case(
    "dummy_cannot_cover_budget",
    "minimax_m3",
    ("image_grid_thw: [1, merge, k * merge]", "image_grid_thw: [1, merge, k]"),
)
case(
    "dummy_wrong_dim_count",
    "minimax_m3",
    ("image_grid_thw: [1, merge, k * merge]", "image_grid_thw: [merge, k * merge]"),
)
case(
    "dummy_missing_for_grid",
    "deepseek_v41",
    ('    llm_grid: [1, "ceil_div(k, r)"]\n', ""),
)
# Declared graph-row capacity (DeepSeek-V4.1: budgets count patches).
case(
    "graph_rows_below_dummy",
    "deepseek_v41",
    (
        "  graph_rows: ceil_div(token_budget, r) + max_batch_size\n",
        "  graph_rows: ceil_div(token_budget, r * r) + max_batch_size\n",
    ),
)
# Enough for the dummy's strips, not for two images of one row each.
case(
    "graph_rows_below_batch_rows",
    "deepseek_v41",
    (
        "  graph_rows: ceil_div(token_budget, r) + max_batch_size\n",
        "  graph_rows: ceil_div(token_budget, r)\n",
    ),
)
case(
    "graph_rows_why_without_graph_rows",
    "deepseek_v41",
    ("  graph_rows: ceil_div(token_budget, r) + max_batch_size\n", ""),
)
case(
    "graph_rows_without_budget_tokens",
    "deepseek_v41",
    ("  budget_tokens: h * w\n", ""),
)
case(
    "graph_rows_without_allocated_buffers",
    "deepseek_v41",
    ("    allocate: true\n", ""),
    (
        '  merge_mask: {shape: ["ceil_div(token_budget, r) + max_batch_size", r * r, 1], '
        "dtype: dtype, allocate: true}",
        '  merge_mask: {shape: ["ceil_div(token_budget, r) + max_batch_size", r * r, 1], '
        "dtype: dtype}",
    ),
)
case(
    "allocated_buffer_too_small",
    "deepseek_v41",
    (
        '    shape: ["ceil_div(token_budget, r) + max_batch_size", r * r]\n',
        '    shape: ["ceil_div(token_budget, r * r) + max_batch_size", r * r]\n',
    ),
)
case(
    "allocated_buffer_without_shape",
    "deepseek_v41",
    (
        '  merge_mask: {shape: ["ceil_div(token_budget, r) + max_batch_size", r * r, 1], '
        "dtype: dtype, allocate: true}",
        "  merge_mask: {dtype: dtype, allocate: true}",
    ),
)
case(
    "item_more_graph_rows_than_budget_tokens",
    "deepseek_v41",
    ("  budget_tokens: h * w\n", "  budget_tokens: ceil_div(h, r)\n"),
)
case(
    "trailing_sequence_no_spare_slot",
    "minimax_m3",
    (
        "cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 2}",
        "cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 1}",
    ),
)
case(
    "trailing_sequence_without_slots",
    "minimax_m3",
    (
        "cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 2}",
        "cu_seqlens: {pad: trailing_sequence}",
    ),
)
case(
    "slots_without_pad",
    "minimax_m3",
    (
        "cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 2}",
        "cu_seqlens: {slots: max_batch_size + 2}",
    ),
)
case(
    "replay_without_host_scalar",
    "minimax_m3",
    (
        "max_seqlen: {host_scalar: true, replay: drop, set_by: max_seqlen_override}",
        "max_seqlen: {replay: drop}",
    ),
)
case(
    "pad_with_rows_dim",
    "minimax_m3",
    (
        "cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 2}",
        "cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 2, rows_dim: 1}",
    ),
)
case(
    "per_item_without_empty_width",
    "deepseek_v41",
    ("  empty_width: config.hidden_size\n", ""),
)
case("empty_width_without_per_item", "deepseek_v41", ("  per_item: true\n", ""))
case(
    "guard_needs_multimodal_config",
    "minimax_m3",
    ("  multimodal_config: MultiModalConfig | None\n", ""),
)
case(
    "backend_guard_allow_and_deny",
    "minimax_m3",
    (
        "    allow: [FLASH_ATTN, ROCM_AITER_FA]\n",
        "    allow: [FLASH_ATTN, ROCM_AITER_FA]\n    deny: [TORCH_SDPA]\n",
    ),
)
case(
    "graph_forward_last_step_assigns",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - out = vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
    ),
)
case(
    "graph_forward_unknown_buffer",
    "deepseek_v41",
    (
        "  - aligner.forward_packed(vit_out, merge_idx, merge_mask)",
        "  - aligner.forward_packed(vit_out, merge_idx, merge_mask, merge_scale)",
    ),
)
case(
    "span_types_not_flat",
    "deepseek_v41",
    ("    types: types\n", "    types: llm_grid\n"),
)
case(
    "span_without_graph_rows",
    "deepseek_v41",
    ("  graph_rows: ceil_div(h, r) * ceil_div(w, r)\n", ""),
)
case(
    "graph_rows_without_postprocess",
    "deepseek_v41",
    (
        "postprocess:\n  span_assembly:\n    types: types\n    content: IMAGE\n    delimiters:\n      IMAGE_START: image_start\n      IMAGE_NEW_LINE: image_newline\n      IMAGE_END: image_end\n",
        "",
    ),
)
case(
    "max_frames_without_video",
    "minimax_m3",
    ("modalities: [image]", "modalities: [image]\nmax_frames_per_video: 4"),
)
case(
    "modalities_repeat",
    "minimax_m3",
    ("modalities: [image]", "modalities: [image, image]"),
)
case(
    "metadata_kwarg_passed_twice",
    "minimax_m3",
    (
        "capture_kwargs: {max_seqlen_override: rows}",
        "capture_kwargs: {max_seqlen_override: rows, device: device}",
    ),
)
case(
    "capture_dtype_not_path",
    "minimax_m3",
    ("      dtype: vision_tower.dtype\n", "      dtype: 16\n"),
)

case(
    "capture_tensor_too_few_rows",
    "minimax_m3",
    (
        "shape: [rows, channels * frames * patch**2]",
        "shape: [max_batch_size * k, channels * frames * patch**2]",
    ),
)
case(
    "set_by_bound_too_small",
    "minimax_m3",
    (
        "capture_kwargs: {max_seqlen_override: rows}",
        "capture_kwargs: {max_seqlen_override: k}",
    ),
)
case(
    "set_by_without_host_scalar",
    "minimax_m3",
    (
        "  cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 2}",
        "  cu_seqlens: {pad: trailing_sequence, slots: max_batch_size + 2, set_by: max_seqlen_override}",
    ),
)
regex("sizes_negative", "minimax_m3", r"\n  half_rot_dim: \d+", "\n  half_rot_dim: -30")
# DeepSeek-V4.1's cu_seqlens closed by one padding sequence, as it was before
# GPU run I (the spec repeats the last offset now).
DEEPSEEK_TRAILING = (
    "    pad: repeat_last\n    slots: max_batch_size + 1\n",
    "    pad: trailing_sequence\n    slots: max_batch_size + 2\n",
)
case(
    "two_trailing_sequences",
    "deepseek_v41",
    DEEPSEEK_TRAILING,
    (
        "  max_seqlen: {host_scalar: true, replay: drop, set_by: max_seqlen_override}\n",
        "  merge_cu: {pad: trailing_sequence, slots: max_batch_size + 2}\n  max_seqlen: {host_scalar: true, replay: drop, set_by: max_seqlen_override}\n",
    ),
    (
        "provides: [merge_idx, merge_mask]",
        "provides: [merge_idx, merge_mask, merge_cu]",
    ),
    (
        "  - aligner.forward_packed(vit_out, merge_idx, merge_mask)",
        "  - aligner.forward_packed(vit_out, merge_idx, merge_mask, merge_cu)",
    ),
)
case(
    "delimiter_not_imported",
    "deepseek_v41",
    (
        "      IMAGE_END: image_end\n",
        "      IMAGE_END: image_end\n      IMAGE_PAD: image_end\n",
    ),
)
case(
    "delimiter_param_not_host",
    "deepseek_v41",
    ("      IMAGE_END: image_end\n", "      IMAGE_END: image_ending\n"),
)
case("base_bad_enum", "deepseek_v41", ("base: none", "base: mixin"))
case(
    "host_type_private_attribute",
    "deepseek_v41",
    ("  image_start: torch.nn.Parameter", "  image_start: torch.nn._Parameter"),
)
case(
    "key_with_newline",
    "minimax_m3",
    ("budget:\n  min: 64\n", 'budget:\n  min: 64\n  "mi\\nn": 1\n'),
)
case(
    "yaml_alias_into_valid_spec",
    "minimax_m3",
    ("name: MiniMax M3", "name: &display MiniMax M3"),
    ("budget:\n  min: 64\n", "budget:\n  min: 64\n  why: *display\n"),
)
case(
    "graph_forward_rest_twice",
    "minimax_m3",
    (
        "  - vision_tower(pixel_values, grid_thw=None, encoder_metadata=rest)",
        "  - vision_tower(pixel_values, rest, encoder_metadata=rest)",
    ),
)
case(
    "eager_step_redefines_name",
    "deepseek_v41",
    (
        "    - aligner(vit_out, h, w)",
        "    - vit_out = aligner(vit_out, h, w)\n    - vit_out",
    ),
)

# -- step names the generated code uses itself ------------------------------------------
case(
    "step_target_reserved_inputs",
    "deepseek_v41",
    (
        "  - vit_out = vision.forward_packed(",
        "  - inputs = vision.forward_packed(",
    ),
    (
        "  - aligner.forward_packed(vit_out, merge_idx, merge_mask)",
        "  - aligner.forward_packed(inputs, merge_idx, merge_mask)",
    ),
)
case(
    "step_target_reserved_outputs",
    "deepseek_v41",
    ("    - vit_out = vision(patches, h, w)", "    - outputs = vision(patches, h, w)"),
    ("    - aligner(vit_out, h, w)", "    - aligner(outputs, h, w)"),
)
case(
    "step_target_builtin",
    "deepseek_v41",
    ("    - vit_out = vision(patches, h, w)", "    - open = vision(patches, h, w)"),
    ("    - aligner(vit_out, h, w)", "    - aligner(open, h, w)"),
)

case(
    "step_target_reserved_rest",
    "deepseek_v41",
    ("  - vit_out = vision.forward_packed(", "  - rest = vision.forward_packed("),
    (
        "  - aligner.forward_packed(vit_out, merge_idx, merge_mask)",
        "  - aligner.forward_packed(rest, merge_idx, merge_mask)",
    ),
)
case(
    "step_failed_target_still_named",
    "deepseek_v41",
    (
        "  - vit_out = vision.forward_packed(patches,",
        "  - vit_out = vision.forward_packed(patchez,",
    ),
)
case(
    "formula_bitwise_operator",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t * h | w"),
)
case(
    "formula_comparison_is",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t * h * (w is 1)"),
)
case(
    "formula_attribute_not_host",
    "minimax_m3",
    ("  input_size: t * h * w", "  input_size: t * h * w.size"),
)

case(
    "import_module_outside_target",
    "minimax_m3",
    (
        "standalone: reference_towers.minimax_vl",
        "standalone: eference_towers.minimax_vl",
    ),
)

# -- what the text helpers above cannot express ----------------------------------------
regex("docstring_empty", "minimax_m3", r"docstring: \|\n(  .*\n)+", 'docstring: ""\n')
regex("docstring_blank", "minimax_m3", r"docstring: \|\n(  .*\n)+", 'docstring: "  "\n')
case("name_empty", "minimax_m3", ("name: MiniMax M3", 'name: ""'))
case(
    "key_with_line_separator",
    "minimax_m3",
    ("budget:\n  min: 64\n", 'budget:\n  min: 64\n  "mi\\u2028n": 1\n'),
)
case(
    "key_with_tab",
    "minimax_m3",
    ("budget:\n  min: 64\n", 'budget:\n  min: 64\n  "w\\thy": 1\n'),
)
case(
    "yaml_recursive_alias",
    "minimax_m3",
    ("modalities: [image]", "modalities: &m [image, *m]"),
)
case(
    "yaml_alias_as_key",
    "minimax_m3",
    ("name: MiniMax M3", "name: &k why"),
    ("budget:\n  min: 64\n", "budget:\n  min: 64\n  *k : text\n"),
)
case("yaml_int_tag_empty", "minimax_m3", ("format: 1", "format: !!int ''"))
case(
    "yaml_control_character_late_line",
    "minimax_m3",
    ("budget:\n  min: 64\n", "budget:\n  min: 64\n  why: bell\x1b here\n"),
)
case(
    "yaml_control_character",
    "minimax_m3",
    ("name: MiniMax M3", 'name: "MiniMax\x07 M3"'),
)
case(
    "yaml_deep_nesting",
    "minimax_m3",
    ("budget:\n  min: 64\n", "budget:\n  min: " + "[" * 3000 + "]" * 3000 + "\n"),
)
# -- what used to generate wrong code (issue #13) ------------------------------------
# A per-item count written as a grid of one dim read each row as a list.
valid_case(
    "grid_one_dim",
    "tiles_count",
    ("{kind: count, dim: n}", "{kind: grid, dims: [n]}"),
)
# per_item_tokens: floor was parsed and ignored; GLM-4.1V's dummy (k per
# item, k rounded down) cannot hold a budget max_batch_size does not divide.
case(
    "floor_dummy_short_of_budget",
    "minimax_m3",
    ("capture:\n  dummy:", "capture:\n  per_item_tokens: floor\n  dummy:"),
)
# Malformed parts that crashed the typed model before its first release.
case(
    "delimiters_not_a_mapping",
    "deepseek_v41",
    (
        "    delimiters:\n      IMAGE_START: image_start\n      IMAGE_NEW_LINE: image_newline\n      IMAGE_END: image_end\n",
        "    delimiters: 1\n",
    ),
)
case(
    "tensor_shape_empty",
    "minimax_m3",
    ("shape: [rows, channels * frames * patch**2]", "shape: []"),
)
case(
    "grid_dim_not_a_name",
    "deepseek_v41",
    ("llm_grid: {kind: grid, dims: [lh, lw],", "llm_grid: {kind: grid, dims: [1, lw],"),
)
# -- encoder paths (paths:) -------------------------------------------------------
# A path's keys beside the top-level ones, and an empty path.
case(
    "paths_beside_top_level_keys",
    "minimax_m3",
    ("budget:\n  min: 64\n", "budget:\n  min: 64\npaths: {local: {}}\n"),
)
# -- capture intermediates and checks (MoonViT's RoPE grid) ----------------------
valid_case(
    "capture_let_uses_a_later_one",
    "rope_grid",
    (
        "    wo: min(k, rope_w // m)\n    ho: ceil_div(k, wo)\n",
        "    ho: ceil_div(k, wo)\n    wo: min(k, rope_w // m)\n",
    ),
)
valid_case(
    "capture_let_takes_a_dim",
    "rope_grid",
    ("    wo: min(k, rope_w // m)\n", "    wo: min(k, rope_w // m)\n    h: 2\n"),
)
valid_case(
    "capture_assert_not_a_comparison",
    "rope_grid",
    ("check: ho * m <= rope_h", "check: ho * m"),
)
valid_case(
    "capture_assert_two_comparisons",
    "rope_grid",
    ("check: ho * m <= rope_h", "check: ho * m <= rope_h and wo * m <= rope_w"),
)
valid_case(
    "capture_assert_chained",
    "rope_grid",
    ("check: ho * m <= rope_h", "check: 1 <= ho * m <= rope_h"),
)
valid_case(
    "capture_assert_without_message",
    "rope_grid",
    ("      message: the dummy grid is taller than the RoPE table\n", ""),
)
valid_case(
    "capture_assert_refuses_every_budget",
    "rope_grid",
    ("default: 24}", "default: 1}"),
)
# -- what a host scalar bounds ---------------------------------------------------
# vLLM's Kimi-VL captures max_seqlen = token_budget, in output tokens.
valid_case(
    "bounds_item_in_tokens",
    "rope_grid",
    (
        'max_seqlen_override: "max(token_budget * m * m, ho * m * wo * m)"',
        "max_seqlen_override: token_budget",
    ),
)
# Frames of one video are one sequence: t * h * w rows for h * w / 4 tokens.
valid_case(
    "bounds_item_misses_the_frames",
    "vision_chunks",
    (
        "  max_seqlen: {host_scalar: true, set_by: max_seqlen_override}",
        "  max_seqlen: {host_scalar: true, set_by: max_seqlen_override, bounds: item}",
    ),
    ("  eager_when: t != 1\n", ""),
    ("{max_seqlen_override: rows}", "{max_seqlen_override: token_budget * m * m}"),
)
valid_case(
    "bounds_without_set_by",
    "rope_grid",
    (
        "  max_seqlen: {host_scalar: true, set_by: max_seqlen_override, bounds: item}",
        "  max_seqlen: {host_scalar: true, bounds: item}",
    ),
)
case(
    "bounds_item_with_trailing_sequence",
    "deepseek_v41",
    DEEPSEEK_TRAILING,
    (
        "max_seqlen: {host_scalar: true, replay: drop, set_by: max_seqlen_override}",
        "max_seqlen: {host_scalar: true, replay: drop, set_by: max_seqlen_override, bounds: item}",
    ),
)
# `bounds: item` is the longest item, so no buffer may be named item.
case(
    "bounds_item_a_buffer_named_item",
    "kimi_vl",
    (
        "cu_seqlens, max_seqlen, merge_gather_idx]",
        "cu_seqlens, max_seqlen, item]",
    ),
    ("  merge_gather_idx: {}\n", "  item: {}\n"),
)
# -- vision chunks: one modality, eager multi-frame chunks, folded pixels -------
valid_case(
    "vision_chunk_with_image",
    "vision_chunks",
    ("modalities: [vision_chunk]", "modalities: [image, vision_chunk]"),
)
valid_case(
    "eager_when_not_a_comparison",
    "vision_chunks",
    ("eager_when: t != 1", "eager_when: t - 1"),
)
valid_case(
    "eager_when_takes_the_dummy",
    "vision_chunks",
    ("grid_thws: [1, m, k * m]", "grid_thws: [2, m, k * m]"),
)
valid_case(
    "fold_ranks_repeat",
    "vision_chunks",
    ("fold_ranks: [3, 5]", "fold_ranks: [5, 5]"),
)
valid_case(
    "fold_ranks_on_a_grid",
    "vision_chunks",
    (
        "grid_thws: {kind: grid, dims: [t, h, w]}",
        "grid_thws: {kind: grid, dims: [t, h, w], fold_ranks: [3]}",
    ),
)
# -- capture dtype with a fallback (first_of) ------------------------------------
FUSED_DTYPE = "dtype: {first_of: [visual.input_norm.input_dtype, dtype]}"
case(
    "capture_dtype_first_of_without_dtype",
    "qwen2_vl",
    (FUSED_DTYPE, "dtype: {first_of: [visual.input_norm.input_dtype]}"),
)
case(
    "capture_dtype_first_of_dtype_not_last",
    "qwen2_vl",
    (FUSED_DTYPE, "dtype: {first_of: [dtype, visual.input_norm.input_dtype, dtype]}"),
)
case(
    "capture_dtype_first_of_typo",
    "qwen2_vl",
    (FUSED_DTYPE, "dtype: {firstof: [visual.input_norm.input_dtype, dtype]}"),
)
case(
    "capture_dtype_first_of_not_a_path",
    "qwen2_vl",
    (FUSED_DTYPE, "dtype: {first_of: [merge * 2, dtype]}"),
)
case(
    "capture_dtype_first_of_a_named_dtype",
    "qwen2_vl",
    (FUSED_DTYPE, "dtype: {first_of: [uint8, dtype]}"),
)
# -- pad rules by backend, windows, bounds, optional buffers (Qwen2.5-VL) ---------
CU = """  cu_seqlens:
    pad: repeat_last
    pad_by_backend: {FLASHINFER: flashinfer_sections}
"""
case(
    "pad_by_backend_unknown_backend",
    "qwen2_5_vl",
    (CU, CU.replace("{FLASHINFER:", "{FLASH_INFER:")),
)
case(
    "pad_by_backend_not_sections",
    "qwen2_5_vl",
    (CU, CU.replace("{FLASHINFER: flashinfer_sections}", "{FLASHINFER: repeat_last}")),
)
case(
    "pad_by_backend_without_pad",
    "qwen2_5_vl",
    (CU, CU.replace("    pad: repeat_last\n", "")),
)
case(
    "pad_by_backend_denied_backend",
    "qwen2_5_vl",
    ("    deny: [TORCH_SDPA]\n", "    deny: [TORCH_SDPA, FLASHINFER]\n"),
)
regex(
    "pad_by_backend_without_guard",
    "qwen2_5_vl",
    r"guards:\n  attention_backend:\n(    .*\n|      .*\n)+\n",
    "",
)
case(
    "pad_flashinfer_sections_as_default",
    "qwen2_5_vl",
    (CU, CU.replace("    pad: repeat_last\n", "    pad: flashinfer_sections\n")),
)
case(
    "window_without_pad",
    "qwen2_5_vl",
    (
        "  rotary_pos_emb_cos: {shape: [rows, head_dim // 2], dtype: dtype}",
        "  rotary_pos_emb_cos: {shape: [rows, head_dim // 2], dtype: dtype, window: 4}",
    ),
)
case(
    "window_slots_too_few",
    "qwen2_5_vl",
    (
        '    slots: "min(token_budget, max(max_batch_size, max_frames_per_batch) + '
        'ceil_div(token_budget, window // merge // patch)) + 1"',
        "    slots: max(max_batch_size, max_frames_per_batch) + 1",
    ),
)
case(
    "window_scalar_too_small",
    "qwen2_5_vl",
    (
        "max_seqlen_window_override: (window // merge // patch)**2 * merge**2",
        "max_seqlen_window_override: (window // merge // patch) * merge**2",
    ),
)
case(
    "bounds_not_a_pad_buffer",
    "qwen2_5_vl",
    ("bounds: cu_seqlens}", "bounds: pixel_values}"),
)
case(
    "bounds_without_host_scalar",
    "qwen2_5_vl",
    (CU, CU + "    bounds: cu_window_seqlens\n"),
)
case(
    "bounds_missing_with_two_pad_buffers",
    "qwen2_5_vl",
    (", bounds: cu_seqlens}", "}"),
)
case(
    "set_by_below_one_item",
    "qwen2_vl",
    (
        "capture_kwargs: {max_seqlen_override: token_budget * merge**2}",
        "capture_kwargs: {max_seqlen_override: token_budget * merge}",
    ),
)
case(
    "optional_on_pad_buffer",
    "qwen2_5_vl",
    (CU, CU + "    optional: true\n"),
)
case(
    "optional_on_capture_tensor",
    "qwen2_5_vl",
    ("  pixel_values: {}\n", "  pixel_values: {optional: true}\n"),
)
# -- replay keyword arguments by modality ------------------------------------------
BY_MODALITY = "      image: {max_batch_size: max_batch_size}\n"
case(
    "replay_by_modality_unknown_modality",
    "qwen2_5_vl",
    (BY_MODALITY, BY_MODALITY.replace("image:", "audio:")),
)
case(
    "replay_by_modality_kwarg_twice",
    "qwen2_5_vl",
    (BY_MODALITY, "      image: {max_batch_size: max_batch_size, device: device}\n"),
)
case(
    "replay_by_modality_without_video",
    "minimax_m3",
    (
        "    capture_kwargs: {max_seqlen_override: rows}\n",
        "    capture_kwargs: {max_seqlen_override: rows}\n"
        "    replay_kwargs_by_modality: {image: {max_batch_size: max_batch_size}}\n",
    ),
)
# -- capture turned off by a host flag ---------------------------------------------
case(
    "capture_off_not_a_path",
    "qwen2_5_vl",
    ("  when: is_multimodal_pruning_enabled\n", "  when: 1\n"),
)
case(
    "capture_off_typo",
    "qwen2_5_vl",
    (
        "  when: is_multimodal_pruning_enabled\n",
        "  wehn: is_multimodal_pruning_enabled\n",
    ),
)
# Crop-less images have no local rows: the path must allow zero tokens.
valid_case(
    "path_zero_tokens_not_allowed",
    "two_paths",
    ("    allow_zero_tokens: true\n", ""),
)
# Every path may be left out: an item could have no rows at all.
valid_case(
    "path_every_path_allows_zero",
    "two_paths",
    (
        "    min_token_budget: global_tokens\n",
        "    min_token_budget: global_tokens\n    allow_zero_tokens: true\n",
    ),
)
# The concatenated rows of the paths are not the item's output tokens.
valid_case(
    "path_tokens_do_not_add_up",
    "two_paths",
    (
        "output_tokens: global_tokens + n * crop_tokens",
        "output_tokens: global_tokens + n * crop_tokens + 1",
    ),
)
# A path's forward sees its own buffers only.
valid_case(
    "path_reads_another_paths_buffer",
    "two_paths",
    (
        "      - vision.encode(crop_pixel_values)\n    eager_forward:",
        "      - vision.encode(crop_pixel_values, pixel_values)\n    eager_forward:",
    ),
)
# Buffer keys are shared by every path's padding logics.
valid_case(
    "path_buffer_key_twice",
    "two_paths",
    (
        "    buffers:\n      crop_pixel_values: {}\n",
        "    buffers:\n      crop_pixel_values: {}\n      pixel_values: {}\n",
    ),
    (
        "        crop_pixel_values: {shape: [rows, 3, side, side], dtype: dtype, fill: randn}\n",
        "        crop_pixel_values: {shape: [rows, 3, side, side], dtype: dtype, fill: randn}\n"
        "        pixel_values: {shape: [rows, 3, side, side], dtype: dtype}\n",
    ),
    (
        "      - vision.encode(crop_pixel_values)\n    eager_forward:",
        "      - vision.encode(crop_pixel_values, pixel_values)\n    eager_forward:",
    ),
)
# What budgets count is each path's output_tokens; a zero path budget.
valid_case(
    "path_budget_tokens_and_zero_budget",
    "two_paths",
    ("  input_size: 1 + n\n", "  input_size: 1 + n\n  budget_tokens: n\n"),
    ("    min_token_budget: crop_tokens\n", "    min_token_budget: crop_tokens - 4\n"),
)
# A misspelt path key, and a path without its rows per item.
valid_case(
    "path_unknown_key_and_no_tokens",
    "two_paths",
    ("    allow_zero_tokens: true\n", "    allow_zero: true\n"),
    ("    output_tokens: global_tokens\n", ""),
)
# The concatenation order names a path twice and leaves one out; a spec
# without paths has nothing to concatenate.
valid_case(
    "path_concatenate_order",
    "two_paths",
    ("  concatenate: [local, global]\n", "  concatenate: [local, local]\n"),
)
valid_case(
    "concatenate_without_paths",
    "flat_own_rows",
    (
        "out_hidden_size: vision.out_hidden_size\n",
        "out_hidden_size: vision.out_hidden_size\n\npostprocess:\n  concatenate: [default]\n",
    ),
)
# -- capture axes (capture_axes:) ----------------------------------------------------
# No key holds the largest grid an item can have: a batch would select a key
# that was never captured (Gemma 4's per-request max_soft_tokens).
valid_case(
    "axis_bound_not_covered",
    "capture_axes",
    ("    bound: [side, side]\n", "    bound: [side + 1, side]\n"),
)
# beyond_keys: eager sends the items no key covers to the eager forward: a
# bound is then meaningless (refused); without it the bound is required; and
# an unknown choice.
valid_case(
    "axis_beyond_eager_with_bound",
    "capture_axis_eager",
    ("    beyond_keys: eager\n", "    beyond_keys: eager\n    bound: [side, side]\n"),
)
valid_case(
    "axis_beyond_refuse_without_bound",
    "capture_axis_eager",
    ("    beyond_keys: eager\n", "    beyond_keys: refuse\n"),
)
valid_case(
    "axis_beyond_unknown",
    "capture_axis_eager",
    ("    beyond_keys: eager\n", "    beyond_keys: clamp\n"),
)
# Items made of units: beyond_keys: eager reads an item's need over its dims.
valid_case(
    "axis_beyond_per_unit",
    "unit_varlen",
    (
        "capture:\n  units:",
        "capture_axes:\n  - dims: [mw]\n    keys: [4]\n    covers: [n]\n"
        "    beyond_keys: eager\n\ncapture:\n  units:",
    ),
)
# A key of the wrong size, and a covers list short of a dim.
valid_case(
    "axis_key_and_covers_sizes",
    "capture_axes",
    ("keys: [[4, 4], [4, 8],", "keys: [[4, 4], [4],"),
    ("    covers: [h, w]\n", "    covers: [h]\n"),
)
# The same key twice; an axis dim that is already an item dim.
valid_case(
    "axis_key_twice_and_dim_clash",
    "capture_axes",
    ("keys: [[4, 4], [4, 8],", "keys: [[4, 4], [4, 4],"),
    ("  - dims: [th, tw]\n", "  - dims: [th, w]\n"),
)
# The forwards do not see the axis dims: a graph's buffers carry its key.
valid_case(
    "axis_dim_in_graph_forward",
    "capture_axes",
    ("  - vision(patches, patch_mask)\n", "  - vision(patches, patch_mask, th)\n"),
)
# vLLM 0.33.0's manager refuses capture axes with several paths.
valid_case(
    "axis_with_two_paths",
    "two_paths",
    (
        "budget:\n  min: global_tokens\n",
        "budget:\n  min: global_tokens\n\ncapture_axes:\n  - dims: [m]\n"
        "    keys: [4, 8]\n    covers: [n]\n    bound: [8]\n",
    ),
)
# -- unit captures ---------------------------------------------------------------
# Gemma 3's clamp: max_batch_size bounds items, and one item brings many tiles.
valid_case(
    "unit_capture_clamped_by_items",
    "unit_capture",
    (
        "units: max(token_budget // tokens_per_tile, 1)",
        'units: "min(token_budget // tokens_per_tile, max_batch_size)"',
    ),
)
valid_case(
    "unit_capture_tensor_short",
    "unit_capture",
    ("shape: [units, 3, side, side]", "shape: [units // 2, 3, side, side]"),
)
valid_case(
    "unit_capture_with_dummy",
    "unit_capture",
    ("capture:\n", "capture:\n  dummy: {num_tiles: [k]}\n  per_item_tokens: floor\n"),
)
valid_case(
    "unit_capture_sized_by_rows",
    "unit_capture",
    ("shape: [units, 3, side, side]", "shape: [rows, 3, side, side]"),
)
valid_case(
    "units_without_unit_capture",
    "unit_capture",
    (
        "  units: max(token_budget // tokens_per_tile, 1)\n",
        "  dummy: {num_tiles: [k]}\n",
    ),
)
valid_case(
    "unit_capture_builder_reads_grid",
    "unit_capture",
    ("host:\n", "host_methods: [vision_model.tile_index]\nhost:\n"),
    (
        "buffers:\n  pixel_values: {}\n",
        "metadata:\n  - call: vision_model.tile_index(num_tiles, device=device)\n"
        "    provides: [tile_index]\n"
        "buffers:\n  pixel_values: {}\n  tile_index: {shape: [units], dtype: int64}\n",
    ),
    (
        "graph_forward:\n  - vision_model(pixel_values)\n",
        "graph_forward:\n  - vision_model(pixel_values, tile_index)\n",
    ),
)
valid_case(
    "unit_capture_bad_formula",
    "unit_capture",
    (
        "units: max(token_budget // tokens_per_tile, 1)",
        "units: max(token_budget // tokens_per_tile, k)",
    ),
)
# -- builders that return their one buffer; capture dtypes by name ------------
valid_case(
    "builder_provides_and_returns",
    "unit_capture_mask",
    (
        "    returns: position_ids\n",
        "    returns: position_ids\n    provides: [position_ids]\n",
    ),
)
valid_case(
    "builder_returns_not_a_name",
    "unit_capture_mask",
    ("    returns: position_ids\n", "    returns: [position_ids]\n"),
)
valid_case(
    "builder_neither_provides_nor_returns",
    "unit_capture_mask",
    ("    returns: position_ids\n", ""),
)
valid_case(
    "builder_returns_an_undeclared_buffer",
    "unit_capture_mask",
    ("    returns: position_ids\n", "    returns: position_idx\n"),
)
valid_case(
    "capture_dtype_unknown_name",
    "unit_capture_mask",
    ("      dtype: bool\n", "      dtype: boolean\n"),
)
# -- constants from host methods -------------------------------------------------
valid_case(
    "constant_calls_an_undeclared_method",
    "unit_capture_ceil",
    ("{from: get_image_patches_per_chunk(),", "{from: get_patches_per_chunk(),"),
)
valid_case(
    "constant_calls_with_arguments",
    "unit_capture_ceil",
    ("{from: get_image_patches_per_chunk(),", "{from: get_image_patches_per_chunk(2),"),
)
# -- items made of units ---------------------------------------------------------
valid_case(
    "units_capture_short_of_the_tiles",
    "unit_items",
    ("  units: token_budget\n", "  units: token_budget // 2\n"),
)
valid_case(
    "units_patches_short",
    "unit_items",
    ("shape: [token_budget * f * f, width]", "shape: [token_budget * f, width]"),
)
valid_case(
    "unit_of_not_a_count",
    "unit_items",
    ("{kind: flat, unit_of: num_tiles}", "{kind: flat, unit_of: spatial_shapes}"),
)
valid_case(
    "unit_of_on_a_count",
    "unit_items",
    ("{kind: count, dim: n}", "{kind: count, dim: n, unit_of: num_tiles}"),
)
valid_case(
    "unit_grid_with_equals",
    "unit_items",
    (
        "{kind: grid, dims: [h, w], unit_of: num_tiles}",
        "{kind: grid, dims: [h, w], unit_of: num_tiles, equals: {h: w}}",
    ),
)
valid_case(
    "unit_dims_without_per_unit",
    "unit_items",
    ("  per_unit: true\n", ""),
)
valid_case(
    "per_unit_reads_the_count",
    "unit_items",
    ("  input_size: h * w\n", "  input_size: h * w * n\n"),
)
valid_case(
    "units_with_a_dummy_batch",
    "unit_items",
    (
        "  units: token_budget\n",
        "  dummy: {spatial_shapes: [f, f], num_tiles: [k]}\n",
    ),
    ("[units, 3, side, side]", "[rows, 3, side, side]"),
    ("[token_budget * f * f, width]", "[rows, width]"),
)
valid_case(
    "units_eager_per_item",
    "unit_items",
    (
        "  steps:\n    - tower(tiles, patches, spatial_shapes)\n",
        "  per_item: true\n  steps:\n    - tower(tiles, patches)\n"
        "  empty_width: tower.out_hidden_size\n",
    ),
)
# -- custom post-processing steps ----------------------------------------------------
case(
    "post_steps_beside_span_assembly",
    "deepseek_v41",
    (
        "postprocess:\n  span_assembly:",
        "postprocess:\n  steps: [path_output]\n  span_assembly:",
    ),
)
case(
    "post_per_item_without_steps",
    "deepseek_v41",
    (
        "postprocess:\n  span_assembly:",
        "postprocess:\n  per_item: true\n  span_assembly:",
    ),
)
valid_case(
    "post_steps_with_paths",
    "two_paths",
    ("  concatenate: [local, global]", "  steps: [path_output]"),
)
case(
    "post_steps_with_paths_read_item_output",
    "deepseek_ocr",
    ("torch.cat([local_part, global_rows,", "torch.cat([local_part, item_output,"),
)
case(
    "post_steps_path_rows_taken",
    "deepseek_ocr",
    ("    - lines = th * tile_side", "    - local_rows = th * tile_side"),
)
case(
    "constant_from_type_only_import",
    "deepseek_ocr",
    (
        "    standalone: reference_towers.deepseek_ocr\n  IMAGE_SIZE:",
        "    standalone: reference_towers.deepseek_ocr\n    type_only: true\n  IMAGE_SIZE:",
    ),
)
case(
    "constant_from_import_without_default",
    "deepseek_ocr",
    ("base: {from: BASE_SIZE, default: 1024}", "base: {from: BASE_SIZE}"),
)
case(
    "constant_short_form_import",
    "deepseek_ocr",
    ("base: {from: BASE_SIZE, default: 1024}", "base: BASE_SIZE"),
)
valid_case(
    "post_steps_graph_rows_per_item",
    "postprocess_per_item",
    ("item_output.view(t * h, w, -1)", "path_output[:graph_rows].view(t * h, w, -1)"),
)
valid_case(
    "post_steps_last_assigns",
    "postprocess_steps",
    (
        "    - projector(path_output[:graph_rows], grid)",
        "    - merged = projector(path_output[:graph_rows], grid)",
    ),
)
valid_case(
    "post_steps_read_a_flat_input",
    "postprocess_steps",
    ("torch.tensor(image_grid_thw)", "torch.tensor(pixel_values)"),
)
# -- per-item post-processing reads the inputs cut to the item, and int() ------------

_EAGER_MARKED = "    - visual(pixel_values)\n\npostprocess"
valid_case(
    "int_in_eager_steps",
    "postprocess_reads_inputs",
    (
        _EAGER_MARKED,
        "    - visual(pixel_values)[:int(pixel_values.sum())]\n\npostprocess",
    ),
)
valid_case(
    "int_in_graph_forward",
    "postprocess_reads_inputs",
    (
        "graph_forward:\n  - visual(pixel_values)",
        "graph_forward:\n  - visual(pixel_values)[:int(pixel_values.sum())]",
    ),
)
valid_case(
    "int_with_two_arguments",
    "postprocess_reads_inputs",
    ("int(crop_masks.sum())", "int(crop_masks.sum(), 2)"),
)
valid_case(
    "int_with_a_keyword",
    "postprocess_reads_inputs",
    ("int(crop_masks.sum())", "int(crop_masks.sum(), base=2)"),
)
valid_case(
    "int_of_a_forbidden_method",
    "postprocess_reads_inputs",
    ("int(crop_masks.sum())", "int(crop_masks.numpy())"),
)
valid_case(
    "post_steps_read_a_list_input",
    "list_units",
    (
        "    - tower.eager(slices, sizes)\n",
        "    - tower.eager(slices, sizes)\n\npostprocess:\n  per_item: true\n"
        "  steps:\n    - item_output[:1] if slices else item_output\n",
    ),
)
valid_case(
    "eager_steps_per_item_read_a_list_input",
    "list_units",
    (
        "eager_forward:\n  steps:\n    - tower.eager(slices, sizes)\n",
        "eager_forward:\n  per_item: true\n  empty_width: 4\n  steps:\n"
        "    - tower.eager(slices, sizes)\n",
    ),
)
valid_case(
    "post_steps_cut_input_clashes",
    "postprocess_reads_inputs",
    ("  crop_masks: {kind", "  output: {kind"),
    ("    crop_masks: [1]", "    output: [1]"),
    ("int(crop_masks.sum())", "int(output.sum())"),
)


NOT_UTF8 = {"not_utf8": ("minimax_m3", "name: MiniMax M3", "name: MiniMax M\xe9")}


# -- derived grids (inputs.<key>.equals) ----------------------------------------------

_EQUALS = '{lh: "ceil_div(h, r)", lw: "ceil_div(w, r)"}'
case(
    "equals_not_a_dim",
    "deepseek_v41",
    (_EQUALS, '{lx: "ceil_div(h, r)", lw: "ceil_div(w, r)"}'),
)
case(
    "equals_reads_its_own_dim",
    "deepseek_v41",
    (_EQUALS, '{lh: "ceil_div(h, r)", lw: "ceil_div(lw, r)"}'),
)
case(
    "equals_unknown_name",
    "deepseek_v41",
    (_EQUALS, '{lh: "ceil_div(h, q)", lw: "ceil_div(w, r)"}'),
)
case(
    "equals_on_a_flat_input",
    "deepseek_v41",
    (
        "types: {kind: flat, rows: output_tokens}",
        'types: {kind: flat, rows: output_tokens, equals: {n: "h"}}',
    ),
)
case(
    "equals_chained",
    "deepseek_v41",
    (
        "vit_grid: {kind: grid, dims: [h, w]}",
        'vit_grid: {kind: grid, dims: [h, w], equals: {w: "lw * r"}}',
    ),
)

# -- the largest budget (budget.max) ---------------------------------------------------

_MAX = "max: r * r * min(max_num_batched_tokens, max_model_len)"
case("budget_max_below_min", "deepseek_v41", (_MAX, "max: r * 16"))
case(
    "budget_max_falls",
    "deepseek_v41",
    (_MAX, "max: 64 + 1000000 // min(max_num_batched_tokens, max_model_len)"),
)
case("budget_max_unknown_name", "deepseek_v41", (_MAX, "max: r * r * max_tokens"))
# -- builders given as steps --------------------------------------------------------
valid_case(
    "builder_steps_capture_value_short",
    "builder_steps",
    ("capture_value: token_budget * merge**2", "capture_value: k * merge * merge"),
)
valid_case(
    "builder_steps_bare_step",
    "builder_steps",
    ("      - patches = pixel_values * 2\n", "      - pixel_values * 2\n"),
)
valid_case(
    "builder_steps_provide_no_step",
    "builder_steps",
    ("      - patches = pixel_values * 2\n", "      - scaled = pixel_values * 2\n"),
)
valid_case(
    "builder_steps_and_a_call",
    "builder_steps",
    ("  - steps:\n", "  - call: tower.metadata(image_grid)\n    steps:\n"),
)
valid_case(
    "builder_steps_bind_a_dim",
    "builder_steps",
    ("      - lengths = sizes", "      - h = sizes[:, 0]\n      - lengths = sizes"),
)
valid_case(
    "builder_steps_capture_kwargs",
    "builder_steps",
    (
        "    provides: [patches,",
        "    capture_kwargs: {n: rows}\n    provides: [patches,",
    ),
)
valid_case(
    "capture_value_not_a_host_scalar",
    "builder_steps",
    (
        "  patches: {shape: [rows, width], dtype: dtype}",
        "  patches: {shape: [rows, width], dtype: dtype, capture_value: rows}",
    ),
)

# -- per-item builders ----------------------------------------------------------------
valid_case(
    "per_item_with_a_call",
    "rope_grid",
    (
        "  - call: vision.prepare_metadata(grid_hw, device=device)\n",
        "  - call: vision.prepare_metadata(grid_hw, device=device)\n    per_item: true\n",
    ),
)
valid_case(
    "per_item_reads_a_grid",
    "per_item_builder",
    ("      - area = h * w\n", "      - area = image_grid_thw[0][1] * w\n"),
)
valid_case(
    "per_item_reads_a_flat_input",
    "per_item_builder",
    (
        "      - area = h * w\n",
        "      - area = h * w + 0 * pixel_values.shape[0]\n",
    ),
)
valid_case(
    "per_item_local_read_after_the_loop",
    "per_item_builder",
    (
        "      - cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])",
        "      - cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0) * area])",
    ),
)
valid_case(
    "per_item_host_scalar",
    "per_item_builder",
    (
        "    provides: [positions, frames]\n",
        "      - longest = torch.tensor([area])\n    provides: [positions, frames, longest]\n",
    ),
    (
        "  frames: {shape: [rows], dtype: int64}\n",
        "  frames: {shape: [rows], dtype: int64}\n"
        "  longest: {host_scalar: true, capture_value: token_budget * merge**2}\n",
    ),
    (
        "  - vision(pixel_values, positions, frames, cu_seqlens)",
        "  - vision(pixel_values, positions, frames, cu_seqlens, longest)",
    ),
)
valid_case(
    "per_item_not_a_boolean",
    "per_item_builder",
    ("  - per_item: true\n", "  - per_item: sometimes\n"),
)
valid_case(
    "per_item_binds_a_dim",
    "per_item_builder",
    ("      - area = h * w\n", "      - w = h * w\n      - area = w\n"),
)
valid_case(
    "per_item_rebinds_the_item",
    "per_item_tensors",
    (
        "      - image_scale = pixel_values.float()",
        "      - pixel_values = pixel_values.float()\n      - image_scale = pixel_values",
    ),
)
valid_case(
    "per_item_in_a_unit_capture",
    "unit_varlen",
    (
        "  - steps:\n      - sizes",
        "  - per_item: true\n    steps:\n      - tile_ids = torch.arange(h * w)\n"
        "    provides: [tile_ids]\n  - steps:\n      - sizes",
    ),
    ("  patches: {}\n", "  patches: {}\n  tile_ids: {shape: [rows], dtype: int64}\n"),
    (
        "  - tower(patches, cu_seqlens, max_seqlen)",
        "  - tower(patches, cu_seqlens, max_seqlen, tile_ids)",
    ),
)

# -- variable-length units in a unit capture ------------------------------------------
valid_case(
    "unit_varlen_slots_per_dummy_unit",
    "unit_varlen",
    ("    slots: token_budget + 1\n", "    slots: ceil_div(token_budget, m) + 1\n"),
)
valid_case(
    "unit_varlen_capture_value_short",
    "unit_varlen",
    ("capture_value: token_budget * f**2", "capture_value: m * f**2"),
)
valid_case(
    "unit_varlen_dummy_short_of_the_budget",
    "unit_varlen",
    ("  units: ceil_div(token_budget, m)\n", "  units: token_budget // m\n"),
)
valid_case(
    "unit_varlen_dummy_dims_not_positive",
    "unit_varlen",
    (
        "  units: ceil_div(token_budget, m)\n",
        "  units: ceil_div(token_budget, m) + 1\n",
    ),
)
valid_case(
    "unit_varlen_pad_without_dummy_units",
    "unit_varlen",
    (
        '  unit_dummy:\n    spatial_shapes: [f, "min(token_budget - unit_index * m, m) * f"]\n',
        "",
    ),
)
valid_case(
    "unit_varlen_trailing_sequence",
    "unit_varlen",
    ("    pad: repeat_last\n", "    pad: trailing_sequence\n"),
)
valid_case(
    "unit_varlen_dummy_of_a_count",
    "unit_varlen",
    (
        '    spatial_shapes: [f, "min',
        '    num_tiles: [1]\n    spatial_shapes: [f, "min',
    ),
)
valid_case(
    "unit_dummy_without_units",
    "builder_steps",
    (
        "  dummy: {image_grid: [merge, k * merge]}\n",
        "  dummy: {image_grid: [merge, k * merge]}\n  unit_dummy: {image_grid: [1, 1]}\n",
    ),
)

valid_case(
    "forward_context_not_a_call",
    "unit_varlen",
    (
        "graph_forward_context: set_forward_context(None, vllm_config)",
        "graph_forward_context: vllm_config",
    ),
)
valid_case(
    "forward_context_unknown_helper",
    "unit_varlen",
    (
        "graph_forward_context: set_forward_context(None, vllm_config)",
        "graph_forward_context: forward_context(None, vllm_config)",
    ),
)

valid_case(
    "multiple_of_not_a_dim",
    "unit_varlen",
    ("multiple_of: {h: f, w: f}", "multiple_of: {h: f, n: f}"),
)
valid_case(
    "multiple_of_zero",
    "unit_varlen",
    ("multiple_of: {h: f, w: f}", "multiple_of: {h: f, w: 0}"),
)
valid_case(
    "multiple_of_on_a_flat_input",
    "unit_varlen",
    ("rows: h * w}", "rows: h * w, multiple_of: {h: f}}"),
)

valid_case(
    "constant_processor_kwarg_without_multimodal_config",
    "builder_steps",
    (
        "  merge: {from: tower.merge, default: 2}",
        "  merge: {from: tower.merge, default: 2, processor_kwarg: merge}",
    ),
)
valid_case(
    "constant_fallback_of_a_method",
    "unit_capture_ceil",
    (
        "{from: get_image_patches_per_chunk(), default: 144}",
        "{from: get_image_patches_per_chunk(), default: 144, fallback: 144}",
    ),
)


# -- built-in functions in steps (next) ----------------------------------------------

# A step named `next` shadows the built-in: calling it is refused.
case(
    "builtin_next_shadowed",
    "kimi_k25",
    ("- merged = torch.cat(feats)", "- next = torch.cat(feats)"),
    ("mm_projector(merged.to(next(", "mm_projector(next.to(next("),
)
# Built-ins are for forward steps; a formula has only ceil_div, min, max.
case(
    "builtin_next_in_a_formula",
    "kimi_k25",
    ("input_size: t * h * w", "input_size: next(t)"),
)


# -- modalities under a host condition (modality_when) -----------------------------

# The condition names a modality the spec does not list.
valid_case(
    "modality_when_not_listed",
    "modality_when",
    ("modalities: [image, video]", "modalities: [image]"),
    ("max_frames_per_video: 4\n", ""),
    ("{kind: flat, video_key: pixel_values_videos}", "{kind: flat}"),
    (
        "{kind: grid, dims: [t, h, w], video_key: video_grid_thw}",
        "{kind: grid, dims: [t, h, w]}",
    ),
)
# The condition reads a name that is neither a constant nor a host path.
valid_case(
    "modality_when_unknown_name",
    "modality_when",
    ("video: major == 2 and minor == 6", "video: mayor == 2 and minor == 6"),
)
# A condition is an expression, not a list of versions.
valid_case(
    "modality_when_not_an_expression",
    "modality_when",
    (
        "video: major == 2 and minor == 6 or major == 4 and minor == 0",
        "video: [[2, 6], [4, 0]]",
    ),
)


# -- eager_when per unit -------------------------------------------------------------

# Per unit, the condition is tested on each unit: an item's count is not in scope.
valid_case(
    "unit_eager_when_reads_the_count",
    "unit_eager_when",
    ("  eager_when: max(h, w) > side\n", "  eager_when: n > side\n"),
)


# -- padded inputs (kind: padded) ------------------------------------------------------

# pad_value is a padded input's; fill: pad fills a padded input's buffer; a
# padded size is its shape (no equals); a padded buffer has items and sizes.
valid_case(
    "padded_key_on_other_kinds",
    "capture_axes",
    (
        "  image_grid: {kind: grid, dims: [h, w]}\n",
        "  image_grid: {kind: grid, dims: [h, w], pad_value: -1}\n",
    ),
    (
        "    patches: {shape: [rows, patch], dtype: dtype}\n",
        "    patches: {shape: [rows, patch], dtype: dtype, fill: pad}\n",
    ),
)
valid_case(
    "padded_equals_and_flat_shape",
    "padded_items",
    (
        "  positions: {kind: padded, dim: p, pad_value: -1}\n",
        "  positions: {kind: padded, dim: p, pad_value: -1, equals: {p: pool}}\n",
    ),
    (
        "    patches: {shape: [images, w * pool, patch], dtype: dtype}\n",
        "    patches: {shape: [images * w * pool * patch], dtype: dtype}\n",
    ),
)
# Images counted by their own tokens: a graph of width w then gets up to
# token_budget images of one token, but holds token_budget // widest.
valid_case(
    "padded_items_beyond_the_key_rows",
    "padded_items",
    ("  budget_tokens: widest\n", "  budget_tokens: p // pool\n"),
    ("budget:\n  min: widest\n", "budget:\n  min: 1\n"),
)
# Rows of w patches: an image the key w covers has up to w * pool.
valid_case(
    "padded_items_wider_than_the_rows",
    "padded_items",
    (
        "    positions: {shape: [images, w * pool, 2]",
        "    positions: {shape: [images, w * pool - 1, 2]",
    ),
)
# pad_value is an integer.
valid_case(
    "padded_pad_value_not_an_integer",
    "padded_items",
    ("pad_value: -1}", "pad_value: -0.5}"),
)

# -- tensors inputs (kind: tensors) --------------------------------------------------

# Each dim is read off the item's shape: a shape without it binds nothing.
valid_case(
    "tensors_dim_not_in_the_shape",
    "tensor_images",
    ("    shape: [channels, h, w]\n", "    shape: [channels, h, 7]\n"),
)
# A dim is an entry of its own: 2 * h is no size an item's shape has.
valid_case(
    "tensors_dim_inside_a_formula",
    "tensor_images",
    ("    shape: [channels, h, w]\n", "    shape: [channels, 2 * h, w]\n"),
)
# A dim read twice would bind two sizes to one name.
valid_case(
    "tensors_dim_twice_in_the_shape",
    "tensor_images",
    ("    shape: [channels, h, w]\n", "    shape: [h, h, w]\n"),
)
# The shape is required (the host checks every item against it).
valid_case(
    "tensors_without_shape",
    "tensor_images",
    ("    shape: [channels, h, w]\n", ""),
)
# shape is a tensors input's key; dim is a count or padded input's.
valid_case(
    "tensors_shape_on_a_padded_input",
    "padded_items",
    (
        "  positions: {kind: padded, dim: p, pad_value: -1}\n",
        "  positions: {kind: padded, dim: p, pad_value: -1, shape: [p, 2]}\n",
    ),
)
valid_case(
    "tensors_with_dim",
    "tensor_images",
    ("    dims: [h, w]\n", "    dim: h\n"),
)
# The buffer has the items on dim 0, then the item's three dims.
valid_case(
    "tensors_buffer_of_another_rank",
    "tensor_images",
    (
        "      shape: [max_batch_size, channels, side * patch, 2 * side * patch]\n",
        "      shape: [max_batch_size, side * patch, 2 * side * patch]\n",
    ),
)
# An image the graph takes is up to 2 side patches wide (items.eager_when).
valid_case(
    "tensors_buffer_narrower_than_the_items",
    "tensor_images",
    (
        "      shape: [max_batch_size, channels, side * patch, 2 * side * patch]\n",
        "      shape: [max_batch_size, channels, side * patch, side * patch]\n",
    ),
)
# Without eager_when, an image as wide as the budget is taken by its graph.
valid_case(
    "tensors_items_unbounded",
    "tensor_images",
    ("  eager_when: max(h, w // 2) > side * patch\n", ""),
)
# A constant that eager_when reads, given without `from` (the fuzz found the
# static checks evaluating eager_when without it): one located message.
valid_case(
    "tensors_eager_when_constant_without_from",
    "tensor_images",
    ("  side: {from: vision.side, default: 4}", "  side: {default: 4}"),
)

# -- list inputs (kind: list) --------------------------------------------------------

# A list input's units are checked on the host against unit_shape: it is required.
valid_case(
    "list_without_unit_shape",
    "list_units",
    (
        "{kind: list, units_per_item: n, unit_shape: [c, h * w]}",
        "{kind: list, units_per_item: n}",
    ),
)
# The name of an item's units is the list's; dims and dim are other kinds' keys.
valid_case(
    "list_with_dims",
    "list_units",
    (
        "{kind: list, units_per_item: n,",
        "{kind: list, dims: [a, b], units_per_item: n,",
    ),
)
# unit_shape reads constants and dims: a capture name is not in scope.
valid_case(
    "list_unit_shape_reads_units",
    "list_units",
    ("unit_shape: [c, h * w]", "unit_shape: [c, units]"),
)
# A list input gives units: it is not itself the units of another input.
valid_case(
    "list_with_unit_of",
    "list_units",
    (
        "{kind: list, units_per_item: n,",
        "{kind: list, unit_of: sizes, units_per_item: n,",
    ),
)
# Its units are what a budget holds: an item capture has no place for them.
valid_case(
    "list_without_unit_capture",
    "list_units",
    ("  units: ceil_div(token_budget, q)\n", ""),
    (
        "  unit_dummy:\n    sizes: [side, side]\n",
        "  dummy: {sizes: [side, side], slices: [1]}\n",
    ),
)
# A list of tensors is no buffer the manager can copy.
valid_case(
    "list_as_a_buffer",
    "list_units",
    (
        "  patches: {shape: [units, c, side * side], dtype: dtype}\n",
        "  slices: {}\n  patches: {shape: [units, c, side * side], dtype: dtype}\n",
    ),
)


# -- capture.keep_alive --------------------------------------------------------------

# The tensors held are host attributes: a formula is no tensor to hold.
case(
    "keep_alive_not_a_host_path",
    "minicpmv",
    ("keep_alive: [resampler.pos_embed]", "keep_alive: [resampler.pos_embed * 2]"),
)
# An empty list holds nothing: leave the key out.
case(
    "keep_alive_empty",
    "minicpmv",
    ("keep_alive: [resampler.pos_embed]", "keep_alive: []"),
)


# -- the step language reaches only its allow-lists (issue #28) ----------------------

# From a module's parameters() generator to its frame's globals.
case(
    "steps_parameters_generator_frame",
    "kimi_k25",
    (
        "  - projected = mm_projector(feats.to(next(mm_projector.parameters()).dtype))",
        "  - projected = mm_projector(feats.to(mm_projector.parameters().gi_frame))",
    ),
)
# next() reads a parameter's dtype or device, nothing else.
case(
    "steps_next_not_dtype",
    "kimi_k25",
    (
        "    - projected = mm_projector(merged.to(next(mm_projector.parameters()).dtype))",
        "    - projected = mm_projector(merged.to(next(mm_projector.parameters())))",
    ),
)
# A file read through a tensor's storage in a captured graph.
case(
    "steps_storage_from_file",
    "kimi_k25",
    (
        "  - projected.view(-1, config.text_config.hidden_size)",
        "  - \"feats.untyped_storage().from_file('/etc/passwd', False, 8)\"",
    ),
)
# A file written through numpy from an eager step.
case(
    "steps_numpy_tofile",
    "kimi_k25",
    (
        "    - projected.reshape(-1, projected.shape[-1])",
        "    - \"projected.numpy().tofile('/tmp/out')\"",
    ),
)
# A string formatted with an object reads its dunder attributes.
case(
    "steps_string_format",
    "lfm2_vl",
    (
        "    - torch.cat(features, dim=0)",
        "    - \"'{0.forward.__globals__}'.format(features)\"",
    ),
)
# A hook registered on a host module from a builder step.
case(
    "steps_builder_register_hook",
    "lfm2_vl",
    (
        "      - starts = lengths.cumsum(0) - lengths",
        "      - starts = lengths.register_hook(lengths.to)",
    ),
)
# A host method call the spec does not declare (a config's file writer).
case(
    "steps_undeclared_host_call",
    "ernie45_vl",
    (
        "    - resampler_model(path_output[:graph_rows], torch.tensor(image_grid_thw))",
        "    - resampler_model.config.save_pretrained(path_output)",
    ),
)
# Only a host attribute annotated as a module is called, looped over or read
# for its parameters: a config's attributes are data (the generated module
# checks the rest of a path under a module at run time).
case(
    "host_call_not_a_module",
    "dots_ocr",
    ("  - vision_tower.merger(normed)[", "  - config(normed)["),
)
case(
    "loop_in_not_a_module",
    "dots_ocr",
    ("    in: vision_tower.blocks", "    in: config.blocks"),
)
case(
    "next_parameters_not_a_module",
    "phi3v",
    (
        "next(vision_embed_tokens.parameters()).dtype",
        "next(config.parameters()).dtype",
    ),
)
# host_methods declares the model's methods, not torch.nn.Module's machinery.
case(
    "host_methods_module_internals",
    "qwen2_vl",
    (
        "host_methods: [get_max_frames_per_video,",
        "host_methods: [get_max_frames_per_video, _modules, _forward_hooks, "
        "visual.apply,",
    ),
)


# -- divisors that are zero ------------------------------------------------------------

# A divisor that folds to 0 whatever the names is refused where it is written.
case(
    "divisor_constant_zero_modulo",
    "minimax_m3",
    ("output_tokens: t * h * w // (merge * merge)", "output_tokens: h % (1-1)"),
)
case(
    "divisor_constant_zero_floor_division",
    "minimax_m3",
    ("output_tokens: t * h * w // (merge * merge)", "output_tokens: w // (2 * 0)"),
)
case(
    "divisor_constant_zero_slots",
    "minimax_m3",
    ("slots: max_batch_size + 2}", 'slots: "max_batch_size % (3 - 3) + 1"}'),
)
case(
    "divisor_constant_zero_ceil_div",
    "minimax_m3",
    ("[1, merge, k * merge]", '[1, merge, "ceil_div(k, 2-2) * merge"]'),
)
# Zero for the constants' defaults (merge = 2) or at one budget only: the
# static checks refuse it at the first budget where it divides by zero.
case(
    "divisor_zero_at_default_constants",
    "minimax_m3",
    (
        "output_tokens: t * h * w // (merge * merge)",
        "output_tokens: t * h * w // (merge * merge - 4)",
    ),
)
case(
    "divisor_zero_at_budget_256",
    "minimax_m3",
    (
        "[1, merge, k * merge]",
        '[1, merge, "k * merge + k // (token_budget - 256) * 0"]',
    ),
)


# -- budgets of vLLM's default ladder ------------------------------------------------------

# Wrong only at 256, a budget of the released ladder (64, 128, 256, ..., 8192)
# that no sample hits.
case(
    "dummy_short_at_budget_256",
    "minimax_m3",
    ("[1, merge, k * merge]", '[1, merge, "k * merge - (token_budget == 256)"]'),
)
case(
    "max_seqlen_short_at_budget_256",
    "minimax_m3",
    (
        "max_seqlen_override: rows}",
        'max_seqlen_override: "1 if token_budget == 256 else rows"}',
    ),
)


# -- loops over a host module list (forward steps) -------------------------------------

_LOOP_IN = "block\n    in: visual.blocks\n"
_LOOP_BODY = (
    "      - hidden = block(hidden, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)\n"
)
valid_case(
    "loop_over_a_step_result", "module_loop", (_LOOP_IN, "block\n    in: hidden\n")
)
valid_case(
    "loop_over_module_api", "module_loop", (_LOOP_IN, "block\n    in: visual.modules\n")
)
valid_case(
    "loop_carry_not_bound_before",
    "module_loop",
    ("  carry: hidden\n", "  carry: merged\n"),
)
valid_case(
    "loop_rebinds_another_name",
    "module_loop",
    (
        _LOOP_BODY,
        "      - merged = block(hidden, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen)\n",
    ),
)
valid_case(
    "loop_variable_as_a_value",
    "module_loop",
    (_LOOP_BODY, "      - hidden = visual.merger(block)\n"),
)
valid_case(
    "loop_variable_after_its_loop",
    "module_loop",
    ("  - visual.merger(hidden)\n", "  - visual.merger(hidden, scale=block)\n"),
)
valid_case(
    "loop_nested",
    "module_loop",
    (
        _LOOP_BODY,
        "      - {for: inner, in: visual.blocks, carry: hidden, steps: [hidden = inner(hidden)]}\n",
    ),
)
valid_case(
    "loop_never_calls_its_variable",
    "module_loop",
    (_LOOP_BODY, "      - hidden = hidden.contiguous()\n"),
)
valid_case(
    "loop_unknown_key_and_no_carry",
    "module_loop",
    ("  carry: hidden\n", "  carry_over: hidden\n"),
)
valid_case(
    "loop_variable_takes_a_name",
    "module_loop",
    ("  - for: block\n", "  - for: cu_seqlens\n"),
)
valid_case(
    "loop_reserved_variable",
    "module_loop",
    ("  - for: block\n", "  - for: self\n"),
)
valid_case(
    "loop_host_sync_in_graph",
    "module_loop",
    (
        _LOOP_BODY,
        "      - hidden = block(hidden, max_seqlen=max_seqlen.item(), cu_seqlens=cu_seqlens)\n",
    ),
)
valid_case(
    "loop_as_the_output",
    "module_loop",
    ("  - visual.merger(feats)\n", ""),
)
valid_case(
    "loop_in_builder_steps",
    "builder_steps",
    (
        "      - patches = pixel_values * 2\n",
        "      - patches = pixel_values * 2\n"
        "      - {for: block, in: tower.blocks, carry: patches, steps: [patches = block(patches)]}\n",
    ),
)


# A loop's index and keep (Qwen3-Omni's DeepStack taps).
_KEEP = "    keep: {as: deepstack, at: visual.deepstack_visual_indexes}\n"
case("loop_keep_without_index", "qwen3_omni", ("    index: layer\n", ""))
case(
    "loop_keep_unknown_key",
    "qwen3_omni",
    (
        _KEEP,
        "    keep: {as: deepstack, at: visual.deepstack_visual_indexes, when: 1}\n",
    ),
)
case(
    "loop_keep_at_a_step_result",
    "qwen3_omni",
    (_KEEP, "    keep: {as: deepstack, at: hidden}\n"),
)
case(
    "loop_keep_as_a_taken_name",
    "qwen3_omni",
    (_KEEP, "    keep: {as: hidden, at: visual.deepstack_visual_indexes}\n"),
)
case(
    "loop_keep_never_read",
    "qwen3_omni",
    ("merger(deepstack[level])", "merger(hidden)"),
)
case(
    "loop_index_is_the_variable",
    "qwen3_omni",
    ("    index: level\n", "    index: merger\n"),
)
case(
    "loop_index_after_its_loop",
    "qwen3_omni",
    (
        "  - merged = visual.merger(hidden)\n",
        "  - merged = visual.merger(hidden) * layer\n",
    ),
)

# -- pads_units: a flat input of one row per unit, padded to the widest ------------------

# pads_units checks each unit's input_size against the padded width: it needs units.
valid_case(
    "pads_units_without_unit_of",
    "unit_items",
    (
        "  num_tiles: {kind: count, dim: n}\n",
        "  num_tiles: {kind: count, dim: n}\n  extra: {kind: flat, rows: n, pads_units: true}\n",
    ),
)
# A row is one unit's patches: rows of h * w per unit are no padded rows.
valid_case(
    "pads_units_of_several_rows",
    "unit_items",
    (
        "  patches: {kind: flat, unit_of: num_tiles, rows: h * w}",
        "  patches: {kind: flat, unit_of: num_tiles, rows: h * w, pads_units: true}",
    ),
)


# -- vLLM-only imports: a vllm module always, allow-listed on both sides ------------------

_LLAVA_NEXT_IMPORT = "{vllm: vllm.model_executor.models.llava_next}"
# The vllm module is what every import has; a standalone one alone is no import.
valid_case(
    "vllm_only_import_without_vllm",
    "vllm_only_import",
    (_LLAVA_NEXT_IMPORT, "{standalone: reference_towers.registry}"),
)
# vllm: modules under vllm only, even for a helper vLLM's module re-exports.
valid_case(
    "vllm_only_import_outside_vllm",
    "vllm_only_import",
    (
        _LLAVA_NEXT_IMPORT,
        "{vllm: transformers.models.llava_next.modeling_llava_next}",
    ),
)
# A module of vLLM 0.33.0 that does not bind the name.
valid_case(
    "vllm_only_import_name_not_in_module",
    "vllm_only_import",
    (_LLAVA_NEXT_IMPORT, "{vllm: vllm.model_executor.models.llava}"),
)
# A stand-in is a module of this project, never another package's.
valid_case(
    "vllm_only_import_stand_in_outside_project",
    "vllm_only_import",
    (
        _LLAVA_NEXT_IMPORT,
        "{vllm: vllm.model_executor.models.llava_next, "
        "standalone: transformers.models.llava_next.modeling_llava_next}",
    ),
)
# A stand-in the project's module does not define.
valid_case(
    "vllm_only_import_stand_in_missing",
    "vllm_only_import",
    (
        _LLAVA_NEXT_IMPORT,
        "{vllm: vllm.model_executor.models.llava_next, "
        "standalone: reference_towers.registry}",
    ),
)


# -- an item's count from host steps (items.output_tokens: {steps, at_most}) -------------

_COUNT_LAST = "      - unpadded.shape[1] * unpadded.shape[2]\n"
# The budgets and the dummy batch read formulas: both must be given.
valid_case(
    "count_steps_without_budget_tokens",
    "count_steps",
    ("  budget_tokens: t * h * w\n", ""),
)
# The bound is what the static checks read: required.
valid_case(
    "count_steps_without_at_most", "count_steps", ("    at_most: t * h * w\n", "")
)
# The bound is an item formula: no call, no host path.
valid_case(
    "count_steps_bound_calls_a_helper",
    "count_steps",
    ("    at_most: t * h * w\n", "    at_most: unpad_image(t, h)\n"),
)
# The last step is the count: an expression, not an assignment.
valid_case(
    "count_steps_last_assigns",
    "count_steps",
    (_COUNT_LAST, "      - tokens = unpadded.shape[1] * unpadded.shape[2]\n"),
)
# The steps see the item's dims, never the batch's inputs.
valid_case(
    "count_steps_read_a_batch_input",
    "count_steps",
    (_COUNT_LAST, "      - pixel_values.shape[0]\n"),
)
# Inside the step language: no private host path.
valid_case(
    "count_steps_private_host_path",
    "count_steps",
    (_COUNT_LAST, "      - visual._count(unpadded)\n"),
)
# A step name must not shadow a declared name.
valid_case(
    "count_steps_shadow_a_dim",
    "count_steps",
    (
        '      - grid = torch.empty(1, t * h, w, device="meta")\n',
        '      - h = torch.empty(1, t, w, device="meta")\n',
    ),
)
# per_unit formulas are summed over units; steps count the whole item.
valid_case(
    "count_steps_per_unit",
    "count_steps",
    ("  input_size: t * h * w\n", "  per_unit: true\n  input_size: t * h * w\n"),
)
# A flat input's rows would read the bound as the count.
valid_case(
    "count_steps_flat_rows_read_output_tokens",
    "count_steps",
    (
        "  pixel_values: {kind: flat}\n",
        "  pixel_values: {kind: flat, rows: output_tokens}\n",
    ),
)

# LLaVA-NeXT's count reads vLLM's helpers: the bound must still be a formula.
case(
    "llava_next_count_bound_reads_the_pinpoints",
    "llava_next",
    (
        "    at_most: p * (side // patch) ** 2 + (p - 1) * (side // patch)\n",
        "    at_most: p * len(config.image_grid_pinpoints)\n",
    ),
)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = set(cases) | set(NOT_UTF8)
    for path in OUT.iterdir():
        if path.suffix in (".yaml", ".expected") and path.stem not in wanted:
            path.unlink()
    for name, text in cases.items():
        (OUT / f"{name}.yaml").write_text(text, encoding="utf-8")
    for name, (stem, old, new) in NOT_UTF8.items():
        text = _header(stem, name) + _spec(stem).replace(old, new)
        (OUT / f"{name}.yaml").write_bytes(text.encode("latin-1"))
    print(f"{len(wanted)} cases written to {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
