"""The capture's own check of what the static checks prove.

The static checks (``generator/static_checks.py``) prove, at sampled budgets
and every budget of vLLM's default ladder, that the dummy batch covers its
budget, that a host scalar such as ``max_seqlen`` holds the longest
sequence the budget admits, and that a full batch's offsets fit their
slots. A user's ``encoder_cudagraph_token_budgets`` may name any other
budget, so the generated capture checks the same claims for the budget it
captures: integers on the host, from the dummy's grid values, before
anything is allocated. A check that fails raises a ``ValueError`` naming the
budget instead of a capture whose replay copy overflows or whose attention
launch truncates a sequence without a word.

The formulas are the spec's, printed by the formula printer; a claim the
static checks reach only by sampling items (``bounds: item``, a windowed
pad buffer's longest window) is left to them.
"""

from __future__ import annotations

from typing import Any

from generator import formulas as fx
from generator.emitters.method_body import Body
from generator.emitters.prose import message_literal
from generator.formulas import BinOp, Expr, Func, Num, Ref
from generator.spec.capture import ITEM_BOUND, Buffer, bounded_buffer, set_by_expr
from generator.spec.enums import Modality, PadRule
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath

MBS = Ref("max_batch_size")
BUDGET = Ref("token_budget")


def check_dims(spec: MixinSpec, path: EncoderPath) -> set[str]:
    """The dims of the dummy item the checks read (the capture binds them)."""
    if not _checked(path):
        return set()
    items = spec.items.on_path(path.output_tokens)
    exprs = [items.budget_tokens or items.output_tokens]
    if path.capture.graph_rows is None:
        exprs.append(items.graph_rows or items.output_tokens)
    dims = {d for g in spec.item_inputs for d in g.dims}
    return set().union(*(fx.names_in(e) for e in exprs)) & dims


def _checked(path: EncoderPath) -> bool:
    """A capture of a dummy batch of rows: a unit capture has no dummy items,
    and a padded input's graph holds its key's items, not the budget."""
    capture = path.capture
    if capture.of_units or not capture.tensors:
        return False
    return not any(getattr(t.flat, "is_padded", False) for t in capture.tensors)


def capture_checks(
    spec: MixinSpec, path: EncoderPath, body: Body
) -> list[dict[str, Any]]:
    """``{"held", "needed", "condition", "message"}`` for each claim the
    capture re-checks (``held < needed`` refuses the budget)."""
    if path.capture.of_units:
        return unit_checks(spec, path, body)
    if not _checked(path):
        return []
    checks = _coverage(spec, path, body)
    for buf in path.buffers:
        checks += _scalar(spec, path, body, buf)
        checks += _slots(spec, body, buf, Modality.VIDEO in spec.modalities)
    # A formula that is its bound (slots: max_batch_size + 2,
    # max_seqlen_override: rows) holds by construction: nothing to print.
    return [c for c in checks if c is not None]


def _check(
    spec: MixinSpec,
    body: Body,
    short: Expr,
    need: Expr,
    what: str,
    why: str,
    when: Expr | None = None,
) -> dict[str, Any] | None:
    """Refuse the budget when ``short < need`` (and ``when`` holds), with
    both values; None when it holds by construction."""
    if _holds_by_form(short, need):
        return None
    condition: Expr = fx.Compare("<", Ref("held"), Ref("needed"))
    if when is not None:
        condition = fx.BoolOp("and", (when, condition))
    return _claim(
        spec, body.expr(short), body.expr(need), body.expr(condition), what, why
    )


def _claim(
    spec: MixinSpec, held: str, needed: str, condition: str, what: str, why: str
) -> dict[str, Any]:
    """A claim from its printed values and condition."""
    return {
        "held": held,
        "needed": needed,
        "condition": condition,
        "message": message_literal(
            [
                (f"{spec.display_name}: at token_budget", False),
                ("token_budget", True),
                ("with max_batch_size", False),
                ("max_batch_size", True),
                (f"{what} is", False),
                ("held", True),
                ("where at least", False),
                ("needed", True),
                (f"is needed ({why})", False),
            ]
        ),
    }


def _holds_by_form(short: Expr, need: Expr) -> bool:
    """``short`` is ``need`` plus a literal of at least 0 (``rows``, or
    ``max_batch_size + 2`` for ``max_batch_size + 1``)."""

    def split(e: Expr) -> tuple[Expr, int]:
        if isinstance(e, BinOp) and e.op == "+" and isinstance(e.right, Num):
            return e.left, e.right.value
        return e, 0

    (a, x), (b, y) = split(short), split(need)
    return a == b and x >= y


def _coverage(spec: MixinSpec, path: EncoderPath, body: Body) -> list[dict | None]:
    """The dummy batch covers the budget in budget tokens and, without a
    declared ``capture.graph_rows``, in graph rows (items whose budget tokens
    read no dim all count the same: the static checks bound those)."""
    items = spec.items.on_path(path.output_tokens)
    tokens = items.budget_tokens or items.output_tokens
    if not check_dims(spec, path) & fx.names_in(tokens):
        return []
    out = [
        _check(
            spec,
            body,
            BinOp("*", MBS, tokens),
            BUDGET,
            "the dummy batch's count of budget tokens",
            "a batch that fits the budget would overflow the buffers",
        )
    ]
    rows = items.graph_rows or items.output_tokens
    if path.capture.graph_rows is None and rows != tokens:
        out.append(
            _check(
                spec,
                body,
                BinOp("*", MBS, rows),
                BUDGET,
                "the dummy batch's count of graph rows",
                "a batch that fits the budget would overflow the buffers",
            )
        )
    return out


def _scalar(
    spec: MixinSpec, path: EncoderPath, body: Body, buf: Buffer
) -> list[dict | None]:
    """A host scalar's capture value holds the longest sequence: every row
    under a trailing padding sequence (or without a pad buffer), else one
    item, the larger of a dummy item and one that takes the whole budget."""
    value = set_by_expr(buf)
    if value is None or buf.bounds == ITEM_BOUND:
        return []
    pads = [b for b in path.buffers if b.pad is not None]
    padded = bounded_buffer(path.buffers, buf)
    if padded is None and (buf.bounds is not None or len(pads) > 1):
        return []
    why = f"the longest attention sequence; a smaller {buf.key} truncates it"
    if padded is None or padded.pad is PadRule.TRAILING_SEQUENCE:
        return [_check(spec, body, value, Ref("rows"), buf.key, why)]
    if padded.window is not None:
        return []  # one window: sampled by the static checks
    one = spec.items.input_size
    need = Func("max", (one, fx.substitute(one, _whole_budget_item(path))))
    return [_check(spec, body, value, need, buf.key, why)]


def _whole_budget_item(path: EncoderPath) -> dict[str, Expr]:
    """The dummy item's dims for one item per batch (``k`` the whole
    budget), the capture's intermediates inlined."""
    names: dict[str, Expr] = {
        "k": BUDGET,
        "max_batch_size": Num(1),
        "max_frames_per_batch": Num(0),
        "frames_per_item": Num(1),
    }
    for let in path.capture.lets:
        names[let.name] = fx.substitute(let.expr, names)
    return {
        dim: fx.substitute(expr, names)
        for item, exprs in path.capture.dummy
        for dim, expr in zip(item.dims, exprs, strict=True)
    }


def _slots(spec: MixinSpec, body: Body, buf: Buffer, video: bool) -> list[dict | None]:
    """A full batch's offsets fit the pad buffer's slots, a spare one for a
    trailing padding sequence; a windowed buffer has one for every window of
    a batch within the budget: ``min(token_budget, frames +
    ceil_div(token_budget, window))`` windows, a frame per item of an image
    batch."""
    if buf.pad not in (PadRule.TRAILING_SEQUENCE, PadRule.REPEAT_LAST):
        return []
    if buf.slots is None:
        return []
    spare = 1 if buf.pad is PadRule.TRAILING_SEQUENCE else 0
    what = f"the count of {buf.key}'s slots"
    out = [
        _check(
            spec,
            body,
            buf.slots,
            BinOp("+", MBS, Num(1 + spare)),
            what,
            "an offset for every item of a full batch"
            + (" and a spare slot for the padding sequence" if spare else ""),
        )
    ]
    if buf.window is not None:
        frames = Func("max", (MBS, Ref("max_frames_per_batch"))) if video else MBS
        per_frame = Func("ceil_div", (BUDGET, buf.window))
        windows = Func("min", (BUDGET, BinOp("+", frames, per_frame)))
        out.append(
            _check(
                spec,
                body,
                buf.slots,
                BinOp("+", windows, Num(1 + spare)),
                what,
                "an offset for every window of a batch within the budget",
                when=fx.Compare(">", buf.window, Num(0)),
            )
        )
    return out


def unit_checks(spec: MixinSpec, path: EncoderPath, body: Body) -> list[dict[str, Any]]:
    """A unit capture's claims that follow from its dummy units: they cover
    the budget in budget tokens, and each host scalar holds the longest dummy
    unit (one sequence). The rest (slots for a batch of the smallest units,
    rows of units no dummy has) rests on sampled units: the static checks'."""
    capture = path.capture
    if not capture.unit_dummy or not spec.items.per_unit:
        return []
    items = spec.items.on_path(path.output_tokens)
    tokens = items.budget_tokens or items.output_tokens
    checks = [
        _claim(
            spec,
            _over_units(path, body, tokens, "sum"),
            "token_budget",
            "held < needed",
            "the dummy units' count of budget tokens",
            "a batch that fits the budget would overflow the buffers",
        )
    ]
    for buf in path.buffers:
        value = set_by_expr(buf)
        if value is not None:
            checks.append(
                _claim(
                    spec,
                    body.expr(value),
                    _over_units(path, body, spec.items.input_size, "max"),
                    "held < needed",
                    buf.key,
                    f"the longest dummy unit; a smaller {buf.key} truncates it",
                )
            )
    return checks


def _over_units(path: EncoderPath, body: Body, expr: Expr, how: str) -> str:
    """``expr`` summed (``sum``) or maximised (``max``) over the dummy units,
    their dims bound from each unit's grid rows (``_`` where unread)."""
    dummy = path.capture.unit_dummy
    keys = [item.key for item, _ in dummy]
    used = fx.names_in(expr)
    if not used & {d for item, _ in dummy for d in item.dims}:
        value = body.expr(expr)  # every unit alike
        return f"len({keys[0]}) * {value}" if how == "sum" else value
    rows = [
        "("
        + ", ".join(d if d in used else "_" for d in item.dims)
        + ("," if len(item.dims) == 1 else "")
        + ")"
        for item, _ in dummy
    ]
    targets = rows[0][1:-1] if len(rows) == 1 else ", ".join(rows)
    source = keys[0] if len(keys) == 1 else "zip(" + ", ".join(keys) + ")"
    return f"{how}({body.expr(expr)} for {targets} in {source})"
