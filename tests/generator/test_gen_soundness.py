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

from encoder_cudagraph_runtime.config import (  # noqa: E402
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from generator.spec import FlatInput, PadRule  # noqa: E402
from genmixin_spec_host import OUT_WIDTH, SpecWorld, is_capture_tensor  # noqa: E402
from genmixin_testlib import spec_paths, valid_corpus_paths  # noqa: E402

SPECS = spec_paths() + valid_corpus_paths()
IDS = [f"{p.parent.name}/{p.stem}" for p in SPECS]
#: (token_budget, max_batch_size, max_frames_per_batch)
CAPTURES = [(64, 1, 1), (100, 3, 3), (257, 7, 14), (1000, 8, 8), (2048, 16, 32)]
INDICES = [[], [0], [2], [1, 0], [3, 1, 2, 0], [2, 2], [0, 3, 0], [3, 2, 1, 0]]


@pytest.fixture(scope="module", params=SPECS, ids=IDS)
def world(request) -> SpecWorld:
    return SpecWorld(Path(request.param))


def expected_specs(world: SpecWorld, items) -> list[tuple[int, int, dict]]:
    out = []
    counted = (world.spec.items.budget_tokens, world.spec.items.eager_when)
    for item in items:
        v = world.item_values(item)
        path = {"default": world.path_tokens(item)} if any(counted) else {}
        out.append((v["input_size"], v["output_tokens"], path))
    return out


def got_specs(specs) -> list[tuple[int, int, dict]]:
    return [(s.input_size, s.output_tokens, s.path_output_tokens) for s in specs]


# -- config, budget range, item specs -------------------------------------------------


def test_config(world: SpecWorld) -> None:
    config = world.host().get_encoder_cudagraph_config()
    path = world.spec.path
    assert config.buffer_keys == [b.key for b in path.buffers]
    assert config.out_hidden_size == world.value(world.spec.out_hidden_size)
    assert config.modalities == [m.value for m in world.spec.modalities]
    special = {b.key for b in path.buffers if b.pad is not None or b.rows_dim}
    assert set(config.padding_logics) == special


@pytest.mark.parametrize(("tokens", "model_len"), [(8192, 8192), (2048, 32768)])
def test_budget_range(world: SpecWorld, tokens: int, model_len: int) -> None:
    cfg = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(max_model_len=model_len),
    )
    got = world.host().get_encoder_cudagraph_budget_range(cfg)
    assert got == (world.value(world.spec.budget.min), min(tokens, model_len))


@pytest.mark.parametrize("lists", [False, True], ids=["tensors", "lists"])
@pytest.mark.parametrize("seed", range(3))
def test_item_specs(world: SpecWorld, lists: bool, seed: int) -> None:
    rng = random.Random(seed)
    items = [world.random_item(rng) for _ in range(rng.randint(1, 5))]
    batch = world.batch(items, lists=lists)
    got = world.host().get_encoder_cudagraph_item_specs(batch)
    assert got_specs(got) == expected_specs(world, items)


def test_input_modality(world: SpecWorld) -> None:
    if world.spec.has_video_keys:
        pytest.skip("by the batch's keys: test_selection_by_video_keys")
    (modality,) = world.spec.modalities
    host = world.host()
    if not hasattr(host, "get_input_modality"):
        assert modality.value == "image", "a plain mixin answers the protocol default"
        return
    batch = world.batch([world.random_item(random.Random(3))])
    assert host.get_input_modality(batch) == modality.value


def test_eager_items_exceed_every_budget(world: SpecWorld) -> None:
    eager = world.spec.items.eager_when
    if eager is None:
        pytest.skip("no items.eager_when")
    rng = random.Random(11)
    items = [world.random_item(rng) for _ in range(24)]
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


# -- selection ----------------------------------------------------------------------------


@pytest.mark.parametrize("lists", [False, True], ids=["tensors", "lists"])
@pytest.mark.parametrize("indices", INDICES, ids=[str(i) for i in INDICES])
def test_selection(world: SpecWorld, lists: bool, indices: list[int]) -> None:
    rng = random.Random(len(indices))
    items = [world.random_item(rng) for _ in range(4)]
    host = world.host()
    batch = world.batch(items, lists=lists)
    got = host.select_encoder_cudagraph_items(batch, list(indices))
    assert list(got) == [i.key for i in world.spec.inputs]
    chosen = [items[i] for i in indices]
    want = world.batch(chosen)
    for inp in world.spec.inputs:
        value = got[inp.key]
        if isinstance(inp, FlatInput):
            # Rows (item, row) of the chosen items, in the order chosen.
            want_rows = world.row_ids(world.batch(items)[inp.key])
            starts = [0]
            for it in items:
                starts.append(starts[-1] + world.flat_rows(inp.key, it))
            rows = [
                want_rows[r] for i in indices for r in range(starts[i], starts[i + 1])
            ]
            assert world.row_ids(value) == rows, inp.key
        else:
            assert value.dtype == torch.int64
            assert value.tolist() == want[inp.key].tolist(), inp.key
            assert value.shape == want[inp.key].shape, inp.key
    assert got_specs(host.get_encoder_cudagraph_item_specs(got)) == expected_specs(
        world, chosen
    )


def test_selection_of_folded_inputs(world: SpecWorld) -> None:
    """Flat inputs with ``fold_ranks`` may arrive with a leading batch dim:
    the selection, replay and eager forward read them as the plain rows."""
    folded = [f for f in world.spec.flat_inputs if f.fold_ranks]
    if not folded:
        pytest.skip("no fold_ranks")
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


def test_selection_by_video_keys(world: SpecWorld) -> None:
    if not world.spec.has_video_keys:
        pytest.skip("no video keys")
    rng = random.Random(7)
    items = [world.random_item(rng) for _ in range(3)]
    host = world.host()
    batch = world.batch(items, video=True)
    got = host.select_encoder_cudagraph_items(batch, [2, 0])
    assert list(got) == [i.video_key for i in world.spec.inputs]
    assert got_specs(host.get_encoder_cudagraph_item_specs(got)) == expected_specs(
        world, [items[2], items[0]]
    )


# -- capture and replay ----------------------------------------------------------------


def capture(world: SpecWorld, host, budget: int, mbs: int, mfpb: int):
    values = host.prepare_encoder_cudagraph_capture_inputs(
        budget, mbs, mfpb, torch.device("cpu"), torch.float32
    ).values
    return values


def dummy_items(world: SpecWorld, budget: int, mbs: int, mfpb: int):
    """The dummy batch's items, from the spec's dummy formulas."""
    names = world.capture_names(budget, mbs, mfpb)
    item = {}
    for inp, exprs in world.spec.path.capture.dummy:
        for dim, e in zip(inp.dims, exprs, strict=True):
            item[dim] = world.value(e, **names)
    return [dict(item) for _ in range(mbs)], names


def unit_names(world: SpecWorld, budget: int, mbs: int, mfpb: int) -> dict:
    """The names of a unit capture's shapes, ``units`` from its formula."""
    names = {
        "token_budget": budget,
        "max_batch_size": mbs,
        "max_frames_per_batch": mfpb,
    }
    return {**names, "units": world.value(world.spec.path.capture.units, **names)}


def check_unit_capture(world: SpecWorld, values, names: dict) -> None:
    """Every buffer of a unit capture has its declared shape over ``units``."""
    for buf in world.spec.path.buffers:
        exprs = buf.source.shape if is_capture_tensor(buf) else buf.shape
        if exprs is None or buf.host_scalar:
            continue
        shape = [world.value(e, **names) for e in exprs]
        assert list(values[buf.key].shape) == shape, buf.key


@pytest.mark.parametrize(("budget", "mbs", "mfpb"), CAPTURES)
def test_capture_inputs(world: SpecWorld, budget: int, mbs: int, mfpb: int) -> None:
    host = world.host()
    refused = world.refused(world.capture_names(budget, mbs, mfpb))
    if refused is not None:
        # A dummy beyond the tower's capacity: refused, with the spec's message.
        with pytest.raises(ValueError, match=re.escape(refused.message)):
            capture(world, host, budget, mbs, mfpb)
        return
    values = capture(world, host, budget, mbs, mfpb)
    spec = world.spec
    assert list(values) == [b.key for b in spec.path.buffers]
    if spec.path.capture.of_units:
        check_unit_capture(world, values, unit_names(world, budget, mbs, mfpb))
        return
    dummy, names = dummy_items(world, budget, mbs, mfpb)
    dims = dummy[0]
    rows = mbs * world.item_values(dims)["input_size"]
    for buf in spec.path.buffers:
        value = values[buf.key]
        if is_capture_tensor(buf):
            own = mbs * world.flat_rows(buf.key, dims)
            shape = [
                world.value(e, **names, rows=own, **dims) for e in buf.source.shape
            ]
            assert list(value.shape) == shape, buf.key
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
        elif buf.allocate:
            shape = [world.value(e, **names, rows=rows) for e in buf.shape]
            assert list(value.shape) == shape, buf.key
    # The dummy batch covers its budget, in budget tokens and in graph rows.
    tokens = sum(world.item_values(d)["budget_tokens"] for d in dummy)
    assert tokens >= budget
    capacity = sum(world.item_values(d)["graph_rows"] for d in dummy)
    if spec.path.capture.graph_rows is not None:
        capacity = max(
            capacity, world.value(spec.path.capture.graph_rows, **names, rows=rows)
        )
    assert capacity >= budget
    # Every builder saw the dummy grids it reads.
    for fake in world.builders:
        seen = fake.items(*fake.calls[-1])
        assert seen == [{d: v for d, v in it.items() if d in seen[0]} for it in dummy]


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
    rng = random.Random(seed * 1000 + budget)
    if world.refused(world.capture_names(budget, mbs, mfpb)) is not None:
        pytest.skip("the capture refuses this budget (test_capture_inputs)")
    host = world.host()
    config = host.get_encoder_cudagraph_config()
    captured = capture(world, host, budget, mbs, mfpb)
    rows_captured = (
        None  # a unit capture pads no offsets
        if world.spec.path.capture.of_units
        else mbs
        * world.item_values(dummy_items(world, budget, mbs, mfpb)[0][0])["input_size"]
    )
    # Random batches, and the one item with the most budget tokens that fits.
    largest = world.largest_item(budget)
    batches = [world.fitting_items(rng, budget, mbs) for _ in range(3)]
    for items in batches + ([[largest]] if largest else []):
        batch = world.batch(items)
        replay = host.prepare_encoder_cudagraph_replay_buffers(batch, mbs, mfpb).values
        target = copy.deepcopy(captured)
        # The padding logic of a trailing sequence finds its buffer by address.
        for buf in world.spec.path.buffers:
            if buf.pad is PadRule.TRAILING_SEQUENCE:
                target[buf.key] = captured[buf.key]
        replay_into(config, target, replay)
        check_replayed(world, items, target, replay, rows_captured)


def check_replayed(world, items, target, replay, rows_captured) -> None:
    for buf in world.spec.path.buffers:
        value = target[buf.key]
        if buf.key not in replay:
            continue
        src = replay[buf.key]
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


# -- eager forward -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_eager_forward(world: SpecWorld, seed: int) -> None:
    rng = random.Random(seed)
    items = [world.random_item(rng) for _ in range(rng.randint(1, 4))]
    host = world.host()
    eager = world.spec.path.eager_forward
    last = eager.steps[-1].expr
    fake = world.calls[_name(last.callee)]
    graph_rows = [world.item_values(it)["graph_rows"] for it in items]
    if eager.per_item:
        fake.queue = [
            torch.full((n, OUT_WIDTH), float(i)) for i, n in enumerate(graph_rows)
        ]
    else:
        fake.queue = [torch.ones(sum(graph_rows), OUT_WIDTH)]
    out = host.encoder_eager_forward(world.batch(items))
    assert out.shape == (sum(graph_rows), OUT_WIDTH)
    if eager.per_item:
        owners = [float(i) for i, n in enumerate(graph_rows) for _ in range(n)]
        assert out[:, 0].tolist() == owners
        assert host.encoder_eager_forward(world.batch([])).shape == (
            0,
            world.value(eager.empty_width),
        )


def _name(callee) -> str:
    from generator.formulas import Ref

    return callee.name if isinstance(callee, Ref) else callee.dotted
