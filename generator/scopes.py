"""The names generated code binds, and the names each spec field may use.

Declared once, read everywhere: the resolver builds every formula's
:class:`~generator.formulas.Scope` from :data:`FIELD_SCOPES` and refuses spec
names that would collide with :data:`METHODS`' parameters and locals; the
emitters print method signatures from :data:`METHODS`; the docs list each
field's names from :data:`FIELD_SCOPES`; a test parses every generated
method and checks that each name it binds is declared here or is a spec name.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from generator.formulas import Scope


class NameKind(Enum):
    """What a name a spec declares stands for (the value reads in messages)."""

    HOST = "host attribute"
    HOST_METHOD = "host method"
    IMPORT = "import"
    CONSTANT = "constant"
    SIZE = "size"
    FLAT = "flat input"
    GRID = "grid input"  # grids and per-item counts
    DIM = "dim"
    AXIS_DIM = "capture axis dim"
    BUFFER = "buffer"
    GRAPH_STEP = "graph_forward step"
    EAGER_STEP = "eager_forward step"
    CAPTURE_LET = "capture intermediate"  # capture.let
    POST_STEP = "postprocess step"
    COUNT_STEP = "items.output_tokens step"  # an item's token count, on the host
    BUILDER_RESULT = "builder result"  # chosen by the generator, never collides
    BUILDER_STEP = "metadata step"  # metadata.steps: the builder's own names


# -- names in scope for each spec field -------------------------------------------

#: Built-in names a formula may use, with what they hold (for the docs).
BUILTIN_MEANINGS: dict[str, str] = {
    "k": "tokens of each dummy item: `token_budget / max_batch_size`, rounded as "
    "`capture.per_item_tokens` says",
    "units": "the fixed-size views (tiles, crops, chunks) captured: "
    "`capture.units` for this budget",
    "unit_index": "in `capture.unit_dummy`: the unit's place, `0 .. units - 1`",
    "rows": "input rows of the dummy batch (`max_batch_size` items)",
    "token_budget": "the budget being captured",
    "max_batch_size": "the manager's item limit per batch",
    "max_frames_per_batch": "the manager's frame limit per batch",
    "frames_per_item": "`max(max_frames_per_batch // max_batch_size, 1)`",
    "device": "capture: the manager's device; replay: the first flat buffer's",
    "dtype": "capture: the manager's dtype; replay: the first flat buffer's",
    "rest": "the buffers no step names, as a dict",
    "input_size": "the item's `items.input_size`",
    "output_tokens": "the item's `items.output_tokens`",
    "max_num_batched_tokens": "the scheduler's token limit per step",
    "max_model_len": "the model's context length",
    "path_output": "the path's output rows for the batch (a graph's padded output "
    "buffer or the eager forward's rows)",
    "graph_rows": "the graph rows of the batch's items (`items.graph_rows`, else "
    "`output_tokens`, summed): `path_output[:graph_rows]` are the real rows",
    "item_output": "the item's graph rows of `path_output`",
}


@dataclass(frozen=True)
class FieldScope:
    """What the formulas of one kind of field may mention."""

    kinds: frozenset[NameKind] = frozenset()
    builtins: tuple[str, ...] = ()
    host_paths: bool = False
    calls: bool = False  # of host paths and imported helpers
    literals: bool = False  # True / False / None
    #: A forward step: methods, attributes and subscripts of values,
    #: ``torch.*``, list/tuple displays, strings and floats, ``/`` and ``~``.
    tensor_ops: bool = False
    #: ``int(x)``: post-processing steps, which run on the host after the graph.
    host_ints: bool = False

    def scope(self, names: Mapping[NameKind, Iterable[str]], extra=()) -> Scope:
        """The formula scope for a spec whose declared names are ``names``."""
        declared = {n for kind in self.kinds for n in names.get(kind, ())}
        return Scope(
            frozenset(declared | set(self.builtins) | set(extra)),
            host_roots=(
                frozenset(names.get(NameKind.HOST, ()))
                | frozenset(names.get(NameKind.HOST_METHOD, ()))
                if self.host_paths
                else frozenset()
            ),
            callables=(
                frozenset(names.get(NameKind.IMPORT, ())) if self.calls else frozenset()
            ),
            allow_calls=self.calls,
            allow_literals=self.literals,
            tensor_ops=self.tensor_ops,
            host_ints=self.host_ints,
        )

    def describe(self) -> str:
        """The names in scope, as the docs list them."""
        parts = [f"{k.value}s" for k in NameKind if k in self.kinds]
        if self.host_paths:
            parts.append("host paths")
        if self.calls:
            parts.append("calls of host methods and imported helpers")
        if self.tensor_ops:
            parts.append("tensor expressions (methods, subscripts, `torch.*`)")
        if self.host_ints:
            parts.append("`int()`")
        parts += [f"`{b}`" for b in self.builtins]
        return ", ".join(parts) if parts else "literals only"


_K = NameKind
CAPTURE_SIZES = ("k", "rows", "units", "max_batch_size", "token_budget")
DUMMY_NAMES = ("k", "max_batch_size", "token_budget", "max_frames_per_batch")
CAPTURE_KWARG_NAMES = (*DUMMY_NAMES, "frames_per_item", "rows", "units")
#: Built-in names of a capture of items (``capture.dummy``), which a unit
#: capture (``capture.units``) does not bind, and the reverse.
ITEM_CAPTURE_NAMES = frozenset({"k", "rows", "frames_per_item"})
UNIT_CAPTURE_NAMES = frozenset({"units", "unit_index"})
#: Constants, capture-axis dims and the capture intermediates
#: (``capture.let``) declared so far.
_CAPTURE_VALUES = frozenset({_K.CONSTANT, _K.AXIS_DIM, _K.CAPTURE_LET})

FIELD_SCOPES: dict[str, FieldScope] = {
    "host_path": FieldScope(host_paths=True),
    "items": FieldScope(frozenset({_K.DIM, _K.CONSTANT})),
    "flat_rows": FieldScope(
        frozenset({_K.DIM, _K.CONSTANT}), ("input_size", "output_tokens")
    ),
    "constants": FieldScope(frozenset({_K.CONSTANT})),
    "budget_max": FieldScope(
        frozenset({_K.CONSTANT}), ("max_num_batched_tokens", "max_model_len")
    ),
    "constants_and_host": FieldScope(frozenset({_K.CONSTANT}), host_paths=True),
    "max_frames_per_video": FieldScope(
        frozenset({_K.CONSTANT}), host_paths=True, calls=True
    ),
    "capture_let": FieldScope(_CAPTURE_VALUES, (*DUMMY_NAMES, "frames_per_item")),
    "capture_assert": FieldScope(_CAPTURE_VALUES, (*DUMMY_NAMES, "frames_per_item")),
    "dummy": FieldScope(_CAPTURE_VALUES, (*DUMMY_NAMES, "frames_per_item")),
    "units": FieldScope(
        frozenset({_K.CONSTANT, _K.AXIS_DIM}),
        ("token_budget", "max_batch_size", "max_frames_per_batch"),
    ),
    "unit_dummy": FieldScope(
        frozenset({_K.CONSTANT, _K.AXIS_DIM}),
        (
            "token_budget",
            "max_batch_size",
            "max_frames_per_batch",
            "units",
            "unit_index",
        ),
    ),
    "tensor_shape": FieldScope(_CAPTURE_VALUES, CAPTURE_SIZES, host_paths=True),
    "tensor_dtype": FieldScope(builtins=("dtype",), host_paths=True),
    "graph_rows": FieldScope(
        _CAPTURE_VALUES, ("k", "rows", "max_batch_size", "token_budget")
    ),
    "builder_call": FieldScope(
        frozenset({_K.CONSTANT, _K.FLAT, _K.GRID, _K.AXIS_DIM}),
        ("device", "dtype", "max_batch_size", "max_frames_per_batch"),
        host_paths=True,
        calls=True,
        literals=True,
    ),
    "builder_steps": FieldScope(
        frozenset({_K.CONSTANT, _K.FLAT, _K.GRID, _K.AXIS_DIM, _K.BUILDER_STEP}),
        ("device", "dtype", "max_batch_size", "max_frames_per_batch"),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
    ),
    # A per-item builder's steps: the item's dims instead of the batch's
    # inputs (the builder's results are joined over the items).
    "builder_steps_per_item": FieldScope(
        frozenset({_K.CONSTANT, _K.DIM, _K.AXIS_DIM, _K.BUILDER_STEP}),
        ("device", "dtype", "max_batch_size", "max_frames_per_batch"),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
    ),
    "capture_value": FieldScope(
        frozenset({_K.CONSTANT, _K.AXIS_DIM, _K.CAPTURE_LET}),
        CAPTURE_KWARG_NAMES,
    ),
    "capture_kwargs": FieldScope(
        frozenset({_K.CONSTANT, _K.FLAT, _K.GRID, _K.AXIS_DIM, _K.CAPTURE_LET}),
        ("device", "dtype", *CAPTURE_KWARG_NAMES),
        host_paths=True,
        literals=True,
    ),
    "replay_kwargs": FieldScope(
        frozenset({_K.CONSTANT, _K.FLAT, _K.GRID, _K.AXIS_DIM}),
        ("device", "dtype", "max_batch_size", "max_frames_per_batch"),
        host_paths=True,
        literals=True,
    ),
    "slots": FieldScope(
        frozenset({_K.CONSTANT}),
        ("max_batch_size", "max_frames_per_batch", "token_budget"),
    ),
    "buffer_shape": FieldScope(
        frozenset({_K.CONSTANT, _K.SIZE, _K.AXIS_DIM, _K.CAPTURE_LET}),
        (*CAPTURE_SIZES, "max_frames_per_batch"),
    ),
    "forward_context": FieldScope(
        frozenset({_K.CONSTANT}), host_paths=True, calls=True, literals=True
    ),
    "graph_forward": FieldScope(
        frozenset({_K.BUFFER, _K.GRAPH_STEP}),
        ("rest",),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
    ),
    "eager_steps": FieldScope(
        frozenset({_K.FLAT, _K.CONSTANT, _K.GRID, _K.EAGER_STEP}),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
    ),
    "eager_steps_per_item": FieldScope(
        frozenset({_K.FLAT, _K.CONSTANT, _K.GRID, _K.DIM, _K.EAGER_STEP}),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
    ),
    "post_steps": FieldScope(
        frozenset({_K.CONSTANT, _K.GRID, _K.POST_STEP}),
        ("path_output", "graph_rows"),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
        host_ints=True,
    ),
    # An item's token count from host steps (items.output_tokens.steps): its
    # dims, the constants, host paths and helpers; run once per item.
    "count_steps": FieldScope(
        frozenset({_K.CONSTANT, _K.DIM, _K.COUNT_STEP}),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
    ),
    # Every input of the selected batch, cut to the item (see
    # generator/emitters/postprocess.py).
    "post_steps_per_item": FieldScope(
        frozenset({_K.CONSTANT, _K.FLAT, _K.GRID, _K.DIM, _K.POST_STEP}),
        ("path_output", "item_output"),
        host_paths=True,
        calls=True,
        literals=True,
        tensor_ops=True,
        host_ints=True,
    ),
}

# -- what each generated method binds ----------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    annotation: str = ""  # ``{Name}`` marks a protocol data class (quoted when local)
    default: str | None = None


@dataclass(frozen=True)
class Method:
    """A generated function: its signature, the locals its body may bind, and
    the kinds of spec names its body binds or reads."""

    name: str
    params: tuple[Param, ...]
    returns: str
    locals: tuple[str, ...] = ()
    #: Locals named after spec names: ``"item_{}"`` for every name of ``kind``.
    derived: tuple[tuple[str, NameKind], ...] = ()
    spec_kinds: frozenset[NameKind] = frozenset()
    #: One parameter per line (with a trailing comma), as vLLM writes it.
    exploded: bool = False

    def bound_names(self, spec_names: Mapping[NameKind, Iterable[str]]) -> set[str]:
        """Every name the generated body may bind for a spec with ``spec_names``
        (spec names themselves excluded)."""
        out = {p.name for p in self.params} | set(self.locals)
        for pattern, kind in self.derived:
            out.update(pattern.format(n) for n in spec_names.get(kind, ()))
        out.update(spec_names.get(NameKind.BUILDER_RESULT, ()) if self.builds else ())
        return out

    @property
    def builds(self) -> bool:
        return NameKind.BUILDER_RESULT in self.spec_kinds


SELF = Param("self")
MM_KWARGS = Param("mm_kwargs", "dict[str, Any]")
PATH = Param("path", "str", '"default"')
_READS_INPUTS = frozenset({_K.CONSTANT, _K.GRID, _K.DIM})

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "get_encoder_cudagraph_config",
            (SELF,),
            "{EncoderCudaGraphConfig}",
            (
                "AttentionBackendEnum",
                "EncoderCudaGraphConfig",
                "EncoderCudaGraphPathConfig",
                "mm_config",
                "backend",
                "modalities",
            ),
            spec_kinds=frozenset({_K.CONSTANT}),
        ),
        Method(
            "get_encoder_cudagraph_budget_range",
            (SELF, Param("vllm_config", '"VllmConfig"')),
            "tuple[int, int]",
            ("min_budget", "max_budget", "max_num_batched_tokens", "max_model_len"),
            spec_kinds=frozenset({_K.CONSTANT}),
        ),
        Method(
            "get_encoder_cudagraph_item_specs",
            (SELF, MM_KWARGS),
            "list[{EncoderItemSpec}]",
            (
                "EncoderItemSpec",
                "keys",
                "grids",
                "units",
                "capture_keys",
                "item_specs",
                "item_tokens",
                "item_bound",
            ),
            spec_kinds=_READS_INPUTS | {_K.IMPORT, _K.COUNT_STEP},
        ),
        Method(
            "select_encoder_cudagraph_items",
            (SELF, MM_KWARGS, Param("indices", "list[int]")),
            "dict[str, Any]",
            ("keys", "grids", "units", "selected", "ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG"),
            spec_kinds=_READS_INPUTS,
        ),
        Method(
            "prepare_encoder_cudagraph_capture_inputs",
            (
                SELF,
                Param("token_budget", "int"),
                Param("max_batch_size", "int"),
                Param("max_frames_per_batch", "int"),
                Param("device", "torch.device"),
                Param("dtype", "torch.dtype"),
                PATH,
                Param("axis_keys", "tuple[Hashable, ...] | None", "None"),
            ),
            "{EncoderCudaGraphCaptureInputs}",
            (
                "AttentionBackendEnum",
                "EncoderCudaGraphCaptureInputs",
                "backend",
                "k",
                "frames_per_item",
                "rows",
                "units",
                "unit_index",
                "offsets",
                "kept",
                "tensor",
                "held",
                "needed",
                "by_item",
                "_",
            ),
            # A tensor's own dummy rows; a padded input's dummy sizes; an
            # allocated buffer's dummy value (its builder names it the same).
            (
                ("{}_rows", _K.FLAT),
                ("{}_sizes", _K.GRID),
                ("{}_dummy", _K.BUFFER),
                # A tensors input's items, one by one (per-item builders).
                ("{}_items", _K.GRID),
                ("{}_item", _K.GRID),
            ),
            _READS_INPUTS
            | {
                _K.FLAT,
                _K.BUFFER,
                _K.IMPORT,
                _K.BUILDER_RESULT,
                _K.BUILDER_STEP,
                _K.AXIS_DIM,
                _K.CAPTURE_LET,
            },
            exploded=True,
        ),
        Method(
            "prepare_encoder_cudagraph_replay_buffers",
            (
                SELF,
                MM_KWARGS,
                Param("max_batch_size", "int"),
                Param("max_frames_per_batch", "int"),
                PATH,
            ),
            "{EncoderCudaGraphReplayBuffers}",
            ("EncoderCudaGraphReplayBuffers", "keys", "axis_keys", "by_item"),
            # A padded input's sizes, and a tensors input's items one by one,
            # for builders.
            (("{}_sizes", _K.GRID), ("{}_items", _K.GRID), ("{}_item", _K.GRID)),
            spec_kinds=frozenset(
                {
                    _K.CONSTANT,
                    _K.GRID,
                    _K.DIM,  # bound item by item for a per-item builder
                    _K.FLAT,
                    _K.IMPORT,
                    _K.BUILDER_RESULT,
                    _K.BUILDER_STEP,
                    _K.AXIS_DIM,
                }
            ),
            exploded=True,
        ),
        Method(
            "encoder_cudagraph_forward",
            (SELF, Param("inputs", "dict[str, torch.Tensor]"), PATH),
            "torch.Tensor",
            ("_",),  # a tuple target's discarded part
            spec_kinds=frozenset({_K.CONSTANT, _K.BUFFER, _K.GRAPH_STEP, _K.IMPORT}),
            exploded=True,
        ),
        Method(
            "encoder_eager_forward",
            (SELF, MM_KWARGS, PATH),
            "torch.Tensor",
            ("keys", "outputs", "position", "_"),
            (("item_{}", _K.FLAT), ("{}_offset", _K.FLAT), ("item_{}", _K.GRID)),
            frozenset(
                {_K.CONSTANT, _K.FLAT, _K.GRID, _K.DIM, _K.EAGER_STEP, _K.IMPORT}
            ),
            exploded=True,
        ),
        Method(
            "postprocess_encoder_output",
            (
                SELF,
                Param("outputs", "dict[str, torch.Tensor]"),
                Param("indices", "list[int]"),
                Param("per_item_out_tokens", "list[int]"),
                Param("dest", "dict[int, torch.Tensor] | list[torch.Tensor | None]"),
                Param("clone", "bool", "False"),
                Param("batch_mm_kwargs", "dict[str, Any] | None", "None"),
            ),
            "None",
            (
                "graph_out",
                "types",
                "num_rows",
                "span_lengths",
                "is_content",
                "src_index",
                "delimiters",
                "table",
                "spans",
                "offset",
                "idx",
                "length",
                "path_rows",
                "path_offsets",
                "position",
                "item_parts",
                "path_name",
                "per_item",
                "item_rows",
                "row_start",
                "path_output",
                "graph_rows",
                "item_output",
                "post_rows",
                "item_tokens",
                "batch_tokens",
                "aliased",
                "absent_rows",
                "path_out",
                "_",
            ),
            # Per-item steps: each input read, cut to the item.
            (
                ("batch_{}", _K.FLAT),
                ("item_{}", _K.FLAT),
                ("{}_offset", _K.FLAT),
                ("item_{}", _K.GRID),
            ),
            spec_kinds=_READS_INPUTS | {_K.IMPORT, _K.POST_STEP},
            exploded=True,
        ),
        Method("get_input_modality", (SELF, MM_KWARGS), "str"),
        Method(
            "_capture_axes",
            (SELF,),
            "tuple[tuple[Hashable, ...], ...]",
            spec_kinds=frozenset({_K.CONSTANT}),
        ),
        Method(
            "_capture_axis_keys",
            (SELF, MM_KWARGS),
            "tuple[Hashable, ...]",
            ("keys", "needs", "axis", "need", "axes"),
            spec_kinds=_READS_INPUTS,
        ),
        Method(
            "_covering_key",
            (
                Param("keys", "tuple[Hashable, ...]"),
                Param("need", "tuple[int, ...]"),
            ),
            "Hashable",
            ("key", "parts", "p", "n"),
        ),
        # Axes with beyond_keys: eager (items no key covers run eagerly).
        Method(
            "_beyond_keys",
            (
                Param("keys", "tuple[Hashable, ...]"),
                Param("need", "tuple[int, ...]"),
            ),
            "bool",
            ("key", "parts", "p", "n"),
        ),
        Method(
            "_key_or_need",
            (
                Param("keys", "tuple[Hashable, ...]"),
                Param("need", "tuple[int, ...]"),
            ),
            "Hashable",
        ),
        # The input checks of item specs and selection (emitters/input_checks.py).
        Method(
            "_checked_grids",
            (SELF, MM_KWARGS, Param("indices", "list[int] | None", "None")),
            "dict[str, list[Any]]",
            ("keys", "num_items", "index"),
            spec_kinds=_READS_INPUTS,
        ),
        # Helpers: no spec name reaches them.
        Method("_modality_keys", (SELF, MM_KWARGS), "dict[str, str]"),
        Method(
            "_check_one_modality",
            (
                MM_KWARGS,
                Param("image", "dict[str, str]"),
                Param("video", "dict[str, str]"),
            ),
            "None",
            ("own", "a", "b", "k"),
        ),
        Method(
            "_check_host_values",
            (Param("key", "str"), Param("tensor", "torch.Tensor")),
            "None",
        ),
        Method(
            "_grid_values",
            (MM_KWARGS, Param("key", "str"), Param("width", "int")),
            "list[list[int]]",
            ("grid", "rows", "index", "row", "v", "i"),
        ),
        Method(
            "_count_values",
            (MM_KWARGS, Param("key", "str"), Param("least", "int", "0")),
            "list[int]",
            ("counts", "values", "index", "value", "i"),
        ),
        Method(
            "_padded_values",
            (
                MM_KWARGS,
                Param("key", "str"),
                Param("item_shape", "tuple[int, ...] | None"),
            ),
            "list[int]",
            ("value", "parts", "shapes", "sizes", "index", "part", "shape", "want"),
        ),
        Method(
            "_tensor_values",
            (
                MM_KWARGS,
                Param("key", "str"),
                Param("shape", "tuple[int | str, ...]"),
                Param("dims", "tuple[str, ...]"),
            ),
            "list[tuple[int, ...]]",
            (
                "value",
                "want",
                "items",
                "index",
                "part",
                "item",
                "size",
                "fixed",
                "positions",
                "dim",
                "p",
            ),
        ),
        Method(
            "_check_same_sizes",
            (Param("inputs", "dict[str, list[int]]"),),
            "None",
            ("first", "sizes", "others", "key", "other", "index", "size", "theirs"),
        ),
        Method(
            "_list_lengths",
            (MM_KWARGS, Param("key", "str"), Param("least", "int", "0")),
            "list[int]",
            ("items", "index", "units", "unit"),
        ),
        Method(
            "_unit_grid_values",
            (MM_KWARGS, Param("key", "str"), Param("width", "int")),
            "list[list[int]]",
            ("grid", "part", "shapes"),
        ),
        Method(
            "_check_unit_shapes",
            (MM_KWARGS, Param("key", "str"), Param("shapes", "list[tuple[int, ...]]")),
            "None",
            ("units", "i", "j", "item", "unit", "index", "position", "shape"),
        ),
        Method(
            "_num_items",
            (Param("inputs", "dict[str, list[Any]]"),),
            "int",
            ("counts", "key", "values", "listed", "k", "n"),
        ),
        Method(
            "_mismatch",
            (
                Param("index", "int"),
                Param("derived", "tuple[str, Any]"),
                Param("sources", "dict[str, Any]"),
                Param("rules", "list[tuple[str, int]]"),
                Param("constants", "dict[str, int]"),
            ),
            "ValueError",
            (
                "key",
                "row",
                "given",
                "expected",
                "values",
                "k",
                "v",
                "rule",
                "value",
                "name",
            ),
        ),
        Method(
            "_check_rows",
            (
                MM_KWARGS,
                Param("key", "str"),
                Param("rows", "int"),
                Param("num_items", "int"),
                Param("per_item", "str"),
                Param("row_shape", "tuple[int, ...] | None", "None"),
                Param("accepts_list", "bool", "False"),
                Param("takes_bool", "bool", "False"),
            ),
            "None",
            # fold_ranks and unit_width: keyword-only parameters, only in a
            # module whose flat inputs fold (``inputs.<key>.fold_ranks``) or
            # pad units (``inputs.<key>.pads_units``).
            ("value", "parts", "part", "held", "fold_ranks", "unit_width"),
        ),
        Method(
            "_check_multiples",
            (
                Param("key", "str"),
                Param("rows", "list[Any]"),
                Param("rules", "tuple[tuple[int, str, int], ...]"),
            ),
            "None",
            ("index", "row", "values", "position", "dim", "divisor"),
        ),
        Method(
            "_check_units",
            (
                Param("grid_key", "str"),
                Param("grid", "list[Any]"),
                Param("count_key", "str"),
                Param("counts", "list[int]"),
            ),
            "None",
            (),
        ),
        Method(
            "_check_span_types",
            (
                MM_KWARGS,
                Param("key", "str"),
                Param("kinds", "dict[str, int]"),
                Param("content", "str"),
                Param("content_rows", "list[int]"),
                Param("lengths", "list[int]"),
            ),
            "None",
            (
                "types",
                "known",
                "position",
                "names",
                "name",
                "value",
                "running",
                "ends",
                "found",
                "index",
                "i",
                "n",
            ),
        ),
        Method(
            "_check_indices",
            (Param("indices", "list[int]"), Param("num_items", "int")),
            "None",
            ("index",),
        ),
        Method(
            "_grid_rows",
            (MM_KWARGS, Param("key", "str")),
            "list[list[int]]",
            ("grid", "row", "v"),
        ),
        Method(
            "_counts",
            (MM_KWARGS, Param("key", "str")),
            "list[int]",
            ("counts", "v"),
        ),
        Method(
            "_list_units",
            (MM_KWARGS, Param("key", "str")),
            "list[torch.Tensor]",
            ("unit", "units"),
        ),
        Method(
            "_register_captured_rows",
            (SELF, Param("cu_seqlens", "torch.Tensor"), Param("rows", "int")),
            "None",
            ("registry", "ptr", "ref", "p", "_"),
        ),
        Method(
            "_pad_with_trailing_sequence",
            (SELF, Param("dst", "torch.Tensor"), Param("src", "torch.Tensor")),
            "None",
            ("entry", "n"),
        ),
        Method(
            "_fold_leading",
            (Param("value", "torch.Tensor"), Param("ranks", "tuple[int, ...]")),
            "torch.Tensor",
        ),
        Method(
            "_concat_rows",
            (Param("value", "torch.Tensor | list[torch.Tensor]"),),
            "torch.Tensor",
        ),
        Method("_check_host_callees", (SELF,), "None"),
        Method(
            "_host_modules",
            (
                Param("model", "Any"),
                Param("path", "str"),
                Param("what", "str"),
                Param("tensor_last", "bool"),
            ),
            "Any",
            ("value", "shown", "parts", "depth", "part", "held"),
        ),
        Method(
            "_require_module_callee",
            (
                Param("model", "Any"),
                Param("path", "str"),
                Param("tensor_method", "bool", "False"),
            ),
            "None",
            (
                "owner_path",
                "_",
                "name",
                "what",
                "owner",
                "callee",
                "method",
                "bound",
                "static",
            ),
        ),
        Method(
            "_require_module_list",
            (Param("model", "Any"), Param("path", "str")),
            "None",
            ("what", "modules"),
        ),
        Method(
            "_select_rows",
            (
                Param("flat", "torch.Tensor"),
                Param("sizes", "list[int]"),
                Param("indices", "list[int]"),
            ),
            "torch.Tensor",
            ("offsets", "i"),
        ),
        Method(
            "_select_grid",
            (
                Param("rows", "list[list[int]]"),
                Param("indices", "list[int]"),
                Param("width", "int"),
            ),
            "torch.Tensor",
            ("i",),
        ),
        Method(
            "_split_units",
            (Param("units", "list"), Param("counts", "list[int]")),
            "list[list]",
            ("offsets", "a", "b"),
        ),
        Method(
            "_unit_indices",
            (Param("counts", "list[int]"), Param("indices", "list[int]")),
            "list[int]",
            ("offsets", "u", "i"),
        ),
        Method(
            "_select_items",
            (Param("items", "list"), Param("indices", "list[int]")),
            "list",
            ("i",),
        ),
        Method(
            "_select_counts",
            (Param("counts", "list[int]"), Param("indices", "list[int]")),
            "torch.Tensor",
            ("i",),
        ),
        # Padded inputs (kind: padded).
        Method(
            "_padded_sizes",
            (Param("value", "torch.Tensor | list[torch.Tensor]"),),
            "list[int]",
            ("part",),
        ),
        Method(
            "_select_padded",
            (
                Param("value", "torch.Tensor | list[torch.Tensor]"),
                Param("indices", "list[int]"),
            ),
            "torch.Tensor | list[torch.Tensor]",
            ("i",),
        ),
        Method(
            "_stack_padded",
            (
                Param("value", "torch.Tensor | list[torch.Tensor]"),
                Param("pad_value", "int"),
            ),
            "torch.Tensor",
            ("part", "first", "widest", "sizes", "stacked", "row", "size"),
        ),
        Method(
            "_copy_padded",
            (
                Param("dst", "torch.Tensor"),
                Param("src", "torch.Tensor"),
                Param("pad_value", "int"),
            ),
            "None",
            ("size",),
        ),
        # Tensors inputs (kind: tensors).
        Method(
            "_tensor_dims",
            (
                Param("value", "torch.Tensor | list[torch.Tensor]"),
                Param("positions", "tuple[int, ...]"),
            ),
            "list[tuple[int, ...]]",
            ("part", "p"),
        ),
        Method(
            "_copy_rows_on_dim",  # one per rows_dim: _copy_rows_on_dim1, ...
            (Param("dst", "torch.Tensor"), Param("src", "torch.Tensor")),
            "None",
            ("n",),
        ),
        Method(
            "_pad_with_empty_sequences",
            (Param("dst", "torch.Tensor"), Param("src", "torch.Tensor")),
            "None",
            ("n",),
        ),
        Method(
            "_pad_flashinfer_sections",
            (Param("dst", "torch.Tensor"), Param("src", "torch.Tensor")),
            "None",
            ("n", "half"),
        ),
    )
}

#: Protocol methods in the order the mixin defines them.
PROTOCOL_METHODS = (
    "get_encoder_cudagraph_config",
    "get_encoder_cudagraph_budget_range",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
    "postprocess_encoder_output",
    "get_input_modality",
)

#: Names the module binds at its top level besides the spec's imports and class.
MODULE_NAMES = frozenset(
    {
        "torch",
        "itertools",
        "math",
        "weakref",
        "inspect",
        "Any",
        "Hashable",
        "TYPE_CHECKING",
        "SupportsEncoderCudaGraph",
        "EncoderCudaGraphConfig",
        "EncoderCudaGraphPathConfig",
        "ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG",
        "EncoderCudaGraphCaptureInputs",
        "EncoderCudaGraphReplayBuffers",
        "EncoderItemSpec",
        "AttentionBackendEnum",
        "async_tensor_h2d",
        "scatter_output_slices",
        "VllmConfig",
        "MultiModalConfig",
        "_IMAGE_KEYS",
        "_VIDEO_KEYS",
        "_EAGER_ONLY_TOKENS",
    }
)

#: Built-in names of every field scope, ``self`` and the formula functions:
#: no spec name may take them, whichever method it lives in.
RESERVED = frozenset(
    {b for s in FIELD_SCOPES.values() for b in s.builtins}
    | {"self", "ceil_div", "ceil_sqrt"}
    | MODULE_NAMES
)
PYTHON_BUILTINS = frozenset(dir(builtins))


@dataclass(frozen=True)
class Collision:
    name: str
    kind: NameKind
    method: str
    what: str  # "the parameter" / "the local"


def collisions(spec_names: Mapping[NameKind, Iterable[str]]) -> list[Collision]:
    """Spec names that a generated method would bind for its own use: in the
    methods where that kind of spec name lives, the first method each."""
    found: dict[tuple[str, NameKind], Collision] = {}
    for method in METHODS.values():
        params = {p.name for p in method.params}
        own = method.bound_names(spec_names) - set(
            spec_names.get(NameKind.BUILDER_RESULT, ())
        )
        for kind in NameKind:
            if kind not in method.spec_kinds or kind is NameKind.BUILDER_RESULT:
                continue
            for name in spec_names.get(kind, ()):
                if name in own and (name, kind) not in found:
                    what = "the parameter" if name in params else "the local"
                    found[(name, kind)] = Collision(name, kind, method.name, what)
    return list(found.values())


def derived_clash(method: str, kind: NameKind, name: str) -> str | None:
    """A name ``method`` derives from the spec name ``name`` (``item_output``
    for an input ``output``) that is also one of its own parameters or
    locals, which binding it would overwrite; checked where the derived name
    is used (a per-item post-processing step reads the input)."""
    m = METHODS[method]
    fixed = {p.name for p in m.params} | set(m.locals)
    return next(
        (
            pattern.format(name)
            for pattern, k in m.derived
            if k is kind and pattern.format(name) in fixed
        ),
        None,
    )
