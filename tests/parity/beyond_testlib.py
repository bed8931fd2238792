"""The oracle check of specs for models vLLM 0.33.0 does not graph.

Such a model has no hand-written mixin to compare with, so the oracle is the
model's own eager path in vLLM: a host class is made of the model's vLLM
methods, read from the wheel (``parity_testlib.WheelCode``), on top of the
generated mixin. Only learned layers are fakes (``beyond_hosts``), each
built so that its output depends on every input row it should read and on
the metadata it is given.

:func:`oracle_problems` drives the host through vLLM's own
``EncoderCudaGraphManager`` (from the wheel, CPU capture:
``parity_testlib.vllm_cpu_manager_class``, whose replays read 0-d buffers
such as ``max_seqlen`` as captured, as a CUDA graph's kernel launches do),
or through this project's runtime manager on the ``standalone`` module, on
vLLM's default budget ladder: item specs, packing, selection, capture at
every budget, replay buffers, the replay copy with the config's padding
logics, the graph forward and the post-processing. Every item the manager
returns must equal what the model's own eager method returns for it on the
same batch, and so must the generated ``encoder_eager_forward``; under every
attention backend the model distinguishes. :func:`mutated_source` renders a
spec with one edit and :func:`edited_module_source` edits a generated
module, so a test can show that the check fails for a wrong mixin.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from encoder_cudagraph_runtime.budget_ladder import generate_budgets
from encoder_cudagraph_runtime.config import (
    CompilationConfig,
    ModelConfig,
    MultiModalConfig,
    SchedulerConfig,
    VllmConfig,
)
from encoder_cudagraph_runtime.graph_backends import EagerReplayGraphBackend
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager
from parity_testlib import (
    REPO,
    WheelCode,
    load_generated_vllm_module,
    protocol_stubs,
    vllm_cpu_manager_class,
    vllm_module_from_source,
    vllm_wheel,
    with_protocol,
)

CPU = torch.device("cpu")
SPECS = REPO / "specs"

#: The managers that drive a check: vLLM 0.33.0's own, from the wheel, on the
#: generated ``vllm`` module; this project's runtime manager (CPU graph
#: backend) on the generated ``standalone`` module.
MANAGERS = ("vllm", "runtime")


@dataclasses.dataclass(frozen=True)
class OracleModel:
    """One model's oracle setup."""

    stem: str  # the spec's stem
    #: Bindings that replace vLLM's, per module (what cannot run on CPU).
    stubs: Mapping[str, Mapping[str, Any]]
    #: The host class: the model's own vLLM methods on top of the mixin.
    host_class: Callable[[WheelCode, type], type]
    #: A host instance of the class, under one attention backend.
    make_host: Callable[[WheelCode, type, str], Any]
    #: vLLM's eager path: the embeddings of every item of a batch, in order.
    eager: Callable[[Any, dict[str, Any]], list[torch.Tensor]]
    #: Seeded batches of ``mm_kwargs``, as vLLM's processor hands them over.
    batches: Callable[[], list[dict[str, Any]]]
    #: The attention backends the model's code distinguishes.
    backends: tuple[str, ...] = ("FLASH_ATTN",)
    #: The largest budget of the default ladder (small: CPU time).
    max_num_batched_tokens: int = 48
    #: What the host's fake attention recorded against its contract
    #: (decreasing offsets, offsets past the rows, ``max_seqlen`` too
    #: small), by kind; reset per batch.
    violations: Callable[[Any], dict[str, list[str]]] = lambda host: {}


class Mutation(NamedTuple):
    """One wrong edit of a spec (or of a generated module) that the check
    must catch: ``old`` (which must occur once) replaced by ``new``."""

    why: str  # what is wrong: the case's name
    old: str
    new: str
    #: The oracle forms that show it (every form when empty).
    forms: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class OracleCases:
    """One model's table of cases for the oracle check."""

    #: The oracle's forms: a name (empty for a model of one form) and the
    #: keyword arguments of its function in ``beyond_hosts``; the first form
    #: answers the backend refusals.
    forms: Mapping[str, Mapping[str, Any]] = dataclasses.field(
        default_factory=lambda: {"": {}}
    )
    #: The managers that drive the check (:data:`MANAGERS`).
    managers: tuple[str, ...] = MANAGERS
    #: The backends the spec guards: refused before any capture.
    refused: tuple[str, ...] = ()
    #: Wrong specs that still generate.
    spec_mutations: tuple[Mutation, ...] = ()
    #: Wrong modules that no spec can ask for (the static checks refuse it).
    module_edits: tuple[Mutation, ...] = ()


def wheel_code(model: OracleModel) -> WheelCode:
    """vLLM's code for ``model``, with the protocol and the model's stubs."""
    stubs = protocol_stubs()
    for module, names in model.stubs.items():
        stubs.setdefault(module, {}).update(names)
    return with_protocol(WheelCode(vllm_wheel(), stubs))


def mixin_class(module: Any) -> type:
    """The one mixin class a generated module defines."""
    (found,) = [
        value
        for name, value in vars(module).items()
        if isinstance(value, type) and name.endswith("EncoderCudaGraphMixin")
    ]
    return found


def mutated_source(stem: str, old: str, new: str, folder: Path) -> str:
    """The ``vllm`` module of ``specs/<stem>.yaml`` with ``old`` (which must
    occur once) replaced by ``new``, rendered in memory (the spec must still
    be valid: the point is a wrong spec that generates)."""
    from generator.emit import render_spec

    text = (SPECS / f"{stem}.yaml").read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    path = folder / f"{stem}.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    (rendered,) = render_spec(path, ("vllm",), folder)
    return rendered.source


def edited_module_source(stem: str, old: str, new: str) -> str:
    """``generated/vllm/<stem>.py`` with ``old`` (which must occur once)
    replaced by ``new``: a wrong module that no spec can ask for today (the
    static checks refuse it), to show what the check would catch."""
    text = (REPO / "generated" / "vllm" / f"{stem}.py").read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def vllm_config(max_num_batched_tokens: int) -> VllmConfig:
    """A config with vLLM's defaults but the scheduler's token limit: the
    manager derives its default budget ladder from the model's range."""
    return VllmConfig(
        scheduler_config=SchedulerConfig(max_num_batched_tokens),
        model_config=ModelConfig(
            max_model_len=8192, multimodal_config=MultiModalConfig()
        ),
        compilation_config=CompilationConfig(cudagraph_mm_encoder=True),
    )


def _item_problems(
    where: str, got: list[torch.Tensor], expected: list[torch.Tensor]
) -> list[str]:
    if len(got) != len(expected):
        return [f"{where}: {len(got)} items, vLLM's eager path gives {len(expected)}"]
    out = []
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if a is None or a.shape != b.shape:
            shape = None if a is None else tuple(a.shape)
            out.append(f"{where}: item {i} has shape {shape}, not {tuple(b.shape)}")
        elif not torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-5):
            worst = (a.float() - b.float()).abs().nan_to_num(float("inf")).max()
            out.append(f"{where}: item {i} differs by up to {float(worst):.3g}")
    return out


def _eager_items(host: Any, batch: dict[str, Any]) -> list:
    """The generated ``encoder_eager_forward``'s rows of ``batch``, post-processed
    as the manager does an eager batch (the HD transform of Phi-4-multimodal's
    spec runs there; without post-processing steps, a split into items)."""
    tokens = [s.output_tokens for s in host.get_encoder_cudagraph_item_specs(batch)]
    indices = list(range(len(tokens)))
    selected = host.select_encoder_cudagraph_items(batch, indices)
    dest: dict[int, torch.Tensor] = {}
    host.postprocess_encoder_output(
        {"default": host.encoder_eager_forward(selected)},
        indices,
        tokens,
        dest,
        clone=True,
        batch_mm_kwargs=selected,
    )
    return [dest.get(i) for i in indices]


def oracle_problems(
    model: OracleModel, source: str | None = None, manager: str = "vllm"
) -> list[str]:
    """Every way the generated mixin (``generated/<target>/<stem>.py``, or a
    ``vllm`` module's ``source``) differs from vLLM's eager path on
    ``model``'s batches, with graphs at every budget of the default ladder,
    under each backend, driven by ``manager`` (one of :data:`MANAGERS`)."""
    code = wheel_code(model)
    if manager == "runtime":
        assert source is None, "an edited source is a vllm module"
        module = importlib.import_module(f"generated.standalone.{model.stem}")
    elif source is None:
        module = load_generated_vllm_module(model.stem, code)
    else:
        path = REPO / "generated" / "vllm" / f"{model.stem}.py"
        module = vllm_module_from_source(f"_beyond_{model.stem}", source, path, code)
    host_class = model.host_class(code, mixin_class(module))
    problems: list[str] = []
    for backend in model.backends:
        try:
            problems += _backend_problems(model, host_class, code, backend, manager)
        except Exception as exc:  # a wrong spec may fail anywhere: a problem
            problems.append(f"{backend}: {type(exc).__name__}: {exc}")
    return problems


def backend_refusal(model: OracleModel, backend: str) -> str | None:
    """Why vLLM's manager cannot be built for the generated mixin under
    ``backend`` (a backend guard's message), or None if it can."""
    code = wheel_code(model)
    mixin = mixin_class(load_generated_vllm_module(model.stem, code))
    host = model.make_host(code, model.host_class(code, mixin), backend)
    config = vllm_config(model.max_num_batched_tokens)
    try:
        vllm_cpu_manager_class(freeze_host_scalars=True)(
            config, CPU, torch.float32, host
        )
    except ValueError as exc:
        return str(exc)
    return None


def _manager(kind: str, config: VllmConfig, host: Any) -> Any:
    """A captured manager of ``kind`` for ``host``."""
    if kind == "runtime":
        made = EncoderCudaGraphManager(
            config, CPU, torch.float32, host, graph_backend=EagerReplayGraphBackend()
        )
        made.capture()
        return made
    manager_class = vllm_cpu_manager_class(freeze_host_scalars=True)
    made = manager_class(config, CPU, torch.float32, host)
    made.capture(None)
    return made


def _backend_problems(
    model: OracleModel, host_class: type, code: WheelCode, backend: str, kind: str
) -> list[str]:
    host = model.make_host(code, host_class, backend)
    config = vllm_config(model.max_num_batched_tokens)
    low, high = host.get_encoder_cudagraph_budget_range(config)
    manager = _manager(kind, config, host)
    problems = []
    if manager.token_budgets != generate_budgets(low, high):
        problems.append(f"{backend}: ladder {manager.token_budgets}")
    for b, batch in enumerate(model.batches()):
        where = f"{backend}/batch {b}"
        with torch.inference_mode():
            expected = model.eager(host, batch)
            eager = _eager_items(host, batch)
            got = manager.execute(batch)
        problems += _item_problems(f"{where}/eager forward", eager, expected)
        problems += _item_problems(f"{where}/graphs", got, expected)
        recorded = model.violations(host)
        problems += [f"{where}: {kind}: {v[0]}" for kind, v in recorded.items()]
        recorded.clear()
    if manager.graph_hits == 0:
        problems.append(f"{backend}: no item replayed a graph")
    return problems
