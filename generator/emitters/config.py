"""``get_encoder_cudagraph_config``: buffers, output width, replay copies, guards."""

from __future__ import annotations

from typing import Any

from generator.emitters import host_callees
from generator.emitters.method_body import Body, signature
from generator.emitters.prose import comment_lines, message_literal, plain_message
from generator.naming import PROTOCOL_MODULES
from generator.spec.enums import ImageLimitGuard, PadRule
from generator.spec.mixin import MixinSpec

DEFAULT_BACKEND_WHY = (
    "FlashInfer reads max_seqlen on the host and TORCH_SDPA calls .tolist() on "
    "the CUDA cu_seqlens: neither can be captured."
)


#: The replay copy of each pad rule.
PAD_COPIES = {
    PadRule.TRAILING_SEQUENCE: "self._pad_with_trailing_sequence",
    PadRule.REPEAT_LAST: "_pad_with_empty_sequences",
    PadRule.FLASHINFER_SECTIONS: "_pad_flashinfer_sections",
}


def padding_logics(spec: MixinSpec) -> list[dict[str, str]]:
    """The replay copies that differ from the manager's default, by buffer
    (chosen by the attention backend ``backend`` where a rule depends on it)."""
    out = []
    for buf in spec.buffers:
        if buf.pad is not None:
            fn = PAD_COPIES[buf.pad]
            for backend, rule in buf.pad_by_backend:
                fn = (
                    f"({PAD_COPIES[rule]} if backend == "
                    f"AttentionBackendEnum.{backend.value} else {fn})"
                )
            out.append({"key": buf.key, "fn": fn})
        elif buf.rows_dim:
            out.append({"key": buf.key, "fn": f"_copy_rows_on_dim{buf.rows_dim}"})
        elif _padded_input(spec, buf.key) is not None:
            pad = _padded_input(spec, buf.key).pad_value
            fn = f"lambda dst, src: _copy_padded(dst, src, {pad!r})"
            out.append({"key": buf.key, "fn": fn})
    return out


def _padded_input(spec: MixinSpec, key: str):
    """The padded input that fills buffer ``key``, if one does."""
    item = spec.item_input(key)
    return item if item is not None and item.is_padded else None


def _backend(spec: MixinSpec, body: Body) -> dict[str, Any] | None:
    guard = spec.guards.attention_backend
    if guard is None:
        return None
    members = guard.allow or guard.deny
    hint = (guard.hint or "Choose a capturable backend").rstrip(". ")
    return {
        "path": body.expr(guard.path),
        "op": "not in" if guard.allow else "in",
        "members": [f"AttentionBackendEnum.{m.value}" for m in members],
        "why": comment_lines(guard.why) or comment_lines(DEFAULT_BACKEND_WHY),
        "message": message_literal(
            [
                ("cudagraph_mm_encoder is not supported with the", False),
                ("backend.name", True),
                (
                    f"ViT attention backend for {spec.display_name}. {hint}, "
                    "or disable cudagraph_mm_encoder.",
                    False,
                ),
            ]
        ),
    }


def _paths(spec: MixinSpec, body: Body) -> list[dict[str, Any]] | None:
    """``EncoderCudaGraphPathConfig`` arguments of each path (spec with paths)."""
    if not spec.has_paths:
        return None
    out = []
    for path in spec.paths:
        args = []
        if path.min_token_budget is not None:
            args.append(f"min_token_budget={body.expr(path.min_token_budget)}")
        if path.allow_zero_tokens:
            args.append("allow_zero_tokens=True")
        out.append({"name": repr(path.name), "args": ", ".join(args)})
    return out


def context(spec: MixinSpec, target: str) -> dict[str, Any]:
    body = Body(spec)
    name = spec.display_name
    image_limit = fp8 = None
    if spec.guards.image_limit_zero is ImageLimitGuard.CONFIG:
        image_limit = plain_message(
            f"cudagraph_mm_encoder requires the {name} vision tower, but the image "
            "limit is 0. Disable cudagraph_mm_encoder."
        )
    if spec.guards.fp8_static_scales:
        fp8 = plain_message(
            "cudagraph_mm_encoder requires static FP8 scales for the "
            f"{name} vision encoder (dynamic scaling keeps its amax history on the "
            "host, which a graph cannot capture). Set --mm-encoder-fp8-scale-path "
            "or disable cudagraph_mm_encoder."
        )
    backend = _backend(spec, body)
    mfpv = spec.max_frames_per_video
    off = spec.capture_off
    ctx = {
        "capture_off": (
            {
                "flag": body.expr(off.when),
                "why": comment_lines(off.why)
                or ["Nothing is captured while this host flag is set."],
            }
            if off is not None
            else None
        ),
        "signature": signature(spec, "get_encoder_cudagraph_config"),
        "defs_local": spec.local_defs_import,
        "defs_module": PROTOCOL_MODULES[target]["defs"],
        "backends_module": PROTOCOL_MODULES[target]["backends"],
        "image_limit": image_limit,
        "fp8": fp8,
        "backend": backend,
        "modalities": [
            repr(m.value) for m in spec.modalities if m not in dict(spec.modality_when)
        ],
        "modality_when": [
            {"name": repr(m.value), "when": body.expr(cond)}
            for m, cond in spec.modality_when
        ],
        "buffer_keys": [repr(b.key) for b in spec.buffers],
        "paths": _paths(spec, body),
        "out_hidden_size": body.expr(spec.out_hidden_size),
        "max_frames_per_video": body.expr(mfpv) if mfpv is not None else None,
        "padding": padding_logics(spec),
        "capture_axes": bool(spec.capture_axes),
        "check_callees": bool(host_callees.callees(spec))
        and host_callees.calls_dotted_method(
            [mfpv, *(k for a in spec.capture_axes for key in a.keys for k in key)]
        ),
    }
    ctx["constants"] = body.bindings()
    return ctx
