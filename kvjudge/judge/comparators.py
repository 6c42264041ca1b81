"""What best-of-N selection asks of a judge: two small interfaces, and today's pairwise judge behind one of them.

- :class:`Scorer` — ``score_runs(run_ids)`` → ``{run_id: score}``: one run at a time (a pointwise critic; higher
  is better, e.g. P(success));
- :class:`Comparator` — ``compare(pairs)`` → one value per pair, the probability that the run named first is the
  better one.

A value is a float, a :class:`Reading` (the value with the prompt tokens it cost), or None: an error (overflow, a
failed call, too little label mass). None is never a score; the strategies (:mod:`kvjudge.judge.select`) count it
as an error and apply their tie rule.

:class:`JudgeComparator` is the pairwise judge of :func:`~kvjudge.judge.judge_batch` (both orders, un-swapped, cached
in the store): a verdict ``a`` or ``b`` reads as its ``p_a``, ``tie`` and ``inconsistent`` as 0.5 (no preference, as
``eval`` counts them), ``overflow`` and ``error`` as None. Its verdicts are kept (``verdicts``) for the report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Union

if TYPE_CHECKING:
    from kvjudge.judge.pipeline import Judge
    from kvjudge.judge.verdict import Verdict
    from kvjudge.retention import Store


@dataclass(frozen=True)
class Reading:
    """One judge reading: ``value`` (None: an error, never a score), the prompt tokens it cost, and a note."""

    value: float | None
    tokens: int = 0
    note: str | None = None


Value = Union[float, Reading, None]


def reading(value: Value) -> Reading:
    """A value as a :class:`Reading` (a float is a reading that cost no known tokens)."""
    if isinstance(value, Reading):
        return value
    if value is None:
        return Reading(None, note="error")
    return Reading(float(value))


class Scorer(Protocol):
    """A pointwise judge: each run scored on its own."""

    def score_runs(self, run_ids: Sequence[str]) -> Mapping[str, Value]:
        ...


class Comparator(Protocol):
    """A pairwise judge: per pair, the probability that its first run is better."""

    def compare(self, pairs: Sequence[tuple[str, str]]) -> Sequence[Value]:
        ...


def verdict_reading(verdict: Verdict) -> Reading:
    """A verdict as a comparison: ``p_a`` for a or b, 0.5 for no preference, None for overflow or error; the
    tokens are the prompts of its orders."""
    tokens = sum(order.prompt_tokens for order in verdict.orders)
    if verdict.outcome in ("a", "b") and verdict.p_a is not None:
        return Reading(float(verdict.p_a), tokens)
    if verdict.outcome in ("tie", "inconsistent"):
        return Reading(0.5, tokens, verdict.outcome)
    return Reading(None, tokens, verdict.outcome + (f": {verdict.error}" if verdict.error else ""))


@dataclass
class JudgeComparator:
    """Today's pairwise judge as a :class:`Comparator`: ``judge_batch`` over the pairs of each call, in the store
    the runs are in. ``states``: folded runs by id, shared across calls (each run folded once); ``judge_pairs``
    replaces :func:`~kvjudge.judge.judge_batch` (a command's progress bar)."""

    judge: Judge
    store: Store
    states: dict[str, Any] = field(default_factory=dict)
    judge_pairs: Callable[[Sequence[tuple[str, str]]], list[Verdict]] | None = None
    verdicts: list[Verdict] = field(default_factory=list)

    def compare(self, pairs: Sequence[tuple[str, str]]) -> list[Reading]:
        if self.judge_pairs is not None:
            verdicts = self.judge_pairs(pairs)
        else:
            from kvjudge.judge.pipeline import judge_batch

            verdicts = judge_batch(self.judge, self.store, pairs, states=self.states)
        self.verdicts.extend(verdicts)
        return [verdict_reading(v) for v in verdicts]


@dataclass
class CriticScorer:
    """A pointwise critic as a :class:`Scorer`: ``score(run_ids)`` gives one score object per run with ``run_id``,
    ``scored`` (a real score, not an error), ``p_success`` and ``outcome`` (and, where it has them, ``readings``
    whose ``prompt_tokens`` are the tokens it cost) — the pointwise protocol's run scores. A run not scored reads as
    None: an error, never a score."""

    score: Callable[[Sequence[str]], Sequence[Any]]

    def score_runs(self, run_ids: Sequence[str]) -> dict[str, Reading]:
        found: dict[str, Reading] = {}
        for item in self.score(run_ids):
            tokens = sum(int(getattr(r, "prompt_tokens", 0) or 0) for r in getattr(item, "readings", ()))
            value = float(item.p_success) if item.scored and item.p_success is not None else None
            found[item.run_id] = Reading(value, tokens, None if value is not None else str(item.outcome))
        return found
