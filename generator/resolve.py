"""Spec file -> validated, frozen :class:`~generator.ir.MixinIR`.

Three passes, each reporting every problem it finds:

1. YAML with positions (:mod:`generator.yaml_loader`): malformed YAML,
   duplicate keys, tags and anchors.
2. Structure against the JSON Schema (:mod:`generator.spec_schema`): unknown
   keys with "did you mean", types, enumerations, required keys.
3. Meaning (this module): identifiers and name clashes, formulas and calls
   against the names in scope at each place, cross references between
   inputs, buffers, builders and forwards, and arithmetic checks that can be
   made with the constants' default values (the dummy batch covers its
   budget, ``cu_seqlens`` keeps a spare slot).

:func:`load_spec` raises :class:`~generator.diagnostics.SpecError` with all of
them; it never raises anything else for a user's mistake.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterable
from pathlib import Path

from generator import formulas as fx
from generator.diagnostics import Diagnostics, Location, SpecError
from generator.formulas import Call, Expr, FormulaError, HostPath, Ref, Scope
from generator.ir import (
    BackendGuard,
    Buffer,
    CaptureTensor,
    Constant,
    FlatInput,
    GridInput,
    HostAttr,
    Import,
    MetadataBuilder,
    MixinIR,
    SpanAssembly,
    Step,
)
from generator.naming import FIRST_PARTY_ROOTS, TARGETS
from generator.spec_schema import SPEC_SCHEMA, check_structure
from generator.static_checks import Arithmetic, capture_problems, slot_problems
from generator.yaml_loader import Node, load_spec_tree, read_spec_file

# Names the generated methods use for their own arguments and locals, and the
# built-ins a spec may mention where the context provides them.
CAPTURE_BUILTINS = (
    "token_budget",
    "max_batch_size",
    "max_frames_per_batch",
    "frames_per_item",
    "k",
    "rows",
)
PHASE_BUILTINS = ("device", "dtype")
RESERVED = frozenset(
    {
        *CAPTURE_BUILTINS,
        *PHASE_BUILTINS,
        "rest",
        "self",
        "inputs",
        "mm_kwargs",
        "indices",
        "metadata",
        "values",
        "torch",
        "path",
        "axis_keys",
        "outputs",
        "dest",
        "clone",
        "batch_mm_kwargs",
        "per_item_out_tokens",
        "input_size",
        "output_tokens",
        "offsets",
        "sizes",
        "item",
        "idx",
        "i",
        "weakref",
        "itertools",
        "ceil_div",
        "Any",
        "Hashable",
        "TYPE_CHECKING",
    }
)
PYTHON_BUILTINS = frozenset(dir(builtins))
TYPE_NAMES = frozenset(
    {"torch", "int", "float", "str", "bool", "list", "dict", "tuple"}
)
VLLM_TYPE_NAMES = frozenset({"MultiModalConfig", "VllmConfig"})
CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9]*\Z")
MAX_TEXT = 2000


class _Resolver:
    def __init__(self, root: Node, path: str, diags: Diagnostics) -> None:
        self.root = root
        self.path = path
        self.d = diags
        self.v = root.value
        # Buffers whose capture tensor or builder is written but failed to
        # resolve (already reported): no "no source" for them on top.
        self.failed_sources: set[str] = set()
        # Host attributes whose annotation failed (already reported): still
        # names, so their mentions do not each report an unknown name.
        self.failed_host: set[str] = set()

    # -- helpers ---------------------------------------------------------------

    def node(self, *keys: str | int) -> Node | None:
        cur: Node | None = self.root
        for key in keys:
            if cur is None:
                return None
            if isinstance(key, int):
                cur = (
                    cur.value[key]
                    if cur.kind == "sequence" and key < len(cur.value)
                    else None
                )
            else:
                cur = cur.value.get(key) if cur.kind == "mapping" else None
        return cur

    def err(self, node: Node | Location, field: str, message: str) -> None:
        loc = node if isinstance(node, Location) else node.location
        self.d.error(loc, field, message)

    def key_loc(self, mapping: Node, key: str) -> Location:
        return (mapping.key_locations or {}).get(key, mapping.location)

    def text(
        self,
        node: Node | None,
        field: str,
        docstring: bool = False,
        required: bool = False,
    ) -> str | None:
        if node is None:
            return None
        value = node.value
        if not isinstance(value, str):
            return None
        value = value.strip("\n")
        if required and not value.strip():
            self.err(node, field, "must not be empty")
            return None
        bad = [c for c in value if c != "\n" and not c.isprintable()]
        if bad:
            self.err(node, field, "text must be printable (no control characters)")
            return None
        if len(value) > MAX_TEXT:
            self.err(node, field, f"text longer than {MAX_TEXT} characters")
            return None
        if docstring and ('"""' in value or "\\" in value):
            self.err(node, field, 'docstrings may not contain """ or backslashes')
            return None
        return value

    def expr(
        self, node: Node | None, field: str, scope: Scope, *, literal_ok: bool = False
    ) -> Expr | None:
        if node is None:
            return None
        value = node.value
        if isinstance(value, bool) or value is None:
            if literal_ok:
                return fx.Literal(value)
            # Not a string or an integer: the structure pass reports it.
            return None
        if isinstance(value, int):
            return fx.Num(value)
        if not isinstance(value, str):
            return None  # reported by the structure pass, as above
        try:
            return fx.parse_expression(value, scope)
        except FormulaError as exc:
            if "never closed" in str(exc) or "unmatched" in str(exc):
                exc = FormulaError(
                    f"{exc} (a formula with a comma inside a [...] list must be quoted)",
                    exc.column,
                )
            self.err(self.column(node, exc), field, str(exc))
            return None

    def column(self, node: Node, exc: FormulaError) -> Location:
        """Where ``exc`` points: its column inside the value when the value
        is written on one line as it reads, else the value's start."""
        loc = node.location
        if node.text_col is None:
            return loc
        return Location(loc.file, loc.line, node.text_col + exc.column)

    def statement(self, node: Node, field: str, scope: Scope) -> Step | None:
        try:
            target, expr = fx.parse_assignment(node.value, scope)
        except FormulaError as exc:
            self.err(self.column(node, exc), field, str(exc))
            return None
        return Step(target, expr)

    def host_path(
        self, node: Node | None, field: str, host: frozenset[str]
    ) -> HostPath | None:
        expr = self.expr(node, field, Scope(frozenset(), host_roots=host))
        if expr is None:
            return None
        if not isinstance(expr, HostPath):
            self.err(
                node, field, "expected a host attribute path (e.g. vision.config.x)"
            )
            return None
        return expr

    # -- passes -------------------------------------------------------------------

    def resolve(self) -> MixinIR | None:
        v = self.v
        class_name = v.get("class_name")
        if class_name is not None and isinstance(class_name.value, str):
            if not CLASS_NAME.match(class_name.value):
                self.err(class_name, "class_name", "expected a CamelCase class name")
        name_node = v["name"]
        display_name = self.text(name_node, "name", required=True) or ""
        if "\n" in display_name:
            self.err(name_node, "name", "must be one line")
        docstring = (
            self.text(v.get("docstring"), "docstring", docstring=True, required=True)
            or ""
        )
        module_docstring = self.text(
            v.get("module_docstring"), "module_docstring", docstring=True
        )

        imports = self.resolve_imports()
        import_names = frozenset(i.name for i in imports)
        host = self.resolve_host(imports)
        host_names = (
            frozenset(h.name for h in host)
            | self.failed_host
            | self.resolve_host_methods(host, import_names)
        )
        self.check_clashes("host", v["host"], host_names, import_names)

        modalities = tuple(n.value for n in v["modalities"].value)
        if len(set(modalities)) != len(modalities):
            self.err(v["modalities"], "modalities", "modalities must not repeat")

        constants = self.resolve_constants(host_names)
        const_names = frozenset(c.name for c in constants)
        flats, grids = self.resolve_inputs(host_names, const_names, import_names)
        dims = frozenset(d for g in grids for d in g.dims)
        flat_names = frozenset(f.key for f, _ in flats)
        grid_names = frozenset(g.key for g in grids)

        item_scope = Scope(dims | const_names, host_roots=frozenset())
        items = v["items"]
        input_size = self.expr(
            items.value.get("input_size"), "items.input_size", item_scope
        )
        output_tokens = self.expr(
            items.value.get("output_tokens"), "items.output_tokens", item_scope
        )
        graph_rows = self.expr(
            items.value.get("graph_rows"), "items.graph_rows", item_scope
        )
        budget_tokens = self.expr(
            items.value.get("budget_tokens"), "items.budget_tokens", item_scope
        )

        rows_scope = Scope(dims | const_names | {"input_size", "output_tokens"})
        resolved_flats = []
        for flat, rows_node in flats:
            rows = (
                self.expr(rows_node, f"inputs.{flat.key}.rows", rows_scope)
                if rows_node is not None
                else Ref("input_size")
            )
            if rows is not None:
                # Inline input_size / output_tokens so each formula stands alone.
                rows = _substitute(
                    rows, {"input_size": input_size, "output_tokens": output_tokens}
                )
            resolved_flats.append(
                FlatInput(
                    flat.key,
                    rows or fx.Num(0),
                    flat.accepts_list,
                    flat.replay_dtype,
                    flat.eager_dtype,
                    flat.video_key,
                )
            )
        flat_inputs = tuple(resolved_flats)

        const_scope = Scope(const_names)
        budget = v["budget"]
        budget_min = self.expr(budget.value.get("min"), "budget.min", const_scope)
        budget_why = self.text(budget.value.get("why"), "budget.why")

        mfpv = None
        if "max_frames_per_video" in v:
            mfpv = self.expr(
                v["max_frames_per_video"],
                "max_frames_per_video",
                Scope(const_names, host_roots=host_names, allow_calls=True),
            )
            if "video" not in modalities:
                self.err(
                    v["max_frames_per_video"],
                    "max_frames_per_video",
                    "only meaningful with the video modality",
                )

        image_limit, fp8, backend = self.resolve_guards(host_names)

        capture = self.resolve_capture(grids, flat_inputs, const_names, host_names)
        per_item_tokens, dummy_dims, tensors, capture_why, capture_graph_rows = capture
        if capture_graph_rows is not None and "budget_tokens" not in items.value:
            self.err(
                self.key_loc(self.v["capture"], "graph_rows"),
                "capture.graph_rows",
                "needs items.budget_tokens: a graph-row capacity beyond the dummy's "
                "only makes sense when budgets count something else",
            )

        sizes = self.resolve_sizes(
            host_names | const_names | dims | flat_names | grid_names
        )
        buffers = self.resolve_buffers(const_names, frozenset(n for n, _ in sizes))
        buffer_names = [b.key for b in buffers]
        metadata = self.resolve_metadata(
            host_names,
            const_names,
            flat_names,
            grid_names,
            import_names,
            set(buffer_names),
        )
        self.check_buffer_sources(buffers, tensors, metadata)
        self.check_set_by(buffers, metadata)
        self.check_allocated(buffers, tensors, capture_graph_rows)

        out_hidden = self.expr(
            v["out_hidden_size"],
            "out_hidden_size",
            Scope(const_names, host_roots=host_names),
        )
        graph_forward = self.resolve_graph_forward(
            buffer_names, host_names, import_names
        )
        eager = self.resolve_eager(
            flat_names, grid_names, dims, const_names, host_names, import_names
        )
        span = self.resolve_postprocess(
            flat_names, import_names, host_names, "graph_rows" in items.value
        )

        # Coverage is checked against graph_rows and budget_tokens: not when
        # either was given but failed to resolve (their defaults would mislead).
        failed_item = any(
            key in items.value and value is None
            for key, value in (
                ("graph_rows", graph_rows),
                ("budget_tokens", budget_tokens),
            )
        )
        if input_size is not None and output_tokens is not None:
            self.check_arithmetic(
                Arithmetic(
                    constants,
                    tuple(grids),
                    dummy_dims,
                    input_size,
                    output_tokens,
                    graph_rows,
                    buffers,
                    tensors,
                    metadata,
                    sizes,
                    budget_tokens,
                    capture_graph_rows,
                    not failed_item,
                )
            )
        else:
            for field, message in slot_problems(constants, buffers):
                self.err(self.node(*field.split(".")) or self.root, field, message)
        if self.d or input_size is None or output_tokens is None:
            return None
        ir = MixinIR(
            spec_path=self.path,
            stem=Path(self.path).stem,
            display_name=display_name,
            class_name=class_name.value,
            docstring=docstring,
            module_docstring=module_docstring,
            protocol_base=v.get("base") is None or v["base"].value == "protocol",
            local_defs_import=v.get("defs_import") is not None
            and v["defs_import"].value == "local",
            host=host,
            imports=imports,
            modalities=modalities,
            max_frames_per_video=mfpv,
            input_order=tuple(v["inputs"].value),
            flat_inputs=flat_inputs,
            grid_inputs=tuple(grids),
            constants=constants,
            input_size=input_size,
            output_tokens=output_tokens,
            graph_rows=graph_rows,
            budget_tokens=budget_tokens,
            budget_min=budget_min,
            budget_why=budget_why,
            image_limit_zero=image_limit,
            fp8_static_scales=fp8,
            backend_guard=backend,
            per_item_tokens=per_item_tokens,
            dummy_dims=dummy_dims,
            capture_tensors=tensors,
            capture_why=capture_why,
            capture_graph_rows=capture_graph_rows,
            metadata=metadata,
            buffers=buffers,
            out_hidden_size=out_hidden,
            graph_forward=graph_forward,
            eager_per_item=eager[0],
            eager_steps=eager[1],
            eager_empty_width=eager[2],
            span_assembly=span,
            sizes=sizes,
        )
        return ir

    def check_name(self, node: Location, field: str, name: str, what: str) -> bool:
        """Report a name a spec may not declare; True if it is fine."""
        if not fx.is_identifier(name):
            self.err(node, field, f"{name!r} is not a valid identifier")
        elif name in RESERVED:
            self.err(
                node, field, f"{what} {name!r} uses a name the generated code reserves"
            )
        elif name in PYTHON_BUILTINS:
            self.err(node, field, f"{what} {name!r} would shadow the Python built-in")
        elif name.startswith("_"):
            self.err(node, field, f"{what} {name!r} must not start with '_'")
        else:
            return True
        return False

    def check_clashes(
        self, section: str, mapping: Node, names: Iterable[str], *others: frozenset[str]
    ) -> None:
        for name in names:
            for other in others:
                if name in other:
                    self.err(
                        self.key_loc(mapping, name),
                        f"{section}.{name}",
                        f"{name!r} is declared twice (also an import)",
                    )

    def resolve_imports(self) -> tuple[Import, ...]:
        node = self.v.get("imports")
        if node is None:
            return ()
        out = []
        for name, entry in node.value.items():
            self.check_name(self.key_loc(node, name), f"imports.{name}", name, "import")
            if name in VLLM_TYPE_NAMES or name in TYPE_NAMES:
                self.err(
                    self.key_loc(node, name),
                    f"imports.{name}",
                    f"{name!r} is imported by the generator itself",
                )
            for target in TARGETS:
                module = entry.value[target]
                # The renderer imports from these packages only.
                roots = (*FIRST_PARTY_ROOTS[target], "vllm")
                if isinstance(module.value, str) and not module.value.startswith(roots):
                    expected = ", ".join(dict.fromkeys(roots))
                    self.err(
                        module,
                        f"imports.{name}.{target}",
                        f"module {module.value!r} is not a module of the {target} "
                        f"target (expected one under: {expected})",
                    )
            type_only = entry.value.get("type_only")
            out.append(
                Import(
                    name,
                    entry.value["vllm"].value,
                    entry.value["standalone"].value,
                    bool(type_only.value) if type_only is not None else False,
                )
            )
        return tuple(out)

    def resolve_host(self, imports: tuple[Import, ...]) -> tuple[HostAttr, ...]:
        node = self.v["host"]
        type_only = {i.name for i in imports if i.type_only} | VLLM_TYPE_NAMES
        known = {i.name for i in imports} | TYPE_NAMES | VLLM_TYPE_NAMES
        out = []
        for name, ann in node.value.items():
            field = f"host.{name}"
            self.check_name(self.key_loc(node, name), field, name, "host attribute")
            try:
                text, mentioned = _annotation(ann.value, known)
            except FormulaError as exc:
                self.err(ann, field, str(exc))
                self.failed_host.add(name)
                continue
            out.append(HostAttr(name, text, bool(mentioned & type_only)))
        return tuple(out)

    def resolve_host_methods(self, host, imports) -> frozenset[str]:
        node = self.v.get("host_methods")
        if node is None:
            return frozenset()
        names = set()
        for item in node.value:
            name = item.value
            self.check_name(item.location, "host_methods", name, "host method")
            if name in names or name in {h.name for h in host} or name in imports:
                self.err(item, "host_methods", f"{name!r} is declared twice")
            names.add(name)
        return frozenset(names)

    def resolve_constants(self, host: frozenset[str]) -> tuple[Constant, ...]:
        node = self.v.get("constants")
        if node is None:
            return ()
        out = []
        for name, entry in node.value.items():
            field = f"constants.{name}"
            self.check_name(self.key_loc(node, name), field, name, "constant")
            if name in host:
                self.err(
                    self.key_loc(node, name),
                    field,
                    f"{name!r} is also a host attribute",
                )
            if entry.kind == "mapping":
                path_node, default_node = entry.value.get("from"), entry.value.get(
                    "default"
                )
            else:
                path_node, default_node = entry, None
            path = self.host_path(path_node, field, host)
            default = default_node.value if default_node is not None else None
            if path is not None:
                out.append(Constant(name, path, default))
        return tuple(out)

    def resolve_inputs(self, host, consts, imports):
        node = self.v["inputs"]
        flats: list[tuple[FlatInput, Node | None]] = []
        grids: list[GridInput] = []
        seen_dims: dict[str, str] = {}
        for key, entry in node.value.items():
            field = f"inputs.{key}"
            loc = self.key_loc(node, key)
            self.check_name(loc, field, key, "input")
            if key in host or key in consts or key in imports:
                self.err(loc, field, f"{key!r} is already declared elsewhere")
            e = entry.value
            kind = e["kind"].value
            if kind not in ("flat", "grid"):
                # Reported by the structure pass; the names below would all
                # come out wrong, so stop here rather than add noise.
                raise ValueError(kind)
            flat_only = ("rows", "accepts_list", "replay_dtype", "eager_dtype")
            if kind == "grid":
                for extra in flat_only:
                    if extra in e:
                        self.err(
                            self.key_loc(entry, extra),
                            f"{field}.{extra}",
                            "only for flat inputs",
                        )
                dims_node = e.get("dims")
                if dims_node is None:
                    self.err(entry, f"{field}.dims", "a grid input needs dims")
                    continue
                dims = tuple(d.value for d in dims_node.value)
                for dim_node in dims_node.value:
                    dim = dim_node.value
                    self.check_name(dim_node.location, f"{field}.dims", dim, "dim")
                    if dim in seen_dims:
                        self.err(
                            dim_node,
                            f"{field}.dims",
                            f"dim {dim!r} is already a dim of {seen_dims[dim]!r}",
                        )
                    elif dim in consts or dim in host or dim in node.value:
                        self.err(
                            dim_node,
                            f"{field}.dims",
                            f"dim {dim!r} clashes with another name",
                        )
                    seen_dims[dim] = key
                video_key = e.get("video_key")
                grids.append(
                    GridInput(key, dims, video_key.value if video_key else None)
                )
            else:
                for extra in ("dims",):
                    if extra in e:
                        self.err(
                            self.key_loc(entry, extra),
                            f"{field}.{extra}",
                            "only for grid inputs",
                        )
                dtype_scope = Scope(frozenset(), host_roots=host)
                replay = self.expr(
                    e.get("replay_dtype"), f"{field}.replay_dtype", dtype_scope
                )
                eager = self.expr(
                    e.get("eager_dtype"), f"{field}.eager_dtype", dtype_scope
                )
                for label, value, src in (
                    ("replay_dtype", replay, e.get("replay_dtype")),
                    ("eager_dtype", eager, e.get("eager_dtype")),
                ):
                    if value is not None and not isinstance(value, HostPath):
                        self.err(
                            src, f"{field}.{label}", "expected a host attribute path"
                        )
                accepts = e.get("accepts_list")
                video_key = e.get("video_key")
                flats.append(
                    (
                        FlatInput(
                            key,
                            fx.Num(0),
                            bool(accepts.value) if accepts else False,
                            replay,
                            eager,
                            video_key.value if video_key else None,
                        ),
                        e.get("rows"),
                    )
                )
        if not grids:
            self.err(
                node,
                "inputs",
                "at least one grid input is needed (items are read from grids)",
            )
        if not flats:
            self.err(node, "inputs", "at least one flat input is needed")
        video_keys = {
            k: n.value["video_key"]
            for k, n in node.value.items()
            if "video_key" in n.value
        }
        if video_keys:
            if len(video_keys) != len(node.value):
                missing = [k for k in node.value if k not in video_keys]
                self.err(
                    node,
                    "inputs",
                    f"some inputs have a video_key and {', '.join(missing)} "
                    "do not (all or none)",
                )
            modalities = [n.value for n in self.v["modalities"].value]
            if "video" not in modalities:
                first = next(iter(video_keys.values()))
                self.err(first, "inputs", "video_key needs the video modality")
            seen: set[str] = set(node.value)
            for key, vk in video_keys.items():
                if vk.value in seen:
                    self.err(
                        vk, f"inputs.{key}.video_key", f"{vk.value!r} is already a key"
                    )
                seen.add(vk.value)
        elif "video" in [n.value for n in self.v["modalities"].value]:
            self.err(
                node, "inputs", "the video modality needs a video_key on every input"
            )
        return flats, grids

    def resolve_guards(self, host):
        node = self.v.get("guards")
        if node is None:
            return "off", False, None
        g = node.value
        image_limit = g["image_limit_zero"].value if "image_limit_zero" in g else "off"
        fp8 = bool(g["fp8_static_scales"].value) if "fp8_static_scales" in g else False
        if (image_limit != "off" or fp8) and "multimodal_config" not in host:
            self.err(
                node,
                "guards",
                "these guards read self.multimodal_config: declare it under host",
            )
        backend = None
        if "attention_backend" in g:
            b = g["attention_backend"]
            bv = b.value
            path = self.host_path(bv.get("from"), "guards.attention_backend.from", host)
            allow = tuple(n.value for n in bv["allow"].value) if "allow" in bv else ()
            deny = tuple(n.value for n in bv["deny"].value) if "deny" in bv else ()
            if bool(allow) == bool(deny):
                self.err(
                    b, "guards.attention_backend", "give exactly one of allow or deny"
                )
            hint = self.text(bv.get("hint"), "guards.attention_backend.hint")
            why = self.text(bv.get("why"), "guards.attention_backend.why")
            if path is not None:
                backend = BackendGuard(path, allow, deny, hint, why)
        return image_limit, fp8, backend

    def resolve_capture(self, grids, flats, consts, host):
        node = self.v["capture"]
        c = node.value
        per_item = c["per_item_tokens"].value if "per_item_tokens" in c else "ceil"
        dummy_scope = Scope(
            consts
            | {
                "k",
                "max_batch_size",
                "token_budget",
                "max_frames_per_batch",
                "frames_per_item",
            }
        )
        dummy_dims = []
        dummy = c["dummy"]
        for key, dims_node in dummy.value.items():
            field = f"capture.dummy.{key}"
            grid = next((g for g in grids if g.key == key), None)
            if grid is None:
                self.err(
                    self.key_loc(dummy, key), field, f"{key!r} is not a grid input"
                )
                continue
            if len(dims_node.value) != len(grid.dims):
                quoted = any(
                    isinstance(n.value, str)
                    and n.value.count("(") != n.value.count(")")
                    for n in dims_node.value
                )
                hint = " (a formula with a comma must be quoted)" if quoted else ""
                self.err(
                    dims_node,
                    field,
                    f"expected {len(grid.dims)} dims ({', '.join(grid.dims)}), "
                    f"got {len(dims_node.value)}{hint}",
                )
                continue
            exprs = [
                self.expr(n, f"{field}[{i}]", dummy_scope)
                for i, n in enumerate(dims_node.value)
            ]
            if all(e is not None for e in exprs):
                dummy_dims.append((key, tuple(exprs)))
        for grid in grids:
            if grid.key not in dummy.value:
                self.err(
                    dummy,
                    f"capture.dummy.{grid.key}",
                    "every grid input needs a dummy item",
                )
        shape_scope = Scope(
            consts | {"k", "rows", "max_batch_size", "token_budget"}, host_roots=host
        )
        tensors = []
        flat_keys = {f.key for f in flats}
        for key, t in c["tensors"].value.items():
            field = f"capture.tensors.{key}"
            if key not in flat_keys:
                self.err(
                    self.key_loc(c["tensors"], key),
                    field,
                    f"{key!r} is not a flat input",
                )
                continue
            shape = tuple(
                self.expr(n, f"{field}.shape[{i}]", shape_scope)
                for i, n in enumerate(t.value["shape"].value)
            )
            dtype = self.expr(
                t.value["dtype"],
                f"{field}.dtype",
                Scope(frozenset({"dtype"}), host_roots=host),
            )
            if dtype is not None and not isinstance(dtype, (HostPath, Ref)):
                self.err(
                    t.value["dtype"],
                    f"{field}.dtype",
                    "expected 'dtype' or a host path",
                )
            fill = t.value["fill"].value if "fill" in t.value else "zeros"
            why = self.text(t.value.get("why"), f"{field}.why")
            if None not in shape and dtype is not None:
                tensors.append(CaptureTensor(key, shape, dtype, fill, why))
            else:
                self.failed_sources.add(key)
        graph_rows = self.expr(
            c.get("graph_rows"),
            "capture.graph_rows",
            Scope(consts | {"k", "rows", "max_batch_size", "token_budget"}),
        )
        return (
            per_item,
            tuple(dummy_dims),
            tuple(tensors),
            self.text(c.get("why"), "capture.why"),
            graph_rows,
        )

    def resolve_sizes(self, taken) -> tuple[tuple[str, int], ...]:
        node = self.v.get("sizes")
        if node is None:
            return ()
        out = []
        for name, value in node.value.items():
            loc = self.key_loc(node, name)
            self.check_name(loc, f"sizes.{name}", name, "size")
            if name in taken:
                self.err(
                    loc, f"sizes.{name}", f"{name!r} is already declared elsewhere"
                )
            out.append((name, value.value))
        return tuple(out)

    def check_set_by(self, buffers, metadata) -> None:
        for buf in buffers:
            if buf.set_by is None:
                continue
            field = f"buffers.{buf.key}.set_by"
            node = self.node("buffers", buf.key, "set_by")
            if not buf.host_scalar:
                self.err(
                    node or buf.location, field, "set_by only goes with host_scalar"
                )
                continue
            builder = next((m for m in metadata if buf.key in m.provides), None)
            if builder is None and buf.key in self.failed_sources:
                continue
            if builder is None:
                self.err(node or buf.location, field, "no builder provides this buffer")
                continue
            kwargs = dict(builder.call.kwargs + builder.capture_kwargs)
            if buf.set_by not in kwargs:
                self.err(
                    node or buf.location,
                    field,
                    f"its builder passes no {buf.set_by!r} at capture",
                )

    def resolve_buffers(self, consts, sizes=frozenset()) -> tuple[Buffer, ...]:
        node = self.v["buffers"]
        out = []
        slot_scope = Scope(consts | {"max_batch_size", "max_frames_per_batch"})
        shape_scope = Scope(
            consts
            | sizes
            | {"k", "rows", "max_batch_size", "token_budget", "max_frames_per_batch"}
        )
        for key, entry in node.value.items():
            field = f"buffers.{key}"
            loc = self.key_loc(node, key)
            self.check_name(loc, field, key, "buffer")
            e = entry.value
            pad = e["pad"].value if "pad" in e else None
            slots = self.expr(e.get("slots"), f"{field}.slots", slot_scope)
            host_scalar = bool(e["host_scalar"].value) if "host_scalar" in e else False
            replay = e["replay"].value if "replay" in e else "copy"
            rows_dim = e["rows_dim"].value if "rows_dim" in e else 0
            if pad == "trailing_sequence" and "slots" not in e:
                self.err(
                    entry,
                    f"{field}.slots",
                    "trailing_sequence needs slots (at least max_batch_size + 2: one spare "
                    "slot for the padding sequence)",
                )
            if pad == "repeat_last" and "slots" not in e:
                self.err(
                    entry,
                    f"{field}.slots",
                    "repeat_last needs slots (at least max_batch_size + 1, or "
                    "max_frames_per_batch + 1 with one sequence per frame)",
                )
            if "slots" in e and pad is None:
                self.err(
                    self.key_loc(entry, "slots"),
                    f"{field}.slots",
                    "slots only goes with pad",
                )
            if "replay" in e and not host_scalar:
                self.err(
                    self.key_loc(entry, "replay"),
                    f"{field}.replay",
                    "replay only goes with host_scalar",
                )
            if host_scalar and (pad or rows_dim):
                self.err(entry, field, "a host scalar has no rows to pad")
            if pad and rows_dim:
                self.err(
                    entry, field, "pad rules apply to 1-D offsets; rows_dim must be 0"
                )
            shape = None
            if "shape" in e:
                parts = [
                    self.expr(n, f"{field}.shape[{i}]", shape_scope)
                    for i, n in enumerate(e["shape"].value)
                ]
                shape = tuple(parts) if None not in parts else None
            out.append(
                Buffer(
                    key,
                    rows_dim,
                    pad,
                    slots,
                    host_scalar,
                    replay,
                    self.text(e.get("why"), f"{field}.why"),
                    loc,
                    shape,
                    e["dtype"].value if "dtype" in e else None,
                    e["set_by"].value if "set_by" in e else None,
                    bool(e["allocate"].value) if "allocate" in e else False,
                )
            )
        if sum(1 for b in out if b.pad == "trailing_sequence") > 1:
            self.err(node, "buffers", "at most one buffer can use trailing_sequence")
        return tuple(out)

    def resolve_metadata(self, host, consts, flats, grids, imports, buffers):
        node = self.v.get("metadata")
        if node is None:
            return ()
        out = []
        base_names = consts | flats | grids | {"device", "dtype"}
        callables = frozenset(imports)
        common = Scope(
            base_names,
            host_roots=host,
            callables=callables,
            allow_calls=True,
            allow_literals=True,
        )
        capture_scope = Scope(
            base_names | set(CAPTURE_BUILTINS), host_roots=host, allow_literals=True
        )
        replay_scope = Scope(base_names, host_roots=host, allow_literals=True)
        provided: dict[str, str] = {}
        for i, b in enumerate(node.value):
            field = f"metadata[{i}]"
            bv = b.value
            call = self.expr(bv["call"], f"{field}.call", common)
            if call is not None and not isinstance(call, Call):
                self.err(
                    bv["call"],
                    f"{field}.call",
                    "expected a call, e.g. builder(grid, device=device)",
                )
                call = None
            if call is not None and any(
                isinstance(e, Call) for e in fx.walk(call) if e is not call
            ):
                self.err(
                    bv["call"],
                    f"{field}.call",
                    "nested calls are not allowed in a builder call",
                )
            kwargs = {}
            for phase, scope in (
                ("capture_kwargs", capture_scope),
                ("replay_kwargs", replay_scope),
            ):
                items = []
                if phase in bv:
                    for kw, value in bv[phase].value.items():
                        kfield = f"{field}.{phase}.{kw}"
                        if not fx.is_identifier(kw):
                            self.err(
                                self.key_loc(bv[phase], kw),
                                kfield,
                                f"bad keyword {kw!r}",
                            )
                            continue
                        if call is not None and kw in dict(call.kwargs):
                            self.err(
                                self.key_loc(bv[phase], kw),
                                kfield,
                                f"{kw!r} is already passed by the call itself",
                            )
                        expr = self.expr(value, kfield, scope, literal_ok=True)
                        if expr is not None:
                            items.append((kw, expr))
                kwargs[phase] = tuple(items)
            provides = []
            for p in bv["provides"].value:
                if p.value in provided:
                    self.err(
                        p,
                        f"{field}.provides",
                        f"{p.value!r} is already provided by {provided[p.value]}",
                    )
                elif p.value not in buffers:
                    self.err(
                        p, f"{field}.provides", f"{p.value!r} is not a declared buffer"
                    )
                provided[p.value] = field
                provides.append(p.value)
            if call is None:
                self.failed_sources.update(provides)
            else:
                out.append(
                    MetadataBuilder(
                        call,
                        kwargs["capture_kwargs"],
                        kwargs["replay_kwargs"],
                        tuple(provides),
                        self.text(bv.get("why"), f"{field}.why"),
                    )
                )
        return tuple(out)

    def check_buffer_sources(self, buffers, tensors, metadata):
        tensor_keys = {t.key for t in tensors}
        provided = {p for m in metadata for p in m.provides}
        for b in buffers:
            if b.key in tensor_keys and b.key in provided:
                self.err(
                    b.location,
                    f"buffers.{b.key}",
                    "provided both by a capture tensor and a builder",
                )
            elif b.key not in tensor_keys | provided | self.failed_sources:
                self.err(
                    b.location,
                    f"buffers.{b.key}",
                    "no source: add a capture tensor for it or list it in a builder's provides",
                )
        buffer_keys = {b.key for b in buffers}
        for b in buffers:
            if b.key in tensor_keys and (b.shape is not None or b.dtype is not None):
                self.err(
                    b.location,
                    f"buffers.{b.key}",
                    "shape and dtype of a capture tensor's buffer come from capture.tensors",
                )
        for t in tensors:
            if t.key not in buffer_keys:
                node = self.node("capture", "tensors")
                self.err(
                    self.key_loc(node, t.key),
                    f"capture.tensors.{t.key}",
                    f"{t.key!r} is not a declared buffer",
                )

    def check_allocated(self, buffers, tensors, capture_graph_rows) -> None:
        """``allocate`` buffers: builder buffers with a declared shape and
        dtype, rows on dim 0, plain copies; needed by capture.graph_rows."""
        tensor_keys = {t.key for t in tensors}
        allocated = [b for b in buffers if b.allocate]
        for b in allocated:
            field = f"buffers.{b.key}.allocate"
            if b.key in tensor_keys:
                self.err(b.location, field, "a capture tensor is allocated already")
            elif b.shape is None or b.dtype is None:
                self.err(b.location, field, "needs the buffer's shape and dtype")
            elif not b.shape:
                self.err(b.location, field, "needs at least one dimension (rows)")
            if b.pad or b.host_scalar or b.rows_dim:
                self.err(
                    b.location,
                    field,
                    "only for plain row buffers (rows on dim 0, no pad, not a host scalar)",
                )
        if capture_graph_rows is not None and not allocated:
            self.err(
                self.key_loc(self.v["capture"], "graph_rows"),
                "capture.graph_rows",
                "no buffer has 'allocate': the graph rows beyond the dummy's need "
                "buffers that hold them",
            )

    def check_target(self, line: Node, field: str, target: str, names, host) -> None:
        """A step's target: a name the generated method may bind."""
        if not self.check_name(line.location, field, target, "step"):
            return
        if target in names or target in host:
            self.err(line, field, f"{target!r} is already a name")

    def resolve_steps(
        self,
        lines: list[Node],
        prefix: str,
        names: set[str],
        host,
        imports,
        last_assigns: str,
        bare_before_last: str,
    ) -> list[Step]:
        """Statements of a forward: ``name = call(...)`` steps, the last a
        bare expression. ``names`` grows with each step's target."""
        steps = []
        for i, line in enumerate(lines):
            field = f"{prefix}[{i}]"
            scope = Scope(
                frozenset(names),
                host_roots=host,
                callables=frozenset(imports),
                allow_calls=True,
                allow_literals=True,
            )
            step = self.statement(line, field, scope)
            if step is None:
                # Later steps may still use the name it assigns.
                target = fx.assignment_target(line.value)
                if target is not None:
                    names.add(target)
                continue
            last = i == len(lines) - 1
            if last and step.target is not None:
                self.err(line, field, last_assigns)
            if not last and step.target is None:
                self.err(line, field, bare_before_last)
            if step.target is not None:
                self.check_target(line, field, step.target, names, host)
                names.add(step.target)
            steps.append(step)
        return steps

    def resolve_graph_forward(self, buffers, host, imports):
        node = self.v["graph_forward"]
        steps = self.resolve_steps(
            node.value,
            "graph_forward",
            set(buffers) | {"rest"},
            host,
            imports,
            "the last step is the output: write an expression, not an assignment",
            "only the last step may be a bare expression",
        )
        used = set().union(*(fx.names_in(s.expr) for s in steps)) if steps else set()
        if "rest" not in used and len(steps) == len(node.value):
            for b in buffers:
                if b not in used:
                    self.err(
                        node,
                        "graph_forward",
                        f"buffer {b!r} is captured but never read (pass it, or pass 'rest')",
                    )
        if sum(1 for s in steps for n in fx.walk(s.expr) if n == Ref("rest")) > 1:
            self.err(node, "graph_forward", "'rest' can be passed once")
        return tuple(steps)

    def resolve_eager(self, flats, grids, dims, consts, host, imports):
        node = self.v["eager_forward"]
        e = node.value
        per_item = bool(e["per_item"].value) if "per_item" in e else False
        names = set(flats) | set(consts) | (set(dims) if per_item else set(grids))
        shape = "every step but the last assigns a name; the last is the output"
        steps = self.resolve_steps(
            e["steps"].value, "eager_forward.steps", names, host, imports, shape, shape
        )
        width = None
        if "empty_width" in e:
            if not per_item:
                self.err(
                    self.key_loc(node, "empty_width"),
                    "eager_forward.empty_width",
                    "only with per_item",
                )
            width = self.expr(
                e["empty_width"],
                "eager_forward.empty_width",
                Scope(frozenset(consts), host_roots=host),
            )
        elif per_item:
            self.err(
                node,
                "eager_forward.empty_width",
                "per_item needs empty_width (for no items)",
            )
        return per_item, tuple(steps), width

    def resolve_postprocess(self, flats, imports, host, has_graph_rows):
        node = self.v.get("postprocess")
        if node is None:
            if has_graph_rows:
                self.err(
                    self.node("items", "graph_rows"),
                    "items.graph_rows",
                    "graph_rows only goes with a postprocess that turns graph rows into output tokens",
                )
            return None
        s = node.value["span_assembly"]
        sv = s.value
        field = "postprocess.span_assembly"
        types_key = sv["types"].value
        if types_key not in flats:
            self.err(
                sv["types"], f"{field}.types", f"{types_key!r} is not a flat input"
            )
        content = sv["content"].value
        if content not in imports:
            self.err(
                sv["content"],
                f"{field}.content",
                f"{content!r} is not an imported name",
            )
        delims = []
        for const, param in sv["delimiters"].value.items():
            loc = self.key_loc(sv["delimiters"], const)
            if const not in imports:
                self.err(
                    loc,
                    f"{field}.delimiters.{const}",
                    f"{const!r} is not an imported name",
                )
            if param.value not in host:
                self.err(
                    param,
                    f"{field}.delimiters.{const}",
                    f"{param.value!r} is not a host attribute",
                )
            delims.append((const, param.value))
        if not has_graph_rows:
            self.err(
                node,
                "items.graph_rows",
                "span assembly needs items.graph_rows (graph rows per item)",
            )
        return SpanAssembly(
            types_key, content, tuple(delims), self.text(sv.get("why"), f"{field}.why")
        )

    # -- arithmetic checks with the constants' defaults -----------------------------

    def check_arithmetic(self, arithmetic: Arithmetic) -> None:
        for field, message in capture_problems(arithmetic):
            node = self.node(*field.split(".")) if field else None
            self.err(node or self.root, field, message)


def _substitute(expr: Expr, mapping: dict[str, Expr | None]) -> Expr:
    if isinstance(expr, Ref) and mapping.get(expr.name) is not None:
        return mapping[expr.name]  # type: ignore[return-value]
    if isinstance(expr, fx.BinOp):
        return fx.BinOp(
            expr.op, _substitute(expr.left, mapping), _substitute(expr.right, mapping)
        )
    if isinstance(expr, fx.Neg):
        return fx.Neg(_substitute(expr.operand, mapping))
    if isinstance(expr, fx.Func):
        return fx.Func(expr.name, tuple(_substitute(a, mapping) for a in expr.args))
    return expr


def _annotation(text: object, known: set[str] | frozenset[str]) -> tuple[str, set[str]]:
    """Validate a type annotation; return its canonical text and root names."""
    if not isinstance(text, str) or not text.strip():
        raise FormulaError("expected a type annotation string")
    if len(text) > 200 or any(not (c.isascii() and c.isprintable()) for c in text):
        raise FormulaError("annotations are short printable ASCII")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise FormulaError(f"syntax error in annotation: {exc.msg}") from None
    roots: set[str] = set()

    def emit(node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            if node.id not in known:
                raise FormulaError(
                    f"unknown type {node.id!r} (declare it under imports; "
                    f"known: {', '.join(sorted(known))})"
                )
            roots.add(node.id)
            return node.id
        if isinstance(node, ast.Attribute):
            if not fx.is_identifier(node.attr) or node.attr.startswith("_"):
                raise FormulaError(f"bad attribute {node.attr!r} in annotation")
            return f"{emit(node.value)}.{node.attr}"
        if isinstance(node, ast.Constant) and node.value is None:
            return "None"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return f"{emit(node.left)} | {emit(node.right)}"
        if isinstance(node, ast.Subscript):
            inner = node.slice
            if isinstance(inner, ast.Tuple):
                args = ", ".join(emit(e) for e in inner.elts)
            else:
                args = emit(inner)
            return f"{emit(node.value)}[{args}]"
        raise FormulaError(f"{type(node).__name__} is not allowed in an annotation")

    return emit(tree), roots


def load_spec(path: str | Path, display_path: str | None = None) -> MixinIR:
    """Read, validate and resolve one spec file."""
    shown = display_path or str(path)
    _, text = read_spec_file(path, shown)
    return resolve_text(text, shown)


def resolve_text(text: str, shown: str) -> MixinIR:
    diags = Diagnostics()
    tree = load_spec_tree(text, shown, diags)
    if tree is None or diags:
        raise SpecError(diags.sorted())
    try:
        ir = _check_and_resolve(tree, shown, diags)
    except (RecursionError, MemoryError):
        # The loader refuses deep nesting; this is the last line of defence.
        diags.error(Location(shown, 1, 1), "", "spec is nested too deeply")
        raise SpecError(diags.sorted()) from None
    if ir is None or diags:
        raise SpecError(diags.sorted())
    return ir


def _check_and_resolve(tree: Node, shown: str, diags: Diagnostics) -> MixinIR | None:
    if not check_structure(tree, SPEC_SCHEMA, "", diags):
        # Still look for problems of meaning in what is well-formed, so one
        # run reports as much as it can. The resolver assumes the structure,
        # so it stops at the first malformed part; what it found until then
        # is kept (structural problems are already reported).
        if tree.kind == "mapping":
            try:
                _Resolver(tree, shown, diags).resolve()
            except (KeyError, AttributeError, TypeError, IndexError, ValueError):
                pass
        return None
    return _Resolver(tree, shown, diags).resolve()
