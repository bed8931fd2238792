"""The helpers the methods call: module-level functions (row selection,
replay copies) and the class's private methods (grid reading, the captured
row registry of a trailing padding sequence)."""

from __future__ import annotations

from typing import Any

from generator.emitters.capture_axes import helpers_context
from generator.emitters.capture_inputs import padded_sizes_names
from generator.emitters import host_callees
from generator.emitters.method_body import of_list
from generator.formulas import Num
from generator.spec.enums import PadRule
from generator.spec.mixin import MixinSpec


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    trailing = spec.trailing
    buffers = spec.buffers
    return {
        "concat_rows": any(f.accepts_list for f in spec.flat_inputs),
        "fold_leading": any(f.fold_ranks for f in spec.flat_inputs),
        "eager_only": spec.items.eager_when is not None
        or any(a.eager_beyond for a in spec.capture_axes),
        # Selection slices every flat input's rows with it.
        "select_rows": bool(spec.flat_inputs),
        "select_counts": any(g.is_count and not g.is_list for g in spec.item_inputs),
        "select_items": any(g.is_list for g in spec.item_inputs),
        "list_units": any(g.is_list for g in spec.item_inputs),
        "select_grid": any(
            not g.is_count and not g.is_padded for g in spec.item_inputs
        ),
        "padded": any(g.is_padded for g in spec.item_inputs),
        "padded_sizes": any(g.is_padded and not g.is_tensors for g in spec.item_inputs),
        "tensor_dims": _reads_tensor_dims(spec),
        "rows_dims": sorted({b.rows_dim for b in buffers if b.rows_dim}),
        "repeat_last": any(
            rule in (PadRule.REPEAT_LAST, PadRule.FLASHINFER_SECTIONS)
            for b in buffers
            for rule in (b.pad, *(r for _, r in b.pad_by_backend))
        ),
        "flashinfer_sections": any(b.pad_by_backend for b in buffers),
        "modality_keys": spec.has_video_keys,
        "grid_rows": any(
            not g.is_count and not g.is_padded and not of_list(spec, g)
            for g in spec.item_inputs
        ),
        "counts": any(g.is_count and not g.is_list for g in spec.item_inputs),
        "split_units": spec.items.per_unit
        or any(f.unit_of and f.rows != Num(1) for f in spec.flat_inputs),
        "unit_indices": any(g.unit_of for g in spec.item_inputs),
        "trailing": {"key": trailing.key} if trailing is not None else None,
        "axes": helpers_context(spec),
        "host_callees": _host_callees(spec),
    }


def _host_callees(spec: MixinSpec) -> dict[str, Any] | None:
    """What ``_check_host_callees`` walks, and which of its two helpers the
    module needs (a spec without loops calls no ``_require_module_list``)."""
    callees = host_callees.callees(spec)
    if not callees:
        return None
    return {
        "callees": callees,
        "methods": any(not c["module_list"] for c in callees),
        "lists": any(c["module_list"] for c in callees),
    }


def _reads_tensor_dims(spec: MixinSpec) -> bool:
    """Whether a method reads a tensors input's dims off its items
    (``_tensor_dims``): a replay builder, a per-item eager forward, the
    post-processing or a capture axis. Item specs and selection read them
    through the input checks; a spec whose graph takes fixed-size items and
    reads no dims (PaliGemma's one view per image) needs no helper."""
    if not any(g.is_tensors for g in spec.item_inputs):
        return False
    return (
        any(padded_sizes_names(spec, path) for path in spec.paths)
        or any(path.eager_forward.per_item for path in spec.paths)
        or spec.postprocess is not None
        or bool(spec.capture_axes)
    )
