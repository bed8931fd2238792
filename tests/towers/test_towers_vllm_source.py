"""The wheel reader of the tower tests, on a small wheel-like zip: which vLLM
imports it resolves, drops or refuses, and what it compiles."""

from __future__ import annotations

import textwrap
import zipfile

import pytest
from towers_vllm_source import VllmSource

from encoder_cudagraph_runtime import defs

MODULE = "vllm/model_executor/models/fake.py"
SOURCE = """
import math

from vllm.model_executor.custom_op import CustomOp


def protocol_type():
    from vllm.v1.worker.encoder_cudagraph_defs import EncoderItemSpec

    return EncoderItemSpec


def rounded(x):
    from vllm.utils.math_utils import round_up

    return round_up(x, 4)


def flag():
    import vllm.envs as envs

    return envs.VLLM_FLAG


def relative():
    from .vision import helper

    return helper()


def annotated(x: VllmOnlyType) -> VllmOnlyType:
    return x


@CustomOp.register("fake")
def registered():
    return "body"


LIMIT = 7


class Model:
    @staticmethod
    def twice(x):
        return 2 * x


class Twice:
    pass


class Twice:
    pass
"""


@pytest.fixture
def source(tmp_path) -> VllmSource:
    path = tmp_path / "fake.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(MODULE, textwrap.dedent(SOURCE))
    with zipfile.ZipFile(path) as wheel:
        yield VllmSource(wheel)


@pytest.mark.parametrize(
    "name, namespace, call, expected",
    [
        ("protocol_type", {}, (), defs.EncoderItemSpec),
        ("rounded", {"round_up": lambda x, m: -(-x // m) * m}, (5,), 8),
        ("flag", {"envs": type("Envs", (), {"VLLM_FLAG": True})}, (), True),
        ("annotated", {}, (3,), 3),
        ("registered", {}, (), "body"),
    ],
    ids=["defs-to-mirror", "supplied-from", "supplied-import", "annotations", "decor"],
)
def test_loads(source, name, namespace, call, expected):
    fn = source.load(MODULE, [name], namespace)[name]
    assert fn(*call) == expected
    assert namespace[name] is fn


@pytest.mark.parametrize(
    "name, message",
    [
        ("rounded", "no stand-in for round_up"),
        ("flag", "no stand-in for envs"),
        ("relative", "no stand-in for helper"),
        ("missing", r"lacks \['missing'\]"),
    ],
)
def test_refuses(source, name, message):
    with pytest.raises(LookupError, match=message):
        source.load(MODULE, [name], {})


def test_a_supplied_import_is_checked_again_for_the_next_namespace(source):
    source.load(MODULE, ["rounded"], {"round_up": round})
    with pytest.raises(LookupError, match="no stand-in for round_up"):
        source.load(MODULE, ["rounded"], {})


def test_constants_methods_and_classes(source):
    assert source.load(MODULE, ["LIMIT"], {}) == {"LIMIT": 7}
    assert source.load(MODULE, ["twice"], {}, cls="Model")["twice"](4) == 8
    made = source.make_class("Made", MODULE, "Model", ["twice"], {}, (object,))
    assert made.twice(5) == 10 and made.__bases__ == (object,)
    with pytest.raises(LookupError, match="defines 2 Twice classes"):
        source.load(MODULE, ["anything"], {}, cls="Twice")
    with pytest.raises(LookupError, match="defines 0 Absent classes"):
        source.load(MODULE, ["anything"], {}, cls="Absent")
