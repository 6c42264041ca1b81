"""Property tests: over random sessions the anchored fullness is always (last report + estimates since).

The reference model below is written from the rule alone (kvjudge/budget/token_budget.py's docstring) and shares
no code with TokenBudget: it keeps the last reported prompt size and a ledger of what was added or pruned since.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from kvjudge.budget import ConversationTurn, TokenBudget, TurnMetrics


def est(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


@dataclass
class Reference:
    prune_above: int
    history: list[tuple[str, str]] = field(default_factory=list)
    last_report: int | None = None
    since: list[int] = field(default_factory=list)  # signed estimates added (+) / pruned (-) since the report

    def fullness(self) -> int:
        if self.last_report is None:
            return sum(est(u) + est(a) for u, a in self.history)
        return max(0, self.last_report + sum(self.since))

    def sync(self, user: str, assistant: str, report: int | None) -> None:
        self.history.append((user, assistant))
        if report is not None:
            self.last_report, self.since = report, [est(assistant)]
        else:
            self.since.append(est(user) + est(assistant))
        while self.history and self.fullness() > self.prune_above:
            user0, assistant0 = self.history.pop(0)
            self.since.append(-(est(user0) + est(assistant0)))


texts = st.text(max_size=80)
steps = st.lists(
    st.tuples(texts, texts, st.one_of(st.none(), st.integers(min_value=0, max_value=6000)), st.booleans()),
    min_size=1, max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(max_tokens=st.integers(min_value=0, max_value=8000), steps=steps)
def test_fullness_is_last_report_plus_estimates_since(max_tokens: int, steps: list) -> None:
    budget = TokenBudget(max_tokens, 0.8)
    reference = Reference(budget.prune_above)
    for user, assistant, report, _ in steps:
        asyncio.run(budget.sync_turn(user, assistant, TurnMetrics(input_tokens=report)))
        reference.sync(user, assistant, report)
        assert budget.fullness() == reference.fullness()
        assert [(t.user, t.assistant) for t in budget.history] == reference.history
        assert budget.anchor == reference.last_report
        assert budget.fullness() >= 0
        # Pruning stops as soon as the figure fits, or when nothing is left to drop.
        assert budget.fullness() <= budget.prune_above or not budget.history


@settings(max_examples=200, deadline=None)
@given(system=st.integers(min_value=0, max_value=3000), steps=steps)
def test_truthful_reports_never_drift_or_double_count(system: int, steps: list) -> None:
    # A backend whose token count equals the estimate: then the anchored figure must equal the real
    # context exactly, however many turns went by, whichever turns were measured.
    budget = TokenBudget(10_000_000, 0.99)
    real = system  # system prompt + every turn so far, as the backend would count it
    for user, assistant, _, measured in steps:
        real_prompt = real + est(user)
        asyncio.run(budget.sync_turn(user, assistant, TurnMetrics(input_tokens=real_prompt if measured else None)))
        real = real_prompt + est(assistant)
        if budget.anchor is not None:
            assert budget.fullness() == real
        else:
            assert budget.fullness() == real - system  # estimate-only: turns once each, no system prompt


@settings(max_examples=200, deadline=None)
@given(max_tokens=st.integers(min_value=0, max_value=4000),
       turns=st.lists(st.tuples(texts, texts, st.one_of(st.none(), st.integers(0, 5000))), max_size=20))
def test_restore_equals_replaying_the_measured_tail(max_tokens: int, turns: list) -> None:
    restored = TokenBudget(max_tokens, 0.8)
    restored.restore_turns([ConversationTurn(u, a, tokens_in=r) for u, a, r in turns])
    reference = Reference(restored.prune_above)
    last = max((i for i, (_, _, r) in enumerate(turns) if r is not None), default=None)
    if last is None:
        reference.history = [(u, a) for u, a, _ in turns]
    else:
        reference.history = [(u, a) for u, a, _ in turns]
        reference.last_report = turns[last][2]
        reference.since = [est(turns[last][1])] + [est(u) + est(a) for u, a, _ in turns[last + 1:]]
    while reference.history and reference.fullness() > reference.prune_above:
        user0, assistant0 = reference.history.pop(0)
        reference.since.append(-(est(user0) + est(assistant0)))
    assert restored.fullness() == reference.fullness()
    assert [(t.user, t.assistant) for t in restored.history] == reference.history
    assert restored.anchor == reference.last_report
