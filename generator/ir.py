"""The frozen intermediate representation of a validated spec.

Everything the renderer needs is decided here: names are checked,
expressions are parsed trees (:mod:`generator.formulas`), defaults are
filled in and every cross reference is resolved. Nothing in the IR is raw
spec text except free prose (docstrings, ``why`` notes, hints), which the
renderer only ever emits inside comments, docstrings or ``repr()`` literals.
"""

from __future__ import annotations

from dataclasses import dataclass

from generator.diagnostics import Location
from generator.formulas import Call, Expr


@dataclass(frozen=True)
class HostAttr:
    name: str
    annotation: str  # validated Python type expression
    quoted: bool  # mentions a TYPE_CHECKING-only name


@dataclass(frozen=True)
class Import:
    name: str
    vllm_module: str
    standalone_module: str
    type_only: bool


@dataclass(frozen=True)
class Constant:
    name: str
    path: Expr  # a HostPath
    default: int | None


@dataclass(frozen=True)
class FlatInput:
    key: str
    rows: Expr  # per-item rows, over grid dims and constants
    accepts_list: bool
    replay_dtype: Expr | None
    eager_dtype: Expr | None
    video_key: str | None = None


@dataclass(frozen=True)
class GridInput:
    key: str
    dims: tuple[str, ...]
    video_key: str | None = None


@dataclass(frozen=True)
class CaptureTensor:
    key: str
    shape: tuple[Expr, ...]
    dtype: Expr  # Ref("dtype") or a HostPath
    fill: str
    why: str | None


@dataclass(frozen=True)
class MetadataBuilder:
    call: Call
    capture_kwargs: tuple[tuple[str, Expr], ...]
    replay_kwargs: tuple[tuple[str, Expr], ...]
    provides: tuple[str, ...]
    why: str | None


@dataclass(frozen=True)
class Buffer:
    key: str
    rows_dim: int
    pad: str | None  # "trailing_sequence" | "repeat_last" | None
    slots: Expr | None
    host_scalar: bool
    replay: str  # "copy" | "drop"
    why: str | None
    location: Location
    shape: tuple[Expr, ...] | None = None  # declared (builder buffers)
    dtype: str | None = None  # declared (builder buffers)
    set_by: str | None = None  # host scalar: the capture kwarg that sets it
    allocate: bool = False  # capture: zeros of shape/dtype, dummy value copied in


@dataclass(frozen=True)
class BackendGuard:
    path: Expr  # HostPath
    allow: tuple[str, ...]
    deny: tuple[str, ...]
    hint: str | None
    why: str | None


@dataclass(frozen=True)
class Step:
    target: str | None
    expr: Expr


@dataclass(frozen=True)
class SpanAssembly:
    types_key: str
    content: str
    delimiters: tuple[tuple[str, str], ...]  # (type constant, host parameter)
    why: str | None


@dataclass(frozen=True)
class MixinIR:
    spec_path: str
    stem: str
    display_name: str
    class_name: str
    docstring: str
    module_docstring: str | None
    protocol_base: bool
    local_defs_import: bool
    host: tuple[HostAttr, ...]
    imports: tuple[Import, ...]
    modalities: tuple[str, ...]
    max_frames_per_video: Expr | None
    input_order: tuple[str, ...]  # flat and grid keys as declared
    flat_inputs: tuple[FlatInput, ...]
    grid_inputs: tuple[GridInput, ...]
    constants: tuple[Constant, ...]
    input_size: Expr
    output_tokens: Expr
    graph_rows: Expr | None
    budget_tokens: Expr | None
    budget_min: Expr
    budget_why: str | None
    image_limit_zero: str  # "config" | "capture" | "off"
    fp8_static_scales: bool
    backend_guard: BackendGuard | None
    per_item_tokens: str  # "ceil" | "floor"
    dummy_dims: tuple[tuple[str, tuple[Expr, ...]], ...]  # grid key -> dims
    capture_tensors: tuple[CaptureTensor, ...]
    capture_why: str | None
    capture_graph_rows: Expr | None
    metadata: tuple[MetadataBuilder, ...]
    buffers: tuple[Buffer, ...]
    out_hidden_size: Expr
    graph_forward: tuple[Step, ...]
    eager_per_item: bool
    eager_steps: tuple[Step, ...]
    eager_empty_width: Expr | None
    span_assembly: SpanAssembly | None
    sizes: tuple[tuple[str, int], ...] = ()

    def constant(self, name: str) -> Constant | None:
        return next((c for c in self.constants if c.name == name), None)

    def grid(self, key: str) -> GridInput | None:
        return next((g for g in self.grid_inputs if g.key == key), None)

    def flat(self, key: str) -> FlatInput | None:
        return next((f for f in self.flat_inputs if f.key == key), None)

    def buffer(self, key: str) -> Buffer | None:
        return next((b for b in self.buffers if b.key == key), None)

    @property
    def has_video_keys(self) -> bool:
        return any(g.video_key for g in self.grid_inputs)

    def dim_owner(self, dim: str) -> GridInput | None:
        return next((g for g in self.grid_inputs if dim in g.dims), None)
