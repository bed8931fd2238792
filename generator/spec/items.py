"""Per-item formulas, the budget range and the refused configurations."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from generator.formulas import Expr, HostPath
from generator.scopes import NameKind
from generator.spec.conditions import Comparison, Condition
from generator.spec.enums import Backend, ImageLimitGuard
from generator.spec.forwards import Step, Steps
from generator.spec.reader import Key, Keys, Reader
from generator.spec.values import (
    Boolean,
    Choice,
    Formula,
    HostPathValue,
    ListOf,
    OneOf,
    Section,
    Text,
)

_COUNT_SHAPE = "every step but the last assigns a name; the last is the item's count"
COUNT_STEPS = Steps("count_steps", NameKind.COUNT_STEP, _COUNT_SHAPE, _COUNT_SHAPE)
#: The item formulas a spec must give when its count comes from steps: the
#: static checks, the budgets and the dummy batch read them, not the steps.
COUNT_STEPS_NEED = ("graph_rows", "budget_tokens")


@dataclass(frozen=True)
class CountSteps:
    """An item's output token count computed on the host by steps (a
    pinpoint search, float arithmetic in a helper), with the integer bound
    the static checks use in its place; the mixin checks each item's count
    against the bound."""

    steps: tuple[Step, ...]
    at_most: Expr
    why: str | None

    KEYS: ClassVar = Keys(
        Key(
            "steps",
            COUNT_STEPS,
            "Statements run once per item on the host with its dims bound "
            "(constants, host paths, calls of host methods and imported helpers, "
            "tensor expressions); the last one is the item's output token count, "
            "an `int`.",
            required=True,
            example="[rows, cols = grid_shape((ih, iw), config.pinpoints), "
            "576 + rows * (cols + 1)]",
        ),
        Key(
            "at_most",
            Formula("items"),
            "An integer formula no item's count exceeds: the static checks and "
            "`gen-mixin plan` use it in place of the count, and the mixin raises "
            "`ValueError` for an item whose steps give an `int` outside "
            "`1 .. at_most`.",
            required=True,
            example="p * 576 + (p - 1) * 24",
        ),
        Key("why", Text(), "Comment on the count."),
    )
    DOC_TITLE = "items.output_tokens"

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> CountSteps | None:
        steps = r.take("steps")
        at_most = r.take("at_most")
        why = r.take("why")
        if steps is None or at_most is None:
            return None
        return cls(steps, at_most, why)


@dataclass(frozen=True)
class Items:
    """What the manager is told about each item (``EncoderItemSpec``)."""

    input_size: Expr
    output_tokens: Expr
    graph_rows: Expr | None  # rows the graph emits, when not output_tokens
    budget_tokens: Expr | None  # what budgets count, when not output_tokens
    #: The formulas are per unit (over the ``unit_of`` grids' dims); an
    #: item's values are their sums over its units.
    per_unit: bool = False
    eager_when: Comparison | None = None  # items no graph takes
    #: The count from host steps; ``output_tokens`` is then their bound.
    count_steps: CountSteps | None = None

    KEYS: ClassVar = Keys(
        Key(
            "input_size",
            Formula("items"),
            "`EncoderItemSpec.input_size` (data-parallel load balance).",
            required=True,
            example="t * h * w",
        ),
        Key(
            "output_tokens",
            OneOf(Formula("items"), Section(CountSteps)),
            "`EncoderItemSpec.output_tokens`: the rows finally written for the item. "
            "A formula, or `{steps, at_most}` where the count needs a helper or "
            "host data (LLaVA-NeXT's pinpoint search): steps run per item on the "
            "host, `at_most` bounds them for the static checks; `graph_rows` and "
            "`budget_tokens` are then required.",
            required=True,
            example="t * h * w // (merge * merge)",
        ),
        Key(
            "graph_rows",
            Formula("items"),
            "Rows the graph emits per item when they differ from `output_tokens` "
            "(span assembly).",
            default_doc="`output_tokens`",
            example="ceil_div(h, r) * ceil_div(w, r)",
        ),
        Key(
            "budget_tokens",
            Formula("items"),
            "The tokens the budgets count (`EncoderItemSpec.path_output_tokens"
            '["default"]`), when a closer measure of the graph\'s work than '
            "`output_tokens` exists. The dummy batch must cover a budget in "
            "`budget_tokens`, and in `graph_rows` unless `capture.graph_rows` "
            "declares a larger capacity.",
            default_doc="`output_tokens`",
            example="h * w",
        ),
        Key(
            "per_unit",
            Boolean(),
            "The formulas are per unit, over the dims of the `unit_of` grids, and "
            "an item's values are their sums over its units (LFM2-VL: an image's "
            "tokens are the sum over its tiles, `(h // f) * (w // f)` each).",
            default=False,
        ),
        Key(
            "eager_when",
            Condition("items"),
            "Items no graph takes (Kimi-K2.5's video chunks): their budget tokens "
            "(`path_output_tokens`) are set above any budget, so the manager runs "
            "each alone in the eager forward; `output_tokens` stays the item's "
            "real count, which the data-parallel gather sizes its buffers by. "
            "With `per_unit`, over a unit's dims: an item runs eagerly when one "
            "of its units does (MiniCPM-V's slices wider than the resampler's "
            "position table).",
            example="t != 1",
        ),
    )
    DOC_TITLE = "items"

    @property
    def formulas(self) -> dict[str, Expr]:
        """The formulas given, by key."""
        named = {
            "input_size": self.input_size,
            "output_tokens": self.output_tokens,
            "graph_rows": self.graph_rows,
            "budget_tokens": self.budget_tokens,
        }
        return {k: v for k, v in named.items() if v is not None}

    def on_path(self, output_tokens: Expr | None) -> Items:
        """The items as one path of ``paths:`` sees them: its rows per item
        (``output_tokens``) are what its budgets count and its graph emits;
        the default path (None) sees them as they are."""
        if output_tokens is None:
            return self
        return replace(self, graph_rows=output_tokens, budget_tokens=output_tokens)

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> Items | None:
        input_size = r.take("input_size")
        output_tokens = r.take("output_tokens")
        graph_rows = r.take("graph_rows")
        budget_tokens = r.take("budget_tokens")
        per_unit = r.take("per_unit")
        eager_when = r.take("eager_when")
        # Coverage is checked against graph_rows and budget_tokens: not when
        # either was written but failed (their defaults would mislead).
        r.ctx.partial["items_resolved"] = r.ok("graph_rows", "budget_tokens")
        count_steps = None
        if isinstance(output_tokens, CountSteps):
            count_steps, output_tokens = output_tokens, output_tokens.at_most
            _check_count_steps(r, per_unit)
        if input_size is None or output_tokens is None:
            return None
        if not r.ok("eager_when"):
            return None
        return cls(
            input_size,
            output_tokens,
            graph_rows,
            budget_tokens,
            per_unit=per_unit,
            eager_when=eager_when,
            count_steps=count_steps,
        )


def _check_count_steps(r: Reader, per_unit: bool) -> None:
    """What a count from steps needs of the other item fields."""
    missing = [k for k in COUNT_STEPS_NEED if not r.has(k)]
    if missing:
        r.error(
            r.key_location("output_tokens"),
            f"a count from steps needs {' and '.join(missing)} (formulas: the "
            "budgets and the dummy batch cannot run the steps)",
            r.path("output_tokens"),
        )
    if per_unit:
        r.error(
            "per_unit",
            "not with a count from steps (output_tokens.steps count the whole item)",
        )


@dataclass(frozen=True)
class Budget:
    min: Expr
    why: str | None
    max: Expr | None = None
    max_why: str | None = None

    KEYS: ClassVar = Keys(
        Key(
            "min",
            Formula("constants"),
            "The smallest token budget; the largest is what one scheduler step "
            "holds (`min(max_num_batched_tokens, max_model_len)`).",
            required=True,
            example="64",
        ),
        Key("why", Text(), "Comment on the smallest budget."),
        Key(
            "max",
            Formula("budget_max"),
            "The largest token budget, in the unit the budgets count "
            "(`items.budget_tokens`): what one scheduler step can bring, "
            "default `min(max_num_batched_tokens, max_model_len)`. The static "
            "checks refuse a largest budget below the smallest or falling as "
            "the step grows.",
            example="r * r * min(max_num_batched_tokens, max_model_len)",
        ),
        Key("max_why", Text(), "Comment on the largest budget."),
    )
    DOC_TITLE = "budget"

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> Budget | None:
        minimum = r.take("min")
        why = r.take("why")
        maximum = r.take("max")
        max_why = r.take("max_why")
        if minimum is None:
            return None
        return cls(minimum, why, maximum, max_why)


@dataclass(frozen=True)
class BackendGuard:
    """Refuse attention backends that cannot be captured."""

    path: HostPath
    allow: tuple[Backend, ...]
    deny: tuple[Backend, ...]
    hint: str | None
    why: str | None

    KEYS: ClassVar = Keys(
        Key(
            "from",
            HostPathValue(),
            "Host path of the tower's `AttentionBackendEnum`.",
            required=True,
            example="visual.attn_backend",
        ),
        Key(
            "allow",
            ListOf(Choice(Backend), min_items=1),
            "The only backends the graphs run with (exactly one of allow / deny).",
            example="[FLASH_ATTN, ROCM_AITER_FA]",
        ),
        Key(
            "deny",
            ListOf(Choice(Backend), min_items=1),
            "Backends the graphs refuse.",
            example="[TORCH_SDPA, FLASHINFER]",
        ),
        Key(
            "hint",
            Text(),
            "What the error tells the user to do.",
            example="Set --mm-encoder-attn-backend FLASH_ATTN",
        ),
        Key("why", Text(), "Comment on the guard."),
    )
    DOC_TITLE = "guards.attention_backend"

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> BackendGuard | None:
        path = r.take("from")
        allow = tuple(b for b in r.take("allow") or () if b)
        deny = tuple(b for b in r.take("deny") or () if b)
        if bool(r.has("allow")) == bool(r.has("deny")):
            r.error(r.node, "give exactly one of allow or deny")
        hint = r.take("hint")
        why = r.take("why")
        if path is None or not r.ok("allow", "deny"):
            return None
        return cls(path, allow, deny, hint, why)


@dataclass(frozen=True)
class Guards:
    image_limit_zero: ImageLimitGuard
    fp8_static_scales: bool
    attention_backend: BackendGuard | None

    KEYS: ClassVar = Keys(
        Key(
            "image_limit_zero",
            Choice(ImageLimitGuard),
            "An image limit of 0 means the tower was not built: `ValueError` in "
            "`get_encoder_cudagraph_config` (`config`, MiniMax M3) or "
            "`RuntimeError` at capture (`capture`, DeepSeek-V4.1).",
            default=ImageLimitGuard.OFF,
            default_doc="`off`",
            example="config",
        ),
        Key(
            "fp8_static_scales",
            Boolean(),
            "Refuse fp8 encoder attention without `--mm-encoder-fp8-scale-path` "
            "(dynamic scales are host state).",
            default=False,
        ),
        Key(
            "attention_backend",
            Section(BackendGuard),
            "Read the tower's attention backend and refuse the ones that cannot "
            "be captured.",
        ),
    )
    DOC_TITLE = "guards"
    NONE: ClassVar[Guards]

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> Guards | None:
        return cls(
            r.take("image_limit_zero"),
            r.take("fp8_static_scales"),
            r.take("attention_backend"),
        )

    @property
    def read_multimodal_config(self) -> bool:
        return (
            self.image_limit_zero is not ImageLimitGuard.OFF or self.fp8_static_scales
        )


Guards.NONE = Guards(ImageLimitGuard.OFF, False, None)


@dataclass(frozen=True)
class CaptureOff:
    """A host flag that turns capture off: the config then lists no
    modality (vLLM's EVS video pruning, whose post-processing the graphs
    would skip)."""

    when: HostPath
    why: str | None

    KEYS: ClassVar = Keys(
        Key(
            "when",
            HostPathValue(),
            "Host path of a flag: when it is true, `modalities` is `[]` (and "
            "`max_frames_per_video` 1), so nothing is captured, and no guard "
            "refuses the configuration.",
            required=True,
            example="is_multimodal_pruning_enabled",
        ),
        Key("why", Text(), "Comment on the condition."),
    )
    DOC_TITLE = "capture_off"

    @classmethod
    def from_yaml(cls, r: Reader, **_: Any) -> CaptureOff | None:
        when = r.take("when")
        why = r.take("why")
        return None if when is None else cls(when, why)
