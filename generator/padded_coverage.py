"""The coverage check of a capture of padded inputs (``kind: padded``).

A padded input's buffer is ``(items, width, ...)``: one row per item, each
item's size on dim 1 (a tensors input's: ``(items, *shape)``, each of its
dims at its place in the shape). The graph of a capture-axis key only ever replays
batches whose items that key covers (selection picks the first key covering
the batch's largest need; an item no key covers runs eagerly), so the buffer
of key ``K`` and budget ``B`` must hold, on dim 0, the most items such a
batch can bring (``max_batch_size`` of them, or as many of the fewest budget
tokens as ``B`` holds) and, on dim 1, the largest size of an item ``K``
covers within ``B``, on every size dim. Without axes every item within the
budget counts.

The item formulas are taken to grow with each size dim (more patches, more
tokens and a larger need), as an image's do: the largest value of a size dim
a key takes is found by bisection over multiples of the formulas' divisors,
the other size dims at their smallest (a long thin image is the widest), the
fewest budget tokens at the smallest sizes. Other dims are sampled.
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
        self.sizes = sorted({d for g in ir.item_inputs for d in size_dims(g)})
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

    def bounds(self, budget: int) -> tuple[int, dict[str, int]] | None:
        """(the fewest budget tokens, the largest value of each size dim) of
        the items taken within ``budget``, over the sampled other dims; None
        when none is."""
        fewest, largest = None, dict.fromkeys(self.sizes, 0)
        steps = {d: _step(self.ir, self.env, d) for d in self.sizes}
        for combo in itertools.product(OTHER_DIM_SAMPLES, repeat=len(self.others)):
            other = dict(zip(self.others, combo, strict=True))
            smallest = dict(steps)
            tokens = self._taken({**other, **smallest}, budget)
            if tokens is None:
                continue
            fewest = tokens if fewest is None else min(fewest, tokens)
            for dim in self.sizes:
                largest[dim] = max(
                    largest[dim], self._largest(other, steps, budget, dim)
                )
        return None if fewest is None else (fewest, largest)

    def _largest(self, other: dict, steps: dict, budget: int, dim: str) -> int:
        """The largest value of size dim ``dim`` an item taken can have, the
        other size dims at their smallest."""
        lo, hi = 1, LARGEST_SIZE // steps[dim]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            dims = {**other, **steps, dim: mid * steps[dim]}
            if self._taken(dims, budget) is not None:
                lo = mid
            else:
                hi = mid - 1
        return lo * steps[dim]


def size_dims(item) -> tuple[str, ...]:
    """The dims a padded or tensors input reads off its items' shapes."""
    if not item.is_padded:
        return ()
    return item.dims if item.is_tensors else item.dims[:1]


def _held_dims(item) -> tuple[tuple[str, int], ...]:
    """(dim, buffer dim) for each size dim of the input of a capture tensor."""
    if item.is_tensors:
        return tuple((d, 1 + p) for d, p in zip(item.dims, item.dim_positions))
    return ((item.dims[0], 1),)


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
                    held_items = evaluate(tensor.shape[0], scope)
                    sizes = [
                        (dim, at, evaluate(tensor.shape[at], scope), largest[dim])
                        for dim, at in _held_dims(tensor.flat)
                    ]
                except (EvaluationError, ArithmeticError):
                    continue
                where = f"budget {budget}, max_batch_size {mbs}{_keys_text(ir, env)}"
                problem = _problem(held_items, items, sizes, fewest, where)
                if problem:
                    reported.add(field)
                    yield field, f"{tensor.key} {problem}"


def _problem(held_items, items, sizes, fewest, where) -> str | None:
    """What does not fit: the items on dim 0, or a size dim (``sizes``:
    (dim, buffer dim, held, largest taken) each)."""
    if held_items < items:
        return (
            f"holds {held_items} item(s) ({where}), but a batch this graph takes "
            f"brings up to {items} (of {fewest} budget tokens each): the replay "
            "copy would not fit; a graph takes only the items its key covers, "
            "so size dim 0 by the fewest budget tokens of those"
        )
    for dim, position, held, largest in sizes:
        if held < largest:
            what = "size" if position == 1 and len(sizes) == 1 else dim
            return (
                f"holds items of {what} {held} ({where}), but an item this graph "
                f"takes has {what} {largest}: the replay copy would not fit; "
                f"size dim {position} by the widest item the key covers"
            )
    return None


def _keys_text(ir, env: Mapping[str, int]) -> str:
    dims = [d for axis in ir.axes for d in axis.dims]
    if not dims:
        return ""
    return ", key " + ", ".join(f"{d} = {env[d]}" for d in dims if d in env)
