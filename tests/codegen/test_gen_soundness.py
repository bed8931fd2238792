"""Soundness: every spec generates a mixin that does what the spec says.

For each spec of ``specs/`` and of the valid corpus (``data/valid/``), the
generated standalone module is imported and run on CPU against a host built
from the spec itself (``genmixin_spec_host``). Every expected value comes
from the spec's own formulas:

* item specs of random batches (grids as tensors and as lists);
* selection with random, repeated, reordered and empty indices: rows, order,
  and the item specs of the selection;
* capture inputs for several (budget, max_batch_size, max_frames_per_batch):
  buffer order and shapes, ``slots``, host scalars, and a dummy batch that
  covers the budget;
* replay buffers of random batches that fit a budget, copied into the
  captured buffers with the manager's own copy and the config's padding
  logics: the real rows first and zeros after them, ``cu_seqlens`` monotone
  and closed as its pad rule says;
* the eager forward: one output row block per item, in order.
"""

from __future__ import annotations

import copy
import random
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from encoder_cudagraph_runtime.attention_backends import (  # noqa: E402
    AttentionBackendEnum,
)
from encoder_cudagraph_runtime.defs import (  # noqa: E402
    ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
)
from encoder_cudagraph_runtime.config import (  # noqa: E402
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime import forward_context  # noqa: E402
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from generator import formulas as fx  # noqa: E402
from generator.resolve import load_spec  # noqa: E402
from generator.spec import FlatInput, PadRule  # noqa: E402
from generator.spec.capture import DtypeFallback  # noqa: E402
from generator.spec.enums import Dtype, Fill, InputKind  # noqa: E402
from genmixin_spec_host import (  # noqa: E402
    FALLBACK_DTYPE,
    OUT_WIDTH,
    UNITS,
    SpecWorld,
    fake_of,
    get_path,
    is_capture_tensor,
    output_call,
    set_path,
)
from genmixin_testlib import (  # noqa: E402
    most_rows_within,
    spec_paths,
    standalone_paths,
    valid_corpus_paths,
)

# The standalone module runs here: a spec with a vLLM-only import has none
# (its vllm module is checked by its oracle check, tests/parity).
SPECS = standalone_paths(spec_paths() + valid_corpus_paths())
IDS = [f"{p.parent.name}/{p.stem}" for p in SPECS]
#: (token_budget, max_batch_size, max_frames_per_batch)
CAPTURES = [(64, 1, 1), (100, 3, 3), (257, 7, 14), (1000, 8, 8), (2048, 16, 32)]
INDICES = [[], [0], [2], [1, 0], [3, 1, 2, 0], [2, 2], [0, 3, 0], [3, 2, 1, 0]]


@pytest.fixture(scope="module", params=SPECS, ids=IDS)
def world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


def expected_specs(world: SpecWorld, items) -> list[tuple[int, int, dict]]:
    out = []
    for item in items:
        v = world.item_values(item)
        out.append((v["input_size"], v["output_tokens"], world.path_rows(item)))
    return out


def got_specs(specs) -> list[tuple[int, int, dict]]:
    return [(s.input_size, s.output_tokens, s.path_output_tokens) for s in specs]


# -- config, budget range, item specs -------------------------------------------------


def test_config(world: SpecWorld) -> None:
    config = world.host().get_encoder_cudagraph_config()
    spec = world.spec
    assert config.buffer_keys == [b.key for b in spec.buffers]
    assert config.out_hidden_size == world.value(spec.out_hidden_size)
    conditional = dict(spec.modality_when)
    assert config.modalities == [
        m.value
        for m in spec.modalities
        if m not in conditional or world.value(conditional[m])
    ]
    special = {b.key for b in spec.buffers if b.pad is not None or b.rows_dim}
    padded = {b.key for b in spec.buffers if is_padded_buffer(world, b)}
    assert set(config.padding_logics) == special | padded
    for key in padded:
        # pad_value everywhere but the batch's [:N, :P] block.
        pad = world.spec.item_input(key).pad_value
        dst, src = torch.full((3, 5, 2), 7.0), torch.ones(2, 4, 2)
        config.padding_logics[key](dst, src)
        assert dst[:2, :4].eq(1).all() and (dst.sum() == 16 + pad * (30 - 16)), key
    off = world.spec.capture_off
    if off is not None:
        # The host flag turns capture off: no modality, one frame per video.
        host = world.host()
        set_path(host, off.when.parts, True)
        config = host.get_encoder_cudagraph_config()
        assert config.modalities == []
        assert config.max_frames_per_video == 1
    paths = {
        name: (c.min_token_budget, c.allow_zero_tokens)
        for name, c in config.paths.items()
    }
    assert list(paths) == [p.name for p in spec.paths]
    for p in spec.paths:
        smallest = world.value(p.min_token_budget) if p.min_token_budget else None
        assert paths[p.name] == (smallest, p.allow_zero_tokens), p.name


@pytest.mark.parametrize(("tokens", "model_len"), [(8192, 8192), (2048, 32768)])
def test_budget_range(world: SpecWorld, tokens: int, model_len: int) -> None:
    cfg = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(max_model_len=model_len),
    )
    got = world.host().get_encoder_cudagraph_budget_range(cfg)
    budget = world.spec.budget
    largest = (
        min(tokens, model_len)
        if budget.max is None
        else world.value(
            budget.max, max_num_batched_tokens=tokens, max_model_len=model_len
        )
    )
    assert got == (world.value(budget.min), largest)


# A constant with a processor override, a fallback and a floor (LFM2-VL's
# min_image_tokens): the override wins, a missing or falsy attribute falls
# back, and the value is an int of at least `at_least`.
OVERRIDES = [
    ({"min_tokens": 8}, 6, 8),
    ({"min_tokens": "12"}, 6, 12),
    ({"min_tokens": 0}, 6, 1),
    (None, 6, 6),
    ({}, None, 4),
    ({"other": 3}, 0, 4),
]


#: tensor_images (patch 2, side 4: slots of 4 x 4 tokens, a token two
#: patches wide): images as (h, w) pixels, and the slot index of each token
#: its builder gathers, image i's token (r, c) at i * 16 + r * 4 + c.
TENSOR_TOKENS = [
    ([(2, 8), (4, 4)], [0, 1, 16, 20]),
    ([(2, 8), (2, 8)], [0, 1, 16, 17]),
    ([(4, 12)], [0, 1, 2, 4, 5, 6]),
]


@pytest.mark.parametrize("lists", [False, True], ids=["stacked", "list"])
@pytest.mark.parametrize(("sizes", "token_rows"), TENSOR_TOKENS)
def test_a_tensors_input_reaches_builders_as_its_dims(sizes, token_rows, lists) -> None:
    """A builder reads a tensors input as each item's (h, w), in the order
    of ``dims``, off a list or a stacked tensor (a swap gathers other slots,
    which item specs and selection would not show: their formulas are
    symmetric in what they read)."""
    world = SpecWorld(next(p for p in SPECS if p.stem == "tensor_images"))
    items = [{"h": h, "w": w} for h, w in sizes]
    batch = world.batch(items, lists=lists)
    replay = world.host().prepare_encoder_cudagraph_replay_buffers(batch, 4, 1)
    assert replay.values["token_rows"].tolist() == token_rows


@pytest.mark.parametrize(("kwargs", "attribute", "smallest"), OVERRIDES)
def test_constant_override_fallback_floor(kwargs, attribute, smallest) -> None:
    world = SpecWorld(next(p for p in SPECS if p.stem == "unit_varlen"))
    host = world.host()
    host.multimodal_config.mm_processor_kwargs = kwargs
    host.tower.min_tokens = attribute
    cfg = VllmConfig(scheduler_config=SchedulerConfig(max_num_batched_tokens=4096))
    assert host.get_encoder_cudagraph_budget_range(cfg)[0] == smallest


def test_constant_override_that_is_no_integer() -> None:
    world = SpecWorld(next(p for p in SPECS if p.stem == "unit_varlen"))
    host = world.host()
    host.multimodal_config.mm_processor_kwargs = {"min_tokens": [4]}
    cfg = VllmConfig(scheduler_config=SchedulerConfig(max_num_batched_tokens=4096))
    with pytest.raises(TypeError, match="not 'list'"):
        host.get_encoder_cudagraph_budget_range(cfg)


#: MiniCPM-V's rule: video from versions 2.6 and 4.0 only (then the host's
#: frames per video, else 1).
VERSIONED_MODALITIES = [
    ((2, 5), ["image"], 1),
    ((2, 6), ["image", "video"], 4),
    ((4, 0), ["image", "video"], 4),
    ((4, 5), ["image"], 1),
]


@pytest.mark.parametrize(("version", "modalities", "frames"), VERSIONED_MODALITIES)
def test_modality_when_a_host_condition_holds(version, modalities, frames) -> None:
    world = SpecWorld(next(p for p in SPECS if p.stem == "modality_when"))
    host = world.host()
    host.version = version
    config = host.get_encoder_cudagraph_config()
    assert (config.modalities, config.max_frames_per_video) == (modalities, frames)


@pytest.mark.parametrize("lists", [False, True], ids=["tensors", "lists"])
@pytest.mark.parametrize("seed", range(3))
def test_item_specs(world: SpecWorld, lists: bool, seed: int) -> None:
    rng = random.Random(seed)
    items = [world.random_item(rng) for _ in range(rng.randint(1, 5))]
    batch = world.batch(items, lists=lists)
    got = world.host().get_encoder_cudagraph_item_specs(batch)
    assert got_specs(got) == expected_specs(world, items)


SINGLE_MODALITY_SPECS = [p for p in SPECS if not load_spec(p).has_video_keys]
EAGER_WHEN_SPECS = [
    p
    for p in SPECS
    if load_spec(p).items.eager_when is not None
    or any(a.eager_beyond for a in load_spec(p).capture_axes)
]
FOLDED_SPECS = [p for p in SPECS if any(f.fold_ranks for f in load_spec(p).flat_inputs)]
LIST_SPECS = [p for p in SPECS if any(i.is_list for i in load_spec(p).item_inputs)]


def _worlds(paths: list[Path]):
    """A module-scoped fixture of the worlds of ``paths`` only."""

    @pytest.fixture(
        scope="module", params=paths, ids=[f"{p.parent.name}/{p.stem}" for p in paths]
    )
    def fixture(request) -> SpecWorld:
        return SpecWorld(Path(request.param))

    return fixture


single_modality_world = _worlds(SINGLE_MODALITY_SPECS)
eager_when_world = _worlds(EAGER_WHEN_SPECS)
folded_world = _worlds(FOLDED_SPECS)
list_world = _worlds(LIST_SPECS)


def _unit_grid_layouts(world: SpecWorld, batch: dict, counts: list[int]):
    """The unit grids of a list input as a processor may give them: one row
    per unit, a list per item of ``(units, width)`` tensors, and (items of
    as many units) one ``(items, units, width)`` tensor."""
    grids = [g for g in world.spec.item_inputs if g.unit_of is not None]
    per_item = dict(batch)
    stacked = dict(batch) if len(set(counts)) == 1 else None
    for g in grids:
        rows = batch[g.key]
        per_item[g.key] = list(torch.split(rows, counts))
        if stacked is not None:
            stacked[g.key] = rows.reshape(len(counts), counts[0], -1)
    return [b for b in (batch, per_item, stacked) if b is not None]


def test_list_inputs_read_unit_grids_in_every_layout(list_world: SpecWorld) -> None:
    world = list_world
    host = world.host()
    rng = random.Random(4)
    for same in (False, True):
        items = [world.random_item(rng) for _ in range(3)]
        if same:
            # Items of as many units: a processor stacks their grids.
            n = len(items[0][UNITS])
            items = [it for it in items if len(it[UNITS]) == n] or items[:1]
        batch = world.batch(items)
        lists = [i for i in world.spec.item_inputs if i.is_list]
        counts = [len(units) for units in batch[lists[0].key]]
        layouts = _unit_grid_layouts(world, batch, counts)
        want = got_specs(host.get_encoder_cudagraph_item_specs(batch))
        assert want == expected_specs(world, items)
        for layout in layouts[1:]:
            assert got_specs(host.get_encoder_cudagraph_item_specs(layout)) == want
            chosen = host.select_encoder_cudagraph_items(layout, [len(items) - 1, 0])
            again = host.select_encoder_cudagraph_items(batch, [len(items) - 1, 0])
            for g in (g for g in world.spec.item_inputs if g.unit_of is not None):
                assert torch.equal(chosen[g.key], again[g.key])


def test_input_modality(single_modality_world: SpecWorld) -> None:
    """(Specs with video keys answer by the batch's keys:
    test_selection_by_video_keys.)"""
    world = single_modality_world
    (modality,) = world.spec.modalities
    host = world.host()
    if not hasattr(host, "get_input_modality"):
        assert modality.value == "image", "a plain mixin answers the protocol default"
        return
    batch = world.batch([world.random_item(random.Random(3))])
    assert host.get_input_modality(batch) == modality.value


def test_eager_items_exceed_every_budget(eager_when_world: SpecWorld) -> None:
    world = eager_when_world
    eager = world.spec.items.eager_when
    rng = random.Random(11)
    items = [world.random_item(rng) for _ in range(24)]
    if not any(world.runs_eagerly(it) for it in items):
        items[::12] = [world.eager_item(rng) for _ in items[::12]]
    eager_items = [it for it in items if world.runs_eagerly(it)]
    assert eager_items and len(eager_items) < len(items), "draw both kinds"
    specs = world.host().get_encoder_cudagraph_item_specs(world.batch(items))
    for item, spec in zip(items, specs, strict=True):
        tokens = spec.get_path_output_tokens("default")
        if world.runs_eagerly(item):
            # Above any budget (at most max_model_len); output_tokens real.
            assert tokens > 2**40
        else:
            assert tokens == world.item_values(item)["budget_tokens"]
        assert spec.output_tokens == world.item_values(item)["output_tokens"]


EAGER_AXES_SPECS = [p for p in EAGER_WHEN_SPECS if load_spec(p).capture_axes]
eager_axes_world = _worlds(EAGER_AXES_SPECS)


def test_an_eager_item_is_selected_without_a_covering_key(eager_axes_world):
    """The manager selects every packed batch, graph or eager: an item that
    runs eagerly gets a key rather than a refusal (the first, when
    ``items.eager_when`` sends it; its own need, when no key of a
    ``beyond_keys: eager`` axis covers it), and its batch runs eagerly
    through the manager."""
    world = eager_axes_world
    rng = random.Random(5)
    drawn = (world.random_item(rng) for _ in range(10**3))
    item = next((it for it in drawn if world.runs_eagerly(it)), None)
    item = item or world.eager_item(rng)
    host = world.host()
    got = host.select_encoder_cudagraph_items(world.batch([item]), [0])
    expected = world.selected_axis_keys([item])
    if not world.uncovered(item):
        assert expected == world.axis_key_combos()[0]
    assert got.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG) == expected
    manager = _manager(world, host)
    manager.capture()
    manager.execute(world.batch([item]))
    assert manager.graph_hits == 0


# -- selection ----------------------------------------------------------------------------


@pytest.mark.parametrize("lists", [False, True], ids=["tensors", "lists"])
@pytest.mark.parametrize("indices", INDICES, ids=[str(i) for i in INDICES])
def test_selection(world: SpecWorld, lists: bool, indices: list[int]) -> None:
    rng = random.Random(len(indices))
    items = [world.random_item(rng) for _ in range(4)]
    host = world.host()
    batch = world.batch(items, lists=lists)
    got = host.select_encoder_cudagraph_items(batch, list(indices))
    chosen = [items[i] for i in indices]
    if world.spec.capture_axes:
        # The key of each axis the sub-batch replays, for the manager to pop.
        keys = got.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG)
        assert keys == world.selected_axis_keys(chosen)
    assert list(got) == [i.key for i in world.spec.inputs]
    want = world.batch(chosen)
    for inp in world.spec.inputs:
        value = got[inp.key]
        if inp.kind is InputKind.TENSORS:
            # The chosen items in the form they came in.
            sent = batch[inp.key]
            assert isinstance(value, list) == isinstance(sent, list), inp.key
            dims = world.tensor_dims(inp, value)
            assert dims == [tuple(it[d] for d in inp.dims) for it in chosen], inp.key
            whole = world.tensor_ids(sent)
            assert world.tensor_ids(value) == [whole[i] for i in indices], inp.key
        elif inp.kind is InputKind.PADDED:
            # The chosen items in the form they came in, each its own rows.
            sent = batch[inp.key]
            assert isinstance(value, list) == isinstance(sent, list), inp.key
            sizes = world.padded_sizes(value)
            assert sizes == [it[inp.dims[0]] for it in chosen], inp.key
            whole = world.padded_ids(sent, world.padded_sizes(sent))
            assert world.padded_ids(value, sizes) == [whole[i] for i in indices]
        elif isinstance(inp, FlatInput):
            # Rows (item, row) of the chosen items, in the order chosen.
            want_rows = world.row_ids(world.batch(items)[inp.key])
            starts = [0]
            for it in items:
                starts.append(starts[-1] + world.flat_rows(inp.key, it))
            rows = [
                want_rows[r] for i in indices for r in range(starts[i], starts[i + 1])
            ]
            assert world.row_ids(value) == rows, inp.key
        elif inp.is_list:
            # The chosen items' own unit tensors, in the order chosen.
            assert [len(units) for units in value] == [
                len(batch[inp.key][i]) for i in indices
            ], inp.key
            assert all(
                u is v
                for i, units in zip(indices, value, strict=True)
                for u, v in zip(units, batch[inp.key][i], strict=True)
            ), inp.key
        else:
            assert value.dtype == torch.int64
            assert value.tolist() == want[inp.key].tolist(), inp.key
            assert value.shape == want[inp.key].shape, inp.key
    assert got_specs(host.get_encoder_cudagraph_item_specs(got)) == expected_specs(
        world, chosen
    )


def test_selection_of_folded_inputs(folded_world: SpecWorld) -> None:
    """Flat inputs with ``fold_ranks`` may arrive with a leading batch dim:
    the selection, replay and eager forward read them as the plain rows."""
    world = folded_world
    folded = [f for f in world.spec.flat_inputs if f.fold_ranks]
    rng = random.Random(5)
    items = [world.random_item(rng) for _ in range(3)]
    host = world.host()
    plain = world.batch(items)
    batch = dict(plain)
    for flat in folded:
        rank = plain[flat.key].ndim + 1
        assert rank in flat.fold_ranks, "the spec folds one more leading dim"
        batch[flat.key] = plain[flat.key].unsqueeze(0)
    got = host.select_encoder_cudagraph_items(batch, [2, 0])
    want = host.select_encoder_cudagraph_items(plain, [2, 0])
    for key in want:
        assert torch.equal(got[key], want[key]), key
    replayed = host.prepare_encoder_cudagraph_replay_buffers(batch, 4, 4).values
    for flat in folded:
        if flat.key in replayed:
            assert torch.equal(replayed[flat.key], plain[flat.key])


VIDEO_SPECS = [p for p in SPECS if load_spec(p).has_video_keys]
video_world = _worlds(VIDEO_SPECS)


def test_selection_by_video_keys(video_world: SpecWorld) -> None:
    world = video_world
    rng = random.Random(7)
    items = [world.random_item(rng) for _ in range(3)]
    host = world.host()
    batch = world.batch(items, video=True)
    got = host.select_encoder_cudagraph_items(batch, [2, 0])
    got.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, None)
    assert list(got) == [i.video_key for i in world.spec.inputs]
    assert got_specs(host.get_encoder_cudagraph_item_specs(got)) == expected_specs(
        world, [items[2], items[0]]
    )


# -- capture and replay ----------------------------------------------------------------


def capture(
    world: SpecWorld, host, budget: int, mbs: int, mfpb: int, path, axis_keys=()
):
    """The capture inputs of ``path``, called as the manager calls it."""
    values = host.prepare_encoder_cudagraph_capture_inputs(
        budget, mbs, mfpb, torch.device("cpu"), torch.float32, path.name, axis_keys
    ).values
    return values


def dummy_items(world: SpecWorld, budget: int, mbs: int, mfpb: int, path, axis_keys=()):
    """The dummy batch's items, from the spec's dummy formulas."""
    names = world.capture_names(budget, mbs, mfpb, path, axis_keys)
    item = {}
    for inp, exprs in path.capture.dummy:
        for dim, e in zip(inp.dims, exprs, strict=True):
            item[dim] = world.value(e, **names)
    return [dict(item) for _ in range(mbs)], names


def unit_names(
    world: SpecWorld, budget: int, mbs: int, mfpb: int, path, axis_keys=()
) -> dict:
    """The names of a unit capture's shapes, ``units`` from its formula."""
    names = {
        "token_budget": budget,
        "max_batch_size": mbs,
        "max_frames_per_batch": mfpb,
        **world.axis_dims(axis_keys),
    }
    return {**names, "units": world.value(path.capture.units, **names)}


def check_unit_capture(world: SpecWorld, path, values, names: dict) -> None:
    """Every buffer of a unit capture has its declared shape over ``units``."""
    for buf in path.buffers:
        exprs = buf.source.shape if is_capture_tensor(buf) else buf.shape
        if exprs is None or buf.host_scalar:
            continue
        shape = [world.value(e, **names) for e in exprs]
        assert list(values[buf.key].shape) == shape, buf.key


@pytest.mark.parametrize(("budget", "mbs", "mfpb"), CAPTURES)
def test_capture_inputs(world: SpecWorld, budget: int, mbs: int, mfpb: int) -> None:
    for path in world.spec.paths:
        for keys in world.axis_key_combos():
            check_capture_inputs(world, path, budget, mbs, mfpb, keys)


def check_capture_inputs(
    world: SpecWorld, path, budget: int, mbs: int, mfpb: int, axis_keys: tuple
):
    host = world.host()
    refused = world.refused(
        world.capture_names(budget, mbs, mfpb, path, axis_keys), path
    )
    if refused is not None:
        # A dummy beyond the tower's capacity: refused, with the spec's message.
        with pytest.raises(ValueError, match=re.escape(refused.message)):
            capture(world, host, budget, mbs, mfpb, path, axis_keys)
        return
    values = capture(world, host, budget, mbs, mfpb, path, axis_keys)
    assert list(values) == [b.key for b in path.buffers]
    held = list(host.__dict__.get("_encoder_cg_keep_alive", {}).values())
    for kept in path.capture.keep_alive:
        # The host tensor the graphs read is held by the mixin: replacing it
        # on the host (an eager call re-registering it) cannot free it.
        tensor = get_path(host, kept.parts)
        assert any(t is tensor for t in held), kept.dotted
        set_path(host, kept.parts, tensor.clone())
        assert any(
            t is tensor for t in host.__dict__["_encoder_cg_keep_alive"].values()
        )
    if path.capture.of_units:
        names = unit_names(world, budget, mbs, mfpb, path, axis_keys)
        check_unit_capture(world, path, values, names)
        return
    dummy, names = dummy_items(world, budget, mbs, mfpb, path, axis_keys)
    dims = dummy[0]
    rows = mbs * world.item_values(dims)["input_size"]
    for buf in path.buffers:
        value = values[buf.key]
        if value is None:
            assert buf.optional, f"{buf.key} is None but not optional"
            continue
        if is_padded_buffer(world, buf):
            check_padded_capture(world, buf, value, names, dims, budget, mbs)
        elif is_capture_tensor(buf):
            own = mbs * world.flat_rows(buf.key, dims)
            shape = [
                world.value(e, **names, rows=own, **dims) for e in buf.source.shape
            ]
            assert list(value.shape) == shape, buf.key
            assert value.dtype == expected_dtype(buf.source), buf.key
            assert value.shape[0] >= own, f"{buf.key}: room for the dummy's rows"
        elif buf.pad is not None:
            slots = world.value(buf.slots, **names)
            assert value.shape == (slots,), f"{buf.key}: {slots} slots"
            assert value.dtype == torch.int32
            # The dummy's offsets, closed as the pad rule closes a replay.
            offsets = [0]
            for d in dummy:
                offsets.append(offsets[-1] + world.item_values(d)["input_size"])
            close = rows if buf.pad is PadRule.TRAILING_SEQUENCE else offsets[-1]
            want = offsets + [close] * (slots - len(offsets))
            assert value.tolist() == want, buf.key
        elif buf.host_scalar:
            assert value.ndim == 0 and value.device.type == "cpu"
        elif buf.allocate or (buf.shape and world.spec.capture_axes):
            # A builder buffer's declared shape (with axes: it follows the key).
            shape = [world.value(e, **names, rows=rows) for e in buf.shape]
            assert list(value.shape) == shape, buf.key
    # With every host path of a first_of None, the manager's dtype is taken.
    for t in path.capture.tensors:
        if isinstance(t.dtype, DtypeFallback):
            unset = world.host()
            for option in t.dtype.options:
                set_path(unset, option.parts, None)
            again = capture(world, unset, budget, mbs, mfpb, path, axis_keys)
            assert again[t.key].dtype == torch.float32, t.key
    if any(is_padded_buffer(world, b) for b in path.buffers):
        return  # check_padded_capture: what a key's graph takes, not a dummy's
    # The dummy batch covers its budget, in budget tokens and in graph rows
    # (a path whose items all have the same rows: the most of max_batch_size
    # such items).
    tokens = sum(world.item_values(d, path)["budget_tokens"] for d in dummy)
    need = min(budget, fixed_batch_rows(world, path, mbs))
    assert tokens >= need
    capacity = sum(world.item_values(d, path)["graph_rows"] for d in dummy)
    rows_need = need
    if path.capture.graph_rows is not None:
        capacity = max(
            capacity, world.value(path.capture.graph_rows, **names, rows=rows)
        )
        # A declared capacity: the most graph rows a batch within the
        # budget has, which may be fewer than its budget tokens.
        rows_need = min(need, most_graph_rows(world, path, budget, mbs))
    assert capacity >= rows_need
    # Every builder saw the dummy grids it reads.
    for fake in world.builders:
        seen = fake.items(*fake.calls[-1])
        assert seen == [{d: v for d, v in it.items() if d in seen[0]} for it in dummy]


def is_padded_buffer(world: SpecWorld, buf) -> bool:
    item = world.spec.item_input(buf.key)
    return item is not None and item.is_padded and is_capture_tensor(buf)


def check_padded_capture(world, buf, value, names, dims, budget, mbs) -> None:
    """A padded input's capture buffer has its shape, holds its pad_value
    (``fill: pad``) and has room for every batch the key's graph takes: as
    many items as fit the budget at the fewest budget tokens of an item the
    key covers, each up to the widest size it covers."""
    shape = [world.value(e, **names, rows=mbs, **dims) for e in buf.source.shape]
    assert list(value.shape) == shape, buf.key
    assert value.dtype == expected_dtype(buf.source), buf.key
    if buf.source.fill is Fill.PAD:
        assert value.eq(world.spec.item_input(buf.key).pad_value).all(), buf.key
    key_dims = {d: names[d] for a in world.spec.capture_axes for d in a.dims}
    taken = [
        it for it in world.padded_probe_items() if world.takes(it, key_dims, budget)
    ]
    if not taken:
        return
    fewest = min(world.path_tokens(it) for it in taken)
    most = min(mbs, max(1, budget // fewest)) if fewest > 0 else mbs
    assert value.shape[0] >= most, f"{buf.key}: room for {most} items"
    for size, at in held_dims(world.spec.item_input(buf.key)):
        widest = max(it[size] for it in taken)
        assert value.shape[at] >= widest, f"{buf.key}: widest {size}"


def held_dims(item) -> list[tuple[str, int]]:
    """(size dim, buffer dim) of a padded or tensors input."""
    if item.is_tensors:
        return [(d, 1 + p) for d, p in zip(item.dims, item.dim_positions)]
    return [(item.dims[0], 1)]


def check_tensors_replay(world, item, items, value, src) -> None:
    """The replay stacked the items to the widest on every dim (pad_value
    past each one's shape), and the copy put item ``i`` at ``[i, :h_i,
    :w_i]`` of a buffer of pad_value (item ``i`` holds ``i + 1``)."""
    pad = item.pad_value
    shapes = [[world.value(e, **it) for e in item.item_shape] for it in items]
    if not shapes:
        # No item fits the budget: an empty stacked tensor (its item dims
        # are the batch's own, whatever they are).
        assert src.shape[0] == 0, item.key
        return
    assert list(src.shape) == [len(items), *map(max, zip(*shapes))], item.key
    mask = torch.zeros(value.shape, dtype=torch.bool)
    for i, shape in enumerate(shapes):
        block = (i, *(slice(0, n) for n in shape))
        assert value[block].eq(i + 1).all(), f"{item.key}: item {i}"
        mask[block] = True
    assert value[~mask].eq(pad).all(), f"{item.key}: stale values past the items"


def expected_dtype(tensor) -> torch.dtype:
    """The capture dtype on the spec host: float32 for the manager's dtype and
    for host paths; a ``first_of`` takes its last host path's
    (``FALLBACK_DTYPE``: the ones before it are None); a dtype by name is
    that dtype."""
    if isinstance(tensor.dtype, DtypeFallback):
        return FALLBACK_DTYPE
    if isinstance(tensor.dtype, Dtype):
        return getattr(torch, tensor.dtype.value)
    return torch.float32


def most_graph_rows(world: SpecWorld, path, budget: int, mbs: int) -> int:
    """The most graph rows of at most ``mbs`` items whose budget tokens sum
    to at most ``budget``, by brute force: every item of the (at most two)
    dims the two formulas read, each dim from 1 until the item's budget
    tokens pass the budget, then a knapsack over the items' budget tokens.
    ``budget`` when more dims are read (no bound below it is claimed)."""
    items = world.spec.items.on_path(path.output_tokens)
    rows_expr = items.graph_rows or items.output_tokens
    tokens_expr = items.budget_tokens or items.output_tokens
    dims = sorted((fx.names_in(rows_expr) | fx.names_in(tokens_expr)) & world.dims)
    if len(dims) > 2:
        return budget
    gain = [0] * (budget + 1)  # the most rows of an item of that many tokens
    for a in range(1, budget + 1):
        first = dict(zip(dims[:1], [a]))
        if (
            dims
            and world.value(tokens_expr, **first, **{d: 1 for d in dims[1:]}) > budget
        ):
            break
        for b in range(1, budget + 1) if len(dims) == 2 else [None]:
            names = {**first, **({dims[1]: b} if b is not None else {})}
            tokens = world.value(tokens_expr, **names)
            if tokens > budget:
                break
            gain[tokens] = max(gain[tokens], world.value(rows_expr, **names))
        if not dims:
            break
    return most_rows_within(gain, mbs)


def fixed_batch_rows(world: SpecWorld, path, mbs: int) -> float:
    """The budget tokens of ``max_batch_size`` items on a path whose budget
    tokens per item read no dims (else unbounded)."""
    items = world.spec.items.on_path(path.output_tokens)
    tokens = items.budget_tokens or items.output_tokens
    if fx.names_in(tokens) & world.dims:
        return float("inf")
    return mbs * world.value(tokens)


def replay_into(config, captured: dict, replay: dict) -> None:
    """Copy replay values into the captured buffers as the manager does."""
    for key, buf in captured.items():
        src = replay.get(key)
        if src is None:
            continue
        if src.ndim == 0:
            buf.copy_(src)
            continue
        logic = config.padding_logics.get(key)
        if logic is not None:
            logic(buf, src)
        else:
            EncoderCudaGraphManager._copy_padded_buffer(buf, src)


def _rows_dim(buf) -> int:
    return buf.rows_dim


@pytest.mark.parametrize(("budget", "mbs", "mfpb"), CAPTURES)
@pytest.mark.parametrize("seed", range(2))
def test_replay_buffers(
    world: SpecWorld, budget: int, mbs: int, mfpb: int, seed: int
) -> None:
    checked = 0
    for path in world.spec.paths:
        rng = random.Random(seed * 1000 + budget)
        checked += check_replay_buffers(world, path, rng, budget, mbs, mfpb)
    if not checked:
        pytest.skip("the capture refuses this budget (test_capture_inputs)")


def check_replay_buffers(world, path, rng, budget: int, mbs: int, mfpb: int) -> int:
    """Replays of random batches into ``path``'s capture; how many (none
    when the capture refuses the budget)."""
    host = world.host()
    config = host.get_encoder_cudagraph_config()
    # Random batches, and the one item with the most budget tokens that fits.
    largest = world.largest_item(budget, path)
    batches = [world.fitting_items(rng, budget, mbs, path) for _ in range(3)]
    checked = 0
    lists = any(i.is_list for i in world.spec.item_inputs)
    for items in batches + ([[largest]] if largest else []):
        if lists and not items:
            # The manager replays no empty batch, and a list input's builders
            # take the replay's device from its first unit.
            continue
        # The graph of the keys the batch selects.
        keys = world.selected_axis_keys(items) if world.spec.capture_axes else ()
        names = world.capture_names(budget, mbs, mfpb, path, keys)
        if world.refused(names, path) is not None:
            continue
        checked += 1
        captured = capture(world, host, budget, mbs, mfpb, path, keys)
        rows_captured = (
            None  # a unit capture pads no offsets
            if path.capture.of_units
            else mbs
            * world.item_values(
                dummy_items(world, budget, mbs, mfpb, path, keys)[0][0]
            )["input_size"]
        )
        batch = world.batch(items)
        replay = host.prepare_encoder_cudagraph_replay_buffers(
            batch, mbs, mfpb, path.name
        ).values
        assert set(replay) <= {b.key for b in path.buffers}, path.name
        target = copy.deepcopy(captured)
        # The padding logic of a trailing sequence finds its buffer by address.
        for buf in path.buffers:
            if buf.pad is PadRule.TRAILING_SEQUENCE:
                target[buf.key] = captured[buf.key]
        for buf in path.buffers:
            if is_padded_buffer(world, buf):
                # Stale values of an earlier, larger batch.
                target[buf.key].fill_(7)
        replay_into(config, target, replay)
        check_replayed(world, path, items, target, replay, rows_captured)
    return checked


def check_replayed(world, path, items, target, replay, rows_captured) -> None:
    for buf in path.buffers:
        value = target[buf.key]
        if buf.key not in replay:
            continue
        src = replay[buf.key]
        if src is None:
            assert buf.optional and value is None, buf.key
            continue
        if is_padded_buffer(world, buf):
            check_padded_replay(world, buf, items, value, src)
            continue
        if is_capture_tensor(buf):
            assert src.shape[0] == sum(world.flat_rows(buf.key, it) for it in items)
        if buf.pad is not None:
            n = src.shape[0]
            offsets = value.tolist()
            assert offsets[:n] == src.tolist(), buf.key
            assert offsets == sorted(offsets), f"{buf.key} is not monotone"
            tail = offsets[n:]
            if buf.pad is PadRule.TRAILING_SEQUENCE:
                # One padding sequence up to the captured rows.
                assert tail and all(v == rows_captured for v in tail), buf.key
            else:
                assert all(v == offsets[n - 1] for v in tail), buf.key
        elif src.ndim > 0:
            dim = _rows_dim(buf)
            n = src.shape[dim]
            head = value.narrow(dim, 0, n)
            assert torch.equal(head, src.to(value.dtype)), buf.key
            rest = value.narrow(dim, n, value.shape[dim] - n)
            assert not rest.any(), f"{buf.key}: stale rows after the real ones"


def check_padded_replay(world, buf, items, value, src) -> None:
    """The replay stacked the items to the widest (pad_value past each one's
    size), and the copy put them at ``[:N, :P]`` of a buffer of pad_value."""
    item = world.spec.item_input(buf.key)
    pad = item.pad_value
    if not items:
        return  # no item fits the budget (the manager replays no empty batch)
    if item.is_tensors:
        check_tensors_replay(world, item, items, value, src)
        return
    sizes = [it[item.dims[0]] for it in items]
    assert list(src.shape[:2]) == [len(items), max(sizes)], buf.key
    assert world.padded_ids(src, sizes) == [
        [[i, r] for r in range(n)] if src[0].numel() // src.shape[1] > 1 else [[i]] * n
        for i, n in enumerate(sizes)
    ], buf.key
    for i, n in enumerate(sizes):
        assert src[i, n:].eq(pad).all(), f"{buf.key}: item {i} padded"
    head = value[: src.shape[0], : src.shape[1]]
    assert torch.equal(head, src.to(value.dtype)), buf.key
    mask = torch.ones(value.shape[:2], dtype=torch.bool)
    mask[: src.shape[0], : src.shape[1]] = False
    assert value[mask].eq(pad).all(), f"{buf.key}: stale rows past the batch"


# -- eager forward -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_eager_forward(world: SpecWorld, seed: int) -> None:
    for path in world.spec.paths:
        check_eager_forward(world, path, random.Random(seed))


def check_eager_forward(world: SpecWorld, path, rng: random.Random) -> None:
    items = [world.random_item(rng) for _ in range(rng.randint(1, 4))]
    host = world.host()
    eager = path.eager_forward
    call, whole = output_call(eager.steps[-1].expr)
    if call is None or not whole:
        # The output is a tensor expression over a host call: the fake's
        # rows need not survive it (the model's parity test checks it).
        host.encoder_eager_forward(world.batch(items), path.name)
        return
    fake = fake_of(world, call)
    graph_rows = [world.item_values(it, path)["graph_rows"] for it in items]
    if eager.per_item:
        fake.queue = [
            torch.full((n, OUT_WIDTH), float(i)) for i, n in enumerate(graph_rows)
        ]
    else:
        fake.queue = [torch.ones(sum(graph_rows), OUT_WIDTH)]
    out = host.encoder_eager_forward(world.batch(items), path.name)
    assert out.shape == (sum(graph_rows), OUT_WIDTH)
    if eager.per_item:
        owners = [float(i) for i, n in enumerate(graph_rows) for _ in range(n)]
        assert out[:, 0].tolist() == owners
        assert host.encoder_eager_forward(world.batch([]), path.name).shape == (
            0,
            world.value(eager.empty_width),
        )


# -- graph forward -------------------------------------------------------------------------


#: Specs whose graph forward gathers rows of a host module's output by a
#: buffer of indices (PaddleOCR-VL's 2 x 2 merge order): the fake modules
#: return one row, so their graph forward runs in their oracle check instead
#: (``tests/parity/test_beyond_oracles.py``, vLLM's code on fakes that
#: keep every row).
GATHERED_OUTPUTS = {"paddleocr_vl"}


@pytest.mark.parametrize(("budget", "mbs", "mfpb"), CAPTURES[:2])
def test_graph_forward(world: SpecWorld, budget: int, mbs: int, mfpb: int) -> None:
    """The captured computation runs on its capture buffers, and a last step
    that is a host call returns that call's result unchanged."""
    if world.spec_path.stem in GATHERED_OUTPUTS:
        pytest.skip("gathers rows of a module's output: run by its oracle check")
    for path in world.spec.paths:
        for keys in world.axis_key_combos():
            names = world.capture_names(budget, mbs, mfpb, path, keys)
            if world.refused(names, path) is not None:
                continue  # test_capture_inputs: the capture refuses this budget
            host = world.host()
            values = capture(world, host, budget, mbs, mfpb, path, keys)
            entered = len(forward_context.ENTERED)
            out = host.encoder_cudagraph_forward(dict(values), path.name)
            call, whole = output_call(path.graph_forward[-1].expr)
            if call is not None and whole:
                assert out is fake_of(world, call).returned[-1]
            if path.graph_forward_context is not None:
                # The forward ran in its context, entered once.
                assert len(forward_context.ENTERED) == entered + 1


# -- pad rules chosen by backend ---------------------------------------------------


SECTIONS_SPECS = [
    p for p in SPECS if any(b.pad_by_backend for b in load_spec(p).buffers)
]


@pytest.fixture(
    scope="module",
    params=SECTIONS_SPECS,
    ids=[f"{p.parent.name}/{p.stem}" for p in SECTIONS_SPECS],
)
def sections_world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


def test_flashinfer_sections(sections_world: SpecWorld) -> None:
    """Under FlashInfer a ``pad_by_backend`` buffer keeps the builder's
    two-section layout at capture, and replay pads each section on its own."""
    world = sections_world
    keys = [b.key for b in world.spec.paths[0].buffers if b.pad_by_backend]
    host = world.host()
    guard = world.spec.guards.attention_backend
    set_path(host, guard.path.parts, AttentionBackendEnum.FLASHINFER)
    config = host.get_encoder_cudagraph_config()
    values = capture(world, host, 100, 3, 3, world.spec.paths[0])
    built = world.builders[0].calls[-1]
    sections = world.module._pad_flashinfer_sections
    for key in keys:
        assert config.padding_logics[key] is sections
        # Kept as the builder made it (the fake builder's plain offsets).
        offsets = [0]
        for item in world.builders[0].items(*built):
            offsets.append(offsets[-1] + world.item_values(item)["input_size"])
        assert values[key].tolist() == offsets, key
    # Two captured sections of 5; a batch's sections of 3 (Q/K/O, then V).
    dst = torch.full((10,), -1, dtype=torch.int32)
    src = torch.tensor([0, 4, 6, 0, 12, 18], dtype=torch.int32)
    sections(dst, src)
    assert dst.tolist() == [0, 4, 6, 6, 6, 0, 12, 18, 18, 18]
    with pytest.raises(RuntimeError, match="sections"):
        sections(torch.zeros(4, dtype=torch.int32), src)


# -- several paths -------------------------------------------------------------------


PATH_SPECS = [p for p in SPECS if load_spec(p).has_paths]


@pytest.fixture(scope="module", params=PATH_SPECS, ids=[p.stem for p in PATH_SPECS])
def paths_world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


#: Path specs whose items are their rows of every path, concatenated (no
#: post-processing steps).
CONCAT_SPECS = [p for p in PATH_SPECS if not load_spec(p).post_steps]


@pytest.fixture(scope="module", params=CONCAT_SPECS, ids=[p.stem for p in CONCAT_SPECS])
def concat_world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


@pytest.mark.parametrize("seed", range(3))
def test_postprocess_concatenates_the_paths(concat_world: SpecWorld, seed: int) -> None:
    """Each item's output is its rows of every path in path order, in a
    tensor of its own; a path without rows in the batch is absent."""
    world = concat_world
    rng = random.Random(seed)
    items = [world.random_item(rng, zero_counts=True) for _ in range(4)]
    indices = rng.sample(range(4), rng.randint(1, 4))
    chosen = [items[i] for i in indices]
    rows = {
        p.name: [world.path_rows(it)[p.name] for it in chosen]
        for p in world.spec.concatenation
    }
    # Row r of item position j on path p holds (p, j, r); a padded tail after.
    outputs = {}
    for pi, (name, per_item) in enumerate(rows.items()):
        if sum(per_item):
            ids = [(pi, j, r) for j, n in enumerate(per_item) for r in range(n)]
            tail = [(-1, -1, -1)] * 3
            outputs[name] = torch.tensor(ids + tail, dtype=torch.float32)
    host = world.host()
    batch = host.select_encoder_cudagraph_items(world.batch(items), indices)
    dest: dict = {}
    host.postprocess_encoder_output(
        outputs, indices, [0] * len(indices), dest, clone=True, batch_mm_kwargs=batch
    )
    assert set(dest) == set(indices)
    for j, idx in enumerate(indices):
        want = [
            [pi, j, r]
            for pi, per_item in enumerate(rows.values())
            for r in range(per_item[j])
        ]
        assert dest[idx].tolist() == want
        for out in outputs.values():
            assert dest[idx].untyped_storage().data_ptr() != (
                out.untyped_storage().data_ptr()
            ), "a result shares the graph output's memory"
        assert dest[idx].shape[0] == world.item_values(chosen[j])["output_tokens"]


def test_an_unknown_path_is_refused(paths_world: SpecWorld) -> None:
    host = paths_world.host()
    with pytest.raises(ValueError, match="no encoder path 'nope'"):
        host.encoder_cudagraph_forward({}, "nope")
    with pytest.raises(ValueError, match="no encoder path 'nope'"):
        host.prepare_encoder_cudagraph_capture_inputs(
            64, 1, 1, torch.device("cpu"), torch.float32, "nope", ()
        )


@pytest.mark.parametrize(
    ("tokens", "budgets", "items"), [(8192, [], 0), (2048, [512], 3)]
)
def test_path_budgets_match_the_manager(
    paths_world: SpecWorld, tokens: int, budgets: list[int], items: int
) -> None:
    """The manager's budgets per path from the generated config are what
    `gen-mixin plan` predicts from the spec."""
    from encoder_cudagraph_runtime.config import CompilationConfig, MultiModalConfig
    from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
    from generator.plan import make_plan

    cfg = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(
            max_model_len=32768, multimodal_config=MultiModalConfig()
        ),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_token_budgets=budgets,
            encoder_cudagraph_max_vision_items_per_batch=items,
        ),
    )
    manager = EncoderCudaGraphManager(
        cfg,
        torch.device("cpu"),
        torch.float32,
        paths_world.host(),
        graph_backend=EagerReplayGraphBackend(),
    )
    plan = make_plan(
        paths_world.spec,
        max_num_batched_tokens=tokens,
        budgets=budgets,
        max_items=items,
    )
    assert {p.name: p.budgets for p in plan.paths} == manager.path_token_budgets
    assert plan.num_graphs == manager.get_num_graphs_to_capture()


# -- capture axes --------------------------------------------------------------------

AXES_SPECS = [p for p in SPECS if load_spec(p).capture_axes]


@pytest.fixture(scope="module", params=AXES_SPECS, ids=[p.stem for p in AXES_SPECS])
def axes_world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


def manager_tokens(world: SpecWorld) -> int:
    """The scheduler step of the manager tests: 256, or four of the
    smallest budget where that is larger (Gemma 4's images count 280)."""
    return max(256, 4 * world.value(world.spec.budget.min))


def _manager(world: SpecWorld, host, tokens: int | None = None, items: int = 4):
    from encoder_cudagraph_runtime.config import CompilationConfig, MultiModalConfig
    from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend

    tokens = tokens or manager_tokens(world)
    cfg = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(
            max_model_len=tokens, multimodal_config=MultiModalConfig()
        ),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True,
            encoder_cudagraph_max_vision_items_per_batch=items,
        ),
    )
    return EncoderCudaGraphManager(
        cfg,
        torch.device("cpu"),
        torch.float32,
        host,
        graph_backend=EagerReplayGraphBackend(),
    )


@pytest.mark.parametrize("seed", range(3))
def test_the_manager_replays_the_selected_keys(axes_world: SpecWorld, seed: int):
    """The manager captures every (budget, key combination) the config lists
    and replays, for each packed batch, the graph of the keys its selection
    resolves, which are the spec's."""
    from generator.plan import make_plan

    world = axes_world
    host = world.host()
    manager = _manager(world, host)
    tokens = manager_tokens(world)
    plan = make_plan(
        world.spec, max_num_batched_tokens=tokens, max_model_len=tokens, max_items=4
    )
    assert manager.get_num_graphs_to_capture() == plan.num_graphs
    manager.capture()
    combos = set(world.axis_key_combos())
    captured = manager.budget_graphs["default"]
    assert {keys for _, keys in captured} == combos
    replayed = []
    run = manager._run_budget_graph

    def spy(kwargs, budget, path="default", axis_keys=(), **kw):
        replayed.append((axis_keys, world.selected_axis_keys(world.items_of(kwargs))))
        return run(kwargs, budget, path=path, axis_keys=axis_keys, **kw)

    manager._run_budget_graph = spy
    rng = random.Random(seed)
    drawn = (world.random_item(rng) for _ in range(10**3))
    # Items a graph takes (items.eager_when sends the others eagerly).
    items = [it for it in drawn if not world.runs_eagerly(it)][: rng.randint(1, 6)]
    manager.execute(world.batch(items))
    assert all(got == want for got, want in replayed)
    # Items no key covers (beyond_keys: eager) run eagerly; the rest replay.
    on_graphs = [it for it in items if not world.runs_eagerly(it)]
    assert bool(replayed) == bool(on_graphs)
    assert manager.graph_hits == len(on_graphs)


# -- custom post-processing ----------------------------------------------------------


#: Specs whose graph output is not rows of ``out_hidden_size`` (DeepSeek-VL2:
#: ``(tiles, h * h, width)``): the fake output below is rows, so their
#: post-processing is checked by their parity test instead.
BLOCK_OUTPUTS = {"deepseek_vl2"}
#: Specs whose steps read inputs that real images keep consistent and random
#: items do not: the useful area of each image's mask (Phi-4-multimodal), as
#: many crops as its size asks for (Phi-3-Vision, Phi-4-multimodal). Checked
#: by their oracle check on real layouts (tests/parity/test_beyond_oracles.py).
ROWS_FROM_CONTENT = {"phi3v", "phi4mm"}
POST_SPECS = [
    p
    for p in SPECS
    if load_spec(p).post_steps
    and not load_spec(p).has_paths
    and p.stem not in BLOCK_OUTPUTS | ROWS_FROM_CONTENT
]


@pytest.fixture(scope="module", params=POST_SPECS, ids=[p.stem for p in POST_SPECS])
def post_world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


def run_post_steps(world: SpecWorld, seed: int, clone: bool):
    """Post-process a padded output of random selected items: (dest, out,
    indices, tokens). A last step that is a host call returns rows numbered
    in batch order (per item: the item's position)."""
    rng = random.Random(seed)
    items = [world.random_item(rng) for _ in range(4)]
    indices = rng.sample(range(4), rng.randint(1, 4))
    chosen = [items[i] for i in indices]
    # The manager's per_item_out_tokens: every item's, by its index.
    every = [world.item_values(it)["output_tokens"] for it in items]
    tokens = [every[i] for i in indices]
    rows = sum(world.item_values(it)["graph_rows"] for it in chosen)
    out = torch.arange((rows + 3) * OUT_WIDTH, dtype=torch.float32)
    out = out.reshape(rows + 3, OUT_WIDTH)
    host = world.host()
    post = world.spec.postprocess
    call, whole = output_call(post.steps[-1].expr)
    if whole:
        if post.per_item:
            queue = [torch.full((n, OUT_WIDTH), float(j)) for j, n in enumerate(tokens)]
        else:
            numbers = torch.arange(sum(tokens), dtype=torch.float32)
            queue = [numbers[:, None].repeat(1, OUT_WIDTH)]
        fake_of(world, call).queue = queue
    batch = host.select_encoder_cudagraph_items(world.batch(items), indices)
    dest: dict = {}
    host.postprocess_encoder_output(
        {"default": out}, indices, every, dest, clone=clone, batch_mm_kwargs=batch
    )
    return dest, out, indices, tokens, whole


@pytest.mark.parametrize("clone", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_postprocess_steps(post_world: SpecWorld, seed: int, clone: bool) -> None:
    """Every selected item gets its output_tokens rows, in order; with
    ``clone`` none shares the graph output's memory."""
    world = post_world
    dest, out, indices, tokens, whole = run_post_steps(world, seed, clone)
    assert set(dest) == set(indices)
    offset = 0
    for j, idx in enumerate(indices):
        assert dest[idx].shape[0] == tokens[j]
        if whole and world.spec.postprocess.per_item:
            assert dest[idx][:, 0].tolist() == [float(j)] * tokens[j]
        elif whole:
            want = [float(r) for r in range(offset, offset + tokens[j])]
            assert dest[idx][:, 0].tolist() == want
        offset += tokens[j]
        if clone:
            assert dest[idx].untyped_storage().data_ptr() != (
                out.untyped_storage().data_ptr()
            ), "a result shares the graph output's memory"


PATH_POST_SPECS = [p for p in PATH_SPECS if load_spec(p).post_steps]


@pytest.fixture(
    scope="module", params=PATH_POST_SPECS, ids=[p.stem for p in PATH_POST_SPECS]
)
def path_post_world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


@pytest.mark.parametrize("clone", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_postprocess_steps_over_paths(
    path_post_world: SpecWorld, seed: int, clone: bool
) -> None:
    """Per-item steps over each path's rows (``<path>_rows``): every selected
    item gets its output_tokens rows (the generated code checks the count
    against ``per_item_out_tokens``), a path without rows in the batch is
    absent from the outputs, and no result shares a graph output's memory
    unless its steps return a view (none of the corpus' do)."""
    world = path_post_world
    rng = random.Random(seed)
    items = [world.random_item(rng, zero_counts=True) for _ in range(4)]
    indices = rng.sample(range(4), rng.randint(1, 4))
    chosen = [items[i] for i in indices]
    every = [world.item_values(it)["output_tokens"] for it in items]
    outputs = {}
    for path in world.spec.paths:
        rows = sum(world.path_rows(it)[path.name] for it in chosen)
        if rows:  # a padded tail after the real rows, as a graph's buffer
            out = torch.arange((rows + 3) * OUT_WIDTH, dtype=torch.float32)
            outputs[path.name] = out.reshape(rows + 3, OUT_WIDTH)
    host = world.host()
    batch = host.select_encoder_cudagraph_items(world.batch(items), indices)
    dest: dict = {}
    host.postprocess_encoder_output(
        outputs, indices, every, dest, clone=clone, batch_mm_kwargs=batch
    )
    assert set(dest) == set(indices)
    for idx in indices:
        assert dest[idx].shape == (every[idx], OUT_WIDTH)
        for out in outputs.values():
            assert dest[idx].untyped_storage().data_ptr() != (
                out.untyped_storage().data_ptr()
            ), "a result shares the graph output's memory"
    wrong = [n + 1 for n in every]
    with pytest.raises(ValueError, match="post-processing gave"):
        host.postprocess_encoder_output(
            outputs, indices, wrong, {}, clone=clone, batch_mm_kwargs=batch
        )


def test_postprocess_steps_clone_a_view_of_the_output(tmp_path: Path) -> None:
    """Steps that return a view of ``path_output`` (every merge-th row) get
    their rows cloned when the manager asks for ``clone``, and only then."""
    source = Path(__file__).parent / "data" / "valid" / "postprocess_steps.yaml"
    text = source.read_text(encoding="utf-8").replace(
        "    - projector(path_output[:graph_rows], grid)",
        "    - path_output[:graph_rows].view(-1, merge * merge, path_output.shape[-1])[:, 0]",
    )
    assert "[:, 0]" in text
    spec = tmp_path / "postprocess_view.yaml"
    spec.write_text(text, encoding="utf-8")
    world = SpecWorld(spec)
    for clone in (True, False):
        dest, out, indices, tokens, _ = run_post_steps(world, 1, clone)
        offset = 0
        for j, idx in enumerate(indices):
            merge = world.env["merge"]
            first = (offset * merge * merge) * OUT_WIDTH
            assert dest[idx][0, 0].item() == first
            shares = dest[idx].untyped_storage().data_ptr() == (
                out.untyped_storage().data_ptr()
            )
            assert shares is not clone
            offset += tokens[j]


#: Per-item steps that read every input cut to the item: (h, w) grid, mask
#: rows and how many of their entries are 1, first pixel, extra rows.
READS_INPUTS_ITEMS = [
    ((2, 3), 3, 2, 11, 0),
    ((1, 4), 3, 5, 12, 2),
    ((3, 1), 3, 0, 13, 1),
]


@pytest.mark.parametrize("stacked", [False, True], ids=["mask list", "mask tensor"])
@pytest.mark.parametrize("indices", [[0, 1, 2], [2, 0], [1], [2, 1, 0]])
def test_postprocess_steps_read_each_items_inputs(stacked, indices) -> None:
    """Per-item steps see the selected batch's inputs cut to the item: the
    mark row of each item (``postprocess_reads_inputs.yaml``) holds its own
    mask area (int() of a padded input's tensor), first pixel (its rows of
    the flat input), grid row and count, whatever the selection's order."""
    spec = Path(__file__).parent / "data" / "valid" / "postprocess_reads_inputs.yaml"
    host = SpecWorld(spec).host()
    pixels, masks = [], []
    for (h, w), crops, ones, first, _ in READS_INPUTS_ITEMS:
        rows = torch.full((h * w, 6), 99.0)
        rows[0, 0] = first
        pixels.append(rows)
        masks.append((torch.arange(crops * 4) < ones).float().view(crops, 4))
    mm_kwargs = {
        "pixel_values": torch.cat(pixels),
        "image_grid_hw": torch.tensor([it[0] for it in READS_INPUTS_ITEMS]),
        "crop_masks": torch.stack(masks) if stacked else masks,
        "extra_rows": torch.tensor([it[4] for it in READS_INPUTS_ITEMS]),
    }
    every = [h * w + 1 + e for (h, w), *_, e in READS_INPUTS_ITEMS]
    batch = host.select_encoder_cudagraph_items(mm_kwargs, indices)
    graph_rows = sum(h * w for (h, w), *_ in (READS_INPUTS_ITEMS[i] for i in indices))
    out = torch.arange(graph_rows * 3, dtype=torch.float32).view(graph_rows, 3)
    dest: dict = {}
    host.postprocess_encoder_output(
        {"default": out}, indices, every, dest, clone=True, batch_mm_kwargs=batch
    )
    offset = 0
    for idx in indices:
        (h, w), _, ones, first, extra = READS_INPUTS_ITEMS[idx]
        assert torch.equal(dest[idx][: h * w], out[offset : offset + h * w])
        mark = ones * 1000000 + first * 1000 + h * 10 + w
        assert dest[idx][h * w :].tolist() == [[float(mark)] * 3] * (1 + extra)
        offset += h * w
