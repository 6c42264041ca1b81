"""Token budgets: the TokenBudget memory provider, budget resolution, and the retention ceiling bound.

This package takes plain numbers; it never imports probe types (the caller resolves and injects).
"""

from kvjudge.budget.ceiling import DEFAULT_CEILING, CeilingBound, configured_ceiling, effective_ceiling

__all__ = ["DEFAULT_CEILING", "CeilingBound", "configured_ceiling", "effective_ceiling"]
