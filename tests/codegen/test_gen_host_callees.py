"""The generated check that a spec's callees under host modules are modules'
code (``_check_host_callees``), run on CPU against host towers of each shape.

A spec declares ``host_methods: [visual.merger]`` and loops over
``visual.blocks``; only the host says what ``visual`` and its parts are. The
generated module checks, once per model, before the capture or the first
batch runs anything, that every part of a declared path is a
``torch.nn.Module`` and the callee a submodule, a method bound to its module
or a static method of its class (a loop's list: a ``ModuleList`` or
``Sequential``), and raises a ``TypeError`` naming the declared path
otherwise. Each case below is a declared path, the host's shape there, and
the outcome.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from generator.emit import render_spec  # noqa: E402
from genmixin_testlib import (  # noqa: E402
    GENERATED_DIR,
    load_generated_mixin,
    load_standalone_mixin,
    mutated_spec,
)
from host_modules import FakeModule, ModuleOf  # noqa: E402

#: Qwen3-Omni's spec (four dotted callees under ``visual``, loops over
#: ``visual.blocks`` and ``visual.merger_list``), declaring one more callee
#: under the tower's config: the path the static checks cannot refuse.
SPEC = mutated_spec(
    "qwen3_omni",
    ("  - visual.merger\n", "  - visual.merger\n  - visual.config.save_pretrained\n"),
)


class _Config:
    """A model config: data with a file writer, no module."""

    def save_pretrained(self, path: str) -> None:
        raise AssertionError("a config's method ran")


class _ConfigModule(FakeModule):
    """A config-like part that is a module (what the check accepts)."""

    def save_pretrained(self, path: str) -> None:
        raise AssertionError("only checked, never called here")


class _Tower(FakeModule):
    """A tower of the shape every case starts from: each declared path a
    method or submodule of a module, each looped list a ModuleList."""

    def __init__(self) -> None:
        self.config = _ConfigModule()
        self.patch_embed = torch.nn.Identity()
        self.merger = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])
        self.merger_list = torch.nn.Sequential(torch.nn.Identity())

    def rot_pos_emb(self, grid: Any) -> Any:
        return grid

    @staticmethod
    def fast_pos_embed_interpolate(grid: Any) -> Any:
        return grid


def _set(path: str, value: Callable[[], Any]) -> Callable[[_Tower], None]:
    def mutate(tower: _Tower) -> None:
        setattr(tower, path, value())

    return mutate


def _other_module_method() -> Any:
    return _Tower().rot_pos_emb  # bound, but to another tower


# (case, declared path, host shape there, the message's end or None: accepted)
CASES = [
    ("as built", "every path", lambda tower: None, None),
    (
        "a callee under the config",
        "visual.config.save_pretrained",
        _set("config", _Config),
        "'visual.config.save_pretrained': visual.config is a _Config, not a "
        "torch.nn.Module",
    ),
    (
        "a plain function on the tower",
        "visual.rot_pos_emb",
        _set("rot_pos_emb", lambda: lambda grid: grid),
        "'visual.rot_pos_emb' is a function, not a submodule, a method bound to "
        "visual or a static method of its class",
    ),
    (
        "a method bound to another module",
        "visual.rot_pos_emb",
        _set("rot_pos_emb", _other_module_method),
        "'visual.rot_pos_emb' is a method, not a submodule",
    ),
    (
        "a builtin function on the tower",
        "visual.merger",
        _set("merger", lambda: print),
        "'visual.merger' is a builtin_function_or_method, not a submodule",
    ),
    (
        "a submodule replaced by a real module",
        "visual.patch_embed",
        _set("patch_embed", lambda: ModuleOf(lambda x: x)),
        None,
    ),
    (
        "an optional submodule left out",
        "visual.merger",
        _set("merger", lambda: None),
        None,
    ),
    (
        "a module list that is a Python list",
        "visual.blocks",
        _set("blocks", lambda: [torch.nn.Identity()]),
        "the module list 'visual.blocks' a loop runs over: visual.blocks is a "
        "list, not a torch.nn.Module",
    ),
    (
        "a module list that is a ModuleDict",
        "visual.merger_list",
        _set("merger_list", lambda: torch.nn.ModuleDict({"a": torch.nn.Identity()})),
        "is a ModuleDict, not a torch.nn.ModuleList or torch.nn.Sequential",
    ),
]


@pytest.fixture(scope="module")
def module(tmp_path_factory) -> Any:
    folder: Path = tmp_path_factory.mktemp("host_callees")
    spec = folder / "qwen3_omni_config_callee.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    source = render_spec(spec, ("standalone",), GENERATED_DIR)[0].source
    path = folder / "qwen3_omni_config_callee.py"
    path.write_text(source, encoding="utf-8")
    return load_generated_mixin(path, "_genmixin_host_callees")


def host_of(module: Any, tower: Any) -> Any:
    cls = type("Host", (module.Qwen3OmniEncoderCudaGraphMixin,), {})
    host = cls.__new__(cls)
    host.visual = tower
    return host


@pytest.mark.parametrize(
    ("case", "path", "mutate", "message"), CASES, ids=[c[0] for c in CASES]
)
def test_each_declared_callee_is_a_host_modules_code(
    module, case, path, mutate, message
) -> None:
    tower = _Tower()
    mutate(tower)
    host = host_of(module, tower)
    if message is None:
        host._check_host_callees()
        return
    with pytest.raises(TypeError) as err:
        host._check_host_callees()
    assert message in str(err.value)
    assert f"{path!r}" in str(err.value)


def test_the_root_itself_must_be_a_module(module) -> None:
    host = host_of(module, ModuleOf())
    host.visual = _Config()
    with pytest.raises(TypeError, match="'visual.rot_pos_emb': visual is a _Config"):
        host._check_host_callees()


def test_the_capture_and_every_batch_check_first(module) -> None:
    """Item specs (which every batch starts with) and the capture refuse the
    host before anything of it runs."""
    tower = _Tower()
    tower.config = _Config()
    host = host_of(module, tower)
    mm_kwargs = {
        "pixel_values": torch.zeros(4, 3),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
    }
    with pytest.raises(TypeError, match="visual.config is a _Config"):
        host.get_encoder_cudagraph_item_specs(mm_kwargs)
    with pytest.raises(TypeError, match="visual.config is a _Config"):
        host.prepare_encoder_cudagraph_capture_inputs(
            64, 1, 1, torch.device("cpu"), torch.float32
        )


def test_checked_once_per_model(module) -> None:
    """A host that passed is not walked again (one dictionary lookup per
    call); another host is checked on its own."""
    host = host_of(module, _Tower())
    host._check_host_callees()
    host.visual.config = _Config()
    host._check_host_callees()  # cached: the check ran once for this model
    with pytest.raises(TypeError, match="visual.config is a _Config"):
        host_of(module, host.visual)._check_host_callees()


# A tensor method under a module (LFM2-VL's position table, reshaped): its
# owner may be a tensor of the module, only where the path ends in one.
TENSOR_PATH = "vision_tower.vision_model.embeddings.position_embedding.weight.reshape"


def _lfm2_host(position_embedding: Any) -> Any:
    embeddings = ModuleOf(position_embedding=position_embedding)
    return ModuleOf(vision_tower=ModuleOf(vision_model=ModuleOf(embeddings=embeddings)))


TENSOR_CASES = [
    (
        "a parameter of an embedding",
        ModuleOf(weight=torch.nn.Parameter(torch.zeros(4, 2))),
        None,
    ),
    (
        "a tensor held by a config-like object",
        type("Holder", (), {"weight": torch.zeros(4, 2)})(),
        "vision_tower.vision_model.embeddings.position_embedding is a Holder, not a "
        "torch.nn.Module",
    ),
]


@pytest.mark.parametrize(
    ("case", "owner", "message"), TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES]
)
def test_a_tensor_method_is_bound_to_a_tensor_of_a_module(case, owner, message) -> None:
    lfm2 = load_standalone_mixin("lfm2_vl")
    host = _lfm2_host(owner)
    if message is None:
        lfm2._require_module_callee(host, TENSOR_PATH, tensor_method=True)
        return
    with pytest.raises(TypeError, match=message):
        lfm2._require_module_callee(host, TENSOR_PATH, tensor_method=True)


def test_a_tensor_owner_is_refused_where_the_callee_is_no_tensor_method() -> None:
    lfm2 = load_standalone_mixin("lfm2_vl")
    host = _lfm2_host(ModuleOf(weight=torch.nn.Parameter(torch.zeros(4, 2))))
    with pytest.raises(TypeError, match="weight is a Parameter, not a torch.nn.Module"):
        lfm2._require_module_callee(host, TENSOR_PATH)


# A loop's list may sit under an item of a module list (``in:
# visual.towers[0].blocks``): the item is a part like any other.
SUBSCRIPT_CASES = [
    ("towers a ModuleList", torch.nn.ModuleList, None),
    ("towers a Python list", list, "visual.towers is a list, not a torch.nn.Module"),
]


@pytest.mark.parametrize(
    ("case", "container", "message"),
    SUBSCRIPT_CASES,
    ids=[c[0] for c in SUBSCRIPT_CASES],
)
def test_a_module_list_under_a_subscript(module, case, container, message) -> None:
    tower = ModuleOf(blocks=torch.nn.ModuleList([torch.nn.Identity()]))
    host = ModuleOf(visual=ModuleOf(towers=container([tower])))
    if message is None:
        module._require_module_list(host, "visual.towers[0].blocks")
        return
    with pytest.raises(TypeError, match=message):
        module._require_module_list(host, "visual.towers[0].blocks")


def test_the_config_checks_first_where_it_calls_a_dotted_method(tmp_path) -> None:
    """``max_frames_per_video`` may call a method under a host module: the
    config (the manager's first call) then checks before it runs it; a
    config that calls none leaves the check to the capture and the batches
    (DeepSeek-V4.1's stubbed tower passes its config)."""
    text = mutated_spec(
        "qwen2_vl",
        (
            "host_methods: [get_max_frames_per_video,",
            "host_methods: [get_max_frames_per_video, visual.max_frames,",
        ),
        (
            "max_frames_per_video: get_max_frames_per_video()",
            "max_frames_per_video: visual.max_frames()",
        ),
    )
    spec = tmp_path / "qwen2_vl_frames.yaml"
    spec.write_text(text, encoding="utf-8")
    source = render_spec(spec, ("standalone",), GENERATED_DIR)[0].source
    path = tmp_path / "qwen2_vl_frames.py"
    path.write_text(source, encoding="utf-8")
    frames = load_generated_mixin(path, "_genmixin_host_callees_frames")
    cls = frames.Qwen2VLEncoderCudaGraphMixin
    host = cls.__new__(cls)
    host.visual = ModuleOf(max_frames=lambda: 4)  # a function, not a method
    with pytest.raises(TypeError, match="'visual.max_frames' is a function"):
        host.get_encoder_cudagraph_config()
    plain = load_standalone_mixin("qwen2_vl").Qwen2VLEncoderCudaGraphMixin
    assert "_check_host_callees()" not in inspect.getsource(
        plain.get_encoder_cudagraph_config
    )
