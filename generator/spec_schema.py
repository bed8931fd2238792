"""The spec's structure as a JSON Schema, and a located validator for it.

The schema is the single source of truth for which keys exist, their types
and enumerations: ``gen-mixin schema`` prints it for editors, and
:func:`check_structure` walks a located YAML tree with it so every structural
problem comes back with its line and column (and a "did you mean" for
misspelt keys). Meaning (formulas, cross references) is checked afterwards in
``generator.resolve``.
"""

from __future__ import annotations

from typing import Any

from generator.diagnostics import Diagnostics, closest_name, field_key
from generator.yaml_loader import Node

IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
DOTTED = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"

BACKENDS = [
    "FLASH_ATTN",
    "FLASH_ATTN_DIFFKV",
    "TRITON_ATTN",
    "TRITON_ATTN_DIFFKV",
    "TRITON_FLASH_ATTN",
    "ROCM_ATTN",
    "ROCM_SEGMENTED_ATTN",
    "ROCM_AITER_MLA",
    "ROCM_AITER_TRITON_MLA",
    "ROCM_AITER_FA",
    "ROCM_AITER_MLA_SPARSE",
    "XPU_MLA_SPARSE",
    "TORCH_SDPA",
    "FLASHINFER",
    "TRITON_FLASHINFER",
]


DTYPES = ["dtype", "float32", "float16", "bfloat16", "int32", "int64", "bool", "uint8"]


def _expr(description: str) -> dict[str, Any]:
    return {"type": ["string", "integer"], "description": description}


_TEXT = {"type": "string", "description": "Free text; becomes a comment or message."}

SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://github.com/gen-mixin/gen-mixin/spec.schema.json",
    "title": "gen-mixin encoder CUDA graph mixin spec",
    "type": "object",
    "additionalProperties": False,
    "required": [
        "format",
        "name",
        "class_name",
        "docstring",
        "host",
        "modalities",
        "inputs",
        "items",
        "budget",
        "capture",
        "buffers",
        "out_hidden_size",
        "graph_forward",
        "eager_forward",
    ],
    "properties": {
        "format": {
            "type": "integer",
            "enum": [1],
            "description": "Spec format version; 1.",
        },
        "name": {
            "type": "string",
            "description": "The model's display name, used in error messages "
            "and docstrings (e.g. 'MiniMax M3').",
        },
        "class_name": {
            "type": "string",
            "pattern": IDENT,
            "description": "Name of the generated mixin class.",
        },
        "docstring": {"type": "string", "description": "The class docstring."},
        "module_docstring": {
            "type": "string",
            "description": "Optional module docstring placed after the header.",
        },
        "base": {
            "type": "string",
            "enum": ["protocol", "none"],
            "description": "'protocol': the mixin subclasses SupportsEncoderCudaGraph "
            "(and inherits its defaults); 'none': a plain mixin that defines "
            "every method it needs. Default 'protocol'.",
        },
        "defs_import": {
            "type": "string",
            "enum": ["module", "local"],
            "description": "Import the protocol data classes at module top "
            "('module') or inside each method ('local'), as vLLM's "
            "interfaces.py imports them only for type checking. Default 'module'.",
        },
        "host": {
            "type": "object",
            "description": "Attributes the host model provides, name -> type "
            "annotation (a Python type expression over declared imports, "
            "torch, MultiModalConfig and builtins).",
            "additionalProperties": {"type": "string"},
            "propertyNames": {"pattern": IDENT},
            "minProperties": 1,
        },
        "host_methods": {
            "type": "array",
            "items": {"type": "string", "pattern": IDENT},
            "description": "Methods the host model defines that expressions may call "
            "(get_max_frames_per_video()).",
        },
        "imports": {
            "type": "object",
            "description": "Names the generated code imports, per target.",
            "propertyNames": {"pattern": IDENT},
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["vllm", "standalone"],
                "properties": {
                    "vllm": {
                        "type": "string",
                        "pattern": DOTTED,
                        "description": "Module inside vLLM 0.33.0.",
                    },
                    "standalone": {
                        "type": "string",
                        "pattern": DOTTED,
                        "description": "Module in this project (reference_towers.*).",
                    },
                    "type_only": {
                        "type": "boolean",
                        "description": "Imported under TYPE_CHECKING only; "
                        "annotations using it are quoted.",
                    },
                },
            },
        },
        "modalities": {
            "type": "array",
            "items": {"type": "string", "enum": ["image", "video"]},
            "minItems": 1,
            "description": "Modalities the graphs serve.",
        },
        "max_frames_per_video": _expr(
            "Frames per video (EncoderCudaGraphConfig.max_frames_per_video); "
            "only with the video modality. A formula over constants, host "
            "paths and host method calls (get_max_frames_per_video())."
        ),
        "inputs": {
            "type": "object",
            "description": "mm_kwargs keys the mixin reads, in order.",
            "propertyNames": {"pattern": IDENT},
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["kind"],
                "properties": {
                    "kind": {
                        "type": "string",
                        "enum": ["flat", "grid"],
                        "description": "'flat': a tensor whose rows are the items' "
                        "rows back to back; 'grid': one row of named dims per item.",
                    },
                    "dims": {
                        "type": "array",
                        "items": {"type": "string", "pattern": IDENT},
                        "minItems": 1,
                        "description": "grid only: the names of the dims of a row.",
                    },
                    "rows": _expr(
                        "flat only: rows per item, a formula over grid dims, "
                        "constants, input_size and output_tokens. Default input_size."
                    ),
                    "accepts_list": {
                        "type": "boolean",
                        "description": "flat only: the value may be a list of "
                        "tensors, concatenated on read.",
                    },
                    "replay_dtype": _expr(
                        "flat only: cast to this dtype (a host path) before replay."
                    ),
                    "eager_dtype": _expr(
                        "flat only: cast to this dtype (a host path) in the eager forward."
                    ),
                    "video_key": {
                        "type": "string",
                        "pattern": IDENT,
                        "description": "The key this input has in a video batch "
                        "(pixel_values -> pixel_values_videos). The spec's names are "
                        "the image keys; a batch whose first grid arrives under its "
                        "video_key is a video batch. All inputs or none have one.",
                    },
                },
            },
        },
        "constants": {
            "type": "object",
            "description": "Names bound to host attribute paths, read when a "
            "method needs them. Short form: name: path.",
            "propertyNames": {"pattern": IDENT},
            "additionalProperties": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["from"],
                        "properties": {
                            "from": {
                                "type": "string",
                                "description": "Host attribute path.",
                            },
                            "default": {
                                "type": "integer",
                                "description": "The released model's value, used "
                                "by 'gen-mixin plan' and the static checks.",
                            },
                        },
                    },
                ]
            },
        },
        "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["input_size", "output_tokens"],
            "description": "Per-item formulas over grid dims and constants.",
            "properties": {
                "input_size": _expr("EncoderItemSpec.input_size (DP load balance)."),
                "output_tokens": _expr(
                    "EncoderItemSpec.output_tokens: the rows finally written "
                    "to dest for the item."
                ),
                "budget_tokens": _expr(
                    "The tokens budgets count for the item "
                    "(EncoderItemSpec.path_output_tokens['default']), when a tighter "
                    "measure of what the graph computes than output_tokens exists "
                    "(DeepSeek: aligner rows, not span tokens). The dummy batch must "
                    "cover a budget in these tokens."
                ),
                "graph_rows": _expr(
                    "Rows the graph emits for the item, when they differ from "
                    "output_tokens (span assembly adds delimiter rows)."
                ),
            },
        },
        "budget": {
            "type": "object",
            "additionalProperties": False,
            "required": ["min"],
            "properties": {
                "min": _expr(
                    "Smallest token budget: a literal or formula over constants."
                ),
                "why": _TEXT,
            },
            "description": "Budget range; the max is min(max_num_batched_tokens, "
            "max_model_len).",
        },
        "guards": {
            "type": "object",
            "additionalProperties": False,
            "description": "Configurations the graphs refuse, with messages "
            "generated from the spec.",
            "properties": {
                "image_limit_zero": {
                    "type": "string",
                    "enum": ["config", "capture", "off"],
                    "description": "Refuse an image limit of 0 (the tower is "
                    "stubbed out): ValueError in get_encoder_cudagraph_config "
                    "('config') or RuntimeError at capture ('capture').",
                },
                "fp8_static_scales": {
                    "type": "boolean",
                    "description": "Refuse fp8 encoder attention without a "
                    "static scale file (dynamic scales are host-side state).",
                },
                "attention_backend": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["from"],
                    "properties": {
                        "from": {
                            "type": "string",
                            "description": "Host path of the tower's AttentionBackendEnum.",
                        },
                        "allow": {
                            "type": "array",
                            "items": {"type": "string", "enum": BACKENDS},
                            "minItems": 1,
                        },
                        "deny": {
                            "type": "array",
                            "items": {"type": "string", "enum": BACKENDS},
                            "minItems": 1,
                        },
                        "hint": {
                            "type": "string",
                            "description": "What the user should do instead.",
                        },
                        "why": _TEXT,
                    },
                },
            },
        },
        "capture": {
            "type": "object",
            "additionalProperties": False,
            "required": ["dummy", "tensors"],
            "properties": {
                "per_item_tokens": {
                    "type": "string",
                    "enum": ["ceil", "floor"],
                    "description": "k, the output tokens of each of the "
                    "max_batch_size dummy items: ceil (default; the dummy "
                    "batch covers the budget) or floor (GLM).",
                },
                "dummy": {
                    "type": "object",
                    "description": "grid key -> the dummy item's dims, formulas "
                    "over constants, k and max_batch_size.",
                    "additionalProperties": {
                        "type": "array",
                        "items": {"type": ["string", "integer"]},
                    },
                },
                "graph_rows": _expr(
                    "The graph rows the captured batch has room for, when more "
                    "than the dummy batch emits (max_batch_size times the dummy "
                    "item's graph_rows): a formula over constants, k, rows, "
                    "max_batch_size and token_budget. Needs items.budget_tokens; "
                    "buffers that hold graph rows are then declared with "
                    "'allocate' and this many rows."
                ),
                "tensors": {
                    "type": "object",
                    "description": "flat input -> its capture buffer.",
                    "additionalProperties": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["shape", "dtype"],
                        "properties": {
                            "shape": {
                                "type": "array",
                                "items": {"type": ["string", "integer"]},
                                "minItems": 1,
                            },
                            "dtype": _expr(
                                "'dtype' (the manager's dtype) or a host path."
                            ),
                            "fill": {"type": "string", "enum": ["zeros", "randn"]},
                            "why": _TEXT,
                        },
                    },
                },
                "why": _TEXT,
            },
        },
        "metadata": {
            "type": "array",
            "description": "Builders run at capture (on the dummy grids) and at "
            "replay (on the real grids), each returning a dict of buffers.",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["call", "provides"],
                "properties": {
                    "call": {
                        "type": "string",
                        "description": "The call, with the arguments both phases pass.",
                    },
                    "capture_kwargs": {
                        "type": "object",
                        "additionalProperties": {
                            "type": ["string", "integer", "boolean", "null"]
                        },
                    },
                    "replay_kwargs": {
                        "type": "object",
                        "additionalProperties": {
                            "type": ["string", "integer", "boolean", "null"]
                        },
                    },
                    "provides": {
                        "type": "array",
                        "items": {"type": "string", "pattern": IDENT},
                        "minItems": 1,
                        "description": "Keys of the returned dict that are buffers.",
                    },
                    "why": _TEXT,
                },
            },
        },
        "buffers": {
            "type": "object",
            "description": "The captured buffers in order (buffer_keys) with their "
            "replay rules. {} is the default: zero, then copy rows on dim 0.",
            "propertyNames": {"pattern": IDENT},
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "rows_dim": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": 3,
                        "description": "The axis that holds rows (rotary planes: 1).",
                    },
                    "pad": {
                        "type": "string",
                        "enum": ["trailing_sequence", "repeat_last"],
                        "description": "cu_seqlens tail: one padding sequence up to "
                        "the captured rows, or zero-length sequences.",
                    },
                    "slots": _expr(
                        "cu_seqlens entries captured (trailing_sequence: at least "
                        "max_batch_size + 2)."
                    ),
                    "host_scalar": {
                        "type": "boolean",
                        "description": "A 0-dim CPU int32 (max_seqlen): its capture "
                        "value is baked into the kernel launch.",
                    },
                    "replay": {
                        "type": "string",
                        "enum": ["copy", "drop"],
                        "description": "host_scalar only: send the real value at "
                        "replay ('copy', a no-op for the graph) or leave it out.",
                    },
                    "shape": {
                        "type": "array",
                        "items": {"type": ["string", "integer"]},
                        "minItems": 0,
                        "description": "Captured shape, for gen-mixin plan and the static "
                        "checks (builder buffers only; capture tensors have theirs): "
                        "expressions over constants, sizes, k, rows, max_batch_size, "
                        "token_budget.",
                    },
                    "dtype": {
                        "type": "string",
                        "enum": DTYPES,
                        "description": "Captured dtype, for gen-mixin plan ('dtype': the "
                        "manager's).",
                    },
                    "allocate": {
                        "type": "boolean",
                        "description": "Builder buffers only: capture allocates the "
                        "buffer at its declared shape and dtype (zeros) and copies the "
                        "builder's dummy value into its leading rows, for buffers that "
                        "hold more rows than the dummy batch (capture.graph_rows).",
                    },
                    "set_by": {
                        "type": "string",
                        "pattern": IDENT,
                        "description": "host_scalar only: the capture keyword argument of "
                        "its builder that sets its capture value (checked to bound every "
                        "sequence: at least rows).",
                    },
                    "why": _TEXT,
                },
            },
        },
        "sizes": {
            "type": "object",
            "description": "Released model sizes the generated code does not read "
            "(e.g. the rotary width), used by gen-mixin plan for buffer shapes.",
            "propertyNames": {"pattern": IDENT},
            "additionalProperties": {"type": "integer", "minimum": 0},
        },
        "out_hidden_size": _expr("Width of the output rows: a host path or formula."),
        "graph_forward": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "Statements of the captured forward: 'name = call(...)' "
            "steps, the last one the output. Names: buffers, earlier steps, and "
            "'rest' (the buffers not named, as a dict).",
        },
        "eager_forward": {
            "type": "object",
            "additionalProperties": False,
            "required": ["steps"],
            "properties": {
                "per_item": {
                    "type": "boolean",
                    "description": "Run the steps per item (flat inputs are the "
                    "item's rows, grid dims its values) and concatenate.",
                },
                "steps": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                },
                "empty_width": _expr(
                    "per_item only: width of the (0, width) result for no items."
                ),
            },
        },
        "postprocess": {
            "type": "object",
            "additionalProperties": False,
            "required": ["span_assembly"],
            "properties": {
                "span_assembly": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["types", "content", "delimiters"],
                    "description": "Build each item's span from graph rows and "
                    "learned delimiter rows placed by a host-side types tensor.",
                    "properties": {
                        "types": {
                            "type": "string",
                            "pattern": IDENT,
                            "description": "Flat CPU input holding one type id per span position.",
                        },
                        "content": {
                            "type": "string",
                            "pattern": IDENT,
                            "description": "Imported constant: the type of graph rows.",
                        },
                        "delimiters": {
                            "type": "object",
                            "minProperties": 1,
                            "propertyNames": {"pattern": IDENT},
                            "additionalProperties": {"type": "string"},
                            "description": "Imported type constant -> host parameter.",
                        },
                        "why": _TEXT,
                    },
                },
            },
        },
    },
}


def _type_ok(node: Node, expected: str | list[str]) -> bool:
    kinds = [expected] if isinstance(expected, str) else expected
    kind = node.kind
    for want in kinds:
        if want == "object" and kind == "mapping":
            return True
        if want == "array" and kind == "sequence":
            return True
        if want == "string" and kind == "string":
            return True
        if want == "integer" and kind == "integer":
            return True
        if want == "boolean" and kind == "boolean":
            return True
        if want == "null" and kind == "null":
            return True
        if want == "number" and kind in ("integer", "number"):
            return True
    return False


def _describe(expected: str | list[str]) -> str:
    kinds = [expected] if isinstance(expected, str) else expected
    words = {
        "object": "a mapping",
        "array": "a list",
        "string": "a string",
        "integer": "an integer",
        "boolean": "true or false",
        "null": "null",
        "number": "a number",
    }
    return " or ".join(words[k] for k in kinds)


def check_structure(
    node: Node, schema: dict[str, Any], path: str, diags: Diagnostics
) -> bool:
    """Report every structural problem below ``node``; True if none."""
    import re

    before = len(diags.items)
    if "anyOf" in schema:
        options = schema["anyOf"]
        for option in options:
            if _type_ok(node, option.get("type", [])):
                return check_structure(node, option, path, diags)
        wanted = [o["type"] for o in options]
        flat = [t for w in wanted for t in ([w] if isinstance(w, str) else w)]
        diags.error(node.location, path, f"expected {_describe(flat)}, got {node.kind}")
        return False
    expected = schema.get("type")
    if expected is not None and not _type_ok(node, expected):
        diags.error(
            node.location, path, f"expected {_describe(expected)}, got {node.kind}"
        )
        return False
    if "enum" in schema and node.value not in schema["enum"]:
        choices = ", ".join(str(c) for c in schema["enum"])
        diags.error(
            node.location,
            path,
            f"unknown value {node.value!r} (expected one of: {choices})",
        )
    if "pattern" in schema and isinstance(node.value, str):
        if not re.match(schema["pattern"], node.value):
            diags.error(
                node.location, path, f"{node.value!r} is not a valid identifier"
            )
    if node.kind == "integer":
        if "minimum" in schema and node.value < schema["minimum"]:
            diags.error(node.location, path, f"must be >= {schema['minimum']}")
        if "maximum" in schema and node.value > schema["maximum"]:
            diags.error(node.location, path, f"must be <= {schema['maximum']}")
    if node.kind == "sequence":
        if len(node.value) < schema.get("minItems", 0):
            diags.error(
                node.location, path, f"needs at least {schema['minItems']} item(s)"
            )
        item_schema = schema.get("items")
        if item_schema:
            for i, child in enumerate(node.value):
                check_structure(child, item_schema, f"{path}[{i}]", diags)
    if node.kind == "mapping":
        props: dict[str, Any] = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        keys = node.key_locations or {}
        if len(node.value) < schema.get("minProperties", 0):
            diags.error(node.location, path, "must not be empty")
        for key, child in node.value.items():
            shown = field_key(key)
            child_path = f"{path}.{shown}" if path else shown
            key_loc = keys.get(key, child.location)
            name_rule = schema.get("propertyNames", {}).get("pattern")
            if name_rule and not re.match(name_rule, key):
                diags.error(key_loc, child_path, f"{key!r} is not a valid identifier")
            if key in props:
                check_structure(child, props[key], child_path, diags)
            elif extra is False:
                close = closest_name(key, props)
                hint = f"; did you mean {close!r}?" if close else ""
                allowed = ", ".join(props)
                diags.error(
                    key_loc, child_path, f"unknown key{hint} (allowed: {allowed})"
                )
            elif isinstance(extra, dict):
                check_structure(child, extra, child_path, diags)
        for key in schema.get("required", []):
            if key not in node.value:
                diags.error(
                    node.location,
                    f"{path}.{key}" if path else key,
                    "required key is missing",
                )
    return len(diags.items) == before
