"""``bench/diagnose_pool_reads.py``: its kernel settings are global torch
flags, so each must leave them as it found them (the next setting and the
rest of the process see the defaults)."""

from __future__ import annotations

import pytest
import torch
from bench_modules import load_bench_module

diagnose = load_bench_module("diagnose_pool_reads")


def _flags() -> tuple[bool, ...]:
    cuda = torch.backends.cuda
    sdpa = tuple(getattr(cuda, f"{k}_sdp_enabled")() for k in diagnose.SDPA_FLAGS)
    return sdpa + (torch.backends.mha.get_fastpath_enabled(),)


@pytest.mark.parametrize(
    ("setting", "off"),
    [
        ("default", ()),
        ("no_mem_efficient", ("mem_efficient",)),
        ("no_cudnn", ("cudnn",)),
        ("math_sdpa", ("flash", "mem_efficient", "cudnn")),
        ("no_mha_fastpath", ()),
    ],
)
def test_each_setting_switches_its_kernels_and_restores_them(setting, off) -> None:  # type: ignore[no-untyped-def]
    before = _flags()
    with diagnose.SETTINGS[setting]():
        cuda = torch.backends.cuda
        for kernel in diagnose.SDPA_FLAGS:
            on = getattr(cuda, f"{kernel}_sdp_enabled")()
            assert on == (
                before[diagnose.SDPA_FLAGS.index(kernel)] and kernel not in off
            )
        fastpath = torch.backends.mha.get_fastpath_enabled()
        assert fastpath == (before[-1] and setting != "no_mha_fastpath")
    assert _flags() == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--settings", "no_such_kernel"], "unknown settings ['no_such_kernel']"),
        (["--before", "deepseek_v41"], "--before takes STEM:SIZE"),
    ],
)
def test_bad_command_lines_are_refused_before_any_run(argv, message, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        diagnose.main(["minicpmv", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_bad_between_action_is_refused_before_any_run(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        diagnose.main(["minicpmv", "--between", "no_such_reset"])
    assert exit_info.value.code == 2
    assert "no_such_reset" in capsys.readouterr().err


def test_side_stream_reset_makes_the_next_capture_take_a_new_stream() -> None:
    streams = diagnose.graph_backends._SIDE_CAPTURE_STREAMS
    saved = dict(streams)
    try:
        streams[7] = object()  # a device's stream, as a capture leaves it
        assert diagnose.BETWEEN["side_stream"]() == ["side stream of device 7"]
        assert streams == {}
    finally:
        streams.clear()
        streams.update(saved)
