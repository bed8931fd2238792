"""Data classes, the protocol and the small vLLM helpers of the runtime."""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest
import torch

from encoder_cudagraph_runtime import defs
from encoder_cudagraph_runtime.defs import (
    ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG,
    EncoderCudaGraphConfig,
    EncoderCudaGraphPathConfig,
    EncoderItemSpec,
)
from encoder_cudagraph_runtime.host_transfer import async_tensor_h2d
from encoder_cudagraph_runtime.interfaces import (
    SupportsEncoderCudaGraph,
    supports_encoder_cudagraph,
)
from encoder_cudagraph_runtime.output_scatter import scatter_output_slices


class TestDefs:
    def test_axis_kwarg(self) -> None:
        assert ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG == "encoder_cudagraph_axis_keys"

    def test_item_spec_default_path_falls_back_to_output_tokens(self) -> None:
        spec = EncoderItemSpec(input_size=40, output_tokens=10)
        assert spec.path_output_tokens == {}
        assert spec.get_path_output_tokens("default") == 10
        assert spec.get_path_output_tokens("thumb") == 0

    def test_item_spec_with_path_dict(self) -> None:
        spec = EncoderItemSpec(
            input_size=40, output_tokens=13, path_output_tokens={"thumb": 3}
        )
        # A non-empty dict is authoritative, also for "default".
        assert spec.get_path_output_tokens("default") == 0
        assert spec.get_path_output_tokens("thumb") == 3

    def test_item_spec_dicts_not_shared(self) -> None:
        a = EncoderItemSpec(1, 1)
        b = EncoderItemSpec(1, 1)
        a.path_output_tokens["x"] = 1
        assert b.path_output_tokens == {}

    def test_path_config_frozen(self) -> None:
        cfg = EncoderCudaGraphPathConfig()
        assert (cfg.min_token_budget, cfg.allow_zero_tokens) == (None, False)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.min_token_budget = 3  # type: ignore[misc]
        assert hash(cfg) == hash(EncoderCudaGraphPathConfig())

    def test_config_defaults(self) -> None:
        cfg = EncoderCudaGraphConfig(
            modalities=["image"], buffer_keys=["x"], out_hidden_size=8
        )
        assert cfg.padding_logics == {}
        assert cfg.max_frames_per_video == 1
        assert cfg.paths == {"default": EncoderCudaGraphPathConfig()}
        assert cfg.capture_axes == ()
        other = EncoderCudaGraphConfig(modalities=[], buffer_keys=[], out_hidden_size=1)
        assert other.paths is not cfg.paths

    def test_field_order_matches_vllm(self) -> None:
        names = lambda cls: [f.name for f in dataclasses.fields(cls)]  # noqa: E731
        assert names(EncoderItemSpec) == [
            "input_size",
            "output_tokens",
            "path_output_tokens",
        ]
        assert names(EncoderCudaGraphPathConfig) == [
            "min_token_budget",
            "allow_zero_tokens",
        ]
        assert names(EncoderCudaGraphConfig) == [
            "modalities",
            "buffer_keys",
            "out_hidden_size",
            "padding_logics",
            "max_frames_per_video",
            "paths",
            "capture_axes",
        ]
        assert names(defs.EncoderCudaGraphCaptureInputs) == ["values"]
        assert names(defs.EncoderCudaGraphReplayBuffers) == ["values"]
        assert names(defs.BudgetGraphMetadata) == [
            "token_budget",
            "max_batch_size",
            "max_frames_per_batch",
            "graph",
            "input_buffers",
            "output_buffer",
            "axis_keys",
        ]


class Minimal(SupportsEncoderCudaGraph):
    """Inherits every default body."""


class Duck:
    """Implements every member without inheriting."""

    supports_encoder_cudagraph = True


for _name in [
    "get_encoder_cudagraph_config",
    "get_input_modality",
    "get_max_frames_per_video",
    "get_encoder_cudagraph_budget_range",
    "get_encoder_cudagraph_item_specs",
    "select_encoder_cudagraph_items",
    "postprocess_encoder_output",
    "prepare_encoder_cudagraph_capture_inputs",
    "prepare_encoder_cudagraph_replay_buffers",
    "encoder_cudagraph_forward",
    "encoder_eager_forward",
]:
    setattr(Duck, _name, lambda self, *a, **k: None)


class TestProtocol:
    def test_isinstance(self) -> None:
        assert supports_encoder_cudagraph(Minimal())
        assert supports_encoder_cudagraph(Duck())
        assert not supports_encoder_cudagraph(object())
        assert Minimal.supports_encoder_cudagraph is True

    def test_default_bodies(self) -> None:
        model = Minimal()
        assert model.get_input_modality({}) == "image"
        assert model.get_encoder_cudagraph_config() is None
        assert model.get_max_frames_per_video() is None
        assert model.get_encoder_cudagraph_item_specs({}) is None
        assert model.select_encoder_cudagraph_items({}, []) is None
        assert model.encoder_eager_forward({}) is None

    def test_default_postprocess_scatters_default_path(self) -> None:
        out = torch.arange(20.0).reshape(10, 2)
        dest: dict[int, torch.Tensor] = {}
        Minimal().postprocess_encoder_output(
            {"default": out, "other": torch.zeros(1)},
            [2, 0],
            [3, 5, 1],
            dest,
            clone=True,
        )
        # Item 2 owns rows 0..0, item 0 rows 1..3; rows 4.. are padding.
        torch.testing.assert_close(dest[2], out[0:1])
        torch.testing.assert_close(dest[0], out[1:4])
        assert dest[0].data_ptr() != out[1:4].data_ptr()
        assert set(dest) == {0, 2}


class TestScatter:
    def test_views_and_list_dest(self) -> None:
        out = torch.arange(12.0).reshape(6, 2)
        dest: list[torch.Tensor | None] = [None, None, None]
        scatter_output_slices(out, [1, 2, 0], [1, 2, 3], dest)
        assert dest[1] is not None and dest[2] is not None and dest[0] is not None
        torch.testing.assert_close(dest[1], out[0:2])  # item 1: 2 rows
        torch.testing.assert_close(dest[2], out[2:5])  # item 2: 3 rows
        torch.testing.assert_close(dest[0], out[5:6])  # item 0: 1 row
        # Without clone the slices alias the output.
        assert dest[1].data_ptr() == out.data_ptr()

    def test_zero_token_item(self) -> None:
        out = torch.ones(4, 2)
        dest: dict[int, torch.Tensor] = {}
        scatter_output_slices(out, [0, 1], [0, 2], dest, clone=True)
        assert dest[0].shape == (0, 2)
        assert dest[1].shape == (2, 2)


class TestAsyncH2D:
    def test_list_to_device(self) -> None:
        t = async_tensor_h2d([1, 2, 3], device="cpu", dtype=torch.int32)
        assert t.dtype == torch.int32 and t.tolist() == [1, 2, 3]

    def test_numpy(self) -> None:
        t = async_tensor_h2d(np.array([1.5, 2.5]), device="cpu")
        assert t.dtype == torch.float64 and t.tolist() == [1.5, 2.5]

    def test_tensor_with_dtype(self) -> None:
        t = async_tensor_h2d(torch.tensor([1, 2]), device="cpu", dtype=torch.float32)
        assert t.dtype == torch.float32 and t.tolist() == [1.0, 2.0]

    def test_into_out(self) -> None:
        out = torch.zeros(3, dtype=torch.int64)
        result = async_tensor_h2d([4, 5, 6], out=out)
        assert result is out and out.tolist() == [4, 5, 6]

    def test_out_dtype_mismatch(self) -> None:
        with pytest.raises(ValueError):
            async_tensor_h2d(
                [1], dtype=torch.float32, out=torch.zeros(1, dtype=torch.int64)
            )

    def test_needs_destination(self) -> None:
        with pytest.raises(ValueError):
            async_tensor_h2d([1])
