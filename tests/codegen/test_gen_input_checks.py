"""The host-side input checks of every generated mixin (issue #16 item 6).

For each spec of ``specs/`` and of the valid corpus, a valid batch built from
the spec (``genmixin_spec_host``) is corrupted in every way the spec allows
(``input_corruptions``): item specs and selection, the two methods that read
``mm_kwargs`` before anything runs, must raise a ``ValueError`` naming the
input and the mismatch; selection refuses the grid and count cases (it
reads the grids; the rest item specs has checked, as the manager calls it
first). The valid batch itself passes (control), and a
selection's output passes the checks again (DP re-selects from a selection).
The manager's graph and eager paths are run in
``tests/equivalence/test_input_checks_cpu.py``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from genmixin_spec_host import SpecWorld  # noqa: E402
from genmixin_testlib import (  # noqa: E402
    spec_paths,
    standalone_paths,
    valid_corpus_paths,
)
from input_corruptions import corruptions, index_corruptions  # noqa: E402

# The standalone module runs here (none for a spec with a vLLM-only import).
SPECS = standalone_paths(spec_paths() + valid_corpus_paths())
WORLDS = {f"{p.parent.name}/{p.stem}": p for p in SPECS}


@pytest.fixture(scope="module")
def worlds() -> dict[str, SpecWorld]:
    return {}


def world_of(worlds: dict[str, SpecWorld], name: str) -> SpecWorld:
    if name not in worlds:
        worlds[name] = SpecWorld(Path(WORLDS[name]))
    return worlds[name]


def valid_batch(world: SpecWorld, lists: bool = False):
    rng = random.Random(5)
    items = [world.random_item(rng) for _ in range(3)]
    return items, world.batch(items, lists=lists)


def cases_of(name: str) -> list[tuple[str, str]]:
    world = SpecWorld(Path(WORLDS[name]))
    items, batch = valid_batch(world)
    tokens = [world.item_values(it)["output_tokens"] for it in items]
    return [
        (name, c.name, c.in_selection)
        for c in corruptions(world.spec, world.module, batch, tokens.__getitem__)
    ]


TABLE = [case for name in WORLDS for case in cases_of(name)]
CASES = [(name, case) for name, case, _ in TABLE]
#: The grid and count cases: selection reads the grids itself; the rows,
#: derived grids and span types it leaves to item specs, which the manager
#: calls first on every execute (checking them per packed batch would cost
#: the batch's rows once per batch).
SELECTION_CASES = [(name, case) for name, case, in_selection in TABLE if in_selection]


def corruption(world: SpecWorld, case: str):
    items, batch = valid_batch(world)
    tokens = [world.item_values(it)["output_tokens"] for it in items]
    table = corruptions(world.spec, world.module, batch, tokens.__getitem__)
    return next(c for c in table if c.name == case)


@pytest.mark.parametrize("name", list(WORLDS))
@pytest.mark.parametrize("lists", [False, True], ids=["tensor-grids", "list-grids"])
def test_a_valid_batch_passes(worlds, name: str, lists: bool) -> None:
    world = world_of(worlds, name)
    host = world.host()
    items, batch = valid_batch(world, lists)
    assert len(host.get_encoder_cudagraph_item_specs(batch)) == len(items)
    selected = host.select_encoder_cudagraph_items(batch, [2, 0, 2])
    assert len(host.get_encoder_cudagraph_item_specs(selected)) == 3
    assert host.select_encoder_cudagraph_items(selected, [1]) is not None


@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_item_specs_refuse(worlds, name: str, case: str) -> None:
    world = world_of(worlds, name)
    bad = corruption(world, case)
    with pytest.raises(ValueError, match=bad.pattern):
        world.host().get_encoder_cudagraph_item_specs(bad.mm_kwargs)


@pytest.mark.parametrize(
    "name,case", SELECTION_CASES, ids=[f"{n}-{c}" for n, c in SELECTION_CASES]
)
def test_selection_refuses_bad_grids(worlds, name: str, case: str) -> None:
    world = world_of(worlds, name)
    bad = corruption(world, case)
    with pytest.raises(ValueError, match=bad.pattern):
        world.host().select_encoder_cudagraph_items(bad.mm_kwargs, [0])


@pytest.mark.parametrize("name", list(WORLDS))
@pytest.mark.parametrize("case", [c[0] for c in index_corruptions(3)])
def test_selection_refuses_indices_outside_the_batch(worlds, name: str, case) -> None:
    world = world_of(worlds, name)
    _, indices, message = next(c for c in index_corruptions(3) if c[0] == case)
    _, batch = valid_batch(world)
    with pytest.raises(ValueError, match=message):
        world.host().select_encoder_cudagraph_items(batch, indices)


#: (spec, input, whether an item needs a unit): InternVL's tiles and
#: MiniCPM-V's slices are the item's tokens (0 left the item without output:
#: KeyError in postprocess); Step3-VL's crops may be none (the global view
#: stays, and the crops path allows zero tokens).
LEAST_UNITS = [
    ("specs/internvl", "image_num_patches", 1),
    ("specs/minicpmv", "pixel_values", 1),
    ("specs/step3_vl", "num_patches", 0),
]


@pytest.mark.parametrize(("name", "key", "least"), LEAST_UNITS)
def test_an_item_of_no_units_is_refused_where_it_has_no_output(
    worlds, name: str, key: str, least: int
) -> None:
    from generator.emitters.input_checks import least_units

    spec = world_of(worlds, name).spec
    assert least_units(spec, spec.item_input(key)) == least


def _on_meta(value):
    """Float tensors (pixels) on the meta device, in lists too; grids,
    counts and span types where they are."""
    if isinstance(value, list):
        return [_on_meta(v) for v in value]
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return value.to("meta")
    return value


@pytest.mark.parametrize("name", list(WORLDS))
def test_pixels_on_the_meta_device_are_accepted(worlds, name: str) -> None:
    """A documented acceptance: pixels are read by shape only, so a tensor
    without values passes the checks (the suite's stand-in for a device,
    tests/towers/test_towers_host_sync.py); the replay copy or the forward
    then fails in torch. Grids and counts on meta are refused (above)."""
    world = world_of(worlds, name)
    host = world.host()
    items, batch = valid_batch(world)
    on_meta = {key: _on_meta(value) for key, value in batch.items()}
    assert len(host.get_encoder_cudagraph_item_specs(on_meta)) == len(items)
    selected = host.select_encoder_cudagraph_items(on_meta, [1, 0])
    assert len(host.get_encoder_cudagraph_item_specs(selected)) == 2


@pytest.mark.parametrize("name", list(WORLDS))
def test_integer_pixels_are_accepted(worlds, name: str) -> None:
    """A documented acceptance: pixels of an integer dtype pass the checks in
    every spec (Kimi-K2.5/K3's fused input norm and some towers take raw
    uint8); complex and bool ones are refused (the corruption table)."""
    world = world_of(worlds, name)
    items, batch = valid_batch(world)
    as_uint8 = {key: _floats_as(value, torch.uint8) for key, value in batch.items()}
    assert len(world.host().get_encoder_cudagraph_item_specs(as_uint8)) == len(items)


def _floats_as(value, dtype: torch.dtype):
    if isinstance(value, list):
        return [_floats_as(v, dtype) for v in value]
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return value.to(dtype)
    return value
