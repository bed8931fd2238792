"""The root of the typed spec: :class:`MixinSpec`, read section by section.

Sections are read in the order their names become known (imports, host,
constants, inputs, items, ...), so every formula is parsed against exactly
the names declared before it, and entries refer to each other by object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from generator import formulas as fx
from generator.formulas import Expr, names_in
from generator.limits import MAX_CAPTURE_AXIS_KEYS
from generator.naming import TARGETS
from generator.scopes import NameKind
from generator.spec.axes import CaptureAxis
from generator.spec.enums import Base, DefsImport, Modality
from generator.spec.forwards import Postprocess, SpanAssembly, Step
from generator.spec.host import (
    Annotation,
    Constant,
    ConstantPath,
    HostAttr,
    HostMethodName,
    Import,
    Size,
    SizeValue,
)
from generator.spec.inputs import (
    FlatInput,
    Input,
    InputEntry,
    ItemInput,
    prescan_dims,
    with_item_rows,
)
from generator.spec.items import Budget, CaptureOff, Guards, Items
from generator.spec.names import check_name, report_collisions
from generator.spec.path import EncoderPath
from generator.spec.reader import Key, Keys, Reader
from generator.spec.units import (
    check_list_path,
    check_unit_path,
    check_units,
    unit_inputs,
)
from generator.spec.values import (
    INVALID,
    Choice,
    ClassName,
    Formula,
    Integer,
    ListOf,
    MapOf,
    OneOf,
    Section,
    Text,
)

_WITHOUT_PATHS = "required without `paths`"
#: The default path's keys, written at the top level by a spec without
#: ``paths:`` (each path of ``paths:`` has its own).
_PATH_KEYS = {
    name: (
        replace(EncoderPath.KEYS[name], required=False, default_doc=_WITHOUT_PATHS)
        if EncoderPath.KEYS[name].required
        else EncoderPath.KEYS[name]
    )
    for name in (
        "capture",
        "metadata",
        "buffers",
        "graph_forward",
        "graph_forward_context",
        "eager_forward",
    )
}


@dataclass(frozen=True)
class MixinSpec:
    """A validated spec: everything the emitters need, decided."""

    spec_path: str
    display_name: str
    class_name: str
    docstring: str
    module_docstring: str | None
    base: Base
    defs_import: DefsImport
    host: tuple[HostAttr, ...]
    host_methods: tuple[str, ...]
    imports: tuple[Import, ...]
    modalities: tuple[Modality, ...]
    max_frames_per_video: Expr | None
    inputs: tuple[Input, ...]  # in the order the sub-batch lists them
    constants: tuple[Constant, ...]
    items: Items
    budget: Budget
    guards: Guards
    capture_off: CaptureOff | None
    sizes: tuple[Size, ...]
    out_hidden_size: Expr
    paths: tuple[EncoderPath, ...]
    postprocess: Postprocess | None
    capture_axes: tuple[CaptureAxis, ...] = ()
    #: Modalities listed only while a host condition holds, in the order of
    #: ``modalities``.
    modality_when: tuple[tuple[Modality, Expr], ...] = ()

    KEYS: ClassVar = Keys(
        Key(
            "format",
            Integer(choices=(1,)),
            "Spec format version.",
            required=True,
            example="1",
        ),
        Key(
            "name",
            Text(nonempty=True, one_line=True),
            "Display name in messages and docstrings.",
            required=True,
            example="MiniMax M3",
        ),
        Key(
            "class_name",
            ClassName(),
            "The mixin class.",
            required=True,
            example="Qwen2_5_VLEncoderCudaGraphMixin",
        ),
        Key(
            "docstring",
            Text(docstring=True, nonempty=True),
            'The class docstring (no `"""`, no backslash).',
            required=True,
        ),
        Key(
            "module_docstring",
            Text(docstring=True),
            "A module docstring after the provenance header.",
        ),
        Key(
            "base",
            Choice(Base),
            "Subclass `SupportsEncoderCudaGraph` and inherit its defaults "
            "(`protocol`), or define every method (`none`: a default "
            "`postprocess_encoder_output` is then generated).",
            default=Base.PROTOCOL,
            default_doc="`protocol`",
        ),
        Key(
            "defs_import",
            Choice(DefsImport),
            "Import the protocol data classes at module top (`module`), or inside "
            "each method with `TYPE_CHECKING` imports for the annotations "
            "(`local`, as vLLM's `interfaces.py` does).",
            default=DefsImport.MODULE,
            default_doc="`module`",
        ),
        Key(
            "host",
            MapOf(Annotation(), min_items=1),
            "Attributes the host model provides, name → Python type over "
            "`imports`, `torch`, `MultiModalConfig`, `VllmConfig` and builtins. "
            "An annotation that mentions an import, or anything beyond builtin "
            "and torch types, is quoted (never evaluated at import).",
            required=True,
            example="{visual: Qwen2VisionTransformer}",
        ),
        Key(
            "host_methods",
            ListOf(HostMethodName()),
            "What expressions may call besides `host:` attributes: methods the "
            "host model defines (a private one, `_process_image_input`, included) "
            "and dotted paths under a `host:` attribute annotated as a module "
            "(`vision.encode`: a method or submodule; under a host tensor, one of "
            "its tensor methods), never `torch.nn.Module`'s own API (see Forward "
            "steps). The generated module checks each dotted path under a module "
            "once per model, at capture and in the first batch: every part a "
            "`torch.nn.Module`, the callee a submodule, a method bound to its "
            "module or a static method of its class (`TypeError` naming the path "
            "otherwise; see Host callees).",
            example="[get_max_frames_per_video, visual.prepare_encoder_metadata]",
        ),
        Key(
            "imports",
            MapOf(Section(Import)),
            "Every name the generated code imports besides the protocol's own, "
            "checked to exist in its module for each target.",
        ),
        Key(
            "modalities",
            ListOf(Choice(Modality), min_items=1),
            "`EncoderCudaGraphConfig.modalities`.",
            required=True,
            example="[image, video]",
        ),
        Key(
            "modality_when",
            MapOf(Formula("constants_and_host")),
            "Modalities of `modalities` that the config lists only while a "
            "condition over the constants and host paths holds (a formula, "
            "`and` / `or` / `==` allowed): MiniCPM-V captures video only for "
            "its versions 2.6 and 4.0. The static checks check the spec with "
            "every modality listed.",
            example="{video: major == 2 and minor == 6 or major == 4 and minor == 0}",
        ),
        Key(
            "max_frames_per_video",
            Formula("max_frames_per_video"),
            "`EncoderCudaGraphConfig.max_frames_per_video` (video only).",
            example="get_max_frames_per_video()",
        ),
        Key(
            "inputs",
            MapOf(Section(InputEntry), min_items=1),
            "The `mm_kwargs` keys the mixin reads, in the order the selected "
            "sub-batch lists them.",
            required=True,
        ),
        Key(
            "constants",
            MapOf(OneOf(ConstantPath(), Section(Constant))),
            "Names bound to host paths (`name: host.path` or `{from, default}`); "
            "each generated method binds the constants it uses first thing.",
            example="{merge: {from: visual.spatial_merge_size, default: 2}}",
        ),
        Key("items", Section(Items), "Per-item formulas.", required=True),
        Key("budget", Section(Budget), "The budget range.", required=True),
        Key("guards", Section(Guards), "Refused configurations."),
        Key(
            "capture_off",
            Section(CaptureOff),
            "A host flag under which nothing is captured (`modalities: []`).",
        ),
        Key(
            "capture_axes",
            ListOf(Section(CaptureAxis), min_items=1),
            "Extra capture axes (`EncoderCudaGraphConfig.capture_axes`): one "
            "graph per budget and combination of the axes' keys; selection "
            "resolves each sub-batch's key. Not with several paths (vLLM 0.33.0's "
            "manager refuses the combination).",
        ),
        _PATH_KEYS["capture"],
        _PATH_KEYS["metadata"],
        _PATH_KEYS["buffers"],
        Key(
            "sizes",
            MapOf(SizeValue()),
            "Released model sizes the generated code never reads, for buffer "
            "shapes in `gen-mixin plan`.",
            example="{head_dim: 80}",
        ),
        Key(
            "out_hidden_size",
            Formula("constants_and_host"),
            "Width of the output rows.",
            required=True,
            example="visual.out_hidden_size",
        ),
        _PATH_KEYS["graph_forward"],
        _PATH_KEYS["graph_forward_context"],
        _PATH_KEYS["eager_forward"],
        Key(
            "postprocess",
            Section(Postprocess),
            "Custom post-processing (default: scatter each item's rows).",
        ),
        Key(
            "paths",
            MapOf(Section(EncoderPath), min_items=1),
            "Several encoder paths, name → path, in the order the config lists "
            "them (`EncoderCudaGraphConfig.paths`): each with its own rows per "
            "item, budgets, capture, builders, buffers and forwards. Without it "
            "the spec has one path, `default`, written at the top level.",
            example="{global: {...}, local: {...}}",
        ),
    )
    DOC_TITLE = "top-level fields"

    # -- what the emitters ask -----------------------------------------------------

    @property
    def stem(self) -> str:
        return Path(self.spec_path).stem

    @property
    def targets(self) -> tuple[str, ...]:
        """The targets the spec has a module for: both, or vllm alone when an
        import names no standalone module (a vLLM-only import)."""
        return tuple(t for t in TARGETS if not self.imports_without(t))

    def imports_without(self, target: str) -> tuple[Import, ...]:
        """The imports with no module in ``target`` (vLLM-only imports for
        the standalone target)."""
        return tuple(i for i in self.imports if i.module(target) is None)

    @property
    def path(self) -> EncoderPath:
        """The implicit default path of a spec without ``paths:``."""
        assert not self.has_paths  # noqa: S101 (a caller that forgot paths)
        return self.paths[0]

    @property
    def has_paths(self) -> bool:
        """The spec declares its paths (``paths:``): every method that builds
        or runs a graph dispatches on ``path``."""
        return self.paths[0].named

    @property
    def concatenation(self) -> tuple[EncoderPath, ...]:
        """The paths in the order an item's rows are concatenated (a spec
        with paths): ``postprocess.concatenate``, else the paths' order."""
        order = self.postprocess.concatenate if self.postprocess else None
        if order is None:
            return self.paths
        return tuple(next(p for p in self.paths if p.name == n) for n in order)

    @property
    def buffers(self) -> tuple:
        """Every path's buffers, in path order (``buffer_keys``)."""
        return tuple(b for p in self.paths for b in p.buffers)

    @property
    def trailing(self):
        """The buffer closed with a trailing padding sequence, if any."""
        return next((p.trailing for p in self.paths if p.trailing), None)

    @property
    def protocol_base(self) -> bool:
        return self.base is Base.PROTOCOL

    @property
    def local_defs_import(self) -> bool:
        return self.defs_import is DefsImport.LOCAL

    @property
    def flat_inputs(self) -> tuple[FlatInput, ...]:
        return tuple(i for i in self.inputs if isinstance(i, FlatInput))

    @property
    def item_inputs(self) -> tuple[ItemInput, ...]:
        return tuple(i for i in self.inputs if isinstance(i, ItemInput))

    @property
    def span_assembly(self) -> SpanAssembly | None:
        return self.postprocess.span_assembly if self.postprocess else None

    @property
    def post_steps(self) -> tuple[Step, ...]:
        """Custom post-processing steps (none: another or the default kind)."""
        return (self.postprocess.steps or ()) if self.postprocess else ()

    @property
    def count_steps(self) -> tuple[Step, ...]:
        """The steps of an item's count (none: a formula)."""
        counted = self.items.count_steps
        return counted.steps if counted is not None else ()

    @property
    def has_video_keys(self) -> bool:
        return any(i.video_key for i in self.inputs)

    def declared_names(self) -> dict[NameKind, frozenset[str]]:
        """Every name the spec declares, by kind (and the builder results
        chosen for it)."""
        paths = self.paths
        return {
            NameKind.HOST: frozenset(h.name for h in self.host),
            NameKind.HOST_METHOD: frozenset(self.host_methods),
            NameKind.IMPORT: frozenset(i.name for i in self.imports),
            NameKind.CONSTANT: frozenset(c.name for c in self.constants),
            NameKind.SIZE: frozenset(s.name for s in self.sizes),
            NameKind.FLAT: frozenset(f.key for f in self.flat_inputs),
            NameKind.GRID: frozenset(g.key for g in self.item_inputs),
            NameKind.DIM: frozenset(d for g in self.item_inputs for d in g.dims),
            NameKind.AXIS_DIM: frozenset(d for a in self.capture_axes for d in a.dims),
            NameKind.BUFFER: frozenset(b.key for b in self.buffers),
            NameKind.GRAPH_STEP: frozenset(
                n for p in paths for s in p.graph_forward for n in s.names
            ),
            NameKind.EAGER_STEP: frozenset(
                n for p in paths for s in p.eager_forward.steps for n in s.names
            ),
            NameKind.BUILDER_RESULT: frozenset(
                b.result_name for p in paths for b in p.metadata if b.call is not None
            ),
            NameKind.BUILDER_STEP: frozenset(
                n for p in paths for b in p.metadata for n in b.step_names
            ),
            NameKind.CAPTURE_LET: frozenset(
                let.name for p in paths for let in p.capture.lets
            ),
            NameKind.COUNT_STEP: frozenset(
                n for s in self.count_steps for n in s.names
            ),
            NameKind.POST_STEP: frozenset(n for s in self.post_steps for n in s.names)
            | frozenset(
                n for _, n in (self.postprocess.path_rows if self.postprocess else ())
            ),
        }

    def constant(self, name: str) -> Constant | None:
        return next((c for c in self.constants if c.name == name), None)

    def item_input(self, key: str) -> ItemInput | None:
        return next((g for g in self.item_inputs if g.key == key), None)

    def flat(self, key: str) -> FlatInput | None:
        return next((f for f in self.flat_inputs if f.key == key), None)

    # -- reading -------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, r: Reader, spec_path: str) -> MixinSpec | None:
        ctx = r.ctx
        head = {
            k: r.take(k)
            for k in (
                "format",
                "name",
                "class_name",
                "docstring",
                "module_docstring",
                "base",
                "defs_import",
            )
        }
        imports = _values(r.take("imports"))
        ctx.partial["imports"] = tuple(imports)
        host = _values(r.take("host"))
        ctx.partial["host"] = tuple(host)
        _check_host_clashes(r)
        host_methods = tuple(_values(r.take("host_methods")))
        modalities = _modalities(r)
        ctx.partial["video"] = Modality.VIDEO in modalities
        constants = _values(r.take("constants"))
        ctx.partial["constants"] = tuple(constants)
        modality_when = _modality_when(r, modalities)
        inputs = _inputs(r, modalities)
        item_inputs = {i.key: i for i in inputs if isinstance(i, ItemInput)}
        items = r.take("items")
        ctx.partial["items"] = items
        ctx.partial["item_inputs"] = tuple(item_inputs.values())
        written_inputs = tuple(inputs)
        if items is not None:
            inputs = [
                (
                    with_item_rows(i, items.input_size, items.output_tokens)
                    if isinstance(i, FlatInput)
                    else i
                )
                for i in inputs
            ]
        flats = {i.key: i for i in inputs if isinstance(i, FlatInput)}
        if items is not None:
            check_units(r, inputs, items)
        budget = r.take("budget")
        ctx.partial["budget"] = budget
        mfpv = _max_frames(r, modalities)
        guards = r.take("guards") or Guards.NONE
        capture_off = r.take("capture_off")
        if (
            guards.read_multimodal_config
            and "multimodal_config" not in ctx.names[NameKind.HOST]
        ):
            r.error(
                "guards",
                "these guards read self.multimodal_config: declare it under host",
            )
        sizes = tuple(_values(r.take("sizes")))
        ctx.partial["sizes"] = sizes
        axes = _capped_axes(r, tuple(_values(r.take("capture_axes"))))
        ctx.partial["capture_axes"] = axes
        # A capture tensor may fill a flat input or a padded one (one row,
        # its item, per item on dim 0).
        row_inputs = {
            **flats,
            **{k: i for k, i in item_inputs.items() if i.is_padded},
        }
        paths = _paths(r, item_inputs, row_inputs)
        if axes and paths and len(paths) > 1:
            r.error(
                "capture_axes",
                "capture axes with several paths: vLLM 0.33.0's manager refuses "
                "the combination (NotImplementedError)",
            )
        if items is not None and items.per_unit:
            for i, axis in enumerate(axes):
                if axis.eager_beyond:
                    r.error(
                        "capture_axes",
                        "beyond_keys: eager reads each item's need in its item "
                        "spec, over the item's dims: not with items.per_unit",
                        field=f"capture_axes[{i}].beyond_keys",
                    )
        for p in paths or ():
            prefix = "" if p.output_tokens is None else f"paths.{p.name}."
            _check_pad_backends(r, guards, p.buffers, prefix)
            _check_replay_modalities(r, p.metadata, inputs, prefix)
        out_hidden = r.take("out_hidden_size")
        post = r.take(
            "postprocess",
            flats=flats,
            imports={i.name: i for i in imports},
            host={h.name: h for h in host},
            paths=paths if r.has("paths") else None,
        )
        if r.has("paths"):
            _check_items_with_paths(r)
        else:
            _check_graph_rows(r, items, post)
        if items is not None and items.count_steps is not None:
            _check_count_steps_readers(r, written_inputs)
        if paths and any(unit_inputs(inputs)):
            for path in paths:
                check_unit_path(r, path)
        lists = [i.key for i in inputs if isinstance(i, ItemInput) and i.is_list]
        if paths and lists:
            for path in paths:
                check_list_path(r, path, lists, any(unit_inputs(inputs)))
        report_collisions(ctx, ctx.fields)
        required = [head[k] for k in ("format", "name", "class_name", "docstring")]
        if ctx.diags or None in (*required, items, budget, paths, out_hidden):
            return None
        if r.has("capture_axes") and not r.ok("capture_axes"):
            return None
        return cls(
            spec_path,
            head["name"],
            head["class_name"],
            head["docstring"],
            head["module_docstring"],
            head["base"],
            head["defs_import"],
            tuple(host),
            host_methods,
            tuple(imports),
            modalities,
            mfpv,
            tuple(inputs),
            tuple(constants),
            items,
            budget,
            guards,
            capture_off,
            sizes,
            out_hidden,
            paths,
            post,
            axes,
            modality_when,
        )


def _modality_when(r: Reader, modalities) -> tuple[tuple[Modality, Expr], ...]:
    """The conditional modalities, each one of ``modalities``, in its
    order."""
    given = r.take("modality_when") or {}
    listed = {m.value: m for m in modalities}
    node = r.raw("modality_when")
    locations = (node.key_locations or {}) if node is not None else {}
    for name in given:
        if name not in listed:
            r.ctx.error(
                locations.get(name, node),
                f"modality_when.{name}",
                f"{name!r} is not one of modalities ({', '.join(listed) or 'none'})",
            )
    return tuple(
        (m, given[m.value])
        for m in modalities
        if m.value in given and given[m.value] is not INVALID
    )


def _paths(r: Reader, item_inputs, flats) -> tuple[EncoderPath, ...] | None:
    """The spec's paths: those of ``paths:``, or the default path written at
    the top level."""
    if not r.has("paths"):
        r.take("paths")
        for name in ("capture", "buffers", "graph_forward", "eager_forward"):
            if not r.has(name):
                r.ctx.error(r.node, r.path(name), "required key is missing")
        path = EncoderPath.from_yaml(r, item_inputs, flats)
        return None if path is None else (path,)
    for name in _PATH_KEYS:
        if r.has(name):
            r.refuse(name, f"with paths, each path has its own {name}")
    taken = r.take("paths", item_inputs=item_inputs, flats=flats)
    if not taken or INVALID in taken.values():
        return None
    paths = tuple(taken.values())
    _check_paths_apart(r, paths)
    return paths


def _check_paths_apart(r: Reader, paths: tuple[EncoderPath, ...]) -> None:
    """What the paths share: the config's padding logics are keyed by buffer
    alone, and one registry holds the trailing sequence's captured rows."""
    owner: dict[str, str] = {}
    trailing = []
    for path in paths:
        for buf in path.buffers:
            if buf.key in owner:
                r.ctx.error(
                    buf.location,
                    f"paths.{path.name}.buffers.{buf.key}",
                    f"{buf.key!r} is also a buffer of path {owner[buf.key]!r}: "
                    "buffer keys are shared by every path (padding_logics, "
                    "buffer_keys); give each path its own",
                )
            owner.setdefault(buf.key, path.name)
        if path.trailing is not None:
            trailing.append((path, path.trailing))
    for path, buf in trailing[1:]:
        r.ctx.error(
            buf.location,
            f"paths.{path.name}.buffers.{buf.key}",
            "at most one buffer of all paths can use trailing_sequence",
        )


def _check_items_with_paths(r: Reader) -> None:
    """With paths, each path's ``output_tokens`` says what its budgets count
    and its graph emits; span assembly reads the default path's output."""
    items = r.raw("items")
    if items is not None and items.kind == "mapping":
        for name in ("budget_tokens", "graph_rows"):
            if name in items.value:
                r.ctx.error(
                    items.key_locations[name],
                    f"items.{name}",
                    "with paths, each path's output_tokens is what its budgets "
                    "count and its graph emits per item",
                )
    post = r.raw("postprocess")
    if post is not None and post.kind == "mapping" and "span_assembly" in post.value:
        r.ctx.error(
            post.key_locations["span_assembly"],
            "postprocess.span_assembly",
            "span assembly reads the default path's rows: a spec with paths "
            "concatenates each item's rows of every path (postprocess.concatenate)",
        )


def _check_count_steps_readers(r: Reader, inputs) -> None:
    """What reads ``items.output_tokens`` as a formula, which a count from
    steps is not: span assembly's lengths, a flat input's rows."""
    location = r.raw("items").key_locations["output_tokens"]
    post = r.raw("postprocess")
    if post is not None and post.kind == "mapping" and "span_assembly" in post.value:
        r.ctx.error(
            location,
            "items.output_tokens",
            "span assembly sizes each span by an output_tokens formula: not "
            "with a count from steps",
        )
    rows = r.raw("inputs")
    for flat in inputs:
        if isinstance(flat, FlatInput) and "output_tokens" in names_in(flat.rows):
            r.ctx.error(
                rows.value[flat.key].location if rows is not None else location,
                f"inputs.{flat.key}.rows",
                "reads output_tokens, which comes from steps here: write the "
                "rows as a formula over the item's dims",
            )


def _capped_axes(r: Reader, axes: tuple[CaptureAxis, ...]) -> tuple:
    """The axes, or none (refused) when their keys combine into more than
    :data:`~generator.limits.MAX_CAPTURE_AXIS_KEYS` graphs per budget: the
    static checks then never run once per combination."""
    combinations = math.prod(len(axis.keys) for axis in axes)
    if combinations <= MAX_CAPTURE_AXIS_KEYS:
        return axes
    r.error(
        "capture_axes",
        f"the axes' keys combine into {combinations} graphs per budget (at most "
        f"{MAX_CAPTURE_AXIS_KEYS}): fewer keys",
    )
    return ()


def _values(mapping_or_list) -> list:
    """The values that resolved, of a MapOf or ListOf result."""
    if mapping_or_list is None:
        return []
    values = (
        mapping_or_list.values()
        if isinstance(mapping_or_list, dict)
        else mapping_or_list
    )
    return [v for v in values if v is not INVALID]


def _check_host_clashes(r: Reader) -> None:
    node = r.raw("host")
    if node is None or node.kind != "mapping":
        return
    imports = r.ctx.names[NameKind.IMPORT]
    for name in node.value:
        if name in imports:
            r.ctx.error(
                node.key_locations[name],
                f"host.{name}",
                f"{name!r} is declared twice (also an import)",
            )


def _modalities(r: Reader) -> tuple[Modality, ...]:
    values = tuple(m for m in r.take("modalities") or () if m is not INVALID)
    if len(set(values)) != len(values):
        r.error("modalities", "modalities must not repeat")
    if Modality.VISION_CHUNK in values and len(values) > 1:
        r.error(
            "modalities",
            "vision_chunk is one modality for images and video chunks alike: "
            "list it alone",
        )
    return values


def _inputs(r: Reader, modalities) -> list[Input]:
    ctx = r.ctx
    node = r.raw("inputs")
    prescan_dims(ctx, node)
    if node is not None and node.kind == "mapping":
        for key in node.value:
            loc = node.key_locations[key]
            field = f"inputs.{key}"
            check_name(ctx, loc, field, key, "input")
            if ctx.kind_of(key) in (NameKind.HOST, NameKind.CONSTANT, NameKind.IMPORT):
                ctx.error(loc, field, f"{key!r} is already declared elsewhere")
            entry = node.value[key]
            kind = entry.value.get("kind") if entry.kind == "mapping" else None
            kind_name = (
                NameKind.FLAT if kind and kind.value == "flat" else NameKind.GRID
            )
            ctx.declare(kind_name, key, loc, field)
    inputs = _values(r.take("inputs"))
    if node is None or not r.ok("inputs") or ctx.failed_inputs:
        return inputs
    if not any(isinstance(i, ItemInput) for i in inputs):
        r.error(
            "inputs",
            "at least one grid or count input is needed (items are read from them)",
        )
    # A padded input holds rows too (one per item, on dim 0), a list input
    # its units.
    if not any(
        isinstance(i, FlatInput)
        or (isinstance(i, ItemInput) and (i.is_padded or i.is_list))
        for i in inputs
    ):
        r.error("inputs", "at least one flat, padded or list input is needed")
    _check_video_keys(r, node, modalities)
    _check_equals(r, node, inputs)
    return inputs


def _check_equals(r: Reader, node, inputs: list[Input]) -> None:
    """The formulas of ``equals`` read free dims only (dims without a formula
    of their own), so that every derived dim follows from drawn ones."""
    derived = {
        dim: i.key for i in inputs if isinstance(i, ItemInput) for dim in i.derived_dims
    }
    for inp in inputs:
        if not isinstance(inp, ItemInput):
            continue
        for dim, expr in inp.equals:
            chained = sorted(fx.names_in(expr) & derived.keys())
            if chained:
                where = node.value[inp.key].value["equals"].key_locations[dim]
                r.ctx.error(
                    where,
                    f"inputs.{inp.key}.equals.{dim}",
                    f"reads {', '.join(chained)}, which inputs."
                    f"{derived[chained[0]]}.equals derives itself: write the "
                    "formula over the dims it is derived from",
                )


def _check_video_keys(r: Reader, node, modalities) -> None:
    video_keys = {
        k: n.value["video_key"]
        for k, n in node.value.items()
        if n.kind == "mapping" and "video_key" in n.value
    }
    video = Modality.VIDEO in modalities
    if not video_keys:
        if video:
            r.error("inputs", "the video modality needs a video_key on every input")
        return
    if len(video_keys) != len(node.value):
        missing = [k for k in node.value if k not in video_keys]
        r.error(
            "inputs",
            f"some inputs have a video_key and {', '.join(missing)} do not (all or none)",
        )
    if not video:
        r.ctx.error(
            next(iter(video_keys.values())),
            "inputs",
            "video_key needs the video modality",
        )
    seen: set[str] = set(node.value)
    for key, vk in video_keys.items():
        if not isinstance(vk.value, str):
            continue  # reported where the input is read
        if vk.value in seen:
            r.ctx.error(vk, f"inputs.{key}.video_key", f"{vk.value!r} is already a key")
        seen.add(vk.value)


def _check_pad_backends(r: Reader, guards: Guards, buffers, prefix: str) -> None:
    """A pad rule chosen by backend reads the backend where the backend guard
    does, and names a backend the guard lets through."""
    guard = guards.attention_backend
    for buf in buffers:
        for backend, _ in buf.pad_by_backend:
            field = f"{prefix}buffers.{buf.key}.pad_by_backend"
            if guard is None:
                r.ctx.error(
                    buf.location,
                    field,
                    "needs guards.attention_backend (its from: is where the "
                    "backend is read)",
                )
            elif backend in guard.deny or (guard.allow and backend not in guard.allow):
                r.ctx.error(
                    buf.location,
                    field,
                    f"the backend guard refuses {backend.value}: its rule is never used",
                )


def _check_replay_modalities(r: Reader, builders, inputs, prefix: str) -> None:
    """Replay kwargs by modality need the video keys (batches of two
    modalities, told apart by their keys)."""
    if any(i.video_key for i in inputs):
        return
    for i, b in enumerate(builders):
        if b.replay_by_modality:
            r.ctx.error(
                b.location,
                f"{prefix}metadata[{i}].replay_kwargs_by_modality",
                "needs the video modality and video_key inputs; with one modality "
                "write replay_kwargs",
            )


def _max_frames(r: Reader, modalities) -> Expr | None:
    mfpv = r.take("max_frames_per_video")
    if r.has("max_frames_per_video") and Modality.VIDEO not in modalities:
        r.error("max_frames_per_video", "only meaningful with the video modality")
    return mfpv


def _check_graph_rows(r: Reader, items: Items | None, post) -> None:
    """graph_rows and span assembly go together; a declared capacity needs
    budget_tokens."""
    items_node = r.raw("items")
    has_graph_rows = (
        items_node is not None
        and items_node.kind == "mapping"
        and "graph_rows" in items_node.value
    )
    if post is None and not r.has("postprocess") and has_graph_rows:
        r.ctx.error(
            items_node.value["graph_rows"],
            "items.graph_rows",
            "graph_rows only goes with a postprocess that turns graph rows into "
            "output tokens",
        )
    post_node = r.raw("postprocess")
    span = (
        post_node is not None
        and post_node.kind == "mapping"
        and "span_assembly" in post_node.value
    )
    if span and not has_graph_rows:
        r.error(
            "postprocess",
            "span assembly needs items.graph_rows (graph rows per item)",
            "items.graph_rows",
        )
    capture = r.raw("capture")
    if (
        capture is not None
        and capture.kind == "mapping"
        and "graph_rows" in capture.value
        and items_node is not None
        and items_node.kind == "mapping"
        and "budget_tokens" not in items_node.value
    ):
        r.ctx.error(
            capture.key_locations["graph_rows"],
            "capture.graph_rows",
            "needs items.budget_tokens: a graph-row capacity beyond the dummy's "
            "only makes sense when budgets count something else",
        )
