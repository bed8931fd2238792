"""The token-budget ladder and batch size the manager captures (vLLM 0.33.0
rules), as pure functions.

The manager resolves its ladder with them, and ``gen-mixin plan`` (which
imports no torch; neither does this module) predicts it with the same code.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["generate_budgets", "path_budgets", "resolve_budget_ladder"]


def generate_budgets(min_budget: int, max_budget: int) -> list[int]:
    """``min_budget`` doubled while it stays ``<= max_budget``, then
    ``max_budget`` itself unless the series already ends on it (so the
    largest batch worth a graph always has one)."""
    budgets: list[int] = []
    budget = min_budget
    while budget <= max_budget:
        budgets.append(budget)
        budget *= 2
    if not budgets or budgets[-1] < max_budget:
        budgets.append(max_budget)
    return budgets


def path_budgets(
    path: str,
    token_budgets: list[int],
    min_token_budget: int | None,
    allow_zero_tokens: bool,
) -> list[int]:
    """One encoder path's budgets (``EncoderCudaGraphPathConfig``): the global
    ``token_budgets``, or doubling from the path's minimum up to the largest
    global budget; with a leading 0 (never captured: the batch skips the
    path) when the path may be left out. Raises ValueError for a minimum
    outside ``(0, largest budget]``, as the manager does."""
    largest = token_budgets[-1]
    if min_token_budget is None:
        budgets = list(token_budgets)
    elif 0 < min_token_budget <= largest:
        budgets = generate_budgets(min_token_budget, largest)
    else:
        raise ValueError(
            f"Encoder CUDA graph path {path!r} has minimum budget "
            f"{min_token_budget}; it must lie in (0, {largest}], the largest "
            "budget."
        )
    return [0, *budgets] if allow_zero_tokens else budgets


def resolve_budget_ladder(
    user_budgets: list[int],
    user_max_items: int,
    budget_range: Callable[[], tuple[int, int]],
) -> tuple[list[int], int]:
    """``(token_budgets, max_batch_size)``.

    Every capture builds ``max_batch_size`` dummy items of at least one row
    each, so ``max_batch_size <= min(token_budgets)`` must hold. Which values
    the user fixed decides how it is ensured:

    * budgets and items: taken as given, the invariant is checked;
    * items only: the generated budgets start at ``max(min, items)``;
    * budgets only: items = ``min(max // min, smallest budget)``;
    * neither: budgets generated from the model range, items as above
      with the generated budgets.

    ``budget_range`` (the model's ``(min, max)``) is only called when
    something is left to infer. Raises ValueError for a configuration the
    manager refuses.
    """
    if user_budgets and user_max_items > 0:
        budgets = sorted(user_budgets)
        smallest = budgets[0]
        if user_max_items > smallest:
            raise ValueError(
                "encoder_cudagraph_max_vision_items_per_batch "
                f"({user_max_items}) must be <= smallest token budget "
                f"({smallest}): capture gives each of the "
                f"{user_max_items} dummy items at least one row, which "
                f"does not fit the budgets {budgets}. Raise the "
                "smallest budget or lower the items per batch."
            )
        return budgets, user_max_items

    min_budget, max_budget = budget_range()
    if min_budget <= 0 or max_budget <= 0:
        raise ValueError(
            "Invalid encoder CUDA graph budget range from the model: "
            f"min_budget={min_budget}, max_budget={max_budget}. Both must "
            "be positive."
        )
    if min_budget > max_budget:
        raise ValueError(
            "Invalid encoder CUDA graph budget range from the model: "
            f"min_budget={min_budget} > max_budget={max_budget}."
        )

    if user_max_items > 0:
        return (
            generate_budgets(max(min_budget, user_max_items), max_budget),
            user_max_items,
        )
    budgets = (
        sorted(user_budgets)
        if user_budgets
        else generate_budgets(min_budget, max_budget)
    )
    return budgets, min(max_budget // min_budget, budgets[0])
