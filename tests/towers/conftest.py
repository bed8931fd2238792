"""Shared fixtures of the reference-tower tests (CPU, fp32, ``tiny``)."""

from __future__ import annotations

import zipfile

import pytest
import torch
from tower_testlib import PlainMixin
from towers_vllm_source import VllmSource, wheel_path

from reference_towers.deepseek_v4 import DeepseekV41VisionHost
from reference_towers.internvl import InternVLVisionHost
from reference_towers.kimi_k25 import KimiK25VisionHost
from reference_towers.kimi_vl import KimiVLVisionHost
from reference_towers.minicpmv import MiniCPMVVisionHost
from reference_towers.minimax_vl import MiniMaxM3VisionHost
from reference_towers.mistral3 import Mistral3VisionHost
from reference_towers.pixtral import PixtralVisionHost
from reference_towers.qwen2_5_vl import Qwen2_5_VLVisionHost
from reference_towers.qwen2_vl import Qwen2VLVisionHost
from reference_towers.registry import REFERENCE_TOWERS
from reference_towers.step3_vl import Step3VLVisionHost


@pytest.fixture(scope="session")
def deepseek_host() -> DeepseekV41VisionHost:
    return REFERENCE_TOWERS["deepseek_v41"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def minimax_host() -> MiniMaxM3VisionHost:
    return REFERENCE_TOWERS["minimax_m3"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def qwen2_vl_host() -> Qwen2VLVisionHost:
    return REFERENCE_TOWERS["qwen2_vl"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def qwen2_5_vl_host() -> Qwen2_5_VLVisionHost:
    return REFERENCE_TOWERS["qwen2_5_vl"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def kimi_vl_host() -> KimiVLVisionHost:
    return REFERENCE_TOWERS["kimi_vl"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def kimi_k25_host() -> KimiK25VisionHost:
    return REFERENCE_TOWERS["kimi_k25"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def minicpmv_host() -> MiniCPMVVisionHost:
    return REFERENCE_TOWERS["minicpmv"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def pixtral_host() -> PixtralVisionHost:
    return REFERENCE_TOWERS["pixtral"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def mistral3_host() -> Mistral3VisionHost:
    return REFERENCE_TOWERS["mistral3"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def internvl_host() -> InternVLVisionHost:
    return REFERENCE_TOWERS["internvl"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def step3_vl_host() -> Step3VLVisionHost:
    return REFERENCE_TOWERS["step3_vl"].build_host(
        PlainMixin, "tiny", device="cpu", dtype=torch.float32, seed=0
    )


@pytest.fixture(scope="session")
def vllm_source() -> VllmSource:
    """vLLM 0.33.0's source from the wheel (see ``towers_vllm_source``)."""
    path = wheel_path()
    if path is None:
        pytest.skip(
            "vLLM 0.33.0 wheel not found: set GEN_MIXIN_VLLM_WHEEL or run "
            "`pip download vllm==0.33.0 --no-deps -d ~/.cache/gen-mixin`"
        )
    if not path.is_file():
        pytest.fail(f"GEN_MIXIN_VLLM_WHEEL={path} does not exist")
    with zipfile.ZipFile(path) as wheel:
        yield VllmSource(wheel)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield
