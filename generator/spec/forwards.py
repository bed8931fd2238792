"""The captured and eager computations, and the post-processing of outputs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from generator import formulas as fx
from generator.diagnostics import Location
from generator.formulas import Expr
from generator.scopes import PYTHON_BUILTINS, RESERVED, NameKind, derived_clash
from generator.spec.host import HostAttr, Import
from generator.spec.inputs import FlatInput
from generator.spec.names import check_name
from generator.spec.reader import Key, Keys, ReadContext, Reader
from generator.spec.step_language import (
    HOST_TENSOR_TYPES,
    host_surface,
    reach_problem,
)
from generator.spec.values import (
    INVALID,
    Boolean,
    Formula,
    Identifier,
    ListOf,
    MapOf,
    Section,
    Text,
    ValueType,
    is_name,
    parsed_or_reported,
    reach_error,
    zero_divisor,
)
from generator.yaml_loader import Node


@dataclass(frozen=True)
class Step:
    """``target = expr`` or ``a, b = expr`` (no targets: the output)."""

    targets: tuple[str, ...]
    expr: Expr
    location: Location

    @property
    def target(self) -> str | None:
        """The statement's left-hand side as printed (``a, _``), or None."""
        return ", ".join(self.targets) if self.targets else None

    @property
    def names(self) -> tuple[str, ...]:
        """The names the step binds (a discarded ``_`` is none)."""
        return tuple(t for t in self.targets if t != fx.DISCARD)


@dataclass(frozen=True)
class Loop:
    """``for <variable> in <modules>:`` over a host module list, each body
    step rebinding the loop's ``carry`` (an earlier step's name): the one
    place a step rebinds a name. The variable is only ever called.

    ``index`` (optional) names the module's place in the list, an integer
    the body may read. ``keep`` (optional, with ``index``) binds a list after
    the loop: the carry after each module whose place is in the host's list
    ``keep_at``, in order (DeepStack's intermediate hidden states)."""

    variable: str
    modules: fx.HostPath
    carry: str
    body: tuple[Step, ...]
    location: Location
    index: str | None = None
    keep_as: str | None = None
    keep_at: fx.HostPath | None = None

    #: The keys of a loop step, in the order the docs give them.
    KEYS: ClassVar = ("for", "in", "carry", "steps")
    #: The keys a loop may have besides.
    OPTIONAL_KEYS: ClassVar = ("index", "keep")
    #: The keys of ``keep``.
    KEEP_KEYS: ClassVar = ("as", "at")

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.carry,)

    @property
    def target(self) -> str:
        """The name the loop leaves bound for the steps after it."""
        return self.carry

    @property
    def names(self) -> tuple[str, ...]:
        """A loop binds its variable, its index and the list it keeps (its
        carry was bound before)."""
        named = (self.variable, self.index, self.keep_as)
        return tuple(n for n in named if n is not None)

    @property
    def expr(self) -> Expr:
        """Everything the loop reads, for the checks that walk a step."""
        reads = (self.modules, *(s.expr for s in self.body))
        if self.keep_at is not None:
            reads = (*reads, self.keep_at)
        return fx.Display("tuple", reads)


#: Methods that copy a tensor to the host: inside a captured graph they
#: would synchronise at capture and be skipped at replay.
HOST_SYNC_METHODS = frozenset({"item", "tolist", "cpu"})
#: torch functions that copy Python data to the device: a graph replays
#: the values of its capture.
HOST_DATA_FUNCTIONS = frozenset({"tensor", "as_tensor"})


def host_sync(expr: Expr) -> str | None:
    """How ``expr`` reads tensor data on the host or bakes host data in, if
    it does."""
    for sub in fx.walk(expr):
        if not isinstance(sub, fx.Call):
            continue
        callee = sub.callee
        if isinstance(callee, fx.Attr) and callee.name in HOST_SYNC_METHODS:
            return f"'.{callee.name}()' copies to the host"
        if isinstance(callee, fx.Torch) and callee.name in HOST_DATA_FUNCTIONS:
            return f"'torch.{callee.name}(...)' copies host data to the device"
    return None


class Steps(ValueType):
    """Statements: ``name = expr`` or ``a, b = expr`` steps, the last one a
    bare expression. Each step's targets are in scope for the steps after it;
    ``captured`` steps run inside a CUDA graph (no host round trips)."""

    kinds = ("array",)
    words = "list of statements"

    def __init__(
        self,
        scope: str,
        kind: NameKind,
        last: str | None,
        before_last: str,
        captured: bool = False,
        loops: bool = False,
    ):
        """``last`` None: every step assigns (a builder's steps, whose
        outputs are the names it provides), ``before_last`` the message for a
        bare one; ``loops``: a step may be a :class:`Loop` (forward steps)."""
        self.scope_id = scope
        self.kind = kind
        self.last_assigns = last
        self.bare_before_last = before_last
        self.captured = captured
        self.loops = loops

    def schema(self) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "string"}
        if self.loops:
            item = {"anyOf": [item, {"type": "object"}]}
        return {"type": "array", "items": item, "minItems": 1}

    def value(self, node: Node, field: str, ctx: ReadContext, **kw: Any) -> Any:
        scope_id = kw.get("scope", self.scope_id)
        extra = kw.get("extra", ())
        lines = node.value
        if not lines:
            ctx.error(node, field, "needs at least 1 item(s)")
        steps: list[Step | Loop] = []
        # A loop's variable or index -> its loop's field, its role, its use.
        loops: dict[str, tuple[str, str, str]] = {}
        for i, line in enumerate(lines):
            path = f"{field}[{i}]"
            step = self.step(line, path, ctx, (scope_id, extra), steps)
            if step is None:
                continue
            if isinstance(step, Loop):
                loops[step.variable] = (path, "variable", "call")
                if step.index is not None:
                    loops[step.index] = (path, "index", "read")
            else:
                _outside_loop(ctx, line, path, step, loops)
            last = i == len(lines) - 1 and self.last_assigns is not None
            if last and step.targets:
                ctx.error(line, path, self.last_assigns)
            if not last and not step.targets:
                ctx.error(line, path, self.bare_before_last)
            steps.append(step)
        if len(steps) == len(lines):  # else a refused step may read it
            _kept_lists_read(ctx, field, lines, steps)
        return tuple(steps)

    def step(self, line: Node, path: str, ctx: ReadContext, where, before):
        """One step of the list (``where``: the scope id and extra names), or
        None where it is refused."""
        scope_id, extra = where
        if line.kind == "mapping":
            loop = self.loop(line, path, ctx, scope_id, extra, before)
            if loop is None:
                _declare_kept(line, path, ctx, self.kind)
            return loop
        if line.kind != "string":
            expected = "a string or a loop" if self.loops else "a string"
            ctx.error(line, path, f"expected {expected}, got {line.kind}")
            return None
        step = self.statement(line, path, ctx, scope_id, extra)
        if step is None:
            # Later steps may still use the names it assigns.
            for target in fx.assignment_targets(line.value):
                if target != fx.DISCARD:
                    ctx.declare(self.kind, target, line.location, path)
        return step

    def statement(
        self, line: Node, path: str, ctx: ReadContext, scope_id: str, extra=()
    ):
        scope = ctx.scope(scope_id, extra)
        statement = parsed_or_reported(fx.parse_statement, line, path, ctx, scope)
        if statement is None:
            return None
        targets, expr = statement
        problem = self.step_problem(line, expr, ctx)
        if problem is not None:
            ctx.error(line, path, problem)
            return None
        step = Step(targets, expr, line.location)
        for target in step.names:
            if check_name(ctx, line.location, path, target, "step"):
                if target in scope.names or target in scope.host_roots:
                    ctx.error(line, path, f"{target!r} is already a name")
            ctx.declare(self.kind, target, line.location, path)
        return step

    def step_problem(self, line: Node, expr: Expr, ctx: ReadContext) -> str | None:
        """What the step language refuses in a parsed step, if anything."""
        zero = zero_divisor(expr)
        if zero is not None:
            return f"division by zero: {zero} always raises"
        reach = reach_error(expr, ctx)
        if reach is not None:
            return reach
        sync = host_sync(expr) if self.captured else None
        if sync is not None:
            return f"{sync}: a captured graph cannot (do it eagerly)"
        return None

    def loop(self, node, path, ctx, scope_id, extra, before) -> Loop | None:
        """A ``{for, in, carry, steps}`` step (see :class:`Loop`)."""
        if not self.loops:
            ctx.error(
                node,
                path,
                "a loop over a module list runs only in graph_forward and "
                "eager_forward steps",
            )
            return None
        keys = node.value
        ok = True
        for key in keys:
            if key not in Loop.KEYS + Loop.OPTIONAL_KEYS:
                ctx.error(
                    node.key_locations[key],
                    f"{path}.{key}",
                    f"unknown key {key!r} (a loop has {', '.join(Loop.KEYS)}, "
                    f"and may have {' and '.join(Loop.OPTIONAL_KEYS)})",
                )
                ok = False
        for key in Loop.KEYS:
            if key not in keys:
                ctx.error(
                    node, f"{path}.{key}", "required (a loop has for, in, carry, steps)"
                )
                ok = False
        if not ok:
            return None
        variable = _loop_variable(keys["for"], f"{path}.for", ctx)
        modules = _loop_modules(keys["in"], f"{path}.in", ctx, scope_id, extra)
        carry = _loop_carry(keys["carry"], f"{path}.carry", ctx, before)
        index = _loop_index(keys, path, ctx, variable)
        keep = _loop_keep(keys, path, ctx, (scope_id, extra), (variable, index))
        if variable is None or carry is None or index is False:
            return None
        inner = (variable, index) if index else (variable,)
        body = self.loop_body(
            keys["steps"], f"{path}.steps", ctx, scope_id, extra, inner, carry
        )
        if modules is None or body is None or keep is None:
            return None
        ctx.declare(self.kind, variable, keys["for"].location, f"{path}.for")
        if index:
            ctx.declare(self.kind, index, keys["index"].location, f"{path}.index")
        if keep[0] is not None:
            where = keys["keep"].value["as"].location
            ctx.declare(self.kind, keep[0], where, f"{path}.keep.as")
        return Loop(variable, modules, carry, body, node.location, index, *keep)

    def loop_body(self, node, path, ctx, scope_id, extra, inner, carry):
        """Steps ``<carry> = <expr>`` in which the loop's variable (the first
        of ``inner``) is callable and its index (the second) readable."""
        if node.kind != "sequence" or not node.value:
            ctx.error(node, path, "expected a non-empty list of steps")
            return None
        variable, *index = inner
        base = ctx.scope(scope_id, (*extra, *index))
        scope = replace(base, callables=base.callables | {variable})
        body = []
        for i, line in enumerate(node.value):
            field = f"{path}[{i}]"
            if line.kind != "string":
                nested = " (loops do not nest)" if line.kind == "mapping" else ""
                ctx.error(line, field, f"expected a string, got {line.kind}{nested}")
                continue
            statement = parsed_or_reported(fx.parse_statement, line, field, ctx, scope)
            if statement is None:
                continue
            targets, expr = statement
            if targets != (carry,):
                ctx.error(
                    line,
                    field,
                    f"a loop step rebinds only the loop's carry: write {carry} = ...",
                )
                continue
            problem = self.step_problem(line, expr, ctx)
            if problem is not None:
                ctx.error(line, field, problem)
                continue
            body.append(Step(targets, expr, line.location))
        if len(body) != len(node.value):
            return None
        if not any(fx.Ref(variable) == e.callee for s in body for e in _calls(s.expr)):
            ctx.error(node, path, f"no step calls the loop variable {variable!r}")
            return None
        return tuple(body)


def _kept_lists_read(ctx: ReadContext, field: str, lines, steps) -> None:
    """A loop's ``keep`` list is read by a later step (else it only holds
    the carry's tensors alive)."""
    for i, step in enumerate(steps):
        if not isinstance(step, Loop) or step.keep_as is None:
            continue
        later = set().union(*(fx.names_in(s.expr) for s in steps[i + 1 :]))
        if step.keep_as in later:
            continue
        place = next(j for j, n in enumerate(lines) if n.location == step.location)
        ctx.error(
            lines[place].value["keep"].value["as"],
            f"{field}[{place}].keep.as",
            f"{step.keep_as!r} is kept but never read by a later step",
        )


def _calls(expr: Expr):
    return (e for e in fx.walk(expr) if isinstance(e, fx.Call))


def _loop_variable(node: Node, path: str, ctx: ReadContext) -> str | None:
    if node.kind != "string":
        ctx.error(node, path, f"expected a name, got {node.kind}")
        return None
    name = node.value
    if not check_name(ctx, node.location, path, name, "loop variable"):
        return None
    if ctx.kind_of(name) is not None:
        ctx.error(node, path, f"{name!r} is already a name")
        return None
    return name


_LOOP_IN = (
    "a loop runs over a module list of the host: a path under a host "
    "module attribute (vision_tower.blocks)"
)
_KEEP_AT = (
    "keep's places are a list of the host: a path under a host module "
    "attribute (visual.deepstack_visual_indexes)"
)


def _loop_modules(
    node, path, ctx, scope_id, extra, what: str = _LOOP_IN
) -> fx.HostPath | None:
    """A path under a ``host:`` attribute that is not a tensor (``what``:
    the message where it is not); a loop's (``_LOOP_IN``), whose modules are
    called, under one annotated as a module."""
    if node.kind != "string":
        ctx.error(node, path, f"expected a host path, got {node.kind}")
        return None
    scope = ctx.scope(scope_id, extra)
    expr = parsed_or_reported(fx.parse_expression, node, path, ctx, scope)
    if expr is None:
        return None
    surface = host_surface(
        ctx.names, ctx.partial.get("host", ()), ctx.partial.get("imports", ())
    )
    root = expr.parts[0] if isinstance(expr, fx.HostPath) else None
    module = (
        isinstance(expr, fx.HostPath)
        and len(expr.parts) > 1
        and surface.attributes.get(root, "") not in HOST_TENSOR_TYPES
        and root in surface.attributes
        and (what != _LOOP_IN or root in surface.modules)
    )
    if not module:
        ctx.error(node, path, what)
        return None
    reach = reach_problem(expr, surface)
    if reach is not None:
        ctx.error(node, path, reach)
        return None
    return expr


def _loop_index(keys, path: str, ctx: ReadContext, variable) -> str | None | bool:
    """The loop's ``index`` name, None without one, False where refused."""
    if "index" not in keys:
        return None
    name = _loop_variable(keys["index"], f"{path}.index", ctx)
    if name is not None and name == variable:
        ctx.error(keys["index"], f"{path}.index", f"{name!r} is the loop's for")
        return False
    return False if name is None else name


def _loop_keep(keys, path: str, ctx: ReadContext, where, inner):
    """``keep: {as: <new name>, at: <host path>}``: ``(as, at)``, ``(None,
    None)`` without ``keep``, or None where it is refused."""
    if "keep" not in keys:
        return None, None
    keep, field = keys["keep"], f"{path}.keep"
    if keep.kind != "mapping":
        ctx.error(keep, field, f"expected a mapping with as and at, got {keep.kind}")
        return None
    ok = True
    for key in keep.value:
        if key not in Loop.KEEP_KEYS:
            ctx.error(
                keep.key_locations[key],
                f"{field}.{key}",
                f"unknown key {key!r} (keep has as and at)",
            )
            ok = False
    for key in Loop.KEEP_KEYS:
        if key not in keep.value:
            ctx.error(keep, f"{field}.{key}", "required (keep has as and at)")
            ok = False
    if not ok:
        return None
    if not inner[1]:
        ctx.error(
            keep,
            field,
            "keep needs the loop's index (index: <name>): the places in 'at' "
            "are compared with it",
        )
        return None
    name = _loop_variable(keep.value["as"], f"{field}.as", ctx)
    if name is not None and name in inner:
        ctx.error(keep.value["as"], f"{field}.as", f"{name!r} is a name of the loop")
        name = None
    at = _loop_modules(keep.value["at"], f"{field}.at", ctx, *where, what=_KEEP_AT)
    if name is None or at is None:
        return None
    return name, at


def _loop_carry(node: Node, path: str, ctx: ReadContext, before) -> str | None:
    """The name the body rebinds: one an earlier step of the list binds."""
    if node.kind != "string":
        ctx.error(node, path, f"expected a name, got {node.kind}")
        return None
    bound = [n for s in before if isinstance(s, Step) for n in s.names]
    if node.value not in bound:
        ctx.error(
            node,
            path,
            f"{node.value!r} is not bound by an earlier step: a loop's carry is a "
            "name an earlier step of the list assigns (the loop rebinds it)",
        )
        return None
    return node.value


def _outside_loop(ctx, line, path, step, loops) -> None:
    """A loop's variable is called, and its index read, in its steps only."""
    for name in sorted(fx.names_in(step.expr) & set(loops)):
        where, role, use = loops[name]
        ctx.error(
            line,
            path,
            f"{name!r} is the {role} of the loop at {where}: only that "
            f"loop's steps {use} it",
        )


def _declare_kept(node: Node, path: str, ctx: ReadContext, kind) -> None:
    """A refused loop's ``keep`` name, declared all the same: the steps
    after it may read it."""
    keep = node.value.get("keep")
    name = keep.value.get("as") if keep is not None and keep.kind == "mapping" else None
    if name is None or name.kind != "string" or ctx.kind_of(name.value) is not None:
        return
    value = name.value
    taken = value.startswith("_") or value in RESERVED or value in PYTHON_BUILTINS
    if is_name(value) and not taken:
        ctx.declare(kind, value, name.location, f"{path}.keep.as")


GRAPH_STEPS = Steps(
    "graph_forward",
    NameKind.GRAPH_STEP,
    "the last step is the output: write an expression, not an assignment",
    "only the last step may be a bare expression",
    captured=True,
    loops=True,
)
_EAGER_SHAPE = "every step but the last assigns a name; the last is the output"
EAGER_STEPS = Steps(
    "eager_steps", NameKind.EAGER_STEP, _EAGER_SHAPE, _EAGER_SHAPE, loops=True
)
_POST_SHAPE = "every step but the last assigns a name; the last is the output rows"
POST_STEPS = Steps("post_steps", NameKind.POST_STEP, _POST_SHAPE, _POST_SHAPE)
BUILDER_STEPS = Steps(
    "builder_steps",
    NameKind.BUILDER_STEP,
    None,
    "every step assigns a name: the buffers are the names listed in provides",
)


def check_graph_forward(
    ctx: ReadContext,
    node: Node,
    steps: tuple[Step, ...],
    buffers: list[str],
    field: str = "graph_forward",
) -> None:
    """Every buffer is read, ``rest`` at most once."""
    used = set().union(*(fx.names_in(s.expr) for s in steps)) if steps else set()
    if "rest" not in used and len(steps) == len(node.value):
        for b in buffers:
            if b not in used:
                ctx.error(
                    node,
                    field,
                    f"buffer {b!r} is captured but never read (pass it, or pass 'rest')",
                )
    if sum(1 for s in steps for n in fx.walk(s.expr) if n == fx.Ref("rest")) > 1:
        ctx.error(node, field, "'rest' can be passed once")


@dataclass(frozen=True)
class EagerForward:
    """What runs instead of a graph for batches above every budget."""

    per_item: bool
    steps: tuple[Step, ...]
    empty_width: Expr | None

    KEYS: ClassVar = Keys(
        Key(
            "per_item",
            Boolean(),
            "Run the steps once per item, each input cut to the item (a flat "
            "input's rows, a padded or tensors input's tensor, a grid's row, a "
            "count's value) and the grid dims bound to its values, and "
            "concatenate the outputs.",
            default=False,
        ),
        Key(
            "steps",
            EAGER_STEPS,
            "Statements over the flat inputs (cast to `eager_dtype`) and the grids "
            "(as lists), or with `per_item` the item's rows and dims.",
            required=True,
            example="[vit_out = vision(patches, h, w), aligner(vit_out, h, w)]",
        ),
        Key(
            "empty_width",
            Formula("constants_and_host"),
            "`per_item` only: the width of the `(0, width)` result for no items.",
            example="config.hidden_size",
        ),
    )
    DOC_TITLE = "eager_forward"

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> EagerForward | None:
        per_item = r.take("per_item")
        scope = "eager_steps_per_item" if per_item else "eager_steps"
        saved = r.ctx.unbound
        if per_item:
            r.ctx.unbound = {**saved, **_unbound_lists(r, "eager steps")}
        try:
            steps = r.take("steps", scope=scope)
        finally:
            r.ctx.unbound = saved
        if per_item and steps:
            _check_cut_names(r, steps, "encoder_eager_forward")
        width = None
        if r.has("empty_width"):
            if not per_item:
                r.error(
                    r.key_location("empty_width"),
                    "only with per_item",
                    r.path("empty_width"),
                )
            width = r.take("empty_width")
        else:
            r.take("empty_width")
            if per_item:
                r.error(
                    r.node,
                    "per_item needs empty_width (for no items)",
                    r.path("empty_width"),
                )
        if steps is None:
            return None
        return cls(per_item, steps, width)


class HostAttrName(Identifier):
    words = "host attribute"


@dataclass(frozen=True)
class SpanAssembly:
    """DeepSeek-V4.1: each item's span from graph rows at ``content`` positions
    and learned delimiter rows elsewhere, placed by the flat input ``types``."""

    types: FlatInput
    content: Import
    delimiters: tuple[tuple[Import, HostAttr], ...]
    why: str | None

    KEYS: ClassVar = Keys(
        Key(
            "types",
            Identifier(),
            "Flat input kept on the host: one span-position type per output token.",
            required=True,
            example="types",
        ),
        Key(
            "content",
            Identifier(),
            "Imported constant: the type of graph rows.",
            required=True,
            example="IMAGE",
        ),
        Key(
            "delimiters",
            MapOf(HostAttrName(), min_items=1),
            "Imported type constant → the host parameter of its learned row; the "
            "first is also the fallback for unknown types.",
            required=True,
            example="{IMAGE_START: image_start, IMAGE_END: image_end}",
        ),
        Key("why", Text(), "Comment on the assembly."),
    )
    DOC_TITLE = "postprocess.span_assembly"

    @classmethod
    def from_yaml(cls, r: Reader, flats, imports, host, **_: Any):
        types = _lookup(r, "types", flats, "is not a flat input")
        content = _lookup(r, "content", imports, "is not an imported name")
        node = r.raw("delimiters")
        delims = []
        for const, param in (r.take("delimiters") or {}).items():
            field = f"{r.path('delimiters')}.{const}"
            imp = imports.get(const)
            if imp is None:
                r.ctx.error(
                    node.key_locations[const],
                    field,
                    f"{const!r} is not an imported name",
                )
            attr = host.get(param) if param is not INVALID else None
            declared = param is not INVALID and param in r.ctx.names[NameKind.HOST]
            if param is not INVALID and attr is None and not declared:
                r.ctx.error(
                    node.value[const], field, f"{param!r} is not a host attribute"
                )
            if imp is not None and attr is not None:
                delims.append((imp, attr))
        why = r.take("why")
        if types is None or content is None or not r.ok("delimiters"):
            return None
        if len(delims) != len(node.value):
            return None
        return cls(types, content, tuple(delims), why)


def _lookup(r: Reader, key: str, table: dict, problem: str):
    name = r.take(key)
    if name is None:
        return None
    found = table.get(name)
    if found is None:
        r.error(key, f"{name!r} {problem}")
    return found


#: The name per-item post-processing steps give an item's rows of a path.
def path_rows_name(path: str) -> str:
    return f"{path}_rows"


@dataclass(frozen=True)
class Postprocess:
    span_assembly: SpanAssembly | None
    concatenate: tuple[str, ...] | None = None
    #: Custom post-processing: statements over the path's ``path_output``.
    steps: tuple[Step, ...] | None = None
    per_item: bool = False
    why: str | None = None
    #: With paths: (path, the name of an item's rows of it) for every path.
    path_rows: tuple[tuple[str, str], ...] = ()

    KEYS: ClassVar = Keys(
        Key(
            "span_assembly",
            Section(SpanAssembly),
            "Build each item's output span from graph rows and learned delimiter "
            "rows (DeepSeek-V4.1). One gather builds every span of the batch; its "
            "index goes to the device with `async_tensor_h2d`.",
        ),
        Key(
            "concatenate",
            ListOf(Identifier(), min_items=1),
            "A spec with paths: each item's rows of every path in this order, in "
            "a fresh tensor (the default: the order of `paths`). Step3-VL: an "
            "image's crop rows, then its global rows.",
            example="[local, global]",
        ),
        Key(
            "steps",
            POST_STEPS,
            "Custom post-processing of the default path's output `path_output` "
            "(a graph's padded buffer, or the eager rows): statements, the last "
            "one the output rows of every item in order (or with `per_item` the "
            "item's), split by `per_item_out_tokens` into `dest`. A result that is "
            "a view of `path_output` is cloned when the manager asks for `clone`. "
            "ERNIE-4.5-VL: the resampler over `path_output[:graph_rows]`. With "
            "paths, per item only: each path's rows of the item are "
            "`<path>_rows` (DeepSeek-OCR: `local_rows`, `global_rows`), and the "
            "steps' result is `items.output_tokens` rows.",
            example="[resampler(path_output[:graph_rows], torch.tensor(grid_thw))]",
        ),
        Key(
            "per_item",
            Boolean(),
            "With `steps`: run them once per item over `item_output` (the item's "
            "graph rows of `path_output`) with its grid dims bound and every "
            "input of the selected batch cut to the item (a padded or tensors "
            "input's tensor, a flat input's rows, a grid's row, a count's "
            "value); the last step is the item's output rows.",
            default=False,
        ),
        Key("why", Text(), "With `steps`: comment on the post-processing."),
    )
    DOC_TITLE = "postprocess"

    @classmethod
    def from_yaml(cls, r: Reader, paths=None, **kw: Any) -> Postprocess | None:
        kinds = [k for k in ("span_assembly", "concatenate", "steps") if r.has(k)]
        if len(kinds) != 1:
            r.error(r.node, "give exactly one of span_assembly, concatenate or steps")
        span = r.take("span_assembly", **kw)
        order = r.take("concatenate")
        per_item = r.take("per_item")
        why = r.take("why")
        path_rows: tuple[tuple[str, str], ...] = ()
        extra: tuple[str, ...] = ()
        if r.has("steps") and paths is not None:
            if not per_item:
                r.error(
                    "steps",
                    "with paths, post-processing steps run per item (per_item: "
                    "true) over each path's rows of the item (<path>_rows)",
                )
            path_rows = _declare_path_rows(r, paths)
            extra = tuple(name for _, name in path_rows)
            r.ctx.partial["post_steps_with_paths"] = True
        saved = r.ctx.unbound
        r.ctx.unbound = dict(saved)
        if paths is not None:
            r.ctx.unbound.update(_UNBOUND_WITH_PATHS)
        if per_item:
            r.ctx.unbound.update(_unbound_lists(r, "post-processing steps"))
        try:
            steps = r.take(
                "steps",
                scope="post_steps_per_item" if per_item else "post_steps",
                extra=extra,
            )
        finally:
            r.ctx.unbound = saved
        if per_item and steps:
            _check_cut_names(r, steps)
        for key in ("per_item", "why"):
            if r.has(key) and not r.has("steps"):
                r.error(r.key_location(key), "only with steps", r.path(key))
        if order is not None and not _path_order(r, order, paths):
            return None
        if span is None and order is None and steps is None:
            return None
        return cls(
            span,
            tuple(order) if order is not None else None,
            steps,
            bool(per_item),
            why,
            path_rows,
        )


#: The default path's names, which steps over several paths do not bind.
_UNBOUND_WITH_PATHS = {
    name: "with paths, each path's rows of the item are <path>_rows"
    for name in ("path_output", "item_output", "graph_rows")
}


def _check_cut_names(
    r: Reader, steps, method: str = "postprocess_encoder_output"
) -> None:
    """An input the steps read is bound cut to the item under a derived
    name (``item_<key>``), which must not be one the method binds for
    itself (an input ``output`` would overwrite ``item_output``)."""
    read = set().union(*(fx.names_in(s.expr) for s in steps))
    for kind in (NameKind.FLAT, NameKind.GRID):
        for name in sorted(read & set(r.ctx.names[kind])):
            clash = derived_clash(method, kind, name)
            if clash is not None:
                r.error(
                    "steps",
                    f"{kind.value} {name!r} is read cut to the item as {clash!r}, "
                    f"a name {method} binds for itself: rename the input",
                )


def _unbound_lists(r: Reader, steps: str) -> dict[str, str]:
    """List inputs, which per-item steps do not cut (every other input they
    see cut to the item)."""
    return {
        i.key: f"per-item {steps} do not cut a list input to the item; its "
        "dim, the item's units, is bound"
        for i in r.ctx.partial.get("item_inputs", ())
        if i.is_list
    }


def _declare_path_rows(r: Reader, paths) -> tuple[tuple[str, str], ...]:
    """The names of an item's rows of each path, declared as postprocess
    step names (checked against every other name, and against what the
    method binds for itself)."""
    out = []
    location = r.key_location("steps")
    for path in paths:
        name = path_rows_name(path.name)
        field = f"paths.{path.name}"
        if check_name(r.ctx, location, field, name, "step"):
            kind = r.ctx.kind_of(name)
            if kind is not None:
                r.ctx.error(
                    location,
                    r.path("steps"),
                    f"{name!r} (the item's rows of path {path.name!r}) is also a "
                    f"{kind.value}: rename one",
                )
        r.ctx.declare(NameKind.POST_STEP, name, location, r.path("steps"))
        out.append((path.name, name))
    return tuple(out)


def _path_order(r: Reader, order: list, paths) -> bool:
    """``concatenate`` names every path once (with paths)."""
    if INVALID in order:
        return False
    if paths is None:
        r.error(
            "concatenate",
            "concatenate orders the rows of several encoder paths: the spec has "
            "no paths",
        )
        return False
    names = [p.name for p in paths]
    if sorted(order) != sorted(names):
        r.error(
            "concatenate",
            f"must list every path once ({', '.join(names)}), got {', '.join(order)}",
        )
        return False
    return True
