"""Budget and batch-size resolution of the manager (vLLM 0.33.0 rules).

Expected values are worked out by hand in the comments, not computed with
the code under test.
"""

from __future__ import annotations

import pytest
from runtime_fakes import FakeEncoder, make_manager

from encoder_cudagraph_runtime.defs import EncoderCudaGraphPathConfig
from encoder_cudagraph_runtime.manager import EncoderCudaGraphManager


class TestGenerateBudgets:
    def test_doubling_then_max_appended(self) -> None:
        # 64 doubles to 4096; 8192 > 5000 stops; 5000 is appended.
        assert EncoderCudaGraphManager._generate_budgets(64, 5000) == [
            64,
            128,
            256,
            512,
            1024,
            2048,
            4096,
            5000,
        ]

    def test_min_above_max_gives_only_max(self) -> None:
        assert EncoderCudaGraphManager._generate_budgets(100, 50) == [50]

    def test_power_of_two_end_not_duplicated(self) -> None:
        assert EncoderCudaGraphManager._generate_budgets(64, 4096) == [
            64,
            128,
            256,
            512,
            1024,
            2048,
            4096,
        ]

    def test_equal_bounds(self) -> None:
        assert EncoderCudaGraphManager._generate_budgets(7, 7) == [7]


class TestResolution:
    def test_user_budgets_and_items(self) -> None:
        model = FakeEncoder(budget_range=(8, 64))
        manager = make_manager(model, budgets=[256, 64, 128], max_items=16)
        assert manager.token_budgets == [64, 128, 256]
        assert manager.max_batch_size == 16
        # The model range is not consulted at all in this case.
        assert model.calls_named("budget_range") == []

    def test_user_items_above_smallest_budget_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="must be <= smallest token budget"):
            make_manager(budgets=[64, 128], max_items=65)

    def test_user_items_equal_smallest_budget_is_fine(self) -> None:
        manager = make_manager(budgets=[64, 128], max_items=64)
        assert manager.max_batch_size == 64

    def test_only_items(self) -> None:
        # Budgets start at max(8, 20) = 20: 20, 40, then 64 appended.
        manager = make_manager(FakeEncoder(budget_range=(8, 64)), max_items=20)
        assert manager.token_budgets == [20, 40, 64]
        assert manager.max_batch_size == 20

    def test_only_items_below_min(self) -> None:
        # max(8, 3) = 8: 8, 16, 32, 64.
        manager = make_manager(FakeEncoder(budget_range=(8, 64)), max_items=3)
        assert manager.token_budgets == [8, 16, 32, 64]
        assert manager.max_batch_size == 3

    def test_only_items_above_max_breaks_invariant_silently(self) -> None:
        # generate(100, 64) = [64]; vLLM keeps max_batch_size = 100 > 64.
        manager = make_manager(FakeEncoder(budget_range=(8, 64)), max_items=100)
        assert manager.token_budgets == [64]
        assert manager.max_batch_size == 100

    def test_only_budgets(self) -> None:
        # items = min(64 // 8, 16) = 8
        manager = make_manager(FakeEncoder(budget_range=(8, 64)), budgets=[48, 16])
        assert manager.token_budgets == [16, 48]
        assert manager.max_batch_size == 8

    def test_only_budgets_capped_by_smallest_budget(self) -> None:
        # items = min(256 // 2, 5) = 5
        manager = make_manager(FakeEncoder(budget_range=(2, 256)), budgets=[5, 300])
        assert manager.token_budgets == [5, 300]
        assert manager.max_batch_size == 5

    @pytest.mark.parametrize(
        ("budget_range", "budgets", "items"),
        [
            ((8, 64), [8, 16, 32, 64], 8),  # min(64 // 8, 8)
            ((10, 100), [10, 20, 40, 80, 100], 10),  # min(10, 10)
            ((30, 100), [30, 60, 100], 3),  # min(100 // 30, 30)
            ((64, 5000), [64, 128, 256, 512, 1024, 2048, 4096, 5000], 64),
        ],
    )
    def test_fully_automatic(
        self, budget_range: tuple[int, int], budgets: list[int], items: int
    ) -> None:
        manager = make_manager(FakeEncoder(budget_range=budget_range))
        assert manager.token_budgets == budgets
        assert manager.max_batch_size == items

    @pytest.mark.parametrize("budget_range", [(0, 64), (8, 0), (-1, 5), (0, 0)])
    def test_non_positive_range(self, budget_range: tuple[int, int]) -> None:
        with pytest.raises(ValueError, match="Both must be positive"):
            make_manager(FakeEncoder(budget_range=budget_range))

    def test_inverted_range(self) -> None:
        with pytest.raises(ValueError, match="min_budget=64 > max_budget=8"):
            make_manager(FakeEncoder(budget_range=(64, 8)))

    def test_range_checked_when_only_budgets_given(self) -> None:
        with pytest.raises(ValueError, match="Both must be positive"):
            make_manager(FakeEncoder(budget_range=(0, 8)), budgets=[16])


class TestFramesAndDP:
    def test_frames_zero_without_video(self) -> None:
        manager = make_manager(video_limit=0, max_frames=12)
        assert manager.max_frames_per_batch == 0

    def test_frames_user_value(self) -> None:
        manager = make_manager(max_frames=12)
        assert manager.max_frames_per_batch == 12

    def test_frames_default_scales_with_batch(self) -> None:
        # range (8, 64): max_batch_size 8; 8 * 3 frames = 24.
        manager = make_manager(
            FakeEncoder(budget_range=(8, 64), max_frames_per_video=3)
        )
        assert manager.max_frames_per_batch == 24

    @pytest.mark.parametrize(
        ("tp_mode", "tp_size", "use_dp"),
        [("data", 2, True), ("weights", 2, False), ("data", 1, False)],
    )
    def test_use_dp(self, tp_mode: str, tp_size: int, use_dp: bool) -> None:
        manager = make_manager(tp_mode=tp_mode, tp_size=tp_size)
        assert manager.use_dp is use_dp


class TestPaths:
    def test_default_path_uses_global_budgets(self) -> None:
        manager = make_manager(FakeEncoder(budget_range=(8, 64)))
        assert manager.path_token_budgets == {"default": [8, 16, 32, 64]}

    def test_path_minimum_and_zero(self) -> None:
        paths = {
            "default": EncoderCudaGraphPathConfig(),
            "thumb": EncoderCudaGraphPathConfig(
                min_token_budget=12, allow_zero_tokens=True
            ),
            "crop": EncoderCudaGraphPathConfig(allow_zero_tokens=True),
        }
        manager = make_manager(FakeEncoder(budget_range=(8, 64), paths=paths))
        assert manager.path_token_budgets == {
            "default": [8, 16, 32, 64],
            "thumb": [0, 12, 24, 48, 64],
            "crop": [0, 8, 16, 32, 64],
        }
        # The global list is not modified by the zero insertion.
        assert manager.token_budgets == [8, 16, 32, 64]
        # 4 + 4 + 4 non-zero budgets.
        assert manager.get_num_graphs_to_capture() == 12

    @pytest.mark.parametrize("minimum", [0, -4, 65])
    def test_path_minimum_out_of_range(self, minimum: int) -> None:
        paths = {"default": EncoderCudaGraphPathConfig(min_token_budget=minimum)}
        with pytest.raises(ValueError, match="minimum budget"):
            make_manager(FakeEncoder(budget_range=(8, 64), paths=paths))

    def test_path_minimum_equal_to_largest(self) -> None:
        paths = {"default": EncoderCudaGraphPathConfig(min_token_budget=64)}
        manager = make_manager(FakeEncoder(budget_range=(8, 64), paths=paths))
        assert manager.path_token_budgets == {"default": [64]}

    def test_no_paths(self) -> None:
        with pytest.raises(ValueError, match="at least one path"):
            make_manager(FakeEncoder(paths={}))

    def test_empty_capture_axis(self) -> None:
        with pytest.raises(ValueError, match="non-empty"):
            make_manager(FakeEncoder(capture_axes=((1, 2), ())))

    def test_paths_with_axes_not_implemented(self) -> None:
        paths = {
            "default": EncoderCudaGraphPathConfig(),
            "thumb": EncoderCudaGraphPathConfig(),
        }
        with pytest.raises(NotImplementedError):
            make_manager(FakeEncoder(paths=paths, capture_axes=((1, 2),)))

    def test_graph_count_with_axes(self) -> None:
        # 4 budgets x 2 x 3 axis keys.
        manager = make_manager(
            FakeEncoder(budget_range=(8, 64), capture_axes=((1, 2), ("a", "b", "c")))
        )
        assert manager.get_num_graphs_to_capture() == 24

    def test_initial_state(self) -> None:
        manager = make_manager()
        assert manager.budget_graphs == {}
        assert manager.graph_pool is None
        assert not manager.is_captured()
        assert (manager.graph_hits, manager.graph_misses) == (0, 0)
        assert manager.log_stats_interval == 100

    def test_supports_modality(self) -> None:
        manager = make_manager(FakeEncoder(modalities=("image", "video")))
        assert manager.supports_modality("video")
        assert not manager.supports_modality("audio")
        assert not make_manager(FakeEncoder(modalities=())).supports_modality("image")
