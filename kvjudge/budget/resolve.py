"""Which token budget a conversation gets, and from where (the seed's injection precedence).

1. an explicit ``[memory] context_tokens`` (a deliberate user override);
2. capability-derived: ``max_ok_input``, else ``safe_context``, from the caller's probe cache;
3. :data:`DEFAULT_CONTEXT_TOKENS` when neither exists (a fresh model).

This module takes plain numbers. It never imports probe types: the caller reads the capability cache
entry for its model and device and passes the two figures in.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from enum import StrEnum

from kvjudge.budget.estimation import TokenEstimation
from kvjudge.budget.token_budget import DEFAULT_THRESHOLD_PCT, TokenBudget
from kvjudge.config import Config
from kvjudge.errors import ConfigError, UsageError

DEFAULT_CONTEXT_TOKENS = 8192
MEMORY_PROVIDERS = ("token_budget",)


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
class MemorySettings:
    """The ``[memory]`` section, checked."""

    provider: str = "token_budget"
    context_tokens: int | None = None
    threshold_pct: float = DEFAULT_THRESHOLD_PCT


def memory_settings(config: Config) -> MemorySettings:
    """Read ``[memory] provider / context_tokens / threshold_pct``; a bad value names the file and key."""
    provider = config.get("memory.provider", str, "token_budget")
    if provider not in MEMORY_PROVIDERS:
        raise ConfigError(f"{config.source}: [memory] provider {provider!r} is unknown; "
                          f"use one of {', '.join(MEMORY_PROVIDERS)}")
    context_tokens = config.get("memory.context_tokens", int, None)
    if context_tokens is not None and context_tokens <= 0:
        raise ConfigError(f"{config.source}: [memory] context_tokens must be positive, got {context_tokens}")
    threshold = config.get("memory.threshold_pct", (int, float), DEFAULT_THRESHOLD_PCT)
    # TokenBudget clamps to [0.1, 0.99]; a value outside (0, 1] is a mistake (80 meant as 80 %), not a choice.
    if not math.isfinite(threshold) or not 0 < threshold <= 1:
        raise ConfigError(f"{config.source}: [memory] threshold_pct must be a fraction like 0.8, got {threshold}")
    return MemorySettings(provider=provider, context_tokens=context_tokens, threshold_pct=float(threshold))


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


def budget_from_config(config: Config, *, max_ok_input: int | None = None, safe_context: int | None = None,
                       model_path: str | os.PathLike[str] | None = None) -> ResolvedBudget:
    """Resolve the budget from the config and the caller's capability figures (plain numbers)."""
    settings = memory_settings(config)
    tokens, source = resolve_budget(settings.context_tokens, max_ok_input, safe_context)
    return ResolvedBudget(tokens=tokens, source=source, threshold_pct=settings.threshold_pct,
                          estimation=TokenEstimation.from_config(config, model_path))
