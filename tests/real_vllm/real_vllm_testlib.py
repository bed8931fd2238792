"""What the real-vLLM tests share: vLLM 0.33.0 on a CPU, its model classes
built from tiny random configs, and stand-ins for the two things a CPU lacks.

- ``_C::gelu_quick``: the one compiled op a vision tower looks up at
  construction (``QuickGELU``); the CPU build of vLLM has no ``_C`` library.
- ``torch.accelerator.get_memory_info``: the host's memory where no GPU
  driver answers (:func:`install_memory_info`).
- FlashAttention's varlen kernel (:func:`varlen_attention`): the generated
  mixins capture with a FlashAttention backend, whose ``cu_seqlens`` may end
  in repeated offsets past the batch's rows, which PyTorch's SDPA path cannot
  split. The stand-in runs each sequence ``[cu[i], cu[i + 1])`` with SDPA, leaves
  rows past the last offset at zero and records offsets that go down
  (:data:`DECREASING_OFFSETS`), which FlashAttention would read as negative
  lengths.
- CUDA graphs (:func:`fake_cuda_graphs`): ``torch.cuda.CUDAGraph`` and
  ``torch.cuda.graph`` replaced while vLLM's own ``EncoderCudaGraphManager``
  captures; a replay re-runs the captured forward on the captured buffers and
  writes the captured output buffer, as a real replay would.

Everything here needs vLLM; the test modules skip without it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DECREASING_OFFSETS: list[list[int]] = []
"""Every ``cu_seqlens`` the stand-in saw go down (a copy of each)."""


def install_gelu_quick() -> None:
    """Register ``torch.ops._C.gelu_quick`` (out, x) once per process."""
    if hasattr(torch.ops, "_C") and hasattr(torch.ops._C, "gelu_quick"):
        return
    torch.library.define("_C::gelu_quick", "(Tensor(a!) out, Tensor x) -> ()")

    @torch.library.impl("_C::gelu_quick", "CPU")
    def _gelu_quick(out: torch.Tensor, x: torch.Tensor) -> None:
        out.copy_(x * torch.sigmoid(1.702 * x))


def install_memory_info() -> None:
    """``torch.accelerator.get_memory_info`` answers on a machine without a
    GPU driver (Gemma 4's eager image path sizes its chunks from it): the
    host's free and total memory (Linux's page counts)."""
    try:
        torch.accelerator.get_memory_info()
    except RuntimeError:

        def host_memory_info(device: Any = None) -> tuple[int, int]:
            page = os.sysconf("SC_PAGE_SIZE")
            free = os.sysconf("SC_AVPHYS_PAGES") * page
            return free, os.sysconf("SC_PHYS_PAGES") * page

        torch.accelerator.get_memory_info = host_memory_info


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    scale: float | None,
) -> torch.Tensor:
    """FlashAttention varlen semantics on ``(1, rows, heads, dim)`` inputs."""
    if cu_seqlens is None:
        offsets = [0, query.shape[1]]
    else:
        offsets = [int(v) for v in cu_seqlens.tolist()]
    if any(b < a for a, b in itertools.pairwise(offsets)):
        DECREASING_OFFSETS.append(offsets)
    out = torch.zeros_like(query)
    for start, end in itertools.pairwise(offsets):
        if end <= start:
            continue
        q, k, v = (t[:, start:end].transpose(1, 2) for t in (query, key, value))
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        out[:, start:end] = F.scaled_dot_product_attention(
            q, k, v, scale=scale
        ).transpose(1, 2)
    return out


@contextlib.contextmanager
def flash_attention_on_cpu() -> Iterator[None]:
    """vLLM's ``MMEncoderAttention`` runs :func:`varlen_attention` on the CPU."""
    from vllm.model_executor.layers.attention.mm_encoder_attention import (
        MMEncoderAttention,
    )

    # CustomOp binds forward_cpu at construction; the SDPA path it calls is
    # looked up at each call.
    def forward_sdpa(self, query, key, value, cu_seqlens=None):
        bsz, q_len = query.shape[:2]
        reshaped = query.dim() != 4
        query, key, value = self.view_qkv_to_4d(
            query, key, value, bsz, q_len, key.shape[1]
        )
        out = varlen_attention(query, key, value, cu_seqlens, self.scale)
        return out.reshape(bsz, q_len, -1) if reshaped else out

    saved = MMEncoderAttention._forward_sdpa
    MMEncoderAttention._forward_sdpa = forward_sdpa
    try:
        yield
    finally:
        MMEncoderAttention._forward_sdpa = saved


class _FakeGraph:
    """A ``torch.cuda.CUDAGraph`` stand-in bound to one manager."""

    manager: Any = None
    on_replay: Callable[[int], None] | None = None
    replays = 0

    def replay(self) -> None:
        for path, graphs in self.manager.budget_graphs.items():
            for meta in graphs.values():
                if meta.graph is self:
                    if self.on_replay is not None:
                        self.on_replay(meta.token_budget)
                    with torch.inference_mode():
                        out = self.manager.model.encoder_cudagraph_forward(
                            {**meta.input_buffers}, path=path
                        )
                        meta.output_buffer.copy_(out)
                    self.replays += 1
                    return
        raise AssertionError("replay of a graph that no budget holds")


@contextlib.contextmanager
def fake_cuda_graphs(
    manager: Any, on_replay: Callable[[int], None] | None = None
) -> Iterator[None]:
    """Capture and replay on the CPU through vLLM's own manager code;
    ``on_replay`` is told the budget of each replay."""
    graph_type = type(
        "CUDAGraph",
        (_FakeGraph,),
        {"manager": manager, "on_replay": staticmethod(on_replay)},
    )

    @contextlib.contextmanager
    def graph(cuda_graph: Any, pool: Any = None, stream: Any = None):
        assert isinstance(cuda_graph, graph_type)
        yield

    saved = torch.cuda.CUDAGraph, torch.cuda.graph
    torch.cuda.CUDAGraph, torch.cuda.graph = graph_type, graph
    try:
        yield
    finally:
        torch.cuda.CUDAGraph, torch.cuda.graph = saved


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_VLLM_CONFIGS: dict[str, Any] = {}


def vllm_config(
    hf_config: Any, save_processor: Callable[[str], None], **compilation: Any
) -> Any:
    """A ``VllmConfig`` of ``hf_config`` (saved to a temporary folder with the
    processor ``save_processor`` writes there), in float32 on the CPU, and a
    gloo world of one (initialised once)."""
    from vllm.config import CompilationConfig, ModelConfig, VllmConfig
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state

    folder = tempfile.mkdtemp(prefix="gen-mixin-real-vllm-")
    hf_config.save_pretrained(folder)
    save_processor(folder)
    model_config = ModelConfig(
        model=folder,
        tokenizer=folder,
        dtype="float32",
        max_model_len=2048,
        enforce_eager=True,
        limit_mm_per_prompt={"image": 8, "video": 2},
    )
    config = VllmConfig(
        model_config=model_config,
        compilation_config=CompilationConfig(**compilation),
    )
    with set_current_vllm_config(config):
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
                backend="gloo",
            )
            parallel_state.initialize_model_parallel(1, 1)
    return config


def build_model(model_class: type, config: Any, prefix: str, seed: int = 0) -> Any:
    """``model_class`` built from ``config`` with random weights, in eval mode.

    Two models in one process need different ``prefix``es (vLLM registers
    each layer by its prefix)."""
    from vllm.config import set_current_vllm_config

    install_gelu_quick()
    install_memory_info()
    torch.manual_seed(seed)
    with set_current_vllm_config(config), torch.device("cpu"):
        model = model_class(vllm_config=config, prefix=prefix)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dtype.is_floating_point:
                # Norm scales near 1, everything else small: activations stay
                # of order one through a few random layers.
                is_scale = "norm" in name and name.endswith("weight")
                param.normal_(1.0 if is_scale else 0.0, 0.05)
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
    return model.eval()


def registered_class(stem: str) -> type:
    """The class vLLM's ``ModelRegistry`` gives for the model of ``stem``
    once the plugin has registered it."""
    from vllm import ModelRegistry

    from gen_mixin_vllm import register
    from gen_mixin_vllm.catalog import CATALOG

    register(ModelRegistry, {"GEN_MIXIN_MODELS": stem})
    model_class = ModelRegistry._try_load_model_cls(CATALOG[stem].architectures[0])
    assert model_class is not None and model_class.gen_mixin_stem == stem
    return model_class


def with_flash_attention(model: Any) -> Any:
    """Every attention of ``model`` says FlashAttention (what the mixins
    capture with on a GPU); :func:`flash_attention_on_cpu` runs it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for module in model.modules():
        if hasattr(module, "attn_backend"):
            module.attn_backend = AttentionBackendEnum.FLASH_ATTN
    return model


@contextlib.contextmanager
def captured_manager(config: Any, model: Any) -> Iterator[Any]:
    """vLLM 0.33.0's own ``EncoderCudaGraphManager`` for ``model``, captured
    with faked graphs, its attention on the CPU stand-in."""
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager

    with flash_attention_on_cpu():
        manager = EncoderCudaGraphManager(
            config, torch.device("cpu"), torch.float32, model
        )
        with fake_cuda_graphs(manager):
            manager.capture(graph_pool=None)
            yield manager


def execute(manager: Any, mm_kwargs: dict) -> list[torch.Tensor]:
    """``manager.execute`` in inference mode, as vLLM's model runner calls it."""
    with torch.inference_mode():
        return manager.execute(mm_kwargs)
