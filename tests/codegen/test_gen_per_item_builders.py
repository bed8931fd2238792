"""Per-item builders (``metadata: - per_item: true``) fill the buffers as
a vectorised builder does.

The valid-corpus spec ``per_item_builder.yaml`` builds Keye-VL's position
ids image by image (``arange(t * h * w) % (h * w)``) and each patch's frame
index. Its twin below builds the same two buffers over the whole batch at
once. Both generated standalone modules run on CPU through the runtime's
manager (capture at every budget of its ladder, selection, packing, the
replay copy, graph forward) on a fake tower whose output depends on every
input row, both buffers and the offsets; the outputs of the two modules and
the eager path must agree item by item, and a wrong per-item step must not.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from encoder_cudagraph_runtime.config import (  # noqa: E402
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.graph_backends import (  # noqa: E402
    EagerReplayGraphBackend,
)
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager  # noqa: E402
from generator.emit import render_spec  # noqa: E402
from genmixin_testlib import (  # noqa: E402
    DATA_DIR,
    GENERATED_DIR,
    load_generated_mixin,
)
from host_modules import FakeModule  # noqa: E402

SPEC = DATA_DIR / "valid" / "per_item_builder.yaml"
MERGE = 2
WIDTH = 12
OUT = 5

PER_ITEM = """\
  - per_item: true
    steps:
      - area = h * w
      - positions = torch.arange(t * area, device=device) % area
      - frames = torch.arange(t, device=device).repeat_interleave(area)
    provides: [positions, frames]
    why: The tower numbers each image's patches on its own, frame by frame.
"""
#: The same buffers over the whole batch: a row's position is its offset in
#: its frame, a frame's index its offset among its image's frames.
VECTORISED = """\
  - steps:
      - grid = torch.tensor(image_grid_thw, dtype=torch.int64).reshape(-1, 3)
      - areas = (grid[:, 1] * grid[:, 2]).repeat_interleave(grid[:, 0])
      - starts = (areas.cumsum(0) - areas).repeat_interleave(areas)
      - positions = (torch.arange(areas.sum()) - starts).to(device)
      - firsts = (grid[:, 0].cumsum(0) - grid[:, 0]).repeat_interleave(grid[:, 0])
      - frames = (torch.arange(areas.numel()) - firsts).repeat_interleave(areas).to(device)
    provides: [positions, frames]
"""


class Tower(FakeModule):
    """A fake tower: each patch row's value mixes its pixels, its position,
    its frame and its sequence's length (from ``cu_seqlens``); each token a
    weighted sum of ``MERGE**2`` consecutive rows, so a row out of place or
    a wrong id changes it."""

    merge = MERGE
    patch_dim = WIDTH
    out_hidden_size = OUT

    def __call__(self, pixel_values, positions, frames, cu_seqlens):
        lengths = cu_seqlens.diff().long()
        seq = torch.zeros(pixel_values.shape[0])
        covered = torch.repeat_interleave(lengths.float(), lengths)
        seq[: covered.numel()] = covered
        return self._tokens(pixel_values, positions, frames, seq)

    def encode(self, pixel_values, image_grid_thw):
        """The eager path: the ids image by image, from the grid."""
        positions, frames, seq = [], [], []
        for t, h, w in torch.as_tensor(image_grid_thw).tolist():
            positions.append(torch.arange(t * h * w) % (h * w))
            frames.append(torch.arange(t).repeat_interleave(h * w))
            seq.append(torch.full((t * h * w,), float(h * w)))
        return self._tokens(
            pixel_values, torch.cat(positions), torch.cat(frames), torch.cat(seq)
        )

    @staticmethod
    def _tokens(pixel_values, positions, frames, seq):
        weights = torch.linspace(1.0, 2.0, WIDTH)
        rows = pixel_values @ weights + 7 * positions + 1000 * frames + 0.01 * seq
        merged = rows.view(-1, MERGE * MERGE) @ torch.arange(1.0, MERGE**2 + 1)
        return merged[:, None] * torch.arange(1.0, OUT + 1)


def module_of(text: str, tmp_path: Path, name: str):
    """The standalone module generated from ``text``."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(text, encoding="utf-8")
    out = render_spec(spec, ("standalone",), GENERATED_DIR)[0].source
    module = tmp_path / f"{name}.py"
    module.write_text(out, encoding="utf-8")
    return load_generated_mixin(module, f"_genmixin_per_item_{name}")


def host_of(module):
    cls = type("Host", (module.PerItemPositionsEncoderCudaGraphMixin,), {})
    host = cls.__new__(cls)
    host.vision = Tower()
    return host


def manager_of(host, tokens: int = 256) -> EncoderCudaGraphManager:
    """vLLM's manager on its default ladder up to ``tokens``."""
    cfg = VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens=tokens),
        model_config=ModelConfig(
            max_model_len=tokens, multimodal_config=MultiModalConfig()
        ),
        compilation_config=CompilationConfig(
            cudagraph_mm_encoder=True, encoder_cudagraph_max_vision_items_per_batch=4
        ),
    )
    manager = EncoderCudaGraphManager(
        cfg,
        torch.device("cpu"),
        torch.float32,
        host,
        graph_backend=EagerReplayGraphBackend(),
    )
    manager.capture()
    return manager


def batch_of(rng: random.Random) -> dict:
    """One to four images of 1-3 frames of even sides, a batch the graphs
    take (at most 256 tokens)."""
    grids = []
    while not grids or sum(t * h * w // 4 for t, h, w in grids) > 200:
        grids = [
            (rng.randint(1, 3), 2 * rng.randint(1, 4), 2 * rng.randint(1, 5))
            for _ in range(rng.randint(1, 4))
        ]
    rows = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rows))
    return {"pixel_values": pixels, "image_grid_thw": torch.tensor(grids)}


@pytest.fixture(scope="module")
def modules(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("per_item")
    text = SPEC.read_text(encoding="utf-8")
    assert text.count(PER_ITEM) == 1
    return {
        "per_item": module_of(text, tmp, "per_item"),
        "vectorised": module_of(text.replace(PER_ITEM, VECTORISED), tmp, "vec"),
    }


def eager_items(batch: dict) -> list[torch.Tensor]:
    out = Tower().encode(batch["pixel_values"], batch["image_grid_thw"])
    tokens = [t * h * w // 4 for t, h, w in batch["image_grid_thw"].tolist()]
    return list(out.split(tokens))


@pytest.mark.parametrize("seed", range(4))
def test_per_item_and_vectorised_builders_replay_alike(modules, seed) -> None:
    """The same replay buffers, and through the manager the same outputs,
    item by item, equal to the eager path's."""
    rng = random.Random(seed)
    batch = batch_of(rng)
    hosts = {name: host_of(m) for name, m in modules.items()}
    buffers = {
        name: h.prepare_encoder_cudagraph_replay_buffers(batch, 4, 1).values
        for name, h in hosts.items()
    }
    for key, value in buffers["vectorised"].items():
        assert torch.equal(buffers["per_item"][key], value), key
    want = eager_items(batch)
    for name, host in hosts.items():
        manager = manager_of(host)
        got = manager.execute(batch)
        assert manager.graph_hits > 0, name
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert torch.allclose(g, w), f"{name}: item {i}"


@pytest.mark.parametrize(("budget", "mbs"), [(4, 1), (64, 3), (256, 4)])
def test_per_item_and_vectorised_builders_capture_alike(modules, budget, mbs):
    """The dummy batch's buffers are the same too."""
    got = {
        name: host_of(m)
        .prepare_encoder_cudagraph_capture_inputs(
            budget, mbs, 1, torch.device("cpu"), torch.float32
        )
        .values
        for name, m in modules.items()
    }
    for key in ("positions", "frames", "cu_seqlens"):
        assert torch.equal(got["per_item"][key], got["vectorised"][key]), key


#: Wrong per-item steps, each caught by the outputs.
MUTATIONS = [
    ("% area", "% w"),  # positions restart every row, not every frame
    ("torch.arange(t, device=device)", "torch.zeros(t, dtype=torch.int64)"),
    ("area = h * w", "area = h * w + 0 * t + 1"),
]


@pytest.mark.parametrize(("old", "new"), MUTATIONS)
def test_a_wrong_per_item_step_is_caught(tmp_path, old, new) -> None:
    text = SPEC.read_text(encoding="utf-8")
    assert text.count(old) == 1
    module = module_of(text.replace(old, new), tmp_path, "mutant")
    batch = batch_of(random.Random(1))
    batch["image_grid_thw"] = torch.tensor([[2, 4, 6], [1, 2, 2]])
    batch["pixel_values"] = torch.randn(52, WIDTH)
    try:
        got = manager_of(host_of(module)).execute(batch)
    except RuntimeError:
        return  # a shape mismatch stops it too
    want = eager_items(batch)
    assert any(not torch.allclose(g, w) for g, w in zip(got, want, strict=True))


# -- a tensors input's item --------------------------------------------------------

TENSORS_SPEC = DATA_DIR / "valid" / "per_item_tensors.yaml"


class TensorVision(FakeModule):
    patch, channels, side, out_hidden_size = 2, 3, 4, OUT


@pytest.fixture(scope="module")
def tensors_module(tmp_path_factory):
    text = TENSORS_SPEC.read_text(encoding="utf-8")
    return module_of(text, tmp_path_factory.mktemp("tensors"), "tensors")


def tensors_host(module):
    cls = type("Host", (module.PerItemTensorsEncoderCudaGraphMixin,), {})
    host = cls.__new__(cls)
    host.vision = TensorVision()
    return host


#: Images as (h, w) pixels: a list of several sizes, or alike (stackable).
IMAGES = [[(2, 8), (4, 4), (2, 4)], [(4, 8), (4, 8)], [(6, 12)]]


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "stacked"])
@pytest.mark.parametrize("sizes", IMAGES)
def test_a_per_item_builder_reads_each_items_own_tensor(
    tensors_module, sizes, stacked
) -> None:
    """Under the input's name the steps see each image's own pixels (not
    another's, not the padding of a stacked batch): each token carries its
    image's mean absolute pixel, images in order."""
    if stacked and len(set(sizes)) > 1:
        pytest.skip("only images of one size stack")
    images = [torch.randn(3, h, w) * (i + 1) for i, (h, w) in enumerate(sizes)]
    value = torch.stack(images) if stacked else images
    replay = tensors_host(tensors_module).prepare_encoder_cudagraph_replay_buffers(
        {"pixel_values": value}, 4, 1
    )
    want = torch.cat(
        [
            img.abs().mean().repeat((h // 2) * (w // 4))
            for img, (h, w) in zip(images, sizes)
        ]
    )
    assert torch.allclose(replay.values["image_scale"], want)


def test_a_per_item_builder_reads_each_dummy_item_cut_to_its_sizes(tensors_module):
    """At capture each dummy image (2 x 4 pixels, one token) is its row of
    the capture tensor (random pixels) cut to the dummy sizes: one token
    each, then padding."""
    capture = tensors_host(tensors_module).prepare_encoder_cudagraph_capture_inputs(
        16, 4, 1, torch.device("cpu"), torch.float32
    )
    pixels, scale = capture.values["pixel_values"], capture.values["image_scale"]
    want = torch.stack([pixels[i, :, :2, :4].abs().mean() for i in range(4)])
    assert scale.shape == (16,)
    assert torch.allclose(scale[:4], want)
    assert torch.equal(scale[4:], torch.zeros(12))
    assert not torch.allclose(want, pixels[:4].abs().mean(dim=(1, 2, 3)))
