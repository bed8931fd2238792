"""Corrupted ``mm_kwargs``, derived from a spec: the inconsistent inputs that
a generated mixin must refuse with a ``ValueError`` naming the input and the
mismatch (issue #16 item 6), rather than run them to wrong rows.

This is an importable helper, not a test module. :func:`corruptions` turns
one valid batch of at least two items into a table of :class:`Corruption`
cases: every flat input one row short and emptied, every grid and count
input with one row more than there are items, as floats (tensor and list),
of the wrong width, with a zero or negative dim, every derived grid
(``inputs.<key>.equals``) off by one against its sources, and the span types
of a span-assembly spec with an unknown value or a content position moved
from one item's span to the next; and (issue #28 item 6) every grid and
count on the meta device, an item of no units where that leaves it no
output tokens, a padded input as a tuple, span types complex or as a list,
and the inputs of two modalities in one batch. The spec tests
(``tests/codegen/test_gen_input_checks.py``) call the protocol methods
directly; the equivalence tests run the cases through the manager on the
graph and the eager path.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from generator.emitters.input_checks import least_units
from generator.formulas import evaluate
from generator.spec import FlatInput, ItemInput, MixinSpec
from generator.spec.enums import Dtype

#: A value no span-type constant takes in any spec of this project.
UNKNOWN_SPAN_TYPE = 1_000_003


@dataclass(frozen=True)
class Corruption:
    """One corrupted batch and the ``ValueError`` message it must raise."""

    name: str
    mm_kwargs: dict[str, Any]
    message: str  # a regular expression, searched in the message
    #: Selection refuses it too: a grid or count it reads. The rows, derived
    #: grids and span types are checked by item specs only, which the manager
    #: calls first on every execute.
    in_selection: bool = True

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.message)


def _key(key: str) -> str:
    return re.escape(f"mm_kwargs[{key!r}]")


def _rows(value: Any) -> list[list[Any]] | list[Any]:
    return value.tolist() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def _like(value: Any, rows: list[Any]) -> Any:
    """``rows`` in the form ``value`` had (an int64 tensor or a list)."""
    if not isinstance(value, torch.Tensor):
        return rows
    return torch.tensor(rows, dtype=value.dtype).reshape(len(rows), *value.shape[1:])


def _with(mm_kwargs: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    return {**mm_kwargs, key: value}


def _flat_cases(spec: MixinSpec, mm_kwargs: dict[str, Any], flat: FlatInput):
    value = mm_kwargs[flat.key]
    last = value[-1] if isinstance(value, list) else value
    if not isinstance(last, torch.Tensor) or last.shape[0] == 0:
        return
    short = last[:-1]
    yield Corruption(
        f"{flat.key}:one-row-short",
        _with(
            mm_kwargs,
            flat.key,
            [*value[:-1], short] if isinstance(value, list) else short,
        ),
        rf"{_key(flat.key)} has \d+ rows, but its \d+ item\(s\) need \d+",
        in_selection=False,
    )
    empty = last[:0]
    yield Corruption(
        f"{flat.key}:empty",
        _with(mm_kwargs, flat.key, [empty] if isinstance(value, list) else empty),
        rf"{_key(flat.key)} has 0 rows, but its \d+ item\(s\) need [1-9]",
        in_selection=False,
    )
    yield from _unit_width_cases(spec, mm_kwargs, flat)
    # A capture that declares the input bool (Idefics3's mask) takes bool rows.
    takes_bool = any(
        t.key == flat.key and t.dtype == Dtype.BOOL
        for path in spec.paths
        for t in path.capture.tensors
    )
    for dtype in (torch.complex64,) if takes_bool else (torch.complex64, torch.bool):
        yield Corruption(
            f"{flat.key}:{dtype}-values",
            _with(mm_kwargs, flat.key, _as_dtype(value, dtype)),
            rf"{_key(flat.key)} holds {re.escape(str(dtype))} values; it takes real",
            in_selection=False,
        )


def _as_dtype(value: Any, dtype: torch.dtype) -> Any:
    """``value`` (a tensor or a list of them) with every tensor in ``dtype``."""
    if isinstance(value, list):
        return [part.to(dtype) for part in value]
    return value.to(dtype)


def _unit_width_cases(spec: MixinSpec, mm_kwargs: dict[str, Any], flat: FlatInput):
    """A flat input of one padded row per unit (``pads_units``, LFM2-VL's tiles): a unit grid
    scaled by 2**40 keeps the row count and every multiple, but its units'
    sizes pass the padded width (and int64)."""
    grids = [i for i in spec.item_inputs if i.unit_of == flat.unit_of]
    if not flat.pads_units:
        return
    for grid in grids:
        rows = [[v * 2**40 for v in row] for row in _rows(mm_kwargs[grid.key])]
        yield Corruption(
            f"{grid.key}:units-past-{flat.key}-width",
            _with(mm_kwargs, grid.key, _like(mm_kwargs[grid.key], rows)),
            rf"{_key(flat.key)} has rows of shape .*, but a unit of its grid has "
            r"\d+ patches",
            in_selection=False,
        )


def _flat_grid(value: Any) -> Any:
    """A grid given per item (a list of ``(units, width)`` tensors, or them
    stacked, as MiniCPM-V's ``tgt_sizes``) as the flat grid of every unit's
    rows, a form the mixins take too; any other value as it is."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, torch.Tensor) for v in value)
    ):
        return torch.cat(value)
    if isinstance(value, torch.Tensor) and value.ndim == 3:
        return value.reshape(-1, value.shape[-1])
    return value


def _item_cases(spec: MixinSpec, mm_kwargs: dict[str, Any], item: ItemInput):
    key = item.key
    value = _flat_grid(mm_kwargs[key])
    rows = _rows(value)
    # Unit grids hold a row per unit; the items are counted by the others.
    counted = [i for i in spec.item_inputs if i.unit_of is None]
    units_of = {i.unit_of: i for i in spec.item_inputs if i.unit_of is not None}
    if item.unit_of is not None or key in units_of:
        grid = item if item.unit_of is not None else units_of[key]
        more = (
            rf"{_key(grid.key)} has \d+ unit rows, but "
            rf"{_key(grid.unit_of)} gives \d+ units"
        )
    elif len(counted) > 1:
        more = "the inputs disagree on the number of items"
    else:
        more = r"has \d+ rows, but its \d+ item\(s\) need"
    yield Corruption(
        f"{key}:one-row-more-than-items",
        _with(mm_kwargs, key, _like(value, [*rows, copy.deepcopy(rows[-1])])),
        more,
        in_selection=more != r"has \d+ rows, but its \d+ item\(s\) need",
    )
    yield Corruption(
        f"{key}:float-tensor",
        _with(mm_kwargs, key, torch.tensor(rows, dtype=torch.float32)),
        rf"{_key(key)} holds torch.float32 values, not integers",
    )
    floats = copy.deepcopy(rows)
    if item.is_count:
        floats[0] = floats[0] + 0.5
        what = "a count is an int"
    else:
        floats[0][0] = floats[0][0] + 0.5
        what = "a grid row is"
    yield Corruption(
        f"{key}:float-in-list",
        _with(mm_kwargs, key, floats),
        rf"{_key(key)}\[0\] is .*; {what}",
    )
    yield Corruption(
        f"{key}:on-meta",  # RuntimeError from the check itself before
        _with(mm_kwargs, key, torch.tensor(rows).to("meta")),
        rf"{_key(key)} is on the meta device: it has a shape but no values",
    )
    if item.is_count and least_units(spec, item):
        # An item of no units (InternVL's count 0): KeyError in postprocess
        # before.
        none = copy.deepcopy(rows)
        none[0] = 0
        yield Corruption(
            f"{key}:item-without-units",
            _with(mm_kwargs, key, _like(value, none)),
            rf"{_key(key)}\[0\] gives the item no units",
        )
    if item.is_count:
        negative = copy.deepcopy(rows)
        negative[0] = -1
        yield Corruption(
            f"{key}:negative",
            _with(mm_kwargs, key, _like(value, negative)),
            rf"{_key(key)}\[0\] is -1; a count is not negative",
        )
        return
    narrow = torch.tensor([row[:-1] for row in rows], dtype=torch.int64)
    yield Corruption(
        f"{key}:wrong-width",
        _with(mm_kwargs, key, narrow),
        rf"{_key(key)} has shape \(\d+, {len(item.dims) - 1}\); a grid has one row of",
    )
    zero = copy.deepcopy(rows)
    zero[0][0] = 0
    yield Corruption(
        f"{key}:zero-dim",
        _with(mm_kwargs, key, _like(value, zero)),
        rf"{_key(key)}\[0\] is \[0.*\]; every dim is at least 1",
    )
    env = {c.name: c.default for c in spec.constants if c.default is not None}
    for dim, divisor in item.multiple_of:
        if evaluate(divisor, env) < 2:
            continue  # every dim is a multiple of 1
        odd = copy.deepcopy(rows)
        odd[0][item.dims.index(dim)] += 1
        yield Corruption(
            f"{key}:{dim}-not-a-multiple",
            _with(mm_kwargs, key, _like(value, odd)),
            rf"{_key(key)}\[0\] is \[.*\]; {dim} must be a multiple of",
            in_selection=False,
        )
    if item.equals:
        off = copy.deepcopy(rows)
        off[0][item.dims.index(item.equals[0][0])] += 1
        yield Corruption(
            f"{key}:derived-off-by-one",
            _with(mm_kwargs, key, _like(value, off)),
            rf"{_key(key)}\[0\] is \[.*\], which does not match mm_kwargs\[",
            in_selection=False,
        )


def _parts(value: Any) -> list[torch.Tensor]:
    """A padded input's items as a list of ``(size, ...)`` tensors."""
    return list(value) if isinstance(value, torch.Tensor) else list(value)


def _padded_cases(spec: MixinSpec, mm_kwargs: dict[str, Any], item: ItemInput):
    """A padded input of the wrong rank, an item of the wrong row shape, one
    item more than the others have, an item whose size differs from its
    twin's (padded inputs of one dim) and, for ``multiple_of``, an item one
    row past a multiple (every padded input of the dim alike)."""
    key = item.key
    parts = _parts(mm_kwargs[key])
    yield Corruption(
        f"{key}:one-dim-tensor",
        _with(mm_kwargs, key, torch.zeros(3)),
        rf"{_key(key)} has shape \(3,\); a padded input is a tensor of shape",
    )
    wide = [
        torch.zeros(parts[0].shape[0], *parts[0].shape[1:-1], parts[0].shape[-1] + 1)
    ]
    yield Corruption(
        f"{key}:wrong-row-shape",
        _with(mm_kwargs, key, wide + parts[1:]),
        # Item 0 against the captured row, or, where no buffer fixes the row,
        # item 1 against item 0.
        rf"{_key(key)}(\[0\] has rows of shape \(.*\), but the captured buffers"
        rf"|\[1\] has rows of shape \(.*\), but {_key(key)}\[0\] has rows)",
    )
    for dtype in (torch.complex64, torch.bool):
        yield Corruption(
            f"{key}:{dtype}-values",
            _with(mm_kwargs, key, _as_dtype(mm_kwargs[key], dtype)),
            rf"{_key(key)} holds {re.escape(str(dtype))} values; it takes real",
        )
    yield Corruption(
        f"{key}:tuple",  # AttributeError in selection before
        _with(mm_kwargs, key, tuple(parts)),
        rf"{_key(key)} is a tuple; a padded input is a tensor",
    )
    counted = [i for i in spec.item_inputs if i.unit_of is None]
    if len(counted) > 1:
        yield Corruption(
            f"{key}:one-item-more",
            _with(mm_kwargs, key, [*parts, parts[-1]]),
            "the inputs disagree on the number of items",
        )
    twins = [i for i in spec.item_inputs if i.is_padded and i.dims == item.dims]
    if len(twins) > 1:
        yield Corruption(
            f"{key}:size-differs-from-its-twin",
            _with(mm_kwargs, key, [parts[0][:-1], *parts[1:]]),
            r"padded inputs of one dim have the same size per item",
        )
    env = {c.name: c.default for c in spec.constants if c.default is not None}
    for dim, divisor in item.multiple_of:
        if evaluate(divisor, env) < 2:
            continue  # every size is a multiple of 1
        odd = dict(mm_kwargs)
        for twin in twins:
            first, *rest = _parts(mm_kwargs[twin.key])
            odd[twin.key] = [torch.cat([first, first[:1]]), *rest]
        yield Corruption(
            f"{key}:{dim}-not-a-multiple",
            odd,
            rf"{_key(key)}\[0\] is \d+; {dim} must be a multiple of",
            in_selection=False,
        )


def _tensors_cases(spec: MixinSpec, mm_kwargs: dict[str, Any], item: ItemInput):
    """A tensors input of the wrong rank, as a tuple, with an item that is
    no tensor, of another rank, of one more channel (a constant entry of its
    shape), with an empty dim, one item more than the other inputs have and,
    for ``multiple_of``, an item one past a multiple."""
    key = item.key
    parts = _parts(mm_kwargs[key])
    first = parts[0]
    shaped = rf"{_key(key)}\[0\] has shape \(.*\), but each item of it has shape"
    fixed = next(
        i
        for i, e in enumerate(item.item_shape)
        if getattr(e, "name", None) not in item.dims
    )
    more = list(first.shape)
    more[fixed] += 1
    empty = list(first.shape)
    empty[item.dim_positions[0]] = 0
    table = [
        ("one-dim-tensor", torch.zeros(3), rf"{_key(key)} has shape \(3,\); a tensors"),
        ("tuple", tuple(parts), rf"{_key(key)} is a tuple; a tensors input is a list"),
        (
            "item-not-a-tensor",
            [first.tolist(), *parts[1:]],
            rf"{_key(key)}\[0\] is a list; each item of a tensors input is a tensor",
        ),
        ("item-of-another-rank", [first[0], *parts[1:]], shaped),
        ("item-of-another-size", [torch.zeros(more), *parts[1:]], shaped),
        ("item-empty", [torch.zeros(empty), *parts[1:]], shaped),
    ]
    for name, value, message in table:
        yield Corruption(f"{key}:{name}", _with(mm_kwargs, key, value), message)
    if len([i for i in spec.item_inputs if i.unit_of is None]) > 1:
        yield Corruption(
            f"{key}:one-item-more",
            _with(mm_kwargs, key, [*parts, parts[-1]]),
            "the inputs disagree on the number of items",
        )
    env = {c.name: c.default for c in spec.constants if c.default is not None}
    for dim, divisor in item.multiple_of:
        if evaluate(divisor, env) < 2:
            continue  # every size is a multiple of 1
        odd = list(first.shape)
        odd[item.dim_positions[item.dims.index(dim)]] += 1
        yield Corruption(
            f"{key}:{dim}-not-a-multiple",
            _with(mm_kwargs, key, [torch.zeros(odd), *parts[1:]]),
            rf"{_key(key)}\[0\] is \(.*\); {dim} must be a multiple of",
            in_selection=False,
        )


def _list_cases(spec: MixinSpec, mm_kwargs: dict[str, Any], item: ItemInput):
    """A list input: per item a list of unit tensors of ``unit_shape``."""
    key = item.key
    value = mm_kwargs[key]
    grids = [i for i in spec.item_inputs if i.unit_of == key]
    if grids:
        more = [*value]
        more[0] = [*value[0], value[0][-1].clone()]
        yield Corruption(
            f"{key}:one-unit-more",
            _with(mm_kwargs, key, more),
            rf"{_key(grids[0].key)} has \d+ unit rows, but {_key(key)} gives \d+ units",
        )
    if least_units(spec, item):
        # MiniCPM-V's empty slice list: KeyError in postprocess before.
        yield Corruption(
            f"{key}:item-without-units",
            _with(mm_kwargs, key, [[], *value[1:]]),
            rf"{_key(key)}\[0\] gives the item no units",
        )
    yield Corruption(
        f"{key}:not-a-list",
        _with(mm_kwargs, key, value[0][0]),
        rf"{_key(key)} is a Tensor; a list input is a list per item of unit tensors",
    )
    not_list = [value[0][0], *value[1:]]
    yield Corruption(
        f"{key}:item-not-a-list",
        _with(mm_kwargs, key, not_list),
        rf"{_key(key)}\[0\] is a Tensor; an item of a list input is a list",
    )
    unit = value[0][0]
    wider = torch.cat([unit, unit[..., :1]], dim=-1)
    reshaped = [[wider, *value[0][1:]], *value[1:]]
    yield Corruption(
        f"{key}:wrong-unit-shape",
        _with(mm_kwargs, key, reshaped),
        rf"{_key(key)}\[0\]\[0\] has shape .*, but its grid row gives it",
        in_selection=False,
    )


def _span_cases(
    spec: MixinSpec,
    module: ModuleType,
    mm_kwargs: dict[str, Any],
    lengths: list[int],
):
    span = spec.span_assembly
    key = span.types.key
    types = mm_kwargs[key]
    unknown = types.clone()
    unknown[0] = UNKNOWN_SPAN_TYPE
    yield Corruption(
        f"{key}:unknown-span-type",
        _with(mm_kwargs, key, unknown),
        rf"{_key(key)}\[0\] is {UNKNOWN_SPAN_TYPE}, not a span type",
        in_selection=False,
    )
    yield Corruption(
        f"{key}:complex",  # reached torch.isin before
        _with(mm_kwargs, key, types.to(torch.complex64)),
        # The rows check, which every flat input has, refuses it first.
        rf"{_key(key)} (is a torch.complex64 tensor of shape|holds torch.complex64)",
        in_selection=False,
    )
    yield Corruption(
        f"{key}:a-list",
        _with(mm_kwargs, key, types.tolist()),
        rf"{_key(key)} is a list; ",  # a flat input too (DeepSeek-V4.1)
        in_selection=False,
    )
    content = getattr(module, span.content.name)
    first, second = range(lengths[0]), range(lengths[0], lengths[0] + lengths[1])
    other = next((i for i in first if int(types[i]) != content), None)
    moved = next((i for i in second if int(types[i]) == content), None)
    if other is None or moved is None:
        return
    swapped = types.clone()
    swapped[other], swapped[moved] = types[moved], types[other]
    yield Corruption(
        f"{key}:content-moved-to-previous-item",
        _with(mm_kwargs, key, swapped),
        rf"item 0's span in {_key(key)} has \d+ {span.content.name} positions, "
        r"but the graph emits \d+ rows",
        in_selection=False,
    )


def _two_modalities(spec: MixinSpec, mm_kwargs: dict[str, Any]) -> Corruption:
    """The image batch with its inputs under the video keys too (Qwen2-VL:
    four items sent, two outputs returned, no error, before)."""
    videos = {i.video_key: mm_kwargs[i.key] for i in spec.inputs if i.video_key}
    return Corruption(
        "image-and-video-keys",
        {**mm_kwargs, **videos},
        r"the batch holds image inputs \(.*\) and video inputs \(.*\); a batch "
        "has one modality",
    )


def corruptions(
    spec: MixinSpec,
    module: ModuleType,
    mm_kwargs: dict[str, Any],
    output_tokens: Callable[[int], int],
) -> list[Corruption]:
    """The corrupted variants of the valid image batch ``mm_kwargs`` (at
    least two items; ``output_tokens(i)`` gives item ``i``'s output tokens,
    for the span-type cases)."""
    cases: list[Corruption] = []
    for flat in spec.flat_inputs:
        cases += _flat_cases(spec, mm_kwargs, flat)
    for item in spec.item_inputs:
        if item.is_tensors:
            cases += _tensors_cases(spec, mm_kwargs, item)
            continue
        if item.is_padded:
            cases += _padded_cases(spec, mm_kwargs, item)
            continue
        if item.is_list:
            cases += _list_cases(spec, mm_kwargs, item)
        else:
            cases += _item_cases(spec, mm_kwargs, item)
    if spec.has_video_keys:
        cases.append(_two_modalities(spec, mm_kwargs))
    if spec.span_assembly is not None:
        lengths = [output_tokens(0), output_tokens(1)]
        cases += _span_cases(spec, module, mm_kwargs, lengths)
    return cases


def index_corruptions(num_items: int) -> list[tuple[str, list[Any], str]]:
    """Selection indices that name no item of a batch of ``num_items``:
    ``(name, indices, message)``."""
    message = rf"selection index {{}} is not an item of this batch of {num_items}"
    return [
        ("past-the-end", [0, num_items], message.format(num_items)),
        ("negative", [-1], message.format(-1)),
        ("float", [0.0], message.format(re.escape("0.0"))),
    ]
