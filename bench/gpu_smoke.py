"""First look at a GPU machine: versions, the FlashAttention varlen kernel,
and one captured + replayed varlen attention compared with eager.

    PYTHONPATH=. python bench/gpu_smoke.py
    PYTHONPATH=. python bench/gpu_smoke.py --device cpu   # the script itself, no graph
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from encoder_cudagraph_runtime.attention_backends import AttentionBackendEnum
from encoder_cudagraph_runtime.varlen_attention import (
    flash_varlen_kernel_name,
    varlen_attention,
)


def cpu_main() -> int:
    """The attention check on the CPU (both backends take the per-sequence
    SDPA path there), so that the stage itself is exercised without a GPU."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(300, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 100, 220, 300], dtype=torch.int32)
    flash = varlen_attention(q, k, v, cu, 120, backend=AttentionBackendEnum.FLASH_ATTN)
    sdpa = varlen_attention(q, k, v, cu, 120, backend=AttentionBackendEnum.TORCH_SDPA)
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": "cpu",
        "flash_vs_sdpa_max_abs": (flash - sdpa).abs().max().item(),
    }
    print(json.dumps(info, indent=2))
    return 0 if info["flash_vs_sdpa_max_abs"] < 1e-6 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    if parser.parse_args(argv).device == "cpu":
        return cpu_main()
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0),
        "device_count": torch.cuda.device_count(),
        "flash_varlen": flash_varlen_kernel_name(),
    }
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows, heads, dim = 1000, 8, 64
    q, k, v = (
        torch.randn(rows, heads, dim, device=dev, dtype=torch.bfloat16)
        for _ in range(3)
    )
    cu = torch.tensor([0, 100, 350, 1000], dtype=torch.int32, device=dev)
    eager = varlen_attention(q, k, v, cu, 650, backend=AttentionBackendEnum.FLASH_ATTN)
    ref = varlen_attention(q, k, v, cu, 650, backend=AttentionBackendEnum.TORCH_SDPA)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        varlen_attention(q, k, v, cu, 1000, backend=AttentionBackendEnum.FLASH_ATTN)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = varlen_attention(
            q, k, v, cu, 1000, backend=AttentionBackendEnum.FLASH_ATTN
        )
    cu.copy_(torch.tensor([0, 100, 350, 900], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    info["eager_vs_sdpa_max_abs"] = (eager.float() - ref.float()).abs().max().item()
    info["graph_rows_past_end_zero"] = bool((out[900:] == 0).all().item())
    ref2 = varlen_attention(q, k, v, cu, 900, backend=AttentionBackendEnum.TORCH_SDPA)
    info["graph_vs_sdpa_max_abs"] = (
        (out[:900].float() - ref2[:900].float()).abs().max().item()
    )
    info["finite"] = bool(torch.isfinite(out).all().item())
    print(json.dumps(info, indent=2))
    ok = (
        info["finite"]
        and info["graph_vs_sdpa_max_abs"] < 2e-2
        and info["graph_rows_past_end_zero"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
