"""Capture axes: graphs captured per budget *and* per key of each axis.

vLLM's ``EncoderCudaGraphConfig.capture_axes`` holds one ordered key tuple
per axis; the manager captures every (budget, key combination) and replays
the graph of the keys ``select_encoder_cudagraph_items`` puts under
``ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG``. A spec names the parts of an axis'
key (``dims``: capture formulas use them), lists the keys, says which key a
sub-batch needs (the first that ``covers`` every item), and bounds what an
item can need, so that the static checks can prove that every key a batch
can select was captured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from generator.diagnostics import Location
from generator.formulas import Expr
from generator.limits import MAX_CAPTURE_AXIS_KEYS
from generator.scopes import NameKind
from generator.spec.enums import BeyondKeys
from generator.spec.names import check_name
from generator.spec.reader import Key, Keys, Reader
from generator.spec.values import (
    INVALID,
    Choice,
    Formula,
    Identifier,
    ListOf,
    OneOf,
    Text,
)


@dataclass(frozen=True)
class CaptureAxis:
    """One capture axis: its key parts, keys, per-item need and bound."""

    location: Location
    dims: tuple[str, ...]
    keys: tuple[tuple[Expr, ...], ...]  # one formula per dim
    covers: tuple[Expr, ...]  # per item, one per dim
    #: The largest ``covers`` values, one per dim (``()`` with
    #: ``beyond_keys: eager``, where no key need cover every item).
    bound: tuple[Expr, ...]
    why: str | None
    beyond_keys: BeyondKeys = BeyondKeys.REFUSE

    KEYS: ClassVar = Keys(
        Key(
            "dims",
            ListOf(Identifier(), min_items=1),
            "The names of the parts of this axis' key, which the capture "
            "formulas (dummy dims, tensor and buffer shapes, builder calls) use. "
            "One dim: the key is a number; several: a tuple of numbers.",
            required=True,
            example="[th, tw]",
        ),
        Key(
            "keys",
            ListOf(
                OneOf(Formula("constants"), ListOf(Formula("constants"), min_items=1)),
                min_items=1,
                max_items=MAX_CAPTURE_AXIS_KEYS,
            ),
            "The axis' keys in order (`EncoderCudaGraphConfig.capture_axes`): one "
            "graph per budget and key. A key is a formula over the constants, or "
            "a list of one per dim; keys equal for some constants are captured "
            "once.",
            required=True,
            example="[[32, 32], [32, 64], [64, 32], [side, side]]",
        ),
        Key(
            "covers",
            ListOf(Formula("items"), min_items=1),
            "What an item needs of each dim's key part, over the item's dims: a "
            "sub-batch replays the first key whose every part is at least the "
            "largest need of its items (an empty sub-batch: the first key).",
            required=True,
            example="[h, w]",
        ),
        Key(
            "bound",
            ListOf(Formula("constants"), min_items=1),
            "The largest need any item can have, per dim (what the processor "
            "allows, whatever a request asks for). Some key must cover it: "
            "otherwise a batch could select a key that was never captured. "
            "With `items.eager_when`, the largest need of the items (units) a "
            "graph takes: those that run eagerly need no key (their batch "
            "selects the first).",
            default_doc="required unless `beyond_keys: eager`",
            example="[side, side]",
        ),
        Key(
            "beyond_keys",
            Choice(BeyondKeys),
            "Items whose need no key covers: `refuse` (none exists: `bound` "
            "says so, and some key covers it) or `eager`: such an item runs "
            "eagerly, its budget tokens above every budget (as with "
            "`items.eager_when`), so no graph is looked up for it (Gemma 4: a "
            "request's `max_soft_tokens` above the model's, finding 7). No "
            "`bound` then; not with `items.per_unit`.",
            default=BeyondKeys.REFUSE,
            example="eager",
        ),
        Key("why", Text(), "Comment on the axis (its keys in the config)."),
    )
    DOC_TITLE = "capture_axes"

    @property
    def scalar(self) -> bool:
        """A key of one part is a number, not a tuple."""
        return len(self.dims) == 1

    @classmethod
    def from_yaml(cls, r: Reader, index: int = 0, **_: Any) -> CaptureAxis | None:
        dims = _dims(r)
        keys = r.take("keys")
        covers = r.take("covers")
        bound = r.take("bound")
        why = r.take("why")
        beyond = r.take("beyond_keys")
        if beyond is BeyondKeys.EAGER and r.has("bound"):
            r.error(
                "bound",
                "with beyond_keys: eager an item no key covers runs eagerly: "
                "no bound is needed (leave it out)",
            )
            return None
        if beyond is BeyondKeys.REFUSE and not r.has("bound"):
            if r.ok("beyond_keys"):
                r.ctx.error(r.node, r.path("bound"), "required key is missing")
            return None
        if beyond is BeyondKeys.EAGER:
            bound = []
        if dims is None or None in (keys, covers, bound):
            return None
        key_parts = _key_parts(r, keys, len(dims))
        ok = _same_length(r, "covers", covers, dims)
        if bound:
            ok &= _same_length(r, "bound", bound, dims)
        if key_parts is None or not ok or INVALID in (*covers, *bound):
            return None
        return cls(
            r.node.location,
            dims,
            key_parts,
            tuple(covers),
            tuple(bound),
            why,
            beyond,
        )

    @property
    def eager_beyond(self) -> bool:
        """Items whose need no key covers run eagerly."""
        return self.beyond_keys is BeyondKeys.EAGER


def _dims(r: Reader) -> tuple[str, ...] | None:
    dims = r.take("dims")
    node = r.raw("dims")
    if dims is None or INVALID in dims:
        return None
    ctx = r.ctx
    for name, dim_node in zip(dims, node.value, strict=True):
        field = r.path("dims")
        if not check_name(ctx, dim_node.location, field, name, "capture axis dim"):
            continue
        if ctx.kind_of(name) is not None:
            ctx.error(dim_node, field, f"{name!r} is already declared elsewhere")
            continue
        ctx.declare(NameKind.AXIS_DIM, name, dim_node.location, field)
    if len(set(dims)) != len(dims):
        r.error("dims", "the dims of an axis must differ")
        return None
    return tuple(dims)


def _key_parts(r: Reader, keys: list, arity: int):
    """Each key as one formula per dim (a number for a one-dim axis)."""
    out = []
    for i, (key, node) in enumerate(zip(keys, r.raw("keys").value, strict=True)):
        parts = key if isinstance(key, list) else [key]
        if INVALID in parts:
            return None
        if len(parts) != arity:
            r.ctx.error(
                node,
                f"{r.path('keys')}[{i}]",
                f"has {len(parts)} part(s) but the axis has {arity} dim(s)",
            )
            return None
        out.append(tuple(parts))
    return tuple(out)


def _same_length(r: Reader, name: str, values: list, dims: tuple[str, ...]) -> bool:
    if len(values) == len(dims):
        return True
    r.error(name, f"needs one formula per dim ({', '.join(dims)}), got {len(values)}")
    return False
