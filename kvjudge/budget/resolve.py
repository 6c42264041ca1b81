"""Which token budget a conversation gets, and from where (the caller resolves it and injects the number).

1. an explicit ``[memory] context_tokens`` (a deliberate user override);
2. capability-derived: ``max_ok_input``, else ``safe_context``, from the caller's probe cache;
3. :data:`DEFAULT_CONTEXT_TOKENS` when neither exists (a fresh model).

This module takes plain numbers. It never imports probe types: the caller reads the capability cache
entry for its model and device and passes the two figures in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

from kvjudge.budget.estimation import TokenEstimation
from kvjudge.budget.token_budget import TokenBudget
from kvjudge.errors import UsageError
from kvjudge.settings import Settings

DEFAULT_CONTEXT_TOKENS = 8192


class BudgetSource(StrEnum):
    """Where a resolved budget came from."""

    EXPLICIT = "explicit"  # [memory] context_tokens
    MAX_OK_INPUT = "max_ok_input"  # the largest prompt that really ran (measured)
    SAFE_CONTEXT = "safe_context"  # the probe's conservative planning figure
    DEFAULT = "default"  # DEFAULT_CONTEXT_TOKENS


def _positive(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{what} must be a positive whole number of tokens or None, got {value!r}")
    return value


def resolve_budget(explicit: int | None, max_ok_input: int | None,
                   safe_context: int | None) -> tuple[int, BudgetSource]:
    """``(tokens, source)``: explicit, else ``max_ok_input``, else ``safe_context``, else 8192."""
    for value, source in ((explicit, BudgetSource.EXPLICIT), (max_ok_input, BudgetSource.MAX_OK_INPUT),
                          (safe_context, BudgetSource.SAFE_CONTEXT)):
        if _positive(value, source.value) is not None:
            return value, source  # type: ignore[return-value]
    return DEFAULT_CONTEXT_TOKENS, BudgetSource.DEFAULT


@dataclass(frozen=True)
class ResolvedBudget:
    """A resolved budget with its provenance, ready to build a :class:`TokenBudget` from."""

    tokens: int
    source: BudgetSource
    threshold_pct: float
    estimation: TokenEstimation

    def provider(self) -> TokenBudget:
        """A fresh TokenBudget with this budget and estimation injected."""
        return TokenBudget(self.tokens, self.threshold_pct).with_estimation(self.estimation)


def budget_from_settings(settings: Settings, *, max_ok_input: int | None = None, safe_context: int | None = None,
                         model_path: str | os.PathLike[str] | None = None) -> ResolvedBudget:
    """Resolve the budget from ``[memory]`` and ``[context.estimation]`` and the caller's capability figures
    (plain numbers)."""
    memory = settings.memory
    tokens, source = resolve_budget(memory.context_tokens, max_ok_input, safe_context)
    return ResolvedBudget(tokens=tokens, source=source, threshold_pct=memory.threshold_pct,
                          estimation=TokenEstimation.from_settings(settings, model_path))
