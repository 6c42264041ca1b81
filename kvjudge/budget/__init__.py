"""Token budgets: the TokenBudget memory provider, budget resolution, and the retention ceiling bound.

This package takes plain numbers; it never imports probe types (the caller resolves and injects).
"""

from kvjudge.budget.ceiling import CeilingBound, effective_ceiling
from kvjudge.budget.estimation import TokenEstimation
from kvjudge.budget.provider import ConversationTurn, MemMessage, MemoryProvider, SessionContext, TurnMetrics
from kvjudge.budget.resolve import BudgetSource, ResolvedBudget, budget_from_settings, resolve_budget
from kvjudge.budget.token_budget import TokenBudget

__all__ = [
    "BudgetSource", "CeilingBound", "ConversationTurn", "MemMessage", "MemoryProvider", "ResolvedBudget",
    "SessionContext", "TokenBudget", "TokenEstimation", "TurnMetrics",
    "budget_from_settings", "effective_ceiling", "resolve_budget",
]
