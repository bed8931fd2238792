"""The coverage check of a capture of padded inputs (``kind: padded``).

A padded input's buffer is ``(items, width, ...)``: one row per item, each
item's size on dim 1. The graph of a capture-axis key only ever replays
batches whose items that key covers (selection picks the first key covering
the batch's largest need; an item no key covers runs eagerly), so the buffer
of key ``K`` and budget ``B`` must hold, on dim 0, the most items such a
batch can bring (``max_batch_size`` of them, or as many of the fewest budget
tokens as ``B`` holds) and, on dim 1, the largest size of an item ``K``
covers within ``B``. Without axes every item within the budget counts.

The item formulas are taken to grow with the size dim (more patches, more
tokens and a larger need), as an image's do: the largest size a key takes is
found by bisection over multiples of the formulas' divisors, the fewest
budget tokens at the smallest size. Other dims are sampled.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping

from generator.formulas import EvaluationError, evaluate, names_in

#: The largest size searched (a million patches per item is far past any
#: processor's).
LARGEST_SIZE = 1 << 20
#: Values of a dim that is not a padded size (times the dims' divisor).
OTHER_DIM_SAMPLES = (1, 2, 3, 8, 64)


def padded_tensors(ir) -> list:
    """The capture tensors of padded inputs."""
    return [t for t in ir.capture.tensors if getattr(t.flat, "is_padded", False)]


def _step(ir, env: Mapping[str, int], dim: str) -> int:
    """The divisor a padded size is a multiple of (``multiple_of``), else 1."""
    step = 1
    for item in ir.item_inputs:
        for name, divisor in item.multiple_of:
            if name == dim:
                try:
                    step = math.lcm(step, max(1, abs(evaluate(divisor, env))))
                except (EvaluationError, ArithmeticError):
                    continue
    return step


class TakenItems:
    """The items a graph of given axis dims and budget replays."""

    def __init__(self, ir, env: Mapping[str, int]) -> None:
        self.ir = ir
        self.env = dict(env)
        items = ir.items
        self.tokens = items.budget_tokens or items.output_tokens
        self.sizes = sorted({g.dims[0] for g in ir.item_inputs if g.is_padded})
        used = names_in(self.tokens) | {
            n for axis in ir.axes for c in axis.covers for n in names_in(c)
        }
        if items.eager_when is not None:
            used |= items.eager_when.names()
        dims = {d for g in ir.item_inputs for d in g.dims}
        self.others = sorted((used & dims) - set(self.sizes))

    def _taken(self, dims: Mapping[str, int], budget: int) -> int | None:
        """The item's budget tokens when a graph of this env and ``budget``
        takes it, else None."""
        scope = {**self.env, **dims}
        eager = self.ir.items.eager_when
        if eager is not None and eager.holds(scope):
            return None
        for axis in self.ir.axes:
            need = [evaluate(c, scope) for c in axis.covers]
            if any(n > scope[d] for n, d in zip(need, axis.dims, strict=True)):
                return None
        tokens = evaluate(self.tokens, scope)
        return tokens if tokens <= budget else None

    def bounds(self, budget: int) -> tuple[int, int] | None:
        """(the fewest budget tokens, the largest size) of the items taken
        within ``budget``, over the sampled other dims; None when none is."""
        fewest, largest = None, 0
        steps = {d: _step(self.ir, self.env, d) for d in self.sizes}
        for combo in itertools.product(OTHER_DIM_SAMPLES, repeat=len(self.others)):
            other = dict(zip(self.others, combo, strict=True))
            smallest = dict(steps)
            tokens = self._taken({**other, **smallest}, budget)
            if tokens is None:
                continue
            fewest = tokens if fewest is None else min(fewest, tokens)
            largest = max(largest, self._largest(other, steps, budget))
        return None if fewest is None else (fewest, largest)

    def _largest(self, other: dict, steps: dict, budget: int) -> int:
        """The largest size (all padded dims alike) an item taken can have."""
        lo, hi = 1, LARGEST_SIZE // max(steps.values())
        while lo < hi:
            mid = (lo + hi + 1) // 2
            dims = {**other, **{d: mid * s for d, s in steps.items()}}
            if self._taken(dims, budget) is not None:
                lo = mid
            else:
                hi = mid - 1
        return lo * max(steps.values())


def padded_problems(
    ir, env: Mapping[str, int], scope_of, budgets, batch_sizes, reported: set[str]
) -> Iterator[tuple[str, str]]:
    """(field, message) where a padded input's buffer is too small for a
    batch its graph takes, once per field (``reported``: the fields already
    reported). ``scope_of(budget, mbs)`` gives the capture's names (raises
    EvaluationError where a constant has no value)."""
    tensors = padded_tensors(ir)
    if not tensors:
        return
    taken = TakenItems(ir, env)
    for budget in budgets:
        try:
            bounds = taken.bounds(budget)
        except (EvaluationError, ArithmeticError):
            return
        if bounds is None:
            continue
        fewest, largest = bounds
        for mbs in (m for m in batch_sizes if m <= budget):
            items = mbs if fewest <= 0 else min(mbs, max(1, budget // fewest))
            try:
                scope = scope_of(budget, mbs)
            except (EvaluationError, ArithmeticError):
                continue
            for tensor in tensors:
                field = f"capture.tensors.{tensor.key}.shape"
                if field in reported:
                    continue
                try:
                    held = [evaluate(e, scope) for e in tensor.shape[:2]]
                except (EvaluationError, ArithmeticError):
                    continue
                problem = _problem(held, items, largest, fewest, budget, mbs, env, ir)
                if problem:
                    reported.add(field)
                    yield field, f"{tensor.key} {problem}"


def _problem(held, items, largest, fewest, budget, mbs, env, ir) -> str | None:
    where = f"budget {budget}, max_batch_size {mbs}{_keys_text(ir, env)}"
    if held[0] < items:
        return (
            f"holds {held[0]} item(s) ({where}), but a batch this graph takes "
            f"brings up to {items} (of {fewest} budget tokens each): the replay "
            "copy would not fit; a graph takes only the items its key covers, "
            "so size dim 0 by the fewest budget tokens of those"
        )
    if held[1] < largest:
        return (
            f"holds items of size {held[1]} ({where}), but an item this graph "
            f"takes has size {largest}: the replay copy would not fit; size dim "
            "1 by the widest item the key covers"
        )
    return None


def _keys_text(ir, env: Mapping[str, int]) -> str:
    dims = [d for axis in ir.axes for d in axis.dims]
    if not dims:
        return ""
    return ", key " + ", ".join(f"{d} = {env[d]}" for d in dims if d in env)
