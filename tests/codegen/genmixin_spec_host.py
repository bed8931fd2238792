"""A fake host built from a spec itself, for the soundness harness.

Every host path the spec mentions resolves to an object: constants' paths to
their defaults, ``out_hidden_size`` to :data:`OUT_WIDTH`, dtype paths to
``torch.float32``, the backend guard's path to a backend it lets through,
builder callees to :class:`FakeBuilder` (which returns tensors of the
buffers' declared shapes for the grids it is given) and forward callees to
:class:`FakeCall` (which records its arguments and returns the rows a test
queues). Imported helpers the module calls are replaced the same way. The
expected values of every check come from the spec's own formulas, evaluated
with :func:`generator.formulas.evaluate`.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.config import MultiModalConfig
from generator import formulas as fx
from generator.emit import render_spec
from generator.resolve import load_spec
from generator.spec import Buffer, EncoderPath, MetadataBuilder, MixinSpec, PadRule
from generator.spec.capture import CaptureTensor, DtypeFallback
from generator.spec.forwards import Loop
from generator.spec.inputs import ItemInput
from generator.static_checks import per_item_tokens
from genmixin_testlib import load_module_copy
from host_modules import FakeModule

OUT_WIDTH = 5
#: The key of an item's units (dicts of unit dims) in a unit spec's items.
UNITS = "units"
#: The dtype the last host path of a ``first_of`` capture dtype holds.
FALLBACK_DTYPE = torch.uint8
#: Value of host integers no constant default names (shapes over host paths).
HOST_INT = 3


class HostObject(FakeModule):
    """An attribute tree node (a module, as the generated module checks
    that every part of a called path is one); callable when a spec calls
    the path."""

    def __init__(self) -> None:
        self._fn = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:
            raise TypeError("this host path is not called by the spec")
        return self._fn(*args, **kwargs)


class HostTable:
    """A host tensor the steps index with tensors (Pixtral's RoPE table,
    ``vision_encoder.freqs_cis[rows, columns]``): any index gives zero rows
    of ``OUT_WIDTH`` columns, one per index entry."""

    def __getitem__(self, index: Any) -> torch.Tensor:
        parts = index if isinstance(index, tuple) else (index,)
        tensors = [part for part in parts if isinstance(part, torch.Tensor)]
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        return torch.zeros((*shape, OUT_WIDTH))


class HostList(list):
    def at(self, index: int) -> Any:
        while len(self) <= index:
            self.append(HostObject())
        return self[index]


def set_path(root: Any, parts: tuple[str | int, ...], value: Any) -> None:
    """``root.<parts> = value``, creating the objects on the way."""
    cur = root
    for part, nxt in zip(parts[:-1], parts[1:], strict=True):
        child = cur.at(part) if isinstance(part, int) else getattr(cur, part, None)
        if child is None or (isinstance(nxt, int) and not isinstance(child, HostList)):
            child = HostList() if isinstance(nxt, int) else HostObject()
            if isinstance(part, int):
                cur[part] = child
            else:
                setattr(cur, part, child)
        cur = child
    last = parts[-1]
    if isinstance(last, int):
        cur.at(last)
        cur[last] = value
    else:
        setattr(cur, last, value)


def get_path(root: Any, parts: tuple[str | int, ...]) -> Any:
    cur = root
    for part in parts:
        cur = cur[part] if isinstance(part, int) else getattr(cur, part)
    return cur


@dataclass
class FakeCall(FakeModule):
    """A forward callee (a submodule): records its calls, returns queued outputs (else a
    placeholder)."""

    name: str
    calls: list[tuple[tuple, dict]] = field(default_factory=list)
    queue: list[torch.Tensor] = field(default_factory=list)
    returned: list[torch.Tensor] = field(default_factory=list)
    #: The generated methods in which the result is a list of tensors (a
    #: step there joins it with torch.cat): MoonViT3d's tower returns one
    #: tensor to the graph forward and a list to the eager one.
    listed_in: set[str] = field(default_factory=set)
    #: The result is an iterator (a step passes it to ``next``: a module's
    #: ``parameters()``).
    iterated: bool = False
    #: A step reads this attribute of the result (HF's
    #: ``encoder(...).last_hidden_state``): an object holding the output.
    attribute: str | None = None
    #: A step takes element 0 of the result (HF's pooler returns a tuple):
    #: a tuple whose first element is rows enough for any gather index.
    indexed: bool = False
    #: A step gathers rows of the result by a tensor of indices (a table
    #: lookup: PaddleOCR-VL's RoPE table): rows enough for any index.
    gathered: bool = False
    #: A step unpacks the result into this many names (``cos, sin =
    #: visual.rot_pos_emb(grid)``): a tuple of as many outputs.
    unpacked: int = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        queued = bool(self.queue)
        out = self.queue.pop(0) if queued else self.placeholder(args)
        self.returned.append(out)
        if self.iterated:
            return iter([out])
        if self.attribute is not None:
            return HostObjectWith(**{self.attribute: out})
        if self.indexed or self.gathered:
            # A table the steps index or gather from: a placeholder's first
            # row repeated, enough rows for any index the steps compute.
            rows = out if queued else out[:1].expand(1 << 16, *out.shape[1:])
            return (rows, None) if self.indexed else rows
        if self.unpacked:
            return (out,) * self.unpacked
        return [out] if _forward_calling() in self.listed_in else out

    @staticmethod
    def placeholder(args: tuple) -> torch.Tensor:
        """Zeros of :data:`OUT_WIDTH` columns: the leading dims of a first
        argument of two or more dims (a row-wise layer, a norm: the steps
        after it may gather its rows), else one row."""
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.dim() >= 2:
            return torch.zeros(*first.shape[:-1], OUT_WIDTH)
        return torch.zeros(1, OUT_WIDTH)


class HostObjectWith:
    """A call result whose attributes the steps read (a model output)."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def _forward_calling() -> str | None:
    """The generated forward method this call comes from (the innermost
    ``encoder_*_forward`` frame), if any."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in (
            "encoder_cudagraph_forward",
            "encoder_eager_forward",
        ):
            return frame.f_code.co_name
        frame = frame.f_back
    return None


class SpecWorld:
    """One spec, its generated standalone module, and everything needed to
    build hosts and batches for it."""

    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        self.spec: MixinSpec = load_spec(spec_path)
        self.module = _import_standalone(spec_path)
        self.env = self._env()
        self.builders: list[FakeBuilder] = []

    # -- formulas -------------------------------------------------------------------

    def _env(self) -> dict[str, int]:
        env: dict[str, int] = {s.name: s.value for s in self.spec.sizes}
        for c in self.spec.constants:
            value = c.default if c.default is not None else HOST_INT
            env[c.name] = value
            if c.host_path is not None:
                env[c.host_path.dotted] = value
        for path in self._int_paths():
            env.setdefault(path.dotted, HOST_INT)
        if isinstance(self.spec.out_hidden_size, fx.HostPath):
            env[self.spec.out_hidden_size.dotted] = OUT_WIDTH
        return env

    @property
    def dims(self) -> set[str]:
        return {d for g in self.spec.item_inputs for d in g.dims}

    def value(self, expr: fx.Expr, **names: int) -> int:
        return fx.evaluate(expr, {**self.env, **names})

    # -- items made of units ---------------------------------------------------------

    @property
    def unit_grids(self) -> list:
        return [g for g in self.spec.item_inputs if g.unit_of is not None]

    @property
    def unit_count_dim(self) -> str | None:
        """The dim of the count input that gives each item's units."""
        if not self.unit_grids:
            return None
        return self.spec.item_input(self.unit_grids[0].unit_of).dims[0]

    def _unit_dims(self) -> set[str]:
        return {d for g in self.unit_grids for d in g.dims}

    def item_values(
        self, dims: Mapping[str, Any], path: EncoderPath | None = None
    ) -> dict[str, int]:
        """An item's formulas (a per-unit spec's summed over
        ``dims["units"]``); ``graph_rows`` and ``budget_tokens`` on ``path``
        (a path of ``paths:`` counts both in its own rows)."""
        if self.spec.items.per_unit:
            per_unit = [self._values(u, path) for u in dims[UNITS]]
            return {k: sum(v[k] for v in per_unit) for k in per_unit[0]}
        return self._values(dims, path)

    def _values(
        self, dims: Mapping[str, int], path: EncoderPath | None
    ) -> dict[str, int]:
        items = self.spec.items
        out = {
            "input_size": self.value(items.input_size, **dims),
            "output_tokens": self.value(items.output_tokens, **dims),
        }
        if path is not None and path.named:
            out["graph_rows"] = out["budget_tokens"] = self.value(
                path.output_tokens, **dims
            )
            return out
        out["graph_rows"] = (
            self.value(items.graph_rows, **dims)
            if items.graph_rows is not None
            else out["output_tokens"]
        )
        out["budget_tokens"] = (
            self.value(items.budget_tokens, **dims)
            if items.budget_tokens is not None
            else out["output_tokens"]
        )
        return out

    def path_rows(self, dims: Mapping[str, int]) -> dict[str, int]:
        """``EncoderItemSpec.path_output_tokens`` of an item, as the spec says."""
        spec = self.spec
        if spec.has_paths:
            return {p.name: self.value(p.output_tokens, **dims) for p in spec.paths}
        if (
            spec.items.budget_tokens is not None
            or spec.items.eager_when is not None
            or self.eager_beyond_axes
        ):
            return {"default": self.path_tokens(dims)}
        return {}

    def items_of(self, batch: Mapping[str, Any]) -> list[dict[str, int]]:
        """The dims of each item of a batch, read from its grids and counts
        (an item of units: its units' dims under ``UNITS``)."""
        items: list[dict[str, Any]] = []
        unit_grids = self.unit_grids
        if unit_grids:
            counts = batch[unit_grids[0].unit_of]
            counts = counts.tolist() if isinstance(counts, torch.Tensor) else counts
            if self.spec.item_input(unit_grids[0].unit_of).is_list:
                counts = [len(units) for units in counts]
            rows = [
                dict(zip(g.dims, map(int, row), strict=True))
                for g in unit_grids
                for row in (
                    batch[g.key].tolist()
                    if isinstance(batch[g.key], torch.Tensor)
                    else batch[g.key]
                )
            ]
            offsets = [0, *itertools.accumulate(counts)]
            return [
                {self.unit_count_dim: n, UNITS: rows[a:b]}
                for n, a, b in zip(counts, offsets, offsets[1:], strict=False)
            ]
        for inp in self.spec.item_inputs:
            if inp.is_tensors:
                rows = self.tensor_dims(inp, batch[inp.key])
                for i, row in enumerate(rows):
                    if i == len(items):
                        items.append({})
                    items[i].update(zip(inp.dims, row, strict=True))
                continue
            if inp.is_padded:
                rows = [[size] for size in self.padded_sizes(batch[inp.key])]
                for i, row in enumerate(rows):
                    if i == len(items):
                        items.append({})
                    items[i][inp.dims[0]] = row[0]
                continue
            rows = batch[inp.key]
            rows = rows.tolist() if isinstance(rows, torch.Tensor) else rows
            for i, row in enumerate(rows):
                if i == len(items):
                    items.append({})
                values = [row] if inp.is_count else row
                items[i].update(zip(inp.dims, (int(v) for v in values), strict=True))
        return items

    def axis_key_combos(self) -> list[tuple]:
        """Every combination of the capture axes' keys, as the spec's
        formulas give them (``[()]`` without axes)."""
        per_axis = []
        for axis in self.spec.capture_axes:
            keys = []
            for key in axis.keys:
                parts = tuple(self.value(p) for p in key)
                value = parts[0] if axis.scalar else parts
                if value not in keys:
                    keys.append(value)
            per_axis.append(keys)
        return list(itertools.product(*per_axis))

    def axis_dims(self, axis_keys: tuple) -> dict[str, int]:
        """The capture axes' dims for one combination of keys."""
        out: dict[str, int] = {}
        for axis, key in zip(self.spec.capture_axes, axis_keys, strict=True):
            parts = (key,) if axis.scalar else key
            out.update(zip(axis.dims, parts, strict=True))
        return out

    def selected_axis_keys(self, items: list[dict[str, int]]) -> tuple:
        """The keys a batch of ``items`` must replay: per axis, the first key
        covering the largest need of the items (the first key for none); on
        a ``beyond_keys: eager`` axis, the need itself when no key covers it
        (the batch holds an item that runs eagerly)."""
        out = []
        combos = self.axis_key_combos()
        # A per-unit spec's needs are its units'; items (units) that run
        # eagerly need no key.
        rows = (
            [u for it in items for u in it[UNITS]]
            if self.spec.items.per_unit
            else items
        )
        rows = [r for r in rows if not self._holds_eager(r)]
        for i, axis in enumerate(self.spec.capture_axes):
            keys = list(dict.fromkeys(c[i] for c in combos))
            need = [
                max((self.value(c, **it) for it in rows), default=0)
                for c in axis.covers
            ]
            fallback = (
                (need[0] if axis.scalar else tuple(need)) if axis.eager_beyond else None
            )
            out.append(
                next(
                    (
                        k
                        for k in keys
                        if all(p >= n for p, n in zip((k,) if axis.scalar else k, need))
                    ),
                    fallback,
                )
            )
        return tuple(out)

    def graph_rows(self, dims: Mapping[str, int]) -> int:
        items = self.spec.items
        return self.value(items.graph_rows or items.output_tokens, **dims)

    def flat_rows(self, key: str, dims: Mapping[str, Any]) -> int:
        flat = self.spec.flat(key)
        if flat.unit_of is None:
            return self.value(flat.rows, **dims)
        if self.spec.items.per_unit:
            return sum(self.value(flat.rows, **u) for u in dims[UNITS])
        return dims[self.unit_count_dim] * self.value(flat.rows)

    # -- hosts --------------------------------------------------------------------------

    def host(self) -> Any:
        spec = self.spec
        cls = type("SpecHost", (getattr(self.module, spec.class_name),), {})
        host = cls.__new__(cls)
        for i, attr in enumerate(spec.host):
            # A learned row (a parameter of the host) is a tensor; the rest
            # are module trees.
            tensor = attr.annotation == "torch.Tensor"
            value = torch.full((OUT_WIDTH,), -10.0 - i) if tensor else HostObject()
            setattr(host, attr.name, value)
        if "multimodal_config" in {a.name for a in spec.host}:
            host.multimodal_config = MultiModalConfig()
        for c in spec.constants:
            if c.host_path is not None:
                set_path(host, c.host_path.parts, self.env[c.name])
        for path in self._int_paths():
            set_path(host, path.parts, self.env[path.dotted])
        for path in self._table_paths():
            set_path(host, path.parts, HostTable())
        for attr in spec.host:
            if attr.annotation == "torch.dtype":
                setattr(host, attr.name, torch.float32)  # the forwards cast to it
        for path in self._int_paths():
            if path.parts[-1] == "dtype":  # a weight's dtype, cast to
                set_path(host, path.parts, torch.float32)
            elif path.parts[-1] == "weight":  # a module's weight, multiplied by
                set_path(host, path.parts, torch.eye(OUT_WIDTH))
        for flat in spec.flat_inputs:
            for dtype_path in (flat.replay_dtype, flat.eager_dtype):
                if dtype_path is not None:
                    set_path(host, dtype_path.parts, torch.float32)
        for t in (t for p in spec.paths for t in p.capture.tensors):
            if isinstance(t.dtype, fx.HostPath):
                set_path(host, t.dtype.parts, torch.float32)
            elif isinstance(t.dtype, DtypeFallback):
                # None everywhere but the last host path: the fallback is taken.
                *unset, last = t.dtype.options
                for option in unset:
                    set_path(host, option.parts, None)
                set_path(host, last.parts, FALLBACK_DTYPE)
        for i, kept in enumerate(k for p in spec.paths for k in p.capture.keep_alive):
            # A host tensor the graphs read, which the capture holds.
            set_path(host, kept.parts, torch.full((2,), float(i)))
        guard = spec.guards.attention_backend
        if guard is not None:
            ok = guard.allow[0].value if guard.allow else "FLASH_ATTN"
            if not guard.allow and any(b.value == ok for b in guard.deny):
                ok = "ROCM_AITER_FA"
            set_path(host, guard.path.parts, getattr(AttentionBackendEnum, ok))
        if isinstance(spec.out_hidden_size, fx.HostPath):
            set_path(host, spec.out_hidden_size.parts, OUT_WIDTH)
        if spec.capture_off is not None:
            set_path(host, spec.capture_off.when.parts, False)
        for name in (m for m in spec.host_methods if "." not in m):
            # A dotted entry names a method the host's modules already have.
            frames = self.env.get("max_frames_per_video", 2)
            setattr(host, name, lambda frames=frames: frames)
        for c in spec.constants:
            if c.method is not None:
                setattr(host, c.method, lambda value=self.env[c.name]: value)
        span = spec.span_assembly
        if span is not None:
            for i, (_, attr) in enumerate(span.delimiters):
                setattr(host, attr.name, torch.full((OUT_WIDTH,), -1.0 - i))
        self._install_callables(host)
        return host

    def _int_paths(self) -> set[fx.HostPath]:
        """Host paths whose values the spec reads as they are (arguments,
        shapes, widths): the leaves, not called, not a prefix of another,
        not indexed with tensors (:meth:`_table_paths`)."""
        spec = self.spec
        exprs = self._read_exprs()
        paths = {p for e in exprs for p in fx.host_paths_in(e)}
        callees = {
            sub.callee for e in exprs for sub in fx.walk(e) if isinstance(sub, fx.Call)
        }
        prefixes = {p.parts[:i] for p in paths for i in range(1, len(p.parts))}
        # A learned row (a tensor attribute, ``view_seperator[None]``) stays
        # the tensor the host is given.
        tensors = {a.name for a in spec.host if a.annotation == "torch.Tensor"}
        return {
            p
            for p in paths - callees - self._table_paths()
            if p.parts not in prefixes and p.parts[0] not in tensors
        }

    def _table_paths(self) -> set[fx.HostPath]:
        """Host paths a step indexes with a name (a tensor): host tensors read
        by index, such as a tower's RoPE table."""
        return {
            sub.value
            for e in self._read_exprs()
            for sub in fx.walk(e)
            if isinstance(sub, fx.Subscript)
            and isinstance(sub.value, fx.HostPath)
            and fx.names_in(sub.index)
        }

    def _read_exprs(self) -> list[fx.Expr]:
        """Every expression of the spec that reads host paths at run time."""
        spec = self.spec
        exprs = [spec.out_hidden_size]
        if spec.max_frames_per_video is not None:
            exprs.append(spec.max_frames_per_video)
        for path in spec.paths:
            exprs += [s for t in path.capture.tensors for s in t.shape]
            if path.eager_forward.empty_width is not None:
                exprs.append(path.eager_forward.empty_width)
            for b in path.metadata:
                exprs += b.exprs
            exprs += [s.expr for s in path.graph_forward + path.eager_forward.steps]
        exprs += [s.expr for s in spec.post_steps]
        return exprs

    def _install_callables(self, host: Any) -> None:
        self.builders = []
        self.calls: dict[str, FakeCall] = {}
        paths = self.spec.paths
        for b in (b for p in paths for b in p.metadata if b.call is not None):
            fake = FakeBuilder(self, b)
            self.builders.append(fake)
            self._install(host, b.call.callee, fake)
        steps = [s for p in paths for s in p.graph_forward + p.eager_forward.steps]
        listed = {
            "encoder_cudagraph_forward": _joined_results(
                [s for p in paths for s in p.graph_forward]
            ),
            "encoder_eager_forward": _joined_results(
                [s for p in paths for s in p.eager_forward.steps]
            ),
        }
        iterated = _iterated_results(steps)
        # A builder's steps run for real, their host calls faked.
        steps += [s for p in paths for b in p.metadata for s in b.steps]
        steps += self.spec.post_steps
        for step in steps:
            # Methods called on a result (``.to(dtype)``) are no attribute reads.
            methods = {
                id(sub.callee)
                for sub in fx.walk(step.expr)
                if isinstance(sub, fx.Call) and isinstance(sub.callee, fx.Attr)
            }
            for sub in fx.walk(step.expr):
                # Methods of values and torch functions run for real.
                if (
                    isinstance(sub, fx.Call)
                    and is_host_call(sub)
                    and not self.on_tensor(sub.callee)
                ):
                    name = _callee_name(sub.callee)
                    fake = self.calls.setdefault(name, FakeCall(name))
                    fake.listed_in |= {
                        m for m, names in listed.items() if name in names
                    }
                    fake.iterated = fake.iterated or sub in iterated
                    if sub is step.expr and len(step.targets) > 1:
                        fake.unpacked = len(step.targets)
                    self._install(host, sub.callee, fake)
                if (
                    isinstance(sub, fx.Subscript)
                    and isinstance(sub.value, fx.Call)
                    and is_host_call(sub.value)
                    and sub.index == fx.Num(0)
                ):
                    name = _callee_name(sub.value.callee)
                    self.calls.setdefault(name, FakeCall(name)).indexed = True
                elif (
                    isinstance(sub, fx.Subscript)
                    and isinstance(sub.value, fx.Call)
                    and is_host_call(sub.value)
                    and not isinstance(sub.index, fx.Num)
                ):
                    name = _callee_name(sub.value.callee)
                    self.calls.setdefault(name, FakeCall(name)).gathered = True
                if (
                    isinstance(sub, fx.Attr)
                    and isinstance(sub.value, fx.Call)
                    and id(sub) not in methods
                ):
                    if is_host_call(sub.value):
                        name = _callee_name(sub.value.callee)
                        fake = self.calls.setdefault(name, FakeCall(name))
                        fake.attribute = sub.name
        for loop in (s for s in steps if isinstance(s, Loop)):
            # Two modules in the list, each the fake of the loop's variable.
            fake = self.calls[_callee_name(fx.Ref(loop.variable))]
            set_path(host, loop.modules.parts, torch.nn.ModuleList([fake, fake]))
            if loop.keep_at is not None:
                # Both kept: a later loop over another two-module list may
                # pair its modules with the kept values.
                set_path(host, loop.keep_at.parts, [0, 1])

    def on_tensor(self, callee) -> bool:
        """A method of a host tensor (``image_newline.to``): runs for real."""
        if not isinstance(callee, fx.HostPath) or len(callee.parts) < 2:
            return False
        root = next((a for a in self.spec.host if a.name == callee.parts[0]), None)
        return root is not None and root.annotation == "torch.Tensor"

    def _install(self, host: Any, callee, fake) -> None:
        if isinstance(callee, fx.Ref):  # an imported helper
            setattr(self.module, callee.name, fake)
            return
        try:
            target = get_path(host, callee.parts)
        except AttributeError:
            target = None
        if isinstance(target, HostObject):
            target._fn = fake
        else:
            set_path(host, callee.parts, fake)

    # -- batches -------------------------------------------------------------------------

    def dim_steps(self) -> dict[str, int]:
        """Each dim divided in the item or row formulas, or with a declared
        ``multiple_of``, is drawn as a multiple of its divisors, so each
        division is exact as in real inputs; the other dims as any positive
        number."""
        exprs = [self.spec.items.input_size, self.spec.items.output_tokens]
        exprs += [
            e for e in (self.spec.items.graph_rows, self.spec.items.budget_tokens) if e
        ]
        exprs += [p.output_tokens for p in self.spec.paths if p.named]
        exprs += [f.rows for f in self.spec.flat_inputs]
        steps: dict[str, int] = {}
        for e in exprs:
            for sub in fx.walk(e):
                if isinstance(sub, fx.BinOp) and sub.op in ("//", "%"):
                    left, right = sub.left, sub.right
                elif isinstance(sub, fx.Func) and sub.name == "ceil_div":
                    left, right = sub.args
                else:
                    continue
                # Only a division of dims needs dims that divide evenly (a
                # constant's own division, side // patch, does not).
                for dim in fx.names_in(left) & self.dims:
                    step = max(1, abs(self.value(right)))
                    steps[dim] = math.lcm(steps.get(dim, 1), step)
        # A dim the mixin checks is a multiple (inputs.<key>.multiple_of):
        # real inputs are (Phi-4-multimodal's image sizes, crops of 448).
        for g in self.spec.item_inputs:
            for dim, divisor in g.multiple_of:
                step = max(1, abs(self.value(divisor)))
                steps[dim] = math.lcm(steps.get(dim, 1), step)
        return steps

    def random_item(
        self, rng: random.Random, big: int = 3, zero_counts: bool = False
    ) -> dict[str, Any]:
        """Random dims (multiples of their :meth:`dim_steps`); counts may be
        0 with ``zero_counts`` (an image without crops). Free dims are drawn,
        derived dims (``inputs.<key>.equals``) computed. Items of units carry
        their units' dims under ``UNITS``."""
        steps = self.dim_steps()
        derived = {d for g in self.spec.item_inputs for d in g.derived_dims}
        item: dict[str, Any] = self.derive(
            {
                d: steps.get(d, 1)
                * rng.randint(0 if zero_counts and g.is_count else 1, big)
                for g in self.spec.item_inputs
                for d in g.dims
                if d not in derived
            }
        )
        if self.unit_grids:
            unit_dims = self._unit_dims()
            step = self._unit_step(steps)
            edge = self._unit_edge()
            units = [
                {d: self._unit_dim(rng, step, big, edge) for d in unit_dims}
                for _ in range(rng.randint(1, big))
            ]
            item = {d: v for d, v in item.items() if d not in unit_dims}
            item[self.unit_count_dim] = len(units)
            item[UNITS] = units
        return item

    def eager_item(self, rng: random.Random) -> dict[str, Any]:
        """A random item that runs eagerly: its dims doubled until no key of
        a ``beyond_keys: eager`` axis covers it (the keys of real specs are
        far above :meth:`random_item`'s small dims)."""
        item = self.random_item(rng)
        for _ in range(40):
            if self.runs_eagerly(item):
                return item
            derived = {d for g in self.spec.item_inputs for d in g.derived_dims}
            item = self.derive(
                {d: v * 2 if d not in derived else v for d, v in item.items()}
            )
        raise AssertionError("no item of this spec runs eagerly")

    def _unit_edge(self) -> int | None:
        """Where units start to run eagerly, when the small draws never get
        there: the largest capture-axis bound of a spec whose per-unit
        ``eager_when`` keeps wider units out of the graphs (MiniCPM-V's
        slices past 70 patches)."""
        spec = self.spec
        if not (spec.items.per_unit and spec.items.eager_when is not None):
            return None
        bounds = [self.value(b) for a in spec.capture_axes for b in a.bound or ()]
        return max(bounds) if bounds and max(bounds) > 3 else None

    @staticmethod
    def _unit_dim(rng: random.Random, step: int, big: int, edge: int | None) -> int:
        """A unit dim: small, or (with an eager edge) at the edge or one
        past it, a quarter of the time each."""
        draw = rng.random()
        if edge is not None and draw < 0.5:
            return edge if draw < 0.25 else edge + 1
        return step * rng.randint(1, big)

    def derive(self, item: dict[str, int]) -> dict[str, int]:
        """``item`` with every derived dim set from its formula."""
        out = dict(item)
        for g in self.spec.item_inputs:
            for dim, expr in g.equals:
                out[dim] = self.value(expr, **item)
        order = [d for g in self.spec.item_inputs for d in g.dims]
        return {d: out[d] for d in order}

    @property
    def eager_beyond_axes(self) -> list[int]:
        """The capture axes (by index) with ``beyond_keys: eager``."""
        return [i for i, a in enumerate(self.spec.capture_axes) if a.eager_beyond]

    def uncovered(self, item: Mapping[str, int]) -> bool:
        """No key of some ``beyond_keys: eager`` axis covers the item."""
        combos = self.axis_key_combos()
        for i in self.eager_beyond_axes:
            axis = self.spec.capture_axes[i]
            need = [self.value(c, **item) for c in axis.covers]
            keys = {c[i] for c in combos}
            parts = [(k,) if axis.scalar else k for k in keys]
            if not any(all(p >= n for p, n in zip(k, need)) for k in parts):
                return True
        return False

    def runs_eagerly(self, item: Mapping[str, int]) -> bool:
        """``items.eager_when`` holds for the item (a per-unit spec's: for
        one of its units), or no key of a ``beyond_keys: eager`` axis
        covers it."""
        if self.uncovered(item):
            return True
        eager = self.spec.items.eager_when
        if eager is None:
            return False
        units = item[UNITS] if self.spec.items.per_unit else [item]
        return any(self._holds_eager(dims) for dims in units)

    def _holds_eager(self, dims: Mapping[str, int]) -> bool:
        """``items.eager_when`` holds for these dims (an item's, or with
        ``per_unit`` a unit's)."""
        eager = self.spec.items.eager_when
        if eager is None:
            return False
        left = self.value(eager.left, **dims)
        return _COMPARE[eager.op](left, self.value(eager.right, **dims))

    def path_tokens(
        self, item: Mapping[str, int], path: EncoderPath | None = None
    ) -> int:
        """The item's budget tokens (on ``path``) as the manager sees them:
        above every budget when it runs eagerly."""
        if self.runs_eagerly(item):
            return self.module._EAGER_ONLY_TOKENS
        return self.item_values(item, path)["budget_tokens"]

    def batch(
        self,
        items: list[dict[str, int]],
        *,
        lists=False,
        video=False,
    ) -> dict[str, Any]:
        """``mm_kwargs`` of these items: grids as tensors (or lists), counts as
        1-D tensors (or lists), flat rows numbered ``(item, row)``."""
        out: dict[str, Any] = {}
        for inp in self.spec.inputs:
            key = inp.video_key if video and inp.video_key else inp.key
            if isinstance(inp, ItemInput) and inp.is_tensors:
                out[key] = self.tensors_value(inp, items, lists=lists)
            elif isinstance(inp, ItemInput) and inp.is_padded:
                out[key] = self.padded_value(inp.key, items, lists=lists)
            elif inp in self.spec.item_inputs and inp.is_list:
                out[key] = self.list_units(inp, items)
            elif inp in self.spec.item_inputs:
                if inp.unit_of is not None:  # one row per unit
                    rows = [[u[d] for d in inp.dims] for it in items for u in it[UNITS]]
                else:
                    rows = [[it[d] for d in inp.dims] for it in items]
                if inp.is_count:
                    rows = [r[0] for r in rows]
                if lists:
                    out[key] = rows
                elif inp.is_count:
                    out[key] = torch.tensor(rows, dtype=torch.int64)
                else:
                    out[key] = torch.tensor(rows, dtype=torch.int64).reshape(
                        len(rows), len(inp.dims)
                    )
            else:
                out[key] = self.flat_tensor(inp.key, items)
        return out

    def list_units(self, inp, items) -> list[list[torch.Tensor]]:
        """A list input: per item its units' tensors, each of ``unit_shape``
        for its unit's dims, starting with ``(item, unit)`` (so that a
        selection's order shows)."""
        out = []
        for i, it in enumerate(items):
            units = []
            for u, dims in enumerate(it[UNITS]):
                shape = [self.value(e, **dims) for e in inp.unit_shape]
                # (i, u) in every element, without the memory of a unit at the
                # eager edge: a stride-0 view, materialised where it is packed.
                unit = torch.tensor(float(i * 100 + u)).expand(shape)
                units.append(unit)
            out.append(units)
        return out

    def row_shape(self, key: str) -> list[int]:
        """The shape of one row of a flat input: its capture buffer's, or 2
        (of a padded input: past its size dim)."""
        tensors = (t for p in self.spec.paths for t in p.capture.tensors)
        tensor = next((t for t in tensors if t.key == key), None)
        if tensor is None:
            return [2]
        names = {"k": 1, "rows": 1, "max_batch_size": 1, "token_budget": 1}
        item = self.spec.item_input(key)
        skip = 2 if item is not None and item.is_padded else 1
        if skip == 2:
            names.update(self.axis_dims(self.axis_key_combos()[0]))
            names.update({let.name: 1 for let in self.spec.paths[0].capture.lets})
        return [self.value(e, **names) for e in tensor.shape[skip:]] or []

    # -- padded inputs --------------------------------------------------------------------

    def padded_probe_items(self) -> list[dict[str, int]]:
        """Items of every size (multiples of its step) up to the widest key
        and a bit past it, the other dims at their step: all size dims alike,
        and (a tensors input's) each size dim alone."""
        steps = self.dim_steps()
        sizes = {
            d
            for g in self.spec.item_inputs
            if g.is_padded
            for d in (g.dims if g.is_tensors else g.dims[:1])
        }
        base = {d: steps.get(d, 1) for g in self.spec.item_inputs for d in g.dims}
        widest = max(
            (self.value(p) for a in self.spec.capture_axes for k in a.keys for p in k),
            default=64,
        )
        step = math.lcm(1, *(steps.get(d, 1) for d in sizes))
        scaled = [set(sizes), *({d} for d in sizes if len(sizes) > 1)]
        return [
            self.derive({**base, **{d: step * m for d in group}})
            for group in scaled
            for m in range(1, 2 * widest + 2)
        ]

    def tensors_value(self, inp, items, *, lists: bool = False):
        """A tensors input of these items: a list of tensors of its shape at
        each item's dims, or (``lists`` False and every shape alike) one
        stacked tensor. Item ``i`` holds ``i + 1`` everywhere (a stride-0
        view: no memory at the eager edge), so a selection's order and the
        padding (``pad_value``, never an item's value here) show."""
        parts = [
            torch.tensor(float(i + 1)).expand(
                [self.value(e, **it) for e in inp.item_shape]
            )
            for i, it in enumerate(items)
        ]
        if not lists and len({p.shape for p in parts}) == 1:
            return torch.stack(parts)
        if not lists and not parts:
            return torch.zeros(0, *[1 for _ in inp.item_shape])
        return parts

    @staticmethod
    def tensor_dims(inp, value) -> list[tuple[int, ...]]:
        """Each item's dims of a tensors input, read off its shape."""
        parts = list(value) if isinstance(value, torch.Tensor) else value
        return [tuple(part.shape[p] for p in inp.dim_positions) for part in parts]

    @staticmethod
    def tensor_ids(value) -> list[float]:
        """The value each item holds (its position in the batch sent, plus 1)."""
        parts = list(value) if isinstance(value, torch.Tensor) else value
        return [float(part.reshape(-1)[0]) for part in parts]

    def takes(self, item: Mapping[str, int], key_dims: Mapping[str, int], budget: int):
        """A graph of these axis dims and budget replays batches holding
        ``item``: no eager rule sends it away, the key covers it and its
        budget tokens fit."""
        if self.runs_eagerly(item) or self.path_tokens(item) > budget:
            return False
        for axis in self.spec.capture_axes:
            need = [self.value(c, **item) for c in axis.covers]
            if any(n > key_dims[d] for n, d in zip(need, axis.dims, strict=True)):
                return False
        return True

    def padded_value(self, key: str, items, *, lists: bool = False):
        """A padded input of these items: a list of ``(p_i, ...)`` tensors, or
        (``lists`` False and every size alike) one ``(N, p, ...)`` tensor.
        Row ``r`` of item ``i`` starts with ``(i, r)``: a selection's order
        and the padding show."""
        item = self.spec.item_input(key)
        shape = self.row_shape(key)
        parts = []
        for i, it in enumerate(items):
            part = torch.zeros(it[item.dims[0]], *shape)
            view = part.view(part.shape[0], -1)
            view[:, 0] = i
            if view.shape[1] > 1:
                view[:, 1] = torch.arange(part.shape[0])
            parts.append(part)
        sizes = {p.shape[0] for p in parts}
        if not lists and len(sizes) == 1:
            return torch.stack(parts)
        if not lists and not parts:
            return torch.zeros(0, 1, *shape)
        return parts

    @staticmethod
    def padded_sizes(value) -> list[int]:
        if isinstance(value, torch.Tensor):
            return [value.shape[1]] * value.shape[0]
        return [part.shape[0] for part in value]

    @staticmethod
    def padded_ids(value, sizes: list[int]) -> list[list[list[float]]]:
        """Per item, ``(item, row)`` of its rows within its own size."""
        parts = list(value) if isinstance(value, torch.Tensor) else value
        out = []
        for part, size in zip(parts, sizes, strict=True):
            view = part[:size].reshape(size, -1)
            out.append(view[:, :2].tolist() if view.shape[1] > 1 else view.tolist())
        return out

    def flat_tensor(self, key: str, items) -> torch.Tensor:
        """Row ``r`` of item ``i`` starts with ``(i, r)``: a selection's order
        shows (rows of one element hold ``i``). Span types are valid ones."""
        span = self.spec.span_assembly
        if span is not None and span.types.key == key:
            return self.span_types(items)
        shape = self.row_shape(key)
        width = math.prod(shape)
        rows = []
        for i, it in enumerate(items):
            for r in range(self.flat_rows(key, it)):
                row = torch.zeros(width)
                row[0] = i
                if width > 1:
                    row[1] = r
                rows.append(row)
        flat = torch.stack(rows) if rows else torch.zeros(0, width)
        return flat.reshape(len(rows), *shape)

    def span_types(self, items) -> torch.Tensor:
        """Per item: its graph rows as content positions, then delimiters
        rotated by the item's index (so that a selection's order shows), one
        type per output token."""
        span = self.spec.span_assembly
        content = getattr(self.module, span.content.name)
        marks = [getattr(self.module, imp.name) for imp, _ in span.delimiters]
        types: list[int] = []
        for i, it in enumerate(items):
            rows = self.graph_rows(it)
            extra = self.item_values(it)["output_tokens"] - rows
            types += [content] * rows + [
                marks[(i + j) % len(marks)] for j in range(extra)
            ]
        return torch.tensor(types, dtype=torch.int64)

    @staticmethod
    def row_ids(flat: torch.Tensor) -> list[list[float]]:
        """``(item, row)`` of each row of a flat tensor made by :meth:`flat_tensor`."""
        view = flat.reshape(flat.shape[0], math.prod(flat.shape[1:]))
        return view[:, :2].tolist() if view.shape[1] > 1 else view.tolist()

    def fitting_items(
        self,
        rng: random.Random,
        budget: int,
        mbs: int,
        path: EncoderPath | None = None,
    ) -> list[dict[str, int]]:
        """Items whose budget tokens on ``path`` fit ``budget``, at most
        ``mbs`` of them."""
        items: list[dict[str, int]] = []
        used = 0
        for _ in range(mbs):
            for big in (3, 2, 1):
                item = self.random_item(rng, big)
                tokens = self.path_tokens(item, path)
                if used + tokens <= budget:
                    items.append(item)
                    used += tokens
                    break
            else:
                break
        return items

    def largest_item(
        self, budget: int, path: EncoderPath | None = None
    ) -> dict[str, int] | None:
        """One item with as many budget tokens (on ``path``) as ``budget``
        allows (each dim grown in turn, by multiples of its step), or None
        when even the smallest does not fit."""
        steps = self.dim_steps()
        if self.unit_grids:
            return self._most_units(budget, self._unit_step(steps))
        item = self.derive(
            {d: steps.get(d, 1) for g in self.spec.item_inputs for d in g.dims}
        )

        def fits(candidate: dict[str, int]) -> bool:
            return self.path_tokens(candidate, path) <= budget

        if not fits(item):
            return None
        items = self.spec.items.on_path(path.output_tokens if path else None)
        counted = fx.names_in(items.budget_tokens or items.output_tokens)
        derived = {d for g in self.spec.item_inputs for d in g.derived_dims}
        for dim in (d for d in item if d in counted and d not in derived):
            step = steps.get(dim, 1)
            grow = step
            while grow >= step:
                trial = self.derive({**item, dim: item[dim] + grow})
                if fits(trial) and trial[dim] <= budget * step:
                    item = trial
                    grow *= 2
                else:
                    grow //= 2
                    grow -= grow % step
        return item

    def _unit_step(self, steps: dict[str, int]) -> int:
        """One step for every unit dim (their dims' steps' least multiple)."""
        return math.lcm(1, *(steps.get(d, 1) for d in self._unit_dims()))

    def _most_units(self, budget: int, step: int) -> dict[str, Any] | None:
        """One item of as many of the smallest units as the budget holds."""
        unit = {d: step for d in self._unit_dims()}
        item: dict[str, Any] = {d: step for g in self.spec.item_inputs for d in g.dims}
        item = {d: v for d, v in item.items() if d not in unit}
        probe = {**item, self.unit_count_dim: 1, UNITS: [unit]}
        tokens = self.item_values(probe)["budget_tokens"]
        count = min(budget // tokens, 4096) if tokens > 0 else 0
        if count == 0:
            return None
        return {**item, self.unit_count_dim: count, UNITS: [unit] * count}

    def k(self, budget: int, mbs: int, path: EncoderPath) -> int:
        return per_item_tokens(budget, mbs, path.capture.rounding)

    def capture_names(
        self,
        budget: int,
        mbs: int,
        mfpb: int,
        path: EncoderPath,
        axis_keys: tuple = (),
    ) -> dict[str, int]:
        """What ``path``'s capture binds before its dummy: ``k``, the
        manager's arguments, ``frames_per_item``, the capture axes' dims and
        the ``capture.let`` values, each from the spec's formula."""
        names = {
            "k": self.k(budget, mbs, path),
            "max_batch_size": mbs,
            "token_budget": budget,
            "max_frames_per_batch": mfpb,
            "frames_per_item": max(mfpb // mbs, 1),
            **self.axis_dims(axis_keys),
        }
        for let in path.capture.lets:
            names[let.name] = self.value(let.expr, **names)
        return names

    def refused(self, names: Mapping[str, int], path: EncoderPath):
        """The first ``capture.assert`` of ``path`` these capture names
        break, if any."""
        for check in path.capture.asserts:
            left = self.value(check.check.left, **names)
            right = self.value(check.check.right, **names)
            if not _COMPARE[check.check.op](left, right):
                return check
        return None


_COMPARE = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def _joined_results(steps) -> set[str]:
    """Host calls whose result a later step joins with ``torch.cat`` or
    ``torch.stack`` (MoonViT's per-image path returns a list of tensors)."""
    joined = set()
    for step in steps:
        for sub in fx.walk(step.expr):
            if (
                isinstance(sub, fx.Call)
                and isinstance(sub.callee, fx.Torch)
                and sub.callee.name in ("cat", "stack")
                and sub.args
                and isinstance(sub.args[0], fx.Ref)
            ):
                joined.add(sub.args[0].name)
    out = set()
    for step in steps:
        if step.target in joined and isinstance(step.expr, fx.Call):
            if is_host_call(step.expr):
                out.add(_callee_name(step.expr.callee))
    return out


def _iterated_results(steps) -> set[fx.Call]:
    """Host calls a step passes to ``next`` (``next(proj.parameters())``)."""
    return {
        sub.args[0]
        for step in steps
        for sub in fx.walk(step.expr)
        if isinstance(sub, fx.Call)
        and isinstance(sub.callee, fx.Builtin)
        and sub.callee.name == "next"
        and sub.args
        and is_host_call(sub.args[0])
    }


def _callee_name(callee) -> str:
    return callee.name if isinstance(callee, fx.Ref) else callee.dotted


def is_host_call(expr: fx.Expr) -> bool:
    """A call of a host path or an imported helper (faked), not of a
    value's method or a torch function (run for real)."""
    return isinstance(expr, fx.Call) and isinstance(expr.callee, (fx.HostPath, fx.Ref))


def output_call(step_expr: fx.Expr) -> tuple[fx.Call | None, bool]:
    """The outermost host call of a forward's last step, and whether it is
    the whole step (its result is then the forward's output)."""
    call = next((e for e in fx.walk(step_expr) if is_host_call(e)), None)
    return call, call is step_expr


def fake_of(world: SpecWorld, call: fx.Call) -> FakeCall:
    return world.calls[_callee_name(call.callee)]


class FakeBuilder(FakeModule):
    """A metadata builder (a submodule): the buffers it provides, for the grids it is given
    (one sequence per item in ``cu_seqlens``-like offsets)."""

    def __init__(self, world: SpecWorld, builder: MetadataBuilder) -> None:
        self.world = world
        self.builder = builder
        self.calls: list[tuple[tuple, dict]] = []

    def items(self, args: tuple, kwargs: dict) -> list[dict[str, int]]:
        """The items of the grids and counts among the arguments."""
        spec = self.world.spec
        given: dict[str, Any] = {}
        for expr, value in zip(self.builder.call.args, args, strict=False):
            if isinstance(expr, fx.Ref) and spec.item_input(expr.name) is not None:
                given[expr.name] = value
        for name, expr in self.builder.call.kwargs:
            if isinstance(expr, fx.Ref) and spec.item_input(expr.name) is not None:
                given[expr.name] = kwargs[name]
        items: list[dict[str, int]] = []
        for key, rows in given.items():
            inp = spec.item_input(key)
            for i, row in enumerate(rows):
                if i == len(items):
                    items.append({})
                values = [row] if inp.is_count else row
                items[i].update(zip(inp.dims, [int(v) for v in values], strict=True))
        return items

    def flat_rows(self, args: tuple, kwargs: dict) -> int | None:
        """The rows of the first flat input among the arguments (a builder
        of a unit capture reads the capture tensors, not grids)."""
        spec = self.world.spec
        pairs = list(zip(self.builder.call.args, args, strict=False))
        pairs += [(expr, kwargs[name]) for name, expr in self.builder.call.kwargs]
        for expr, value in pairs:
            if isinstance(expr, fx.Ref) and spec.flat(expr.name) is not None:
                return int(value.shape[0])
        return None

    def axis_values(self, args: tuple, kwargs: dict) -> dict[str, int]:
        """The capture axes' dims among the arguments (their key's parts)."""
        dims = {d for a in self.world.spec.capture_axes for d in a.dims}
        out = {}
        for expr, value in zip(self.builder.call.args, args, strict=False):
            if isinstance(expr, fx.Ref) and expr.name in dims:
                out[expr.name] = int(value)
        for name, expr in self.builder.call.kwargs:
            if isinstance(expr, fx.Ref) and expr.name in dims:
                out[expr.name] = int(kwargs[name])
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        items = self.items(args, kwargs)
        axes = self.axis_values(args, kwargs)
        device = kwargs.get("device", torch.device("cpu"))
        dtype = kwargs.get("dtype", torch.float32)
        out = {}
        for key in self.builder.provides:
            buf = next(b for b in self.world.spec.buffers if b.key == key)
            # An optional buffer is None, as under the backends that need none.
            out[key] = (
                None
                if buf.optional
                else self.tensor(
                    buf,
                    items,
                    kwargs,
                    device,
                    dtype,
                    axes,
                    self.flat_rows(args, kwargs),
                )
            )
        if self.builder.returns_tensor:
            return out[self.builder.provides[0]]
        return out

    def tensor(
        self, buf: Buffer, items, kwargs, device, dtype, axes=None, flat_rows=None
    ) -> torch.Tensor:
        w = self.world
        axes = axes or {}
        rows = [w.value(w.spec.items.input_size, **it) for it in items]
        if buf.pad is not None:
            offsets = [0]
            for r in rows:
                offsets.append(offsets[-1] + r)
            return torch.tensor(offsets, dtype=torch.int32, device=device)
        if buf.host_scalar:
            bound = kwargs.get(buf.set_by) if buf.set_by else None
            return torch.tensor(
                bound if bound is not None else max(rows, default=0), dtype=torch.int32
            )
        total = sum(w.graph_rows(it) for it in items) if buf.allocate else sum(rows)
        if not items and flat_rows is not None:
            total = flat_rows
        if buf.shape is None:
            shape = [total]
        else:
            shape = []
            for i, e in enumerate(buf.shape):
                shape.append(total if i == buf.rows_dim else w.value(e, **axes))
        tdtype = (
            dtype
            if buf.dtype is None or buf.dtype.value == "dtype"
            else getattr(torch, buf.dtype.value)
        )
        numel = math.prod(shape)
        values = torch.arange(1, numel + 1, device=device).reshape(shape)
        return values.to(tdtype)


def _import_standalone(spec_path: Path) -> ModuleType:
    """Render the spec's standalone module into a temporary file and import a
    private copy of it."""
    rendered = render_spec(spec_path, ("standalone",), Path("generated"))[0]
    folder = Path(tempfile.mkdtemp(prefix="genmixin_sound_"))
    path = folder / f"{spec_path.stem}.py"
    path.write_text(rendered.source, encoding="utf-8")
    name = f"_genmixin_sound_{spec_path.parent.name}_{spec_path.stem}"
    sys.modules.pop(name, None)
    return load_module_copy(path, name)


def is_capture_tensor(buf: Buffer) -> bool:
    return isinstance(buf.source, CaptureTensor)


__all__ = [
    "FALLBACK_DTYPE",
    "OUT_WIDTH",
    "FakeBuilder",
    "FakeCall",
    "PadRule",
    "SpecWorld",
    "is_capture_tensor",
]
