"""Token budgets: the TokenBudget memory provider, budget resolution, and the retention ceiling bound.

This package takes plain numbers; it never imports probe types (the caller resolves and injects).
"""

from kvjudge.budget.ceiling import DEFAULT_CEILING, CeilingBound, effective_ceiling
from kvjudge.budget.estimation import DEFAULT_CHARS_PER_TOKEN, TokenEstimation
from kvjudge.budget.provider import ConversationTurn, MemMessage, MemoryProvider, SessionContext, TurnMetrics
from kvjudge.budget.resolve import (
    DEFAULT_CONTEXT_TOKENS,
    BudgetSource,
    ResolvedBudget,
    budget_from_settings,
    resolve_budget,
)
from kvjudge.budget.token_budget import (
    DEFAULT_THRESHOLD_PCT,
    MAX_THRESHOLD_PCT,
    MIN_MAX_TOKENS,
    MIN_THRESHOLD_PCT,
    TokenBudget,
)

__all__ = [
    "DEFAULT_CEILING", "DEFAULT_CHARS_PER_TOKEN", "DEFAULT_CONTEXT_TOKENS", "DEFAULT_THRESHOLD_PCT",
    "MAX_THRESHOLD_PCT", "MIN_MAX_TOKENS", "MIN_THRESHOLD_PCT",
    "BudgetSource", "CeilingBound", "ConversationTurn", "MemMessage", "MemoryProvider", "ResolvedBudget",
    "SessionContext", "TokenBudget", "TokenEstimation", "TurnMetrics",
    "budget_from_settings", "effective_ceiling", "resolve_budget",
]
