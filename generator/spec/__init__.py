"""The typed spec model: one frozen dataclass per spec entity.

Each class declares its YAML keys (:class:`~generator.spec.reader.Keys`) and
reads them in a ``from_yaml`` classmethod; the JSON Schema
(:mod:`generator.spec.schema`) and the field tables of the docs
(:mod:`generator.spec.doc_tables`) are derived from those declarations.
"""

from generator.spec.capture import Buffer, Capture, CaptureTensor, MetadataBuilder
from generator.spec.enums import (
    Base,
    DefsImport,
    Dtype,
    Fill,
    ImageLimitGuard,
    InputKind,
    Modality,
    PadRule,
    ReplayRule,
    Rounding,
)
from generator.spec.forwards import EagerForward, Postprocess, SpanAssembly, Step
from generator.spec.host import Constant, HostAttr, Import, Size
from generator.spec.inputs import FlatInput, Input, ItemInput
from generator.spec.items import BackendGuard, Budget, Guards, Items
from generator.spec.mixin import MixinSpec
from generator.spec.path import EncoderPath

__all__ = [
    "BackendGuard",
    "Base",
    "Budget",
    "Buffer",
    "Capture",
    "CaptureTensor",
    "Constant",
    "DefsImport",
    "Dtype",
    "EagerForward",
    "EncoderPath",
    "Fill",
    "FlatInput",
    "Guards",
    "HostAttr",
    "ImageLimitGuard",
    "Import",
    "Input",
    "InputKind",
    "ItemInput",
    "Items",
    "MetadataBuilder",
    "MixinSpec",
    "Modality",
    "PadRule",
    "Postprocess",
    "ReplayRule",
    "Rounding",
    "Size",
    "SpanAssembly",
    "Step",
]
