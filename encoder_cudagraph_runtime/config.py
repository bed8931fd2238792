"""Duck-typed stand-ins for the parts of vLLM 0.33.0's ``VllmConfig`` that
encoder CUDA graph mixins and the manager read.

Attribute names and defaults follow vLLM 0.33.0 (``vllm/config/*.py``); only
the fields on the encoder graph path exist. Negative or inconsistent values
are rejected the way vLLM's config validation rejects them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# vLLM returns 999 for a modality the user gave no limit for.
DEFAULT_LIMIT_PER_PROMPT = 999


@dataclass
class MultiModalConfig:
    """``vllm.config.multimodal.MultiModalConfig``, encoder graph fields only."""

    limit_per_prompt: dict[str, int] = field(default_factory=dict)
    """Items per prompt by modality; missing modalities get 999."""

    language_model_only: bool = False
    """When set, every modality's limit is 0 (the towers are not built)."""

    mm_encoder_tp_mode: Literal["weights", "data"] = "weights"
    mm_encoder_attn_dtype: Literal["fp8"] | None = None
    mm_encoder_fp8_scale_path: str | None = None
    mm_processor_kwargs: dict[str, object] | None = None
    """Overrides of the HF processor's arguments (LFM2-VL's min_image_tokens)."""

    def __post_init__(self) -> None:
        if self.mm_encoder_tp_mode not in ("weights", "data"):
            raise ValueError(
                f"mm_encoder_tp_mode must be 'weights' or 'data', "
                f"got {self.mm_encoder_tp_mode!r}"
            )
        for modality, limit in self.limit_per_prompt.items():
            if limit < 0:
                raise ValueError(
                    f"limit_per_prompt[{modality!r}] must be >= 0, got {limit}"
                )

    def get_limit_per_prompt(self, modality: str) -> int:
        if self.language_model_only:
            return 0
        return self.limit_per_prompt.get(modality, DEFAULT_LIMIT_PER_PROMPT)


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 8192


@dataclass
class ModelConfig:
    max_model_len: int = 8192
    multimodal_config: MultiModalConfig | None = field(default_factory=MultiModalConfig)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1


@dataclass
class CompilationConfig:
    """The encoder CUDA graph fields of ``vllm.config.CompilationConfig``."""

    cudagraph_mm_encoder: bool = False
    encoder_cudagraph_token_budgets: list[int] = field(default_factory=list)
    encoder_cudagraph_max_vision_items_per_batch: int = 0
    encoder_cudagraph_max_frames_per_batch: int | None = None

    def __post_init__(self) -> None:
        for budget in self.encoder_cudagraph_token_budgets:
            if budget <= 0:
                raise ValueError(
                    "encoder_cudagraph_token_budgets must contain only "
                    f"positive values, got {budget}"
                )
        if self.encoder_cudagraph_max_vision_items_per_batch < 0:
            raise ValueError(
                "encoder_cudagraph_max_vision_items_per_batch must be >= 0, "
                f"got {self.encoder_cudagraph_max_vision_items_per_batch}"
            )
        if (
            self.encoder_cudagraph_max_frames_per_batch is not None
            and self.encoder_cudagraph_max_frames_per_batch < 0
        ):
            raise ValueError(
                "encoder_cudagraph_max_frames_per_batch must be >= 0, "
                f"got {self.encoder_cudagraph_max_frames_per_batch}"
            )


@dataclass
class VllmConfig:
    """``vllm.config.VllmConfig`` as far as encoder CUDA graphs read it."""

    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
