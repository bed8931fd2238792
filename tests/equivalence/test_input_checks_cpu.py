"""Corrupted ``mm_kwargs`` through the manager, on the graph and the eager path
(issue #16 item 6).

For every spec with a reference tower, the generated standalone mixin is
captured (``tiny``, fp32, :class:`EagerReplayGraphBackend`) twice: with the
default ladder, where two small images replay a graph, and with the
eager-fallback ladder of the equivalence driver, where two images above its
largest budget run the eager forward. Each corruption of those batches
(``input_corruptions``) must stop ``execute`` with the ``ValueError`` that
names the input, before any forward runs; the clean batches run their path
and match the tower (control).
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import equivalence_driver as drv
from encoder_cudagraph_runtime.config import MultiModalConfig
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from generator.resolve import load_spec
from input_corruptions import corruptions
from reference_towers.registry import REFERENCE_TOWERS

STEMS = drv.discover_spec_stems()
PATHS = ("graph", "eager")


@dataclass(frozen=True)
class Setup:
    host: Any
    manager: Any
    mm_kwargs: dict[str, Any]
    #: Graph hits the batch counts: vLLM's manager counts every item once per
    #: path that replays (a path no item has rows on does not replay).
    path_replays: int = 0


def _setup(stem: str, path: str) -> Setup:
    tower = REFERENCE_TOWERS[stem]
    mm_config = MultiModalConfig()
    host = drv.build_host(
        stem, "tiny", device="cpu", dtype=torch.float32, multimodal_config=mm_config
    )
    rng = random.Random(3)
    if path == "graph":
        config = drv.build_vllm_config("tiny", multimodal_config=mm_config)
        items = [tower.smallest_item("tiny"), tower.legal_grid(rng, "tiny")]
    else:
        budgets, max_items = drv.eager_ladder(tower, "tiny", 4)
        config = drv.build_vllm_config(
            "tiny",
            token_budgets=budgets,
            max_items_per_batch=max_items,
            multimodal_config=mm_config,
        )
        cap = tower.max_budget_tokens("tiny")
        items = [tower.budget_item(rng, "tiny", budget_tokens=cap) for _ in range(2)]
    manager = drv.build_manager(
        host,
        config,
        device="cpu",
        dtype=torch.float32,
        graph_backend=EagerReplayGraphBackend(),
    )
    manager.capture()
    replayed = {
        p for item in items for p, rows in tower.path_tokens(item).items() if rows
    }
    replays = len(items) * len(replayed)
    return Setup(
        host, manager, tower.make_mm_kwargs(host, items, "cpu", seed=4), replays
    )


@pytest.fixture(scope="module")
def setups() -> dict[tuple[str, str], Setup]:
    return {}


def setup_of(setups, stem: str, path: str) -> Setup:
    if (stem, path) not in setups:
        setups[(stem, path)] = _setup(stem, path)
    return setups[(stem, path)]


def _corruptions(stem: str, setup: Setup):
    spec = load_spec(drv.SPECS_DIR / f"{stem}.yaml")
    module = importlib.import_module(f"generated.standalone.{stem}")
    specs = setup.host.get_encoder_cudagraph_item_specs(setup.mm_kwargs)
    return corruptions(spec, module, setup.mm_kwargs, lambda i: specs[i].output_tokens)


def _case_names(stem: str) -> list[str]:
    """The corruption names of ``stem``, from the graph path's batch on an
    uncaptured host (the eager batch gives the same names)."""
    tower = REFERENCE_TOWERS[stem]
    host = drv.build_host(stem, "tiny", device="cpu", dtype=torch.float32)
    items = [tower.smallest_item("tiny"), tower.legal_grid(random.Random(3), "tiny")]
    mm_kwargs = tower.make_mm_kwargs(host, items, "cpu", seed=4)
    return [c.name for c in _corruptions(stem, Setup(host, None, mm_kwargs))]


CASES = [(stem, name) for stem in STEMS for name in _case_names(stem)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stem", STEMS)
def test_the_clean_batch_runs_its_path(setups, stem: str, path: str) -> None:
    setup = setup_of(setups, stem, path)
    hits, misses = setup.manager.graph_hits, setup.manager.graph_misses
    outputs = setup.manager.execute(setup.mm_kwargs)
    expected = REFERENCE_TOWERS[stem].reference_outputs(setup.host, setup.mm_kwargs)
    for out, ref in zip(outputs, expected, strict=True):
        torch.testing.assert_close(
            out, ref, rtol=0, atol=1e-4 * max(1, ref.abs().max())
        )
    if path == "graph":
        assert setup.manager.graph_misses == misses
        assert setup.manager.graph_hits - hits == setup.path_replays
    else:
        # A ladder below the largest item sends every item of a one-path
        # model eagerly. A two-path model (Step3-VL) counts its items by the
        # paths that replay; its eager case checks the values above only.
        if len(REFERENCE_TOWERS[stem].paths) == 1:
            assert setup.manager.graph_hits == hits
            assert setup.manager.graph_misses - misses == len(outputs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stem,case", CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_execute_refuses(setups, stem: str, case: str, path: str) -> None:
    setup = setup_of(setups, stem, path)
    bad = next(c for c in _corruptions(stem, setup) if c.name == case)
    with pytest.raises(ValueError, match=bad.pattern):
        setup.manager.execute(bad.mm_kwargs)
